//! The tokenizer of a GGUF model, built from its `tokenizer.ggml.*` metadata to give the token
//! ids llama.cpp gives (`llama_tokenize`) and the text it decodes (`llama_detokenize`,
//! `llama_token_to_piece`).
//!
//! - "gpt2" vocabularies: byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre`
//!   ([`pretokenize`] lists the supported names: qwen2, llama3, gpt-2, deepseek-v3, gpt-4o,
//!   tekken, ...).
//! - "llama" vocabularies: SentencePiece-style BPE over scores with `<0xXX>` byte fallback.
//!
//! The BPE itself runs in the `tokenizers` library; around it sit the parts llama.cpp does its
//! own way: special tokens cut out of the text first ([`special`]), the BOS/EOS rules, the
//! SentencePiece space prefix, and decoding piece by piece ([`decode`], [`stream`]).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use brink_engine::gguf::GgufFile;
//! use brink_engine::tokenizer::Tokenizer;
//! let file = GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(file.metadata())?;
//! let ids = tok.encode("<|im_start|>user\nHello<|im_end|>\n", true, true)?;
//! let mut stream = tok.stream_decoder(false);
//! for &id in &ids {
//!     print!("{}", stream.push(id)?);
//! }
//! # Ok(()) }
//! ```

mod bpe;
pub mod byte_level;
pub mod decode;
mod error;
pub mod pretokenize;
pub mod special;
mod spm;
mod stream;
mod vocab;

use aho_corasick::AhoCorasick;
use tokenizers::models::bpe::BPE;
use tokenizers::{DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, TokenizerImpl};

use crate::gguf::Metadata;

pub use error::TokenizerError;
pub use special::Fragment;
pub use stream::{StreamDecoder, take_complete};
pub use vocab::{SUPPORTED_MODELS, SpecialTokens, TokenAttr, TokenizerModel, VocabFlags, keys};

use pretokenize::RegexByteLevel;
use vocab::Vocab;

/// The `tokenizers` tokenizer each vocabulary is converted into.
pub type HfTokenizer = TokenizerImpl<BPE, NormalizerWrapper, RegexByteLevel, PostProcessorWrapper, DecoderWrapper>;

/// A GGUF model's tokenizer. Immutable and `Sync`: share one between threads.
pub struct Tokenizer {
    vocab: Vocab,
    hf: HfTokenizer,
    /// Each token's bytes when rendered (special tokens as their text).
    pieces: Vec<Box<[u8]>>,
    /// Tokens that may be matched whole in text, longest first.
    special_by_length: Vec<u32>,
    /// Finds which of them occur in a text, so the partition only walks those.
    special_finder: Option<AhoCorasick>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.vocab.path)
            .field("model", &self.vocab.model)
            .field("pre", &self.pre_tokenizer())
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.vocab.special)
            .field("flags", &self.vocab.flags)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a model's metadata. Missing or malformed keys, unsupported models
    /// or pre-tokenizers, and inconsistent vocabularies are errors naming the file and the key.
    pub fn from_gguf(meta: &Metadata) -> Result<Tokenizer, TokenizerError> {
        let vocab = vocab::read(meta)?;
        let hf = match (&vocab.model, &vocab.pre) {
            (TokenizerModel::BytePairBpe, Some((_, spec))) => bpe::build(&vocab, spec)?,
            _ => spm::build(&vocab)?,
        };
        let pieces = decode::pieces(vocab.model, &vocab.tokens, &vocab.attrs);
        let special_by_length = special::matchable_by_length(&vocab.tokens, &vocab.attrs);
        let special_finder = if special_by_length.is_empty() {
            None
        } else {
            let patterns = special_by_length.iter().map(|&id| vocab.tokens[id as usize].as_bytes());
            let finder = AhoCorasick::new(patterns)
                .map_err(|e| TokenizerError::library(format!("{}: indexing the special tokens", vocab.path.display()), e))?;
            Some(finder)
        };
        Ok(Tokenizer { vocab, hf, pieces, special_by_length, special_finder })
    }

    /// Tokenizes `text` as `llama_tokenize(vocab, text, add_special, parse_special)` does.
    ///
    /// `add_special` adds BOS when the vocabulary asks for it (`tokenizer.ggml.add_bos_token`, or
    /// the pre-tokenizer's default) and EOS when `add_eos_token` is set. `parse_special` matches
    /// control tokens such as `<|im_start|>` written in the text; user-defined tokens are matched
    /// either way, and without it control-token text is tokenized as ordinary text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let fragments = self.partition(text, parse_special);
        let flags = self.vocab.flags;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && flags.add_bos {
            // The reader refuses add_bos_token without a BOS id.
            out.extend(self.vocab.special.bos);
        }
        let mut after_special = true;
        for fragment in fragments {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(range) => {
                    let piece = &text[range];
                    match self.vocab.model {
                        TokenizerModel::BytePairBpe => self.encode_piece(piece, &mut out)?,
                        TokenizerModel::SentencePiece => {
                            // SentencePiece sees a space before text that starts the input or
                            // follows a special token.
                            let prefix = if flags.add_space_prefix && after_special { " " } else { "" };
                            self.encode_piece(&spm::escape_whitespace(&format!("{prefix}{piece}")), &mut out)?;
                        }
                    }
                    after_special = false;
                }
            }
        }
        if add_special && flags.add_eos {
            out.extend(self.vocab.special.eos);
        }
        Ok(out)
    }

    fn encode_piece(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let encoding = self.hf.encode_fast(text, false).map_err(|e| TokenizerError::library("tokenizing text", e))?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }

    /// The text fragments and whole special tokens `text` is cut into before tokenization.
    pub fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        // Only tokens that occur somewhere in the text can cut it; finding them in one pass keeps
        // long prompts from being scanned once per special token (a vocabulary may have
        // thousands). Pattern i is special_by_length[i], so the order is kept.
        let Some(finder) = &self.special_finder else {
            return special::partition(text, &[], &self.vocab.tokens, &self.vocab.attrs, parse_special);
        };
        let mut found = vec![false; self.special_by_length.len()];
        for m in finder.find_overlapping_iter(text) {
            found[m.pattern().as_usize()] = true;
        }
        let present: Vec<u32> = self.special_by_length.iter().zip(found).filter(|(_, f)| *f).map(|(&id, _)| id).collect();
        special::partition(text, &present, &self.vocab.tokens, &self.vocab.attrs, parse_special)
    }

    /// Decodes a whole sequence as `llama_detokenize(..., remove_special=false, unparse_special=!skip_special)`:
    /// control tokens are left out when `skip_special`, SentencePiece's leading space is removed,
    /// and vocabularies that ask for it get llama.cpp's space clean-up. Bytes that do not form
    /// UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.check_ids(ids)?;
        let bytes = decode::join(ids, &self.pieces, &self.vocab.attrs, !skip_special, self.vocab.flags.add_space_prefix);
        let bytes = if self.vocab.flags.clean_spaces { decode::clean_spaces(&bytes) } else { bytes };
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A decoder for generated tokens that releases text as soon as it is complete UTF-8.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// A token's bytes as `llama_token_to_piece(..., lstrip=0, special=render_special)` gives
    /// them (empty for control tokens when not rendering special tokens).
    pub fn piece(&self, id: u32, render_special: bool) -> Result<&[u8], TokenizerError> {
        let attr = self.token_attr(id).ok_or(TokenizerError::TokenOutOfRange { id, vocab_size: self.vocab_size() })?;
        Ok(if !render_special && decode::is_hidden(attr) { &[] } else { &self.pieces[id as usize] })
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), TokenizerError> {
        match ids.iter().find(|&&id| id as usize >= self.vocab_size()) {
            Some(&id) => Err(TokenizerError::TokenOutOfRange { id, vocab_size: self.vocab_size() }),
            None => Ok(()),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.tokens.len()
    }

    pub fn model(&self) -> TokenizerModel {
        self.vocab.model
    }

    /// The `tokenizer.ggml.pre` in effect ("default" when the key is absent); `None` for
    /// SentencePiece vocabularies, which have no pre-tokenizer.
    pub fn pre_tokenizer(&self) -> Option<&str> {
        self.vocab.pre.as_ref().map(|(name, _)| name.as_str())
    }

    pub fn flags(&self) -> VocabFlags {
        self.vocab.flags
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.vocab.special
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.vocab.special.eot
    }

    /// Tokens that end generation (llama.cpp's `special_eog_ids`), ascending: EOS, EOT, EOM,
    /// the FIM pad/repo/separator tokens and end-of-turn tokens known by their text
    /// (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...).
    pub fn stop_tokens(&self) -> &[u32] {
        &self.vocab.eog
    }

    pub fn is_stop_token(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// A token's text as the vocabulary spells it (byte-level characters, '▁', `<0xXX>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(|t| &**t)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.ids.get(text).copied()
    }

    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.vocab.attrs.get(id as usize).copied()
    }

    /// The underlying `tokenizers` tokenizer (BPE model and pre-tokenizer, without the special
    /// token handling above).
    pub fn hf_tokenizer(&self) -> &HfTokenizer {
        &self.hf
    }
}
