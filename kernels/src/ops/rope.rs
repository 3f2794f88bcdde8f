//! Rotary position embedding, NEOX style as qwen3 uses it: within each head of `d` floats the
//! pairs `(i, i + d/2)` rotate by `pos · freq[i]`, `freq[i] = theta^(-2i/d)`.
//!
//! Applied in place to Q `[tokens, n_head, d]` and K `[tokens, n_kv, d]`, one launch per tensor
//! ([`launch`]); positions `[tokens]` i32 restart per sequence of the batch. The frequencies are
//! computed in f32 as llama.cpp's CUDA backend does (`powf(powf(theta, -2/d), i)`), once per
//! model on the host ([`RopeTable`]: d/2 floats, nothing that grows with tokens); the angle is
//! the f32 product `pos · freq[i]`. Geometry: a grid-stride loop over (token, head, i) items,
//! one rotated pair each (`cuda/rope.cu`), so a single decode token still spreads over the GPU.
//!
//! Accuracy: the twin repeats the device's f32 angle and rotation exactly; only the device's
//! `sincosf` (2 ulp) differs from the host's sine and cosine, hence [`TOLERANCE`]. Against an
//! f64 rotation with exact angles, the f32 angle itself is off by ~1e-7 · pos radians (the f32
//! frequencies and product; llama.cpp's error too: 4e-3 rad at position 40,960), which the unit
//! tests bound.

use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PushKernelArg};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::check::{Check, KernelFamily, Outcome, RelErr, Staged, sample_rows};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Cover, Launch, PlanError, bytes_of, grid_stride_blocks, require_bytes};
use crate::limits::DeviceLimits;
use crate::ops::testdata::{GUARD_WORDS, Guarded, fill_uniform, in_place_diff, note_in_place_diff};
use crate::sources::ROPE;
use crate::testdata::{hash2, uniform_row};
use crate::thresholds::{Critical, overflow_point, tile_tails};

pub const KERNEL: &str = "rope";
/// The CUDA function.
pub const KERNEL_FN: &str = "rope_neox";
/// Relative to the largest output: sin and cos differ by at most ~2.5 ulp (sincosf's 2 ulp and
/// the host's rounding), i.e. 1.5e-7 each, which moves an output by at most (|x0| + |x1|)·1.5e-7
/// plus an ulp of rounding: under 5e-7 of the largest. A swapped pair or a wrong position is
/// off by O(1).
pub const TOLERANCE: f64 = 2e-6;
const THREADS: u32 = 256;
const SAMPLE_ROWS: usize = 512;

/// What a rotation depends on besides the positions: one table per model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    /// Rotated width: the whole head (`rope.dimension_count` = head_dim for qwen3).
    pub head_dim: u32,
    /// `rope.freq_base` (1,000,000 for qwen3).
    pub theta: f32,
}

impl RopeSpec {
    fn half(&self) -> usize {
        self.head_dim as usize / 2
    }

    fn unsupported(&self) -> Option<String> {
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > i32::MAX as u32 {
            Some(format!("head_dim {} must be even, positive and below 2^31", self.head_dim))
        } else if !(self.theta > 0.0 && self.theta.is_finite()) {
            Some(format!("theta {} must be finite and > 0", self.theta))
        } else {
            None
        }
    }

    /// `freq[i] = (theta^(-2/d))^i` in f32, as llama.cpp's CUDA backend computes it.
    pub fn freqs(&self) -> Vec<f32> {
        let scale = self.theta.powf(-2.0 / self.head_dim as f32);
        (0..self.half()).map(|i| scale.powf(i as f32)).collect()
    }

    /// [`RopeSpec::freqs`] under YaRN: pair i's angle `freq_scale · θ · (1 − mix) + θ · mix`
    /// (θ = pos · freq[i]) is `pos · freq[i] · (freq_scale · (1 − mix) + mix)`; the factor is
    /// folded into the frequency (in f64, rounded once).
    pub fn yarn_freqs(&self, yarn: &RopeYarn) -> Vec<f32> {
        let (dims, fs) = (yarn.corr_dims(self.head_dim, self.theta), yarn.freq_scale() as f64);
        self.freqs()
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let mix = RopeYarn::mix(i, dims) as f64;
                (f as f64 * (fs * (1.0 - mix) + mix)) as f32
            })
            .collect()
    }

    /// The table's frequencies and cos/sin factor: plain, or under `yarn`.
    pub fn table(&self, yarn: Option<&RopeYarn>) -> (Vec<f32>, f32) {
        match yarn {
            None => (self.freqs(), 1.0),
            Some(y) => (self.yarn_freqs(y), y.mscale()),
        }
    }
}

/// YaRN context extension (gpt-oss), as llama.cpp runs it for a YaRN model (`rope_yarn` with
/// freq_scale = 1 / factor and ext_factor 1): pair i's angle mixes the interpolated
/// (freq_scale · pos · freq_i) and the original one by a ramp over the correction dims, and cos
/// and sin are scaled by `mscale`. On the device the mix is folded into the pair's frequency
/// ([`RopeSpec::yarn_freqs`]), so the kernel's angle stays one f32 product.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeYarn {
    /// `rope.scaling.factor` (32 for gpt-oss): freq_scale = 1 / factor.
    pub factor: f32,
    /// `rope.scaling.original_context_length` (4096).
    pub orig_ctx: u32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub attn_factor: f32,
}

impl RopeYarn {
    /// gpt-oss's (`gpt-oss-20b`, `gpt-oss-120b`).
    pub const GPT_OSS: RopeYarn = RopeYarn { factor: 32.0, orig_ctx: 4096, beta_fast: 32.0, beta_slow: 1.0, attn_factor: 1.0 };

    fn freq_scale(&self) -> f32 {
        1.0 / self.factor
    }

    /// cos and sin's factor: `attn_factor · (1 + 0.1 ln(1 / freq_scale))` (ggml's, one fma).
    pub fn mscale(&self) -> f32 {
        self.attn_factor * 0.1f32.mul_add((1.0 / self.freq_scale()).ln(), 1.0)
    }

    /// `ggml_rope_yarn_corr_dims` in f32: [max(0, floor(dim(beta_fast))), min(d − 1, ceil(dim(beta_slow)))].
    pub fn corr_dims(&self, head_dim: u32, theta: f32) -> [f32; 2] {
        let dim = |n_rot: f32| head_dim as f32 * (self.orig_ctx as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * theta.ln());
        let (start, end, last) = (dim(self.beta_fast).floor(), dim(self.beta_slow).ceil(), (head_dim - 1) as f32);
        [if 0.0 > start { 0.0 } else { start }, if last < end { last } else { end }]
    }

    /// `rope_yarn_ramp` · ext_factor (1) for pair i: 1 − min(1, max(0, (i − low) / max(0.001, high − low))).
    fn mix(i: usize, [low, high]: [f32; 2]) -> f32 {
        let y = (i as f32 - low) / if 0.001 > high - low { 0.001 } else { high - low };
        let y = if 0.0 > y { 0.0 } else { y };
        1.0 - if 1.0 < y { 1.0 } else { y }
    }

    /// The theta and YaRN of a layer kind's `attention.rope` value,
    /// `yarn(theta=…,factor=…,orig_ctx=…,beta_fast=…,beta_slow=…,attn_factor=…)` (the engine's
    /// `LayerSpec::fields`); None for anything else.
    pub fn parse_kind(value: &str) -> Option<(f32, RopeYarn)> {
        let body = value.strip_prefix("yarn(")?.strip_suffix(')')?;
        let get = |key: &str| body.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='));
        let f = |key: &str| get(key)?.parse::<f32>().ok();
        let yarn = RopeYarn {
            factor: f("factor")?,
            orig_ctx: get("orig_ctx")?.parse().ok()?,
            beta_fast: f("beta_fast")?,
            beta_slow: f("beta_slow")?,
            attn_factor: f("attn_factor")?,
        };
        Some((f("theta")?, yarn))
    }

    fn unsupported(&self) -> Option<String> {
        let finite = [self.factor, self.beta_fast, self.beta_slow, self.attn_factor].iter().all(|v| v.is_finite());
        if !finite || self.factor <= 0.0 || self.beta_fast <= 0.0 || self.beta_slow <= 0.0 || self.orig_ctx == 0 {
            Some(format!("YaRN {self:?}: factor, betas and original context must be finite and > 0"))
        } else {
            None
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeCase {
    /// Heads of the rotated tensor: n_head for Q, n_kv for K.
    pub heads: u32,
    pub head_dim: u32,
    pub theta: f32,
    /// Sequences the self-test's batch is split into (positions restart in each).
    pub sequences: u32,
    /// YaRN scaling (gpt-oss); absent: plain NEOX RoPE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yarn: Option<RopeYarn>,
}

impl RopeCase {
    pub fn spec(&self) -> RopeSpec {
        RopeSpec { head_dim: self.head_dim, theta: self.theta }
    }
}

fn shape(tokens: u64, heads: u32, s: &RopeSpec) -> String {
    format!("tokens={tokens} heads={heads} head_dim={} theta={}", s.head_dim, s.theta)
}

/// Every launch one tensor's rotation of `tokens` makes (one).
pub fn plans(tokens: u64, c: &RopeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
    Ok(vec![plan(tokens, c.heads, &c.spec(), limits)?])
}

/// Grid-stride over the `tokens · heads · d/2` (token, head, i) items, 256 threads a block, grid.x capped to
/// fill the device a few times.
pub fn plan(tokens: u64, heads: u32, s: &RopeSpec, limits: &DeviceLimits) -> Result<Launch, PlanError> {
    let what = if tokens == 0 {
        Some("0 tokens".into())
    } else if heads == 0 || heads > i32::MAX as u32 {
        Some(format!("{heads} heads: must be in 1..2^31"))
    } else if tokens.checked_mul(heads as u64 * s.head_dim as u64).is_none() {
        Some("tokens × heads × head_dim overflows 64 bits".into())
    } else {
        s.unsupported()
    };
    if let Some(what) = what {
        return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape: shape(tokens, heads, s) });
    }
    let (items, per_block) = (tokens * heads as u64 * s.half() as u64, THREADS as u64);
    Launch::checked(
        KERNEL_FN,
        shape(tokens, heads, s),
        [grid_stride_blocks(items, per_block, limits), 1, 1],
        [THREADS, 1, 1],
        0,
        vec![Cover::GridStride { items, per_block }],
        limits,
    )
}

/// The frequencies of a model on the device, made once by the engine and passed to every launch.
pub struct RopeTable {
    spec: RopeSpec,
    yarn: Option<RopeYarn>,
    mscale: f32,
    freqs: CudaSlice<f32>,
}

impl RopeTable {
    pub fn new(gpu: &Gpu, spec: RopeSpec) -> Result<RopeTable, GpuError> {
        RopeTable::with_yarn(gpu, spec, None)
    }

    /// The table of `spec`, under YaRN when `yarn` is given.
    pub fn with_yarn(gpu: &Gpu, spec: RopeSpec, yarn: Option<RopeYarn>) -> Result<RopeTable, GpuError> {
        if let Some(what) = spec.unsupported().or_else(|| yarn.and_then(|y| y.unsupported())) {
            let shape = format!("head_dim={} theta={}", spec.head_dim, spec.theta);
            return Err(PlanError::Unsupported { kernel: KERNEL.into(), what, shape }.into());
        }
        let (freqs, mscale) = spec.table(yarn.as_ref());
        Ok(RopeTable { spec, yarn, mscale, freqs: gpu.upload(&freqs)? })
    }

    pub fn spec(&self) -> RopeSpec {
        self.spec
    }

    /// The YaRN scaling the table was made for (the fused norm + RoPE kernel takes none).
    pub fn yarn(&self) -> Option<RopeYarn> {
        self.yarn
    }

    /// The `head_dim / 2` frequencies on the device (the fused norm + RoPE reads them too).
    pub(crate) fn freqs(&self) -> &CudaSlice<f32> {
        &self.freqs
    }
}

/// `(sin, cos)` of the f32 angle `pos · freq`, rounded from f64.
fn rotation(pos: i32, freq: f32) -> (f32, f32) {
    let angle = (pos as f32 * freq) as f64;
    (angle.sin() as f32, angle.cos() as f32)
}

/// CPU twin of one token: `x` holds its heads (`[heads, d]`), rotated in place.
pub fn rope_token_cpu(x: &mut [f32], pos: i32, freqs: &[f32]) {
    rope_token_scaled_cpu(x, pos, freqs, 1.0);
}

/// [`rope_token_cpu`] with cos and sin scaled by `mscale` (YaRN).
pub fn rope_token_scaled_cpu(x: &mut [f32], pos: i32, freqs: &[f32], mscale: f32) {
    let half = freqs.len();
    for (i, &freq) in freqs.iter().enumerate() {
        let (s, c) = rotation(pos, freq);
        let (s, c) = (s * mscale, c * mscale);
        for head in x.chunks_exact_mut(2 * half) {
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * c - x1 * s;
            head[i + half] = x0 * s + x1 * c;
        }
    }
}

/// CPU twin over a batch: `x` `[positions.len(), heads, d]` in place, tokens in parallel.
pub fn rope_cpu(x: &mut [f32], positions: &[i32], heads: usize, s: &RopeSpec) {
    rope_yarn_cpu(x, positions, heads, s, None);
}

/// [`rope_cpu`] under YaRN when `yarn` is given.
pub fn rope_yarn_cpu(x: &mut [f32], positions: &[i32], heads: usize, s: &RopeSpec, yarn: Option<&RopeYarn>) {
    let (freqs, mscale) = s.table(yarn);
    x.par_chunks_mut((heads * s.head_dim as usize).max(1))
        .zip(positions)
        .for_each(|(row, &pos)| rope_token_scaled_cpu(row, pos, &freqs, mscale));
}

/// Rotates `x` (`[tokens, heads, d]`: Q or K) in place at `positions` (`[tokens]`).
pub fn launch(
    gpu: &Gpu,
    tokens: u64,
    heads: u32,
    table: &RopeTable,
    positions: &CudaView<i32>,
    x: &mut CudaViewMut<f32>,
) -> Result<(), GpuError> {
    let bytes = bytes_of(x.len(), 4);
    let (ptr, _done) = x.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, heads, table, positions, (ptr, bytes), (ptr, bytes))
}

/// Rotates `x` into `y` (f32 bits; any element type): the self-test's poisoned output.
pub fn launch_into<Y: DeviceRepr>(
    gpu: &Gpu,
    tokens: u64,
    heads: u32,
    table: &RopeTable,
    positions: &CudaView<i32>,
    x: &CudaView<f32>,
    y: &mut CudaViewMut<Y>,
) -> Result<(), GpuError> {
    let (x_bytes, y_bytes) = (bytes_of(x.len(), 4), bytes_of(y.len(), size_of::<Y>()));
    let (x_ptr, _x_done) = x.device_ptr(gpu.stream());
    let (y_ptr, _y_done) = y.device_ptr_mut(gpu.stream());
    launch_ptrs(gpu, tokens, heads, table, positions, (x_ptr, x_bytes), (y_ptr, y_bytes))
}

/// The launch behind both entry points: `x` and `y` as (device address, bytes) so that they may
/// be the same buffer; the callers hold the buffers' stream guards until it is queued.
fn launch_ptrs(
    gpu: &Gpu,
    tokens: u64,
    heads: u32,
    table: &RopeTable,
    positions: &CudaView<i32>,
    x: (u64, u64),
    y: (u64, u64),
) -> Result<(), GpuError> {
    let p = plan(tokens, heads, &table.spec, gpu.limits())?;
    let n = 4 * tokens * heads as u64 * table.spec.head_dim as u64;
    require_bytes(&p, &[("x", x.1, n), ("y", y.1, n), ("positions", bytes_of(positions.len(), 4), 4 * tokens)])?;
    let f = gpu.function(&ROPE, KERNEL_FN)?;
    let (heads, half, mscale) = (heads as i32, table.spec.half() as i32, table.mscale);
    gpu.launch(&p, &f, |b| {
        b.arg(&x.0).arg(&y.0).arg(positions).arg(&table.freqs).arg(&tokens).arg(&heads).arg(&half).arg(&mscale);
    })?;
    Ok(())
}

/// Counts this plan makes critical: where `x[t·heads·d + …]` and the item index
/// `(t·heads + h)·d/2 + i` pass 2^31 − 1, where the grid-stride loop starts a second round (the grid is capped by the
/// device), and the tails of the tokens one block holds.
pub fn critical_counts(c: &RopeCase, limits: &DeviceLimits) -> Vec<Critical> {
    let per_token = (c.heads as u64 * (c.head_dim / 2) as u64).max(1);
    let mut v = vec![Critical::new(1, "single token")];
    v.extend(overflow_point(c.heads as u64 * c.head_dim as u64, "rope: x[t·heads·d + h·d + i] passes 2^31 − 1"));
    v.extend(overflow_point(per_token, "rope: item (t·heads + h)·d/2 + i passes 2^31 − 1"));
    let per_block = THREADS as u64;
    let cap = grid_stride_blocks(u64::MAX, per_block, limits);
    let last = cap * per_block / per_token;
    v.push(Critical::new(last, format!("rope: {cap} blocks hold every item in one round (grid capped)")));
    v.push(Critical::new(last + 1, format!("rope: first count whose grid-stride loop takes a second round ({cap} blocks)")));
    if per_block.is_multiple_of(per_token) && per_block / per_token > 1 {
        v.extend(tile_tails(per_block / per_token, true, &[], &format!("rope: {} tokens per block", per_block / per_token)));
    }
    v
}

/// Input, positions, frequencies and the guarded output of a self-test case.
pub fn device_bytes(tokens: u64, c: &RopeCase) -> u64 {
    let n = tokens * c.heads as u64 * c.head_dim as u64;
    4 * (n + tokens + c.head_dim as u64 / 2 + n + GUARD_WORDS as u64)
}

const SEED_X: u64 = 0x60;
const SEED_POS: u64 = 0x61;
/// Sequences after the first start as if this much context came before them (qwen3's context).
const MAX_START: u64 = 40_960;

/// Positions of the self-test batch: `sequences` sequences (fewer if there are fewer tokens)
/// of equal length, the remainder in the last; positions restart in each, the first at 0, the
/// others at a pseudo-random offset below [`MAX_START`] (a sequence resuming with context).
pub(crate) fn test_positions(tokens: u64, sequences: u32) -> Vec<i32> {
    let seqs = (sequences as u64).clamp(1, tokens);
    let len = tokens / seqs;
    (0..tokens)
        .map(|t| {
            let s = (t / len).min(seqs - 1);
            let start = if s == 0 { 0 } else { hash2(SEED_POS, s) % MAX_START };
            (start + t - s * len) as i32
        })
        .collect()
}

/// Self-test: x from a seed and a batch of sequences' positions, rotated into a poisoned y;
/// sampled tokens compared with the twin; then the in-place launch over x must reproduce y bit
/// for bit on those tokens.
pub fn run_case(gpu: &Gpu, tokens: u64, c: &RopeCase) -> Result<Outcome, GpuError> {
    stage_case(gpu, tokens, c).map(Staged::finish)
}

/// [`run_case`]'s GPU half: both launches, the poison check, the in-place difference and the
/// sampled tokens of y downloaded in runs; the host table, the twin and the comparison are the
/// host check.
pub fn stage_case(gpu: &Gpu, tokens: u64, c: &RopeCase) -> Result<Staged, GpuError> {
    let spec = c.spec();
    plan(tokens, c.heads, &spec, gpu.limits())?; // a bad shape is refused before anything is allocated
    let table = RopeTable::with_yarn(gpu, spec, c.yarn)?;
    let row = c.heads as usize * c.head_dim as usize;
    let n = tokens as usize * row;
    let mut x = gpu.alloc::<f32>(n)?;
    fill_uniform(gpu, &mut x, n, SEED_X, 1.0)?;
    let positions = test_positions(tokens, c.sequences);
    let pos_dev = gpu.upload(&positions)?;
    let mut y = Guarded::new(gpu, n)?;
    gpu.synchronize()?;
    let start = Instant::now();
    launch_into(gpu, tokens, c.heads, &table, &pos_dev.as_view(), &x.as_view(), &mut y.buf.slice_mut(..n))?;
    gpu.synchronize()?;
    let kernel_ms = start.elapsed().as_secs_f64() * 1e3;
    let (unwritten, past_end) = y.check(gpu, 1)?;
    let sampled = sample_rows(tokens, 64, SAMPLE_ROWS, tokens);
    let got = y.read_rows_f32(gpu, &sampled, row)?;
    launch(gpu, tokens, c.heads, &table, &pos_dev.as_view(), &mut x.as_view_mut())?;
    let diff = in_place_diff(gpu, &sampled, row, &x, &y)?;
    let yarn = c.yarn;
    Ok(Staged::Check(Box::new(move || {
        let (freqs, mscale) = spec.table(yarn.as_ref());
        let want: Vec<Vec<f32>> = sampled
            .par_iter()
            .map(|&t| {
                let mut r = uniform_row(SEED_X, t * row as u64, row, 1.0);
                rope_token_scaled_cpu(&mut r, positions[t as usize], &freqs, mscale);
                r
            })
            .collect();
        let mut err = RelErr::default();
        for ((&t, want), got) in sampled.iter().zip(&want).zip(&got) {
            err.add_slice(t * row as u64, got, want);
        }
        let check = Check::of_floats(&err, TOLERANCE, (unwritten, past_end), kernel_ms);
        Outcome::Ran(note_in_place_diff(check, diff))
    })))
}

/// The self-test's handle on this family (registered in `selftest::case`).
pub struct Family;

impl KernelFamily for Family {
    type Case = RopeCase;

    fn run(gpu: &Gpu, tokens: u64, c: &RopeCase) -> Result<Outcome, GpuError> {
        run_case(gpu, tokens, c)
    }

    fn stage(gpu: &Gpu, tokens: u64, c: &RopeCase) -> Result<Staged, GpuError> {
        stage_case(gpu, tokens, c)
    }

    fn plans(tokens: u64, c: &RopeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> {
        plans(tokens, c, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: RopeCase = RopeCase { heads: 32, head_dim: 128, theta: 1e6, sequences: 4, yarn: None };
    const K: RopeCase = RopeCase { heads: 4, ..Q };

    /// Rotation with the angle pos · theta^(-2i/d) in f64.
    fn scalar_token(x: &[f32], pos: i32, s: &RopeSpec) -> Vec<f64> {
        let (d, half) = (s.head_dim as usize, s.half());
        let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        for head in out.chunks_exact_mut(d) {
            for i in 0..half {
                let angle = pos as f64 * (s.theta as f64).powf(-2.0 * i as f64 / d as f64);
                let (x0, x1) = (head[i], head[i + half]);
                head[i] = x0 * angle.cos() - x1 * angle.sin();
                head[i + half] = x0 * angle.sin() + x1 * angle.cos();
            }
        }
        out
    }

    #[test]
    fn twin_matches_f64_rotation_within_the_f32_angle_error() {
        for spec in [RopeSpec { head_dim: 128, theta: 1e6 }, RopeSpec { head_dim: 64, theta: 1e4 }, RopeSpec { head_dim: 2, theta: 1e6 }] {
            let heads = 3;
            let row = heads * spec.head_dim as usize;
            let positions = [0, 1, 2, 7, 100, 4095, 40_959, 300_000, -5];
            let mut x = uniform_row(7, 0, positions.len() * row, 1.0);
            let orig = x.clone();
            rope_cpu(&mut x, &positions, heads, &spec);
            for (t, &pos) in positions.iter().enumerate() {
                let want = scalar_token(&orig[t * row..(t + 1) * row], pos, &spec);
                // The f32 angle is off by ~1e-7·|pos| rad (measured up to 9e-8·|pos| here, see
                // the module doc); sin and cos by ~1e-7.
                let bound = 2e-7 * pos.unsigned_abs() as f64 + 1e-6;
                for (j, (g, w)) in x[t * row..(t + 1) * row].iter().zip(&want).enumerate() {
                    assert!((*g as f64 - w).abs() <= bound, "{spec:?} pos {pos} elem {j}: {g} vs {w}");
                }
            }
            // Position 0 is the identity, bit for bit.
            assert_eq!(x[..row], orig[..row]);
        }
    }

    #[test]
    fn rotates_neox_pairs_of_each_head() {
        // One head of 4: pairs (0, 2) and (1, 3); freq = [1, theta^(-1/2)].
        let s = RopeSpec { head_dim: 4, theta: 100.0 };
        assert_eq!(s.freqs(), vec![1.0, 0.1]);
        let mut x = vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0];
        rope_cpu(&mut x, &[1, 10], 1, &s);
        let sc = |a: f32| ((a as f64).sin() as f32, (a as f64).cos() as f32);
        // Position 1: pair (0, 2) by 1 rad, pair (1, 3) by 0.1 rad.
        let ((s1, c1), (s01, c01)) = (sc(1.0), sc(0.1));
        assert_eq!(x[..4], [c1, -s01, s1, c01]);
        // Position 10: by 10 rad and by 10 · 0.1 = 1 rad (in f32).
        let (s10, c10) = sc(10.0);
        assert_eq!(x[4..], [c10, -s1, s10, c1]);
    }

    /// YaRN's table: below the fast correction dim the pairs keep their frequency (ramp 1),
    /// past the slow one they are interpolated (× freq_scale), linear between; cos and sin are
    /// scaled by 1 + 0.1 ln(factor); without YaRN the table is plain RoPE's, mscale 1.
    #[test]
    fn yarn_table_ramps_between_the_correction_dims() {
        let s = RopeSpec { head_dim: 64, theta: 150_000.0 };
        let y = RopeYarn::GPT_OSS;
        assert_eq!(y.corr_dims(64, 150_000.0), [8.0, 18.0]);
        let (plain, eff) = (s.freqs(), s.yarn_freqs(&y));
        for i in 0..32 {
            let mix = (1.0 - ((i as f64 - 8.0) / 10.0).clamp(0.0, 1.0)) as f64;
            let want = plain[i] as f64 * (mix + (1.0 - mix) / 32.0);
            assert!((eff[i] as f64 - want).abs() <= 1e-6 * want, "pair {i}: {} vs {want}", eff[i]);
        }
        assert_eq!(eff[..=8], plain[..=8]);
        assert!((y.mscale() as f64 - (1.0 + 0.1 * 32f64.ln())).abs() < 1e-6);
        assert_eq!(s.table(None), (plain.clone(), 1.0));
        // The twin with mscale 1 is the plain one, bit for bit.
        let mut a = uniform_row(3, 0, 128, 1.0);
        let mut b = a.clone();
        rope_token_cpu(&mut a, 77, &plain);
        rope_token_scaled_cpu(&mut b, 77, &plain, 1.0);
        assert_eq!(a, b);
    }

    #[test]
    fn yarn_parses_from_a_layer_kind() {
        let kind = "yarn(theta=150000,factor=32,orig_ctx=4096,beta_fast=32,beta_slow=1,attn_factor=1)";
        assert_eq!(RopeYarn::parse_kind(kind), Some((150_000.0, RopeYarn::GPT_OSS)));
        assert_eq!(RopeYarn::parse_kind("neox(theta=1000000)"), None);
        assert_eq!(RopeYarn::parse_kind("yarn(theta=1,factor=x)"), None);
        let bad = RopeYarn { factor: 0.0, ..RopeYarn::GPT_OSS };
        assert!(bad.unsupported().is_some() && RopeYarn::GPT_OSS.unsupported().is_none());
    }

    #[test]
    fn freqs_follow_llama_cpp() {
        let s = Q.spec();
        let f = s.freqs();
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[1], 1e6f32.powf(-2.0 / 128.0));
        assert!(f.windows(2).all(|w| w[1] < w[0]));
        let exact = 1e6f64.powf(-126.0 / 128.0);
        assert!((f[63] as f64 - exact).abs() <= 1e-5 * exact, "{} vs {exact}", f[63]);
    }

    #[test]
    fn positions_restart_per_sequence() {
        let p = test_positions(10, 4);
        let starts: Vec<i32> = (1..4).map(|s| (hash2(SEED_POS, s) % MAX_START) as i32).collect();
        let want = [0, 1, starts[0], starts[0] + 1, starts[1], starts[1] + 1, starts[2], starts[2] + 1, starts[2] + 2, starts[2] + 3];
        assert_eq!(p, want);
        assert_eq!(test_positions(3, 4), vec![0, starts[0], starts[1]]);
        assert_eq!(test_positions(5, 1), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn plans_cover_every_item_once() {
        for limits in DeviceLimits::recorded() {
            for c in [Q, K] {
                for tokens in (1..=256).chain([8191, 8192, 14_135, 16_896, 16_897, 1 << 20]) {
                    let p = plans(tokens, &c, &limits).unwrap_or_else(|e| panic!("{e}"));
                    assert_eq!(p.len(), 1);
                    p[0].check_cover().unwrap_or_else(|e| panic!("{e}"));
                    if tokens <= 256 {
                        assert!(p[0].simulate_cover(0).iter().all(|&h| h == 1), "{}", p[0]);
                    }
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_typed_errors() {
        let l = DeviceLimits::gb10();
        let bad = [
            (0, Q),
            (1, RopeCase { heads: 0, ..Q }),
            (1, RopeCase { head_dim: 0, ..Q }),
            (1, RopeCase { head_dim: 127, ..Q }),
            (1, RopeCase { theta: 0.0, ..Q }),
            (1, RopeCase { theta: f32::NAN, ..Q }),
            (1, RopeCase { theta: -1e4, ..Q }),
            (u64::MAX / 2, Q),
        ];
        for (tokens, c) in bad {
            assert!(matches!(plans(tokens, &c, &l), Err(PlanError::Unsupported { .. })), "{c:?}");
        }
    }

    #[test]
    fn critical_counts_for_qwen3() {
        let counts = |c: &RopeCase, l: &DeviceLimits| -> Vec<u64> { critical_counts(c, l).iter().map(|c| c.tokens).collect() };
        let h200 = DeviceLimits::h200();
        // Q: 2^31 / (32·128) = 524,287.99; items 2^31 / (32·64) = 1,048,575.99; K: 2^31 / (4·128).
        for t in [1, 524_287, 524_288, 1_048_575, 1_048_576] {
            assert!(counts(&Q, &h200).contains(&t), "{t}");
        }
        assert!(counts(&K, &h200).contains(&4_194_303) && counts(&K, &h200).contains(&4_194_304));
        // Grid capped at 132·2048/256·4 = 4224 blocks of 256 threads: 4224·256/2048 = 528 tokens of Q.
        assert!(counts(&Q, &h200).contains(&528) && counts(&Q, &h200).contains(&529));
        // GB10: 48·1536/256·4 = 1152 blocks: 144 tokens.
        assert!(counts(&Q, &DeviceLimits::gb10()).contains(&145));
        // A token is 2,048 items of Q and 256 of K: no block holds a whole second token, no tails.
        assert!(!counts(&Q, &h200).contains(&7) && !counts(&K, &h200).contains(&3));
    }
}
