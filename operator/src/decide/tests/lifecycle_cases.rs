//! `lifecycle`: one table, each case also run with replicas and nodes in every rotation of both
//! orders.

use brink_api::Verdict;

use super::*;

struct Case {
    name: &'static str,
    nodes: Vec<NodeView>,
    /// (replica, node, healthy)
    replicas: Vec<(&'static str, &'static str, bool)>,
    wanted: u64,
    /// (replica, text its reasons must contain)
    replace: Vec<(&'static str, &'static str)>,
    remove: Vec<&'static str>,
    place: u64,
    dep: DeploymentView,
    /// Replicas held on an expired heartbeat, and the recheck.
    held: Vec<&'static str>,
    recheck: Option<u64>,
}

fn case(name: &'static str, nodes: Vec<NodeView>, replicas: &[(&'static str, &'static str, bool)], wanted: u64) -> Case {
    Case {
        name,
        nodes,
        replicas: replicas.to_vec(),
        wanted,
        replace: vec![],
        remove: vec![],
        place: 0,
        dep: dep(),
        held: vec![],
        recheck: None,
    }
}

impl Case {
    fn replace(mut self, r: &'static str, why: &'static str) -> Case {
        self.replace.push((r, why));
        self
    }
    fn remove(mut self, rs: &[&'static str]) -> Case {
        self.remove = rs.to_vec();
        self
    }
    fn dep(mut self, edit: impl FnOnce(&mut DeploymentView)) -> Case {
        edit(&mut self.dep);
        self
    }
    fn held(mut self, rs: &[&'static str], recheck: u64) -> Case {
        self.held = rs.to_vec();
        self.recheck = Some(recheck);
        self
    }
    fn place(mut self, n: u64) -> Case {
        self.place = n;
        self
    }
}

/// One replica `r` on node `a`, whose state `edit` sets, and a healthy node `b`.
fn one(name: &'static str, edit: impl FnOnce(&mut NodeView)) -> Case {
    case(name, vec![with("a", edit), node("b")], &[("r", "a", true)], 1)
}

fn cases() -> Vec<Case> {
    use TaintEffect::*;
    let other = "ai/other";
    vec![
        case("steady", vec![node("a"), node("b")], &[("r1", "a", true), ("r2", "b", true)], 2),
        case("node gone", vec![node("b")], &[("r", "gone", true)], 1).replace("r", "node gone").place(1),
        one("cordoned (drained)", |n| n.unschedulable = true).replace("r", "cordoned").place(1),
        one("NoSchedule taint", |n| n.taints = vec![taint("gpu-broken", NoSchedule)])
            .replace("r", "taint gpu-broken=true:NoSchedule")
            .place(1),
        one("NoExecute taint", |n| n.taints = vec![taint("gpu-broken", NoExecute)])
            .replace("r", "taint gpu-broken=true:NoExecute")
            .place(1),
        one("PreferNoSchedule taint keeps", |n| n.taints = vec![taint("maint", PreferNoSchedule)]),
        one("a sweep draining the node replaces", |n| n.sweep = Some("ai/nightly-7".into()))
            .replace("r", "sweep in progress: SweepRun ai/nightly-7 drains the node")
            .place(1),
        case(
            "a drained replica whose replacement exists is the scale-down victim (surge done)",
            vec![with("a", |n| n.sweep = Some("ai/nightly-7".into())), node("b")],
            &[("r1", "a", true), ("r2", "b", true)],
            1,
        )
        .remove(&["r1"]),
        case(
            "a tolerated taint does not shield a node a sweep drains",
            vec![with("a", |n| {
                n.taints = vec![taint("dedicated", NoExecute)];
                n.sweep = Some("ai/nightly-7".into());
            })],
            &[("r", "a", true)],
            1,
        )
        .dep(|d| d.tolerations = vec![Toleration::default()])
        .replace("r", "SweepRun ai/nightly-7")
        .place(1),
        case(
            "a tolerated NoExecute taint keeps",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoExecute)])],
            &[("r", "a", true)],
            1,
        )
        .dep(|d| d.tolerations = vec![Toleration { key: Some("dedicated".into()), value: Some("true".into()), effect: Some(NoExecute) }]),
        case(
            "an untolerated NoExecute taint replaces",
            vec![with("a", |n| n.taints = vec![taint("dedicated", NoExecute)])],
            &[("r", "a", true)],
            1,
        )
        .dep(|d| d.tolerations = vec![Toleration { key: Some("dedicated".into()), value: Some("false".into()), effect: Some(NoExecute) }])
        .replace("r", "taint dedicated=true:NoExecute")
        .place(1),
        one("heartbeat expired within the grace keeps", |n| n.heartbeat = expired(59)).held(&["r"], 1),
        one("heartbeat just expired keeps", |n| n.heartbeat = expired(1)).held(&["r"], 59),
        case(
            "held replicas recheck at the first grace's end",
            vec![
                with("a", |n| n.heartbeat = expired(10)),
                with("b", |n| n.heartbeat = expired(45)),
                with("c", |n| n.heartbeat = expired(60)),
            ],
            &[("r1", "a", true), ("r2", "b", true), ("r3", "c", true)],
            3,
        )
        .held(&["r1", "r2"], 15)
        .replace("r3", "heartbeat expired 60 s ago")
        .place(1),
        // A replica removed by the scale-down is not held.
        case(
            "held and scaled down",
            vec![with("a", |n| n.heartbeat = expired(10)), node("b")],
            &[("r1", "a", true), ("r2", "b", false)],
            1,
        )
        .remove(&["r2"])
        .held(&["r1"], 50),
        one("heartbeat expired at the grace is replaced", |n| n.heartbeat = expired(60))
            .replace("r", "heartbeat expired 60 s ago")
            .place(1),
        one("heartbeat settling keeps", |n| n.heartbeat = settling(1)),
        one("heartbeat flapping is replaced", |n| n.heartbeat = flapping()).replace("r", "heartbeat flapping").place(1),
        one("no heartbeat lease is replaced", |n| n.heartbeat = HeartbeatHistory::new(40)).replace("r", "no heartbeat lease").place(1),
        one("disqualified since is replaced", |n| {
            n.classes.insert(CLASS.into(), ClassQualification::Done(Verdict::Disqualified { reason: "tail bug".into() }));
        })
        .replace("r", "not qualified for class qwen3moe-h2048-e128-top8-ffn768 (disqualified: tail bug)")
        .place(1),
        one("re-qualifying keeps", |n| {
            n.classes.insert(CLASS.into(), ClassQualification::Stale { changed: "driver".into() });
        }),
        one("qualifying keeps", |n| {
            n.classes.insert(CLASS.into(), ClassQualification::InProgress);
        }),
        one("a lower envelope keeps (a rollout's business)", |n| {
            n.classes.insert(CLASS.into(), clamped(1024, 2048));
        }),
        one("low memory keeps (the replica holds its own)", |n| n.allocatable_bytes = GIB),
        one("several reasons", |n| {
            n.unschedulable = true;
            n.heartbeat = expired(600);
        })
        .replace("r", "cordoned; heartbeat expired 600 s ago")
        .place(1),
        case("scale up", vec![node("a")], &[("r1", "a", true)], 3).place(2),
        case("scale up from nothing", vec![node("a")], &[], 2).place(2),
        case("scale up and replace", vec![with("a", |n| n.unschedulable = true)], &[("r1", "a", true)], 2)
            .replace("r1", "cordoned")
            .place(2),
        case(
            "scale down: a replica due for replacement goes first",
            vec![with("a", |n| n.unschedulable = true), node("b"), node("c")],
            &[("r1", "b", false), ("r2", "a", true), ("r3", "c", true)],
            2,
        )
        .remove(&["r2"]),
        case(
            "scale down: then an unhealthy one",
            vec![node("a"), node("b"), node("c")],
            &[("r1", "a", true), ("r2", "b", false), ("r3", "c", true)],
            2,
        )
        .remove(&["r2"]),
        case(
            "scale down: then the most stacked node",
            vec![node("a"), node("b")],
            &[("r1", "b", true), ("r2", "a", true), ("r3", "a", true)],
            2,
        )
        .remove(&["r2"]),
        case(
            "scale down: then the more loaded node",
            vec![
                with("a", |n| n.residents = vec![resident("x", other, 60 * GIB)]),
                with("b", |n| n.residents = vec![resident("y", other, 10 * GIB)]),
            ],
            &[("r1", "b", true), ("r2", "a", true)],
            1,
        )
        .remove(&["r2"]),
        case("scale down: then the name", vec![node("a"), node("b")], &[("r2", "b", true), ("r1", "a", true)], 1).remove(&["r1"]),
        // Each pick re-counts: a holds 3, b 2, c 1 -> r1 (a; the name among a's); then a and b
        // hold 2 -> r2 (the name); then b holds 2 -> r4.
        case(
            "scale down re-counts spread after each pick",
            vec![node("a"), node("b"), node("c")],
            &[("r1", "a", true), ("r2", "a", true), ("r3", "a", true), ("r4", "b", true), ("r5", "b", true), ("r6", "c", true)],
            3,
        )
        .remove(&["r1", "r2", "r4"]),
        case("scale to zero", vec![node("a"), node("b")], &[("r1", "a", true), ("r2", "b", false)], 0).remove(&["r2", "r1"]),
        case(
            "scale down and replace: a gone node's replica goes first",
            vec![with("a", |n| n.unschedulable = true), node("b")],
            &[("r1", "gone", true), ("r2", "a", true), ("r3", "b", true)],
            2,
        )
        .remove(&["r1"])
        .replace("r2", "cordoned")
        .place(1),
    ]
}

#[test]
fn lifecycle_table() {
    let cases = cases();
    assert!(cases.len() >= 25, "{} cases", cases.len());
    for c in cases {
        let d = DeploymentView { replicas: c.wanted, ..c.dep.clone() };
        let replicas: Vec<ReplicaView> = c
            .replicas
            .iter()
            .map(|(name, node, healthy)| ReplicaView { name: (*name).into(), node: (*node).into(), healthy: *healthy, gang: None })
            .collect();
        let got = lifecycle(&d, &replicas, &c.nodes, NOW, &POLICY).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let replaced: Vec<&str> = got.replace.iter().map(|r| r.replica.as_str()).collect();
        let want: Vec<&str> = c.replace.iter().map(|r| r.0).collect();
        assert_eq!(replaced, want, "{}: replace {:?}", c.name, got.replace);
        for (r, (_, why)) in got.replace.iter().zip(&c.replace) {
            let text = r.reasons.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("; ");
            assert!(text.contains(why), "{}: {text:?} lacks {why:?}", c.name);
            assert_eq!(Some(r.node.as_str()), c.replicas.iter().find(|x| x.0 == r.replica).map(|x| x.1), "{}", c.name);
        }
        assert_eq!(got.remove, c.remove, "{}: remove", c.name);
        assert_eq!(got.place, c.place, "{}: place", c.name);
        let held: Vec<&str> = got.held.iter().map(|r| r.replica.as_str()).collect();
        assert_eq!((held, got.recheck_in_s), (c.held.clone(), c.recheck), "{}: held", c.name);
        for nodes in orders(&c.nodes) {
            for reps in orders(&replicas) {
                assert_eq!(lifecycle(&d, &reps, &nodes, NOW, &POLICY).unwrap(), got, "{}: depends on the input order", c.name);
            }
        }
    }
}

#[test]
fn duplicates_are_refused() {
    let r = |name: &str| ReplicaView { name: name.into(), node: "a".into(), healthy: true, gang: None };
    assert_eq!(lifecycle(&dep(), &[r("x"), r("y"), r("x")], &[node("a")], NOW, &POLICY), Err(DecideError::DuplicateReplica("x".into())));
    assert_eq!(lifecycle(&dep(), &[r("x")], &[node("a"), node("a")], NOW, &POLICY), Err(DecideError::DuplicateNode("a".into())));
}

#[test]
fn a_sweep_drains_without_room_one_replica_per_unplaced_replacement() {
    let sweep = |r: &str| Replacement {
        replica: r.into(),
        node: "a".into(),
        reasons: vec![Reason::SweepInProgress { run: "ai/nightly-7".into() }],
    };
    let cordon = |r: &str| Replacement { replica: r.into(), node: "c".into(), reasons: vec![Reason::Cordoned] };
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // (due, unplaced) -> deleted now
    let cases: Vec<(Vec<Replacement>, u64, Vec<String>)> = vec![
        // Every replacement placed: surge, nothing goes now.
        (vec![sweep("r1")], 0, names(&[])),
        (vec![sweep("r1")], 1, names(&["r1"])),
        // One of two replacements fits: one drained replica goes, by name.
        (vec![sweep("r2"), sweep("r1")], 1, names(&["r1"])),
        (vec![sweep("r2"), sweep("r1")], 5, names(&["r1", "r2"])),
        // Another reason waits for its replacement as before: cordons do not delete unreplaced.
        (vec![cordon("r0"), sweep("r1")], 2, names(&["r1"])),
        (vec![cordon("r0")], 1, names(&[])),
    ];
    for (due, unplaced, want) in cases {
        assert_eq!(drain_without_room(&due, unplaced), want, "{due:?} {unplaced}");
    }
}
