//! `GgufFile`: one logical model, in one file or split into parts, opened and validated.

use std::fs::File;
use std::io::BufReader;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::error::{ErrorKind, GgufError, SplitProblem};
use super::layout;
use super::metadata::Metadata;
use super::reader::{PartHeader, read_header};
use super::split::{SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY, SplitInfo, parse_split_path, split_path};
use super::tensor::TensorInfo;

/// A GGUF model: the metadata of its first file and the tensors of all its files. Holds the
/// files open for positioned reads of tensor data (see `read_tensor_into`).
#[derive(Debug)]
pub struct GgufFile {
    parts: Vec<GgufPart>,
    tensors: Vec<TensorInfo>,
    /// Tensor indices sorted by name.
    by_name: Vec<u32>,
}

/// One file of a model.
#[derive(Debug)]
pub struct GgufPart {
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    pub(crate) file_len: u64,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Metadata,
    tensors: Range<usize>,
}

impl GgufPart {
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The file's length when it was opened; every tensor lies inside it.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    pub fn data_start(&self) -> u64 {
        self.data_start
    }
    /// This file's own metadata (for parts after the first, usually only the split keys).
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }
    /// Indices into `GgufFile::tensors()` of the tensors stored in this file.
    pub fn tensor_range(&self) -> Range<usize> {
        self.tensors.clone()
    }
}

type OpenPart = (PathBuf, File, PartHeader);

fn open_part(path: &Path, file: File) -> Result<OpenPart, GgufError> {
    let io_err = |during| move |source| GgufError::new(path, None, ErrorKind::Io { during, source });
    let len = file.metadata().map_err(io_err("reading the file's length"))?.len();
    // 1 MiB of buffer: a large vocabulary's header is a few MB of small reads.
    let header = read_header(BufReader::with_capacity(1 << 20, &file), len, path)?;
    Ok((path.to_path_buf(), file, header))
}

impl GgufFile {
    /// Opens a GGUF model. For a split model, `path` may name any part: the other parts are
    /// found by llama.cpp's naming (`-00001-of-00003.gguf`) and checked against each other.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| GgufError::new(path, None, ErrorKind::Io { during: "opening the file", source }))?;
        let first = open_part(path, file)?;
        match SplitInfo::from_metadata(&first.2.metadata)? {
            Some(split) if split.count > 1 => Self::open_split(first, split),
            _ => Self::assemble(vec![first]),
        }
    }

    fn open_split(given: OpenPart, split: SplitInfo) -> Result<Self, GgufError> {
        let path = given.0.clone();
        let split_err = |problem| GgufError::new(&path, None, ErrorKind::Split(problem));
        let (prefix, name_no, name_count) =
            parse_split_path(&path).ok_or_else(|| split_err(SplitProblem::UnnamedSplit { count: split.count }))?;
        if (name_no, name_count) != (split.no, split.count) {
            let (no, count) = (split.no + 1, split.count);
            return Err(split_err(SplitProblem::NameDisagrees { name_no: name_no + 1, name_count, no, count }));
        }
        let mut given = Some(given);
        let mut parts = Vec::with_capacity(split.count as usize);
        for no in 0..split.count {
            if no == split.no {
                parts.extend(given.take());
                continue;
            }
            let part_path = split_path(&prefix, no, split.count);
            let file = File::open(&part_path).map_err(|source| {
                GgufError::new(&part_path, None, ErrorKind::Split(SplitProblem::MissingPart { part: no + 1, count: split.count, source }))
            })?;
            let part = open_part(&part_path, file)?;
            check_part_numbering(&part.2.metadata, no, split.count)?;
            parts.push(part);
        }
        check_tensor_counts(&parts)?;
        Self::assemble(parts)
    }

    fn assemble(parts: Vec<OpenPart>) -> Result<Self, GgufError> {
        let mut tensors = Vec::with_capacity(parts.iter().map(|p| p.2.tensors.len()).sum());
        let mut out = Vec::with_capacity(parts.len());
        for (index, (path, file, header)) in parts.into_iter().enumerate() {
            let start = tensors.len();
            tensors.extend(header.tensors.into_iter().map(|mut t| {
                t.part = index as u32;
                t
            }));
            out.push(GgufPart {
                path,
                file,
                file_len: header.file_len,
                version: header.version,
                alignment: header.alignment,
                data_start: header.data_start,
                metadata: header.metadata,
                tensors: start..tensors.len(),
            });
        }
        let by_name = layout::sorted_by_name(&tensors, |part| &out[part].path)?;
        Ok(GgufFile { parts: out, tensors, by_name })
    }

    /// The first file's path.
    pub fn path(&self) -> &Path {
        &self.parts[0].path
    }

    /// The model's metadata (from its first file).
    pub fn metadata(&self) -> &Metadata {
        &self.parts[0].metadata
    }

    /// The files of the model, in part order (one for an unsplit model).
    pub fn parts(&self) -> &[GgufPart] {
        &self.parts
    }

    /// All tensors, in part order and file order within a part.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let i = self.by_name.binary_search_by(|&i| (*self.tensors[i as usize].name).cmp(name)).ok()?;
        Some(&self.tensors[self.by_name[i] as usize])
    }

    /// Like `tensor`, with an error naming the file and the missing tensor.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::new(self.path(), None, ErrorKind::MissingTensor { name: name.to_string() }))
    }

    /// `general.architecture`, e.g. `qwen3moe`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.metadata().get_str("general.architecture")
    }

    /// Bytes of tensor data in all parts.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }
}

fn mismatch(metadata: &Metadata, key: &'static str, expected: String, found: String) -> GgufError {
    let offset = metadata.entry(key).map(|e| e.offset);
    GgufError::new(metadata.path(), offset, ErrorKind::Split(SplitProblem::PartMismatch { key, expected, found }))
}

/// A part opened by name must say it is that part of that many.
fn check_part_numbering(metadata: &Metadata, no: u32, count: u32) -> Result<(), GgufError> {
    let Some(info) = SplitInfo::from_metadata(metadata)? else {
        return Err(mismatch(metadata, SPLIT_NO_KEY, no.to_string(), "missing".into()));
    };
    if info.count != count {
        return Err(mismatch(metadata, SPLIT_COUNT_KEY, count.to_string(), info.count.to_string()));
    }
    if info.no != no {
        return Err(mismatch(metadata, SPLIT_NO_KEY, no.to_string(), info.no.to_string()));
    }
    Ok(())
}

/// Every part that states `split.tensors.count` must state the same, and the parts must hold
/// that many tensors.
fn check_tensor_counts(parts: &[OpenPart]) -> Result<(), GgufError> {
    let mut declared: Option<u64> = None;
    for (_, _, header) in parts {
        let Some(n) = SplitInfo::from_metadata(&header.metadata)?.and_then(|s| s.tensors_count) else { continue };
        match declared {
            Some(d) if d != n => return Err(mismatch(&header.metadata, SPLIT_TENSORS_COUNT_KEY, d.to_string(), n.to_string())),
            _ => declared = Some(n),
        }
    }
    let found: u64 = parts.iter().map(|p| p.2.tensors.len() as u64).sum();
    match declared {
        Some(declared) if declared != found => {
            let first = &parts[0].2.metadata;
            let offset = first.entry(SPLIT_TENSORS_COUNT_KEY).map(|e| e.offset);
            Err(GgufError::new(&parts[0].0, offset, ErrorKind::Split(SplitProblem::TensorCount { declared, found })))
        }
        _ => Ok(()),
    }
}
