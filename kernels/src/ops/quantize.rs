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

pub const KERNEL: &str = "quantize";
pub const TOLERANCE: f64 = 0.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuantizeCase {
    /// Row width (hidden size), a multiple of 32.
    pub k: u32,
    pub experts: u32,
    pub top_k: u32,
    pub tile: u32,
    pub routing: Routing,
    /// Gather rows by expert (routed path) or quantize rows in order (dense path).
    pub gather: bool,
}

fn todo_err() -> PlanError { PlanError::Unsupported { kernel: KERNEL.into(), what: "scaffold".into(), shape: String::new() } }
pub fn plans(tokens: u64, c: &QuantizeCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> { Err(todo_err()) }
pub fn critical_counts(c: &QuantizeCase, limits: &DeviceLimits) -> Vec<Critical> { vec![] }
pub fn device_bytes(tokens: u64, c: &QuantizeCase) -> u64 { 0 }
pub fn run_case(gpu: &Gpu, tokens: u64, c: &QuantizeCase) -> Result<Outcome, GpuError> { Err(todo_err().into()) }
