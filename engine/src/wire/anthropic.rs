//! Anthropic's wire format: `POST /v1/messages`. Messages become the OpenAI-shaped messages chat
//! templates take: `system` a first system message, `tool_use` blocks assistant `tool_calls`,
//! `tool_result` blocks `tool` messages.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json, json};

use super::error::ApiError;
use super::reply::{self, ReplyFormat};
use super::request::{self as req, FinishReason, GenerateRequest, Limits, Output, Prompt, Sampling, ToolChoice, Usage};
use crate::chat_template::json_kind;

#[derive(Clone, Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    /// A string or an array of content blocks (checked one by one for field-named errors).
    pub content: Json,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ToolDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub input_schema: Json,
}

#[derive(Clone, Debug, Deserialize)]
pub struct MessagesRequest {
    pub model: String,
    pub max_tokens: u64,
    pub messages: Vec<MessageIn>,
    /// A string or an array of text blocks.
    pub system: Option<Json>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<ToolDef>>,
    /// `{"type": "auto" | "any" | "none"}` or `{"type": "tool", "name": ...}`.
    pub tool_choice: Option<Json>,
}

/// The content blocks a request may carry. An assistant's thinking blocks reach the template
/// as `reasoning_content` (templates that keep reasoning read it); redacted ones are dropped.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockIn {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Json,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<Json>,
        #[serde(default)]
        is_error: Option<bool>,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
    },
    RedactedThinking {},
}

/// Anthropic's temperature range.
const MAX_TEMPERATURE: f64 = 1.0;

fn parse_blocks(field: &str, content: &Json) -> Result<Vec<BlockIn>, ApiError> {
    match content {
        Json::String(s) => Ok(vec![BlockIn::Text { text: s.clone() }]),
        Json::Array(blocks) => blocks
            .iter()
            .enumerate()
            .map(|(j, b)| {
                let field = format!("{field}[{j}]");
                serde_path_to_error::deserialize(b).map_err(|e| {
                    let at = e.path().to_string();
                    let field = if at.is_empty() || at == "." { field } else { format!("{field}.{at}") };
                    ApiError::invalid(&field, e.into_inner())
                })
            })
            .collect(),
        other => Err(ApiError::invalid(field, format!("must be a string or an array of content blocks, found {}", json_kind(other)))),
    }
}

/// The text of a `system` field or a `tool_result` content: a string or text blocks.
fn text_of(field: &str, value: &Json) -> Result<String, ApiError> {
    match value {
        Json::String(s) => Ok(s.clone()),
        Json::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Json::as_str), b.get("text")) {
                    (Some("text"), Some(Json::String(t))) => texts.push(t.as_str()),
                    (Some(other), _) if other != "text" => {
                        return Err(ApiError::invalid(
                            &format!("{field}[{j}]"),
                            format!("block type \"{other}\" is not supported here (text only)"),
                        ));
                    }
                    _ => return Err(ApiError::invalid(&format!("{field}[{j}]"), "must be {\"type\": \"text\", \"text\": string}")),
                }
            }
            Ok(texts.join("\n"))
        }
        other => Err(ApiError::invalid(field, format!("must be a string or an array of text blocks, found {}", json_kind(other)))),
    }
}

/// Appends the template messages for one Anthropic message.
fn convert_message(i: usize, m: &MessageIn, out: &mut Vec<Json>) -> Result<(), ApiError> {
    let field = format!("messages[{i}]");
    let blocks = parse_blocks(&format!("{field}.content"), &m.content)?;
    match m.role.as_str() {
        "user" => {
            // Text gathers into user messages; each tool result becomes a tool message, in order.
            let mut text: Vec<String> = Vec::new();
            let flush = |text: &mut Vec<String>, out: &mut Vec<Json>| {
                if !text.is_empty() {
                    out.push(json!({"role": "user", "content": text.join("\n")}));
                    text.clear();
                }
            };
            for (j, b) in blocks.into_iter().enumerate() {
                match b {
                    BlockIn::Text { text: t } => text.push(t),
                    BlockIn::ToolResult { tool_use_id, content, is_error } => {
                        flush(&mut text, out);
                        let mut body = match &content {
                            None | Some(Json::Null) => String::new(),
                            Some(c) => text_of(&format!("{field}.content[{j}].content"), c)?,
                        };
                        // Templates have no error flag; the model learns of the failure from the text.
                        if is_error == Some(true) {
                            body = format!("Error: {body}");
                        }
                        out.push(json!({"role": "tool", "content": body, "tool_call_id": tool_use_id}));
                    }
                    BlockIn::ToolUse { .. } => {
                        return Err(ApiError::invalid(&format!("{field}.content[{j}]"), "tool_use blocks belong in assistant messages"));
                    }
                    BlockIn::Thinking { .. } | BlockIn::RedactedThinking {} => {}
                }
            }
            flush(&mut text, out);
        }
        "assistant" => {
            let mut text: Vec<String> = Vec::new();
            let mut thinking: Vec<String> = Vec::new();
            let mut calls = Vec::new();
            for (j, b) in blocks.into_iter().enumerate() {
                match b {
                    BlockIn::Text { text: t } => text.push(t),
                    BlockIn::Thinking { thinking: t } if !t.is_empty() => thinking.push(t),
                    BlockIn::ToolUse { id, name, input } => {
                        if !input.is_object() {
                            return Err(ApiError::invalid(
                                &format!("{field}.content[{j}].input"),
                                format!("must be an object, found {}", json_kind(&input)),
                            ));
                        }
                        calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
                    }
                    BlockIn::ToolResult { .. } => {
                        return Err(ApiError::invalid(&format!("{field}.content[{j}]"), "tool_result blocks belong in user messages"));
                    }
                    BlockIn::Thinking { .. } | BlockIn::RedactedThinking {} => {}
                }
            }
            let mut msg = Map::new();
            msg.insert("role".into(), Json::from("assistant"));
            msg.insert("content".into(), if text.is_empty() && !calls.is_empty() { Json::Null } else { Json::from(text.join("\n")) });
            if !calls.is_empty() {
                msg.insert("tool_calls".into(), Json::Array(calls));
            }
            if !thinking.is_empty() {
                msg.insert("reasoning_content".into(), Json::from(thinking.join("\n")));
            }
            out.push(Json::Object(msg));
        }
        "system" => return Err(ApiError::invalid(&format!("{field}.role"), "system prompts go in the top-level \"system\" field")),
        other => return Err(ApiError::invalid(&format!("{field}.role"), format!("unknown role \"{other}\"; expected user or assistant"))),
    }
    Ok(())
}

fn parse_tool_choice(value: Option<&Json>) -> Result<Option<ToolChoice>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    let bad = |what: &str| ApiError::invalid("tool_choice", what.to_string());
    match value.get("type").and_then(Json::as_str) {
        Some("auto") => Ok(Some(ToolChoice::Auto)),
        Some("any") => Ok(Some(ToolChoice::Required)),
        Some("none") => Ok(Some(ToolChoice::None)),
        Some("tool") => match value.get("name") {
            Some(Json::String(name)) => Ok(Some(ToolChoice::Named(name.clone()))),
            _ => Err(bad("{\"type\": \"tool\"} needs a \"name\" string")),
        },
        _ => Err(bad("must be an object with \"type\" \"auto\", \"any\", \"tool\" or \"none\"")),
    }
}

impl MessagesRequest {
    pub fn validate(self, limits: &Limits) -> Result<GenerateRequest, ApiError> {
        req::check_model(&self.model, limits)?;
        let max_tokens = req::check_max_tokens("max_tokens", self.max_tokens, limits)?;
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "must contain at least one message"));
        }
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = self.system.as_ref().filter(|s| !s.is_null()) {
            messages.push(json!({"role": "system", "content": text_of("system", system)?}));
        }
        for (i, m) in self.messages.iter().enumerate() {
            convert_message(i, m, &mut messages)?;
        }
        let tools = self.tools.unwrap_or_default();
        let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
        req::check_tool_names(&names, "tools")?;
        for (i, t) in tools.iter().enumerate() {
            if !t.input_schema.is_object() {
                return Err(ApiError::invalid(
                    &format!("tools[{i}].input_schema"),
                    format!("must be an object, found {}", json_kind(&t.input_schema)),
                ));
            }
        }
        let choice = parse_tool_choice(self.tool_choice.as_ref())?.unwrap_or(ToolChoice::Auto);
        let tool_choice = req::check_tool_choice(choice, &names, "tool_choice")?;
        let template_tools = tools
            .iter()
            .map(|t| {
                let mut function = Map::new();
                function.insert("name".into(), Json::from(t.name.clone()));
                if let Some(d) = &t.description {
                    function.insert("description".into(), Json::from(d.clone()));
                }
                function.insert("parameters".into(), t.input_schema.clone());
                json!({"type": "function", "function": function})
            })
            .collect();
        let tools = req::tools_for_choice(template_tools, &names, &tool_choice);
        Ok(GenerateRequest {
            model: self.model,
            prompt: Prompt::Chat { messages, tools },
            tool_choice,
            max_tokens: Some(max_tokens),
            sampling: Sampling {
                temperature: req::check_temperature(self.temperature, MAX_TEMPERATURE)?,
                top_p: req::check_top_p(self.top_p)?,
                top_k: req::check_top_k(self.top_k)?,
                seed: None,
            },
            stop: req::check_stop("stop_sequences", self.stop_sequences.unwrap_or_default())?,
            n: 1,
            stream: self.stream.unwrap_or(false),
            include_usage: false,
            reasoning_effort: None,
        })
    }
}

// ---- Responses ----

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// The model's reasoning. Anthropic signs its own; ours has an empty signature.
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Json,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageOut {
    /// Prompt tokens that were computed: Anthropic counts the cache reads apart.
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> UsageOut {
        UsageOut {
            input_tokens: u.prompt_tokens.saturating_sub(u.cached_tokens),
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: u.cached_tokens,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub role: String,
    pub content: Vec<ContentBlock>,
    pub model: String,
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: UsageOut,
}

/// Anthropic's `stop_reason` and `stop_sequence`.
pub fn stop_reason(finish: &FinishReason, called_tools: bool) -> (&'static str, Option<String>) {
    match finish {
        FinishReason::EndOfTurn if called_tools => ("tool_use", None),
        FinishReason::EndOfTurn => ("end_turn", None),
        FinishReason::MaxTokens => ("max_tokens", None),
        FinishReason::StopSequence(s) => ("stop_sequence", Some(s.clone())),
    }
}

/// The non-streaming answer to `/v1/messages`: the reply split in the model's `format` into a
/// `thinking` block (returned by default, whether or not the request asked for thinking), a
/// `text` block and `tool_use` blocks, in that order.
pub fn message(id: &str, request: &GenerateRequest, format: ReplyFormat, output: &Output, usage: Usage) -> Message {
    let reply::Reply { reasoning, content: text, calls } = reply::split(format, request.parses_tool_calls(), &output.text);
    let mut content = Vec::with_capacity(calls.len() + 2);
    if !reasoning.is_empty() {
        content.push(ContentBlock::Thinking { thinking: reasoning, signature: String::new() });
    }
    if !text.is_empty() {
        content.push(ContentBlock::Text { text });
    }
    for call in &calls {
        content.push(ContentBlock::ToolUse {
            id: super::new_id("toolu_"),
            name: call.name.clone(),
            input: Json::Object(call.arguments.clone()),
        });
    }
    let (reason, stop_sequence) = stop_reason(&output.finish, !calls.is_empty());
    Message {
        id: id.into(),
        kind: "message".into(),
        role: "assistant".into(),
        content,
        model: request.model.clone(),
        stop_reason: Some(reason.into()),
        stop_sequence,
        usage: usage.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::error::parse_body;
    use crate::wire::request::test_limits;

    fn messages(body: &str) -> Result<GenerateRequest, ApiError> {
        parse_body::<MessagesRequest>(body.as_bytes())?.validate(&test_limits())
    }

    /// What `client.messages.create(...)` of the `anthropic` Python SDK sends for a second turn
    /// of a tool conversation (Claude Code-style cache_control and metadata included).
    const SDK_BODY: &str = r#"{
        "max_tokens": 1024,
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": "abc"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "18C"}], "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Thanks; and tomorrow?"}
            ]}
        ],
        "model": "brink",
        "system": [{"type": "text", "text": "You are a weather bot.", "cache_control": {"type": "ephemeral"}}],
        "metadata": {"user_id": "u1"},
        "stop_sequences": ["\n\nHuman:"],
        "stream": true,
        "temperature": 0.7,
        "top_k": 40,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": false},
        "tools": [{"name": "get_weather", "description": "Weather now", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    }"#;

    #[test]
    fn sdk_body_converts_to_template_messages() {
        let r = messages(SDK_BODY).unwrap();
        let Prompt::Chat { messages, tools } = &r.prompt else { panic!("chat prompt expected") };
        assert_eq!(
            messages,
            &vec![
                json!({"role": "system", "content": "You are a weather bot."}),
                json!({"role": "user", "content": "What's the weather in Paris?"}),
                json!({"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "toolu_01", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}], "reasoning_content": "I should call the tool."}),
                json!({"role": "tool", "content": "18C", "tool_call_id": "toolu_01"}),
                json!({"role": "user", "content": "Thanks; and tomorrow?"}),
            ]
        );
        assert_eq!(
            tools,
            &Some(json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]))
        );
        assert_eq!((r.max_tokens, r.n, r.stream, r.include_usage), (Some(1024), 1, true, false));
        assert_eq!(r.sampling, Sampling { temperature: 0.7, top_p: 1.0, top_k: 40, seed: None });
        assert_eq!(r.stop, vec!["\n\nHuman:".to_string()]);
        assert_eq!(r.tool_choice, ToolChoice::Auto);
        let t = crate::chat_template::ChatTemplate::chatml().unwrap();
        let text = t.render(messages, tools.as_ref(), true).unwrap();
        assert!(text.contains("<|im_start|>tool\n18C<|im_end|>"), "{text}");
    }

    #[test]
    fn tool_result_error_and_choices() {
        let body = r#"{"model": "brink", "max_tokens": 10, "system": "S",
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": true}]}],
            "tools": [{"name": "a", "input_schema": {"type": "object"}}, {"name": "b", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "a"}}"#;
        let r = messages(body).unwrap();
        let Prompt::Chat { messages: m, tools } = &r.prompt else { panic!("chat prompt expected") };
        assert_eq!(m[1], json!({"role": "tool", "content": "Error: boom", "tool_call_id": "t"}));
        assert_eq!(tools.as_ref().unwrap().as_array().unwrap().len(), 1);
        assert_eq!(r.tool_choice, ToolChoice::Named("a".into()));
        assert_eq!(
            messages(&body.replace(r#""type": "tool", "name": "a""#, r#""type": "any""#)).unwrap().tool_choice,
            ToolChoice::Required
        );
        let none = messages(&body.replace(r#""type": "tool", "name": "a""#, r#""type": "none""#)).unwrap();
        assert!(matches!(none.prompt, Prompt::Chat { tools: None, .. }));
    }

    #[test]
    fn validation_errors_name_the_field() {
        let m = r#""messages": [{"role": "user", "content": "Hi"}]"#;
        let cases: Vec<(String, u16, &str)> = vec![
            (format!(r#"{{"model": "brink", {m}}}"#), 400, "invalid request body: missing field `max_tokens`"),
            (format!(r#"{{"model": "brink", "max_tokens": 0, {m}}}"#), 400, "max_tokens: must be at least 1, got 0"),
            (format!(r#"{{"model": "brink", "max_tokens": 99999999, {m}}}"#), 400, "max_tokens: 99999999 is more than the model's context"),
            (format!(r#"{{"model": "claude-3-opus", "max_tokens": 9, {m}}}"#), 404, "model \"claude-3-opus\" is not served here"),
            (r#"{"model": "brink", "max_tokens": 9, "messages": []}"#.into(), 400, "messages: must contain at least one message"),
            (r#"{"model": "brink", "max_tokens": 9, "messages": [{"role": "system", "content": "x"}]}"#.into(), 400, "messages[0].role: system prompts go in"),
            (r#"{"model": "brink", "max_tokens": 9, "messages": [{"role": "bot", "content": "x"}]}"#.into(), 400, "messages[0].role: unknown role \"bot\""),
            (r#"{"model": "brink", "max_tokens": 9, "messages": [{"role": "user", "content": 1}]}"#.into(), 400, "messages[0].content: must be a string or an array"),
            (
                r#"{"model": "brink", "max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}"#.into(),
                400,
                "messages[0].content[0].type: unknown variant `image`",
            ),
            (
                r#"{"model": "brink", "max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}"#.into(),
                400,
                "messages[0].content[0]: invalid type: integer `5`",
            ),
            (
                r#"{"model": "brink", "max_tokens": 9, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": []}]}]}"#.into(),
                400,
                "messages[0].content[0].input: must be an object",
            ),
            (
                r#"{"model": "brink", "max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}"#.into(),
                400,
                "messages[0].content[0]: tool_use blocks belong in assistant messages",
            ),
            (format!(r#"{{"model": "brink", "max_tokens": 9, {m}, "temperature": 1.5}}"#), 400, "temperature: must be between 0 and 1, got 1.5"),
            (format!(r#"{{"model": "brink", "max_tokens": 9, {m}, "top_p": 2}}"#), 400, "top_p: must be greater than 0"),
            (format!(r#"{{"model": "brink", "max_tokens": 9, {m}, "stop_sequences": "x"}}"#), 400, "stop_sequences: invalid type: string \"x\", expected a sequence"),
            (format!(r#"{{"model": "brink", "max_tokens": 9, {m}, "system": 3}}"#), 400, "system: must be a string or an array of text blocks"),
            (format!(r#"{{"model": "brink", "max_tokens": 9, {m}, "tools": [{{"name": "a"}}]}}"#), 400, "tools[0]: missing field `input_schema`"),
            (
                format!(r#"{{"model": "brink", "max_tokens": 9, {m}, "tools": [{{"name": "a", "input_schema": {{}}}}], "tool_choice": {{"type": "tool", "name": "z"}}}}"#),
                400,
                "tool_choice: names the tool \"z\" but tools are: a",
            ),
            (format!(r#"{{"model": "brink", "max_tokens": 9, {m}, "tool_choice": {{"type": "maybe"}}}}"#), 400, "tool_choice: must be an object"),
        ];
        for (body, status, start) in cases {
            let e = messages(&body).unwrap_err();
            assert_eq!(e.status, status, "{body}: {e}");
            assert!(e.message.starts_with(start), "{body}\n  got: {}\n  want: {start}", e.message);
        }
    }

    #[test]
    fn response_with_tool_use_round_trips() {
        let r = messages(SDK_BODY).unwrap();
        let out = Output {
            text: "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"day\": 1}}\n</tool_call>"
                .into(),
            finish: FinishReason::EndOfTurn,
        };
        let msg = message("msg_1", &r, ReplyFormat::Hermes, &out, Usage { prompt_tokens: 500, completion_tokens: 20, cached_tokens: 480 });
        let v = serde_json::to_value(&msg).unwrap();
        assert_eq!(v["type"], "message");
        assert_eq!(v["role"], "assistant");
        assert_eq!(v["content"][0], json!({"type": "text", "text": "Let me look."}));
        assert_eq!(v["content"][1]["type"], "tool_use");
        assert!(v["content"][1]["id"].as_str().unwrap().starts_with("toolu_"));
        assert_eq!(v["content"][1]["input"], json!({"city": "Paris", "day": 1}));
        assert_eq!((v["stop_reason"].as_str(), &v["stop_sequence"]), (Some("tool_use"), &Json::Null));
        assert_eq!(
            v["usage"],
            json!({"input_tokens": 20, "output_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 480})
        );
        assert_eq!(serde_json::from_value::<Message>(v).unwrap(), msg);
        let stopped = message(
            "m",
            &r,
            ReplyFormat::Hermes,
            &Output { text: "Sunny".into(), finish: FinishReason::StopSequence("\n\nHuman:".into()) },
            Usage::default(),
        );
        assert_eq!((stopped.stop_reason.as_deref(), stopped.stop_sequence.as_deref()), (Some("stop_sequence"), Some("\n\nHuman:")));
        let long = message("m", &r, ReplyFormat::Hermes, &Output { text: "Sun".into(), finish: FinishReason::MaxTokens }, Usage::default());
        assert_eq!(long.stop_reason.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn response_with_thinking_first() {
        let r = messages(SDK_BODY).unwrap();
        let text = "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary<|message|>Looking.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}";
        let msg = message("m", &r, ReplyFormat::Harmony, &Output { text: text.into(), finish: FinishReason::EndOfTurn }, Usage::default());
        let v = serde_json::to_value(&msg).unwrap();
        assert_eq!(v["content"][0], json!({"type": "thinking", "thinking": "Call it.", "signature": ""}));
        assert_eq!(v["content"][1], json!({"type": "text", "text": "Looking."}));
        assert_eq!((&v["content"][2]["type"], &v["content"][2]["input"]), (&json!("tool_use"), &json!({"city": "Paris"})));
        assert_eq!(v["stop_reason"], "tool_use");
        assert_eq!(serde_json::from_value::<Message>(v).unwrap(), msg);
        let msg = message(
            "m",
            &r,
            ReplyFormat::Hermes,
            &Output { text: "<think>r</think>a".into(), finish: FinishReason::EndOfTurn },
            Usage::default(),
        );
        assert_eq!(
            msg.content,
            vec![ContentBlock::Thinking { thinking: "r".into(), signature: String::new() }, ContentBlock::Text { text: "a".into() }]
        );
    }
}
