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

pub const KERNEL: &str = "router";
pub const TOLERANCE: f64 = 0.0;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouterCase {
    pub experts: u32,
    pub top_k: u32,
    pub scoring: Scoring,
    pub renormalize: bool,
    /// All logits equal: ties broken by the lowest expert id (and every token then routes to the same experts).
    pub ties: bool,
}

fn todo_err() -> PlanError { PlanError::Unsupported { kernel: KERNEL.into(), what: "scaffold".into(), shape: String::new() } }
pub fn plans(tokens: u64, c: &RouterCase, limits: &DeviceLimits) -> Result<Vec<Launch>, PlanError> { Err(todo_err()) }
pub fn critical_counts(c: &RouterCase, limits: &DeviceLimits) -> Vec<Critical> { vec![] }
pub fn device_bytes(tokens: u64, c: &RouterCase) -> u64 { 0 }
pub fn run_case(gpu: &Gpu, tokens: u64, c: &RouterCase) -> Result<Outcome, GpuError> { Err(todo_err().into()) }
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring { Softmax, Sigmoid }
