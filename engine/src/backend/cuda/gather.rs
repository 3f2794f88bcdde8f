//! Row gathers: the embedding lookup (table rows by token id) and the selection of the rows
//! whose logits are wanted.

use brink_kernels::cuda::{Gpu, error_name};
use brink_kernels::ops::embed::{self, BadIds, EmbedCase, TableType};

use super::batch_state::{BatchState, row_runs};
use super::buffers::CudaAct;
use super::weights::{CudaWeight, WeightData};
use super::{fail, gpu_fail};
use crate::model::{BackendError, MatrixDims};

/// `out [rows, hidden]` = the table rows of the batch's tokens. An id outside the table reads
/// as zeros and is counted in `bad` (read with the logits, when the step synchronises).
pub(crate) fn embed(gpu: &Gpu, batch: &BatchState, table: &CudaWeight, bad: &mut BadIds, out: &mut CudaAct) -> Result<(), BackendError> {
    let rows = batch.require("embed")?;
    let what = |e: String| fail(format!("embed from {}: {e}", table.name()));
    if table.dims().len() != 2 || table.rows() > i32::MAX as usize || table.row_len() > i32::MAX as usize {
        return Err(what(format!("dims {:?} are not a [hidden, vocab] table within i32", table.dims())));
    }
    let (vocab, hidden) = (table.rows() as u32, table.row_len() as u32);
    let ids = batch.tokens.slice(0..rows);
    let mut o = out.view_mut();
    let launched = match &table.data {
        WeightData::Blocks { wtype, bytes } => {
            let t = TableType::ALL
                .into_iter()
                .find(|t| t.quant() == Some(*wtype))
                .ok_or_else(|| what(format!("the embed kernel reads no {wtype} table")))?;
            embed::launch(gpu, rows as u64, &EmbedCase { vocab, hidden, table: t }, &ids, &bytes.as_view(), &mut o, bad)
        }
        WeightData::F32(values) => {
            embed::launch(gpu, rows as u64, &EmbedCase { vocab, hidden, table: TableType::F32 }, &ids, &values.as_view(), &mut o, bad)
        }
    };
    launched.map_err(|e| gpu_fail(format_args!("embed from {}", table.name()), &e))
}

/// Copies the rows `rows` of `x` into `out`, one device-to-device copy per run of consecutive
/// rows.
pub(crate) fn select_rows(gpu: &Gpu, x: &CudaAct, rows: &[u32], out: &mut CudaAct) -> Result<(), BackendError> {
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= x.rows()) {
        return Err(fail(format!("select_logit_rows: row {r} of an activation of {} rows", x.rows())));
    }
    let w = x.width();
    for (src, dst, n) in row_runs(rows) {
        let from = x.buf.slice(src * w..(src + n) * w);
        let mut to = out.buf.slice_mut(dst * w..(dst + n) * w);
        gpu.stream()
            .memcpy_dtod(&from, &mut to)
            .map_err(|e| fail(format!("select_logit_rows: copying rows {src}..{}: {}", src + n, error_name(&e))))?;
    }
    Ok(())
}
