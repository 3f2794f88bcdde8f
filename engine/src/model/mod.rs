//! What every architecture shares: hyperparameters, the weights as read from the file, errors.

pub mod config;
pub mod error;
pub mod layer;
pub mod tensors;

pub use config::{AttentionConfig, Hyper, ModelConfig, MoeConfig, TensorTypes};
pub use error::{BackendError, KernelLaunchFailure, ModelError};
pub use layer::{Activation, AttentionLayer, FfnLayer, Gating, LayerSpec, Rope};
pub use tensors::{HostTensor, MatrixDims, TensorReader};
