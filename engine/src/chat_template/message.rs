//! Chat messages as OpenAI-style JSON and the checks and normalisation they get before a
//! template sees them. Text content parts are joined with newlines for templates that expect a
//! string (llama.cpp's `concat_typed_text`), which is nearly all of them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use super::error::ChatTemplateError;

/// One message of a conversation. Any serializable type with the same shape (or a
/// `serde_json::Value`) can be rendered as well; this one is for building conversations in code.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// A string, an array of content parts (`{"type": "text", "text": ...}`), or absent/null
    /// (an assistant message that only calls tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Json>,
    /// `[{"type": "function", "function": {"name": ..., "arguments": ...}}]`; arguments may be a
    /// JSON string (as OpenAI sends them) or an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Json>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.into(), content: Some(Json::String(content.into())), ..Default::default() }
    }

    pub fn system(content: &str) -> ChatMessage {
        Self::new("system", content)
    }

    pub fn user(content: &str) -> ChatMessage {
        Self::new("user", content)
    }

    pub fn assistant(content: &str) -> ChatMessage {
        Self::new("assistant", content)
    }

    /// The result of a tool call, answering the call with id `tool_call_id`.
    pub fn tool(content: &str, tool_call_id: &str) -> ChatMessage {
        ChatMessage { tool_call_id: Some(tool_call_id.into()), ..Self::new("tool", content) }
    }

    /// An assistant message calling `name` with `arguments` (an object, or a JSON string).
    pub fn tool_call(name: &str, arguments: Json) -> ChatMessage {
        let call = serde_json::json!({"type": "function", "function": {"name": name, "arguments": arguments}});
        ChatMessage { role: "assistant".into(), tool_calls: Some(vec![call]), ..Default::default() }
    }
}

fn problem(index: usize, problem: impl Into<String>) -> ChatTemplateError {
    ChatTemplateError::Message { index, problem: problem.into() }
}

/// Checks the messages and, when `join_text_parts`, replaces text-part arrays by their texts
/// joined with newlines. Fields a template may use besides these pass through untouched.
pub fn normalize(messages: Vec<Json>, join_text_parts: bool) -> Result<Vec<Json>, ChatTemplateError> {
    messages.into_iter().enumerate().map(|(i, m)| normalize_one(i, m, join_text_parts)).collect()
}

fn normalize_one(index: usize, message: Json, join_text_parts: bool) -> Result<Json, ChatTemplateError> {
    let Json::Object(mut fields) = message else {
        return Err(problem(index, format!("expected an object, found {}", kind(&message))));
    };
    match fields.get("role") {
        Some(Json::String(_)) => {}
        Some(other) => return Err(problem(index, format!("\"role\" must be a string, found {}", kind(other)))),
        None => return Err(problem(index, "has no \"role\"")),
    }
    if let Some(content) = fields.get_mut("content") {
        match content {
            Json::String(_) | Json::Null => {}
            Json::Array(parts) => {
                let texts = check_parts(index, parts)?;
                if join_text_parts {
                    *content = Json::String(texts.join("\n"));
                }
            }
            other => return Err(problem(index, format!("\"content\" must be a string, an array of parts or null, found {}", kind(other)))),
        }
    }
    match fields.get("tool_calls") {
        None | Some(Json::Null) => {}
        Some(Json::Array(calls)) => {
            if let Some((j, call)) = calls.iter().enumerate().find(|(_, c)| !c.is_object()) {
                return Err(problem(index, format!("tool_calls[{j}] must be an object, found {}", kind(call))));
            }
        }
        Some(other) => return Err(problem(index, format!("\"tool_calls\" must be an array, found {}", kind(other)))),
    }
    Ok(Json::Object(fields))
}

/// The texts of content parts; any part that is not text is refused (this engine has no vision
/// or audio input).
fn check_parts(index: usize, parts: &[Json]) -> Result<Vec<String>, ChatTemplateError> {
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let part: &Map<String, Json> =
                part.as_object().ok_or_else(|| problem(index, format!("content[{j}] must be an object, found {}", kind(part))))?;
            match (part.get("type").and_then(Json::as_str), part.get("text").and_then(Json::as_str)) {
                (Some("text"), Some(text)) => Ok(text.to_string()),
                (Some("text"), None) => Err(problem(index, format!("content[{j}] is a text part without a \"text\" string"))),
                (Some(other), _) => Err(problem(index, format!("content[{j}] has type {other:?}; only text parts are supported"))),
                (None, _) => Err(problem(index, format!("content[{j}] has no \"type\""))),
            }
        })
        .collect()
}

/// What a JSON value is, for error messages ("found an array").
pub fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_parts_are_joined_and_bad_messages_named() {
        let msgs = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "assistant", "content": null, "extra": 1}),
        ];
        let out = normalize(msgs.clone(), true).unwrap();
        assert_eq!(out[0]["content"], "a\nb");
        assert_eq!(out[1], msgs[1]);
        assert_eq!(normalize(msgs.clone(), false).unwrap(), msgs);

        let err = |m: Json| normalize(vec![json!({"role": "user", "content": "x"}), m], true).unwrap_err().to_string();
        assert_eq!(err(json!("hi")), "message 1: expected an object, found a string");
        assert_eq!(err(json!({"content": "x"})), "message 1: has no \"role\"");
        assert_eq!(err(json!({"role": 3})), "message 1: \"role\" must be a string, found a number");
        assert_eq!(
            err(json!({"role": "user", "content": 5})),
            "message 1: \"content\" must be a string, an array of parts or null, found a number"
        );
        assert_eq!(
            err(json!({"role": "user", "content": [{"type": "image_url", "image_url": {}}]})),
            "message 1: content[0] has type \"image_url\"; only text parts are supported"
        );
        assert_eq!(
            err(json!({"role": "user", "content": [{"type": "text"}]})),
            "message 1: content[0] is a text part without a \"text\" string"
        );
        assert_eq!(err(json!({"role": "assistant", "tool_calls": {}})), "message 1: \"tool_calls\" must be an array, found an object");
        assert_eq!(err(json!({"role": "assistant", "tool_calls": [1]})), "message 1: tool_calls[0] must be an object, found a number");
    }

    #[test]
    fn chat_message_serializes_like_openai_json() {
        let m = ChatMessage::tool("42", "call_1");
        assert_eq!(serde_json::to_value(&m).unwrap(), json!({"role": "tool", "content": "42", "tool_call_id": "call_1"}));
        let m = ChatMessage::tool_call("get", json!({"x": 1}));
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": {"x": 1}}}]})
        );
    }
}
