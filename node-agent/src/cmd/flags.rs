//! Flags shared by several commands: the engine flags of the commands that load a model
//! (`generate`, `bench`), the serving limits of those that qualify or serve (`serve`, `up`,
//! `run`, `sweep`), the engine's size of those that start one (`serve`, `up`, `sweep`), and the
//! backend choice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use brink_api::ServingParams;
use brink_engine::BackendKind;
use brink_engine::gguf::GgufFile;
use brink_engine::model::ModelConfig;
use brink_kernels::thresholds::ModelShape;
use clap::{Args, ValueEnum};

use crate::error::Error;

/// The serving limits, declared once for `serve`, `up`, `run` and `sweep` with one type and one
/// default each: `up`'s and `run`'s defaults must agree, so that a qualification `up` cached
/// (keyed by these limits) is reused by `run`.
#[derive(Args, Clone, Copy, Debug, PartialEq)]
pub struct ServingFlags {
    /// Most tokens in one forward pass (decodes plus prefill chunks); clamped to the validated envelope.
    #[arg(long, default_value_t = 8192, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batch_tokens: u64,
    /// Most prompt tokens of one sequence per forward pass (chunked prefill); clamped to the validated envelope.
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    pub prefill_chunk: u64,
    /// Seconds without engine progress during a step before it is a stall: the engine process is
    /// killed and restarted, the step's requests fail with 503, the queued ones run after.
    #[arg(long, default_value_t = 120.0, value_parser = positive_seconds)]
    pub stall_timeout: f64,
}

impl ServingFlags {
    /// The limits as a qualification keys them, with the context the command settled on and
    /// the KV layout it serves (`--full-window-kv`).
    pub fn params(&self, context: u64, full_window_kv: bool) -> ServingParams {
        ServingParams { max_batch_tokens: self.max_batch_tokens, prefill_chunk: self.prefill_chunk, context, full_window_kv }
    }

    pub fn stall_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.stall_timeout)
    }
}

/// The engine's size, declared once for `serve`, `up` and `sweep` (one type and default each).
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaFlags {
    /// KV positions per sequence (0: the model's trained context).
    #[arg(long, default_value_t = 0)]
    pub context: usize,
    /// Sequences generated at once (each holds a KV cache of --context positions).
    #[arg(long, default_value_t = 4)]
    pub slots: usize,
}

impl ReplicaFlags {
    /// The KV positions per sequence for a model trained for `trained` ([`context_for`]).
    pub fn context_for(&self, trained: usize) -> usize {
        context_for(self.context, trained)
    }
}

/// The KV positions per sequence: the `asked` context, unless it is 0 (not given) or more than
/// the model was trained for, which gets the trained context.
pub fn context_for(asked: usize, trained: usize) -> usize {
    if asked == 0 || asked > trained { trained } else { asked }
}

/// A value a seconds flag cannot take (clap names the flag).
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SecondsError {
    /// Zero, negative, infinite, not a number, or beyond what a `Duration` holds.
    #[error("{value}: expected a positive number of seconds")]
    NotPositive { value: String },
    #[error("{value}: {source}")]
    NotANumber {
        value: String,
        #[source]
        source: std::num::ParseFloatError,
    },
}

/// A positive, finite number of seconds (clap refuses anything else, exit 2, naming the flag).
fn positive_seconds(s: &str) -> Result<f64, SecondsError> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && Duration::try_from_secs_f64(v).is_ok() => Ok(v),
        Ok(_) => Err(SecondsError::NotPositive { value: s.into() }),
        Err(source) => Err(SecondsError::NotANumber { value: s.into(), source }),
    }
}

/// The KV layout of the commands that serve or compare a model (`serve`, `up`, `selftest
/// --model`, `parity`; `EngineArgs` has the same flag, since flattening this into a struct that
/// bench holds as an `Option` hides it from clap's presence check); `serve` and `up` run their
/// model-level test in the same layout.
#[derive(Args, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvLayoutFlags {
    /// Keep sliding-window layers' whole sequences in the KV cache instead of a ring of window
    /// blocks; more memory, for A/B and debugging.
    #[arg(long)]
    pub full_window_kv: bool,
}

#[derive(Args)]
pub struct EngineArgs {
    /// GGUF model file (the first part of a split model).
    #[arg(long)]
    pub model: PathBuf,
    /// Backend: auto takes cuda when a GPU is present, else cpu (and says which).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// KV positions per sequence (0: what the command needs).
    #[arg(long, default_value_t = 0)]
    pub context: usize,
    /// Most prompt tokens per forward pass (chunked prefill). Refused as `ServingFlags`'
    /// `--prefill-chunk` is (0 or not a count: a clap error naming the flag, exit 2), held as the
    /// `usize` the engine's options take.
    #[arg(long, default_value_t = 2048, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub prefill_chunk: usize,
    /// Keep sliding-window layers' whole sequences in the KV cache instead of a ring of window
    /// blocks; more memory, for A/B and debugging.
    #[arg(long)]
    pub full_window_kv: bool,
}

/// The configuration of the GGUF model a flag names, from its header (errors name the flag and
/// the file).
pub fn model_config(flag: &'static str, path: &Path) -> Result<ModelConfig, Error> {
    let file = GgufFile::open(path).map_err(|e| Error::content(Some(flag), path, e))?;
    brink_engine::arch::config(&file).map_err(|e| Error::content(Some(flag), path, e))
}

/// The kernels' shape class of the GGUF model a flag names, from its header (errors name the
/// flag and the file).
pub fn model_shape(flag: &'static str, path: &Path) -> Result<ModelShape, Error> {
    Ok(brink_engine::qualify::kernel_shape(&model_config(flag, path)?))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Auto,
    Cpu,
    Cuda,
}

impl BackendArg {
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendArg::Cpu => BackendKind::Cpu,
            BackendArg::Cuda => BackendKind::Cuda,
            BackendArg::Auto if brink_kernels::cuda::Gpu::open(0).is_ok() => BackendKind::Cuda,
            BackendArg::Auto => {
                eprintln!("no CUDA GPU found: using the cpu backend");
                BackendKind::Cpu
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serving: ServingFlags,
        #[command(flatten)]
        replica: ReplicaFlags,
    }

    #[test]
    fn the_replica_flags_and_the_context_a_model_gets() {
        let d = Cli::try_parse_from(["x"]).unwrap().replica;
        assert_eq!(d, ReplicaFlags { context: 0, slots: 4 });
        let r = Cli::try_parse_from(["x", "--context", "4096", "--slots", "2"]).unwrap().replica;
        assert_eq!(r, ReplicaFlags { context: 4096, slots: 2 });
        // Not given, within, and beyond the model's trained 32k.
        assert_eq!((d.context_for(32_768), r.context_for(32_768), r.context_for(2048)), (32_768, 4096, 2048));
        assert_eq!(context_for(32_769, 32_768), 32_768);
        for bad in [["--slots", "x"], ["--context", "1.5"]] {
            let e = Cli::try_parse_from(["x", bad[0], bad[1]]).err().unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert!(e.to_string().contains(bad[0]), "{bad:?}: {e}");
        }
    }

    #[test]
    fn defaults_and_refusals() {
        let d = Cli::try_parse_from(["x"]).unwrap().serving;
        assert_eq!((d.max_batch_tokens, d.prefill_chunk, d.stall_timeout), (8192, 2048, 120.0));
        assert_eq!(
            d.params(4096, false),
            ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 4096, full_window_kv: false }
        );
        let s = Cli::try_parse_from(["x", "--max-batch-tokens", "512", "--stall-timeout", "0.5"]).unwrap().serving;
        assert_eq!((s.max_batch_tokens, s.stall_timeout()), (512, Duration::from_millis(500)));
        for bad in [
            ["--max-batch-tokens", "0"],
            ["--prefill-chunk", "x1"],
            ["--stall-timeout", "0"],
            ["--stall-timeout", "inf"],
            ["--stall-timeout", "NaN"],
        ] {
            let e = Cli::try_parse_from(["x", bad[0], bad[1]]).err().unwrap_or_else(|| panic!("{bad:?} was accepted"));
            assert!(e.to_string().contains(bad[0]), "{bad:?}: {e}");
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
        assert!(matches!(positive_seconds("0"), Err(SecondsError::NotPositive { value }) if value == "0"));
        let e = positive_seconds("soon").unwrap_err();
        assert!(matches!(e, SecondsError::NotANumber { .. }) && e.to_string().starts_with("soon: "), "{e}");
    }

    #[derive(Parser)]
    struct EngineCli {
        #[command(flatten)]
        engine: EngineArgs,
    }

    #[test]
    fn the_engine_prefill_chunk_is_refused_as_the_serving_one_is() {
        let a = EngineCli::try_parse_from(["x", "--model", "m.gguf"]).unwrap().engine;
        assert_eq!((a.prefill_chunk, a.context, a.full_window_kv), (2048, 0, false));
        assert!(EngineCli::try_parse_from(["x", "--model", "m.gguf", "--full-window-kv"]).unwrap().engine.full_window_kv);
        let a = EngineCli::try_parse_from(["x", "--model", "m.gguf", "--prefill-chunk", "512"]).unwrap().engine;
        assert_eq!(a.prefill_chunk, 512);
        for bad in ["0", "-1", "x1", "1.5", "18446744073709551616"] {
            let flag = format!("--prefill-chunk={bad}");
            let e = EngineCli::try_parse_from(["x", "--model", "m.gguf", &flag])
                .err()
                .unwrap_or_else(|| panic!("--prefill-chunk {bad} was accepted"));
            assert_eq!(e.exit_code(), 2, "{bad}");
            let first = |e: &clap::Error| e.to_string().lines().next().unwrap_or_default().to_string();
            assert!(first(&e).contains("--prefill-chunk"), "{bad}: {e}");
            // Word for word the refusal `serve`, `up`, `run` and `sweep` give.
            let sibling = Cli::try_parse_from(["x", &flag]).err().unwrap_or_else(|| panic!("{bad} was accepted"));
            assert_eq!(first(&e), first(&sibling), "{bad}");
        }
    }
}
