//! The messages between the supervisor and its engine child, over the child's stdin and stdout:
//! each frame is a 4-byte little-endian length, then that many bytes of JSON. Pure: it reads and
//! writes any `Read`/`Write`, so the framing is tested without a process.
//!
//! The supervisor speaks first with [`ToChild::Load`]; the child answers [`FromChild::Ready`] (or
//! `LoadFailed`), then one answer per [`ToChild::Step`]. Sampling happens in the child (the logits
//! never cross the pipe), so a sequence's sampling params travel with its first chunk and its
//! sampler lives in the child until the supervisor lists the sequence as ended.

use std::io::{Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::engine::BackendKind;
use crate::model::KernelLaunchFailure;
use crate::sampler::SamplingParams;
use crate::sched::SeqId;

/// Frames above this are refused as corrupt (a step of 24k tokens is ~200 KB of JSON).
pub const MAX_FRAME_BYTES: usize = 256 << 20;

/// How the child loads the engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildConfig {
    pub model: PathBuf,
    /// `cpu` or `cuda`.
    pub backend: String,
    pub slots: usize,
    /// 0: the model's context.
    pub context: usize,
    pub prefill_chunk: usize,
    /// The sliding-window layers keep whole sequences, not a ring per sequence
    /// (`EngineOptions::full_window_kv`); absent from an older supervisor's config: rings.
    #[serde(default)]
    pub full_window_kv: bool,
    /// The progress board the supervisor created and watches.
    pub board: PathBuf,
    /// Test-only: `hang:layer=N[,min-rows=R]` or `fail:layer=N[,min-rows=R]`.
    pub fault: Option<String>,
}

pub fn backend_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cpu => "cpu",
        BackendKind::Cuda => "cuda",
    }
}

pub fn parse_backend(name: &str) -> Result<BackendKind, String> {
    match name {
        "cpu" => Ok(BackendKind::Cpu),
        "cuda" => Ok(BackendKind::Cuda),
        other => Err(format!("backend {other:?}: expected cpu or cuda")),
    }
}

/// Sampling params as they cross the pipe.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireSampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl From<SamplingParams> for WireSampling {
    fn from(p: SamplingParams) -> Self {
        WireSampling { temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, seed: p.seed }
    }
}

impl From<WireSampling> for SamplingParams {
    fn from(p: WireSampling) -> Self {
        SamplingParams { temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, seed: p.seed }
    }
}

/// One sequence's part of a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireChunk {
    pub seq: SeqId,
    pub tokens: Vec<u32>,
    pub start_pos: usize,
    /// The sequence's KV block table.
    pub blocks: Vec<u32>,
    /// The sequence's ring index (the scheduler's, below `slots`): where the engine keeps its
    /// sliding-window layers' KV under the window-only layout.
    #[serde(default)]
    pub ring: u32,
    /// Sample a token from this chunk's last row.
    pub logits: bool,
    /// Present the first time the child sees the sequence.
    pub sampling: Option<WireSampling>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ToChild {
    Load(ChildConfig),
    Step {
        step: u64,
        chunks: Vec<WireChunk>,
        /// Sequences that ended since the last step: their samplers go.
        ended: Vec<SeqId>,
    },
    /// Finish: the child exits.
    Shutdown,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FromChild {
    /// The engine is loaded; the served geometry after clamping to the model.
    Ready {
        context: usize,
        slots: usize,
        prefill_chunk: usize,
        /// The paged KV cache: blocks, and positions per block.
        blocks: usize,
        block_size: usize,
        /// Blocks of each sequence's ring in the sliding-window layers (the window-only
        /// layout); 0: every layer keeps whole sequences, so prefix blocks can be shared.
        #[serde(default)]
        ring_blocks: usize,
        vocab: usize,
        backend: String,
        load_seconds: f64,
    },
    LoadFailed(String),
    /// One sampled token per chunk with `logits`, in chunk order.
    Sampled {
        step: u64,
        tokens: Vec<u32>,
    },
    /// The step failed; the engine is still usable unless `launch` is sticky.
    StepFailed {
        step: u64,
        message: String,
        /// The kernel launch that failed, when that is why (the supervisor counts them).
        #[serde(default)]
        launch: Option<KernelLaunchFailure>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the pipe closed")]
    Closed,
    #[error("pipe: {0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of {0} bytes is larger than the limit of {MAX_FRAME_BYTES}")]
    TooLarge(usize),
    #[error("a frame is not a valid message: {0}")]
    Decode(String),
}

pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), FrameError> {
    let body = serde_json::to_vec(msg).map_err(|e| FrameError::Decode(e.to_string()))?;
    if body.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(body.len()));
    }
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()?;
    Ok(())
}

/// The next frame; `Closed` on a clean end of stream between frames.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| FrameError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Serialize + for<'de> Deserialize<'de> + PartialEq + std::fmt::Debug>(msgs: &[T]) {
        let mut buf = Vec::new();
        for m in msgs {
            write_frame(&mut buf, m).unwrap();
        }
        let mut r = buf.as_slice();
        for m in msgs {
            assert_eq!(&read_frame::<T>(&mut r).unwrap(), m);
        }
        assert!(matches!(read_frame::<T>(&mut r), Err(FrameError::Closed)));
    }

    #[test]
    fn every_message_round_trips() {
        let cfg = ChildConfig {
            model: "/m/x.gguf".into(),
            backend: "cpu".into(),
            slots: 4,
            context: 512,
            prefill_chunk: 64,
            full_window_kv: true,
            board: "/tmp/board".into(),
            fault: Some("hang:layer=1,min-rows=48".into()),
        };
        let chunk = WireChunk {
            seq: u64::MAX - 1,
            tokens: vec![1, 2, u32::MAX],
            start_pos: 3 << 32,
            blocks: vec![7, 9],
            ring: 3,
            logits: true,
            sampling: Some(WireSampling { temperature: 0.7, top_k: 40, top_p: 0.9, seed: u64::MAX }),
        };
        round_trip(&[
            ToChild::Load(cfg),
            ToChild::Step { step: 1, chunks: vec![chunk.clone(), WireChunk { sampling: None, logits: false, ..chunk }], ended: vec![3] },
            ToChild::Shutdown,
        ]);
        round_trip(&[
            FromChild::Ready {
                context: 512,
                slots: 4,
                prefill_chunk: 64,
                blocks: 128,
                block_size: 16,
                ring_blocks: 9,
                vocab: 300,
                backend: "cpu".into(),
                load_seconds: 0.25,
            },
            FromChild::LoadFailed("no file".into()),
            FromChild::Sampled { step: 2, tokens: vec![5, 6] },
            FromChild::StepFailed { step: 3, message: "injected fault at layer 1".into(), launch: None },
            FromChild::StepFailed {
                step: 4,
                message: "cuda backend: moe expert GEMV: kernel moe_gemv_q4_0 ...".into(),
                launch: Some(KernelLaunchFailure {
                    kernel: "moe_gemv_q4_0".into(),
                    phase: "launch".into(),
                    error: "CUDA_ERROR_INVALID_VALUE".into(),
                    sticky: false,
                }),
            },
        ]);
        let p = SamplingParams { temperature: 0.5, top_k: 3, top_p: 0.8, seed: 11 };
        let back: SamplingParams = WireSampling::from(p).into();
        assert_eq!((back.temperature, back.top_k, back.top_p, back.seed), (0.5, 3, 0.8, 11));
        for k in [BackendKind::Cpu, BackendKind::Cuda] {
            assert_eq!(parse_backend(backend_name(k)).unwrap(), k);
        }
        assert!(parse_backend("tpu").unwrap_err().contains("tpu"));
    }

    /// A child built before the field existed is still understood.
    #[test]
    fn a_step_failure_without_a_launch_field_reads_as_none() {
        let old = br#"{"StepFailed":{"step":7,"message":"boom"}}"#;
        let mut buf = (old.len() as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(old);
        let m: FromChild = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(m, FromChild::StepFailed { step: 7, message: "boom".into(), launch: None });
    }

    #[test]
    fn broken_frames_are_errors_not_panics() {
        // A truncated body.
        let mut buf = Vec::new();
        write_frame(&mut buf, &ToChild::Shutdown).unwrap();
        buf.truncate(buf.len() - 1);
        assert!(matches!(read_frame::<ToChild>(&mut buf.as_slice()), Err(FrameError::Io(_))));
        // A length past the limit.
        let huge = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes();
        assert!(matches!(read_frame::<ToChild>(&mut huge.as_slice()), Err(FrameError::TooLarge(_))));
        // Not a message.
        let mut buf = 5u32.to_le_bytes().to_vec();
        buf.extend(b"hello");
        let e = read_frame::<ToChild>(&mut buf.as_slice()).unwrap_err();
        assert!(e.to_string().contains("not a valid message"), "{e}");
        // A length cut short reads as a close: the writer died mid-frame, the same outcome.
        assert!(matches!(read_frame::<ToChild>(&mut [1u8, 0].as_slice()), Err(FrameError::Closed)));
    }
}
