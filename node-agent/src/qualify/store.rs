//! Keeping the node's qualification files (a cached qualification, the last qualified shape, the
//! negative controls' proof, a replica's result and report): JSON written to a temporary file
//! and renamed over the old one, so a reader or a crash never sees half of one. Every error
//! names the file.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// A file that could not be kept, and which step failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: cannot create the directory: {source}", path.display())]
    Folder {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot serialise: {source}", path.display())]
    Serialise {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// `path`: the temporary file.
    #[error("{}: cannot write: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: cannot replace with {}: {source}", path.display(), tmp.display())]
    Replace {
        path: PathBuf,
        tmp: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes `value` as JSON to `path` (creating its directory) through `path.tmp` and a rename.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Folder { path: dir.to_path_buf(), source })?;
    }
    let json = serde_json::to_string_pretty(value).map_err(|source| StoreError::Serialise { path: path.to_path_buf(), source })?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, json).map_err(|source| StoreError::Write { path: tmp.clone(), source })?;
    std::fs::rename(&tmp, path).map_err(|source| StoreError::Replace { path: path.to_path_buf(), tmp, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_through_a_rename_and_names_the_file_that_failed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qualifications").join("q.json");
        write_json(&path, &serde_json::json!({"schema": 1})).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\n  \"schema\": 1\n}");
        assert!(!dir.path().join("qualifications/q.json.tmp").exists());
        // A file where the directory should be.
        let blocked = path.join("inner.json");
        let e = write_json(&blocked, &1).unwrap_err();
        assert!(matches!(&e, StoreError::Folder { path: p, .. } if p == &path), "{e:?}");
        assert!(e.to_string().starts_with(&format!("{}: cannot create the directory: ", path.display())), "{e}");
        // A directory where the file should be.
        let e = write_json(&dir.path().join("qualifications"), &1).unwrap_err();
        assert!(matches!(&e, StoreError::Replace { .. }), "{e:?}");
        assert!(e.to_string().contains("cannot replace with"), "{e}");
    }
}
