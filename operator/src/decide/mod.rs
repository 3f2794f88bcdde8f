//! The operator's decisions, pure: no Kubernetes client or kube types, no I/O, no clock (time is
//! an input).
//! The controllers map API objects into the views of `inputs`, call these, and turn the
//! results into writes, conditions and Events.

mod eligibility;
pub mod gang;
pub mod heartbeat;
pub mod inputs;
pub mod lifecycle;
pub mod placement;
pub mod pod_recovery;
pub mod reason;
pub mod revision;
pub mod rollout;
pub mod sweep;

#[cfg(test)]
mod tests;

pub use gang::{GangMembers, gang_eviction_reasons, gang_pod_state, place_gangs};
pub use heartbeat::{HeartbeatHistory, HeartbeatPolicy, HeartbeatState, Outage};
pub use inputs::{
    ClassQualification, DecideError, DeploymentView, GangNeed, MAX_GANG_NODES, MAX_REPLICAS, MemoryNeed, NodeView, OnSelfTestFailure,
    Resident, Spread, Taint, TaintEffect, Toleration,
};
pub use lifecycle::{Lifecycle, Replacement, ReplicaView, drain_without_room, lifecycle};
pub use placement::{AssignedGang, Assignment, Placement, place};
pub use pod_recovery::{FailureRecord, PodState, Recovery, RecoveryPolicy, recover};
pub use reason::Reason;
pub use revision::revision;
pub use rollout::{
    EventType, Recreate, RolloutCondition, RolloutDecision, RolloutError, RolloutEvent, RolloutPolicy, RolloutReplica, RolloutSpec,
    ThresholdTest, decide_rollout,
};
