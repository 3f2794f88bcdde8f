//! Ops that work row by row: RMS norm (whole rows or per head), RoPE, `add` and `add_bias`.

use brink_kernels::cuda::{Gpu, GpuError};
use brink_kernels::ops::norm_rope::{self, NormRopeCase};
use brink_kernels::ops::rmsnorm::{self, RmsNormCase};
use brink_kernels::ops::rmsnorm_q8_1;
use brink_kernels::ops::rope::{self, RopeSpec, RopeTable, RopeYarn};
use brink_kernels::quant::QK;

use super::batch_state::BatchState;
use super::buffers::{ActRows, CudaAct, Grow};
use super::dense::q8_1_bytes;
use super::weights::{CudaWeight, WeightData};
use super::{fail, gpu_fail};
use crate::model::{BackendError, MatrixDims};

/// Groups of `group` values in a row of `width` (1 for a whole-row norm, the head count for the
/// per-head Q/K norm), or why `width` does not split into them.
pub(crate) fn norm_groups(width: usize, group: usize) -> Result<usize, String> {
    if group == 0 || !width.is_multiple_of(group) {
        return Err(format!("a row of {width} does not split into norm groups of {group}"));
    }
    Ok(width / group)
}

/// `out = rms_norm(x)` over each `w.len()`-wide group of every row, scaled by `w`.
pub(crate) fn rms_norm(gpu: &Gpu, x: &CudaAct, w: &CudaWeight, eps: f32, out: &mut CudaAct) -> Result<(), BackendError> {
    let what = |e: String| fail(format!("rms_norm by {}: {e}", w.name()));
    let WeightData::F32(scale) = &w.data else {
        return Err(what("a norm weight must be held as f32".into()));
    };
    let groups = norm_groups(x.width(), w.row_len()).map_err(what)?;
    let case = RmsNormCase { width: w.row_len() as u32, rows_per_token: groups as u32, eps };
    rmsnorm::launch(gpu, x.rows() as u64, &case, &x.view(), &scale.as_view(), &mut out.view_mut())
        .map_err(|e| gpu_fail(format_args!("rms_norm by {}", w.name()), &e))
}

/// Whether `rms_norm` of `x` by `w` also writes its q8_1 rows (`rms_norm_q8_1`): a whole-row
/// norm (the hidden norms, whose outputs feed the quantized projections and the router) of a
/// width in whole q8_1 blocks. The per-head Q/K norms do not.
pub(crate) fn emits_q8_1(x: &CudaAct, w: &CudaWeight) -> bool {
    matches!(w.data, WeightData::F32(_)) && w.row_len() == x.width() && x.width().is_multiple_of(QK) && x.width() <= i32::MAX as usize
}

/// `out = rms_norm(x)` as [`rms_norm`] computes it, and `xq` = its dense q8_1 quantization as
/// `quantize` computes it from `out`, in one launch (`rmsnorm_q8_1`); `xq` then records that it
/// holds `out`'s rows, so the projection or the MoE block after the norm quantizes nothing.
pub(crate) fn rms_norm_q8_1(
    gpu: &Gpu,
    x: &CudaAct,
    w: &CudaWeight,
    eps: f32,
    out: &mut CudaAct,
    xq: &mut Grow<u8>,
) -> Result<(), BackendError> {
    let what = |e: String| fail(format!("rms_norm by {}: {e}", w.name()));
    let WeightData::F32(scale) = &w.data else {
        return Err(what("a norm weight must be held as f32".into()));
    };
    let failed = |e: GpuError| gpu_fail(format_args!("rms_norm (with q8_1) by {}", w.name()), &e);
    let case = RmsNormCase { width: x.width() as u32, rows_per_token: 1, eps };
    xq.set_holds(None);
    xq.ensure(gpu, q8_1_bytes(x.rows(), x.width())).map_err(failed)?;
    rmsnorm_q8_1::launch(gpu, x.rows() as u64, &case, &x.view(), &scale.as_view(), &mut out.buf, &mut **xq).map_err(failed)?;
    xq.set_holds(Some(ActRows::of(out, out.rows(), out.width())));
    Ok(())
}

/// The frequency table of `spec` (under `yarn`), made on first use (one per model in practice).
fn table<'a>(gpu: &Gpu, tables: &'a mut Vec<RopeTable>, spec: RopeSpec, yarn: Option<RopeYarn>) -> Result<&'a RopeTable, String> {
    let at = match tables.iter().position(|t| t.spec() == spec && t.yarn() == yarn) {
        Some(i) => i,
        None => {
            tables.push(RopeTable::with_yarn(gpu, spec, yarn).map_err(|e| e.to_string())?);
            tables.len() - 1
        }
    };
    Ok(&tables[at])
}

/// NEOX RoPE (YaRN-scaled when `yarn` is given) of each `head_dim` group of `x`, in place, at
/// the batch's positions.
pub(crate) fn rope(
    gpu: &Gpu,
    batch: &BatchState,
    tables: &mut Vec<RopeTable>,
    x: &mut CudaAct,
    (head_dim, theta, yarn): (usize, f32, Option<RopeYarn>),
) -> Result<(), BackendError> {
    let rows = batch.require("rope")?;
    let what = |e: String| fail(format!("rope (head_dim {head_dim}, theta {theta}): {e}"));
    if x.rows() != rows {
        return Err(what(format!("{} rows, the batch has {rows} positions", x.rows())));
    }
    let heads = norm_groups(x.width(), head_dim).map_err(what)?;
    let t = table(gpu, tables, RopeSpec { head_dim: head_dim as u32, theta }, yarn).map_err(what)?;
    let positions = batch.positions.slice(0..rows);
    rope::launch(gpu, rows as u64, heads as u32, t, &positions, &mut x.view_mut())
        .map_err(|e| gpu_fail(format_args!("rope (head_dim {head_dim}, theta {theta})"), &e))
}

/// `out = rope(rms_norm(x))` over each `head_dim` group of `x` (the per-head Q/K norm and the
/// rotation) in one launch (`rmsnorm_rope_neox`), bit for bit [`rms_norm`] then [`rope`];
/// `Ok(false)` (nothing launched) for a shape that kernel does not take (a head wider than a
/// warp's row), which the caller then runs as the two ops.
pub(crate) fn norm_rope(
    gpu: &Gpu,
    batch: &BatchState,
    tables: &mut Vec<RopeTable>,
    x: &CudaAct,
    w: &CudaWeight,
    (eps, head_dim, theta): (f32, usize, f32),
    out: &mut CudaAct,
) -> Result<bool, BackendError> {
    let WeightData::F32(scale) = &w.data else { return Ok(false) };
    if w.row_len() != head_dim || !x.width().is_multiple_of(head_dim.max(1)) || head_dim > rmsnorm::WARP_ROW_MAX as usize {
        return Ok(false);
    }
    let rows = batch.require("norm_rope")?;
    let what = |e: String| fail(format!("norm_rope by {} (head_dim {head_dim}, theta {theta}): {e}", w.name()));
    if x.rows() != rows {
        return Err(what(format!("{} rows, the batch has {rows} positions", x.rows())));
    }
    let heads = norm_groups(x.width(), head_dim).map_err(what)?;
    let c = NormRopeCase { heads: heads as u32, head_dim: head_dim as u32, eps, theta, sequences: 1 };
    if norm_rope::plan(rows as u64, &c, gpu.limits()).is_err() {
        return Ok(false);
    }
    let t = table(gpu, tables, RopeSpec { head_dim: head_dim as u32, theta }, None).map_err(what)?;
    let positions = batch.positions.slice(0..rows);
    norm_rope::launch(gpu, rows as u64, &c, t, &positions, &scale.as_view(), &x.view(), &mut out.view_mut())
        .map_err(|e| gpu_fail(format_args!("norm_rope by {} (head_dim {head_dim}, theta {theta})", w.name()), &e))?;
    Ok(true)
}

/// `x += y` (the residual connections).
pub(crate) fn add(gpu: &Gpu, x: &mut CudaAct, y: &CudaAct) -> Result<(), BackendError> {
    if (x.rows(), x.width()) != (y.rows(), y.width()) {
        return Err(fail(format!("add: [{}, {}] + [{}, {}]", x.rows(), x.width(), y.rows(), y.width())));
    }
    let n = x.len() as u64;
    brink_kernels::ops::add::launch_in_place(gpu, n, &mut x.view_mut(), &y.view()).map_err(|e| gpu_fail("add", &e))
}

/// `x[r] += bias` for every row (gpt-oss's q, k, v and o projection biases).
pub(crate) fn add_bias(gpu: &Gpu, x: &mut CudaAct, bias: &CudaWeight) -> Result<(), BackendError> {
    let WeightData::F32(values) = &bias.data else {
        return Err(fail(format!("bias {}: must be held as f32 values", bias.name())));
    };
    if values.len() != x.width() {
        return Err(fail(format!("bias {} holds {} values; the rows are {} wide", bias.name(), values.len(), x.width())));
    }
    let rows = x.rows() as u64;
    brink_kernels::ops::bias::launch(gpu, rows, &mut x.view_mut(), &values.as_view())
        .map_err(|e| gpu_fail(format_args!("bias {}", bias.name()), &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rope kernel's twin under gpt-oss's YaRN (the blended frequency table, cos and sin
    /// scaled) against the CPU backend's `rope_yarn` (llama.cpp's): the same rotation, the
    /// angles rounded along other paths (one f32 product of a blended frequency; the CPU's
    /// iterated theta and its fma mix).
    #[test]
    fn yarn_twin_matches_the_cpu_backends_rope_yarn() {
        use crate::ggml_cpu::{Yarn, rope_neox_yarn};
        use brink_kernels::ops::rope::rope_yarn_cpu;
        let (heads, d, theta) = (8, 64, 150_000.0f32);
        let y = RopeYarn::GPT_OSS;
        let cpu_yarn = Yarn {
            freq_scale: 1.0 / y.factor,
            ext_factor: 1.0,
            attn_factor: y.attn_factor,
            beta_fast: y.beta_fast,
            beta_slow: y.beta_slow,
            n_ctx_orig: y.orig_ctx,
        };
        let positions: Vec<u32> = vec![0, 1, 2, 17, 127, 128, 1000, 4095, 4096];
        let x = brink_kernels::testdata::uniform_row(9, 0, positions.len() * heads * d, 1.0);
        let (mut dev, mut cpu) = (x.clone(), x);
        let pos_i32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        rope_yarn_cpu(&mut dev, &pos_i32, heads, &RopeSpec { head_dim: d as u32, theta }, Some(&y));
        rope_neox_yarn(&mut cpu, heads, d, &positions, theta, &cpu_yarn);
        let worst = dev.iter().zip(&cpu).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 2e-3, "largest difference {worst}");
        // Position 0 rotates nothing: both scale by mscale alone.
        assert!(dev[..heads * d].iter().zip(&cpu[..heads * d]).all(|(a, b)| (a - b).abs() <= 1e-6));
    }

    #[test]
    fn norm_groups_whole_rows_and_heads() {
        assert_eq!(norm_groups(2048, 2048), Ok(1));
        assert_eq!(norm_groups(4096, 128), Ok(32));
        assert!(norm_groups(100, 64).is_err());
        assert!(norm_groups(100, 0).is_err());
    }
}
