//! brink-gateway: one OpenAI/Anthropic-compatible endpoint in front of serving replicas (the
//! no-cluster mode: replicas given as `--upstream` URLs). See docs/gateway.md.

pub mod cli;
pub mod config;
pub mod discovery;
pub mod errors;
pub mod keys;
pub mod metrics;
pub mod pick;
pub mod prompt;
pub mod proxy;
pub mod server;

pub use config::Config;
pub use server::serve_on;
