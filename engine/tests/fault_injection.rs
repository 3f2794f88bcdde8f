//! The test-only faults (`brink_engine::monitor::fault`) on the CPU backend: a `fail` is an error
//! from the chosen layer, only for steps as large as the trigger; a `hang` blocks in that layer
//! and the progress board names it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brink_engine::backend::Logits;
use brink_engine::monitor::{Monitor, Op};
use brink_engine::synth::{self, Preset, SynthSpec};
use brink_engine::{BackendKind, EngineOptions};

fn tiny(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap();
    path
}

fn opts() -> EngineOptions {
    EngineOptions { context: 256, slots: 2, prefill_chunk: 256, ..EngineOptions::default() }
}

#[test]
fn an_injected_failure_fails_only_the_steps_it_targets() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = brink_engine::open(&tiny(dir.path()), BackendKind::Cpu, opts()).unwrap();
    let monitor = Arc::new(Monitor::local().with_fault(Some("fail:layer=1,min-rows=16".parse().unwrap())));
    e.set_monitor(monitor.clone());
    let small: Vec<u32> = (1..9).collect();
    let big: Vec<u32> = (1..33).collect();
    e.prefill(0, 0, &small, Logits::Last).expect("8 rows are below the trigger");
    let err = e.prefill(1, 0, &big, Logits::Last).unwrap_err().to_string();
    assert!(err.contains("injected fault at layer 1"), "{err}");
    let s = monitor.board().snapshot();
    assert_eq!((s.layer, s.op, s.rows), (Some(1), Op::AttnNorm, 32), "the board shows where it failed: {s:?}");
}

#[test]
fn an_injected_hang_blocks_in_its_layer_and_the_board_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = tiny(dir.path());
    let monitor = Arc::new(Monitor::local().with_fault(Some("hang:layer=1,min-rows=4".parse().unwrap())));
    let m = monitor.clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // The hung thread is never joined: only ending the process would end it, as in the engine.
    std::thread::spawn(move || {
        let mut e = brink_engine::open(&path, BackendKind::Cpu, opts()).unwrap();
        e.set_monitor(m);
        let tokens: Vec<u32> = (1..6).collect();
        let r = e.prefill(0, 0, &tokens, Logits::Last);
        let _ = done_tx.send(r.is_ok());
    });
    let t0 = Instant::now();
    let stuck = loop {
        let s = monitor.board().snapshot();
        if s.layer == Some(1) && s.op == Op::AttnNorm {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the step never reached layer 1: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(done_rx.recv_timeout(Duration::from_millis(500)).is_err(), "the step finished despite the hang");
    let later = monitor.board().snapshot();
    assert_eq!(later.beats, stuck.beats, "no progress while hung");
    assert_eq!(later.rows, 5);
}
