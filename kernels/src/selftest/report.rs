//! Judging results against expectations, the verdict for the shape class, and the report a
//! person reads at a glance. All pure: tested without a GPU.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use brink_api::selftest::{CaseReport, CaseResult, ControlsProof, NegativeControls, Phase, REQUIRED_CONTROLS, SelfTestReport, Verdict};

use super::case::{Case, Expect};
use super::runner::{CaseTimes, Returned};
use crate::check::Outcome;

pub fn is_negative_control(case: &Case) -> bool {
    case.params.is_negative_control()
}

fn expect_name(e: &Expect) -> String {
    match e {
        Expect::Pass => "pass".into(),
        Expect::LaunchError { kernel } => format!("launch_error({kernel})"),
        Expect::Hang => "hang".into(),
    }
}

/// Turns what came back for a case into its report line.
pub fn judge(case: &Case, returned: &Returned) -> CaseReport {
    let negative = is_negative_control(case);
    let mut r = CaseReport {
        id: case.id.clone(),
        kernel: case.kernel.clone(),
        tokens: case.tokens,
        batch: case.batch.clone(),
        reasons: case.reasons.clone(),
        expect: expect_name(&case.expect),
        result: CaseResult::Failed,
        detail: String::new(),
        max_rel_err: None,
        tolerance: None,
        compared: 0,
        kernel_ms: None,
        wall_ms: 0.0,
    };
    let (caught, detail) = match returned {
        Returned::Hung { wall_ms } => {
            r.wall_ms = *wall_ms;
            (case.expect == Expect::Hang, format!("hung: {} at {} tokens killed after {} ms", case.kernel, case.tokens, case.deadline_ms))
        }
        Returned::WorkerDied { detail, wall_ms } => {
            r.wall_ms = *wall_ms;
            (false, format!("worker died: {detail}"))
        }
        Returned::Outcome { outcome, wall_ms, .. } => {
            r.wall_ms = *wall_ms;
            match outcome {
                Outcome::Ran(check) => {
                    r.max_rel_err = Some(check.max_rel_err);
                    r.tolerance = Some(check.tolerance);
                    r.compared = check.compared;
                    r.kernel_ms = Some(check.kernel_ms);
                    let ok = check.passed();
                    let detail = if ok {
                        format!("max rel err {:.2e} <= {:.0e} over {} values", check.max_rel_err, check.tolerance, check.compared)
                    } else {
                        format!(
                            "max rel err {:.2e} (tolerance {:.0e}), {} unwritten, {} written past the end, {} integer mismatches; {}",
                            check.max_rel_err, check.tolerance, check.unwritten, check.past_end, check.int_mismatches, check.note
                        )
                    };
                    (case.expect == Expect::Pass && ok, detail)
                }
                Outcome::LaunchError(e) => {
                    let expected = matches!(&case.expect, Expect::LaunchError { kernel } if *kernel == e.kernel && e.phase == "launch");
                    (expected, format!("launch error: {e}"))
                }
                Outcome::PlanRejected { error } => (false, format!("plan rejected: {error}")),
                Outcome::Error { error } => (false, format!("CUDA error: {error}")),
            }
        }
    };
    r.detail = match returned {
        Returned::Outcome { times, .. } => format!("{detail}{}", times_note(times)),
        _ => detail,
    };
    r.result = match (negative && case.expect != Expect::Pass, caught) {
        (true, true) => CaseResult::Flagged,
        (true, false) => CaseResult::Missed,
        (false, true) => CaseResult::Passed,
        (false, false) if matches!(returned, Returned::Hung { .. }) => CaseResult::Hung,
        (false, false) => CaseResult::Failed,
    };
    r
}

/// Where the worker's time on a case went, for its detail line: "; GPU half 12.3 ms (inputs
/// 8.0, kernel 2.1, outputs 2.2), host check 40.5 ms" (empty when the worker said nothing).
pub fn times_note(t: &CaseTimes) -> String {
    let mut s = String::new();
    if let Some(g) = t.gpu_ms {
        let _ = write!(s, "; GPU half {g:.1} ms");
        if !t.parts.is_empty() {
            let parts: Vec<String> = t.parts.iter().map(|(w, ms)| format!("{w} {ms:.1}")).collect();
            let _ = write!(s, " ({})", parts.join(", "));
        }
    }
    if let Some(h) = t.host_ms {
        let _ = write!(s, "{}host check {h:.1} ms", if s.is_empty() { "; " } else { ", " });
    }
    s
}

/// Phases named with this prefix hold one family's sums (see [`family_phases`]); the text report
/// shows them on their own line.
pub const FAMILY_PHASE: &str = "  family ";

/// Per kernel family, the worker's time summed over its cases that came back: the GPU halves
/// (and their marked parts) and the host checks, as phases (`"  family attention: GPU halves"`,
/// `"  family attention: GPU half kernel"`, `"  family attention: host checks"`), the family
/// whose halves took longest first. Which half of which family dominates a run, from its report.
pub fn family_phases(returned: &[(String, CaseTimes)]) -> Vec<Phase> {
    // Per family: GPU halves, host checks, parts (in the order first seen).
    let mut by: Vec<(&str, f64, f64, Vec<(String, f64)>)> = Vec::new();
    for (kernel, t) in returned {
        let kernel = kernel.as_str();
        let at = match by.iter().position(|f| f.0 == kernel) {
            Some(at) => at,
            None => {
                by.push((kernel, 0.0, 0.0, Vec::new()));
                by.len() - 1
            }
        };
        let f = &mut by[at];
        f.1 += t.gpu_ms.unwrap_or(0.0);
        f.2 += t.host_ms.unwrap_or(0.0);
        for (w, ms) in &t.parts {
            match f.3.iter_mut().find(|(n, _)| n == w) {
                Some((_, sum)) => *sum += ms,
                None => f.3.push((w.clone(), *ms)),
            }
        }
    }
    by.sort_by(|a, b| (b.1 + b.2).total_cmp(&(a.1 + a.2)).then_with(|| a.0.cmp(b.0)));
    let mut v = Vec::new();
    for (kernel, gpu, host, parts) in by {
        v.push(Phase { name: format!("{FAMILY_PHASE}{kernel}: GPU halves"), seconds: gpu / 1e3 });
        v.extend(parts.into_iter().map(|(w, ms)| Phase { name: format!("{FAMILY_PHASE}{kernel}: GPU half {w}"), seconds: ms / 1e3 }));
        v.push(Phase { name: format!("{FAMILY_PHASE}{kernel}: host checks"), seconds: host / 1e3 });
    }
    v
}

/// The text line of [`family_phases`]: "attention GPU 12.3s (history 5.0, kernel 0.3) + host
/// 40.1s (284 cases); ...".
fn family_split_line(report: &SelfTestReport) -> Option<String> {
    let mut line: Vec<String> = Vec::new();
    let mut current: Option<(String, String, Vec<String>)> = None;
    let cases = |kernel: &str| {
        report.cases.iter().filter(|c| c.kernel == kernel && !matches!(c.result, CaseResult::Skipped | CaseResult::Planned)).count()
    };
    for p in report.phases.iter().filter_map(|p| Some((p.name.strip_prefix(FAMILY_PHASE)?, p.seconds))) {
        let (name, secs) = p;
        let Some((kernel, what)) = name.split_once(": ") else { continue };
        if what == "GPU halves" {
            current = Some((kernel.to_string(), format!("{secs:.1}s"), Vec::new()));
        } else if let (Some(part), Some(c)) = (what.strip_prefix("GPU half "), current.as_mut()) {
            c.2.push(format!("{part} {secs:.1}"));
        } else if let (Some(c), "host checks") = (current.take(), what) {
            let parts = if c.2.is_empty() { String::new() } else { format!(" ({})", c.2.join(", ")) };
            line.push(format!("{} GPU {}{parts} + host {secs:.1}s ({} cases)", c.0, c.1, cases(&c.0)));
        }
    }
    (!line.is_empty()).then(|| line.join("; "))
}

pub fn skipped(case: &Case, why: &str) -> CaseReport {
    let mut r = judge(case, &Returned::WorkerDied { detail: String::new(), wall_ms: 0.0 });
    r.result = CaseResult::Skipped;
    r.detail = why.to_string();
    r
}

/// The verdict of the design: qualified when everything passed; clamped under the first
/// failure when every failure lies above every pass; disqualified when a failure lies below a
/// passing count (chunking cannot avoid it) or a negative control was missed. Qualified and
/// clamped hold only when every required control was shown flagged ([`controls_shown`]);
/// otherwise the proof is incomplete.
pub fn verdict(cases: &[CaseReport], executed_any: bool, negative: &NegativeControls) -> Verdict {
    if !executed_any {
        return Verdict::NotQualified { reason: "no case was executed on a GPU".into() };
    }
    if negative.missed > 0 {
        let ids: Vec<&str> = cases.iter().filter(|c| c.result == CaseResult::Missed).map(|c| c.id.as_str()).collect();
        return Verdict::Disqualified { reason: format!("the self-test cannot fail: negative control(s) not flagged: {}", ids.join(", ")) };
    }
    let v = brink_api::selftest::threshold_verdict(cases);
    let would = match &v {
        Verdict::Qualified { max_tokens } => format!("qualified up to {max_tokens} tokens"),
        Verdict::Clamped { max_tokens, first_failure } => format!("clamped to {max_tokens} tokens (first failure at {first_failure})"),
        _ => return v,
    };
    match controls_shown(cases, negative) {
        Ok(()) => v,
        Err(why) => Verdict::ProofIncomplete { reason: format!("{why}; the cases alone would be {would}") },
    }
}

/// The required controls flagged by this run's cases (each: some case flagged, none missed).
pub fn flagged_controls(cases: &[CaseReport]) -> Vec<String> {
    REQUIRED_CONTROLS
        .iter()
        .filter(|k| {
            let of = || cases.iter().filter(|c| c.kernel == **k);
            of().any(|c| c.result == CaseResult::Flagged) && !of().any(|c| c.result == CaseResult::Missed)
        })
        .map(|k| k.to_string())
        .collect()
}

/// Whether every required control was shown flagged on this device under this run's
/// fingerprint: by this run's cases, or by an earlier proof whose fingerprint is this run's.
/// `Err` says which were not, and why an earlier proof does not count.
pub fn controls_shown(cases: &[CaseReport], negative: &NegativeControls) -> Result<(), String> {
    let now = flagged_controls(cases);
    let earlier: Option<&ControlsProof> = negative.earlier_proof.as_ref();
    let earlier_holds = earlier.is_some_and(|p| negative.fingerprint.as_deref() == Some(p.fingerprint.as_str()));
    let missing: Vec<&str> = REQUIRED_CONTROLS
        .iter()
        .copied()
        .filter(|k| !(now.iter().any(|f| f == k) || earlier_holds && earlier.is_some_and(|p| p.flagged.iter().any(|f| f == k))))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let this_run = match &negative.not_run_reason {
        Some(why) => format!("not run in this run ({why})"),
        None => "not flagged in this run".to_string(),
    };
    let earlier = match (earlier, earlier_holds) {
        (None, _) => "no earlier proof on this node".to_string(),
        (Some(p), false) => format!("the earlier proof of {} was under another fingerprint ({})", p.at, short(&p.fingerprint)),
        (Some(p), true) => format!("the earlier proof of {} flagged only {}", p.at, p.flagged.join(", ")),
    };
    Err(format!("proof incomplete: negative control(s) {} {this_run}, {earlier}", missing.join(", ")))
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

pub fn count_negative(cases: &[CaseReport]) -> NegativeControls {
    let expected = cases.iter().filter(|c| matches!(c.result, CaseResult::Flagged | CaseResult::Missed)).count() as u64;
    let flagged = cases.iter().filter(|c| c.result == CaseResult::Flagged).count() as u64;
    NegativeControls { expected, flagged, missed: expected - flagged, ..NegativeControls::default() }
}

/// Fills the counters and the verdict of a report from its cases.
pub fn summarise(report: &mut SelfTestReport) {
    let count = |r: CaseResult| report.cases.iter().filter(|c| c.result == r).count() as u64;
    report.derived = report.cases.len() as u64;
    report.skipped = count(CaseResult::Skipped) + count(CaseResult::Planned);
    report.executed = report.derived - report.skipped;
    report.passed = count(CaseResult::Passed);
    report.failed = count(CaseResult::Failed);
    report.hung = count(CaseResult::Hung);
    let mut counted = count_negative(&report.cases);
    counted.not_run_reason = report.negative_controls.not_run_reason.take();
    counted.fingerprint = report.negative_controls.fingerprint.take();
    counted.earlier_proof = report.negative_controls.earlier_proof.take();
    report.negative_controls = counted;
    report.verdict = verdict(&report.cases, report.executed > 0 && report.device.gpu, &report.negative_controls);
}

/// The table a person reads: one row per kernel, then anything that failed, the negative
/// controls, the phases and the verdict.
pub fn render(report: &SelfTestReport) -> String {
    let mut s = String::new();
    let d = &report.device;
    if d.gpu {
        let _ = writeln!(
            s,
            "device   {} (sm_{}, {} SMs, {:.1} GiB), CUDA driver {}, NVRTC {}",
            d.name,
            d.compute_capability.replace('.', ""),
            d.sm_count,
            d.total_mem_bytes as f64 / (1u64 << 30) as f64,
            d.driver_cuda_version.as_deref().unwrap_or("?"),
            d.nvrtc_version.as_deref().unwrap_or("?")
        );
    } else {
        let _ = writeln!(s, "device   NO GPU: {}", d.no_gpu_reason.as_deref().unwrap_or("none found"));
        let _ = writeln!(s, "         kernels were not run; launch plans and thresholds were checked on the CPU against {}", d.name);
    }
    let _ = writeln!(
        s,
        "class    {}   kernels {}",
        report.shape_class,
        &report.kernel_sources_hash[..12.min(report.kernel_sources_hash.len())]
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<22} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7} {:>7} {:>8} {:>10} {:>10}",
        "kernel", "derived", "executed", "passed", "failed", "hung", "planned", "skipped", "flagged", "max err", "max ms"
    );
    let mut by_kernel: BTreeMap<&str, Vec<&CaseReport>> = BTreeMap::new();
    for c in &report.cases {
        by_kernel.entry(c.kernel.as_str()).or_default().push(c);
    }
    for (kernel, cases) in &by_kernel {
        let n = |r: CaseResult| cases.iter().filter(|c| c.result == r).count();
        let (planned, skipped) = (n(CaseResult::Planned), n(CaseResult::Skipped));
        let err = cases.iter().filter_map(|c| c.max_rel_err).fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
        let ms = cases.iter().filter_map(|c| c.kernel_ms).fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
        let _ = writeln!(
            s,
            "{:<22} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7} {:>7} {:>8} {:>10} {:>10}",
            kernel,
            cases.len(),
            cases.len() - skipped - planned,
            n(CaseResult::Passed),
            n(CaseResult::Failed),
            n(CaseResult::Hung),
            planned,
            skipped,
            format!("{}/{}", n(CaseResult::Flagged), n(CaseResult::Flagged) + n(CaseResult::Missed)),
            err.map_or("-".into(), |e| format!("{e:.1e}")),
            ms.map_or("-".into(), |m| format!("{m:.2}")),
        );
    }
    let planned = report.cases.iter().filter(|c| c.result == CaseResult::Planned).count() as u64;
    let _ = writeln!(
        s,
        "{:<22} {:>7} {:>8} {:>6} {:>6} {:>5} {:>7} {:>7} {:>8}",
        "total",
        report.derived,
        report.executed,
        report.passed,
        report.failed,
        report.hung,
        planned,
        report.skipped - planned,
        format!("{}/{}", report.negative_controls.flagged, report.negative_controls.expected)
    );
    let problems: Vec<&CaseReport> =
        report.cases.iter().filter(|c| matches!(c.result, CaseResult::Failed | CaseResult::Hung | CaseResult::Missed)).collect();
    if !problems.is_empty() {
        let _ = writeln!(s, "\nproblems:");
        for c in problems.iter().take(30) {
            let _ = writeln!(s, "  {:?} {}: {}", c.result, c.id, c.detail);
        }
        if problems.len() > 30 {
            let _ = writeln!(s, "  ... and {} more (see --json)", problems.len() - 30);
        }
    }
    let negatives: Vec<&CaseReport> = report.cases.iter().filter(|c| c.kernel.starts_with("neg_")).collect();
    if !negatives.is_empty() {
        let _ = writeln!(s, "\nnegative controls (deliberately broken kernels):");
        for c in negatives {
            let _ = writeln!(s, "  {:<8} {:<34} expect {:<40} {}", format!("{:?}", c.result), c.id, c.expect, c.detail);
        }
    } else if let Some(why) = &report.negative_controls.not_run_reason {
        let _ = writeln!(s, "\nnegative controls not run: {why}");
    }
    let skipped: Vec<&CaseReport> = report.cases.iter().filter(|c| c.result == CaseResult::Skipped).collect();
    if !skipped.is_empty() {
        let _ = writeln!(s, "\nskipped ({}), first ones:", skipped.len());
        for c in skipped.iter().take(8) {
            let _ = writeln!(s, "  {}: {}", c.id, c.detail);
        }
    }
    let costs = family_costs(&report.cases);
    if !costs.is_empty() {
        let line: Vec<String> = costs.iter().map(|c| format!("{} {:.1}s ({} cases)", c.kernel, c.wall_ms / 1e3, c.cases)).collect();
        let _ = writeln!(s, "\ntime by kernel family (wall, most first): {}", line.join(", "));
    }
    if let Some(line) = family_split_line(report) {
        let _ = writeln!(s, "\nGPU halves vs host checks by family (sums, most first): {line}");
    }
    let phases = report.phases.iter().filter(|p| !p.name.starts_with(FAMILY_PHASE));
    let _ = writeln!(s, "\nphases:  {}", phases.map(|p| format!("{} {:.2}s", p.name, p.seconds)).collect::<Vec<_>>().join(", "));
    let _ = writeln!(
        s,
        "verdict: {}",
        match &report.verdict {
            brink_api::Verdict::Qualified { max_tokens } => format!("QUALIFIED (every executed case passed, up to {max_tokens} tokens)"),
            brink_api::Verdict::Clamped { max_tokens, first_failure } => {
                format!("CLAMPED: serve with batch and chunk <= {max_tokens} tokens (first failure at {first_failure})")
            }
            brink_api::Verdict::Disqualified { reason } => format!("DISQUALIFIED: {reason}"),
            brink_api::Verdict::NotQualified { reason } => format!("NOT QUALIFIED: {reason}"),
            brink_api::Verdict::ProofIncomplete { reason } => format!("PROOF INCOMPLETE (not qualified): {reason}"),
        }
    );
    s
}

/// The wall time one kernel family's executed cases took, the device and its CPU twin together.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyCost {
    pub kernel: String,
    pub wall_ms: f64,
    pub cases: usize,
}

/// Each kernel's executed cases' wall time summed, the most expensive family first (ties by
/// name): where a self-test's minutes go.
pub fn family_costs(cases: &[CaseReport]) -> Vec<FamilyCost> {
    let mut by: Vec<FamilyCost> = Vec::new();
    for c in cases.iter().filter(|c| !matches!(c.result, CaseResult::Skipped | CaseResult::Planned)) {
        match by.iter_mut().find(|f| f.kernel == c.kernel) {
            Some(f) => {
                f.wall_ms += c.wall_ms;
                f.cases += 1;
            }
            None => by.push(FamilyCost { kernel: c.kernel.clone(), wall_ms: c.wall_ms, cases: 1 }),
        }
    }
    by.sort_by(|a, b| b.wall_ms.total_cmp(&a.wall_ms).then_with(|| a.kernel.cmp(&b.kernel)));
    by
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(kernel: &str, tokens: u64, result: CaseResult) -> CaseReport {
        CaseReport {
            id: format!("{kernel}/t{tokens}"),
            kernel: kernel.into(),
            tokens,
            batch: vec![tokens],
            reasons: vec![],
            expect: "pass".into(),
            result,
            detail: "x".into(),
            max_rel_err: None,
            tolerance: None,
            compared: 0,
            kernel_ms: None,
            wall_ms: 0.0,
        }
    }

    fn none() -> NegativeControls {
        NegativeControls::default()
    }

    #[test]
    fn family_costs_sum_executed_cases_most_expensive_first() {
        let timed = |kernel: &str, result: CaseResult, ms: f64| CaseReport { wall_ms: ms, ..case(kernel, 1, result) };
        let cases = [
            timed("attention", CaseResult::Passed, 900.0),
            timed("rope", CaseResult::Passed, 5.0),
            timed("attention", CaseResult::Failed, 100.0),
            timed("moe_gemm", CaseResult::Passed, 400.0),
            timed("moe_gemv", CaseResult::Planned, 0.0),
            timed("moe_gemm", CaseResult::Skipped, 9_999.0),
            timed("rope", CaseResult::Skipped, 1.0),
            timed("neg_gemv_gridz", CaseResult::Flagged, 5.0),
        ];
        let got: Vec<(String, f64, usize)> = family_costs(&cases).into_iter().map(|f| (f.kernel, f.wall_ms, f.cases)).collect();
        assert_eq!(
            got,
            vec![
                ("attention".into(), 1000.0, 2),
                ("moe_gemm".into(), 400.0, 1),
                ("neg_gemv_gridz".into(), 5.0, 1),
                ("rope".into(), 5.0, 1)
            ]
        );
        assert!(family_costs(&[]).is_empty());
    }

    /// Per family the sums of the GPU halves, their marked parts and the host checks, as
    /// phases the text report puts on one line (and leaves out of the phases line).
    #[test]
    fn family_phases_split_gpu_halves_and_host_checks() {
        let t = |gpu: f64, host: Option<f64>, parts: &[(&str, f64)]| CaseTimes {
            gpu_ms: Some(gpu),
            host_ms: host,
            parts: parts.iter().map(|(w, ms)| (w.to_string(), *ms)).collect(),
        };
        let returned = vec![
            ("rope".to_string(), t(100.0, None, &[])),
            ("attention".to_string(), t(1000.0, Some(3000.0), &[("history", 600.0), ("kernel", 100.0)])),
            ("attention".to_string(), t(500.0, Some(1000.0), &[("history", 200.0), ("outputs", 50.0)])),
        ];
        let phases = family_phases(&returned);
        let got: Vec<(&str, f64)> = phases.iter().map(|p| (p.name.as_str(), p.seconds)).collect();
        assert_eq!(
            got,
            [
                ("  family attention: GPU halves", 1.5),
                ("  family attention: GPU half history", 0.8),
                ("  family attention: GPU half kernel", 0.1),
                ("  family attention: GPU half outputs", 0.05),
                ("  family attention: host checks", 4.0),
                ("  family rope: GPU halves", 0.1),
                ("  family rope: host checks", 0.0),
            ]
        );
        let mut report: SelfTestReport = serde_json::from_value(serde_json::json!({
            "schema": 1, "agentVersion": "t", "kernelSourcesHash": "h",
            "device": {"gpu": true, "name": "d", "computeCapability": "9.0", "smCount": 1, "totalMemBytes": 1, "freeMemBytes": 1,
                       "driverCudaVersion": null, "nvrtcVersion": null, "maxGridDim": [1, 1, 1], "maxSharedMemPerBlockOptin": 1,
                       "noGpuReason": null},
            "shapeClass": "c", "derived": 0, "executed": 0, "passed": 0, "failed": 0, "hung": 0, "skipped": 0,
            "negativeControls": {"expected": 0, "flagged": 0, "missed": 0, "notRunReason": null},
            "verdict": {"state": "notQualified", "reason": ""}, "phases": [], "cases": []
        }))
        .unwrap();
        report.cases =
            vec![case("attention", 1, CaseResult::Passed), case("attention", 2, CaseResult::Passed), case("rope", 1, CaseResult::Passed)];
        report.phases = phases;
        report.phases.push(Phase { name: "total".into(), seconds: 9.0 });
        let text = render(&report);
        assert!(
            text.contains(
                "by family (sums, most first): attention GPU 1.5s (history 0.8, kernel 0.1, outputs 0.1) + host 4.0s (2 cases); rope GPU 0.1s + host 0.0s (1 cases)"
            ),
            "{text}"
        );
        assert!(text.contains("phases:  total 9.00s\n"), "{text}");
        assert_eq!(times_note(&t(12.0, Some(40.5), &[("kernel", 2.0)])), "; GPU half 12.0 ms (kernel 2.0), host check 40.5 ms");
        assert_eq!(times_note(&CaseTimes::default()), "");
    }

    /// `cases` and both required controls flagged in this run.
    fn with_controls(cases: &[CaseReport]) -> Vec<CaseReport> {
        let mut v = cases.to_vec();
        v.extend(REQUIRED_CONTROLS.iter().map(|k| case(k, 8192, CaseResult::Flagged)));
        v
    }

    #[test]
    fn all_pass_qualifies() {
        let v = verdict(&with_controls(&[case("a", 1, CaseResult::Passed), case("a", 8192, CaseResult::Passed)]), true, &none());
        assert_eq!(v, Verdict::Qualified { max_tokens: 8192 });
    }

    #[test]
    fn failures_above_every_pass_clamp() {
        let cases = [
            case("a", 1, CaseResult::Passed),
            case("a", 8191, CaseResult::Passed),
            case("a", 8192, CaseResult::Failed),
            case("b", 9000, CaseResult::Hung),
        ];
        assert_eq!(verdict(&with_controls(&cases), true, &none()), Verdict::Clamped { max_tokens: 8191, first_failure: 8192 });
    }

    /// Controls run / not run / run under an older fingerprint, for a run whose cases pass.
    #[test]
    fn qualified_only_with_both_controls_shown_under_this_fingerprint() {
        const NOW: &str = "fp-now";
        let passing = [case("a", 1, CaseResult::Passed), case("a", 8192, CaseResult::Passed)];
        let proof = |fingerprint: &str, flagged: &[&str]| ControlsProof {
            fingerprint: fingerprint.into(),
            flagged: flagged.iter().map(|s| s.to_string()).collect(),
            at: "2026-12-01T20:00:00Z".into(),
        };
        let not_run = |earlier: Option<ControlsProof>| NegativeControls {
            not_run_reason: Some("a replica is resident".into()),
            fingerprint: Some(NOW.into()),
            earlier_proof: earlier,
            ..NegativeControls::default()
        };
        let qualified = Verdict::Qualified { max_tokens: 8192 };
        let only_gemv = {
            let mut v = passing.to_vec();
            v.push(case("neg_gemv_gridz", 8192, CaseResult::Flagged));
            v
        };
        type Row<'a> = (&'a str, Vec<CaseReport>, NegativeControls, Option<&'a str>);
        let table: Vec<Row> = vec![
            ("both run and flagged now", with_controls(&passing), none(), None),
            (
                "not run, no earlier proof",
                passing.to_vec(),
                not_run(None),
                Some("not run in this run (a replica is resident), no earlier proof"),
            ),
            ("not run, proof under this fingerprint", passing.to_vec(), not_run(Some(proof(NOW, &REQUIRED_CONTROLS))), None),
            (
                "not run, proof under an older fingerprint",
                passing.to_vec(),
                not_run(Some(proof("fp-older-driver", &REQUIRED_CONTROLS))),
                Some("under another fingerprint (fp-older-dri)"),
            ),
            ("one flagged now", only_gemv.clone(), none(), Some("neg_latent_tailskip not flagged in this run")),
            (
                "one now, the other proven earlier",
                only_gemv,
                NegativeControls { fingerprint: Some(NOW.into()), earlier_proof: Some(proof(NOW, &["neg_latent_tailskip"])), ..none() },
                None,
            ),
            (
                "earlier proof of one only",
                passing.to_vec(),
                not_run(Some(proof(NOW, &["neg_gemv_gridz"]))),
                Some("flagged only neg_gemv_gridz"),
            ),
        ];
        for (name, cases, negative, incomplete) in table {
            let v = verdict(&cases, true, &negative);
            match incomplete {
                None => assert_eq!(v, qualified, "{name}"),
                Some(why) => {
                    let Verdict::ProofIncomplete { reason } = &v else { panic!("{name}: {v:?}") };
                    assert!(reason.contains(why) && reason.contains("would be qualified up to 8192"), "{name}: {reason}");
                }
            }
        }
        // A clamp needs the proof as much as a pass does; a disqualification does not.
        let clamped = [case("a", 1, CaseResult::Passed), case("a", 9000, CaseResult::Failed)];
        assert!(matches!(verdict(&clamped, true, &not_run(None)), Verdict::ProofIncomplete { .. }));
        let tail_bug = [case("a", 5, CaseResult::Failed), case("a", 8192, CaseResult::Passed)];
        assert!(matches!(verdict(&tail_bug, true, &not_run(None)), Verdict::Disqualified { .. }));
    }

    #[test]
    fn failure_below_a_pass_disqualifies() {
        let cases = [case("a", 5, CaseResult::Failed), case("a", 8192, CaseResult::Passed)];
        assert!(matches!(verdict(&cases, true, &none()), Verdict::Disqualified { .. }));
        // A hang at 63 with passes above is a tail bug, not an envelope.
        let cases = [case("a", 63, CaseResult::Hung), case("a", 64, CaseResult::Passed)];
        assert!(matches!(verdict(&cases, true, &none()), Verdict::Disqualified { .. }));
    }

    #[test]
    fn missed_negative_control_disqualifies_and_no_gpu_never_qualifies() {
        let cases = [case("a", 1, CaseResult::Passed), case("neg_x", 8192, CaseResult::Missed)];
        let neg = count_negative(&cases);
        assert_eq!(neg.missed, 1);
        assert!(matches!(verdict(&cases, true, &neg), Verdict::Disqualified { .. }));
        assert!(matches!(verdict(&[case("a", 1, CaseResult::Planned)], false, &none()), Verdict::NotQualified { .. }));
    }

    #[test]
    fn negative_controls_do_not_count_as_fixed_failures() {
        let cases = [
            case("a", 8192, CaseResult::Passed),
            case("neg_gemv_gridz", 8192, CaseResult::Flagged),
            case("neg_gemv_gridz", 8191, CaseResult::Passed),
            case("neg_latent_tailskip", 8192, CaseResult::Flagged),
        ];
        assert_eq!(verdict(&cases, true, &count_negative(&cases)), Verdict::Qualified { max_tokens: 8192 });
    }
}
