//! Special tokens: which ones end generation, and how they are cut out of text before the rest
//! is tokenized. Both follow llama.cpp (src/llama-vocab.cpp), which decides end-of-generation
//! partly from token texts because converters do not always record it.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;

use super::vocab::{SpecialTokens, TokenAttr};

/// Texts llama.cpp takes as end-of-turn when `eot_token_id` is not set.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts that end generation whatever the metadata says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss (harmony) markers llama.cpp always renders, even when special tokens are skipped.
const ALWAYS_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// Completes the special ids from token texts, adjusts attributes as llama.cpp does, and returns
/// the end-of-generation tokens in ascending order. Where llama.cpp would pick any one of several
/// matching tokens (it walks a hash map), the lowest id is taken.
pub fn detect(tokens: &[Box<str>], ids: &HashMap<Box<str>, u32>, attrs: &mut [TokenAttr], special: &mut SpecialTokens) -> Vec<u32> {
    let first_of = |texts: &[&str]| texts.iter().filter_map(|t| ids.get(*t).copied()).min();
    let mark_control = |id: u32, attrs: &mut [TokenAttr]| attrs[id as usize] = attrs[id as usize].with(TokenAttr::CONTROL);

    for (slot, texts) in [
        (&mut special.eot, EOT_TEXTS),
        (&mut special.eom, &["<|eom_id|>"][..]),
        (&mut special.fim_pad, FIM_PAD_TEXTS),
        (&mut special.fim_rep, FIM_REP_TEXTS),
        (&mut special.fim_sep, FIM_SEP_TEXTS),
    ] {
        if slot.is_none() {
            *slot = first_of(texts);
            if let Some(id) = *slot {
                mark_control(id, attrs);
            }
        }
    }

    // Control tokens named "unused" are placeholders, never generated or rendered.
    for (text, attr) in tokens.iter().zip(attrs.iter_mut()) {
        if attr.has(TokenAttr::CONTROL) && text.contains("unused") {
            *attr = attr.with(TokenAttr::UNUSED);
        }
    }

    let mut eog: BTreeSet<u32> = [special.fim_pad, special.fim_rep, special.fim_sep].into_iter().flatten().collect();
    for text in EOG_TEXTS {
        if let Some(&id) = ids.get(*text) {
            eog.insert(id);
            mark_control(id, attrs);
        }
    }
    for text in ALWAYS_RENDERED {
        if let Some(&id) = ids.get(*text) {
            attrs[id as usize] = TokenAttr::USER_DEFINED;
        }
    }
    eog.extend([special.eos, special.eot, special.eom].into_iter().flatten());

    let eog_has = |eog: &BTreeSet<u32>, text: &str| ids.get(text).is_some_and(|id| eog.contains(id));
    // Harmony (and solar-open) end a message with <|end|> but a turn with <|return|>/<|call|>.
    let has_call = eog_has(&eog, "<|call|>") || eog_has(&eog, "<|calls|>");
    let ends_messages = has_call && (eog_has(&eog, "<|return|>") || eog_has(&eog, "<|flush|>"));
    if ends_messages && let Some(&end) = ids.get("<|end|>").filter(|id| eog.contains(id)) {
        eog.remove(&end);
        attrs[end as usize] = TokenAttr::USER_DEFINED;
    }
    // Gemma 4 uses </s> inside tool responses.
    if eog_has(&eog, "<|tool_response>")
        && let Some(&s) = ids.get("</s>").filter(|id| eog.contains(id))
    {
        eog.remove(&s);
        attrs[s as usize] = TokenAttr::NORMAL;
    }
    eog.into_iter().collect()
}

/// A piece of the input: text still to be tokenized, or a special token matched whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// The special tokens that may be matched in text, longest first (ties by id; llama.cpp's
/// unstable sort leaves them in no particular order).
pub fn matchable_by_length(tokens: &[Box<str>], attrs: &[TokenAttr]) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..tokens.len() as u32).filter(|&i| attrs[i as usize].is_special()).collect();
    ids.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()).then(a.cmp(&b)));
    ids
}

/// Cuts special tokens out of `text` as llama.cpp's `tokenizer_st_partition` does: each token in
/// turn (longest first) is cut from every remaining text fragment at each of its leftmost
/// non-overlapping occurrences. User-defined tokens are always matched; control and unknown
/// tokens only with `parse_special`. `by_length` may leave out tokens that do not occur in `text`.
pub fn partition(text: &str, by_length: &[u32], tokens: &[Box<str>], attrs: &[TokenAttr], parse_special: bool) -> Vec<Fragment> {
    let mut fragments = if text.is_empty() { Vec::new() } else { vec![Fragment::Text(0..text.len())] };
    for &id in by_length {
        let attr = attrs[id as usize];
        if !parse_special && attr.has(TokenAttr::CONTROL.with(TokenAttr::UNKNOWN)) {
            continue;
        }
        let needle = &*tokens[id as usize];
        let mut next = Vec::with_capacity(fragments.len());
        for fragment in fragments {
            let Fragment::Text(range) = fragment else {
                next.push(fragment);
                continue;
            };
            let mut start = range.start;
            while let Some(found) = text[start..range.end].find(needle) {
                let at = start + found;
                if at > start {
                    next.push(Fragment::Text(start..at));
                }
                next.push(Fragment::Token(id));
                start = at + needle.len();
            }
            if start < range.end {
                next.push(Fragment::Text(start..range.end));
            }
        }
        fragments = next;
    }
    fragments
}

#[cfg(test)]
mod tests {
    use super::*;

    type Table = (Vec<Box<str>>, HashMap<Box<str>, u32>, Vec<TokenAttr>);

    fn vocab(texts: &[&str], attrs: &[TokenAttr]) -> Table {
        let tokens: Vec<Box<str>> = texts.iter().map(|&t| t.into()).collect();
        let ids = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        (tokens, ids, attrs.to_vec())
    }

    const N: TokenAttr = TokenAttr::NORMAL;
    const C: TokenAttr = TokenAttr::CONTROL;
    const U: TokenAttr = TokenAttr::USER_DEFINED;

    #[test]
    fn qwen_like_end_of_generation() {
        let (tokens, ids, mut attrs) = vocab(
            &["a", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<|unused_0|>"],
            &[N, C, C, C, C, C, C, C],
        );
        let mut special = SpecialTokens { bos: Some(1), eos: Some(3), pad: Some(1), ..Default::default() };
        let eog = detect(&tokens, &ids, &mut attrs, &mut special);
        assert_eq!(eog, [1, 3, 4, 5, 6]);
        assert_eq!(special.eot, Some(1), "lowest id among <|im_end|> and <|endoftext|>");
        assert_eq!((special.fim_pad, special.fim_rep, special.fim_sep), (Some(4), Some(5), Some(6)));
        assert!(attrs[7].has(TokenAttr::UNUSED));
        assert!(!attrs[2].has(TokenAttr::UNUSED));
    }

    #[test]
    fn normal_typed_end_tokens_become_control_and_metadata_ids_are_kept() {
        let (tokens, ids, mut attrs) = vocab(&["<|eot_id|>", "<|eom_id|>", "x"], &[N, N, N]);
        let mut special = SpecialTokens { eos: Some(2), ..Default::default() };
        let eog = detect(&tokens, &ids, &mut attrs, &mut special);
        assert_eq!(eog, [0, 1, 2]);
        assert!(attrs[0].has(TokenAttr::CONTROL) && attrs[1].has(TokenAttr::CONTROL));
        assert_eq!((special.eot, special.eom), (Some(0), Some(1)));
    }

    #[test]
    fn harmony_end_is_not_end_of_generation() {
        let (tokens, ids, mut attrs) = vocab(&["<|return|>", "<|call|>", "<|end|>", "<|channel|>", "<|endoftext|>"], &[C, C, C, C, C]);
        let mut special = SpecialTokens { eos: Some(0), ..Default::default() };
        let eog = detect(&tokens, &ids, &mut attrs, &mut special);
        assert_eq!(eog, [0, 1, 4]);
        assert_eq!(attrs[2], TokenAttr::USER_DEFINED);
        assert_eq!(attrs[3], TokenAttr::USER_DEFINED);
    }

    fn texts(text: &str, frags: &[Fragment]) -> Vec<String> {
        frags
            .iter()
            .map(|f| match f {
                Fragment::Text(r) => text[r.clone()].to_string(),
                Fragment::Token(id) => format!("#{id}"),
            })
            .collect()
    }

    #[test]
    fn partition_matches_longest_tokens_first_and_respects_parse_special() {
        let (tokens, _, attrs) = vocab(&["<|im_start|>", "<|im_end|>", "<tag>", "<|im", "x"], &[C, C, U, C, N]);
        let by_len = matchable_by_length(&tokens, &attrs);
        assert_eq!(by_len, [0, 1, 2, 3]);
        let text = "<|im_start|>user\nhi <tag><|im_end|><|im";
        assert_eq!(texts(text, &partition(text, &by_len, &tokens, &attrs, true)), ["#0", "user\nhi ", "#2", "#1", "#3"]);
        // Without parse_special only the user-defined token is cut out.
        assert_eq!(texts(text, &partition(text, &by_len, &tokens, &attrs, false)), ["<|im_start|>user\nhi ", "#2", "<|im_end|><|im"]);
        assert!(partition("", &by_len, &tokens, &attrs, true).is_empty());
        assert_eq!(texts("aa", &partition("aa", &by_len, &tokens, &attrs, true)), ["aa"]);
    }

    #[test]
    fn partition_prefers_length_over_position() {
        // "bcd" is longer, so it is cut first although "ab" starts earlier.
        let (tokens, _, attrs) = vocab(&["ab", "bcd"], &[U, U]);
        let by_len = matchable_by_length(&tokens, &attrs);
        let frags = partition("abcd", &by_len, &tokens, &attrs, true);
        assert_eq!(texts("abcd", &frags), ["a", "#1"]);
    }
}
