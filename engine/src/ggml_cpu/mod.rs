//! The CPU backend's arithmetic: the reference the CUDA backend is checked against, and the
//! side of the parity tests that must match llama.cpp's CPU backend token for token.
//!
//! Every module mirrors ggml's CPU operations of llama.cpp's x86-64 AVX2 build (no repacked
//! weights, no tiled K-quant matmul: see scripts/llama_ref.py) rounding for rounding: f16/q8
//! activation rounding, f64 sums in norms and softmax, the SIMD lanes and summation order of
//! every dot, ggml's vector `expf`; in plain Rust, the same on any CPU and thread count.
//! scripts/ggml-crosscheck checks it op by op, bit for bit.
//!
//! - [`act_quant`]: activation rows in each weight type's vec_dot format ([`QuantizedActs`]);
//! - [`vec_dot`]: one weight row · one activation row, per type ([`WeightKind`]), with
//!   [`float_dot`], the summation orders of ggml's float dots, and [`quant_dot`], the lane
//!   order of its quantized dots;
//! - [`matmul`]: [`WeightMatrix`] (checked views of GGUF bytes) × activation rows, on rayon;
//! - [`embedding`], [`norm`], [`rope`], [`softmax`], [`activation`], [`attention`], [`moe`]
//!   (with [`argsort`], libstdc++'s sort order for ties), [`bias`]; with gpt-oss's ops:
//!   attention sinks and sliding windows (also over a wrapped cache, [`attention_cells`]),
//!   YaRN RoPE, the clamped SwiGLU, softmax-weight gating and per-expert biases.

pub mod act_quant;
pub mod activation;
pub mod argsort;
pub mod attention;
pub mod bias;
pub mod embedding;
mod error;
pub mod float_dot;
pub mod ggml_exp;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod quant_dot;
pub mod rope;
pub mod softmax;
pub mod vec_dot;

pub use act_quant::{QuantizedActs, VecDotType};
pub use activation::{silu, swiglu, swiglu_oai};
pub use attention::{AttnExt, attention, attention_cells, attention_ext, attention_in_batch};
pub use bias::{add_bias, add_id};
pub use embedding::get_rows;
pub use error::CpuError;
pub use matmul::{WeightMatrix, matmul, matmul_gather, matmul_quantized};
pub use moe::{Routing, check_moe_shape, combine, route, route_softmax_weight};
pub use norm::{rms_norm, rms_norm_in_place};
pub use rope::{Yarn, rope_neox, rope_neox_yarn};
pub use softmax::{soft_max, soft_max_in_place};
pub use vec_dot::{WeightKind, vec_dot, vec_dot_sgemm};
