//! The OpenTelemetry GenAI semantic conventions' advisory histogram bucket boundaries (seconds,
//! or tokens): one copy for the engine's `gen_ai_server_*` series and the gateway's
//! `gen_ai_client_*` ones, so the two read side by side.

/// Time to first token.
pub const TTFT_BOUNDS: [f64; 16] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];
/// Time per output token.
pub const TPOT_BOUNDS: [f64; 13] = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5];
/// Request / operation duration.
pub const DURATION_BOUNDS: [f64; 14] = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
/// Token usage.
pub const TOKEN_BOUNDS: [f64; 14] =
    [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0];
