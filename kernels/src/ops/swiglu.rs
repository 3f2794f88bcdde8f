//! SwiGLU between the experts' gate/up and down projections:
//! `out[r, j] = silu(gate[r, j]) · up[r, j]`, `silu(g) = g / (1 + exp(−g))`, over `rows × width`
//! values (rows: the (token, slot) pairs in expert order, width: the expert FFN width).
//!
//! Two outputs (`cuda/glue.cu`): f32 `[rows, width]`, or q8_1 blocks `[rows, width/32]`
//! quantized on the fly, ready for the down projection (saves writing and re-reading the f32
//! values). Gate and up are two buffers or the two halves of one `[rows, 2·width]` buffer. Rows
//! pass 65,535 and rows × width passes 2^31 at large prefills (8 · 768 values per token): the
//! values (f32) or blocks (q8_1) are walked by a grid-stride loop on `grid.x`, 64-bit indexes.

use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::quantize;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, dequantize_q8_1, quantize_row_q8_1};
use crate::selftest::case::{Check, Outcome};
use crate::selftest::verify::{RelErr, sample_rows};
use crate::sources::GLUE;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, I32_MAX, overflow_point};

pub const KERNEL: &str = "swiglu";
/// The CUDA functions of the two outputs.
pub const F32_KERNEL: &str = "swiglu";
pub const Q8_1_KERNEL: &str = "swiglu_q8_1";
/// f32 output: division, sum and product are IEEE-rounded on both sides and in the same order;
/// only `exp` differs (the device's `expf` within 2 ulp, the host's within 1): a few ulp of
/// each value, < 1e-6 of it. A wrong element or row is off by far more.
pub const TOLERANCE: f64 = 2e-6;
/// q8_1 output, dequantized, against the exact f32 values: the quantization bound of
/// [`quantize::TOLERANCE`]; the quants themselves must equal the twin's within one step
/// (a value at a rounding tie may go either way after an ulp of `exp`), counted as mismatches.
pub const Q8_1_TOLERANCE: f64 = quantize::TOLERANCE;
const THREADS: u32 = 256;
const WARPS: u32 = THREADS / 32;
/// 32-bit words per q8_1 block: the first holds (d, s), the word `Guarded::check` looks at.
const BLOCK_WORDS: usize = BLOCK_Q8_1_BYTES / 4;

/// Where gate and up are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// Two buffers `[rows, width]`.
    Separate,
    /// One buffer `[rows, 2·width]`: gate in columns `0..width`, up in `width..2·width`.
    Fused,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    F32,
    /// q8_1 blocks (the width a multiple of 32).
    Q8_1,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SwigluCase {
    /// Values per row (the expert FFN width).
    pub width: u32,
    /// Rows per token: top_k for the routed experts.
    pub rows_per_token: u32,
    pub layout: Layout,
    pub output: Output,
}

/// The device input.
pub enum GateUp<'a> {
    Separate { gate: &'a CudaSlice<f32>, up: &'a CudaSlice<f32> },
    Fused(&'a CudaSlice<f32>),
}

impl GateUp<'_> {
    fn layout(&self) -> Layout {
        match self {
            GateUp::Separate { .. } => Layout::Separate,
            GateUp::Fused(_) => Layout::Fused,
        }
    }
}

/// Elements between consecutive rows of gate (and of up).
fn in_stride(layout: Layout, width: u32) -> u64 {
    match layout {
        Layout::Separate => width as u64,
        Layout::Fused => 2 * width as u64,
    }
}

fn describe(rows: u64, width: u32, layout: Layout, output: Output) -> String {
    format!("rows={rows} width={width} {layout:?} -> {output:?}")
}

/// Every launch a SwiGLU of `tokens` makes (one).
pub fn plans(tokens: u64, c: &SwigluCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    let rows = tokens.saturating_mul(c.rows_per_token as u64);
    Ok(vec![plan(rows, c.width, c.layout, c.output, limits)?])
}

/// f32: threads grid-stride over the `rows·width` values; q8_1: warps over the `rows·width/32`
/// blocks. Both on `grid.x`, 256 threads, capped at a few waves of the device.
pub fn plan(rows: u64, width: u32, layout: Layout, output: Output, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = describe(rows, width, layout, output);
    let kernel = if output == Output::F32 { F32_KERNEL } else { Q8_1_KERNEL };
    let bad = |what: String| Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: shape.clone() });
    if rows == 0 {
        return bad("no rows".into());
    }
    if width == 0 || width as u64 > I32_MAX || (output == Output::Q8_1 && !(width as usize).is_multiple_of(QK)) {
        return bad(format!("width {width} must be in 1..2^31 (a multiple of {QK} for q8_1 output)"));
    }
    if rows.checked_mul(in_stride(layout, width)).is_none_or(|n| n > u64::MAX / 8) {
        return bad("rows × width overflows 64-bit indexes".into());
    }
    let (items, per_block, threads_per_item) = match output {
        Output::F32 => (rows * width as u64, THREADS as u64, 1),
        Output::Q8_1 => (rows * (width as u64 / QK as u64), WARPS as u64, 32),
    };
    Launch::checked(
        kernel,
        shape.clone(),
        [grid_stride_blocks(items * threads_per_item, THREADS as u64, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block }],
        limits,
    )
}

/// `silu(g) · u` rounded as the device rounds it.
pub fn swiglu_value(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// CPU twin, f32 output: `gate` and `up` of equal length (one or many rows).
pub fn swiglu_cpu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.par_iter().zip(up).map(|(&g, &u)| swiglu_value(g, u)).collect()
}

/// CPU twin, q8_1 output: the f32 values quantized as `quantize` does (length a multiple of 32).
pub fn swiglu_q8_1_cpu(gate: &[f32], up: &[f32]) -> Vec<BlockQ8_1> {
    quantize_row_q8_1(&swiglu_cpu(gate, up))
}

/// SwiGLU of `rows` rows of `width` values into `out` (f32 `[rows, width]` or q8_1 blocks
/// `[rows, width/32]`, any element type). Buffers too small for the shape are refused.
pub fn launch<Y: DeviceRepr>(
    gpu: &Gpu,
    rows: u64,
    width: u32,
    output: Output,
    input: GateUp<'_>,
    out: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    let layout = input.layout();
    let p = plan(rows, width, layout, output, gpu.limits())?;
    let n = rows * width as u64;
    let out_need = match output {
        Output::F32 => 4 * n,
        Output::Q8_1 => n / QK as u64 * BLOCK_Q8_1_BYTES as u64,
    };
    let out_have = bytes_of(out.len(), size_of::<Y>());
    match &input {
        GateUp::Separate { gate, up } => require_bytes(
            &p,
            &[("gate", bytes_of(gate.len(), 4), 4 * n), ("up", bytes_of(up.len(), 4), 4 * n), ("out", out_have, out_need)],
        )?,
        GateUp::Fused(gu) => require_bytes(&p, &[("gate_up", bytes_of(gu.len(), 4), 8 * n), ("out", out_have, out_need)])?,
    }
    let f = gpu.function(&GLUE, &p.kernel)?;
    let (stride, w) = (in_stride(layout, width), width as i32);
    let (zero, up_offset) = (0u64, width as u64);
    gpu.launch(&p, &f, |b| {
        match &input {
            GateUp::Separate { gate, up } => b.arg(*gate).arg(&zero).arg(*up).arg(&zero),
            GateUp::Fused(gu) => b.arg(*gu).arg(&zero).arg(*gu).arg(&up_offset),
        };
        b.arg(&stride).arg(out).arg(&rows).arg(&w);
    })?;
    Ok(())
}

/// The first token count at which the grid-stride loop of `plan` takes a second trip, and the
/// one before: `per_token` items a token, `threads_per_item` threads an item.
fn second_trip(per_token: u64, threads_per_item: u64, what: &str, limits: &DeviceLimits) -> Vec<Critical> {
    let cap = grid_stride_blocks(u64::MAX / 64, THREADS as u64, limits);
    let first = cap * (THREADS as u64 / threads_per_item) / per_token + 1;
    vec![
        Critical::new(first - 1, format!("{what}: one grid-stride trip (last count)")),
        Critical::new(first, format!("{what}: a second trip")),
    ]
}

/// Counts this plan makes critical: the 2^31 points of the input and output indexes, and
/// where the grid-stride loop first takes a second trip.
pub fn critical_counts(c: &SwigluCase, limits: &DeviceLimits) -> Vec<Critical> {
    let (rpt, w) = (c.rows_per_token.max(1) as u64, c.width.max(1) as u64);
    let mut v = vec![Critical::new(1, "swiglu: single token")];
    v.extend(overflow_point(rpt * in_stride(c.layout, c.width), "swiglu: gate/up[r·stride + j] passes 2^31 − 1"));
    match c.output {
        Output::F32 => {
            v.extend(overflow_point(rpt * w, "swiglu: out[r·W + j] passes 2^31 − 1"));
            v.extend(second_trip(rpt * w, 1, "swiglu", limits));
        }
        Output::Q8_1 => {
            let nb = w / QK as u64;
            v.extend(overflow_point(rpt * nb, "swiglu_q8_1: block index r·(W/32) + b passes 2^31 − 1"));
            v.extend(second_trip(rpt * nb, 32, "swiglu_q8_1", limits));
        }
    }
    v
}

/// Gate and up, and the guarded output.
pub fn device_bytes(tokens: u64, c: &SwigluCase) -> u64 {
    let n = tokens * c.rows_per_token as u64 * c.width as u64;
    let out = match c.output {
        Output::F32 => 4 * n,
        Output::Q8_1 => n / QK as u64 * BLOCK_Q8_1_BYTES as u64,
    };
    8 * n + out + 4 * GUARD_WORDS as u64
}

const SEED_GATE: u64 = 0x60;
const SEED_UP: u64 = 0x61;
/// Gate values in ±8: silu's negative tail (exp(8) ≈ 3000), its bend and its linear part.
const GATE_SCALE: f32 = 8.0;
const UP_SCALE: f32 = 2.0;
const SAMPLE_ROWS: usize = 256;

/// The self-test's inputs: two seeded buffers, or one fused buffer filled from one seed (gate
/// and up then share `GATE_SCALE`).
struct Inputs {
    layout: Layout,
    gate: CudaSlice<f32>,
    up: Option<CudaSlice<f32>>,
}

impl Inputs {
    fn new(gpu: &Gpu, rows: u64, width: u32, layout: Layout) -> Result<Inputs, GpuError> {
        let n = rows as usize * width as usize;
        match layout {
            Layout::Separate => {
                let (mut gate, mut up) = (gpu.alloc::<f32>(n)?, gpu.alloc::<f32>(n)?);
                fill_uniform(gpu, &mut gate, n, SEED_GATE, GATE_SCALE)?;
                fill_uniform(gpu, &mut up, n, SEED_UP, UP_SCALE)?;
                Ok(Inputs { layout, gate, up: Some(up) })
            }
            Layout::Fused => {
                let mut gu = gpu.alloc::<f32>(2 * n)?;
                fill_uniform(gpu, &mut gu, 2 * n, SEED_GATE, GATE_SCALE)?;
                Ok(Inputs { layout, gate: gu, up: None })
            }
        }
    }

    fn device(&self) -> GateUp<'_> {
        match &self.up {
            Some(up) => GateUp::Separate { gate: &self.gate, up },
            None => GateUp::Fused(&self.gate),
        }
    }

    /// Row `r`'s gate and up values, as the device buffers hold them.
    fn row(&self, r: u64, width: u32) -> (Vec<f32>, Vec<f32>) {
        let w = width as usize;
        match self.layout {
            Layout::Separate => (uniform_row(SEED_GATE, r * w as u64, w, GATE_SCALE), uniform_row(SEED_UP, r * w as u64, w, UP_SCALE)),
            Layout::Fused => {
                let start = 2 * r * w as u64;
                (uniform_row(SEED_GATE, start, w, GATE_SCALE), uniform_row(SEED_GATE, start + w as u64, w, GATE_SCALE))
            }
        }
    }
}

/// Self-test: gate and up from seeds, output poisoned, one launch, sampled rows against the
/// twin (f32: values; q8_1: dequantized values and the quants within a step).
pub fn run_case(gpu: &Gpu, tokens: u64, c: &SwigluCase) -> Result<Outcome, GpuError> {
    plans(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    let (rows, w) = (tokens * c.rows_per_token as u64, c.width as usize);
    let ins = Inputs::new(gpu, rows, c.width, c.layout)?;
    let (words, item_words) = match c.output {
        Output::F32 => (rows as usize * w, 1),
        Output::Q8_1 => (rows as usize * w / QK * BLOCK_WORDS, BLOCK_WORDS),
    };
    let mut out = Guarded::new(gpu, words)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch(gpu, rows, c.width, c.output, ins.device(), &mut out.buf)?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = out.check(gpu, item_words)?;
    let sampled = sample_rows(rows, c.rows_per_token as u64, SAMPLE_ROWS, rows);
    let want: Vec<(Vec<f32>, Vec<f32>)> = sampled.par_iter().map(|&r| ins.row(r, c.width)).collect();
    let row_words = words / rows as usize;
    let (mut err, mut mismatches) = (RelErr::default(), 0u64);
    for (&r, (gate, up)) in sampled.iter().zip(&want) {
        let at = r as usize * row_words;
        let exact = swiglu_cpu(gate, up);
        match c.output {
            Output::F32 => err.add_slice((r as usize * w) as u64, &out.read_f32(gpu, at, w)?, &exact),
            Output::Q8_1 => {
                let bytes: Vec<u8> = gpu.download_range(&out.buf, at, row_words)?.iter().flat_map(|x| x.to_le_bytes()).collect();
                let got: Vec<BlockQ8_1> = bytes.chunks_exact(BLOCK_Q8_1_BYTES).map(BlockQ8_1::from_bytes).collect();
                mismatches += quant_mismatches(&got, &quantize_row_q8_1(&exact));
                err.add_slice((r as usize * w) as u64, &dequantize_q8_1(&got), &exact);
            }
        }
    }
    let tolerance = if c.output == Output::F32 { TOLERANCE } else { Q8_1_TOLERANCE };
    let mut check = Check::of_floats(&err, tolerance, (unwritten, past_end), kernel_ms);
    check.int_mismatches = mismatches;
    if mismatches > 0 {
        check.note = format!("{mismatches} quants more than one step from the twin's; {}", check.note);
    }
    Ok(Outcome::Ran(check))
}

/// Quants of `got` more than one step from `want`'s.
fn quant_mismatches(got: &[BlockQ8_1], want: &[BlockQ8_1]) -> u64 {
    got.iter().zip(want).flat_map(|(g, w)| g.qs.iter().zip(&w.qs)).filter(|(g, w)| (**g as i32 - **w as i32).abs() > 1).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thresholds::TOP_K_SET;

    const QWEN: SwigluCase = SwigluCase { width: 768, rows_per_token: 8, layout: Layout::Separate, output: Output::F32 };

    #[test]
    fn twin_matches_f64_formula() {
        let gate = uniform_row(1, 0, 4096, GATE_SCALE);
        let up = uniform_row(2, 0, 4096, UP_SCALE);
        let got = swiglu_cpu(&gate, &up);
        for ((&g, &u), &y) in gate.iter().zip(&up).zip(&got) {
            let want = g as f64 / (1.0 + (-(g as f64)).exp()) * u as f64;
            assert!((y as f64 - want).abs() <= 1e-6 * want.abs().max(1e-30), "{g} {u}: {y} vs {want}");
        }
        // Saturation: silu(−100) underflows to −0 times u, silu(100) is 100.
        assert_eq!(swiglu_value(-100.0, 1.0), 0.0);
        assert_eq!(swiglu_value(100.0, 0.5), 50.0);
    }

    #[test]
    fn quantized_twin_is_quantize_of_f32_twin() {
        let gate = uniform_row(3, 0, 256, GATE_SCALE);
        let up = uniform_row(4, 0, 256, UP_SCALE);
        let q = swiglu_q8_1_cpu(&gate, &up);
        assert_eq!(q.len(), 8);
        let exact = swiglu_cpu(&gate, &up);
        let mut err = RelErr::default();
        err.add_slice(0, &dequantize_q8_1(&q), &exact);
        assert!(err.value() <= Q8_1_TOLERANCE, "{}", err.value());
        assert_eq!(quant_mismatches(&q, &q), 0);
        let mut off = q.clone();
        off[3].qs[7] = off[3].qs[7].wrapping_add(2);
        assert_eq!(quant_mismatches(&off, &q), 1);
    }

    #[test]
    fn plans_cover_every_item_once() {
        for limits in DeviceLimits::recorded() {
            for &k in &TOP_K_SET {
                for output in [Output::F32, Output::Q8_1] {
                    let c = SwigluCase { rows_per_token: k, output, ..QWEN };
                    for t in (1..=40u64).chain([8191, 8192, 349_525, 349_526, 1 << 20]) {
                        let p = &plans(t, &c, &limits).unwrap_or_else(|e| panic!("{e}"))[0];
                        p.check_cover().unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(p.grid[1..], [1, 1]);
                        let per_row = if output == Output::F32 { 768 } else { 24 };
                        assert_eq!(p.cover[0].items(), t * k as u64 * per_row);
                        if t <= 3 {
                            assert!(p.simulate_cover(0).iter().all(|&h| h == 1), "{p}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        let l = DeviceLimits::gb10();
        let un = |r: Result<Vec<Launch>, PlanError>| matches!(r, Err(PlanError::Unsupported { .. }));
        assert!(un(plans(0, &QWEN, &l)));
        assert!(un(plans(1, &SwigluCase { width: 0, ..QWEN }, &l)));
        assert!(un(plans(1, &SwigluCase { rows_per_token: 0, ..QWEN }, &l)));
        assert!(un(plans(1, &SwigluCase { width: 100, output: Output::Q8_1, ..QWEN }, &l)));
        assert!(!un(plans(1, &SwigluCase { width: 100, ..QWEN }, &l)));
        assert!(un(plans(u64::MAX / 4, &QWEN, &l)));
    }

    #[test]
    fn critical_counts_for_qwen3() {
        let l = DeviceLimits::h200();
        let counts = |c: SwigluCase| -> Vec<u64> { critical_counts(&c, &l).iter().map(|c| c.tokens).collect() };
        // out: (2^31 − 1) / (8 · 768) = 349,525.3; fused input: / (8 · 1536) = 174,762.6.
        let f32_fused = counts(SwigluCase { layout: Layout::Fused, ..QWEN });
        for t in [1, 349_525, 349_526, 174_762, 174_763] {
            assert!(f32_fused.contains(&t), "{t} missing from {f32_fused:?}");
        }
        // q8_1 blocks: (2^31 − 1) / (8 · 24) = 11,184,810.7.
        let q = counts(SwigluCase { output: Output::Q8_1, ..QWEN });
        assert!(q.contains(&11_184_810) && q.contains(&11_184_811), "{q:?}");
        // The second trip: one grid of blocks covers the count before, not the count.
        let c = SwigluCase { output: Output::Q8_1, ..QWEN };
        let second = critical_counts(&c, &l).into_iter().find(|x| x.reason.contains("second trip")).unwrap().tokens;
        let p = |t: u64| plans(t, &c, &l).unwrap().remove(0);
        let covered = |t: u64| p(t).blocks() * WARPS as u64 >= t * 8 * 24;
        assert!(covered(second - 1) && !covered(second));
    }
}
