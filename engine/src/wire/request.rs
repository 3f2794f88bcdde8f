//! The API-neutral request the scheduler takes, what it gives back, and the checks both APIs
//! share. Each check returns a 400/404 whose message names the field and the limit.

use serde_json::Value as Json;

use super::error::ApiError;
use crate::sampler::SamplingParams;

/// What the server knows when it checks a request.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The model names this server answers to (the first is the one `/v1/models` lists first).
    pub served_models: Vec<String>,
    /// The context length in tokens: no request may ask for more new tokens than this.
    pub context_tokens: usize,
    /// The most choices (`n`) one request may ask for.
    pub max_n: usize,
}

/// What the model is asked to continue.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// OpenAI-shaped messages (`role`, `content`, `tool_calls`, `tool_call_id`) as
    /// [`ChatTemplate::render`](crate::chat_template::ChatTemplate::render) takes them, and the
    /// tools in the template's shape (`[{"type": "function", "function": {...}}]`).
    Chat { messages: Vec<Json>, tools: Option<Json> },
    /// A raw prompt (`/v1/completions`), tokenized as is.
    Text(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 keeps all tokens.
    pub top_k: usize,
    /// `None`: the server picks one per request.
    pub seed: Option<u64>,
}

impl Default for Sampling {
    /// Both APIs default to temperature 1 and top_p 1.
    fn default() -> Sampling {
        Sampling { temperature: 1.0, top_p: 1.0, top_k: 0, seed: None }
    }
}

impl Sampling {
    /// The sampler's parameters; `fallback_seed` when the client gave none. Choice `i` of an
    /// `n > 1` request should pass `seed + i` so the choices differ yet stay reproducible.
    pub fn params(&self, fallback_seed: u64) -> SamplingParams {
        SamplingParams { temperature: self.temperature, top_k: self.top_k, top_p: self.top_p, seed: self.seed.unwrap_or(fallback_seed) }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tools were given, or the client said `none` (the tools are then left out of the prompt).
    None,
    Auto,
    /// The client asked for at least one call (OpenAI `required`, Anthropic `any`). Not enforced
    /// on decoding: the prompt has the tools and the reply is parsed for calls as with `Auto`.
    Required,
    /// One named tool; the prompt lists only that tool.
    Named(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateRequest {
    /// The served model name the client asked for.
    pub model: String,
    pub prompt: Prompt,
    pub tool_choice: ToolChoice,
    /// New tokens at most; `None`: until the context is full (OpenAI's default).
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    /// Generation ends before the first of these strings; it is not part of the output.
    pub stop: Vec<String>,
    /// Independent choices to generate for the same prompt.
    pub n: usize,
    pub stream: bool,
    /// OpenAI `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
    /// OpenAI `reasoning_effort` (checked by [`check_reasoning_effort`]): given to the chat
    /// template as the variable of that name (gpt-oss's template reads it).
    pub reasoning_effort: Option<String>,
}

impl GenerateRequest {
    /// Whether the reply should be searched for `<tool_call>` blocks.
    pub fn parses_tool_calls(&self) -> bool {
        self.tool_choice != ToolChoice::None
    }

    /// The chat template variables the request sets beyond messages and tools.
    pub fn template_vars(&self) -> serde_json::Map<String, Json> {
        let mut vars = serde_json::Map::new();
        if let Some(effort) = &self.reasoning_effort {
            vars.insert("reasoning_effort".into(), Json::from(effort.clone()));
        }
        vars
    }
}

/// The reasoning efforts models are trained on (gpt-oss's `Reasoning: low|medium|high`).
pub const REASONING_EFFORTS: [&str; 3] = ["low", "medium", "high"];

pub fn check_reasoning_effort(value: Option<String>) -> Result<Option<String>, ApiError> {
    match value {
        Some(v) if !REASONING_EFFORTS.contains(&v.as_str()) => {
            Err(ApiError::invalid("reasoning_effort", format!("must be \"low\", \"medium\" or \"high\", got \"{v}\"")))
        }
        v => Ok(v),
    }
}

/// Why a choice ended, before the tool-call parse (which turns `EndOfTurn` into a tool-call
/// finish when the reply called tools).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended its turn (an end-of-generation token).
    EndOfTurn,
    /// `max_tokens` or the context ran out.
    MaxTokens,
    /// One of the request's stop strings (which is not in the text).
    StopSequence(String),
}

/// One finished choice, its text already cut at the stop string.
#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub text: String,
    pub finish: FinishReason,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// All prompt tokens, the reused ones included.
    pub prompt_tokens: u64,
    /// Generated tokens over all choices.
    pub completion_tokens: u64,
    /// Prompt tokens whose KV came from the prefix cache.
    pub cached_tokens: u64,
}

pub fn check_model(model: &str, limits: &Limits) -> Result<(), ApiError> {
    if limits.served_models.iter().any(|m| m == model) { Ok(()) } else { Err(ApiError::unknown_model(model, &limits.served_models)) }
}

/// Once the prompt is tokenized: the prompt must leave room for at least one new token, and
/// the new tokens are capped by what the context has left. Returns that cap.
pub fn check_prompt_fits(param: &str, prompt_tokens: usize, max_tokens: Option<usize>, context_tokens: usize) -> Result<usize, ApiError> {
    if prompt_tokens >= context_tokens {
        let message = format!(
            "the prompt is {prompt_tokens} tokens; the model's context is {context_tokens} tokens, and at least one must be left to generate"
        );
        return Err(ApiError { param: Some(param.into()), ..ApiError::new(super::ErrorKind::InvalidRequest, message) });
    }
    let room = context_tokens - prompt_tokens;
    Ok(max_tokens.map_or(room, |m| m.min(room)))
}

/// `max_tokens` must be at least 1 and no more than the context.
pub fn check_max_tokens(field: &str, value: u64, limits: &Limits) -> Result<usize, ApiError> {
    if value == 0 {
        return Err(ApiError::invalid(field, "must be at least 1, got 0"));
    }
    match usize::try_from(value) {
        Ok(v) if v <= limits.context_tokens => Ok(v),
        _ => Err(ApiError::invalid(field, format!("{value} is more than the model's context of {} tokens", limits.context_tokens))),
    }
}

/// A temperature in `[0, max]` (OpenAI documents 2, Anthropic 1).
pub fn check_temperature(value: Option<f64>, max: f64) -> Result<f32, ApiError> {
    match value {
        None => Ok(1.0),
        Some(t) if t.is_finite() && (0.0..=max).contains(&t) => Ok(t as f32),
        Some(t) => Err(ApiError::invalid("temperature", format!("must be between 0 and {max}, got {t}"))),
    }
}

/// A top_p in `(0, 1]`.
pub fn check_top_p(value: Option<f64>) -> Result<f32, ApiError> {
    match value {
        None => Ok(1.0),
        Some(p) if p > 0.0 && p <= 1.0 => Ok(p as f32),
        Some(p) => Err(ApiError::invalid("top_p", format!("must be greater than 0 and at most 1, got {p}"))),
    }
}

/// A top_k of 0 or more (0, as llama.cpp and vLLM's -1, keeps all tokens).
pub fn check_top_k(value: Option<i64>) -> Result<usize, ApiError> {
    match value {
        None | Some(-1) => Ok(0),
        Some(k) => usize::try_from(k).map_err(|_| ApiError::invalid("top_k", format!("must be 0 or more (or -1 for all), got {k}"))),
    }
}

pub fn check_n(value: Option<i64>, limits: &Limits) -> Result<usize, ApiError> {
    match value {
        None => Ok(1),
        Some(n) if n >= 1 && (n as u64) <= limits.max_n as u64 => Ok(n as usize),
        Some(n) => Err(ApiError::invalid("n", format!("must be between 1 and {}, got {n}", limits.max_n))),
    }
}

/// Stop strings must not be empty (an empty one would stop before the first token).
pub fn check_stop(field: &str, stops: Vec<String>) -> Result<Vec<String>, ApiError> {
    if let Some(i) = stops.iter().position(String::is_empty) {
        return Err(ApiError::invalid(&format!("{field}[{i}]"), "must not be empty"));
    }
    Ok(stops)
}

/// The tool choice must name a tool the request defines, and tools must be given for any
/// choice other than `none`/`auto`.
pub fn check_tool_choice(choice: ToolChoice, tool_names: &[String], field: &str) -> Result<ToolChoice, ApiError> {
    match &choice {
        ToolChoice::Named(name) if !tool_names.contains(name) => {
            let known =
                if tool_names.is_empty() { "no tools were given".to_string() } else { format!("tools are: {}", tool_names.join(", ")) };
            Err(ApiError::invalid(field, format!("names the tool \"{name}\" but {known}")))
        }
        ToolChoice::Required if tool_names.is_empty() => Err(ApiError::invalid(field, "asks for a tool call but no tools were given")),
        ToolChoice::Auto if tool_names.is_empty() => Ok(ToolChoice::None),
        _ => Ok(choice),
    }
}

/// Tool names must be unique and non-empty, so a call can be told apart by its name.
pub fn check_tool_names(names: &[String], field: &str) -> Result<(), ApiError> {
    for (i, name) in names.iter().enumerate() {
        if name.is_empty() {
            return Err(ApiError::invalid(&format!("{field}[{i}]"), "tool name must not be empty"));
        }
        if names[..i].contains(name) {
            return Err(ApiError::invalid(&format!("{field}[{i}]"), format!("tool name \"{name}\" is defined twice")));
        }
    }
    Ok(())
}

/// Keeps only the tools the choice allows: none for `None`, the named one for `Named`.
pub fn tools_for_choice(tools: Vec<Json>, names: &[String], choice: &ToolChoice) -> Option<Json> {
    let kept: Vec<Json> = match choice {
        ToolChoice::None => return None,
        ToolChoice::Named(name) => tools.into_iter().zip(names).filter(|(_, n)| *n == name).map(|(t, _)| t).collect(),
        ToolChoice::Auto | ToolChoice::Required => tools,
    };
    if kept.is_empty() { None } else { Some(Json::Array(kept)) }
}

#[cfg(test)]
pub(crate) fn test_limits() -> Limits {
    Limits { served_models: vec!["qwen3-30b-a3b".into(), "brink".into()], context_tokens: 32768, max_n: 4 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_checks() {
        let l = test_limits();
        assert_eq!(check_max_tokens("max_tokens", 1, &l), Ok(1));
        assert_eq!(check_max_tokens("max_tokens", 32768, &l), Ok(32768));
        assert_eq!(check_max_tokens("max_tokens", 0, &l).unwrap_err().message, "max_tokens: must be at least 1, got 0");
        assert_eq!(
            check_max_tokens("max_tokens", 1 << 40, &l).unwrap_err().message,
            "max_tokens: 1099511627776 is more than the model's context of 32768 tokens"
        );
        assert_eq!(check_temperature(None, 2.0), Ok(1.0));
        assert_eq!(check_temperature(Some(0.0), 2.0), Ok(0.0));
        assert!(check_temperature(Some(-0.5), 2.0).unwrap_err().message.contains("got -0.5"));
        assert!(check_temperature(Some(f64::NAN), 2.0).is_err());
        assert!(check_temperature(Some(1.5), 1.0).is_err());
        assert_eq!(check_top_p(Some(1.0)), Ok(1.0));
        assert!(check_top_p(Some(0.0)).is_err());
        assert!(check_top_p(Some(1.01)).is_err());
        assert!(check_top_p(Some(f64::NAN)).is_err());
        assert_eq!(check_top_k(Some(-1)), Ok(0));
        assert_eq!(check_top_k(Some(40)), Ok(40));
        assert!(check_top_k(Some(-2)).is_err());
        assert_eq!(check_n(None, &l), Ok(1));
        assert_eq!(check_n(Some(4), &l), Ok(4));
        assert_eq!(check_n(Some(0), &l).unwrap_err().message, "n: must be between 1 and 4, got 0");
        assert!(check_n(Some(5), &l).is_err());
        assert_eq!(check_stop("stop", vec!["a".into(), "".into()]).unwrap_err().param.as_deref(), Some("stop[1]"));
    }

    #[test]
    fn prompt_fits_the_context() {
        assert_eq!(check_prompt_fits("messages", 100, None, 32768), Ok(32668));
        assert_eq!(check_prompt_fits("messages", 100, Some(50), 32768), Ok(50));
        assert_eq!(check_prompt_fits("messages", 32700, Some(500), 32768), Ok(68));
        let e = check_prompt_fits("prompt", 40000, Some(10), 32768).unwrap_err();
        assert_eq!((e.status, e.param.as_deref()), (400, Some("prompt")));
        assert_eq!(e.message, "the prompt is 40000 tokens; the model's context is 32768 tokens, and at least one must be left to generate");
        assert!(check_prompt_fits("messages", 32768, None, 32768).is_err());
    }

    #[test]
    fn model_and_tools() {
        let l = test_limits();
        assert!(check_model("brink", &l).is_ok());
        let e = check_model("gpt-4o", &l).unwrap_err();
        assert_eq!((e.status, e.message.as_str()), (404, "model \"gpt-4o\" is not served here; available: qwen3-30b-a3b, brink"));
        let names = vec!["get_weather".to_string(), "search".to_string()];
        assert_eq!(check_tool_choice(ToolChoice::Named("search".into()), &names, "tool_choice"), Ok(ToolChoice::Named("search".into())));
        let e = check_tool_choice(ToolChoice::Named("nope".into()), &names, "tool_choice").unwrap_err();
        assert_eq!(e.message, "tool_choice: names the tool \"nope\" but tools are: get_weather, search");
        assert!(check_tool_choice(ToolChoice::Required, &[], "tool_choice").is_err());
        assert_eq!(check_tool_choice(ToolChoice::Auto, &[], "tool_choice"), Ok(ToolChoice::None));
        assert!(check_tool_names(&["a".into(), "a".into()], "tools").unwrap_err().message.contains("defined twice"));
        let tools = vec![serde_json::json!({"n": 1}), serde_json::json!({"n": 2})];
        assert_eq!(tools_for_choice(tools.clone(), &names, &ToolChoice::Named("search".into())), Some(serde_json::json!([{"n": 2}])));
        assert_eq!(tools_for_choice(tools.clone(), &names, &ToolChoice::None), None);
        assert_eq!(tools_for_choice(tools, &names, &ToolChoice::Auto).unwrap().as_array().unwrap().len(), 2);
    }
}
