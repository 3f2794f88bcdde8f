//! A little-endian cursor over a GGUF header that knows how many bytes the file has left.
//!
//! Every read checks the remaining length first, and every count is checked against what the
//! remaining bytes could hold before anything is allocated for it: a hostile header claiming
//! 2^60 entries fails here instead of asking the allocator for exabytes.

use std::io::Read;
use std::path::Path;

use super::error::{ErrorKind, GgufError};

pub(crate) struct Cursor<'p, R> {
    src: R,
    pos: u64,
    len: u64,
    path: &'p Path,
}

impl<'p, R: Read> Cursor<'p, R> {
    /// `src` yields the file from byte 0; `len` is the file's length.
    pub fn new(src: R, len: u64, path: &'p Path) -> Self {
        Cursor { src, pos: 0, len, path }
    }

    pub fn pos(&self) -> u64 {
        self.pos
    }

    pub fn path(&self) -> &'p Path {
        self.path
    }

    pub fn remaining(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    pub fn error(&self, offset: u64, kind: ErrorKind) -> GgufError {
        GgufError::at(self.path, offset, kind)
    }

    fn need(&self, n: u64, what: &'static str) -> Result<(), GgufError> {
        if n > self.remaining() {
            return Err(self.error(self.pos, ErrorKind::Truncated { what, needed: n, file_len: self.len }));
        }
        Ok(())
    }

    pub fn read_into(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), GgufError> {
        self.need(buf.len() as u64, what)?;
        self.src.read_exact(buf).map_err(|source| self.error(self.pos, ErrorKind::Io { during: "reading the header", source }))?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    pub fn bytes<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.read_into(&mut b, what)?;
        Ok(b)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.bytes::<1>(what)?[0])
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }

    /// `count` items of at least `min_each` bytes each must fit in the rest of the file.
    /// `offset` is where the count was read, so the error points at it.
    pub fn bounded_count(&self, count: u64, min_each: u64, offset: u64, what: &'static str) -> Result<usize, GgufError> {
        let remaining = self.remaining();
        let max = remaining / min_each.max(1);
        if count > max {
            return Err(self.error(offset, ErrorKind::CountTooLarge { what, count, remaining, max }));
        }
        // count <= remaining <= u64::MAX; on 32-bit targets it must also fit in memory.
        usize::try_from(count).map_err(|_| self.error(offset, ErrorKind::CountTooLarge { what, count, remaining, max }))
    }

    /// A GGUF string: u64 length, then that many bytes of UTF-8.
    pub fn string(&mut self, what: &'static str) -> Result<Box<str>, GgufError> {
        let start = self.pos;
        let len = self.u64(what)?;
        let len = self.bounded_count(len, 1, start, what)?;
        let mut buf = vec![0u8; len];
        self.read_into(&mut buf, what)?;
        String::from_utf8(buf).map(String::into_boxed_str).map_err(|_| self.error(start, ErrorKind::InvalidUtf8 { what }))
    }

    /// `n` fixed-size little-endian values (`n` already bounded), decoded through a small
    /// stack buffer so the only allocation is the result.
    pub fn le_values<T, const N: usize>(&mut self, n: usize, decode: fn([u8; N]) -> T, what: &'static str) -> Result<Vec<T>, GgufError> {
        let mut out = Vec::with_capacity(n);
        let mut buf = [0u8; 4096];
        let per_chunk = buf.len() / N;
        let mut left = n;
        while left > 0 {
            let take = left.min(per_chunk);
            let chunk = &mut buf[..take * N];
            self.read_into(chunk, what)?;
            out.extend(chunk.chunks_exact(N).map(|c| {
                let mut b = [0u8; N];
                b.copy_from_slice(c);
                decode(b)
            }));
            left -= take;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded_by_the_file_length() {
        let data = [1u8, 0, 0, 0, 0xff];
        let mut c = Cursor::new(&data[..], data.len() as u64, Path::new("f"));
        assert_eq!(c.u32("x").unwrap(), 1);
        let e = c.u32("y").unwrap_err();
        assert!(matches!(e.kind, ErrorKind::Truncated { needed: 4, file_len: 5, .. }));
        assert_eq!(e.offset, Some(4));
        assert_eq!(c.u8("z").unwrap(), 0xff);
    }

    #[test]
    fn counts_are_bounded_before_allocation() {
        let data = [0u8; 16];
        let c = Cursor::new(&data[..], 16, Path::new("f"));
        assert_eq!(c.bounded_count(4, 4, 0, "x").unwrap(), 4);
        assert!(matches!(c.bounded_count(5, 4, 0, "x").unwrap_err().kind, ErrorKind::CountTooLarge { max: 4, .. }));
        assert!(c.bounded_count(u64::MAX, 1, 0, "x").is_err());
    }

    #[test]
    fn le_values_decode_across_chunks() {
        let data: Vec<u8> = (0u32..3000).flat_map(|v| v.to_le_bytes()).collect();
        let mut c = Cursor::new(&data[..], data.len() as u64, Path::new("f"));
        let v = c.le_values(3000, u32::from_le_bytes, "v").unwrap();
        assert_eq!(v, (0..3000).collect::<Vec<_>>());
    }
}
