//! The synthetic models' vocabulary: a real byte-level BPE ("gpt2" model) laid out as Qwen's or
//! gpt-oss's: byte tokens and merged tokens, then the family's special tokens ([`Layout`]), then
//! `[PAD{id}]` tokens (type UNUSED, as `convert_hf_to_gguf.py` pads Qwen's 151,665 tokens to
//! 151,936) up to the requested size.

use crate::gguf::{GgufError, GgufWriter, Value};

use super::bpe;

/// The embedded training text (prose, questions, code, numbers, several languages).
const CORPUS: &str = include_str!("corpus.txt");

/// Tokens of the trained part (byte tokens, merges and the special tokens); a larger vocabulary
/// is padded, a smaller one trains fewer merges.
pub const TRAINED_TOKENS: u64 = 2000;

/// Special tokens, in id order after the trained tokens (Qwen's first three).
pub const ENDOFTEXT: &str = "<|endoftext|>";
pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
const SPECIALS: [&str; 3] = [ENDOFTEXT, IM_START, IM_END];

/// The fewest tokens a Qwen-layout vocabulary can have: every byte and the special tokens.
pub const MIN_VOCAB: u64 = 256 + SPECIALS.len() as u64;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub const TOKEN_NORMAL: i32 = 1;
pub const TOKEN_CONTROL: i32 = 3;
pub const TOKEN_UNUSED: i32 = 5;

/// Qwen's ChatML template, without the tool-calling and reasoning branches.
pub const CHAT_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// A model family's tokenizer keys: its special tokens (ids right after the BPE tokens, in this
/// order), which of them are BOS, EOS and padding, the pre-tokenizer name and the chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub specials: &'static [&'static str],
    pub bos: &'static str,
    pub eos: &'static str,
    pub pad: &'static str,
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    /// `tokenizer.chat_template`.
    pub chat_template: &'static str,
}

impl Layout {
    /// The fewest tokens a vocabulary of this layout can have: every byte and the specials.
    pub fn min_vocab(&self) -> u64 {
        256 + self.specials.len() as u64
    }
}

/// Qwen's: `<|endoftext|>` is BOS and padding, `<|im_end|>` EOS, the Qwen2 pre-tokenizer, ChatML.
pub const QWEN: Layout =
    Layout { specials: &SPECIALS, bos: ENDOFTEXT, eos: IM_END, pad: ENDOFTEXT, pre: "qwen2", chat_template: CHAT_TEMPLATE };

/// A complete vocabulary, as the GGUF `tokenizer.*` keys store it.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocab {
    /// Token texts: bytes mapped through GPT-2's byte-to-unicode table.
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    /// "left right", in rank order.
    pub merges: Vec<String>,
    /// Normal (byte and merged) tokens: ids `0..bpe_tokens`.
    pub bpe_tokens: u32,
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    pub layout: Layout,
}

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to themselves, the others to
/// U+0100 onwards, so every byte sequence is a string of visible characters. Returns the bytes
/// in token order (the printable ones first, as GPT-2's and Qwen's vocabularies number them) and
/// each byte's character.
pub fn byte_to_unicode() -> ([u8; 256], [char; 256]) {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut order = [0u8; 256];
    let mut chars = ['\0'; 256];
    let mut next = 0;
    for b in (0..=255u8).filter(|&b| printable(b)) {
        order[next] = b;
        chars[b as usize] = char::from(b);
        next += 1;
    }
    for (n, b) in (0..=255u8).filter(|&b| !printable(b)).enumerate() {
        order[next] = b;
        // 256 + n < 0x180: always a valid char.
        chars[b as usize] = char::from_u32(256 + n as u32).unwrap_or(char::REPLACEMENT_CHARACTER);
        next += 1;
    }
    (order, chars)
}

fn mapped(bytes: &[u8], chars: &[char; 256]) -> String {
    bytes.iter().map(|&b| chars[b as usize]).collect()
}

impl Vocab {
    /// Builds a Qwen-layout vocabulary of exactly `size` tokens (`MIN_VOCAB..=i32::MAX`, checked
    /// by the caller's shape validation).
    pub fn build(size: u64) -> Vocab {
        Self::build_for(size, QWEN)
    }

    /// Builds a vocabulary of exactly `size` tokens (`layout.min_vocab()..=i32::MAX`, checked by
    /// the caller's shape validation) with `layout`'s special tokens.
    pub fn build_for(size: u64, layout: Layout) -> Vocab {
        let specials = layout.specials;
        let trained = size.min(TRAINED_TOKENS) - specials.len() as u64;
        let (order, chars) = byte_to_unicode();
        let bpe = bpe::train(CORPUS, &order, trained as usize);
        let mut tokens: Vec<String> = bpe.tokens.iter().map(|t| mapped(t, &chars)).collect();
        let merges = bpe.merges.iter().map(|&(l, r)| format!("{} {}", tokens[l as usize], tokens[r as usize])).collect();
        let bpe_tokens = tokens.len() as u32;
        let mut token_types = vec![TOKEN_NORMAL; tokens.len()];
        tokens.extend(specials.iter().map(|s| s.to_string()));
        token_types.extend(std::iter::repeat_n(TOKEN_CONTROL, specials.len()));
        // The corpus may run out of merges before `trained`: the padding fills the rest.
        let padded = tokens.len() as u64..size;
        tokens.extend(padded.clone().map(|id| format!("[PAD{id}]")));
        token_types.extend(padded.map(|_| TOKEN_UNUSED));
        let id = |text: &str| {
            bpe_tokens + specials.iter().position(|s| *s == text).expect("a layout's BOS, EOS and padding are among its specials") as u32
        };
        let (bos, eos, pad) = (id(layout.bos), id(layout.eos), id(layout.pad));
        Vocab { tokens, token_types, merges, bpe_tokens, bos, eos, pad, layout }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The id of a special token by its text.
    pub fn special(&self, text: &str) -> Option<u32> {
        self.layout.specials.iter().position(|s| *s == text).map(|i| self.bpe_tokens + i as u32)
    }

    /// Sets the `tokenizer.*` keys as the family's GGUF files carry them.
    pub fn write_metadata(&self, w: &mut GgufWriter) -> Result<(), GgufError> {
        w.set("tokenizer.ggml.model", "gpt2")?;
        w.set("tokenizer.ggml.pre", self.layout.pre)?;
        w.set("tokenizer.ggml.tokens", Value::from(self.tokens.clone()))?;
        w.set("tokenizer.ggml.token_type", Value::from(self.token_types.clone()))?;
        w.set("tokenizer.ggml.merges", Value::from(self.merges.clone()))?;
        w.set("tokenizer.ggml.bos_token_id", self.bos)?;
        w.set("tokenizer.ggml.eos_token_id", self.eos)?;
        w.set("tokenizer.ggml.padding_token_id", self.pad)?;
        w.set("tokenizer.ggml.add_bos_token", false)?;
        w.set("tokenizer.chat_template", self.layout.chat_template)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn byte_mapping_matches_gpt2() {
        let (order, chars) = byte_to_unicode();
        assert_eq!(order[0], b'!');
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[0], 'Ā');
        assert_eq!(chars[b'A' as usize], 'A');
        let distinct: HashSet<char> = chars.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        let bytes: HashSet<u8> = order.iter().copied().collect();
        assert_eq!(bytes.len(), 256);
    }

    #[test]
    fn default_vocab_is_trained_to_size_with_specials() {
        let v = Vocab::build(TRAINED_TOKENS);
        assert_eq!(v.len() as u64, TRAINED_TOKENS);
        assert_eq!(v.bpe_tokens as u64, TRAINED_TOKENS - 3, "the corpus ran out of merges");
        // A merge may produce a token an earlier merge produced: at least one merge per token.
        assert!(v.merges.len() as u64 >= TRAINED_TOKENS - 3 - 256);
        assert_eq!(v.tokens[v.bos as usize], ENDOFTEXT);
        assert_eq!(v.tokens[v.eos as usize], IM_END);
        assert_eq!(v.special(IM_START), Some(v.bpe_tokens + 1));
        assert!(v.token_types[v.bpe_tokens as usize..].iter().all(|&t| t == TOKEN_CONTROL));
        // Common words are single tokens.
        for word in ["Ġthe", "Ġand", "Ġmodel", "the"] {
            assert!(v.tokens.iter().any(|t| t == word), "{word} is not a token");
        }
        let distinct: HashSet<&String> = v.tokens.iter().collect();
        assert_eq!(distinct.len(), v.len(), "token texts must be unique (llama.cpp asserts it)");
    }

    #[test]
    fn large_vocab_is_padded_and_small_one_trains_less() {
        let big = Vocab::build(151_936);
        assert_eq!(big.len(), 151_936);
        assert_eq!(big.tokens[151_935], "[PAD151935]");
        assert_eq!(big.token_types[151_935], TOKEN_UNUSED);
        assert_eq!(big.bpe_tokens as u64, TRAINED_TOKENS - 3);
        let small = Vocab::build(MIN_VOCAB + 10);
        assert_eq!(small.len() as u64, MIN_VOCAB + 10);
        assert_eq!(small.bpe_tokens, 266);
        assert_eq!(small.tokens[..266], big.tokens[..266], "the first merges do not depend on the size");
    }
}
