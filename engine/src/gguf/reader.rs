//! Parses and validates one GGUF file's header (magic, version, metadata, tensor infos).
//!
//! Works over any `Read` that yields the file from byte 0 plus the file's length, so the same
//! code reads a file through a buffer and a byte slice in the fuzz tests. The layout checks
//! (alignment, ranges, overlaps) are in `layout`.

use std::io::Read;
use std::path::Path;

use super::cursor::Cursor;
use super::error::{ErrorKind, GgufError, ShapeProblem};
use super::ggml_type::{GgmlType, tensor_bytes};
use super::layout;
use super::metadata::{Entry, Metadata};
use super::tensor::TensorInfo;
use super::value::{Array, Value, ValueType};

pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Deepest nesting of metadata arrays accepted (files use 1); bounds the parser's recursion.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Fewest bytes of one metadata entry: key length, a 1-byte key, value type, a 1-byte value.
const MIN_ENTRY_BYTES: u64 = 8 + 1 + 4 + 1;
/// Fewest bytes of one tensor info: name length, a 1-byte name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 8 + 4 + 8;

/// The validated header of one GGUF file.
#[derive(Clone, Debug)]
pub struct PartHeader {
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the data section (the header's end, aligned).
    pub data_start: u64,
    pub file_len: u64,
    pub metadata: Metadata,
    /// In file order, each with its absolute `file_offset`; `part()` is 0.
    pub tensors: Vec<TensorInfo>,
}

/// Reads and validates the header of the GGUF file `path`: `src` yields its bytes from the
/// start and the file is `file_len` bytes long. Never allocates more than a small multiple of
/// `file_len`, whatever the header claims.
pub fn read_header<R: Read>(src: R, file_len: u64, path: &Path) -> Result<PartHeader, GgufError> {
    let mut c = Cursor::new(src, file_len, path);
    let magic = c.bytes::<4>("the magic")?;
    if &magic != b"GGUF" {
        return Err(c.error(0, ErrorKind::BadMagic { found: magic }));
    }
    let version = c.u32("the version")?;
    check_version(version).map_err(|kind| c.error(4, kind))?;

    let tensors_at = c.pos();
    let n_tensors = c.u64("the tensor count")?;
    let entries_at = c.pos();
    let n_entries = c.u64("the metadata entry count")?;
    let n_entries = bounded(&c, n_entries, MIN_ENTRY_BYTES, entries_at, "metadata entry")?;
    let n_tensors = bounded(&c, n_tensors, MIN_TENSOR_INFO_BYTES, tensors_at, "tensor")?;
    // Both sections must fit together, too.
    let room_for_tensors = (c.remaining() - n_entries as u64 * MIN_ENTRY_BYTES) / MIN_TENSOR_INFO_BYTES;
    if n_tensors as u64 > room_for_tensors {
        let kind = ErrorKind::CountTooLarge { what: "tensor", count: n_tensors as u64, remaining: c.remaining(), max: room_for_tensors };
        return Err(c.error(tensors_at, kind));
    }

    let metadata = read_metadata(&mut c, n_entries)?;
    let alignment = alignment(&metadata)?;
    let mut tensors = read_tensor_infos(&mut c, n_tensors)?;
    let header_end = c.pos();
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| c.error(header_end, ErrorKind::Truncated { what: "the aligned data section", needed: alignment, file_len }))?;
    layout::place_tensors(path, &mut tensors, alignment, data_start, file_len)?;
    layout::sorted_by_name(&tensors, |_| path)?;
    Ok(PartHeader { version, alignment, data_start, file_len, metadata, tensors })
}

fn check_version(version: u32) -> Result<(), ErrorKind> {
    match version {
        2 | 3 => Ok(()),
        // A big-endian file's small version number reads as a large little-endian one with
        // the low half zero (the test gguf-py and ggml use).
        v if v != 0 && v & 0xffff == 0 => Err(ErrorKind::BigEndian { raw: v }),
        v => Err(ErrorKind::UnsupportedVersion { version: v }),
    }
}

/// Like `Cursor::bounded_count`, and also at most u32::MAX (entries are indexed with u32).
fn bounded<R: Read>(c: &Cursor<R>, count: u64, min_each: u64, offset: u64, what: &'static str) -> Result<usize, GgufError> {
    let n = c.bounded_count(count, min_each, offset, what)?;
    if n as u64 > u64::from(u32::MAX) {
        return Err(c.error(offset, ErrorKind::CountTooLarge { what, count, remaining: c.remaining(), max: u32::MAX.into() }));
    }
    Ok(n)
}

fn read_metadata<R: Read>(c: &mut Cursor<R>, n: usize) -> Result<Metadata, GgufError> {
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let key_at = c.pos();
        let key = c.string("a metadata key")?;
        if key.is_empty() {
            return Err(c.error(key_at, ErrorKind::EmptyString { what: "a metadata key" }));
        }
        let offset = c.pos();
        let ty = value_type(c, "a metadata value type")?;
        let value = read_value(c, ty, 0)?;
        entries.push(Entry { key, value, offset });
    }
    Metadata::new(c.path(), entries)
}

fn value_type<R: Read>(c: &mut Cursor<R>, what: &'static str) -> Result<ValueType, GgufError> {
    let at = c.pos();
    let id = c.u32(what)?;
    ValueType::from_id(id).ok_or_else(|| c.error(at, ErrorKind::UnknownValueType { id }))
}

const VALUE: &str = "a metadata value";

fn read_value<R: Read>(c: &mut Cursor<R>, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
    Ok(match ty {
        ValueType::U8 => Value::U8(c.u8(VALUE)?),
        ValueType::I8 => Value::I8(c.u8(VALUE)? as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.bytes(VALUE)?)),
        ValueType::Bool => {
            let at = c.pos();
            let byte = c.u8(VALUE)?;
            Value::Bool(to_bool(c, at, byte)?)
        }
        ValueType::String => Value::String(c.string("a metadata string")?),
        ValueType::Array => Value::Array(Box::new(read_array(c, depth + 1)?)),
    })
}

fn to_bool<R: Read>(c: &Cursor<R>, at: u64, byte: u8) -> Result<bool, GgufError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        byte => Err(c.error(at, ErrorKind::InvalidBool { byte })),
    }
}

const ELEMENT: &str = "an array element";

fn read_array<R: Read>(c: &mut Cursor<R>, depth: usize) -> Result<Array, GgufError> {
    if depth > MAX_ARRAY_DEPTH {
        return Err(c.error(c.pos(), ErrorKind::ArrayTooDeep { max: MAX_ARRAY_DEPTH }));
    }
    let ty = value_type(c, "an array element type")?;
    let len_at = c.pos();
    let len = c.u64("an array length")?;
    let n = c.bounded_count(len, ty.min_encoded_size(), len_at, "array element")?;
    Ok(match ty {
        ValueType::U8 => {
            let mut v = vec![0u8; n];
            c.read_into(&mut v, ELEMENT)?;
            Array::U8(v)
        }
        ValueType::I8 => Array::I8(c.le_values(n, i8::from_le_bytes, ELEMENT)?),
        ValueType::U16 => Array::U16(c.le_values(n, u16::from_le_bytes, ELEMENT)?),
        ValueType::I16 => Array::I16(c.le_values(n, i16::from_le_bytes, ELEMENT)?),
        ValueType::U32 => Array::U32(c.le_values(n, u32::from_le_bytes, ELEMENT)?),
        ValueType::I32 => Array::I32(c.le_values(n, i32::from_le_bytes, ELEMENT)?),
        ValueType::F32 => Array::F32(c.le_values(n, f32::from_le_bytes, ELEMENT)?),
        ValueType::U64 => Array::U64(c.le_values(n, u64::from_le_bytes, ELEMENT)?),
        ValueType::I64 => Array::I64(c.le_values(n, i64::from_le_bytes, ELEMENT)?),
        ValueType::F64 => Array::F64(c.le_values(n, f64::from_le_bytes, ELEMENT)?),
        ValueType::Bool => {
            let at = c.pos();
            let bytes = c.le_values(n, |[b]: [u8; 1]| b, ELEMENT)?;
            let bools = bytes.iter().enumerate().map(|(i, &b)| to_bool(c, at + i as u64, b));
            Array::Bool(bools.collect::<Result<_, _>>()?)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(c.string("a metadata string")?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

/// `general.alignment`: absent means 32; else a power of two that fits in u32 (the spec's type;
/// any integer type is accepted for its value).
fn alignment(metadata: &Metadata) -> Result<u64, GgufError> {
    let Some(entry) = metadata.entry(ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match entry.value.as_integer() {
        Some(a) if a > 0 && a <= u32::MAX.into() && (a as u64).is_power_of_two() => Ok(a as u64),
        _ => {
            let found = format!("{} {:?}", entry.value.type_description(), entry.value);
            Err(GgufError::at(metadata.path(), entry.offset, ErrorKind::BadAlignment { found }))
        }
    }
}

fn read_tensor_infos<R: Read>(c: &mut Cursor<R>, n: usize) -> Result<Vec<TensorInfo>, GgufError> {
    let mut tensors = Vec::with_capacity(n);
    for _ in 0..n {
        let info_offset = c.pos();
        let name = c.string("a tensor name")?;
        if name.is_empty() {
            return Err(c.error(info_offset, ErrorKind::EmptyString { what: "a tensor name" }));
        }
        let dims_at = c.pos();
        let n_dims = c.u32("a tensor's dimension count")?;
        if !(1..=4).contains(&n_dims) {
            let kind = ErrorKind::BadShape { tensor: name.into(), problem: ShapeProblem::DimCount(n_dims) };
            return Err(c.error(dims_at, kind));
        }
        let mut dims = [1u64; 4];
        for d in &mut dims[..n_dims as usize] {
            *d = c.u64("a tensor dimension")?;
        }
        let type_at = c.pos();
        let id = c.u32("a tensor type")?;
        let Some(ggml_type) = GgmlType::from_id(id) else {
            let kind = ErrorKind::UnknownTensorType { tensor: name.into(), id, removed: GgmlType::removed_name(id) };
            return Err(c.error(type_at, kind));
        };
        let offset = c.u64("a tensor data offset")?;
        let size = tensor_bytes(ggml_type, &dims[..n_dims as usize])
            .map_err(|problem| c.error(dims_at, ErrorKind::BadShape { tensor: name.to_string(), problem }))?;
        tensors.push(TensorInfo { name, dims, n_dims: n_dims as u8, ggml_type, offset, file_offset: 0, size, part: 0, info_offset });
    }
    Ok(tensors)
}
