//! Synthetic models: valid `qwen3moe` and `gpt-oss` GGUF files of any shape and tensor type, with
//! deterministic random weights and a small real byte-level BPE vocabulary. Small ones serve the
//! tests and the demo; Qwen3-30B-A3B- and gpt-oss-20b/120b-shaped ones serve the benchmarks,
//! plans and memory fit.
//!
//! The same seed, shape and type always give the same bytes, whatever the number of threads.
//! Tensor data is drawn directly in each type's block format and streamed to the file, so a
//! 16 GiB model never sits in memory.
//!
//! - [`SynthSpec`]: what to generate (shape, type scheme, seed); [`SynthSpec::plan`] validates
//!   it and lays out the file; [`generate`] writes it. gpt-oss: [`gpt_oss::GptOssSpec`],
//!   [`gpt_oss::generate`].
//! - [`presets`]: named shapes (qwen3moe: `tiny`, `tiny-top8`, `demo`, `qwen3-30b-a3b`; gpt-oss:
//!   `tiny`, `gpt-oss-20b`, `gpt-oss-120b`).
//! - [`vocab`] and [`bpe`]: the tokenizer; [`weights`]: the block generators.

pub mod bpe;
mod error;
pub mod gpt_oss;
pub mod presets;
pub mod qwen3moe;
mod rng;
pub mod scheme;
mod stream;
pub mod vocab;
pub mod weights;

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::gguf::{GgufError, GgufWriter};

pub use error::{ShapeField, SynthError};
pub use gpt_oss::{GptOssShape, GptOssSpec};
pub use presets::{GptOssPreset, Preset};
pub use qwen3moe::{Init, Qwen3MoeShape, TensorPlan};
pub use rng::Rng;
pub use scheme::{Matrix, QuantScheme};
pub use stream::{CHUNK_VALUES, fill_chunk, tensor_bytes};
pub use vocab::Vocab;

/// Architectures the generator writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    Qwen3Moe,
    GptOss,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Qwen3Moe, Arch::GptOss];

    /// `general.architecture`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => qwen3moe::ARCH,
            Arch::GptOss => gpt_oss::ARCH,
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arch {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self, SynthError> {
        match s {
            qwen3moe::ARCH => Ok(Arch::Qwen3Moe),
            gpt_oss::ARCH => Ok(Arch::GptOss),
            _ => Err(SynthError::UnknownArch(s.to_string())),
        }
    }
}

/// Keys that mark a file as synthetic and say how to make it again.
pub const SEED_KEY: &str = "brink.synthetic.seed";
pub const PRESET_KEY: &str = "brink.synthetic.preset";

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    pub shape: Qwen3MoeShape,
    pub scheme: QuantScheme,
    pub seed: u64,
    /// The preset the shape started from (recorded in the file; flags may have changed it).
    pub preset: Preset,
}

/// A validated spec laid out as a GGUF file: metadata and tensor infos declared, data not yet
/// generated.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    pub writer: GgufWriter,
    pub tensors: Vec<TensorPlan>,
    pub seed: u64,
    pub vocab_tokens: usize,
    /// Normal (byte and merged) tokens.
    pub bpe_tokens: u32,
    pub merges: usize,
}

impl ModelPlan {
    pub fn params(&self) -> u64 {
        self.tensors.iter().map(TensorPlan::elements).sum()
    }

    /// Bytes of tensor data (without padding).
    pub fn data_bytes(&self) -> u64 {
        self.writer.tensors().iter().map(|t| t.size).sum()
    }

    /// The length of the file [`generate`] writes: the header and every tensor padded to the
    /// alignment. Computed from the plan alone (a 60 GB model's costs its header).
    pub fn file_bytes(&self) -> u64 {
        let align = self.writer.alignment();
        let data: u64 = self.writer.tensors().iter().map(|t| t.size.next_multiple_of(align)).sum();
        self.writer.header_bytes().len() as u64 + data
    }
}

impl SynthSpec {
    /// The preset's shape in its default type, seed 0.
    pub fn from_preset(preset: Preset) -> Self {
        SynthSpec { shape: preset.shape(), scheme: preset.default_scheme(), seed: 0, preset }
    }

    /// `general.name`: what the file is, readable in any GGUF viewer.
    pub fn model_name(&self) -> String {
        format!("brink synthetic qwen3moe ({} shape, {}, seed {})", self.preset, self.scheme, self.seed)
    }

    /// Validates the shape and the types, builds the vocabulary and declares every key and
    /// tensor. A tensor whose rows cannot be cut into its type's blocks is an error naming it.
    pub fn plan(&self) -> Result<ModelPlan, SynthError> {
        self.shape.validate()?;
        let tensors = self.shape.tensors(self.scheme);
        check_storable(&tensors, self.scheme, Qwen3MoeShape::row_fields)?;
        let vocab = Vocab::build(self.shape.vocab);
        declare(tensors, &vocab, self.seed, self.preset.name(), |w| self.shape.write_metadata(w, self.scheme, &self.model_name()))
    }
}

/// Checks that every tensor's rows cut into its type's blocks: one that cannot is an error naming
/// it and the shape fields (`row_fields`) its row length comes from.
fn check_storable(tensors: &[TensorPlan], scheme: QuantScheme, row_fields: fn(&str) -> &'static str) -> Result<(), SynthError> {
    for t in tensors {
        let ty = t.init.tensor_type();
        if !t.dims[0].is_multiple_of(ty.block_size() as u64) {
            return Err(SynthError::Unstorable {
                tensor: t.name.clone(),
                dims: t.dims.clone(),
                scheme,
                ty,
                row: t.dims[0],
                block: ty.block_size(),
                fields: row_fields(&t.name).to_string(),
            });
        }
    }
    Ok(())
}

/// Declares a model's keys (the architecture's through `write_metadata`, then the seed, the
/// preset and the vocabulary's) and its tensors.
fn declare(
    tensors: Vec<TensorPlan>,
    vocab: &Vocab,
    seed: u64,
    preset: &str,
    write_metadata: impl FnOnce(&mut GgufWriter) -> Result<(), GgufError>,
) -> Result<ModelPlan, SynthError> {
    let mut writer = GgufWriter::new();
    write_metadata(&mut writer)?;
    writer.set(SEED_KEY, seed)?;
    writer.set(PRESET_KEY, preset)?;
    vocab.write_metadata(&mut writer)?;
    for t in &tensors {
        writer.add_tensor(&t.name, &t.dims, t.init.tensor_type().ggml())?;
    }
    Ok(ModelPlan { writer, tensors, seed, vocab_tokens: vocab.len(), bpe_tokens: vocab.bpe_tokens, merges: vocab.merges.len() })
}

/// What [`generate`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub path: PathBuf,
    pub tensors: usize,
    pub params: u64,
    /// The file's length.
    pub bytes: u64,
    pub seconds: f64,
    pub vocab_tokens: usize,
    pub bpe_tokens: u32,
    pub merges: usize,
}

impl Report {
    /// File bytes per second, in MB (10^6).
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds.max(1e-9)
    }
}

/// Writes the model to `path` (through `path.partial`, renamed when complete, so an interrupted
/// run never leaves a file that looks finished). `progress(done, total)` gets tensor-data bytes.
pub fn generate(spec: &SynthSpec, path: &Path, progress: impl FnMut(u64, u64)) -> Result<Report, SynthError> {
    let start = Instant::now();
    write_plan(&spec.plan()?, path, start, progress)
}

/// Writes a planned model (any architecture) as [`generate`] describes; `start` is when the
/// work began, for the report's time.
pub(crate) fn write_plan(plan: &ModelPlan, path: &Path, start: Instant, mut progress: impl FnMut(u64, u64)) -> Result<Report, SynthError> {
    let total = plan.data_bytes();
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let io = |during, source| SynthError::Io { path: partial.clone(), during, source };

    let file = File::create(&partial).map_err(|e| io("creating the file", e))?;
    let written = (|| {
        let mut data = plan.writer.begin(BufWriter::with_capacity(8 << 20, file), path)?;
        stream::write_tensors(&mut data, &plan.tensors, plan.seed, &mut |done| progress(done, total))?;
        let file = data.finish()?.into_inner().map_err(|e| io("flushing", e.into_error()))?;
        file.metadata().map(|m| m.len()).map_err(|e| io("reading the length", e))
    })();
    let bytes = match written {
        Ok(bytes) => bytes,
        Err(e) => {
            // The partial file is useless; removing it is best effort, the error is the news.
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, path).map_err(|e| SynthError::Io {
        path: path.to_path_buf(),
        during: "renaming the finished file",
        source: e,
    })?;
    Ok(Report {
        path: path.to_path_buf(),
        tensors: plan.tensors.len(),
        params: plan.params(),
        bytes,
        seconds: start.elapsed().as_secs_f64(),
        vocab_tokens: plan.vocab_tokens,
        bpe_tokens: plan.bpe_tokens,
        merges: plan.merges,
    })
}
