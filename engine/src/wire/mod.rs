//! The wire formats of the serving API, as pure logic (no sockets, no async): the HTTP server
//! parses a body with [`openai`] or [`anthropic`], turns it into an API-neutral
//! [`GenerateRequest`] (validated into [`ApiError`]s that name the field), runs it, and writes the
//! answer back in the client's own format — whole, or as SSE frames from [`sse`].
//!
//! - [`request`] — [`GenerateRequest`], [`Limits`], the checks every API shares.
//! - [`openai`] — `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//! - [`anthropic`] — `/v1/messages`.
//! - [`reply`] — a reply split into reasoning, answer and tool calls, per chat format (Qwen3's
//!   `<think>`, gpt-oss's harmony channels), whole or streamed.
//! - [`tool_calls`] — `<tool_call>{...}</tool_call>` blocks in generated text, whole or streamed.
//! - [`stop`] — stop strings over streamed bytes, holding back a possible partial match.
//! - [`sse`] — server-sent-event framing and the per-API stream state machines.
//! - [`error`] — [`ApiError`] in each API's error JSON.

pub mod anthropic;
pub mod error;
pub mod openai;
pub mod reply;
pub mod request;
pub mod sse;
pub mod stop;
pub mod tool_calls;

pub use error::{ApiError, ErrorKind};
pub use request::{FinishReason, GenerateRequest, Limits, Output, Prompt, Sampling, ToolChoice, Usage};

/// A fresh id for a response or tool call: `prefix` and 24 random alphanumerics, as the
/// official APIs write theirs (`chatcmpl-…`, `call_…`, `msg_…`, `toolu_…`).
pub fn new_id(prefix: &str) -> String {
    use rand::Rng;
    use rand::distr::Alphanumeric;
    let tail: String = rand::rng().sample_iter(&Alphanumeric).take(24).map(char::from).collect();
    format!("{prefix}{tail}")
}

/// Seconds since the Unix epoch, for OpenAI's `created` fields.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
