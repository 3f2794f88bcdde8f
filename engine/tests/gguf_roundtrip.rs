//! Write with our writer, read with our reader: identical metadata (every value type, in order)
//! and identical tensor bytes through every read path.

mod gguf_common;

use brink_engine::gguf::{Array, ErrorKind, GgmlType, GgufFile, GgufWriter, KeyProblem, Value};
use gguf_common::*;

fn assert_same_metadata(read: &brink_engine::gguf::Metadata, expected: &[(&str, Value)]) {
    let got: Vec<(&str, &Value)> = read.iter().collect();
    assert_eq!(got.len(), expected.len());
    for ((k, v), (ek, ev)) in got.iter().zip(expected) {
        assert_eq!(k, ek);
        assert_eq!(*v, ev, "{k}");
        assert_eq!(v.value_type(), ev.value_type(), "{k}");
    }
}

#[test]
fn every_value_type_and_tensor_type_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    let (w, data) = sample_model();
    w.write_file(&path, &refs(&data)).unwrap();

    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.parts().len(), 1);
    assert_eq!(f.parts()[0].version(), 3);
    assert_eq!(f.parts()[0].alignment(), 32);
    assert_same_metadata(f.metadata(), &every_value());
    assert_eq!(f.architecture().unwrap(), "qwen3moe");

    let map = f.map().unwrap();
    assert_eq!(f.tensors().len(), data.len());
    for ((t, (name, dims, ty)), bytes) in f.tensors().iter().zip(sample_tensors()).zip(&data) {
        assert_eq!((t.name(), t.dims(), t.ggml_type()), (name, dims.as_slice(), ty));
        assert_eq!(t.size(), bytes.len() as u64);
        assert_eq!(t.file_offset() % 32, 0);
        assert_eq!(f.tensor(name).unwrap(), t);
        let mut buf = vec![0u8; bytes.len()];
        f.read_tensor_into(t, &mut buf).unwrap();
        assert_eq!(&buf, bytes, "{name}");
        assert_eq!(&f.read_tensor(t).unwrap(), bytes);
        assert_eq!(map.tensor_bytes(t).unwrap(), bytes.as_slice());
        // A range in the middle of the tensor.
        let (start, len) = (bytes.len() / 3, bytes.len() / 2);
        let mut part = vec![0u8; len];
        f.read_tensor_range_into(t, start as u64, &mut part).unwrap();
        assert_eq!(part, bytes[start..start + len]);
    }
    assert!(f.tensor("nope").is_none());
    assert!(matches!(f.require_tensor("nope").unwrap_err().kind, ErrorKind::MissingTensor { .. }));
}

#[test]
fn shapes_are_reported_in_ggml_order() {
    let (w, data) = sample_model();
    let bytes = w.to_bytes(&refs(&data)).unwrap();
    let h = parse(&bytes).unwrap();
    let t = h.tensors.iter().find(|t| t.name() == "blk.0.ffn_up_exps.weight").unwrap();
    assert_eq!(t.dims(), &[32, 3, 2, 2]);
    assert_eq!(t.ne(), [32, 3, 2, 2]);
    assert_eq!(t.n_elements(), 384);
    assert_eq!(t.row_len(), 32);
    assert_eq!(t.row_bytes(), 34);
    assert_eq!(t.n_rows(), 12);
    let t = h.tensors.iter().find(|t| t.name() == "blk.0.attn_norm.weight").unwrap();
    assert_eq!(t.ne(), [64, 1, 1, 1]);
}

#[test]
fn nan_payloads_survive() {
    let mut w = GgufWriter::new();
    let nan32 = f32::from_bits(0x7fc0_1234);
    let nan64 = f64::from_bits(0xfff8_0000_dead_beef);
    w.set("nan32", nan32).unwrap();
    w.set("nan64", nan64).unwrap();
    w.set("nans", vec![nan32]).unwrap();
    let h = parse(&w.to_bytes(&[]).unwrap()).unwrap();
    let Some(Value::F32(x)) = h.metadata.get("nan32") else { panic!() };
    assert_eq!(x.to_bits(), nan32.to_bits());
    let Some(Value::F64(x)) = h.metadata.get("nan64") else { panic!() };
    assert_eq!(x.to_bits(), nan64.to_bits());
    assert_eq!(h.metadata.get_array("nans").unwrap().as_f32().unwrap()[0].to_bits(), nan32.to_bits());
}

#[test]
fn version_2_and_custom_alignments_round_trip() {
    for version in [2, 3] {
        for alignment in [1u64, 8, 32, 64, 4096] {
            let bytes = small_model(alignment, version);
            let h = parse(&bytes).unwrap();
            assert_eq!((h.version, h.alignment), (version, alignment));
            assert_eq!(h.data_start % alignment, 0);
            for t in &h.tensors {
                assert_eq!(t.file_offset() % alignment, 0);
            }
            if alignment != 32 {
                assert_eq!(h.metadata.get_u32("general.alignment").unwrap() as u64, alignment);
            }
        }
    }
}

#[test]
fn a_file_without_tensors_or_metadata_is_valid() {
    let bytes = GgufWriter::new().to_bytes(&[]).unwrap();
    assert_eq!(bytes.len(), 32, "24-byte header padded to 32");
    let h = parse(&bytes).unwrap();
    assert!(h.metadata.is_empty() && h.tensors.is_empty());
    // The bare 24-byte header (no padding) is also a valid file.
    let h = parse(&bytes[..24]).unwrap();
    assert!(h.tensors.is_empty());
}

#[test]
fn streamed_data_in_pieces_equals_whole_tensors() {
    let (w, data) = sample_model();
    let whole = w.to_bytes(&refs(&data)).unwrap();
    let mut s = w.begin(Vec::new(), std::path::Path::new("s.gguf")).unwrap();
    for d in &data {
        for piece in d.chunks(7) {
            s.write(piece).unwrap();
        }
    }
    assert_eq!(s.next_tensor(), None);
    assert_eq!(s.finish().unwrap(), whole);
}

#[test]
fn getters_convert_and_name_key_and_types() {
    let (w, data) = sample_model();
    let h = parse(&w.to_bytes(&refs(&data)).unwrap()).unwrap();
    let m = &h.metadata;
    assert_eq!(m.get_u32("t.u8").unwrap(), 0xfe);
    assert_eq!(m.get_i64("t.u32").unwrap(), 0xdead_beef);
    assert_eq!(m.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(m.get_str("t.string").unwrap(), "héllo, 世界 \u{1F600}");
    assert_eq!(m.get_f64("t.f32_inf").unwrap(), f64::INFINITY);
    assert!(m.get_bool("t.bool_true").unwrap());
    assert_eq!(m.get_str_array("t.arr_string").unwrap().len(), 3);
    assert_eq!(m.get_int_array("t.arr_i16").unwrap(), vec![-2, 2]);
    let nested = m.get_array("t.arr_nested").unwrap().as_arrays().unwrap();
    assert_eq!(nested[0], Array::U32(vec![1, 2]));

    let e = m.get_u8("t.u16").unwrap_err();
    assert!(matches!(&e.kind, ErrorKind::Metadata { key, problem: KeyProblem::OutOfRange { expected: "u8", .. } } if key == "t.u16"));
    let e = m.get_u32("t.i8").unwrap_err();
    assert_eq!(e.to_string(), format!("mem.gguf at byte {}: metadata key \"t.i8\": value -128 does not fit in u32", e.offset.unwrap()));
    let e = m.get_u32("t.string").unwrap_err();
    assert!(e.to_string().ends_with("metadata key \"t.string\": expected u32, found string"), "{e}");
    let e = m.get_str("t.arr_u8").unwrap_err();
    assert!(e.to_string().ends_with("expected string, found array of u8"), "{e}");
    let e = m.get_u32("qwen3moe.block_count").unwrap_err();
    assert_eq!(e.to_string(), "mem.gguf: metadata key \"qwen3moe.block_count\": missing");
}

#[test]
fn writer_refuses_what_the_reader_would() {
    let mut w = GgufWriter::new();
    assert!(matches!(w.set("", 1u8).unwrap_err().kind, ErrorKind::EmptyString { .. }));
    assert!(matches!(w.set_alignment(48).unwrap_err().kind, ErrorKind::BadAlignment { .. }));
    assert!(matches!(w.set_alignment(1 << 32).unwrap_err().kind, ErrorKind::BadAlignment { .. }));
    assert!(matches!(w.set("general.alignment", "x").unwrap_err().kind, ErrorKind::BadAlignment { .. }));
    assert!(matches!(w.set_version(1).unwrap_err().kind, ErrorKind::UnsupportedVersion { version: 1 }));
    let mut deep = Array::U8(vec![]);
    for _ in 0..8 {
        deep = Array::Array(vec![deep]);
    }
    assert!(matches!(w.set("deep", deep).unwrap_err().kind, ErrorKind::ArrayTooDeep { .. }));
    assert!(matches!(w.add_tensor("", &[32], GgmlType::F32).unwrap_err().kind, ErrorKind::EmptyString { .. }));
    assert!(matches!(w.add_tensor("x", &[48], GgmlType::Q8_0).unwrap_err().kind, ErrorKind::BadShape { .. }));
    assert!(matches!(w.add_tensor("x", &[1, 1, 1, 1, 1], GgmlType::F32).unwrap_err().kind, ErrorKind::BadShape { .. }));
    assert!(matches!(w.add_tensor("x", &[1 << 62], GgmlType::F32).unwrap_err().kind, ErrorKind::BadShape { .. }));
    assert!(matches!(w.add_tensor("x", &[1 << 60], GgmlType::F64).unwrap_err().kind, ErrorKind::Writer { .. }));
    w.add_tensor("x", &[32], GgmlType::Q8_0).unwrap();
    assert!(matches!(w.add_tensor("x", &[32], GgmlType::F32).unwrap_err().kind, ErrorKind::DuplicateTensor { .. }));
    // Wrong data sizes and unfinished data.
    assert!(matches!(w.to_bytes(&[&[0u8; 33]]).unwrap_err().kind, ErrorKind::DataSize { expected: 34, found: 33, .. }));
    assert!(matches!(w.to_bytes(&[]).unwrap_err().kind, ErrorKind::Writer { .. }));
    let mut s = w.begin(Vec::new(), std::path::Path::new("x.gguf")).unwrap();
    s.write(&[0u8; 10]).unwrap();
    assert!(matches!(s.write(&[0u8; 25]).unwrap_err().kind, ErrorKind::DataSize { expected: 24, found: 25, .. }));
    let e = s.finish().unwrap_err();
    assert!(e.to_string().contains("has 10 of 34 bytes written"), "{e}");
    // Replacing a key keeps its place.
    w.set("a", 1u8).unwrap();
    w.set("b", 2u8).unwrap();
    w.set("a", 3u8).unwrap();
    assert_eq!(w.metadata().iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["a", "b"]);
}

#[test]
fn reads_refuse_wrong_buffers_and_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, small_model(32, 3)).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor("a").unwrap();
    let mut small = vec![0u8; t.size() as usize - 1];
    assert!(matches!(f.read_tensor_into(t, &mut small).unwrap_err().kind, ErrorKind::DataSize { .. }));
    let mut two = [0u8; 2];
    assert!(matches!(f.read_tensor_range_into(t, t.size() - 1, &mut two).unwrap_err().kind, ErrorKind::RangeOutsideTensor { .. }));
    assert!(matches!(f.read_tensor_range_into(t, u64::MAX, &mut two).unwrap_err().kind, ErrorKind::RangeOutsideTensor { .. }));
    // A tensor of another, longer file does not read out of this one.
    let other_path = dir.path().join("big.gguf");
    let mut w = GgufWriter::new();
    w.add_tensor("pad", &[4096], GgmlType::F32).unwrap();
    w.add_tensor("a", &[32, 2], GgmlType::Q8_0).unwrap();
    w.write_file(&other_path, &[&[0u8; 16384], &[0u8; 68]]).unwrap();
    let other = GgufFile::open(&other_path).unwrap();
    let foreign = other.tensor("a").unwrap();
    let mut buf = vec![0u8; foreign.size() as usize];
    assert!(matches!(f.read_tensor_into(foreign, &mut buf).unwrap_err().kind, ErrorKind::ForeignTensor { .. }));
    assert!(matches!(f.map().unwrap().tensor_bytes(foreign).unwrap_err().kind, ErrorKind::ForeignTensor { .. }));
}

#[test]
fn open_names_the_file_when_it_is_missing() {
    let e = GgufFile::open("/nonexistent/dir/model.gguf").unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Io { .. }));
    assert!(e.to_string().starts_with("/nonexistent/dir/model.gguf: I/O error while opening the file"), "{e}");
}
