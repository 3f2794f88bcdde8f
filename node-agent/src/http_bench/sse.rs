//! Server-sent events from an OpenAI completions stream: bytes in (in whatever pieces the network
//! gives), events out, each classified as text, usage, an error or the end.

use serde_json::Value;

/// Splits a byte stream into SSE events' `data` payloads.
#[derive(Default)]
pub struct SseDecoder {
    buf: Vec<u8>,
    data: Vec<String>,
}

impl SseDecoder {
    /// Feeds bytes; returns the events they completed (a payload's `data:` lines joined by `\n`).
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = self.buf.drain(..=nl).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(self.data.join("\n"));
                    self.data.clear();
                }
            } else if let Some(rest) = line.strip_prefix("data:") {
                self.data.push(rest.strip_prefix(' ').unwrap_or(rest).to_string());
            }
            // Comments (`:`), `event:`, `id:` and `retry:` lines carry nothing we measure.
        }
        events
    }
}

/// What one event of a completions stream says.
#[derive(Debug, PartialEq)]
pub enum Chunk {
    /// A chunk whose choice carries text (empty text is not a token arriving).
    Text,
    /// The final usage (`stream_options.include_usage`).
    Usage { prompt_tokens: u64, completion_tokens: u64 },
    /// Neither text nor usage (an empty chunk, a finish reason).
    Other,
    /// `data: [DONE]`.
    Done,
    /// The server reported an error inside the stream.
    Error(String),
}

/// An event's payload that is not JSON (`excerpt`: its start).
#[derive(Debug, thiserror::Error)]
#[error("an SSE event is not JSON ({source}): {excerpt}")]
pub struct NotJsonEvent {
    #[source]
    pub source: serde_json::Error,
    pub excerpt: String,
}

/// Classifies one event's payload; a payload that is not JSON is an error to report.
pub fn classify(data: &str) -> Result<Chunk, NotJsonEvent> {
    if data.trim() == "[DONE]" {
        return Ok(Chunk::Done);
    }
    let v: Value = serde_json::from_str(data).map_err(|source| NotJsonEvent { source, excerpt: excerpt(data) })?;
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        let msg = err.get("message").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| err.to_string());
        return Ok(Chunk::Error(msg));
    }
    let texted = v["choices"].as_array().is_some_and(|cs| cs.iter().any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty())));
    if texted {
        return Ok(Chunk::Text);
    }
    let usage = &v["usage"];
    if let (Some(p), Some(c)) = (usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()) {
        return Ok(Chunk::Usage { prompt_tokens: p, completion_tokens: c });
    }
    Ok(Chunk::Other)
}

/// The start of a long text, for error messages.
pub fn excerpt(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_events_split_anywhere() {
        let stream = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\r\n\r\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        let whole = SseDecoder::default().push(stream);
        assert_eq!(whole, ["{\"a\":1}", "{\"b\":2}", "x\ny", "[DONE]"]);
        for cut in 1..stream.len() {
            let mut d = SseDecoder::default();
            let mut got = d.push(&stream[..cut]);
            got.extend(d.push(&stream[cut..]));
            assert_eq!(got, whole, "cut at {cut}");
        }
        let mut d = SseDecoder::default();
        assert!(d.push(b"data: {\"unfinished\"").is_empty());
    }

    #[test]
    fn classifies_completion_chunks() {
        let cases = [
            (r#"{"choices":[{"index":0,"text":" the","finish_reason":null}],"usage":null}"#, Chunk::Text),
            (r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":null}"#, Chunk::Other),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":130,"completion_tokens":64,"total_tokens":194}}"#,
                Chunk::Usage { prompt_tokens: 130, completion_tokens: 64 },
            ),
            ("[DONE]", Chunk::Done),
            (r#"{"error":{"message":"engine stalled","type":"server_error"}}"#, Chunk::Error("engine stalled".into())),
        ];
        for (data, want) in cases {
            assert_eq!(classify(data).unwrap(), want, "{data}");
        }
        assert!(classify("<html>").unwrap_err().to_string().contains("not JSON"));
    }
}
