//! The checks of one node against one deployment that do not change while replicas are being
//! placed: cordon, taints, heartbeat, node selector, qualification and envelope. Memory and
//! spread change with every replica placed and are checked in `placement`.

use brink_api::{Envelope, Verdict};

use super::heartbeat::HeartbeatPolicy;
use super::inputs::{ClassQualification, DeploymentView, NodeView, OnSelfTestFailure};
use super::reason::Reason;

/// What the static checks say about a node.
pub(crate) struct Static {
    /// Empty when the node may serve the deployment.
    pub reasons: Vec<Reason>,
    /// The serving limits it would get (when the qualification allows any).
    pub limits: Option<Envelope>,
    /// The class was never qualified here: the agent should be asked to.
    pub needs_qualification: bool,
    /// Untolerated `PreferNoSchedule` taints: such a node is used last.
    pub preferred_against: usize,
}

pub(crate) fn check(node: &NodeView, dep: &DeploymentView, now_s: u64, policy: &HeartbeatPolicy) -> Static {
    let mut reasons = schedulability(node, dep, now_s, policy);
    for (key, want) in &dep.node_selector {
        let have = node.labels.get(key);
        if have != Some(want) {
            reasons.push(Reason::SelectorMismatch { key: key.clone(), want: want.clone(), have: have.cloned() });
        }
    }
    let needs_qualification = !node.classes.contains_key(&dep.shape_class);
    let limits = match serving_limits(node.classes.get(&dep.shape_class), dep) {
        Ok(l) => Some(l),
        Err(r) => {
            reasons.push(r);
            None
        }
    };
    let preferred_against = node.taints.iter().filter(|t| !t.effect.blocks() && !dep.tolerates(t)).count();
    Static { reasons, limits, needs_qualification, preferred_against }
}

/// Cordon, blocking taints, the heartbeat and a draining sweep: what keeps any replica off the
/// node (and, but for a heartbeat within its grace, moves its replicas away).
pub(crate) fn schedulability(node: &NodeView, dep: &DeploymentView, now_s: u64, policy: &HeartbeatPolicy) -> Vec<Reason> {
    let mut reasons = Vec::new();
    if node.unschedulable {
        reasons.push(Reason::Cordoned);
    }
    let mut taints: Vec<_> = node.taints.iter().filter(|t| t.effect.blocks() && !dep.tolerates(t)).cloned().collect();
    taints.sort();
    reasons.extend(taints.into_iter().map(Reason::Taint));
    let hb = node.heartbeat.assess(now_s, policy);
    if !hb.accepts_replicas() {
        reasons.push(Reason::Heartbeat(hb));
    }
    if let Some(run) = &node.sweep {
        reasons.push(Reason::SweepInProgress { run: run.clone() });
    }
    reasons
}

/// The limits the node serves the deployment under, or why it may not.
pub(crate) fn serving_limits(class: Option<&ClassQualification>, dep: &DeploymentView) -> Result<Envelope, Reason> {
    let not = |state: String| Reason::NotQualified { class: dep.shape_class.clone(), state };
    let unvalidated = Envelope {
        validated: false,
        validated_tokens: None,
        first_failure: None,
        max_batch_tokens: dep.max_batch_tokens,
        prefill_chunk: dep.prefill_chunk,
    };
    let (max, first_failure) = match class {
        None if dep.require_qualified => return Err(not("no result yet; qualification requested".into())),
        None => return Ok(unvalidated),
        Some(ClassQualification::InProgress) => return Err(not("qualifying now".into())),
        Some(ClassQualification::Stale { changed }) => return Err(not(format!("stale, re-qualifying: {changed}"))),
        Some(ClassQualification::Done(Verdict::Disqualified { reason })) => return Err(not(format!("disqualified: {reason}"))),
        // Whatever the deployment requires: cases never shown able to fail validate nothing.
        Some(ClassQualification::Done(Verdict::ProofIncomplete { reason })) => return Err(not(reason.clone())),
        Some(ClassQualification::Done(Verdict::NotQualified { reason })) if dep.require_qualified => {
            return Err(not(format!("nothing executed: {reason}")));
        }
        Some(ClassQualification::Done(Verdict::NotQualified { .. })) => return Ok(unvalidated),
        Some(ClassQualification::Done(Verdict::Qualified { max_tokens })) => (*max_tokens, None),
        Some(ClassQualification::Done(Verdict::Clamped { max_tokens, first_failure })) => (*max_tokens, Some(*first_failure)),
    };
    if max == 0 {
        return Err(not("the self-tests validated no batch size (0 tokens)".into()));
    }
    // prefillChunk <= maxBatchTokens (validated), so the batch is the binding request.
    if max < dep.max_batch_tokens && dep.on_self_test_failure == OnSelfTestFailure::Refuse {
        return Err(Reason::EnvelopeBelowRequest { class: dep.shape_class.clone(), envelope: max, requested: dep.max_batch_tokens });
    }
    Ok(Envelope {
        validated: true,
        validated_tokens: Some(max),
        first_failure,
        max_batch_tokens: dep.max_batch_tokens.min(max),
        prefill_chunk: dep.prefill_chunk.min(max),
    })
}
