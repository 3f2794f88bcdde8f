//! The qualification cache: a node's last result for a shape class, reused while its
//! fingerprint is unchanged and re-qualified (naming what changed) when it is not.
//!
//! The decision is pure ([`decide`]); reading and writing are thin and name the file in every
//! error. A cache that cannot be trusted is never an error to the caller: it means qualifying
//! again, with the reason said.

use std::path::{Path, PathBuf};

use brink_api::{FieldChange, Fingerprint, QUALIFICATION_SCHEMA, Qualification};
use brink_kernels::thresholds::ModelShape;

use super::store::{self, StoreError};

/// What was found at the cache path.
#[derive(Clone, Debug, PartialEq)]
pub enum Cached {
    Missing,
    /// Unreadable or not a qualification: the reason names the file.
    Corrupt(String),
    Found(Box<Qualification>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum CacheDecision {
    /// The fingerprint is unchanged: use this result without running the self-test.
    Reuse(Box<Qualification>),
    /// Qualify again because these fingerprint fields changed.
    Changed(Vec<FieldChange>),
    /// Qualify again because the cached result cannot be trusted.
    Invalid(String),
    /// Nothing cached: qualify.
    NoCache,
}

impl CacheDecision {
    /// One line for the report: what the agent does and why.
    pub fn describe(&self) -> String {
        match self {
            CacheDecision::Reuse(q) => format!("reusing the qualification of {} (fingerprint unchanged)", q.qualified_at),
            CacheDecision::Changed(changes) => {
                format!("re-qualifying: {}", changes.iter().map(|c| c.to_string()).collect::<Vec<_>>().join("; "))
            }
            CacheDecision::Invalid(why) => format!("re-qualifying: {why}"),
            CacheDecision::NoCache => "qualifying: no cached result".into(),
        }
    }
}

/// Decides between reusing `cached` and qualifying again for `current`.
pub fn decide(current: &Fingerprint, cached: Cached) -> CacheDecision {
    let q = match cached {
        Cached::Missing => return CacheDecision::NoCache,
        Cached::Corrupt(why) => return CacheDecision::Invalid(why),
        Cached::Found(q) => q,
    };
    if q.schema != QUALIFICATION_SCHEMA {
        return CacheDecision::Invalid(format!("cached qualification has schema {} (this agent writes {QUALIFICATION_SCHEMA})", q.schema));
    }
    let recomputed = q.fingerprint.digest();
    if q.digest != recomputed {
        return CacheDecision::Invalid(format!(
            "cached digest {} does not match its fingerprint ({recomputed}): the file was edited or damaged",
            q.digest
        ));
    }
    let changes = q.fingerprint.changed_fields(current);
    if changes.is_empty() { CacheDecision::Reuse(q) } else { CacheDecision::Changed(changes) }
}

/// What to say when nothing is cached under `current`'s key: the fields that differ from the
/// shape this node qualified last (`up --model B` after `up --model A`), or that a result is
/// held under the key's old, label-only form (which left out heads, head dim, vocabulary,
/// context and weight types, so it is not reused). Otherwise plain [`CacheDecision::NoCache`].
pub fn no_cache_reason(current: &ModelShape, last: Option<&ModelShape>, legacy_label_cached: bool) -> CacheDecision {
    let key = current.key();
    if let Some(last) = last.filter(|l| l.key() != key) {
        let changes = last.changed_fields(current);
        return CacheDecision::Invalid(format!(
            "no result for shape key {key}; the last qualified shape ({}) differs in {}",
            last.key(),
            if changes.is_empty() { "its label only".to_string() } else { changes.join(", ") }
        ));
    }
    if legacy_label_cached {
        return CacheDecision::Invalid(format!(
            "a result is cached under the old key {} (label only: it did not cover heads, head dim, vocabulary, context or weight types); not reused for {key}",
            current.name
        ));
    }
    CacheDecision::NoCache
}

/// Where the shape of the last qualified model is kept (for [`no_cache_reason`]).
pub fn last_shape_path(state_dir: &Path) -> PathBuf {
    state_dir.join("qualifications").join("last-qualified-shape.json")
}

/// The shape at `path`; `None` when missing or unreadable (it only explains a re-qualification).
pub fn read_shape(path: &Path) -> Option<ModelShape> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Writes `shape` to `path` (creating its directory) through a temporary file and a rename.
pub fn write_shape(path: &Path, shape: &ModelShape) -> Result<(), StoreError> {
    store::write_json(path, shape)
}

/// Parses the cache file's text (`file` names it in errors). The schema is read first, so a
/// file of another schema says so rather than failing on a field it does not have.
pub fn parse(text: &str, file: &str) -> Cached {
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Cached::Corrupt(format!("{file}: not JSON: {e}")),
    };
    match value.get("schema").and_then(|s| s.as_u64()) {
        Some(s) if s == u64::from(QUALIFICATION_SCHEMA) => {}
        Some(s) => return Cached::Corrupt(format!("{file}: schema {s} (this agent reads {QUALIFICATION_SCHEMA})")),
        None => return Cached::Corrupt(format!("{file}: no numeric `schema` field: not a qualification")),
    }
    match serde_json::from_value::<Qualification>(value) {
        Ok(q) => Cached::Found(Box::new(q)),
        Err(e) => Cached::Corrupt(format!("{file}: not a qualification: {e}")),
    }
}

/// Reads the cache at `path`; a missing file is [`Cached::Missing`], any other failure corrupt.
pub fn read(path: &Path) -> Cached {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, &path.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Cached::Missing,
        Err(e) => Cached::Corrupt(format!("{}: cannot read: {e}", path.display())),
    }
}

/// Writes `q` to `path` (creating its directory) through a temporary file and a rename, so a
/// crash mid-write leaves the old cache or the new one, never half of one.
pub fn write(path: &Path, q: &Qualification) -> Result<(), StoreError> {
    store::write_json(path, q)
}

/// Where the qualification for `shape_class` is cached under `state_dir`: one file per shape
/// class, so qualifying a second model does not discard the first one's result.
pub fn path(state_dir: &Path, shape_class: &str) -> PathBuf {
    let safe: String =
        shape_class.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect();
    state_dir.join("qualifications").join(format!("{safe}.json"))
}

/// `$BRINK_STATE_DIR`, else `$XDG_STATE_HOME/brink`, else `$HOME/.local/state/brink` (`env`
/// reads a variable; `None` when none is set).
pub fn state_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |k: &str| env(k).filter(|v| !v.is_empty());
    set("BRINK_STATE_DIR")
        .map(PathBuf::from)
        .or_else(|| set("XDG_STATE_HOME").map(|d| PathBuf::from(d).join("brink")))
        .or_else(|| set("HOME").map(|h| PathBuf::from(h).join(".local/state/brink")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::{ReportSummary, ServingParams, Verdict};

    fn fingerprint() -> Fingerprint {
        Fingerprint {
            gpu_name: "NVIDIA GB10".into(),
            compute_capability: "12.1".into(),
            driver_version: Some("580.95.05".into()),
            cuda_version: "13.0".into(),
            nvrtc_version: Some("13.0".into()),
            agent_version: "0.1.0".into(),
            kernel_sources_hash: "ab".repeat(32),
            shape_class: "qwen3moe-h2048-e128-top8-ffn768".into(),
            serving: ServingParams { max_batch_tokens: 16_384, prefill_chunk: 4096, context: 32_768, full_window_kv: false },
        }
    }

    fn qualification(fp: Fingerprint) -> Qualification {
        Qualification {
            schema: QUALIFICATION_SCHEMA,
            digest: fp.digest(),
            fingerprint: fp,
            verdict: Verdict::Qualified { max_tokens: 16_384 },
            summary: ReportSummary {
                derived: 120,
                executed: 110,
                passed: 110,
                failed: 0,
                hung: 0,
                skipped: 10,
                negative_controls_missed: 0,
            },
            qualified_at: "2026-11-30T19:44:52Z".into(),
            model_summary: None,
            kernel_verdict: None,
            model_verdict: None,
        }
    }

    #[test]
    fn unchanged_reuses() {
        let q = qualification(fingerprint());
        assert_eq!(decide(&fingerprint(), Cached::Found(Box::new(q.clone()))), CacheDecision::Reuse(Box::new(q)));
    }

    #[test]
    fn each_changed_field_requalifies_naming_it() {
        type Edit = fn(&mut Fingerprint);
        let table: [(&str, Edit, &str); 12] = [
            ("gpuName", |f| f.gpu_name = "NVIDIA H200".into(), "gpuName changed: NVIDIA GB10 -> NVIDIA H200"),
            ("computeCapability", |f| f.compute_capability = "9.0".into(), "computeCapability changed: 12.1 -> 9.0"),
            ("driverVersion", |f| f.driver_version = Some("590.10".into()), "driverVersion changed: 580.95.05 -> 590.10"),
            ("cudaVersion", |f| f.cuda_version = "13.1".into(), "cudaVersion changed: 13.0 -> 13.1"),
            ("nvrtcVersion", |f| f.nvrtc_version = None, "nvrtcVersion changed: 13.0 -> -"),
            ("agentVersion", |f| f.agent_version = "0.2.0".into(), "agentVersion changed: 0.1.0 -> 0.2.0"),
            ("kernelSourcesHash", |f| f.kernel_sources_hash = "cd".repeat(32), "kernelSourcesHash changed: abab"),
            ("shapeClass", |f| f.shape_class = "qwen3moe-h4096-e128-top8-ffn1536".into(), "shapeClass changed"),
            ("serving.maxBatchTokens", |f| f.serving.max_batch_tokens = 8192, "serving.maxBatchTokens changed: 16384 -> 8192"),
            ("serving.prefillChunk", |f| f.serving.prefill_chunk = 2048, "serving.prefillChunk changed: 4096 -> 2048"),
            ("serving.context", |f| f.serving.context = 40_960, "serving.context changed: 32768 -> 40960"),
            ("serving.fullWindowKv", |f| f.serving.full_window_kv = true, "serving.fullWindowKv changed: false -> true"),
        ];
        assert_eq!(table.len(), fingerprint().fields().len(), "a fingerprint field the table does not change");
        for (field, edit, line) in table {
            let mut current = fingerprint();
            edit(&mut current);
            let d = decide(&current, Cached::Found(Box::new(qualification(fingerprint()))));
            let CacheDecision::Changed(changes) = &d else { panic!("{field}: {d:?}") };
            assert_eq!(changes.iter().map(|c| c.field).collect::<Vec<_>>(), [field]);
            assert!(d.describe().contains(line), "{field}: {}", d.describe());
        }
    }

    #[test]
    fn several_changes_are_all_named() {
        let mut current = fingerprint();
        current.driver_version = Some("590.10".into());
        current.serving.context = 8192;
        let d = decide(&current, Cached::Found(Box::new(qualification(fingerprint()))));
        let CacheDecision::Changed(c) = d else { panic!() };
        assert_eq!(c.iter().map(|c| c.field).collect::<Vec<_>>(), ["driverVersion", "serving.context"]);
    }

    #[test]
    fn missing_is_no_cache() {
        assert_eq!(decide(&fingerprint(), Cached::Missing), CacheDecision::NoCache);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&dir.path().join("absent.json")), Cached::Missing);
    }

    #[test]
    fn corrupt_files_requalify_with_the_reason() {
        let good = serde_json::to_value(qualification(fingerprint())).unwrap();
        let mut other_schema = good.clone();
        other_schema["schema"] = 7.into();
        let mut wrong_verdict = good.clone();
        wrong_verdict["verdict"] = serde_json::json!({"state": "sideways"});
        let mut no_fp = good.clone();
        no_fp.as_object_mut().unwrap().remove("fingerprint");
        let cases: [(String, &str); 6] = [
            ("{\"schema\": 1, \"finger".into(), "q.json: not JSON: EOF while parsing"),
            ("".into(), "q.json: not JSON"),
            ("[1, 2]".into(), "q.json: no numeric `schema` field"),
            (other_schema.to_string(), &format!("q.json: schema 7 (this agent reads {QUALIFICATION_SCHEMA})")),
            (wrong_verdict.to_string(), "q.json: not a qualification: unknown variant `sideways`"),
            (no_fp.to_string(), "q.json: not a qualification: missing field `fingerprint`"),
        ];
        for (text, want) in cases {
            let d = decide(&fingerprint(), parse(&text, "q.json"));
            let CacheDecision::Invalid(why) = &d else { panic!("{text}: {d:?}") };
            assert!(why.starts_with(want), "{text}: {why}");
            assert!(d.describe().starts_with("re-qualifying: q.json"), "{}", d.describe());
        }
    }

    #[test]
    fn an_edited_fingerprint_is_not_trusted() {
        // Someone edits the cached GPU name to match this node without re-running the self-test.
        let mut q = qualification(fingerprint());
        q.fingerprint.gpu_name = "NVIDIA H200".into();
        let mut current = fingerprint();
        current.gpu_name = "NVIDIA H200".into();
        let d = decide(&current, Cached::Found(Box::new(q)));
        let CacheDecision::Invalid(why) = d else { panic!("{d:?}") };
        assert!(why.contains("does not match its fingerprint"), "{why}");
    }

    #[test]
    fn a_qualification_of_another_schema_in_memory_is_invalid() {
        let mut q = qualification(fingerprint());
        q.schema = QUALIFICATION_SCHEMA + 1;
        let want = format!("schema {}", QUALIFICATION_SCHEMA + 1);
        assert!(matches!(decide(&fingerprint(), Cached::Found(Box::new(q))), CacheDecision::Invalid(w) if w.contains(&want)));
    }

    #[test]
    fn write_then_read_round_trips_and_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), "qwen3moe-h2048-e128-top8-ffn768");
        assert!(p.ends_with("qualifications/qwen3moe-h2048-e128-top8-ffn768.json"));
        let q = qualification(fingerprint());
        write(&p, &q).unwrap();
        assert_eq!(read(&p), Cached::Found(Box::new(q.clone())));
        assert_eq!(decide(&fingerprint(), read(&p)), CacheDecision::Reuse(Box::new(q.clone())));
        // Overwrite in place; no temporary file is left behind.
        write(&p, &q).unwrap();
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn io_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: unreadable as text, and not replaceable.
        let p = dir.path().join("q.json");
        std::fs::create_dir(&p).unwrap();
        let Cached::Corrupt(why) = read(&p) else { panic!() };
        assert!(why.starts_with(&format!("{}: cannot read", p.display())), "{why}");
        // A file where the directory should be.
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "x").unwrap();
        let err = write(&blocker.join("q.json"), &qualification(fingerprint())).unwrap_err();
        assert!(matches!(&err, StoreError::Folder { path, .. } if path == &blocker), "{err:?}");
        assert!(err.to_string().starts_with(&format!("{}: cannot create the directory", blocker.display())), "{err}");
    }

    #[test]
    fn another_shape_requalifies_naming_the_field_that_changed() {
        let a = ModelShape::qwen3_30b_a3b();
        let mut b = a.clone();
        b.attention.head_dim = 64;
        let d = no_cache_reason(&b, Some(&a), false);
        let CacheDecision::Invalid(why) = &d else { panic!("{d:?}") };
        assert!(why.contains("attention.head_dim: 128 -> 64") && why.contains(&a.key()) && why.contains(&b.key()), "{why}");
        // The same shape last (its file removed): nothing to explain.
        assert_eq!(no_cache_reason(&a, Some(&a), false), CacheDecision::NoCache);
        assert_eq!(no_cache_reason(&a, None, false), CacheDecision::NoCache);
        let d = no_cache_reason(&a, None, true);
        assert!(d.describe().contains("old key qwen3moe-h2048-e128-top8-ffn768 (label only"), "{}", d.describe());
    }

    #[test]
    fn shapes_round_trip_through_their_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = last_shape_path(dir.path());
        assert_eq!(read_shape(&p), None);
        let mut s = ModelShape::qwen3_30b_a3b();
        s.weights.insert("output.weight".into(), "q8_0".into());
        write_shape(&p, &s).unwrap();
        assert_eq!(read_shape(&p).map(|r| r.key()), Some(s.key()));
        std::fs::write(&p, "{").unwrap();
        assert_eq!(read_shape(&p), None, "a damaged file explains nothing");
    }

    #[test]
    fn shape_classes_become_safe_file_names() {
        assert_eq!(path(Path::new("/s"), "../etc/passwd"), Path::new("/s/qualifications/.._etc_passwd.json"));
    }

    #[test]
    fn state_dir_precedence() {
        let env =
            |vars: &'static [(&'static str, &'static str)]| move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        assert_eq!(state_dir(env(&[("BRINK_STATE_DIR", "/var/lib/brink"), ("HOME", "/root")])), Some("/var/lib/brink".into()));
        assert_eq!(state_dir(env(&[("XDG_STATE_HOME", "/x"), ("HOME", "/root")])), Some("/x/brink".into()));
        assert_eq!(state_dir(env(&[("BRINK_STATE_DIR", ""), ("HOME", "/root")])), Some("/root/.local/state/brink".into()));
        assert_eq!(state_dir(env(&[])), None);
    }
}
