//! Fleet outliers over many nodes with noise: the slow node is found, noise is not, different
//! hardware is never compared, small groups are left alone.

use crate::crd::{PointFigures, SweepVerdict};

use super::fig;
use crate::sweep::outliers::{MIN_PEERS, NodeFigures, outliers};

/// Deterministic noise in [-amp, +amp] (a small LCG: the same fleet every run).
fn noise(seed: &mut u64, amp: f64) -> f64 {
    *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    ((*seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
}

fn fleet(n: usize, amp: f64, slow: &[(usize, f64)]) -> Vec<(String, Vec<PointFigures>)> {
    let mut seed = 42;
    (0..n)
        .map(|i| {
            let factor = slow.iter().find(|(j, _)| *j == i).map_or(1.0, |(_, f)| *f);
            let tps = 70.0 * (1.0 + noise(&mut seed, amp)) * factor;
            let ttft = 0.22 * (1.0 + noise(&mut seed, amp)) / factor;
            let itl = 0.014 * (1.0 + noise(&mut seed, amp)) / factor;
            (format!("spark-{i:03}"), vec![fig(512, 1, tps, ttft, itl)])
        })
        .collect()
}

fn run(nodes: &[(String, Vec<PointFigures>)], hw: impl Fn(usize) -> &'static str, tol: u32) -> Vec<(String, String)> {
    let figures: Vec<NodeFigures<'_>> =
        nodes.iter().enumerate().map(|(i, (n, p))| NodeFigures { node: n, hardware: hw(i), points: p }).collect();
    let found = outliers(&figures, tol);
    assert!(found.iter().all(|f| f.verdict == SweepVerdict::Outlier));
    found.into_iter().map(|f| (f.node, f.metric.unwrap_or_default())).collect()
}

#[test]
fn a_slow_node_among_many_noisy_peers_is_flagged_and_only_it() {
    for (n, amp) in [(3, 0.0), (5, 0.03), (24, 0.05), (200, 0.05), (1000, 0.08)] {
        let nodes = fleet(n, amp, &[(1, 0.7)]);
        let found = run(&nodes, |_| "NVIDIA GB10 12.1", 15);
        let flagged: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert!(flagged.iter().all(|f| *f == "spark-001"), "{n} nodes, noise {amp}: {found:?}");
        assert!(found.iter().any(|(_, m)| m == "outputTokensPerS"), "{n} nodes, noise {amp}: {found:?}");
    }
}

#[test]
fn noise_alone_flags_nothing() {
    for (n, amp) in [(3, 0.05), (10, 0.1), (500, 0.12)] {
        assert_eq!(run(&fleet(n, amp, &[]), |_| "GB10", 15), vec![], "{n} nodes, noise {amp}");
    }
}

#[test]
fn a_drift_within_tolerance_is_not_an_outlier_even_if_it_stands_out() {
    // Identical peers (MAD 0): the tolerance alone decides.
    let nodes = fleet(10, 0.0, &[(4, 0.9)]);
    assert_eq!(run(&nodes, |_| "GB10", 15), vec![]);
    assert_eq!(run(&nodes, |_| "GB10", 5).len(), 3, "all three metrics at 5%");
    // A node much faster than its identical peers is reported too (a different build?).
    let fast = fleet(10, 0.0, &[(2, 1.5)]);
    let found = run(&fast, |_| "GB10", 15);
    assert!(!found.is_empty() && found.iter().all(|(n, _)| n == "spark-002"), "{found:?}");
}

#[test]
fn only_identical_hardware_is_compared_and_small_groups_are_left_alone() {
    // Four H200-class nodes twice as fast as six GB10s: nobody is an outlier.
    let mut nodes = fleet(6, 0.02, &[]);
    nodes.extend(fleet(4, 0.02, &[]).into_iter().map(|(n, mut p)| {
        p[0].output_tokens_per_s = p[0].output_tokens_per_s.map(|v| v * 2.0);
        (format!("h200-{n}"), p)
    }));
    assert_eq!(run(&nodes, |i| if i < 6 { "GB10" } else { "H200" }, 15), vec![]);
    // Two nodes of a kind (below MIN_PEERS) are never judged, however far apart.
    let pair = fleet(MIN_PEERS - 1, 0.0, &[(0, 0.2)]);
    assert_eq!(run(&pair, |_| "GB10", 15), vec![]);
}

#[test]
fn a_node_missing_a_point_does_not_shift_the_others() {
    let mut nodes = fleet(6, 0.0, &[(5, 0.5)]);
    nodes[0].1.clear();
    let found = run(&nodes, |_| "GB10", 15);
    assert!(!found.is_empty() && found.iter().all(|(n, _)| n == "spark-005"), "{found:?}");
}
