//! Gangs: placement (one fabric, all members or none, the memory each member needs, one member
//! per node) and replacement (any member's node lost, cordoned or silent replaces the whole
//! gang), each placement case also run with the nodes in every rotation of both orders.

use brink_api::crd::{FABRIC_LABEL, RDMA_LABEL};

use super::*;

/// A node on `fabric` (None: no fabric label).
fn on(name: &str, fabric: Option<&str>) -> NodeView {
    with(name, |n| {
        if let Some(f) = fabric {
            n.labels.insert(FABRIC_LABEL.into(), f.into());
        }
    })
}

fn rdma(mut n: NodeView) -> NodeView {
    n.labels.insert(RDMA_LABEL.into(), "true".into());
    n
}

/// Gangs of `size`, each 120 GiB in all (60 GiB per member of two).
fn gang_dep(size: u64, replicas: u64) -> DeploymentView {
    dep_with(|d| {
        d.memory = MemoryNeed::Bytes(120 * GIB);
        d.replicas = replicas;
        d.gang = Some(GangNeed { nodes: size, fabric_label: FABRIC_LABEL.into() });
    })
}

struct Case {
    name: &'static str,
    nodes: Vec<NodeView>,
    dep: DeploymentView,
    count: u64,
    /// (leader, workers, fabric, rdma) in placement order.
    gangs: Vec<(&'static str, Vec<&'static str>, &'static str, bool)>,
    /// (node, text its reasons must contain) for nodes not chosen.
    reasons: Vec<(&'static str, &'static str)>,
    /// Texts the message must contain (none: there must be no message).
    message: Vec<&'static str>,
}

fn case(name: &'static str, nodes: Vec<NodeView>, dep: DeploymentView, count: u64) -> Case {
    Case { name, nodes, dep, count, gangs: vec![], reasons: vec![], message: vec![] }
}

impl Case {
    fn gang(mut self, leader: &'static str, workers: &[&'static str], fabric: &'static str, rdma: bool) -> Case {
        self.gangs.push((leader, workers.to_vec(), fabric, rdma));
        self
    }
    fn why(mut self, node: &'static str, text: &'static str) -> Case {
        self.reasons.push((node, text));
        self
    }
    fn message(mut self, text: &'static str) -> Case {
        self.message.push(text);
        self
    }
}

fn cases() -> Vec<Case> {
    let member = |n: NodeView| {
        with(&n.name.clone(), |m| {
            *m = n;
            m.residents.push(Resident { replica: "other-0".into(), deployment: "ai/other".into(), memory_bytes: GIB, gang_member: true });
        })
    };
    vec![
        case("two nodes of one fabric", vec![on("a", Some("f1")), on("b", Some("f1"))], gang_dep(2, 1), 1).gang("a", &["b"], "f1", false),
        case("RDMA only when every member has it", vec![rdma(on("a", Some("f1"))), rdma(on("b", Some("f1")))], gang_dep(2, 1), 1).gang(
            "a",
            &["b"],
            "f1",
            true,
        ),
        case("one member without RDMA: none", vec![rdma(on("a", Some("f1"))), on("b", Some("f1"))], gang_dep(2, 1), 1).gang(
            "a",
            &["b"],
            "f1",
            false,
        ),
        // Members never span fabrics, even when two nodes are eligible overall.
        case("not enough peers in a fabric", vec![on("a", Some("f1")), on("b", Some("f2")), on("c", None)], gang_dep(2, 1), 1)
            .why("a", "fabric f1 has 1 eligible nodes, a gang needs 2")
            .why("b", "fabric f2 has 1 eligible nodes, a gang needs 2")
            .why("c", "no fabric: the node has no label brink.dev/fabric")
            .message("1 of 1 gangs of 2 nodes cannot be placed: a gang needs 2 eligible nodes of one fabric")
            .message("fabrics by label brink.dev/fabric: f1: 1 of 1 eligible, f2: 1 of 1 eligible")
            .message("0/3 nodes available"),
        case("more nodes than any fabric has", vec![on("a", Some("f1")), on("b", Some("f1"))], gang_dep(4, 1), 1)
            .why("a", "fabric f1 has 2 eligible nodes, a gang needs 4")
            .message("no fabric has 4 nodes (the largest has 2)"),
        case("no node labelled", vec![on("a", None), on("b", None)], gang_dep(2, 1), 1)
            .message("no node carries the fabric label brink.dev/fabric"),
        // A cordoned member leaves its fabric one node short: all or nothing.
        case(
            "a cordoned peer",
            vec![
                on("a", Some("f1")),
                with("b", |n| {
                    *n = on("b", Some("f1"));
                    n.unschedulable = true
                }),
            ],
            gang_dep(2, 1),
            1,
        )
        .why("b", "cordoned")
        .why("a", "fabric f1 has 1 eligible nodes")
        .message("f1: 1 of 2 eligible"),
        // Each member needs 60 GiB (120 GiB over 2): a node with 50 GiB free cannot be one.
        case(
            "the memory each member needs",
            vec![
                on("a", Some("f1")),
                with("b", |n| {
                    *n = on("b", Some("f1"));
                    n.allocatable_bytes = 50 * GIB
                }),
                on("c", Some("f1")),
            ],
            gang_dep(2, 1),
            1,
        )
        .gang("a", &["c"], "f1", false)
        .why("b", "memory: needs 60.00 GiB, has 50.00 GiB"),
        case(
            "one member per node (host networking)",
            vec![member(on("a", Some("f1"))), on("b", Some("f1")), on("c", Some("f1"))],
            gang_dep(2, 1),
            1,
        )
        .gang("b", &["c"], "f1", false)
        .why("a", "hosts a gang member already"),
        // The smallest fabric that fits; the larger stays whole for larger gangs.
        case(
            "best fit between fabrics",
            vec![on("a", Some("big")), on("b", Some("big")), on("c", Some("big")), on("d", Some("small")), on("e", Some("small"))],
            gang_dep(2, 1),
            1,
        )
        .gang("d", &["e"], "small", false)
        .why("a", "went to less loaded nodes"),
        // Two gangs: the second takes the next fabric; the first's nodes are members now.
        case(
            "two gangs, two fabrics",
            vec![on("a", Some("f1")), on("b", Some("f1")), on("c", Some("f2")), on("d", Some("f2"))],
            gang_dep(2, 2),
            2,
        )
        .gang("a", &["b"], "f1", false)
        .gang("c", &["d"], "f2", false),
        case("a second gang finds no room", vec![on("a", Some("f1")), on("b", Some("f1")), on("c", Some("f1"))], gang_dep(2, 2), 2)
            .gang("a", &["b"], "f1", false)
            .why("c", "fabric f1 has 1 eligible nodes")
            .message("1 of 2 gangs of 2 nodes cannot be placed"),
        // The least loaded members, the leader first.
        case(
            "least loaded members",
            vec![
                with("a", |n| {
                    *n = on("a", Some("f1"));
                    n.residents.push(resident("x-0", "ai/x", 30 * GIB))
                }),
                on("b", Some("f1")),
                with("c", |n| {
                    *n = on("c", Some("f1"));
                    n.residents.push(resident("y-0", "ai/y", 10 * GIB))
                }),
            ],
            gang_dep(2, 1),
            1,
        )
        .gang("b", &["c"], "f1", false),
        case("a three-node gang", vec![on("a", Some("f1")), on("b", Some("f1")), on("c", Some("f1"))], gang_dep(3, 1), 1).gang(
            "a",
            &["b", "c"],
            "f1",
            false,
        ),
        // Another fabric label (a topology label the cluster has).
        case(
            "a topology label as the fabric",
            vec![
                with("a", |n| {
                    n.labels.insert("topology.kubernetes.io/zone".into(), "rack-1".into());
                }),
                with("b", |n| {
                    n.labels.insert("topology.kubernetes.io/zone".into(), "rack-1".into());
                }),
            ],
            dep_with(|d| {
                d.memory = MemoryNeed::Bytes(80 * GIB);
                d.gang = Some(GangNeed { nodes: 2, fabric_label: "topology.kubernetes.io/zone".into() });
            }),
            1,
        )
        .gang("a", &["b"], "rack-1", false),
    ]
}

#[test]
fn gang_placement_table() {
    for c in cases() {
        for nodes in orders(&c.nodes) {
            let p = place(&c.dep, &nodes, c.count, NOW, &POLICY).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let got: Vec<(String, Vec<String>, String, bool)> = p
                .assignments
                .iter()
                .map(|a| {
                    let g = a.gang.as_ref().unwrap_or_else(|| panic!("{}: an assignment without its gang", c.name));
                    (a.node.clone(), g.workers.clone(), g.fabric.clone(), g.rdma)
                })
                .collect();
            let want: Vec<(String, Vec<String>, String, bool)> =
                c.gangs.iter().map(|(l, w, f, r)| (l.to_string(), w.iter().map(|s| s.to_string()).collect(), f.to_string(), *r)).collect();
            assert_eq!(got, want, "{}", c.name);
            for a in &p.assignments {
                assert_eq!(a.memory_bytes, c.dep.member_memory_bytes().expect("memory"), "{}", c.name);
            }
            assert_eq!(p.unplaced, c.count - c.gangs.len() as u64, "{}", c.name);
            for (node, text) in &c.reasons {
                let reasons = p.not_chosen.iter().find(|(n, _)| n == node).map(|(_, r)| r.clone()).unwrap_or_default();
                let said: Vec<String> = reasons.iter().map(ToString::to_string).collect();
                assert!(said.iter().any(|s| s.contains(text)), "{}: node {node}: {said:?} lacks {text:?}", c.name);
            }
            match (&p.message, c.message.is_empty()) {
                (None, true) => {}
                (Some(m), false) => {
                    for text in &c.message {
                        assert!(m.contains(text), "{}: message {m:?} lacks {text:?}", c.name);
                    }
                }
                (m, _) => panic!("{}: message {m:?}, wanted {:?}", c.name, c.message),
            }
        }
    }
}

#[test]
fn a_gang_serves_under_its_tightest_member() {
    let nodes = [
        with("a", |n| {
            *n = on("a", Some("f1"));
            n.classes.insert(CLASS.into(), clamped(4096, 4097));
        }),
        on("b", Some("f1")),
    ];
    let p = place(&gang_dep(2, 1), &nodes, 1, NOW, &POLICY).expect("placement");
    let limits = p.assignments[0].limits;
    assert_eq!(
        (limits.max_batch_tokens, limits.prefill_chunk, limits.validated_tokens, limits.first_failure),
        (4096, 2048, Some(4096), Some(4097))
    );
    // Under Refuse, the clamped member keeps the gang out of the fabric.
    let refuse = dep_with(|d| {
        *d = gang_dep(2, 1);
        d.on_self_test_failure = OnSelfTestFailure::Refuse;
    });
    let p = place(&refuse, &nodes, 1, NOW, &POLICY).expect("placement");
    assert_eq!(p.unplaced, 1);
}

#[test]
fn a_gang_size_outside_the_bounds_is_refused() {
    for size in [0, 1, MAX_GANG_NODES + 1] {
        let err = place(&gang_dep(size, 1), &[on("a", Some("f1"))], 1, NOW, &POLICY).expect_err("a bad gang size");
        assert!(err.to_string().contains("spec.nodesPerReplica"), "{err}");
    }
}

/// A gang replica (leader `a`, workers) on `nodes`.
fn gang_replica(name: &str, leader: &str, workers: &[&str], fabric: &str) -> ReplicaView {
    ReplicaView {
        name: name.into(),
        node: leader.into(),
        healthy: true,
        gang: Some(GangMembers { workers: workers.iter().map(|w| w.to_string()).collect(), fabric: fabric.into() }),
    }
}

#[test]
fn gang_replacement_table() {
    let fabric = |nodes: Vec<NodeView>| {
        nodes
            .into_iter()
            .map(|n| {
                let name = n.name.clone();
                with(&name, |m| {
                    *m = n;
                    m.labels.insert(FABRIC_LABEL.into(), "f1".into());
                })
            })
            .collect::<Vec<_>>()
    };
    let healthy = || fabric(vec![node("a"), node("b"), node("c"), node("d")]);
    // (case, nodes, replica, the text a reason must contain; "" = the gang stays)
    let cases: Vec<(&str, Vec<NodeView>, ReplicaView, &str)> = vec![
        ("all members healthy", healthy(), gang_replica("g-0", "a", &["b"], "f1"), ""),
        (
            "a worker's node gone",
            fabric(vec![node("a"), node("c")]),
            gang_replica("g-0", "a", &["b"], "f1"),
            "gang member on node b: node gone",
        ),
        (
            "a worker cordoned",
            fabric(vec![node("a"), with("b", |n| n.unschedulable = true)]),
            gang_replica("g-0", "a", &["b"], "f1"),
            "gang member on node b: cordoned",
        ),
        (
            "a worker silent (heartbeat expired past the grace)",
            fabric(vec![node("a"), with("b", |n| n.heartbeat = expired(300))]),
            gang_replica("g-0", "a", &["b"], "f1"),
            "gang member on node b: heartbeat expired",
        ),
        // Within the grace the gang is kept, as a single replica would be.
        (
            "a worker briefly silent",
            fabric(vec![node("a"), with("b", |n| n.heartbeat = expired(10))]),
            gang_replica("g-0", "a", &["b"], "f1"),
            "",
        ),
        (
            "the leader cordoned",
            fabric(vec![with("a", |n| n.unschedulable = true), node("b")]),
            gang_replica("g-0", "a", &["b"], "f1"),
            "cordoned",
        ),
        (
            "a member moved to another fabric",
            vec![
                with("a", |n| {
                    n.labels.insert(FABRIC_LABEL.into(), "f1".into());
                }),
                with("b", |n| {
                    n.labels.insert(FABRIC_LABEL.into(), "f2".into());
                }),
            ],
            gang_replica("g-0", "a", &["b"], "f1"),
            "gang member on node b is on fabric f2, the gang on f1",
        ),
        (
            "the deployment asks for 3 nodes now",
            healthy(),
            gang_replica("g-0", "a", &["b"], "f1"),
            "the replica spans 2 nodes, the deployment asks for 3",
        ),
        (
            "a single-node replica of a gang deployment",
            healthy(),
            ReplicaView { name: "g-0".into(), node: "a".into(), healthy: true, gang: None },
            "the replica spans 1 nodes, the deployment asks for 2",
        ),
    ];
    for (name, nodes, replica, want) in cases {
        let size = if name.contains("3 nodes") { 3 } else { 2 };
        let dep = gang_dep(size, 1);
        let life = lifecycle(&dep, std::slice::from_ref(&replica), &nodes, NOW, &POLICY).unwrap_or_else(|e| panic!("{name}: {e}"));
        if want.is_empty() {
            assert!(life.replace.is_empty(), "{name}: {:?}", life.replace);
            assert_eq!(life.place, 0, "{name}");
            continue;
        }
        // The whole gang is one replacement: one new gang placed, the old one removed once it serves.
        assert_eq!(life.replace.len(), 1, "{name}: {:?}", life.replace);
        assert_eq!((life.replace[0].replica.as_str(), life.place), ("g-0", 1), "{name}");
        let said: Vec<String> = life.replace[0].reasons.iter().map(ToString::to_string).collect();
        assert!(said.iter().any(|s| s.contains(want)), "{name}: {said:?} lacks {want:?}");
    }
}

#[test]
fn single_node_deployments_are_unchanged_by_gangs() {
    // A plain replica of a single-node deployment has nothing to do with fabrics.
    let replica = ReplicaView { name: "r".into(), node: "a".into(), healthy: true, gang: None };
    let life = lifecycle(&dep(), &[replica], &[node("a")], NOW, &POLICY).expect("lifecycle");
    assert!(life.replace.is_empty());
    let p = place(&dep(), &[node("a")], 1, NOW, &POLICY).expect("placement");
    assert_eq!(p.assignments[0].gang, None);
}

#[test]
fn a_gangs_pods_fail_together_and_serve_as_their_leader() {
    let up = |uid: &str, ready: Option<u64>| PodState::Up { uid: uid.into(), ready_for_s: ready };
    let failed = |uid: &str| PodState::Failed { uid: uid.into(), why: format!("{uid} evicted") };
    // (members leader first) -> the gang's state
    let cases = [
        (vec![up("l", Some(30)), up("w1", Some(30))], up("l", Some(30))),
        // The leader waits for its qualification: not ready, whatever the workers say.
        (vec![up("l", None), up("w1", Some(30))], up("l", None)),
        (vec![up("l", Some(30)), failed("w1")], failed("w1")),
        (vec![failed("l"), failed("w1")], failed("l")),
        (vec![PodState::Absent, up("w1", None)], PodState::Absent),
        // A worker missing is created again; the gang is its leader meanwhile.
        (vec![up("l", None), PodState::Absent], up("l", None)),
        (vec![], PodState::Absent),
    ];
    for (members, want) in cases {
        assert_eq!(gang_pod_state(&members), want, "{members:?}");
    }
}
