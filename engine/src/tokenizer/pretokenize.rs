//! Pre-tokenizers of byte-level BPE vocabularies, chosen by `tokenizer.ggml.pre` exactly as
//! llama.cpp chooses them (src/llama-vocab.cpp, `LLAMA_VOCAB_PRE_TYPE_*`): the same names, the
//! same regexes applied in sequence, and the same per-name flags (`ignore_merges`,
//! `clean_spaces`, BOS by default).
//!
//! The regexes are llama.cpp's adapted forms, not the originals of the models' tokenizer.json:
//! llama.cpp rewrites `(?i:'s|...)` as `'[sS]|...` and GPT-4o's upper/lower-case letter classes
//! as look-aheads over "any letter but a-z", and matching its forms is what keeps our token ids
//! equal to llama.cpp's. Each regex splits every piece the previous one produced; the text between
//! matches is kept as pieces too (llama.cpp's `unicode_regex_split`, the `tokenizers` library's
//! `Isolated` behaviour). The pieces are then mapped byte by byte to GPT-2's printable characters.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{PreTokenizedString, PreTokenizer, SplitDelimiterBehavior};

/// How a `tokenizer.ggml.pre` value tokenizes.
#[derive(Debug)]
pub struct PreTokenizerSpec {
    /// The `tokenizer.ggml.pre` values that select this behaviour.
    pub names: &'static [&'static str],
    /// Applied in order, each to every piece of the previous split.
    pub regexes: &'static [&'static str],
    /// A whole piece that is itself a token is taken as that token, without merges (llama3, tekken).
    pub ignore_merges: bool,
    /// Decoding removes spaces before punctuation and some contractions (llama.cpp's `clean_spaces`).
    pub clean_spaces: bool,
    /// BOS is added unless `tokenizer.ggml.add_bos_token` says otherwise.
    pub add_bos: bool,
}

/// GPT-2's regex, as llama.cpp spells it (without the final `|\s+`, which its hand-written
/// splitter implements; unmatched whitespace becomes a piece of its own either way).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2/Qwen3: like llama3, but every digit is a piece of its own.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek-V3's third regex. llama.cpp evaluates `\p{P}`/`\p{S}` on ASCII through a table that
/// leaves out `~` (a math symbol), so `~` is neither punctuation nor symbol there; `[\p{S}--~]`
/// reproduces that, or our ids would differ from llama.cpp's on any text with a tilde.
const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}[\p{S}--~]]?[\p{L}\p{M}]+| ?[\p{P}[\p{S}--~]]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

/// GPT-4o / o200k (gpt-oss): upper-then-lower letter runs with an optional contraction.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's tekken.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";

const BAILINGMOE: &str =
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

const EXAONE_MOE: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";

const PUNCT_RUNS: &str = r"[\p{P}\$\+<=>\^~\|]+";

const fn spec(
    names: &'static [&'static str],
    regexes: &'static [&'static str],
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
) -> PreTokenizerSpec {
    PreTokenizerSpec { names, regexes, ignore_merges, clean_spaces, add_bos }
}

/// Every supported `tokenizer.ggml.pre`, grouped as llama.cpp groups them (a group sharing a
/// regex may differ in `clean_spaces`, so such names sit in separate rows).
pub static PRE_TOKENIZERS: &[PreTokenizerSpec] = &[
    spec(&["default"], &[PUNCT_RUNS, GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], true, false, false),
    spec(
        &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"],
        &[LLAMA3],
        true,
        true,
        true,
    ),
    spec(&["dbrx", "smaug-bpe"], &[LLAMA3], true, false, false),
    spec(
        &["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "a.x-4.0", "mellum", "exaone4", "mpt", "olmo", "jais"],
        &[GPT2],
        true,
        false,
        false,
    ),
    spec(&["trillion", "granite-docling"], &[GPT2], false, false, false),
    spec(&["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "grok-2"], &[QWEN2], false, false, false),
    spec(&["megrez", "stablelm2"], &[QWEN2], true, false, false),
    spec(&["qwen35"], &[QWEN35], false, false, false),
    spec(
        &["deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"],
        &[r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_WORDS],
        false,
        false,
        false,
    ),
    spec(&["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], &[GPT4O], false, false, false),
    spec(&["tekken"], &[TEKKEN], false, true, true),
    spec(&["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"], &[r"\p{N}", GPT2], true, false, false),
    spec(&["command-r", "smollm"], &[r"\p{N}", GPT2], false, false, false),
    spec(
        &["falcon"],
        &[PUNCT_RUNS, r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)", "[0-9][0-9][0-9]"],
        true,
        false,
        false,
    ),
    spec(&["seed-coder"], &[SEED_CODER], false, false, false),
    spec(&["bailingmoe", "bailingmoe2", "llada-moe"], &[BAILINGMOE], false, false, false),
    spec(&["exaone-moe"], &[EXAONE_MOE], false, false, false),
];

/// The `tokenizer.ggml.pre` llama.cpp assumes when the key is absent.
pub const DEFAULT_PRE: &str = "default";

pub fn find_pre_tokenizer(name: &str) -> Option<&'static PreTokenizerSpec> {
    PRE_TOKENIZERS.iter().find(|s| s.names.contains(&name))
}

pub fn supported_pre_tokenizers() -> Vec<&'static str> {
    PRE_TOKENIZERS.iter().flat_map(|s| s.names.iter().copied()).collect()
}

/// Hostile text (a megabyte of spaces) can make the look-ahead alternatives backtrack once per
/// character; the limit only turns a runaway match into an error instead of a hang.
const BACKTRACK_LIMIT: usize = 50_000_000;

/// The regex splits of a spec followed by the byte-to-character mapping, as a `tokenizers`
/// pre-tokenizer. Regex failures (backtrack limit) are errors, never a silently unsplit piece.
pub struct RegexByteLevel {
    regexes: Vec<fancy_regex::Regex>,
    byte_level: ByteLevel,
}

impl RegexByteLevel {
    /// Compiles the spec's regexes; `Err((pattern, message))` names the one that failed.
    pub fn new(spec: &PreTokenizerSpec) -> Result<Self, (&'static str, String)> {
        let regexes = spec
            .regexes
            .iter()
            .map(|&p| fancy_regex::RegexBuilder::new(p).backtrack_limit(BACKTRACK_LIMIT).build().map_err(|e| (p, e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        // The regexes above replace ByteLevel's own (GPT-2) split; it only maps bytes.
        Ok(RegexByteLevel { regexes, byte_level: ByteLevel::new(false, false, false) })
    }

    /// The pieces of `text` after the regex splits, before byte mapping (for tests and tools).
    pub fn split(&self, text: &str) -> tokenizers::Result<Vec<String>> {
        let mut pre = PreTokenizedString::from(text);
        self.split_all(&mut pre)?;
        Ok(pre
            .get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect())
    }

    fn split_all(&self, pre: &mut PreTokenizedString) -> tokenizers::Result<()> {
        for re in &self.regexes {
            // `tokenizers` implements its `Pattern` for fancy_regex with error propagation.
            pre.split(|_, piece| piece.split(re, SplitDelimiterBehavior::Isolated))?;
        }
        Ok(())
    }
}

impl PreTokenizer for RegexByteLevel {
    fn pre_tokenize(&self, pretokenized: &mut PreTokenizedString) -> tokenizers::Result<()> {
        self.split_all(pretokenized)?;
        self.byte_level.pre_tokenize(pretokenized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(name: &str, text: &str) -> Vec<String> {
        RegexByteLevel::new(find_pre_tokenizer(name).unwrap()).unwrap().split(text).unwrap()
    }

    #[test]
    fn every_spec_compiles_and_splits_losslessly() {
        let corpus = [
            "Hello, world! It's 2024-05-01 and I'VE got 1234567 apples.",
            "  leading\tand\ttrailing  \n\n\r\n  mixed   whitespace \u{3000}ideographic\u{00a0}nbsp ",
            "中文字符，日本語のテキスト、한국어 텍스트 and émojis 👍🏽👨‍👩‍👧 ~tilde~ $x^2$ |pipe|",
            "def f(x):\n    return x**2  # comment\n\n\n",
            "ÉTÉ café CAFÉ naïve 'quoted' \"double\" ’curly’ ١٢٣ ⅷ",
        ];
        let names = supported_pre_tokenizers();
        assert!(names.len() > 40, "{names:?}");
        for name in names {
            let pre = RegexByteLevel::new(find_pre_tokenizer(name).unwrap()).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            for text in corpus {
                let pieces = pre.split(text).unwrap();
                assert!(pieces.iter().all(|p| !p.is_empty()), "{name}: empty piece in {pieces:?}");
                assert_eq!(pieces.concat(), text, "{name}");
            }
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names = supported_pre_tokenizers();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn qwen2_splits_digits_one_by_one_and_keeps_contractions() {
        assert_eq!(split("qwen2", "I'm 12345 years"), ["I", "'m", " ", "1", "2", "3", "4", "5", " years"]);
        assert_eq!(split("qwen2", "DON'T stop"), ["DON", "'T", " stop"]);
        // Newline runs go with their preceding whitespace; trailing spaces before a word split off one.
        assert_eq!(split("qwen2", "a  \n\n  b   c"), ["a", "  \n\n", " ", " b", "  ", " c"]);
        assert_eq!(split("qwen2", "x!!\n\ny"), ["x", "!!\n\n", "y"]);
        assert_eq!(split("qwen2", "中文，测试"), ["中文", "，测试"]);
        assert_eq!(split("qwen2", "hi 👍🏽!"), ["hi", " 👍🏽!"]);
    }

    #[test]
    fn llama3_groups_three_digits_and_gpt2_keeps_numbers_whole() {
        assert_eq!(split("llama3", "1234567"), ["123", "456", "7"]);
        assert_eq!(split("gpt-2", "abc 1234567 def"), ["abc", " 1234567", " def"]);
        assert_eq!(split("gpt-2", "you're"), ["you", "'re"]);
        // GPT-2's contractions are case-sensitive; llama3's are not.
        assert_eq!(split("gpt-2", "YOU'RE"), ["YOU", "'", "RE"]);
        assert_eq!(split("llama3", "YOU'RE"), ["YOU", "'RE"]);
    }

    #[test]
    fn default_splits_punctuation_first_then_numbers_in_threes() {
        assert_eq!(split("default", "a,b 12345"), ["a", ",", "b", " ", "123", "45"]);
    }

    #[test]
    fn gpt4o_and_tekken_split_case_changes() {
        assert_eq!(split("gpt-4o", "HelloWORLDfoo it's"), ["Hello", "WORLDfoo", " it's"]);
        assert_eq!(split("tekken", "HelloWorld 12"), ["Hello", "World", " ", "1", "2"]);
    }

    #[test]
    fn deepseek_v3_treats_tilde_as_llama_cpp_does() {
        // `~` is neither punctuation nor symbol there, so it prefixes a word as a space would
        // (with Unicode's classes it would be a piece of its own: "~", "é").
        assert_eq!(split("deepseek-v3", "a ~é"), ["a", " ", "~é"]);
        assert_eq!(split("deepseek-v3", "a !é"), ["a", " !", "é"]);
        assert_eq!(split("deepseek-v3", "x $+y 12345 中文"), ["x", " $+", "y", " ", "123", "45", " ", "中文"]);
    }
}
