//! `brink-agent parity`: run the same batches through two backends (by default the CPU
//! reference and CUDA) on one model and compare every logit row, then a greedy decode.
//!
//! A case is one forward pass holding one or more sequences (`8192` or `4096+4096`), each in its
//! own KV slot, so the token counts where kernels break (grid limits, 2^31 products, partial
//! tiles) are reached by a real model, not only by the kernel self-test. With `--chunk N` each
//! case is prefilled N positions at a time instead (every sequence's next chunk in one step), so
//! chunk edges fall inside attention windows and the windowed layers' KV rings wrap (a ring holds
//! the window plus one chunk, far less than the context).

use std::path::PathBuf;
use std::process::ExitCode;

use brink_engine::backend::Logits;
use brink_engine::parity::{LogitDiff, compare};

use brink_engine::{AnyEngine, EngineOptions, GenerateParams, StepItem, open};
use clap::Args as ClapArgs;
use serde_json::json;

use crate::cmd::flags::{BackendArg, KvLayoutFlags};
use crate::error::{Error, write_file};

#[derive(ClapArgs)]
pub struct Args {
    #[arg(long)]
    model: PathBuf,
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    reference: BackendArg,
    #[arg(long, value_enum, default_value_t = BackendArg::Cuda)]
    candidate: BackendArg,
    /// Cases separated by commas; the sequences of one case joined by '+'.
    #[arg(long, value_delimiter = ',', default_values_t = default_cases())]
    cases: Vec<String>,
    /// Prefill each case in chunks of this many positions (0: each case in one step).
    #[arg(long, default_value_t = 0)]
    chunk: usize,
    /// Greedy decode steps compared after the first case's prefill.
    #[arg(long, default_value_t = 16)]
    decode_steps: usize,
    #[command(flatten)]
    kv: KvLayoutFlags,
    /// Largest median row error accepted. The backends round differently on purpose (the CPU
    /// reference quantizes activations as llama.cpp's CPU backend does, to q8_0/q8_K with f16
    /// attention probabilities; CUDA as llama.cpp's CUDA backend does, to q8_1 with its sum in
    /// f16 and f32 attention), which moves typical rows by ~1e-3..1e-2.
    #[arg(long, default_value_t = 2e-2)]
    tolerance: f64,
    /// Largest error accepted on any row. A near-tie in the router's top-k can send one token
    /// to another expert and move its row by ~0.1–0.3; garbage, a dropped tile or NaN moves it
    /// by O(1) or more.
    #[arg(long, default_value_t = 1.0)]
    max_row_error: f64,
    /// Largest fraction of rows whose argmax may differ.
    #[arg(long, default_value_t = 0.1)]
    max_argmax_mismatch: f64,
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Tile edges, the edges of a 128-token attention window and of the second one (gpt-oss's), the
/// 8192 envelope, and batches of several sequences.
fn default_cases() -> Vec<String> {
    [
        "1",
        "63",
        "64",
        "65",
        "127",
        "128",
        "129",
        "255",
        "256",
        "257",
        "1000",
        "8191",
        "8192",
        "8193",
        "4096+4096",
        "3000+5000+192",
        "2731+2731+2730",
    ]
    .map(String::from)
    .to_vec()
}

fn parse_case(s: &str) -> Result<Vec<usize>, Error> {
    s.split('+')
        .map(|n| {
            n.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| Error::Flag { flag: "--cases", reason: format!("bad sequence length {n:?} in {s:?}") })
        })
        .collect()
}

pub fn run(a: Args) -> ExitCode {
    match parity(a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Deterministic tokens for sequence `seq` of a case.
fn tokens(len: usize, vocab: usize, seq: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7919 + seq * 104_729 + 13) % vocab) as u32).collect()
}

/// The steps that prefill sequences of `lens` in chunks of `chunk` positions (0: whole): step i
/// holds, for every sequence still longer than `i · chunk`, its positions `[start, end)`.
fn chunk_steps(lens: &[usize], chunk: usize) -> Vec<Vec<(usize, usize, usize)>> {
    let longest = lens.iter().copied().max().unwrap_or(0);
    let chunk = if chunk == 0 { longest.max(1) } else { chunk };
    (0..longest)
        .step_by(chunk)
        .map(|start| lens.iter().enumerate().filter(|&(_, &n)| n > start).map(|(s, &n)| (s, start, n.min(start + chunk))).collect())
        .collect()
}

/// The logits of a case's rows (every row, or each sequence's last), prefilled as
/// [`chunk_steps`] says, in the order the steps return them (the same on both backends).
fn run_case(e: &mut dyn AnyEngine, lens: &[usize], all_rows: bool, chunk: usize) -> Result<Vec<f32>, Error> {
    let vocab = e.config().vocab;
    let toks: Vec<Vec<u32>> = lens.iter().enumerate().map(|(s, &n)| tokens(n, vocab, s)).collect();
    let tables: Vec<Vec<u32>> = (0..toks.len()).map(|s| e.slot_blocks(s as u32)).collect();
    let mut out = Vec::new();
    for step in chunk_steps(lens, chunk) {
        let items: Vec<StepItem> = step
            .iter()
            .map(|&(s, start, end)| {
                let logits = match (all_rows, end == lens[s]) {
                    (true, _) => Logits::All,
                    (false, true) => Logits::Last,
                    (false, false) => Logits::None,
                };
                StepItem { blocks: &tables[s], start_pos: start as u32, tokens: &toks[s][start..end], logits }
            })
            .collect();
        let what = format!("{} backend, case {lens:?}, positions from {}", e.backend_name(), step[0].1);
        out.extend(e.step(&items).map_err(Error::engine(what))?);
    }
    Ok(out)
}

fn parity(a: Args) -> Result<bool, Error> {
    let cases: Vec<Vec<usize>> = a.cases.iter().map(|c| parse_case(c)).collect::<Result<_, _>>()?;
    let slots = cases.iter().map(Vec::len).max().unwrap_or(1);
    let longest = cases.iter().flatten().copied().max().unwrap_or(1);
    let chunk = if a.chunk == 0 { longest } else { a.chunk.min(longest) };
    let opts = EngineOptions {
        context: longest + a.decode_steps + 1,
        slots,
        prefill_chunk: chunk,
        full_window_kv: a.kv.full_window_kv,
        ..EngineOptions::default()
    };
    let mut reference = open(&a.model, a.reference.resolve(), opts).map_err(Error::engine("--reference"))?;
    let mut candidate = open(&a.model, a.candidate.resolve(), opts).map_err(Error::engine("--candidate"))?;
    let vocab = reference.config().vocab;
    println!(
        "{:<18} {:>6} {:>10} {:>10} {:>10} {:>7} {:>9}  ({} against {})",
        "case",
        "rows",
        "median err",
        "p99 err",
        "max err",
        "worst",
        "argmax ≠",
        candidate.backend_name(),
        reference.backend_name()
    );
    let mut ok = true;
    let mut report = Vec::new();
    for lens in &cases {
        let total: usize = lens.iter().sum();
        // Every row when it fits in ~1 GiB of logits per backend, else each sequence's last.
        let all_rows = total * vocab <= 1 << 28;
        let r = run_case(reference.as_mut(), lens, all_rows, a.chunk)?;
        let c = run_case(candidate.as_mut(), lens, all_rows, a.chunk)?;
        let d = compare(&c, &r, vocab)
            .ok_or_else(|| Error::Step(format!("case {lens:?}: the backends returned logits of different shapes")))?;
        let pass = d.non_finite_rows == 0
            && d.median_rel_err <= a.tolerance
            && d.max_rel_err <= a.max_row_error
            && d.argmax_mismatches as f64 <= a.max_argmax_mismatch * d.rows as f64;
        ok &= pass;
        let name = lens.iter().map(usize::to_string).collect::<Vec<_>>().join("+");
        println!(
            "{:<18} {:>6} {:>10.2e} {:>10.2e} {:>10.2e} {:>7} {:>9}  {}",
            name,
            d.rows,
            d.median_rel_err,
            d.p99_rel_err,
            d.max_rel_err,
            d.worst_row,
            d.argmax_mismatches,
            if pass { "ok" } else { "FAIL" }
        );
        report.push(case_json(&name, &d, pass));
    }
    let (same, steps) = decode(reference.as_mut(), candidate.as_mut(), a.decode_steps)?;
    // Reported, not judged: once a near-tie sends the two backends to different tokens, the
    // continuations part for good, bug or not; the logit rows above are the measure.
    println!("greedy decode: {same} of {steps} tokens identical");
    if let Some(path) = &a.json {
        let doc = json!({ "model": a.model, "tolerance": a.tolerance, "maxRowError": a.max_row_error, "cases": report,
                          "decode_identical": same, "decode_steps": steps });
        write_file(Some("--json"), path, "the report", &doc.to_string())?;
    }
    println!("verdict: {}", if ok { "PASS" } else { "FAIL" });
    Ok(ok)
}

fn case_json(name: &str, d: &LogitDiff, pass: bool) -> serde_json::Value {
    json!({ "case": name, "rows": d.rows, "maxRelErr": d.max_rel_err, "medianRelErr": d.median_rel_err, "p99RelErr": d.p99_rel_err, "worstRow": d.worst_row,
            "argmaxMismatches": d.argmax_mismatches, "nonFiniteRows": d.non_finite_rows, "pass": pass })
}

/// Greedy continuations of one prompt on both backends: how many leading tokens agree.
fn decode(r: &mut dyn AnyEngine, c: &mut dyn AnyEngine, steps: usize) -> Result<(usize, usize), Error> {
    let vocab = r.config().vocab;
    let prompt = tokens(100, vocab, 7);
    let p = GenerateParams { max_tokens: steps, sampling: Default::default(), stop_tokens: Vec::new(), record_logits: false };
    let gr =
        r.generate(0, &prompt, &p, &mut |_| true).map_err(Error::engine(format!("greedy decode on the {} backend", r.backend_name())))?;
    let gc =
        c.generate(0, &prompt, &p, &mut |_| true).map_err(Error::engine(format!("greedy decode on the {} backend", c.backend_name())))?;
    let same = gr.tokens.iter().zip(&gc.tokens).take_while(|(a, b)| a == b).count();
    Ok((same, steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_parse_and_bad_ones_name_the_flag() {
        assert_eq!(parse_case("4096+4096").unwrap(), [4096, 4096]);
        assert_eq!(parse_case(" 7 ").unwrap(), [7]);
        for bad in ["0", "4096+", "x", "1+-2"] {
            let e = parse_case(bad).unwrap_err();
            assert!(matches!(e, Error::Flag { flag: "--cases", .. }), "{bad}: {e:?}");
            assert!(e.to_string().starts_with("--cases: bad sequence length"), "{bad}: {e}");
        }
    }

    #[test]
    fn chunked_steps_cover_every_position_once_in_order() {
        assert_eq!(chunk_steps(&[5], 0), vec![vec![(0, 0, 5)]]);
        assert_eq!(chunk_steps(&[5, 3], 2), vec![vec![(0, 0, 2), (1, 0, 2)], vec![(0, 2, 4), (1, 2, 3)], vec![(0, 4, 5)]]);
        for (lens, chunk) in [(vec![129usize], 40usize), (vec![100, 160, 1], 7), (vec![256, 256], 128)] {
            let mut next = vec![0; lens.len()];
            for step in chunk_steps(&lens, chunk) {
                for (s, start, end) in step {
                    assert_eq!(start, next[s], "{lens:?} / {chunk}");
                    assert!(end > start && end - start <= chunk);
                    next[s] = end;
                }
            }
            assert_eq!(next, lens);
        }
    }

    /// The tiny gpt-oss through `parity` on two CPU engines, prefilled in chunks of 40 positions:
    /// chunk edges inside the 128-token window, its KV rings wrapping, several sequences a step.
    /// Equal engines agree exactly; the run proves the chunked path end to end without a GPU.
    #[test]
    fn a_chunked_run_on_a_windowed_model_agrees_with_itself() {
        use brink_engine::synth::{GptOssPreset, GptOssSpec, gpt_oss};
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny-gpt-oss.gguf");
        gpt_oss::generate(&GptOssSpec::from_preset(GptOssPreset::Tiny), &model, |_, _| {}).unwrap();
        let json = dir.path().join("parity.json");
        let argv = [
            "parity",
            "--model",
            model.to_str().unwrap(),
            "--candidate",
            "cpu",
            "--chunk",
            "40",
            "--cases",
            "129,300+257",
            "--decode-steps",
            "4",
        ];
        let mut a = <Cli as clap::Parser>::try_parse_from(argv).unwrap().args;
        a.json = Some(json.clone());
        assert!(parity(a).unwrap());
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert_eq!(doc["cases"].as_array().unwrap().len(), 2);
        assert_eq!(doc["cases"][1]["rows"], 557, "every row of both sequences");
        assert_eq!(doc["cases"][1]["maxRelErr"], 0.0);
    }

    #[test]
    fn a_model_that_does_not_load_names_the_backend_flag() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let a = <Cli as clap::Parser>::try_parse_from(["parity", "--model", "/nonexistent/model.gguf", "--cases", "1"]).unwrap().args;
        let e = parity(a).unwrap_err();
        assert!(matches!(e, Error::Engine { .. }), "{e:?}");
        assert!(e.to_string().starts_with("--reference: "), "{e}");
        assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
    }
}
