//! A reply as the model wrote it, split into reasoning, answer and tool calls. How a model marks
//! these is its chat format, told by its chat template:
//!
//! - [`ReplyFormat::Hermes`] (Qwen3 and other ChatML models): a leading `<think>...</think>` is
//!   the reasoning (or everything up to `</think>` when the prompt itself opened `<think>`, as
//!   Qwen3's thinking-only templates do); the rest is the answer, with `<tool_call>` blocks
//!   ([`super::tool_calls`]).
//! - [`ReplyFormat::Harmony`] (gpt-oss): a sequence of messages, each a header and a body,
//!   `[<|start|>assistant][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ [<|constrain|>]json]<|message|>BODY`
//!   ended by `<|end|>`, `<|call|>`, `<|return|>` or the end of generation. The `analysis`
//!   channel is reasoning, `final` and `commentary` without a recipient are the answer, and a
//!   message to `functions.NAME` is a call with the body as its JSON arguments. The generation
//!   prompt ends with `<|start|>assistant`, so the first header has no `<|start|>`.
//!
//! One incremental parser per format ([`ReplyParser`]) takes decoded text as it comes and gives
//! [`Piece`]s; the whole-reply answer ([`split`]) runs the same parser over the whole text, so a
//! stream and a whole reply always agree. Text is released as soon as it cannot be part of a
//! marker, and a call when its message ends. Whatever does not fit the format is kept as answer
//! text: nothing the model wrote is lost.

use serde_json::Value as Json;

use super::tool_calls::{Piece, ToolCall, ToolCallStream};

/// How a model marks reasoning and tool calls in its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFormat {
    /// `<think>` reasoning and `<tool_call>` blocks (Qwen3, Hermes).
    Hermes,
    /// As `Hermes`, for a prompt that ends with `<think>`: the reply begins inside the reasoning.
    HermesThinking,
    /// OpenAI's harmony channels (gpt-oss).
    Harmony,
}

impl ReplyFormat {
    /// The format a chat template's model answers in: harmony templates write `<|channel|>`
    /// headers; every other template gets the Hermes parse, which leaves plain text as it is.
    pub fn of_template(source: &str) -> ReplyFormat {
        if source.contains(CHANNEL) { ReplyFormat::Harmony } else { ReplyFormat::Hermes }
    }

    /// The format of the reply to one rendered chat prompt of that template.
    pub fn of_prompt(template: &str, prompt: &str) -> ReplyFormat {
        match ReplyFormat::of_template(template) {
            ReplyFormat::Hermes if prompt.trim_end().ends_with(THINK_OPEN) => ReplyFormat::HermesThinking,
            format => format,
        }
    }
}

/// The parts of a whole reply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    pub reasoning: String,
    /// The answer; trimmed when the reply called tools (the whitespace between calls is not
    /// part of it).
    pub content: String,
    pub calls: Vec<ToolCall>,
}

/// Splits a whole reply; `tools`: whether the request offered tools (else calls stay text).
pub fn split(format: ReplyFormat, tools: bool, text: &str) -> Reply {
    let mut parser = ReplyParser::new(format, tools);
    let mut reply = Reply::default();
    for piece in parser.push(text).into_iter().chain(parser.finish()) {
        match piece {
            Piece::Reasoning(t) => reply.reasoning.push_str(&t),
            Piece::Text(t) => reply.content.push_str(&t),
            Piece::Call(c) => reply.calls.push(c),
        }
    }
    if !reply.calls.is_empty() {
        reply.content = reply.content.trim().to_string();
    }
    reply
}

/// The incremental parser of one reply.
#[derive(Clone, Debug)]
pub enum ReplyParser {
    Hermes(HermesParser),
    Harmony(HarmonyParser),
}

impl ReplyParser {
    pub fn new(format: ReplyFormat, tools: bool) -> ReplyParser {
        match format {
            ReplyFormat::Hermes => ReplyParser::Hermes(HermesParser::new(tools, false)),
            ReplyFormat::HermesThinking => ReplyParser::Hermes(HermesParser::new(tools, true)),
            ReplyFormat::Harmony => ReplyParser::Harmony(HarmonyParser::new(tools)),
        }
    }

    /// The next decoded text; the pieces that are complete.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        match self {
            ReplyParser::Hermes(p) => p.push(text),
            ReplyParser::Harmony(p) => p.push(text),
        }
    }

    /// The end of the reply: everything still held.
    pub fn finish(&mut self) -> Vec<Piece> {
        match self {
            ReplyParser::Hermes(p) => p.finish(),
            ReplyParser::Harmony(p) => p.finish(),
        }
    }
}

/// Appends a piece, joining it to the last one when both are text of the same kind.
pub fn push_piece(out: &mut Vec<Piece>, piece: Piece) {
    match (out.last_mut(), piece) {
        (_, Piece::Text(t) | Piece::Reasoning(t)) if t.is_empty() => {}
        (Some(Piece::Text(a)), Piece::Text(b)) | (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
        (_, piece) => out.push(piece),
    }
}

/// Length of the longest proper prefix of any of `markers` that `s` ends with.
fn partial_suffix(s: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .filter_map(|m| (1..m.len().min(s.len() + 1)).rev().find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&m[..n])))
        .max()
        .unwrap_or(0)
}

// ---- Hermes / Qwen3 ----

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Think {
    /// Nothing but whitespace yet: a `<think>` may still open the reply.
    Start,
    /// Inside `<think>`; `started`: some reasoning was released (leading whitespace is dropped).
    Thinking { started: bool },
    /// The answer; `skip_space`: just after `</think>`, whose following blank lines are dropped.
    Answer { skip_space: bool },
}

/// `<think>` reasoning at the start, then the answer (through [`ToolCallStream`] with tools).
/// Whitespace around the reasoning and between it and the answer is dropped, as llama.cpp and
/// vLLM drop it.
#[derive(Clone, Debug)]
pub struct HermesParser {
    state: Think,
    buf: String,
    tools: Option<ToolCallStream>,
}

impl HermesParser {
    /// `thinking`: the prompt opened `<think>`, so the reply starts with reasoning.
    pub fn new(tools: bool, thinking: bool) -> HermesParser {
        let state = if thinking { Think::Thinking { started: false } } else { Think::Start };
        HermesParser { state, buf: String::new(), tools: tools.then(ToolCallStream::new) }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                Think::Start => {
                    let rest = self.buf.trim_start();
                    if let Some(after) = rest.strip_prefix(THINK_OPEN) {
                        self.buf = after.to_string();
                        self.state = Think::Thinking { started: false };
                    } else if THINK_OPEN.starts_with(rest) {
                        break;
                    } else {
                        self.state = Think::Answer { skip_space: false };
                    }
                }
                Think::Thinking { started } => {
                    if !started {
                        let trimmed = self.buf.trim_start().len();
                        self.buf.drain(..self.buf.len() - trimmed);
                    }
                    if let Some(end) = self.buf.find(THINK_CLOSE) {
                        push_piece(&mut out, Piece::Reasoning(self.buf[..end].trim_end().to_string()));
                        self.buf.drain(..end + THINK_CLOSE.len());
                        self.state = Think::Answer { skip_space: true };
                        continue;
                    }
                    // Hold a possible `</think>` start and trailing whitespace (trimmed if the
                    // reasoning ends there).
                    let keep_from = self.buf.len() - partial_suffix(&self.buf, &[THINK_CLOSE]);
                    let cut = self.buf[..keep_from].trim_end().len();
                    if cut > 0 {
                        push_piece(&mut out, Piece::Reasoning(self.buf[..cut].to_string()));
                        self.buf.drain(..cut);
                        self.state = Think::Thinking { started: true };
                    }
                    break;
                }
                Think::Answer { skip_space } => {
                    if skip_space {
                        let trimmed = self.buf.trim_start().len();
                        self.buf.drain(..self.buf.len() - trimmed);
                        if self.buf.is_empty() {
                            break;
                        }
                        self.state = Think::Answer { skip_space: false };
                    }
                    let text = std::mem::take(&mut self.buf);
                    match self.tools.as_mut() {
                        Some(tools) => tools.push(&text).into_iter().for_each(|p| push_piece(&mut out, p)),
                        None => push_piece(&mut out, Piece::Text(text)),
                    }
                    break;
                }
            }
        }
        out
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = self.push("");
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            // Only whitespace or part of `<think>`: that was the answer.
            Think::Start => push_piece(&mut out, Piece::Text(rest)),
            // Cut off while thinking (max_tokens): all of it was reasoning.
            Think::Thinking { .. } => push_piece(&mut out, Piece::Reasoning(rest.trim_end().to_string())),
            Think::Answer { .. } => {}
        }
        if let Some(tools) = self.tools.as_mut() {
            tools.finish().into_iter().for_each(|p| push_piece(&mut out, p));
        }
        out
    }
}

// ---- Harmony / gpt-oss ----

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const END: &str = "<|end|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";
/// What ends a message body: the three end markers (consumed), or a new header begun without
/// one (`<|start|>`, or a `<|channel|>` the model wrote straight after a body).
const BODY_ENDS: [&str; 5] = [END, RETURN, CALL, START, CHANNEL];
/// A header longer than this, or with a newline, is taken for text the model wrote outside the
/// format. Real headers are a role, a channel, a recipient and a content type.
const MAX_HEADER: usize = 256;
/// How a header may begin (after an optional `<|start|>`).
const HEADER_OPENERS: [&str; 4] = [CHANNEL, MESSAGE, " to=", "assistant"];

#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call to `functions.NAME`; the body (JSON arguments) is held until the message ends.
    Call(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Harmony {
    /// Reading a message header up to `<|message|>`.
    Header,
    Body(Body),
}

#[derive(Clone, Debug)]
pub struct HarmonyParser {
    state: Harmony,
    buf: String,
    tools: bool,
}

impl HarmonyParser {
    pub fn new(tools: bool) -> HarmonyParser {
        HarmonyParser { state: Harmony::Header, buf: String::new(), tools }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            match &self.state {
                Harmony::Header => {
                    let end = self.buf.find(MESSAGE);
                    // The header so far, without a `<|message|>` that may be arriving.
                    let header = end.unwrap_or(self.buf.len() - partial_suffix(&self.buf, &[MESSAGE]));
                    if !could_be_header(&self.buf[..header]) {
                        // Not the format: what was read so far is the answer's text, a leading
                        // marker included (released here, so the body does not end at it again).
                        if let Some(marker) = [START, CHANNEL].into_iter().find(|m| self.buf.starts_with(m)) {
                            push_piece(&mut out, Piece::Text(marker.to_string()));
                            self.buf.drain(..marker.len());
                        }
                        self.state = Harmony::Body(Body::Content);
                        continue;
                    }
                    let Some(end) = end else { break };
                    self.state = Harmony::Body(classify(&self.buf[..end], self.tools));
                    self.buf.drain(..end + MESSAGE.len());
                }
                Harmony::Body(body) => {
                    let found = BODY_ENDS.iter().filter_map(|m| self.buf.find(m).map(|at| (at, *m))).min();
                    match (found, body) {
                        (Some((at, marker)), _) => {
                            let piece = body_piece(body, &self.buf[..at]);
                            push_piece(&mut out, piece);
                            let consumed = if marker == START || marker == CHANNEL { at } else { at + marker.len() };
                            self.buf.drain(..consumed);
                            self.state = Harmony::Header;
                        }
                        (None, Body::Call(_)) => break,
                        (None, Body::Reasoning | Body::Content) => {
                            let cut = self.buf.len() - partial_suffix(&self.buf, &BODY_ENDS);
                            let piece = body_piece(body, &self.buf[..cut]);
                            push_piece(&mut out, piece);
                            self.buf.drain(..cut);
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = self.push("");
        let rest = std::mem::take(&mut self.buf);
        match &self.state {
            // A header cut short is structure, not text; words without markers are text.
            Harmony::Header if rest.contains("<|") => {}
            Harmony::Header => push_piece(&mut out, Piece::Text(rest)),
            // The turn ends at `<|call|>`/`<|return|>`, end-of-generation tokens the text does
            // not show: the last body ends with the text.
            Harmony::Body(body) => push_piece(&mut out, body_piece(body, &rest)),
        }
        self.state = Harmony::Header;
        out
    }
}

/// Whether `s` is, or begins, a header. Closed under prefixes (a prefix of a possible header
/// is one), so a stream that gives up on a header gives up where the whole parse does.
fn could_be_header(s: &str) -> bool {
    if s.len() > MAX_HEADER || s.contains('\n') {
        return false;
    }
    if START.starts_with(s) {
        return true;
    }
    let rest = s.strip_prefix(START).unwrap_or(s);
    HEADER_OPENERS.iter().any(|o| o.starts_with(rest) || rest.starts_with(o))
}

/// What a message's body is, from its header.
fn classify(header: &str, tools: bool) -> Body {
    let header = header.replace(CONSTRAIN, " ");
    let header = header.strip_prefix(START).unwrap_or(&header);
    // The last channel counts: gpt-oss sometimes writes `<|channel|>commentary` before the real one.
    let channel = header.rsplit_once(CHANNEL).map(|(_, c)| c.split(|ch: char| ch.is_whitespace() || ch == '<').next().unwrap_or(""));
    let recipient = header.split_once("to=").map(|(_, r)| r.split(|ch: char| ch.is_whitespace() || ch == '<').next().unwrap_or(""));
    match recipient {
        Some(r) if r != "assistant" => match r.strip_prefix("functions.") {
            Some(name) if tools && !name.is_empty() => Body::Call(name.to_string()),
            // A built-in tool (browser, python) or tools not offered: the body is shown as is.
            _ => Body::Content,
        },
        _ if channel == Some("analysis") => Body::Reasoning,
        _ => Body::Content,
    }
}

fn body_piece(body: &Body, text: &str) -> Piece {
    match body {
        Body::Reasoning => Piece::Reasoning(text.to_string()),
        Body::Content => Piece::Text(text.to_string()),
        Body::Call(name) => match serde_json::from_str::<Json>(text.trim()) {
            Ok(Json::Object(arguments)) => Piece::Call(ToolCall { name: name.clone(), arguments }),
            // Arguments cut short or not an object: the model's text, kept.
            _ => Piece::Text(text.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: Json) -> Piece {
        Piece::Call(ToolCall { name: name.into(), arguments: args.as_object().unwrap().clone() })
    }
    fn text(s: &str) -> Piece {
        Piece::Text(s.into())
    }
    fn reasoning(s: &str) -> Piece {
        Piece::Reasoning(s.into())
    }

    fn whole(format: ReplyFormat, tools: bool, input: &str) -> Vec<Piece> {
        let mut p = ReplyParser::new(format, tools);
        let mut out = Vec::new();
        p.push(input).into_iter().chain(p.finish()).for_each(|piece| push_piece(&mut out, piece));
        out
    }

    /// The pieces of `input` pushed in the given parts, joined as a client joins deltas.
    fn streamed(format: ReplyFormat, tools: bool, parts: &[&str]) -> Vec<Piece> {
        let mut p = ReplyParser::new(format, tools);
        let mut out = Vec::new();
        for part in parts {
            p.push(part).into_iter().for_each(|piece| push_piece(&mut out, piece));
        }
        p.finish().into_iter().for_each(|piece| push_piece(&mut out, piece));
        out
    }

    /// Every split of `input` in two and every split into single characters gives the whole
    /// parse (a released part of a marker would show up as text the whole parse has not).
    fn check_splits(format: ReplyFormat, tools: bool, input: &str, want: &[Piece]) {
        assert_eq!(whole(format, tools, input), want, "whole: {input:?}");
        for (at, _) in input.char_indices().skip(1) {
            assert_eq!(streamed(format, tools, &[&input[..at], &input[at..]]), want, "split at {at}: {input:?}");
        }
        let chars: Vec<String> = input.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(streamed(format, tools, &parts), want, "per character: {input:?}");
    }

    #[test]
    fn format_from_the_template() {
        assert_eq!(ReplyFormat::of_template("{{- \"<|start|>assistant<|channel|>final<|message|>\" }}"), ReplyFormat::Harmony);
        assert_eq!(ReplyFormat::of_template(crate::chat_template::CHATML), ReplyFormat::Hermes);
        assert_eq!(ReplyFormat::of_template(include_str!("../../tests/chat_template_qwen3.jinja")), ReplyFormat::Hermes);
    }

    const H: ReplyFormat = ReplyFormat::Harmony;
    const Q: ReplyFormat = ReplyFormat::Hermes;

    #[test]
    fn harmony_reasoning_then_answer() {
        // As gpt-oss writes it after the prompt's `<|start|>assistant` (`<|return|>` is an
        // end-of-generation token the text does not show; shown or not, the answer is the same).
        let out = "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = **4**.";
        let want = [reasoning("User asks 2+2. Easy."), text("2 + 2 = **4**.")];
        check_splits(H, false, out, &want);
        check_splits(H, true, &format!("{out}<|return|>"), &want);
        // Reasoning only (cut by max_tokens), and a final answer alone.
        check_splits(H, false, "<|channel|>analysis<|message|>Thinking about ü", &[reasoning("Thinking about ü")]);
        check_splits(H, false, "<|channel|>final<|message|>Hi <b>there</b> <|x", &[text("Hi <b>there</b> <|x")]);
    }

    #[test]
    fn harmony_tool_calls_both_header_forms() {
        // Recipient in the channel, with `<|constrain|>json`, after reasoning.
        let a = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        check_splits(H, true, a, &[reasoning("Need weather."), call("get_weather", json!({"city": "Paris"}))]);
        // Without the `<|call|>` the text does not show, too.
        check_splits(
            H,
            true,
            a.strip_suffix("<|call|>").unwrap(),
            &[reasoning("Need weather."), call("get_weather", json!({"city": "Paris"}))],
        );
        // Recipient in the role, right after the prompt's `<|start|>assistant`.
        let b = " to=functions.get_time<|channel|>commentary json<|message|>{\"tz\": \"CET\", \"n\": [1, 2]}";
        check_splits(H, true, b, &[call("get_time", json!({"tz": "CET", "n": [1, 2]}))]);
        // A preamble (commentary without recipient) is answer text; two calls in a row.
        let c = "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}<|call|><|start|>assistant to=functions.g<|channel|>commentary<|message|>{\"x\":1}<|call|>";
        check_splits(H, true, c, &[text("Checking both."), call("f", json!({})), call("g", json!({"x": 1}))]);
        // Without tools in the request the body is text.
        check_splits(H, false, b, &[text("{\"tz\": \"CET\", \"n\": [1, 2]}")]);
    }

    #[test]
    fn harmony_malformed_keeps_the_text() {
        // No structure at all: all of it is the answer.
        check_splits(H, true, "Hello, world!\nSecond line.", &[text("Hello, world!\nSecond line.")]);
        check_splits(H, true, "Hello", &[text("Hello")]);
        // Arguments that are not a JSON object, or cut short.
        check_splits(H, true, "<|channel|>commentary to=functions.f<|message|>{\"a\": ", &[text("{\"a\": ")]);
        check_splits(H, true, "<|channel|>commentary to=functions.f<|message|>[1]<|call|>", &[text("[1]")]);
        // A built-in tool we do not run, an unknown channel, a stray commentary before analysis.
        check_splits(H, true, "<|channel|>analysis to=browser.search<|message|>{\"q\":1}<|end|>", &[text("{\"q\":1}")]);
        check_splits(H, true, "<|channel|>scratch<|message|>odd<|end|>", &[text("odd")]);
        check_splits(H, true, "<|channel|>commentary<|channel|>analysis<|message|>r<|end|>", &[reasoning("r")]);
        // Text before the first header, and a body ended by a header without `<|end|>`.
        check_splits(H, true, "Sure thing <|channel|>final<|message|>ok", &[text("Sure thing ok")]);
        check_splits(
            H,
            true,
            "<|channel|>analysis<|message|>r<|start|>assistant<|channel|>final<|message|>a",
            &[reasoning("r"), text("a")],
        );
        // Headers that are not headers (a newline, too long) are text, markers and all.
        check_splits(H, true, "<|channel|>\nodd<|end|>", &[text("<|channel|>\nodd")]);
        check_splits(H, true, "<|start|><|channel|>\nodd", &[text("<|start|><|channel|>\nodd")]);
        let long = format!("<|channel|>{}<|message|>x", "a".repeat(300));
        check_splits(H, true, &long, &[text(&long)]);
        // A header cut short at the end is dropped; the reasoning before it is not.
        check_splits(H, true, "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|chan", &[reasoning("r")]);
    }

    #[test]
    fn hermes_think_then_answer_and_calls() {
        let out = "<think>\nThe user greets.\n\n</think>\n\nHello! <b>Hi</b>";
        check_splits(Q, false, out, &[reasoning("The user greets."), text("Hello! <b>Hi</b>")]);
        let out =
            "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        check_splits(Q, true, out, &[reasoning("weather"), call("get_weather", json!({"city": "Paris"}))]);
        // No reasoning: the text is untouched (leading whitespace included).
        check_splits(Q, false, "  plain <thinking> text", &[text("  plain <thinking> text")]);
        check_splits(Q, false, "<thin", &[text("<thin")]);
        // Empty reasoning (thinking disabled) and reasoning cut by max_tokens.
        check_splits(Q, false, "<think>\n\n</think>\n\nok", &[text("ok")]);
        check_splits(Q, false, "<think>\nstill going </thi", &[reasoning("still going </thi")]);
        // A `<think>` later in the answer is answer text.
        check_splits(Q, false, "a <think>b</think>", &[text("a <think>b</think>")]);
    }

    #[test]
    fn hermes_prompt_opened_thinking() {
        let t = ReplyFormat::HermesThinking;
        check_splits(t, false, "\nlet me see\n</think>\n\nIt is 4.", &[reasoning("let me see"), text("It is 4.")]);
        check_splits(t, true, "r</think><tool_call>{\"name\": \"f\"}</tool_call>", &[reasoning("r"), call("f", json!({}))]);
        check_splits(t, false, "cut short", &[reasoning("cut short")]);
        assert_eq!(ReplyFormat::of_prompt("{{ x }}", "<|im_start|>assistant\n<think>\n"), t);
        assert_eq!(ReplyFormat::of_prompt("{{ x }}", "<|im_start|>assistant\n<think>\n\n</think>\n\n"), Q);
        assert_eq!(ReplyFormat::of_prompt("<|channel|>", "<think>"), H);
    }

    #[test]
    fn split_whole_replies() {
        let r = split(
            H,
            true,
            "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>commentary<|message|> Calling. <|end|><|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\":1}",
        );
        assert_eq!(
            r,
            Reply {
                reasoning: "r".into(),
                content: "Calling.".into(),
                calls: vec![ToolCall { name: "f".into(), arguments: json!({"a": 1}).as_object().unwrap().clone() }]
            }
        );
        let r = split(Q, false, "<think>r</think>answer ");
        assert_eq!((r.reasoning.as_str(), r.content.as_str(), r.calls.len()), ("r", "answer ", 0));
    }
}
