//! The GenAI client series on the gateway's /metrics, through the real proxy path: token usage
//! read from non-streamed and streamed answers of both APIs, per operation, model and replica,
//! and the operation duration of every request a replica answered, failures by error type.

mod common;

use common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_usage_and_durations_are_recorded_per_model_and_replica() {
    let a = Stub::start("A", &["alpha"]).await;
    let b = Stub::start("B", &["beta"]).await;
    let gw = gateway(config(&[&a, &b])).await;
    wait_models(&gw, &[], &["alpha", "beta"]).await;
    let set_usage = |stub: &Stub, usage: Option<(u64, u64)>| *stub.state.usage.lock().unwrap() = usage;
    let chat_url = format!("{}/v1/chat/completions", gw.url);
    let messages_url = format!("{}/v1/messages", gw.url);

    // OpenAI: a chat answered whole, a streamed one with its usage chunk, a text completion.
    set_usage(&a, Some((7, 3)));
    let r = post(&chat_url, &chat("alpha", "hi")).await;
    assert_eq!((r.status, r.json()["usage"]["prompt_tokens"].as_u64()), (200, Some(7)), "{}", r.body);
    set_usage(&a, Some((11, 5)));
    a.state.gate.add_permits(1);
    let mut streamed = chat("alpha", "hi");
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = post(&chat_url, &streamed).await;
    assert!(r.status == 200 && r.body.contains(r#""prompt_tokens":11"#) && r.body.ends_with("data: [DONE]\n\n"), "{}", r.body);
    set_usage(&a, Some((2, 9)));
    let r = post(&format!("{}/v1/completions", gw.url), &json!({"model": "alpha", "prompt": "once"})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    // An answer without usage adds a duration and no tokens; a failed one, its status.
    set_usage(&a, None);
    assert_eq!(post(&chat_url, &chat("alpha", "hi")).await.status, 200);
    a.refuse_with(Some(500));
    assert_eq!(post(&chat_url, &chat("alpha", "hi")).await.status, 500);

    // Anthropic: streamed (message_start, then message_delta) and whole.
    set_usage(&b, Some((13, 6)));
    b.state.gate.add_permits(1);
    let r =
        post(&messages_url, &json!({"model": "beta", "max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .await;
    assert!(r.status == 200 && r.body.contains("message_delta"), "{}", r.body);
    set_usage(&b, Some((4, 2)));
    let r = post(&messages_url, &json!({"model": "beta", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(r.status, 200, "{}", r.body);

    // Recorded as each answer ends: by the time nothing is in flight, all are.
    wait_idle(&gw).await;
    let m = metrics(&gw).await;
    let tokens = |part: &str, op: &str, model: &str, kind: &str, upstream: &str| {
        let labels = [("gen_ai_operation_name", op), ("gen_ai_request_model", model), ("gen_ai_token_type", kind), ("upstream", upstream)];
        metric(&m, &format!("gen_ai_client_token_usage_{part}"), &labels)
    };
    for (op, model, upstream, kind, sum, count) in [
        ("chat", "alpha", &a.url, "input", 18.0, 2.0),
        ("chat", "alpha", &a.url, "output", 8.0, 2.0),
        ("text_completion", "alpha", &a.url, "input", 2.0, 1.0),
        ("text_completion", "alpha", &a.url, "output", 9.0, 1.0),
        ("chat", "beta", &b.url, "input", 17.0, 2.0),
        ("chat", "beta", &b.url, "output", 8.0, 2.0),
    ] {
        let got = (tokens("sum", op, model, kind, upstream), tokens("count", op, model, kind, upstream));
        assert_eq!(got, (Some(sum), Some(count)), "{op} {model} {kind} {upstream}:\n{m}");
    }
    assert_eq!(tokens("count", "chat", "beta", "input", &a.url), None, "no series for a replica that did not answer");

    let durations = |op: &str, model: &str, upstream: &str, error: &str| {
        let labels = [("gen_ai_operation_name", op), ("gen_ai_request_model", model), ("upstream", upstream), ("error_type", error)];
        metric(&m, "gen_ai_client_operation_duration_seconds_count", &labels)
    };
    assert_eq!(durations("chat", "alpha", &a.url, ""), Some(3.0), "{m}");
    assert_eq!(durations("chat", "alpha", &a.url, "500"), Some(1.0), "{m}");
    assert_eq!(durations("text_completion", "alpha", &a.url, ""), Some(1.0), "{m}");
    assert_eq!(durations("chat", "beta", &b.url, ""), Some(2.0), "{m}");
    assert!(!m.contains(r#"error_type="cancelled""#), "every answer was read to its end:\n{m}");
    // The existing routing series are still there beside them.
    assert_eq!(metric(&m, "brink_gateway_requests_total", &[("model", "alpha"), ("upstream", &a.url), ("status", "200")]), Some(4.0));
}
