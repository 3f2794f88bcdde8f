//! Cross-check with gguf-py, the reference GGUF implementation (`pip install 'gguf>=0.17,<1'`):
//! files from our writer read by `gguf.GGUFReader`, and files from `gguf.GGUFWriter` (single
//! and split) read by our reader, compared field by field and byte by byte.
//!
//! Skipped with a message when python3 or the package is missing, unless BRINK_REQUIRE_PY=1
//! (as scripts/test sets), where that is a failure.

mod gguf_common;

use std::path::{Path, PathBuf};
use std::process::Command;

use brink_engine::gguf::{Array, GgmlType, GgufFile, GgufWriter, Value, ValueType};
use gguf_common::*;
use serde_json::{Value as Json, json};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/gguf_check.py")
}

/// Whether gguf-py is importable; panics when it is required and missing.
fn have_gguf_py() -> bool {
    let ok = Command::new("python3").args(["-c", "import gguf, numpy"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "python3 with the `gguf` package (pip install 'gguf>=0.17,<1') is not available";
        assert!(std::env::var("BRINK_REQUIRE_PY").as_deref() != Ok("1"), "BRINK_REQUIRE_PY=1 but {msg}");
        eprintln!("skipping the gguf-py cross-check: {msg}");
    }
    ok
}

fn run_py(args: &[&str]) -> Json {
    let out = Command::new("python3").arg(script()).args(args).output().expect("run python3");
    assert!(out.status.success(), "gguf_check.py {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    if out.stdout.is_empty() { Json::Null } else { serde_json::from_slice(&out.stdout).expect("gguf_check.py printed JSON") }
}

fn py_type(t: ValueType) -> &'static str {
    match t {
        ValueType::U8 => "UINT8",
        ValueType::I8 => "INT8",
        ValueType::U16 => "UINT16",
        ValueType::I16 => "INT16",
        ValueType::U32 => "UINT32",
        ValueType::I32 => "INT32",
        ValueType::F32 => "FLOAT32",
        ValueType::Bool => "BOOL",
        ValueType::String => "STRING",
        ValueType::Array => "ARRAY",
        ValueType::U64 => "UINT64",
        ValueType::I64 => "INT64",
        ValueType::F64 => "FLOAT64",
    }
}

/// gguf-py's `types` of a field: the value's type, and for an array the types of its first
/// element (an empty array has none).
fn types_of(v: &Value) -> Vec<&'static str> {
    fn array_types(a: &Array) -> Vec<&'static str> {
        let mut out = vec!["ARRAY"];
        match a.as_arrays() {
            Some(inner) => out.extend(inner.first().map(array_types).unwrap_or_default()),
            None if !a.is_empty() => out.push(py_type(a.element_type())),
            None => {}
        }
        out
    }
    v.as_array().map_or_else(|| vec![py_type(v.value_type())], array_types)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Scalar leaves, flattened through nested arrays, as gguf_check.py formats them.
fn leaves_of(v: &Value) -> Vec<String> {
    fn array_leaves(a: &Array, out: &mut Vec<String>) {
        macro_rules! each {
            ($v:expr, $name:literal, $fmt:expr) => {
                out.extend($v.iter().map(|x| format!("{}:{}", $name, $fmt(x))))
            };
        }
        match a {
            Array::U8(v) => each!(v, "UINT8", |x: &u8| x.to_string()),
            Array::I8(v) => each!(v, "INT8", |x: &i8| x.to_string()),
            Array::U16(v) => each!(v, "UINT16", |x: &u16| x.to_string()),
            Array::I16(v) => each!(v, "INT16", |x: &i16| x.to_string()),
            Array::U32(v) => each!(v, "UINT32", |x: &u32| x.to_string()),
            Array::I32(v) => each!(v, "INT32", |x: &i32| x.to_string()),
            Array::F32(v) => each!(v, "FLOAT32", |x: &f32| hex(&x.to_le_bytes())),
            Array::Bool(v) => each!(v, "BOOL", |x: &bool| x.to_string()),
            Array::String(v) => out.extend(v.iter().map(|x| format!("STRING:{x}"))),
            Array::U64(v) => each!(v, "UINT64", |x: &u64| x.to_string()),
            Array::I64(v) => each!(v, "INT64", |x: &i64| x.to_string()),
            Array::F64(v) => each!(v, "FLOAT64", |x: &f64| hex(&x.to_le_bytes())),
            Array::Array(v) => v.iter().for_each(|inner| array_leaves(inner, out)),
        }
    }
    let mut out = Vec::new();
    match v {
        Value::Array(a) => array_leaves(a, &mut out),
        scalar => array_leaves(&scalar_as_array(scalar), &mut out),
    }
    out
}

fn scalar_as_array(v: &Value) -> Array {
    match v.clone() {
        Value::U8(x) => Array::U8(vec![x]),
        Value::I8(x) => Array::I8(vec![x]),
        Value::U16(x) => Array::U16(vec![x]),
        Value::I16(x) => Array::I16(vec![x]),
        Value::U32(x) => Array::U32(vec![x]),
        Value::I32(x) => Array::I32(vec![x]),
        Value::F32(x) => Array::F32(vec![x]),
        Value::Bool(x) => Array::Bool(vec![x]),
        Value::String(x) => Array::String(vec![x]),
        Value::U64(x) => Array::U64(vec![x]),
        Value::I64(x) => Array::I64(vec![x]),
        Value::F64(x) => Array::F64(vec![x]),
        Value::Array(a) => *a,
    }
}

/// Part `index` of `f` in gguf_check.py's dump format, as our reader sees it.
fn our_dump(f: &GgufFile, index: usize) -> Json {
    let part = &f.parts()[index];
    let fields: Vec<Json> = part.metadata().iter().map(|(k, v)| json!({"key": k, "types": types_of(v), "leaves": leaves_of(v)})).collect();
    let tensors: Vec<Json> = f.tensors()[part.tensor_range()]
        .iter()
        .map(|t| {
            json!({
                "name": t.name(),
                "type": t.ggml_type().id(),
                "shape": t.dims(),
                "n_bytes": t.size(),
                "data_offset": t.file_offset(),
                "hex": hex(&f.read_tensor(t).unwrap()),
            })
        })
        .collect();
    json!({"version": part.version(), "alignment": part.alignment(), "fields": fields, "tensors": tensors})
}

fn assert_same_dump(ours: &Json, theirs: &Json, what: &str) {
    assert_eq!(ours["version"], theirs["version"], "{what}: version");
    assert_eq!(ours["alignment"], theirs["alignment"], "{what}: alignment");
    let (a, b) = (ours["fields"].as_array().unwrap(), theirs["fields"].as_array().unwrap());
    assert_eq!(a.len(), b.len(), "{what}: field count");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x, y, "{what}: field");
    }
    let (a, b) = (ours["tensors"].as_array().unwrap(), theirs["tensors"].as_array().unwrap());
    assert_eq!(a.len(), b.len(), "{what}: tensor count");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x, y, "{what}: tensor");
    }
}

#[test]
fn gguf_py_reads_our_files() {
    if !have_gguf_py() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (version, alignment) in [(3, 32), (2, 64)] {
        let mut w = GgufWriter::new();
        w.set_version(version).unwrap();
        if alignment != 32 {
            w.set_alignment(alignment).unwrap();
        }
        // gguf-py flattens nested arrays using the first element's types, so nested arrays here
        // hold one element type (mixed ones are covered by our own round trip).
        for (k, v) in every_value().into_iter().filter(|(k, _)| *k != "t.arr_nested") {
            w.set(k, v).unwrap();
        }
        w.set("t.nested_u32", Value::from(Array::Array(vec![Array::U32(vec![1, 2]), Array::U32(vec![3])]))).unwrap();
        w.set("t.nested_str", Value::from(Array::Array(vec![vec!["a"].into(), vec!["b", "cd"].into()]))).unwrap();
        let mut data = Vec::new();
        for (i, (name, dims, ty)) in sample_tensors().into_iter().enumerate() {
            let idx = w.add_tensor(name, &dims, ty).unwrap();
            data.push(bytes(w.tensors()[idx].size as usize, 77 + i as u64));
        }
        let path = dir.path().join(format!("ours-v{version}.gguf"));
        w.write_file(&path, &refs(&data)).unwrap();

        let theirs = run_py(&["read", path.to_str().unwrap()]);
        let f = GgufFile::open(&path).unwrap();
        assert_same_dump(&our_dump(&f, 0), &theirs, &format!("v{version}"));
        // And what gguf-py read is what we wrote.
        for (t, d) in theirs["tensors"].as_array().unwrap().iter().zip(&data) {
            assert_eq!(t["hex"], hex(d));
        }
    }
}

/// gguf_check.py's deterministic tensor bytes: (i * 31 + seed) % 251.
fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + seed) % 251) as u8).collect()
}

#[test]
fn we_read_gguf_py_files() {
    if !have_gguf_py() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("py.gguf");
    let theirs = run_py(&["write", path.to_str().unwrap()]);
    let f = GgufFile::open(&path).unwrap();
    assert_same_dump(&our_dump(&f, 0), &theirs, "gguf-py file");

    // Independent of both readers: what the script wrote.
    let m = f.metadata();
    assert_eq!(f.architecture().unwrap(), "qwen3moe");
    assert_eq!(f.parts()[0].alignment(), 64);
    assert_eq!(m.get_u8("p.u8").unwrap(), 200);
    assert_eq!(m.get_i64("p.i64").unwrap(), i64::MIN);
    assert_eq!(m.get_u64("p.u64").unwrap(), u64::MAX);
    assert_eq!(m.get_f32("p.f32").unwrap(), 0.1);
    assert_eq!(m.get_str("p.str").unwrap(), "ünïcödé \u{4e16}");
    assert_eq!(m.get_str_array("p.arr_str").unwrap().iter().map(|s| &**s).collect::<Vec<_>>(), ["a", "", "bc"]);
    assert_eq!(m.get_array("p.arr_u8").unwrap().as_u8().unwrap(), &[1, 2, 255]);
    assert_eq!(m.get_array("p.nested").unwrap().as_arrays().unwrap()[1], Array::I32(vec![3]));
    let expect = [
        ("w.q8_0", GgmlType::Q8_0, vec![32, 2], pattern(68, 1)),
        ("w.q4_0", GgmlType::Q4_0, vec![32, 3], pattern(54, 2)),
        ("w.q4_k", GgmlType::Q4_K, vec![256, 1], pattern(144, 3)),
        ("w.q6_k", GgmlType::Q6_K, vec![256, 2], pattern(420, 4)),
        ("w.bf16", GgmlType::BF16, vec![8, 4], pattern(64, 5)),
    ];
    for (name, ty, dims, bytes) in expect {
        let t = f.require_tensor(name).unwrap();
        assert_eq!((t.ggml_type(), t.dims()), (ty, dims.as_slice()), "{name}");
        assert_eq!(f.read_tensor(t).unwrap(), bytes, "{name}");
    }
    let t = f.require_tensor("w.f32").unwrap();
    assert_eq!(t.dims(), &[8, 3]);
    let floats: Vec<f32> = f.read_tensor(t).unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(floats, (0..24).map(|i| i as f32 - 7.5).collect::<Vec<_>>());
}

#[test]
fn we_read_gguf_py_split_files() {
    if !have_gguf_py() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    run_py(&["write", dir.path().join("pys.gguf").to_str().unwrap(), "--split-max-tensors", "3"]);
    let parts: Vec<PathBuf> = (1..=3).map(|i| dir.path().join(format!("pys-{i:05}-of-00003.gguf"))).collect();
    for open in &parts {
        let f = GgufFile::open(open).unwrap();
        assert_eq!(f.parts().len(), 3);
        assert_eq!(f.tensors().len(), 8);
        for (i, part) in parts.iter().enumerate() {
            let theirs = run_py(&["read", part.to_str().unwrap()]);
            assert_same_dump(&our_dump(&f, i), &theirs, &format!("part {}", i + 1));
        }
        assert_eq!(f.read_tensor(f.require_tensor("w.bf16").unwrap()).unwrap(), pattern(64, 5));
    }
}
