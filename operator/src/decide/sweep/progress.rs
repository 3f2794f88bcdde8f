//! A run's per-node progress: which nodes start next (at most `maxConcurrentNodes` at once),
//! draining replicas first, and when a node is done, timed out or lost. A node that dies or
//! hangs mid-sweep ends in a final state of its own; the run still completes.

use brink_api::crd::{NodeRunState, ResultState};

/// What the operator sees of one node of the run at this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNow {
    pub node: String,
    /// Its state as the run's status last recorded it (`Waiting` for a new run).
    pub state: NodeRunState,
    pub started_s: Option<i64>,
    /// The node still exists and its heartbeat is fresh.
    pub alive: bool,
    /// Serving replicas still resident on the node.
    pub resident_replicas: u32,
    /// The state of its `SweepResult`, if the agent has written one.
    pub result: Option<ResultState>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunLimits {
    pub max_concurrent_nodes: u32,
    pub drain_replicas: bool,
    pub node_timeout_s: u32,
}

/// One node's next state, with why (for the status message) and when it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeStep {
    pub node: String,
    pub state: NodeRunState,
    pub started_s: Option<i64>,
    pub message: Option<String>,
}

/// The nodes' next states, in the input order. The run is complete when every state is final.
pub fn advance(nodes: &[NodeNow], limits: RunLimits, now_s: i64) -> Vec<NodeStep> {
    let mut steps: Vec<NodeStep> = nodes.iter().map(|n| step(n, limits, now_s)).collect();
    // Fill free slots with waiting nodes, in the run's order (the spec lists them sorted).
    let busy = steps.iter().filter(|s| matches!(s.state, NodeRunState::Draining | NodeRunState::Running)).count();
    let mut free = (limits.max_concurrent_nodes as usize).saturating_sub(busy);
    for (s, n) in steps.iter_mut().zip(nodes) {
        if free == 0 {
            break;
        }
        if s.state != NodeRunState::Waiting {
            continue;
        }
        free -= 1;
        s.started_s = Some(now_s);
        s.state = if n.resident_replicas == 0 {
            NodeRunState::Running
        } else if limits.drain_replicas {
            s.message = Some(format!("moving {} serving replica(s) away first", n.resident_replicas));
            NodeRunState::Draining
        } else {
            // A node that cannot be swept does not hold a slot.
            free += 1;
            s.message = Some(format!("{} serving replica(s) resident and drainReplicas is false", n.resident_replicas));
            NodeRunState::Skipped
        };
    }
    steps
}

fn step(n: &NodeNow, limits: RunLimits, now_s: i64) -> NodeStep {
    let keep = |state, message: Option<String>| NodeStep { node: n.node.clone(), state, started_s: n.started_s, message };
    if n.state.is_final() {
        return keep(n.state, None);
    }
    if !n.alive {
        let what = if n.state == NodeRunState::Waiting { "before its turn" } else { "mid-sweep" };
        return keep(NodeRunState::Lost, Some(format!("the node or its heartbeat went away {what}")));
    }
    match n.state {
        NodeRunState::Waiting => keep(NodeRunState::Waiting, None),
        NodeRunState::Draining if n.resident_replicas == 0 => {
            // The node's own timeout counts from when it starts measuring.
            NodeStep { node: n.node.clone(), state: NodeRunState::Running, started_s: Some(now_s), message: None }
        }
        NodeRunState::Draining | NodeRunState::Running => {
            if n.state == NodeRunState::Running && matches!(n.result, Some(ResultState::Done | ResultState::Failed)) {
                return keep(NodeRunState::Done, None);
            }
            let started = n.started_s.unwrap_or(now_s);
            let elapsed = now_s - started;
            if elapsed > i64::from(limits.node_timeout_s) {
                let doing = if n.state == NodeRunState::Draining { "its replicas to move away" } else { "its result" };
                return keep(
                    NodeRunState::TimedOut,
                    Some(format!("waited {elapsed} s for {doing} (nodeTimeoutSeconds {})", limits.node_timeout_s)),
                );
            }
            keep(n.state, None)
        }
        NodeRunState::Done | NodeRunState::TimedOut | NodeRunState::Lost | NodeRunState::Skipped => keep(n.state, None),
    }
}

/// Whether nothing more will happen in the run.
pub fn complete(steps: &[NodeStep]) -> bool {
    steps.iter().all(|s| s.state.is_final())
}

/// When the run next needs a look without any watch event: the earliest node timeout.
pub fn next_deadline_s(steps: &[NodeStep], limits: RunLimits) -> Option<i64> {
    steps
        .iter()
        .filter(|s| matches!(s.state, NodeRunState::Draining | NodeRunState::Running))
        .filter_map(|s| s.started_s.map(|t| t + i64::from(limits.node_timeout_s) + 1))
        .min()
}
