//! The qualification fingerprint and the cached result it keys.
//!
//! A node's self-test result holds only for what was tested: the GPU, its driver, CUDA and
//! NVRTC, the agent build and its kernel sources, the model's shape class and the serving
//! parameters whose edges the cases were derived from. The fingerprint names all of them; when
//! any one changes the node is qualified again, otherwise the cached result is reused.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::selftest::{SelfTestReport, Verdict};

/// Bumped when a field of [`Qualification`] or [`Fingerprint`] changes meaning; a cached
/// qualification of another schema is not reused. 2: the fingerprint keys the KV layout
/// (`serving.fullWindowKv`), so schema 1 results, keyed without it, are run again.
pub const QUALIFICATION_SCHEMA: u32 = 2;

/// Prefix of the canonical encoding; bump the suffix with the encoding itself.
const CANONICAL_TAG: &str = "brink-fingerprint-v2";

/// Everything a qualification result depends on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fingerprint {
    pub gpu_name: String,
    /// e.g. `12.1`.
    pub compute_capability: String,
    /// The kernel driver's version (e.g. `580.95.05`); `None` where neither NVML nor
    /// `/proc/driver/nvidia/version` tells it.
    pub driver_version: Option<String>,
    /// The driver's CUDA version (`cuDriverGetVersion`, e.g. `13.0`).
    pub cuda_version: String,
    pub nvrtc_version: Option<String>,
    pub agent_version: String,
    /// SHA-256 over every kernel source.
    pub kernel_sources_hash: String,
    /// The model's shape key (label and hash of its whole kernel shape), e.g.
    /// `qwen3moe-h2048-e128-top8-ffn768-0123456789abcdef`.
    pub shape_class: String,
    pub serving: ServingParams,
}

/// The serving parameters whose edges the self-test cases are derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingParams {
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
    /// Context length (tokens per sequence).
    pub context: u64,
    /// Whole sequences kept for sliding-window layers (`--full-window-kv`) rather than the
    /// ring the engine serves with by default: the model-level cases run the layout the
    /// replica serves, so a result under one layout says nothing of the other. Absent from a
    /// result cached before the field: rings.
    #[serde(default)]
    pub full_window_kv: bool,
}

impl Fingerprint {
    /// Each field as `(name, canonical value)`, in a fixed order. The one list both the digest
    /// and [`Fingerprint::changed_fields`] are computed from, so a field can be neither hashed
    /// without being compared nor compared without being hashed. Names are the JSON (camelCase)
    /// names; an absent value is `-`, which no real version or hash can be.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        vec![
            ("gpuName", self.gpu_name.clone()),
            ("computeCapability", self.compute_capability.clone()),
            ("driverVersion", opt(&self.driver_version)),
            ("cudaVersion", self.cuda_version.clone()),
            ("nvrtcVersion", opt(&self.nvrtc_version)),
            ("agentVersion", self.agent_version.clone()),
            ("kernelSourcesHash", self.kernel_sources_hash.clone()),
            ("shapeClass", self.shape_class.clone()),
            ("serving.maxBatchTokens", self.serving.max_batch_tokens.to_string()),
            ("serving.prefillChunk", self.serving.prefill_chunk.to_string()),
            ("serving.context", self.serving.context.to_string()),
            ("serving.fullWindowKv", self.serving.full_window_kv.to_string()),
        ]
    }

    /// The canonical encoding: a tag line, then one `name=value` line per field in the order of
    /// [`Fingerprint::fields`], each value JSON-string-quoted (so a value holding `\n` or `=`
    /// cannot forge another line). It depends on that list, not on the struct's declaration
    /// order or serde's: reordering the struct leaves every digest as it was, while adding,
    /// renaming or reordering an entry of `fields()` changes all of them (then bump the tag).
    pub fn canonical(&self) -> String {
        let mut out = String::from(CANONICAL_TAG);
        out.push('\n');
        for (name, value) in self.fields() {
            out.push_str(name);
            out.push('=');
            // Serialising a &str to JSON cannot fail.
            out.push_str(&serde_json::to_string(&value).unwrap_or_default());
            out.push('\n');
        }
        out
    }

    /// SHA-256 of [`Fingerprint::canonical`], lower-case hex: stable across builds, platforms
    /// and serde versions.
    pub fn digest(&self) -> String {
        Sha256::digest(self.canonical().as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The fields whose values differ from `other`'s, each as `name: old -> new` (self is old).
    pub fn changed_fields(&self, other: &Fingerprint) -> Vec<FieldChange> {
        self.fields()
            .into_iter()
            .zip(other.fields())
            .filter(|((_, a), (_, b))| a != b)
            .map(|((name, old), (_, new))| FieldChange { field: name, old, new })
            .collect()
    }
}

/// One fingerprint field that changed since the cached qualification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldChange {
    pub field: &'static str,
    pub old: String,
    pub new: String,
}

impl std::fmt::Display for FieldChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} changed: {} -> {}", self.field, self.old, self.new)
    }
}

/// The counts of a self-test report, without its cases.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReportSummary {
    pub derived: u64,
    pub executed: u64,
    pub passed: u64,
    pub failed: u64,
    pub hung: u64,
    pub skipped: u64,
    /// Negative controls the self-test failed to flag (non-zero: the self-test is untrustworthy).
    pub negative_controls_missed: u64,
}

impl From<&SelfTestReport> for ReportSummary {
    fn from(r: &SelfTestReport) -> ReportSummary {
        ReportSummary {
            derived: r.derived,
            executed: r.executed,
            passed: r.passed,
            failed: r.failed,
            hung: r.hung,
            skipped: r.skipped,
            negative_controls_missed: r.negative_controls.missed,
        }
    }
}

impl From<&crate::model_test::ModelTestReport> for ReportSummary {
    /// The model-level test has no negative controls.
    fn from(r: &crate::model_test::ModelTestReport) -> ReportSummary {
        ReportSummary {
            derived: r.derived,
            executed: r.executed,
            passed: r.passed,
            failed: r.failed,
            hung: r.hung,
            skipped: r.skipped,
            negative_controls_missed: 0,
        }
    }
}

/// A qualification result under its fingerprint: what the agent caches on the node and
/// publishes for the operator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Qualification {
    pub schema: u32,
    pub fingerprint: Fingerprint,
    /// `fingerprint.digest()` when written: a reader recomputes it, so an edited or damaged
    /// fingerprint is noticed instead of trusted.
    pub digest: String,
    pub verdict: Verdict,
    pub summary: ReportSummary,
    /// When the self-test finished, RFC 3339 UTC (e.g. `2026-11-30T19:44:52Z`).
    pub qualified_at: String,
    /// The model-level threshold test's counts, where one ran (`up`, `selftest --model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_summary: Option<ReportSummary>,
    /// The verdicts of each suite, the `verdict` above being both together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_verdict: Option<Verdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_verdict: Option<Verdict>,
}

/// The limits a node serves a shape class under: the requested serving parameters, clamped to
/// the largest token count the self-tests validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// False when no GPU case ran (the CPU backend): nothing was validated, nothing is clamped.
    pub validated: bool,
    /// The largest token count validated (every count up to it that was tested passed).
    pub validated_tokens: Option<u64>,
    /// The smallest failing count, when the serving limits were clamped under it.
    pub first_failure: Option<u64>,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
}

impl Qualification {
    pub fn new(fingerprint: Fingerprint, report: &SelfTestReport, qualified_at: String) -> Qualification {
        Qualification {
            schema: QUALIFICATION_SCHEMA,
            digest: fingerprint.digest(),
            fingerprint,
            verdict: report.verdict.clone(),
            summary: ReportSummary::from(report),
            qualified_at,
            model_summary: None,
            kernel_verdict: None,
            model_verdict: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn digest_is_pinned() {
        // Pinned: a change here means every node's cache is invalidated; bump CANONICAL_TAG
        // deliberately rather than by accident.
        let fp = fingerprint();
        let expected_canonical = "brink-fingerprint-v2\ngpuName=\"NVIDIA GB10\"\ncomputeCapability=\"12.1\"\n\
            driverVersion=\"580.95.05\"\ncudaVersion=\"13.0\"\nnvrtcVersion=\"13.0\"\nagentVersion=\"0.1.0\"\n\
            kernelSourcesHash=\"abababababababababababababababababababababababababababababababab\"\n\
            shapeClass=\"qwen3moe-h2048-e128-top8-ffn768\"\nserving.maxBatchTokens=\"16384\"\n\
            serving.prefillChunk=\"4096\"\nserving.context=\"32768\"\nserving.fullWindowKv=\"false\"\n";
        assert_eq!(fp.canonical(), expected_canonical);
        // sha256sum of the text above, computed outside Rust.
        assert_eq!(fp.digest(), "d5c6912e395a72a640811483287f1c5e270180188553b484ed0141368d22a05c");
        assert_eq!(fp.digest().len(), 64);
    }

    #[test]
    fn every_field_moves_the_digest_and_is_named() {
        let base = fingerprint();
        type Edit = fn(&mut Fingerprint);
        let edits: Vec<(&str, Edit)> = vec![
            ("gpuName", |f| f.gpu_name = "NVIDIA H200".into()),
            ("computeCapability", |f| f.compute_capability = "9.0".into()),
            ("driverVersion", |f| f.driver_version = None),
            ("cudaVersion", |f| f.cuda_version = "13.1".into()),
            ("nvrtcVersion", |f| f.nvrtc_version = Some("12.9".into())),
            ("agentVersion", |f| f.agent_version = "0.2.0".into()),
            ("kernelSourcesHash", |f| f.kernel_sources_hash = "cd".repeat(32)),
            ("shapeClass", |f| f.shape_class = "qwen3moe-h4096-e128-top8-ffn1536".into()),
            ("serving.maxBatchTokens", |f| f.serving.max_batch_tokens = 8192),
            ("serving.prefillChunk", |f| f.serving.prefill_chunk = 2048),
            ("serving.context", |f| f.serving.context = 40_960),
            ("serving.fullWindowKv", |f| f.serving.full_window_kv = true),
        ];
        assert_eq!(edits.len(), base.fields().len(), "a fingerprint field without a test edit");
        for (name, edit) in edits {
            let mut changed = base.clone();
            edit(&mut changed);
            assert_ne!(changed.digest(), base.digest(), "{name}");
            let diff = base.changed_fields(&changed);
            assert_eq!(diff.len(), 1, "{name}: {diff:?}");
            assert_eq!(diff[0].field, name);
        }
        assert!(base.changed_fields(&base.clone()).is_empty());
    }

    #[test]
    fn a_value_cannot_forge_another_field() {
        let mut a = fingerprint();
        a.gpu_name = "X\"\ncomputeCapability=\"12.1".into();
        a.compute_capability = "".into();
        let mut b = fingerprint();
        b.gpu_name = "X".into();
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn qualification_round_trips_in_camel_case() {
        let q = Qualification {
            schema: QUALIFICATION_SCHEMA,
            digest: fingerprint().digest(),
            fingerprint: fingerprint(),
            verdict: Verdict::Clamped { max_tokens: 8192, first_failure: 16_384 },
            summary: ReportSummary { derived: 10, executed: 9, passed: 8, failed: 1, hung: 0, skipped: 1, negative_controls_missed: 0 },
            qualified_at: "2026-11-30T19:44:52Z".into(),
            model_summary: None,
            kernel_verdict: None,
            model_verdict: None,
        };
        let json = serde_json::to_string(&q).unwrap();
        assert!(
            json.contains("\"qualifiedAt\"") && json.contains("\"kernelSourcesHash\"") && json.contains("\"maxBatchTokens\""),
            "{json}"
        );
        assert!(json.contains(r#""verdict":{"state":"clamped","maxTokens":8192,"firstFailure":16384}"#), "{json}");
        assert_eq!(serde_json::from_str::<Qualification>(&json).unwrap(), q);
    }

    #[test]
    fn verdicts_cached_in_snake_case_still_read() {
        let old: Verdict = serde_json::from_str(r#"{"state":"clamped","max_tokens":8191,"first_failure":8192}"#).unwrap();
        assert_eq!(old, Verdict::Clamped { max_tokens: 8191, first_failure: 8192 });
        let old: Verdict = serde_json::from_str(r#"{"state":"qualified","max_tokens":5}"#).unwrap();
        assert_eq!(old, Verdict::Qualified { max_tokens: 5 });
    }
}
