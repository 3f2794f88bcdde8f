//! The token usage a replica's answer reports, read from its body as the frames pass through
//! (nothing is held back from the client): a JSON answer's `usage` (OpenAI `prompt_tokens` /
//! `completion_tokens`, Anthropic `input_tokens` / `output_tokens`), or a stream's events
//! carrying one (OpenAI's last chunk when the client asked `stream_options.include_usage`;
//! Anthropic's `message_start`, whose `message.usage` has the input, and `message_delta`, whose
//! `usage` has the output so far).
//!
//! Memory is bounded whatever the body: a stream keeps only its current line, up to
//! [`MAX_LINE_BYTES`] (a longer line is skipped: a usage event is small); a JSON answer is kept
//! only up to [`MAX_JSON_BYTES`] and read at its end (a larger one reports nothing).

/// Longest SSE line kept: usage events are a few hundred bytes; content deltas may be long.
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// Largest JSON answer read for its usage (a non-streamed answer is usually a few KB).
pub const MAX_JSON_BYTES: usize = 1 << 20;

/// Tokens an answer reports; `None` where it says nothing (not zero: nothing is invented).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: Option<u64>,
    pub output: Option<u64>,
}

/// Reads one answer's body, fed chunk by chunk as split anywhere.
#[derive(Debug)]
pub struct Scanner {
    sse: bool,
    /// SSE: the current line so far. JSON: the body so far.
    buf: Vec<u8>,
    /// SSE: the current line is over the cap and is skipped to its end. JSON: the body is over
    /// the cap and is not read.
    over: bool,
    usage: Usage,
}

impl Scanner {
    /// `sse`: the answer is `text/event-stream`; otherwise a JSON body.
    pub fn new(sse: bool) -> Scanner {
        Scanner { sse, buf: Vec::new(), over: false, usage: Usage::default() }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if !self.sse {
            if self.over || self.buf.len() + chunk.len() > MAX_JSON_BYTES {
                self.over = true;
                self.buf = Vec::new();
            } else {
                self.buf.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (part, after) = rest.split_at(nl);
            rest = &after[1..];
            if !self.over && self.buf.len() + part.len() <= MAX_LINE_BYTES {
                if self.buf.is_empty() {
                    self.sse_line(part);
                } else {
                    self.buf.extend_from_slice(part);
                    let line = std::mem::take(&mut self.buf);
                    self.sse_line(&line);
                    self.buf = line; // its capacity, for the next line
                }
            }
            self.buf.clear();
            self.over = false;
        }
        if self.over || self.buf.len() + rest.len() > MAX_LINE_BYTES {
            self.over = true;
            self.buf.clear();
        } else {
            self.buf.extend_from_slice(rest);
        }
    }

    /// The usage seen, once the body has ended.
    pub fn finish(mut self) -> Usage {
        if self.sse {
            // A last event without its line end (a server that closed right after it).
            if !self.over && !self.buf.is_empty() {
                let line = std::mem::take(&mut self.buf);
                self.sse_line(&line);
            }
        } else if !self.over
            && let Ok(v) = serde_json::from_slice(&self.buf)
        {
            self.absorb(&v);
        }
        self.usage
    }

    fn sse_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else { return };
        // Most events are content: only those naming a usage are parsed.
        if !data.windows(7).any(|w| w == b"\"usage\"") {
            return;
        }
        if let Ok(v) = serde_json::from_slice(data) {
            self.absorb(&v);
        }
    }

    /// Takes the counts of the event's (or answer's) `usage` and `message.usage`; a later one
    /// replaces an earlier (Anthropic's `message_delta` counts the output so far).
    fn absorb(&mut self, v: &serde_json::Value) {
        for usage in [v.get("usage"), v.get("message").and_then(|m| m.get("usage"))].into_iter().flatten() {
            let n = |k: &str| usage.get(k).and_then(serde_json::Value::as_u64);
            // Anthropic counts cached prompt tokens apart from `input_tokens`; the semantic
            // conventions' input tokens include them.
            let anthropic_input =
                n("input_tokens").map(|i| i + n("cache_creation_input_tokens").unwrap_or(0) + n("cache_read_input_tokens").unwrap_or(0));
            if let Some(i) = n("prompt_tokens").or(anthropic_input) {
                self.usage.input = Some(i);
            }
            if let Some(o) = n("completion_tokens").or(n("output_tokens")) {
                self.usage.output = Some(o);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: Option<u64>, output: Option<u64>) -> Usage {
        Usage { input, output }
    }

    /// The body fed whole, byte by byte, and split at every point into two chunks.
    fn scan_every_way(sse: bool, body: &str) -> Usage {
        let whole = {
            let mut s = Scanner::new(sse);
            s.feed(body.as_bytes());
            s.finish()
        };
        let mut bytewise = Scanner::new(sse);
        for b in body.as_bytes() {
            bytewise.feed(std::slice::from_ref(b));
        }
        assert_eq!(bytewise.finish(), whole, "byte by byte: {body}");
        for at in 0..=body.len() {
            let mut s = Scanner::new(sse);
            s.feed(&body.as_bytes()[..at]);
            s.feed(&body.as_bytes()[at..]);
            assert_eq!(s.finish(), whole, "split at {at}: {body}");
        }
        whole
    }

    #[test]
    fn usage_is_read_from_each_apis_answers_split_anywhere() {
        let cases: &[(&str, bool, &str, Usage)] = &[
            (
                "openai json",
                false,
                r#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#,
                usage(Some(12), Some(3)),
            ),
            (
                "anthropic json",
                false,
                r#"{"type":"message","content":[{"type":"text","text":"\"usage\""}],"usage":{"input_tokens":9,"output_tokens":4}}"#,
                usage(Some(9), Some(4)),
            ),
            (
                "anthropic json, cached prompt tokens",
                false,
                r#"{"usage":{"input_tokens":9,"cache_read_input_tokens":100,"cache_creation_input_tokens":20,"output_tokens":4}}"#,
                usage(Some(129), Some(4)),
            ),
            ("json without usage", false, r#"{"choices":[]}"#, usage(None, None)),
            ("an error body", false, r#"{"error":{"message":"no"}}"#, usage(None, None)),
            ("not json", false, "usage: 5", usage(None, None)),
            (
                "openai stream with include_usage (null until the last chunk), CRLF",
                true,
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\r\n\r\n\
                 data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":7}}\r\n\r\n\
                 data: [DONE]\r\n\r\n",
                usage(Some(20), Some(7)),
            ),
            (
                "openai stream without usage",
                true,
                "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}]}\n\ndata: [DONE]\n\n",
                usage(None, None),
            ),
            (
                "anthropic stream",
                true,
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":31,\"output_tokens\":1}}}\n\n\
                 event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n\
                 event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\n\n\
                 event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                usage(Some(31), Some(15)),
            ),
            (
                "a last event without its line end",
                true,
                "data: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}",
                usage(Some(2), Some(1)),
            ),
            ("data without a space", true, "data:{\"usage\":{\"prompt_tokens\":2}}\n\n", usage(Some(2), None)),
        ];
        for (name, sse, body, want) in cases {
            assert_eq!(scan_every_way(*sse, body), *want, "{name}");
        }
    }

    #[test]
    fn memory_stays_bounded_and_over_long_parts_are_skipped() {
        // A content line over the cap is skipped; the usage event after it is still read.
        let long = format!("data: {{\"delta\":\"{}\"}}\n\n", "x".repeat(MAX_LINE_BYTES));
        let mut s = Scanner::new(true);
        for piece in long.as_bytes().chunks(1000) {
            s.feed(piece);
            assert!(s.buf.len() <= MAX_LINE_BYTES);
        }
        s.feed(b"data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n");
        assert_eq!(s.finish(), usage(Some(5), Some(6)));

        // A JSON answer over its cap is dropped, not read.
        let body = format!("{{\"pad\":\"{}\",\"usage\":{{\"prompt_tokens\":1}}}}", "y".repeat(MAX_JSON_BYTES));
        let mut s = Scanner::new(false);
        for piece in body.as_bytes().chunks(4096) {
            s.feed(piece);
            assert!(s.buf.len() <= MAX_JSON_BYTES);
        }
        assert_eq!(s.finish(), usage(None, None));
    }
}
