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

/// The load series a replica may export: brink's, vLLM's, and llama.cpp's server's (with
/// `--metrics`: requests in a slot, and requests deferred for want of a free slot).
const RUNNING_SERIES: &[&str] = &["brink_requests_running", "vllm:num_requests_running", "llamacpp:requests_processing"];
const WAITING_SERIES: &[&str] = &["brink_requests_waiting", "vllm:num_requests_waiting", "llamacpp:requests_deferred"];
/// KV cache use as a fraction 0..1: vLLM's (the older name, then the newer) and older
/// llama.cpp servers' (the pinned one exports none); brink's is
/// `brink_kv_blocks_used / brink_kv_blocks_total`.
const KV_FRACTION_SERIES: &[&str] = &["vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    pub healthy: bool,
    /// The names its `/v1/models` listed last time it answered (kept while it is unhealthy, so
    /// a request for a known model gets 503, not 404, while its replicas restart).
    pub models: Vec<String>,
    /// What its `/metrics` said of its load (all 0 / unknown when it exports none of it).
    pub load: Load,
    /// The gateway's own requests in flight to it when that `/metrics` answered (they are in
    /// its running and waiting counts, and counted fresh by the gateway instead).
    pub ours_at_poll: u64,
    /// Tokens per sequence, from its `/engine` (brink) or `/v1/models` (vLLM's `max_model_len`).
    pub context: Option<u64>,
    /// Why it is unhealthy, for the log.
    pub problem: Option<String>,
}

/// A replica's load as its `/metrics` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    pub running: f64,
    pub waiting: f64,
    /// KV cache blocks held by sequences, as a fraction of the cache; none when not exported.
    pub kv_use: Option<f64>,
}

/// What a cluster says of a replica (found through the Kubernetes API): the names its deployment
/// answers to, and the name the replica itself serves (requests are passed on under it), and
/// the serving limits it was started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub models: Vec<String>,
    pub served_as: String,
    /// Sequences it serves at once (`serving.concurrency`).
    pub slots: Option<u64>,
    /// Tokens per sequence (`serving.context`).
    pub context: Option<u64>,
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
            // What the replica says of itself wins over what it was started with.
            seen.context = seen.context.or(d.context);
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

/// One look at an upstream: `/ready` (or `/health`), `/v1/models`, `/engine`, `/metrics`.
pub async fn poll_once(upstream: &Upstream, client: &UpstreamClient, key: Option<&str>) -> Seen {
    let previous = upstream.polled();
    let mut probe = "/ready";
    let mut ready = fetch(client, &upstream.base, probe, key).await;
    if has_no_ready(&ready) {
        probe = "/health";
        ready = fetch(client, &upstream.base, probe, key).await;
    }
    let mut listed_context = None;
    let models = match fetch(client, &upstream.base, "/v1/models", key).await {
        Ok((StatusCode::OK, body)) => {
            listed_context = context_from_models(&body);
            parse_models(&body).ok_or_else(|| "/v1/models: not an OpenAI model list".to_string())
        }
        Ok((status, _)) => Err(format!("/v1/models answered {status}")),
        Err(e) => Err(format!("/v1/models: {e}")),
    };
    let context = match fetch(client, &upstream.base, "/engine", key).await {
        Ok((StatusCode::OK, body)) => context_from_engine(&body),
        _ => None,
    };
    let context = context.or(listed_context);
    // The gateway's requests in flight as the metrics come back: the most of before and after,
    // so one that finished meanwhile is taken as counted there (a replica that looks a little
    // less busy, never busier than it is).
    let ours_before = upstream.in_flight();
    let (load, ours_at_poll) = match fetch(client, &upstream.base, "/metrics", key).await {
        Ok((StatusCode::OK, body)) => (load_from_metrics(&String::from_utf8_lossy(&body)), ours_before.max(upstream.in_flight())),
        _ => (Load::default(), 0),
    };
    let problem = not_ready(probe, &ready).or_else(|| models.as_ref().err().cloned());
    Seen { healthy: problem.is_none(), models: models.unwrap_or(previous.models), load, ours_at_poll, context, problem }
}

/// `/ready` answered 404: an engine without one (llama.cpp's server, vLLM), whose `/health`
/// says instead (200 once its model is loaded; llama.cpp's is 503 while loading). Any other
/// answer, a failure included, is the replica's readiness as it is.
pub fn has_no_ready(answer: &Result<(StatusCode, Bytes), String>) -> bool {
    matches!(answer, Ok((StatusCode::NOT_FOUND, _)))
}

/// Why the answer of readiness probe `path` says unhealthy; none when it is 200.
pub fn not_ready(path: &str, answer: &Result<(StatusCode, Bytes), String>) -> Option<String> {
    match answer {
        Ok((StatusCode::OK, _)) => None,
        Ok((status, body)) => Some(format!("{path} answered {status}: {}", String::from_utf8_lossy(body).trim())),
        Err(e) => Some(format!("{path}: {e}")),
    }
}

async fn fetch(client: &UpstreamClient, base: &str, path: &str, key: Option<&str>) -> Result<(StatusCode, Bytes), String> {
    let request = || {
        let mut req = Request::get(format!("{base}{path}"));
        if let Some(k) = key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        req.body(Full::new(Bytes::new())).map_err(|e| e.to_string())
    };
    let work = async {
        // A pooled connection the replica closed as the poll went out: a GET is sent again once,
        // on a new connection, rather than marking the replica down.
        let resp = match client.request(request()?).await {
            Err(e) if crate::proxy::closed_before_response(&e) => client.request(request()?).await,
            first => first,
        };
        let resp = resp.map_err(|e| crate::proxy::describe_client_error(&e))?;
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

/// The context brink's `GET /engine` reports (`{"context": N, ...}`).
pub fn context_from_engine(body: &[u8]) -> Option<u64> {
    let v: Json = serde_json::from_slice(body).ok()?;
    v.get("context")?.as_u64().filter(|&c| c > 0)
}

/// The context vLLM lists with its model (`max_model_len`), the smallest when it lists several.
pub fn context_from_models(body: &[u8]) -> Option<u64> {
    let v: Json = serde_json::from_slice(body).ok()?;
    v.get("data")?.as_array()?.iter().filter_map(|m| m.get("max_model_len")?.as_u64()).filter(|&c| c > 0).min()
}

/// Running and waiting requests and KV cache use from a Prometheus text body (each series
/// summed over its label sets); 0 (and no KV use) for what the replica does not export or
/// exports as garbage.
pub fn load_from_metrics(text: &str) -> Load {
    let (mut running, mut waiting, mut kv_fraction) = (0.0, 0.0, None::<f64>);
    let (mut blocks_used, mut blocks_total) = (None::<f64>, None::<f64>);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = sample(line) else { continue };
        if !value.is_finite() || value < 0.0 {
            continue;
        }
        if RUNNING_SERIES.contains(&name) {
            running += value;
        } else if WAITING_SERIES.contains(&name) {
            waiting += value;
        } else if KV_FRACTION_SERIES.contains(&name) {
            // One engine per replica: several label sets (engines of a data-parallel vLLM)
            // are as full as the fullest.
            kv_fraction = Some(kv_fraction.map_or(value, |k| k.max(value)));
        } else if name == "brink_kv_blocks_used" {
            *blocks_used.get_or_insert(0.0) += value;
        } else if name == "brink_kv_blocks_total" {
            *blocks_total.get_or_insert(0.0) += value;
        }
    }
    let kv_blocks = match (blocks_used, blocks_total) {
        (Some(used), Some(total)) if total > 0.0 => Some(used / total),
        _ => None,
    };
    let kv_use = kv_blocks.or(kv_fraction).map(|k| k.clamp(0.0, 1.0));
    Load { running, waiting, kv_use }
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

    fn load(running: f64, waiting: f64, kv_use: Option<f64>) -> Load {
        Load { running, waiting, kv_use }
    }

    #[test]
    fn load_is_running_waiting_and_kv_blocks() {
        let text = "# HELP brink_requests_running Sequences.\n# TYPE brink_requests_running gauge\n\
                    brink_requests_running 3\nbrink_requests_waiting 2\nbrink_requests_total 99\n\
                    brink_kv_blocks_total 400\nbrink_kv_blocks_used 100\nbrink_kv_blocks_cached 250\n";
        assert_eq!(load_from_metrics(text), load(3.0, 2.0, Some(0.25)));
        assert_eq!(load_from_metrics("brink_ready 1\n"), Load::default());
        assert_eq!(load_from_metrics(""), Load::default());
        // No cache yet (total 0): no KV use rather than a division by zero.
        assert_eq!(load_from_metrics("brink_kv_blocks_total 0\nbrink_kv_blocks_used 0\n"), Load::default());
    }

    #[test]
    fn labelled_series_are_summed_and_vllm_names_read() {
        let text = "vllm:num_requests_running{model_name=\"a b}\",engine=\"0\"} 2\n\
                    vllm:num_requests_running{model_name=\"c\"} 1 1700000000\nvllm:num_requests_waiting{x=\"\\\"\"} 4\n\
                    vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n";
        assert_eq!(load_from_metrics(text), load(3.0, 4.0, Some(0.75)));
        assert_eq!(load_from_metrics("vllm:gpu_cache_usage_perc 1.5\n"), load(0.0, 0.0, Some(1.0)));
    }

    #[test]
    fn llama_cpp_server_metrics_are_read() {
        // What the pinned llama.cpp's `llama-server --metrics` (llama-cpp-python 0.3.36's
        // vendored source) answers, its load gauges and a few of the other series around them.
        let text = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n\
                    # TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 14\n\
                    # HELP llamacpp:tokens_predicted_total Number of generation tokens processed\n\
                    # TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 7\n\
                    # HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)\n\
                    # TYPE llamacpp:n_tokens_max counter\nllamacpp:n_tokens_max 18\n\
                    # HELP llamacpp:requests_processing Number of requests processing\n\
                    # TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n\
                    # HELP llamacpp:requests_deferred Number of requests deferred\n\
                    # TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 5\n\
                    # HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call\n\
                    # TYPE llamacpp:n_busy_slots_per_decode gauge\nllamacpp:n_busy_slots_per_decode 1.5\n";
        assert_eq!(load_from_metrics(text), load(2.0, 5.0, None));
        // Older servers also export the KV cache's use as a fraction.
        let older = "llamacpp:kv_cache_usage_ratio 0.375\nllamacpp:kv_cache_tokens 384\nllamacpp:requests_processing 1\n";
        assert_eq!(load_from_metrics(older), load(1.0, 0.0, Some(0.375)));
    }

    #[test]
    fn health_is_asked_only_where_ready_is_missing() {
        let answer = |status: u16, body: &'static str| Ok((StatusCode::from_u16(status).unwrap(), Bytes::from_static(body.as_bytes())));
        // llama.cpp's server: no /ready.
        let missing = answer(404, r#"{"error":{"message":"File Not Found","type":"not_found_error","code":404}}"#);
        assert!(has_no_ready(&missing));
        // brink's /ready while loading or draining, or a failure: the replica's own answer.
        for other in [answer(200, ""), answer(503, "loading"), Err("connection refused".to_string())] {
            assert!(!has_no_ready(&other), "{other:?}");
        }
        assert_eq!(not_ready("/health", &answer(200, r#"{"status":"ok"}"#)), None);
        assert_eq!(
            not_ready("/health", &answer(503, "{\"error\":{\"code\":503,\"message\":\"Loading model\"}}\n")).as_deref(),
            Some(r#"/health answered 503 Service Unavailable: {"error":{"code":503,"message":"Loading model"}}"#)
        );
        // An engine with neither: unhealthy, named by the probe it fell back to.
        assert_eq!(not_ready("/health", &answer(404, "")).as_deref(), Some("/health answered 404 Not Found: "));
        assert_eq!(not_ready("/ready", &Err("no answer in 5s".into())).as_deref(), Some("/ready: no answer in 5s"));
    }

    #[test]
    fn garbage_metrics_are_load_zero() {
        let text =
            "brink_requests_running NaN\nbrink_requests_waiting{oops 3\n}}}\nbrink_requests_waiting -4\nvllm:kv_cache_usage_perc inf\n";
        assert_eq!(load_from_metrics(text), Load::default());
    }

    #[test]
    fn context_from_brink_and_vllm() {
        assert_eq!(context_from_engine(br#"{"ready":true,"context":26000,"restarts":0}"#), Some(26000));
        assert_eq!(context_from_engine(br#"{"ready":false,"context":null}"#), None);
        assert_eq!(context_from_engine(b"<html>"), None);
        let vllm = br#"{"object":"list","data":[{"id":"m","max_model_len":32768},{"id":"lora","max_model_len":8192}]}"#;
        assert_eq!(context_from_models(vllm), Some(8192));
        assert_eq!(context_from_models(br#"{"data":[{"id":"m"}]}"#), None);
    }

    #[test]
    fn models_are_listed_once() {
        let body = br#"{"object":"list","data":[{"id":"a"},{"id":"b"},{"id":"a"}]}"#;
        assert_eq!(parse_models(body), Some(vec!["a".to_string(), "b".to_string()]));
        assert_eq!(parse_models(b"not json"), None);
        assert_eq!(parse_models(br#"{"data":[{"name":"a"}]}"#), None);
    }
}
