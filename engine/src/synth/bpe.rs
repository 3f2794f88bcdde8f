//! A small byte-level BPE trainer: the synthetic models' merges are learned from an embedded text
//! so that their vocabulary behaves like a real one (common words become single tokens, rare
//! ones split into pieces, any byte sequence still encodes through the 256 byte tokens).
//!
//! Training is deterministic: pairs are ranked by count, ties broken by the smaller token ids.

use std::collections::{BTreeMap, HashMap};

/// The result of training: every token's bytes (the 256 single bytes first, in `byte_order`),
/// and the merges as pairs of token ids, in rank order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trained {
    pub tokens: Vec<Vec<u8>>,
    pub merges: Vec<(u32, u32)>,
}

/// Splits text into the pieces merges may not cross, after Qwen2's pre-tokenizer regex
/// (`tokenizer.ggml.pre = "qwen2"`):
///
/// ```text
/// (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
/// ```
///
/// Training only needs pieces that resemble what the runtime tokenizer produces (a merge that
/// never applies is harmless), so `char::is_alphabetic` and `is_numeric` stand in for the
/// Unicode classes.
pub fn pre_tokenize(text: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    let byte = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
    let is_letter = |c: Option<char>| c.is_some_and(char::is_alphabetic);
    let is_number = |c: Option<char>| c.is_some_and(char::is_numeric);
    let is_space = |c: Option<char>| c.is_some_and(char::is_whitespace);
    let is_newline = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    let is_other = |c: Option<char>| c.is_some() && !is_letter(c) && !is_number(c) && !is_space(c);

    let mut pieces = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = at(i);
        let end = if let Some(len) = contraction(&chars[i..]) {
            i + len
        } else if is_letter(c) || (!is_newline(c) && !is_number(c) && is_letter(at(i + 1))) {
            // [^\r\n\p{L}\p{N}]?\p{L}+
            let mut j = i + 1;
            while is_letter(at(j)) {
                j += 1;
            }
            j
        } else if is_number(c) {
            i + 1
        } else if is_other(c) || (c == Some(' ') && is_other(at(i + 1))) {
            // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
            let mut j = i + 1;
            while is_other(at(j)) {
                j += 1;
            }
            while is_newline(at(j)) {
                j += 1;
            }
            j
        } else {
            // Whitespace: through its last newline; else all of it but the space that starts
            // the next word; else all of it.
            let mut run_end = i;
            while is_space(at(run_end)) {
                run_end += 1;
            }
            match (i..run_end).rev().find(|&j| is_newline(at(j))) {
                Some(last_newline) => last_newline + 1,
                None if run_end < chars.len() && run_end - i > 1 => run_end - 1,
                None => run_end,
            }
        };
        pieces.push(&text[byte(i)..byte(end)]);
        i = end;
    }
    pieces
}

/// The length in chars of an English contraction suffix at the start of `chars`, if any.
fn contraction(chars: &[(usize, char)]) -> Option<usize> {
    if chars.first()?.1 != '\'' {
        return None;
    }
    let lower = |i: usize| chars.get(i).map(|&(_, c)| c.to_ascii_lowercase());
    match (lower(1)?, lower(2)) {
        ('s' | 't' | 'm' | 'd', _) => Some(2),
        ('r', Some('e')) | ('v', Some('e')) | ('l', Some('l')) => Some(3),
        _ => None,
    }
}

/// Trains merges on `text` until there are `target` tokens (including the 256 byte tokens) or no
/// pair is left to merge. `byte_order[i]` is the byte that token `i` stands for.
pub fn train(text: &str, byte_order: &[u8; 256], target: usize) -> Trained {
    let mut tokens: Vec<Vec<u8>> = byte_order.iter().map(|&b| vec![b]).collect();
    let mut id_of: HashMap<Vec<u8>, u32> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();

    // Distinct pieces with their counts, in a fixed order.
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for piece in pre_tokenize(text) {
        *counts.entry(piece).or_default() += 1;
    }
    let mut words: Vec<(Vec<u32>, u64)> =
        counts.into_iter().map(|(piece, n)| (piece.bytes().map(|b| id_of[&vec![b]]).collect(), n)).collect();

    let mut pairs: HashMap<(u32, u32), u64> = HashMap::new();
    for (symbols, n) in &words {
        add_pairs(&mut pairs, symbols, *n as i64);
    }

    let mut merges = Vec::new();
    while tokens.len() < target {
        // The most frequent pair; among equals, the smallest ids (a total order, so the
        // HashMap's iteration order does not matter).
        let Some((&best, _)) = pairs.iter().filter(|&(_, &n)| n > 0).max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))) else {
            break;
        };
        let merged = [tokens[best.0 as usize].as_slice(), tokens[best.1 as usize].as_slice()].concat();
        let new_id = match id_of.get(&merged) {
            Some(&id) => id,
            None => {
                let id = tokens.len() as u32;
                id_of.insert(merged.clone(), id);
                tokens.push(merged);
                id
            }
        };
        merges.push(best);
        for (symbols, n) in &mut words {
            if !symbols.windows(2).any(|w| (w[0], w[1]) == best) {
                continue;
            }
            add_pairs(&mut pairs, symbols, -(*n as i64));
            *symbols = apply_merge(symbols, best, new_id);
            add_pairs(&mut pairs, symbols, *n as i64);
        }
    }
    Trained { tokens, merges }
}

fn add_pairs(pairs: &mut HashMap<(u32, u32), u64>, symbols: &[u32], n: i64) {
    for w in symbols.windows(2) {
        let count = pairs.entry((w[0], w[1])).or_default();
        *count = count.checked_add_signed(n).unwrap_or(0);
    }
}

/// Replaces each occurrence of `pair`, left to right, with `id` (as a BPE tokenizer applies one
/// merge).
pub fn apply_merge(symbols: &[u32], pair: (u32, u32), id: u32) -> Vec<u32> {
    let mut out = Vec::with_capacity(symbols.len());
    let mut i = 0;
    while i < symbols.len() {
        if i + 1 < symbols.len() && (symbols[i], symbols[i + 1]) == pair {
            out.push(id);
            i += 2;
        } else {
            out.push(symbols[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity_order() -> [u8; 256] {
        std::array::from_fn(|i| i as u8)
    }

    #[test]
    fn pre_tokenizer_splits_like_qwen2() {
        let cases: [(&str, &[&str]); 7] = [
            ("Hello world", &["Hello", " world"]),
            ("it's 42!", &["it", "'s", " ", "4", "2", "!"]),
            ("a  b", &["a", " ", " b"]),
            ("x = y;\n\nz", &["x", " =", " y", ";\n\n", "z"]),
            ("end.  \n  next", &["end", ".", "  \n", " ", " next"]),
            ("(café)", &["(café", ")"]),
            ("trailing   ", &["trailing", "   "]),
        ];
        for (text, expected) in cases {
            assert_eq!(pre_tokenize(text), expected, "{text:?}");
        }
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = include_str!("corpus.txt");
        assert_eq!(pre_tokenize(text).concat(), text);
    }

    #[test]
    fn training_is_deterministic_and_merges_frequent_pairs_first() {
        let text = "low low low lower lowest newer newer";
        let a = train(text, &identity_order(), 270);
        assert_eq!(a, train(text, &identity_order(), 270));
        // "l","o" and "o","w" are the most frequent pairs (5 times each); the smaller ids win.
        assert_eq!(a.merges[0], (u32::from(b'l'), u32::from(b'o')));
        assert!(a.tokens.iter().any(|t| t == b" low"), "{:?}", a.tokens.iter().map(|t| String::from_utf8_lossy(t)).collect::<Vec<_>>());
        // Every merge joins two existing tokens into one that exists.
        for &(l, r) in &a.merges {
            let joined = [a.tokens[l as usize].as_slice(), a.tokens[r as usize].as_slice()].concat();
            assert!(a.tokens.contains(&joined));
        }
    }

    #[test]
    fn training_stops_when_nothing_is_left_to_merge() {
        let t = train("ab ab", &identity_order(), 10_000);
        // "ab", " ab" → merges: a+b, " "+ab.
        assert_eq!(t.merges.len(), 2);
        assert_eq!(t.tokens.len(), 258);
    }

    #[test]
    fn apply_merge_is_left_to_right() {
        assert_eq!(apply_merge(&[1, 1, 1], (1, 1), 9), vec![9, 1]);
        assert_eq!(apply_merge(&[2, 1, 1, 3, 1, 1], (1, 1), 9), vec![2, 9, 3, 9]);
    }
}
