//! `brink-agent gen-model`: write a synthetic model (deterministic random weights, a small real
//! BPE vocabulary) of a preset's shape, with any field overridden by a flag.

use std::path::PathBuf;
use std::process::ExitCode;

use brink_engine::synth::{self, Arch, Preset, QuantScheme, SynthError, SynthSpec};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct Args {
    /// Architecture (general.architecture); the generator writes qwen3moe.
    #[arg(long, value_parser = parse::<Arch>)]
    arch: Arch,
    /// The GGUF file to write.
    #[arg(long)]
    out: PathBuf,
    /// Starting shape: tiny, tiny-top8, demo or qwen3-30b-a3b.
    #[arg(long, default_value = "demo", value_parser = parse::<Preset>)]
    preset: Preset,
    /// Tensor type of the weight matrices: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K or k-mix
    /// (a Q4_K_M-like mix). Default: the preset's (q4_0 for qwen3-30b-a3b, else q8_0).
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
}

fn parse<T: std::str::FromStr<Err = SynthError>>(s: &str) -> Result<T, SynthError> {
    s.parse()
}

impl Args {
    fn spec(&self) -> SynthSpec {
        let mut spec = SynthSpec::from_preset(self.preset);
        let s = &mut spec.shape;
        s.layers = self.layers.unwrap_or(s.layers);
        s.hidden = self.hidden.unwrap_or(s.hidden);
        s.experts = self.experts.unwrap_or(s.experts);
        s.top_k = self.top_k.unwrap_or(s.top_k);
        s.expert_ffn = self.expert_ffn.unwrap_or(s.expert_ffn);
        s.heads = self.heads.unwrap_or(s.heads);
        s.kv_heads = self.kv_heads.unwrap_or(s.kv_heads);
        s.head_dim = self.head_dim.unwrap_or(s.head_dim);
        s.vocab = self.vocab.unwrap_or(s.vocab);
        s.context = self.context.unwrap_or(s.context);
        s.rope_theta = self.rope_theta.unwrap_or(s.rope_theta);
        s.rms_eps = self.rms_eps.unwrap_or(s.rms_eps);
        spec.scheme = self.ty.unwrap_or(spec.scheme);
        spec.seed = self.seed;
        spec
    }
}

pub fn run(args: Args) -> ExitCode {
    // The only architecture today; the match grows with the generator.
    let Arch::Qwen3Moe = args.arch;
    let spec = args.spec();
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
    // Only a large model is worth a bar; indicatif draws nothing when stderr is not a terminal.
    let mut bar: Option<ProgressBar> = None;
    let report = synth::generate(&spec, &args.out, |done, total| {
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
