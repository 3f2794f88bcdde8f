//! Deterministic test inputs: the CPU twin of `cuda/testdata.cu`.
//!
//! Every input element is a pure function of `(seed, index)`, computed with the same integer
//! hash and the same exact float steps on both sides. The self-test fills gigabyte buffers on
//! the device and the CPU reference recomputes just the elements a sampled output needs.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};

use half::f16;

use crate::quant::{BlockQ8_1, QK, WeightType, kquants};

/// The poison word written over outputs (and a guard zone past their end) before a kernel
/// runs. As f32 it is a NaN with a payload no kernel computes; as an i32 id it is negative;
/// as the (d, s) word of a q8_1 block it is a negative d.
pub const POISON: u32 = 0xFFBA_DBAD;

pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

pub fn hash2(seed: u64, i: u64) -> u64 {
    mix64(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ i)
}

/// Uniform in [-1, 1), exact in f32.
pub fn uniform_pm1(seed: u64, i: u64) -> f32 {
    (hash2(seed, i) >> 40) as f32 * (1.0 / 8_388_608.0) - 1.0
}

/// Element `i` of a `fill_uniform_f32(seed, scale)` buffer.
pub fn uniform_f32(seed: u64, i: u64, scale: f32) -> f32 {
    uniform_pm1(seed, i) * scale
}

/// `f16::from_f32(x).to_f32()` (round to nearest even) in f32 arithmetic, inlined: the twins
/// round billions of generated K/V elements, and `half`'s conversion is a call per element.
/// Values past f16's range and NaN take `half`'s path.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    let a = x.abs();
    if a < 6.103_515_6e-5 {
        // Below 2^-14: f16 subnormals, multiples of 2^-24; 0.75 + x has an ulp of 2^-24, so
        // the sum rounds x to the nearest (even) multiple. The sign is x's (a zero keeps it).
        ((x + 0.75) - 0.75).copysign(x)
    } else if a < 65_520.0 {
        // Normal: keep 10 of the 23 mantissa bits, ties to even (a carry moves the exponent).
        let b = x.to_bits();
        f32::from_bits(b.wrapping_add(0x0FFF + ((b >> 13) & 1)) & !0x1FFF)
    } else {
        f16::from_f32(x).to_f32()
    }
}

/// A row of `fill_uniform_f32`: elements `[start, start + len)`.
pub fn uniform_row(seed: u64, start: u64, len: usize, scale: f32) -> Vec<f32> {
    (0..len as u64).map(|j| uniform_f32(seed, start + j, scale)).collect()
}

/// `f16(lo + span·u)`, u uniform in [0, 1) from `(seed, i)`: the device's `scale_f16`.
fn scale_f16(seed: u64, i: u64, lo: f32, span: f32) -> f16 {
    let u = (uniform_pm1(seed, i) + 1.0) * 0.5;
    f16::from_f32(lo + span * u)
}

/// `(lo, span)` of a generated f16 scale: `lo + span·u`, u uniform in [0, 1).
pub type ScaleRange = (f32, f32);

/// `(lo, span)` of a generated K-quant block's d, and of its dmin (q6_K has none); `None` for
/// the legacy formats. dmin is about d times the mean quant (7.5 for q4_K, 15.5 for q5_K), so
/// the min term cancels the mean weight as in a real model. The device's `fill_kquant_block`
/// uses the same literals.
pub fn kquant_scale_ranges(wtype: WeightType) -> Option<(ScaleRange, Option<ScaleRange>)> {
    match wtype {
        WeightType::Q4K => Some(((2e-4, 4e-4), Some((1.5e-3, 3e-3)))),
        WeightType::Q5K => Some(((1e-4, 2e-4), Some((1.55e-3, 3.1e-3)))),
        WeightType::Q6K => Some(((1e-4, 2e-4), None)),
        _ => None,
    }
}

/// K-quant super-block `b` of `bytes` bytes: every byte random (byte i is byte i % 8 of
/// hash(seed, 64b + i/8)), then d (hash index 64b + 48) and dmin (64b + 49) from their ranges.
fn kquant_block(seed: u64, b: u64, bytes: usize, d: ScaleRange, dmin: Option<ScaleRange>, out: &mut Vec<u8>) {
    let start = out.len();
    // One hash per 8 bytes, not one per byte (the self-test's twins generate gigabytes of these).
    for j in 0..bytes.div_ceil(8) {
        out.extend_from_slice(&hash2(seed, b * 64 + j as u64).to_le_bytes()[..(bytes - 8 * j).min(8)]);
    }
    let blk = &mut out[start..];
    let d = scale_f16(seed, b * 64 + 48, d.0, d.1).to_le_bytes();
    match dmin {
        Some((lo, span)) => {
            blk[kquants::Q4_K_D..kquants::Q4_K_D + 2].copy_from_slice(&d);
            blk[kquants::Q4_K_DMIN..kquants::Q4_K_DMIN + 2].copy_from_slice(&scale_f16(seed, b * 64 + 49, lo, span).to_le_bytes());
        }
        None => blk[kquants::Q6_K_D..kquants::Q6_K_D + 2].copy_from_slice(&d),
    }
}

/// Weight block `b` of a `fill_weights(seed, wtype)` buffer, as bytes.
pub fn weight_block(seed: u64, b: u64, wtype: WeightType, out: &mut Vec<u8>) {
    if let Some((d, dmin)) = kquant_scale_ranges(wtype) {
        return kquant_block(seed, b, wtype.block_bytes(), d, dmin, out);
    }
    if wtype == WeightType::MXFP4 {
        // Exponents 119..=121 (scales 2^-9 .. 2^-7: weights up to ±0.09, q4_0's span), codes uniform.
        out.push(119 + (hash2(seed, b * 33) % 3) as u8);
        out.extend((0..QK as u64 / 2).map(|j| (hash2(seed, b * 33 + 1 + j) & 0xff) as u8));
        return;
    }
    out.extend_from_slice(&scale_f16(seed, b * 33, 0.002, 0.004).to_le_bytes());
    if wtype == WeightType::Q8_0 {
        out.extend((0..QK as u64).map(|j| ((hash2(seed, b * 33 + 1 + j) % 255) as i32 - 127) as i8 as u8));
    } else {
        out.extend((0..QK as u64 / 2).map(|j| (hash2(seed, b * 33 + 1 + j) & 0xff) as u8));
    }
}

/// Row `row` (of `k` weights) of a `fill_weights` buffer holding rows of `k` weights.
pub fn weight_row(seed: u64, row: u64, k: usize, wtype: WeightType) -> Vec<u8> {
    let nb = wtype.blocks_per_row(k) as u64;
    let mut out = Vec::with_capacity(wtype.row_bytes(k));
    for b in 0..nb {
        weight_block(seed, row * nb + b, wtype, &mut out);
    }
    out
}

/// Rows `[first, first + count)` of a `fill_weights(seed, wtype)` buffer holding rows of `k`
/// weights, back to back: [`weight_row`]'s bytes, generated once per process and shared by every
/// case that asks for the same rows (the self-test's cases of one family differ in their token
/// counts, not in their weights). Generated on the caller's thread, one row after the other: a
/// parallel generation inside the cache's slot could steal another case's check that waits for
/// the same slot. Callers split big matrices into slots (an expert, a chunk of rows) to
/// generate them in parallel.
pub fn shared_weight_rows(seed: u64, wtype: WeightType, k: usize, first: u64, count: u64) -> Arc<Vec<u8>> {
    static CACHE: OnceLock<SharedCache<WeightKey, u8>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| SharedCache::new(WEIGHT_CACHE_BYTES));
    cache.get(WeightKey { seed, wtype: wtype.code(), k, first, count }, || {
        let mut out = Vec::with_capacity(count as usize * wtype.row_bytes(k));
        let nb = wtype.blocks_per_row(k) as u64;
        for b in first * nb..(first + count) * nb {
            weight_block(seed, b, wtype, &mut out);
        }
        out
    })
}

/// Bytes the shared weight rows may hold; past it their cache starts over (rows handed out stay
/// valid with their holders).
pub const WEIGHT_CACHE_BYTES: usize = 4 << 30;

/// One output row of a CPU twin, computed once per process by `make` and shared by every case
/// that asks for it: `what` names everything the row depends on besides `row` (the family, its
/// shape and weight type, the seeds' use, an expert), so two cases asking the same key compute
/// the same row. The self-test compares the first rows and the rows around the tails of every
/// case, and neighbouring counts share most of them. `make` runs on the caller's thread and
/// must not itself use the thread pool (see [`shared_weight_rows`]).
pub fn shared_twin_row(what: &str, row: u64, make: impl FnOnce() -> Vec<f32>) -> Arc<Vec<f32>> {
    static CACHE: OnceLock<SharedCache<(String, u64), f32>> = OnceLock::new();
    CACHE.get_or_init(|| SharedCache::new(TWIN_CACHE_BYTES)).get((what.to_string(), row), make)
}

/// Bytes the shared twin rows may hold.
pub const TWIN_CACHE_BYTES: usize = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct WeightKey {
    seed: u64,
    wtype: i32,
    k: usize,
    first: u64,
    count: u64,
}

type Slot<T> = Arc<OnceLock<Arc<Vec<T>>>>;

/// Values made once per key and shared: one slot per key, filled by the first caller while
/// later callers of the same key wait for it. Past `cap` bytes made, it starts over.
pub(crate) struct SharedCache<K, T> {
    slots: Mutex<(HashMap<K, Slot<T>>, usize)>,
    cap: usize,
}

impl<K: Eq + Hash, T> SharedCache<K, T> {
    pub(crate) fn new(cap: usize) -> Self {
        SharedCache { slots: Mutex::new((HashMap::new(), 0)), cap }
    }

    pub(crate) fn get(&self, key: K, make: impl FnOnce() -> Vec<T>) -> Arc<Vec<T>> {
        let slot = self.slots.lock().unwrap_or_else(|p| p.into_inner()).0.entry(key).or_default().clone();
        let mut made = 0;
        let value = slot
            .get_or_init(|| {
                let v = make();
                made = v.len() * std::mem::size_of::<T>();
                Arc::new(v)
            })
            .clone();
        if made > 0 {
            let mut guard = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            guard.1 += made;
            if guard.1 > self.cap {
                *guard = (HashMap::new(), 0);
            }
        }
        value
    }
}

/// Source row `src` (of `nb` blocks) of a `fill_q8_1_rows` buffer.
pub fn q8_1_row(seed: u64, src: u64, nb: usize) -> Vec<BlockQ8_1> {
    (0..nb as u64)
        .map(|b| {
            let blk = src * nb as u64 + b;
            let mut qs = [0i8; QK];
            let mut sum = 0i32;
            for (j, q) in qs.iter_mut().enumerate() {
                *q = ((hash2(seed, blk * 33 + 1 + j as u64) % 255) as i32 - 127) as i8;
                sum += *q as i32;
            }
            let u = (uniform_pm1(seed, blk * 33) + 1.0) * 0.5;
            let d = f16::from_f32(0.001 + 0.01 * u);
            BlockQ8_1 { d, s: f16::from_f32(d.to_f32() * sum as f32), qs }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`round_f16`] is `half`'s rounding: for every value `uniform_pm1` can give (all 2^24) and
    /// for values across f16's range, its subnormals, ties, zeros and past its end.
    #[test]
    fn round_f16_is_halfs_rounding() {
        let bits = |x: f32| (round_f16(x).to_bits(), f16::from_f32(x).to_f32().to_bits());
        for k in 0..1u64 << 24 {
            let x = k as f32 * (1.0 / 8_388_608.0) - 1.0;
            let (got, want) = bits(x);
            assert_eq!(got, want, "{x:e}");
        }
        let mut h = 0x1234_5678u64;
        for _ in 0..1_000_000 {
            h = mix64(h);
            // Any f32 bits with an exponent from 2^-30 to 2^17: subnormal f16s to past f16's max.
            let x = f32::from_bits((h as u32 & 0x807F_FFFF) | (((h >> 32) % 48 + 97) as u32) << 23);
            let (got, want) = bits(x);
            assert_eq!(got, want, "{x:e}");
        }
        for x in [0.0f32, -0.0, 1e-10, -1e-10, 2.980_232_2e-8, 65_504.0, 65_519.0, 65_520.0, f32::INFINITY, -f32::INFINITY] {
            let (got, want) = bits(x);
            assert_eq!(got, want, "{x:e}");
        }
        assert!(round_f16(f32::NAN).is_nan());
    }

    /// K-quant blocks made with one hash per 8 bytes are those made with one hash per byte.
    #[test]
    fn kquant_blocks_equal_the_bytewise_generation() {
        for wtype in [WeightType::Q4K, WeightType::Q5K, WeightType::Q6K] {
            let (d, dmin) = kquant_scale_ranges(wtype).unwrap();
            let bytes = wtype.block_bytes();
            for (seed, b) in [(1u64, 0u64), (7, 1), (0x5eed, 123_456), (u64::MAX, 1 << 40)] {
                let mut got = Vec::new();
                kquant_block(seed, b, bytes, d, dmin, &mut got);
                let mut want: Vec<u8> = (0..bytes).map(|i| (hash2(seed, b * 64 + (i / 8) as u64) >> (8 * (i % 8))) as u8).collect();
                let dd = scale_f16(seed, b * 64 + 48, d.0, d.1).to_le_bytes();
                match dmin {
                    Some((lo, span)) => {
                        want[kquants::Q4_K_D..kquants::Q4_K_D + 2].copy_from_slice(&dd);
                        want[kquants::Q4_K_DMIN..kquants::Q4_K_DMIN + 2]
                            .copy_from_slice(&scale_f16(seed, b * 64 + 49, lo, span).to_le_bytes());
                    }
                    None => want[kquants::Q6_K_D..kquants::Q6_K_D + 2].copy_from_slice(&dd),
                }
                assert_eq!(got, want, "{wtype} seed {seed} block {b}");
            }
        }
    }

    #[test]
    fn uniform_is_in_range_and_spread() {
        let v: Vec<f32> = (0..10_000).map(|i| uniform_pm1(7, i)).collect();
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert_ne!(uniform_pm1(7, 0), uniform_pm1(8, 0));
    }

    #[test]
    fn weight_blocks_have_positive_scale_in_range() {
        for wtype in WeightType::LEGACY {
            let row = weight_row(3, 5, 64, wtype);
            assert_eq!(row.len(), wtype.row_bytes(64));
            for b in row.chunks_exact(wtype.block_bytes()) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                assert!((0.0019..=0.0061).contains(&d), "{d}");
            }
        }
    }

    /// Shared rows are exactly `weight_row`'s, whatever slot they come from, and one key is
    /// generated once however many threads ask for it.
    #[test]
    fn shared_weight_rows_equal_weight_rows() {
        for wtype in WeightType::ALL {
            let k = 512;
            let shared = shared_weight_rows(0x5eed, wtype, k, 3, 4);
            let direct: Vec<u8> = (3..7).flat_map(|r| weight_row(0x5eed, r, k, wtype)).collect();
            assert_eq!(*shared, direct, "{wtype}");
            assert!(Arc::ptr_eq(&shared, &shared_weight_rows(0x5eed, wtype, k, 3, 4)));
        }
        let cache: SharedCache<u32, u8> = SharedCache::new(64);
        let calls = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let v = cache.get(1, || {
                        calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        vec![7u8; 40]
                    });
                    assert_eq!(*v, vec![7u8; 40]);
                });
            }
        });
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Past the cap the cache starts over: the next request makes the value again.
        cache.get(2, || vec![0u8; 40]);
        cache.get(1, || {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            vec![7u8; 40]
        });
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
        // Twin rows: one computation per (what, row).
        let twice = std::sync::atomic::AtomicUsize::new(0);
        let make = || {
            twice.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            vec![1.5f32; 3]
        };
        let a = shared_twin_row("testdata test", 9, make);
        let b = shared_twin_row("testdata test", 9, || unreachable!("the row is shared"));
        assert!(Arc::ptr_eq(&a, &b) && twice.load(std::sync::atomic::Ordering::SeqCst) == 1);
    }

    /// The K-quant scales land in their ranges, and the random bytes give every sub-block scale
    /// and min value, so the generated rows exercise the whole of `get_scale_min_k4`.
    #[test]
    fn kquant_blocks_have_scales_in_range_and_every_sub_scale() {
        let f16_at = |b: &[u8], at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
        let within = |v: f32, (lo, span): ScaleRange| v >= lo * 0.999 && v <= (lo + span) * 1.001;
        for wtype in WeightType::K_QUANTS {
            let (d, dmin) = kquant_scale_ranges(wtype).unwrap();
            let row = weight_row(9, 2, 256 * 200, wtype);
            assert_eq!(row.len(), wtype.row_bytes(256 * 200));
            let mut seen = [[false; 64]; 2];
            for b in row.chunks_exact(wtype.block_bytes()) {
                if wtype == WeightType::Q6K {
                    assert!(within(f16_at(b, kquants::Q6_K_D), d));
                    continue;
                }
                assert!(within(f16_at(b, kquants::Q4_K_D), d) && within(f16_at(b, kquants::Q4_K_DMIN), dmin.unwrap()));
                for j in 0..8 {
                    let (sc, m) = kquants::get_scale_min_k4(j, &b[kquants::Q4_K_SCALES..kquants::Q4_K_QS]);
                    seen[0][sc as usize] = true;
                    seen[1][m as usize] = true;
                }
            }
            assert!(wtype == WeightType::Q6K || seen.iter().all(|s| s.iter().all(|&x| x)), "{wtype}: not every scale/min value occurs");
        }
    }
}
