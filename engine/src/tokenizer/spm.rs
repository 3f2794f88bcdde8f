//! SentencePiece-style BPE ("llama" vocabularies: Mixtral, Llama 2) as a `tokenizers` BPE model
//! with byte fallback. llama.cpp merges, among adjacent symbols, the pair whose concatenation is
//! the highest-scoring token; here every way of splitting a token into two tokens becomes a merge
//! ranked by that token's score, which the `tokenizers` BPE applies in the same order.
//!
//! Ties: llama.cpp breaks equal scores by position; ranks must be distinct, so equal scores are
//! ordered by token id, then by split point. Real vocabularies give distinct scores to distinct
//! pieces, so this only matters for hand-made ones.

use std::collections::HashMap;

use tokenizers::models::bpe::BPE;

use super::HfTokenizer;
use super::error::TokenizerError;
use super::vocab::Vocab;

/// The merges a scored vocabulary implies, best first.
pub fn merges_from_scores(tokens: &[Box<str>], ids: &HashMap<Box<str>, u32>, scores: &[f32]) -> Vec<(String, String)> {
    let mut ranked: Vec<(f32, u32, usize)> = Vec::new();
    for (id, text) in tokens.iter().enumerate() {
        for (at, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(at);
            if ids.contains_key(left) && ids.contains_key(right) {
                ranked.push((scores[id], id as u32, at));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked
        .into_iter()
        .map(|(_, id, at)| {
            let (left, right) = tokens[id as usize].split_at(at);
            (left.to_string(), right.to_string())
        })
        .collect()
}

pub fn build(vocab: &Vocab) -> Result<HfTokenizer, TokenizerError> {
    let context = || format!("{}: building the SentencePiece tokenizer", vocab.path.display());
    let map: tokenizers::models::bpe::Vocab = vocab.tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
    let merges = merges_from_scores(&vocab.tokens, &vocab.ids, &vocab.scores);
    let mut builder = BPE::builder().vocab_and_merges(map, merges).byte_fallback(true);
    if let Some(unk) = super::vocab::unknown_fallback(&vocab.special, &vocab.attrs) {
        builder = builder.unk_token(vocab.tokens[unk as usize].to_string());
    }
    let model = builder.build().map_err(|e| TokenizerError::library(context(), e))?;
    Ok(HfTokenizer::new(model))
}

/// llama.cpp's whitespace escape: spaces become '▁' (U+2581) before SentencePiece tokenization.
pub fn escape_whitespace(text: &str) -> String {
    text.replace(' ', "▁")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_follow_scores_then_ids() {
        let tokens: Vec<Box<str>> = ["a", "b", "c", "ab", "bc", "abc", "▁"].iter().map(|&t| t.into()).collect();
        let ids: HashMap<Box<str>, u32> = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0, 0.0];
        let merges = merges_from_scores(&tokens, &ids, &scores);
        let as_str: Vec<(&str, &str)> = merges.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
        assert_eq!(as_str, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }
}
