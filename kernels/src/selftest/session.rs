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
use super::report::{judge, skipped, summarise};
use super::runner::{Runner, Start};
use crate::limits::DeviceLimits;
use crate::ops::moe_gemv;
use crate::sources;
use crate::thresholds::{ModelShape, Serving};

/// Counts above this are derived and listed, not run, unless asked for: past ~2M tokens the
/// cases need tens of GiB and host-side routing of billions of ids, and the startup self-test
/// must stay under a minute. `--max-tokens` raises it (a nightly sweep runs them all).
pub const DEFAULT_MAX_TOKENS: u64 = 1 << 21;

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
            for (index, case) in cat.cases.iter().enumerate() {
                let returned = runner.run(case);
                let r = judge(case, &returned);
                progress(Progress::Case { index, total, report: &r });
                cases.push(r);
            }
            phases.push(Phase { name: "run cases".into(), seconds: t.elapsed().as_secs_f64() });
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
