//! A run moving through its nodes: concurrency slots, draining first, done, timed out, lost,
//! skipped; the run completes whatever happens to single nodes.

use brink_api::crd::NodeRunState::{self, *};
use brink_api::crd::ResultState;

use crate::decide::sweep::progress::{NodeNow, RunLimits, advance, complete, next_deadline_s};

const LIMITS: RunLimits = RunLimits { max_concurrent_nodes: 2, drain_replicas: true, node_timeout_s: 600 };

fn n(name: &str, state: NodeRunState, started: Option<i64>) -> NodeNow {
    NodeNow { node: name.into(), state, started_s: started, alive: true, resident_replicas: 0, result: None }
}

fn states(nodes: &[NodeNow], limits: RunLimits, now: i64) -> Vec<NodeRunState> {
    advance(nodes, limits, now).into_iter().map(|s| s.state).collect()
}

#[test]
fn at_most_max_concurrent_nodes_start_in_order() {
    let nodes: Vec<NodeNow> = ["a", "b", "c", "d"].iter().map(|x| n(x, Waiting, None)).collect();
    assert_eq!(states(&nodes, LIMITS, 100), [Running, Running, Waiting, Waiting]);
    let one = RunLimits { max_concurrent_nodes: 1, ..LIMITS };
    assert_eq!(states(&nodes, one, 100), [Running, Waiting, Waiting, Waiting]);
    let all = RunLimits { max_concurrent_nodes: 10, ..LIMITS };
    assert_eq!(states(&nodes, all, 100), [Running; 4]);
    let steps = advance(&nodes, LIMITS, 100);
    assert_eq!(steps[0].started_s, Some(100));
    assert_eq!(steps[2].started_s, None);
}

#[test]
fn a_finished_node_frees_its_slot_in_the_same_reconcile() {
    let mut nodes = vec![n("a", Running, Some(0)), n("b", Running, Some(0)), n("c", Waiting, None)];
    nodes[0].result = Some(ResultState::Done);
    assert_eq!(states(&nodes, LIMITS, 50), [Done, Running, Running]);
    nodes[0].result = Some(ResultState::Failed);
    assert_eq!(states(&nodes, LIMITS, 50), [Done, Running, Running], "a failed result is still the node's result");
    nodes[0].result = Some(ResultState::Running);
    assert_eq!(states(&nodes, LIMITS, 50), [Running, Running, Waiting]);
}

#[test]
fn replicas_are_drained_first_or_the_node_is_skipped() {
    let mut serving = n("a", Waiting, None);
    serving.resident_replicas = 2;
    let nodes = vec![serving.clone(), n("b", Waiting, None), n("c", Waiting, None)];
    let steps = advance(&nodes, LIMITS, 10);
    assert_eq!(steps.iter().map(|s| s.state).collect::<Vec<_>>(), [Draining, Running, Waiting]);
    assert!(steps[0].message.as_deref().unwrap_or("").contains("moving 2 serving replica(s)"));
    // Without draining the node is skipped and does not take a slot.
    let no_drain = RunLimits { drain_replicas: false, ..LIMITS };
    let steps = advance(&nodes, no_drain, 10);
    assert_eq!(steps.iter().map(|s| s.state).collect::<Vec<_>>(), [Skipped, Running, Running]);
    assert!(steps[0].message.as_deref().unwrap_or("").contains("drainReplicas is false"));
    // Once its replicas are gone it runs, and its timeout starts then.
    let mut draining = n("a", Draining, Some(10));
    draining.resident_replicas = 1;
    assert_eq!(states(&[draining.clone()], LIMITS, 300), [Draining]);
    draining.resident_replicas = 0;
    let s = &advance(&[draining.clone()], LIMITS, 300)[0];
    assert_eq!((s.state, s.started_s), (Running, Some(300)));
    // Replicas that never leave: the node times out.
    draining.resident_replicas = 1;
    let s = &advance(&[draining], LIMITS, 611)[0];
    assert_eq!(s.state, TimedOut);
    assert!(s.message.as_deref().unwrap_or("").contains("replicas to move away"), "{s:?}");
}

#[test]
fn timeouts_count_from_the_start_exactly() {
    let node = n("a", Running, Some(1000));
    assert_eq!(states(&[node.clone()], LIMITS, 1600), [Running], "exactly the timeout: still running");
    assert_eq!(states(&[node.clone()], LIMITS, 1601), [TimedOut]);
    assert_eq!(next_deadline_s(&advance(&[node], LIMITS, 1500), LIMITS), Some(1601));
}

#[test]
fn a_node_that_dies_is_lost_and_the_run_still_completes() {
    let mut nodes = vec![n("a", Running, Some(0)), n("b", Waiting, None), n("c", Done, Some(0))];
    nodes[0].alive = false;
    nodes[1].alive = false;
    let steps = advance(&nodes, LIMITS, 100);
    assert_eq!(steps.iter().map(|s| s.state).collect::<Vec<_>>(), [Lost, Lost, Done]);
    assert!(steps[0].message.as_deref().unwrap_or("").contains("mid-sweep"));
    assert!(steps[1].message.as_deref().unwrap_or("").contains("before its turn"));
    assert!(complete(&steps));
    // Final states never change, whatever the node does later.
    let mut back = nodes.clone();
    for (b, s) in back.iter_mut().zip(&steps) {
        b.state = s.state;
        b.alive = true;
        b.result = Some(ResultState::Done);
    }
    assert_eq!(states(&back, LIMITS, 200), [Lost, Lost, Done]);
}

#[test]
fn a_flapping_heartbeat_mid_run_loses_the_node_once() {
    // Lost is final: a node whose heartbeat comes back is not resumed in this run (its result
    // would mix two engine lifetimes); the next run sweeps it again.
    let mut node = n("a", Running, Some(0));
    let mut history = Vec::new();
    for (t, alive) in [(10, true), (20, false), (30, true), (40, true)] {
        node.alive = alive;
        let s = advance(&[node.clone()], LIMITS, t).remove(0);
        node.state = s.state;
        history.push(s.state);
    }
    assert_eq!(history, [Running, Lost, Lost, Lost]);
}

#[test]
fn an_empty_run_is_complete() {
    assert!(complete(&advance(&[], LIMITS, 0)));
}
