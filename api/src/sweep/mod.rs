//! How sweep results are judged, shared by the operator (which writes the verdicts into
//! `SweepResult`s and `SweepRun`s) and the agent (local sweeps and `sweep-report`): each node
//! against its own baseline with the sweep's tolerances, and against the median of its
//! identical peers in the same run.

pub mod baseline;
pub mod judge;
pub mod outliers;

#[cfg(test)]
mod tests;
