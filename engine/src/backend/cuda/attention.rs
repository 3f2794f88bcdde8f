//! Attention: the batch's K and V rows go into the f16 KV cache at their (slot, position), then
//! every query row attends causally over its sequence's cache (GQA: query head h reads KV head
//! h / (heads / kv_heads)).
//!
//! AWAITS branch h/attn (`brink_kernels::ops::attention`): [`kv_store`], [`prefill`] and
//! [`decode`] below return "not yet available" until its kernels are merged. Everything they
//! need is prepared here: the per-row slots and positions (uploaded with the batch), the chunk
//! table and the prefill tile map ([`AttnMaps`], built on the host in `begin_batch`), the
//! cache ([`KvLayer`]) and the checked shapes.

use super::batch_state::{BatchState, upload};
use super::buffers::{AllocCounter, CudaAct, Grow};
use super::kv::{KvCache, KvLayer};
use super::{awaiting, fail};
use crate::backend::{AttentionSpec, Chunk, KvSpec};
use crate::model::BackendError;
use brink_kernels::cuda::Gpu;

/// Queries per tile of the prefill kernel. Must equal the query tile of
/// `ops::attention::attention_prefill` (h/attn): take its constant when merging.
pub(crate) const PREFILL_QUERY_TILE: u32 = 64;

/// The batch's chunks as the attention kernels read them.
pub(crate) struct AttnMaps {
    /// `[chunks, 4]`: slot, start position, length, first row.
    pub chunk_table: Grow<i32>,
    /// `[tiles, 2]`: chunk, offset of the tile's first query in the chunk (prefill only).
    pub tiles: Grow<i32>,
    pub n_tiles: usize,
    /// Every chunk is one token: the split-K decode kernel runs instead of the prefill one.
    pub decode: bool,
}

impl AttnMaps {
    pub(crate) fn new(gpu: &Gpu, allocs: &AllocCounter) -> Result<Self, BackendError> {
        let grow = || Grow::new(gpu, allocs).map_err(|e| fail(format!("allocating attention maps: {e}")));
        Ok(AttnMaps { chunk_table: grow()?, tiles: grow()?, n_tiles: 0, decode: false })
    }

    pub(crate) fn prepare(&mut self, gpu: &Gpu, chunks: &[Chunk]) -> Result<(), BackendError> {
        self.decode = chunks.iter().all(|c| c.len == 1);
        upload(gpu, &chunk_table(chunks), &mut self.chunk_table, "chunk table")?;
        let tiles = if self.decode { Vec::new() } else { prefill_tiles(chunks, PREFILL_QUERY_TILE) };
        self.n_tiles = tiles.len() / 2;
        upload(gpu, &tiles, &mut self.tiles, "prefill tile map")
    }
}

/// `[slot, start_pos, len, first_row]` per chunk (bounded to i32 by the batch check).
pub(crate) fn chunk_table(chunks: &[Chunk]) -> Vec<i32> {
    chunks.iter().flat_map(|c| [c.slot as i32, c.start_pos as i32, c.len as i32, c.first_row as i32]).collect()
}

/// The prefill kernel's work list: each chunk cut into tiles of `tile` queries (the last one
/// partial), `[chunk, first query offset]` per tile. Tiles never straddle chunks, so a tile's
/// queries share one sequence and one causal frontier.
pub(crate) fn prefill_tiles(chunks: &[Chunk], tile: u32) -> Vec<i32> {
    chunks.iter().enumerate().flat_map(|(i, c)| (0..c.len.div_ceil(tile)).flat_map(move |t| [i as i32, (t * tile) as i32])).collect()
}

/// The shapes attention needs: Q `[rows, heads·d]`, K and V `[rows, kv_heads·d]`, a layer and
/// head layout the cache was made for.
pub(crate) fn check_shapes(spec: &AttentionSpec, kv: &KvSpec, rows: usize, q: &CudaAct, k: &CudaAct, v: &CudaAct) -> Result<(), String> {
    let (qw, kvw) = (spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim);
    if spec.heads == 0 || spec.kv_heads == 0 || !spec.heads.is_multiple_of(spec.kv_heads) {
        return Err(format!("{} heads cannot share {} KV heads", spec.heads, spec.kv_heads));
    }
    if spec.layer >= kv.layers || spec.kv_heads != kv.kv_heads || spec.head_dim != kv.head_dim {
        return Err(format!(
            "layer {} with {} KV heads of {} does not fit the KV cache ({} layers, {} heads of {})",
            spec.layer, spec.kv_heads, spec.head_dim, kv.layers, kv.kv_heads, kv.head_dim
        ));
    }
    for (name, a, width) in [("Q", q, qw), ("K", k, kvw), ("V", v, kvw)] {
        if a.rows() != rows || a.width() != width {
            return Err(format!("{name} is [{}, {}], expected [{rows}, {width}] (the batch's rows)", a.rows(), a.width()));
        }
    }
    Ok(())
}

/// Stores K and V, then attends; `out` is `[rows, heads·d]`.
pub(crate) fn attention(
    gpu: &Gpu,
    kv: Option<&mut KvCache>,
    batch: &BatchState,
    (q, k, v): (&CudaAct, &CudaAct, &CudaAct),
    spec: &AttentionSpec,
    out: &mut CudaAct,
) -> Result<(), BackendError> {
    let rows = batch.require("attention")?;
    let kv = kv.ok_or_else(|| fail("attention: no KV cache (alloc_kv was not called)"))?;
    check_shapes(spec, &kv.spec, rows, q, k, v).map_err(|why| fail(format!("attention (layer {}): {why}", spec.layer)))?;
    let layer = &mut kv.layers[spec.layer];
    kv_store(gpu, batch, k, v, layer)?;
    if batch.attn.decode { decode(gpu, batch, q, layer, spec, out) } else { prefill(gpu, batch, q, layer, spec, out) }
}

/// AWAITS h/attn: `kv_store` of K and V rows (f32) into `layer` (f16) at `batch.slots` /
/// `batch.positions`, one launch for both.
fn kv_store(_gpu: &Gpu, batch: &BatchState, k: &CudaAct, _v: &CudaAct, layer: &mut KvLayer) -> Result<(), BackendError> {
    let shape = format!("rows={} kv_width={} cache K/V={}/{} values", batch.rows, k.width(), layer.k.len(), layer.v.len());
    Err(awaiting("kv_store", shape, "h/attn"))
}

/// AWAITS h/attn: `attention_prefill` over `batch.attn.tiles` (`n_tiles` tiles on grid.x, each
/// mapped to its chunk through `batch.attn.chunk_table`), GQA, `spec.scale`.
fn prefill(
    _gpu: &Gpu,
    batch: &BatchState,
    _q: &CudaAct,
    _layer: &KvLayer,
    spec: &AttentionSpec,
    _out: &mut CudaAct,
) -> Result<(), BackendError> {
    let shape =
        format!("rows={} tiles={} heads={}/{} head_dim={}", batch.rows, batch.attn.n_tiles, spec.heads, spec.kv_heads, spec.head_dim);
    Err(awaiting("attention_prefill", shape, "h/attn"))
}

/// AWAITS h/attn: split-K `attention_decode`, one query row per sequence at
/// `batch.slots`/`batch.positions`.
fn decode(
    _gpu: &Gpu,
    batch: &BatchState,
    _q: &CudaAct,
    _layer: &KvLayer,
    spec: &AttentionSpec,
    _out: &mut CudaAct,
) -> Result<(), BackendError> {
    let shape = format!("rows={} heads={}/{} head_dim={}", batch.rows, spec.heads, spec.kv_heads, spec.head_dim);
    Err(awaiting("attention_decode", shape, "h/attn"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(slot: u32, start_pos: u32, len: u32, first_row: u32) -> Chunk {
        Chunk { slot, start_pos, len, first_row }
    }

    #[test]
    fn tiles_cover_every_query_once_without_straddling_chunks() {
        let chunks = [chunk(0, 0, 130, 0), chunk(3, 7, 1, 130), chunk(1, 0, 64, 131)];
        let t = prefill_tiles(&chunks, 64);
        assert_eq!(t, vec![0, 0, 0, 64, 0, 128, 1, 0, 2, 0]);
        let covered: u32 = t.chunks(2).map(|p| (chunks[p[0] as usize].len - p[1] as u32).min(64)).sum();
        assert_eq!(covered, 130 + 1 + 64);
    }

    #[test]
    fn chunk_table_is_four_ints_per_chunk() {
        assert_eq!(chunk_table(&[chunk(2, 5, 3, 0), chunk(0, 0, 1, 3)]), vec![2, 5, 3, 0, 0, 0, 1, 3]);
    }
}
