//! Errors of model loading and execution: each names the file, key, tensor or backend at fault.

use std::path::PathBuf;

use brink_kernels::cuda::{GpuError, LaunchError};
use brink_kernels::launch::PlanError;
use serde::{Deserialize, Serialize};

use crate::gguf::{GgmlType, GgufError};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{}: general.architecture is {arch:?}, which brink does not support (supported: {})", .path.display(), .supported.join(", "))]
    UnsupportedArchitecture { path: PathBuf, arch: String, supported: Vec<&'static str> },
    #[error("{}: metadata key {key:?} is {value}: {why}", .path.display())]
    BadHyperparameter { path: PathBuf, key: String, value: String, why: String },
    #[error("{}: tensor {tensor:?} has shape {found:?} (ggml order), expected {expected:?}", .path.display())]
    TensorShape { path: PathBuf, tensor: String, expected: Vec<u64>, found: Vec<u64> },
    #[error("{}: tensor {tensor:?} is {ty}, which the {backend} backend cannot compute with as {role} (supported: {})", .path.display(), .supported.join(", "))]
    UnsupportedTensorType {
        path: PathBuf,
        tensor: String,
        ty: GgmlType,
        backend: &'static str,
        role: &'static str,
        supported: Vec<&'static str>,
    },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("request: {0}")]
    Request(String),
}

/// A failure inside a backend: a CUDA error (naming the kernel, grid, block and shape), an
/// allocation that does not fit, or an input the backend cannot run.
#[derive(Debug, thiserror::Error)]
#[error("{backend} backend: {message}")]
pub struct BackendError {
    pub backend: &'static str,
    pub message: String,
    /// The kernel launch that failed, when that is what this error is: kept typed (not only in
    /// the message) so the server can count launch errors per kernel.
    pub launch: Option<KernelLaunchFailure>,
}

impl BackendError {
    pub fn new(backend: &'static str, message: impl Into<String>) -> Self {
        BackendError { backend, message: message.into(), launch: None }
    }

    /// `error` in `context`; a checked launch's failure (refused plan, driver rejection, fault)
    /// stays typed in [`BackendError::launch`].
    pub fn from_gpu(backend: &'static str, context: impl std::fmt::Display, error: &GpuError) -> Self {
        BackendError { backend, message: format!("{context}: {error}"), launch: KernelLaunchFailure::from_gpu(error) }
    }
}

impl ModelError {
    /// The failed kernel launch behind this error, if it is one.
    pub fn kernel_launch(&self) -> Option<&KernelLaunchFailure> {
        match self {
            ModelError::Backend(b) => b.launch.as_ref(),
            _ => None,
        }
    }
}

/// A kernel launch that failed, as the engine child reports it to the supervisor (which counts
/// `brink_kernel_launch_errors_total{kernel,phase}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelLaunchFailure {
    pub kernel: String,
    /// `plan` (the checked launch refused the geometry against the device's limits, before the
    /// driver saw it), `launch` (the driver rejected it) or `execution` (a fault the diagnostic
    /// synchronise after the launch found, `BRINK_SYNC_LAUNCHES=1`).
    pub phase: String,
    /// The driver's error name, or the plan's refusal.
    pub error: String,
    /// The CUDA context is unusable after it (illegal address, ...).
    pub sticky: bool,
}

impl KernelLaunchFailure {
    pub const PHASES: [&'static str; 3] = ["plan", "launch", "execution"];

    /// The launch failure `error` is, if it is one (allocation and copy errors are not).
    pub fn from_gpu(error: &GpuError) -> Option<KernelLaunchFailure> {
        match error {
            GpuError::Launch(l) => Some(KernelLaunchFailure::from(l.as_ref())),
            GpuError::Plan(p) => Some(KernelLaunchFailure::from(p)),
            _ => None,
        }
    }
}

impl From<&LaunchError> for KernelLaunchFailure {
    fn from(e: &LaunchError) -> Self {
        // Setting the shared-memory attribute is part of launching; only the synchronise's
        // finding is an execution fault.
        let phase = if e.phase == "execution" { "execution" } else { "launch" };
        KernelLaunchFailure { kernel: e.kernel.clone(), phase: phase.into(), error: e.error.clone(), sticky: e.sticky }
    }
}

impl From<&PlanError> for KernelLaunchFailure {
    fn from(e: &PlanError) -> Self {
        let kernel = match e {
            PlanError::GridDim { kernel, .. }
            | PlanError::BlockDim { kernel, .. }
            | PlanError::SharedMem { kernel, .. }
            | PlanError::Unsupported { kernel, .. } => kernel.clone(),
        };
        KernelLaunchFailure { kernel, phase: "plan".into(), error: e.to_string(), sticky: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver_rejection(phase: &str, sticky: bool) -> GpuError {
        GpuError::Launch(Box::new(LaunchError {
            kernel: "moe_gemv_q4_0".into(),
            grid: [8, 1, 65_536],
            block: [128, 1, 1],
            shared_mem: 0,
            shape: "tokens=8192 top_k=8".into(),
            phase: phase.into(),
            error: "CUDA_ERROR_INVALID_VALUE".into(),
            sticky,
        }))
    }

    #[test]
    fn launch_failures_keep_their_kernel_and_phase() {
        let e = BackendError::from_gpu("cuda", "moe expert GEMV blk.3.ffn_gate_exps", &driver_rejection("launch", false));
        assert!(e.message.starts_with("moe expert GEMV blk.3.ffn_gate_exps: kernel moe_gemv_q4_0"), "{}", e.message);
        let l = e.launch.clone().unwrap();
        assert_eq!(
            (l.kernel.as_str(), l.phase.as_str(), l.error.as_str(), l.sticky),
            ("moe_gemv_q4_0", "launch", "CUDA_ERROR_INVALID_VALUE", false)
        );
        let m = ModelError::from(e);
        assert_eq!(m.kernel_launch(), Some(&l));

        let fault = KernelLaunchFailure::from_gpu(&driver_rejection("execution", true)).unwrap();
        assert_eq!((fault.phase.as_str(), fault.sticky), ("execution", true));
        let attr = KernelLaunchFailure::from_gpu(&driver_rejection("set max dynamic shared memory", false)).unwrap();
        assert_eq!(attr.phase, "launch");

        let plan = PlanError::GridDim { kernel: "router".into(), axis: 'y', value: 70_000, limit: 65_535, shape: "tokens=70000".into() };
        let p = KernelLaunchFailure::from_gpu(&GpuError::Plan(plan)).unwrap();
        assert_eq!((p.kernel.as_str(), p.phase.as_str()), ("router", "plan"));
        assert!(p.error.contains("grid.y = 70000"), "{}", p.error);
        for f in [&l, &fault, &attr, &p] {
            assert!(KernelLaunchFailure::PHASES.contains(&f.phase.as_str()), "{f:?}");
        }
    }

    #[test]
    fn other_errors_are_not_launch_failures() {
        let alloc = GpuError::Driver { call: "cuMemAlloc(8 x 4)".into(), error: "CUDA_ERROR_OUT_OF_MEMORY".into() };
        assert_eq!(KernelLaunchFailure::from_gpu(&alloc), None);
        assert!(BackendError::from_gpu("cuda", "activation", &alloc).launch.is_none());
        assert_eq!(ModelError::Request("x".into()).kernel_launch(), None);
        assert_eq!(ModelError::from(BackendError::new("cpu", "bad")).kernel_launch(), None);
    }
}
