//! gpt-oss on the CPU backend without a reference engine: the synthetic tiny model (MXFP4
//! experts, sinks, biases, YaRN) generates finite logits; a chunked prefill gives the whole
//! prefill's logits bit for bit (chunk edges inside windows); and the sliding window is what it
//! says: with every layer windowed (`attention.sliding_window_pattern` = 0, window 16), a token
//! more than 2·15 positions back (two layers of reach) changes no logit of the last position,
//! while with no layer windowed (pattern 1) it does.

use std::path::{Path, PathBuf};

use brink_engine::backend::cpu::CpuBackend;
use brink_engine::gguf::{GgufFile, GgufWriter, Value};
use brink_engine::synth::GptOssPreset;
use brink_engine::synth::gpt_oss::{self, GptOssSpec};
use brink_engine::{Engine, EngineOptions, GenerateParams};

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
