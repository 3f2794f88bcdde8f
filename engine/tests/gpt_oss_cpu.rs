//! gpt-oss on the CPU backend without a reference engine: the synthetic tiny model (MXFP4
//! experts, sinks, biases, YaRN) generates finite logits; a chunked prefill gives the whole
//! prefill's logits bit for bit (chunk edges inside windows); and the sliding window is what it
//! says: with every layer windowed (`attention.sliding_window_pattern` = 0, window 16), a token
//! more than 2·15 positions back (two layers of reach) changes no logit of the last position,
//! while with no layer windowed (pattern 1) it does. The window-only KV layout (a ring of
//! blocks per sequence in the windowed layers) gives the full layout's logits bit for bit.

use std::path::{Path, PathBuf};

use brink_engine::backend::cpu::CpuBackend;
use brink_engine::backend::{KvSpec, Logits, ring_blocks};
use brink_engine::engine::WindowRing;
use brink_engine::gguf::{GgufFile, GgufWriter, Value};
use brink_engine::synth::GptOssPreset;
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::{Engine, EngineOptions, GenerateParams, StepItem};

fn tiny(dir: &Path) -> PathBuf {
    let path = dir.join("gpt-oss-tiny.gguf");
    gpt_oss::generate(&GptOssSpec::from_preset(GptOssPreset::Tiny), &path, |_, _| {}).unwrap();
    path
}

/// A copy of `src` with the window and the SWA pattern set.
fn with_window(src: &Path, dst: &Path, window: u32, pattern: u32) {
    let file = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        let v = match key {
            "gpt-oss.attention.sliding_window" => Value::U32(window),
            _ => value.clone(),
        };
        w.set(key, v).unwrap();
    }
    w.set("gpt-oss.attention.sliding_window_pattern", Value::U32(pattern)).unwrap();
    let mut data = Vec::new();
    for t in file.tensors() {
        w.add_tensor(t.name(), t.dims(), t.ggml_type()).unwrap();
        data.push(file.read_tensor(t).unwrap());
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    w.write_file(dst, &refs).unwrap();
}

/// The logits of `tokens`' last position and of `extra` greedy steps after it.
fn logits(model: &Path, tokens: &[u32], prefill_chunk: usize, extra: usize) -> Vec<Vec<f32>> {
    let opts = EngineOptions { context: 512, slots: 1, prefill_chunk, ..EngineOptions::default() };
    let mut engine = Engine::load(model, CpuBackend::new(), opts).unwrap();
    let p = GenerateParams { max_tokens: 1 + extra, sampling: Default::default(), stop_tokens: Vec::new(), record_logits: true };
    engine.generate(0, tokens, &p, |_| true).unwrap().logits
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 300 + (i * 37) % 1500).collect()
}

#[test]
fn chunked_prefill_gives_the_whole_prefills_logits_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let tokens = prompt(300);
    let whole = logits(&model, &tokens, 512, 4);
    assert!(whole.iter().flatten().all(|x| x.is_finite()), "non-finite logits");
    // Chunk edges at 100/200 (inside layer 0's 128-token windows of the queries after them),
    // and at 127/128-offsets around the window's own length.
    for chunk in [100, 127, 129] {
        assert_eq!(logits(&model, &tokens, chunk, 4), whole, "chunks of {chunk}");
    }
}

#[test]
fn a_windowed_layer_sees_only_its_window() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny(dir.path());
    let (windowed, full) = (dir.path().join("windowed.gguf"), dir.path().join("full.gguf"));
    with_window(&src, &windowed, 16, 0);
    with_window(&src, &full, 16, 1);
    let a = prompt(64);
    let mut b = a.clone();
    b[10] = 999; // 53 positions before the last: past two layers' reach of 2 x 15
    assert_eq!(logits(&windowed, &a, 512, 0), logits(&windowed, &b, 512, 0), "every layer windowed: token 10 is out of reach");
    assert_ne!(logits(&full, &a, 512, 0), logits(&full, &b, 512, 0), "no layer windowed: token 10 is seen");
    let mut c = a.clone();
    c[40] = 999; // 23 positions back: within two layers' reach
    assert_ne!(logits(&windowed, &a, 512, 0), logits(&windowed, &c, 512, 0), "token 40 is within reach");
}

/// Every position's logits of `tokens` prefilled in chunks of `chunk` into `slot` (logits of
/// all rows), then of `decode` greedy steps; with the KV cache's spec and ring.
fn layout_logits(
    model: &Path,
    tokens: &[u32],
    chunk: usize,
    full_window_kv: bool,
    slot: u32,
    decode: usize,
) -> (Vec<f32>, KvSpec, Option<WindowRing>) {
    let opts = EngineOptions { context: 512, slots: 2, prefill_chunk: chunk, full_window_kv, ..EngineOptions::default() };
    let mut engine = Engine::load(model, CpuBackend::new(), opts).unwrap();
    let vocab = engine.config().vocab;
    let mut out = engine.prefill(slot, 0, tokens, Logits::All).unwrap();
    let blocks = engine.slot_blocks(slot);
    for pos in tokens.len()..tokens.len() + decode {
        let last = &out[out.len() - vocab..];
        let next = (0..vocab).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        out.extend(engine.step(&[StepItem { blocks: &blocks, start_pos: pos as u32, tokens: &[next], logits: Logits::Last }]).unwrap());
    }
    (out, engine.kv_spec().clone(), engine.window_ring())
}

/// The window-only layout (the windowed layer keeps a ring of blocks per sequence) gives the
/// full layout's logits bit for bit: a prompt of several windows, prefilled in chunks whose
/// edges fall inside windows, then decode steps past the ring's wrap; its KV cache is smaller by
/// the windowed layer's blocks beyond the rings.
#[test]
fn window_only_kv_gives_the_full_layouts_logits_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let tokens = prompt(300);
    let (full, full_spec, none) = layout_logits(&model, &tokens, 100, true, 1, 40);
    assert!(none.is_none() && !full_spec.has_window_layers(), "full_window_kv keeps whole sequences");
    assert!(full.iter().all(|x| x.is_finite()));
    let window = 128;
    let bs = full_spec.block_size;
    let n = 512 / bs;
    for chunk in [100, 37, 129] {
        let (ring_logits, spec, ring) = layout_logits(&model, &tokens, chunk, false, 1, 40);
        let ring = ring.expect("a ring for the windowed layer");
        assert_eq!(ring.blocks, ring_blocks(window, chunk, bs, n), "chunks of {chunk}");
        assert!(ring.blocks < n && ring.max_chunk >= chunk);
        assert!(ring_logits == full, "chunks of {chunk}: the window-only layout's logits differ");
        // Layer 0 is windowed, layer 1 full: 2 slots of n − R blocks fewer in layer 0.
        assert_eq!(spec.window_layers, vec![true, false]);
        let row_bytes = (spec.kv_heads * spec.head_dim * 4) as u64; // K and V, f16
        assert_eq!(full_spec.bytes() - spec.bytes(), 2 * (n - ring.blocks) as u64 * bs as u64 * row_bytes);
    }
}

/// Rings given by the caller (`step_in_rings`): two sequences interleaved on each other's slot
/// tables and rings give the full layout's logits; a table that is not a slot's needs a ring, a
/// chunk longer than the ring serves and a ring shared by two items are refused.
#[test]
fn rings_given_by_the_caller_and_their_limits() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let (a, b) = (prompt(260), prompt(200).into_iter().map(|t| t + 1).collect::<Vec<u32>>());
    let run = |full_window_kv: bool| {
        let opts = EngineOptions { context: 512, slots: 2, prefill_chunk: 64, full_window_kv, ..EngineOptions::default() };
        let mut e = Engine::load(&model, CpuBackend::new(), opts).unwrap();
        // Sequence a on slot 1's table in ring 0, b on slot 0's table in ring 1.
        let (ta, tb) = (e.slot_blocks(1), e.slot_blocks(0));
        let mut out = Vec::new();
        for (i, start) in (0..260).step_by(64).enumerate() {
            let mut items =
                vec![StepItem { blocks: &ta, start_pos: start as u32, tokens: &a[start..(start + 64).min(260)], logits: Logits::All }];
            let mut rings = vec![0];
            if start < 200 {
                items.push(StepItem {
                    blocks: &tb,
                    start_pos: start as u32,
                    tokens: &b[start..(start + 64).min(200)],
                    logits: Logits::All,
                });
                rings.push(1);
            }
            out.push(e.step_in_rings(&items, &rings).unwrap_or_else(|err| panic!("step {i}: {err}")));
        }
        (out, e)
    };
    let (full, _) = run(true);
    let (ring, mut e) = run(false);
    assert!(ring == full, "rings given by the caller: the logits differ");
    let r = e.window_ring().unwrap();
    let t = e.slot_blocks(0);
    let mut odd = t.clone();
    odd.swap(0, 1);
    let err = e.step(&[StepItem { blocks: &odd, start_pos: 0, tokens: &a[..4], logits: Logits::Last }]).unwrap_err().to_string();
    assert!(err.contains("needs its ring index"), "{err}");
    let long = prompt(r.max_chunk + 1);
    let err = e.step(&[StepItem { blocks: &t, start_pos: 0, tokens: &long, logits: Logits::Last }]).unwrap_err().to_string();
    assert!(err.contains(&format!("a chunk of {} tokens", r.max_chunk + 1)) && err.contains(&format!("at most {}", r.max_chunk)), "{err}");
    let two = [
        StepItem { blocks: &t, start_pos: 0, tokens: &a[..4], logits: Logits::Last },
        StepItem { blocks: &odd, start_pos: 0, tokens: &b[..4], logits: Logits::Last },
    ];
    let err = e.step_in_rings(&two, &[1, 1]).unwrap_err().to_string();
    assert!(err.contains("share the ring 1"), "{err}");
    assert!(e.step_in_rings(&two, &[1, 2]).unwrap_err().to_string().contains("ring 2 out of range"));
}
