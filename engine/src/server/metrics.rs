//! The `/metrics` table: every `brink_*` counter and gauge read from the [`Heartbeat`], the
//! handlers' [`HttpCounters`] and the telemetry store, then the agent's node gauges; and the
//! whole Prometheus body. The OTLP export reads the same table.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::state::{Heartbeat, HttpCounters};
use super::telemetry::prometheus::{render_histogram, render_scalars};
use super::telemetry::{Kind, REQUEST_DURATION, Scalar, TOKEN_USAGE, TPOT, TTFT};

/// Every `brink_*` counter and gauge, read from the stores, then the agent's node gauges.
pub fn scalars(hb: &Heartbeat, http: &HttpCounters) -> Vec<Scalar> {
    let mut table = server_scalars(hb, http);
    if let Some(node) = hb.telemetry.node.get() {
        for s in node.read() {
            if !table.iter().any(|t| t.name == s.name) {
                table.push(s);
            }
        }
    }
    table
}

fn server_scalars(hb: &Heartbeat, http: &HttpCounters) -> Vec<Scalar> {
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
    let one = |name, kind, help, value: f64| Scalar { name, kind, help, samples: vec![(Vec::new(), value)] };
    let t = &hb.telemetry;
    use Kind::{Counter, Gauge};
    let stalls = hb
        .stalls
        .lock()
        .map(|m| m.iter().map(|((layer, op), &c)| (vec![("layer", layer.clone()), ("op", op.clone())], c as f64)).collect())
        .unwrap_or_default();
    let launch_errors = t
        .kernel_launch_errors
        .lock()
        .map(|m| m.iter().map(|((kernel, phase), &c)| (vec![("kernel", kernel.clone()), ("phase", phase.clone())], c as f64)).collect())
        .unwrap_or_default();
    vec![
        one("brink_requests_total", Counter, "Generation requests received.", n(&http.requests)),
        one("brink_request_errors_total", Counter, "Generation requests answered with an error.", n(&http.errors)),
        one("brink_prompt_tokens_total", Counter, "Prompt tokens admitted.", n(&hb.prompt_tokens)),
        one("brink_completion_tokens_total", Counter, "Tokens generated.", n(&hb.completion_tokens)),
        one("brink_engine_steps_total", Counter, "Engine forward passes.", n(&hb.steps)),
        one("brink_engine_failed_steps_total", Counter, "Engine forward passes that failed.", n(&hb.failed_steps)),
        one("brink_requests_running", Gauge, "Sequences in the running batch.", n(&hb.running)),
        one("brink_requests_waiting", Gauge, "Sequences waiting for admission (the queue depth).", n(&hb.waiting)),
        one("brink_ready", Gauge, "1 once the model is loaded.", f64::from(u8::from(hb.ready.load(Ordering::Acquire)))),
        one("brink_seconds_since_progress", Gauge, "Seconds since the engine last made progress.", hb.since_progress().as_secs_f64()),
        one("brink_engine_restarts_total", Counter, "Engine child restarts after a stall or crash.", n(&hb.restarts)),
        one(
            "brink_requests_requeued_total",
            Counter,
            "Requests in flight when the engine died or stalled, run again on the restarted engine (their client saw no error).",
            n(&hb.requeued),
        ),
        one(
            "brink_engine_restart_seconds",
            Gauge,
            "Kill (or death) to ready of the last engine restart, without back-off waits.",
            secs(&hb.last_restart_micros),
        ),
        one("brink_engine_pid", Gauge, "The engine child's process id (0 while none runs).", n(&hb.engine_pid)),
        one("brink_quarantined_prompts", Gauge, "Prompt lengths under the poison quarantine.", n(&hb.quarantined)),
        Scalar {
            name: "brink_stalls_total",
            kind: Counter,
            help: "Engine stalls caught by the watchdog, by the layer and op the board named.",
            samples: stalls,
        },
        Scalar {
            name: "brink_kernel_launch_errors_total",
            kind: Counter,
            help: "Engine steps failed by a kernel launch, by kernel and phase (plan: refused against the device's limits; launch: \
                   rejected by the driver; execution: a fault found by the diagnostic synchronise). None on the CPU backend.",
            samples: launch_errors,
        },
        one("brink_prefill_tokens_total", Counter, "Prompt tokens computed by prefill chunks.", n(&t.prefill_tokens)),
        one(
            "brink_prefill_seconds_total",
            Counter,
            "Engine step time spent on prefill tokens (a mixed step is split by token count); rate(tokens)/rate(seconds) is tokens/s.",
            secs(&t.prefill_micros),
        ),
        one("brink_decode_tokens_total", Counter, "Tokens computed by decode steps.", n(&t.decode_tokens)),
        one(
            "brink_decode_seconds_total",
            Counter,
            "Engine step time spent on decode tokens (a mixed step is split by token count).",
            secs(&t.decode_micros),
        ),
        one(
            "brink_prefix_cached_tokens_total",
            Counter,
            "Prompt tokens read from the prefix cache instead of computed.",
            n(&t.cached_prompt_tokens),
        ),
        one("brink_kv_blocks_total", Gauge, "KV cache blocks of the engine's paged cache.", n(&t.kv_blocks_total)),
        one("brink_kv_blocks_used", Gauge, "KV cache blocks held by sequences.", n(&t.kv_blocks_used)),
        one("brink_kv_blocks_cached", Gauge, "KV cache blocks kept for prefix reuse that no sequence holds.", n(&t.kv_blocks_cached)),
    ]
}

/// The whole `/metrics` body.
pub fn render(hb: &Heartbeat, scalars: &[Scalar]) -> String {
    let mut out = String::new();
    render_scalars(&mut out, scalars);
    // Kept from before the GenAI histogram (scripts read it); the same observations.
    out += "# HELP brink_time_to_first_token_seconds Time from submission to the first generated token.\n\
            # TYPE brink_time_to_first_token_seconds summary\n";
    let _ = writeln!(out, "brink_time_to_first_token_seconds_sum {}", hb.ttft_micros_sum.load(Ordering::Relaxed) as f64 / 1e6);
    let _ = writeln!(out, "brink_time_to_first_token_seconds_count {}", hb.ttft_count.load(Ordering::Relaxed));
    let t = &hb.telemetry;
    for (m, h) in [(&TTFT, &t.ttft), (&TPOT, &t.tpot), (&REQUEST_DURATION, &t.duration), (&TOKEN_USAGE, &t.tokens)] {
        render_histogram(&mut out, m, h);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::model::KernelLaunchFailure;
    use crate::server::telemetry::prometheus::parse_exposition;
    use crate::server::telemetry::{GenAiLabels, NodeMetrics};

    fn launch_failure(kernel: &str, phase: &str) -> KernelLaunchFailure {
        KernelLaunchFailure { kernel: kernel.into(), phase: phase.into(), error: "CUDA_ERROR_INVALID_VALUE".into(), sticky: false }
    }

    #[test]
    fn kernel_launch_errors_are_counted_by_kernel_and_phase() {
        let hb = Heartbeat::new();
        let table = |hb: &Heartbeat| {
            scalars(hb, &HttpCounters::default()).into_iter().find(|s| s.name == "brink_kernel_launch_errors_total").unwrap()
        };
        // The CPU backend never fails a launch: the counter is there, with no series.
        let none = table(&hb);
        assert_eq!((none.kind, none.samples.len()), (Kind::Counter, 0));
        for (k, p) in [("moe_gemv_q4_0", "launch"), ("moe_gemv_q4_0", "launch"), ("router", "plan")] {
            hb.telemetry.record_kernel_launch_error(&launch_failure(k, p));
        }
        let got: Vec<(String, String, f64)> = table(&hb).samples.into_iter().map(|(l, v)| (l[0].1.clone(), l[1].1.clone(), v)).collect();
        assert_eq!(got, [("moe_gemv_q4_0".into(), "launch".into(), 2.0), ("router".into(), "plan".into(), 1.0)]);
    }

    #[test]
    fn node_metrics_are_appended_and_may_not_shadow_the_servers() {
        let hb = Heartbeat::new();
        let server = scalars(&hb, &HttpCounters::default()).len();
        let gauge = |name, v| Scalar { name, kind: Kind::Gauge, help: "h", samples: vec![(vec![("gpu_uuid", "GPU-1".to_string())], v)] };
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        hb.telemetry
            .node
            .set(NodeMetrics::new(move || {
                c.fetch_add(1, Ordering::Relaxed);
                vec![gauge("brink_gpu_temperature_celsius", 61.0), gauge("brink_requests_total", 99.0)]
            }))
            .unwrap();
        let table = scalars(&hb, &HttpCounters::default());
        assert_eq!(table.len(), server + 1, "the repeated name is dropped");
        assert_eq!(table.last().unwrap().samples[0].1, 61.0);
        assert_ne!(table.iter().find(|s| s.name == "brink_requests_total").unwrap().samples[0].1, 99.0);
        scalars(&hb, &HttpCounters::default());
        assert_eq!(calls.load(Ordering::Relaxed), 2, "read at every call, not cached here");
    }

    /// docs/metrics.md names every series the server exposes.
    #[test]
    fn every_series_is_documented() {
        let doc = include_str!("../../../docs/metrics.md");
        let hb = Heartbeat::new();
        let mut names: Vec<String> = scalars(&hb, &HttpCounters::default()).iter().map(|s| s.name.to_string()).collect();
        names.extend([TTFT, TPOT, REQUEST_DURATION, TOKEN_USAGE].iter().map(|m| m.prom.to_string()));
        names.push("brink_time_to_first_token_seconds".into());
        for n in names {
            // Pairs share a row: `brink_prefill_tokens_total`, `brink_prefill_seconds_total`.
            assert!(doc.contains(&format!("`{n}`")), "{n} is not in docs/metrics.md");
        }
    }

    #[test]
    fn the_render_parses_and_carries_every_series() {
        let hb = Heartbeat::new();
        hb.record_stall("layer 3".into(), "moe \"gate\"".into());
        let labels = GenAiLabels { operation: "chat", model: "we\\ird\nname".into() };
        hb.telemetry.first_token(&labels, Duration::from_millis(20));
        let text = render(&hb, &scalars(&hb, &HttpCounters::default()));
        let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let find = |name: &str| samples.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}\n{text}"));
        let count = find("gen_ai_server_time_to_first_token_seconds_count");
        assert_eq!(count.value, 1.0);
        assert_eq!(count.label("gen_ai_request_model"), Some("we\\ird\nname"));
        assert_eq!(count.label("gen_ai_operation_name"), Some("chat"));
        // Upper bounds are inclusive: 20 ms counts in le="0.02".
        let b = samples.iter().find(|s| s.name.ends_with("_first_token_seconds_bucket") && s.label("le") == Some("0.02")).unwrap();
        assert_eq!(b.value, 1.0);
        assert_eq!(find("brink_stalls_total").label("op"), Some("moe \"gate\""));
        for name in
            ["brink_requests_total", "brink_kv_blocks_used", "brink_prefill_tokens_total", "brink_time_to_first_token_seconds_count"]
        {
            find(name);
        }
    }
}
