//! Little-endian encoding of GGUF header fields (the writer's half of `reader`).

use super::value::{Array, Value};

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// The value's type id, then the value.
pub(crate) fn put_value(out: &mut Vec<u8>, v: &Value) {
    put_u32(out, v.value_type().id());
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Element type id, length, elements (a nested array: its own type id, length, elements).
fn put_array(out: &mut Vec<u8>, a: &Array) {
    put_u32(out, a.element_type().id());
    put_u64(out, a.len() as u64);
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, v: &[T], f: fn(T) -> [u8; N]) {
        out.reserve(v.len() * N);
        for &x in v {
            out.extend_from_slice(&f(x));
        }
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => each(out, v, i8::to_le_bytes),
        Array::U16(v) => each(out, v, u16::to_le_bytes),
        Array::I16(v) => each(out, v, i16::to_le_bytes),
        Array::U32(v) => each(out, v, u32::to_le_bytes),
        Array::I32(v) => each(out, v, i32::to_le_bytes),
        Array::F32(v) => each(out, v, f32::to_le_bytes),
        Array::Bool(v) => each(out, v, |b| [u8::from(b)]),
        Array::String(v) => v.iter().for_each(|s| put_string(out, s)),
        Array::Array(v) => v.iter().for_each(|inner| put_array(out, inner)),
        Array::U64(v) => each(out, v, u64::to_le_bytes),
        Array::I64(v) => each(out, v, i64::to_le_bytes),
        Array::F64(v) => each(out, v, f64::to_le_bytes),
    }
}

/// How deeply arrays nest in `v` (0 for a scalar), so the writer refuses what the reader would.
pub(crate) fn array_depth(v: &Value) -> usize {
    fn depth(a: &Array) -> usize {
        1 + a.as_arrays().map_or(0, |inner| inner.iter().map(depth).max().unwrap_or(0))
    }
    v.as_array().map_or(0, depth)
}
