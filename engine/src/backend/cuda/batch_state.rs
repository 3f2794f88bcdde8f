//! The current batch on the device: token ids, positions and each row's KV cache row uploaded
//! once per batch (every layer's embed, RoPE and attention read them), the attention's chunk
//! maps with the block tables, and the logit rows (host side: the row selection turns them into
//! copies).
//!
//! A batch is checked before anything is uploaded: the device indexes the KV cache through its
//! block tables, so a bad one would read or write out of bounds rather than fail.

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
    /// The KV cache row each row's K and V go to (`kv_store`).
    pub dest: Grow<i64>,
    /// The same in the windowed layers' ring cache (window-only layout; empty without).
    pub window_dest: Grow<i64>,
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
            dest: Grow::new(gpu, allocs).map_err(|e| fail(format!("allocating batch buffers: {e}")))?,
            window_dest: Grow::new(gpu, allocs).map_err(|e| fail(format!("allocating batch buffers: {e}")))?,
            attn: AttnMaps::new(gpu, allocs)?,
        })
    }

    /// Checks `batch` (against the KV cache when there is one) and uploads it.
    pub(crate) fn begin(&mut self, gpu: &Gpu, batch: &Batch, kv: Option<&KvSpec>) -> Result<(), BackendError> {
        check(batch, kv).map_err(|why| fail(format!("bad batch: {why}")))?;
        upload(gpu, &as_i32(&batch.tokens), &mut self.tokens, "token ids")?;
        upload(gpu, &as_i32(&batch.positions), &mut self.positions, "positions")?;
        upload(gpu, &dest_rows(batch.physical_rows()), &mut self.dest, "KV cache rows")?;
        // The window tables are used only by a cache with windowed layers (checked against it).
        let windowed = kv.is_some_and(KvSpec::has_window_layers);
        let window_tables: &[u32] = if windowed { &batch.window_tables } else { &[] };
        if windowed {
            upload(gpu, &dest_rows(batch.window_rows()), &mut self.window_dest, "windowed layers' KV cache rows")?;
        }
        self.attn.prepare(gpu, &batch.chunks, &batch.block_tables, window_tables)?;
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

/// `kv_store`'s destination rows: -1 where a row has none (never for a checked batch: every
/// row's table reaches its position).
fn dest_rows(rows: Vec<Option<u64>>) -> Vec<i64> {
    rows.into_iter().map(|r| r.map_or(-1, |r| r as i64)).collect()
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

/// What the device relies on: one token and position per row, chunks that cover the rows in
/// order with consecutive positions, each chunk's block table inside the batch's tables and
/// covering its positions, logit rows inside the batch, every index within i32, and (with a KV
/// cache) the cache's block size and every block a chunk reads inside it, in the windowed
/// layers' cache too (through the window tables) when it has some.
pub(crate) fn check(b: &Batch, kv: Option<&KvSpec>) -> Result<(), String> {
    let rows = b.tokens.len();
    if rows == 0 {
        return Err("no rows".into());
    }
    if b.positions.len() != rows {
        return Err(format!("{rows} tokens but {} positions", b.positions.len()));
    }
    if !b.block_size.is_power_of_two() {
        return Err(format!("KV block size {} is not a power of two", b.block_size));
    }
    if let Some(kv) = kv.filter(|kv| kv.block_size != b.block_size as usize) {
        return Err(format!("blocks of {} positions, the KV cache's hold {}", b.block_size, kv.block_size));
    }
    if b.block_tables.len() > i32::MAX as usize {
        return Err(format!("{} block table entries do not fit the kernels' i32 indexes", b.block_tables.len()));
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
            if r >= rows || b.positions[r] as u64 != c.start_pos as u64 + (r - c.first_row as usize) as u64 {
                return Err(format!("row {r} disagrees with chunk {i} ({c:?})"));
            }
        }
        if c.table as u64 + c.table_len as u64 > b.block_tables.len() as u64 {
            return Err(format!(
                "chunk {i}: block table {}..+{} outside the batch's {} entries",
                c.table,
                c.table_len,
                b.block_tables.len()
            ));
        }
        let need = c.end_pos().div_ceil(b.block_size as u64);
        if need > c.table_len as u64 {
            return Err(format!(
                "chunk {i}: positions up to {} need {need} blocks of {}, its block table has {}",
                c.end_pos(),
                b.block_size,
                c.table_len
            ));
        }
        if let Some(kv) = kv {
            let table = &b.table(c)[..need as usize];
            if let Some(j) = table.iter().position(|&blk| blk as usize >= kv.blocks) {
                return Err(format!("chunk {i}: block table entry {j} is block {}, outside the KV cache's {} blocks", table[j], kv.blocks));
            }
            if kv.has_window_layers() {
                let window =
                    b.window_table(c).get(..need as usize).ok_or_else(|| format!("chunk {i}: no window table (a ring batch is needed)"))?;
                if let Some(j) = window.iter().position(|&blk| blk as usize >= kv.window_blocks) {
                    return Err(format!(
                        "chunk {i}: window table entry {j} is block {}, outside the windowed layers' {} blocks",
                        window[j], kv.window_blocks
                    ));
                }
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
        let mut b = Batch::new(4).unwrap();
        b.push(&[3], 0, &[5, 6, 7], Logits::Last).unwrap();
        b.push(&[1, 0, 2], 9, &[8], Logits::All).unwrap();
        b
    }

    /// 2 sequences of 16 positions in blocks of 4.
    const KV: KvSpec =
        KvSpec { layers: 1, blocks: 8, block_size: 4, kv_heads: 1, head_dim: 2, window_blocks: 0, window_layers: Vec::new() };

    #[test]
    fn a_batch_built_by_push_passes() {
        assert_eq!(check(&batch(), Some(&KV)), Ok(()));
        assert_eq!(check(&batch(), None), Ok(()));
    }

    #[test]
    fn bad_batches_are_named() {
        let mut b = batch();
        b.positions[3] = 0;
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
        let mut b = batch();
        b.chunks[1].table_len = 2;
        assert!(check(&b, None).unwrap_err().contains("chunk 1: positions up to 10 need 3 blocks of 4, its block table has 2"));
        let mut b = batch();
        b.chunks[1].table = 2;
        assert!(check(&b, None).unwrap_err().contains("outside the batch's 4 entries"));
    }

    #[test]
    fn tables_must_fit_the_kv_cache() {
        let mut b = Batch::new(4).unwrap();
        b.push(&[8], 0, &[1], Logits::Last).unwrap();
        assert!(check(&b, Some(&KV)).unwrap_err().contains("entry 0 is block 8, outside the KV cache's 8 blocks"));
        // Entries past the chunk's end are not read, so not checked.
        let mut b = Batch::new(4).unwrap();
        b.push(&[7, 6, 5, 99], 9, &[1, 2, 3], Logits::Last).unwrap();
        assert_eq!(check(&b, Some(&KV)), Ok(()));
        let mut b = Batch::new(4).unwrap();
        b.push(&[7, 6, 5, 99], 10, &[1, 2, 3], Logits::Last).unwrap();
        assert!(check(&b, Some(&KV)).unwrap_err().contains("entry 3 is block 99"));
        let mut b = Batch::new(8).unwrap();
        b.push(&[0], 0, &[1], Logits::Last).unwrap();
        assert!(check(&b, Some(&KV)).unwrap_err().contains("blocks of 8 positions, the KV cache's hold 4"));
    }

    #[test]
    fn window_tables_must_fit_the_windowed_layers_cache() {
        // 2 rings of 2 blocks for the windowed layer 0.
        let kv = KvSpec { layers: 2, window_blocks: 4, window_layers: vec![true, false], ..KV };
        let mut b = Batch::with_ring(4, 2).unwrap();
        b.push_in_ring(&[5, 6, 7], 1, 9, &[1, 2], Logits::Last).unwrap();
        assert_eq!(check(&b, Some(&kv)), Ok(()));
        b.window_tables[1] = 4;
        assert!(check(&b, Some(&kv)).unwrap_err().contains("window table entry 1 is block 4, outside the windowed layers' 4 blocks"));
        // A plain batch has no window tables for a cache that needs them.
        assert!(check(&batch(), Some(&kv)).unwrap_err().contains("no window table"));
    }

    #[test]
    fn row_runs_merge_consecutive_rows() {
        assert_eq!(row_runs(&[0, 1, 2, 3]), vec![(0, 0, 4)]);
        assert_eq!(row_runs(&[2, 3, 7, 9, 10]), vec![(2, 0, 2), (7, 2, 1), (9, 3, 2)]);
        assert_eq!(row_runs(&[5, 4]), vec![(5, 0, 1), (4, 1, 1)]);
        assert!(row_runs(&[]).is_empty());
    }
}
