//! The tokenizer built from small vocabularies written as GGUF files: encoding with merges and
//! each pre-tokenizer, special tokens, BOS/EOS, SentencePiece byte fallback and space prefix,
//! decoding, streaming, end-of-generation tokens.

mod tokenizer_common;

use brink_engine::tokenizer::{Fragment, TokenAttr, TokenizerModel};
use tokenizer_common::*;

/// "hello" and " world" each merge to one token; "42" merges; "xyz" is a token no merge makes.
fn hello_vocab(pre: &str) -> VocabSpec {
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "4 2"];
    let extra = [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("<tool>", USER_DEFINED), ("xyz", NORMAL)];
    let mut v = byte_level(pre, &merges, &extra);
    let eot = v.id("<|endoftext|>");
    let im_end = v.id("<|im_end|>");
    v.set("tokenizer.ggml.bos_token_id", eot).set("tokenizer.ggml.eos_token_id", im_end).set("tokenizer.ggml.padding_token_id", eot);
    v
}

#[test]
fn byte_level_bpe_applies_merges_in_rank_order() {
    let v = hello_vocab("qwen2");
    let tok = v.build().unwrap();
    assert_eq!(tok.model(), TokenizerModel::BytePairBpe);
    assert_eq!(tok.pre_tokenizer(), Some("qwen2"));
    assert_eq!(tok.vocab_size(), v.tokens.len());
    assert_eq!(tok.encode("hello world", false, false).unwrap(), [v.id("hello"), v.id("Ġworld")]);
    // "hell" + "o" needs the rank-3 merge after "he"+"ll": "hellohello" is two words' worth.
    assert_eq!(tok.encode("hellohello", false, false).unwrap(), [v.id("hello"), v.id("hello")]);
    // Without the leading space there is no "Ġw" merge: "world" is w + or + ld.
    assert_eq!(tok.encode("world", false, false).unwrap(), [v.id("w"), v.id("or"), v.id("ld")]);
    assert_eq!(tok.encode("", false, false).unwrap(), Vec::<u32>::new());
}

#[test]
fn the_pre_tokenizer_decides_what_can_merge() {
    // qwen2 splits digits one by one, so "42" cannot merge; llama3 keeps up to three together.
    let qwen = hello_vocab("qwen2").build().unwrap();
    let llama3 = hello_vocab("llama3").build().unwrap();
    let v = hello_vocab("qwen2");
    assert_eq!(qwen.encode("42", false, false).unwrap(), byte_ids("42"));
    assert_eq!(llama3.encode("42", false, false).unwrap(), [v.id("42")]);
    // llama3 ignores merges for a piece that is itself a token; qwen2 does not.
    assert_eq!(llama3.encode("xyz", false, false).unwrap(), [v.id("xyz")]);
    assert_eq!(qwen.encode("xyz", false, false).unwrap(), byte_ids("xyz"));
    // gpt-2 keeps a whole digit run (with its space) in one piece; llama3 cuts it in threes.
    let gpt2 = hello_vocab("gpt-2").build().unwrap();
    let (n42, n4, n2) = (v.id("42"), byte_id(b'4'), byte_id(b'2'));
    assert_eq!(gpt2.encode("42424", false, false).unwrap(), [n42, n42, n4]);
    assert_eq!(llama3.encode("42424", false, false).unwrap(), [n42, n4, n2, n4]);
    assert_eq!(gpt2.encode("a 42", false, false).unwrap(), [byte_id(b'a'), v.id("Ġ"), n42]);
}

#[test]
fn tricky_text_round_trips_through_byte_level() {
    let tok = hello_vocab("qwen2").build().unwrap();
    let texts = [
        "Hello, world! It's DON'T-stop 1234567890 3.14",
        "中文字符测试，日本語のテキスト、한국어",
        "emoji 👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷 ",
        "  leading and trailing   \n\n\t\ttabs\r\nCRLF\u{a0}nbsp\u{3000}ideographic  ",
        "combining e\u{301} and hindi हिन्दी and arabic العربية",
        "<|im_start|> written by a user",
    ];
    for text in texts {
        for parse in [false, true] {
            let ids = tok.encode(text, false, parse).unwrap();
            assert_eq!(tok.decode(&ids, false).unwrap(), text, "{text:?}");
        }
    }
}

#[test]
fn control_tokens_are_parsed_only_when_asked_user_defined_always() {
    let v = hello_vocab("qwen2");
    let tok = v.build().unwrap();
    let (start, end, tool) = (v.id("<|im_start|>"), v.id("<|im_end|>"), v.id("<tool>"));
    let text = "<|im_start|>user\nhello<|im_end|><tool>";
    let mut expected = vec![start];
    expected.extend(byte_ids("user\n"));
    expected.extend([v.id("hello"), end, tool]);
    assert_eq!(tok.encode(text, false, true).unwrap(), expected);
    // Without parse_special the control tokens are plain text; the user-defined one is still cut.
    let plain = tok.encode(text, false, false).unwrap();
    assert!(!plain.contains(&start) && !plain.contains(&end), "{plain:?}");
    assert_eq!(plain.last(), Some(&tool));
    assert_eq!(tok.partition(text, false)[1], Fragment::Token(tool));
    // Decoding: control tokens shown or skipped, user-defined ones always shown.
    assert_eq!(tok.decode(&expected, false).unwrap(), text);
    assert_eq!(tok.decode(&expected, true).unwrap(), "user\nhello<tool>");
}

#[test]
fn bos_and_eos_follow_the_vocabulary_flags() {
    let mut v = hello_vocab("qwen2");
    let bos = v.id("<|endoftext|>");
    let eos = v.id("<|im_end|>");
    // qwen2 adds no BOS by default, even when asked for special tokens.
    let tok = v.build().unwrap();
    assert!(!tok.flags().add_bos);
    assert_eq!(tok.encode("hello", true, false).unwrap(), [v.id("hello")]);
    v.set("tokenizer.ggml.add_bos_token", true).set("tokenizer.ggml.add_eos_token", true);
    let tok = v.build().unwrap();
    assert_eq!(tok.encode("hello", true, false).unwrap(), [bos, v.id("hello"), eos]);
    assert_eq!(tok.encode("hello", false, false).unwrap(), [v.id("hello")]);
    assert_eq!(tok.encode("", true, false).unwrap(), [bos, eos]);
    // llama3 adds BOS by default.
    let tok = hello_vocab("llama3").build().unwrap();
    assert_eq!(tok.encode("hello", true, false).unwrap(), [bos, v.id("hello")]);
}

#[test]
fn end_of_generation_tokens() {
    let v = hello_vocab("qwen2");
    let tok = v.build().unwrap();
    let (eot, end) = (v.id("<|endoftext|>"), v.id("<|im_end|>"));
    assert_eq!(tok.stop_tokens(), [eot, end]);
    assert!(tok.is_stop_token(end) && !tok.is_stop_token(v.id("<|im_start|>")));
    assert_eq!((tok.bos(), tok.eos(), tok.eot()), (Some(eot), Some(end), Some(eot)));
    assert_eq!(tok.special_tokens().pad, Some(eot));
    assert!(tok.token_attr(end).unwrap().has(TokenAttr::CONTROL));
    assert_eq!(tok.token_text(end), Some("<|im_end|>"));
    assert_eq!(tok.token_id("<|im_end|>"), Some(end));
    assert_eq!(tok.token_text(v.tokens.len() as u32), None);
}

#[test]
fn stream_decoder_never_splits_a_character() {
    let tok = hello_vocab("qwen2").build().unwrap();
    let text = "a中👍🏽é\n";
    let ids = tok.encode(text, false, false).unwrap();
    assert_eq!(ids.len(), text.len(), "no merges apply: one token per byte");
    let mut stream = tok.stream_decoder(false);
    let mut pieces = Vec::new();
    for &id in &ids {
        let out = stream.push(id).unwrap();
        assert!(stream.pending_bytes() < 4);
        pieces.push(out);
    }
    assert_eq!(stream.finish(), "");
    assert_eq!(pieces.concat(), text);
    // Output only at character ends: "a", then "中" after its 3rd byte, ...
    let released: Vec<&str> = pieces.iter().filter(|p| !p.is_empty()).map(String::as_str).collect();
    assert_eq!(released, ["a", "中", "👍", "🏽", "é", "\n"]);
    // An unfinished character at the end comes out as U+FFFD.
    let mut stream = tok.stream_decoder(false);
    assert_eq!(stream.push(byte_id(0xe4)).unwrap(), "");
    assert_eq!(stream.finish(), "\u{fffd}");
    // Control tokens are withheld when skipping special tokens.
    let v = hello_vocab("qwen2");
    let mut stream = tok.stream_decoder(true);
    assert_eq!(stream.push(v.id("<|im_end|>")).unwrap(), "");
    let mut stream = tok.stream_decoder(false);
    assert_eq!(stream.push(v.id("<|im_end|>")).unwrap(), "<|im_end|>");
    assert!(stream.push(1_000_000).is_err());
}

#[test]
fn gpt2_decoding_cleans_spaces_like_llama_cpp_qwen2_does_not() {
    let text = "Hi , there ! it 's";
    let gpt2 = hello_vocab("gpt-2").build().unwrap();
    let ids = gpt2.encode(text, false, false).unwrap();
    assert_eq!(gpt2.decode(&ids, false).unwrap(), "Hi, there! it's");
    let qwen = hello_vocab("qwen2").build().unwrap();
    let ids = qwen.encode(text, false, false).unwrap();
    assert_eq!(qwen.decode(&ids, false).unwrap(), text);
    assert!(qwen.decode(&[u32::MAX], false).is_err());
}

/// "Hello" and "world" build up through scored merges (see the comments on each score).
fn spm_vocab() -> VocabSpec {
    sentencepiece(&[
        ("▁", -100.0),
        ("H", -100.0),
        ("e", -100.0),
        ("l", -100.0),
        ("o", -100.0),
        ("w", -100.0),
        ("r", -100.0),
        ("d", -100.0),
        ("a", -100.0),
        ("b", -100.0),
        ("el", -1.0),
        ("▁H", -2.0),
        ("ll", -3.0),
        ("lo", -5.0),
        ("ello", -6.0),
        ("▁Hello", -7.0),
        ("ell", -8.0),
        ("▁w", -10.0),
        ("or", -11.0),
        ("ld", -12.0),
        ("▁wor", -13.0),
        ("▁world", -14.0),
        ("▁a", -20.0),
        ("▁b", -21.0),
    ])
}

#[test]
fn sentencepiece_merges_by_score_with_space_prefix_and_bos() {
    let v = spm_vocab();
    let tok = v.build().unwrap();
    assert_eq!(tok.model(), TokenizerModel::SentencePiece);
    assert_eq!(tok.pre_tokenizer(), None);
    // "el" (-1) first, then "▁H", "lo", "ello", "▁Hello": highest score wins at each step.
    assert_eq!(tok.encode("Hello world", true, false).unwrap(), [1, v.id("▁Hello"), v.id("▁world")]);
    assert_eq!(tok.encode("Hello world", false, false).unwrap(), [v.id("▁Hello"), v.id("▁world")]);
    // Decoding strips the prefix space of the first token; after a hidden BOS it is kept (llama.cpp).
    assert_eq!(tok.decode(&[v.id("▁Hello"), v.id("▁world")], true).unwrap(), "Hello world");
    assert_eq!(tok.decode(&[1, v.id("▁Hello"), v.id("▁world")], true).unwrap(), " Hello world");
    assert_eq!(tok.decode(&[1, v.id("▁Hello")], false).unwrap(), "<s> Hello");
    assert_eq!(tok.stop_tokens(), [2]);
}

#[test]
fn sentencepiece_falls_back_to_bytes() {
    let v = spm_vocab();
    let tok = v.build().unwrap();
    let ids = tok.encode("Hello é中", false, false).unwrap();
    let byte = |b: u8| v.id(&format!("<0x{b:02X}>"));
    let mut expected = vec![v.id("▁Hello"), v.id("▁")];
    expected.extend("é中".bytes().map(byte));
    assert_eq!(ids, expected);
    assert_eq!(tok.decode(&ids, false).unwrap(), "Hello é中");
    let mut stream = tok.stream_decoder(true);
    let streamed: Vec<String> = ids.iter().map(|&id| stream.push(id).unwrap()).collect();
    assert_eq!(streamed.concat(), " Hello é中");
}

#[test]
fn sentencepiece_space_prefix_after_special_tokens() {
    let v = spm_vocab();
    let tok = v.build().unwrap();
    // Text after a special token gets the space prefix again.
    assert_eq!(tok.encode("a</s>b", false, true).unwrap(), [v.id("▁a"), 2, v.id("▁b")]);
    assert_eq!(tok.encode("<s>a", false, true).unwrap(), [1, v.id("▁a")]);
    // Without the prefix, "Hello" has no "▁H" to start from.
    let mut v2 = spm_vocab();
    v2.set("tokenizer.ggml.add_space_prefix", false);
    let tok = v2.build().unwrap();
    assert_eq!(tok.encode("Hello", false, false).unwrap(), [v2.id("H"), v2.id("ello")]);
    assert_eq!(tok.decode(&[v2.id("▁a")], false).unwrap(), " a");
}
