//! Prompts of a requested token count without the server's tokenizer. Each is a shuffle of the
//! same words: tokenizers split text at spaces first, so a shuffle keeps the count while every
//! request's text differs from its first word, and no request reuses another's KV prefix
//! (which would flatter time to first token). The word count per target comes from calibration
//! against the server's own `usage.prompt_tokens`.

/// Common English words: one token each in most vocabularies, so counts land close at once.
pub const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or",
    "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "water", "world", "house", "light",
    "river", "city", "night", "small", "long", "great", "old", "new", "day", "year", "work", "part", "place", "made", "found", "still",
];

/// splitmix64: a fixed, portable generator, so `--seed` reproduces the prompts anywhere.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `words` words, the same multiset for every `nonce`, in an order drawn from `(seed, nonce)`.
pub fn build(words: usize, seed: u64, nonce: u64) -> String {
    let mut order: Vec<&str> = (0..words).map(|i| WORDS[i % WORDS.len()]).collect();
    let mut state = seed ^ nonce.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for i in (1..order.len()).rev() {
        let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order.join(" ")
}

/// The word count to try next: `words` gave `measured` tokens, `target` is wanted. Scales by the
/// measured tokens per word (the count is near linear in the words); at least one word.
pub fn rescale(words: usize, measured: u64, target: u64) -> usize {
    if measured == 0 {
        return words.saturating_mul(2).max(1);
    }
    ((words as f64 * target as f64 / measured as f64).round() as usize).max(1)
}

/// Close enough to stop calibrating: within 2% or one token.
pub fn close_enough(measured: u64, target: u64) -> bool {
    measured.abs_diff(target) as f64 <= (target as f64 * 0.02).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffles_are_distinct_permutations() {
        let a = build(200, 7, 1);
        let b = build(200, 7, 2);
        assert_ne!(a, b);
        assert_ne!(a.split(' ').next(), None);
        let sorted = |s: &str| {
            let mut w: Vec<&str> = s.split(' ').collect();
            w.sort();
            w.join(" ")
        };
        assert_eq!(sorted(&a), sorted(&b), "same words, other order");
        assert_eq!(a.split(' ').count(), 200);
        assert_eq!(build(200, 7, 1), a, "deterministic");
        assert_ne!(build(200, 8, 1), a, "the seed matters");
        // Requests differ early, so they share no KV block.
        let distinct_starts: std::collections::HashSet<String> =
            (0..64).map(|n| build(200, 7, n).split(' ').take(4).collect::<Vec<_>>().join(" ")).collect();
        assert!(distinct_starts.len() >= 60, "{}", distinct_starts.len());
        assert_eq!(build(0, 1, 1), "");
    }

    #[test]
    fn rescales_toward_the_target() {
        assert_eq!(rescale(100, 130, 128), 98);
        assert_eq!(rescale(1000, 500, 1024), 2048);
        assert_eq!(rescale(10, 0, 64), 20);
        assert_eq!(rescale(1, 1000, 1), 1);
        assert!(close_enough(1024, 1040) && !close_enough(1000, 1040));
        assert!(close_enough(9, 8) && !close_enough(10, 8));
    }
}
