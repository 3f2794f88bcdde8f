//! One whole self-test: start the worker, derive the catalogue for the device it found, run
//! every case with its deadline, and build the report (with the wall time of each phase).
//! Without a GPU it says so and checks every derived case's launch plans on the CPU against
//! the recorded limits of the H200 and GB10 instead.

use std::time::Instant;

use brink_api::selftest::{
    CaseReport, CaseResult, ControlsProof, DeviceSummary, NegativeControls, Phase, SCHEMA_VERSION, SelfTestReport, Verdict,
};
use serde::{Deserialize, Serialize};

use super::case::{Case, Expect, OpCase};
use super::catalogue::{self, Catalogue};
use super::report::{family_phases, judge, skipped, summarise};
use super::runner::{Returned, Runner, Start};
use crate::limits::DeviceLimits;
use crate::ops::moe_gemv;
use crate::sources;
use crate::thresholds::{ModelShape, Serving};

/// Counts above this are derived and listed, not run, unless asked for: past ~2M tokens the
/// cases need tens of GiB and host-side routing of billions of ids, and the startup self-test
/// must stay under a minute. `--max-tokens` raises it (a nightly sweep runs them all).
pub const DEFAULT_MAX_TOKENS: u64 = 1 << 21;

/// The phase summing the worker's GPU halves of the cases (launches, data, downloads; the
/// whole case for families whose twin runs inline), and the one summing the host checks (CPU
/// twins and comparisons) that ran on other cores beside them. With the overlap both can
/// exceed "run cases", whose wall time is what the run cost.
pub const GPU_PHASE: &str = "  of which GPU halves of cases (sum)";
pub const HOST_PHASE: &str = "  of which host checks beside the GPU (sum)";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Options {
    pub shape: ModelShape,
    pub serving: Serving,
    /// Run the deliberately broken kernels (only when no replica is resident on the GPU).
    pub negative_controls: bool,
    /// Why negative controls are off, for the report.
    pub negative_controls_off_reason: Option<String>,
    /// Digest of the fingerprint the run is under, when the caller keeps control proofs.
    #[serde(default)]
    pub fingerprint: Option<String>,
    /// The proof of an earlier run the caller kept (see `report::controls_shown`).
    #[serde(default)]
    pub earlier_controls: Option<ControlsProof>,
    /// Skip counts above this.
    pub max_tokens: Option<u64>,
    /// Keep only cases whose id contains this (debugging one kernel).
    pub only: Option<String>,
    /// Multiplies every deadline (under compute-sanitizer kernels run tens of times slower).
    pub deadline_scale: f64,
    /// Device memory kept free for everything else; the cases get the rest.
    pub memory_reserve_bytes: u64,
    /// Overrides the budget derived from the device's free memory (e.g. GB10's OS view).
    pub memory_budget_bytes: Option<u64>,
    pub agent_version: String,
}

impl Options {
    pub fn new(shape: ModelShape, agent_version: &str) -> Self {
        Options {
            shape,
            serving: Serving::default(),
            negative_controls: true,
            negative_controls_off_reason: None,
            fingerprint: None,
            earlier_controls: None,
            max_tokens: Some(DEFAULT_MAX_TOKENS),
            only: None,
            deadline_scale: 1.0,
            memory_reserve_bytes: 4 << 30,
            memory_budget_bytes: None,
            agent_version: agent_version.into(),
        }
    }
}

/// Progress for a caller's display.
pub enum Progress<'a> {
    Derived { cases: usize, skipped: usize },
    Case { index: usize, total: usize, report: &'a CaseReport },
}

pub fn run(runner: &mut Runner, opts: &Options, progress: &mut dyn FnMut(Progress)) -> SelfTestReport {
    let t_start = Instant::now();
    let start = runner.start();
    let mut phases = vec![Phase { name: "start worker (open GPU, compile kernels)".into(), seconds: t_start.elapsed().as_secs_f64() }];
    match start {
        Start::Ready { limits, info, compile_seconds } => {
            phases.push(Phase { name: "  of which compile/load kernels".into(), seconds: compile_seconds });
            let budget = opts.memory_budget_bytes.unwrap_or(info.free_mem_bytes.saturating_sub(opts.memory_reserve_bytes));
            let t = Instant::now();
            let cat = derive(opts, &limits, budget);
            phases.push(Phase { name: "derive cases".into(), seconds: t.elapsed().as_secs_f64() });
            progress(Progress::Derived { cases: cat.cases.len(), skipped: cat.skipped.len() });
            let device = DeviceSummary {
                gpu: true,
                name: info.name.clone(),
                compute_capability: format!("{}.{}", limits.compute_capability.0, limits.compute_capability.1),
                sm_count: limits.sm_count,
                total_mem_bytes: limits.total_mem_bytes,
                free_mem_bytes: info.free_mem_bytes,
                driver_cuda_version: Some(format!("{}.{}", info.driver_cuda_version / 1000, info.driver_cuda_version % 1000 / 10)),
                nvrtc_version: Some(format!("{}.{}", info.nvrtc_version.0, info.nvrtc_version.1)),
                max_grid_dim: limits.max_grid_dim,
                max_shared_mem_per_block_optin: limits.max_shared_mem_per_block_optin,
                no_gpu_reason: None,
            };
            let t = Instant::now();
            let mut cases = Vec::with_capacity(cat.cases.len() + cat.skipped.len());
            let total = cat.cases.len();
            let before = runner.timing;
            let mut times = Vec::new();
            // Results come in the catalogue's order, whatever order the host checks finish in.
            runner.run_all(&cat.cases, &mut |index, returned| {
                if let Returned::Outcome { times: t, .. } = returned {
                    times.push((cat.cases[index].kernel.clone(), t.clone()));
                }
                let r = judge(&cat.cases[index], returned);
                progress(Progress::Case { index, total, report: &r });
                cases.push(r);
            });
            phases.push(Phase { name: "run cases".into(), seconds: t.elapsed().as_secs_f64() });
            let (gpu_ms, host_ms) = (runner.timing.gpu_ms - before.gpu_ms, runner.timing.host_ms - before.host_ms);
            phases.push(Phase { name: GPU_PHASE.into(), seconds: gpu_ms / 1e3 });
            phases.push(Phase { name: HOST_PHASE.into(), seconds: host_ms / 1e3 });
            phases.extend(family_phases(&times));
            cases.extend(cat.skipped.iter().map(|(c, why)| skipped(c, why)));
            finish(opts, device, cases, phases, t_start)
        }
        Start::NoGpu { reason } => plans_only(opts, reason, phases, t_start),
        Start::Failed { error } => {
            let mut report = plans_only(opts, error.clone(), phases, t_start);
            report.verdict = Verdict::Disqualified { reason: format!("the GPU is present but the self-test could not start: {error}") };
            report.device.gpu = true;
            report
        }
    }
}

fn derive(opts: &Options, limits: &DeviceLimits, budget: u64) -> Catalogue {
    let cat_opts =
        catalogue::Options { memory_budget_bytes: budget, negative_controls: opts.negative_controls, max_tokens: opts.max_tokens };
    let mut cat = catalogue::derive(&opts.shape, &opts.serving, limits, &cat_opts);
    if let Some(only) = &opts.only {
        cat.cases.retain(|c| c.id.contains(only.as_str()));
        cat.skipped.retain(|(c, _)| c.id.contains(only.as_str()));
    }
    for c in &mut cat.cases {
        c.deadline_ms = (c.deadline_ms as f64 * opts.deadline_scale) as u64;
    }
    cat
}

/// No GPU: every derived case's launches are planned against the recorded H200 and GB10 limits.
fn plans_only(opts: &Options, reason: String, mut phases: Vec<Phase>, t_start: Instant) -> SelfTestReport {
    let t = Instant::now();
    // Budget as if on a GB10 (the node we ship to): cases it could not hold are skipped there too.
    let gb10 = DeviceLimits::gb10();
    let budget = opts.memory_budget_bytes.unwrap_or(gb10.total_mem_bytes.saturating_sub(opts.memory_reserve_bytes));
    let cat = derive(opts, &gb10, budget);
    let recorded = DeviceLimits::recorded();
    let mut cases: Vec<CaseReport> = cat.cases.iter().map(|c| plan_check(c, &recorded)).collect();
    cases.extend(cat.skipped.iter().map(|(c, why)| skipped(c, why)));
    phases.push(Phase { name: "check plans on the CPU".into(), seconds: t.elapsed().as_secs_f64() });
    let device = DeviceSummary {
        gpu: false,
        name: recorded.iter().map(|l| l.name.as_str()).collect::<Vec<_>>().join(" and "),
        compute_capability: "-".into(),
        sm_count: 0,
        total_mem_bytes: 0,
        free_mem_bytes: 0,
        driver_cuda_version: None,
        nvrtc_version: crate::cuda::compile::nvrtc_version().ok().map(|(a, b)| format!("{a}.{b}")),
        max_grid_dim: gb10.max_grid_dim,
        max_shared_mem_per_block_optin: gb10.max_shared_mem_per_block_optin,
        no_gpu_reason: Some(reason),
    };
    finish(opts, device, cases, phases, t_start)
}

fn plan_check(case: &Case, recorded: &[DeviceLimits]) -> CaseReport {
    let mut r = skipped(case, "");
    let mut notes = Vec::new();
    for limits in recorded {
        match super::plans(case, limits) {
            Ok(plans) => {
                if let Some(bad) = plans.iter().find_map(|p| p.check_cover().err()) {
                    r.result = CaseResult::Failed;
                    notes.push(format!("{}: {bad}", limits.name));
                }
            }
            Err(e) => {
                r.result = CaseResult::Failed;
                notes.push(format!("{}: {e}", limits.name));
            }
        }
        if let (OpCase::NegGemvGridZ(c), Expect::LaunchError { .. }) = (&case.params, &case.expect) {
            let z = moe_gemv::negative_gridz_plan(case.tokens, c).grid[2] as u64;
            notes.push(format!("{}: broken launch would put grid.z = {z} > {}", limits.name, limits.max_grid_dim[2]));
        }
    }
    if r.result != CaseResult::Failed {
        r.result = CaseResult::Planned;
        notes.insert(0, "plans fit H200 and GB10 limits; not executed (no GPU)".into());
    }
    r.detail = notes.join("; ");
    r
}

fn finish(opts: &Options, device: DeviceSummary, cases: Vec<CaseReport>, mut phases: Vec<Phase>, t_start: Instant) -> SelfTestReport {
    phases.push(Phase { name: "total".into(), seconds: t_start.elapsed().as_secs_f64() });
    let mut report = SelfTestReport {
        schema: SCHEMA_VERSION,
        agent_version: opts.agent_version.clone(),
        kernel_sources_hash: sources::sources_hash(),
        device,
        shape_class: opts.shape.key(),
        derived: 0,
        executed: 0,
        passed: 0,
        failed: 0,
        hung: 0,
        skipped: 0,
        negative_controls: NegativeControls {
            not_run_reason: if opts.negative_controls {
                None
            } else {
                opts.negative_controls_off_reason.clone().or(Some("disabled".into()))
            },
            fingerprint: opts.fingerprint.clone(),
            earlier_proof: opts.earlier_controls.clone(),
            ..Default::default()
        },
        verdict: Verdict::NotQualified { reason: String::new() },
        phases,
        cases,
    };
    summarise(&mut report);
    report
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::process::Command;

    use super::*;
    use crate::check::{Check, Outcome};
    use crate::cuda::DeviceInfo;
    use crate::selftest::worker::WorkerMsg;

    /// The families whose default-class counts are pinned below (those of 2026-12-06; a family
    /// added later brings its own cases, which the pinned counts leave out).
    const PINNED: [&str; 19] = [
        "add",
        "attention",
        "dense_f32",
        "embed",
        "latent_proj",
        "linear",
        "moe_align",
        "moe_combine",
        "moe_gemm",
        "moe_gemv",
        "neg_gemv_gridz",
        "neg_latent_tailskip",
        "output_head",
        "quantize",
        "rmsnorm",
        "rope",
        "router",
        "sampling",
        "swiglu",
    ];

    /// A worker script that answers every case with a pass, staging attention's (its host check
    /// collected later, as the real worker does): the session's report must hold every derived
    /// case, executed or skipped, whatever the overlap does.
    fn scripted_worker() -> Runner {
        let info = DeviceInfo {
            name: "scripted".into(),
            ordinal: 0,
            driver_cuda_version: 13000,
            nvrtc_version: (13, 0),
            free_mem_bytes: 80 << 30,
        };
        let ready = serde_json::to_string(&WorkerMsg::Ready { limits: DeviceLimits::h200(), info, compile_seconds: 0.0 }).unwrap();
        let check = Check {
            max_rel_err: 0.0,
            tolerance: 1e-6,
            compared: 1,
            unwritten: 0,
            past_end: 0,
            int_mismatches: 0,
            kernel_ms: 0.1,
            note: String::new(),
        };
        let result = serde_json::to_string(&WorkerMsg::Result {
            id: "ID".into(),
            outcome: Outcome::Ran(check),
            wall_ms: 0.2,
            gpu_ms: None,
            host_ms: Some(0.1),
            parts: vec![],
        })
        .unwrap();
        let staged = serde_json::to_string(&WorkerMsg::Staged { id: "ID".into(), gpu_ms: 0.1 }).unwrap();
        let (r0, r1) = result.split_once("ID").unwrap();
        let (s0, s1) = staged.split_once("ID").unwrap();
        let script = format!(
            r#"echo '{ready}'; while IFS= read -r line; do case "$line" in '{{"collect":"'*) id=${{line#'{{"collect":"'}}; id=${{id%%'"'*}}; printf '%s%s%s\n' '{r0}' "$id" '{r1}';; *'"op":"attention"'*) id=${{line#'{{"id":"'}}; id=${{id%%'"'*}}; printf '%s%s%s\n' '{s0}' "$id" '{s1}';; *) id=${{line#'{{"id":"'}}; id=${{id%%'"'*}}; printf '%s%s%s\n' '{r0}' "$id" '{r1}';; esac; done"#
        );
        Runner::new(move || {
            let mut c = Command::new("sh");
            c.arg("-c").arg(&script);
            c
        })
    }

    /// The default class (the Qwen3-30B-A3B shape, `--max-tokens 65536`) on an H200 with 80 GiB
    /// free: every derived case is in the report, executed or skipped with its reason, in the
    /// catalogue's order, and the counts of the pinned families are those of 2026-12-06. The
    /// host checks' overlap must not drop or reorder a case.
    #[test]
    fn default_class_counts_are_unchanged_through_the_overlap() {
        let mut opts = Options::new(ModelShape::qwen3_30b_a3b(), "test");
        opts.max_tokens = Some(65_536);
        let mut runner = scripted_worker();
        let mut seen = Vec::new();
        let report = run(&mut runner, &opts, &mut |p| {
            if let Progress::Case { index, .. } = p {
                seen.push(index)
            }
        });
        let limits = DeviceLimits::h200();
        let cat = derive(&opts, &limits, (80u64 << 30) - opts.memory_reserve_bytes);
        assert_eq!(seen, (0..cat.cases.len()).collect::<Vec<_>>(), "progress in the catalogue's order");
        assert_eq!(report.derived as usize, cat.cases.len() + cat.skipped.len());
        assert_eq!(report.executed as usize, cat.cases.len());
        assert_eq!(report.skipped as usize, cat.skipped.len());
        let ids: Vec<&str> = report.cases.iter().map(|c| c.id.as_str()).collect();
        let want: Vec<&str> = cat.cases.iter().chain(cat.skipped.iter().map(|(c, _)| c)).map(|c| c.id.as_str()).collect();
        assert_eq!(ids, want);
        assert!(
            report
                .cases
                .iter()
                .filter(|c| c.kernel == "attention" && c.result != brink_api::selftest::CaseResult::Skipped)
                .all(|c| c.result == brink_api::selftest::CaseResult::Passed)
        );
        assert!(report.phases.iter().any(|p| p.name == HOST_PHASE && p.seconds > 0.0));
        // (derived, executed) of the pinned families.
        let mut by: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for c in report.cases.iter().filter(|c| PINNED.contains(&c.kernel.as_str())) {
            let e = by.entry(PINNED.iter().find(|k| **k == c.kernel).unwrap()).or_default();
            e.0 += 1;
            e.1 += u64::from(c.result != brink_api::selftest::CaseResult::Skipped);
        }
        let got: Vec<(&str, u64, u64)> = by.iter().map(|(k, (d, e))| (*k, *d, *e)).collect();
        assert_eq!(got, PINNED_COUNTS);
        // 1,956 derived and 1,534 executed: the H100's run of 2026-12-06 (77.5 s warm); then
        // the routed GEMM's switch to its short tile (two counts per shape, 32 more); then the
        // tensor-core attention prefill as the default, whose 64-row, 64-key tiles have their
        // own tails (23 more). MXFP4's cases (139 derived, 73 executed at this shape) run only
        // for classes whose files hold MXFP4 tensors.
        let total = got.iter().fold((0, 0), |a, b| (a.0 + b.1, a.1 + b.2));
        assert_eq!(total, (2011, 1589));
    }

    /// (family, derived, executed) of the default class.
    const PINNED_COUNTS: [(&str, u64, u64); 19] = [
        ("add", 14, 12),
        ("attention", 288, 284),
        ("dense_f32", 32, 26),
        ("embed", 42, 36),
        ("latent_proj", 170, 162),
        ("linear", 125, 67),
        ("moe_align", 105, 78),
        ("moe_combine", 21, 17),
        ("moe_gemm", 480, 324),
        ("moe_gemv", 157, 119),
        ("neg_gemv_gridz", 14, 14),
        ("neg_latent_tailskip", 3, 3),
        ("output_head", 153, 113),
        ("quantize", 99, 77),
        ("rmsnorm", 44, 36),
        ("rope", 32, 24),
        ("router", 111, 93),
        ("sampling", 54, 54),
        ("swiglu", 67, 50),
    ];
}
