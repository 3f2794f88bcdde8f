//! Writes GGUF files (version 3, or 2 for tests): metadata of every value type, tensor infos,
//! and tensor data padded to the alignment. Data is streamed tensor by tensor, so a model much
//! larger than memory can be generated; `split` cuts a model into llama.cpp-style parts.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::encode::{array_depth, put_string, put_u32, put_u64, put_value};
use super::error::{ErrorKind, GgufError};
use super::ggml_type::{GgmlType, tensor_bytes};
use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH};
use super::split::{SPLIT_COUNT_KEY, SPLIT_NO_KEY, SPLIT_TENSORS_COUNT_KEY, split_path};
use super::value::Value;

/// What errors name before the writer has a file.
const UNWRITTEN: &str = "(gguf writer)";

/// A tensor declared to the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Bytes of data (without padding).
    pub size: u64,
}

/// Builds a GGUF file: declare metadata and tensors, then write the header and stream the data.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PlannedTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

fn builder_error(kind: ErrorKind) -> GgufError {
    GgufError::new(Path::new(UNWRITTEN), None, kind)
}

fn misuse(problem: String) -> ErrorKind {
    ErrorKind::Writer { problem }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { version: 3, alignment: DEFAULT_ALIGNMENT, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// 3 (the default) or 2; the two differ only in what they promise about byte order.
    pub fn set_version(&mut self, version: u32) -> Result<(), GgufError> {
        if !matches!(version, 2 | 3) {
            return Err(builder_error(ErrorKind::UnsupportedVersion { version }));
        }
        self.version = version;
        Ok(())
    }

    /// Sets `general.alignment` (a power of two that fits in u32).
    pub fn set_alignment(&mut self, alignment: u64) -> Result<(), GgufError> {
        let value = u32::try_from(alignment).ok().filter(|a| a.is_power_of_two());
        let Some(value) = value else {
            return Err(builder_error(ErrorKind::BadAlignment { found: alignment.to_string() }));
        };
        self.set(ALIGNMENT_KEY, Value::U32(value))
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Sets a metadata key, replacing an earlier value in place. `general.alignment` also sets
    /// the alignment the data is written with.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> Result<(), GgufError> {
        let value = value.into();
        if key.is_empty() {
            return Err(builder_error(ErrorKind::EmptyString { what: "a metadata key" }));
        }
        if array_depth(&value) > MAX_ARRAY_DEPTH {
            return Err(builder_error(ErrorKind::ArrayTooDeep { max: MAX_ARRAY_DEPTH }));
        }
        if key == ALIGNMENT_KEY {
            let alignment = value.as_integer().filter(|&a| a > 0 && a <= u32::MAX.into() && (a as u64).is_power_of_two());
            let Some(alignment) = alignment else {
                return Err(builder_error(ErrorKind::BadAlignment { found: format!("{value:?}") }));
            };
            self.alignment = alignment as u64;
        }
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        Ok(())
    }

    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Declares a tensor (data is written later, in declaration order); returns its index.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ggml_type: GgmlType) -> Result<usize, GgufError> {
        if name.is_empty() {
            return Err(builder_error(ErrorKind::EmptyString { what: "a tensor name" }));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(builder_error(ErrorKind::DuplicateTensor { name: name.to_string() }));
        }
        let size =
            tensor_bytes(ggml_type, dims).map_err(|problem| builder_error(ErrorKind::BadShape { tensor: name.to_string(), problem }))?;
        // Offsets are sums of padded sizes; with every tensor padded by less than u32::MAX (the
        // largest alignment), a total under i64::MAX keeps them from overflowing.
        let mut sizes = self.tensors.iter().map(|t| t.size).chain(std::iter::once(size));
        let total = sizes.try_fold(0u64, |acc, s| acc.checked_add(s)?.checked_add(u32::MAX.into()));
        let fits = total.is_some_and(|b| b <= i64::MAX as u64);
        if !fits {
            return Err(builder_error(misuse(format!("tensor {name:?} makes the data section larger than 2^63 bytes"))));
        }
        self.tensors.push(PlannedTensor { name: name.to_string(), dims: dims.to_vec(), ggml_type, size });
        Ok(self.tensors.len() - 1)
    }

    pub fn tensors(&self) -> &[PlannedTensor] {
        &self.tensors
    }

    fn padded(&self, size: u64) -> u64 {
        size.next_multiple_of(self.alignment)
    }

    /// Each tensor's offset in the data section: packed in order, each padded to the alignment.
    pub fn tensor_offsets(&self) -> Vec<u64> {
        let mut offset = 0;
        self.tensors
            .iter()
            .map(|t| {
                let at = offset;
                offset += self.padded(t.size);
                at
            })
            .collect()
    }

    /// The header, padded to the start of the data section.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        put_u32(&mut out, self.version);
        put_u64(&mut out, self.tensors.len() as u64);
        put_u64(&mut out, self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            put_value(&mut out, value);
        }
        for (t, offset) in self.tensors.iter().zip(self.tensor_offsets()) {
            put_string(&mut out, &t.name);
            put_u32(&mut out, t.dims.len() as u32);
            t.dims.iter().for_each(|&d| put_u64(&mut out, d));
            put_u32(&mut out, t.ggml_type.id());
            put_u64(&mut out, offset);
        }
        out.resize(self.padded(out.len() as u64) as usize, 0);
        out
    }

    /// Writes the header to `out` and returns the writer for the tensor data. `path` is what
    /// errors name.
    pub fn begin<W: Write>(&self, mut out: W, path: &Path) -> Result<TensorDataWriter<W>, GgufError> {
        out.write_all(&self.header_bytes()).map_err(|source| io_error(path, "writing the header", source))?;
        let tensors = self.tensors.iter().map(|t| (t.name.clone(), t.size)).collect();
        Ok(TensorDataWriter { out, path: path.to_path_buf(), alignment: self.alignment, tensors, next: 0, written: 0 })
    }

    /// Writes the whole file in memory; `data[i]` is tensor `i`'s bytes.
    pub fn to_bytes(&self, data: &[&[u8]]) -> Result<Vec<u8>, GgufError> {
        let mut w = self.begin(Vec::new(), Path::new("(in memory)"))?;
        self.write_all_data(&mut w, data)?;
        w.finish()
    }

    /// Writes the file `path`; `data[i]` is tensor `i`'s bytes.
    pub fn write_file(&self, path: &Path, data: &[&[u8]]) -> Result<(), GgufError> {
        let file = File::create(path).map_err(|source| io_error(path, "creating the file", source))?;
        let mut w = self.begin(BufWriter::with_capacity(1 << 20, file), path)?;
        self.write_all_data(&mut w, data)?;
        w.finish()?.into_inner().map_err(|e| io_error(path, "writing", e.into_error()))?;
        Ok(())
    }

    fn write_all_data<W: Write>(&self, w: &mut TensorDataWriter<W>, data: &[&[u8]]) -> Result<(), GgufError> {
        if data.len() != self.tensors.len() {
            let problem = format!("{} tensors declared but data for {} given", self.tensors.len(), data.len());
            return Err(GgufError::new(&w.path, None, misuse(problem)));
        }
        data.iter().try_for_each(|d| w.write_tensor(d))
    }

    /// Cuts the model into `count` parts as llama.cpp's gguf-split does: contiguous runs of
    /// tensors balanced by bytes; the first part carries all metadata, every part the split keys
    /// (and the alignment, which each file needs for its own layout).
    pub fn split(&self, count: u32) -> Result<Vec<SplitPart>, GgufError> {
        if count == 0 || count > u16::MAX.into() {
            return Err(builder_error(misuse(format!("a model can be split into 1 to {} parts, not {count}", u16::MAX))));
        }
        if let Some((key, _)) = self.metadata.iter().find(|(k, _)| k.starts_with("split.")) {
            return Err(builder_error(misuse(format!("metadata already has split key {key:?}"))));
        }
        let n_tensors =
            i32::try_from(self.tensors.len()).map_err(|_| builder_error(misuse("too many tensors for split.tensors.count".into())))?;
        let part_of = self.balanced_parts(count);
        let mut parts = Vec::with_capacity(count as usize);
        let mut next = 0;
        for no in 0..count {
            let end = next + part_of[next..].iter().take_while(|&&p| p == no).count();
            let mut writer = GgufWriter { version: self.version, alignment: self.alignment, metadata: Vec::new(), tensors: Vec::new() };
            if no == 0 {
                writer.metadata = self.metadata.clone();
            } else if let Some((_, v)) = self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
                writer.metadata.push((ALIGNMENT_KEY.to_string(), v.clone()));
            }
            writer.set(SPLIT_NO_KEY, Value::U16(no as u16))?;
            writer.set(SPLIT_COUNT_KEY, Value::U16(count as u16))?;
            writer.set(SPLIT_TENSORS_COUNT_KEY, Value::I32(n_tensors))?;
            writer.tensors = self.tensors[next..end].to_vec();
            parts.push(SplitPart { writer, tensors: next..end });
            next = end;
        }
        Ok(parts)
    }

    /// The part each tensor goes to: part `p` holds the tensors that start in the `p`-th
    /// `count`-th of the data.
    fn balanced_parts(&self, count: u32) -> Vec<u32> {
        let total: u128 = self.tensors.iter().map(|t| u128::from(t.size)).sum();
        let mut before: u128 = 0;
        self.tensors
            .iter()
            .map(|t| {
                let part = (before * u128::from(count)).checked_div(total).unwrap_or(0) as u32;
                before += u128::from(t.size);
                part.min(count - 1)
            })
            .collect()
    }

    /// Writes `prefix-00001-of-0000N.gguf` ...; `data[i]` is tensor `i`'s bytes. Returns the
    /// paths in part order.
    pub fn write_split_files(&self, prefix: &Path, count: u32, data: &[&[u8]]) -> Result<Vec<PathBuf>, GgufError> {
        if data.len() != self.tensors.len() {
            let problem = format!("{} tensors declared but data for {} given", self.tensors.len(), data.len());
            return Err(builder_error(misuse(problem)));
        }
        let mut paths = Vec::with_capacity(count as usize);
        for (no, part) in self.split(count)?.into_iter().enumerate() {
            let path = split_path(prefix, no as u32, count);
            part.writer.write_file(&path, &data[part.tensors])?;
            paths.push(path);
        }
        Ok(paths)
    }
}

/// One part of a split model: its writer and which of the whole model's tensors it holds.
#[derive(Clone, Debug)]
pub struct SplitPart {
    pub writer: GgufWriter,
    pub tensors: Range<usize>,
}

fn io_error(path: &Path, during: &'static str, source: std::io::Error) -> GgufError {
    GgufError::new(path, None, ErrorKind::Io { during, source })
}

/// Streams tensor data after the header, in declaration order, padding each tensor.
#[derive(Debug)]
pub struct TensorDataWriter<W: Write> {
    out: W,
    path: PathBuf,
    alignment: u64,
    tensors: Vec<(String, u64)>,
    next: usize,
    /// Bytes of tensor `next` written so far.
    written: u64,
}

impl<W: Write> TensorDataWriter<W> {
    /// The tensor the next bytes belong to, or `None` when all are written.
    pub fn next_tensor(&self) -> Option<&str> {
        self.tensors.get(self.next).map(|(name, _)| name.as_str())
    }

    /// Writes the next piece of the current tensor's data; the tensor ends (and is padded) when
    /// its size is reached. A piece may not run into the next tensor.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let Some((name, size)) = self.tensors.get(self.next) else {
            return Err(GgufError::new(&self.path, None, misuse("data written after the last tensor".into())));
        };
        let (name, size) = (name.clone(), *size);
        if self.written + bytes.len() as u64 > size {
            let kind = ErrorKind::DataSize { tensor: name, expected: size - self.written, found: bytes.len() as u64 };
            return Err(GgufError::new(&self.path, None, kind));
        }
        self.out.write_all(bytes).map_err(|source| io_error(&self.path, "writing tensor data", source))?;
        self.written += bytes.len() as u64;
        if self.written == size {
            let pad = size.next_multiple_of(self.alignment) - size;
            self.write_zeros(pad)?;
            self.next += 1;
            self.written = 0;
        }
        Ok(())
    }

    /// Writes one whole tensor's data.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        if let Some((name, size)) = self.tensors.get(self.next)
            && (self.written != 0 || bytes.len() as u64 != *size)
        {
            let kind = ErrorKind::DataSize { tensor: name.clone(), expected: *size - self.written, found: bytes.len() as u64 };
            return Err(GgufError::new(&self.path, None, kind));
        }
        self.write(bytes)
    }

    fn write_zeros(&mut self, mut n: u64) -> Result<(), GgufError> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while n > 0 {
            let take = n.min(ZEROS.len() as u64) as usize;
            self.out.write_all(&ZEROS[..take]).map_err(|source| io_error(&self.path, "writing padding", source))?;
            n -= take as u64;
        }
        Ok(())
    }

    /// Checks every tensor was written, flushes, and returns the output.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some((name, size)) = self.tensors.get(self.next) {
            let left = self.tensors.len() - self.next;
            let problem = format!("tensor {name:?} has {} of {size} bytes written ({left} tensors unfinished)", self.written);
            return Err(GgufError::new(&self.path, None, misuse(problem)));
        }
        self.out.flush().map_err(|source| io_error(&self.path, "flushing", source))?;
        Ok(self.out)
    }
}
