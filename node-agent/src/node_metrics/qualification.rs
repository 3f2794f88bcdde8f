//! The node's qualification → gauges (pure): self-test cases by result and suite, the state of
//! the shape class (a state set: 1 for the current state, 0 for the others) and the validated
//! envelope.

use brink_api::selftest::{SelfTestReport, Verdict};
use std::collections::BTreeMap;

use brink_engine::server::telemetry::{Kind, Scalar};

use super::kernel_cases::{self, KernelCases};

/// Every state `brink_qualified` has a series for; the names are the report's JSON (`state`).
pub const STATES: [&str; 5] = ["qualified", "clamped", "disqualified", "notQualified", "proofIncomplete"];

/// The state's name as the report's JSON writes it.
pub fn state_name(v: &Verdict) -> &'static str {
    match v {
        Verdict::Qualified { .. } => STATES[0],
        Verdict::Clamped { .. } => STATES[1],
        Verdict::Disqualified { .. } => STATES[2],
        Verdict::NotQualified { .. } => STATES[3],
        Verdict::ProofIncomplete { .. } => STATES[4],
    }
}

/// Cases of one suite by result. `flagged` and `missed` are negative controls (the kernel suite
/// has them; the model suite has none and leaves them 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaseCounts {
    pub passed: u64,
    pub failed: u64,
    pub hung: u64,
    pub skipped: u64,
    pub flagged: u64,
    pub missed: u64,
}

impl CaseCounts {
    /// The kernel self-test's counts, negative controls included.
    pub fn kernel(report: &SelfTestReport) -> CaseCounts {
        CaseCounts {
            passed: report.passed,
            failed: report.failed,
            hung: report.hung,
            skipped: report.skipped,
            flagged: report.negative_controls.flagged,
            missed: report.negative_controls.missed,
        }
    }

    /// From a suite's summary (a cached qualification keeps only these): the negative controls
    /// flagged are the executed cases that are neither a pass, a failure, a hang nor a miss.
    pub fn from_summary(s: &brink_api::ReportSummary) -> CaseCounts {
        let missed = s.negative_controls_missed;
        CaseCounts {
            passed: s.passed,
            failed: s.failed,
            hung: s.hung,
            skipped: s.skipped,
            flagged: s.executed.saturating_sub(s.passed + s.failed + s.hung + missed),
            missed,
        }
    }

    pub fn by_result(&self) -> [(&'static str, u64); 6] {
        [
            ("passed", self.passed),
            ("failed", self.failed),
            ("hung", self.hung),
            ("skipped", self.skipped),
            ("flagged", self.flagged),
            ("missed", self.missed),
        ]
    }
}

/// What the qualification gauges show.
#[derive(Clone, Debug, PartialEq)]
pub struct QualificationMetrics {
    pub shape_class: String,
    /// The state of the shape class on this node: the kernel report's verdict, unless the caller
    /// (`up`, having run the model-level test too) sets the combined one.
    pub verdict: Verdict,
    pub kernel: CaseCounts,
    /// The model-level threshold test's counts, when it ran.
    pub model: Option<CaseCounts>,
    /// The kernel self-test's cases per kernel (empty when only its counts are known).
    pub kernels: KernelCases,
}

impl QualificationMetrics {
    /// From the kernel self-test's report and, when the model-level test ran, its counts.
    pub fn new(report: &SelfTestReport, model: Option<CaseCounts>) -> QualificationMetrics {
        QualificationMetrics {
            shape_class: report.shape_class.clone(),
            verdict: report.verdict.clone(),
            kernel: CaseCounts::kernel(report),
            model,
            kernels: kernel_cases::by_kernel(report),
        }
    }

    /// The same counts under another verdict (the one both suites decided together).
    #[allow(dead_code)] // for `up`, which decides the verdict from both suites
    pub fn with_verdict(self, verdict: Verdict) -> QualificationMetrics {
        QualificationMetrics { verdict, ..self }
    }

    /// The envelope's batch limit, where the state has one.
    pub fn envelope(&self) -> Option<u64> {
        match self.verdict {
            Verdict::Qualified { max_tokens } | Verdict::Clamped { max_tokens, .. } => Some(max_tokens),
            Verdict::Disqualified { .. } | Verdict::NotQualified { .. } | Verdict::ProofIncomplete { .. } => None,
        }
    }

    pub fn scalars(&self) -> Vec<Scalar> {
        let class = || ("shape_class", self.shape_class.clone());
        let suites = [("kernel", Some(self.kernel)), ("model", self.model)];
        let cases = suites
            .iter()
            .filter_map(|(suite, counts)| counts.map(|c| (*suite, c)))
            .flat_map(|(suite, c)| {
                c.by_result().map(|(result, n)| (vec![("result", result.to_string()), ("suite", suite.to_string())], n as f64))
            })
            .collect();
        let current = state_name(&self.verdict);
        let states = STATES.iter().map(|&s| (vec![class(), ("state", s.to_string())], f64::from(u8::from(s == current)))).collect();
        let mut out = vec![
            Scalar {
                name: "brink_selftest_cases",
                kind: Kind::Gauge,
                help: "Cases of this node's last qualification by result (passed, failed, hung, skipped; negative controls flagged or missed) and suite (kernel self-test, model-level threshold test).",
                samples: cases,
            },
            Scalar {
                name: "brink_qualified",
                kind: Kind::Gauge,
                help: "The shape class's qualification state on this node: 1 for the current state (qualified, clamped, disqualified, notQualified), 0 for the others.",
                samples: states,
            },
            Scalar {
                name: "brink_envelope_max_batch_tokens",
                kind: Kind::Gauge,
                help: "The largest batch (tokens per forward pass) validated for the shape class; absent when none is (disqualified, or nothing ran on a GPU).",
                samples: self.envelope().map(|t| vec![(vec![class()], t as f64)]).unwrap_or_default(),
            },
        ];
        // Absent, not empty, when only the counts are known (a cached result).
        if !self.kernels.is_empty() {
            out.push(kernel_cases::scalar(&BTreeMap::from([(self.shape_class.clone(), self.kernels.clone())])));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_a_summary_recover_the_flagged_controls() {
        let s =
            brink_api::ReportSummary { derived: 20, executed: 15, passed: 10, failed: 1, hung: 1, skipped: 5, negative_controls_missed: 1 };
        let c = CaseCounts::from_summary(&s);
        assert_eq!((c.passed, c.failed, c.hung, c.skipped, c.flagged, c.missed), (10, 1, 1, 5, 2, 1));
        assert_eq!(CaseCounts::from_summary(&brink_api::ReportSummary::default()), CaseCounts::default());
    }
    use brink_api::selftest::{DeviceSummary, NegativeControls, SCHEMA_VERSION};

    const CLASS: &str = "qwen3moe-h2048-e128-top8-ffn768";

    fn report(verdict: Verdict) -> SelfTestReport {
        SelfTestReport {
            schema: SCHEMA_VERSION,
            agent_version: "0.1.0".into(),
            kernel_sources_hash: "h".into(),
            device: DeviceSummary {
                gpu: true,
                name: "NVIDIA GB10".into(),
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
            derived: 260,
            executed: 250,
            passed: 240,
            failed: 6,
            hung: 4,
            skipped: 10,
            negative_controls: NegativeControls { expected: 5, flagged: 4, missed: 1, ..Default::default() },
            verdict,
            phases: vec![],
            cases: vec![],
        }
    }

    fn series<'a>(table: &'a [Scalar], name: &str) -> &'a [(Vec<(&'static str, String)>, f64)] {
        &table.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no {name}")).samples
    }

    fn flat(samples: &[(Vec<(&'static str, String)>, f64)]) -> Vec<(String, f64)> {
        samples.iter().map(|(l, v)| (l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), *v)).collect()
    }

    #[test]
    fn cases_by_result_and_suite() {
        let model = CaseCounts { passed: 30, failed: 1, hung: 2, skipped: 3, flagged: 0, missed: 0 };
        let q = QualificationMetrics::new(&report(Verdict::Clamped { max_tokens: 8191, first_failure: 8192 }), Some(model));
        let table = q.scalars();
        let want: Vec<(String, f64)> = [
            ("passed", "kernel", 240.0),
            ("failed", "kernel", 6.0),
            ("hung", "kernel", 4.0),
            ("skipped", "kernel", 10.0),
            ("flagged", "kernel", 4.0),
            ("missed", "kernel", 1.0),
            ("passed", "model", 30.0),
            ("failed", "model", 1.0),
            ("hung", "model", 2.0),
            ("skipped", "model", 3.0),
            ("flagged", "model", 0.0),
            ("missed", "model", 0.0),
        ]
        .iter()
        .map(|(r, s, v)| (format!("result={r},suite={s}"), *v))
        .collect();
        assert_eq!(flat(series(&table, "brink_selftest_cases")), want);
        // Without the model-level test, only the kernel suite.
        let q = QualificationMetrics::new(&report(Verdict::Qualified { max_tokens: 16_384 }), None);
        let cases = flat(series(&q.scalars(), "brink_selftest_cases"));
        assert_eq!(cases.len(), 6);
        assert!(cases.iter().all(|(l, _)| l.ends_with("suite=kernel")));
    }

    #[test]
    fn one_state_is_current_and_the_envelope_follows_it() {
        let cases: [(Verdict, &str, Option<f64>); 4] = [
            (Verdict::Qualified { max_tokens: 16_384 }, "qualified", Some(16_384.0)),
            (Verdict::Clamped { max_tokens: 8191, first_failure: 8192 }, "clamped", Some(8191.0)),
            (Verdict::Disqualified { reason: "fails at 63 but 64 passes".into() }, "disqualified", None),
            (Verdict::NotQualified { reason: "no GPU".into() }, "notQualified", None),
        ];
        for (verdict, current, envelope) in cases {
            let table = QualificationMetrics::new(&report(verdict.clone()), None).scalars();
            let states = flat(series(&table, "brink_qualified"));
            let want: Vec<(String, f64)> =
                STATES.iter().map(|s| (format!("shape_class={CLASS},state={s}"), if *s == current { 1.0 } else { 0.0 })).collect();
            assert_eq!(states, want, "{verdict:?}");
            let env = flat(series(&table, "brink_envelope_max_batch_tokens"));
            assert_eq!(env, envelope.map(|t| (format!("shape_class={CLASS}"), t)).into_iter().collect::<Vec<_>>(), "{verdict:?}");
        }
    }

    #[test]
    fn a_report_with_cases_adds_the_per_kernel_series_and_a_summary_does_not() {
        let mut r = report(Verdict::Qualified { max_tokens: 16_384 });
        let mut case = brink_api::selftest::CaseReport {
            id: "moe/t64".into(),
            kernel: "moe".into(),
            tokens: 64,
            batch: Vec::new(),
            reasons: Vec::new(),
            expect: "pass".into(),
            result: brink_api::selftest::CaseResult::Hung,
            detail: String::new(),
            max_rel_err: None,
            tolerance: None,
            compared: 0,
            kernel_ms: None,
            wall_ms: 1.0,
        };
        r.cases.push(case.clone());
        case.result = brink_api::selftest::CaseResult::Passed;
        r.cases.push(case);
        let table = QualificationMetrics::new(&r, None).scalars();
        let k = flat(series(&table, "brink_selftest_kernel_cases"));
        assert!(k.contains(&(format!("shape_class={CLASS},suite=kernel,kernel=moe,result=hung"), 1.0)), "{k:?}");
        assert!(k.contains(&(format!("shape_class={CLASS},suite=kernel,kernel=moe,result=passed"), 1.0)), "{k:?}");
        let without = QualificationMetrics::new(&report(Verdict::Qualified { max_tokens: 1 }), None).scalars();
        assert!(without.iter().all(|s| s.name != "brink_selftest_kernel_cases"), "no cases: absent, not empty");
    }

    /// The state label is the report's own JSON name for the verdict.
    #[test]
    fn state_names_are_the_reports_json_names() {
        for v in [
            Verdict::Qualified { max_tokens: 1 },
            Verdict::Clamped { max_tokens: 1, first_failure: 2 },
            Verdict::Disqualified { reason: "r".into() },
            Verdict::NotQualified { reason: "r".into() },
        ] {
            assert_eq!(serde_json::to_value(&v).unwrap()["state"], state_name(&v), "{v:?}");
        }
    }

    #[test]
    fn the_combined_verdict_replaces_the_kernel_reports() {
        let q = QualificationMetrics::new(&report(Verdict::Qualified { max_tokens: 16_384 }), Some(CaseCounts::default()))
            .with_verdict(Verdict::Clamped { max_tokens: 4095, first_failure: 4096 });
        assert_eq!((state_name(&q.verdict), q.envelope(), q.kernel.passed), ("clamped", Some(4095), 240));
    }
}
