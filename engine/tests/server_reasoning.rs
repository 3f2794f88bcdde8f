//! Reasoning over HTTP, on the synthetic model: `reasoning_effort` checked (400 with the field
//! named) and taken; and a reply streamed and not streamed splits the same way into reasoning,
//! answer and calls, in both APIs (the same parser behind both, whatever the model wrote).

mod common;

use common::*;
use serde_json::{Value as Json, json};

#[test]
fn reasoning_effort_and_streamed_replies_split_as_whole_ones() {
    let server = start(options(2, 8, Vec::new()));
    let addr = server.addr;
    let messages = json!([{"role": "user", "content": "Think first, then answer: 2+2?"}]);

    for bad in [json!("extreme"), json!(""), json!(3)] {
        let r = post(addr, "/v1/chat/completions", &json!({"model": "tiny", "messages": messages, "reasoning_effort": bad}));
        assert_eq!(r.status, 400, "{}", r.body);
        let v = r.json();
        assert_eq!(v["error"]["param"], "reasoning_effort", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().starts_with("reasoning_effort: "), "{v}");
    }

    // OpenAI: the whole message and the joined deltas agree, field by field.
    let body = json!({"model": "tiny", "messages": messages, "max_tokens": 24, "temperature": 0, "reasoning_effort": "high"});
    let r = post(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let message = r.json()["choices"][0]["message"].clone();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(addr, "/v1/chat/completions", &streamed);
    let (content, _) = openai_stream_text(&r);
    let reasoning: String = sse_events(&r.body)
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .filter_map(|(_, d)| serde_json::from_str::<Json>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str().map(String::from))
        .collect();
    assert_eq!(content, message["content"].as_str().unwrap_or(""), "{message}");
    assert_eq!(reasoning, message["reasoning_content"].as_str().unwrap_or(""), "{message}");

    // Anthropic: the blocks of the whole message and of the stream agree.
    let body = json!({"model": "tiny", "max_tokens": 24, "temperature": 0, "messages": messages});
    let r = post(addr, "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let whole: Vec<(String, String)> = r.json()["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let kind = b["type"].as_str().unwrap().to_string();
            let text = b["thinking"].as_str().or(b["text"].as_str()).unwrap_or("").to_string();
            (kind, text)
        })
        .collect();
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = post(addr, "/v1/messages", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    let mut blocks: Vec<(String, String)> = Vec::new();
    for (event, data) in sse_events(&r.body) {
        let v: Json = serde_json::from_str(&data).unwrap();
        match event.as_str() {
            "content_block_start" => blocks.push((v["content_block"]["type"].as_str().unwrap().to_string(), String::new())),
            "content_block_delta" => {
                let d = &v["delta"];
                let part = d["thinking"].as_str().or(d["text"].as_str()).unwrap_or("");
                blocks.last_mut().expect("a delta before any block").1.push_str(part);
            }
            _ => {}
        }
    }
    assert_eq!(blocks, whole);
    stop(server);
}
