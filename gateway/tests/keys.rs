//! API keys: 401 without a valid key (in each API's shape), the per-key concurrency limit (429
//! with Retry-After), and the replicas' own key.

mod common;

use std::time::Instant;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_key_get_401() {
    let a = Stub::start("A", &["m"]).await;
    let mut c = config(&[&a]);
    c.api_keys = vec!["k1".into(), "k2".into()];
    c.upstream_api_key = Some("replica-secret".into());
    let gw = gateway(c).await;
    let models = format!("{}/v1/models", gw.url);
    assert_eq!(call(&models, "GET", &[], "").await.status, 401, "the model list needs a key too");
    wait_models(&gw, &[("authorization", "Bearer k1")], &["m"]).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let body = chat("m", "hi").to_string();

    let r = call(&url, "POST", &[], &body).await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("missing API key"));
    let r = call(&url, "POST", &[("authorization", "Bearer wrong")], &body).await;
    assert_eq!((r.status, r.json()["error"]["message"].clone()), (401, json!("invalid API key")));
    let r = call(&format!("{}/v1/messages", gw.url), "POST", &[("anthropic-version", "2023-06-01")], &body).await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!((r.json()["type"].as_str(), r.json()["error"]["type"].as_str()), (Some("error"), Some("authentication_error")));
    assert!(a.hits().is_empty());

    assert_eq!(call(&url, "POST", &[("authorization", "Bearer k1")], &body).await.status, 200);
    assert_eq!(call(&url, "POST", &[("x-api-key", "k2")], &body).await.status, 200);
    // The replica sees its own key, never the client's.
    for h in a.hits() {
        assert_eq!(h.authorization.as_deref(), Some("Bearer replica-secret"));
        assert_eq!(h.x_api_key, None);
    }
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_rejections_total", &[("reason", "unauthorized")]), Some(4.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_over_its_concurrency_gets_429_with_retry_after() {
    let a = Stub::start("A", &["m"]).await;
    let mut c = config(&[&a]);
    c.api_keys = vec!["k1".into(), "k2".into()];
    c.per_key_concurrency = Some(1);
    let gw = gateway(c).await;
    wait_models(&gw, &[("x-api-key", "k1")], &["m"]).await;
    let url = format!("{}/v1/chat/completions", gw.url);

    // k1's one slot is held by a stream the stub keeps open until its gate opens.
    let mut streamed = chat("m", "hold");
    streamed["stream"] = json!(true);
    let req = request(&url, "POST", &[("x-api-key", "k1")], &streamed.to_string());
    let held = tokio::time::timeout(DEADLINE, client().request(req)).await.unwrap().unwrap();
    assert_eq!(held.status(), 200);

    let body = chat("m", "hi").to_string();
    let r = call(&url, "POST", &[("x-api-key", "k1")], &body).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let r = call(&format!("{}/v1/messages", gw.url), "POST", &[("x-api-key", "k1")], &body).await;
    assert_eq!((r.status, r.json()["error"]["type"].clone()), (429, json!("rate_limit_error")));
    assert_eq!(call(&url, "POST", &[("x-api-key", "k2")], &body).await.status, 200, "another key has its own slot");

    // The stream ends; the slot frees once the gateway has let go of the body.
    a.state.gate.add_permits(1);
    use http_body_util::BodyExt;
    tokio::time::timeout(DEADLINE, held.into_body().collect()).await.unwrap().unwrap();
    let t0 = Instant::now();
    loop {
        let r = call(&url, "POST", &[("x-api-key", "k1")], &body).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(t0.elapsed() < DEADLINE, "k1's slot never freed");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_rejections_total", &[("reason", "key_limit")]).map(|v| v >= 2.0), Some(true), "{m}");
}
