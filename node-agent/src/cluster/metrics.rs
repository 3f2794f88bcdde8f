//! The `run` agent's own series for `/metrics` (pure): the qualification of every shape class
//! on its SparkNode, the self-test's cases per kernel, the model cache's size and budget, and the
//! sweeps this process finished. The node's sensor gauges (memory, GPU) come from
//! [`crate::node_metrics`], as `serve` exports them.

use std::collections::BTreeMap;

use brink_api::crd::ShapeQualification;
use brink_engine::server::telemetry::{Kind, Scalar};

use crate::node_metrics::kernel_cases::{self, KernelCases};
use crate::node_metrics::{CaseCounts, QualificationMetrics};

/// What the agent knows at a scrape.
#[derive(Clone, Debug, Default)]
pub struct View {
    pub qualifications: Vec<ShapeQualification>,
    pub kernel_cases: BTreeMap<String, KernelCases>,
    /// Bytes the cache holds; None when its index could not be read (the series is then absent).
    pub cache_bytes: Option<u64>,
    pub cache_budget_bytes: u64,
    /// Sweeps finished by result (`Done`, `Failed`).
    pub sweeps: Vec<(&'static str, u64)>,
}

/// The series the agent adds to the node gauges.
pub fn scalars(v: &View) -> Vec<Scalar> {
    // One `brink_qualified` and one envelope series over all classes, from the same rows as
    // `serve` exports for its one class.
    let mut by_name: BTreeMap<&'static str, Scalar> = BTreeMap::new();
    for q in &v.qualifications {
        let m = QualificationMetrics {
            shape_class: q.shape_class.clone(),
            verdict: q.qualification.verdict.clone(),
            kernel: CaseCounts::from_summary(&q.qualification.summary),
            model: None,
            kernels: KernelCases::new(),
        };
        // The per-kernel series comes from `kernel_cases` below (the latest self-test run here);
        // `brink_selftest_cases` has no shape_class label, so it is `serve`'s alone.
        let wanted = ["brink_qualified", "brink_envelope_max_batch_tokens"];
        for s in m.scalars().into_iter().filter(|s| wanted.contains(&s.name)) {
            match by_name.get_mut(s.name) {
                Some(have) => have.samples.extend(s.samples),
                None => {
                    by_name.insert(s.name, s);
                }
            }
        }
    }
    let mut out: Vec<Scalar> = by_name.into_values().collect();
    if !v.kernel_cases.is_empty() {
        out.push(kernel_cases::scalar(&v.kernel_cases));
    }
    if let Some(bytes) = v.cache_bytes {
        out.push(gauge("brink_model_cache_bytes", "Bytes of models in this node's model cache.", bytes as f64));
    }
    out.push(gauge(
        "brink_model_cache_budget_bytes",
        "Disk the model cache may use (least recently used models no replica uses are evicted beyond it).",
        v.cache_budget_bytes as f64,
    ));
    out.push(Scalar {
        name: "brink_agent_sweeps_total",
        kind: Kind::Counter,
        help: "Sweeps this agent finished for the operator's SweepRuns, by the result's final state (Done, Failed).",
        samples: v.sweeps.iter().map(|(r, n)| (vec![("result", r.to_string())], *n as f64)).collect(),
    });
    out
}

fn gauge(name: &'static str, help: &'static str, v: f64) -> Scalar {
    Scalar { name, kind: Kind::Gauge, help, samples: vec![(Vec::new(), v)] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::{Envelope, Verdict};

    fn class(name: &str, verdict: Verdict) -> ShapeQualification {
        let mut q = crate::cluster::tests::shape_result(name, None);
        q.qualification.verdict = verdict;
        q.envelope = None::<Envelope>;
        q
    }

    fn samples(t: &[Scalar], name: &str) -> Vec<(String, f64)> {
        t.iter()
            .find(|s| s.name == name)
            .map(|s| &s.samples)
            .into_iter()
            .flatten()
            .map(|(l, v)| (l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), *v))
            .collect()
    }

    #[test]
    fn every_class_in_one_series_and_the_cache_and_sweeps() {
        let v = View {
            qualifications: vec![
                class("a", Verdict::Qualified { max_tokens: 4096 }),
                class("b", Verdict::NotQualified { reason: "no GPU".into() }),
            ],
            kernel_cases: BTreeMap::from([(
                "a".to_string(),
                KernelCases::from([("gemm".to_string(), CaseCounts { passed: 3, ..Default::default() })]),
            )]),
            cache_bytes: Some(1234),
            cache_budget_bytes: 5000,
            sweeps: vec![("Done", 2), ("Failed", 1)],
        };
        let t = scalars(&v);
        let names: Vec<&str> = t.iter().map(|s| s.name).collect();
        let mut unique = names.clone();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert!(!names.contains(&"brink_selftest_cases"), "that series has no shape_class label: serve's alone");
        let q = samples(&t, "brink_qualified");
        assert_eq!(q.len(), 10, "five states per class: {q:?}");
        assert!(
            q.contains(&("shape_class=a,state=qualified".into(), 1.0)) && q.contains(&("shape_class=b,state=notQualified".into(), 1.0))
        );
        assert_eq!(samples(&t, "brink_envelope_max_batch_tokens"), [("shape_class=a".to_string(), 4096.0)]);
        assert_eq!(samples(&t, "brink_selftest_kernel_cases").len(), 6);
        assert_eq!(samples(&t, "brink_model_cache_bytes"), [(String::new(), 1234.0)]);
        assert_eq!(samples(&t, "brink_model_cache_budget_bytes"), [(String::new(), 5000.0)]);
        assert_eq!(samples(&t, "brink_agent_sweeps_total"), [("result=Done".to_string(), 2.0), ("result=Failed".to_string(), 1.0)]);
        // Nothing qualified, no cache index, no per-kernel counts: those series are absent.
        let t = scalars(&View { cache_budget_bytes: 1, sweeps: vec![("Done", 0), ("Failed", 0)], ..View::default() });
        let names: Vec<&str> = t.iter().map(|s| s.name).collect();
        assert_eq!(names, ["brink_model_cache_budget_bytes", "brink_agent_sweeps_total"]);
    }

    /// docs/metrics.md names every series the agent adds.
    #[test]
    fn every_agent_series_is_documented() {
        let doc = include_str!("../../../docs/metrics.md");
        let v = View {
            qualifications: vec![class("a", Verdict::Qualified { max_tokens: 1 })],
            kernel_cases: BTreeMap::from([("a".to_string(), KernelCases::new())]),
            cache_bytes: Some(1),
            ..View::default()
        };
        for s in scalars(&v) {
            assert!(doc.contains(&format!("`{}`", s.name)), "{} is not in docs/metrics.md", s.name);
        }
    }
}
