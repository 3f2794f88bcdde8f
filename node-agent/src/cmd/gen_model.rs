//! `brink-agent gen-model`: write a synthetic model (deterministic random weights, a small real
//! BPE vocabulary) of a preset's shape, with any field overridden by a flag, in either
//! architecture the generator writes (qwen3moe, gpt-oss).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use brink_engine::synth::{self, Arch, GptOssPreset, GptOssSpec, Preset, QuantScheme, Report, SynthError, SynthSpec};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct Args {
    /// Architecture (general.architecture): qwen3moe or gpt-oss.
    #[arg(long, default_value = "qwen3moe", value_parser = parse::<Arch>)]
    arch: Arch,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
    /// Starting shape. qwen3moe: tiny, tiny-top8, demo (default) or qwen3-30b-a3b; gpt-oss: tiny
    /// (default), gpt-oss-20b or gpt-oss-120b.
    #[arg(long)]
    preset: Option<String>,
    /// Tensor type of the weight matrices: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K, mxfp4,
    /// k-mix (a Q4_K_M-like mix) or mxfp4-moe (MXFP4 experts, q8_0 elsewhere). Default: the
    /// preset's (q4_0 for qwen3-30b-a3b, mxfp4-moe for gpt-oss, else q8_0).
    #[arg(long = "type", value_name = "TYPE", value_parser = parse::<QuantScheme>)]
    ty: Option<QuantScheme>,
    /// Seed of the random weights: the same seed, shape and type give the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    layers: Option<u32>,
    /// embedding_length.
    #[arg(long)]
    hidden: Option<u64>,
    #[arg(long)]
    experts: Option<u32>,
    /// Experts used per token.
    #[arg(long)]
    top_k: Option<u32>,
    /// Each expert's intermediate width.
    #[arg(long)]
    expert_ffn: Option<u64>,
    /// Query heads.
    #[arg(long)]
    heads: Option<u32>,
    #[arg(long)]
    kv_heads: Option<u32>,
    #[arg(long)]
    head_dim: Option<u64>,
    /// Vocabulary size (tokens past the ~2,000 trained ones are [PAD] tokens).
    #[arg(long)]
    vocab: Option<u64>,
    /// context_length.
    #[arg(long)]
    context: Option<u32>,
    #[arg(long)]
    rope_theta: Option<f32>,
    #[arg(long)]
    rms_eps: Option<f32>,
    /// gpt-oss: the sliding window of the even layers (attention.sliding_window).
    #[arg(long)]
    sliding_window: Option<u32>,
    /// gpt-oss: YaRN's rope.scaling.factor.
    #[arg(long)]
    yarn_factor: Option<f32>,
    /// gpt-oss: YaRN's rope.scaling.original_context_length.
    #[arg(long)]
    yarn_original_context: Option<u32>,
}

/// What to write, in either architecture.
enum Spec {
    Qwen3Moe(SynthSpec),
    GptOss(GptOssSpec),
}

fn parse<T: std::str::FromStr<Err = SynthError>>(s: &str) -> Result<T, SynthError> {
    s.parse()
}

/// A flag the architecture has no field for, or a preset it does not have: a usage error naming
/// the flag and what it accepts.
fn usage(flag: &str, problem: impl std::fmt::Display) -> String {
    format!("{flag}: {problem}")
}

/// Sets each field qwen3moe's and gpt-oss's shapes share (`$shape`) that a flag of `$args`
/// gives; the preset's value stays where the flag is absent.
macro_rules! override_moe_fields {
    ($args:expr, $shape:expr) => {
        override_moe_fields!(@each $args, $shape;
            layers hidden experts top_k expert_ffn heads kv_heads head_dim vocab context rope_theta rms_eps)
    };
    (@each $args:expr, $shape:expr; $($field:ident)*) => {
        $($shape.$field = $args.$field.unwrap_or($shape.$field);)*
    };
}

impl Args {
    fn spec(&self) -> Result<Spec, String> {
        match self.arch {
            Arch::Qwen3Moe => {
                let only_gpt_oss = [
                    ("--sliding-window", self.sliding_window.is_some()),
                    ("--yarn-factor", self.yarn_factor.is_some()),
                    ("--yarn-original-context", self.yarn_original_context.is_some()),
                ];
                if let Some((flag, _)) = only_gpt_oss.iter().find(|(_, set)| *set) {
                    return Err(usage(flag, "only gpt-oss has it (--arch gpt-oss)"));
                }
                let preset: Preset = self.preset.as_deref().unwrap_or("demo").parse().map_err(|e| usage("--preset", e))?;
                Ok(Spec::Qwen3Moe(self.qwen3moe(preset)))
            }
            Arch::GptOss => {
                let preset: GptOssPreset = self.preset.as_deref().unwrap_or("tiny").parse().map_err(|e| usage("--preset", e))?;
                Ok(Spec::GptOss(self.gpt_oss(preset)))
            }
        }
    }

    fn gpt_oss(&self, preset: GptOssPreset) -> GptOssSpec {
        let mut spec = GptOssSpec::from_preset(preset);
        let s = &mut spec.shape;
        override_moe_fields!(self, s);
        s.sliding_window = self.sliding_window.unwrap_or(s.sliding_window);
        s.yarn_factor = self.yarn_factor.unwrap_or(s.yarn_factor);
        s.yarn_original_context = self.yarn_original_context.unwrap_or(s.yarn_original_context);
        spec.scheme = self.ty.unwrap_or(spec.scheme);
        spec.seed = self.seed;
        spec
    }

    fn qwen3moe(&self, preset: Preset) -> SynthSpec {
        let mut spec = SynthSpec::from_preset(preset);
        let s = &mut spec.shape;
        override_moe_fields!(self, s);
        spec.scheme = self.ty.unwrap_or(spec.scheme);
        spec.seed = self.seed;
        spec
    }
}

pub fn run(args: Args) -> ExitCode {
    let spec = match args.spec() {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match &spec {
        Spec::Qwen3Moe(spec) => {
            let s = &spec.shape;
            eprintln!(
                "generating {}: qwen3moe, {} layers, hidden {}, {} experts (top {}), expert width {}, heads {}/{} × {}, vocab {}, context {}, type {}, seed {}",
                args.out.display(),
                s.layers,
                s.hidden,
                s.experts,
                s.top_k,
                s.expert_ffn,
                s.heads,
                s.kv_heads,
                s.head_dim,
                s.vocab,
                s.context,
                spec.scheme,
                spec.seed
            );
            with_progress(&args.out, |path, progress| synth::generate(spec, path, progress))
        }
        Spec::GptOss(spec) => {
            let s = &spec.shape;
            eprintln!(
                "generating {}: gpt-oss, {} layers (window {} on even layers), hidden {}, {} experts (top {}), expert width {}, heads {}/{} × {}, vocab {}, context {} (YaRN ×{} over {}), type {}, seed {}",
                args.out.display(),
                s.layers,
                s.sliding_window,
                s.hidden,
                s.experts,
                s.top_k,
                s.expert_ffn,
                s.heads,
                s.kv_heads,
                s.head_dim,
                s.vocab,
                s.context,
                s.yarn_factor,
                s.yarn_original_context,
                spec.scheme,
                spec.seed
            );
            with_progress(&args.out, |path, progress| synth::gpt_oss::generate(spec, path, progress))
        }
    };
    report_outcome(report)
}

/// Runs `generate` with a progress bar for large models.
fn with_progress(
    out: &Path,
    generate: impl FnOnce(&Path, &mut dyn FnMut(u64, u64)) -> Result<Report, SynthError>,
) -> Result<Report, SynthError> {
    // Only a large model is worth a bar; indicatif draws nothing when stderr is not a terminal.
    let mut bar: Option<ProgressBar> = None;
    let report = generate(out, &mut |done, total| {
        if total < 256 << 20 {
            return;
        }
        let bar = bar.get_or_insert_with(|| {
            let style = ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}");
            ProgressBar::new(total).with_style(style.unwrap_or_else(|_| ProgressStyle::default_bar()))
        });
        bar.set_position(done);
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    report
}

fn report_outcome(report: Result<Report, SynthError>) -> ExitCode {
    match report {
        Ok(r) => {
            println!(
                "wrote {}: {} tensors, {} parameters, {} bytes ({:.1} MiB), vocabulary {} tokens ({} BPE, {} merges), in {:.2} s ({:.0} MB/s)",
                r.path.display(),
                r.tensors,
                r.params,
                r.bytes,
                r.bytes as f64 / (1u64 << 20) as f64,
                r.vocab_tokens,
                r.bpe_tokens,
                r.merges,
                r.seconds,
                r.mb_per_s()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(match e {
                SynthError::BadShape { .. } | SynthError::Unstorable { .. } => 2,
                _ => 1,
            })
        }
    }
}
