//! What stops a command before or while it does its work, each naming the flag, file or field
//! at fault. The commands print it as `error: …` and exit 2 (bad flags and files) or 1 (as
//! each command documents).

use std::path::{Path, PathBuf};

use crate::model_cache::CacheError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag's value cannot be used.
    #[error("{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },
    /// A flag's value that is out of bounds or does not fit the others (`reason` says how).
    #[error("{flag} {value}: {reason}")]
    Value { flag: &'static str, value: String, reason: String },
    /// A flag that was not given, nor the environment variable that stands in for it.
    #[error("{flag}: not given and ${var} is not set")]
    Unset { flag: &'static str, var: &'static str },
    /// No state directory from the flag or the environment.
    #[error("no state directory: pass --state-dir, or set BRINK_STATE_DIR or HOME")]
    NoStateDir,
    /// A file (named by `flag` when one gave it) that cannot be read.
    #[error("{}{}: {source}", flag_prefix(flag), path.display())]
    Read {
        flag: Option<&'static str>,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file that was read but is not what it should be (`expected`: "a SweepResult").
    #[error("{}{}: not {expected}: {reason}", flag_prefix(flag), path.display())]
    Parse { flag: Option<&'static str>, path: PathBuf, expected: &'static str, reason: String },
    /// A file or folder that cannot be written.
    #[error("{}{}: cannot write {what}: {source}", flag_prefix(flag), path.display())]
    Write {
        flag: Option<&'static str>,
        path: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A file whose content (a field of it, a GGUF header, a report's verdict) rules it out.
    #[error("{}{}: {reason}", flag_prefix(flag), path.display())]
    Content { flag: Option<&'static str>, path: PathBuf, reason: String },
    /// The model cache.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The engine on a model (its errors name the file): loading it, or a pass `doing` names
    /// (the backend and the case).
    #[error("{doing}: {source}")]
    Engine {
        doing: String,
        #[source]
        source: brink_engine::model::ModelError,
    },
    /// The address a server was to listen on (`flag` names where it came from).
    #[error("{flag} {addr}: cannot listen: {source}")]
    Listen {
        flag: &'static str,
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// The node agent's work against the cluster (`run`): the API call, Lease, Node or cache named.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::agent::AgentError),
    /// A running engine that `qualify --url` cannot qualify (its URL named).
    #[error(transparent)]
    BlackBox(#[from] crate::blackbox::session::RunError),
    /// A `--url` (or a server's own address) that is not an HTTP endpoint.
    #[error(transparent)]
    Url(#[from] crate::http_bench::client::UrlError),
    /// A request to a running server that failed (its URL named).
    #[error(transparent)]
    Http(#[from] crate::http_bench::client::HttpError),
    /// `bench --url` could not measure (its URL, flag or output file named).
    #[error(transparent)]
    BenchUrl(#[from] crate::http_bench::BenchError),
    /// The kernel self-test's worker processes cannot start (this executable not found).
    #[error(transparent)]
    SelfTestWorker(#[from] crate::qualify::kernels::NoWorker),
    /// A local server (the supervisor and its engine child) that stopped or never got ready.
    #[error("{0}")]
    Server(#[from] brink_engine::server::ServeError),
    /// A deadline a flag sets, passed (`waiting`: what did not happen in time).
    #[error("{waiting} after {after:?} ({flag})")]
    Timeout { flag: &'static str, waiting: &'static str, after: std::time::Duration },
    /// A server's answer at `url` that is not what it should be.
    #[error("{url}: {reason}")]
    Answer { url: String, reason: String },
    /// Setting up the process: the async runtime, the Kubernetes client, a serialisation.
    #[error("{what}: {reason}")]
    Setup { what: &'static str, reason: String },
    /// A step below that still reports its failure as a sentence (it names its own subject).
    #[error("{0}")]
    Step(String),
}

fn flag_prefix(flag: &Option<&'static str>) -> String {
    flag.map(|f| format!("{f} ")).unwrap_or_default()
}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error::Step(message)
    }
}

/// For the callers that still report failures as sentences.
impl From<Error> for String {
    fn from(e: Error) -> Self {
        e.to_string()
    }
}

impl Error {
    pub fn read(flag: Option<&'static str>, path: &Path, source: std::io::Error) -> Self {
        Error::Read { flag, path: path.to_path_buf(), source }
    }

    pub fn content(flag: Option<&'static str>, path: &Path, reason: impl std::fmt::Display) -> Self {
        Error::Content { flag, path: path.to_path_buf(), reason: reason.to_string() }
    }

    /// A failure of the engine while `doing` something (loading, a case on a backend).
    pub fn engine(doing: impl Into<String>) -> impl FnOnce(brink_engine::model::ModelError) -> Self {
        let doing = doing.into();
        move |source| Error::Engine { doing, source }
    }
}

/// Reads `path` as JSON of type `T` (`expected` names it in the error: "a SweepResult").
pub fn read_json<T: serde::de::DeserializeOwned>(flag: Option<&'static str>, path: &Path, expected: &'static str) -> Result<T, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::read(flag, path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Parse { flag, path: path.to_path_buf(), expected, reason: e.to_string() })
}

/// Writes `text` to `path`, creating its folder.
pub fn write_file(flag: Option<&'static str>, path: &Path, what: &'static str, text: &str) -> Result<(), Error> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write { flag, path: dir.to_path_buf(), what: "the folder", source })?;
    }
    std::fs::write(path, text).map_err(|source| Error::Write { flag, path: path.to_path_buf(), what, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_names_its_flag_file_or_field() {
        let missing = Path::new("/nonexistent/report.json");
        let e = read_json::<serde_json::Value>(Some("--selftest-report"), missing, "a self-test report").unwrap_err();
        assert!(e.to_string().starts_with("--selftest-report /nonexistent/report.json: "), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("r.json");
        std::fs::write(&bad, "{").unwrap();
        let e = read_json::<serde_json::Value>(None, &bad, "a SweepResult").unwrap_err();
        assert!(e.to_string().starts_with(&format!("{}: not a SweepResult: ", bad.display())), "{e}");
        let e = write_file(Some("--out"), &bad.join("x").join("y.json"), "the result", "{}").unwrap_err();
        assert!(e.to_string().starts_with(&format!("--out {}: cannot write the folder: ", bad.join("x").display())), "{e}");
        assert_eq!(Error::Unset { flag: "--node-name", var: "NODE_NAME" }.to_string(), "--node-name: not given and $NODE_NAME is not set");
        assert_eq!(
            Error::Flag { flag: "--concurrency", reason: "0 is outside 1..=1024".into() }.to_string(),
            "--concurrency: 0 is outside 1..=1024"
        );
        let e = Error::Value { flag: "--top-k", value: "9".into(), reason: "more than the 8 experts".into() };
        assert_eq!(e.to_string(), "--top-k 9: more than the 8 experts");
    }
}
