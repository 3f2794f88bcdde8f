//! Leader election over a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! only one runs the controllers. `decision` is the pure rule (which write to make, given the
//! Lease as read); `elector` is the loop that reads and writes the Lease and starts and stops
//! the work.

pub mod decision;
pub mod elector;

#[cfg(test)]
mod tests;

pub use decision::{Decision, Observed, decide, lease_seconds, observe, release};
pub use elector::{LeaderError, Outcome, run_as_leader};
