//! Model architectures, registered by `general.architecture`: one file each (`qwen3moe`,
//! `gpt-oss`), each a `config` reader that maps GGUF keys to the per-layer spec list
//! ([`crate::model::LayerSpec`]) and a `load` that shape-checks every tensor; the graph is the
//! shared decoder's ([`decoder`]), driven by the specs.

pub mod decoder;
pub mod gpt_oss;
mod moe_keys;
pub mod qwen3moe;

use crate::backend::{Backend, Batch, WeightRole};
use crate::gguf::GgufFile;
use crate::model::{BackendError, HostTensor, ModelConfig, ModelError};

/// A model loaded onto a backend.
pub trait Loaded<B: Backend> {
    fn config(&self) -> &ModelConfig;
    /// Runs `batch` through the model, filling the KV cache at its positions; returns the
    /// logits of `batch.logit_rows`, `[rows, vocab]`.
    fn forward(&self, b: &mut B, batch: &Batch) -> Result<Vec<f32>, BackendError>;
}

/// Architectures brink can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Qwen3Moe,
    GptOss,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Qwen3Moe, Arch::GptOss];

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Qwen3Moe => qwen3moe::ARCH,
            Arch::GptOss => gpt_oss::ARCH,
        }
    }

    /// The architecture of the model in `file`, or an error naming what it is instead.
    pub fn of(file: &GgufFile) -> Result<Arch, ModelError> {
        let arch = file.architecture()?;
        Arch::ALL.into_iter().find(|a| a.name() == arch).ok_or_else(|| ModelError::UnsupportedArchitecture {
            path: file.path().to_path_buf(),
            arch: arch.to_string(),
            supported: Arch::ALL.iter().map(|a| a.name()).collect(),
        })
    }
}

/// The hyperparameters of the model in `file`, or a clear error for an unsupported
/// architecture or a missing/inconsistent key.
pub fn config(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    match Arch::of(file)? {
        Arch::Qwen3Moe => qwen3moe::config(file),
        Arch::GptOss => gpt_oss::config(file),
    }
}

/// Loads the model in `file` onto `backend`.
pub fn load<B: Backend + 'static>(file: &GgufFile, backend: &mut B) -> Result<Box<dyn Loaded<B>>, ModelError> {
    match Arch::of(file)? {
        Arch::Qwen3Moe => {
            let config = qwen3moe::config(file)?;
            Ok(Box::new(qwen3moe::load(file, config, backend)?))
        }
        Arch::GptOss => {
            let config = gpt_oss::config(file)?;
            Ok(Box::new(gpt_oss::load(file, config, backend)?))
        }
    }
}

/// Refuses a tensor whose type the backend cannot compute with in `role`, naming both.
pub(crate) fn check_type<B: Backend>(file: &GgufFile, b: &B, t: &HostTensor, role: WeightRole) -> Result<(), ModelError> {
    let supported = b.supported_types(role);
    if supported.contains(&t.ggml_type) {
        return Ok(());
    }
    Err(ModelError::UnsupportedTensorType {
        path: file.path().to_path_buf(),
        tensor: t.name.clone(),
        ty: t.ggml_type,
        backend: b.name(),
        role: role.name(),
        supported: supported.iter().map(|t| t.name()).collect(),
    })
}

/// Header-only model files for the config readers' table tests.
#[cfg(test)]
pub(crate) mod test_files {
    use crate::gguf::{GgmlType, GgufFile, GgufWriter, Value};

    /// A file of `general.architecture` = `arch`, the `entries` (keys without the `<arch>.`
    /// prefix), and an F32 `token_embd.weight` of `[hidden, vocab]` (the vocabulary's source).
    pub fn file(arch: &str, entries: &[(&str, Value)], hidden: u64, vocab: u64) -> (tempfile::TempDir, GgufFile) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{arch}.gguf"));
        let mut w = GgufWriter::new();
        w.set("general.architecture", arch).unwrap();
        for (k, v) in entries {
            w.set(&format!("{arch}.{k}"), v.clone()).unwrap();
        }
        w.add_tensor("token_embd.weight", &[hidden, vocab], GgmlType::F32).unwrap();
        w.write_file(&path, &[&vec![0u8; (hidden * vocab * 4) as usize]]).unwrap();
        let f = GgufFile::open(&path).unwrap();
        (dir, f)
    }

    /// `entries` with `key` replaced by `value` (`None`: removed).
    pub fn with(entries: &[(&'static str, Value)], key: &str, value: Option<Value>) -> Vec<(&'static str, Value)> {
        let mut out: Vec<_> = entries.iter().filter(|(k, _)| *k != key).cloned().collect();
        if let Some(v) = value {
            let k = entries.iter().map(|(k, _)| *k).find(|k| *k == key).expect("a key of the table");
            out.push((k, v));
        }
        out
    }
}
