//! brink-engine: the MoE inference engine every node hosts.
//!
//! Empty until the engine issue lands the GGUF reader, the qwen3moe graph and the CPU and CUDA
//! backends; it builds on the kernels of `brink-kernels` (the routed MoE path is there today).
