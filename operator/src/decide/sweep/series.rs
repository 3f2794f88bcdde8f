//! Which `brink_sweep_*` series a judged run sets, with which labels: per node its verdict, its
//! figures and its baseline's at every grid point, the regressed and outlier findings by metric,
//! and the fleet median per grid point. Pure: the SweepRun controller gives the judged results,
//! the metrics registry stores what this returns (namespace and sweep labels are its own).

use std::collections::BTreeMap;

use brink_api::crd::{GridPoint, Judgement, PointFigures, SweepVerdict};
use brink_api::sweep::judge::Metric;
use brink_api::sweep::outliers::{MIN_PEERS, median};

/// Labelled values of one family: label values in the family's label order.
pub type Samples = Vec<(Vec<String>, f64)>;

/// One node of a judged run.
#[derive(Clone, Copy, Debug)]
pub struct JudgedNode<'a> {
    pub node: &'a str,
    pub judgement: &'a Judgement,
    /// The node's hardware key and figures, when it finished with figures.
    pub figures: Option<(&'a str, &'a [PointFigures])>,
    /// The figures of the node's baseline result (empty without a baseline).
    pub baseline: &'a [PointFigures],
}

/// A run's series; label orders are in the field docs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SweepSeries {
    /// `[node, verdict]`: 1 for the node's verdict.
    pub node_verdict: Samples,
    /// `[node, prompt_tokens, concurrency, gen_tokens, metric]`
    pub figure: Samples,
    /// `[node, prompt_tokens, concurrency, gen_tokens, metric]`
    pub baseline_figure: Samples,
    /// `[prompt_tokens, concurrency, gen_tokens, metric]`
    pub fleet_median: Samples,
    /// `[node, metric]`: regressed findings (grid points) in this run.
    pub regressions: Vec<(Vec<String>, u64)>,
    /// `[node, metric]`: outlier findings (grid points) in this run.
    pub outliers: Vec<(Vec<String>, u64)>,
}

/// A verdict as the API serialises it (`Pass`, `Regressed`, ...).
pub fn verdict_label(v: SweepVerdict) -> String {
    serde_json::to_value(v).ok().and_then(|j| j.as_str().map(String::from)).unwrap_or_else(|| format!("{v:?}"))
}

fn point_labels(p: &GridPoint) -> [String; 3] {
    [p.prompt_tokens.to_string(), p.concurrency.to_string(), p.generated_tokens.to_string()]
}

fn figure_samples(node: &str, points: &[PointFigures], out: &mut Samples) {
    for p in points {
        for m in Metric::ALL {
            if let Some(v) = m.of(p) {
                let mut labels = vec![node.to_string()];
                labels.extend(point_labels(&p.point));
                labels.push(m.name().to_string());
                out.push((labels, v));
            }
        }
    }
}

/// Findings of `verdict` counted per `[node, metric]`; findings without a metric (a failed
/// self-test case names its case there, a lost node nothing) are not metric findings.
fn count_findings(nodes: &[JudgedNode<'_>], verdict: SweepVerdict) -> Vec<(Vec<String>, u64)> {
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for n in nodes {
        for f in n.judgement.findings.iter().filter(|f| f.verdict == verdict) {
            if let Some(m) = f.metric.as_deref().filter(|m| Metric::ALL.iter().any(|x| x.name() == *m)) {
                *counts.entry((n.node.to_string(), m.to_string())).or_default() += 1;
            }
        }
    }
    counts.into_iter().map(|((node, metric), c)| (vec![node, metric], c)).collect()
}

/// The fleet median per grid point and metric, as the outlier test computes it: over nodes of
/// identical hardware, at least [`MIN_PEERS`] of them. The series has no hardware label, so
/// where several hardware groups qualify the largest one speaks for the fleet (ties: the
/// hardware key that sorts first).
fn fleet_medians(nodes: &[JudgedNode<'_>]) -> Samples {
    let mut values: BTreeMap<(GridPoint, &'static str), BTreeMap<&str, Vec<f64>>> = BTreeMap::new();
    for n in nodes {
        let Some((hardware, points)) = n.figures else { continue };
        for p in points {
            for m in Metric::ALL {
                if let Some(v) = m.of(p) {
                    values.entry((p.point, m.name())).or_default().entry(hardware).or_default().push(v);
                }
            }
        }
    }
    let mut out = Samples::new();
    for ((point, metric), groups) in values {
        // max_by_key keeps the last of equal keys: iterate in reverse so the first hardware wins.
        let Some(mut group) = groups.into_values().rev().filter(|g| g.len() >= MIN_PEERS).max_by_key(Vec::len) else { continue };
        let mut labels: Vec<String> = point_labels(&point).into();
        labels.push(metric.to_string());
        out.push((labels, median(&mut group)));
    }
    out
}

/// The series of a judged run, nodes sorted by name.
pub fn series(nodes: &[JudgedNode<'_>]) -> SweepSeries {
    let mut sorted: Vec<JudgedNode<'_>> = nodes.to_vec();
    sorted.sort_by_key(|n| n.node);
    let mut out = SweepSeries::default();
    for n in &sorted {
        out.node_verdict.push((vec![n.node.to_string(), verdict_label(n.judgement.verdict)], 1.0));
        if let Some((_, points)) = n.figures {
            figure_samples(n.node, points, &mut out.figure);
            // A baseline figure only beside a figure of this run: what it was judged against.
            let judged: Vec<PointFigures> = n.baseline.iter().filter(|b| points.iter().any(|p| p.point == b.point)).cloned().collect();
            figure_samples(n.node, &judged, &mut out.baseline_figure);
        }
    }
    out.regressions = count_findings(&sorted, SweepVerdict::Regressed);
    out.outliers = count_findings(&sorted, SweepVerdict::Outlier);
    out.fleet_median = fleet_medians(&sorted);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::crd::Finding;

    const P1: GridPoint = GridPoint { prompt_tokens: 512, concurrency: 1, generated_tokens: 64 };
    const P8: GridPoint = GridPoint { prompt_tokens: 512, concurrency: 8, generated_tokens: 64 };

    fn fig(point: GridPoint, tps: f64, ttft: Option<f64>) -> PointFigures {
        PointFigures {
            point,
            requests: 8,
            failed: 0,
            timed_out: 0,
            output_tokens_per_s: Some(tps),
            ttft_p50_s: ttft,
            ttft_p99_s: None,
            itl_p50_s: None,
            itl_p99_s: None,
            error: None,
        }
    }

    fn finding(node: &str, verdict: SweepVerdict, metric: Option<&str>) -> Finding {
        Finding {
            node: node.into(),
            verdict,
            point: Some(P1),
            metric: metric.map(String::from),
            value: None,
            reference: None,
            change_percent: None,
            message: String::new(),
        }
    }

    fn judgement(verdict: SweepVerdict, findings: Vec<Finding>) -> Judgement {
        Judgement { verdict, baseline_run: None, findings }
    }

    fn l(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn verdicts_figures_baselines_and_findings_per_node() {
        let regressed = judgement(
            SweepVerdict::Regressed,
            vec![
                finding("b", SweepVerdict::Regressed, Some("outputTokensPerS")),
                finding("b", SweepVerdict::Regressed, Some("outputTokensPerS")),
                finding("b", SweepVerdict::Regressed, Some("ttftP50S")),
            ],
        );
        let outlier = judgement(SweepVerdict::Outlier, vec![finding("c", SweepVerdict::Outlier, Some("outputTokensPerS"))]);
        // A failed self-test case names its case in `metric`: not a metric finding.
        let failed = judgement(SweepVerdict::Failed, vec![finding("d", SweepVerdict::Failed, Some("gemm_q4_0/4096"))]);
        let lost = judgement(SweepVerdict::Lost, vec![finding("e", SweepVerdict::Lost, None)]);
        let pass = judgement(SweepVerdict::Pass, vec![]);
        let (a_figs, b_figs, c_figs, d_figs) =
            ([fig(P1, 100.0, Some(0.2))], [fig(P1, 80.0, None)], [fig(P1, 50.0, None)], [fig(P1, 101.0, None)]);
        // b's baseline also had a point this run no longer measures: not exported.
        let b_base = [fig(P1, 100.0, None), fig(P8, 300.0, None)];
        let hw = "NVIDIA GB10 (compute capability 12.1)";
        let nodes = [
            JudgedNode { node: "e", judgement: &lost, figures: None, baseline: &[] },
            JudgedNode { node: "b", judgement: &regressed, figures: Some((hw, &b_figs)), baseline: &b_base },
            JudgedNode { node: "a", judgement: &pass, figures: Some((hw, &a_figs)), baseline: &[] },
            JudgedNode { node: "c", judgement: &outlier, figures: Some((hw, &c_figs)), baseline: &[] },
            JudgedNode { node: "d", judgement: &failed, figures: Some((hw, &d_figs)), baseline: &[] },
        ];
        let s = series(&nodes);
        assert_eq!(
            s.node_verdict,
            vec![
                (l(&["a", "Pass"]), 1.0),
                (l(&["b", "Regressed"]), 1.0),
                (l(&["c", "Outlier"]), 1.0),
                (l(&["d", "Failed"]), 1.0),
                (l(&["e", "Lost"]), 1.0)
            ]
        );
        assert_eq!(
            s.figure,
            vec![
                (l(&["a", "512", "1", "64", "outputTokensPerS"]), 100.0),
                (l(&["a", "512", "1", "64", "ttftP50S"]), 0.2),
                (l(&["b", "512", "1", "64", "outputTokensPerS"]), 80.0),
                (l(&["c", "512", "1", "64", "outputTokensPerS"]), 50.0),
                (l(&["d", "512", "1", "64", "outputTokensPerS"]), 101.0),
            ]
        );
        assert_eq!(s.baseline_figure, vec![(l(&["b", "512", "1", "64", "outputTokensPerS"]), 100.0)]);
        assert_eq!(s.regressions, vec![(l(&["b", "outputTokensPerS"]), 2), (l(&["b", "ttftP50S"]), 1)]);
        assert_eq!(s.outliers, vec![(l(&["c", "outputTokensPerS"]), 1)]);
        // tokens/s of a, b, c, d: 100, 80, 50, 101 -> median 90; ttft has one node only (< 3 peers).
        assert_eq!(s.fleet_median, vec![(l(&["512", "1", "64", "outputTokensPerS"]), 90.0)]);
    }

    #[test]
    fn the_largest_identical_hardware_group_gives_the_median() {
        let pass = judgement(SweepVerdict::Pass, vec![]);
        let figs: Vec<[PointFigures; 1]> = [10.0, 20.0, 30.0, 40.0, 1000.0, 2000.0, 3000.0].iter().map(|v| [fig(P1, *v, None)]).collect();
        let names = ["n0", "n1", "n2", "n3", "n4", "n5", "n6"];
        let node =
            |i: usize, hw: &'static str| JudgedNode { node: names[i], judgement: &pass, figures: Some((hw, &figs[i])), baseline: &[] };
        // Four GB10s and three H200s: the GB10s' median.
        let mixed: Vec<JudgedNode<'_>> = (0..7).map(|i| node(i, if i < 4 { "gb10" } else { "h200" })).collect();
        assert_eq!(series(&mixed).fleet_median, vec![(l(&["512", "1", "64", "outputTokensPerS"]), 25.0)]);
        // Three and three (n3 left out): a tie goes to the hardware that sorts first.
        let tie: Vec<JudgedNode<'_>> = [0, 1, 2, 4, 5, 6].iter().map(|&i| node(i, if i < 4 { "gb10" } else { "h200" })).collect();
        assert_eq!(series(&tie).fleet_median, vec![(l(&["512", "1", "64", "outputTokensPerS"]), 20.0)]);
        // Two of each: no group is big enough, no median.
        let small: Vec<JudgedNode<'_>> = [0, 1, 4, 5].iter().map(|&i| node(i, if i < 4 { "gb10" } else { "h200" })).collect();
        assert!(series(&small).fleet_median.is_empty());
        assert!(series(&[]).node_verdict.is_empty());
    }
}
