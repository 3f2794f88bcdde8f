//! The serving envelope from a node's self-test report: the largest batch (tokens per forward
//! pass) the kernels were validated at for the model's shape class. `serve` clamps
//! `--max-batch-tokens` and the prefill chunk to it, so a node that fails above some count is
//! still used below it, and a node whose report disqualifies the class does not serve it.

use std::path::Path;

use brink_api::selftest::{SCHEMA_VERSION, SelfTestReport, Verdict};

/// What a report allows for `shape_class`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// Batches up to this many tokens were validated.
    Validated(usize),
    /// The report ran no GPU case (a CPU-only machine): nothing to clamp to.
    Unvalidated(String),
}

/// Reads `path` (the JSON of `brink-agent selftest --json`).
pub fn read_report(path: &Path) -> Result<SelfTestReport, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--selftest-report {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("--selftest-report {}: not a self-test report: {e}", path.display()))
}

/// The envelope `report` gives the model of `shape_class`, or why it may not be served.
pub fn envelope(report: &SelfTestReport, shape_class: &str, path: &Path) -> Result<Envelope, String> {
    let file = path.display();
    if report.schema != SCHEMA_VERSION {
        return Err(format!("{file}: report schema {} (this agent reads {SCHEMA_VERSION}); run the self-test again", report.schema));
    }
    if report.shape_class != shape_class {
        return Err(format!(
            "{file}: the report qualifies shape class {}, but the model is {shape_class}; run the self-test for this model",
            report.shape_class
        ));
    }
    let tokens = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    match &report.verdict {
        Verdict::Qualified { max_tokens } | Verdict::Clamped { max_tokens, .. } if *max_tokens > 0 => {
            Ok(Envelope::Validated(tokens(*max_tokens)))
        }
        Verdict::Qualified { .. } | Verdict::Clamped { .. } => Err(format!("{file}: the report validates no batch size (0 tokens)")),
        Verdict::Disqualified { reason } => Err(format!("{file}: this node is disqualified for {shape_class}: {reason}")),
        Verdict::NotQualified { reason } => Ok(Envelope::Unvalidated(reason.clone())),
    }
}

/// `max_batch_tokens` and `prefill_chunk` clamped to the envelope.
pub fn clamp(max_batch_tokens: usize, prefill_chunk: usize, env: &Envelope) -> (usize, usize) {
    match *env {
        Envelope::Validated(max) => (max_batch_tokens.min(max), prefill_chunk.min(max)),
        Envelope::Unvalidated(_) => (max_batch_tokens, prefill_chunk),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::selftest::{DeviceSummary, NegativeControls};

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

    #[test]
    fn verdicts_become_envelopes_or_refusals() {
        let p = Path::new("node.json");
        let cases: [(Verdict, Result<Envelope, &str>); 6] = [
            (Verdict::Qualified { max_tokens: 16_384 }, Ok(Envelope::Validated(16_384))),
            (Verdict::Clamped { max_tokens: 8191, first_failure: 8192 }, Ok(Envelope::Validated(8191))),
            (Verdict::Clamped { max_tokens: 0, first_failure: 1 }, Err("no batch size")),
            (Verdict::Disqualified { reason: "attn fails at 63 tokens but 64 pass".into() }, Err("disqualified for qwen3moe")),
            (Verdict::NotQualified { reason: "no GPU".into() }, Ok(Envelope::Unvalidated("no GPU".into()))),
            (Verdict::Qualified { max_tokens: 0 }, Err("0 tokens")),
        ];
        for (verdict, want) in cases {
            let got = envelope(&report(verdict.clone()), CLASS, p);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{verdict:?}"),
                (Err(e), Err(needle)) => assert!(e.contains(needle) && e.contains("node.json"), "{verdict:?}: {e}"),
                (g, w) => panic!("{verdict:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn another_shape_class_or_schema_is_refused() {
        let p = Path::new("node.json");
        let e = envelope(&report(Verdict::Qualified { max_tokens: 8 }), "qwen3moe-h4096-e128-top8-ffn1536", p).unwrap_err();
        assert!(e.contains("qualifies shape class qwen3moe-h2048") && e.contains("h4096"), "{e}");
        let mut old = report(Verdict::Qualified { max_tokens: 8 });
        old.schema = SCHEMA_VERSION + 1;
        assert!(envelope(&old, CLASS, p).unwrap_err().contains("schema"));
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
            norm_eps: a.norm_eps,
        };
        assert_eq!(config.shape_class(), s.name);
    }

    #[test]
    fn clamping_takes_the_smaller_of_the_request_and_the_envelope() {
        assert_eq!(clamp(16_384, 4096, &Envelope::Validated(8191)), (8191, 4096));
        assert_eq!(clamp(16_384, 16_384, &Envelope::Validated(8191)), (8191, 8191));
        assert_eq!(clamp(2048, 512, &Envelope::Validated(8191)), (2048, 512));
        assert_eq!(clamp(2048, 512, &Envelope::Unvalidated("cpu".into())), (2048, 512));
    }

    #[test]
    fn reports_are_read_with_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("r.json");
        std::fs::write(&f, serde_json::to_string(&report(Verdict::Qualified { max_tokens: 5 })).unwrap()).unwrap();
        assert_eq!(read_report(&f).unwrap().shape_class, CLASS);
        std::fs::write(&f, "{\"schema\": 1}").unwrap();
        let e = read_report(&f).unwrap_err();
        assert!(e.contains("r.json") && e.contains("not a self-test report"), "{e}");
        assert!(read_report(&dir.path().join("missing.json")).unwrap_err().contains("missing.json"));
    }
}
