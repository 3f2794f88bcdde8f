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

/// The first statement of every kernel entry point in `code`, by kernel name: what follows the
/// opening brace of each `extern "C" __global__` function (macro line continuations skipped).
#[cfg(test)]
fn first_statements(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("extern \"C\" __global__") {
        let after = &rest[at..];
        // Neither `__launch_bounds__(..)` nor the parameters hold a brace: the first one opens
        // the body, and the last parenthesised group before it is the parameter list.
        let brace = after.find('{').expect("a kernel has a body");
        let head = &after[..brace];
        let params = head.rfind(')').and_then(|close| {
            let mut depth = 0;
            head[..=close].char_indices().rev().find_map(|(i, c)| {
                depth += match c {
                    ')' => 1,
                    '(' => -1,
                    _ => 0,
                };
                (depth == 0).then_some(i)
            })
        });
        let name = params.map(|open| head[..open].split_whitespace().last().unwrap_or("")).unwrap_or("").to_string();
        let first = after[brace + 1..].trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
        let statement = first.split(';').next().unwrap_or("").trim().to_string();
        out.push((name, statement));
        rest = &after[brace + 1..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decode graphs make kernel-to-kernel edges programmatic (`cuda::graph`): a kernel that
    /// touched memory before `GRID_DEPENDENCY_WAIT()` could read what the kernel before it has
    /// not written yet, or overwrite what that one still reads.
    #[test]
    fn every_kernel_waits_for_the_one_before_first() {
        let mut kernels = 0;
        for src in ALL {
            for (name, first) in first_statements(src.code) {
                kernels += 1;
                assert_eq!(first, "GRID_DEPENDENCY_WAIT()", "{}: kernel {name} starts with {first:?}", src.file);
            }
        }
        assert!(kernels >= 30, "only {kernels} kernels found");
    }

    #[test]
    fn first_statements_reads_plain_and_macro_kernels() {
        let code = "extern \"C\" __global__ void __launch_bounds__(256, 1)\nk(int a, float (*b)[4]) {\n    x = 1;\n}\n\
                    #define K(NAME) \\\n    extern \"C\" __global__ void NAME(int a) { \\\n        y(); \\\n    }\n";
        let got = first_statements(code);
        assert_eq!(got, vec![("k".to_string(), "x = 1".to_string()), ("NAME".to_string(), "y()".to_string())]);
    }
}
