//! Server-sent events: the frames, and per API a small state machine that turns what a choice
//! produced (text, tool calls, its end) into that API's stream.
//!
//! - OpenAI: `data: {chunk}\n\n` frames, ending with `data: [DONE]\n\n`; an error mid-stream is
//!   `data: {"error": {...}}\n\n` (the SDKs raise it), after which the stream ends.
//! - Anthropic: `event: TYPE\ndata: {...}\n\n` frames: `message_start`, per content block
//!   `content_block_start` / `content_block_delta`s / `content_block_stop`, `message_delta` with
//!   the stop reason and usage, `message_stop`; an error is an `error` event.
//!
//! The server feeds each choice's token bytes to a [`ChoiceStream`] (stop strings, then the
//! reply format's parse into reasoning, text and tool calls) and hands the resulting pieces to
//! the API's encoder. Reasoning goes out by default, apart from the answer: OpenAI's
//! `delta.reasoning_content` (as vLLM and llama.cpp send it), Anthropic's `thinking` blocks.

use serde::Serialize;
use serde_json::{Value as Json, json};

use super::error::ApiError;
use super::openai::{self, UsageOut};
use super::reply::{ReplyFormat, ReplyParser};
use super::request::{FinishReason, GenerateRequest, Prompt, Usage};
use super::stop::{StopMatcher, StopStep};
use super::tool_calls::{Piece, ToolCall};
use super::{anthropic, new_id};

pub const OPENAI_DONE: &str = "data: [DONE]\n\n";

/// `data: JSON\n\n`.
pub fn data_frame<T: Serialize>(value: &T) -> String {
    // Serializing our own types and `Value`s cannot fail (no maps with non-string keys).
    format!("data: {}\n\n", serde_json::to_string(value).unwrap_or_default())
}

/// `event: NAME\ndata: JSON\n\n`.
pub fn event_frame<T: Serialize>(event: &str, value: &T) -> String {
    format!("event: {event}\ndata: {}\n\n", serde_json::to_string(value).unwrap_or_default())
}

/// What one push into a [`ChoiceStream`] gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChoiceStep {
    pub pieces: Vec<Piece>,
    /// A stop string ended the choice: stop generating it, and finish with this reason.
    pub stopped: Option<FinishReason>,
}

/// One choice's output on its way to the client: stop strings cut it, then a chat reply is
/// parsed in its format (reasoning, and tool calls when the request has tools); a raw
/// completion is passed as it is. Whitespace between and after tool calls is dropped, as the
/// non-streaming answer trims it.
#[derive(Clone, Debug)]
pub struct ChoiceStream {
    stop: StopMatcher,
    parser: Option<ReplyParser>,
    called_tools: bool,
    /// Whitespace after a call, sent only if more text follows.
    pending_space: String,
}

impl ChoiceStream {
    pub fn new(request: &GenerateRequest, format: ReplyFormat) -> ChoiceStream {
        let chat = matches!(request.prompt, Prompt::Chat { .. });
        ChoiceStream {
            stop: StopMatcher::new(request.stop.clone()),
            parser: chat.then(|| ReplyParser::new(format, request.parses_tool_calls())),
            called_tools: false,
            pending_space: String::new(),
        }
    }

    /// The bytes of the next generated token(s).
    pub fn push(&mut self, bytes: &[u8]) -> ChoiceStep {
        match self.stop.push(bytes) {
            StopStep::Text(text) => ChoiceStep { pieces: self.parse(&text, false), stopped: None },
            StopStep::Stopped { text, stop } => {
                let stopped = Some(FinishReason::StopSequence(self.stop.stops()[stop].clone()));
                ChoiceStep { pieces: self.parse(&text, true), stopped }
            }
        }
    }

    /// The engine ended the choice (end of turn or token limit): what was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = self.stop.finish();
        self.parse(&rest, true)
    }

    pub fn called_tools(&self) -> bool {
        self.called_tools
    }

    fn parse(&mut self, text: &str, last: bool) -> Vec<Piece> {
        let Some(parser) = self.parser.as_mut() else {
            return if text.is_empty() { Vec::new() } else { vec![Piece::Text(text.to_string())] };
        };
        let mut pieces = parser.push(text);
        if last {
            pieces.extend(parser.finish());
        }
        let mut out = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match piece {
                Piece::Call(call) => {
                    self.pending_space.clear();
                    self.called_tools = true;
                    out.push(Piece::Call(call));
                }
                Piece::Text(t) if self.called_tools && t.trim().is_empty() => self.pending_space.push_str(&t),
                Piece::Text(t) => {
                    let t = std::mem::take(&mut self.pending_space) + &t;
                    super::reply::push_piece(&mut out, Piece::Text(t));
                }
                reasoning @ Piece::Reasoning(_) => super::reply::push_piece(&mut out, reasoning),
            }
        }
        out
    }
}

// ---- OpenAI ----

#[derive(Clone, Debug, Serialize)]
struct FunctionDelta<'a> {
    name: &'a str,
    arguments: String,
}

#[derive(Clone, Debug, Serialize)]
struct ToolCallDelta<'a> {
    index: usize,
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionDelta<'a>,
}

#[derive(Clone, Debug, Default, Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ToolCallDelta<'a>>>,
}

#[derive(Clone, Debug, Serialize)]
struct ChunkChoice<'a> {
    index: usize,
    delta: Delta<'a>,
    logprobs: Option<Json>,
    finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
struct ChatChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    /// With `include_usage`, `null` in every chunk but the last, as OpenAI sends it.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<UsageOut>>,
}

/// The chunks of a streamed chat completion.
#[derive(Clone, Debug)]
pub struct OpenAiChatStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    n: usize,
    /// Per choice: how many tool calls it has sent (the `index` of the next).
    calls_sent: Vec<usize>,
}

impl OpenAiChatStream {
    pub fn new(id: &str, created: u64, request: &GenerateRequest) -> OpenAiChatStream {
        OpenAiChatStream {
            id: id.into(),
            created,
            model: request.model.clone(),
            include_usage: request.include_usage,
            n: request.n,
            calls_sent: vec![0; request.n],
        }
    }

    fn chunk(&self, choices: Vec<ChunkChoice<'_>>) -> String {
        let usage = self.include_usage.then_some(None);
        data_frame(&ChatChunk { id: &self.id, object: "chat.completion.chunk", created: self.created, model: &self.model, choices, usage })
    }

    /// The first chunk of every choice: the assistant role and empty content.
    pub fn start(&self) -> String {
        (0..self.n)
            .map(|index| {
                let delta = Delta { role: Some("assistant"), content: Some(""), ..Delta::default() };
                self.chunk(vec![ChunkChoice { index, delta, logprobs: None, finish_reason: None }])
            })
            .collect()
    }

    /// Content, reasoning and tool-call chunks for what choice `index` produced.
    pub fn pieces(&mut self, index: usize, pieces: &[Piece]) -> String {
        let mut out = String::new();
        for piece in pieces {
            let delta = match piece {
                Piece::Text(t) | Piece::Reasoning(t) if t.is_empty() => continue,
                Piece::Text(t) => Delta { content: Some(t), ..Delta::default() },
                Piece::Reasoning(t) => Delta { reasoning_content: Some(t), ..Delta::default() },
                Piece::Call(call) => Delta { tool_calls: Some(vec![self.call_delta(index, call)]), ..Delta::default() },
            };
            out += &self.chunk(vec![ChunkChoice { index, delta, logprobs: None, finish_reason: None }]);
        }
        out
    }

    fn call_delta<'a>(&mut self, index: usize, call: &'a ToolCall) -> ToolCallDelta<'a> {
        let slot = self.calls_sent.get_mut(index);
        let call_index = slot.map(|n| std::mem::replace(n, *n + 1)).unwrap_or(0);
        ToolCallDelta {
            index: call_index,
            id: new_id("call_"),
            kind: "function",
            function: FunctionDelta { name: &call.name, arguments: call.arguments_json() },
        }
    }

    /// The last chunk of choice `index`: an empty delta with the finish reason.
    pub fn finish(&self, index: usize, finish: &FinishReason) -> String {
        let called = self.calls_sent.get(index).is_some_and(|&n| n > 0);
        let reason = openai::finish_reason(finish, called);
        self.chunk(vec![ChunkChoice { index, delta: Delta::default(), logprobs: None, finish_reason: Some(reason) }])
    }

    /// After every choice finished: the usage chunk (with `include_usage`) and `[DONE]`.
    pub fn end(&self, usage: Usage) -> String {
        let mut out = String::new();
        if self.include_usage {
            let chunk = ChatChunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: Vec::new(),
                usage: Some(Some(usage.into())),
            };
            out += &data_frame(&chunk);
        }
        out + OPENAI_DONE
    }
}

/// The chunks of a streamed `/v1/completions`.
#[derive(Clone, Debug)]
pub struct OpenAiCompletionStream {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl OpenAiCompletionStream {
    pub fn new(id: &str, created: u64, request: &GenerateRequest) -> OpenAiCompletionStream {
        OpenAiCompletionStream { id: id.into(), created, model: request.model.clone(), include_usage: request.include_usage }
    }

    fn chunk(&self, index: usize, text: &str, finish_reason: Option<&str>) -> String {
        data_frame(&json!({
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": [{"text": text, "index": index, "logprobs": null, "finish_reason": finish_reason}],
        }))
    }

    /// A chunk with text choice `index` produced (none for empty text).
    pub fn text(&self, index: usize, text: &str) -> String {
        if text.is_empty() { String::new() } else { self.chunk(index, text, None) }
    }

    pub fn finish(&self, index: usize, finish: &FinishReason) -> String {
        self.chunk(index, "", Some(openai::finish_reason(finish, false)))
    }

    pub fn end(&self, usage: Usage) -> String {
        let mut out = String::new();
        if self.include_usage {
            let usage: UsageOut = usage.into();
            out += &data_frame(&json!({
                "id": self.id, "object": "text_completion", "created": self.created, "model": self.model, "choices": [], "usage": usage,
            }));
        }
        out + OPENAI_DONE
    }
}

/// An error in the middle of an OpenAI stream.
pub fn openai_error(err: &ApiError) -> String {
    data_frame(&err.openai_json())
}

// ---- Anthropic ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// The events of a streamed `/v1/messages`.
#[derive(Clone, Debug)]
pub struct AnthropicStream {
    id: String,
    model: String,
    open: Option<(usize, Block)>,
    next_index: usize,
    called_tools: bool,
}

impl AnthropicStream {
    pub fn new(id: &str, request: &GenerateRequest) -> AnthropicStream {
        AnthropicStream { id: id.into(), model: request.model.clone(), open: None, next_index: 0, called_tools: false }
    }

    /// `message_start`, once the prompt is counted (`usage.completion_tokens` is 0 here).
    pub fn start(&self, usage: Usage) -> String {
        let usage: anthropic::UsageOut = usage.into();
        event_frame(
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.model,
                "stop_reason": null, "stop_sequence": null, "usage": usage,
            }}),
        )
    }

    /// A keep-alive the SDKs ignore.
    pub fn ping() -> String {
        event_frame("ping", &json!({"type": "ping"}))
    }

    fn close(&mut self) -> String {
        match self.open.take() {
            Some((index, _)) => event_frame("content_block_stop", &json!({"type": "content_block_stop", "index": index})),
            None => String::new(),
        }
    }

    fn open(&mut self, block: Block, content_block: Json) -> (usize, String) {
        let mut out = self.close();
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((index, block));
        out += &event_frame("content_block_start", &json!({"type": "content_block_start", "index": index, "content_block": content_block}));
        (index, out)
    }

    /// The open block's index when it is of this kind, else a new block's (its start in `out`).
    fn open_or_continue(&mut self, block: Block, content_block: Json, out: &mut String) -> usize {
        match self.open {
            Some((index, open)) if open == block => index,
            _ => {
                let (index, start) = self.open(block, content_block);
                *out += &start;
                index
            }
        }
    }

    pub fn pieces(&mut self, pieces: &[Piece]) -> String {
        let mut out = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) | Piece::Reasoning(t) if t.is_empty() => {}
                Piece::Text(t) => {
                    let index = self.open_or_continue(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                    let delta = json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}});
                    out += &event_frame("content_block_delta", &delta);
                }
                // Anthropic signs its own thinking; ours has no signature (an empty one, which
                // the SDKs accept).
                Piece::Reasoning(t) => {
                    let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                    let index = self.open_or_continue(Block::Thinking, block, &mut out);
                    let delta = json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": t}});
                    out += &event_frame("content_block_delta", &delta);
                }
                Piece::Call(call) => {
                    self.called_tools = true;
                    let block = json!({"type": "tool_use", "id": new_id("toolu_"), "name": call.name, "input": {}});
                    let (index, start) = self.open(Block::ToolUse, block);
                    out += &start;
                    let delta = json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": call.arguments_json()}});
                    out += &event_frame("content_block_delta", &delta);
                    out += &self.close();
                }
            }
        }
        out
    }

    /// Closes the open block, then `message_delta` (stop reason, the whole usage as the
    /// unstreamed message has it: the SDKs take its input and cache counts over
    /// `message_start`'s) and `message_stop`.
    pub fn finish(&mut self, finish: &FinishReason, usage: Usage) -> String {
        let mut out = self.close();
        let (reason, stop_sequence) = anthropic::stop_reason(finish, self.called_tools);
        let usage: anthropic::UsageOut = usage.into();
        out += &event_frame(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop_sequence}, "usage": usage}),
        );
        out + &event_frame("message_stop", &json!({"type": "message_stop"}))
    }
}

/// An error in the middle of an Anthropic stream.
pub fn anthropic_error(err: &ApiError) -> String {
    event_frame("error", &err.anthropic_json())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ErrorKind;
    use crate::wire::request::{Prompt, Sampling, ToolChoice};

    fn request(tools: bool, stop: &[&str], n: usize, include_usage: bool) -> GenerateRequest {
        GenerateRequest {
            model: "brink".into(),
            prompt: Prompt::Chat { messages: Vec::new(), tools: None },
            tool_choice: if tools { ToolChoice::Auto } else { ToolChoice::None },
            max_tokens: Some(10),
            sampling: Sampling::default(),
            stop: stop.iter().map(|s| s.to_string()).collect(),
            n,
            stream: true,
            include_usage,
            reasoning_effort: None,
        }
    }

    /// Replaces the random ids (`call_…`, `toolu_…`) so frames can be compared byte for byte.
    fn mask_ids(s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(at) = rest.find("\"id\":\"") {
            let (head, tail) = rest.split_at(at + 6);
            out.push_str(head);
            let end = tail.find('"').unwrap_or(tail.len());
            let id = &tail[..end];
            out.push_str(if id.starts_with("call_") {
                "call_X"
            } else if id.starts_with("toolu_") {
                "toolu_X"
            } else {
                id
            });
            rest = &tail[end..];
        }
        out + rest
    }

    #[test]
    fn choice_stream_stops_and_parses_calls_across_tokens() {
        let req = request(true, &["<|user|>"], 1, false);
        let mut c = ChoiceStream::new(&req, ReplyFormat::Hermes);
        let tokens: [&[u8]; 8] = [
            b"Sure",
            b". <tool",
            b"_call>{\"name\": \"f\", ",
            b"\"arguments\": {\"x\": \"\xC3",
            b"\xA9\"}}</tool_call>",
            b"\n",
            b" done<|us",
            b"er|> tail",
        ];
        let mut pieces = Vec::new();
        let mut stopped = None;
        for t in tokens {
            let step = c.push(t);
            for p in step.pieces {
                match (pieces.last_mut(), p) {
                    (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
                    (_, p) => pieces.push(p),
                }
            }
            if step.stopped.is_some() {
                stopped = step.stopped;
                break;
            }
        }
        let args = serde_json::from_str::<Json>(r#"{"x": "é"}"#).unwrap().as_object().unwrap().clone();
        assert_eq!(
            pieces,
            vec![Piece::Text("Sure. ".into()), Piece::Call(ToolCall { name: "f".into(), arguments: args }), Piece::Text("\n done".into())]
        );
        assert_eq!(stopped, Some(FinishReason::StopSequence("<|user|>".into())));
        assert!(c.called_tools());
        // Whitespace after the last call is dropped.
        let mut c = ChoiceStream::new(&req, ReplyFormat::Hermes);
        let mut pieces = c.push(b"<tool_call>{\"name\": \"g\"}</tool_call>\n").pieces;
        pieces.extend(c.finish());
        assert_eq!(pieces.len(), 1);
        // Without tools the tags are text.
        let mut c = ChoiceStream::new(&request(false, &[], 1, false), ReplyFormat::Hermes);
        assert_eq!(c.push(b"<tool_call>{}</tool_call>").pieces, vec![Piece::Text("<tool_call>{}</tool_call>".into())]);
        // A raw completion is not parsed at all.
        let raw = GenerateRequest { prompt: Prompt::Text("x".into()), ..request(true, &[], 1, false) };
        let mut c = ChoiceStream::new(&raw, ReplyFormat::Harmony);
        assert_eq!(c.push(b"<|channel|>analysis<|message|>r").pieces, vec![Piece::Text("<|channel|>analysis<|message|>r".into())]);
    }

    /// Token bytes split at every byte (inside UTF-8 characters and markers alike) give what the
    /// whole reply gives: the same parser behind the stop strings.
    #[test]
    fn choice_stream_harmony_at_every_byte_boundary() {
        let reply = "<|channel|>analysis<|message|>Wetter für Paris 🌤<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        let req = request(true, &["STOP"], 1, false);
        let run = |parts: &[&[u8]]| {
            let mut c = ChoiceStream::new(&req, ReplyFormat::Harmony);
            let mut out = Vec::new();
            for part in parts {
                c.push(part).pieces.into_iter().for_each(|p| crate::wire::reply::push_piece(&mut out, p));
            }
            c.finish().into_iter().for_each(|p| crate::wire::reply::push_piece(&mut out, p));
            (out, c.called_tools())
        };
        let args = serde_json::from_str::<Json>(r#"{"city": "Paris"}"#).unwrap().as_object().unwrap().clone();
        let want =
            vec![Piece::Reasoning("Wetter für Paris 🌤".into()), Piece::Call(ToolCall { name: "get_weather".into(), arguments: args })];
        let bytes = reply.as_bytes();
        assert_eq!(run(&[bytes]), (want.clone(), true));
        for at in 1..bytes.len() {
            assert_eq!(run(&[&bytes[..at], &bytes[at..]]), (want.clone(), true), "split at byte {at}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(run(&singles), (want, true));
    }

    #[test]
    fn reasoning_in_both_streams() {
        let req = request(true, &[], 1, false);
        let mut s = OpenAiChatStream::new("c", 1, &req);
        let got = s.pieces(0, &[Piece::Reasoning("think \"hard\"".into()), Piece::Reasoning(String::new()), Piece::Text("4".into())]);
        let head = r#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"brink","choices":[{"index":0,"delta":"#;
        assert_eq!(
            got,
            format!(
                "{head}{{\"reasoning_content\":\"think \\\"hard\\\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n{head}{{\"content\":\"4\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            )
        );
        let mut a = AnthropicStream::new("m", &req);
        let call = ToolCall { name: "f".into(), arguments: serde_json::Map::new() };
        let got = a.pieces(&[Piece::Reasoning("hmm".into())])
            + &a.pieces(&[Piece::Reasoning(" more".into()), Piece::Text("ok".into()), Piece::Call(call)])
            + &a.finish(&FinishReason::EndOfTurn, Usage::default());
        let want = concat!(
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\" more\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_X\",\"name\":\"f\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
        );
        assert!(mask_ids(&got).starts_with(want), "{got}");
        assert!(got.contains("\"stop_reason\":\"tool_use\""));
    }

    #[test]
    fn openai_chat_stream_bytes() {
        let req = request(true, &[], 1, true);
        let mut s = OpenAiChatStream::new("chatcmpl-1", 7, &req);
        let call = ToolCall { name: "f".into(), arguments: serde_json::from_str(r#"{"a":1}"#).unwrap() };
        let mut got = s.start();
        got += &s.pieces(0, &[Piece::Text("Hi".into()), Piece::Call(call.clone()), Piece::Call(call)]);
        got += &s.finish(0, &FinishReason::EndOfTurn);
        got += &s.end(Usage { prompt_tokens: 5, completion_tokens: 3, cached_tokens: 2 });
        let head = r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"brink","choices":"#;
        let want = [
            format!("{head}[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"),
            format!("{head}[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"),
            format!("{head}[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":0,\"id\":\"call_X\",\"type\":\"function\",\"function\":{{\"name\":\"f\",\"arguments\":\"{{\\\"a\\\":1}}\"}}}}]}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"),
            format!("{head}[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":1,\"id\":\"call_X\",\"type\":\"function\",\"function\":{{\"name\":\"f\",\"arguments\":\"{{\\\"a\\\":1}}\"}}}}]}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null}}\n\n"),
            format!("{head}[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}}],\"usage\":null}}\n\n"),
            format!("{head}[],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8,\"prompt_tokens_details\":{{\"cached_tokens\":2}}}}}}\n\n"),
            "data: [DONE]\n\n".to_string(),
        ]
        .concat();
        assert_eq!(mask_ids(&got), want);
        // Every frame but [DONE] is JSON.
        for frame in got.split("\n\n").filter(|f| !f.is_empty() && *f != "data: [DONE]") {
            serde_json::from_str::<Json>(frame.strip_prefix("data: ").unwrap()).unwrap();
        }
    }

    #[test]
    fn openai_stream_without_usage_and_n2() {
        let req = request(false, &[], 2, false);
        let s = OpenAiChatStream::new("c", 1, &req);
        let start = s.start();
        assert_eq!(start.matches("data: ").count(), 2);
        assert!(!start.contains("usage"));
        assert!(start.contains("\"index\":1,"));
        assert_eq!(
            s.finish(1, &FinishReason::MaxTokens),
            "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"brink\",\"choices\":[{\"index\":1,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n"
        );
        assert_eq!(s.end(Usage::default()), "data: [DONE]\n\n");
    }

    #[test]
    fn completion_stream_bytes() {
        let req = request(false, &[], 1, true);
        let s = OpenAiCompletionStream::new("cmpl-9", 3, &req);
        let got = s.text(0, "a\"b")
            + &s.text(0, "")
            + &s.finish(0, &FinishReason::StopSequence("x".into()))
            + &s.end(Usage { prompt_tokens: 1, completion_tokens: 2, cached_tokens: 0 });
        let head = r#"data: {"id":"cmpl-9","object":"text_completion","created":3,"model":"brink","choices":"#;
        let want = [
            format!("{head}[{{\"text\":\"a\\\"b\",\"index\":0,\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"),
            format!("{head}[{{\"text\":\"\",\"index\":0,\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n"),
            format!("{head}[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3,\"prompt_tokens_details\":{{\"cached_tokens\":0}}}}}}\n\n"),
            "data: [DONE]\n\n".into(),
        ]
        .concat();
        assert_eq!(got, want);
    }

    #[test]
    fn anthropic_stream_bytes() {
        let req = request(true, &[], 1, false);
        let mut s = AnthropicStream::new("msg_1", &req);
        let call = ToolCall { name: "f".into(), arguments: serde_json::from_str(r#"{"a":[1]}"#).unwrap() };
        let mut got = s.start(Usage { prompt_tokens: 10, completion_tokens: 0, cached_tokens: 4 });
        got += &AnthropicStream::ping();
        got += &s.pieces(&[Piece::Text("Hi".into())]);
        got += &s.pieces(&[Piece::Text(" there".into()), Piece::Call(call)]);
        got += &s.finish(&FinishReason::EndOfTurn, Usage { prompt_tokens: 10, completion_tokens: 12, cached_tokens: 4 });
        let want = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"brink\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":6,\"output_tokens\":0,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4}}}\n\n",
            "event: ping\ndata: {\"type\":\"ping\"}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" there\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_X\",\"name\":\"f\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":[1]}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"input_tokens\":6,\"output_tokens\":12,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        assert_eq!(mask_ids(&got), want);
    }

    #[test]
    fn anthropic_stop_sequence_and_errors() {
        let mut s = AnthropicStream::new("m", &request(false, &["END"], 1, false));
        let got = s.finish(&FinishReason::StopSequence("END".into()), Usage { prompt_tokens: 7, completion_tokens: 3, cached_tokens: 0 });
        assert_eq!(
            got,
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"stop_sequence\",\"stop_sequence\":\"END\"},\"usage\":{\"input_tokens\":7,\"output_tokens\":3,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        );
        let e = ApiError::new(ErrorKind::Overloaded, "engine restarted after a stall");
        assert_eq!(
            anthropic_error(&e),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"engine restarted after a stall\"}}\n\n"
        );
        assert_eq!(
            openai_error(&e),
            "data: {\"error\":{\"message\":\"engine restarted after a stall\",\"type\":\"service_unavailable_error\",\"param\":null,\"code\":null}}\n\n"
        );
    }
}
