//! `brink-agent generate`: run a prompt through a GGUF model and print the continuation.

use std::path::PathBuf;
use std::process::ExitCode;

use brink_engine::gguf::GgufFile;
use brink_engine::sampler::SamplingParams;
use brink_engine::tokenizer::Tokenizer;
use brink_engine::{EngineOptions, GenerateParams, open};
use clap::Args as ClapArgs;
use serde_json::json;

use crate::cmd::flags::EngineArgs;
use crate::error::{Error, write_file};

#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    engine: EngineArgs,
    /// Prompt text (tokenized with the model's own tokenizer, special tokens parsed).
    #[arg(long, conflicts_with = "prompt_tokens")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids instead of text.
    #[arg(long, value_delimiter = ',')]
    prompt_tokens: Option<Vec<u32>>,
    /// Tokens to generate.
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Don't add BOS/EOS even if the vocabulary asks for them.
    #[arg(long)]
    no_special: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Write the logits of the last prompt position and of each generated position as JSON.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> ExitCode {
    match generate(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn generate(a: Args) -> Result<(), Error> {
    let model = &a.engine.model;
    // The GGUF reader's and the engine's errors name the file already.
    let bad_model = |e: &dyn std::fmt::Display| Error::Flag { flag: "--model", reason: e.to_string() };
    let file = GgufFile::open(model).map_err(|e| bad_model(&e))?;
    let tok = Tokenizer::from_gguf(file.metadata()).map_err(|e| Error::content(Some("--model"), model, format!("tokenizer: {e}")))?;
    drop(file);
    let prompt = match (&a.prompt, &a.prompt_tokens) {
        (Some(text), _) => {
            tok.encode(text, !a.no_special, true).map_err(|e| Error::Flag { flag: "--prompt", reason: format!("tokenizing: {e}") })?
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) => return Err(Error::Flag { flag: "--prompt", reason: "give --prompt TEXT or --prompt-tokens IDS".into() }),
    };
    let opts = EngineOptions {
        context: a.engine.context.max(prompt.len() + a.max_tokens),
        slots: 1,
        prefill_chunk: a.engine.prefill_chunk,
        full_window_kv: a.engine.full_window_kv,
        ..EngineOptions::default()
    };
    let mut engine = open(model, a.engine.backend.resolve(), opts).map_err(|e| bad_model(&e))?;
    let params = GenerateParams {
        max_tokens: a.max_tokens,
        sampling: SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed },
        stop_tokens: if a.ignore_eos { Vec::new() } else { tok.stop_tokens().to_vec() },
        record_logits: a.dump_logits.is_some(),
    };
    let g = engine.generate(0, &prompt, &params, &mut |_| true).map_err(|e| Error::Step(e.to_string()))?;
    let text = tok.decode(&g.tokens, false).map_err(|e| Error::Step(format!("decoding the output: {e}")))?;
    if let Some(path) = &a.dump_logits {
        let doc = json!({ "prompt_tokens": prompt, "tokens": g.tokens, "logits": g.logits });
        write_file(Some("--dump-logits"), path, "the logits", &doc.to_string())?;
    }
    let decode_tps = if g.decode_seconds > 0.0 { g.tokens.len().saturating_sub(1) as f64 / g.decode_seconds } else { 0.0 };
    if a.json {
        let doc = json!({
            "backend": engine.backend_name(), "prompt_tokens": prompt, "tokens": g.tokens, "text": text,
            "stop": format!("{:?}", g.stop), "prefill_seconds": g.prefill_seconds, "decode_seconds": g.decode_seconds,
        });
        println!("{doc}");
    } else {
        println!("prompt tokens ({}): {:?}", prompt.len(), prompt);
        println!("generated ({}, {:?}): {:?}", g.tokens.len(), g.stop, g.tokens);
        println!("text: {text}");
        eprintln!(
            "{} backend: prefill {} tokens in {:.3} s, decode {:.1} tokens/s",
            engine.backend_name(),
            prompt.len(),
            g.prefill_seconds,
            decode_tps
        );
    }
    Ok(())
}
