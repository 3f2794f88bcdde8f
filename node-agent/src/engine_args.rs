//! Flags shared by the commands that load a model (`generate`, `bench`, `serve`).

use std::path::PathBuf;

use brink_engine::BackendKind;
use clap::{Args, ValueEnum};

#[derive(Args)]
pub struct EngineArgs {
    /// GGUF model file (the first part of a split model).
    #[arg(long)]
    pub model: PathBuf,
    /// Backend: auto takes cuda when a GPU is present, else cpu (and says which).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// KV positions per sequence (0: what the command needs).
    #[arg(long, default_value_t = 0)]
    pub context: usize,
    /// Most prompt tokens per forward pass (chunked prefill).
    #[arg(long, default_value_t = 2048)]
    pub prefill_chunk: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Auto,
    Cpu,
    Cuda,
}

impl BackendArg {
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendArg::Cpu => BackendKind::Cpu,
            BackendArg::Cuda => BackendKind::Cuda,
            BackendArg::Auto if brink_kernels::cuda::Gpu::open(0).is_ok() => BackendKind::Cuda,
            BackendArg::Auto => {
                eprintln!("no CUDA GPU found: using the cpu backend");
                BackendKind::Cpu
            }
        }
    }
}
