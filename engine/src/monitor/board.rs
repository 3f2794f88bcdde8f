//! The progress board: a few atomic words the engine process updates as it works (step, layer,
//! op, batch shape, the last layer the device finished) and the supervisor reads to tell a busy
//! engine from a hung one. It lives in a memory-mapped file shared by the two processes, so the
//! supervisor can still read the last stage after the engine stopped answering.
//!
//! Writers only store and bump `beats`; a reader compares `beats` between looks: unchanged while
//! a step is in flight means no progress. Torn reads across fields are harmless here (the report
//! is evidence, not control), so there is no seqlock.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use memmap2::MmapMut;
use serde::{Deserialize, Serialize};

/// What the engine is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Idle,
    Loading,
    /// Between ops of a step on the host (batch set-up, sampling).
    Step,
    Embed,
    AttnNorm,
    QkvProj,
    Rope,
    Attention,
    AttnOut,
    FfnNorm,
    Moe,
    OutputNorm,
    Logits,
    /// The host has queued the step and waits for the device to finish it.
    DeviceWait,
}

impl Op {
    const ALL: [Op; 14] = [
        Op::Idle,
        Op::Loading,
        Op::Step,
        Op::Embed,
        Op::AttnNorm,
        Op::QkvProj,
        Op::Rope,
        Op::Attention,
        Op::AttnOut,
        Op::FfnNorm,
        Op::Moe,
        Op::OutputNorm,
        Op::Logits,
        Op::DeviceWait,
    ];

    fn code(self) -> u64 {
        Op::ALL.iter().position(|&o| o == self).unwrap_or(0) as u64
    }

    fn from_code(c: u64) -> Op {
        Op::ALL.get(c as usize).copied().unwrap_or(Op::Idle)
    }

    /// The kernels this op launches on the CUDA backend, for the stall report.
    pub fn kernels(self) -> &'static str {
        match self {
            Op::Embed => "embed",
            Op::AttnNorm | Op::FfnNorm | Op::OutputNorm => "rmsnorm",
            Op::QkvProj | Op::AttnOut => "quantize_q8_1, dense gemm/gemv",
            Op::Rope => "rope",
            Op::Attention => "kv_store, attn_prefill / attn_decode + attn_decode_combine",
            Op::Moe => "router, moe_align, quantize_q8_1, moe_gemm + swiglu + moe_combine / moe_gemv_swiglu_q8_1 + moe_gemv_combine",
            Op::Logits => "output_head",
            Op::Idle | Op::Loading | Op::Step | Op::DeviceWait => "",
        }
    }
}

const NONE: u64 = u64::MAX;
const MAGIC: u64 = 0x6272_696e_6b50_4231; // "brinkPB1"

/// The shared words. `repr(C)` with only `AtomicU64`s: the same layout in both processes.
#[repr(C)]
pub struct ProgressBoard {
    magic: AtomicU64,
    pid: AtomicU64,
    /// Bumped on every update.
    beats: AtomicU64,
    /// Wall-clock milliseconds since the Unix epoch of the last update.
    updated_ms: AtomicU64,
    step: AtomicU64,
    op: AtomicU64,
    layer: AtomicU64,
    rows: AtomicU64,
    chunks: AtomicU64,
    /// The last layer whose work the device finished in the current step (CUDA), or NONE.
    device_layer: AtomicU64,
    device_ms: AtomicU64,
    /// 1 when the backend records device progress (CUDA under a supervisor): then the device,
    /// not the host, says where a hang is.
    device_tracked: AtomicU64,
}

/// A copy of the board at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub pid: u32,
    pub beats: u64,
    pub updated_ms: u64,
    pub step: u64,
    pub op: Op,
    pub layer: Option<u32>,
    pub rows: u64,
    pub chunks: u64,
    pub device_layer: Option<u32>,
    pub device_ms: Option<u64>,
    #[serde(default)]
    pub device_tracked: bool,
}

/// Where a stalled step is stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Stuck {
    /// The layer being computed, when in one.
    pub layer: Option<u32>,
    /// The op, when the host is the one stuck (CPU backend, or a host-side wait); on the
    /// device only the layer is known.
    pub op: Option<Op>,
    pub on_device: bool,
}

impl Snapshot {
    /// Where the step is stuck. Kernel launches are asynchronous: the host may have queued
    /// dozens of layers past a hung kernel (until the launch queue fills) before it blocks.
    /// When the device's progress is tracked, the hung work is in the layer after the last one
    /// the device finished; otherwise the host's stage is the answer.
    pub fn stuck(&self) -> Stuck {
        let host = Stuck { layer: self.layer, op: Some(self.op), on_device: false };
        if !self.device_tracked {
            return host;
        }
        let device = self.device_layer.map_or(0, |d| d + 1);
        match self.layer {
            // The host is still in that layer (or before it): its op is the better answer.
            Some(l) if l <= device => host,
            // Past it, or after the last layer (output norm, logits, waiting on the device).
            _ if matches!(self.op, Op::Embed | Op::Loading | Op::Idle | Op::Step) && self.layer.is_none() => host,
            _ => Stuck { layer: Some(device), op: None, on_device: true },
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn opt(v: u64) -> Option<u32> {
    (v != NONE).then_some(v as u32)
}

impl ProgressBoard {
    /// A board in this process's memory (tests, and engines not run under a supervisor).
    pub fn new() -> ProgressBoard {
        let b = ProgressBoard {
            magic: AtomicU64::new(MAGIC),
            pid: AtomicU64::new(std::process::id() as u64),
            beats: AtomicU64::new(0),
            updated_ms: AtomicU64::new(now_ms()),
            step: AtomicU64::new(0),
            op: AtomicU64::new(Op::Idle.code()),
            layer: AtomicU64::new(NONE),
            rows: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            device_layer: AtomicU64::new(NONE),
            device_ms: AtomicU64::new(NONE),
            device_tracked: AtomicU64::new(0),
        };
        b.touch();
        b
    }

    fn touch(&self) {
        self.updated_ms.store(now_ms(), Ordering::Relaxed);
        self.beats.fetch_add(1, Ordering::Release);
    }

    /// A step of `rows` rows in `chunks` chunks starts.
    pub fn begin_step(&self, step: u64, rows: u64, chunks: u64) {
        self.step.store(step, Ordering::Relaxed);
        self.rows.store(rows, Ordering::Relaxed);
        self.chunks.store(chunks, Ordering::Relaxed);
        self.layer.store(NONE, Ordering::Relaxed);
        self.device_layer.store(NONE, Ordering::Relaxed);
        self.device_ms.store(NONE, Ordering::Relaxed);
        self.op.store(Op::Step.code(), Ordering::Relaxed);
        self.touch();
    }

    /// The host enters `op` (of `layer`, for per-layer ops).
    pub fn enter(&self, layer: Option<u32>, op: Op) {
        self.layer.store(layer.map_or(NONE, u64::from), Ordering::Relaxed);
        self.op.store(op.code(), Ordering::Relaxed);
        self.touch();
    }

    /// The device finished the work of `layer` (called from a stream callback).
    pub fn device_done(&self, layer: u32) {
        self.device_layer.store(layer as u64, Ordering::Relaxed);
        self.device_ms.store(now_ms(), Ordering::Relaxed);
        self.touch();
    }

    /// The backend records device progress (`device_done`) from now on.
    pub fn track_device(&self) {
        self.device_tracked.store(1, Ordering::Relaxed);
    }

    /// Nothing to do (after a step, or while waiting for work).
    pub fn idle(&self) {
        self.layer.store(NONE, Ordering::Relaxed);
        self.op.store(Op::Idle.code(), Ordering::Relaxed);
        self.touch();
    }

    pub fn snapshot(&self) -> Snapshot {
        let ms = self.device_ms.load(Ordering::Relaxed);
        Snapshot {
            pid: self.pid.load(Ordering::Relaxed) as u32,
            beats: self.beats.load(Ordering::Acquire),
            updated_ms: self.updated_ms.load(Ordering::Relaxed),
            step: self.step.load(Ordering::Relaxed),
            op: Op::from_code(self.op.load(Ordering::Relaxed)),
            layer: opt(self.layer.load(Ordering::Relaxed)),
            rows: self.rows.load(Ordering::Relaxed),
            chunks: self.chunks.load(Ordering::Relaxed),
            device_layer: opt(self.device_layer.load(Ordering::Relaxed)),
            device_ms: (ms != NONE).then_some(ms),
            device_tracked: self.device_tracked.load(Ordering::Relaxed) != 0,
        }
    }
}

impl Default for ProgressBoard {
    fn default() -> Self {
        ProgressBoard::new()
    }
}

/// A board in a memory-mapped file: the supervisor creates it, the engine child opens it.
#[derive(Debug)]
pub struct BoardFile {
    map: MmapMut,
}

const BOARD_BYTES: usize = std::mem::size_of::<ProgressBoard>();

impl BoardFile {
    /// Creates (or truncates) `path` and initialises a board in it.
    pub fn create(path: &Path) -> std::io::Result<BoardFile> {
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path)?;
        f.set_len(BOARD_BYTES as u64)?;
        let mut map = unsafe { MmapMut::map_mut(&f)? };
        // SAFETY: the mapping is page-aligned and BOARD_BYTES long; ProgressBoard is repr(C) of
        // AtomicU64, which has u64's layout, so writing one initialises the bytes.
        unsafe { std::ptr::write(map.as_mut_ptr() as *mut ProgressBoard, ProgressBoard::new()) };
        Ok(BoardFile { map })
    }

    /// Maps an existing board created by [`BoardFile::create`].
    pub fn open(path: &Path) -> std::io::Result<BoardFile> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        let len = f.metadata()?.len();
        if len < BOARD_BYTES as u64 {
            return Err(std::io::Error::other(format!("{}: {len} bytes, a progress board needs {BOARD_BYTES}", path.display())));
        }
        let map = unsafe { MmapMut::map_mut(&f)? };
        let file = BoardFile { map };
        if file.board().magic.load(Ordering::Relaxed) != MAGIC {
            return Err(std::io::Error::other(format!("{}: not a brink progress board", path.display())));
        }
        // This process writes from now on.
        file.board().pid.store(std::process::id() as u64, Ordering::Relaxed);
        Ok(file)
    }

    pub fn board(&self) -> &ProgressBoard {
        // SAFETY: see `create`: the mapping holds an initialised ProgressBoard (checked by the
        // magic word in `open`), aligned, and lives as long as `self`. Atomics make shared
        // access from both processes sound.
        unsafe { &*(self.map.as_ptr() as *const ProgressBoard) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_round_trip_through_a_shared_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("board");
        let sup = BoardFile::create(&path).unwrap();
        let child = BoardFile::open(&path).unwrap();
        let b0 = sup.board().snapshot().beats;
        child.board().begin_step(7, 4096, 3);
        child.board().enter(Some(5), Op::Moe);
        child.board().device_done(4);
        let s = sup.board().snapshot();
        assert_eq!((s.step, s.rows, s.chunks, s.op, s.layer, s.device_layer), (7, 4096, 3, Op::Moe, Some(5), Some(4)));
        assert_eq!(s.beats, b0 + 3);
        assert_eq!(s.pid, std::process::id());
        child.board().idle();
        let s = sup.board().snapshot();
        assert_eq!((s.op, s.layer), (Op::Idle, None));
        assert_eq!(s.device_layer, Some(4), "the device's last layer stays for the report");
    }

    #[test]
    fn a_hang_is_placed_on_the_device_when_its_progress_is_tracked() {
        let b = ProgressBoard::new();
        b.begin_step(1, 13_502, 1);
        b.enter(Some(36), Op::Moe);
        // CPU: the host is the executor.
        assert_eq!(b.snapshot().stuck(), Stuck { layer: Some(36), op: Some(Op::Moe), on_device: false });
        b.track_device();
        b.device_done(4);
        // The host queued up to layer 36 and blocked; the device never finished layer 5.
        assert_eq!(b.snapshot().stuck(), Stuck { layer: Some(5), op: None, on_device: true });
        b.enter(None, Op::DeviceWait);
        assert_eq!(b.snapshot().stuck().layer, Some(5));
        // The host itself in the device's layer: its op is known.
        b.enter(Some(5), Op::Attention);
        assert_eq!(b.snapshot().stuck(), Stuck { layer: Some(5), op: Some(Op::Attention), on_device: false });
        // Nothing finished yet, host far ahead: layer 0.
        b.begin_step(2, 8, 1);
        b.enter(Some(9), Op::Moe);
        assert_eq!(b.snapshot().stuck(), Stuck { layer: Some(0), op: None, on_device: true });
    }

    #[test]
    fn a_file_that_is_not_a_board_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junk");
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        assert!(BoardFile::open(&path).unwrap_err().to_string().contains("not a brink progress board"));
        std::fs::write(&path, b"short").unwrap();
        assert!(BoardFile::open(&path).unwrap_err().to_string().contains("needs"));
    }

    #[test]
    fn every_op_has_a_code() {
        for op in Op::ALL {
            assert_eq!(Op::from_code(op.code()), op);
        }
    }
}
