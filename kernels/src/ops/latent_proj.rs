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

pub const KERNEL: &str = "latent_proj";
pub const TOLERANCE: f64 = 0.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatentCase {
    pub k: u32,
    pub width: u32,
    pub groups: u32,
    pub wtype: WeightType,
}

fn todo_err() -> PlanError { PlanError::Unsupported { kernel: KERNEL.into(), what: "scaffold".into(), shape: String::new() } }
pub fn plans(tokens: u64, c: &LatentCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> { Err(todo_err()) }
pub fn critical_counts(c: &LatentCase, limits: &DeviceLimits) -> Vec<Critical> { vec![] }
pub fn device_bytes(tokens: u64, c: &LatentCase) -> u64 { 0 }
pub fn run_case(gpu: &Gpu, tokens: u64, c: &LatentCase) -> Result<Outcome, GpuError> { Err(todo_err().into()) }
/// Negative control: the epilogue whose tail lanes `continue` past the shuffles (kernel in `cuda/neg_latent_tailskip.cu`).
pub fn run_negative_tailskip(gpu: &Gpu, tokens: u64, c: &LatentCase) -> Result<Outcome, GpuError> { Err(todo_err().into()) }
