//! The CUDA sources, one file per kernel family, embedded in the binary.
//!
//! Each source is compiled as its own NVRTC program with the type constants generated from the
//! tensor type table ([`crate::quant::types::cuda_header`]) and `common.cuh` prepended; the hash
//! of all of them is the "kernel sources" part of a node's fingerprint.

use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// File name under `kernels/cuda/`, also the module's name.
    pub file: &'static str,
    pub code: &'static str,
    /// Code compiled in front of the file: a header shared by some families (the GEMM tile), or
    /// a negative control's fixed twin, so the broken kernel reuses the twin's device functions
    /// and differs only where the bug is.
    pub prelude: Option<&'static KernelSource>,
}

const COMMON: &str = include_str!("../cuda/common.cuh");

macro_rules! source {
    ($file:literal) => {
        KernelSource { file: $file, code: include_str!(concat!("../cuda/", $file)), prelude: None }
    };
    ($file:literal, twin: $twin:expr) => {
        KernelSource { file: $file, code: include_str!(concat!("../cuda/", $file)), prelude: Some(&$twin) }
    };
    ($file:literal, header: $header:expr) => {
        KernelSource { file: $file, code: include_str!(concat!("../cuda/", $file)), prelude: Some(&$header) }
    };
}

/// The dp4a GEMM tile loop of the routed and the dense GEMM: a header, not a module of its own
/// (compiled as the prelude of both).
pub const GEMM_TILE: KernelSource = source!("gemm_tile.cuh");

pub const TESTDATA: KernelSource = source!("testdata.cu");
pub const ROUTER: KernelSource = source!("router.cu");
pub const MOE_ALIGN: KernelSource = source!("moe_align.cu");
pub const QUANTIZE: KernelSource = source!("quantize.cu");
pub const MOE_GEMV: KernelSource = source!("moe_gemv.cu");
pub const MOE_GEMM: KernelSource = source!("moe_gemm.cu", header: GEMM_TILE);
pub const MOE_COMBINE: KernelSource = source!("moe_combine.cu");
pub const LATENT_PROJ: KernelSource = source!("latent_proj.cu");
pub const EMBED: KernelSource = source!("embed.cu");
pub const RMSNORM: KernelSource = source!("rmsnorm.cu");
pub const ROPE: KernelSource = source!("rope.cu");
pub const OUTPUT_HEAD: KernelSource = source!("output_head.cu", header: GEMM_TILE);
pub const SAMPLING: KernelSource = source!("sampling.cu");
pub const ATTENTION: KernelSource = source!("attention.cu");
pub const KV_STORE: KernelSource = source!("kv_store.cu");
pub const GLUE: KernelSource = source!("glue.cu");
/// Deliberately broken kernels, loaded only by the self-test's negative controls: the routed
/// GEMV with tokens x top_k on grid.z, and the latent epilogue whose tail lanes skip shuffles.
pub const NEG_GEMV_GRIDZ: KernelSource = source!("neg_gemv_gridz.cu", twin: MOE_GEMV);
pub const NEG_LATENT_TAILSKIP: KernelSource = source!("neg_latent_tailskip.cu", twin: LATENT_PROJ);

pub const ALL: &[KernelSource] = &[
    TESTDATA,
    ROUTER,
    MOE_ALIGN,
    QUANTIZE,
    MOE_GEMV,
    MOE_GEMM,
    MOE_COMBINE,
    LATENT_PROJ,
    EMBED,
    RMSNORM,
    ROPE,
    OUTPUT_HEAD,
    SAMPLING,
    ATTENTION,
    KV_STORE,
    GLUE,
    NEG_GEMV_GRIDZ,
    NEG_LATENT_TAILSKIP,
];

impl KernelSource {
    /// What NVRTC compiles: the generated type constants, the common header, then the file,
    /// with `#line` so compile errors name the right file and line.
    pub fn full_source(&self) -> String {
        let types = crate::quant::types::cuda_header();
        let twin = self.prelude.map(|t| format!("#line 1 \"{}\"\n{}\n", t.file, t.code)).unwrap_or_default();
        format!("#line 1 \"types.h\"\n{types}#line 1 \"common.cuh\"\n{COMMON}\n{twin}#line 1 \"{}\"\n{}", self.file, self.code)
    }

    pub fn sha256(&self) -> String {
        hex(&Sha256::digest(self.full_source().as_bytes()))
    }
}

/// Hash over every kernel source: changes whenever any kernel (or the common header) does.
pub fn sources_hash() -> String {
    let mut h = Sha256::new();
    for s in ALL {
        h.update(s.file.as_bytes());
        h.update(s.full_source().as_bytes());
    }
    hex(&h.finalize())
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
