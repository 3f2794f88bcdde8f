//! OpenAI's wire format: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.
//! Requests parse with unknown fields ignored (SDKs send many); [`ChatCompletionRequest::validate`]
//! and [`CompletionRequest::validate`] turn them into a [`GenerateRequest`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json, json};

use super::error::ApiError;
use super::reply::{self, ReplyFormat};
use super::request::{self as req, FinishReason, GenerateRequest, Limits, Output, Prompt, Sampling, ToolChoice, Usage};
use super::tool_calls::ToolCall;
use crate::chat_template::json_kind;

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Json>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ToolDef {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

impl ToolDef {
    /// The shape chat templates expect.
    pub fn template_json(&self) -> Json {
        let mut function = Map::new();
        function.insert("name".into(), Json::from(self.function.name.clone()));
        if let Some(d) = &self.function.description {
            function.insert("description".into(), Json::from(d.clone()));
        }
        if let Some(p) = &self.function.parameters {
            function.insert("parameters".into(), p.clone());
        }
        json!({"type": "function", "function": function})
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// A JSON string as OpenAI sends it (an object is taken too).
    #[serde(default)]
    pub arguments: Option<Json>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ToolCallIn {
    #[serde(default)]
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Clone, Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    /// A string, an array of `{"type": "text", "text": ...}` parts, or null.
    #[serde(default)]
    pub content: Option<Json>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// An earlier answer's reasoning, as this server returned it (templates that keep
    /// reasoning in the context read it: Qwen3's, and gpt-oss's as `thinking`).
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<MessageIn>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Not in OpenAI's API; llama.cpp and vLLM take it, and so do we.
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub tools: Option<Vec<ToolDef>>,
    /// `"none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Json>,
    /// `"low" | "medium" | "high"`, for the chat template (gpt-oss's).
    pub reasoning_effort: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: PromptField,
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
}

/// OpenAI's temperature range.
const MAX_TEMPERATURE: f64 = 2.0;
/// `/v1/completions` without `max_tokens` generates 16 tokens, as OpenAI's does.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

const ROLES: &str = "system, developer, user, assistant or tool";

fn sampling(temperature: Option<f64>, top_p: Option<f64>, top_k: Option<i64>, seed: Option<i64>) -> Result<Sampling, ApiError> {
    Ok(Sampling {
        temperature: req::check_temperature(temperature, MAX_TEMPERATURE)?,
        top_p: req::check_top_p(top_p)?,
        top_k: req::check_top_k(top_k)?,
        // A negative seed is a valid integer seed; its bits are as good as any.
        seed: seed.map(|s| s as u64),
    })
}

fn parse_tool_choice(value: Option<&Json>) -> Result<Option<ToolChoice>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "tool_choice",
            "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        )
    };
    match value {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => match s.as_str() {
            "none" => Ok(Some(ToolChoice::None)),
            "auto" => Ok(Some(ToolChoice::Auto)),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(bad()),
        },
        Some(Json::Object(o)) => match (o.get("type"), o.get("function").and_then(|f| f.get("name"))) {
            (Some(Json::String(t)), Some(Json::String(name))) if t == "function" => Ok(Some(ToolChoice::Named(name.clone()))),
            _ => Err(bad()),
        },
        Some(_) => Err(bad()),
    }
}

/// Text parts of a content array, checked; other part types are refused by name.
fn text_parts(field: &str, parts: &[Json]) -> Result<Json, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let field = format!("{field}[{j}]");
        match (part.get("type").and_then(Json::as_str), part.get("text")) {
            (Some("text"), Some(Json::String(text))) => out.push(json!({"type": "text", "text": text})),
            (Some("text"), _) => return Err(ApiError::invalid(&format!("{field}.text"), "must be a string")),
            (Some(other), _) => return Err(ApiError::invalid(&field, format!("content type \"{other}\" is not supported (text only)"))),
            (None, _) => return Err(ApiError::invalid(&field, "must be an object with \"type\": \"text\"")),
        }
    }
    Ok(Json::Array(out))
}

/// One message in the shape chat templates take.
fn template_message(i: usize, m: &MessageIn) -> Result<Json, ApiError> {
    let field = format!("messages[{i}]");
    let role = match m.role.as_str() {
        // OpenAI's newer name for the system role; templates know only "system".
        "developer" | "system" => "system",
        r @ ("user" | "assistant" | "tool") => r,
        other => return Err(ApiError::invalid(&format!("{field}.role"), format!("unknown role \"{other}\"; expected {ROLES}"))),
    };
    let has_calls = m.tool_calls.as_ref().is_some_and(|c| !c.is_empty());
    let content = match &m.content {
        None | Some(Json::Null) if role == "assistant" && has_calls => Json::Null,
        None | Some(Json::Null) => return Err(ApiError::invalid(&format!("{field}.content"), "is required")),
        Some(Json::String(s)) => Json::from(s.clone()),
        Some(Json::Array(parts)) => text_parts(&format!("{field}.content"), parts)?,
        Some(other) => {
            return Err(ApiError::invalid(
                &format!("{field}.content"),
                format!("must be a string or an array of text parts, found {}", json_kind(other)),
            ));
        }
    };
    let mut out = Map::new();
    out.insert("role".into(), Json::from(role));
    out.insert("content".into(), content);
    if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
        if role != "assistant" {
            return Err(ApiError::invalid(&format!("{field}.tool_calls"), "only assistant messages may call tools"));
        }
        let calls = calls
            .iter()
            .map(|c| {
                // Templates that `tojson` the arguments want an object; OpenAI sends a string.
                let arguments = match &c.function.arguments {
                    None | Some(Json::Null) => Json::Object(Map::new()),
                    Some(Json::String(s)) => {
                        serde_json::from_str::<Json>(s).ok().filter(Json::is_object).unwrap_or_else(|| Json::from(s.clone()))
                    }
                    Some(other) => other.clone(),
                };
                let mut call = Map::new();
                if let Some(id) = &c.id {
                    call.insert("id".into(), Json::from(id.clone()));
                }
                call.insert("type".into(), Json::from("function"));
                call.insert("function".into(), json!({"name": c.function.name, "arguments": arguments}));
                Json::Object(call)
            })
            .collect();
        out.insert("tool_calls".into(), Json::Array(calls));
    }
    if role == "tool" {
        match &m.tool_call_id {
            Some(id) => out.insert("tool_call_id".into(), Json::from(id.clone())),
            None => return Err(ApiError::invalid(&format!("{field}.tool_call_id"), "is required for a tool message")),
        };
    }
    if let Some(name) = &m.name {
        out.insert("name".into(), Json::from(name.clone()));
    }
    if let Some(reasoning) = m.reasoning_content.as_ref().filter(|_| role == "assistant") {
        out.insert("reasoning_content".into(), Json::from(reasoning.clone()));
    }
    Ok(Json::Object(out))
}

impl ChatCompletionRequest {
    pub fn validate(self, limits: &Limits) -> Result<GenerateRequest, ApiError> {
        req::check_model(&self.model, limits)?;
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "must contain at least one message"));
        }
        let messages = self.messages.iter().enumerate().map(|(i, m)| template_message(i, m)).collect::<Result<Vec<_>, _>>()?;
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => Some(req::check_max_tokens("max_completion_tokens", v, limits)?),
            (None, Some(v)) => Some(req::check_max_tokens("max_tokens", v, limits)?),
            (None, None) => None,
        };
        let tools = self.tools.unwrap_or_default();
        for (i, t) in tools.iter().enumerate() {
            if t.kind != "function" {
                return Err(ApiError::invalid(&format!("tools[{i}].type"), format!("must be \"function\", got \"{}\"", t.kind)));
            }
        }
        let names: Vec<String> = tools.iter().map(|t| t.function.name.clone()).collect();
        req::check_tool_names(&names, "tools")?;
        let choice = parse_tool_choice(self.tool_choice.as_ref())?.unwrap_or(ToolChoice::Auto);
        let tool_choice = req::check_tool_choice(choice, &names, "tool_choice")?;
        let tools = req::tools_for_choice(tools.iter().map(ToolDef::template_json).collect(), &names, &tool_choice);
        let stream = self.stream.unwrap_or(false);
        Ok(GenerateRequest {
            model: self.model,
            prompt: Prompt::Chat { messages, tools },
            tool_choice,
            max_tokens,
            sampling: sampling(self.temperature, self.top_p, self.top_k, self.seed)?,
            stop: req::check_stop("stop", self.stop.map(StopField::into_vec).unwrap_or_default())?,
            n: req::check_n(self.n, limits)?,
            stream,
            include_usage: stream && self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            reasoning_effort: req::check_reasoning_effort(self.reasoning_effort)?,
        })
    }
}

impl CompletionRequest {
    pub fn validate(self, limits: &Limits) -> Result<GenerateRequest, ApiError> {
        req::check_model(&self.model, limits)?;
        let prompt = match self.prompt {
            PromptField::One(s) => s,
            PromptField::Many(mut v) if v.len() == 1 => v.remove(0),
            PromptField::Many(v) => {
                return Err(ApiError::invalid("prompt", format!("one prompt per request is supported, got {}", v.len())));
            }
        };
        if self.echo == Some(true) {
            return Err(ApiError::invalid("echo", "is not supported"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid("suffix", "is not supported"));
        }
        let max_tokens = match self.max_tokens {
            Some(v) => req::check_max_tokens("max_tokens", v, limits)?,
            None => COMPLETIONS_DEFAULT_MAX_TOKENS.min(limits.context_tokens),
        };
        let stream = self.stream.unwrap_or(false);
        Ok(GenerateRequest {
            model: self.model,
            prompt: Prompt::Text(prompt),
            tool_choice: ToolChoice::None,
            max_tokens: Some(max_tokens),
            sampling: sampling(self.temperature, self.top_p, self.top_k, self.seed)?,
            stop: req::check_stop("stop", self.stop.map(StopField::into_vec).unwrap_or_default())?,
            n: req::check_n(self.n, limits)?,
            stream,
            include_usage: stream && self.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
            reasoning_effort: None,
        })
    }
}

// ---- Responses ----

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageOut {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: PromptTokensDetails,
}

impl From<Usage> for UsageOut {
    fn from(u: Usage) -> UsageOut {
        UsageOut {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: u.cached_tokens },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallOut {
    pub name: String,
    /// The arguments object as a JSON string.
    pub arguments: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionCallOut,
}

impl ToolCallOut {
    pub fn new(call: &ToolCall) -> ToolCallOut {
        ToolCallOut {
            id: super::new_id("call_"),
            kind: "function".into(),
            function: FunctionCallOut { name: call.name.clone(), arguments: call.arguments_json() },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub role: String,
    pub content: Option<String>,
    /// The model's reasoning, apart from the answer (vLLM's and llama.cpp's field); absent when
    /// the model gave none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<Json>,
    pub finish_reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageOut,
}

/// OpenAI's `finish_reason` for a choice.
pub fn finish_reason(finish: &FinishReason, called_tools: bool) -> &'static str {
    match finish {
        FinishReason::EndOfTurn if called_tools => "tool_calls",
        FinishReason::EndOfTurn | FinishReason::StopSequence(_) => "stop",
        FinishReason::MaxTokens => "length",
    }
}

/// The non-streaming answer to a chat completion: each reply split in the model's `format` into
/// reasoning (returned by default, as `reasoning_content`), content, and tool calls when the
/// request had tools.
pub fn chat_completion(
    id: &str,
    created: u64,
    request: &GenerateRequest,
    format: ReplyFormat,
    outputs: &[Output],
    usage: Usage,
) -> ChatCompletion {
    let choices = outputs
        .iter()
        .enumerate()
        .map(|(index, out)| {
            let reply::Reply { reasoning, content, calls } = reply::split(format, request.parses_tool_calls(), &out.text);
            let tool_calls = if calls.is_empty() { None } else { Some(calls.iter().map(ToolCallOut::new).collect()) };
            let content = if content.is_empty() && tool_calls.is_some() { None } else { Some(content) };
            let reasoning_content = (!reasoning.is_empty()).then_some(reasoning);
            ChatChoice {
                index,
                message: AssistantMessage { role: "assistant".into(), content, reasoning_content, tool_calls },
                logprobs: None,
                finish_reason: finish_reason(&out.finish, !calls.is_empty()).into(),
            }
        })
        .collect();
    ChatCompletion { id: id.into(), object: "chat.completion".into(), created, model: request.model.clone(), choices, usage: usage.into() }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub text: String,
    pub index: usize,
    pub logprobs: Option<Json>,
    pub finish_reason: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
}

/// The non-streaming answer to `/v1/completions`.
pub fn completion(id: &str, created: u64, model: &str, outputs: &[Output], usage: Usage) -> Completion {
    let choices = outputs
        .iter()
        .enumerate()
        .map(|(index, out)| CompletionChoice {
            text: out.text.clone(),
            index,
            logprobs: None,
            finish_reason: Some(finish_reason(&out.finish, false).into()),
        })
        .collect();
    Completion { id: id.into(), object: "text_completion".into(), created, model: model.into(), choices, usage: Some(usage.into()) }
}

/// `GET /v1/models`.
pub fn models_list(served: &[String], created: u64) -> Json {
    let data: Vec<Json> = served.iter().map(|m| json!({"id": m, "object": "model", "created": created, "owned_by": "brink"})).collect();
    json!({"object": "list", "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::error::parse_body;
    use crate::wire::request::test_limits;

    fn chat(body: &str) -> Result<GenerateRequest, ApiError> {
        parse_body::<ChatCompletionRequest>(body.as_bytes())?.validate(&test_limits())
    }

    /// What `client.chat.completions.create(model=..., messages=[...], tools=[...], stream=True,
    /// stream_options={"include_usage": True})` of the `openai` Python SDK sends.
    const SDK_TOOLS_BODY: &str = r#"{
        "messages": [
            {"role": "developer", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "text", "text": "And Rome?"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_abc", "content": "18C sunny"}
        ],
        "model": "qwen3-30b-a3b",
        "max_completion_tokens": 256,
        "parallel_tool_calls": true,
        "seed": -5,
        "stop": "\n\nUser:",
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0.2,
        "tool_choice": "auto",
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, "strict": false}}],
        "top_p": 0.9,
        "user": "u-123"
    }"#;

    #[test]
    fn sdk_body_with_tools() {
        let r = chat(SDK_TOOLS_BODY).unwrap();
        let Prompt::Chat { messages, tools } = &r.prompt else { panic!("chat prompt expected") };
        assert_eq!(messages.len(), 4);
        assert_eq!(messages[0], json!({"role": "system", "content": "You are terse."}));
        assert_eq!(
            messages[1],
            json!({"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "text", "text": "And Rome?"}]})
        );
        assert_eq!(
            messages[2],
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})
        );
        assert_eq!(messages[3], json!({"role": "tool", "content": "18C sunny", "tool_call_id": "call_abc"}));
        let tools = tools.as_ref().unwrap();
        assert_eq!(tools[0]["function"]["name"], "get_weather");
        assert_eq!(tools[0]["function"]["parameters"]["required"], json!(["city"]));
        // Key order is the client's (templates dump schemas with it).
        let keys: Vec<&String> = tools[0]["function"]["parameters"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["type", "properties", "required"]);
        assert_eq!(r.max_tokens, Some(256));
        assert_eq!(r.sampling, Sampling { temperature: 0.2, top_p: 0.9, top_k: 0, seed: Some(-5i64 as u64) });
        assert_eq!(r.stop, vec!["\n\nUser:".to_string()]);
        assert_eq!((r.n, r.stream, r.include_usage), (1, true, true));
        assert_eq!(r.tool_choice, ToolChoice::Auto);
    }

    #[test]
    fn renders_through_a_template() {
        // The converted messages and tools go through the chat template renderer as they are.
        let r = chat(SDK_TOOLS_BODY).unwrap();
        let Prompt::Chat { messages, tools } = &r.prompt else { panic!("chat prompt expected") };
        let t = crate::chat_template::ChatTemplate::chatml().unwrap();
        let text = t.render(messages, tools.as_ref(), true).unwrap();
        assert!(
            text.starts_with("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWeather in Paris?\nAnd Rome?<|im_end|>"),
            "{text}"
        );
        assert!(text.ends_with("<|im_start|>tool\n18C sunny<|im_end|>\n<|im_start|>assistant\n"), "{text}");
    }

    #[test]
    fn minimal_body_defaults() {
        let r = chat(r#"{"model": "brink", "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
        assert_eq!(r.max_tokens, None);
        assert_eq!(r.sampling, Sampling::default());
        assert_eq!((r.n, r.stream, r.include_usage, r.tool_choice.clone()), (1, false, false, ToolChoice::None));
        assert!(r.stop.is_empty());
        // Nulls as some clients send them, and a stop array.
        let r = chat(r#"{"model": "brink", "messages": [{"role": "user", "content": "Hi"}], "temperature": null, "stop": ["a", "b"], "max_tokens": 5, "n": 2, "top_k": 20}"#)
            .unwrap();
        assert_eq!((r.max_tokens, r.n, r.sampling.top_k, r.stop.len()), (Some(5), 2, 20, 2));
    }

    #[test]
    fn validation_errors_name_the_field() {
        let m = r#""messages": [{"role": "user", "content": "Hi"}]"#;
        let cases: Vec<(String, u16, &str)> = vec![
            (r#"{"model": "brink", "messages": [}"#.into(), 400, "malformed JSON body: "),
            (r#"{"model": "brink", "messages": []}"#.into(), 400, "messages: must contain at least one message"),
            (format!(r#"{{"model": "gpt-4o", {m}}}"#), 404, "model \"gpt-4o\" is not served here"),
            (format!(r#"{{"model": 5, {m}}}"#), 400, "model: invalid type: integer `5`, expected a string"),
            (r#"{"model": "brink", "messages": "hi"}"#.into(), 400, "messages: invalid type: string \"hi\", expected a sequence"),
            (
                r#"{"model": "brink", "messages": [{"role": "robot", "content": "x"}]}"#.into(),
                400,
                "messages[0].role: unknown role \"robot\"",
            ),
            (r#"{"model": "brink", "messages": [{"role": "user"}]}"#.into(), 400, "messages[0].content: is required"),
            (
                r#"{"model": "brink", "messages": [{"role": "user", "content": 3}]}"#.into(),
                400,
                "messages[0].content: must be a string or an array",
            ),
            (
                r#"{"model": "brink", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#
                    .into(),
                400,
                "messages[0].content[0]: content type \"image_url\" is not supported",
            ),
            (r#"{"model": "brink", "messages": [{"role": "tool", "content": "x"}]}"#.into(), 400, "messages[0].tool_call_id: is required"),
            (format!(r#"{{"model": "brink", {m}, "max_tokens": 0}}"#), 400, "max_tokens: must be at least 1, got 0"),
            (
                format!(r#"{{"model": "brink", {m}, "max_tokens": 10000000}}"#),
                400,
                "max_tokens: 10000000 is more than the model's context of 32768",
            ),
            (
                format!(r#"{{"model": "brink", {m}, "max_completion_tokens": -1}}"#),
                400,
                "max_completion_tokens: invalid value: integer `-1`",
            ),
            (format!(r#"{{"model": "brink", {m}, "max_tokens": "many"}}"#), 400, "max_tokens: invalid type: string \"many\""),
            (format!(r#"{{"model": "brink", {m}, "temperature": -1}}"#), 400, "temperature: must be between 0 and 2, got -1"),
            (format!(r#"{{"model": "brink", {m}, "top_p": 0}}"#), 400, "top_p: must be greater than 0 and at most 1, got 0"),
            (format!(r#"{{"model": "brink", {m}, "n": 0}}"#), 400, "n: must be between 1 and 4, got 0"),
            (format!(r#"{{"model": "brink", {m}, "n": 9}}"#), 400, "n: must be between 1 and 4, got 9"),
            (format!(r#"{{"model": "brink", {m}, "stop": ["x", ""]}}"#), 400, "stop[1]: must not be empty"),
            (format!(r#"{{"model": "brink", {m}, "stop": 4}}"#), 400, "stop: data did not match"),
            (format!(r#"{{"model": "brink", {m}, "stream": "yes"}}"#), 400, "stream: invalid type: string \"yes\", expected a boolean"),
            (format!(r#"{{"model": "brink", {m}, "tool_choice": "sometimes"}}"#), 400, "tool_choice: must be \"none\""),
            (
                format!(r#"{{"model": "brink", {m}, "tool_choice": "required"}}"#),
                400,
                "tool_choice: asks for a tool call but no tools were given",
            ),
            (
                format!(
                    r#"{{"model": "brink", {m}, "tools": [{{"type": "function", "function": {{"name": "a"}}}}], "tool_choice": {{"type": "function", "function": {{"name": "b"}}}}}}"#
                ),
                400,
                "tool_choice: names the tool \"b\" but tools are: a",
            ),
            (
                format!(r#"{{"model": "brink", {m}, "tools": [{{"type": "retrieval", "function": {{"name": "a"}}}}]}}"#),
                400,
                "tools[0].type: must be \"function\"",
            ),
            (format!(r#"{{"model": "brink", {m}, "tools": [{{"type": "function"}}]}}"#), 400, "tools[0]: missing field `function`"),
            (
                format!(r#"{{"model": "brink", {m}, "reasoning_effort": "extreme"}}"#),
                400,
                "reasoning_effort: must be \"low\", \"medium\" or \"high\", got \"extreme\"",
            ),
            (format!(r#"{{"model": "brink", {m}, "reasoning_effort": 3}}"#), 400, "reasoning_effort: invalid type: integer `3`"),
        ];
        for (body, status, start) in cases {
            let e = chat(&body).unwrap_err();
            assert_eq!(e.status, status, "{body}: {e}");
            assert!(e.message.starts_with(start), "{body}\n  got: {}\n  want: {start}", e.message);
        }
    }

    #[test]
    fn named_tool_choice_keeps_that_tool() {
        let body = r#"{"model": "brink", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b"}}],
            "tool_choice": {"type": "function", "function": {"name": "b"}}}"#;
        let r = chat(body).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Named("b".into()));
        assert_eq!(
            r.prompt,
            Prompt::Chat {
                messages: vec![json!({"role": "user", "content": "x"})],
                tools: Some(json!([{"type": "function", "function": {"name": "b"}}]))
            }
        );
        let r = chat(&body.replace(r#"{"type": "function", "function": {"name": "b"}}}"#, r#""none"}"#)).unwrap();
        assert!(matches!(r.prompt, Prompt::Chat { tools: None, .. }));
        assert!(!r.parses_tool_calls());
    }

    #[test]
    fn completions_request() {
        let limits = test_limits();
        let parse = |b: &str| parse_body::<CompletionRequest>(b.as_bytes()).and_then(|r| r.validate(&limits));
        let r = parse(r#"{"model": "brink", "prompt": "Once upon", "stream": true, "stop": ["\n"], "seed": 7}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Text("Once upon".into()));
        assert_eq!((r.max_tokens, r.stream, r.sampling.seed), (Some(16), true, Some(7)));
        assert_eq!(parse(r#"{"model": "brink", "prompt": ["a"]}"#).unwrap().prompt, Prompt::Text("a".into()));
        assert!(parse(r#"{"model": "brink", "prompt": ["a", "b"]}"#).unwrap_err().message.starts_with("prompt: one prompt per request"));
        assert!(parse(r#"{"model": "brink", "prompt": "a", "echo": true}"#).unwrap_err().message.starts_with("echo: "));
        assert!(parse(r#"{"model": "brink"}"#).unwrap_err().message.contains("missing field `prompt`"));
    }

    #[test]
    fn chat_response_with_tool_calls_round_trips() {
        let r = chat(SDK_TOOLS_BODY).unwrap();
        let outputs = vec![
            Output {
                text: "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>".into(),
                finish: FinishReason::EndOfTurn,
            },
            Output { text: "It is sunny.".into(), finish: FinishReason::StopSequence("\n\nUser:".into()) },
        ];
        let usage = Usage { prompt_tokens: 100, completion_tokens: 30, cached_tokens: 64 };
        let resp = chat_completion("chatcmpl-1", 1700000000, &r, ReplyFormat::Hermes, &outputs, usage);
        let v = serde_json::to_value(&resp).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(v["choices"][0]["message"]["content"], Json::Null);
        let call = &v["choices"][0]["message"]["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"], json!({"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}));
        assert_eq!(v["choices"][1]["message"], json!({"role": "assistant", "content": "It is sunny."}));
        assert_eq!(v["choices"][1]["finish_reason"], "stop");
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 100, "completion_tokens": 30, "total_tokens": 130, "prompt_tokens_details": {"cached_tokens": 64}})
        );
        let back: ChatCompletion = serde_json::from_value(v).unwrap();
        assert_eq!(back, resp);
        // Without tools the same text is plain content.
        let plain = chat(r#"{"model": "brink", "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
        let resp = chat_completion("c", 0, &plain, ReplyFormat::Hermes, &outputs[..1], usage);
        assert_eq!(resp.choices[0].message.content.as_deref(), Some(outputs[0].text.as_str()));
        assert_eq!(resp.choices[0].finish_reason, "stop");
    }

    #[test]
    fn reasoning_effort_reaches_the_template() {
        let r = chat(r#"{"model": "brink", "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "high"}"#).unwrap();
        assert_eq!(r.reasoning_effort.as_deref(), Some("high"));
        assert_eq!(Json::Object(r.template_vars()), json!({"reasoning_effort": "high"}));
        let t = crate::chat_template::ChatTemplate::new("Reasoning: {{ reasoning_effort | default('medium') }}", "", "").unwrap();
        let Prompt::Chat { messages, tools } = &r.prompt else { panic!("chat prompt expected") };
        assert_eq!(t.render_with(messages, tools.as_ref(), true, &r.template_vars()).unwrap(), "Reasoning: high");
        let r = chat(r#"{"model": "brink", "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
        assert!(r.template_vars().is_empty());
        assert_eq!(t.render_with(&[json!({"role": "user", "content": "x"})], None, true, &r.template_vars()).unwrap(), "Reasoning: medium");
    }

    #[test]
    fn chat_response_with_reasoning() {
        let r = chat(SDK_TOOLS_BODY).unwrap();
        let harmony = "<|channel|>analysis<|message|>Need Rome.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Rome\"}";
        let outputs = [
            Output { text: harmony.into(), finish: FinishReason::EndOfTurn },
            Output {
                text: "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.".into(),
                finish: FinishReason::EndOfTurn,
            },
        ];
        let v = serde_json::to_value(chat_completion("c", 0, &r, ReplyFormat::Harmony, &outputs, Usage::default())).unwrap();
        assert_eq!(v["choices"][0]["message"]["reasoning_content"], "Need Rome.");
        assert_eq!(v["choices"][0]["message"]["content"], Json::Null);
        assert_eq!(
            v["choices"][0]["message"]["tool_calls"][0]["function"],
            json!({"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"})
        );
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(v["choices"][1]["message"], json!({"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."}));
        assert_eq!(v["choices"][1]["finish_reason"], "stop");
        // Qwen3's <think> the same way; without reasoning the field is absent.
        let plain = chat(r#"{"model": "brink", "messages": [{"role": "user", "content": "Hi"}]}"#).unwrap();
        let outputs = [
            Output { text: "<think>\nhello?\n</think>\n\nHello!".into(), finish: FinishReason::EndOfTurn },
            Output { text: "Hello!".into(), finish: FinishReason::MaxTokens },
        ];
        let v = serde_json::to_value(chat_completion("c", 0, &plain, ReplyFormat::Hermes, &outputs, Usage::default())).unwrap();
        assert_eq!(v["choices"][0]["message"], json!({"role": "assistant", "content": "Hello!", "reasoning_content": "hello?"}));
        assert_eq!(v["choices"][1]["message"], json!({"role": "assistant", "content": "Hello!"}));
    }

    #[test]
    fn completion_and_models() {
        let out = [Output { text: " there was".into(), finish: FinishReason::MaxTokens }];
        let c = completion("cmpl-1", 5, "brink", &out, Usage { prompt_tokens: 2, completion_tokens: 3, cached_tokens: 0 });
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "brink",
                "choices": [{"text": " there was", "index": 0, "logprobs": null, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}})
        );
        assert_eq!(
            models_list(&["brink".into()], 9),
            json!({"object": "list", "data": [{"id": "brink", "object": "model", "created": 9, "owned_by": "brink"}]})
        );
    }
}
