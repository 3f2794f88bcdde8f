//! Writes a batch's K and V rows into the f16 KV cache of a layer.
//!
//! K and V rows are f32 `[rows, n_kv · head_dim]` (after the K norm and RoPE); row r goes to
//! cache row `dest[r]` (a device array of i64 the engine fills from its chunks' block tables:
//! `block · block_size + pos % block_size`, see [`physical_row`]) of the paged caches `[blocks,
//! block_size, n_kv, head_dim]`, rounded to nearest even as `__float2half_rn`
//! (`cuda/kv_store.cu`). A row whose destination lies outside the cache is dropped on both sides,
//! so a bad index cannot write out of bounds. Geometry: a grid-stride loop over rows x width/4
//! items, 256 threads, 64-bit offsets (a cache of 327,680 blocks x 16 x 512 passes 2^31).

use cudarc::driver::{CudaView, CudaViewMut, DevicePtr, DevicePtrMut, PushKernelArg};
use half::f16;

use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::attention::AttentionSpec;
pub use crate::ops::attention::physical_row;
use crate::sources::KV_STORE;
use crate::thresholds::I32_MAX;

pub const KERNEL: &str = "kv_store";
const THREADS: u32 = 256;

/// The cache row of a row's destination, or `None` when it lies outside the cache (the row is dropped).
fn destination(dest: i64, spec: &AttentionSpec) -> Option<u64> {
    u64::try_from(dest).ok().filter(|&d| d < spec.cache_rows())
}

fn shape(rows: u64, spec: &AttentionSpec) -> String {
    format!("rows={rows} {}", spec.describe())
}

/// Grid-stride over the `rows · n_kv · head_dim / 4` items (4 floats of K and of V each).
pub fn plan(rows: u64, spec: &AttentionSpec, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let what = if rows == 0 {
        Some("0 rows".to_string())
    } else if rows > I32_MAX {
        Some(format!("{rows} rows: the destination array is indexed by row, at most 2^31 − 1"))
    } else {
        spec.unsupported()
    };
    if let Some(what) = what {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: shape(rows, spec) });
    }
    let (items, per_block) = (rows * spec.kv_width() / 4, THREADS as u64);
    Launch::checked(
        KERNEL,
        shape(rows, spec),
        [grid_stride_blocks(items, per_block, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block }],
        limits,
    )
}

/// CPU twin: rows of `k`, `v` (`[rows, n_kv · head_dim]`) into the caches at cache rows
/// `dest[r]`. Rows outside the cache are dropped, as on the device.
pub fn kv_store_cpu(
    k_cache: &mut [f16],
    v_cache: &mut [f16],
    k: &[f32],
    v: &[f32],
    dest: &[i64],
    spec: &AttentionSpec,
) -> Result<(), PlanError> {
    let rows = dest.len() as u64;
    let w = spec.kv_width() as usize;
    let what = spec.unsupported().or_else(|| {
        let need = spec.cache_elems() as usize;
        if k.len() != dest.len() * w || v.len() != k.len() {
            Some(format!("{} destinations, {} K and {} V floats for rows of {w}", dest.len(), k.len(), v.len()))
        } else if k_cache.len() < need || v_cache.len() < need {
            Some(format!("caches of {} and {} elements, the spec needs {need}", k_cache.len(), v_cache.len()))
        } else {
            None
        }
    });
    if let Some(what) = what {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: shape(rows, spec) });
    }
    for (r, &d) in dest.iter().enumerate() {
        if let Some(at) = destination(d, spec) {
            let dst = at as usize * w;
            for (cache, src) in [(&mut *k_cache, k), (&mut *v_cache, v)] {
                for (c, &x) in cache[dst..dst + w].iter_mut().zip(&src[r * w..(r + 1) * w]) {
                    *c = f16::from_f32(x);
                }
            }
        }
    }
    Ok(())
}

/// The rows to store, on the device.
pub struct KvRows<'a> {
    /// `[rows, n_kv · head_dim]` f32.
    pub k: CudaView<'a, f32>,
    pub v: CudaView<'a, f32>,
    /// `[rows]` cache rows ([`physical_row`]); a negative one drops its row.
    pub dest: CudaView<'a, i64>,
}

/// Stores `rows` rows into the caches (f16 bits, `[blocks, block_size, n_kv, head_dim]`).
pub fn launch(
    gpu: &Gpu,
    spec: &AttentionSpec,
    rows: u64,
    src: &KvRows<'_>,
    k_cache: &mut CudaViewMut<'_, u16>,
    v_cache: &mut CudaViewMut<'_, u16>,
) -> Result<(), GpuError> {
    let p = plan(rows, spec, gpu.limits())?;
    let row_bytes = 4 * rows * spec.kv_width();
    require_bytes(
        &p,
        &[
            ("k", bytes_of(src.k.len(), 4), row_bytes),
            ("v", bytes_of(src.v.len(), 4), row_bytes),
            ("dest", bytes_of(src.dest.len(), 8), 8 * rows),
            ("k_cache", bytes_of(k_cache.len(), 2), 2 * spec.cache_elems()),
            ("v_cache", bytes_of(v_cache.len(), 2), 2 * spec.cache_elems()),
        ],
    )?;
    let stream = gpu.stream();
    let (k, _k) = src.k.device_ptr(stream);
    let (v, _v) = src.v.device_ptr(stream);
    let (kc, _kc) = k_cache.device_ptr_mut(stream);
    let (vc, _vc) = v_cache.device_ptr_mut(stream);
    // 16-byte loads of the rows, 8-byte stores into the caches.
    if let Some((name, addr)) = [("k", k, 16), ("v", v, 16), ("k_cache", kc, 8), ("v_cache", vc, 8)]
        .into_iter()
        .find(|(_, a, n)| a % n != 0)
        .map(|(name, a, _)| (name, a))
    {
        let what = format!("buffer {name} at {addr:#x} is not aligned for the kernel's vector accesses");
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: p.shape.clone() }.into());
    }
    let f = gpu.function(&KV_STORE, KERNEL)?;
    // The spec's checks bound the cache's rows well below 2^63.
    let (width, cache_rows) = (spec.kv_width() as i32, spec.cache_rows() as i64);
    gpu.launch(&p, &f, |b| {
        b.arg(&k).arg(&v).arg(&src.dest).arg(&kc).arg(&vc);
        b.arg(&rows).arg(&width).arg(&cache_rows);
    })?;
    Ok(())
}

/// The destinations of positions `positions` of a sequence with block table `table`: cache rows,
/// or -1 (dropped) for a position the table does not reach.
pub fn destinations(table: &[u32], positions: impl IntoIterator<Item = u32>, spec: &AttentionSpec) -> Vec<i64> {
    positions.into_iter().map(|p| physical_row(table, p, spec).map_or(-1, |r| r as i64)).collect()
}

/// Elements of the K (or V) cache a cache row starts at, for checks: `[row · width ..]`.
pub fn cache_offset(row: u64, spec: &AttentionSpec) -> u64 {
    row * spec.kv_width()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_rounds_to_nearest_even_at_each_rows_physical_row() {
        // 4 blocks of 2 positions; the sequence's table hands them out reversed.
        let spec = AttentionSpec::new(4, 2, 64, 4, 2);
        let w = spec.kv_width() as usize;
        let n = spec.cache_elems() as usize;
        let (mut kc, mut vc) = (vec![f16::from_f32(7.0); n], vec![f16::from_f32(7.0); n]);
        // 1 + 2^-11 lies halfway between two f16 values: even rounds down, 1 + 3·2^-11 rounds up.
        let k: Vec<f32> = (0..3 * w).map(|i| if i % 2 == 0 { 1.0 + 2f32.powi(-11) } else { 1.0 + 3.0 * 2f32.powi(-11) }).collect();
        let v: Vec<f32> = (0..3 * w).map(|i| i as f32 * 0.25 - 100.0).collect();
        let table = [3, 2, 1, 0];
        let dest = destinations(&table, [4, 0, 7], &spec);
        assert_eq!(dest, vec![2, 6, 1]);
        kv_store_cpu(&mut kc, &mut vc, &k, &v, &dest, &spec).unwrap();
        for (r, row) in [2u64, 6, 1].into_iter().enumerate() {
            let at = cache_offset(row, &spec) as usize;
            for e in 0..w {
                let want_k = if e % 2 == 0 { 1.0 } else { 1.0 + 4.0 * 2f32.powi(-11) };
                assert_eq!(kc[at + e].to_f32(), want_k, "row {r} elem {e}");
                assert_eq!(vc[at + e], f16::from_f32(v[r * w + e]));
            }
        }
        let written: usize = kc.iter().filter(|x| x.to_f32() != 7.0).count();
        assert_eq!(written, 3 * w);
    }

    #[test]
    fn rows_outside_the_cache_are_dropped() {
        let spec = AttentionSpec::new(2, 1, 64, 2, 4);
        let n = spec.cache_elems() as usize;
        let (mut kc, mut vc) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
        // Past the table (-1), negative, past the cache, and one good row.
        let mut dest = destinations(&[1], [4], &spec);
        dest.extend([-7, 8, i64::MAX, 7]);
        let k = vec![1.0f32; dest.len() * 64];
        kv_store_cpu(&mut kc, &mut vc, &k, &k, &dest, &spec).unwrap();
        let at = cache_offset(7, &spec) as usize;
        assert!(kc[at..at + 64].iter().all(|x| x.to_f32() == 1.0));
        assert_eq!(kc.iter().filter(|x| x.to_f32() != 0.0).count(), 64);
    }

    #[test]
    fn mismatched_sizes_are_typed_errors() {
        let spec = AttentionSpec::new(2, 1, 64, 2, 4);
        let n = spec.cache_elems() as usize;
        let (mut kc, mut vc) = (vec![f16::ZERO; n], vec![f16::ZERO; n - 1]);
        let k = vec![0.0f32; 64];
        assert!(kv_store_cpu(&mut kc.clone(), &mut kc.clone(), &k, &k, &[0, 1], &spec).is_err());
        assert!(kv_store_cpu(&mut kc, &mut vc, &k, &k, &[0], &spec).is_err());
    }

    #[test]
    fn plan_covers_every_item_once() {
        let spec = AttentionSpec::new(32, 4, 128, 16, 16);
        for limits in DeviceLimits::recorded() {
            for rows in [1, 2, 3, 63, 64, 65, 8192, 1 << 20] {
                let p = plan(rows, &spec, &limits).unwrap();
                p.check_cover().unwrap();
                if rows <= 65 {
                    assert!(p.simulate_cover(0).iter().all(|&h| h == 1), "{p}");
                }
            }
            assert!(matches!(plan(0, &spec, &limits), Err(PlanError::Unsupported { .. })));
            assert!(matches!(plan(1, &AttentionSpec { head_dim: 100, ..spec }, &limits), Err(PlanError::Unsupported { .. })));
            assert!(matches!(plan(1, &AttentionSpec { block_size: 12, ..spec }, &limits), Err(PlanError::Unsupported { .. })));
        }
    }
}
