//! Tool calls in generated text. Qwen3 and Hermes-style models write each call as
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; the text around the blocks
//! is the message content. A block whose inside is not such a JSON object is kept as text, so
//! nothing the model wrote is lost.

use serde_json::{Map, Value as Json};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// A JSON object (OpenAI sends it as a string; Anthropic as `input`).
    pub arguments: Map<String, Json>,
}

impl ToolCall {
    /// The arguments as the JSON string OpenAI's `function.arguments` holds.
    pub fn arguments_json(&self) -> String {
        Json::Object(self.arguments.clone()).to_string()
    }
}

/// A piece of a parsed reply, in the order the model wrote them.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// The answer's text.
    Text(String),
    /// Reasoning before the answer (see [`super::reply`]); never from the parse here.
    Reasoning(String),
    Call(ToolCall),
}

/// Reads the inside of one block; `None` when it is not a call.
pub fn parse_call(inside: &str) -> Option<ToolCall> {
    let Ok(Json::Object(mut obj)) = serde_json::from_str::<Json>(inside.trim()) else {
        return None;
    };
    let Some(Json::String(name)) = obj.remove("name") else {
        return None;
    };
    let arguments = match obj.remove("arguments").or_else(|| obj.remove("parameters")) {
        None | Some(Json::Null) => Map::new(),
        Some(Json::Object(args)) => args,
        // Some models write the arguments as a JSON string, as OpenAI's wire format has them.
        Some(Json::String(s)) => match serde_json::from_str::<Json>(&s) {
            Ok(Json::Object(args)) => args,
            _ => return None,
        },
        Some(_) => return None,
    };
    if name.is_empty() {
        return None;
    }
    Some(ToolCall { name, arguments })
}

/// Splits a whole reply into text and calls.
pub fn parse(text: &str) -> Vec<Piece> {
    let mut stream = ToolCallStream::new();
    let mut pieces = stream.push(text);
    for piece in stream.finish() {
        match piece {
            Piece::Text(t) => push_text(&mut pieces, t),
            call => pieces.push(call),
        }
    }
    pieces
}

/// The calls of a reply and its text outside them (whitespace between blocks trimmed away).
pub fn split(text: &str) -> (String, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in parse(text) {
        match piece {
            Piece::Text(t) | Piece::Reasoning(t) => content.push_str(&t),
            Piece::Call(c) => calls.push(c),
        }
    }
    let content = if calls.is_empty() { content } else { content.trim().to_string() };
    (content, calls)
}

/// The streaming parser: text is released as soon as it cannot be the start of a block; a
/// block is released as a call when it closes.
#[derive(Clone, Debug, Default)]
pub struct ToolCallStream {
    buf: String,
    in_block: bool,
}

impl ToolCallStream {
    pub fn new() -> ToolCallStream {
        ToolCallStream::default()
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.in_block {
                let Some(end) = self.buf.find(CLOSE) else { break };
                let inside: String = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.in_block = false;
                match parse_call(&inside) {
                    Some(call) => out.push(Piece::Call(call)),
                    None => push_text(&mut out, format!("{OPEN}{inside}{CLOSE}")),
                }
            } else if let Some(start) = self.buf.find(OPEN) {
                let before = self.buf[..start].to_string();
                self.buf.drain(..start + OPEN.len());
                push_text(&mut out, before);
                self.in_block = true;
            } else {
                // Hold back a tail that could be the start of `<tool_call>`.
                let keep = partial_suffix(&self.buf, OPEN);
                let cut = self.buf.len() - keep;
                let rest = self.buf.split_off(cut);
                let released = std::mem::replace(&mut self.buf, rest);
                push_text(&mut out, released);
                break;
            }
        }
        out
    }

    /// The end of the reply: held text, and an unclosed block as the text it was.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if self.in_block {
            self.in_block = false;
            // A block cut off by max_tokens may still hold a whole call (Qwen3 sometimes ends
            // its turn before the closing tag).
            match parse_call(&rest) {
                Some(call) => out.push(Piece::Call(call)),
                None => push_text(&mut out, format!("{OPEN}{rest}")),
            }
        } else {
            push_text(&mut out, rest);
        }
        out
    }
}

fn push_text(out: &mut Vec<Piece>, text: String) {
    if text.is_empty() {
        return;
    }
    if let Some(Piece::Text(last)) = out.last_mut() {
        last.push_str(&text);
    } else {
        out.push(Piece::Text(text));
    }
}

/// Length of the longest proper prefix of `tag` that `s` ends with.
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&n| s.ends_with(&tag[..n])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: Json) -> Piece {
        Piece::Call(ToolCall { name: name.into(), arguments: args.as_object().unwrap().clone() })
    }

    #[test]
    fn several_calls_with_text() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
        let pieces = parse(text);
        assert_eq!(
            pieces,
            vec![
                Piece::Text("Let me check.\n".into()),
                call("get_weather", json!({"city": "Paris", "unit": "c"})),
                Piece::Text("\n".into()),
                call("get_time", json!({"tz": "CET"})),
            ]
        );
        let (content, calls) = split(text);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments_json(), r#"{"city":"Paris","unit":"c"}"#);
    }

    #[test]
    fn malformed_blocks_stay_text() {
        for inside in [
            "{\"name\": \"f\", \"arguments\": {\"a\": }",
            "not json",
            "[1, 2]",
            "{\"arguments\": {}}",
            "{\"name\": \"f\", \"arguments\": 3}",
        ] {
            let text = format!("a<tool_call>{inside}</tool_call>b");
            assert_eq!(parse(&text), vec![Piece::Text(text.clone())], "{inside}");
        }
        // Arguments given as a JSON string, and none at all.
        assert_eq!(parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>"), vec![call("f", json!({"x": 1}))]);
        assert_eq!(parse("<tool_call>{\"name\": \"f\"}</tool_call>"), vec![call("f", json!({}))]);
    }

    #[test]
    fn streaming_holds_partial_tags() {
        let text = "Hé 😀 <tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"<tool\"}}\n</tool_call> bye <tool";
        // Every split into 1-, 2- and 5-character chunks gives the same pieces as the whole parse.
        for size in [1, 2, 5] {
            let mut s = ToolCallStream::new();
            let mut pieces = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(size) {
                for p in s.push(&chunk.iter().collect::<String>()) {
                    match (pieces.last_mut(), p) {
                        (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
                        (_, p) => pieces.push(p),
                    }
                }
            }
            for p in s.finish() {
                match (pieces.last_mut(), p) {
                    (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
                    (_, p) => pieces.push(p),
                }
            }
            assert_eq!(
                pieces,
                vec![Piece::Text("Hé 😀 ".into()), call("f", json!({"q": "<tool"})), Piece::Text(" bye <tool".into())],
                "{size}"
            );
        }
        // Text that cannot start a tag is released at once; "<to" is held.
        let mut s = ToolCallStream::new();
        assert_eq!(s.push("abc <to"), vec![Piece::Text("abc ".into())]);
        assert_eq!(s.push("day"), vec![Piece::Text("<today".into())]);
    }

    #[test]
    fn unclosed_block_at_the_end() {
        assert_eq!(parse("x<tool_call>{\"name\": \"f\", \"arguments\": {}}"), vec![Piece::Text("x".into()), call("f", json!({}))]);
        assert_eq!(parse("x<tool_call>{\"name\": \"f\", \"argu"), vec![Piece::Text("x<tool_call>{\"name\": \"f\", \"argu".into())]);
    }
}
