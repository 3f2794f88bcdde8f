//! Dense projections `y = x · Wᵀ` (the attention projections, the router, the LM head).
//!
//! Quantized weights: x is quantized to q8_1 rows (`quantize`, dense mode), then the dp4a
//! GEMV (up to 8 rows: decode) or tiled GEMM of `output_head` computes every output row; the
//! kernels' `path` picks which; K-quant weights take the same call. f32 weights (tied
//! embedding tables widened at load, the router's F32 matrix) take `dense_f32`.

use brink_kernels::cuda::{Gpu, GpuError};
use brink_kernels::ops::linear::LinearCase;
use brink_kernels::ops::output_head::{self, HeadBuffers, HeadDims};
use brink_kernels::ops::qkv;
use brink_kernels::ops::quantize::{self, Source};
use brink_kernels::quant::{BLOCK_Q8_1_BYTES, QK, WeightType};
use cudarc::driver::CudaSlice;

use super::buffers::{ActRows, CudaAct, Grow};
use super::weights::{CudaWeight, WeightData};
use super::{fail, gpu_fail};
use crate::model::{BackendError, MatrixDims};
use brink_kernels::ops::dense_f32::{self, DenseF32Case};

/// Bytes of `rows` q8_1 rows of `k` values.
pub(crate) fn q8_1_bytes(rows: usize, k: usize) -> usize {
    rows * (k / QK) * BLOCK_Q8_1_BYTES
}

/// Makes `xq` hold the first `rows` rows of `x` (`[rows, k]`) as q8_1 (dense `quantize`) and
/// records that it does. Nothing is launched when `xq` holds exactly those rows already: the
/// norm before this projection wrote them with its output (`pointwise::rms_norm_q8_1`), or an
/// earlier projection of the same rows did. The record and the rule that keeps it true are
/// `Grow`'s and `CudaBackend::stale_q8_1`'s.
pub(crate) fn quantize_rows(gpu: &Gpu, x: &CudaAct, rows: usize, k: usize, xq: &mut Grow<u8>) -> Result<(), GpuError> {
    let these = ActRows::of(x, rows, k);
    if xq.holds(&these) {
        return Ok(());
    }
    xq.set_holds(None);
    xq.ensure(gpu, q8_1_bytes(rows, k))?;
    quantize::launch(gpu, &x.buf, rows as u64, k as u32, rows as u64, Source::Dense, &mut **xq)?;
    xq.set_holds(Some(these));
    Ok(())
}

/// `out[rows, n] = xq · Wᵀ` for q8_1 rows `xq` and `n` rows of `k` quantized weights.
pub(crate) fn project_q8_1(
    gpu: &Gpu,
    xq: &CudaSlice<u8>,
    rows: usize,
    (k, n): (usize, usize),
    (wtype, w): (WeightType, &CudaSlice<u8>),
    out: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    let d = HeadDims { hidden: k as u32, vocab: n as u32, wtype };
    output_head::launch(gpu, &d, rows as u64, rows as u64, HeadBuffers { x: xq, rows: None, w, out })
}

/// The width check every projection makes first: `x` rows of `k` against `w` `[n, k]`.
pub(crate) fn check_matrix(w: &CudaWeight, k: usize, op: &str) -> Result<usize, BackendError> {
    if w.dims().len() > 2 || w.row_len() != k {
        return Err(fail(format!("{op}: {} has dims {:?}, expected [{k}, n] for rows of width {k}", w.name(), w.dims())));
    }
    if k > i32::MAX as usize || w.rows() > i32::MAX as usize {
        return Err(fail(format!("{op}: {} is wider than the kernels' i32 widths", w.name())));
    }
    Ok(w.rows())
}

/// `out[rows, n] = x · Wᵀ` for `x` `[rows, k]`, through the kernels `w`'s layout calls for;
/// `xq` is the q8_1 scratch.
pub(crate) fn project(
    gpu: &Gpu,
    x: &CudaAct,
    (rows, k): (usize, usize),
    w: &CudaWeight,
    xq: &mut Grow<u8>,
    out: &mut CudaSlice<f32>,
) -> Result<(), BackendError> {
    let n = w.rows();
    let failed = |e: GpuError| gpu_fail(format_args!("projection by {}", w.name()), &e);
    match &w.data {
        WeightData::Blocks { wtype, bytes } => {
            quantize_rows(gpu, x, rows, k, xq).map_err(failed)?;
            project_q8_1(gpu, xq, rows, (k, n), (*wtype, bytes), out).map_err(failed)
        }
        WeightData::F32(values) => dense_f32(gpu, &x.buf, (rows, k), values, n, out),
    }
}

/// `outs[i] = x · Wᵢᵀ` for weights of the same width (q, k and v): `x` is quantized once for
/// every quantized weight (or not at all, when the norm before left its rows in `xq`); each
/// output is the value `project` gives. Up to three quantized weights are one launch
/// (`qkv`: at decode `output_head_gemv3`, the column tiles of all of them on one grid; above
/// 8 rows the same per-matrix launches as `project`).
pub(crate) fn project_each<const N: usize>(
    gpu: &Gpu,
    x: &CudaAct,
    (rows, k): (usize, usize),
    ws: &[&CudaWeight; N],
    xq: &mut Grow<u8>,
    outs: [&mut CudaSlice<f32>; N],
) -> Result<(), BackendError> {
    let blocks: [Option<(WeightType, &CudaSlice<u8>)>; N] = std::array::from_fn(|i| match &ws[i].data {
        WeightData::Blocks { wtype, bytes } => Some((*wtype, bytes)),
        WeightData::F32(_) => None,
    });
    if N <= qkv::MAX_MATRICES && blocks.iter().all(Option::is_some) {
        let names = || ws.iter().map(|w| w.name()).collect::<Vec<_>>().join(", ");
        let failed = |e: GpuError| gpu_fail(format_args!("projection by {}", names()), &e);
        quantize_rows(gpu, x, rows, k, xq).map_err(failed)?;
        let ps: [LinearCase; N] =
            std::array::from_fn(|i| LinearCase { n: ws[i].rows() as u32, k: k as u32, wtype: blocks[i].map_or(WeightType::Q8_0, |b| b.0) });
        let w: [&CudaSlice<u8>; N] = std::array::from_fn(|i| blocks[i].map_or(&**xq, |b| b.1));
        let mut outs = outs;
        return qkv::launch(gpu, rows as u64, &ps, xq, &w, &mut outs).map_err(failed);
    }
    for (w, out) in ws.iter().zip(outs) {
        match &w.data {
            WeightData::Blocks { wtype, bytes } => {
                let failed = |e: GpuError| gpu_fail(format_args!("projection by {}", w.name()), &e);
                // Launches nothing after the first (or when the norm left the rows quantized).
                quantize_rows(gpu, x, rows, k, xq).map_err(failed)?;
                project_q8_1(gpu, xq, rows, (k, w.rows()), (*wtype, bytes), out).map_err(failed)?;
            }
            WeightData::F32(values) => dense_f32(gpu, &x.buf, (rows, k), values, w.rows(), out)?,
        }
    }
    Ok(())
}

/// `out[rows, n] = x · Wᵀ` in f32 for f32 `W [n, k]` (the router).
pub(crate) fn dense_f32(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    (rows, k): (usize, usize),
    w: &CudaSlice<f32>,
    n: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), BackendError> {
    let case = DenseF32Case { n: n as u32, k: k as u32 };
    let failed = |e: GpuError| gpu_fail(format_args!("dense_f32 [rows={rows} k={k} n={n}]"), &e);
    if x.len() < rows * k || out.len() < rows * n {
        return Err(fail(format!("dense_f32: buffers of {} and {} values for [{rows}, {k}] -> [{rows}, {n}]", x.len(), out.len())));
    }
    dense_f32::launch(gpu, rows as u64, &case, &w.as_view(), &x.slice(0..rows * k), &mut out.slice_mut(0..rows * n)).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_1_rows_take_36_bytes_per_32_values() {
        assert_eq!(q8_1_bytes(3, 64), 3 * 2 * 36);
        assert_eq!(q8_1_bytes(0, 2048), 0);
    }
}
