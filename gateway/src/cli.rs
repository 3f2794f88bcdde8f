//! The command line: flags into a [`Config`]. Every mistake is a message naming the flag, and
//! exit status 2.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::config::Config;
use crate::keys::Keys;

/// One OpenAI/Anthropic-compatible endpoint in front of serving replicas: routes each request by
/// its `model` to a healthy replica that serves it, by load and prompt-prefix affinity, and
/// retries refusals on another replica.
#[derive(Debug, Parser)]
#[command(name = "brink-gateway", version)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// A replica, `http://HOST:PORT` (repeat for each).
    #[arg(long = "upstream", value_name = "URL", required_unless_present = "kubernetes", conflicts_with = "kubernetes", value_parser = parse_upstream)]
    pub upstreams: Vec<String>,
    /// Find the replicas in the cluster instead (in-cluster service account, else the
    /// kubeconfig): every Serving, Ready replica of every ModelDeployment, watched.
    #[arg(long)]
    pub kubernetes: bool,
    /// With --kubernetes: route only to this namespace's replicas (repeat for each; default: all
    /// namespaces).
    #[arg(long = "namespace", value_name = "NS", conflicts_with = "upstreams")]
    pub namespaces: Vec<String>,
    /// Client API keys, one per line (`#` comments and blank lines skipped): requests must send
    /// `Authorization: Bearer KEY` or `x-api-key: KEY`.
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// The key sent to the replicas as `Authorization: Bearer` (its first line).
    #[arg(long, value_name = "FILE")]
    pub upstream_api_key_file: Option<PathBuf>,
    /// Most requests of one key in flight at once; the next gets 429 with `Retry-After: 1`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub per_key_concurrency: Option<u64>,
    /// Extra tries on other replicas for a request a replica refused before answering.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub retry_budget: usize,
    /// How often each replica's /ready (or /health), /v1/models and /metrics are read.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..))]
    pub poll_interval_ms: u64,
    /// Characters of the prompt that pick its replica by affinity (0: off).
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub affinity_prefix_chars: usize,
    /// Sequences each --upstream replica runs at once (its --slots): a prompt goes to the replica
    /// holding its prefix only while that one has a slot free (default: unknown; then only while
    /// it reports no queue and is within 4 requests of the least loaded).
    #[arg(long, value_name = "N", conflicts_with = "kubernetes", value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_slots: Option<u64>,
}

/// `http://host:port` (an optional trailing `/`), returned without the slash.
pub fn parse_upstream(s: &str) -> Result<String, String> {
    let uri: axum::http::Uri = s.parse().map_err(|e| format!("not a URL ({e}); expected http://HOST:PORT"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => return Err(format!("scheme {other}:// is not supported; expected http://HOST:PORT")),
        None => return Err("no scheme; expected http://HOST:PORT".into()),
    }
    let Some(authority) = uri.authority() else {
        return Err("no host; expected http://HOST:PORT".into());
    };
    if authority.host().is_empty() {
        return Err("no host; expected http://HOST:PORT".into());
    }
    if authority.as_str().contains('@') {
        return Err("user info is not supported; give the key with --upstream-api-key-file".into());
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err("a path is not supported; expected http://HOST:PORT".into());
    }
    Ok(format!("http://{authority}"))
}

/// A mistake in the flags: the message names the flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CliError(pub String);

impl Args {
    pub fn into_config(self) -> Result<Config, CliError> {
        let mut config = Config::new(self.upstreams);
        config.kubernetes = self.kubernetes;
        config.namespaces = self.namespaces;
        if let Some(path) = &self.api_key_file {
            let keys = Keys::parse_file(&read("--api-key-file", path)?);
            if keys.is_empty() {
                return Err(CliError(format!("--api-key-file {}: holds no key", path.display())));
            }
            config.api_keys = keys;
        }
        if let Some(path) = &self.upstream_api_key_file {
            let key = Keys::parse_file(&read("--upstream-api-key-file", path)?).into_iter().next();
            let Some(key) = key else {
                return Err(CliError(format!("--upstream-api-key-file {}: holds no key", path.display())));
            };
            if axum::http::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
                return Err(CliError(format!("--upstream-api-key-file {}: the key is not a valid header value", path.display())));
            }
            config.upstream_api_key = Some(key);
        }
        config.per_key_concurrency = self.per_key_concurrency.map(|n| n as usize);
        config.retry_budget = self.retry_budget;
        config.poll_interval = Duration::from_millis(self.poll_interval_ms);
        config.affinity_prefix_chars = self.affinity_prefix_chars;
        config.upstream_slots = self.upstream_slots;
        Ok(config)
    }
}

fn read(flag: &str, path: &std::path::Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| CliError(format!("{flag} {}: cannot read it: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        assert_eq!(parse_upstream("http://127.0.0.1:8080"), Ok("http://127.0.0.1:8080".into()));
        assert_eq!(parse_upstream("http://replica-0.brink:8080/"), Ok("http://replica-0.brink:8080".into()));
        assert_eq!(parse_upstream("http://[::1]:9"), Ok("http://[::1]:9".into()));
        for bad in ["127.0.0.1:8080", "https://a:1", "http://a:1/v1", "http://", "nonsense url", "http://u:p@a:1"] {
            assert!(parse_upstream(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn flags_make_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        std::fs::write(&keys, "k1\nk2\n").unwrap();
        let args = Args::try_parse_from([
            "brink-gateway",
            "--upstream",
            "http://a:1",
            "--upstream",
            "http://b:2",
            "--api-key-file",
            keys.to_str().unwrap(),
            "--per-key-concurrency",
            "3",
            "--retry-budget",
            "1",
            "--upstream-slots",
            "2",
        ])
        .unwrap();
        let c = args.into_config().unwrap();
        assert_eq!(c.upstream_slots, Some(2));
        assert_eq!(c.upstreams, vec!["http://a:1".to_string(), "http://b:2".to_string()]);
        assert_eq!(c.api_keys, vec!["k1".to_string(), "k2".to_string()]);
        assert_eq!((c.per_key_concurrency, c.retry_budget, c.affinity_prefix_chars), (Some(3), 1, 2048));
    }

    #[test]
    fn mistakes_name_the_flag() {
        let e = Args::try_parse_from(["brink-gateway", "--upstream", "https://a:1"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--upstream"), "{e}");
        let e = Args::try_parse_from(["brink-gateway", "--upstream", "http://a:1", "--api-key-file", "/nonexistent/keys"])
            .unwrap()
            .into_config()
            .unwrap_err();
        assert!(e.0.starts_with("--api-key-file /nonexistent/keys: cannot read it"), "{e}");
        assert!(Args::try_parse_from(["brink-gateway", "--upstream", "http://a:1", "--per-key-concurrency", "0"]).is_err());
        let e = Args::try_parse_from(["brink-gateway", "--upstream", "http://a:1", "--upstream-slots", "0"]).unwrap_err();
        assert!(e.to_string().contains("--upstream-slots"), "{e}");
        // In a cluster the deployment says how many slots each replica has.
        assert!(Args::try_parse_from(["brink-gateway", "--kubernetes", "--upstream-slots", "2"]).is_err());
        // One source of replicas: URLs or the cluster, never both, never neither.
        assert!(Args::try_parse_from(["brink-gateway"]).is_err());
        assert!(Args::try_parse_from(["brink-gateway", "--upstream", "http://a:1", "--kubernetes"]).is_err());
        assert!(Args::try_parse_from(["brink-gateway", "--upstream", "http://a:1", "--namespace", "x"]).is_err());
        assert!(Args::try_parse_from(["brink-gateway", "--namespace", "x"]).is_err());
        let c =
            Args::try_parse_from(["brink-gateway", "--kubernetes", "--namespace", "a", "--namespace", "b"]).unwrap().into_config().unwrap();
        assert!(c.kubernetes && c.upstreams.is_empty());
        assert_eq!(c.namespaces, ["a", "b"]);
    }
}
