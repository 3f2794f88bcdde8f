//! Weights on the device. Each [`HostTensor`]'s bytes are uploaded in the file's block layout
//! where a kernel reads that layout; otherwise they are converted once, on the host, at load:
//!
//! - norm weights (F32, or F16/BF16 widened to f32: a vector, no memory to speak of);
//! - embedding tables the embed kernel cannot read (F16, BF16, K-quants) are widened to f32.
//!   Memory cost: 4 bytes per weight instead of 2 or ~0.56, i.e. 1.24 GB for a 151,936 x 2048
//!   table (vs 0.62 GB in F16);
//! - F32 matrices (the router `ffn_gate_inp`, which llama.cpp never quantizes) stay f32 and
//!   run through `dense_f32` (`dense::project`);
//! - MXFP4 matrices (gpt-oss's routed experts) are repacked to Q8_0 on the host, exactly
//!   (`repack`), while the repacked matrix leaves half the device free ([`Mxfp4::resolve`]);
//!   past that they stay MXFP4 and the kernels read its blocks. Q8_0 takes 34 bytes per 32
//!   weights instead of 17 (gpt-oss-20b's experts, ~11 GB in the file, take ~22 GB) and was
//!   measured faster on an H100 (perf-notes entry 16: prefill 1.6x, decode 1.6x); a model whose
//!   experts cannot be doubled (gpt-oss-120b on one Spark) keeps the blocks it came with.
//!   `BRINK_MXFP4_REPACK=1` always repacks, `=0` never does ([`Mxfp4::from_env`]).
//!
//! Which types the backend takes in each role follows from [`layout`] alone, so
//! [`supported_types`] cannot disagree with what loading does.

use std::sync::LazyLock;

use brink_kernels::cuda::Gpu;
use brink_kernels::quant::{QK, TensorType, WeightType};
use cudarc::driver::CudaSlice;

use super::fail;
use crate::backend::WeightRole;
use crate::gguf::GgmlType;
use crate::model::{BackendError, HostTensor, MatrixDims};

/// A weight resident on the GPU.
pub struct CudaWeight {
    name: String,
    file_type: GgmlType,
    /// ggml order: `dims[0]` is the row length.
    dims: Vec<u64>,
    pub(crate) data: WeightData,
}

pub(crate) enum WeightData {
    /// Quantized blocks the kernels read as they are.
    Blocks { wtype: WeightType, bytes: CudaSlice<u8> },
    /// f32 values: norm weights, widened embedding tables.
    F32(CudaSlice<f32>),
}

impl CudaWeight {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tensor's type in the file (the device may hold it converted).
    pub fn file_type(&self) -> GgmlType {
        self.file_type
    }
}

impl MatrixDims for CudaWeight {
    fn dims(&self) -> &[u64] {
        &self.dims
    }
}

/// How a tensor is held on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// The file's blocks, unchanged.
    Blocks(WeightType),
    /// The file's f32 values, unchanged.
    F32,
    /// Converted to f32 on the host.
    WidenToF32,
    /// MXFP4 blocks rewritten as the Q8_0 blocks of the same values on the host.
    RepackMxfp4ToQ8_0,
}

/// How MXFP4 matrices are held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Mxfp4 {
    /// The file's blocks: the kernels read MXFP4.
    Native,
    /// Repacked to Q8_0 on the host (twice the memory).
    RepackToQ8_0,
    /// Repacked while the repacked matrix leaves half the device's memory free, else native
    /// ([`Mxfp4::resolve`]).
    #[default]
    RepackWhileItFits,
}

/// The environment variable that forces [`Mxfp4::RepackToQ8_0`] (`1`) or [`Mxfp4::Native`] (`0`).
pub(crate) const MXFP4_REPACK_ENV: &str = "BRINK_MXFP4_REPACK";

impl Mxfp4 {
    /// `BRINK_MXFP4_REPACK=1` repacks, `0` keeps the blocks, anything else (or nothing) repacks
    /// while it fits; read once per process.
    pub(crate) fn from_env() -> Mxfp4 {
        static CHOICE: LazyLock<Mxfp4> = LazyLock::new(|| Mxfp4::parse(std::env::var(MXFP4_REPACK_ENV).ok().as_deref()));
        *CHOICE
    }

    fn parse(value: Option<&str>) -> Mxfp4 {
        match value {
            Some("1") => Mxfp4::RepackToQ8_0,
            Some("0") => Mxfp4::Native,
            _ => Mxfp4::RepackWhileItFits,
        }
    }

    /// The choice for one MXFP4 matrix of `file_bytes`: [`Mxfp4::RepackWhileItFits`] repacks
    /// when the device keeps at least half its `total` memory `free` after the repacked copy
    /// (twice the file's bytes), room for the matrices still to come, the KV cache and the
    /// activations; otherwise the blocks stay. The forced choices stay as they are.
    pub(crate) fn resolve(self, file_bytes: u64, free: u64, total: u64) -> Mxfp4 {
        match self {
            Mxfp4::RepackWhileItFits if free.saturating_sub(file_bytes.saturating_mul(2)) >= total / 2 => Mxfp4::RepackToQ8_0,
            Mxfp4::RepackWhileItFits => Mxfp4::Native,
            forced => forced,
        }
    }
}

/// The kernels' view of a GGUF type, for the types the CPU backend computes with.
fn tensor_type(ty: GgmlType) -> Option<TensorType> {
    TensorType::from_ggml_id(ty.id()).ok()
}

/// How a tensor of type `ty` and shape `dims` is held in `role`, or why it cannot be; MXFP4
/// matrices as `mxfp4` says.
pub(crate) fn layout(ty: GgmlType, role: WeightRole, dims: &[u64], mxfp4: Mxfp4) -> Result<Layout, String> {
    let tt = tensor_type(ty);
    match role {
        WeightRole::Scale => match ty {
            GgmlType::F32 => Ok(Layout::F32),
            GgmlType::F16 | GgmlType::BF16 => Ok(Layout::WidenToF32),
            _ => Err(format!("per-channel values (norm weights, biases) must be f32, f16 or bf16, not {ty}")),
        },
        WeightRole::Embedding => match (ty, tt) {
            (GgmlType::F32, _) => Ok(Layout::F32),
            (GgmlType::Q8_0, _) => Ok(Layout::Blocks(WeightType::Q8_0)),
            (GgmlType::Q4_0, _) => Ok(Layout::Blocks(WeightType::Q4_0)),
            (_, Some(_)) => Ok(Layout::WidenToF32),
            (_, None) => Err(format!("no dequantization for {ty}")),
        },
        WeightRole::Matrix => match tt.and_then(TensorType::weight_type) {
            Some(WeightType::MXFP4) if mxfp4 == Mxfp4::RepackToQ8_0 => Ok(Layout::RepackMxfp4ToQ8_0),
            Some(w) => Ok(Layout::Blocks(w)),
            None if ty == GgmlType::F32 && dims.len() <= 2 => Ok(Layout::F32),
            None if ty == GgmlType::F32 => Err(format!(
                "routed experts must be quantized: the routed kernels read {} blocks",
                WeightType::ALL.map(WeightType::name).join(", ")
            )),
            None => Err(format!("no dense or routed kernel computes with {ty} weights")),
        },
    }
}

fn types_for(role: WeightRole) -> Vec<GgmlType> {
    // The types, not their layouts: the same whichever way MXFP4 is held.
    GgmlType::ALL.into_iter().filter(|&t| layout(t, role, &[QK as u64 * 8, 8], Mxfp4::Native).is_ok()).collect()
}

static SCALE_TYPES: LazyLock<Vec<GgmlType>> = LazyLock::new(|| types_for(WeightRole::Scale));
static EMBEDDING_TYPES: LazyLock<Vec<GgmlType>> = LazyLock::new(|| types_for(WeightRole::Embedding));
static MATRIX_TYPES: LazyLock<Vec<GgmlType>> = LazyLock::new(|| types_for(WeightRole::Matrix));

/// The types [`load`] accepts in `role` (a 2-D shape: see [`layout`] for 3-D F32).
pub(crate) fn supported_types(role: WeightRole) -> &'static [GgmlType] {
    match role {
        WeightRole::Scale => &SCALE_TYPES,
        WeightRole::Embedding => &EMBEDDING_TYPES,
        WeightRole::Matrix => &MATRIX_TYPES,
    }
}

/// The layout of `t` in `role` after the checks every upload makes (its bytes match its shape;
/// per-channel values are a vector, or one per expert), or why it cannot be held.
pub(crate) fn checked_layout(t: &HostTensor, role: WeightRole, mxfp4: Mxfp4) -> Result<Layout, String> {
    let expected = crate::gguf::tensor_bytes(t.ggml_type, &t.dims).map_err(|e| e.to_string())?;
    if expected != t.bytes.len() as u64 {
        return Err(format!("holds {} bytes, its shape needs {expected}", t.bytes.len()));
    }
    // A vector, or one vector per expert (gpt-oss's `ffn_*_exps.bias`, `[width, experts]`).
    if role == WeightRole::Scale && !(1..=2).contains(&t.dims.len()) {
        return Err("per-channel values are a vector or one vector per expert".into());
    }
    layout(t.ggml_type, role, &t.dims, mxfp4)
}

/// Uploads `t` in the layout its type and role call for, MXFP4 matrices as `mxfp4` says.
pub(crate) fn load(gpu: &Gpu, t: HostTensor, role: WeightRole, mxfp4: Mxfp4) -> Result<CudaWeight, BackendError> {
    let bad = |why: String| fail(format!("tensor {:?} ({}, dims {:?}) as {}: {why}", t.name, t.ggml_type, t.dims, role.name()));
    let mxfp4 = if mxfp4 == Mxfp4::RepackWhileItFits && t.ggml_type == GgmlType::MXFP4 {
        let free = gpu.free_mem().map_err(|e| bad(format!("reading the device's free memory: {e}")))?;
        mxfp4.resolve(t.bytes.len() as u64, free, gpu.limits().total_mem_bytes)
    } else {
        mxfp4
    };
    let layout = checked_layout(&t, role, mxfp4).map_err(&bad)?;
    let upload_err = |e| fail(format!("uploading tensor {:?}: {e}", t.name));
    let data = match layout {
        Layout::Blocks(wtype) => WeightData::Blocks { wtype, bytes: gpu.upload(&t.bytes).map_err(upload_err)? },
        Layout::F32 => WeightData::F32(gpu.upload(&f32_values(&t.bytes)).map_err(upload_err)?),
        Layout::WidenToF32 => WeightData::F32(gpu.upload(&widen(&t).map_err(&bad)?).map_err(upload_err)?),
        // Sized by `wtype` downstream, like every block layout: the file's type is only named.
        Layout::RepackMxfp4ToQ8_0 => {
            let q8 = super::repack::mxfp4_to_q8_0(&t.bytes).map_err(|e| bad(e.to_string()))?;
            WeightData::Blocks { wtype: WeightType::Q8_0, bytes: gpu.upload(&q8).map_err(upload_err)? }
        }
    };
    Ok(CudaWeight { name: t.name, file_type: t.ggml_type, dims: t.dims, data })
}

fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// The tensor's values as f32 (every type the CPU backend reads).
fn widen(t: &HostTensor) -> Result<Vec<f32>, String> {
    let tt = tensor_type(t.ggml_type).ok_or_else(|| format!("no dequantization for {}", t.ggml_type))?;
    let values = t.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d as usize)).ok_or("element count overflows")?;
    let mut out = vec![0.0f32; values];
    tt.dequantize_rows(&t.bytes, t.dims[0] as usize, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_types_follow_the_layouts() {
        let m = supported_types(WeightRole::Matrix);
        assert!(m.contains(&GgmlType::Q8_0) && m.contains(&GgmlType::Q4_0) && m.contains(&GgmlType::F32));
        assert!(m.contains(&GgmlType::MXFP4), "a kernel weight format");
        assert!(!m.contains(&GgmlType::F16) && !m.contains(&GgmlType::Q4_1));
        let e = supported_types(WeightRole::Embedding);
        for t in
            [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K]
        {
            assert!(e.contains(&t), "{t} embeddings");
        }
        assert!(!e.contains(&GgmlType::IQ2_XS));
        assert_eq!(supported_types(WeightRole::Scale), &[GgmlType::F32, GgmlType::F16, GgmlType::BF16]);
    }

    #[test]
    fn layouts_by_role() {
        use GgmlType::*;
        let layout = |ty, role, dims: &[u64]| layout(ty, role, dims, Mxfp4::Native);
        assert_eq!(layout(Q4_0, WeightRole::Embedding, &[64, 10]), Ok(Layout::Blocks(WeightType::Q4_0)));
        assert_eq!(layout(F16, WeightRole::Embedding, &[64, 10]), Ok(Layout::WidenToF32));
        assert_eq!(layout(Q6_K, WeightRole::Embedding, &[256, 10]), Ok(Layout::WidenToF32));
        assert_eq!(layout(F32, WeightRole::Matrix, &[64, 8]), Ok(Layout::F32));
        let e = layout(F32, WeightRole::Matrix, &[64, 8, 4]).unwrap_err();
        assert!(e.contains("routed experts") && e.contains("q4_0") && e.contains("mxfp4"), "{e}");
        assert!(layout(Q4_1, WeightRole::Matrix, &[64, 8]).unwrap_err().contains("q4_1"));
        assert!(layout(Q8_0, WeightRole::Scale, &[64]).is_err());
        // MXFP4: the file's blocks as a matrix, dense or routed (gpt-oss's experts are 3-D);
        // widened as an embedding table (the embed kernel reads q8_0/q4_0 only); never a norm
        // weight.
        assert_eq!(layout(MXFP4, WeightRole::Matrix, &[2880, 2880, 32]), Ok(Layout::Blocks(WeightType::MXFP4)));
        assert_eq!(layout(MXFP4, WeightRole::Matrix, &[64, 8]), Ok(Layout::Blocks(WeightType::MXFP4)));
        assert_eq!(layout(MXFP4, WeightRole::Embedding, &[64, 10]), Ok(Layout::WidenToF32));
        assert!(layout(MXFP4, WeightRole::Scale, &[64]).unwrap_err().contains("mxfp4"));
    }

    /// `BRINK_MXFP4_REPACK=1` repacks MXFP4 matrices, and nothing else: other types, other roles
    /// and other values of the variable keep their layouts.
    #[test]
    fn the_repack_switch_changes_only_mxfp4_matrices() {
        use GgmlType::*;
        let repack = Mxfp4::RepackToQ8_0;
        assert_eq!(layout(MXFP4, WeightRole::Matrix, &[2880, 2880, 32], repack), Ok(Layout::RepackMxfp4ToQ8_0));
        assert_eq!(layout(MXFP4, WeightRole::Matrix, &[64, 8], repack), Ok(Layout::RepackMxfp4ToQ8_0));
        assert_eq!(layout(MXFP4, WeightRole::Embedding, &[64, 10], repack), Ok(Layout::WidenToF32));
        for ty in GgmlType::ALL.into_iter().filter(|&t| t != MXFP4) {
            for role in [WeightRole::Matrix, WeightRole::Embedding, WeightRole::Scale] {
                let dims = [ty.block_size() * 8, 8];
                assert_eq!(layout(ty, role, &dims, repack), layout(ty, role, &dims, Mxfp4::Native), "{ty} {}", role.name());
            }
        }
        assert_eq!(Mxfp4::parse(Some("1")), Mxfp4::RepackToQ8_0);
        assert_eq!(Mxfp4::parse(Some("0")), Mxfp4::Native);
        for other in [None, Some(""), Some("yes")] {
            assert_eq!(Mxfp4::parse(other), Mxfp4::RepackWhileItFits, "{other:?}");
        }
        // Unresolved, the default reads the file's blocks (as `supported_types` asks).
        assert_eq!(layout(MXFP4, WeightRole::Matrix, &[64, 8], Mxfp4::RepackWhileItFits), Ok(Layout::Blocks(WeightType::MXFP4)));
    }

    /// The default repacks a matrix while its Q8_0 copy (twice the file's bytes) leaves half the
    /// device free: gpt-oss-20b's experts (~0.45 GB a layer) on a 128 GB Spark or an 80 GB H100
    /// repack; once the weights have taken the device to half, the rest stay MXFP4 (gpt-oss-120b's
    /// ~60 GB of experts on a Spark); the forced choices ignore memory.
    #[test]
    fn the_default_repacks_while_half_the_device_stays_free() {
        const GB: u64 = 1_000_000_000;
        let auto = Mxfp4::RepackWhileItFits;
        assert_eq!(auto.resolve(GB / 2, 120 * GB, 128 * GB), Mxfp4::RepackToQ8_0);
        assert_eq!(auto.resolve(GB / 2, 79 * GB, 80 * GB), Mxfp4::RepackToQ8_0);
        // At the edge: exactly half left repacks, a byte less does not.
        assert_eq!(auto.resolve(GB, 66 * GB, 128 * GB), Mxfp4::RepackToQ8_0);
        assert_eq!(auto.resolve(GB + 1, 66 * GB, 128 * GB), Mxfp4::Native);
        assert_eq!(auto.resolve(GB / 2, 40 * GB, 128 * GB), Mxfp4::Native);
        // More than the device holds: no overflow, no repack.
        assert_eq!(auto.resolve(u64::MAX, 128 * GB, 128 * GB), Mxfp4::Native);
        for forced in [Mxfp4::Native, Mxfp4::RepackToQ8_0] {
            assert_eq!(forced.resolve(GB, 0, 128 * GB), forced);
            assert_eq!(forced.resolve(0, 128 * GB, 128 * GB), forced);
        }
    }

    /// The gpt-oss loader driven by a backend that answers as the CUDA one does (its layer
    /// check, its types, [`checked_layout`]: the per-expert bias rows included) and computes
    /// nothing: every tensor of the tiny preset gets a layout, its experts their MXFP4 blocks;
    /// under the repack switch the repack, whose bytes hold the file's values bit for bit.
    #[test]
    fn every_tensor_of_a_synthetic_gpt_oss_gets_a_layout() {
        use crate::synth::{GptOssPreset, GptOssSpec};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny-gpt-oss.gguf");
        crate::synth::gpt_oss::generate(&GptOssSpec::from_preset(GptOssPreset::Tiny), &path, |_, _| {}).unwrap();
        let file = crate::gguf::GgufFile::open(&path).unwrap();
        let shape = GptOssPreset::Tiny.shape();
        for (mxfp4, expert_layout) in [(Mxfp4::Native, Layout::Blocks(WeightType::MXFP4)), (Mxfp4::RepackToQ8_0, Layout::RepackMxfp4ToQ8_0)]
        {
            let mut r = Layouts(Vec::new(), mxfp4);
            if let Err(e) = crate::arch::load(&file, &mut r) {
                panic!("{mxfp4:?}: {e}");
            }
            assert_eq!(r.0.len(), shape.tensors(GptOssPreset::Tiny.default_scheme()).len(), "every tensor loads");
            let experts: Vec<_> = r.0.iter().filter(|(_, l)| *l == expert_layout).map(|(n, _)| n.as_str()).collect();
            assert_eq!(experts.len(), 3 * shape.layers as usize, "{mxfp4:?}: {experts:?}");
            assert!(experts.iter().all(|n| n.ends_with("_exps.weight")), "{experts:?}");
        }
    }

    /// Records each tensor's layout (MXFP4 matrices as its `Mxfp4` says); loads nothing and
    /// computes nothing.
    struct Layouts(Vec<(String, Layout)>, Mxfp4);

    impl crate::backend::Backend for Layouts {
        type Act = ();
        type Weight = ();

        fn name(&self) -> &'static str {
            "cuda layouts"
        }
        fn check_layer(&self, layer: usize, spec: &crate::model::LayerSpec) -> crate::backend::Result<()> {
            super::super::check_layer(layer, spec)
        }
        fn supported_types(&self, role: WeightRole) -> &'static [GgmlType] {
            supported_types(role)
        }
        fn load_weight(&mut self, t: HostTensor, role: WeightRole) -> crate::backend::Result<()> {
            let l = checked_layout(&t, role, self.1).map_err(|e| fail(format!("{}: {e}", t.name)))?;
            if l == Layout::RepackMxfp4ToQ8_0 {
                let q8 = super::super::repack::mxfp4_to_q8_0(&t.bytes).map_err(|e| fail(format!("{}: {e}", t.name)))?;
                let values = |tt: TensorType, b: &[u8]| {
                    let mut v = vec![f32::NAN; tt.value_count(b.len()).unwrap()];
                    tt.dequantize_into(b, &mut v).unwrap();
                    v.into_iter().map(f32::to_bits).collect::<Vec<_>>()
                };
                assert!(values(TensorType::Q8_0, &q8) == values(TensorType::MXFP4, &t.bytes), "{} repacks inexactly", t.name);
            }
            self.0.push((t.name, l));
            Ok(())
        }
        fn alloc_kv(&mut self, _: crate::backend::KvSpec) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn begin_batch(&mut self, _: &crate::backend::Batch) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn set_monitor(&mut self, _: std::sync::Arc<crate::monitor::Monitor>) {}
        fn mark(&mut self, _: Option<u32>, _: crate::monitor::Op) -> crate::backend::Result<()> {
            Ok(())
        }
        fn embed(&mut self, _: &()) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn rms_norm(&mut self, _: &(), _: &(), _: f32) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn linear(&mut self, _: &(), _: &()) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn rope(&mut self, _: &mut (), _: usize, _: &crate::model::Rope) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn attention(&mut self, _: &(), _: &(), _: &(), _: Option<&()>, _: &crate::backend::AttentionSpec) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn moe(&mut self, _: &(), _: &crate::backend::MoeWeights<'_, ()>, _: &crate::backend::MoeSpec) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn add(&mut self, _: &mut (), _: &()) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn add_bias(&mut self, _: &mut (), _: &()) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn select_logit_rows(&mut self, _: &()) -> crate::backend::Result<()> {
            unreachable!("loading only")
        }
        fn logits(&mut self, _: &(), _: &()) -> crate::backend::Result<Vec<f32>> {
            unreachable!("loading only")
        }
    }
}
