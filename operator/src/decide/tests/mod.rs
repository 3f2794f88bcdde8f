//! Table tests of the decisions, and the fixtures they share.

mod gang_cases;
mod lifecycle_cases;
mod placement_cases;
mod rollout_cases;
mod rollout_flows;
mod simulation;

use std::collections::BTreeMap;

use brink_api::Verdict;

use super::*;

pub const GIB: u64 = 1 << 30;
pub const NOW: u64 = 100_000;
pub const CLASS: &str = "qwen3moe-h2048-e128-top8-ffn768";
pub const DEP: &str = "ai/chat";
pub const GPU_LABEL: &str = "nvidia.com/gpu.product";
pub const POLICY: HeartbeatPolicy = HeartbeatPolicy { grace_s: 60, settle_s: 120, flap_count: 3, flap_window_s: 600 };

/// Renewed 5 s ago under a 40 s lease, no outages.
pub fn fresh() -> HeartbeatHistory {
    HeartbeatHistory { lease_duration_s: 40, last_renew_s: Some(NOW - 5), outages: vec![], expiry_seen: false }
}

/// Expired `for_s` seconds ago (40 s lease).
pub fn expired(for_s: u64) -> HeartbeatHistory {
    HeartbeatHistory { last_renew_s: Some(NOW - 40 - for_s), expiry_seen: true, ..fresh() }
}

/// Renewed again `fresh_for_s` ago after an outage.
pub fn settling(fresh_for_s: u64) -> HeartbeatHistory {
    HeartbeatHistory {
        outages: vec![Outage { expired_at_s: NOW - fresh_for_s - 50, renewed_at_s: NOW - fresh_for_s }],
        last_renew_s: Some(NOW - fresh_for_s.min(5)),
        ..fresh()
    }
}

/// Three outages in the last 10 minutes, fresh now (and past the settle time).
pub fn flapping() -> HeartbeatHistory {
    let o = |renewed: u64| Outage { expired_at_s: renewed - 20, renewed_at_s: renewed };
    HeartbeatHistory { outages: vec![o(NOW - 500), o(NOW - 300), o(NOW - 150)], ..fresh() }
}

pub fn qualified(max: u64) -> ClassQualification {
    ClassQualification::Done(Verdict::Qualified { max_tokens: max })
}

pub fn clamped(max: u64, first_failure: u64) -> ClassQualification {
    ClassQualification::Done(Verdict::Clamped { max_tokens: max, first_failure })
}

/// A schedulable GB10 node, fresh, qualified for CLASS up to 16k tokens, 100 GiB, empty.
pub fn node(name: &str) -> NodeView {
    NodeView {
        name: name.into(),
        unschedulable: false,
        taints: vec![],
        labels: BTreeMap::from([(GPU_LABEL.to_string(), "NVIDIA-GB10".to_string())]),
        heartbeat: fresh(),
        classes: BTreeMap::from([(CLASS.to_string(), qualified(16_384))]),
        allocatable_bytes: 100 * GIB,
        residents: vec![],
        sweep: None,
    }
}

pub fn with(name: &str, edit: impl FnOnce(&mut NodeView)) -> NodeView {
    let mut n = node(name);
    edit(&mut n);
    n
}

pub fn resident(replica: &str, deployment: &str, bytes: u64) -> Resident {
    Resident { replica: replica.into(), deployment: deployment.into(), memory_bytes: bytes, gang_member: false }
}

pub fn taint(key: &str, effect: TaintEffect) -> Taint {
    Taint { key: key.into(), value: Some("true".into()), effect }
}

/// One replica of 20 GiB, batch 8192, chunk 2048, one per node, qualified only, Clamp.
pub fn dep() -> DeploymentView {
    DeploymentView {
        key: DEP.into(),
        shape_class: CLASS.into(),
        memory: MemoryNeed::Bytes(20 * GIB),
        reserve_bytes: 0,
        max_batch_tokens: 8192,
        prefill_chunk: 2048,
        replicas: 1,
        node_selector: BTreeMap::new(),
        tolerations: vec![],
        spread: Spread::OnePerNode,
        require_qualified: true,
        on_self_test_failure: OnSelfTestFailure::Clamp,
        gang: None,
    }
}

pub fn dep_with(edit: impl FnOnce(&mut DeploymentView)) -> DeploymentView {
    let mut d = dep();
    edit(&mut d);
    d
}

/// Every rotation of `items` and of its reverse: the orders a cache may list them in.
pub fn orders<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    for base in [items.to_vec(), items.iter().rev().cloned().collect()] {
        for k in 0..base.len().max(1) {
            let mut v = base.clone();
            let k = k.min(v.len());
            v.rotate_left(k);
            out.push(v);
        }
    }
    out
}
