//! brink-gateway: one OpenAI/Anthropic-compatible endpoint in front of serving replicas, given
//! as `--upstream` URLs or found in a cluster (`--kubernetes`). See docs/gateway.md.

pub mod affinity;
pub mod cli;
pub mod config;
pub mod discovery;
pub mod errors;
pub mod keys;
pub mod kubernetes;
pub mod metrics;
pub mod pick;
pub mod prompt;
pub mod proxy;
pub mod server;
pub mod spans;
pub mod telemetry;
pub mod trace;
pub mod usage;

pub use config::Config;
pub use server::{Gateway, serve, serve_kubernetes, serve_on, serve_on_kubernetes};
