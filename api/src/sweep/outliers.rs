//! Fleet outliers: on identical hardware, a node whose figure at a grid point drifts from the
//! median of its peers in the same run by more than the tolerance, and stands out from their
//! spread, is flagged, with or without a baseline of its own.
//!
//! The spread test is the modified z-score of Iglewicz and Hoaglin, 0.6745 |x - median| / MAD
//! above 3.5: robust to a few bad nodes (unlike the mean and standard deviation, which one slow
//! node drags), and it keeps ordinary run-to-run noise among peers from being called an outlier.
//! Where every peer measured the same (MAD 0) the tolerance alone decides.

use std::collections::BTreeMap;

use crate::crd::{Finding, GridPoint, PointFigures, SweepVerdict};

use super::judge::{Metric, change_percent};

/// Fewer identical nodes than this have no meaningful median.
pub const MIN_PEERS: usize = 3;
/// The modified z-score above which a figure stands out from its peers.
pub const Z_LIMIT: f64 = 3.5;

/// One node's figures in the run.
#[derive(Clone, Copy, Debug)]
pub struct NodeFigures<'a> {
    pub node: &'a str,
    /// What "identical hardware" compares: the GPU name and compute capability.
    pub hardware: &'a str,
    pub points: &'a [PointFigures],
}

/// The outliers among `nodes`, by node then point then metric.
pub fn outliers(nodes: &[NodeFigures<'_>], tolerance_percent: u32) -> Vec<Finding> {
    let mut groups: BTreeMap<&str, Vec<&NodeFigures<'_>>> = BTreeMap::new();
    for n in nodes {
        groups.entry(n.hardware).or_default().push(n);
    }
    let mut found = Vec::new();
    for (hardware, peers) in groups {
        let mut points: Vec<GridPoint> = peers.iter().flat_map(|n| n.points.iter().map(|p| p.point)).collect();
        points.sort();
        points.dedup();
        for point in points {
            for metric in Metric::ALL {
                let values: Vec<(&str, f64)> = peers
                    .iter()
                    .filter_map(|n| n.points.iter().find(|p| p.point == point).and_then(|p| metric.of(p)).map(|v| (n.node, v)))
                    .collect();
                if values.len() < MIN_PEERS {
                    continue;
                }
                let mut sorted: Vec<f64> = values.iter().map(|&(_, v)| v).collect();
                let med = median(&mut sorted);
                let mut deviations: Vec<f64> = values.iter().map(|&(_, v)| (v - med).abs()).collect();
                let mad = median(&mut deviations);
                for &(node, v) in &values {
                    let change = change_percent(v, med);
                    let stands_out = mad == 0.0 || 0.6745 * (v - med).abs() / mad > Z_LIMIT;
                    if change.abs() > f64::from(tolerance_percent) && stands_out {
                        let side = if (v < med) == metric.higher_is_better() { "worse" } else { "better" };
                        found.push(Finding {
                            node: node.to_string(),
                            verdict: SweepVerdict::Outlier,
                            point: Some(point),
                            metric: Some(metric.name().to_string()),
                            value: Some(v),
                            reference: Some(med),
                            change_percent: Some(change),
                            message: format!(
                                "{point}: {} {v:.4} is {change:+.1}% from the median {med:.4} of {} {hardware} nodes ({side}; tolerance {tolerance_percent}%)",
                                metric.name(),
                                values.len()
                            ),
                        });
                    }
                }
            }
        }
    }
    found.sort_by(|a, b| a.node.cmp(&b.node));
    found
}

/// The median of `v` (sorted in place); `v` is not empty. Public: the operator's fleet-median
/// gauges use the same one.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}
