//! Every validation the reader makes, each provoked on purpose: the right error variant, at the
//! right byte offset, naming the file — never a panic.

mod gguf_common;

use brink_engine::gguf::{ErrorKind, GgufError, GgufFile, GgufWriter, PartHeader, ShapeProblem, Value};
use gguf_common::*;

fn seed() -> (Vec<u8>, PartHeader) {
    let bytes = small_model(32, 3);
    let h = parse(&bytes).unwrap();
    (bytes, h)
}

fn err(bytes: &[u8]) -> GgufError {
    let e = parse(bytes).expect_err("a broken file must not parse");
    assert!(e.to_string().starts_with("mem.gguf"), "{e}");
    e
}

/// Offset of a metadata value's type field.
fn value_at(h: &PartHeader, key: &str) -> usize {
    h.metadata.entry(key).unwrap().offset as usize
}

#[test]
fn bad_magic() {
    let (mut b, _) = seed();
    b[0] = b'X';
    let e = err(&b);
    assert!(matches!(e.kind, ErrorKind::BadMagic { found } if &found == b"XGUF"));
    assert_eq!(e.offset, Some(0));
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
}

#[test]
fn bad_versions() {
    let (b, _) = seed();
    for (version, big_endian) in [(1u32, false), (0, false), (4, false), (0x0300_0000, true), (0x0002_0000, true)] {
        let mut b = b.clone();
        put_u32(&mut b, 4, version);
        let e = err(&b);
        assert_eq!(e.offset, Some(4));
        if big_endian {
            assert!(matches!(e.kind, ErrorKind::BigEndian { raw } if raw == version), "{e}");
        } else {
            assert!(matches!(e.kind, ErrorKind::UnsupportedVersion { version: v } if v == version), "{e}");
            assert!(e.to_string().contains("unsupported GGUF version"), "{e}");
        }
    }
}

#[test]
fn truncated_at_every_offset() {
    let (b, h) = seed();
    let header_end = h.tensors.iter().map(|t| t.info_offset()).max().unwrap() as usize;
    let data_end = h.tensors.iter().map(|t| t.file_offset() + t.size()).max().unwrap() as usize;
    for cut in 0..b.len() {
        match parse(&b[..cut]) {
            Ok(_) => assert!(cut >= data_end, "a file cut at {cut} (data ends at {data_end}) parsed"),
            Err(e) => {
                assert!(e.offset.unwrap() <= cut as u64, "cut {cut}: {e}");
                if cut <= header_end {
                    assert!(matches!(e.kind, ErrorKind::Truncated { .. } | ErrorKind::CountTooLarge { .. }), "cut {cut}: {e}");
                } else {
                    // Past the last tensor info only the data can be missing.
                    assert!(
                        matches!(e.kind, ErrorKind::Truncated { .. } | ErrorKind::CountTooLarge { .. } | ErrorKind::TensorPastEnd { .. }),
                        "cut {cut}: {e}"
                    );
                }
            }
        }
    }
    // Cut inside the data: the error names the tensor that no longer fits.
    let c = h.tensors.iter().find(|t| t.name() == "c").unwrap();
    let e = err(&b[..c.file_offset() as usize + 1]);
    assert!(matches!(&e.kind, ErrorKind::TensorPastEnd { tensor, .. } if tensor == "c"), "{e}");
    assert_eq!(e.offset, Some(c.info_offset()));
}

#[test]
fn truncated_file_on_disk_names_the_path() {
    let (b, _) = seed();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    std::fs::write(&path, &b[..40]).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert_eq!(e.path, path);
    assert!(e.to_string().starts_with(&format!("{} at byte ", path.display())), "{e}");
}

#[test]
fn misaligned_offset() {
    let (mut b, h) = seed();
    let (_, _, _, off_at) = tensor_field_offsets(&h, "b");
    let t = h.tensors.iter().find(|t| t.name() == "b").unwrap();
    put_u64(&mut b, off_at, t.offset() + 4);
    let e = err(&b);
    assert!(matches!(&e.kind, ErrorKind::MisalignedTensor { tensor, alignment: 32, .. } if tensor == "b"), "{e}");
    assert_eq!(e.offset, Some(t.info_offset()));
}

#[test]
fn overlapping_tensors() {
    let (mut b, h) = seed();
    let (_, _, _, off_at) = tensor_field_offsets(&h, "b");
    put_u64(&mut b, off_at, 32); // "a" holds 68 bytes at offset 0
    let e = err(&b);
    assert!(matches!(&e.kind, ErrorKind::OverlappingTensors { first, second, .. } if first == "a" && second == "b"), "{e}");
}

#[test]
fn data_past_the_end() {
    let (b, h) = seed();
    let (_, dim_at, _, off_at) = tensor_field_offsets(&h, "c");
    let data_len = (b.len() as u64) - h.data_start;
    for offset in [data_len, data_len + 32, u64::MAX - 31, (u64::MAX - h.data_start) & !31] {
        let mut b = b.clone();
        put_u64(&mut b, off_at, offset);
        assert!(matches!(err(&b).kind, ErrorKind::TensorPastEnd { .. }), "offset {offset}");
    }
    // A larger shape than the data written.
    let mut b = b.clone();
    put_u64(&mut b, dim_at, 512);
    assert!(matches!(&err(&b).kind, ErrorKind::TensorPastEnd { tensor, size: 288, .. } if tensor == "c"));
}

#[test]
fn huge_counts_are_refused_before_allocation() {
    let (b, h) = seed();
    let tokens_len_at = value_at(&h, "tokenizer.ggml.tokens") + 4 + 4;
    let first_key_len_at = 24;
    let first_string_len_at = value_at(&h, "general.architecture") + 4;
    let (_, dim_at, _, _) = tensor_field_offsets(&h, "a");
    let name_len_at = h.tensors[0].info_offset() as usize;
    for (at, what) in [
        (8, "tensor"),
        (16, "metadata entry"),
        (first_key_len_at, "a metadata key"),
        (first_string_len_at, "a metadata string"),
        (tokens_len_at, "array element"),
        (name_len_at, "a tensor name"),
    ] {
        for value in [u64::MAX, 1 << 62, 1 << 40, b.len() as u64] {
            let mut b = b.clone();
            put_u64(&mut b, at, value);
            let e = err(&b);
            assert!(matches!(e.kind, ErrorKind::CountTooLarge { what: w, .. } if w == what), "{what} = {value}: {e}");
            assert_eq!(e.offset, Some(at as u64));
        }
    }
    // Dimensions are not counts of bytes in the header, but their product is checked.
    let mut b = b.clone();
    put_u64(&mut b, dim_at, u64::MAX - 31);
    assert!(matches!(err(&b).kind, ErrorKind::BadShape { problem: ShapeProblem::TooManyElements, .. }));
}

#[test]
fn counts_that_fit_alone_but_not_together() {
    let (mut b, _) = seed();
    let remaining = b.len() as u64 - 24;
    put_u64(&mut b, 8, remaining / 33); // tensors alone would fit ...
    put_u64(&mut b, 16, remaining / 14); // ... and entries alone, but not both
    let e = err(&b);
    assert!(matches!(e.kind, ErrorKind::CountTooLarge { what: "tensor", .. }), "{e}");
}

#[test]
fn unknown_types() {
    let (b, h) = seed();
    let (_, _, type_at, _) = tensor_field_offsets(&h, "b");
    for (id, removed) in [(99u32, None), (4, Some("Q4_2")), (31, Some("Q4_0_4_4")), (u32::MAX, None)] {
        let mut b = b.clone();
        put_u32(&mut b, type_at, id);
        let e = err(&b);
        assert!(
            matches!(&e.kind, ErrorKind::UnknownTensorType { tensor, id: i, removed: r } if tensor == "b" && *i == id && *r == removed)
        );
        assert_eq!(e.offset, Some(type_at as u64));
        assert!(e.to_string().contains(&format!("tensor \"b\" has unknown ggml type id {id}")), "{e}");
    }
    let mut b = b.clone();
    let at = value_at(&h, "qwen3moe.block_count");
    put_u32(&mut b, at, 13);
    let e = err(&b);
    assert!(matches!(e.kind, ErrorKind::UnknownValueType { id: 13 }));
    assert_eq!(e.offset, Some(at as u64));
    // An array's element type.
    let mut b2 = small_model(32, 3);
    put_u32(&mut b2, value_at(&h, "tokenizer.ggml.tokens") + 4, 100);
    assert!(matches!(err(&b2).kind, ErrorKind::UnknownValueType { id: 100 }));
}

/// A file whose key "general.alignmenX" is renamed to "general.alignment" after writing, so
/// the writer's own checks do not stop the value.
fn with_alignment_value(value: Value) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.alignmenX", value).unwrap();
    w.add_tensor("a", &[8], brink_engine::gguf::GgmlType::F32).unwrap();
    let mut b = w.to_bytes(&[&[0u8; 32]]).unwrap();
    let at = b.windows(17).position(|w| w == b"general.alignmenX").unwrap();
    b[at + 16] = b't';
    b
}

#[test]
fn bad_alignment() {
    for v in [Value::U32(0), Value::U32(48), Value::U64(1 << 32), Value::I32(-32), Value::from("32"), Value::F32(32.0)] {
        let e = err(&with_alignment_value(v.clone()));
        assert!(matches!(e.kind, ErrorKind::BadAlignment { .. }), "{v:?}: {e}");
        assert!(e.to_string().contains("general.alignment must be a non-zero power of two"), "{e}");
    }
    // Any integer type holding a power of two is accepted.
    let h = parse(&with_alignment_value(Value::U8(16))).unwrap();
    assert_eq!(h.alignment, 16);
}

#[test]
fn bad_shapes() {
    let (b, h) = seed();
    let (n_dims_at, dim_at, _, _) = tensor_field_offsets(&h, "b");
    for n in [0u32, 5, u32::MAX] {
        let mut b = b.clone();
        put_u32(&mut b, n_dims_at, n);
        let e = err(&b);
        assert!(matches!(&e.kind, ErrorKind::BadShape { problem: ShapeProblem::DimCount(d), .. } if *d == n), "{e}");
        assert_eq!(e.offset, Some(n_dims_at as u64));
    }
    let mut z = b.clone();
    put_u64(&mut z, dim_at, 0);
    assert!(matches!(err(&z).kind, ErrorKind::BadShape { problem: ShapeProblem::ZeroDim { index: 0 }, .. }));
    let (_, a_dim_at, _, _) = tensor_field_offsets(&h, "a");
    let mut p = b.clone();
    put_u64(&mut p, a_dim_at, 48);
    let e = err(&p);
    assert!(matches!(e.kind, ErrorKind::BadShape { problem: ShapeProblem::PartialBlock { ne0: 48, block: 32, .. }, .. }), "{e}");
    assert!(e.to_string().contains("row length 48 is not a multiple of the q8_0 block size 32"), "{e}");
    let mut o = b.clone();
    put_u64(&mut o, a_dim_at, 1 << 62);
    put_u64(&mut o, a_dim_at + 8, 4);
    assert!(matches!(err(&o).kind, ErrorKind::BadShape { problem: ShapeProblem::TooManyElements, .. }));
}

#[test]
fn invalid_values() {
    let (b, h) = seed();
    let mut bad_bool = b.clone();
    let at = value_at(&h, "t.flag") + 4;
    bad_bool[at] = 2;
    let e = err(&bad_bool);
    assert!(matches!(e.kind, ErrorKind::InvalidBool { byte: 2 }));
    assert_eq!(e.offset, Some(at as u64));

    // The bool inside the nested array [[1, 2], [true]].
    let mut bad_nested = b.clone();
    let nested = value_at(&h, "t.nested");
    let at = nested + 4 + 12 + (12 + 2) + 12;
    assert_eq!(bad_nested[at], 1);
    bad_nested[at] = 0xff;
    assert!(matches!(err(&bad_nested).kind, ErrorKind::InvalidBool { byte: 0xff }));

    let mut bad_utf8 = b.clone();
    let key_at = bad_utf8.windows(20).position(|w| w == b"qwen3moe.block_count").unwrap();
    bad_utf8[key_at] = 0xff;
    let e = err(&bad_utf8);
    assert!(matches!(e.kind, ErrorKind::InvalidUtf8 { what: "a metadata key" }));
    assert_eq!(e.offset, Some(key_at as u64 - 8));
}

#[test]
fn duplicates() {
    let mut w = GgufWriter::new();
    w.set("dup.a", 1u8).unwrap();
    w.set("dup.b", 2u8).unwrap();
    let mut b = w.to_bytes(&[]).unwrap();
    let at = b.windows(5).position(|w| w == b"dup.b").unwrap();
    b[at + 4] = b'a';
    let h_offset = (at + 5) as u64;
    let e = err(&b);
    assert!(matches!(&e.kind, ErrorKind::DuplicateKey { key } if key == "dup.a"));
    assert_eq!(e.offset, Some(h_offset));

    let (mut b, h) = seed();
    let t = h.tensors.iter().find(|t| t.name() == "b").unwrap();
    b[t.info_offset() as usize + 8] = b'a';
    let e = err(&b);
    assert!(matches!(&e.kind, ErrorKind::DuplicateTensor { name } if name == "a"), "{e}");
    assert_eq!(e.offset, Some(t.info_offset()));
}

/// Raw header bytes: magic, version 3, counts.
fn raw_header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b
}

fn raw_string(b: &mut Vec<u8>, s: &[u8]) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s);
}

#[test]
fn empty_key_and_empty_tensor_name() {
    let mut b = raw_header(0, 1);
    raw_string(&mut b, b"");
    b.extend_from_slice(&0u32.to_le_bytes());
    b.push(7);
    b.resize(64, 0);
    let e = err(&b);
    assert!(matches!(e.kind, ErrorKind::EmptyString { what: "a metadata key" }));
    assert_eq!(e.offset, Some(24));

    let mut b = raw_header(1, 0);
    raw_string(&mut b, b"");
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&8u64.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.resize(128, 0);
    assert!(matches!(err(&b).kind, ErrorKind::EmptyString { what: "a tensor name" }));
}

#[test]
fn arrays_nested_too_deep() {
    for depth in [8usize, 9, 100_000] {
        let mut b = raw_header(0, 1);
        raw_string(&mut b, b"deep");
        b.extend_from_slice(&9u32.to_le_bytes()); // value type: array
        for _ in 0..depth - 1 {
            b.extend_from_slice(&9u32.to_le_bytes()); // of arrays
            b.extend_from_slice(&1u64.to_le_bytes()); // one element
        }
        b.extend_from_slice(&0u32.to_le_bytes()); // innermost: u8
        b.extend_from_slice(&0u64.to_le_bytes()); // empty
        let r = parse(&b);
        if depth <= 8 {
            let h = r.unwrap();
            assert!(h.metadata.get_array("deep").is_ok());
        } else {
            let e = r.unwrap_err();
            assert!(matches!(e.kind, ErrorKind::ArrayTooDeep { max: 8 }), "{e}");
        }
    }
}
