//! Reads `tokenizer.ggml.*` into a validated vocabulary, with llama.cpp's defaults
//! (src/llama-vocab.cpp, `llama_vocab::impl::load`): which model and pre-tokenizer, the tokens
//! and their types, merges or scores, the special token ids and the add-BOS/EOS flags.
//!
//! Where llama.cpp warns and carries on with a broken file (an out-of-range special id, arrays
//! of different lengths, a merge of tokens that do not exist), this refuses it with an error
//! naming the key and the index: such a file tokenizes differently from the model it came from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::gguf::{Array, ErrorKind, GgufError, KeyProblem, Metadata};

use super::error::TokenizerError;
use super::pretokenize::{DEFAULT_PRE, PreTokenizerSpec, find_pre_tokenizer, supported_pre_tokenizers};
use super::special;

/// The metadata keys read here.
pub mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const SCORES: &str = "tokenizer.ggml.scores";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    pub const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    pub const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    pub const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
    /// Spelled as llama.cpp and gguf-py spell it.
    pub const SEP_ID: &str = "tokenizer.ggml.seperator_token_id";
    pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    pub const FIM_PAD_ID: &str = "tokenizer.ggml.fim_pad_token_id";
    pub const FIM_REP_ID: &str = "tokenizer.ggml.fim_rep_token_id";
    pub const FIM_SEP_ID: &str = "tokenizer.ggml.fim_sep_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// The tokenizer algorithm named by `tokenizer.ggml.model`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerModel {
    /// "gpt2": byte-level BPE with ranked merges and a regex pre-tokenizer.
    BytePairBpe,
    /// "llama": SentencePiece-style BPE over scores, spaces as '▁', bytes as `<0xXX>` tokens.
    SentencePiece,
}

pub const SUPPORTED_MODELS: [&str; 2] = ["gpt2", "llama"];

/// A token's attributes, as llama.cpp derives them from `tokenizer.ggml.token_type` and then
/// adjusts them (bit flags, so a normal-typed end-of-turn token can also be control).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenAttr(u8);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);

    /// The attribute of a `tokenizer.ggml.token_type` value (0 undefined, 1 normal, 2 unknown,
    /// 3 control, 4 user-defined, 5 unused, 6 byte).
    pub fn from_token_type(t: i64) -> Option<TokenAttr> {
        Some(match t {
            0 => Self::UNDEFINED,
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => return None,
        })
    }

    /// Whether any of `other`'s flags are set.
    pub fn has(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    pub fn with(self, other: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | other.0)
    }

    /// Control, unknown and user-defined tokens are matched whole in text (the first two only when
    /// special tokens are parsed).
    pub fn is_special(self) -> bool {
        self.has(Self::CONTROL.with(Self::UNKNOWN).with(Self::USER_DEFINED))
    }
}

/// The special token ids of a vocabulary (`None` where it has none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// How text is turned into tokens and back, besides the vocabulary itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VocabFlags {
    pub add_bos: bool,
    pub add_eos: bool,
    /// SentencePiece: a space before text that starts the input or follows a special token
    /// (and a leading space stripped when decoding).
    pub add_space_prefix: bool,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
}

/// A validated vocabulary.
#[derive(Debug)]
pub struct Vocab {
    pub path: PathBuf,
    pub model: TokenizerModel,
    /// The `tokenizer.ggml.pre` in effect and its spec (byte-level BPE only).
    pub pre: Option<(String, &'static PreTokenizerSpec)>,
    pub tokens: Vec<Box<str>>,
    pub ids: HashMap<Box<str>, u32>,
    pub attrs: Vec<TokenAttr>,
    /// Per-token scores (SentencePiece merge priorities); zeros when the file has none.
    pub scores: Vec<f32>,
    /// Byte-level BPE merges in rank order, duplicates dropped (the first rank counts, as in llama.cpp).
    pub merges: Vec<(String, String)>,
    pub special: SpecialTokens,
    pub flags: VocabFlags,
    /// End-of-generation tokens, ascending.
    pub eog: Vec<u32>,
}

/// Largest vocabulary: token ids are `llama_token` (i32) in llama.cpp and u32 here.
const MAX_TOKENS: usize = i32::MAX as usize;

fn invalid(path: &Path, key: &'static str, index: Option<usize>, problem: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid { path: path.to_path_buf(), key, index, problem: problem.into() }
}

fn wrong_type(meta: &Metadata, key: &str, expected: &'static str) -> TokenizerError {
    let entry = meta.entry(key);
    let found = entry.map(|e| e.value.type_description()).unwrap_or_default();
    let kind = ErrorKind::Metadata { key: key.to_string(), problem: KeyProblem::WrongType { expected, found } };
    GgufError::new(meta.path(), entry.map(|e| e.offset), kind).into()
}

pub fn read(meta: &Metadata) -> Result<Vocab, TokenizerError> {
    let path = meta.path().to_path_buf();
    let model_name = meta.get_str(keys::MODEL)?;
    let model = match model_name {
        "gpt2" => TokenizerModel::BytePairBpe,
        "llama" => TokenizerModel::SentencePiece,
        other => {
            return Err(TokenizerError::Unsupported {
                path,
                key: keys::MODEL,
                value: other.to_string(),
                supported: SUPPORTED_MODELS.to_vec(),
            });
        }
    };

    // The pre-tokenizer matters for byte-level BPE only; llama.cpp ignores it for SentencePiece.
    let pre = match model {
        TokenizerModel::BytePairBpe => {
            let name = meta.optional(keys::PRE, Metadata::get_str)?.unwrap_or(DEFAULT_PRE);
            let spec = find_pre_tokenizer(name).ok_or_else(|| TokenizerError::Unsupported {
                path: path.clone(),
                key: keys::PRE,
                value: name.to_string(),
                supported: supported_pre_tokenizers(),
            })?;
            Some((name.to_string(), spec))
        }
        TokenizerModel::SentencePiece => None,
    };
    let mut flags = match pre {
        Some((_, spec)) => VocabFlags {
            add_bos: spec.add_bos,
            add_eos: false,
            add_space_prefix: false,
            ignore_merges: spec.ignore_merges,
            clean_spaces: spec.clean_spaces,
        },
        None => VocabFlags { add_bos: true, add_eos: false, add_space_prefix: true, ignore_merges: false, clean_spaces: false },
    };
    if let Some(v) = meta.optional(keys::ADD_SPACE_PREFIX, Metadata::get_bool)? {
        flags.add_space_prefix = v;
    }

    let (tokens, ids) = read_tokens(meta)?;
    let n = tokens.len();
    let scores = read_scores(meta, n)?;
    let mut attrs = read_token_types(meta, n)?;
    validate_byte_tokens(&path, &tokens, &attrs)?;
    let merges = match model {
        TokenizerModel::BytePairBpe => read_merges(meta, &ids)?,
        TokenizerModel::SentencePiece => Vec::new(),
    };

    let mut special = read_special_ids(meta, model, n)?;
    if let Some(v) = meta.optional(keys::ADD_BOS, Metadata::get_bool)? {
        flags.add_bos = v;
    }
    if let Some(v) = meta.optional(keys::ADD_EOS, Metadata::get_bool)? {
        flags.add_eos = v;
    }
    if flags.add_bos && special.bos.is_none() {
        return Err(invalid(&path, keys::ADD_BOS, None, format!("is true, but {} is not set", keys::BOS_ID)));
    }
    if flags.add_eos && special.eos.is_none() {
        return Err(invalid(&path, keys::ADD_EOS, None, format!("is true, but {} is not set", keys::EOS_ID)));
    }

    let eog = special::detect(&tokens, &ids, &mut attrs, &mut special);
    require_byte_coverage(&path, model, &ids, unknown_fallback(&special, &attrs))?;
    Ok(Vocab { path, model, pre, tokens, ids, attrs, scores, merges, special, flags, eog })
}

/// Token texts by id, and ids by text.
type TokenTable = (Vec<Box<str>>, HashMap<Box<str>, u32>);

fn read_tokens(meta: &Metadata) -> Result<TokenTable, TokenizerError> {
    let path = meta.path();
    let raw = meta.get_str_array(keys::TOKENS)?;
    if raw.is_empty() {
        return Err(invalid(path, keys::TOKENS, None, "is empty"));
    }
    if raw.len() > MAX_TOKENS {
        return Err(invalid(
            path,
            keys::TOKENS,
            None,
            format!("has {} tokens, more than the {MAX_TOKENS} a token id can number", raw.len()),
        ));
    }
    let mut tokens = Vec::with_capacity(raw.len());
    let mut ids = HashMap::with_capacity(raw.len());
    for (i, text) in raw.iter().enumerate() {
        // llama.cpp names empty tokens so that they stay distinct and unmatchable.
        let text: Box<str> = if text.is_empty() { format!("[EMPTY_{i}]").into() } else { text.clone() };
        if let Some(first) = ids.insert(text.clone(), i as u32) {
            return Err(invalid(path, keys::TOKENS, Some(i), format!("duplicate token {text:?}, already at index {first}")));
        }
        tokens.push(text);
    }
    Ok((tokens, ids))
}

fn read_scores(meta: &Metadata, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let Some(value) = meta.get(keys::SCORES) else { return Ok(vec![0.0; n]) };
    let scores: Vec<f32> = match value.as_array() {
        Some(Array::F32(v)) => v.clone(),
        Some(Array::I32(v)) => v.iter().map(|&s| s as f32).collect(),
        _ => return Err(wrong_type(meta, keys::SCORES, "array of f32 or i32")),
    };
    if scores.len() != n {
        return Err(invalid(meta.path(), keys::SCORES, None, format!("has {} entries for {n} tokens", scores.len())));
    }
    if let Some(i) = scores.iter().position(|s| s.is_nan()) {
        return Err(invalid(meta.path(), keys::SCORES, Some(i), "is NaN"));
    }
    Ok(scores)
}

fn read_token_types(meta: &Metadata, n: usize) -> Result<Vec<TokenAttr>, TokenizerError> {
    let Some(types) = meta.optional(keys::TOKEN_TYPE, Metadata::get_int_array)? else {
        return Ok(vec![TokenAttr::NORMAL; n]);
    };
    if types.len() != n {
        return Err(invalid(meta.path(), keys::TOKEN_TYPE, None, format!("has {} entries for {n} tokens", types.len())));
    }
    types
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            TokenAttr::from_token_type(t)
                .ok_or_else(|| invalid(meta.path(), keys::TOKEN_TYPE, Some(i), format!("unknown token type {t} (expected 0..=6)")))
        })
        .collect()
}

/// The byte a `<0xXX>` token stands for.
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn validate_byte_tokens(path: &Path, tokens: &[Box<str>], attrs: &[TokenAttr]) -> Result<(), TokenizerError> {
    for (i, (text, attr)) in tokens.iter().zip(attrs).enumerate() {
        if attr.has(TokenAttr::BYTE) && parse_byte_token(text).is_none() {
            return Err(invalid(
                path,
                keys::TOKEN_TYPE,
                Some(i),
                format!("token {text:?} has the byte type but is not of the form <0xXX>"),
            ));
        }
    }
    Ok(())
}

/// Merges are "left right" with the first space after the first character separating the two
/// (llama.cpp's split); both sides and their concatenation must be tokens.
fn read_merges(meta: &Metadata, ids: &HashMap<Box<str>, u32>) -> Result<Vec<(String, String)>, TokenizerError> {
    let path = meta.path();
    let raw = meta.get_str_array(keys::MERGES)?;
    let mut seen = std::collections::HashSet::with_capacity(raw.len());
    let mut merges = Vec::with_capacity(raw.len());
    for (i, merge) in raw.iter().enumerate() {
        let split = merge.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(at, _)| at);
        let Some(at) = split else {
            return Err(invalid(path, keys::MERGES, Some(i), format!("{merge:?} is not two tokens separated by a space")));
        };
        let (left, right) = (&merge[..at], &merge[at + 1..]);
        for side in [left, right] {
            if !ids.contains_key(side) {
                return Err(invalid(
                    path,
                    keys::MERGES,
                    Some(i),
                    format!("{merge:?} refers to {side:?}, which is not in {}", keys::TOKENS),
                ));
            }
        }
        let joined = format!("{left}{right}");
        if !ids.contains_key(joined.as_str()) {
            return Err(invalid(path, keys::MERGES, Some(i), format!("{merge:?} makes {joined:?}, which is not in {}", keys::TOKENS)));
        }
        if seen.insert((left, right)) {
            merges.push((left.to_string(), right.to_string()));
        }
    }
    Ok(merges)
}

fn read_special_ids(meta: &Metadata, model: TokenizerModel, n: usize) -> Result<SpecialTokens, TokenizerError> {
    // llama.cpp's defaults, dropped when they fall outside a small vocabulary.
    let (bos, eos, unk) = match model {
        TokenizerModel::SentencePiece => (Some(1), Some(2), Some(0)),
        TokenizerModel::BytePairBpe => (Some(11), Some(11), None),
    };
    let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    let read = |key: &'static str, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
        match meta.optional(key, Metadata::get_u32)? {
            Some(id) if id as usize >= n => {
                Err(invalid(meta.path(), key, None, format!("token id {id} is outside the vocabulary of {n} tokens")))
            }
            Some(id) => Ok(Some(id)),
            None => Ok(in_range(default)),
        }
    };
    Ok(SpecialTokens {
        bos: read(keys::BOS_ID, bos)?,
        eos: read(keys::EOS_ID, eos)?,
        eot: read(keys::EOT_ID, None)?,
        eom: read(keys::EOM_ID, None)?,
        unk: read(keys::UNK_ID, unk)?,
        sep: read(keys::SEP_ID, None)?,
        pad: read(keys::PAD_ID, None)?,
        fim_pad: read(keys::FIM_PAD_ID, None)?,
        fim_rep: read(keys::FIM_REP_ID, None)?,
        fim_sep: read(keys::FIM_SEP_ID, None)?,
    })
}

/// The token for text SentencePiece cannot spell: the unknown id, if it names a token typed
/// unknown (llama.cpp defaults the id to 0 whatever token is there).
pub fn unknown_fallback(special: &SpecialTokens, attrs: &[TokenAttr]) -> Option<u32> {
    special.unk.filter(|&id| attrs[id as usize].has(TokenAttr::UNKNOWN))
}

/// Every byte must have a token, or text would silently lose characters: byte-level BPE needs
/// all 256 byte characters; SentencePiece needs the 256 `<0xXX>` tokens or an unknown token.
fn require_byte_coverage(path: &Path, model: TokenizerModel, ids: &HashMap<Box<str>, u32>, unk: Option<u32>) -> Result<(), TokenizerError> {
    let missing = |spell: &dyn Fn(u8) -> String| (0..=255u8).map(spell).find(|s| !ids.contains_key(s.as_str()));
    match model {
        TokenizerModel::BytePairBpe => {
            if let Some(s) = missing(&|b| super::byte_level::byte_to_char(b).to_string()) {
                return Err(invalid(
                    path,
                    keys::TOKENS,
                    None,
                    format!("byte-level vocabulary has no token {s:?} for its byte; every byte needs one"),
                ));
            }
        }
        TokenizerModel::SentencePiece => {
            if unk.is_none()
                && let Some(s) = missing(&|b| format!("<0x{b:02X}>"))
            {
                return Err(invalid(
                    path,
                    keys::TOKENS,
                    None,
                    format!("has no byte token {s} and no unknown token, so some text could not be encoded"),
                ));
            }
        }
    }
    Ok(())
}
