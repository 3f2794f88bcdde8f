//! The fleet gauges (`brink_fleet_*`), computed from the reflector caches at scrape time rather
//! than kept up to date by the controllers: a scrape sees the caches as they are, and a node or
//! deployment that left the caches leaves the exposition with them (no stale series to delete).
//! [`fleet_series`] is the pure part: API objects in, labelled values out.

use std::collections::BTreeMap;
use std::sync::Arc;

use brink_api::crd::{ModelDeployment, ModelReplica, SparkNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::names::heartbeat_lease;
pub use crate::decide::sweep::series::Samples;

/// Lease duration assumed for a Lease that does not say (the agent's default).
const DEFAULT_LEASE_S: i64 = 40;

/// What the fleet gauges are computed from.
pub struct FleetInput<'a> {
    pub now_s: i64,
    pub nodes: &'a [Arc<Node>],
    pub spark_nodes: &'a [Arc<SparkNode>],
    /// The heartbeat Leases (`brink-node-<node>`, in the lease namespace).
    pub leases: &'a [Arc<Lease>],
    pub replicas: &'a [Arc<ModelReplica>],
    pub deployments: &'a [Arc<ModelDeployment>],
    /// Replicas of `(namespace, deployment)` that fit no node, as the deployment controller last found.
    pub unplaced: &'a dyn Fn(&str, &str) -> u64,
}

/// Every `brink_fleet_*` family's samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetSeries {
    /// `[node]`
    pub node_up: Samples,
    /// `[node]`
    pub node_schedulable: Samples,
    /// `[node, shape_class, state]`
    pub node_qualified: Samples,
    /// `[node, shape_class]`
    pub node_envelope_max_batch_tokens: Samples,
    /// `[node]`
    pub node_replicas: Samples,
    /// `[namespace, deployment, state]`
    pub deployment_replicas: Samples,
}

/// The heartbeat Lease is unexpired at `now_s`: renewed within its duration.
fn heartbeat_fresh(lease: Option<&Lease>, now_s: i64) -> bool {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else { return false };
    let Some(renew) = spec.renew_time.as_ref() else { return false };
    let duration = spec.lease_duration_seconds.map_or(DEFAULT_LEASE_S, i64::from);
    renew.0.as_second().saturating_add(duration) >= now_s
}

/// Not cordoned and no taint that keeps new Pods off (NoSchedule, NoExecute).
fn admits_pods(node: &Node) -> bool {
    let spec = node.spec.clone().unwrap_or_default();
    !spec.unschedulable.unwrap_or(false) && spec.taints.unwrap_or_default().iter().all(|t| t.effect == "PreferNoSchedule")
}

/// A qualification's state label: the verdict's `state` as the API writes it (`qualified`,
/// `clamped`, `disqualified`, `notQualified`); `stale` for a result under an older fingerprint
/// of the node; `inProgress` for a class asked for and not reported yet.
fn verdict_state(v: &brink_api::Verdict) -> String {
    serde_json::to_value(v).ok().and_then(|j| j.get("state").and_then(|s| s.as_str()).map(String::from)).unwrap_or_else(|| "unknown".into())
}

/// The fleet gauges: one series set per node with an agent (a `SparkNode`), one per deployment.
pub fn fleet_series(input: &FleetInput<'_>) -> FleetSeries {
    let mut out = FleetSeries::default();
    let nodes: BTreeMap<String, &Node> = input.nodes.iter().map(|n| (n.name_any(), n.as_ref())).collect();
    let leases: BTreeMap<String, &Lease> = input.leases.iter().map(|l| (l.name_any(), l.as_ref())).collect();
    let mut sparks: Vec<&SparkNode> = input.spark_nodes.iter().map(Arc::as_ref).collect();
    sparks.sort_by_key(|s| s.name_any());
    for spark in sparks {
        let name = spark.name_any();
        let up = heartbeat_fresh(leases.get(&heartbeat_lease(&name)).copied(), input.now_s);
        let schedulable = up && nodes.get(&name).is_some_and(|n| admits_pods(n));
        out.node_up.push((vec![name.clone()], f64::from(u8::from(up))));
        out.node_schedulable.push((vec![name.clone()], f64::from(u8::from(schedulable))));

        let mut classes: BTreeMap<String, (String, Option<u64>)> =
            spark.spec.shape_classes.iter().map(|c| (c.clone(), ("inProgress".to_string(), None))).collect();
        if let Some(status) = &spark.status {
            for q in &status.qualifications {
                let stale = status.fingerprint.as_ref().is_some_and(|fp| !fp.covers(&q.qualification.fingerprint));
                let state = if stale { "stale".to_string() } else { verdict_state(&q.qualification.verdict) };
                classes.insert(q.shape_class.clone(), (state, q.envelope.as_ref().map(|e| e.max_batch_tokens)));
            }
        }
        for (class, (state, envelope)) in classes {
            out.node_qualified.push((vec![name.clone(), class.clone(), state], 1.0));
            if let Some(tokens) = envelope {
                out.node_envelope_max_batch_tokens.push((vec![name.clone(), class], tokens as f64));
            }
        }
        let hosted =
            input.replicas.iter().filter(|r| r.spec.nodes().contains(&name.as_str()) && r.metadata.deletion_timestamp.is_none()).count();
        out.node_replicas.push((vec![name], hosted as f64));
    }
    let mut deps: Vec<&ModelDeployment> = input.deployments.iter().map(Arc::as_ref).collect();
    deps.sort_by_key(|d| (d.namespace(), d.name_any()));
    for d in deps {
        let (ns, name) = (d.namespace().unwrap_or_default(), d.name_any());
        let ready = d.status.as_ref().map_or(0, |s| s.ready_replicas);
        let unplaced = (input.unplaced)(&ns, &name);
        for (state, v) in [("desired", f64::from(d.spec.replicas)), ("ready", f64::from(ready)), ("unplaced", unplaced as f64)] {
            out.deployment_replicas.push((vec![ns.clone(), name.clone(), state.to_string()], v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use brink_api::crd::{ModelDeploymentStatus, NodeFingerprint, ShapeQualification, SparkNodeSpec, SparkNodeStatus};
    use brink_api::{Envelope, Fingerprint, QUALIFICATION_SCHEMA, Qualification, ReportSummary, ServingParams, Verdict};
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    const NOW: i64 = 1_796_083_200;

    fn node(name: &str, unschedulable: bool, taint: Option<&str>) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.spec = Some(NodeSpec {
            unschedulable: Some(unschedulable),
            taints: taint.map(|e| vec![Taint { key: "k".into(), effect: e.into(), ..Taint::default() }]),
            ..NodeSpec::default()
        });
        Arc::new(n)
    }

    fn lease(node: &str, renewed_ago_s: i64) -> Arc<Lease> {
        let mut l = Lease::default();
        l.metadata.name = Some(heartbeat_lease(node));
        l.spec = Some(LeaseSpec {
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::from_second(NOW - renewed_ago_s).unwrap())),
            ..LeaseSpec::default()
        });
        Arc::new(l)
    }

    fn fingerprint(driver: &str) -> Fingerprint {
        Fingerprint {
            gpu_name: "NVIDIA GB10".into(),
            compute_capability: "12.1".into(),
            driver_version: Some(driver.into()),
            cuda_version: "13.0".into(),
            nvrtc_version: None,
            agent_version: "0.2.0".into(),
            kernel_sources_hash: "cafe".into(),
            shape_class: "x".into(),
            serving: ServingParams { max_batch_tokens: 8192, prefill_chunk: 2048, context: 32_768, full_window_kv: false },
        }
    }

    /// A SparkNode asked for `asked` classes, with results `(class, verdict, envelope tokens, driver)`.
    fn spark(name: &str, asked: &[&str], results: &[(&str, Verdict, Option<u64>, &str)]) -> Arc<SparkNode> {
        let mut s = SparkNode::new(name, SparkNodeSpec { shape_classes: asked.iter().map(|c| c.to_string()).collect() });
        let qualifications = results
            .iter()
            .map(|(class, verdict, tokens, driver)| {
                let fingerprint = fingerprint(driver);
                ShapeQualification {
                    shape_class: class.to_string(),
                    qualification: Qualification {
                        schema: QUALIFICATION_SCHEMA,
                        digest: fingerprint.digest(),
                        fingerprint,
                        verdict: verdict.clone(),
                        summary: ReportSummary::default(),
                        qualified_at: "2026-11-30T23:00:00Z".into(),
                        model_summary: None,
                        kernel_verdict: None,
                        model_verdict: None,
                    },
                    envelope: tokens.map(|t| Envelope {
                        validated: true,
                        validated_tokens: Some(t),
                        first_failure: None,
                        max_batch_tokens: t,
                        prefill_chunk: 2048,
                    }),
                    failing_cases: Vec::new(),
                }
            })
            .collect();
        let fp = fingerprint("580.95.05");
        s.status = Some(SparkNodeStatus {
            fingerprint: Some(NodeFingerprint {
                gpu_name: fp.gpu_name,
                compute_capability: fp.compute_capability,
                driver_version: fp.driver_version,
                cuda_version: fp.cuda_version,
                nvrtc_version: fp.nvrtc_version,
                agent_version: fp.agent_version,
                kernel_sources_hash: fp.kernel_sources_hash,
            }),
            qualifications,
            ..Default::default()
        });
        Arc::new(s)
    }

    fn replica(name: &str, node: &str, deleting: bool) -> Arc<ModelReplica> {
        let mut r: ModelReplica = serde_json::from_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
            "metadata": { "name": name, "namespace": "llm" },
            "spec": { "deployment": "qwen", "node": node, "model": "qwen", "revision": "r1",
                      "engine": { "image": "brink:1", "version": "1" },
                      "serving": { "context": 32768, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.9 } },
        }))
        .expect("a replica");
        if deleting {
            r.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(NOW).unwrap()));
        }
        Arc::new(r)
    }

    fn deployment(ns: &str, name: &str, replicas: i32, ready: i32) -> Arc<ModelDeployment> {
        let mut d: ModelDeployment = serde_json::from_value(json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": { "name": name, "namespace": ns },
            "spec": { "replicas": replicas, "modelRef": { "name": "qwen" },
                      "engine": { "image": "brink:1", "version": "1" },
                      "serving": { "context": 32768, "maxBatchTokens": 8192, "prefillChunk": 2048, "concurrency": 4, "kvFraction": 0.9 } },
        }))
        .expect("a deployment");
        d.status = Some(ModelDeploymentStatus { ready_replicas: ready, ..Default::default() });
        Arc::new(d)
    }

    fn s(v: &[&str], x: f64) -> (Vec<String>, f64) {
        (v.iter().map(|s| s.to_string()).collect(), x)
    }

    #[test]
    fn every_node_and_deployment_gets_its_series() {
        let nodes = [
            node("a", false, None),
            node("b", true, None),
            node("c", false, Some("NoSchedule")),
            node("d", false, Some("PreferNoSchedule")),
        ];
        let qualified = Verdict::Qualified { max_tokens: 16384 };
        let clamped = Verdict::Clamped { max_tokens: 4096, first_failure: 8192 };
        let sparks = [
            spark("a", &["x", "y"], &[("x", qualified.clone(), Some(16384), "580.95.05")]),
            spark("b", &[], &[("x", clamped, Some(4096), "580.95.05")]),
            // Qualified under an older driver: stale.
            spark("c", &[], &[("x", qualified.clone(), Some(16384), "575.0")]),
            spark("d", &[], &[]),
            // An agent whose Node is gone: up by its heartbeat, never schedulable.
            spark("e", &[], &[]),
        ];
        let leases = [lease("a", 5), lease("b", 5), lease("c", 39), lease("d", 41), lease("e", 1)];
        let replicas = [replica("r0", "a", false), replica("r1", "a", false), replica("r2", "b", true)];
        let deps = [deployment("llm", "qwen", 3, 2), deployment("dev", "tiny", 1, 1)];
        let unplaced = |ns: &str, d: &str| u64::from(ns == "llm" && d == "qwen");
        let out = fleet_series(&FleetInput {
            now_s: NOW,
            nodes: &nodes,
            spark_nodes: &sparks,
            leases: &leases,
            replicas: &replicas,
            deployments: &deps,
            unplaced: &unplaced,
        });
        assert_eq!(out.node_up, vec![s(&["a"], 1.0), s(&["b"], 1.0), s(&["c"], 1.0), s(&["d"], 0.0), s(&["e"], 1.0)]);
        assert_eq!(out.node_schedulable, vec![s(&["a"], 1.0), s(&["b"], 0.0), s(&["c"], 0.0), s(&["d"], 0.0), s(&["e"], 0.0)]);
        assert_eq!(
            out.node_qualified,
            vec![
                s(&["a", "x", "qualified"], 1.0),
                s(&["a", "y", "inProgress"], 1.0),
                s(&["b", "x", "clamped"], 1.0),
                s(&["c", "x", "stale"], 1.0)
            ]
        );
        assert_eq!(out.node_envelope_max_batch_tokens, vec![s(&["a", "x"], 16384.0), s(&["b", "x"], 4096.0), s(&["c", "x"], 16384.0)]);
        assert_eq!(out.node_replicas, vec![s(&["a"], 2.0), s(&["b"], 0.0), s(&["c"], 0.0), s(&["d"], 0.0), s(&["e"], 0.0)]);
        assert_eq!(
            out.deployment_replicas,
            vec![
                s(&["dev", "tiny", "desired"], 1.0),
                s(&["dev", "tiny", "ready"], 1.0),
                s(&["dev", "tiny", "unplaced"], 0.0),
                s(&["llm", "qwen", "desired"], 3.0),
                s(&["llm", "qwen", "ready"], 2.0),
                s(&["llm", "qwen", "unplaced"], 1.0),
            ]
        );
    }

    #[test]
    fn no_lease_or_no_renewal_is_down_and_an_empty_fleet_has_no_series() {
        assert!(!heartbeat_fresh(None, NOW));
        let mut l = (*lease("a", 0)).clone();
        l.spec.as_mut().unwrap().renew_time = None;
        assert!(!heartbeat_fresh(Some(&l), NOW));
        // The boundary: renewed exactly one duration ago is still fresh.
        assert!(heartbeat_fresh(Some(&lease("a", 40)), NOW));
        let out = fleet_series(&FleetInput {
            now_s: NOW,
            nodes: &[node("a", false, None)],
            spark_nodes: &[],
            leases: &[],
            replicas: &[],
            deployments: &[],
            unplaced: &|_, _| 0,
        });
        assert_eq!(out, FleetSeries::default());
    }
}
