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

pub const KERNEL: &str = "moe_gemv";
pub const TOLERANCE: f64 = 0.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemvCase {
    pub experts: u32,
    pub top_k: u32,
    /// Output rows per expert.
    pub n: u32,
    /// Input width.
    pub k: u32,
    pub wtype: WeightType,
    pub routing: Routing,
}

fn todo_err() -> PlanError { PlanError::Unsupported { kernel: KERNEL.into(), what: "scaffold".into(), shape: String::new() } }
pub fn plans(tokens: u64, c: &GemvCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> { Err(todo_err()) }
pub fn critical_counts(c: &GemvCase, limits: &DeviceLimits) -> Vec<Critical> { vec![] }
pub fn device_bytes(tokens: u64, c: &GemvCase) -> u64 { 0 }
pub fn run_case(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Outcome, GpuError> { Err(todo_err().into()) }
/// Negative control: the same GEMV launched with tokens x top_k on grid.z (kernel in `cuda/neg_gemv_gridz.cu`).
pub const NEG_GRIDZ_KERNEL: &str = "moe_gemv_gridz_broken";
pub fn run_negative_gridz(gpu: &Gpu, tokens: u64, c: &GemvCase) -> Result<Outcome, GpuError> { Err(todo_err().into()) }
pub fn negative_gridz_plan(tokens: u64, c: &GemvCase) -> Launch { unimplemented!() }
