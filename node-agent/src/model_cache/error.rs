//! Every way making a model available can fail, each naming the file, URL or field at fault.

use std::path::{Path, PathBuf};

use super::evict::NoRoom;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{during} {}: {source}", path.display())]
    Io {
        during: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the cache index {} is unreadable: {message}", path.display())]
    Index { path: PathBuf, message: String },
    #[error("{field}: {value:?} is not a sha256 (64 hexadecimal digits)")]
    BadSha256 { field: String, value: String },
    #[error("the model source lists no files")]
    NoParts,
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{url}: the server answered {status}")]
    Status { url: String, status: u16 },
    #[error(
        "{url}: the server did not say how large the file is (no Content-Length or Content-Range), so the disk budget cannot be checked"
    )]
    UnknownSize { url: String },
    #[error("{url}: the transfer stopped after {attempts} attempts at byte {at} of {total}: {last}")]
    Interrupted { url: String, attempts: u32, at: u64, total: u64, last: String },
    #[error("{url}: checksum mismatch: expected sha256 {expected}, got {actual}; the downloaded file was removed")]
    Checksum { url: String, expected: String, actual: String },
    #[error("{}: checksum mismatch: expected sha256 {expected}, got {actual}", path.display())]
    LocalChecksum { path: PathBuf, expected: String, actual: String },
    #[error("{}: {message}", path.display())]
    Header { path: PathBuf, message: String },
    #[error("the disk budget: {0}")]
    NoRoom(#[from] NoRoom),
    #[error("model {sha256} is already being downloaded by another task; try again when it is done")]
    Busy { sha256: String },
    #[error(
        "{url}: the GGUF header is not complete in the first {cap} bytes (metadata and tensor infos); raise the header cap or check that the URL is a GGUF file"
    )]
    HeaderTooLarge { url: String, cap: u64 },
    #[error(
        "{url}: the server ignores Range requests (it answered 200 with the whole file), so the header cannot be read without downloading the model; its facts will be written when a node downloads it"
    )]
    NoRanges { url: String },
    #[error("a background task failed: {0}")]
    Task(String),
}

impl CacheError {
    pub fn io(during: &'static str, path: &Path, source: std::io::Error) -> Self {
        CacheError::Io { during, path: path.to_path_buf(), source }
    }
}
