//! `brink-agent`'s library: everything the one binary for every brink process on a node does,
//! behind the thin commands of [`cmd`] (and `up`, `run`, `sweep`, which carry their own flags).
//!
//! - [`up`]: qualify, benchmark and serve one machine; [`cluster`]: `run`, the DaemonSet's
//!   process; [`sweep`]: one node's regression sweep;
//! - [`qualify`]: fingerprint cache, both suites' verdict, backend truth; [`envelope`]: a
//!   self-test report's serving envelope; [`device`]: GPU discovery;
//! - [`model_cache`], [`node_metrics`] (`/metrics` gauges), [`http_bench`] (`bench --url`).

pub mod blackbox;
pub mod cluster;
pub mod cmd;
pub mod device;
pub mod envelope;
pub mod error;
pub mod http_bench;
pub mod model_cache;
pub mod node_metrics;
pub mod qualify;
pub mod sweep;
pub mod up;
