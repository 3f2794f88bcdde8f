//! Routing against stub upstreams: by model, the model list, the errors the gateway answers
//! itself (unknown model, bad bodies) in each API's shape, streaming passed through chunk by
//! chunk, and prefix affinity.

mod common;

use common::*;
use http_body_util::BodyExt;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_replica_that_serves_their_model() {
    let a = Stub::start("A", &["alpha"]).await;
    let b = Stub::start("B", &["beta", "shared"]).await;
    let gw = gateway(config(&[&a, &b])).await;
    wait_models(&gw, &[], &["alpha", "beta", "shared"]).await;

    for (path, body) in [
        ("/v1/chat/completions", chat("alpha", "hi")),
        ("/v1/completions", json!({"model": "alpha", "prompt": "once"})),
        ("/v1/messages", json!({"model": "alpha", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})),
    ] {
        let r = post(&format!("{}{path}", gw.url), &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(r.json()["answered_by"], "A", "{path}");
        assert_eq!(r.json()["path"], path, "the path reaches the replica unchanged");
    }
    for model in ["beta", "shared"] {
        let r = post(&format!("{}/v1/chat/completions", gw.url), &chat(model, "hi")).await;
        assert_eq!((r.status, r.json()["answered_by"].clone()), (200, json!("B")), "{model}");
    }
    assert_eq!(a.hits().len(), 3);
    assert!(a.hits().iter().all(|h| h.model == "alpha"));
    assert_eq!(b.hits().len(), 2);

    let m = metrics(&gw).await;
    assert_eq!(
        metric(&m, "brink_gateway_requests_total", &[("model", "alpha"), ("upstream", &a.url), ("status", "200")]),
        Some(3.0),
        "{m}"
    );
    assert_eq!(metric(&m, "brink_gateway_upstream_healthy", &[("upstream", &a.url)]), Some(1.0), "{m}");
    assert_eq!(metric(&m, "brink_gateway_upstream_in_flight", &[("upstream", &b.url)]), Some(0.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_is_the_union_of_healthy_replicas_each_once() {
    let a = Stub::start("A", &["one", "two"]).await;
    let b = Stub::start("B", &["two", "three"]).await;
    let mut c = Stub::start("C", &["four"]).await;
    c.stop().await; // a replica that never answers: its models are not listed
    let gw = gateway(config(&[&a, &b, &c])).await;
    wait_models(&gw, &[], &["one", "two", "three"]).await;
    let r = call(&format!("{}/v1/models", gw.url), "GET", &[], "").await;
    assert_eq!(r.json()["object"], "list");
    assert!(r.json()["data"].as_array().unwrap().iter().all(|m| m["object"] == "model"));
    let ready = call(&format!("{}/ready", gw.url), "GET", &[], "").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(call(&format!("{}/health", gw.url), "GET", &[], "").await.status, 200);
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_upstream_healthy", &[("upstream", &c.url)]), Some(0.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_models_and_bad_bodies_get_each_apis_error_shape() {
    let a = Stub::start("A", &["a"]).await;
    let b = Stub::start("B", &["b"]).await;
    let gw = gateway(config(&[&a, &b])).await;
    wait_models(&gw, &[], &["a", "b"]).await;

    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("nope", "hi")).await;
    assert_eq!(r.status, 404, "{}", r.body);
    let e = &r.json()["error"];
    assert_eq!(e["message"], "model 'nope' is not served by any replica; served: a, b");
    assert_eq!(
        (e["type"].as_str(), e["param"].as_str(), e["code"].as_str()),
        (Some("invalid_request_error"), Some("model"), Some("model_not_found"))
    );

    let r = post(&format!("{}/v1/messages", gw.url), &json!({"model": "nope", "max_tokens": 1, "messages": []})).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "not_found_error");
    assert_eq!(r.json()["error"]["message"], "model 'nope' is not served by any replica; served: a, b");

    for (path, body, needle) in [
        ("/v1/chat/completions", "{not json", "not valid JSON"),
        ("/v1/completions", "", "not valid JSON"),
        ("/v1/chat/completions", r#"{"messages": []}"#, "no `model`"),
        ("/v1/completions", r#"{"model": 7, "prompt": "x"}"#, "`model` must be a string"),
        ("/v1/chat/completions", "[1, 2]", "JSON object"),
    ] {
        let r = call(&format!("{}{path}", gw.url), "POST", &[], body).await;
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["type"], "invalid_request_error", "{body}");
        assert!(r.json()["error"]["message"].as_str().unwrap().contains(needle), "{body}: {}", r.body);
    }
    let r = call(&format!("{}/v1/messages", gw.url), "POST", &[], "{\"model\": ").await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!((r.json()["type"].as_str(), r.json()["error"]["type"].as_str()), (Some("error"), Some("invalid_request_error")));
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("not valid JSON"));

    assert!(a.hits().is_empty() && b.hits().is_empty(), "no bad request reached a replica");
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_rejections_total", &[("reason", "unknown_model")]), Some(2.0), "{m}");
    assert_eq!(metric(&m, "brink_gateway_rejections_total", &[("reason", "bad_request")]), Some(6.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_healthy_replica_is_503_not_404() {
    let mut a = Stub::start("A", &["a"]).await;
    a.stop().await;
    let gw = gateway(config(&[&a])).await;
    // Unhealthy from the start (before the first poll too), so no wait is needed.
    let r = call(&format!("{}/ready", gw.url), "GET", &[], "").await;
    assert_eq!(r.status, 503, "{}", r.body);
    let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("a", "hi")).await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_rejections_total", &[("reason", "no_healthy_replica")]), Some(1.0), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reaches_the_client_chunk_by_chunk() {
    let a = Stub::start("A", &["m"]).await;
    let gw = gateway(config(&[&a])).await;
    wait_models(&gw, &[], &["m"]).await;
    let mut body = chat("m", "stream me");
    body["stream"] = json!(true);
    let req = request(&format!("{}/v1/chat/completions", gw.url), "POST", &[], &body.to_string());
    let resp = tokio::time::timeout(DEADLINE, client().request(req)).await.expect("no response head").unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The stub holds its last chunks until the gate opens; the first must arrive before that.
    let mut seen = String::new();
    while !seen.contains("\n\n") {
        let frame = tokio::time::timeout(DEADLINE, body.frame())
            .await
            .expect("the first chunk did not arrive while the stub held the rest: the gateway buffers the stream")
            .expect("the stream ended early")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen += std::str::from_utf8(&data).unwrap();
        }
    }
    assert!(seen.contains(r#""chunk":1"#), "{seen}");
    assert!(!seen.contains(r#""chunk":2"#), "{seen}");
    // The stream is the model's one request in flight (the autoscaler's queue series) until it ends.
    let in_flight = |m: &str| metric(m, "brink_gateway_model_in_flight", &[("model", "m")]);
    assert_eq!(in_flight(&metrics(&gw).await), Some(1.0));
    a.state.gate.add_permits(1);
    let rest = tokio::time::timeout(DEADLINE, body.collect()).await.expect("the rest did not come").unwrap().to_bytes();
    let rest = String::from_utf8(rest.to_vec()).unwrap();
    assert!(rest.contains(r#""chunk":2"#) && rest.ends_with("data: [DONE]\n\n"), "{rest}");
    let t0 = std::time::Instant::now();
    while in_flight(&metrics(&gw).await) != Some(0.0) {
        assert!(t0.elapsed() < DEADLINE, "the ended stream is still counted in flight");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // A model no replica serves gets no series (a client cannot grow the label set at will).
    post(&format!("{}/v1/chat/completions", gw.url), &chat("nonsense-model", "x")).await;
    assert_eq!(metric(&metrics(&gw).await, "brink_gateway_model_in_flight", &[("model", "nonsense-model")]), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_prompt_prefix_goes_to_the_same_replica() {
    let a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    let gw = gateway(config(&[&a, &b])).await;
    wait_models(&gw, &[], &["m"]).await;
    let url = format!("{}/v1/chat/completions", gw.url);

    // A long system prompt, resent with a different question each time: the key is its first
    // 2048 characters, so every request goes to one replica.
    let system: String = (0..300).map(|i| format!("rule {i}. ")).collect();
    assert!(system.chars().count() > 2048);
    let mut answered = Vec::new();
    for i in 0..10 {
        let body = json!({"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("question {i}")}]});
        let r = post(&url, &body).await;
        assert_eq!(r.status, 200, "{}", r.body);
        answered.push(r.json()["answered_by"].as_str().unwrap().to_string());
    }
    assert!(answered.iter().all(|x| *x == answered[0]), "one prompt prefix went to several replicas: {answered:?}");
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_affinity_hits_total", &[("model", "m")]), Some(10.0), "{m}");

    // Different prompts spread: each key picks one of the two by its hash, so a few dozen
    // distinct prompts reach both (all on one is a 2^-63 chance).
    let (mut to_a, mut to_b) = (0, 0);
    for i in 0..64 {
        if to_a > 0 && to_b > 0 {
            break;
        }
        let r = post(&url, &chat("m", &format!("prompt number {i}"))).await;
        match r.json()["answered_by"].as_str() {
            Some("A") => to_a += 1,
            Some("B") => to_b += 1,
            other => panic!("{other:?}: {}", r.body),
        }
    }
    assert!(to_a > 0 && to_b > 0, "different prompts all went to one replica (A {to_a}, B {to_b})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_affinity_off_ties_go_in_upstream_order() {
    let a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    let mut c = config(&[&a, &b]);
    c.affinity_prefix_chars = 0;
    let gw = gateway(c).await;
    wait_models(&gw, &[], &["m"]).await;
    for i in 0..5 {
        // The previous answer's in-flight count may outlive the client's read by a moment.
        wait_idle(&gw).await;
        let r = post(&format!("{}/v1/chat/completions", gw.url), &chat("m", &format!("p{i}"))).await;
        assert_eq!(r.json()["answered_by"], "A", "equal load: the first --upstream");
    }
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_affinity_hits_total", &[("model", "m")]), None, "{m}");
}

/// Two one-slot replicas: a prompt whose replica is busy with another request of the same prefix
/// goes to the free one, and its prefix's home moves there: later requests with that prefix stay
/// on the new home even once the old one is free (no ping-pong between two clients' turns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_whose_replica_has_no_free_slot_moves_and_stays_moved() {
    let a = Stub::start("A", &["m"]).await;
    let b = Stub::start("B", &["m"]).await;
    let mut c = config(&[&a, &b]);
    c.upstream_slots = Some(1);
    let gw = gateway(c).await;
    wait_models(&gw, &[], &["m"]).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    let system: String = (0..300).map(|i| format!("rule {i}. ")).collect();
    let turn = |i: usize, stream: bool| {
        json!({"model": "m", "stream": stream,
               "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("turn {i}")}]})
    };

    // Turn 0, streamed and held open by the stub: its replica's one slot is taken.
    let req = request(&url, "POST", &[], &turn(0, true).to_string());
    let resp = tokio::time::timeout(DEADLINE, client().request(req)).await.expect("no response head").unwrap();
    assert_eq!(resp.status(), 200);
    let mut held = resp.into_body();
    let first = tokio::time::timeout(DEADLINE, held.frame()).await.expect("no first chunk").unwrap().unwrap();
    let first = String::from_utf8(first.into_data().unwrap().to_vec()).unwrap();
    let (home, other, other_stub) = if first.contains(r#""answered_by":"A""#) { ("A", "B", &b) } else { ("B", "A", &a) };

    // Turn 1 of the same prefix meanwhile: no free slot at home, so the other replica.
    let r = post(&url, &turn(1, false)).await;
    assert_eq!(r.json()["answered_by"], other, "{}", r.body);
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_affinity_moves_total", &[("model", "m"), ("reason", "no_free_slot")]), Some(1.0), "{m}");

    // The held stream ends; the old home is free again, but the prefix now lives elsewhere.
    let stub_of = |name: &str| if name == "A" { &a } else { &b };
    stub_of(home).state.gate.add_permits(1);
    tokio::time::timeout(DEADLINE, held.collect()).await.expect("the held stream did not end").unwrap();
    wait_idle(&gw).await;
    for i in 2..6 {
        let r = post(&url, &turn(i, false)).await;
        assert_eq!(r.json()["answered_by"], other, "turn {i}: {}", r.body);
    }
    assert_eq!(other_stub.hits().len(), 5);
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "brink_gateway_affinity_hits_total", &[("model", "m")]), Some(5.0), "{m}");
    assert_eq!(metric(&m, "brink_gateway_affinity_moves_total", &[("model", "m"), ("reason", "no_free_slot")]), Some(1.0), "{m}");
}
