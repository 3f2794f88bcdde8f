//! Retries against stub upstreams: a refusal before any response byte (503, a closed port) goes
//! to the next replica; past the budget the client gets the last replica's own answer.
//! Affinity is off here, so with equal loads the order is the `--upstream` order (A first).

mod common;

use common::*;
use serde_json::json;

fn no_affinity(stubs: &[&Stub]) -> brink_gateway::Config {
    let mut c = config(stubs);
    c.affinity_prefix_chars = 0;
    c
}

/// The model is listed once one replica is healthy; a retry needs every replica healthy, or the
/// first one's refusal has nowhere to go.
async fn wait_all_healthy(gw: &Gateway, stubs: &[&Stub]) {
    wait_models(gw, &[], &["m"]).await;
    let t0 = std::time::Instant::now();
    for s in stubs {
        while metric(&metrics(gw).await, "brink_gateway_upstream_healthy", &[("upstream", &s.url)]) != Some(1.0) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(30), "{} never became healthy", s.url);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_is_retried_on_another_replica() {
    let a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    a.refuse_with(Some(503));
    let gw = gateway(no_affinity(&[&a, &b])).await;
    wait_all_healthy(&gw, &[&a, &b]).await;
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("m", "hi")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["answered_by"], "B");
    assert_eq!((a.hits().len(), b.hits().len()), (1, 1), "A refused first, then B answered");
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_retries_total", &[("model", "m"), ("reason", "http_503")]), Some(1.0), "{m}");
    assert_eq!(metric(&m, "brink_gateway_requests_total", &[("model", "m"), ("upstream", &a.url), ("status", "503")]), Some(1.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_its_head_before_any_body_is_retried_on_another_replica() {
    let a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    *a.state.cut_after_head.lock().unwrap() = true;
    b.state.gate.add_permits(1);
    let gw = gateway(no_affinity(&[&a, &b])).await;
    wait_all_healthy(&gw, &[&a, &b]).await;
    let mut body = chat("m", "stream me");
    body["stream"] = json!(true);
    let r = post(&format!("{}/v1/chat/completions", gw.url), &body).await;
    // The client sees B's whole stream and nothing of A's: the head A sent never reached it.
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.starts_with("data: {") && r.body.ends_with("data: [DONE]\n\n"), "{}", r.body);
    assert!(r.body.contains(r#""answered_by":"B""#) && !r.body.contains(r#""answered_by":"A""#), "{}", r.body);
    assert_eq!((a.hits().len(), b.hits().len()), (1, 1), "A cut the stream, then B answered");
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_retries_total", &[("model", "m"), ("reason", "closed_before_body")]), Some(1.0), "{m}");
    assert_eq!(metric(&m, "brink_gateway_requests_total", &[("model", "m"), ("upstream", &a.url), ("status", "error")]), Some(1.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_too() {
    let a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    a.refuse_with(Some(429));
    let gw = gateway(no_affinity(&[&a, &b])).await;
    wait_all_healthy(&gw, &[&a, &b]).await;
    let r = post(&format!("{}/v1/messages", gw.url), &json!({"model": "m", "max_tokens": 1, "messages": []})).await;
    assert_eq!((r.status, r.json()["answered_by"].clone()), (200, json!("B")), "{}", r.body);
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_retries_total", &[("model", "m"), ("reason", "http_429")]), Some(1.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_retried_on_another_replica() {
    let mut a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    let gw = gateway(no_affinity(&[&a, &b])).await;
    wait_all_healthy(&gw, &[&a, &b]).await;
    // A goes away after discovery saw it healthy (the next poll is an hour off).
    a.stop().await;
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("m", "hi")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["answered_by"], "B");
    let m = metrics(&gw).await;
    let retried = |m: &str| -> f64 {
        ["connect_failed", "connection_closed", "connection_reset", "connection_error"]
            .iter()
            .filter_map(|reason| metric(m, "brink_gateway_retries_total", &[("model", "m"), ("reason", reason)]))
            .sum()
    };
    assert_eq!(retried(&m), 1.0, "{m}");
    assert_eq!(metric(&m, "brink_gateway_requests_total", &[("model", "m"), ("upstream", &a.url), ("status", "error")]), Some(1.0), "{m}");
    // The failed replica is out until discovery sees it again: the next request goes straight to B.
    assert_eq!(metric(&m, "brink_gateway_upstream_healthy", &[("upstream", &a.url)]), Some(0.0), "{m}");
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("m", "again")).await;
    assert_eq!(r.json()["answered_by"], "B");
    assert_eq!(retried(&metrics(&gw).await), 1.0, "no second retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_the_last_replicas_error_is_returned() {
    let a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    let c = Stub::start("C", &["m"]).await;
    for s in [&a, &b, &c] {
        s.refuse_with(Some(503));
    }
    let mut config = no_affinity(&[&a, &b, &c]);
    config.retry_budget = 1;
    let gw = gateway(config).await;
    wait_models(&gw, &[], &["m"]).await;
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("m", "hi")).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.json()["error"]["message"], "stub B refused", "the upstream's own body");
    assert_eq!(r.header("retry-after"), Some("7"), "the upstream's own headers");
    assert_eq!((a.hits().len(), b.hits().len(), c.hits().len()), (1, 1, 0), "one try and one retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_gone_is_a_502_naming_the_failure() {
    let mut a = Stub::start("A", &["m"]).await;
    let mut b = Stub::start("B", &["m"]).await;
    let gw = gateway(no_affinity(&[&a, &b])).await;
    wait_models(&gw, &[], &["m"]).await;
    a.stop().await;
    b.stop().await;
    let r = post(&format!("{}/v1/messages", gw.url), &json!({"model": "m", "max_tokens": 1, "messages": []})).await;
    assert_eq!(r.status, 502, "{}", r.body);
    assert_eq!((r.json()["type"].as_str(), r.json()["error"]["type"].as_str()), (Some("error"), Some("api_error")));
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("no replica answered") && msg.contains(&b.url), "{msg}");
}
