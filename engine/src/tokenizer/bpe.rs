//! Byte-level BPE ("gpt2" vocabularies: Qwen, Llama 3, DeepSeek, gpt-oss, ...) as a `tokenizers`
//! tokenizer: the vocabulary and ranked merges as its BPE model, the pre-tokenizer chosen by
//! `tokenizer.ggml.pre` (regex splits, then bytes to GPT-2 characters) as its pre-tokenizer.
//! Special tokens are cut out of the text before it gets here (see `special::partition`).

use tokenizers::models::bpe::BPE;

use super::HfTokenizer;
use super::error::TokenizerError;
use super::pretokenize::{PreTokenizerSpec, RegexByteLevel};
use super::vocab::Vocab;

pub fn build(vocab: &Vocab, spec: &PreTokenizerSpec) -> Result<HfTokenizer, TokenizerError> {
    let context = || format!("{}: building the byte-level BPE tokenizer", vocab.path.display());
    let map: tokenizers::models::bpe::Vocab = vocab.tokens.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
    let model = BPE::builder()
        .vocab_and_merges(map, vocab.merges.clone())
        .ignore_merges(vocab.flags.ignore_merges)
        .build()
        .map_err(|e| TokenizerError::library(context(), e))?;
    let pre = RegexByteLevel::new(spec)
        .map_err(|(pattern, e)| TokenizerError::library(context(), format!("pre-tokenizer regex {pattern:?} does not compile: {e}")))?;
    let mut tokenizer = HfTokenizer::new(model);
    tokenizer.with_pre_tokenizer(Some(pre));
    Ok(tokenizer)
}
