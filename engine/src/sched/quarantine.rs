//! The poison quarantine: the batch shape that was running when the engine stalled, and for a
//! new request whether it would recreate that shape and what smaller chunks avoid it. One bad
//! request must not take the engine down again and again.
//!
//! Requests are matched by prompt length, the part of the shape a client's retry reproduces
//! exactly (the seeds' client resent the same prompt eight times). A match is served with half
//! the chunk it stalled at and a smaller step total; a prompt that stalls again is halved again,
//! and refused once the chunk would drop below `min_chunk` or after `max_strikes` stalls.

use super::plan::SeqLimits;

/// One chunk of the batch running at the stall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeChunk {
    /// The whole prompt length of the chunk's sequence.
    pub prompt_tokens: usize,
    pub chunk_len: usize,
    /// A decode row rather than a prefill chunk.
    pub decode: bool,
}

/// The batch running at a stall.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StallShape {
    pub chunks: Vec<ShapeChunk>,
    pub total: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not part of a stalled shape.
    Clear,
    /// Serve it under these limits.
    Limit(SeqLimits),
    /// Refuse it: the message says why.
    Refuse(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    prompt_tokens: usize,
    /// Smallest chunk this prompt stalled at, and the step total then.
    chunk_len: usize,
    total: usize,
    strikes: u32,
}

#[derive(Clone, Debug)]
pub struct Quarantine {
    min_chunk: usize,
    max_strikes: u32,
    entries: Vec<Entry>,
}

impl Quarantine {
    pub fn new(min_chunk: usize, max_strikes: u32) -> Self {
        Quarantine { min_chunk: min_chunk.max(1), max_strikes: max_strikes.max(1), entries: Vec::new() }
    }

    /// Records the shape of a stall; returns how many prompts it put under quarantine. Decode
    /// rows are not recorded: one row per sequence is the shape every request ends up in, and
    /// refusing it would refuse everything.
    pub fn record(&mut self, shape: &StallShape) -> usize {
        let mut n = 0;
        for c in shape.chunks.iter().filter(|c| !c.decode) {
            n += 1;
            match self.entries.iter_mut().find(|e| e.prompt_tokens == c.prompt_tokens) {
                Some(e) => {
                    e.strikes += 1;
                    e.chunk_len = e.chunk_len.min(c.chunk_len);
                    e.total = e.total.min(shape.total);
                }
                None => self.entries.push(Entry { prompt_tokens: c.prompt_tokens, chunk_len: c.chunk_len, total: shape.total, strikes: 1 }),
            }
        }
        n
    }

    /// Prompt lengths under quarantine.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// How to serve a new request with a prompt of `prompt_tokens` tokens.
    pub fn check(&self, prompt_tokens: usize) -> Verdict {
        let Some(e) = self.entries.iter().find(|e| e.prompt_tokens == prompt_tokens) else { return Verdict::Clear };
        let chunk = e.chunk_len / 2;
        if e.strikes >= self.max_strikes || chunk < self.min_chunk {
            return Verdict::Refuse(format!(
                "a prompt of {prompt_tokens} tokens stalled the engine {} time(s), the last time in a prefill chunk of {} tokens \
                 in a step of {}; it is refused to keep the engine up (smallest chunk allowed: {})",
                e.strikes, e.chunk_len, e.total, self.min_chunk
            ));
        }
        // Both the chunk and the step total stay below what stalled: the rows a kernel sees
        // are the step total, not just this prompt's chunk.
        Verdict::Limit(SeqLimits { chunk: Some(chunk), batch: Some((e.total / 2).max(chunk)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stall(prompt: usize, chunk: usize, total: usize) -> StallShape {
        StallShape {
            chunks: vec![
                ShapeChunk { prompt_tokens: 40, chunk_len: 1, decode: true },
                ShapeChunk { prompt_tokens: prompt, chunk_len: chunk, decode: false },
            ],
            total,
        }
    }

    #[test]
    fn a_retried_prompt_gets_smaller_chunks_then_is_refused() {
        let mut q = Quarantine::new(1024, 3);
        assert_eq!(q.check(24_000), Verdict::Clear);
        assert_eq!(q.record(&stall(24_000, 8192, 8193)), 1);
        // Other prompt lengths, and the decode row's sequence, are not affected.
        assert_eq!(q.check(23_999), Verdict::Clear);
        assert_eq!(q.check(40), Verdict::Clear);
        assert_eq!(q.check(24_000), Verdict::Limit(SeqLimits { chunk: Some(4096), batch: Some(4096) }));
        // It stalls again at the smaller chunk: halved again.
        q.record(&stall(24_000, 4096, 4097));
        assert_eq!(q.check(24_000), Verdict::Limit(SeqLimits { chunk: Some(2048), batch: Some(2048) }));
        q.record(&stall(24_000, 2048, 2049));
        let Verdict::Refuse(msg) = q.check(24_000) else { panic!("third stall must refuse") };
        assert!(msg.contains("24000 tokens") && msg.contains("3 time(s)") && msg.contains("2048"), "{msg}");
    }

    #[test]
    fn refused_when_the_chunk_would_fall_below_the_floor() {
        let mut q = Quarantine::new(512, 10);
        q.record(&stall(3000, 1000, 1200));
        assert!(matches!(q.check(3000), Verdict::Refuse(_)));
        assert!(q.check(3000).refuse_text().contains("smallest chunk allowed: 512"));
        // A decode-only stall quarantines nothing.
        let decode_only = StallShape { chunks: vec![ShapeChunk { prompt_tokens: 9, chunk_len: 1, decode: true }], total: 1 };
        assert_eq!(q.record(&decode_only), 0);
        assert_eq!(q.check(9), Verdict::Clear);
    }

    impl Verdict {
        fn refuse_text(&self) -> String {
            match self {
                Verdict::Refuse(m) => m.clone(),
                other => format!("not refused: {other:?}"),
            }
        }
    }
}
