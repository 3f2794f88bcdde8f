//! Every way a vocabulary's metadata can be broken gives an error naming the file, the key and,
//! for arrays, the index; nothing panics.

mod tokenizer_common;

use brink_engine::gguf::{Array, Value};
use brink_engine::tokenizer::TokenizerError;
use tokenizer_common::*;

fn small() -> VocabSpec {
    let mut v = byte_level("qwen2", &["a b", "ab c"], &[("<|endoftext|>", CONTROL)]);
    v.set("tokenizer.ggml.eos_token_id", v.id("<|endoftext|>"));
    v
}

/// The error's message, checked to name the file and to contain each of `parts`.
fn error_of(v: &VocabSpec, parts: &[&str]) -> TokenizerError {
    let err = v.build().unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("vocab.gguf"), "no file name in: {msg}");
    for part in parts {
        assert!(msg.contains(part), "{part:?} not in: {msg}");
    }
    err
}

#[test]
fn the_reference_vocabulary_is_fine() {
    let v = small();
    let tok = v.build().unwrap();
    assert_eq!(tok.encode("abc", false, false).unwrap(), [v.id("abc")]);
}

#[test]
fn missing_or_mistyped_keys() {
    let mut w = small().writer();
    // Rebuild without the tokens array.
    let mut without = brink_engine::gguf::GgufWriter::new();
    for (k, v) in w.metadata() {
        if k != "tokenizer.ggml.tokens" {
            without.set(k, v.clone()).unwrap();
        }
    }
    let msg = build_from(&without).unwrap_err().to_string();
    assert!(msg.contains("\"tokenizer.ggml.tokens\": missing"), "{msg}");

    w.set("tokenizer.ggml.tokens", Value::U32(3)).unwrap();
    let msg = build_from(&w).unwrap_err().to_string();
    assert!(msg.contains("tokenizer.ggml.tokens") && msg.contains("expected array of string, found u32"), "{msg}");

    let mut v = small();
    v.set("tokenizer.ggml.scores", vec!["x"; v.tokens.len()]);
    error_of(&v, &["tokenizer.ggml.scores", "expected array of f32 or i32, found array of string"]);

    let mut v = small();
    v.set("tokenizer.ggml.add_bos_token", "yes");
    error_of(&v, &["tokenizer.ggml.add_bos_token", "expected bool, found string"]);

    let mut v = small();
    v.model = "bert".into();
    error_of(&v, &["tokenizer.ggml.model", "unsupported value \"bert\"", "gpt2, llama"]);

    let mut v = small();
    v.set("tokenizer.ggml.pre", "chatglm-bpe");
    error_of(&v, &["tokenizer.ggml.pre", "unsupported value \"chatglm-bpe\"", "qwen2", "llama3", "deepseek-v3", "gpt-4o", "tekken"]);
}

#[test]
fn bad_merges_name_their_index() {
    let mut v = small();
    v.merges.push("a zz".into());
    error_of(&v, &["tokenizer.ggml.merges[2]", "\"a zz\" refers to \"zz\", which is not in tokenizer.ggml.tokens"]);

    let mut v = small();
    v.merges.insert(0, "b a".into());
    error_of(&v, &["tokenizer.ggml.merges[0]", "makes \"ba\""]);

    let mut v = small();
    v.merges.insert(1, "abc".into());
    error_of(&v, &["tokenizer.ggml.merges[1]", "not two tokens separated by a space"]);

    // A merge whose first token is a space character is split after it (llama.cpp's rule).
    let mut v = small();
    v.merges.insert(1, " ab".into());
    error_of(&v, &["tokenizer.ggml.merges[1]", "\" ab\" is not two tokens"]);
}

#[test]
fn bad_token_arrays() {
    let mut v = small();
    v.types.pop();
    error_of(&v, &["tokenizer.ggml.token_type", &format!("has {} entries for {} tokens", v.tokens.len() - 1, v.tokens.len())]);

    let mut v = small();
    v.types[7] = 9;
    error_of(&v, &["tokenizer.ggml.token_type[7]", "unknown token type 9"]);

    let mut v = small();
    v.tokens[257] = v.tokens[5].clone();
    error_of(&v, &["tokenizer.ggml.tokens[257]", "duplicate token", "already at index 5"]);

    let mut v = small();
    v.tokens.truncate(0);
    v.types.truncate(0);
    v.merges.clear();
    v.unset("tokenizer.ggml.eos_token_id");
    error_of(&v, &["tokenizer.ggml.tokens", "is empty"]);

    // A byte-typed token must spell a byte.
    let mut v = small();
    v.types[3] = BYTE;
    error_of(&v, &["tokenizer.ggml.token_type[3]", "not of the form <0xXX>"]);

    // A byte-level vocabulary must cover every byte.
    let mut v = small();
    v.tokens[0] = "[renamed]".into();
    error_of(&v, &["tokenizer.ggml.tokens", "no token \"Ā\" for its byte"]);
}

#[test]
fn bad_special_ids_and_flags() {
    let n = small().tokens.len();
    let mut v = small();
    v.set("tokenizer.ggml.bos_token_id", n as u32);
    error_of(&v, &["tokenizer.ggml.bos_token_id", &format!("token id {n} is outside the vocabulary of {n} tokens")]);

    let mut v = small();
    v.set("tokenizer.ggml.eos_token_id", -1i32);
    error_of(&v, &["tokenizer.ggml.eos_token_id", "does not fit in u32"]);

    // BOS requested by default (SentencePiece) but the default id 1 is past a 1-token vocabulary.
    let mut v = VocabSpec { model: "llama".into(), ..Default::default() };
    v.push("<unk>", UNKNOWN, 0.0);
    error_of(&v, &["tokenizer.ggml.add_bos_token", "is true, but tokenizer.ggml.bos_token_id is not set"]);
    v.set("tokenizer.ggml.add_bos_token", false);
    let tok = v.build().unwrap();
    assert_eq!((tok.bos(), tok.eos(), tok.special_tokens().unk), (None, None, Some(0)));
}

#[test]
fn sentencepiece_specific_errors() {
    let mut v = sentencepiece(&[("▁a", -1.0)]);
    v.scores.pop();
    error_of(&v, &["tokenizer.ggml.scores", "entries for"]);

    let mut v = sentencepiece(&[("▁a", -1.0)]);
    v.scores[3] = f32::NAN;
    error_of(&v, &["tokenizer.ggml.scores[3]", "NaN"]);

    // No byte tokens and no unknown token: some text could not be encoded.
    let mut v = VocabSpec { model: "llama".into(), ..Default::default() };
    v.push("<s>", CONTROL, 0.0);
    v.push("</s>", CONTROL, 0.0);
    v.push("▁", NORMAL, -10.0);
    v.push("a", NORMAL, -10.0);
    v.push("▁a", NORMAL, -1.0);
    v.set("tokenizer.ggml.bos_token_id", 0u32).set("tokenizer.ggml.eos_token_id", 1u32);
    error_of(&v, &["tokenizer.ggml.tokens", "no byte token <0x00> and no unknown token"]);

    // With an unknown token instead, text outside the vocabulary becomes <unk>.
    let unk = v.push("<unk>", UNKNOWN, 0.0);
    v.set("tokenizer.ggml.unknown_token_id", unk);
    let tok = v.build().unwrap();
    assert_eq!(tok.encode("a z", false, false).unwrap(), [v.id("▁a"), v.id("▁"), unk]);

    // Integer scores are accepted, as llama.cpp accepts them.
    let v = sentencepiece(&[("▁a", -1.0)]);
    let mut w = v.writer();
    w.set("tokenizer.ggml.scores", Value::from(Array::I32(vec![0; v.tokens.len()]))).unwrap();
    assert!(build_from(&w).is_ok());
}
