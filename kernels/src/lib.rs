//! brink-kernels: CUDA kernels whose launch geometry is safe by construction.
//!
//! - [`launch`]: launch plans (pure) and their limit checks; [`limits`]: device limits, read
//!   from the device or recorded (H200, GB10);
//! - [`ops`]: one module per kernel family: plan, CPU twin, checked GPU launch, critical
//!   counts, self-test case; CUDA sources in `cuda/` ([`sources`]);
//! - [`cuda`]: the device, NVRTC-to-CUBIN compilation with a disk cache, the checked launch;
//! - [`thresholds`] and [`selftest`]: which token counts to test, and the runner that tests
//!   them in a child process with deadlines.

pub mod check;
pub mod cuda;
pub mod launch;
pub mod limits;
pub mod ops;
pub mod quant;
pub mod routing;
pub mod selftest;
pub mod sources;
pub mod testdata;
pub mod thresholds;

pub use limits::DeviceLimits;
