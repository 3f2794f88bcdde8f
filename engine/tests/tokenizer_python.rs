//! Cross-check with Hugging Face's Python `tokenizers` (pip install 'tokenizers==0.22.2'), the
//! reference the models' own tokenizer.json files run on. Python trains a byte-level BPE
//! vocabulary per pre-tokenizer (with the original regexes of Qwen2/3, Llama 3, GPT-2 and
//! DeepSeek-V3 as their tokenizer.json files spell them, matched by Oniguruma), writes it out,
//! and encodes a corpus of tricky strings; we write the same vocabulary to a GGUF file, build our
//! tokenizer from it (llama.cpp's adapted regexes, fancy-regex) and must give the same ids.
//!
//! Skipped with a message when python3 or the package is missing, unless BRINK_REQUIRE_PY=1
//! (as scripts/test sets), where that is a failure.

mod tokenizer_common;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value as Json, json};
use tokenizer_common::*;

const SCRIPT: &str = r#"
import json, sys
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, trainers

req = json.load(sys.stdin)
out = {}
for cfg in req["configs"]:
    if cfg["regexes"]:
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in cfg["regexes"]]
        pre = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=req["vocab_size"], special_tokens=req["special"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(req["train"], trainer)
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else m[0] + " " + m[1] for m in model["merges"]]
    vocab = model["vocab"]
    tok.model = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=cfg["ignore_merges"])
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    ids = [tok.encode(t, add_special_tokens=False).ids for t in cfg["texts"]]
    out[cfg["name"]] = {"tokens": tokens, "merges": merges, "ids": ids}
json.dump(out, sys.stdout)
"#;

fn have_py_tokenizers() -> bool {
    let ok = Command::new("python3").args(["-c", "import tokenizers"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with the `tokenizers` package (pip install 'tokenizers==0.22.2') is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the tokenizers cross-check: {msg}");
    }
    ok
}

fn run_python(request: &Json) -> Json {
    let mut child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python3");
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("python printed JSON")
}

/// Hand-picked strings that exercise each regex branch.
const CURATED: &[&str] = &[
    "Hello world",
    "I'm here, you're there; they'll go. We'd've? It's DON'T I'M YOU'RE O'Neil",
    "numbers 1 12 123 1234 12345 1234567890 3.14159 -42 +7 1e10 0x1F",
    "  two leading spaces, trailing spaces   ",
    "tabs\tand\t\tmore\ttabs \t mixed",
    "newlines\n\nand\r\nCRLF\r\n\r\nand trailing\n",
    "\n\n\n   \n  \t\n",
    "   ",
    "a",
    "中文分词测试，标点符号！还有数字123和English混合",
    "日本語のひらがなとカタカナ、漢字。",
    "한국어 텍스트입니다",
    "emoji 👍👍🏽 👨‍👩‍👧‍👦 🇯🇵 ❤️ and text",
    "combining: e\u{301}te\u{301} and precomposed été",
    "हिन्दी भाषा",
    "العربية ٣٤٥",
    "Ⅷ ½ ² superscripts and roman numerals",
    "code: fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); }",
    "path/to/file.rs:42:7 https://example.com/a?b=c&d=e#frag",
    "!!!??? ... ,,, ;;; ::: --- ___ *** ### $$$ %%% ^^^ &&& |||",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "mixed<|endoftext|>tokens<|im_end|>",
    "\u{a0}nbsp\u{3000}ideographic\u{2028}linesep",
    "ALLCAPS lowercase MixedCase camelCaseWord snake_case_word",
];

/// Pieces random strings are made of.
const ATOMS: &[&str] = &[
    "a",
    "Z",
    "é",
    "É",
    "ß",
    "中",
    "文",
    "日",
    "한",
    "👍",
    "🏽",
    "\u{200d}",
    "👨",
    "1",
    "2",
    "9",
    "٣",
    "Ⅷ",
    "½",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\u{a0}",
    "\u{3000}",
    "'",
    "'s",
    "'T",
    "'ll",
    "'re",
    "!",
    "?",
    ".",
    ",",
    "-",
    "_",
    "$",
    "+",
    "<",
    ">",
    "(",
    ")",
    "\"",
    "\\",
    "/",
    "#",
    "\u{301}",
    "hello",
    "World",
    "DON'T",
    "it's",
    "the",
    " the",
    "<|im_start|>",
    "<|im_end|>",
    "~",
];

fn random_strings(count: usize, seed: u64, exclude: &[&str]) -> Vec<String> {
    let atoms: Vec<&str> = ATOMS.iter().copied().filter(|a| !exclude.iter().any(|e| a.contains(e))).collect();
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    (0..count)
        .map(|_| {
            let len = 1 + next() % 14;
            (0..len).map(|_| atoms[(next() % atoms.len() as u64) as usize]).collect()
        })
        .collect()
}

struct Config {
    name: &'static str,
    /// The regexes of the model's tokenizer.json; empty means ByteLevel's own GPT-2 regex.
    hf_regexes: &'static [&'static str],
    ignore_merges: bool,
    /// Text llama.cpp (and so we) split differently from the original regex on purpose.
    exclude: &'static [&'static str],
}

const CONFIGS: &[Config] = &[
    Config {
        name: "qwen2",
        hf_regexes: &[r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
        ignore_merges: false,
        exclude: &[],
    },
    Config {
        name: "llama3",
        hf_regexes: &[
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
        ignore_merges: true,
        exclude: &[],
    },
    Config { name: "gpt-2", hf_regexes: &[], ignore_merges: false, exclude: &[] },
    Config {
        name: "deepseek-v3",
        hf_regexes: &[
            r"\p{N}{1,3}",
            r"[一-龥぀-ゟ゠-ヿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
        ],
        ignore_merges: false,
        // llama.cpp treats `~` as neither punctuation nor symbol (see pretokenize.rs).
        exclude: &["~"],
    },
];

const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

#[test]
fn byte_level_bpe_matches_hugging_face_tokenizers() {
    if !have_py_tokenizers() {
        return;
    }
    let mut train: Vec<String> = CURATED.iter().map(|s| s.to_string()).collect();
    let prose = "The quick brown fox jumps over the lazy dog. It's what they'd've done, isn't it? \
                 Tokenizers split text into pieces, then merge bytes into tokens by rank. 1234 5678.\n";
    train.extend(std::iter::repeat_n(prose.to_string(), 20));
    train.extend(random_strings(300, 7, &[]));

    let configs: Vec<Json> = CONFIGS
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut texts: Vec<String> =
                CURATED.iter().map(|s| s.to_string()).filter(|s| !c.exclude.iter().any(|e| s.contains(e))).collect();
            texts.extend(random_strings(400, 1000 + i as u64, c.exclude));
            json!({"name": c.name, "regexes": c.hf_regexes, "ignore_merges": c.ignore_merges, "texts": texts})
        })
        .collect();
    let request = json!({"configs": configs, "train": train, "vocab_size": 1200, "special": SPECIAL});
    let reply = run_python(&request);

    let mut compared = 0;
    let mut failures = Vec::new();
    for (config, c) in configs.iter().zip(CONFIGS) {
        let r = &reply[c.name];
        let tokens: Vec<String> = serde_json::from_value(r["tokens"].clone()).unwrap();
        let mut v = VocabSpec { model: "gpt2".into(), ..Default::default() };
        for t in &tokens {
            v.push(t, if SPECIAL.contains(&t.as_str()) { CONTROL } else { NORMAL }, 0.0);
        }
        v.merges = serde_json::from_value(r["merges"].clone()).unwrap();
        assert!(v.merges.len() > 500, "{}: only {} merges were learnt", c.name, v.merges.len());
        let eos = v.id("<|im_end|>");
        v.set("tokenizer.ggml.pre", c.name).set("tokenizer.ggml.eos_token_id", eos);
        let tok = v.build().unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let texts = config["texts"].as_array().unwrap();
        let expected = r["ids"].as_array().unwrap();
        for (text, want) in texts.iter().zip(expected) {
            let text = text.as_str().unwrap();
            let want: Vec<u32> = serde_json::from_value(want.clone()).unwrap();
            let got = tok.encode(text, false, true).unwrap();
            compared += 1;
            if got != want {
                let show = |ids: &[u32]| ids.iter().map(|&i| tok.token_text(i).unwrap_or("?").to_string()).collect::<Vec<_>>();
                failures.push(format!("{}: {text:?}\n  python: {:?}\n  ours:   {:?}", c.name, show(&want), show(&got)));
            }
            // Byte-level decoding gives back the text exactly (unless llama.cpp's space clean-up applies).
            if !tok.flags().clean_spaces {
                assert_eq!(tok.decode(&got, false).unwrap(), text, "{}", c.name);
            }
        }
    }
    eprintln!("compared {compared} encodings with Python tokenizers, {} differ", failures.len());
    assert!(failures.is_empty(), "{} of {compared} encodings differ:\n{}", failures.len(), failures.join("\n"));
    assert!(compared > 1500);
}
