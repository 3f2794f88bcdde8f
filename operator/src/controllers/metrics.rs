//! The operator's own metrics, in the Prometheus text format on `/metrics`: reconciles, errors
//! and durations per controller, the placement outcomes, the fleet gauges (`brink_fleet_*`,
//! computed at scrape time from a source the controllers install) and the sweep series
//! (`brink_sweep_*`, recorded when a run is judged complete). docs/metrics.md lists them all.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use brink_api::crd::SweepVerdict;
use prometheus::{Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

use super::fleet_metrics::{FleetSeries, Samples};
use crate::decide::sweep::series::{SweepSeries, verdict_label};

/// What the fleet gauges are read from at each scrape.
pub type FleetSource = Box<dyn Fn() -> FleetSeries + Send + Sync>;

/// The `brink_fleet_*` gauges.
struct FleetGauges {
    node_up: GaugeVec,
    node_schedulable: GaugeVec,
    node_qualified: GaugeVec,
    node_envelope_max_batch_tokens: GaugeVec,
    node_replicas: GaugeVec,
    deployment_replicas: GaugeVec,
}

/// The `brink_sweep_*` series.
struct SweepMetrics {
    runs: IntCounterVec,
    regressions: IntCounterVec,
    outliers: IntCounterVec,
    node_verdict: GaugeVec,
    figure: GaugeVec,
    baseline_figure: GaugeVec,
    fleet_median: GaugeVec,
    last_completion: GaugeVec,
}

/// The latest complete run of a sweep, whose series the gauges show.
struct LatestRun {
    run: String,
    completed_s: i64,
    series: SweepSeries,
}

pub struct Metrics {
    registry: Registry,
    pub reconciles: IntCounterVec,
    pub errors: IntCounterVec,
    pub duration: HistogramVec,
    pub placements: IntCounterVec,
    pub replacements: IntCounterVec,
    pub unplaced: IntGaugeVec,
    fleet: FleetGauges,
    fleet_source: Mutex<Option<FleetSource>>,
    sweep: SweepMetrics,
    /// Per `(namespace, sweep)`; the sweep gauges are rebuilt from this whole map at each
    /// change, so a node gone from the latest run loses its series.
    latest_runs: Mutex<BTreeMap<(String, String), LatestRun>>,
    /// One scrape at a time: a refresh resets the fleet gauges before setting them again.
    scrape: Mutex<()>,
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec, prometheus::Error> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

/// Replaces every series of `vec` with `samples`, each labelled `prefix` then its own labels.
fn set_all(vec: &GaugeVec, prefix: &[&str], samples: &Samples) {
    for (labels, v) in samples {
        let all: Vec<&str> = prefix.iter().copied().chain(labels.iter().map(String::as_str)).collect();
        vec.with_label_values(&all).set(*v);
    }
}

/// The labels of a grid point and metric.
const POINT: [&str; 4] = ["prompt_tokens", "concurrency", "gen_tokens", "metric"];

impl FleetGauges {
    fn new(r: &Registry) -> Result<FleetGauges, prometheus::Error> {
        Ok(FleetGauges {
            node_up: gauge(r, "brink_fleet_node_up", "1 while the node's heartbeat Lease is unexpired, else 0", &["node"])?,
            node_schedulable: gauge(
                r,
                "brink_fleet_node_schedulable",
                "1 when new replicas may go to the node: heartbeat fresh, not cordoned, no NoSchedule or NoExecute taint",
                &["node"],
            )?,
            node_qualified: gauge(
                r,
                "brink_fleet_node_qualified",
                "1 for the current qualification state of each shape class on the node",
                &["node", "shape_class", "state"],
            )?,
            node_envelope_max_batch_tokens: gauge(
                r,
                "brink_fleet_node_envelope_max_batch_tokens",
                "The largest batch, in tokens, the node serves a shape class with (its qualification envelope)",
                &["node", "shape_class"],
            )?,
            node_replicas: gauge(r, "brink_fleet_node_replicas", "ModelReplicas bound to the node and not being deleted", &["node"])?,
            deployment_replicas: gauge(
                r,
                "brink_fleet_deployment_replicas",
                "A ModelDeployment's replicas by state: desired (spec), ready (status), unplaced (fit no node)",
                &["namespace", "deployment", "state"],
            )?,
        })
    }

    fn set(&self, s: &FleetSeries) {
        for (vec, samples) in [
            (&self.node_up, &s.node_up),
            (&self.node_schedulable, &s.node_schedulable),
            (&self.node_qualified, &s.node_qualified),
            (&self.node_envelope_max_batch_tokens, &s.node_envelope_max_batch_tokens),
            (&self.node_replicas, &s.node_replicas),
            (&self.deployment_replicas, &s.deployment_replicas),
        ] {
            vec.reset();
            set_all(vec, &[], samples);
        }
    }
}

impl SweepMetrics {
    fn new(r: &Registry) -> Result<SweepMetrics, prometheus::Error> {
        let sweep = ["namespace", "sweep"];
        let node_point = ["namespace", "sweep", "node", POINT[0], POINT[1], POINT[2], POINT[3]];
        Ok(SweepMetrics {
            runs: counter(r, "brink_sweep_runs_total", "Sweep runs completed, by the run's verdict", &["namespace", "sweep", "verdict"])?,
            regressions: counter(
                r,
                "brink_sweep_regressions_total",
                "Grid points judged regressed against the node's baseline, by node and metric",
                &["namespace", "sweep", "node", "metric"],
            )?,
            outliers: counter(
                r,
                "brink_sweep_outliers_total",
                "Grid points flagged as fleet outliers, by node and metric",
                &["namespace", "sweep", "node", "metric"],
            )?,
            node_verdict: gauge(
                r,
                "brink_sweep_node_verdict",
                "1 for each node's verdict in the sweep's latest complete run",
                &["namespace", "sweep", "node", "verdict"],
            )?,
            figure: gauge(r, "brink_sweep_figure", "A node's figure at a grid point in the sweep's latest complete run", &node_point)?,
            baseline_figure: gauge(
                r,
                "brink_sweep_baseline_figure",
                "The baseline figure the node's latest figure was judged against",
                &node_point,
            )?,
            fleet_median: gauge(
                r,
                "brink_sweep_fleet_median",
                "The median of identical nodes' figures at a grid point in the latest complete run",
                &[sweep[0], sweep[1], POINT[0], POINT[1], POINT[2], POINT[3]],
            )?,
            last_completion: gauge(
                r,
                "brink_sweep_last_completion_timestamp_seconds",
                "When the sweep's latest complete run completed (Unix seconds)",
                &sweep,
            )?,
        })
    }

    fn set(&self, latest: &BTreeMap<(String, String), LatestRun>) {
        for v in [&self.node_verdict, &self.figure, &self.baseline_figure, &self.fleet_median, &self.last_completion] {
            v.reset();
        }
        for ((ns, sweep), l) in latest {
            let prefix = [ns.as_str(), sweep.as_str()];
            set_all(&self.node_verdict, &prefix, &l.series.node_verdict);
            set_all(&self.figure, &prefix, &l.series.figure);
            set_all(&self.baseline_figure, &prefix, &l.series.baseline_figure);
            set_all(&self.fleet_median, &prefix, &l.series.fleet_median);
            self.last_completion.with_label_values(&prefix).set(l.completed_s as f64);
        }
    }
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let reconciles =
            IntCounterVec::new(Opts::new("brink_operator_reconciles_total", "Reconciles run, by controller"), &["controller"])?;
        let errors = IntCounterVec::new(
            Opts::new("brink_operator_reconcile_errors_total", "Reconciles that failed, by controller and error kind"),
            &["controller", "kind"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new("brink_operator_reconcile_duration_seconds", "Reconcile duration, by controller")
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["controller"],
        )?;
        let placements = IntCounterVec::new(
            Opts::new("brink_operator_placements_total", "Replicas placed on a node, by deployment namespace"),
            &["namespace"],
        )?;
        let replacements = IntCounterVec::new(
            Opts::new(
                "brink_operator_replica_deletions_total",
                "Replicas deleted, by why (lifecycle: scale-down or replaced; revision: an old model or engine)",
            ),
            &["reason"],
        )?;
        let unplaced = IntGaugeVec::new(
            Opts::new("brink_operator_unplaced_replicas", "Replicas of a deployment that fit no node"),
            &["namespace", "deployment"],
        )?;
        registry.register(Box::new(reconciles.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(placements.clone()))?;
        registry.register(Box::new(replacements.clone()))?;
        registry.register(Box::new(unplaced.clone()))?;
        // Every controller's series from the start: a scrape before the first reconcile sees 0, not nothing.
        for c in super::CONTROLLERS {
            reconciles.with_label_values(&[c]);
            duration.with_label_values(&[c]);
        }
        let fleet = FleetGauges::new(&registry)?;
        let sweep = SweepMetrics::new(&registry)?;
        Ok(Metrics {
            registry,
            reconciles,
            errors,
            duration,
            placements,
            replacements,
            unplaced,
            fleet,
            fleet_source: Mutex::new(None),
            sweep,
            latest_runs: Mutex::new(BTreeMap::new()),
            scrape: Mutex::new(()),
        })
    }

    /// Where the fleet gauges come from at each scrape (`None`: no fleet series, e.g. while
    /// this operator is not the leader and its caches are not filled).
    pub fn set_fleet_source(&self, source: Option<FleetSource>) {
        *self.fleet_source.lock().unwrap_or_else(|p| p.into_inner()) = source;
    }

    /// The replicas of a deployment that fit no node, as its controller last set them.
    pub fn unplaced_of(&self, namespace: &str, deployment: &str) -> u64 {
        self.unplaced.get_metric_with_label_values(&[namespace, deployment]).map_or(0, |g| u64::try_from(g.get()).unwrap_or(0))
    }

    /// A run judged complete just now: counts it and its regressed and outlier findings, and
    /// shows its series as the sweep's latest.
    pub fn sweep_run_completed(
        &self,
        namespace: &str,
        sweep: &str,
        run: &str,
        verdict: Option<SweepVerdict>,
        completed_s: i64,
        series: SweepSeries,
    ) {
        let verdict = verdict.map_or_else(|| "None".to_string(), verdict_label);
        self.sweep.runs.with_label_values(&[namespace, sweep, verdict.as_str()]).inc();
        for (counter, counts) in [(&self.sweep.regressions, &series.regressions), (&self.sweep.outliers, &series.outliers)] {
            for (labels, n) in counts {
                let all: Vec<&str> = [namespace, sweep].into_iter().chain(labels.iter().map(String::as_str)).collect();
                counter.with_label_values(&all).inc_by(*n);
            }
        }
        self.sweep_run_latest(namespace, sweep, run, completed_s, series);
    }

    /// Shows `run`'s series as the sweep's latest (no counting: also after a restart, from a run
    /// completed before it), unless a later-completed run is shown already.
    pub fn sweep_run_latest(&self, namespace: &str, sweep: &str, run: &str, completed_s: i64, series: SweepSeries) {
        let mut latest = self.latest_runs.lock().unwrap_or_else(|p| p.into_inner());
        let key = (namespace.to_string(), sweep.to_string());
        if latest.get(&key).is_some_and(|l| (l.completed_s, l.run.as_str()) > (completed_s, run)) {
            return;
        }
        latest.insert(key, LatestRun { run: run.to_string(), completed_s, series });
        self.sweep.set(&latest);
    }

    /// The run whose series the sweep's gauges show.
    pub fn latest_sweep_run(&self, namespace: &str, sweep: &str) -> Option<String> {
        let latest = self.latest_runs.lock().unwrap_or_else(|p| p.into_inner());
        latest.get(&(namespace.to_string(), sweep.to_string())).map(|l| l.run.clone())
    }

    /// Counts a reconcile and times it until the guard drops.
    pub fn reconcile(&self, controller: &'static str) -> ReconcileTimer<'_> {
        self.reconciles.with_label_values(&[controller]).inc();
        ReconcileTimer { metrics: self, controller, start: Instant::now() }
    }

    pub fn error(&self, controller: &str, kind: &str) {
        self.errors.with_label_values(&[controller, kind]).inc();
    }

    /// The exposition text, with the fleet gauges read from their source now.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let _one = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        let fleet = self.fleet_source.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|source| source()).unwrap_or_default();
        self.fleet.set(&fleet);
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    controller: &'static str,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics.duration.with_label_values(&[self.controller]).observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::new().expect("registry");
        drop(m.reconcile("deployment"));
        m.error("deployment", "api");
        m.placements.with_label_values(&["ns"]).inc_by(2);
        m.unplaced.with_label_values(&["ns", "d"]).set(1);
        let text = m.render().expect("render");
        assert!(text.contains("brink_operator_reconciles_total{controller=\"deployment\"} 1"), "{text}");
        assert!(text.contains("brink_operator_reconciles_total{controller=\"modelreplica\"} 0"), "{text}");
        assert!(text.contains("brink_operator_reconcile_errors_total{controller=\"deployment\",kind=\"api\"} 1"), "{text}");
        assert!(text.contains("brink_operator_reconcile_duration_seconds_count{controller=\"deployment\"} 1"), "{text}");
        assert!(text.contains("brink_operator_placements_total{namespace=\"ns\"} 2"), "{text}");
        assert!(text.contains("brink_operator_unplaced_replicas{deployment=\"d\",namespace=\"ns\"} 1"), "{text}");
    }

    fn l(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn docs_name_every_family() {
        let m = Metrics::new().expect("registry");
        // Every family has a series here, so gather lists them all.
        m.set_fleet_source(Some(Box::new(|| FleetSeries {
            node_up: vec![(l(&["a"]), 1.0)],
            node_schedulable: vec![(l(&["a"]), 1.0)],
            node_qualified: vec![(l(&["a", "c", "qualified"]), 1.0)],
            node_envelope_max_batch_tokens: vec![(l(&["a", "c"]), 8192.0)],
            node_replicas: vec![(l(&["a"]), 0.0)],
            deployment_replicas: vec![(l(&["ns", "d", "desired"]), 1.0)],
        })));
        let series = SweepSeries {
            node_verdict: vec![(l(&["a", "Regressed"]), 1.0)],
            figure: vec![(l(&["a", "128", "1", "32", "outputTokensPerS"]), 90.0)],
            baseline_figure: vec![(l(&["a", "128", "1", "32", "outputTokensPerS"]), 100.0)],
            fleet_median: vec![(l(&["128", "1", "32", "outputTokensPerS"]), 95.0)],
            regressions: vec![(l(&["a", "outputTokensPerS"]), 1)],
            outliers: vec![(l(&["a", "ttftP50S"]), 1)],
        };
        m.sweep_run_completed("ns", "s", "s-1", Some(SweepVerdict::Regressed), 1000, series);
        m.errors.with_label_values(&["deployment", "api"]);
        m.placements.with_label_values(&["ns"]);
        m.replacements.with_label_values(&["lifecycle"]);
        m.unplaced.with_label_values(&["ns", "d"]);
        let _ = m.render().expect("render");
        let doc = include_str!("../../../docs/metrics.md");
        let families = m.registry.gather();
        assert_eq!(families.len(), 6 + 6 + 8, "{:?}", families.iter().map(|f| f.name()).collect::<Vec<_>>());
        for f in families {
            assert!(doc.contains(&format!("`{}`", f.name())), "{} is not in docs/metrics.md", f.name());
        }
    }

    #[test]
    fn a_completed_run_counts_once_and_the_latest_run_replaces_the_gauges() {
        let m = Metrics::new().expect("registry");
        let run = |node: &str, verdict: &str, tps: f64| SweepSeries {
            node_verdict: vec![(l(&[node, verdict]), 1.0)],
            figure: vec![(l(&[node, "128", "1", "32", "outputTokensPerS"]), tps)],
            regressions: if verdict == "Regressed" { vec![(l(&[node, "outputTokensPerS"]), 2)] } else { vec![] },
            ..SweepSeries::default()
        };
        m.sweep_run_completed("ns", "s", "s-1", Some(SweepVerdict::Regressed), 1000, run("a", "Regressed", 90.0));
        m.sweep_run_completed("ns", "s", "s-2", Some(SweepVerdict::Pass), 2000, run("b", "Pass", 100.0));
        // An older run shown again (after a restart) does not replace the newer one.
        m.sweep_run_latest("ns", "s", "s-1", 1000, run("a", "Regressed", 90.0));
        assert_eq!(m.latest_sweep_run("ns", "s").as_deref(), Some("s-2"));
        let text = m.render().expect("render");
        for want in [
            "brink_sweep_runs_total{namespace=\"ns\",sweep=\"s\",verdict=\"Regressed\"} 1",
            "brink_sweep_runs_total{namespace=\"ns\",sweep=\"s\",verdict=\"Pass\"} 1",
            "brink_sweep_regressions_total{metric=\"outputTokensPerS\",namespace=\"ns\",node=\"a\",sweep=\"s\"} 2",
            "brink_sweep_node_verdict{namespace=\"ns\",node=\"b\",sweep=\"s\",verdict=\"Pass\"} 1",
            "brink_sweep_last_completion_timestamp_seconds{namespace=\"ns\",sweep=\"s\"} 2000",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        // Node a is not in the latest run: its gauges are gone, its counter stays.
        assert!(!text.contains("brink_sweep_node_verdict{namespace=\"ns\",node=\"a\""), "{text}");
        assert!(
            !text
                .contains("brink_sweep_figure{concurrency=\"1\",gen_tokens=\"32\",metric=\"outputTokensPerS\",namespace=\"ns\",node=\"a\""),
            "{text}"
        );
        // No fleet source: no fleet series, and a source that empties removes them.
        assert!(!text.contains("brink_fleet_node_up{"), "{text}");
        m.set_fleet_source(Some(Box::new(|| FleetSeries { node_up: vec![(l(&["a"]), 1.0)], ..FleetSeries::default() })));
        assert!(m.render().expect("render").contains("brink_fleet_node_up{node=\"a\"} 1"));
        m.set_fleet_source(None);
        assert!(!m.render().expect("render").contains("brink_fleet_node_up{"));
    }
}
