//! Which shape classes to qualify next (pure): the ones the operator lists in
//! `spec.shapeClasses` that have no current result, in the operator's order. A result is
//! current while this node's fingerprint covers it (a new driver or agent build makes it stale).

use std::collections::BTreeMap;

use brink_api::crd::{NodeFingerprint, ShapeQualification};

/// The requested classes still to qualify, first to last (duplicates once).
pub fn pending(requested: &[String], results: &BTreeMap<String, ShapeQualification>, node: &NodeFingerprint) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for class in requested {
        let current = results.get(class).is_some_and(|q| node.covers(&q.qualification.fingerprint));
        if !current && !out.contains(class) {
            out.push(class.clone());
        }
    }
    out
}

/// Whether the self-test may run its deliberately broken kernels: only on a node with no
/// replica resident (a negative control that misbehaves must not take a serving engine down).
pub fn negative_controls(resident_replicas: usize) -> Result<(), ReplicasResident> {
    match resident_replicas {
        0 => Ok(()),
        count => Err(ReplicasResident { count }),
    }
}

/// Why the negative controls are off: serving replicas on this node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{count} replica(s) resident on this node: the deliberately broken kernels are not run next to a serving engine")]
pub struct ReplicasResident {
    pub count: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::{Fingerprint, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, Verdict};

    fn node(driver: &str) -> NodeFingerprint {
        NodeFingerprint {
            gpu_name: "NVIDIA GB10".into(),
            compute_capability: "12.1".into(),
            driver_version: Some(driver.into()),
            cuda_version: "13.0".into(),
            nvrtc_version: Some("13.0".into()),
            agent_version: "0.1.0".into(),
            kernel_sources_hash: "ab".repeat(32),
        }
    }

    fn result(class: &str, driver: &str) -> ShapeQualification {
        let n = node(driver);
        let fp = Fingerprint {
            gpu_name: n.gpu_name,
            compute_capability: n.compute_capability,
            driver_version: n.driver_version,
            cuda_version: n.cuda_version,
            nvrtc_version: n.nvrtc_version,
            agent_version: n.agent_version,
            kernel_sources_hash: n.kernel_sources_hash,
            shape_class: class.into(),
            serving: ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 4096, full_window_kv: false },
        };
        ShapeQualification {
            shape_class: class.into(),
            qualification: Qualification {
                schema: QUALIFICATION_SCHEMA,
                digest: fp.digest(),
                fingerprint: fp,
                verdict: Verdict::Qualified { max_tokens: 8192 },
                summary: ReportSummary::default(),
                qualified_at: "2026-12-01T00:00:00Z".into(),
                model_summary: None,
                kernel_verdict: None,
                model_verdict: None,
            },
            envelope: None,
            failing_cases: Vec::new(),
        }
    }

    #[test]
    fn table() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // (name, requested, results (class, driver), want)
        type Case = (&'static str, Vec<String>, Vec<(&'static str, &'static str)>, Vec<String>);
        let cases: Vec<Case> = vec![
            ("nothing asked", s(&[]), vec![("a", "580")], s(&[])),
            ("asked, none done", s(&["a", "b"]), vec![], s(&["a", "b"])),
            ("operator's order kept", s(&["b", "a"]), vec![], s(&["b", "a"])),
            ("one current", s(&["a", "b"]), vec![("a", "580")], s(&["b"])),
            ("all current", s(&["a", "b"]), vec![("a", "580"), ("b", "580")], s(&[])),
            ("stale after a driver upgrade", s(&["a", "b"]), vec![("a", "575"), ("b", "580")], s(&["a"])),
            ("results for classes no longer asked do not matter", s(&["b"]), vec![("a", "575")], s(&["b"])),
            ("duplicates once", s(&["a", "a", "b"]), vec![], s(&["a", "b"])),
        ];
        for (name, requested, results, want) in cases {
            let results: BTreeMap<String, ShapeQualification> = results.into_iter().map(|(c, d)| (c.to_string(), result(c, d))).collect();
            assert_eq!(pending(&requested, &results, &node("580")), want, "{name}");
        }
    }

    #[test]
    fn negative_controls_only_on_an_empty_node() {
        assert!(negative_controls(0).is_ok());
        assert!(negative_controls(2).unwrap_err().to_string().starts_with("2 replica(s) resident"));
    }
}
