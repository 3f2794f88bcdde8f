//! Stop strings over streamed output. Tokens arrive as bytes that may end inside a UTF-8
//! character and text that may end inside a stop string: the matcher holds both back until the
//! next bytes decide, so what it releases is valid UTF-8 and never contains part of a stop.

use crate::tokenizer::take_complete;

/// What one push released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopStep {
    /// Text that is safe to send (possibly empty); generation goes on.
    Text(String),
    /// A stop string was found: the text before it, and which stop (index into the list).
    /// Generation must end; later pushes are ignored.
    Stopped { text: String, stop: usize },
}

#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Bytes of an unfinished UTF-8 character.
    partial_utf8: Vec<u8>,
    /// Decoded text that could still be the start of a stop string.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            partial_utf8: Vec::new(),
            held: String::new(),
            stopped: false,
        }
    }

    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Feeds the bytes of the next token(s).
    pub fn push(&mut self, bytes: &[u8]) -> StopStep {
        if self.stopped {
            return StopStep::Text(String::new());
        }
        self.partial_utf8.extend_from_slice(bytes);
        let decoded = take_complete(&mut self.partial_utf8);
        self.held.push_str(&decoded);
        self.release()
    }

    /// Feeds text that is already whole characters.
    pub fn push_str(&mut self, text: &str) -> StopStep {
        self.push(text.as_bytes())
    }

    /// The end of generation: everything held back, an unfinished character as U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let mut out = std::mem::take(&mut self.held);
        if !self.partial_utf8.is_empty() {
            out.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.partial_utf8)));
        }
        out
    }

    fn release(&mut self) -> StopStep {
        // The earliest stop in the held text wins; at one position, the first in the list.
        let found = self.stops.iter().enumerate().filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, i))).min();
        if let Some((at, stop)) = found {
            self.stopped = true;
            self.held.truncate(at);
            self.partial_utf8.clear();
            return StopStep::Stopped { text: std::mem::take(&mut self.held), stop };
        }
        let keep = self.longest_stop_prefix_suffix();
        let cut = self.held.len() - keep;
        let rest = self.held.split_off(cut);
        StopStep::Text(std::mem::replace(&mut self.held, rest))
    }

    /// Length of the longest tail of the held text that is the start of some stop string (on a
    /// character boundary, since stops are whole strings).
    fn longest_stop_prefix_suffix(&self) -> usize {
        let held = &self.held;
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(held.len());
            for len in (best + 1..=max).rev() {
                let start = held.len() - len;
                if held.is_char_boundary(start) && stop.starts_with(&held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&[u8]]) -> (Vec<String>, Option<usize>, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for c in chunks {
            match m.push(c) {
                StopStep::Text(t) => out.push(t),
                StopStep::Stopped { text, stop } => {
                    out.push(text);
                    return (out, Some(stop), m.finish());
                }
            }
        }
        let tail = m.finish();
        (out, None, tail)
    }

    #[test]
    fn stop_across_chunks_is_held_then_cut() {
        let (out, stop, tail) = run(&["</answer>"], &[b"the result</a", b"nsw", b"er> more"]);
        assert_eq!(out, vec!["the result", "", ""]);
        assert_eq!(stop, Some(0));
        assert_eq!(tail, "");
    }

    #[test]
    fn false_start_is_released() {
        let (out, stop, tail) = run(&["STOP"], &[b"ab ST", b"ARt and S", b"T"]);
        assert_eq!(out, vec!["ab ", "STARt and ", ""]);
        assert_eq!(stop, None);
        assert_eq!(tail, "ST");
    }

    #[test]
    fn earliest_stop_wins_and_first_listed_on_ties() {
        let (out, stop, _) = run(&["world", "lo w"], &[b"hello world"]);
        assert_eq!((out, stop), (vec!["hel".to_string()], Some(1)));
        let (out, stop, _) = run(&["ab", "abc"], &[b"xabc"]);
        assert_eq!((out, stop), (vec!["x".to_string()], Some(0)));
    }

    #[test]
    fn never_splits_utf8() {
        // "é" is C3 A9, "😀" is F0 9F 98 80: fed one byte at a time.
        let bytes = "café 😀!".as_bytes();
        let chunks: Vec<&[u8]> = bytes.chunks(1).collect();
        let (out, stop, tail) = run(&[], &chunks);
        assert!(stop.is_none());
        assert_eq!(out.concat() + &tail, "café 😀!");
        assert!(out.iter().all(|s| !s.contains('\u{FFFD}')));
        // A stop string that starts with a multi-byte character, split inside it.
        let (out, stop, _) = run(&["é!"], &[b"caf\xC3", b"\xA9", b"!"]);
        assert_eq!((out.concat(), stop), ("caf".to_string(), Some(0)));
    }

    #[test]
    fn invalid_and_unfinished_bytes() {
        let (out, _, tail) = run(&[], &[b"a\xFFb", b"\xE2\x82"]);
        assert_eq!(out, vec!["a\u{FFFD}b", ""]);
        assert_eq!(tail, "\u{FFFD}");
        let mut buf = b"x\xF0\x9F".to_vec();
        assert_eq!(take_complete(&mut buf), "x");
        assert_eq!(buf, b"\xF0\x9F");
    }

    #[test]
    fn pushes_after_a_stop_are_ignored() {
        let mut m = StopMatcher::new(vec!["\n\n".into()]);
        assert_eq!(m.push_str("a\n"), StopStep::Text("a".into()));
        assert_eq!(m.push_str("\nb"), StopStep::Stopped { text: "".into(), stop: 0 });
        assert_eq!(m.push_str("more"), StopStep::Text(String::new()));
        assert_eq!(m.finish(), "");
    }
}
