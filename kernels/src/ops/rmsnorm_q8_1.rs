//! RMS norm that also writes its output's q8_1 quantization: `y = rmsnorm(x)` exactly as
//! [`crate::ops::rmsnorm`] computes it, and `yq = quantize(y)` exactly as
//! [`crate::ops::quantize`] (dense mode) computes it from y, in one launch.
//!
//! The hidden norms whose output feeds a quantized projection use it (attn_norm before q/k/v,
//! ffn_norm before the router and the experts): the engine then skips the quantize launch. y is
//! still written (the F32 router and the residual path read it). Same geometry as the plain norm
//! (`cuda/rmsnorm.cu`, `rmsnorm_q8_1_warp_rows` / `rmsnorm_q8_1_block_rows`, chosen from the width
//! as [`rmsnorm::plan`] chooses): rows on grid.x, 256 threads. The width must be a multiple of 32
//! (each pass of a warp then covers one q8_1 block). The twin is the composition of the two
//! existing twins ([`rmsnorm::rmsnorm_cpu`], [`quantize::quantize_cpu`]).

use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::quantize::{self, BLOCK_WORDS, BlockCompare, Source, blocks_of};
use crate::ops::rmsnorm::{self, RmsNormCase};
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform};
use crate::quant::{BlockQ8_1, QK, q8_1_bytes};
use crate::sources::RMSNORM;
use crate::thresholds::{Critical, overflow_point};

pub const KERNEL: &str = "rmsnorm_q8_1";
/// One warp per row, [`rmsnorm::WARPS`] rows per block (rows up to [`rmsnorm::WARP_ROW_MAX`]).
pub const WARP_KERNEL: &str = "rmsnorm_q8_1_warp_rows";
/// One block per row.
pub const BLOCK_KERNEL: &str = "rmsnorm_q8_1_block_rows";
/// y as the plain norm's ([`rmsnorm::TOLERANCE`]: expected bit-exact); the quants are compared
/// block by block as the quantize self-test compares them, against the twin's y.
pub const TOLERANCE: f64 = rmsnorm::TOLERANCE;
const THREADS: u32 = 256;
const SAMPLE_ROWS: usize = 512;

fn unsupported(tokens: u64, c: &RmsNormCase) -> Option<String> {
    c.unsupported(tokens)
        .or_else(|| (!c.width.is_multiple_of(QK as u32)).then(|| format!("row width {} must be a multiple of {QK} (q8_1 blocks)", c.width)))
}

/// Every launch one fused norm of `tokens` makes (one).
pub fn plans(tokens: u64, c: &RmsNormCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c, limits)?])
}

/// The plain norm's grid: (ceil(rows / 8), 1, 1) with a warp per row, or (rows, 1, 1) with a
/// block per row; refused for a width that is not a multiple of 32.
pub fn plan(tokens: u64, c: &RmsNormCase, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    if let Some(what) = unsupported(tokens, c) {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: c.shape(tokens) });
    }
    let (rows, per_block) = (c.rows(tokens), c.rows_per_block());
    Launch::checked(
        if c.warp_per_row() { WARP_KERNEL } else { BLOCK_KERNEL },
        c.shape(tokens),
        [rows.div_ceil(per_block), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::Tiles { axis: 0, items: rows, per_block }],
        limits,
    )
}

/// CPU twin: the plain norm's twin, then the dense quantize's twin of its output. Returns y
/// `[rows, width]` and yq `[rows · width/32]` blocks (a token's rows of one width each; the
/// blocks of `rows_per_token` rows are those of one row of `rows_per_token · width`).
pub fn rmsnorm_q8_1_cpu(x: &[f32], w: &[f32], c: &RmsNormCase) -> (Vec<f32>, Vec<BlockQ8_1>) {
    let y = rmsnorm::rmsnorm_cpu(x, w, c);
    let q = quantize::quantize_cpu(&y, c.width as usize, Source::Dense);
    (y, q)
}

/// Normalises the `tokens · rows_per_token` rows of `x` into `y` and their q8_1 blocks into `yq`
/// (`[rows, width/32]`; any element type: the kernel sees bytes). `y` must not be `x`.
pub fn launch<Y: DeviceRepr, Q: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    c: &RmsNormCase,
    x: &CudaView<f32>,
    w: &CudaView<f32>,
    y: &mut CudaSlice<Y>,
    yq: &mut CudaSlice<Q>,
) -> Result<(), GpuError> {
    let p = plan(tokens, c, gpu.limits())?;
    let n = 4 * c.rows(tokens) * c.width as u64;
    let need_q = q8_1_bytes(c.rows(tokens), c.width);
    require_bytes(
        &p,
        &[
            ("x", bytes_of(x.len(), 4), n),
            ("y", bytes_of(y.len(), size_of::<Y>()), n),
            ("yq", bytes_of(yq.len(), size_of::<Q>()), need_q),
            ("w", bytes_of(w.len(), 4), 4 * c.width as u64),
        ],
    )?;
    let f = gpu.function(&RMSNORM, &p.kernel)?;
    let (rows, width, eps) = (c.rows(tokens), c.width as i32, c.eps);
    let warp = c.warp_per_row();
    let (x_ptr, _x_done) = x.device_ptr(gpu.stream());
    let (y_ptr, _y_done) = y.device_ptr_mut(gpu.stream());
    let (q_ptr, _q_done) = yq.device_ptr_mut(gpu.stream());
    gpu.launch(&p, &f, |b| {
        b.arg(&x_ptr).arg(&y_ptr).arg(w).arg(&q_ptr);
        if warp {
            b.arg(&rows);
        }
        b.arg(&width).arg(&eps);
    })?;
    Ok(())
}

/// The plain norm's critical counts, and where the yq block index `row·(width/32) + b` passes
/// 2^31 − 1 (64-bit on the device).
pub fn critical_counts(c: &RmsNormCase, limits: &DeviceLimits) -> Vec<Critical> {
    let mut v = rmsnorm::critical_counts(c, limits);
    let blocks_per_token = c.rows_per_token.max(1) as u64 * (c.width as u64 / QK as u64).max(1);
    v.extend(overflow_point(blocks_per_token, "rmsnorm_q8_1: yq[row·(width/32) + b] passes 2^31 − 1"));
    v
}

/// Input, weight, the guarded y and the guarded yq of a self-test case.
pub fn device_bytes(tokens: u64, c: &RmsNormCase) -> u64 {
    let n = c.rows(tokens) * c.width as u64;
    4 * (n + c.width as u64 + n + 2 * GUARD_WORDS as u64) + q8_1_bytes(c.rows(tokens), c.width)
}

const SEED_X: u64 = 0x58;
const SEED_W: u64 = 0x59;
const X_SCALE: f32 = 4.0;

/// Self-test: x and w from seeds, y and yq poisoned; sampled rows of y compared with the norm's
/// twin and their blocks with the quantize of the twin's row (as the quantize self-test
/// compares them), every element and block written, nothing past either end.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the fills, the kernel, both poison checks and the sampled rows of y
/// and of yq (each downloaded in runs); the twin of the rows and both comparisons are left to
/// the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Staged, GpuError> {
    plan(tokens, c, gpu.limits())?; // a bad shape is refused before anything is allocated
    let (width, rows) = (c.width as usize, c.rows(tokens));
    let (n, nb) = (rows as usize * width, width / QK);
    let mut x = gpu.alloc::<f32>(n)?;
    let mut w = gpu.alloc::<f32>(width)?;
    fill_uniform(gpu, &mut x, n, SEED_X, X_SCALE)?;
    fill_uniform(gpu, &mut w, width, SEED_W, 1.0)?;
    let mut y = Guarded::new(gpu, n)?;
    let mut yq = Guarded::new(gpu, rows as usize * nb * BLOCK_WORDS)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch(gpu, tokens, c, &x.as_view(), &w.as_view(), &mut y.buf, &mut yq.buf)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (y_unwritten, y_past) = y.check(gpu, 1)?;
    let (q_unwritten, q_past) = yq.check(gpu, BLOCK_WORDS)?;
    let sampled = sample_rows(rows, 64, SAMPLE_ROWS, rows);
    let got_y = y.read_rows_f32(gpu, &sampled, width)?;
    let got_q = download_rows(gpu, &yq.buf, &sampled, nb * BLOCK_WORDS)?;
    let c = *c;
    Ok(Staged::Check(Box::new(move || {
        let want = rmsnorm::twin_rows(&c, &sampled, (SEED_X, X_SCALE), SEED_W);
        let mut err = RelErr::default();
        let mut blocks = BlockCompare::default();
        for (((&r, want), got), words) in sampled.iter().zip(&want).zip(&got_y).zip(&got_q) {
            let at = r as usize * width;
            err.add_slice(at as u64, got, want);
            blocks.row(at as u64, &blocks_of(words), Some(want));
        }
        let mut check = Check::of_floats(&err, TOLERANCE, (y_unwritten + q_unwritten, y_past + q_past), kernel_ms);
        check.int_mismatches += blocks.mismatches;
        let q_note = blocks.describe();
        if !q_note.is_empty() {
            check.note = format!("{}; q8_1: {q_note}", check.note);
        }
        Outcome::Ran(check)
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = RmsNormCase;

    fn run(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &RmsNormCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &RmsNormCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row_q8_1;
    use crate::testdata::uniform_row;

    const HIDDEN: RmsNormCase = RmsNormCase { width: 2048, rows_per_token: 1, eps: 1e-6 };
    const NARROW: RmsNormCase = RmsNormCase { width: 512, rows_per_token: 1, eps: 1e-6 };

    #[test]
    fn twin_is_the_norm_then_the_dense_quantize() {
        for c in [HIDDEN, NARROW, RmsNormCase { width: 128, rows_per_token: 3, eps: 1e-5 }] {
            let width = c.width as usize;
            let n = width * c.rows_per_token as usize * 5;
            let x = uniform_row(7, 0, n, X_SCALE);
            let w = uniform_row(8, 0, width, 1.0);
            let (y, q) = rmsnorm_q8_1_cpu(&x, &w, &c);
            assert_eq!(y, rmsnorm::rmsnorm_cpu(&x, &w, &c));
            assert_eq!(q.len(), n / QK);
            for (row, qrow) in y.chunks(width).zip(q.chunks(width / QK)) {
                assert_eq!(quantize_row_q8_1(row).as_slice(), qrow);
            }
        }
    }

    #[test]
    fn plans_follow_the_plain_norm() {
        for limits in DeviceLimits::recorded() {
            for c in [HIDDEN, NARROW] {
                for tokens in (1..=64).chain([8191, 8192, 1 << 20]) {
                    let p = plan(tokens, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                    let plain = rmsnorm::plan(tokens, &c, &limits).unwrap();
                    assert_eq!((p.grid, p.block, p.shared_mem), (plain.grid, plain.block, plain.shared_mem), "{p}");
                    let kernel = if c.width <= rmsnorm::WARP_ROW_MAX { WARP_KERNEL } else { BLOCK_KERNEL };
                    assert_eq!(p.kernel, kernel);
                    p.check_cover().unwrap();
                    if tokens <= 64 {
                        assert!(p.simulate_cover(0).iter().all(|&h| h == 1), "{p}");
                    }
                }
            }
        }
    }

    #[test]
    fn widths_off_the_q8_1_block_are_refused() {
        let l = DeviceLimits::gb10();
        for c in [RmsNormCase { width: 100, ..NARROW }, RmsNormCase { width: 2047, ..HIDDEN }, RmsNormCase { width: 0, ..HIDDEN }] {
            assert!(matches!(plans(1, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?}");
        }
        assert!(matches!(plans(0, &HIDDEN, &l), Err(PlanError::Unsupported { .. })));
    }

    #[test]
    fn critical_counts_include_the_blocks_2_pow_31_point() {
        let counts: Vec<u64> = critical_counts(&HIDDEN, &DeviceLimits::h200()).iter().map(|c| c.tokens).collect();
        // 64 blocks a token: 2^31 / 64; the plain norm's 2^31 / 2048 stays.
        for t in [33_554_431, 33_554_432, 1_048_576, 1] {
            assert!(counts.contains(&t), "{t} missing from {counts:?}");
        }
    }
}
