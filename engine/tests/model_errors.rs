//! Bad model files fail at load with errors that name what is wrong: an unsupported
//! architecture, a missing or inconsistent hyperparameter, a tensor of the wrong shape, a
//! tensor type no backend computes with. Each file is a valid tiny qwen3moe model rewritten
//! with one change.

use std::path::{Path, PathBuf};

use brink_engine::backend::cpu::CpuBackend;
use brink_engine::gguf::{GgmlType, GgufFile, GgufWriter, Value};
use brink_engine::synth::{self, Preset, SynthSpec};
use brink_engine::{Engine, EngineOptions};

fn tiny(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    synth::generate(&SynthSpec::from_preset(Preset::Tiny), &path, |_, _| {}).unwrap();
    path
}

/// Copies `src` to `dst` with metadata rewritten by `meta` (return None to drop a key) and,
/// for the tensor named `retype.0`, a new type (its bytes zeroed to the new size).
fn rewrite(src: &Path, dst: &Path, meta: impl Fn(&str, &Value) -> Option<Value>, retype: Option<(&str, GgmlType)>) {
    let file = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        if let Some(v) = meta(key, value) {
            w.set(key, v).unwrap();
        }
    }
    let mut data = Vec::new();
    for t in file.tensors() {
        match retype {
            Some((name, ty)) if name == t.name() => {
                w.add_tensor(t.name(), t.dims(), ty).unwrap();
                data.push(vec![0u8; brink_engine::gguf::tensor_bytes(ty, t.dims()).unwrap() as usize]);
            }
            _ => {
                w.add_tensor(t.name(), t.dims(), t.ggml_type()).unwrap();
                data.push(file.read_tensor(t).unwrap());
            }
        }
    }
    let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    w.write_file(dst, &refs).unwrap();
}

fn load_error(path: &Path) -> String {
    match Engine::load(path, CpuBackend::new(), EngineOptions::default()) {
        Ok(_) => panic!("{} loaded, expected an error", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn an_unsupported_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("arch.gguf");
    rewrite(&tiny(dir.path()), &bad, |k, v| Some(if k == "general.architecture" { "mamba9".into() } else { v.clone() }), None);
    let e = load_error(&bad);
    assert!(e.contains("mamba9") && e.contains("qwen3moe") && e.contains("arch.gguf"), "{e}");
}

#[test]
fn a_missing_hyperparameter_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("missing.gguf");
    rewrite(&tiny(dir.path()), &bad, |k, v| (k != "qwen3moe.expert_used_count").then(|| v.clone()), None);
    let e = load_error(&bad);
    assert!(e.contains("qwen3moe.expert_used_count") && e.contains("missing"), "{e}");
}

#[test]
fn inconsistent_hyperparameters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny(dir.path());
    let cases: [(&str, Value, &str); 3] = [
        ("qwen3moe.expert_used_count", Value::U32(99), "expert_count"),
        ("qwen3moe.attention.head_count_kv", Value::U32(3), "divide"),
        ("qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(-1.0), "positive"),
    ];
    for (key, value, why) in cases {
        let bad = dir.path().join("inconsistent.gguf");
        rewrite(&src, &bad, |k, v| Some(if k == key { value.clone() } else { v.clone() }), None);
        let e = load_error(&bad);
        assert!(e.contains(key) && e.contains(why), "{key}: {e}");
    }
}

#[test]
fn a_tensor_of_the_wrong_shape_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("shape.gguf");
    // Two fewer experts in the metadata than the expert tensors hold.
    rewrite(&tiny(dir.path()), &bad, |k, v| Some(if k == "qwen3moe.expert_count" { Value::U32(14) } else { v.clone() }), None);
    let e = load_error(&bad);
    assert!(e.contains("ffn_gate_inp") || e.contains("exps"), "{e}");
    assert!(e.contains("shape"), "{e}");
}

#[test]
fn a_tensor_type_the_backend_cannot_compute_with_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("type.gguf");
    rewrite(&tiny(dir.path()), &bad, |_, v| Some(v.clone()), Some(("blk.1.attn_q.weight", GgmlType::Q4_1)));
    let e = load_error(&bad);
    assert!(e.contains("blk.1.attn_q.weight") && e.contains("q4_1") && e.contains("cpu"), "{e}");
}

#[test]
fn a_truncated_file_is_refused_with_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny(dir.path());
    let bad = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(&src).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_error(&bad);
    assert!(e.contains("truncated.gguf") && e.contains("byte"), "{e}");
}
