//! Reading tensor data.
//!
//! The default path is a positioned read (`pread`) straight into a buffer the caller owns —
//! pinned host memory, a device staging buffer — so the model is never held twice and no page
//! faults are taken per 4 KiB as with mmap-then-copy. A memory map is offered as an option for
//! callers that want zero-copy views of a file that will not change underneath them.

use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};

use super::error::{ErrorKind, GgufError};
use super::file::{GgufFile, GgufPart};
use super::tensor::TensorInfo;

/// Largest single read. Linux caps one read at ~2 GiB; smaller chunks also keep each
/// syscall short.
const READ_CHUNK: usize = 64 << 20;

impl GgufFile {
    fn part_of(&self, t: &TensorInfo, start: u64, len: u64) -> Result<(&GgufPart, u64), GgufError> {
        let range_err = || ErrorKind::RangeOutsideTensor { tensor: t.name.to_string(), start, len, size: t.size };
        if start.checked_add(len).is_none_or(|end| end > t.size) {
            return Err(GgufError::new(self.path(), Some(t.info_offset), range_err()));
        }
        // A TensorInfo from another GgufFile could point anywhere: check it against this one.
        let part = self.parts().get(t.part());
        let abs = t.file_offset.checked_add(start);
        match (part, abs) {
            (Some(part), Some(abs)) if abs.checked_add(len).is_some_and(|end| end <= part.file_len) => Ok((part, abs)),
            _ => {
                let (part_len, path) = part.map_or((0, self.path()), |p| (p.file_len, p.path()));
                let kind = ErrorKind::ForeignTensor {
                    tensor: t.name.to_string(),
                    part: t.part,
                    start: t.file_offset,
                    end: t.file_offset.saturating_add(t.size),
                    part_len,
                };
                Err(GgufError::new(path, Some(t.info_offset), kind))
            }
        }
    }

    /// Reads all of `t`'s bytes into `dst`, which must be exactly `t.size()` bytes.
    pub fn read_tensor_into(&self, t: &TensorInfo, dst: &mut [u8]) -> Result<(), GgufError> {
        if dst.len() as u64 != t.size {
            let kind = ErrorKind::DataSize { tensor: t.name.to_string(), expected: t.size, found: dst.len() as u64 };
            return Err(GgufError::new(self.path(), Some(t.info_offset), kind));
        }
        self.read_tensor_range_into(t, 0, dst)
    }

    /// Reads `dst.len()` bytes of `t`'s data starting `start` bytes into it (e.g. one expert's
    /// rows of a stacked expert tensor).
    pub fn read_tensor_range_into(&self, t: &TensorInfo, start: u64, dst: &mut [u8]) -> Result<(), GgufError> {
        let (part, abs) = self.part_of(t, start, dst.len() as u64)?;
        read_chunked(part, abs, dst, READ_CHUNK)
    }

    /// `t`'s bytes in a new buffer.
    pub fn read_tensor(&self, t: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        // The size was checked against the file's length, so this allocation is bounded by it.
        let mut buf = vec![0u8; t.size as usize];
        self.read_tensor_into(t, &mut buf)?;
        Ok(buf)
    }

    /// Maps every part of the model read-only.
    pub fn map(&self) -> Result<MappedGguf, GgufError> {
        let mut maps = Vec::with_capacity(self.parts().len());
        for part in self.parts() {
            // SAFETY: the map is read-only and private to this process. If another process
            // truncates or rewrites the file while it is mapped, reads through the map see the
            // change or fault (SIGBUS) — the caveat of every mmap-based loader, and why the
            // positioned reads above are the default way to load.
            let map = unsafe { MmapOptions::new().map(&part.file) }
                .map_err(|source| GgufError::new(part.path(), None, ErrorKind::Io { during: "mapping the file", source }))?;
            if (map.len() as u64) < part.file_len {
                let kind = ErrorKind::Truncated { what: "the mapped file", needed: part.file_len, file_len: map.len() as u64 };
                return Err(GgufError::new(part.path(), Some(0), kind));
            }
            maps.push((part.path().to_path_buf(), map));
        }
        Ok(MappedGguf { maps })
    }
}

fn read_chunked(part: &GgufPart, offset: u64, dst: &mut [u8], chunk: usize) -> Result<(), GgufError> {
    for (i, piece) in dst.chunks_mut(chunk).enumerate() {
        let at = offset + (i * chunk) as u64;
        read_exact_at(part, piece, at)
            .map_err(|source| GgufError::at(part.path(), at, ErrorKind::Io { during: "reading tensor data", source }))?;
    }
    Ok(())
}

/// A read-only memory map of every part of a model.
#[derive(Debug)]
pub struct MappedGguf {
    maps: Vec<(PathBuf, Mmap)>,
}

impl MappedGguf {
    /// `t`'s bytes, borrowed from the map.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let bytes = self.maps.get(t.part()).and_then(|(_, m)| {
            let start = usize::try_from(t.file_offset).ok()?;
            m.get(start..start.checked_add(usize::try_from(t.size).ok()?)?)
        });
        bytes.ok_or_else(|| {
            let kind = ErrorKind::ForeignTensor {
                tensor: t.name.to_string(),
                part: t.part,
                start: t.file_offset,
                end: t.file_offset.saturating_add(t.size),
                part_len: self.maps.get(t.part()).map_or(0, |(_, m)| m.len() as u64),
            };
            let path = self.maps.get(t.part()).or(self.maps.first()).map_or(Path::new(""), |(p, _)| p);
            GgufError::new(path, Some(t.info_offset), kind)
        })
    }
}

#[cfg(unix)]
fn read_exact_at(part: &GgufPart, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(&part.file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(part: &GgufPart, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match part.file.seek_read(buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Portable fallback: seek, then read, on a handle opened for this read (a cloned handle
/// would share the file position with concurrent readers).
#[cfg(not(any(unix, windows)))]
fn read_exact_at(part: &GgufPart, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut own = std::fs::File::open(part.path())?;
    own.seek(SeekFrom::Start(offset))?;
    own.read_exact(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgmlType, GgufWriter};

    #[test]
    fn chunked_reads_stitch_together_and_fail_past_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut w = GgufWriter::new();
        w.add_tensor("t", &[1000], GgmlType::F32).unwrap();
        let data: Vec<u8> = (0..4000u32).map(|i| (i * 7 % 256) as u8).collect();
        w.write_file(&path, &[&data]).unwrap();
        let f = GgufFile::open(&path).unwrap();
        let (t, part) = (&f.tensors()[0], &f.parts()[0]);
        for chunk in [1, 7, 4096] {
            let mut buf = vec![0u8; 4000];
            read_chunked(part, t.file_offset(), &mut buf, chunk).unwrap();
            assert_eq!(buf, data, "chunk {chunk}");
        }
        // The file shrinks after opening: an I/O error at the offset, not a panic.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(t.file_offset() + 100).unwrap();
        let mut buf = vec![0u8; 4000];
        let e = f.read_tensor_into(t, &mut buf).unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Io { .. }), "{e}");
        assert_eq!(e.offset, Some(t.file_offset()));
    }
}
