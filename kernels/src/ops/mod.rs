//! One module per kernel family. Each carries, next to its CUDA source in `cuda/`: the launch
//! plan (pure), the CPU twin, the checked GPU launch, its critical token counts and the
//! self-test case that runs it against the twin.
//!
//! Common API of a family module: `plans(tokens, case, limits)`, `critical_counts(case,
//! limits)`, `device_bytes(tokens, case)`, `run_case(gpu, tokens, case)`, `TOLERANCE`, and
//! `Family`, its [`crate::check::KernelFamily`], registered once in `selftest::case`.

pub mod add;
pub mod attention;
pub mod bias;
pub mod dense_f32;
pub mod embed;
pub mod kv_store;
pub mod latent_proj;
pub mod linear;
pub mod moe_align;
pub mod moe_combine;
pub mod moe_gemm;
pub mod moe_gemv;
pub mod moe_gemv_fused;
pub mod norm_rope;
pub mod output_head;
pub mod qkv;
pub mod quantize;
pub mod rmsnorm;
pub mod rmsnorm_q8_1;
pub mod rope;
pub mod router;
pub mod sampling;
pub mod swiglu;
pub mod testdata;
