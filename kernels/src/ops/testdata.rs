//! Device-side test data: fills from `(seed, index)` and the poison checks. The CPU twin of
//! the generators is `crate::testdata`.

use cudarc::driver::{CudaSlice, DeviceRepr};

use cudarc::driver::PushKernelArg;

use crate::check::{Check, timing};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, grid_stride_blocks};
use crate::limits::DeviceLimits;
use crate::quant::WeightType;
use crate::sources::TESTDATA;
use crate::testdata::POISON;

const THREADS: u32 = 256;

/// Grid-stride plan over `items` elements, one thread each.
pub fn plan(kernel: &str, items: u64, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let per_block = THREADS as u64;
    Launch::checked(
        kernel,
        format_args!("items={items}"),
        [grid_stride_blocks(items, per_block, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block }],
        limits,
    )
}

/// What the GPU half did between two [`timed`] steps: its host work (routing, plans, the data it
/// makes) and the launches it waited for (the kernel under test, kv_store).
pub const BETWEEN_STEPS: &str = "host work and kernels";

/// Runs one test-data step of a case's GPU half; while the worker marks the GPU half
/// (`check::timing`), the time before it goes to [`BETWEEN_STEPS`] and its own to `what`, the
/// device synchronised on both sides so an asynchronous fill is counted where it runs.
pub(crate) fn timed<T>(gpu: &Gpu, what: &str, step: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    if !timing::active() {
        return step();
    }
    gpu.synchronize()?;
    timing::mark(BETWEEN_STEPS);
    let r = step()?;
    gpu.synchronize()?;
    timing::mark(what);
    Ok(r)
}

pub fn fill_uniform(gpu: &Gpu, buf: &mut CudaSlice<f32>, n: usize, seed: u64, scale: f32) -> Result<(), GpuError> {
    timed(gpu, "fill inputs", || {
        let f = gpu.function(&TESTDATA, "fill_uniform_f32")?;
        let p = plan("fill_uniform_f32", n as u64, gpu.limits())?;
        let n = n as u64;
        gpu.launch(&p, &f, |b| {
            b.arg(buf).arg(&n).arg(&seed).arg(&scale);
        })?;
        Ok(())
    })
}

/// Fills `nblocks` weight blocks of `wtype` (super-blocks for the K-quants; buffer sized
/// `nblocks * block_bytes`). CPU twin: `testdata::weight_row`.
pub fn fill_weights(gpu: &Gpu, buf: &mut CudaSlice<u8>, nblocks: usize, seed: u64, wtype: WeightType) -> Result<(), GpuError> {
    timed(gpu, "fill weights", || {
        let f = gpu.function(&TESTDATA, "fill_weights")?;
        let p = plan("fill_weights", nblocks as u64, gpu.limits())?;
        let (n, code) = (nblocks as u64, wtype.code());
        gpu.launch(&p, &f, |b| {
            b.arg(buf).arg(&n).arg(&seed).arg(&code);
        })?;
        Ok(())
    })
}

/// Fills `rows` q8_1 rows of `nb` blocks: row r from source row `row_ids[r]` (`None`: r);
/// sources outside `[0, n_src)` are zero padding rows. CPU twin: `testdata::q8_1_row`.
pub fn fill_q8_1_rows(
    gpu: &Gpu,
    out: &mut CudaSlice<u8>,
    rows: usize,
    nb: usize,
    seed: u64,
    row_ids: Option<&CudaSlice<i32>>,
    n_src: u64,
) -> Result<(), GpuError> {
    timed(gpu, "fill inputs", || {
        let f = gpu.function(&TESTDATA, "fill_q8_1_rows")?;
        let p = plan("fill_q8_1_rows", (rows * nb) as u64, gpu.limits())?;
        let (rows, nb) = (rows as u64, nb as i32);
        let null: u64 = 0;
        gpu.launch(&p, &f, |b| {
            b.arg(out).arg(&rows).arg(&nb).arg(&seed);
            match row_ids {
                Some(ids) => b.arg(ids),
                None => b.arg(&null),
            };
            b.arg(&n_src);
        })?;
        Ok(())
    })
}

pub fn fill_words(gpu: &Gpu, buf: &mut CudaSlice<u32>, value: u32) -> Result<(), GpuError> {
    let f = gpu.function(&TESTDATA, "fill_u32")?;
    let n = buf.len() as u64;
    let p = plan("fill_u32", n, gpu.limits())?;
    gpu.launch(&p, &f, |b| {
        b.arg(buf).arg(&n).arg(&value);
    })?;
    Ok(())
}

/// Counts items `i < n` whose word `start + i * stride` equals / differs from `value`.
pub fn count_words(
    gpu: &Gpu,
    buf: &CudaSlice<u32>,
    start: usize,
    n: u64,
    stride: u64,
    value: u32,
    want_equal: bool,
) -> Result<u64, GpuError> {
    if n == 0 {
        return Ok(0);
    }
    let f = gpu.function(&TESTDATA, "count_words")?;
    let p = plan("count_words", n, gpu.limits())?;
    let mut count = gpu.upload(&[0u64])?;
    let view = buf.slice(start..);
    let eq = want_equal as i32;
    gpu.launch(&p, &f, |b| {
        b.arg(&view).arg(&n).arg(&stride).arg(&value).arg(&eq).arg(&mut count);
    })?;
    Ok(gpu.download(&count)?[0])
}

/// Elements worth downloading between two wanted rows rather than starting another copy: a
/// device-to-host copy costs tens of microseconds before its first byte, the time of ~256 KiB.
const MERGE_GAP_BYTES: usize = 256 << 10;

/// Rows `rows` of `buf` (row r at elements `[r·width, (r + 1)·width)`), in `rows`' order:
/// rows shorter than [`MERGE_GAP_BYTES`] with one copy per run of nearby rows instead of one
/// per row (a case compares tens to hundreds of sampled rows, most of them in runs: the first
/// and last tiles); longer rows one by one, as their copy's latency is small beside its bytes.
pub fn download_rows<T: DeviceRepr + Default + Clone>(
    gpu: &Gpu,
    buf: &CudaSlice<T>,
    rows: &[u64],
    width: usize,
) -> Result<Vec<Vec<T>>, GpuError> {
    timed(gpu, "download", || download_rows_untimed(gpu, buf, rows, width))
}

fn download_rows_untimed<T: DeviceRepr + Default + Clone>(
    gpu: &Gpu,
    buf: &CudaSlice<T>,
    rows: &[u64],
    width: usize,
) -> Result<Vec<Vec<T>>, GpuError> {
    let mut out: Vec<Vec<T>> = vec![Vec::new(); rows.len()];
    for run in row_runs(rows, std::mem::size_of::<T>() * width) {
        let first = rows[run[0]];
        let span = gpu.download_range(buf, first as usize * width, (rows[run[run.len() - 1]] - first + 1) as usize * width)?;
        for k in run {
            let at = (rows[k] - first) as usize * width;
            out[k] = span[at..at + width].to_vec();
        }
    }
    Ok(out)
}

/// [`download_rows`]' copies: indexes into `rows`, each run in ascending row order, consecutive
/// rows of a run at most [`MERGE_GAP_BYTES`] apart; every row alone when a row is that long.
fn row_runs(rows: &[u64], row_bytes: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| rows[i]);
    let gap = (row_bytes < MERGE_GAP_BYTES).then(|| (MERGE_GAP_BYTES / row_bytes.max(1)) as u64);
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match runs.last_mut() {
            Some(run) if gap.is_some_and(|gap| rows[i] <= rows[run[run.len() - 1]] + 1 + gap) => run.push(i),
            _ => runs.push(vec![i]),
        }
    }
    runs
}

/// Guard words after every output: a kernel that writes past its end overwrites them.
pub const GUARD_WORDS: usize = 1024;

/// An output buffer of `words` 32-bit words plus a guard, all poisoned before the kernel runs.
pub struct Guarded {
    pub buf: CudaSlice<u32>,
    pub words: usize,
}

impl Guarded {
    pub fn new(gpu: &Gpu, words: usize) -> Result<Guarded, GpuError> {
        timed(gpu, "alloc and poison outputs", || {
            let mut buf = gpu.alloc::<u32>(words + GUARD_WORDS)?;
            fill_words(gpu, &mut buf, POISON)?;
            Ok(Guarded { buf, words })
        })
    }

    /// `(unwritten, past_end)`: items of `stride` words whose first word still holds the
    /// poison, and guard words that do not.
    pub fn check(&self, gpu: &Gpu, stride: usize) -> Result<(u64, u64), GpuError> {
        timed(gpu, "guard check", || {
            let items = (self.words / stride) as u64;
            let unwritten = count_words(gpu, &self.buf, 0, items, stride as u64, POISON, true)?;
            let past_end = count_words(gpu, &self.buf, self.words, GUARD_WORDS as u64, 1, POISON, false)?;
            Ok((unwritten, past_end))
        })
    }

    /// Words `[start, start + len)` as f32.
    pub fn read_f32(&self, gpu: &Gpu, start: usize, len: usize) -> Result<Vec<f32>, GpuError> {
        Ok(gpu.download_range(&self.buf, start, len)?.into_iter().map(f32::from_bits).collect())
    }

    /// Rows `rows` of `width` words as f32, in `rows`' order ([`download_rows`]).
    pub fn read_rows_f32(&self, gpu: &Gpu, rows: &[u64], width: usize) -> Result<Vec<Vec<f32>>, GpuError> {
        Ok(download_rows(gpu, &self.buf, rows, width)?.into_iter().map(|r| r.into_iter().map(f32::from_bits).collect()).collect())
    }

    pub fn read_i32(&self, gpu: &Gpu, start: usize, len: usize) -> Result<Vec<i32>, GpuError> {
        Ok(gpu.download_range(&self.buf, start, len)?.into_iter().map(|w| w as i32).collect())
    }
}

/// For kernels with an in-place variant: how many values of the sampled rows of the in-place
/// result `x` differ, bit for bit, from the out-of-place output `y` (both downloaded in runs,
/// [`download_rows`]). The GPU half of [`with_in_place_diff`]; [`note_in_place_diff`] puts the
/// count into the check on the host.
pub fn in_place_diff(gpu: &Gpu, sampled: &[u64], width: usize, x: &CudaSlice<f32>, y: &Guarded) -> Result<u64, GpuError> {
    let xs = download_rows(gpu, x, sampled, width)?;
    let ys = y.read_rows_f32(gpu, sampled, width)?;
    Ok(xs.iter().zip(&ys).map(|(a, b)| a.iter().zip(b).filter(|(a, b)| a.to_bits() != b.to_bits()).count() as u64).sum())
}

/// `check` with the in-place differences `diff` counted as integer mismatches (and named first
/// in its note when there are any).
pub fn note_in_place_diff(mut check: Check, diff: u64) -> Check {
    check.int_mismatches += diff;
    if diff > 0 {
        check.note = format!("in place differs from out of place in {diff} sampled values; {}", check.note);
    }
    check
}

/// [`in_place_diff`] counted into `check` ([`note_in_place_diff`]).
pub fn with_in_place_diff(
    gpu: &Gpu,
    sampled: &[u64],
    width: usize,
    x: &CudaSlice<f32>,
    y: &Guarded,
    check: Check,
) -> Result<Check, GpuError> {
    Ok(note_in_place_diff(check, in_place_diff(gpu, sampled, width, x, y)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short rows go in runs (a gap of up to 256 KiB is downloaded through), in ascending order
    /// whatever order they were asked in; rows of 256 KiB or more each get a copy of their own.
    #[test]
    fn row_runs_merge_nearby_short_rows_only() {
        let rows = [70, 0, 1, 2, 63, 10_000, 71, 200];
        // 16 KiB rows merge across 16 rows of gap: 63 is 60 rows after 2, 70 is 6 after 63.
        let runs = row_runs(&rows, 16 << 10);
        let as_rows: Vec<Vec<u64>> = runs.iter().map(|r| r.iter().map(|&i| rows[i]).collect()).collect();
        assert_eq!(as_rows, [vec![0, 1, 2], vec![63, 70, 71], vec![200], vec![10_000]]);
        let long = row_runs(&rows, 600 << 10);
        assert_eq!(long.len(), rows.len());
        assert!(long.windows(2).all(|w| rows[w[0][0]] < rows[w[1][0]]));
        assert!(row_runs(&[], 4).is_empty());
    }
}
