//! What harmony (gpt-oss) templates need of OpenAI-shaped messages. The gpt-oss template reads
//! an assistant's reasoning from `thinking` (clients send `reasoning_content`), tests
//! `"<|channel|>..." in message.content` (which fails on the `null` content of a message that
//! only calls tools), and refuses a tool-calling message with both content and thinking. So,
//! as llama.cpp does for this template: `reasoning_content` becomes `thinking`, a null content
//! is left out, and a tool-calling message with thinking drops its content.

use serde_json::Value as Json;

/// Whether `source` is a harmony template: its messages have `<|channel|>` headers.
pub fn is_harmony(source: &str) -> bool {
    source.contains("<|channel|>")
}

pub fn adapt(messages: &mut [Json]) {
    for m in messages.iter_mut().filter_map(Json::as_object_mut) {
        if m.get("role").and_then(Json::as_str) != Some("assistant") {
            continue;
        }
        if !m.contains_key("thinking")
            && let Some(Json::String(r)) = m.get("reasoning_content").filter(|r| r.as_str().is_some_and(|s| !s.is_empty()))
        {
            let r = r.clone();
            m.insert("thinking".into(), Json::String(r));
        }
        let calls = m.get("tool_calls").and_then(Json::as_array).is_some_and(|c| !c.is_empty());
        if m.get("content").is_some_and(Json::is_null) || (calls && m.contains_key("thinking")) {
            m.remove("content");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reasoning_becomes_thinking() {
        let mut msgs = vec![
            json!({"role": "user", "content": "q", "reasoning_content": "not an assistant"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}),
            json!({"role": "assistant", "content": "Checking.", "reasoning_content": "why", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}),
            json!({"role": "assistant", "content": "4", "reasoning_content": "add"}),
            json!({"role": "assistant", "content": "5", "reasoning_content": ""}),
        ];
        adapt(&mut msgs);
        assert_eq!(msgs[0], json!({"role": "user", "content": "q", "reasoning_content": "not an assistant"}));
        assert_eq!(msgs[1], json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}));
        assert_eq!(
            msgs[2],
            json!({"role": "assistant", "reasoning_content": "why", "thinking": "why", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]})
        );
        assert_eq!(msgs[3], json!({"role": "assistant", "content": "4", "reasoning_content": "add", "thinking": "add"}));
        assert_eq!(msgs[4], json!({"role": "assistant", "content": "5", "reasoning_content": ""}));
        assert!(is_harmony(include_str!("../../tests/chat_template_gpt_oss.jinja")));
        assert!(!is_harmony(super::super::CHATML));
    }
}
