//! What the kernel families and the self-test share, below both: how a GPU output is compared
//! with the CPU twin ([`compare`]), what a run found ([`outcome`]), and the [`KernelFamily`]
//! trait each family implements. It imports neither `ops` nor `selftest`, so `ops` can use it
//! while `selftest` uses `ops` (the test `module_layers` keeps it so).

pub mod compare;
pub mod family;
pub mod outcome;
pub mod timing;

pub use compare::{RelErr, always_sampled, sample_rows, sample_rows_around};
pub use family::KernelFamily;
pub use outcome::{Check, HostCheck, Outcome, Staged};
