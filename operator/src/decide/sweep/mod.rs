//! Regression sweep decisions, pure like the rest of `decide`: when a sweep fires (CronJob
//! semantics), how a run moves through its nodes, the run's summary, and which old runs to
//! prune. How a node's figures are judged (baselines, tolerances, fleet outliers) lives in
//! `brink_api::sweep`, because the agent's local sweeps judge the same way.

pub mod history;
pub mod progress;
pub mod schedule;
pub mod series;
pub mod summary;

#[cfg(test)]
mod tests;
