//! Qualifying one shape class on this node: the [`Qualifier`] seam (the tests put a fake behind
//! it; the agent runs [`SelfTest`]), and the real one: the kernel self-test in child processes
//! of this executable, as `selftest` and `up` run it, reusing the result `up` cached for the
//! class while its fingerprint holds.

use std::path::PathBuf;

use brink_api::crd::{MAX_FAILING_CASES, ShapeQualification, failing_cases};
use brink_api::{DeviceInfo, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, Verdict};
use brink_kernels::selftest::session::Options;
use brink_kernels::thresholds::ModelShape;

use crate::model_cache::Index;
use crate::node_metrics::kernel_cases::{KernelCases, by_kernel};
use crate::qualify::{self, cache, verdict};

/// One class to qualify.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QualifyJob {
    pub shape_class: String,
    /// `Err(why)`: the negative controls are off (replicas are resident).
    pub negative_controls: Result<(), super::qualify_plan::ReplicasResident>,
    /// A verified model file of the class outside the cache (a node path or PVC), if one is
    /// known: where the class's full shape is read from.
    pub model_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QualifyError {
    /// The class cannot be tested yet (its full shape is unknown here); asked again later.
    #[error("{0}")]
    Unresolved(String),
    /// The self-test could not run at all (no worker process, ...).
    #[error("{0}")]
    Failed(String),
}

/// Runs to completion on a blocking thread: a self-test takes minutes.
pub trait Qualifier: Send + Sync + 'static {
    /// Whether `shape_class` can be qualified now (quick); `Err(why)` leaves it waiting.
    fn check(&self, job: &QualifyJob) -> Result<(), QualifyError>;
    fn qualify(&self, job: &QualifyJob) -> Result<ShapeQualification, QualifyError>;
}

/// The kernel self-test.
pub struct SelfTest {
    /// `None`: no GPU (`no_gpu_reason` says why): nothing can be executed.
    pub device: Option<DeviceInfo>,
    pub no_gpu_reason: Option<String>,
    /// Where `up` keeps its qualification cache (read here, never written: `up`'s entries also
    /// carry its model-level test, which this agent does not run) and where the negative
    /// controls' proof is kept (read and written).
    pub state_dir: PathBuf,
    /// The model cache's root: the class's full kernel shape comes from a cached model's header.
    pub cache_root: PathBuf,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
    /// The latest self-test's cases per kernel, by shape class (for `/metrics`; a reused
    /// cached qualification has only its summary and adds nothing here).
    pub kernel_cases: KernelCasesByClass,
}

/// Shared with the agent's `/metrics`.
pub type KernelCasesByClass = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, KernelCases>>>;

impl Qualifier for SelfTest {
    fn check(&self, job: &QualifyJob) -> Result<(), QualifyError> {
        match &self.device {
            // Nothing to execute: the result (not qualified, and why) is immediate.
            None => Ok(()),
            Some(_) => self.shape(job).map(|_| ()),
        }
    }

    fn qualify(&self, job: &QualifyJob) -> Result<ShapeQualification, QualifyError> {
        let class = job.shape_class.as_str();
        let Some(device) = &self.device else {
            let reason = self.no_gpu_reason.clone().unwrap_or_else(|| "no CUDA GPU on this node".into());
            let serving = ServingParams {
                max_batch_tokens: self.max_batch_tokens,
                prefill_chunk: self.prefill_chunk,
                context: 0,
                full_window_kv: false,
            };
            let q = not_executed(qualify::fingerprint(None, class, serving), reason);
            return Ok(ShapeQualification { shape_class: class.into(), qualification: q, envelope: None, failing_cases: Vec::new() });
        };
        let shape = self.shape(job)?;
        let serving = ServingParams {
            max_batch_tokens: self.max_batch_tokens,
            prefill_chunk: self.prefill_chunk,
            context: u64::from(shape.context),
            full_window_kv: false,
        };
        let fp = qualify::fingerprint(Some(device), class, serving);
        if let cache::CacheDecision::Reuse(q) = cache::decide(&fp, cache::read(&cache::path(&self.state_dir, class))) {
            // The cache keeps the counts, not the cases: a reused result lists no failing cases.
            let envelope = verdict::envelope(&q.verdict, serving).ok();
            return Ok(ShapeQualification { shape_class: class.into(), qualification: *q, envelope, failing_cases: Vec::new() });
        }
        let mut opts = Options::new(shape, env!("CARGO_PKG_VERSION"));
        opts.serving.max_batch_tokens = self.max_batch_tokens;
        opts.serving.prefill_chunk = self.prefill_chunk;
        if let Err(why) = &job.negative_controls {
            opts.negative_controls = false;
            opts.negative_controls_off_reason = Some(why.to_string());
        }
        // A run without controls (replicas resident) counts the proof an earlier run kept.
        let report = qualify::controls::run_kernels(opts, &self.state_dir, &fp).map_err(|e| QualifyError::Failed(e.to_string()))?;
        self.kernel_cases.lock().unwrap_or_else(|p| p.into_inner()).insert(class.to_string(), by_kernel(&report));
        let q = Qualification::new(fp, &report, qualify::rfc3339(std::time::SystemTime::now()));
        let envelope = verdict::envelope(&q.verdict, serving).ok();
        Ok(ShapeQualification {
            shape_class: class.into(),
            qualification: q,
            envelope,
            failing_cases: failing_cases(&report, MAX_FAILING_CASES),
        })
    }
}

impl SelfTest {
    /// The class's full kernel shape (the class name holds only the dimensions that name it,
    /// not vocabulary, attention or context): from the job's model file, else a cached model of
    /// the class, else the built-in class it may be.
    fn shape(&self, job: &QualifyJob) -> Result<ModelShape, QualifyError> {
        let class = job.shape_class.as_str();
        let index = Index::load(&self.cache_root).map_err(|e| QualifyError::Failed(e.to_string()))?;
        let cached = index
            .entries
            .iter()
            .find(|e| e.header.as_ref().is_ok_and(|f| f.shape_class == class) && !e.files.is_empty())
            .map(|e| self.cache_root.join("models").join(&e.files[0]));
        if let Some(path) = job.model_file.clone().or(cached) {
            let file = brink_engine::gguf::GgufFile::open(&path).map_err(|e| QualifyError::Failed(format!("{}: {e}", path.display())))?;
            let config = brink_engine::arch::config(&file).map_err(|e| QualifyError::Failed(format!("{}: {e}", path.display())))?;
            let shape = brink_engine::qualify::kernel_shape(&config);
            if shape.key() != class {
                return Err(QualifyError::Failed(format!("{}: its shape key is {}, not {class}", path.display(), shape.key())));
            }
            return Ok(shape);
        }
        let builtin = ModelShape::qwen3_30b_a3b();
        if builtin.key() == class {
            return Ok(builtin);
        }
        Err(QualifyError::Unresolved(
            "no model of this class is in the node's cache yet: the self-test takes the class's full shape from a model's header".into(),
        ))
    }
}

/// A result with nothing executed (no GPU), for the status to say why.
pub fn not_executed(fingerprint: brink_api::Fingerprint, reason: String) -> Qualification {
    Qualification {
        schema: QUALIFICATION_SCHEMA,
        digest: fingerprint.digest(),
        fingerprint,
        verdict: Verdict::NotQualified { reason },
        summary: ReportSummary::default(),
        qualified_at: qualify::rfc3339(std::time::SystemTime::now()),
        model_summary: None,
        kernel_verdict: None,
        model_verdict: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_engine::synth::{Preset, SynthSpec};

    fn device() -> DeviceInfo {
        DeviceInfo {
            ordinal: 0,
            name: "NVIDIA GB10".into(),
            uuid: "GPU-1".into(),
            compute_capability: "12.1".into(),
            sm_count: 48,
            total_mem_bytes: 128 << 30,
            free_mem_bytes: 100 << 30,
            max_grid_dim: [2_147_483_647, 65_535, 65_535],
            driver_version: Some("580.95.05".into()),
            cuda_version: "13.0".into(),
            nvrtc_version: Some("13.0".into()),
            integrated: true,
            unified_memory: None,
        }
    }

    fn self_test(dir: &std::path::Path, device: Option<DeviceInfo>) -> SelfTest {
        SelfTest {
            device,
            no_gpu_reason: Some("no CUDA driver (libcuda.so) on this machine".into()),
            state_dir: dir.join("state"),
            cache_root: dir.join("cache"),
            max_batch_tokens: 8192,
            prefill_chunk: 2048,
            kernel_cases: Default::default(),
        }
    }

    fn job(class: &str, model_file: Option<PathBuf>) -> QualifyJob {
        QualifyJob { shape_class: class.into(), negative_controls: Ok(()), model_file }
    }

    #[test]
    fn the_full_shape_comes_from_a_model_file_of_the_class() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tiny.gguf");
        brink_engine::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &file, |_, _| {}).unwrap();
        let class = crate::model_cache::header::read(&file).unwrap().shape_class;
        let t = self_test(dir.path(), Some(device()));
        assert_eq!(t.check(&job(&class, Some(file.clone()))), Ok(()));
        let other = t.check(&job("qwen3moe-h9-e9-top9-ffn9", Some(file.clone()))).unwrap_err().to_string();
        assert!(other.contains(&format!("its shape key is {class}, not qwen3moe-h9-e9-top9-ffn9")), "{other}");
        let none = t.check(&job(&class, None)).unwrap_err().to_string();
        assert!(none.starts_with("no model of this class is in the node's cache yet"), "{none}");
        // The built-in class needs no file.
        assert_eq!(t.check(&job(&ModelShape::qwen3_30b_a3b().key(), None)), Ok(()));
    }

    #[test]
    fn ups_cached_result_is_reused_without_running_the_self_test() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tiny.gguf");
        brink_engine::synth::generate(&SynthSpec::from_preset(Preset::Tiny), &file, |_, _| {}).unwrap();
        let class = crate::model_cache::header::read(&file).unwrap().shape_class;
        let t = self_test(dir.path(), Some(device()));
        let shape = t.shape(&job(&class, Some(file.clone()))).unwrap();
        let serving =
            ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: u64::from(shape.context), full_window_kv: false };
        let fp = qualify::fingerprint(Some(&device()), &class, serving);
        let mut q = not_executed(fp, String::new());
        q.verdict = Verdict::Clamped { max_tokens: 4096, first_failure: 4097 };
        cache::write(&cache::path(&t.state_dir, &class), &q).unwrap();
        let got = t.qualify(&job(&class, Some(file))).unwrap();
        assert_eq!(got.qualification, q);
        let envelope = got.envelope.unwrap();
        assert_eq!((envelope.max_batch_tokens, envelope.first_failure), (4096, Some(4097)));
    }

    #[test]
    fn no_gpu_is_a_result_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let t = self_test(dir.path(), None);
        assert_eq!(t.check(&job("any-class", None)), Ok(()));
        let got = t.qualify(&job("any-class", None)).unwrap();
        assert_eq!(got.qualification.verdict, Verdict::NotQualified { reason: "no CUDA driver (libcuda.so) on this machine".into() });
        assert_eq!(got.qualification.fingerprint.gpu_name, "cpu");
        assert_eq!(got.qualification.digest, got.qualification.fingerprint.digest());
        assert!(got.envelope.is_none() && got.failing_cases.is_empty());
    }
}
