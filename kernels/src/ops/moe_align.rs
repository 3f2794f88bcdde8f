//! SCAFFOLD — being written by a helper; replaced before commit.
#![allow(unused)]
use serde::{Deserialize, Serialize};
use crate::cuda::{Gpu, GpuError};
use crate::launch::{Launch, PlanError};
use crate::limits::DeviceLimits;
use crate::quant::WeightType;
use crate::routing::Routing;
use crate::selftest::case::Outcome;
use crate::thresholds::Critical;

pub const KERNEL: &str = "moe_align";
pub const TOLERANCE: f64 = 0.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AlignCase {
    pub experts: u32,
    pub top_k: u32,
    /// Row tile of the routed GEMM that segments are padded to.
    pub tile: u32,
    pub routing: Routing,
}

fn todo_err() -> PlanError { PlanError::Unsupported { kernel: KERNEL.into(), what: "scaffold".into(), shape: String::new() } }
pub fn plans(tokens: u64, c: &AlignCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> { Err(todo_err()) }
pub fn critical_counts(c: &AlignCase, limits: &DeviceLimits) -> Vec<Critical> { vec![] }
pub fn device_bytes(tokens: u64, c: &AlignCase) -> u64 { 0 }
pub fn run_case(gpu: &Gpu, tokens: u64, c: &AlignCase) -> Result<Outcome, GpuError> { Err(todo_err().into()) }

// ---- CPU twin (written first: the routed GEMM's self-test uses it to build its inputs) ----

/// The sentinel id of a padding row: one past the last (token, slot) pair.
pub fn sentinel(tokens: u64, top_k: u32) -> i32 {
    (tokens * top_k as u64) as i32
}

/// Upper bound of rows after padding every expert's segment to `tile`: the buffers are sized
/// by it (the real count is only known on the device).
pub fn max_padded_rows(tokens: u64, top_k: u32, experts: u32, tile: u32) -> u64 {
    let pairs = tokens * top_k as u64;
    (pairs + experts as u64 * (tile as u64 - 1)).div_ceil(tile as u64) * tile as u64
}

/// Tokens sorted by expert, each expert's segment padded to a multiple of `tile`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Aligned {
    /// `[max_padded_rows]`: the (token·top_k + slot) pair of each row, [`sentinel`] for padding
    /// (and for rows past `padded_rows`).
    pub sorted_ids: Vec<i32>,
    /// `[max_padded_rows / tile]`: the expert of each row tile, −1 past `padded_rows`.
    pub tile_expert: Vec<i32>,
    /// `[experts + 1]`: start row of each expert's padded segment; the last is `padded_rows`.
    pub offsets: Vec<i32>,
    pub padded_rows: u64,
}

/// CPU twin of the alignment kernels. Within a segment, pairs are in increasing order (the GPU
/// scatter uses atomics, so its order within a segment is arbitrary and compared as a set).
pub fn align_cpu(ids: &[i32], tokens: u64, top_k: u32, experts: u32, tile: u32) -> Aligned {
    let (e, tile_u) = (experts as usize, tile as u64);
    let max_rows = max_padded_rows(tokens, top_k, experts, tile) as usize;
    let mut counts = vec![0u64; e];
    for &x in ids {
        counts[x as usize] += 1;
    }
    let mut offsets = Vec::with_capacity(e + 1);
    let mut at = 0u64;
    for &c in &counts {
        offsets.push(at as i32);
        at += c.div_ceil(tile_u) * tile_u;
    }
    offsets.push(at as i32);
    let sent = sentinel(tokens, top_k);
    let mut sorted_ids = vec![sent; max_rows];
    let mut cursor: Vec<u64> = offsets[..e].iter().map(|&o| o as u64).collect();
    for (pair, &x) in ids.iter().enumerate() {
        sorted_ids[cursor[x as usize] as usize] = pair as i32;
        cursor[x as usize] += 1;
    }
    let mut tile_expert = vec![-1i32; max_rows / tile as usize];
    for ex in 0..e {
        for t in (offsets[ex] as u64 / tile_u)..(offsets[ex + 1] as u64 / tile_u) {
            tile_expert[t as usize] = ex as i32;
        }
    }
    Aligned { sorted_ids, tile_expert, offsets, padded_rows: at }
}
