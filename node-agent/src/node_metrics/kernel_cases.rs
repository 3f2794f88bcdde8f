//! The kernel self-test's cases per kernel and result (pure): which kernel failed or hung at
//! the node's latest qualification, not only how many cases did.

use std::collections::BTreeMap;

use brink_api::selftest::{CaseResult, SelfTestReport};
use brink_engine::server::telemetry::{Kind, Scalar};

use super::qualification::CaseCounts;

/// Counts by kernel (the report's `kernel` column).
pub type KernelCases = BTreeMap<String, CaseCounts>;

/// `report`'s cases by kernel and result. A planned case (checked on the CPU, not run) counts
/// as skipped: it validated nothing.
pub fn by_kernel(report: &SelfTestReport) -> KernelCases {
    let mut out = KernelCases::new();
    for c in &report.cases {
        let k = out.entry(c.kernel.clone()).or_default();
        match c.result {
            CaseResult::Passed => k.passed += 1,
            CaseResult::Failed => k.failed += 1,
            CaseResult::Hung => k.hung += 1,
            CaseResult::Skipped | CaseResult::Planned => k.skipped += 1,
            CaseResult::Flagged => k.flagged += 1,
            CaseResult::Missed => k.missed += 1,
        }
    }
    out
}

/// `brink_selftest_kernel_cases{shape_class,suite,kernel,result}` for each class's counts.
pub fn scalar(classes: &BTreeMap<String, KernelCases>) -> Scalar {
    let samples = classes
        .iter()
        .flat_map(|(class, kernels)| {
            kernels.iter().flat_map(move |(kernel, counts)| {
                counts.by_result().map(|(result, n)| {
                    let labels = vec![
                        ("shape_class", class.clone()),
                        ("suite", "kernel".to_string()),
                        ("kernel", kernel.clone()),
                        ("result", result.to_string()),
                    ];
                    (labels, n as f64)
                })
            })
        })
        .collect();
    Scalar {
        name: "brink_selftest_kernel_cases",
        kind: Kind::Gauge,
        help: "Cases of the shape class's latest kernel self-test on this node, per kernel and result (passed, failed, hung, skipped; negative controls flagged or missed).",
        samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::selftest::CaseReport;

    fn case(kernel: &str, result: CaseResult) -> CaseReport {
        CaseReport {
            id: format!("{kernel}/x"),
            kernel: kernel.into(),
            tokens: 1,
            batch: Vec::new(),
            reasons: Vec::new(),
            expect: "pass".into(),
            result,
            detail: String::new(),
            max_rel_err: None,
            tolerance: None,
            compared: 0,
            kernel_ms: None,
            wall_ms: 0.0,
        }
    }

    #[test]
    fn counts_per_kernel_and_result() {
        use CaseResult::*;
        let cases: Vec<CaseReport> = [
            ("gemm", Passed),
            ("gemm", Passed),
            ("gemm", Failed),
            ("moe", Hung),
            ("moe", Planned),
            ("moe", Skipped),
            ("nc", Flagged),
            ("nc", Missed),
        ]
        .iter()
        .map(|(k, r)| case(k, *r))
        .collect();
        let mut report = empty_report();
        report.cases = cases;
        let k = by_kernel(&report);
        assert_eq!(k["gemm"], CaseCounts { passed: 2, failed: 1, ..CaseCounts::default() });
        assert_eq!(k["moe"], CaseCounts { hung: 1, skipped: 2, ..CaseCounts::default() });
        assert_eq!(k["nc"], CaseCounts { flagged: 1, missed: 1, ..CaseCounts::default() });
        let s = scalar(&BTreeMap::from([("c1".to_string(), k)]));
        assert_eq!(s.samples.len(), 3 * 6, "six results per kernel");
        let failed: Vec<f64> = s
            .samples
            .iter()
            .filter(|(l, _)| l.contains(&("kernel", "gemm".to_string())) && l.contains(&("result", "failed".to_string())))
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(failed, [1.0]);
        assert!(s.samples.iter().all(|(l, _)| l[0] == ("shape_class", "c1".to_string()) && l[1] == ("suite", "kernel".to_string())));
    }

    fn empty_report() -> SelfTestReport {
        use brink_api::selftest::{DeviceSummary, NegativeControls, SCHEMA_VERSION, Verdict};
        SelfTestReport {
            schema: SCHEMA_VERSION,
            agent_version: "0".into(),
            kernel_sources_hash: "h".into(),
            device: DeviceSummary {
                gpu: false,
                name: "cpu".into(),
                compute_capability: "-".into(),
                sm_count: 0,
                total_mem_bytes: 0,
                free_mem_bytes: 0,
                driver_cuda_version: None,
                nvrtc_version: None,
                max_grid_dim: [0, 0, 0],
                max_shared_mem_per_block_optin: 0,
                no_gpu_reason: None,
            },
            shape_class: "c1".into(),
            derived: 0,
            executed: 0,
            passed: 0,
            failed: 0,
            hung: 0,
            skipped: 0,
            negative_controls: NegativeControls { expected: 0, flagged: 0, missed: 0, ..Default::default() },
            verdict: Verdict::NotQualified { reason: "r".into() },
            phases: vec![],
            cases: vec![],
        }
    }
}
