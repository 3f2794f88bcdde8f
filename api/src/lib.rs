//! brink-api: the wire types shared by the node agent and the operator.
//!
//! One source of truth: the agent writes these (as JSON from `brink-agent selftest --json`, and
//! later into `SparkNode` status), the operator reads them. Kubernetes resource types join them
//! in [`crd`] (group `brink.dev`, version `v1alpha1`); [`sweep`] holds the rules sweep results
//! are judged by, which both sides apply.

pub mod blackbox;
pub mod crd;
pub mod device;
pub mod gen_ai;
pub mod model_test;
pub mod qualification;
pub mod report;
pub mod selftest;
pub mod sweep;

pub use blackbox::{BLACKBOX_SCHEMA, BlackBoxReport, EngineLimits};
pub use device::{DeviceInfo, DeviceReport, UnifiedMemory};
pub use model_test::{MODEL_TEST_SCHEMA, ModelTestReport, SelfTestWithModel};
pub use qualification::{Envelope, FieldChange, Fingerprint, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams};
pub use report::{BackendCheck, BenchSummary, ModelSummary, QualificationReport, SuiteResult};
pub use selftest::{
    CaseReport, CaseResult, ControlsProof, DeviceSummary, NegativeControls, Phase, REQUIRED_CONTROLS, SelfTestReport, Verdict,
};
