//! The `brink.dev/v1alpha1` Kubernetes resources (one module per kind) and their conditions.
//! The CRDs are generated from these types (`brink-operator crds`), never written by hand.

// kube's `printcolumn(name = .., type_ = ..)` repeats keys inside one derive attribute, which
// clippy mistakes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod conditions;
pub mod model;
pub mod model_deployment;
pub mod model_replica;
pub mod regression_sweep;
pub mod spark_node;
pub mod sweep_result;
pub mod sweep_run;

#[cfg(test)]
mod tests;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use conditions::{BadReason, Condition, ConditionStatus, ConditionType, condition, find_condition, is_true, set_condition};
pub use model::{
    CachePhase, HttpsSource, KV_WINDOW_PREFILL_CHUNK, Model, ModelFormat, ModelPart, ModelSource, ModelSpec, ModelStatus, NodeCache,
    NodePathSource, PvcSource, SecretRef, kv_window_bytes_at_chunk,
};
pub use model_deployment::{
    EngineBuild, EngineKind, FABRIC_LABEL, GangSettings, ModelDeployment, ModelDeploymentSpec, ModelDeploymentStatus, ModelRef,
    OnSelfTestFailure, Placement, RDMA_LABEL, Rollout, RolloutPhase, RolloutStatus, RolloutStrategy, Serving, Spread,
};
pub use model_replica::{
    DownloadProgress, ModelReplica, ModelReplicaSpec, ModelReplicaStatus, PodFailures, QualificationMethod, ReplicaGang, ReplicaPhase,
    ReplicaQualification, StallReport, Throughput,
};
pub use regression_sweep::{
    BaselineKind, BaselinePolicy, ConcurrencyPolicy, DeploymentRef, GridPoint, RegressionSweep, RegressionSweepSpec, RegressionSweepStatus,
    SweepSelfTest, SweepVerdict, Tolerance, WorkloadGrid,
};
pub use spark_node::{
    Capacity, FailingCase, HostedReplica, MAX_FAILING_CASES, NodeFingerprint, ShapeQualification, SparkNode, SparkNodeSpec,
    SparkNodeStatus, failing_cases,
};

pub const GROUP: &str = "brink.dev";
pub const VERSION: &str = "v1alpha1";

pub use sweep_result::{
    Judgement, PointFigures, ResultState, SelfTestOutcome, SweepResult, SweepResultSpec, SweepResultStatus, result_name,
};
pub use sweep_run::{
    ExtraCase, Finding, MAX_FINDINGS, NodeProgress, NodeRunState, RunCounts, RunPhase, SweepRun, SweepRunSpec, SweepRunStatus,
};

/// Every CRD of the group, in the order `brink-operator crds` prints them.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        SparkNode::crd(),
        Model::crd(),
        ModelDeployment::crd(),
        ModelReplica::crd(),
        RegressionSweep::crd(),
        SweepRun::crd(),
        SweepResult::crd(),
    ]
}
