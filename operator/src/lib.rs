//! brink's operator as a library: the pure decisions (`decide`), the kube-rs controllers that
//! act on them (`controllers`), leader election (`leader`) and the CRD rendering (`crds`). The
//! binary (`main.rs`) is the CLI.

pub mod controllers;
pub mod crds;
pub mod decide;
pub mod engines;
pub mod leader;
pub mod telemetry;
