//! Test-only scripted replies (the switch [`crate::test_switches::SCRIPT_REPLY`]): a synthetic
//! model's greedy output is random tokens, so a test that needs a reply in a given format (harmony
//! channels, a tool call) names a JSON file of `[{"when": ["needle", ...], "reply": "text"}]`. A
//! request whose prompt (detokenized, specials shown) contains every needle of an entry gets that
//! entry's reply, tokenized with specials parsed, as its generated tokens, one per step in place of
//! the sampled one; after the script (or with no entry matching) the model samples as usual. The
//! tokens go through the scheduler, stop tokens and reply parsing like sampled ones.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::Deserialize;

use crate::tokenizer::Tokenizer;

#[derive(Deserialize)]
struct Entry {
    when: Vec<String>,
    reply: String,
}

/// The scripted replies, tokenized.
pub struct Script {
    tokenizer: Arc<Tokenizer>,
    entries: Vec<(Vec<String>, Vec<u32>)>,
}

impl Script {
    /// The script the switch names, if it is set (and this build honours switches).
    pub fn from_switch(tokenizer: &Arc<Tokenizer>) -> Result<Option<Script>, String> {
        let Some(path) = crate::test_switches::get(crate::test_switches::SCRIPT_REPLY) else { return Ok(None) };
        let text = std::fs::read_to_string(path.trim()).map_err(|e| format!("{}: {path}: {e}", crate::test_switches::SCRIPT_REPLY))?;
        let script = Script::parse(tokenizer, &text).map_err(|e| format!("{}: {path}: {e}", crate::test_switches::SCRIPT_REPLY))?;
        eprintln!("brink serve: TEST-ONLY: {} scripted replies from {path}", script.entries.len());
        Ok(Some(script))
    }

    /// Parses the JSON list of entries and tokenizes each reply.
    pub fn parse(tokenizer: &Arc<Tokenizer>, json: &str) -> Result<Script, String> {
        let entries: Vec<Entry> = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let entries = entries
            .into_iter()
            .map(|e| Ok((e.when, tokenizer.encode(&e.reply, false, true).map_err(|e| e.to_string())?)))
            .collect::<Result<_, String>>()?;
        Ok(Script { tokenizer: tokenizer.clone(), entries })
    }

    /// The tokens to generate for `prompt`: the first entry all of whose needles it contains.
    pub fn reply_for(&self, prompt: &[u32]) -> VecDeque<u32> {
        let Ok(text) = self.tokenizer.decode(prompt, false) else { return VecDeque::new() };
        self.entries
            .iter()
            .find(|(when, _)| when.iter().all(|w| text.contains(w.as_str())))
            .map(|(_, reply)| reply.iter().copied().collect())
            .unwrap_or_default()
    }
}
