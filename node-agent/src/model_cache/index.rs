//! The cache's index: one JSON file in the cache directory listing every complete model (its
//! sha256, size, source, files, last use and the GGUF header facts). Written to a temporary file
//! and renamed over the old one, so a crash leaves either the old index or the new one.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::CacheError;
use super::header::{HeaderFacts, Unreadable};

pub const INDEX_FILE: &str = "index.json";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Index {
    pub entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The model's key: the sha256 of its (first) file, lowercase hex.
    pub sha256: String,
    /// Bytes on disk, all parts together.
    pub size: u64,
    /// Where it came from (the URLs), for people reading the index.
    pub source: Vec<String>,
    /// File names under `models/`, in part order.
    pub files: Vec<String>,
    /// Unix milliseconds (seconds would tie models fetched one after another).
    pub last_used_ms: u64,
    /// The header's facts, or why they could not be read (the file is kept: it is what the
    /// `Model` asked for, and its status says why brink cannot serve it).
    pub header: Result<HeaderFacts, Unreadable>,
}

impl Index {
    /// The index in `root`, empty when there is none yet.
    pub fn load(root: &Path) -> Result<Index, CacheError> {
        let path = root.join(INDEX_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Index::default()),
            Err(source) => return Err(CacheError::io("reading the index", &path, source)),
        };
        serde_json::from_str(&text).map_err(|e| CacheError::Index { path, message: e.to_string() })
    }

    /// Writes the index atomically (temporary file, fsync, rename).
    pub fn save(&self, root: &Path) -> Result<(), CacheError> {
        let path = root.join(INDEX_FILE);
        let tmp: PathBuf = root.join(format!("{INDEX_FILE}.tmp"));
        let text = serde_json::to_vec_pretty(self).map_err(|e| CacheError::Index { path: path.clone(), message: e.to_string() })?;
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|source| CacheError::io("writing the index", &path, source))
    }

    #[allow(dead_code)] // The tests' reader; the agent looks entries up mutably (`get_mut`).
    pub fn get(&self, sha256: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.sha256 == sha256)
    }

    pub fn get_mut(&mut self, sha256: &str) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.sha256 == sha256)
    }

    /// Adds `entry`, replacing one with the same key.
    pub fn upsert(&mut self, entry: Entry) {
        self.entries.retain(|e| e.sha256 != entry.sha256);
        self.entries.push(entry);
    }

    pub fn remove(&mut self, sha256: &str) -> Option<Entry> {
        let at = self.entries.iter().position(|e| e.sha256 == sha256)?;
        Some(self.entries.remove(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sha: &str, header: Result<HeaderFacts, Unreadable>) -> Entry {
        Entry {
            sha256: sha.into(),
            size: 7,
            source: vec!["http://x/m.gguf".into()],
            files: vec![format!("{sha}.gguf")],
            last_used_ms: 3,
            header,
        }
    }

    #[test]
    fn round_trips_and_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Index::load(dir.path()).unwrap(), Index::default());
        let facts = HeaderFacts {
            arch: "qwen3moe".into(),
            experts: 16,
            top_k: 4,
            shape_class: "qwen3moe-h256-e16-top4-ffn256-0123456789abcdef".into(),
            shape_label: Some("qwen3moe-h256-e16-top4-ffn256".into()),
            quant_types: vec!["f32".into(), "q8_0".into()],
            kv_bytes_per_token: Some(8192),
            kv_window_bytes_per_sequence: Some(0),
        };
        let mut index = Index::default();
        index.upsert(entry("aa", Ok(facts)));
        index.upsert(entry("bb", Err(Unreadable("not a GGUF file".into()))));
        index.save(dir.path()).unwrap();
        assert_eq!(Index::load(dir.path()).unwrap(), index);
        // The reason is kept as the plain string it always was.
        let text = std::fs::read_to_string(dir.path().join(INDEX_FILE)).unwrap();
        assert!(text.contains(r#""Err": "not a GGUF file""#), "{text}");
        assert!(!dir.path().join("index.json.tmp").exists());
        index.upsert(Entry { size: 9, ..entry("aa", Err(Unreadable("x".into()))) });
        assert_eq!(index.entries.len(), 2);
        assert_eq!(index.get("aa").unwrap().size, 9);
        assert_eq!(index.remove("bb").unwrap().sha256, "bb");
        assert!(index.get("bb").is_none());
    }

    #[test]
    fn a_corrupt_index_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(INDEX_FILE), "{ not json").unwrap();
        let e = Index::load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("index.json"), "{e}");
    }
}
