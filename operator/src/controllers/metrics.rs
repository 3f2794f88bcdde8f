//! The operator's own metrics, in the Prometheus text format on `/metrics`: reconciles, errors
//! and durations per controller, and the placement outcomes.

use std::time::Instant;

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    pub reconciles: IntCounterVec,
    pub errors: IntCounterVec,
    pub duration: HistogramVec,
    pub placements: IntCounterVec,
    pub replacements: IntCounterVec,
    pub unplaced: IntGaugeVec,
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
        Ok(Metrics { registry, reconciles, errors, duration, placements, replacements, unplaced })
    }

    /// Counts a reconcile and times it until the guard drops.
    pub fn reconcile(&self, controller: &'static str) -> ReconcileTimer<'_> {
        self.reconciles.with_label_values(&[controller]).inc();
        ReconcileTimer { metrics: self, controller, start: Instant::now() }
    }

    pub fn error(&self, controller: &str, kind: &str) {
        self.errors.with_label_values(&[controller, kind]).inc();
    }

    /// The exposition text.
    pub fn render(&self) -> Result<String, prometheus::Error> {
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
}
