//! Split models as llama.cpp's `gguf-split` writes them: `model-00001-of-00003.gguf` ...; each
//! part is a complete GGUF file whose metadata has `split.no` (0-based), `split.count` and
//! `split.tensors.count`; the first part carries the model's metadata.

use std::path::{Path, PathBuf};

use super::error::{ErrorKind, GgufError, SplitProblem};
use super::metadata::Metadata;

pub const SPLIT_NO_KEY: &str = "split.no";
pub const SPLIT_COUNT_KEY: &str = "split.count";
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";

/// What one part's metadata says about the split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitInfo {
    /// 0-based part number.
    pub no: u32,
    pub count: u32,
    /// Tensors in all parts together, where the part says.
    pub tensors_count: Option<u64>,
}

impl SplitInfo {
    /// `Ok(None)` for a file without split keys; `split.no` and `split.count` come together.
    pub fn from_metadata(metadata: &Metadata) -> Result<Option<SplitInfo>, GgufError> {
        if !metadata.contains(SPLIT_NO_KEY) && !metadata.contains(SPLIT_COUNT_KEY) {
            return Ok(None);
        }
        let no = metadata.get_u32(SPLIT_NO_KEY)?;
        let count = metadata.get_u32(SPLIT_COUNT_KEY)?;
        let tensors_count = metadata.optional(SPLIT_TENSORS_COUNT_KEY, Metadata::get_u64)?;
        if no >= count {
            let offset = metadata.entry(SPLIT_NO_KEY).map(|e| e.offset);
            return Err(GgufError::new(metadata.path(), offset, ErrorKind::Split(SplitProblem::BadNumbering { no, count })));
        }
        Ok(Some(SplitInfo { no, count, tensors_count }))
    }
}

/// The path of part `no` (0-based) of `count`: `{prefix}-{no+1:05}-of-{count:05}.gguf`, as
/// llama.cpp names them.
pub fn split_path(prefix: &Path, no: u32, count: u32) -> PathBuf {
    let mut name = prefix.as_os_str().to_owned();
    name.push(format!("-{:05}-of-{:05}.gguf", u64::from(no) + 1, count));
    PathBuf::from(name)
}

/// Splits a part's path into (prefix, 0-based part number, part count), or `None` when its
/// name does not follow the `-NNNNN-of-NNNNN.gguf` pattern.
pub fn parse_split_path(path: &Path) -> Option<(PathBuf, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let number = |s: &str| -> Option<u32> {
        if s.len() < 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (no, count) = (number(no)?, number(count)?);
    if prefix.is_empty() || no == 0 || no > count {
        return None;
    }
    Some((path.with_file_name(prefix), no - 1, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let p = split_path(Path::new("/m/qwen-30b"), 1, 3);
        assert_eq!(p, Path::new("/m/qwen-30b-00002-of-00003.gguf"));
        assert_eq!(parse_split_path(&p), Some((PathBuf::from("/m/qwen-30b"), 1, 3)));
        assert_eq!(parse_split_path(Path::new("m-00001-of-00001.gguf")), Some((PathBuf::from("m"), 0, 1)));
    }

    #[test]
    fn other_names_are_not_splits() {
        for name in
            ["m.gguf", "m-1-of-3.gguf", "m-00000-of-00003.gguf", "m-00004-of-00003.gguf", "-00001-of-00003.gguf", "m-00001-of-00003.bin"]
        {
            assert_eq!(parse_split_path(Path::new(name)), None, "{name}");
        }
    }
}
