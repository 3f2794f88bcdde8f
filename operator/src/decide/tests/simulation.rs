//! Heartbeats over time through `lifecycle` and `place`, as the controller would run them: where
//! does a replica go, and how often, when a node's heartbeat comes and goes?

use super::*;

/// Node `a` hosts replica `r` at first; `b` and `c` are healthy. Each node's agent renews its
/// 40 s lease every 10 s except during its gaps; the controller reads every 5 s from t = 0 to
/// `until`, replacing `r` where `lifecycle` says so. Returns the moves (t, from, to) and the
/// first time after the last move at which `a` would take a replica again.
fn simulate(gaps: &[(&str, u64, u64)], until: u64) -> (Vec<(u64, String, String)>, Option<u64>) {
    let d = dep();
    let mut nodes: Vec<NodeView> = ["a", "b", "c"].iter().map(|n| with(n, |n| n.heartbeat = HeartbeatHistory::new(40))).collect();
    let mut renew: Vec<Option<u64>> = vec![None; nodes.len()];
    let mut at = "a".to_string();
    let mut moves = Vec::new();
    let mut a_back = None;
    for t in (0..=until).step_by(5) {
        for (i, n) in nodes.iter_mut().enumerate() {
            let down = gaps.iter().any(|&(g, from, to)| g == n.name && t >= from && t < to);
            if !down && t % 10 == 0 {
                renew[i] = Some(t);
            }
            n.heartbeat.observe(renew[i], 40, t, &POLICY);
            n.residents = if n.name == at { vec![resident("r", DEP, 20 * GIB)] } else { vec![] };
        }
        let replica = ReplicaView { name: "r".into(), node: at.clone(), healthy: true, gang: None };
        let decided = lifecycle(&d, &[replica], &nodes, t, &POLICY).unwrap();
        if !decided.replace.is_empty() {
            let p = place(&d, &nodes, decided.place, t, &POLICY).unwrap();
            assert_eq!(p.assignments.len(), 1, "t={t}: {p:?}");
            moves.push((t, at.clone(), p.assignments[0].node.clone()));
            at = p.assignments[0].node.clone();
            a_back = None;
        }
        if a_back.is_none() && !moves.is_empty() && nodes[0].heartbeat.assess(t, &POLICY).accepts_replicas() {
            a_back = Some(t);
        }
    }
    (moves, a_back)
}

fn mv(t: u64, from: &str, to: &str) -> (u64, String, String) {
    (t, from.into(), to.into())
}

#[test]
fn flapping_heartbeats_do_not_bounce_replicas() {
    // (name, gaps, moves, when a takes replicas again)
    type Gap = (&'static str, u64, u64);
    type Move = (u64, String, String);
    type Row = (&'static str, Vec<Gap>, Vec<Move>, Option<u64>);
    let table: Vec<Row> = vec![
        ("steady", vec![], vec![], None),
        // Renewed at 990, expired at 1030, back at 1070: 40 s, under the 60 s grace.
        ("one blip under the grace", vec![("a", 1000, 1070)], vec![], None),
        ("two blips in ten minutes", vec![("a", 1000, 1070), ("a", 1300, 1370)], vec![], None),
        ("two blips on every node", vec![("a", 1000, 1070), ("a", 1300, 1370), ("b", 1000, 1070), ("b", 1300, 1370)], vec![], None),
        // The third expiry (at 1430) is seen at 1435: flapping. a takes replicas again once the
        // first outage (renewed at 1070) leaves the 600 s window: at 1675.
        (
            "flapping: moved once, not back until quiet",
            vec![("a", 1000, 1070), ("a", 1200, 1270), ("a", 1400, 1470)],
            vec![mv(1435, "a", "b")],
            Some(1675),
        ),
        // Expired at 1030, lost at the 60 s grace.
        ("a long outage: moved at the grace", vec![("a", 1000, 5000)], vec![mv(1090, "a", "b")], None),
        // a and b both flap; b's third outage starts just after r moved there: it moves once
        // more, to c, and never back to either.
        (
            "two flapping nodes: c ends up with it",
            vec![("a", 1000, 1070), ("a", 1200, 1270), ("a", 1400, 1470), ("b", 1010, 1080), ("b", 1210, 1280), ("b", 1410, 1480)],
            vec![mv(1435, "a", "b"), mv(1445, "b", "c")],
            Some(1675),
        ),
        // A node that recovers and is settling takes no replica: with b settling (back at 1380)
        // when a is lost (expired at 1330, lost at 1390), r goes to c.
        ("a settling node is passed over", vec![("a", 1300, 5000), ("b", 1300, 1380)], vec![mv(1390, "a", "c")], None),
    ];
    for (name, gaps, want_moves, want_back) in table {
        let (moves, back) = simulate(&gaps, 2000);
        assert_eq!(moves, want_moves, "{name}");
        assert_eq!(back, want_back, "{name}");
    }
}
