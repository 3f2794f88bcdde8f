//! Hyperparameters of a MoE transformer, read from GGUF metadata by each architecture.

use std::path::Path;

use crate::gguf::Metadata;

use super::error::ModelError;

/// What the graph and the backends need to know about a model. Every field comes from the
/// file's metadata (or the shapes of its tensors), never from a built-in table.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: String,
    pub layers: usize,
    pub hidden: usize,
    pub vocab: usize,
    /// Longest context the model was trained for (`<arch>.context_length`).
    pub context: usize,
    pub attention: AttentionConfig,
    pub moe: MoeConfig,
    /// `<arch>.attention.layer_norm_rms_epsilon`.
    pub norm_eps: f32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionConfig {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// `<arch>.rope.freq_base`.
    pub rope_theta: f32,
}

impl AttentionConfig {
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// llama.cpp's `kq_scale` for these models.
    pub fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub experts: usize,
    pub top_k: usize,
    /// Width of one expert's gate/up projection.
    pub expert_ffn: usize,
    /// Renormalise the picked weights to sum to 1 (qwen3moe: always).
    pub norm_top_k: bool,
    /// Multiplier of the picked weights, when the file sets one (`expert_weights_scale`).
    pub weights_scale: Option<f32>,
}

impl ModelConfig {
    /// The shape class the kernels are qualified for: the architecture and the dimensions that
    /// decide launch geometry (not the layer count or the weights), as the self-test names it,
    /// e.g. `qwen3moe-h2048-e128-top8-ffn768`. Two files of one class share a qualification.
    pub fn shape_class(&self) -> String {
        format!("{}-h{}-e{}-top{}-ffn{}", self.arch, self.hidden, self.moe.experts, self.moe.top_k, self.moe.expert_ffn)
    }
}

/// Typed reads of `<arch>.*` keys with errors that name the file, the key and the value.
pub struct Hyper<'a> {
    pub meta: &'a Metadata,
    pub arch: &'a str,
}

impl<'a> Hyper<'a> {
    pub fn new(meta: &'a Metadata, arch: &'a str) -> Self {
        Hyper { meta, arch }
    }

    pub fn path(&self) -> &Path {
        self.meta.path()
    }

    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// A positive count no larger than `max`.
    pub fn count(&self, suffix: &str, max: usize) -> Result<usize, ModelError> {
        let key = self.key(suffix);
        let v = self.meta.get_u64(&key)?;
        self.check_count(&key, v, max)
    }

    pub fn optional_count(&self, suffix: &str, max: usize) -> Result<Option<usize>, ModelError> {
        let key = self.key(suffix);
        match self.meta.optional(&key, Metadata::get_u64)? {
            Some(v) => self.check_count(&key, v, max).map(Some),
            None => Ok(None),
        }
    }

    fn check_count(&self, key: &str, v: u64, max: usize) -> Result<usize, ModelError> {
        if v == 0 || v > max as u64 {
            return Err(self.bad(key, v, format!("must be between 1 and {max}")));
        }
        Ok(v as usize)
    }

    /// A finite positive float.
    pub fn positive(&self, suffix: &str) -> Result<f32, ModelError> {
        let key = self.key(suffix);
        let v = self.meta.get_f32(&key)?;
        if !(v.is_finite() && v > 0.0) {
            return Err(self.bad(&key, v, "must be a finite positive number"));
        }
        Ok(v)
    }

    pub fn optional_f32(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(suffix);
        match self.meta.optional(&key, Metadata::get_f32)? {
            Some(v) if !v.is_finite() => Err(self.bad(&key, v, "must be finite")),
            other => Ok(other),
        }
    }

    pub fn bad(&self, key: &str, value: impl std::fmt::Display, why: impl Into<String>) -> ModelError {
        ModelError::BadHyperparameter { path: self.path().to_path_buf(), key: key.to_string(), value: value.to_string(), why: why.into() }
    }
}
