//! The injected GPU hang (`hang:layer=N` on the CUDA backend): the negative control's tail-skip
//! kernel deadlocks the device inside layer N; the host blocks waiting for the step; the progress
//! board, read from another process, shows the host waiting on the device and names the last
//! layer the device finished (N − 1). Killing the process frees the GPU: a new process runs.
//!
//! The hang runs in a child process (this test binary again, told by an environment variable),
//! because a deadlocked kernel ends only with its process. Needs a GPU: without one the test
//! prints why and passes, unless `BRINK_REQUIRE_GPU=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brink_engine::backend::Logits;
use brink_engine::backend::cuda::CudaBackend;
use brink_engine::monitor::{BoardFile, Monitor, Op};
use brink_engine::synth::{self, Preset, SynthSpec};
use brink_engine::{BackendKind, EngineOptions};

const CHILD: &str = "BRINK_FAULT_CHILD";
const LAYER: u32 = 1;

/// The child's part: one step of 64 rows with the fault armed (or not), then exit 0.
fn child(board: &Path, model: &Path, fault: &str) {
    let mut e = brink_engine::open(
        model,
        BackendKind::Cuda,
        EngineOptions { context: 256, slots: 1, prefill_chunk: 256, ..EngineOptions::default() },
    )
    .unwrap();
    let fault = (!fault.is_empty()).then(|| fault.parse().unwrap());
    e.set_monitor(Arc::new(Monitor::shared(BoardFile::open(board).unwrap()).with_fault(fault)));
    let tokens: Vec<u32> = (1..65).collect();
    e.prefill(0, 0, &tokens, Logits::Last).unwrap();
}

fn spawn(board: &Path, model: &Path, fault: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_gpu_hang_is_caught_at_its_layer_and_ends_with_its_process", "--nocapture"])
        .env(CHILD, format!("{}|{}|{fault}", board.display(), model.display()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_gpu_hang_is_caught_at_its_layer_and_ends_with_its_process() {
    if let Ok(args) = std::env::var(CHILD) {
        let mut it = args.splitn(3, '|');
        let (board, model, fault) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap_or(""));
        return child(Path::new(board), Path::new(model), fault);
    }
    if let Err(e) = CudaBackend::new() {
        assert!(std::env::var("BRINK_REQUIRE_GPU").as_deref() != Ok("1"), "BRINK_REQUIRE_GPU=1 but {e}");
        return eprintln!("skipping the GPU hang test: {e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let model: PathBuf = dir.path().join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &model, |_, _| {}).unwrap();
    let path = dir.path().join("board");
    let board = BoardFile::create(&path).unwrap();

    let mut hung = spawn(&path, &model, &format!("hang:layer={LAYER}"));
    let t0 = Instant::now();
    // Stuck: waiting on the device, with no beat for 3 s.
    let mut last = board.board().snapshot();
    let mut since = Instant::now();
    let stuck = loop {
        std::thread::sleep(Duration::from_millis(100));
        assert!(hung.try_wait().unwrap().is_none(), "the child ended: the hang did not hold");
        let s = board.board().snapshot();
        if s.beats != last.beats {
            (last, since) = (s, Instant::now());
        } else if s.op == Op::DeviceWait && since.elapsed() > Duration::from_secs(3) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "no stall seen: {s:?}");
    };
    eprintln!("stalled after {:.1} s: {stuck:?}", t0.elapsed().as_secs_f64());
    assert_eq!(stuck.device_layer, Some(LAYER - 1), "the device finished layer {} and is stuck in {LAYER}: {stuck:?}", LAYER - 1);
    assert_eq!(stuck.rows, 64);

    let kill = Instant::now();
    hung.kill().unwrap();
    hung.wait().unwrap();
    eprintln!("killed in {:.2} s", kill.elapsed().as_secs_f64());

    // The device is free again: a fresh process runs the same step to the end.
    let again = Instant::now();
    let status = spawn(&path, &model, "").wait().unwrap();
    assert!(status.success(), "the step after the hang failed: {status}");
    eprintln!("a new process ran the step in {:.1} s (open, compile cache, load, step)", again.elapsed().as_secs_f64());
    assert_eq!(board.board().snapshot().op, Op::Step);
}
