//! The serving envelope from a node's self-test report: the largest batch (tokens per forward
//! pass) the kernels were validated at for the model's shape class. `serve` clamps
//! `--max-batch-tokens` and the prefill chunk to it, so a node that fails above some count is
//! still used below it, and a node whose report disqualifies the class does not serve it.

use std::path::Path;

use brink_api::qualification::{Envelope, ServingParams};
use brink_api::selftest::{SCHEMA_VERSION, SelfTestReport};

use crate::error::{Error, read_json};
use crate::qualify::verdict;

const FLAG: Option<&str> = Some("--selftest-report");

/// Reads `path` (the JSON of `brink-agent selftest --json`).
pub fn read_report(path: &Path) -> Result<SelfTestReport, Error> {
    read_json(FLAG, path, "a self-test report")
}

/// The limits `requested` are served under for the model of `shape_class` according to
/// `report` (the same rule `up` applies to its own verdict), or why it may not be served.
pub fn envelope(report: &SelfTestReport, shape_class: &str, path: &Path, requested: ServingParams) -> Result<Envelope, Error> {
    if report.schema != SCHEMA_VERSION {
        let reason = format!("report schema {} (this agent reads {SCHEMA_VERSION}); run the self-test again", report.schema);
        return Err(Error::content(FLAG, path, reason));
    }
    if report.shape_class != shape_class {
        let reason = format!(
            "the report qualifies shape class {}, but the model is {shape_class}; run the self-test for this model",
            report.shape_class
        );
        return Err(Error::content(FLAG, path, reason));
    }
    verdict::envelope(&report.verdict, requested).map_err(|e| Error::content(FLAG, path, format!("{shape_class}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::selftest::{DeviceSummary, NegativeControls, Verdict};

    const CLASS: &str = "qwen3moe-h2048-e128-top8-ffn768";

    fn report(verdict: Verdict) -> SelfTestReport {
        SelfTestReport {
            schema: SCHEMA_VERSION,
            agent_version: "0.1.0".into(),
            kernel_sources_hash: "h".into(),
            device: DeviceSummary {
                gpu: true,
                name: "GB10".into(),
                compute_capability: "12.1".into(),
                sm_count: 48,
                total_mem_bytes: 1,
                free_mem_bytes: 1,
                driver_cuda_version: None,
                nvrtc_version: None,
                max_grid_dim: [i32::MAX as u32, 65535, 65535],
                max_shared_mem_per_block_optin: 101_376,
                no_gpu_reason: None,
            },
            shape_class: CLASS.into(),
            derived: 1,
            executed: 1,
            passed: 1,
            failed: 0,
            hung: 0,
            skipped: 0,
            negative_controls: NegativeControls::default(),
            verdict,
            phases: vec![],
            cases: vec![],
        }
    }

    const ASKED: ServingParams = ServingParams { max_batch_tokens: 16_384, prefill_chunk: 4096, context: 32_768, full_window_kv: false };

    /// `(max batch tokens, prefill chunk, validated)` of an envelope.
    fn limits(e: &Envelope) -> (u64, u64, bool) {
        (e.max_batch_tokens, e.prefill_chunk, e.validated)
    }

    #[test]
    fn verdicts_become_clamped_limits_or_refusals() {
        let p = Path::new("node.json");
        let cases: [(Verdict, Result<(u64, u64, bool), &str>); 7] = [
            (Verdict::Qualified { max_tokens: 32_768 }, Ok((16_384, 4096, true))),
            (Verdict::Qualified { max_tokens: 16_384 }, Ok((16_384, 4096, true))),
            (Verdict::Clamped { max_tokens: 8191, first_failure: 8192 }, Ok((8191, 4096, true))),
            (Verdict::Clamped { max_tokens: 2047, first_failure: 2048 }, Ok((2047, 2047, true))),
            (Verdict::Clamped { max_tokens: 0, first_failure: 1 }, Err("no batch size")),
            (Verdict::Disqualified { reason: "attn fails at 63 tokens but 64 pass".into() }, Err("disqualified: attn fails at 63")),
            (Verdict::NotQualified { reason: "no GPU".into() }, Ok((16_384, 4096, false))),
        ];
        for (verdict, want) in cases {
            let got = envelope(&report(verdict.clone()), CLASS, p, ASKED);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(limits(&g), w, "{verdict:?}"),
                (Err(e), Err(needle)) => assert!(
                    e.to_string().contains(needle) && e.to_string().contains("node.json") && e.to_string().contains(CLASS),
                    "{verdict:?}: {e}"
                ),
                (g, w) => panic!("{verdict:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn another_shape_class_or_schema_is_refused() {
        let p = Path::new("node.json");
        let e =
            envelope(&report(Verdict::Qualified { max_tokens: 8 }), "qwen3moe-h4096-e128-top8-ffn1536", p, ASKED).unwrap_err().to_string();
        assert!(e.contains("qualifies shape class qwen3moe-h2048") && e.contains("h4096"), "{e}");
        let mut old = report(Verdict::Qualified { max_tokens: 8 });
        old.schema = SCHEMA_VERSION + 1;
        assert!(envelope(&old, CLASS, p, ASKED).unwrap_err().to_string().contains("schema"));
    }

    /// The engine names a model's class as the self-test names the class it qualifies.
    #[test]
    fn the_engine_and_the_self_test_agree_on_the_shape_class_name() {
        use brink_engine::model::{AttentionConfig, ModelConfig, MoeConfig};
        let s = brink_kernels::thresholds::ModelShape::qwen3_30b_a3b();
        let a = s.attention;
        let config = ModelConfig {
            arch: "qwen3moe".into(),
            layers: 48,
            hidden: s.hidden as usize,
            vocab: s.vocab as usize,
            context: s.context as usize,
            attention: AttentionConfig {
                heads: a.heads as usize,
                kv_heads: a.kv_heads as usize,
                head_dim: a.head_dim as usize,
                rope_theta: a.rope_theta,
            },
            moe: MoeConfig {
                experts: s.experts as usize,
                top_k: s.top_k as usize,
                expert_ffn: s.expert_ffn as usize,
                norm_top_k: true,
                weights_scale: None,
            },
            layer_specs: Vec::new(),
            norm_eps: a.norm_eps,
            // The built-in class carries no weight types.
            weights: Default::default(),
        };
        assert_eq!(config.shape_class(), s.key());
        assert_eq!(config.shape_label(), s.name);
    }

    #[test]
    fn reports_are_read_with_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        std::fs::write(&f, serde_json::to_string(&report(Verdict::Qualified { max_tokens: 5 })).unwrap()).unwrap();
        assert_eq!(read_report(&f).unwrap().shape_class, CLASS);
        std::fs::write(&f, "{\"schema\": 1}").unwrap();
        let e = read_report(&f).unwrap_err().to_string();
        assert!(e.contains("r.json") && e.contains("not a self-test report"), "{e}");
        assert!(read_report(&dir.path().join("missing.json")).unwrap_err().to_string().contains("missing.json"));
    }
}
