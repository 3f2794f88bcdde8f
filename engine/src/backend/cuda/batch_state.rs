//! The current batch on the device: token ids, positions and slots uploaded once per batch
//! (every layer's embed, RoPE and attention read them), the attention's chunk maps, and the
//! logit rows (host side: the row selection turns them into copies).
//!
//! A batch is checked before anything is uploaded: the device indexes the KV cache with its
//! slots and positions, so a bad one would write out of bounds rather than fail.

use brink_kernels::cuda::{Gpu, error_name};
use cudarc::driver::{CudaSlice, DeviceRepr};

use super::attention::AttnMaps;
use super::buffers::{AllocCounter, Grow};
use super::fail;
use crate::backend::{Batch, KvSpec};
use crate::model::BackendError;

pub(crate) struct BatchState {
    /// Rows of the current batch (0 before the first).
    pub rows: usize,
    pub logit_rows: Vec<u32>,
    pub tokens: Grow<i32>,
    pub positions: Grow<i32>,
    pub slots: Grow<i32>,
    pub attn: AttnMaps,
}

impl BatchState {
    pub(crate) fn new(gpu: &Gpu, allocs: &AllocCounter) -> Result<Self, BackendError> {
        let grow = || Grow::new(gpu, allocs).map_err(|e| fail(format!("allocating batch buffers: {e}")));
        Ok(BatchState {
            rows: 0,
            logit_rows: Vec::new(),
            tokens: grow()?,
            positions: grow()?,
            slots: grow()?,
            attn: AttnMaps::new(gpu, allocs)?,
        })
    }

    /// Checks `batch` (against the KV cache when there is one) and uploads it.
    pub(crate) fn begin(&mut self, gpu: &Gpu, batch: &Batch, kv: Option<&KvSpec>) -> Result<(), BackendError> {
        check(batch, kv).map_err(|why| fail(format!("bad batch: {why}")))?;
        upload(gpu, &as_i32(&batch.tokens), &mut self.tokens, "token ids")?;
        upload(gpu, &as_i32(&batch.positions), &mut self.positions, "positions")?;
        upload(gpu, &as_i32(&batch.slots), &mut self.slots, "slots")?;
        self.attn.prepare(gpu, &batch.chunks)?;
        self.rows = batch.rows();
        self.logit_rows.clone_from(&batch.logit_rows);
        Ok(())
    }

    /// Fails when no batch has begun (ops that read the batch's ids or positions).
    pub(crate) fn require(&self, op: &str) -> Result<usize, BackendError> {
        if self.rows == 0 {
            return Err(fail(format!("{op}: no batch has begun (begin_batch)")));
        }
        Ok(self.rows)
    }
}

/// The values `check` has bounded to `i32::MAX`.
fn as_i32(v: &[u32]) -> Vec<i32> {
    v.iter().map(|&x| x as i32).collect()
}

pub(crate) fn upload<T: DeviceRepr>(gpu: &Gpu, host: &[T], dst: &mut Grow<T>, what: &str) -> Result<(), BackendError> {
    let failed = |e: String| fail(format!("uploading the batch's {what} ({} values): {e}", host.len()));
    dst.ensure(gpu, host.len()).map_err(|e| failed(e.to_string()))?;
    if host.is_empty() {
        return Ok(()); // a decode batch has no prefill tiles: nothing to copy
    }
    let buf: &mut CudaSlice<T> = dst;
    let mut view = buf.slice_mut(0..host.len());
    gpu.stream().memcpy_htod(host, &mut view).map_err(|e| failed(error_name(&e)))
}

/// What the device relies on: one token, position and slot per row, chunks that cover the rows
/// in order with consecutive positions of one slot, logit rows inside the batch, every index
/// within i32, and (with a KV cache) every slot and position inside it.
pub(crate) fn check(b: &Batch, kv: Option<&KvSpec>) -> Result<(), String> {
    let rows = b.tokens.len();
    if rows == 0 {
        return Err("no rows".into());
    }
    if b.positions.len() != rows || b.slots.len() != rows {
        return Err(format!("{rows} tokens but {} positions and {} slots", b.positions.len(), b.slots.len()));
    }
    if rows > i32::MAX as usize {
        return Err(format!("{rows} rows do not fit the kernels' i32 row indexes"));
    }
    if let Some(&t) = b.tokens.iter().find(|&&t| t > i32::MAX as u32) {
        return Err(format!("token id {t} does not fit i32"));
    }
    let mut next_row = 0u64;
    for (i, c) in b.chunks.iter().enumerate() {
        if c.first_row as u64 != next_row || c.len == 0 {
            return Err(format!("chunk {i} ({c:?}) does not start where the previous one ended (row {next_row}) or is empty"));
        }
        if c.end_pos() > i32::MAX as u64 {
            return Err(format!("chunk {i} ends at position {}, past i32", c.end_pos()));
        }
        for r in c.first_row as usize..c.first_row as usize + c.len as usize {
            if r >= rows || b.slots[r] != c.slot || b.positions[r] as u64 != c.start_pos as u64 + (r - c.first_row as usize) as u64 {
                return Err(format!("row {r} disagrees with chunk {i} ({c:?})"));
            }
        }
        if let Some(kv) = kv {
            if c.slot as usize >= kv.slots {
                return Err(format!("chunk {i}: slot {} outside the KV cache's {} slots", c.slot, kv.slots));
            }
            if c.end_pos() > kv.context as u64 {
                return Err(format!("chunk {i}: positions up to {} past the KV cache's context of {}", c.end_pos(), kv.context));
            }
        }
        next_row += c.len as u64;
    }
    if next_row != rows as u64 {
        return Err(format!("the chunks cover {next_row} of {rows} rows"));
    }
    if let Some(&r) = b.logit_rows.iter().find(|&&r| r as usize >= rows) {
        return Err(format!("logit row {r} outside the batch's {rows} rows"));
    }
    Ok(())
}

/// Copies that gather `rows` (source row indexes, in output order): `(source row, output row,
/// rows)` for each run of consecutive source rows, so that "every row" or "the last rows of
/// contiguous chunks" take one copy.
pub(crate) fn row_runs(rows: &[u32]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (dst, &src) in rows.iter().enumerate() {
        match runs.last_mut() {
            Some((s, _, n)) if *s + *n == src as usize => *n += 1,
            _ => runs.push((src as usize, dst, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Logits;

    fn batch() -> Batch {
        let mut b = Batch::default();
        b.push(0, 0, &[5, 6, 7], Logits::Last).unwrap();
        b.push(1, 9, &[8], Logits::All).unwrap();
        b
    }

    const KV: KvSpec = KvSpec { layers: 1, slots: 2, context: 16, kv_heads: 1, head_dim: 2 };

    #[test]
    fn a_batch_built_by_push_passes() {
        assert_eq!(check(&batch(), Some(&KV)), Ok(()));
        assert_eq!(check(&batch(), None), Ok(()));
    }

    #[test]
    fn bad_batches_are_named() {
        let mut b = batch();
        b.slots[3] = 0;
        assert!(check(&b, None).unwrap_err().contains("row 3 disagrees"));
        let mut b = batch();
        b.positions.pop();
        assert!(check(&b, None).unwrap_err().contains("positions"));
        let mut b = batch();
        b.logit_rows.push(4);
        assert!(check(&b, None).unwrap_err().contains("logit row 4"));
        let mut b = batch();
        b.chunks[1].first_row = 2;
        assert!(check(&b, None).unwrap_err().contains("chunk 1"));
        let mut b = batch();
        b.chunks.pop();
        assert!(check(&b, None).unwrap_err().contains("cover 3 of 4"));
        assert!(check(&Batch::default(), None).unwrap_err().contains("no rows"));
        let mut b = batch();
        b.tokens[0] = u32::MAX;
        assert!(check(&b, None).unwrap_err().contains("token id"));
    }

    #[test]
    fn slots_and_positions_must_fit_the_kv_cache() {
        let mut b = Batch::default();
        b.push(2, 0, &[1], Logits::Last).unwrap();
        assert!(check(&b, Some(&KV)).unwrap_err().contains("slot 2"));
        let mut b = Batch::default();
        b.push(1, 14, &[1, 2, 3], Logits::Last).unwrap();
        assert!(check(&b, Some(&KV)).unwrap_err().contains("context of 16"));
        let mut b = Batch::default();
        b.push(1, 13, &[1, 2, 3], Logits::Last).unwrap();
        assert_eq!(check(&b, Some(&KV)), Ok(()));
    }

    #[test]
    fn row_runs_merge_consecutive_rows() {
        assert_eq!(row_runs(&[0, 1, 2, 3]), vec![(0, 0, 4)]);
        assert_eq!(row_runs(&[2, 3, 7, 9, 10]), vec![(2, 0, 2), (7, 2, 1), (9, 3, 2)]);
        assert_eq!(row_runs(&[5, 4]), vec![(5, 0, 1), (4, 1, 1)]);
        assert!(row_runs(&[]).is_empty());
    }
}
