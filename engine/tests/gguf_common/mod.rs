//! Helpers shared by the GGUF tests: sample models, deterministic bytes, byte patching.
#![allow(dead_code)]

use brink_engine::gguf::{Array, GgmlType, GgufWriter, PartHeader, Value, read_header};
use std::path::Path;

/// Deterministic pseudo-random bytes (SplitMix64), different per seed.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..len).map(|_| rng.next() as u8).collect()
}

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One metadata value of every type, including arrays of every element type, an empty array and
/// nested arrays; floats with awkward values.
pub fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", "qwen3moe".into()),
        ("t.u8", Value::U8(0xfe)),
        ("t.i8", Value::I8(-128)),
        ("t.u16", Value::U16(0xfffe)),
        ("t.i16", Value::I16(-32768)),
        ("t.u32", Value::U32(0xdead_beef)),
        ("t.i32", Value::I32(i32::MIN)),
        ("t.f32", Value::F32(-0.0)),
        ("t.f32_inf", Value::F32(f32::INFINITY)),
        ("t.f32_subnormal", Value::F32(f32::from_bits(1))),
        ("t.bool_true", Value::Bool(true)),
        ("t.bool_false", Value::Bool(false)),
        ("t.string", "héllo, 世界 \u{1F600}".into()),
        ("t.empty_string", "".into()),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.arr_u8", vec![0u8, 1, 255].into()),
        ("t.arr_i8", vec![-1i8, 0, 127].into()),
        ("t.arr_u16", vec![1u16, 65535].into()),
        ("t.arr_i16", vec![-2i16, 2].into()),
        ("t.arr_u32", vec![7u32, u32::MAX].into()),
        ("t.arr_i32", vec![-7i32, i32::MAX].into()),
        ("t.arr_f32", vec![1.5f32, -2.25, f32::MAX].into()),
        ("t.arr_bool", vec![true, false, true].into()),
        ("t.arr_string", vec!["a", "", "ünïcode"].into()),
        ("t.arr_u64", vec![0u64, u64::MAX].into()),
        ("t.arr_i64", vec![i64::MIN, 1].into()),
        ("t.arr_f64", vec![1e300f64, -1e-300].into()),
        ("t.arr_empty", Array::U32(vec![]).into()),
        ("t.arr_nested", Array::Array(vec![Array::U32(vec![1, 2]), Array::String(vec!["x".into()]), Array::Array(vec![])]).into()),
    ]
}

/// Tensors of several types and shapes: (name, dims, type).
pub fn sample_tensors() -> Vec<(&'static str, Vec<u64>, GgmlType)> {
    vec![
        ("token_embd.weight", vec![64, 5], GgmlType::F32),
        ("blk.0.attn_norm.weight", vec![64], GgmlType::F16),
        ("blk.0.attn_q.weight", vec![64, 3], GgmlType::BF16),
        ("blk.0.ffn_gate_exps.weight", vec![64, 2, 4], GgmlType::Q4_0),
        ("blk.0.ffn_up_exps.weight", vec![32, 3, 2, 2], GgmlType::Q8_0),
        ("blk.0.ffn_down_exps.weight", vec![256, 2], GgmlType::Q4_K),
        ("blk.1.attn_k.weight", vec![512], GgmlType::Q5_K),
        ("blk.1.attn_v.weight", vec![256, 3], GgmlType::Q6_K),
        ("blk.1.ffn_gate.weight", vec![256], GgmlType::Q2_K),
        ("blk.1.ffn_up.weight", vec![256], GgmlType::Q3_K),
        ("output.weight", vec![64, 1], GgmlType::Q5_0),
        ("extra.i32", vec![3], GgmlType::I32),
    ]
}

/// A writer with every metadata value type and the sample tensors, and each tensor's data.
pub fn sample_model() -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.set(k, v).unwrap();
    }
    let mut data = Vec::new();
    for (i, (name, dims, ty)) in sample_tensors().into_iter().enumerate() {
        let idx = w.add_tensor(name, &dims, ty).unwrap();
        data.push(bytes(w.tensors()[idx].size as usize, 1000 + i as u64));
    }
    (w, data)
}

pub fn refs(data: &[Vec<u8>]) -> Vec<&[u8]> {
    data.iter().map(Vec::as_slice).collect()
}

/// A small but complete model (a few metadata keys, three tensors): the fuzz seed.
pub fn small_model(alignment: u64, version: u32) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set_version(version).unwrap();
    if alignment != 32 {
        w.set_alignment(alignment).unwrap();
    }
    w.set("general.architecture", "qwen3moe").unwrap();
    w.set("qwen3moe.block_count", Value::U32(2)).unwrap();
    w.set("qwen3moe.rope.freq_base", Value::F32(1e6)).unwrap();
    w.set("tokenizer.ggml.tokens", vec!["<s>", "a", "bc"]).unwrap();
    w.set("tokenizer.ggml.token_type", vec![3i32, 1, 1]).unwrap();
    w.set("t.nested", Value::from(Array::Array(vec![Array::U8(vec![1, 2]), Array::Bool(vec![true])]))).unwrap();
    w.set("t.flag", Value::Bool(true)).unwrap();
    w.set("t.big", Value::U64(1 << 40)).unwrap();
    w.add_tensor("a", &[32, 2], GgmlType::Q8_0).unwrap();
    w.add_tensor("b", &[8], GgmlType::F32).unwrap();
    w.add_tensor("c", &[256], GgmlType::Q4_K).unwrap();
    let data: Vec<Vec<u8>> = w.tensors().iter().enumerate().map(|(i, t)| bytes(t.size as usize, i as u64)).collect();
    w.to_bytes(&refs(&data)).unwrap()
}

pub fn parse(bytes: &[u8]) -> Result<PartHeader, brink_engine::gguf::GgufError> {
    read_header(bytes, bytes.len() as u64, Path::new("mem.gguf"))
}

/// Byte offsets of a tensor info's fields: (n_dims, first dim, type, offset).
pub fn tensor_field_offsets(header: &PartHeader, name: &str) -> (usize, usize, usize, usize) {
    let t = header.tensors.iter().find(|t| t.name() == name).unwrap();
    let n_dims_at = t.info_offset() as usize + 8 + name.len();
    let type_at = n_dims_at + 4 + 8 * t.dims().len();
    (n_dims_at, n_dims_at + 4, type_at, type_at + 4)
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
