//! SwiGLU between the experts' gate/up and down projections:
//! `out[r, j] = silu(gate[r, j]) · up[r, j]`, `silu(g) = g / (1 + exp(−g))`, over rows of
//! `width` values (rows: the (token, slot) pairs, width: the expert FFN width).
//!
//! Outputs (`cuda/glue.cu`): f32 `[rows, width]`; or q8_1 blocks `[rows, width/32]` quantized on
//! the fly (as `quantize` does, bit for bit), ready for the down projection: in pair order (the
//! decode GEMV, run with one pair per "token") or gathered into the alignment's expert order with
//! zero padding rows (the routed GEMM's A), which saves writing, re-reading and gathering the f32
//! values. Gate and up are two buffers or the two halves of one `[rows, 2·width]` buffer. Rows
//! pass 65,535 and rows × width passes 2^31 at large prefills (8 · 768 values per token): values
//! (f32) or blocks (q8_1) are walked by a grid-stride loop on `grid.x`, 64-bit indexes.

use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use half::f16;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::moe_align::GEMM_TILE_M;
use crate::ops::moe_align::{align_cpu, max_padded_rows};
use crate::ops::quantize::{self, Source, source_row};
use crate::ops::testdata::{GUARD_WORDS, Guarded, download_rows, fill_uniform};
use crate::quant::{BLOCK_Q8_1_BYTES, BlockQ8_1, QK, dequantize_q8_1, quantize_row_q8_1};
use crate::routing::{Routing, route};
use crate::sources::GLUE;
use crate::testdata::uniform_row;
use crate::thresholds::{Critical, I32_MAX, overflow_point};

pub const KERNEL: &str = "swiglu";
/// The CUDA functions of the two output formats.
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

/// The output of a self-test case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    F32,
    /// q8_1 blocks in pair order (the width a multiple of 32).
    Q8_1,
    /// q8_1 blocks in the expert order of an alignment of `experts` experts (64-row tiles,
    /// the self-test routing with maximal padding): the down projection's A.
    Q8_1Sorted {
        experts: u32,
    },
}

/// The activation of gate and up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    /// `silu(g) · u` (qwen3moe).
    #[default]
    SwiGlu,
    /// gpt-oss's `ggml_swiglu_oai`: `x = min(g, limit)`, `y = clamp(u, −limit, limit)`,
    /// `x / (1 + exp(alpha · −x)) · (y + 1)` (alpha 1.702, limit 7).
    Clamped { alpha: f32, limit: f32 },
}

impl Act {
    /// gpt-oss's constants (llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE`).
    pub const GPT_OSS: Act = Act::Clamped { alpha: 1.702, limit: 7.0 };

    pub fn is_plain(&self) -> bool {
        *self == Act::SwiGlu
    }

    /// The kernels' `(clamped, alpha, limit)` arguments.
    pub(crate) fn args(self) -> (i32, f32, f32) {
        match self {
            Act::SwiGlu => (0, 0.0, 0.0),
            Act::Clamped { alpha, limit } => (1, alpha, limit),
        }
    }

    /// One value, rounded as the device rounds it.
    pub fn value(self, g: f32, u: f32) -> f32 {
        match self {
            Act::SwiGlu => swiglu_value(g, u),
            Act::Clamped { alpha, limit } => swiglu_oai_value(g, u, alpha, limit),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SwigluCase {
    /// Values per row (the expert FFN width).
    pub width: u32,
    /// Rows per token: top_k for the routed experts.
    pub rows_per_token: u32,
    pub layout: Layout,
    pub output: Output,
    /// Clamped SwiGLU (gpt-oss); absent: plain.
    #[serde(default, skip_serializing_if = "Act::is_plain")]
    pub act: Act,
}

impl SwigluCase {
    /// Source rows (pairs) of a batch of `tokens`.
    fn src_rows(&self, tokens: u64) -> u64 {
        tokens.saturating_mul(self.rows_per_token as u64)
    }

    /// Output rows: the pairs, or the alignment's worst-case padded rows.
    fn out_rows(&self, tokens: u64) -> u64 {
        match self.output {
            Output::Q8_1Sorted { experts } => max_padded_rows(tokens, self.rows_per_token, experts, GEMM_TILE_M),
            Output::F32 | Output::Q8_1 => self.src_rows(tokens),
        }
    }
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

    /// `(name, have, need)` bytes for `src_rows` rows of `width`.
    fn needs(&self, src_rows: u64, width: u32) -> Vec<(&'static str, u64, u64)> {
        let n = 4 * src_rows * width as u64;
        match self {
            GateUp::Separate { gate, up } => vec![("gate", bytes_of(gate.len(), 4), n), ("up", bytes_of(up.len(), 4), n)],
            GateUp::Fused(gu) => vec![("gate_up", bytes_of(gu.len(), 4), 2 * n)],
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

fn unsupported(what: impl Into<String>, shape: &str) -> PlanError {
    PlanError::Unsupported { kernel: KERNEL.into(), what: what.into(), shape: shape.into() }
}

/// Every launch a SwiGLU of `tokens` makes (one).
pub fn plans(tokens: u64, c: &SwigluCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    if let Output::Q8_1Sorted { experts } = c.output {
        let shape = format!("tokens={tokens} rows_per_token={} experts={experts}", c.rows_per_token);
        if experts == 0 || c.rows_per_token > experts {
            return Err(unsupported("the alignment needs 1 <= rows per token <= experts", &shape));
        }
        if c.src_rows(tokens) > I32_MAX {
            return Err(unsupported("tokens × rows per token passes the i32 pair ids of the alignment", &shape));
        }
    }
    let q8 = c.output != Output::F32;
    Ok(vec![plan(c.out_rows(tokens), c.width, c.layout, q8, limits)?])
}

/// `rows` output rows of `width`: f32 (`q8_1` false), threads grid-stride over the values;
/// q8_1, warps over the blocks. Both on `grid.x`, 256 threads, capped at a few waves.
pub fn plan(rows: u64, width: u32, layout: Layout, q8_1: bool, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let shape = format!("rows={rows} width={width} {layout:?} -> {}", if q8_1 { "q8_1" } else { "f32" });
    if rows == 0 {
        return Err(unsupported("no rows", &shape));
    }
    if width == 0 || width as u64 > I32_MAX || (q8_1 && !(width as usize).is_multiple_of(QK)) {
        return Err(unsupported(format!("width {width} must be in 1..2^31 (a multiple of {QK} for q8_1 output)"), &shape));
    }
    if rows.checked_mul(in_stride(layout, width)).is_none_or(|n| n > u64::MAX / 64) {
        return Err(unsupported("rows × width overflows 64-bit indexes", &shape));
    }
    let (kernel, items, per_block, threads_per_item) = if q8_1 {
        (Q8_1_KERNEL, rows * (width as u64 / QK as u64), WARPS as u64, 32)
    } else {
        (F32_KERNEL, rows * width as u64, THREADS as u64, 1)
    };
    Launch::checked(
        kernel,
        shape,
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

/// gpt-oss's clamped SwiGLU rounded as the device (and the CPU backend's `swiglu_oai`) rounds it.
pub fn swiglu_oai_value(g: f32, u: f32, alpha: f32, limit: f32) -> f32 {
    let x = if limit < g { limit } else { g };
    let y = if u < -limit {
        -limit
    } else if limit < u {
        limit
    } else {
        u
    };
    x / (1.0 + (alpha * -x).exp()) * (y + 1.0)
}

/// CPU twin, f32 output: `gate` and `up` of equal length (one or many rows).
pub fn swiglu_cpu(gate: &[f32], up: &[f32]) -> Vec<f32> {
    act_cpu(gate, up, Act::SwiGlu)
}

/// [`swiglu_cpu`] under `act`.
pub fn act_cpu(gate: &[f32], up: &[f32], act: Act) -> Vec<f32> {
    gate.par_iter().zip(up).map(|(&g, &u)| act.value(g, u)).collect()
}

const ZERO_BLOCK: BlockQ8_1 = BlockQ8_1 { d: f16::ZERO, s: f16::ZERO, qs: [0; QK] };

/// CPU twin, q8_1 output: `gate` and `up` are `[src_rows, width]`; output rows in order
/// (`Dense`) or from `sorted_ids` (padding ids give zero blocks), each quantized as `quantize`.
pub fn swiglu_q8_1_cpu(gate: &[f32], up: &[f32], width: usize, source: Source<&[i32]>) -> Vec<BlockQ8_1> {
    act_q8_1_cpu(gate, up, width, source, Act::SwiGlu)
}

/// [`swiglu_q8_1_cpu`] under `act`.
pub fn act_q8_1_cpu(gate: &[f32], up: &[f32], width: usize, source: Source<&[i32]>, act: Act) -> Vec<BlockQ8_1> {
    let (nb, src_rows) = (width / QK, (gate.len() / width.max(1)) as u64);
    let rows = match source {
        Source::Dense => src_rows as usize,
        Source::Gather { sorted_ids, .. } => sorted_ids.len(),
    };
    let mut out = vec![ZERO_BLOCK; rows * nb];
    out.par_chunks_mut(nb.max(1)).enumerate().for_each(|(r, o)| {
        let src = match source {
            Source::Dense => Some(r as u64),
            Source::Gather { sorted_ids, rows_per_token } => source_row(sorted_ids[r], src_rows, rows_per_token),
        };
        if let Some(s) = src.map(|s| s as usize * width) {
            o.copy_from_slice(&quantize_row_q8_1(&act_cpu(&gate[s..s + width], &up[s..s + width], act)));
        }
    });
    out
}

/// SwiGLU of `rows` rows of `width` values into f32 `out [rows, width]` (any 4-byte element
/// type). Buffers too small for the shape are refused before the launch.
pub fn launch_f32<Y: DeviceRepr>(gpu: &Gpu, rows: u64, width: u32, input: GateUp<'_>, out: &mut CudaSlice<Y>) -> Result<(), GpuError> {
    launch_f32_act(gpu, rows, width, input, Act::SwiGlu, out)
}

/// [`launch_f32`] under `act`.
pub fn launch_f32_act<Y: DeviceRepr>(
    gpu: &Gpu,
    rows: u64,
    width: u32,
    input: GateUp<'_>,
    act: Act,
    out: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    let p = plan(rows, width, input.layout(), false, gpu.limits())?;
    let mut needs = input.needs(rows, width);
    needs.push(("out", bytes_of(out.len(), size_of::<Y>()), 4 * rows * width as u64));
    require_bytes(&p, &needs)?;
    let f = gpu.function(&GLUE, F32_KERNEL)?;
    let (stride, w, offsets) = (in_stride(input.layout(), width), width as i32, [0, width as u64]);
    let (clamped, alpha, limit) = act.args();
    gpu.launch(&p, &f, |b| {
        push_input(b, &input, &offsets);
        b.arg(&stride).arg(out).arg(&rows).arg(&w).arg(&clamped).arg(&alpha).arg(&limit);
    })?;
    Ok(())
}

/// SwiGLU of the `src_rows` rows of `input` (`[src_rows, width]` each of gate and up),
/// quantized into `out_rows` rows of q8_1 blocks `out [out_rows, width/32]` (any element
/// type): row r from source row r (`Dense`, `out_rows <= src_rows`) or from
/// `sorted_ids[r] / rows_per_token` (`Gather`; padding ids give zero rows). Arguments that do not
/// fit the shape are refused before the launch.
pub fn launch_q8_1<Y: DeviceRepr>(
    gpu: &Gpu,
    src_rows: u64,
    width: u32,
    input: GateUp<'_>,
    source: Source<&CudaSlice<i32>>,
    out_rows: u64,
    out: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    launch_q8_1_act(gpu, (src_rows, width), input, Act::SwiGlu, source, out_rows, out)
}

/// [`launch_q8_1`] under `act`.
pub fn launch_q8_1_act<Y: DeviceRepr>(
    gpu: &Gpu,
    (src_rows, width): (u64, u32),
    input: GateUp<'_>,
    act: Act,
    source: Source<&CudaSlice<i32>>,
    out_rows: u64,
    out: &mut CudaSlice<Y>,
) -> Result<(), GpuError> {
    let p = plan(out_rows, width, input.layout(), true, gpu.limits())?;
    let (ids, rows_per_token) = match source {
        Source::Dense => (None, 1u32),
        Source::Gather { sorted_ids, rows_per_token } => (Some(sorted_ids), rows_per_token),
    };
    let fits = rows_per_token >= 1
        && src_rows >= 1
        && match ids {
            None => out_rows <= src_rows,
            Some(ids) => ids.len() as u64 >= out_rows,
        };
    if !fits {
        let what = format!(
            "{out_rows} output rows from {src_rows} source rows: rows_per_token {rows_per_token} must be >= 1, sorted_ids must hold a row each, dense needs out_rows <= src_rows"
        );
        return Err(PlanError::Unsupported { kernel: p.kernel.clone(), what, shape: p.shape.clone() }.into());
    }
    let mut needs = input.needs(src_rows, width);
    needs.push(("out", bytes_of(out.len(), size_of::<Y>()), out_rows * (width as u64 / QK as u64) * BLOCK_Q8_1_BYTES as u64));
    require_bytes(&p, &needs)?;
    let f = gpu.function(&GLUE, Q8_1_KERNEL)?;
    let (stride, w, rpt, null) = (in_stride(input.layout(), width), width as i32, rows_per_token as i32, 0u64);
    let offsets = [0, width as u64];
    let (clamped, alpha, limit) = act.args();
    gpu.launch(&p, &f, |b| {
        push_input(b, &input, &offsets);
        b.arg(&stride);
        match ids {
            Some(ids) => b.arg(ids),
            None => b.arg(&null),
        };
        b.arg(&src_rows).arg(&rpt).arg(out).arg(&out_rows).arg(&w).arg(&clamped).arg(&alpha).arg(&limit);
    })?;
    Ok(())
}

/// The kernels' (gate, gate_offset, up, up_offset) arguments; `offsets` is `[0, width]`: for
/// the fused layout the same buffer twice, up `width` values into each row.
fn push_input<'a>(b: &mut cudarc::driver::LaunchArgs<'a>, input: &GateUp<'a>, offsets: &'a [u64; 2]) {
    match input {
        GateUp::Separate { gate, up } => b.arg(*gate).arg(&offsets[0]).arg(*up).arg(&offsets[0]),
        GateUp::Fused(gu) => b.arg(*gu).arg(&offsets[0]).arg(*gu).arg(&offsets[1]),
    };
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

/// Counts this plan makes critical: the 2^31 points of the input and output indexes (padding
/// of the sorted output ignored: it only adds a constant), and where the grid-stride loop first
/// takes a second trip.
pub fn critical_counts(c: &SwigluCase, limits: &DeviceLimits) -> Vec<Critical> {
    let (rpt, w) = (c.rows_per_token.max(1) as u64, c.width.max(1) as u64);
    let mut v = vec![Critical::new(1, "swiglu: single token")];
    v.extend(overflow_point(rpt * in_stride(c.layout, c.width), "swiglu: gate/up[r·stride + j] passes 2^31 − 1"));
    if c.output == Output::F32 {
        v.extend(overflow_point(rpt * w, "swiglu: out[r·W + j] passes 2^31 − 1"));
        v.extend(second_trip(rpt * w, 1, "swiglu", limits));
    } else {
        let nb = w / QK as u64;
        v.extend(overflow_point(rpt * nb, "swiglu_q8_1: block index r·(W/32) + b passes 2^31 − 1"));
        v.extend(second_trip(rpt * nb, 32, "swiglu_q8_1", limits));
    }
    v
}

/// Gate and up, the sorted ids, and the guarded output.
pub fn device_bytes(tokens: u64, c: &SwigluCase) -> u64 {
    let (src, out) = (c.src_rows(tokens) * c.width as u64, c.out_rows(tokens) * c.width as u64);
    let (out, ids) = match c.output {
        Output::F32 => (4 * out, 0),
        Output::Q8_1 => (out / QK as u64 * BLOCK_Q8_1_BYTES as u64, 0),
        Output::Q8_1Sorted { .. } => (out / QK as u64 * BLOCK_Q8_1_BYTES as u64, 4 * c.out_rows(tokens)),
    };
    8 * src + ids + out + 4 * GUARD_WORDS as u64
}

const SEED_GATE: u64 = 0x60;
const SEED_UP: u64 = 0x61;
const SEED_ROUTE: u64 = 0x62;
/// Gate values in ±8: silu's negative tail (exp(8) ≈ 3000), its bend and its linear part.
const GATE_SCALE: f32 = 8.0;
const UP_SCALE: f32 = 2.0;
const SAMPLE_ROWS: usize = 256;

/// The self-test's inputs: two seeded buffers, or one fused buffer filled from one seed (gate
/// and up then share `GATE_SCALE`).
struct Inputs {
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
                Ok(Inputs { gate, up: Some(up) })
            }
            Layout::Fused => {
                let mut gu = gpu.alloc::<f32>(2 * n)?;
                fill_uniform(gpu, &mut gu, 2 * n, SEED_GATE, GATE_SCALE)?;
                Ok(Inputs { gate: gu, up: None })
            }
        }
    }

    fn device(&self) -> GateUp<'_> {
        match &self.up {
            Some(up) => GateUp::Separate { gate: &self.gate, up },
            None => GateUp::Fused(&self.gate),
        }
    }
}

/// Source row `r`'s gate and up values, as the device buffers of [`Inputs`] in `layout` hold
/// them.
fn source_values(layout: Layout, r: u64, width: u32) -> (Vec<f32>, Vec<f32>) {
    let w = width as usize;
    match layout {
        Layout::Separate => (uniform_row(SEED_GATE, r * w as u64, w, GATE_SCALE), uniform_row(SEED_UP, r * w as u64, w, UP_SCALE)),
        Layout::Fused => {
            let start = 2 * r * w as u64;
            (uniform_row(SEED_GATE, start, w, GATE_SCALE), uniform_row(SEED_GATE, start + w as u64, w, GATE_SCALE))
        }
    }
}

/// Self-test: gate and up from seeds (and, sorted, the alignment of a maximal-padding routing),
/// output poisoned, one launch, sampled output rows against the twin: f32 values; q8_1 blocks
/// dequantized against the exact values and their quants within a step of the twin's, padding
/// rows zero.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &SwigluCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: the inputs, the routing and alignment the sorted output is gathered
/// by, the kernel, the poison check and the sampled output rows (downloaded in runs); the twin
/// of those rows and the comparison are left to the host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &SwigluCase) -> Result<Staged, GpuError> {
    plans(tokens, c, gpu.limits())?; // refuse a bad shape before allocating for it
    let (src_rows, out_rows, w) = (c.src_rows(tokens), c.out_rows(tokens), c.width as usize);
    let ins = Inputs::new(gpu, src_rows, c.width, c.layout)?;
    let sorted = match c.output {
        Output::Q8_1Sorted { experts } => {
            let ids =
                route(Routing::MaxPadding, tokens as usize, experts as usize, c.rows_per_token as usize, GEMM_TILE_M as usize, SEED_ROUTE);
            Some(align_cpu(&ids, tokens, c.rows_per_token, experts, GEMM_TILE_M).sorted_ids)
        }
        Output::F32 | Output::Q8_1 => None,
    };
    let ids_dev = sorted.as_deref().map(|s| gpu.upload(s)).transpose()?;
    let row_words = if c.output == Output::F32 { w } else { w / QK * BLOCK_WORDS };
    let mut out = Guarded::new(gpu, out_rows as usize * row_words)?;
    gpu.synchronize()?;
    let start = Instant::now();
    match (&c.output, &ids_dev) {
        (Output::F32, _) => launch_f32_act(gpu, src_rows, c.width, ins.device(), c.act, &mut out.buf)?,
        (_, Some(ids)) => launch_q8_1_act(
            gpu,
            (src_rows, c.width),
            ins.device(),
            c.act,
            Source::Gather { sorted_ids: ids, rows_per_token: 1 },
            out_rows,
            &mut out.buf,
        )?,
        (_, None) => launch_q8_1_act(gpu, (src_rows, c.width), ins.device(), c.act, Source::Dense, out_rows, &mut out.buf)?,
    }
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let guard = out.check(gpu, if c.output == Output::F32 { 1 } else { BLOCK_WORDS })?;
    let sampled = sample_rows(out_rows, GEMM_TILE_M as u64, SAMPLE_ROWS, out_rows);
    let got_words = download_rows(gpu, &out.buf, &sampled, row_words)?;
    let c = *c;
    Ok(Staged::Check(Box::new(move || {
        // The source row of each sampled output row (None: a padding row).
        let src_of = |r: u64| sorted.as_ref().map_or(Some(r), |s| source_row(s[r as usize], src_rows, 1));
        let want: Vec<Option<(Vec<f32>, Vec<f32>)>> =
            sampled.par_iter().map(|&r| src_of(r).map(|s| source_values(c.layout, s, c.width))).collect();
        let (mut err, mut mismatches) = (RelErr::default(), 0u64);
        for ((&r, want), words) in sampled.iter().zip(&want).zip(&got_words) {
            let exact = want.as_ref().map_or_else(|| vec![0.0; w], |(gate, up)| act_cpu(gate, up, c.act));
            if c.output == Output::F32 {
                let got: Vec<f32> = words.iter().map(|&x| f32::from_bits(x)).collect();
                err.add_slice((r as usize * w) as u64, &got, &exact);
                continue;
            }
            let bytes: Vec<u8> = words.iter().flat_map(|x| x.to_le_bytes()).collect();
            let got: Vec<BlockQ8_1> = bytes.chunks_exact(BLOCK_Q8_1_BYTES).map(BlockQ8_1::from_bytes).collect();
            mismatches += quant_mismatches(&got, &quantize_row_q8_1(&exact));
            err.add_slice((r as usize * w) as u64, &dequantize_q8_1(&got), &exact);
        }
        let tolerance = if c.output == Output::F32 { TOLERANCE } else { Q8_1_TOLERANCE };
        let mut check = Check::of_floats(&err, tolerance, guard, kernel_ms);
        check.int_mismatches = mismatches;
        if mismatches > 0 {
            check.note = format!("{mismatches} quants more than one step from the twin's; {}", check.note);
        }
        Outcome::Ran(check)
    })))
}

/// Quants of `got` more than one step from `want`'s.
fn quant_mismatches(got: &[BlockQ8_1], want: &[BlockQ8_1]) -> u64 {
    got.iter().zip(want).flat_map(|(g, w)| g.qs.iter().zip(&w.qs)).filter(|(g, w)| (**g as i32 - **w as i32).abs() > 1).count() as u64
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = SwigluCase;

    fn run(gpu: &Gpu, tokens: u64, c: &SwigluCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &SwigluCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &SwigluCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thresholds::TOP_K_SET;

    const QWEN: SwigluCase = SwigluCase { width: 768, rows_per_token: 8, layout: Layout::Separate, output: Output::F32, act: Act::SwiGlu };

    /// The clamped activation: the gate clamps above only, up both ways, alpha scales the
    /// sigmoid's argument and up gains 1 (the CPU backend's `swiglu_oai` cases, in f64).
    #[test]
    fn clamped_swiglu_clamps_and_matches_f64() {
        let act = Act::GPT_OSS;
        for (g, u) in [(0.5f32, 0.25f32), (-3.0, 1.5), (7.0, 1.0), (8.0, 1.0), (1e30, 1.0), (1.0, -1e9), (1.0, 100.0), (-20.0, -7.5)] {
            let x = (g as f64).min(7.0);
            let y = (u as f64).clamp(-7.0, 7.0);
            let want = x / (1.0 + (-1.702f64 * x).exp()) * (y + 1.0);
            let got = act.value(g, u) as f64;
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-30), "({g}, {u}): {got} vs {want}");
        }
        assert_eq!(act.value(7.0, 1.0), act.value(1e30, 1.0));
        assert_eq!(Act::SwiGlu.value(1.5, -0.5), swiglu_value(1.5, -0.5));
        let (gate, up) = (uniform_row(1, 0, 64, 8.0), uniform_row(2, 0, 64, 8.0));
        assert_eq!(swiglu_q8_1_cpu(&gate, &up, 64, Source::Dense), act_q8_1_cpu(&gate, &up, 64, Source::Dense, Act::SwiGlu));
        assert_eq!(act_q8_1_cpu(&gate, &up, 64, Source::Dense, act)[0], quantize_row_q8_1(&act_cpu(&gate[..32], &up[..32], act))[0]);
        // A plain case's JSON has no `act`: the catalogue's existing cases keep their encoding.
        assert!(!serde_json::to_string(&QWEN).unwrap().contains("act"));
    }

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
        let (rows, w) = (4usize, 64usize);
        let gate = uniform_row(3, 0, rows * w, GATE_SCALE);
        let up = uniform_row(4, 0, rows * w, UP_SCALE);
        let q = swiglu_q8_1_cpu(&gate, &up, w, Source::Dense);
        assert_eq!(q, quantize_row_q8_1(&swiglu_cpu(&gate, &up)));
        let mut err = RelErr::default();
        err.add_slice(0, &dequantize_q8_1(&q), &swiglu_cpu(&gate, &up));
        assert!(err.value() <= Q8_1_TOLERANCE, "{}", err.value());
        assert_eq!(quant_mismatches(&q, &q), 0);
        let mut off = q.clone();
        off[3].qs[7] = off[3].qs[7].wrapping_add(2);
        assert_eq!(quant_mismatches(&off, &q), 1);
        // Gathered: row r is source row sorted_ids[r]; ids past the source rows are padding.
        let sorted = [2, 4, 0, -1, 3];
        let g = swiglu_q8_1_cpu(&gate, &up, w, Source::Gather { sorted_ids: &sorted, rows_per_token: 1 });
        assert_eq!(g.len(), 5 * 2);
        for (r, &id) in sorted.iter().enumerate() {
            let want = if (0..4).contains(&id) { &q[id as usize * 2..][..2] } else { &[ZERO_BLOCK; 2][..] };
            assert_eq!(&g[r * 2..][..2], want, "row {r} id {id}");
        }
    }

    #[test]
    fn plans_cover_every_item_once() {
        for limits in DeviceLimits::recorded() {
            for &k in &TOP_K_SET {
                for output in [Output::F32, Output::Q8_1, Output::Q8_1Sorted { experts: 128 }] {
                    let c = SwigluCase { rows_per_token: k, output, ..QWEN };
                    for t in (1..=40u64).chain([8191, 8192, 349_525, 349_526, 1 << 20]) {
                        let p = &plans(t, &c, &limits).unwrap_or_else(|e| panic!("{e}"))[0];
                        p.check_cover().unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(p.grid[1..], [1, 1]);
                        let per_row = if output == Output::F32 { 768 } else { 24 };
                        assert_eq!(p.cover[0].items(), c.out_rows(t) * per_row);
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
        let sorted = |experts| SwigluCase { output: Output::Q8_1Sorted { experts }, ..QWEN };
        assert!(un(plans(1, &sorted(4), &l)));
        assert!(un(plans(1 << 28, &sorted(128), &l)));
        assert_eq!(plans(3, &sorted(128), &l).unwrap()[0].cover[0].items(), max_padded_rows(3, 8, 128, 64) * 24);
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
