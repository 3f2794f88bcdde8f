//! `brink-agent bench`: prefill tokens/s at several prompt lengths and decode tokens/s (one
//! sequence and batches of sequences), as a table and JSON. With `--url` instead of `--model`:
//! a grid against a running server ([`crate::http_bench`]).
//!
//! Prompts are deterministic pseudo-random token ids (the numbers depend on lengths, not on
//! text). Every figure is wall time around calls that return logits to the host, so the GPU
//! work is finished when the clock stops. One untimed warm-up prefill compiles and loads
//! kernels, and each decode batch size gets an untimed warm-up of a few steps; then every
//! prefill and every decode is timed `--repeat` times and reported as the median with the
//! spread (standard deviation, min and max) beside it, since one run can be off by several
//! percent on the same machine.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use brink_api::sweep::outliers::median;
use brink_engine::backend::Logits;
use brink_engine::sampler::argmax;
use brink_engine::{AnyEngine, EngineOptions, StepItem, open};
use clap::{ArgGroup, Args as ClapArgs};
use serde_json::json;

use crate::cmd::flags::EngineArgs;
use crate::error::{Error, write_file};
use crate::http_bench::UrlArgs;

#[derive(ClapArgs)]
#[command(group(ArgGroup::new("target").args(["model", "url"]).required(true)))]
pub struct Args {
    /// In process: the model and backend to time (absent with --url).
    #[command(flatten)]
    engine: Option<EngineArgs>,
    #[command(flatten)]
    http: UrlArgs,
    /// Prompt lengths whose prefill is timed.
    #[arg(long, value_delimiter = ',', default_values_t = [512, 2048, 8192], conflicts_with = "url")]
    prompt_lengths: Vec<usize>,
    /// Generated tokens per decode measurement.
    #[arg(long, default_value_t = 128, conflicts_with = "url")]
    decode_tokens: usize,
    /// Concurrent sequences for the decode measurements (aggregate tokens/s).
    #[arg(long, value_delimiter = ',', default_values_t = [1], conflicts_with = "url")]
    sequences: Vec<usize>,
    /// Prompt length before decoding.
    #[arg(long, default_value_t = 128, conflicts_with = "url")]
    decode_context: usize,
    /// Timed repetitions of each prefill and each decode (the table shows their median).
    #[arg(long, default_value_t = 5, conflicts_with = "url")]
    repeat: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Row {
    test: String,
    tokens: usize,
    seconds: Vec<f64>,
}

impl Row {
    fn rates(&self) -> Vec<f64> {
        self.seconds.iter().map(|s| self.tokens as f64 / s).collect()
    }
    fn stats(&self) -> RateStats {
        RateStats::of(&self.rates())
    }
}

/// Tokens/s over a row's repetitions: the median is the figure, the rest its spread.
#[derive(Debug, PartialEq)]
struct RateStats {
    median: f64,
    mean: f64,
    /// Sample standard deviation (0 for one repetition).
    sd: f64,
    min: f64,
    max: f64,
}

impl RateStats {
    /// `rates` is not empty (`--repeat` is at least 1); the median is the sweeps' own.
    fn of(rates: &[f64]) -> RateStats {
        let mut sorted = rates.to_vec();
        let median = median(&mut sorted);
        let n = sorted.len();
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let sd = if n > 1 { (sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt() } else { 0.0 };
        RateStats { median, mean, sd, min: sorted[0], max: sorted[n - 1] }
    }
}

pub fn run(a: Args) -> ExitCode {
    let result = match (&a.http.url, &a.engine) {
        (Some(url), _) => crate::http_bench::bench(&a.http, url, a.json.as_deref()).map_err(Error::from),
        (None, Some(engine)) => bench(&a, engine),
        (None, None) => {
            Err(Error::Step("give --model FILE (time the engine in process) or --url http://HOST:PORT (benchmark a running server)".into()))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Deterministic prompt tokens in `[0, vocab)`.
fn prompt(len: usize, vocab: usize, salt: u64) -> Vec<u32> {
    (0..len as u64)
        .map(|i| {
            let mut x = (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 31;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn bench(a: &Args, engine: &EngineArgs) -> Result<(), Error> {
    for (flag, zero) in
        [("--prompt-lengths", a.prompt_lengths.contains(&0)), ("--sequences", a.sequences.contains(&0)), ("--repeat", a.repeat == 0)]
    {
        if zero {
            return Err(Error::Flag { flag, reason: "must be positive".into() });
        }
    }
    let max_prompt = a.prompt_lengths.iter().copied().max().unwrap_or(0);
    let slots = a.sequences.iter().copied().max().unwrap_or(1);
    let context = engine.context.max(max_prompt).max(a.decode_context + a.decode_tokens);
    let opts = EngineOptions {
        context,
        slots,
        prefill_chunk: engine.prefill_chunk,
        full_window_kv: engine.full_window_kv,
        ..EngineOptions::default()
    };
    let mut e = open(&engine.model, engine.backend.resolve(), opts).map_err(Error::engine("--model"))?;
    let vocab = e.config().vocab;
    let load = e.load_report();
    eprintln!(
        "loaded {} ({:.2} GiB of tensors) on {} in {:.2} s ({:.2} GB/s)",
        engine.model.display(),
        load.tensor_bytes as f64 / (1u64 << 30) as f64,
        e.backend_name(),
        load.seconds,
        load.tensor_bytes as f64 / 1e9 / load.seconds
    );
    e.prefill(0, 0, &prompt(16, vocab, 99), Logits::Last).map_err(Error::engine("the warm-up prefill"))?;
    let mut rows = Vec::new();
    for &len in &a.prompt_lengths {
        let p = prompt(len, vocab, len as u64);
        let mut seconds = Vec::new();
        for _ in 0..a.repeat {
            let t = Instant::now();
            e.prefill(0, 0, &p, Logits::Last).map_err(Error::engine(format!("prefill {len}")))?;
            seconds.push(t.elapsed().as_secs_f64());
        }
        rows.push(Row { test: format!("prefill {len}"), tokens: len, seconds });
    }
    for &s in &a.sequences {
        decode(e.as_mut(), s, a.decode_context, a.decode_tokens.min(DECODE_WARMUP_STEPS))?;
        let mut seconds = Vec::new();
        for _ in 0..a.repeat {
            seconds.push(decode(e.as_mut(), s, a.decode_context, a.decode_tokens)?);
        }
        let n = a.decode_tokens;
        let test = if s == 1 { format!("decode {n}") } else { format!("decode {n} x {s} seqs (aggregate)") };
        rows.push(Row { test, tokens: n * s, seconds });
    }
    print_table(&rows, e.backend_name());
    if let Some(path) = &a.json {
        let results: Vec<_> = rows
            .iter()
            .map(|r| {
                let st = r.stats();
                json!({
                    "test": r.test, "tokens": r.tokens, "seconds": r.seconds, "repetitions": r.seconds.len(),
                    "tokens_per_s": st.median, "tokens_per_s_mean": st.mean, "tokens_per_s_sd": st.sd,
                    "tokens_per_s_min": st.min, "tokens_per_s_max": st.max,
                })
            })
            .collect();
        let doc = json!({
            "model": engine.model, "backend": e.backend_name(), "prefill_chunk": opts.prefill_chunk,
            "load_seconds": load.seconds, "tensor_bytes": load.tensor_bytes, "results": results,
        });
        write_file(Some("--json"), path, "the results", &serde_json::to_string_pretty(&doc).unwrap_or_default())?;
    }
    Ok(())
}

/// Untimed decode steps before a batch size's timed repetitions.
const DECODE_WARMUP_STEPS: usize = 4;

/// Seconds of `n` greedy decode steps of `seqs` sequences at once, after an untimed
/// `context`-token prompt each (the same prompts every time, so repetitions do equal work).
fn decode(e: &mut dyn AnyEngine, seqs: usize, context: usize, n: usize) -> Result<f64, Error> {
    let vocab = e.config().vocab;
    let mut next = Vec::with_capacity(seqs);
    for s in 0..seqs {
        let logits = e
            .prefill(s as u32, 0, &prompt(context, vocab, 1000 + s as u64), Logits::Last)
            .map_err(Error::engine(format!("the {context}-token prompt of decode sequence {s}")))?;
        next.push(argmax(&logits));
    }
    let tables: Vec<Vec<u32>> = (0..seqs).map(|s| e.slot_blocks(s as u32)).collect();
    let t = Instant::now();
    for step in 0..n {
        let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let items: Vec<StepItem> = tokens
            .iter()
            .zip(&tables)
            .map(|(tok, blocks)| StepItem { blocks, start_pos: (context + step) as u32, tokens: tok, logits: Logits::Last })
            .collect();
        let logits = e.step(&items).map_err(Error::engine(format!("decode step {step} of {seqs} sequences")))?;
        next = logits.chunks_exact(vocab).map(argmax).collect();
    }
    Ok(t.elapsed().as_secs_f64())
}

fn print_table(rows: &[Row], backend: &str) {
    println!("{:<36} {:>12} {:>10} {:>10} {:>10}   ({backend}; median of each row's repetitions)", "test", "tokens/s", "+-", "min", "max");
    for r in rows {
        let st = r.stats();
        let sd = if r.seconds.len() > 1 { format!("{:.1}", st.sd) } else { "-".into() };
        println!("{:<36} {:>12.1} {:>10} {:>10.1} {:>10.1}", r.test, st.median, sd, st.min, st.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_and_spread_of_repetitions() {
        let odd = RateStats::of(&[30.0, 10.0, 20.0]);
        assert_eq!(odd, RateStats { median: 20.0, mean: 20.0, sd: 10.0, min: 10.0, max: 30.0 });
        let even = RateStats::of(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((even.median, even.min, even.max), (2.5, 1.0, 4.0));
        assert!((even.sd - (5.0f64 / 3.0).sqrt()).abs() < 1e-12);
        // An outlier moves the mean, not the median.
        let outlier = RateStats::of(&[100.0, 101.0, 99.0, 100.0, 10.0]);
        assert_eq!(outlier.median, 100.0);
        assert!(outlier.mean < 90.0);
        assert_eq!(RateStats::of(&[7.0]), RateStats { median: 7.0, mean: 7.0, sd: 0.0, min: 7.0, max: 7.0 });
    }

    fn parsed(flags: &[&str]) -> Args {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let argv = ["bench"].into_iter().chain(flags.iter().copied());
        <Cli as clap::Parser>::try_parse_from(argv).unwrap_or_else(|e| panic!("{flags:?}: {e}")).args
    }

    #[test]
    fn bad_counts_and_a_model_that_does_not_load_are_named() {
        for (flag, value) in [("--prompt-lengths", "512,0"), ("--sequences", "0"), ("--repeat", "0")] {
            let a = parsed(&["--model", "/nonexistent/model.gguf", "--backend", "cpu", flag, value]);
            let e = bench(&a, a.engine.as_ref().unwrap()).unwrap_err();
            assert!(matches!(e, Error::Flag { flag: f, .. } if f == flag), "{flag}: {e:?}");
            assert_eq!(e.to_string(), format!("{flag}: must be positive"));
        }
        let a = parsed(&["--model", "/nonexistent/model.gguf", "--backend", "cpu"]);
        let e = bench(&a, a.engine.as_ref().unwrap()).unwrap_err();
        assert!(matches!(e, Error::Engine { .. }), "{e:?}");
        assert!(e.to_string().starts_with("--model: /nonexistent/model.gguf"), "{e}");
    }

    #[test]
    fn rates_are_tokens_over_seconds() {
        let r = Row { test: "decode 4".into(), tokens: 8, seconds: vec![2.0, 4.0, 1.0] };
        assert_eq!(r.rates(), vec![4.0, 2.0, 8.0]);
        assert_eq!(r.stats().median, 4.0);
    }
}
