//! The facts a `Model`'s status carries, read from the GGUF header with the engine's reader
//! (no tensor data is touched): architecture, experts, top_k, shape class, quant types and the
//! KV cache's size facts.

use std::collections::BTreeSet;
use std::path::Path;

use brink_engine::gguf::{GgufError, GgufFile};
use brink_engine::model::ModelError;
use serde::{Deserialize, Serialize};

use super::kv_size;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderFacts {
    pub arch: String,
    pub experts: u64,
    pub top_k: u64,
    /// The kernels' qualification key (`ModelShape::key`: the label and the hash of the whole
    /// shape), e.g. `qwen3moe-h2048-e128-top8-ffn768-0123456789abcdef`.
    pub shape_class: String,
    /// The key's readable label, e.g. `qwen3moe-h2048-e128-top8-ffn768`. None in index entries
    /// written while the key was only this label; [`super::ModelCache`] re-reads those headers.
    #[serde(default)]
    pub shape_label: Option<String>,
    /// The distinct tensor types, sorted by name (ggml's names, e.g. `f32`, `q8_0`).
    pub quant_types: Vec<String>,
    /// KV cache bytes per token of the full-attention layers (see [`super::kv_size`]). None in
    /// index entries written before the field existed; [`super::ModelCache`] re-reads those
    /// headers.
    #[serde(default)]
    pub kv_bytes_per_token: Option<u64>,
    /// KV cache bytes the sliding-window layers' rings take per sequence at the engine's
    /// default prefill chunk and block size (Some(0) without such layers). None in index
    /// entries written before the field existed (their `kv_bytes_per_token` counted every
    /// layer); [`super::ModelCache`] re-reads those headers.
    #[serde(default)]
    pub kv_window_bytes_per_sequence: Option<u64>,
}

/// A header that cannot be read: the engine's error, which names the file, the key or the tensor.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// Not a GGUF file, or a damaged one.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A GGUF file of a model brink cannot run (architecture, hyperparameters, tensor shapes).
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Why an indexed model's header could not be read, as the index keeps it (the message of the
/// [`HeaderError`] when the model was indexed). Kept as a plain string in the index's JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(transparent)]
#[error("{0}")]
pub struct Unreadable(pub String);

impl From<HeaderError> for Unreadable {
    fn from(e: HeaderError) -> Self {
        Unreadable(e.to_string())
    }
}

/// Reads the header of the model at `path` (any part of a split model).
pub fn read(path: &Path) -> Result<HeaderFacts, HeaderError> {
    let file = GgufFile::open(path)?;
    let config = brink_engine::arch::config(&file)?;
    let quant_types: BTreeSet<String> = file.tensors().iter().map(|t| t.ggml_type().to_string()).collect();
    let layers: Vec<kv_size::LayerKv> = config.layer_specs.iter().map(kv_size::LayerKv::of).collect();
    let kv = kv_size::kv_facts(&layers, kv_size::Geometry::status());
    Ok(HeaderFacts {
        arch: config.arch.clone(),
        experts: config.moe.experts as u64,
        top_k: config.moe.top_k as u64,
        shape_class: config.shape_class(),
        shape_label: Some(config.shape_label()),
        quant_types: quant_types.into_iter().collect(),
        kv_bytes_per_token: kv.map(|k| k.bytes_per_token),
        kv_window_bytes_per_sequence: kv.map(|k| k.window_bytes_per_sequence),
    })
}
