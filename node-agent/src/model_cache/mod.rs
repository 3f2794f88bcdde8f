//! The node's model cache: the machinery `brink-agent run` uses to make a `Model` available on
//! this node.
//!
//! Layout under the cache root:
//! - `partial/<sha256>.part`: a download in progress, resumed from its length;
//! - `models/<sha256>.gguf` (or `<sha256>-00001-of-0000N.gguf` for the parts of a split model,
//!   llama.cpp's naming, which the engine's reader follows): verified models, moved in by rename;
//! - `index.json`: the entries (see [`index`]), written atomically.
//!
//! A local source (a node path or a mounted PVC) is verified and used in place: it is not copied
//! and never evicted, and it does not count against the budget (the cache does not own it).
//!
//! - [`evict`]: the pure disk-budget decision;
//! - [`download`]: one file over http(s) with resume and sha256;
//! - [`header`]: the GGUF facts a `Model`'s status carries ([`kv_size`]: the KV bytes per token);
//! - [`remote_header`]: the header of a file over http(s) by `Range` requests, for
//!   [`ModelCache::probe`], which reads a Model's facts without downloading it (a local source
//!   is read in place); its sparse scratch files live in `probe/<sha256>/` while it runs;
//! - [`index`], [`source`], [`error`].

pub mod download;
pub mod error;
pub mod evict;
pub mod header;
pub mod index;
pub mod kv_size;
pub mod remote_header;
pub mod source;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use download::Progress;
pub use error::CacheError;
pub use header::{HeaderError, HeaderFacts, Unreadable};
pub use index::{Entry, Index};
pub use remote_header::RangePolicy;
pub use source::{Credentials, HttpPart, ModelSource};

use download::Fetch;
use evict::{Budget, Candidate};

#[derive(Clone, Debug)]
pub struct CacheConfig {
    pub root: PathBuf,
    /// Bytes the cache may hold: models and partial downloads together.
    pub budget_bytes: u64,
    /// Bytes kept free inside the budget.
    pub reserve_bytes: u64,
    /// Tries per file before a broken transfer is an error (each resumes where the last stopped).
    pub attempts: u32,
    /// Wait before the second try; grows linearly with the try.
    pub retry_delay: Duration,
    pub connect_timeout: Duration,
    /// Longest silence inside a transfer before it counts as broken (and is resumed).
    pub read_timeout: Duration,
    /// How much of a remote file [`ModelCache::probe`] may read to find its header.
    pub header_range: RangePolicy,
}

impl CacheConfig {
    pub fn new(root: impl Into<PathBuf>, budget_bytes: u64) -> Self {
        CacheConfig {
            root: root.into(),
            budget_bytes,
            reserve_bytes: 0,
            attempts: 5,
            retry_delay: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            header_range: RangePolicy::default(),
        }
    }
}

/// A model ready on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedModel {
    pub sha256: String,
    /// The file to open (the first part of a split model).
    pub path: PathBuf,
    pub size: u64,
    pub facts: HeaderFacts,
    /// Whether this call downloaded it (false: it was cached, or is a local file).
    pub fetched: bool,
}

/// A model's header facts and its size in bytes (all parts), without the model on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFacts {
    pub facts: HeaderFacts,
    pub size: u64,
}

pub struct ModelCache {
    config: CacheConfig,
    client: reqwest::Client,
    /// Serialises the index's read-modify-write cycles within this process.
    index_lock: Mutex<()>,
    /// Keys being downloaded: two downloads of one model would append to one partial file.
    downloading: Mutex<HashSet<String>>,
}

/// Holds a key in `downloading` until dropped (also when the download's future is dropped).
struct InFlight<'a> {
    set: &'a Mutex<HashSet<String>>,
    key: String,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.key);
    }
}

impl ModelCache {
    /// Opens (creating) the cache directory.
    pub fn open(config: CacheConfig) -> Result<Self, CacheError> {
        for dir in [config.root.join("models"), config.root.join("partial")] {
            std::fs::create_dir_all(&dir).map_err(|e| CacheError::io("creating the cache directory", &dir, e))?;
        }
        // Header scratch files a stopped process left (no probe runs before the cache is open).
        let probes = config.root.join("probe");
        match std::fs::remove_dir_all(&probes) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(CacheError::io("removing old header scratch files", &probes, e)),
        }
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .build()
            .map_err(|e| CacheError::Http { url: "(building the HTTP client)".into(), message: e.to_string() })?;
        Ok(ModelCache { config, client, index_lock: Mutex::new(()), downloading: Mutex::new(HashSet::new()) })
    }

    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// The index's entries as they are on disk.
    pub fn entries(&self) -> Result<Vec<Entry>, CacheError> {
        let _guard = self.lock();
        Ok(Index::load(&self.config.root)?.entries)
    }

    /// Makes the model available: a cached one is touched and returned; otherwise it is
    /// downloaded (resuming a partial), verified, moved into `models/` and indexed, after
    /// evicting least-recently-used models not in `in_use` (sha256 keys) when the budget needs
    /// it. A local source is verified in place.
    pub async fn ensure(
        &self,
        source: &ModelSource,
        in_use: &HashSet<String>,
        progress: &mut (dyn FnMut(usize, Progress) + Send),
    ) -> Result<CachedModel, CacheError> {
        let key = source.key()?;
        match source {
            ModelSource::Local { path, .. } => self.verify_local(path, &key).await,
            ModelSource::Http { parts, credentials } => {
                if let Some(hit) = self.touch(&key)? {
                    return hit;
                }
                let _in_flight = self.claim(&key)?;
                self.download(&key, parts, credentials.as_ref(), in_use, progress).await
            }
        }
    }

    /// The header facts and size of the cached model under `key` (lowercase), if the cache
    /// holds it and its header was readable. Does not count as a use.
    pub fn indexed_facts(&self, key: &str) -> Result<Option<ModelFacts>, CacheError> {
        let _guard = self.lock();
        let mut index = Index::load(&self.config.root)?;
        let Some(entry) = index.get_mut(key) else { return Ok(None) };
        let Some(first) = entry.files.first().map(|f| self.models_dir().join(f)) else { return Ok(None) };
        if !first.is_file() {
            return Ok(None);
        }
        if refresh_old_facts(entry, &first) {
            index.save(&self.config.root)?;
        }
        let entry = index.get(key).ok_or(CacheError::NoParts)?;
        Ok(entry.header.as_ref().ok().map(|facts| ModelFacts { facts: facts.clone(), size: entry.size }))
    }

    /// Reads `source`'s header facts without downloading it: a local file is read in place (its
    /// sha256 is not checked: hashing tens of GB for a few header fields is what the download
    /// path does, and the facts are written again from the verified file when a node caches
    /// it); over http(s), each part's header is fetched with `Range` requests (at most
    /// `header_range.cap_bytes` per part), written at its offset into a sparse scratch file of
    /// the part's length, and read by the engine's reader exactly as a downloaded file is.
    pub async fn probe(&self, source: &ModelSource) -> Result<ModelFacts, CacheError> {
        let key = source.key()?;
        match source {
            ModelSource::Local { path, .. } => {
                let size = std::fs::metadata(path).map_err(|e| CacheError::io("reading the size of", path, e))?.len();
                let facts = read_header_blocking(path.clone()).await?;
                Ok(ModelFacts { facts, size })
            }
            ModelSource::Http { parts, credentials } => {
                let mut headers = Vec::with_capacity(parts.len());
                for part in parts {
                    headers.push(remote_header::fetch(&self.client, &part.url, credentials.as_ref(), self.config.header_range).await?);
                }
                let dir = self.config.root.join("probe").join(&key);
                let result = probe_files(&dir, &key, &headers).await;
                // The scratch files are only needed for the read above.
                if let Err(e) = std::fs::remove_dir_all(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    eprintln!("brink-agent: removing the header scratch files {}: {e}", dir.display());
                }
                let facts = result?;
                let size = headers.iter().map(|h| h.file_len).fold(0u64, u64::saturating_add);
                Ok(ModelFacts { facts, size })
            }
        }
    }

    /// Removes the partial downloads whose sha256 is not in `wanted` (lowercase; the part
    /// digests of every `Model` that still exists, those downloading now included): an
    /// abandoned download would otherwise hold its bytes of the budget forever. Returns the
    /// bytes freed.
    pub fn prune_partials(&self, wanted: &HashSet<String>) -> Result<u64, CacheError> {
        let dir = self.config.root.join("partial");
        let read = std::fs::read_dir(&dir).map_err(|e| CacheError::io("listing", &dir, e))?;
        let mut freed = 0;
        for item in read {
            let path = item.map_err(|e| CacheError::io("listing", &dir, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.strip_suffix(".part").is_some_and(|sha| wanted.contains(sha)) {
                continue;
            }
            let len = std::fs::metadata(&path).map_err(|e| CacheError::io("reading the size of", &path, e))?.len();
            std::fs::remove_file(&path).map_err(|e| CacheError::io("removing the abandoned download", &path, e))?;
            freed += len;
        }
        Ok(freed)
    }

    fn lock(&self) -> MutexGuard<'_, ()> {
        // A panic elsewhere while holding the lock left no half-written index (writes are atomic).
        self.index_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn claim(&self, key: &str) -> Result<InFlight<'_>, CacheError> {
        let mut set = self.downloading.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !set.insert(key.to_string()) {
            return Err(CacheError::Busy { sha256: key.to_string() });
        }
        Ok(InFlight { set: &self.downloading, key: key.to_string() })
    }

    fn models_dir(&self) -> PathBuf {
        self.config.root.join("models")
    }

    fn partial_path(&self, sha256: &str) -> PathBuf {
        self.config.root.join("partial").join(format!("{sha256}.part"))
    }

    /// The cached model under `key`, its last use set to now; None when absent (an entry whose
    /// files are gone is dropped).
    fn touch(&self, key: &str) -> Result<Option<Result<CachedModel, CacheError>>, CacheError> {
        let _guard = self.lock();
        let mut index = Index::load(&self.config.root)?;
        let Some(entry) = index.get_mut(key) else { return Ok(None) };
        let files: Vec<PathBuf> = entry.files.iter().map(|f| self.models_dir().join(f)).collect();
        if files.is_empty() || !files.iter().all(|f| f.is_file()) {
            index.remove(key);
            index.save(&self.config.root)?;
            return Ok(None);
        }
        entry.last_used_ms = now_ms();
        refresh_old_facts(entry, &files[0]);
        let hit = cached(entry, &files[0], false);
        index.save(&self.config.root)?;
        Ok(Some(hit))
    }

    async fn download(
        &self,
        key: &str,
        parts: &[HttpPart],
        credentials: Option<&Credentials>,
        in_use: &HashSet<String>,
        progress: &mut (dyn FnMut(usize, Progress) + Send),
    ) -> Result<CachedModel, CacheError> {
        let names = model_file_names(key, parts.len());
        let mut size = 0;
        for (i, part) in parts.iter().enumerate() {
            let sha256 = source::normalize_sha256(&format!("parts[{i}].sha256"), &part.sha256)?;
            let partial = self.partial_path(&sha256);
            let job = Fetch {
                url: &part.url,
                sha256: &sha256,
                partial: &partial,
                credentials,
                attempts: self.config.attempts,
                retry_delay: self.config.retry_delay,
            };
            let mut admit = |need: u64| self.make_room(&partial, need, in_use);
            let mut part_progress = |p: Progress| progress(i, p);
            size += download::fetch(&self.client, &job, &mut admit, &mut part_progress).await?;
        }
        // Every part verified: move them in (a rename within the cache's file system).
        let mut files = Vec::with_capacity(parts.len());
        for (part, name) in parts.iter().zip(&names) {
            let from = self.partial_path(&part.sha256.to_ascii_lowercase());
            let to = self.models_dir().join(name);
            std::fs::rename(&from, &to).map_err(|e| CacheError::io("moving the verified download into models/", &to, e))?;
            files.push(to);
        }
        let first = files[0].clone();
        let header = tokio::task::spawn_blocking(move || header::read(&first).map_err(Unreadable::from))
            .await
            .map_err(|e| CacheError::Task(e.to_string()))?;
        let entry = Entry {
            sha256: key.to_string(),
            size,
            source: parts.iter().map(|p| p.url.clone()).collect(),
            files: names,
            last_used_ms: now_ms(),
            header,
        };
        let _guard = self.lock();
        let mut index = Index::load(&self.config.root)?;
        index.upsert(entry.clone());
        index.save(&self.config.root)?;
        cached(&entry, &files[0], true)
    }

    /// Evicts least-recently-used models not in use until `need` more bytes fit, or says why
    /// they cannot (evicting nothing). Partial files count against the budget, except the one
    /// being resumed, whose bytes are part of `need`.
    fn make_room(&self, partial: &Path, need: u64, in_use: &HashSet<String>) -> Result<(), CacheError> {
        let _guard = self.lock();
        let mut index = Index::load(&self.config.root)?;
        let candidates: Vec<Candidate> = index
            .entries
            .iter()
            .map(|e| Candidate { key: e.sha256.clone(), size: e.size, last_used: e.last_used_ms, in_use: in_use.contains(&e.sha256) })
            .collect();
        let other_used = self.partial_bytes(partial)?;
        let budget = Budget { budget: self.config.budget_bytes, reserve: self.config.reserve_bytes, other_used };
        let evict = evict::plan_eviction(&candidates, budget, need)?;
        for key in evict {
            if let Some(entry) = index.remove(&key) {
                for f in &entry.files {
                    let path = self.models_dir().join(f);
                    match std::fs::remove_file(&path) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(CacheError::io("evicting", &path, e)),
                    }
                }
            }
            // Saved after each model: the index never lists a file that is gone.
            index.save(&self.config.root)?;
        }
        Ok(())
    }

    /// Bytes in `partial/`, except `current`.
    fn partial_bytes(&self, current: &Path) -> Result<u64, CacheError> {
        let dir = self.config.root.join("partial");
        let read = std::fs::read_dir(&dir).map_err(|e| CacheError::io("listing", &dir, e))?;
        let mut total = 0;
        for item in read {
            let item = item.map_err(|e| CacheError::io("listing", &dir, e))?;
            if item.path() != current {
                total += item.metadata().map_err(|e| CacheError::io("reading the size of", &item.path(), e))?.len();
            }
        }
        Ok(total)
    }

    async fn verify_local(&self, path: &Path, key: &str) -> Result<CachedModel, CacheError> {
        let actual = download::sha256_file(path).await?;
        if actual != key {
            return Err(CacheError::LocalChecksum { path: path.to_path_buf(), expected: key.to_string(), actual });
        }
        let size = std::fs::metadata(path).map_err(|e| CacheError::io("reading the size of", path, e))?.len();
        let owned = path.to_path_buf();
        let facts = tokio::task::spawn_blocking(move || header::read(&owned))
            .await
            .map_err(|e| CacheError::Task(e.to_string()))?
            .map_err(|e| CacheError::Header { path: path.to_path_buf(), message: e.to_string() })?;
        Ok(CachedModel { sha256: key.to_string(), path: path.to_path_buf(), size, facts, fetched: false })
    }
}

/// Re-reads the header of an entry indexed before the facts had `kv_bytes_per_token` or
/// `kv_window_bytes_per_sequence` (its KV bytes per token then counted windowed layers too),
/// or while the shape key was only its label (such a key must not match a new one).
/// Returns whether the entry changed.
fn refresh_old_facts(entry: &mut Entry, first: &Path) -> bool {
    let old = |f: &HeaderFacts| f.kv_bytes_per_token.is_none() || f.kv_window_bytes_per_sequence.is_none() || f.shape_label.is_none();
    if !matches!(&entry.header, Ok(f) if old(f)) {
        return false;
    }
    entry.header = header::read(first).map_err(Unreadable::from);
    true
}

async fn read_header_blocking(path: PathBuf) -> Result<HeaderFacts, CacheError> {
    let owned = path.clone();
    tokio::task::spawn_blocking(move || header::read(&owned))
        .await
        .map_err(|e| CacheError::Task(e.to_string()))?
        .map_err(|e| CacheError::Header { path, message: e.to_string() })
}

/// Writes each part's header bytes into a sparse file of the part's length under `dir` (named
/// as the cache names a model's parts, so a split model's parts find each other) and reads the
/// facts from the first.
async fn probe_files(dir: &Path, key: &str, headers: &[remote_header::RemoteHeader]) -> Result<HeaderFacts, CacheError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CacheError::io("removing old header scratch files", dir, e)),
    }
    std::fs::create_dir_all(dir).map_err(|e| CacheError::io("creating the header scratch directory", dir, e))?;
    let names = model_file_names(key, headers.len());
    for (h, name) in headers.iter().zip(&names) {
        let path = dir.join(name);
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&path)?;
            std::io::Write::write_all(&mut f, &h.prefix)?;
            // The length without the bytes: the reader checks every tensor against it.
            f.set_len(h.file_len)
        };
        write().map_err(|e| CacheError::io("writing the header scratch file", &path, e))?;
    }
    let first = dir.join(names.first().ok_or(CacheError::NoParts)?);
    read_header_blocking(first).await
}

fn cached(entry: &Entry, first: &Path, fetched: bool) -> Result<CachedModel, CacheError> {
    match &entry.header {
        Ok(facts) => {
            Ok(CachedModel { sha256: entry.sha256.clone(), path: first.to_path_buf(), size: entry.size, facts: facts.clone(), fetched })
        }
        Err(why) => Err(CacheError::Header { path: first.to_path_buf(), message: why.to_string() }),
    }
}

/// `<key>.gguf`, or llama.cpp's split names so the engine's reader finds every part.
fn model_file_names(key: &str, parts: usize) -> Vec<String> {
    if parts == 1 {
        return vec![format!("{key}.gguf")];
    }
    (0..parts).map(|i| format!("{key}-{:05}-of-{:05}.gguf", i + 1, parts)).collect()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests;
