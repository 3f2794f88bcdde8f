//! Helpers shared by the tokenizer tests: small vocabularies written to real GGUF files with our
//! writer and read back, so the tokenizer is built from metadata exactly as for a model.
#![allow(dead_code)]

use brink_engine::gguf::{GgufFile, GgufWriter, Value};
use brink_engine::tokenizer::byte_level::byte_to_char;
use brink_engine::tokenizer::{Tokenizer, TokenizerError};

pub const NORMAL: i32 = 1;
pub const UNKNOWN: i32 = 2;
pub const CONTROL: i32 = 3;
pub const USER_DEFINED: i32 = 4;
pub const BYTE: i32 = 6;

/// Metadata of a vocabulary under construction.
#[derive(Clone, Debug, Default)]
pub struct VocabSpec {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub scores: Vec<f32>,
    pub merges: Vec<String>,
    /// Further keys (special ids, flags, pre-tokenizer), written after the arrays.
    pub extra: Vec<(String, Value)>,
    pub model: String,
}

impl VocabSpec {
    pub fn id(&self, text: &str) -> u32 {
        self.tokens.iter().position(|t| t == text).unwrap_or_else(|| panic!("no token {text:?}")) as u32
    }

    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Self {
        self.extra.retain(|(k, _)| k != key);
        self.extra.push((key.to_string(), value.into()));
        self
    }

    pub fn unset(&mut self, key: &str) -> &mut Self {
        self.extra.retain(|(k, _)| k != key);
        self
    }

    pub fn push(&mut self, text: &str, ty: i32, score: f32) -> u32 {
        self.tokens.push(text.to_string());
        self.types.push(ty);
        self.scores.push(score);
        (self.tokens.len() - 1) as u32
    }

    /// The GGUF writer with every key, in the usual order (model, arrays, then the rest).
    pub fn writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        w.set("general.architecture", "qwen3moe").unwrap();
        w.set("tokenizer.ggml.model", self.model.as_str()).unwrap();
        w.set("tokenizer.ggml.tokens", self.tokens.clone()).unwrap();
        w.set("tokenizer.ggml.token_type", self.types.clone()).unwrap();
        if self.model == "llama" {
            w.set("tokenizer.ggml.scores", self.scores.clone()).unwrap();
        } else {
            w.set("tokenizer.ggml.merges", self.merges.clone()).unwrap();
        }
        for (k, v) in &self.extra {
            w.set(k, v.clone()).unwrap();
        }
        w
    }

    /// Writes the file and builds the tokenizer from what is read back.
    pub fn build(&self) -> Result<Tokenizer, TokenizerError> {
        build_from(&self.writer())
    }
}

pub fn build_from(w: &GgufWriter) -> Result<Tokenizer, TokenizerError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vocab.gguf");
    w.write_file(&path, &[]).unwrap();
    let file = GgufFile::open(&path).unwrap();
    Tokenizer::from_gguf(file.metadata())
}

/// A byte-level BPE vocabulary: the 256 byte characters (ids 0..=255 in byte order), then the
/// result of each merge (in merge order), then `extra` tokens.
pub fn byte_level(pre: &str, merges: &[&str], extra: &[(&str, i32)]) -> VocabSpec {
    let mut v = VocabSpec { model: "gpt2".into(), ..Default::default() };
    for b in 0..=255u8 {
        v.push(&byte_to_char(b).to_string(), NORMAL, 0.0);
    }
    for m in merges {
        let (l, r) = m.split_once(' ').unwrap();
        let joined = format!("{l}{r}");
        if !v.tokens.contains(&joined) {
            v.push(&joined, NORMAL, 0.0);
        }
        v.merges.push(m.to_string());
    }
    for (t, ty) in extra {
        v.push(t, *ty, 0.0);
    }
    v.set("tokenizer.ggml.pre", pre);
    v
}

/// The id of byte `b` in a [`byte_level`] vocabulary.
pub fn byte_id(b: u8) -> u32 {
    b as u32
}

pub fn byte_ids(s: &str) -> Vec<u32> {
    s.bytes().map(byte_id).collect()
}

/// A SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then `pieces` with scores.
pub fn sentencepiece(pieces: &[(&str, f32)]) -> VocabSpec {
    let mut v = VocabSpec { model: "llama".into(), ..Default::default() };
    v.push("<unk>", UNKNOWN, 0.0);
    v.push("<s>", CONTROL, 0.0);
    v.push("</s>", CONTROL, 0.0);
    for b in 0..=255u8 {
        v.push(&format!("<0x{b:02X}>"), BYTE, 0.0);
    }
    for (p, s) in pieces {
        v.push(p, NORMAL, *s);
    }
    v.set("tokenizer.ggml.bos_token_id", 1u32).set("tokenizer.ggml.eos_token_id", 2u32).set("tokenizer.ggml.unknown_token_id", 0u32);
    v
}
