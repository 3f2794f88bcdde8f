//! Hyperparameters of a MoE transformer, read from GGUF metadata by each architecture.

use std::collections::BTreeMap;
use std::path::Path;

use crate::gguf::{GgufFile, Metadata};

use super::error::ModelError;
use super::layer::LayerSpec;

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
    /// What each layer computes, in order (`layers` entries): the seam the backends and the
    /// qualification key are driven by. `attention` and `moe` are the dimensions every layer
    /// shares (the KV cache's shape, the shape label).
    pub layer_specs: Vec<LayerSpec>,
    /// `<arch>.attention.layer_norm_rms_epsilon`.
    pub norm_eps: f32,
    /// The weight type of every tensor, as the file stores them: part of the qualification key.
    pub weights: TensorTypes,
}

/// The ggml type name of each tensor of a file, split into the tensors outside the layers and
/// those of each layer (`blk.N.<role>`), by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TensorTypes {
    pub global: BTreeMap<String, String>,
    /// Index N holds the roles of `blk.N.*`.
    pub layers: Vec<BTreeMap<String, String>>,
}

impl TensorTypes {
    /// Read from the file's tensor list (its header: no tensor data is touched). Layer indexes
    /// are bounded by `layers`; a `blk.N.` name past them counts as a global tensor, so it
    /// still changes the key and no hostile index sizes an allocation.
    pub fn of(file: &GgufFile, layers: usize) -> TensorTypes {
        let mut t = TensorTypes { global: BTreeMap::new(), layers: vec![BTreeMap::new(); layers] };
        for info in file.tensors() {
            let name = info.name();
            let ty = info.ggml_type().name().to_string();
            let in_layer = name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(n, role)| Some((n.parse::<usize>().ok().filter(|&n| n < layers)?, role)));
            match in_layer {
                Some((n, role)) => {
                    t.layers[n].insert(role.to_string(), ty);
                }
                None => {
                    t.global.insert(name.to_string(), ty);
                }
            }
        }
        t
    }
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
    /// The readable label of the model's shape, e.g. `qwen3moe-h2048-e128-top8-ffn768`: names
    /// it for people, never identifies it (see [`ModelConfig::shape_class`]).
    pub fn shape_label(&self) -> String {
        format!("{}-h{}-e{}-top{}-ffn{}", self.arch, self.hidden, self.moe.experts, self.moe.top_k, self.moe.expert_ffn)
    }

    /// The qualification key of the model: [`brink_kernels::thresholds::ModelShape::key`] of
    /// its full kernel shape (label plus the hash of every dimension and weight type), e.g.
    /// `qwen3moe-h2048-e128-top8-ffn768-0123456789abcdef`. Two files share a qualification
    /// exactly when their keys are equal.
    pub fn shape_class(&self) -> String {
        crate::qualify::kernel_shape(self).key()
    }

    /// The qwen3moe layer of the shared dimensions ([`LayerSpec::plain`]): what each layer's
    /// kind in the qualification key is told apart from.
    pub fn plain_layer(&self) -> LayerSpec {
        let (a, m) = (&self.attention, &self.moe);
        LayerSpec::plain(a.heads, a.kv_heads, a.head_dim, a.rope_theta, m.experts, m.top_k, m.expert_ffn)
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
