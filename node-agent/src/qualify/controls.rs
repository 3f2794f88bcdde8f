//! The negative controls' proof on the node: a run that flagged every required control keeps
//! that (with its fingerprint's digest) under the state directory, so a later run under the
//! same fingerprint that may not run broken kernels (a replica is resident) still counts as
//! proven. The verdict decides whether a kept proof holds (`report::controls_shown`); this
//! module only reads and writes it, naming the file in every error.

use std::path::{Path, PathBuf};

use brink_api::Fingerprint;
use brink_api::selftest::{ControlsProof, REQUIRED_CONTROLS, SelfTestReport};
use brink_kernels::selftest::report::flagged_controls;
use brink_kernels::selftest::session::Options;

use super::store::StoreError;

/// Where the proof for `shape_key` is kept: next to its cached qualification.
pub fn path(state_dir: &Path, shape_key: &str) -> PathBuf {
    let q = super::cache::path(state_dir, shape_key);
    q.with_extension("controls.json")
}

/// The kept proof; `None` when missing or unreadable (then the controls must run again).
pub fn read(path: &Path) -> Option<ControlsProof> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// The proof `report` gives, when it executed on a GPU and flagged every required control.
pub fn proof_of(report: &SelfTestReport, fingerprint: &Fingerprint, at: String) -> Option<ControlsProof> {
    let flagged = flagged_controls(&report.cases);
    (report.device.gpu && flagged.len() == REQUIRED_CONTROLS.len()).then(|| ControlsProof {
        fingerprint: fingerprint.digest(),
        flagged,
        at,
    })
}

/// Keeps `proof` at `path` (through a temporary file and a rename).
pub fn write(path: &Path, proof: &ControlsProof) -> Result<(), StoreError> {
    super::store::write_json(path, proof)
}

/// Runs the kernel self-test with the kept proof for `fingerprint` offered to its verdict, and
/// keeps this run's proof when it gives one.
pub fn run_kernels(mut opts: Options, state_dir: &Path, fingerprint: &Fingerprint) -> Result<SelfTestReport, super::kernels::NoWorker> {
    let file = path(state_dir, &fingerprint.shape_class);
    opts.fingerprint = Some(fingerprint.digest());
    opts.earlier_controls = read(&file);
    let report = super::kernels::run(&opts)?;
    if let Some(proof) = proof_of(&report, fingerprint, super::rfc3339(std::time::SystemTime::now()))
        && let Err(e) = write(&file, &proof)
    {
        eprintln!("brink: warning: the negative controls' proof is not kept: {e}");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::selftest::{CaseReport, CaseResult};

    fn case(kernel: &str, result: CaseResult) -> CaseReport {
        CaseReport {
            id: format!("{kernel}/t1"),
            kernel: kernel.into(),
            tokens: 1,
            batch: vec![1],
            reasons: vec![],
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

    fn report(gpu: bool, cases: Vec<CaseReport>) -> SelfTestReport {
        let mut r: SelfTestReport = serde_json::from_value(serde_json::json!({
            "schema": 1, "agentVersion": "t", "kernelSourcesHash": "h",
            "device": {"gpu": gpu, "name": "", "computeCapability": "", "smCount": 0, "totalMemBytes": 0, "freeMemBytes": 0,
                       "driverCudaVersion": null, "nvrtcVersion": null, "maxGridDim": [0, 0, 0], "maxSharedMemPerBlockOptin": 0,
                       "noGpuReason": null},
            "shapeClass": "k", "derived": 0, "executed": 0, "passed": 0, "failed": 0, "hung": 0, "skipped": 0,
            "negativeControls": {"expected": 0, "flagged": 0, "missed": 0, "notRunReason": null},
            "verdict": {"state": "notQualified", "reason": ""}, "phases": [], "cases": []
        }))
        .unwrap();
        r.cases = cases;
        r
    }

    #[test]
    fn only_a_gpu_run_that_flagged_both_controls_gives_a_proof_and_it_round_trips() {
        let fp = crate::qualify::fingerprint(
            None,
            "qwen3moe-h8-e2-top1-ffn8-0123456789abcdef",
            brink_api::ServingParams { max_batch_tokens: 8, prefill_chunk: 8, context: 8, full_window_kv: false },
        );
        let both = vec![case("neg_gemv_gridz", CaseResult::Flagged), case("neg_latent_tailskip", CaseResult::Flagged)];
        let proof = proof_of(&report(true, both.clone()), &fp, "2026-12-01T20:00:00Z".into()).expect("a proof");
        assert_eq!((proof.fingerprint.as_str(), proof.flagged.len()), (fp.digest().as_str(), 2));
        assert_eq!(proof_of(&report(false, both), &fp, String::new()), None, "nothing ran on a GPU");
        let one = vec![case("neg_gemv_gridz", CaseResult::Flagged), case("neg_latent_tailskip", CaseResult::Missed)];
        assert_eq!(proof_of(&report(true, one), &fp, String::new()), None, "a missed control proves nothing");

        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), &fp.shape_class);
        assert!(p.ends_with("qualifications/qwen3moe-h8-e2-top1-ffn8-0123456789abcdef.controls.json"), "{}", p.display());
        assert_eq!(read(&p), None);
        write(&p, &proof).unwrap();
        assert_eq!(read(&p), Some(proof));
    }
}
