//! Prompts of exactly a given number of tokens, as the engine counts them, built without its
//! tokenizer's vocabulary. Pure: tested without an engine.
//!
//! Tokenizers split text at spaces before merging, so a prompt of words costs the first word's
//! tokens (with whatever the engine adds to every prompt, e.g. a BOS) plus each further word's
//! tokens after a space. Both are measured per word once (`calibration_texts`, counted by the
//! engine's tokenizer endpoint or its usage), then a prompt of `n` tokens is one first word and
//! `n - first` words that cost one token each, shuffled: every request's text differs from its
//! first words, so no request reuses another's cached prefix (which would hide the prefill
//! under test). Each built prompt is checked against the engine's own count when it runs.

use crate::http_bench::prompt::{WORDS, splitmix};

/// Times a word is repeated to measure its cost after a space.
pub const REPEAT: u64 = 9;

/// The candidate words to calibrate (common English words, most one token in most vocabularies).
pub fn candidates() -> &'static [&'static str] {
    &WORDS[..32.min(WORDS.len())]
}

/// The two texts whose counts give `word`'s costs: alone, and repeated [`REPEAT`] times.
pub fn calibration_texts(word: &str) -> (String, String) {
    (word.to_string(), vec![word; REPEAT as usize].join(" "))
}

/// A word's cost in tokens as the engine counts them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WordCost {
    pub word: String,
    /// As a whole prompt (the engine's own tokens included).
    pub first: u64,
    /// After a space, inside a prompt.
    pub next: u64,
}

/// The costs from the counts of [`calibration_texts`]; `None` when they are not those of a
/// word whose repeats cost the same each (the tokenizer merged across spaces).
pub fn word_cost(word: &str, alone: u64, repeated: u64) -> Option<WordCost> {
    let extra = repeated.checked_sub(alone)?;
    if alone == 0 || extra == 0 || extra % (REPEAT - 1) != 0 {
        return None;
    }
    Some(WordCost { word: word.to_string(), first: alone, next: extra / (REPEAT - 1) })
}

/// Builds prompts of exact lengths from calibrated words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizer {
    /// Words a prompt may start with, and their cost there; cheapest first.
    starts: Vec<(String, u64)>,
    /// Words that cost one token after a space.
    fillers: Vec<String>,
}

/// No calibrated word costs one token after a space, so no prompt length can be hit exactly;
/// `measured`: every word's costs as the engine counted them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot build prompts of exact lengths: no calibrated word costs one token after a space (measured: {})", list(.measured))]
pub struct NoFiller {
    pub measured: Vec<WordCost>,
}

fn list(costs: &[WordCost]) -> String {
    if costs.is_empty() {
        return "none".into();
    }
    costs.iter().map(|c| format!("{} ({} after a space)", c.word, c.next)).collect::<Vec<_>>().join(", ")
}

impl Sizer {
    pub fn new(costs: &[WordCost]) -> Result<Sizer, NoFiller> {
        let fillers: Vec<String> = costs.iter().filter(|c| c.next == 1).map(|c| c.word.clone()).collect();
        if fillers.is_empty() {
            return Err(NoFiller { measured: costs.to_vec() });
        }
        // Only words whose repeats are fillers too, so the cost model held for them.
        let mut starts: Vec<(String, u64)> = costs.iter().filter(|c| c.next == 1).map(|c| (c.word.clone(), c.first)).collect();
        starts.sort_by_key(|(w, first)| (*first, w.clone()));
        Ok(Sizer { starts, fillers })
    }

    /// The shortest prompt that can be built.
    pub fn min_prompt(&self) -> u64 {
        self.starts.first().map_or(u64::MAX, |(_, first)| *first)
    }

    /// A prompt of `tokens` tokens; `(seed, nonce)` pick its first word and its order. `None`
    /// under [`Sizer::min_prompt`].
    pub fn build(&self, tokens: u64, seed: u64, nonce: u64) -> Option<String> {
        let fits: Vec<&(String, u64)> = self.starts.iter().filter(|(_, first)| *first <= tokens).collect();
        if fits.is_empty() {
            return None;
        }
        let mut state = seed ^ nonce.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        let (first, cost) = fits[(splitmix(&mut state) % fits.len() as u64) as usize];
        let n = (tokens - cost) as usize;
        let mut rest: Vec<&str> = (0..n).map(|i| self.fillers[i % self.fillers.len()].as_str()).collect();
        for i in (1..rest.len()).rev() {
            let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
            rest.swap(i, j);
        }
        let mut text = String::with_capacity(first.len() + 6 * n);
        text.push_str(first);
        for w in rest {
            text.push(' ');
            text.push_str(w);
        }
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tokenizer as the cost model sees one: a BOS, then each word's token count.
    fn count(text: &str, bos: u64, cost: impl Fn(&str) -> u64) -> u64 {
        bos + text.split(' ').map(cost).sum::<u64>()
    }

    fn costs(bos: u64, cost: &dyn Fn(&str) -> u64) -> Vec<WordCost> {
        candidates()
            .iter()
            .filter_map(|w| {
                let (alone, rep) = calibration_texts(w);
                word_cost(w, count(&alone, bos, cost), count(&rep, bos, cost))
            })
            .collect()
    }

    #[test]
    fn measures_costs_from_two_counts() {
        assert_eq!(word_cost("the", 2, 10), Some(WordCost { word: "the".into(), first: 2, next: 1 }));
        assert_eq!(word_cost("people", 3, 19), Some(WordCost { word: "people".into(), first: 3, next: 2 }));
        assert_eq!(word_cost("x", 2, 13), None, "repeats that do not cost the same each");
        assert_eq!(word_cost("x", 5, 5), None);
        assert_eq!(word_cost("x", 5, 3), None);
        assert_eq!(calibration_texts("of").1.split(' ').count() as u64, REPEAT);
    }

    #[test]
    fn builds_every_length_exactly_and_distinctly() {
        // Two-letter words cost two tokens: they are measured and left out of the fillers.
        let cost = |w: &str| if w.len() == 2 { 2 } else { 1 };
        let sizer = Sizer::new(&costs(1, &cost)).unwrap();
        assert_eq!(sizer.min_prompt(), 2);
        for n in [2, 3, 17, 64, 127, 1000, 8193] {
            for nonce in 0..4 {
                let text = sizer.build(n, 7, nonce).unwrap();
                assert_eq!(count(&text, 1, cost), n, "{n} tokens, nonce {nonce}");
            }
        }
        assert_eq!(sizer.build(1, 7, 0), None);
        let texts: std::collections::HashSet<String> =
            (0..32).map(|nonce| sizer.build(200, 7, nonce).unwrap().split(' ').take(3).collect::<Vec<_>>().join(" ")).collect();
        assert!(texts.len() >= 30, "prompts share their first words: {}", texts.len());
        assert_eq!(sizer.build(200, 7, 3), sizer.build(200, 7, 3), "deterministic");
    }

    #[test]
    fn no_one_token_word_is_a_clear_error() {
        let measured = costs(0, &|_| 3);
        let e = Sizer::new(&measured).unwrap_err();
        assert_eq!(e, NoFiller { measured });
        let e = e.to_string();
        assert!(e.contains("no calibrated word costs one token") && e.contains("the (3 after a space)"), "{e}");
        assert!(Sizer::new(&[]).unwrap_err().to_string().ends_with("(measured: none)"));
    }
}
