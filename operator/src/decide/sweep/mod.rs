//! Regression sweep decisions, pure like the rest of `decide`: when a sweep fires (CronJob
//! semantics), how a run moves through its nodes, each node's baseline and verdict, fleet
//! outliers on identical hardware, the run's summary, and which old runs to prune.

pub mod baseline;
pub mod history;
pub mod judge;
pub mod outliers;
pub mod progress;
pub mod schedule;
pub mod summary;

#[cfg(test)]
mod tests;
