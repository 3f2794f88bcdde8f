//! Replicas found in a cluster: the gateway watches `ModelDeployment`s, `ModelReplica`s and
//! `EndpointSlice`s (read-only) and routes to every replica that is serving and Ready, under the
//! names its deployment answers to (`spec.servedModelNames`, else the Model's name).
//!
//! A replica counts when its deployment exists (and is not being deleted), its phase is
//! `Serving` with an endpoint, its `Ready` and `Qualified` conditions (where present) are true,
//! and no EndpointSlice lists its address and port as not ready: the slices follow the Pod's
//! readiness probe (the engine's `/ready`) within seconds, before the node agent's next status
//! report. The gateway's own polls of `/ready` and `/metrics` still decide health and load; the
//! replica's `serving` limits tell its slots (for prefix affinity) and its context.

use std::sync::Arc;

use brink_api::crd::{ModelDeployment, ModelReplica, ReplicaPhase};
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use crate::discovery::Declared;
use crate::server::Gateway;

/// Watches the three kinds (cluster-wide: the chart's read-only ClusterRole) until aborted, and
/// makes the routable replicas of `namespaces` (all when empty) the gateway's upstreams after
/// every change.
pub async fn watch(gw: Arc<Gateway>, client: Client, namespaces: Vec<String>) {
    let (deployments, w1) = reflector::store::<ModelDeployment>();
    let (replicas, w2) = reflector::store::<ModelReplica>();
    let (slices, w3) = reflector::store::<EndpointSlice>();
    let config = watcher::Config::default();
    // Each event only says "something changed"; the stores hold the state.
    let streams = vec![
        reflector(w1, watcher(Api::<ModelDeployment>::all(client.clone()), config.clone())).default_backoff().map(describe).boxed(),
        reflector(w2, watcher(Api::<ModelReplica>::all(client.clone()), config.clone())).default_backoff().map(describe).boxed(),
        reflector(w3, watcher(Api::<EndpointSlice>::all(client), config)).default_backoff().map(describe).boxed(),
    ];
    let mut events = futures::stream::select_all(streams);
    let mut last: Option<Vec<(String, Option<Declared>)>> = None;
    while let Some(event) = events.next().await {
        if let Err(e) = event {
            // The watcher retries with backoff; the stores keep the last state meanwhile.
            eprintln!("brink-gateway: watching the cluster: {e}");
            continue;
        }
        let in_scope: Vec<Arc<ModelReplica>> = replicas
            .state()
            .into_iter()
            .filter(|r| namespaces.is_empty() || r.namespace().is_some_and(|ns| namespaces.contains(&ns)))
            .collect();
        let desired: Vec<(String, Option<Declared>)> =
            routable(&deployments.state(), &in_scope, &slices.state()).into_iter().map(|(b, d)| (b, Some(d))).collect();
        if last.as_ref() != Some(&desired) {
            gw.set_upstreams(desired.clone());
            last = Some(desired);
        }
    }
}

fn describe<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<(), String> {
    r.map(|_| ()).map_err(|e| e.to_string())
}

/// The replicas to route to, sorted by namespace and name: base URL and what they serve. Pure,
/// so the rules are one table of cases.
pub fn routable(
    deployments: &[Arc<ModelDeployment>],
    replicas: &[Arc<ModelReplica>],
    slices: &[Arc<EndpointSlice>],
) -> Vec<(String, Declared)> {
    let mut sorted: Vec<&Arc<ModelReplica>> = replicas.iter().collect();
    sorted.sort_by_key(|r| (r.namespace(), r.name_any()));
    let mut out: Vec<(String, Declared)> = Vec::new();
    for r in sorted {
        let ns = r.namespace();
        let Some(dep) = deployments.iter().find(|d| d.namespace() == ns && d.name_any() == r.spec.deployment) else { continue };
        if dep.metadata.deletion_timestamp.is_some() || r.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(status) = &r.status else { continue };
        if status.phase != ReplicaPhase::Serving {
            continue;
        }
        let condition_false = |t: &str| status.conditions.iter().any(|c| c.type_ == t && c.status != "True");
        if condition_false("Ready") || condition_false("Qualified") {
            continue;
        }
        let Some((host, port)) = status.endpoint.as_deref().and_then(split_endpoint) else { continue };
        let in_ns: Vec<&Arc<EndpointSlice>> = slices.iter().filter(|s| s.namespace() == ns).collect();
        if listed_not_ready(&in_ns, host, port) {
            continue;
        }
        let base = if host.contains(':') { format!("http://[{host}]:{port}") } else { format!("http://{host}:{port}") };
        if out.iter().any(|(b, _)| *b == base) {
            continue;
        }
        out.push((
            base,
            Declared {
                models: dep.spec.served_names(),
                served_as: r.spec.model.clone(),
                slots: Some(u64::from(r.spec.serving.concurrency)),
                context: Some(r.spec.serving.context),
            },
        ));
    }
    out
}

/// `host:port`, `[v6]:port` or a bare IPv6 address with its port after the last colon.
fn split_endpoint(endpoint: &str) -> Option<(&str, u16)> {
    let (host, port) = endpoint.rsplit_once(':')?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port: u16 = port.parse().ok()?;
    if host.is_empty() || port == 0 { None } else { Some((host, port)) }
}

/// Whether a slice lists `host` on `port` with `ready: false` (an endpoint without the
/// condition counts as ready, as Kubernetes reads it).
fn listed_not_ready(slices: &[&Arc<EndpointSlice>], host: &str, port: u16) -> bool {
    slices.iter().any(|s| {
        let on_port = match &s.ports {
            Some(ports) if !ports.is_empty() => ports.iter().any(|p| p.port == Some(i32::from(port))),
            _ => true,
        };
        on_port
            && s.endpoints
                .iter()
                .flatten()
                .any(|e| e.addresses.iter().any(|a| a == host) && e.conditions.as_ref().and_then(|c| c.ready) == Some(false))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dep(ns: &str, name: &str, model: &str, names: &[&str], deleting: bool) -> Arc<ModelDeployment> {
        let mut v = json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"modelRef": {"name": model}, "servedModelNames": names, "engine": {"image": "i", "version": "1"},
                     "serving": {"context": 4096, "maxBatchTokens": 4096, "prefillChunk": 1024, "concurrency": 4, "kvFraction": 0.9}}
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn rep(ns: &str, name: &str, dep: &str, model: &str, phase: &str, endpoint: Option<&str>, ready: Option<&str>) -> Arc<ModelReplica> {
        let mut status = json!({"phase": phase});
        if let Some(e) = endpoint {
            status["endpoint"] = json!(e);
        }
        if let Some(r) = ready {
            status["conditions"] =
                json!([{"type": "Ready", "status": r, "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        }
        let v = json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"deployment": dep, "node": "n", "model": model, "revision": "r", "engine": {"image": "i", "version": "1"},
                     "serving": {"context": 4096, "maxBatchTokens": 4096, "prefillChunk": 1024, "concurrency": 4, "kvFraction": 0.9}},
            "status": status
        });
        Arc::new(serde_json::from_value(v).unwrap())
    }

    fn slice(ns: &str, port: i32, endpoints: &[(&str, Option<bool>)]) -> Arc<EndpointSlice> {
        let eps: Vec<_> = endpoints.iter().map(|(a, r)| json!({"addresses": [a], "conditions": {"ready": r}})).collect();
        let v = json!({"metadata": {"name": "s", "namespace": ns}, "addressType": "IPv4", "ports": [{"name": "http", "port": port}], "endpoints": eps});
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn which_replicas_are_routed_to() {
        let deps = vec![
            dep("a", "chat", "qwen", &["qwen", "chat"], false),
            dep("a", "code", "coder", &[], false),
            dep("a", "old", "m", &[], true),
        ];
        let reps = vec![
            rep("a", "chat-1", "chat", "qwen", "Serving", Some("10.0.0.2:8000"), Some("True")),
            rep("a", "chat-0", "chat", "qwen", "Serving", Some("10.0.0.1:8000"), None),
            rep("a", "chat-2", "chat", "qwen", "Loading", Some("10.0.0.3:8000"), None),
            rep("a", "chat-3", "chat", "qwen", "Serving", Some("10.0.0.4:8000"), Some("False")),
            rep("a", "chat-4", "chat", "qwen", "Serving", None, None),
            rep("a", "chat-5", "chat", "qwen", "Serving", Some("10.0.0.5:8000"), None),
            rep("a", "code-0", "code", "coder", "Serving", Some("[fd00::1]:8000"), None),
            rep("a", "old-0", "old", "m", "Serving", Some("10.0.0.6:8000"), None),
            rep("a", "gone-0", "gone", "m", "Serving", Some("10.0.0.7:8000"), None),
            rep("b", "chat-0", "chat", "qwen", "Serving", Some("10.0.0.8:8000"), None),
        ];
        // chat-5 is listed not ready on its port; chat-1 not ready on another port only.
        let slices =
            vec![slice("a", 8000, &[("10.0.0.5", Some(false)), ("10.0.0.1", Some(true))]), slice("a", 9000, &[("10.0.0.2", Some(false))])];
        let got = routable(&deps, &reps, &slices);
        let limits = (Some(4), Some(4096));
        let chat = Declared { models: vec!["qwen".into(), "chat".into()], served_as: "qwen".into(), slots: limits.0, context: limits.1 };
        let code = Declared { models: vec!["coder".into()], served_as: "coder".into(), slots: limits.0, context: limits.1 };
        assert_eq!(
            got,
            vec![
                ("http://10.0.0.1:8000".to_string(), chat.clone()),
                ("http://10.0.0.2:8000".to_string(), chat),
                ("http://[fd00::1]:8000".to_string(), code),
            ]
        );
    }

    #[test]
    fn endpoints() {
        assert_eq!(split_endpoint("10.1.2.3:8000"), Some(("10.1.2.3", 8000)));
        assert_eq!(split_endpoint("[fd00::1]:80"), Some(("fd00::1", 80)));
        assert_eq!(split_endpoint("replica.ns.svc:8080"), Some(("replica.ns.svc", 8080)));
        for bad in ["", "host", "host:", ":80", "host:0", "host:99999"] {
            assert_eq!(split_endpoint(bad), None, "{bad}");
        }
    }
}
