//! Split models: written in N parts, opened from any part, each tensor read from its own file;
//! missing or inconsistent parts are refused with errors naming the part.

mod gguf_common;

use std::path::{Path, PathBuf};

use brink_engine::gguf::{ErrorKind, GgmlType, GgufFile, GgufWriter, KeyProblem, SplitProblem, Value, split_path};
use gguf_common::*;

fn write_split(dir: &Path, count: u32) -> (Vec<PathBuf>, Vec<Vec<u8>>) {
    let (w, data) = sample_model();
    let paths = w.write_split_files(&dir.join("model"), count, &refs(&data)).unwrap();
    (paths, data)
}

#[test]
fn split_round_trip_from_every_part() {
    for count in [1u32, 2, 3, 5, 20] {
        let dir = tempfile::tempdir().unwrap();
        let (paths, data) = write_split(dir.path(), count);
        assert_eq!(paths.len(), count as usize);
        assert_eq!(paths[0].file_name().unwrap().to_str().unwrap(), format!("model-00001-of-{count:05}.gguf"));
        for open_path in &paths {
            let f = GgufFile::open(open_path).unwrap();
            assert_eq!(f.parts().len(), count as usize, "opened {}", open_path.display());
            assert_eq!(f.path(), paths[0]);
            // The model's metadata is the first part's, with the split keys added.
            assert_eq!(f.architecture().unwrap(), "qwen3moe");
            assert_eq!(f.metadata().get_u16("split.count").unwrap(), count as u16);
            assert_eq!(f.metadata().get_i32("split.tensors.count").unwrap(), data.len() as i32);
            for (k, v) in every_value() {
                assert_eq!(f.metadata().get(k), Some(&v), "{k}");
            }
            assert_eq!(f.tensors().len(), data.len());
            for (t, (expected, (name, _, _))) in f.tensors().iter().zip(data.iter().zip(sample_tensors())) {
                assert_eq!(t.name(), name);
                assert!(f.parts()[t.part()].tensor_range().contains(&f.tensors().iter().position(|x| x == t).unwrap()));
                assert_eq!(&f.read_tensor(t).unwrap(), expected, "{name} in part {}", t.part());
            }
            let map = f.map().unwrap();
            for (t, expected) in f.tensors().iter().zip(&data) {
                assert_eq!(map.tensor_bytes(t).unwrap(), expected.as_slice());
            }
        }
        // Balanced: with more tensors than parts, every part holds some.
        let f = GgufFile::open(&paths[0]).unwrap();
        if count as usize <= data.len() {
            assert!(f.parts().iter().all(|p| !p.tensor_range().is_empty()), "count {count}");
        }
        // Later parts carry only the split keys.
        if count > 1 {
            assert_eq!(f.parts()[1].metadata().len(), 3);
        }
    }
}

#[test]
fn custom_alignment_reaches_every_part() {
    let dir = tempfile::tempdir().unwrap();
    let (mut w, data) = sample_model();
    w.set_alignment(128).unwrap();
    let paths = w.write_split_files(&dir.path().join("m"), 3, &refs(&data)).unwrap();
    let f = GgufFile::open(&paths[2]).unwrap();
    for p in f.parts() {
        assert_eq!(p.alignment(), 128);
    }
    for (t, d) in f.tensors().iter().zip(&data) {
        assert_eq!(t.file_offset() % 128, 0);
        assert_eq!(&f.read_tensor(t).unwrap(), d);
    }
}

#[test]
fn missing_part() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = write_split(dir.path(), 3);
    std::fs::remove_file(&paths[1]).unwrap();
    for open in [&paths[0], &paths[2]] {
        let e = GgufFile::open(open).unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Split(SplitProblem::MissingPart { part: 2, count: 3, .. })), "{e}");
        assert_eq!(e.path, paths[1]);
        assert!(e.to_string().contains("part 2 of 3 cannot be opened"), "{e}");
    }
}

#[test]
fn part_with_another_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = write_split(dir.path(), 3);
    // Swap parts 2 and 3: their names no longer match their split.no.
    let tmp = dir.path().join("tmp");
    std::fs::rename(&paths[1], &tmp).unwrap();
    std::fs::rename(&paths[2], &paths[1]).unwrap();
    std::fs::rename(&tmp, &paths[2]).unwrap();
    let e = GgufFile::open(&paths[0]).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Split(SplitProblem::PartMismatch { key: "split.no", .. })), "{e}");
    assert_eq!(e.path, paths[1]);
    let e = GgufFile::open(&paths[1]).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Split(SplitProblem::NameDisagrees { name_no: 2, no: 3, .. })), "{e}");
}

#[test]
fn parts_from_different_splits() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = write_split(dir.path(), 3);
    // Replace part 3 of 3 by part 3 of a 4-way split renamed to fit.
    let other = tempfile::tempdir().unwrap();
    let (other_paths, _) = write_split(other.path(), 4);
    std::fs::copy(&other_paths[2], &paths[2]).unwrap();
    let e = GgufFile::open(&paths[0]).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::Split(SplitProblem::PartMismatch { key: "split.count", expected, found }) if expected == "3" && found == "4")
    );
    assert_eq!(e.path, paths[2]);
}

/// Writes the parts of a split by hand so their split keys can disagree.
fn write_parts(prefix: &Path, parts: &[(u16, u16, Option<i32>, &[&str])]) -> Vec<PathBuf> {
    let count = parts.len() as u32;
    parts
        .iter()
        .enumerate()
        .map(|(i, (no, n, tensors_count, names))| {
            let mut w = GgufWriter::new();
            w.set("general.architecture", "test").unwrap();
            w.set("split.no", Value::U16(*no)).unwrap();
            w.set("split.count", Value::U16(*n)).unwrap();
            if let Some(tc) = tensors_count {
                w.set("split.tensors.count", Value::I32(*tc)).unwrap();
            }
            for name in *names {
                w.add_tensor(name, &[8], GgmlType::F32).unwrap();
            }
            let data = vec![[7u8; 32]; names.len()];
            let data: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let path = split_path(prefix, i as u32, count);
            w.write_file(&path, &data).unwrap();
            path
        })
        .collect()
}

#[test]
fn tensor_counts_must_agree() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("m");
    let p = write_parts(&prefix, &[(0, 2, Some(3), &["a", "b"]), (1, 2, Some(3), &["c"])]);
    let f = GgufFile::open(&p[1]).unwrap();
    assert_eq!(f.tensors().iter().map(|t| (t.name(), t.part())).collect::<Vec<_>>(), [("a", 0), ("b", 0), ("c", 1)]);

    let p = write_parts(&prefix, &[(0, 2, Some(4), &["a", "b"]), (1, 2, Some(4), &["c"])]);
    let e = GgufFile::open(&p[0]).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Split(SplitProblem::TensorCount { declared: 4, found: 3 })), "{e}");

    let p = write_parts(&prefix, &[(0, 2, Some(3), &["a", "b"]), (1, 2, Some(2), &["c"])]);
    let e = GgufFile::open(&p[0]).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Split(SplitProblem::PartMismatch { key: "split.tensors.count", .. })), "{e}");
    assert_eq!(e.path, p[1]);

    // Without split.tensors.count the parts are taken as they are.
    let p = write_parts(&prefix, &[(0, 2, None, &["a"]), (1, 2, None, &["b"])]);
    assert_eq!(GgufFile::open(&p[0]).unwrap().tensors().len(), 2);
}

#[test]
fn duplicate_tensor_across_parts() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_parts(&dir.path().join("m"), &[(0, 2, None, &["a", "b"]), (1, 2, None, &["b"])]);
    let e = GgufFile::open(&p[0]).unwrap_err();
    assert!(matches!(&e.kind, ErrorKind::DuplicateTensor { name } if name == "b"), "{e}");
    assert_eq!(e.path, p[1]);
}

#[test]
fn bad_split_keys() {
    let dir = tempfile::tempdir().unwrap();
    // split.no not below split.count.
    let p = write_parts(&dir.path().join("m"), &[(2, 2, None, &["a"]), (1, 2, None, &["b"])]);
    let e = GgufFile::open(&p[0]).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Split(SplitProblem::BadNumbering { no: 2, count: 2 })), "{e}");
    // split.count without split.no.
    let path = dir.path().join("lone.gguf");
    let mut w = GgufWriter::new();
    w.set("split.count", Value::U16(2)).unwrap();
    w.write_file(&path, &[]).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(matches!(&e.kind, ErrorKind::Metadata { key, problem: KeyProblem::Missing } if key == "split.no"), "{e}");
    // split.count of a string type.
    let mut w = GgufWriter::new();
    w.set("split.no", Value::U16(0)).unwrap();
    w.set("split.count", "two").unwrap();
    w.write_file(&path, &[]).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(matches!(&e.kind, ErrorKind::Metadata { problem: KeyProblem::WrongType { .. }, .. }), "{e}");
}

#[test]
fn a_split_part_under_another_name() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = write_split(dir.path(), 2);
    let renamed = dir.path().join("renamed.gguf");
    std::fs::copy(&paths[0], &renamed).unwrap();
    let e = GgufFile::open(&renamed).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Split(SplitProblem::UnnamedSplit { count: 2 })), "{e}");
    // A single file that happens to have a split-like name is just a file.
    let single = dir.path().join("x-00001-of-00002.gguf");
    GgufWriter::new().write_file(&single, &[]).unwrap();
    assert_eq!(GgufFile::open(&single).unwrap().parts().len(), 1);
}

#[test]
fn writer_split_limits() {
    let (w, _) = sample_model();
    assert!(matches!(w.split(0).unwrap_err().kind, ErrorKind::Writer { .. }));
    assert!(matches!(w.split(70_000).unwrap_err().kind, ErrorKind::Writer { .. }));
    let mut w2 = w.clone();
    w2.set("split.no", Value::U16(0)).unwrap();
    assert!(matches!(w2.split(2).unwrap_err().kind, ErrorKind::Writer { .. }));
    // Parts cover the tensors in order, contiguously.
    let parts = w.split(4).unwrap();
    assert_eq!(parts.first().unwrap().tensors.start, 0);
    assert_eq!(parts.last().unwrap().tensors.end, w.tensors().len());
    for pair in parts.windows(2) {
        assert_eq!(pair[0].tensors.end, pair[1].tensors.start);
    }
}
