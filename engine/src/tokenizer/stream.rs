//! Incremental decoding for streaming output: text is released as tokens arrive, but never in
//! the middle of a UTF-8 character (a CJK character or an emoji is often spread over two or
//! three byte tokens). As in llama.cpp's server, each token's piece is used as is: no leading
//! space is stripped and no spaces are cleaned, so the streamed text of a continuation is what
//! follows the prompt.

use super::Tokenizer;
use super::error::TokenizerError;

/// Turns a stream of token ids into text. Create with [`Tokenizer::stream_decoder`].
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    render_special: bool,
    /// Bytes of an incomplete character, waiting for the token that completes it (at most 3).
    pending: Vec<u8>,
}

impl<'t> StreamDecoder<'t> {
    pub(super) fn new(tokenizer: &'t Tokenizer, skip_special: bool) -> Self {
        StreamDecoder { tokenizer, render_special: !skip_special, pending: Vec::new() }
    }

    /// Adds one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tokenizer.piece(id, self.render_special)?;
        self.pending.extend_from_slice(piece);
        Ok(take_complete(&mut self.pending))
    }

    /// Bytes held back because they may start a character not yet complete.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// Ends the stream: whatever is held back is released, an incomplete character as U+FFFD.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// Removes and returns the longest prefix of `buf` that can be released: valid UTF-8, with
/// invalid bytes replaced by U+FFFD; only an incomplete character at the very end stays in `buf`.
pub fn take_complete(buf: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut rest: &[u8] = buf;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                rest = &[];
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                // The prefix up to valid_up_to is valid UTF-8 by definition.
                out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match e.error_len() {
                    // An incomplete sequence at the end: wait for more bytes.
                    None => {
                        rest = after;
                        break;
                    }
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[n..];
                    }
                }
            }
        }
    }
    let keep = rest.len();
    buf.drain(..buf.len() - keep);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_only_an_incomplete_tail() {
        let euro = "€".as_bytes(); // e2 82 ac
        let mut buf = vec![b'a', euro[0]];
        assert_eq!(take_complete(&mut buf), "a");
        assert_eq!(buf, [euro[0]]);
        buf.push(euro[1]);
        assert_eq!(take_complete(&mut buf), "");
        buf.push(euro[2]);
        assert_eq!(take_complete(&mut buf), "€");
        assert!(buf.is_empty());
        // Invalid bytes are replaced at once, not held.
        let mut buf = vec![0xff, b'x', 0xc3];
        assert_eq!(take_complete(&mut buf), "\u{fffd}x");
        assert_eq!(buf, [0xc3]);
        // A lead byte followed by a non-continuation byte is invalid, not incomplete.
        let mut buf = vec![0xe2, b'y'];
        assert_eq!(take_complete(&mut buf), "\u{fffd}y");
        assert!(buf.is_empty());
    }
}
