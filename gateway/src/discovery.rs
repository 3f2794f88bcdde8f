//! What the gateway knows of each upstream replica: whether it is healthy, which model names it
//! serves and how loaded it is, refreshed by one polling task per upstream (so a slow replica
//! never delays what is known of the others), plus the requests the gateway has in flight to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use serde_json::Value as Json;

use crate::metrics::Metrics;
use crate::proxy::UpstreamClient;

/// How long one poll request may take before the replica counts as unhealthy.
const POLL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest `/v1/models` or `/metrics` body read from a replica.
const MAX_POLL_BODY: usize = 8 << 20;

/// The load series a replica may export: brink's, and vLLM's under its own names.
const RUNNING_SERIES: &[&str] = &["brink_requests_running", "vllm:num_requests_running"];
const WAITING_SERIES: &[&str] = &["brink_requests_waiting", "vllm:num_requests_waiting"];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    pub healthy: bool,
    /// The names its `/v1/models` listed last time it answered (kept while it is unhealthy, so
    /// a request for a known model gets 503, not 404, while its replicas restart).
    pub models: Vec<String>,
    /// Running + waiting requests from its `/metrics`; 0 when it exports neither.
    pub reported_load: f64,
    /// Why it is unhealthy, for the log.
    pub problem: Option<String>,
}

/// What a cluster says of a replica (found through the Kubernetes API): the names its deployment
/// answers to, and the name the replica itself serves (requests are passed on under it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub models: Vec<String>,
    pub served_as: String,
}

pub struct Upstream {
    /// `http://host:port`, no trailing slash.
    pub base: String,
    seen: Mutex<Seen>,
    declared: Mutex<Option<Declared>>,
    in_flight: AtomicU64,
}

impl Upstream {
    pub fn new(base: String) -> Upstream {
        Upstream { base, seen: Mutex::default(), declared: Mutex::new(None), in_flight: AtomicU64::new(0) }
    }

    /// What routing uses: the last poll, with the deployment's names in place of the replica's
    /// own list when the cluster declared them.
    pub fn seen(&self) -> Seen {
        let mut seen = self.polled();
        if let Some(d) = self.declared() {
            seen.models = d.models;
        }
        seen
    }

    /// The last poll as it answered.
    fn polled(&self) -> Seen {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn declared(&self) -> Option<Declared> {
        self.declared.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_declared(&self, declared: Option<Declared>) {
        *self.declared.lock().unwrap_or_else(|p| p.into_inner()) = declared;
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn set(&self, seen: Seen, metrics: &Metrics) {
        metrics.upstream_healthy.with_label_values(&[&self.base]).set(i64::from(seen.healthy));
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = seen;
    }

    /// A connection to it failed while proxying: unhealthy until its next poll says otherwise,
    /// so requests stop trying it at once.
    pub fn mark_down(&self, why: &str, metrics: &Metrics) {
        let mut seen = self.polled();
        seen.healthy = false;
        seen.problem = Some(why.to_string());
        self.set(seen, metrics);
    }

    /// Counts a request in flight to it until the returned guard drops.
    pub fn start_request(self: &Arc<Self>, metrics: &Arc<Metrics>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        metrics.upstream_in_flight.with_label_values(&[&self.base]).inc();
        InFlight { upstream: self.clone(), metrics: metrics.clone() }
    }
}

/// One request in flight to an upstream (held by the response body until it ends).
pub struct InFlight {
    upstream: Arc<Upstream>,
    metrics: Arc<Metrics>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.upstream.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.metrics.upstream_in_flight.with_label_values(&[&self.upstream.base]).dec();
    }
}

/// Polls `upstream` every `interval` until the task is aborted; the first poll is at once.
pub async fn poll_forever(upstream: Arc<Upstream>, client: UpstreamClient, key: Option<String>, interval: Duration, metrics: Arc<Metrics>) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let seen = poll_once(&upstream, &client, key.as_deref()).await;
        let before = upstream.polled();
        if before.healthy != seen.healthy || before.models != seen.models {
            match &seen.problem {
                None => eprintln!("brink-gateway: {} healthy, serving {}", upstream.base, seen.models.join(", ")),
                Some(why) => eprintln!("brink-gateway: {} unhealthy: {why}", upstream.base),
            }
        }
        upstream.set(seen, &metrics);
    }
}

/// One look at an upstream: `/ready`, `/v1/models`, `/metrics`.
pub async fn poll_once(upstream: &Upstream, client: &UpstreamClient, key: Option<&str>) -> Seen {
    let previous = upstream.polled();
    let ready = fetch(client, &upstream.base, "/ready", key).await;
    let models = match fetch(client, &upstream.base, "/v1/models", key).await {
        Ok((StatusCode::OK, body)) => parse_models(&body).ok_or_else(|| "/v1/models: not an OpenAI model list".to_string()),
        Ok((status, _)) => Err(format!("/v1/models answered {status}")),
        Err(e) => Err(format!("/v1/models: {e}")),
    };
    let reported_load = match fetch(client, &upstream.base, "/metrics", key).await {
        Ok((StatusCode::OK, body)) => load_from_metrics(&String::from_utf8_lossy(&body)),
        _ => 0.0,
    };
    let problem = match (&ready, &models) {
        (Ok((StatusCode::OK, _)), Ok(_)) => None,
        (Ok((status, body)), _) if *status != StatusCode::OK => {
            Some(format!("/ready answered {status}: {}", String::from_utf8_lossy(body).trim()))
        }
        (Err(e), _) => Some(format!("/ready: {e}")),
        (_, Err(e)) => Some(e.clone()),
        _ => None,
    };
    Seen { healthy: problem.is_none(), models: models.unwrap_or(previous.models), reported_load, problem }
}

async fn fetch(client: &UpstreamClient, base: &str, path: &str, key: Option<&str>) -> Result<(StatusCode, Bytes), String> {
    let mut req = Request::get(format!("{base}{path}"));
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    let req = req.body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
    let work = async {
        let resp = client.request(req).await.map_err(|e| crate::proxy::describe_client_error(&e))?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), MAX_POLL_BODY).collect().await.map_err(|e| e.to_string())?;
        Ok((status, body.to_bytes()))
    };
    tokio::time::timeout(POLL_TIMEOUT, work).await.map_err(|_| format!("no answer in {POLL_TIMEOUT:?}"))?
}

/// The model ids of an OpenAI `/v1/models` body, each once, in its order.
pub fn parse_models(body: &[u8]) -> Option<Vec<String>> {
    let v: Json = serde_json::from_slice(body).ok()?;
    let mut out: Vec<String> = Vec::new();
    for m in v.get("data")?.as_array()? {
        let id = m.get("id")?.as_str()?.to_string();
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Some(out)
}

/// Running + waiting requests from a Prometheus text body (each series summed over its label
/// sets); 0 when the replica exports none of the known series.
pub fn load_from_metrics(text: &str) -> f64 {
    let mut running = None;
    let mut waiting = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = sample(line) else { continue };
        if RUNNING_SERIES.contains(&name) {
            *running.get_or_insert(0.0) += value;
        } else if WAITING_SERIES.contains(&name) {
            *waiting.get_or_insert(0.0) += value;
        }
    }
    let load: f64 = running.unwrap_or(0.0) + waiting.unwrap_or(0.0);
    if load.is_finite() && load > 0.0 { load } else { 0.0 }
}

/// `name{labels} value [timestamp]` → (name, value).
fn sample(line: &str) -> Option<(&str, f64)> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    if rest.starts_with('{') {
        // Skip the label set; a quoted value may hold `}` or spaces.
        let mut quoted = false;
        let mut escaped = false;
        let mut close = None;
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                '}' if !quoted => {
                    close = Some(i);
                    break;
                }
                _ => {}
            }
        }
        rest = &rest[close? + 1..];
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_is_running_plus_waiting() {
        let text = "# HELP brink_requests_running Sequences.\n# TYPE brink_requests_running gauge\n\
                    brink_requests_running 3\nbrink_requests_waiting 2\nbrink_requests_total 99\n";
        assert_eq!(load_from_metrics(text), 5.0);
        assert_eq!(load_from_metrics("brink_ready 1\n"), 0.0);
        assert_eq!(load_from_metrics(""), 0.0);
    }

    #[test]
    fn labelled_series_are_summed_and_vllm_names_read() {
        let text = "vllm:num_requests_running{model_name=\"a b}\",engine=\"0\"} 2\n\
                    vllm:num_requests_running{model_name=\"c\"} 1 1700000000\nvllm:num_requests_waiting{x=\"\\\"\"} 4\n";
        assert_eq!(load_from_metrics(text), 7.0);
    }

    #[test]
    fn garbage_metrics_are_load_zero() {
        assert_eq!(load_from_metrics("brink_requests_running NaN\nbrink_requests_waiting{oops 3\n}}}\n"), 0.0);
    }

    #[test]
    fn models_are_listed_once() {
        let body = br#"{"object":"list","data":[{"id":"a"},{"id":"b"},{"id":"a"}]}"#;
        assert_eq!(parse_models(body), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(parse_models(b"not json"), None);
        assert_eq!(parse_models(br#"{"data":[{"name":"a"}]}"#), None);
    }
}
