//! The test handle: injected API errors and the request log.

use brink_api::crd::ModelDeployment;
use http::Method;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::{NS, api_error, deployment, double_with_apis};

#[tokio::test]
async fn injected_errors_hit_the_next_matching_requests_only() {
    let (d, deps, _) = double_with_apis();
    deps.create(&PostParams::default(), &deployment("f", 1)).await.unwrap();
    d.fail_next(Some(Method::PATCH), "/modeldeployments/f/status", 2, 500);
    d.fail_next(Some(Method::GET), "/modeldeployments", 1, 403);

    let status = Patch::Merge(json!({"status": {"replicas": 1}}));
    let pp = PatchParams::default();
    // The GET fault does not touch PATCHes; the PATCH faults do not touch GETs.
    assert_eq!(api_error(deps.patch_status("f", &pp, &status).await).code, 500);
    let forbidden = api_error(deps.get("f").await);
    assert_eq!((forbidden.code, forbidden.reason.as_str()), (403, "Forbidden"));
    assert_eq!(api_error(deps.patch_status("f", &pp, &status).await).code, 500);
    deps.patch_status("f", &pp, &status).await.unwrap();
    deps.get("f").await.unwrap();

    let lines = d.request_lines();
    let tail: Vec<&str> = lines.iter().skip(1).map(|l| l.split('?').next().unwrap()).collect();
    let path = "/apis/brink.dev/v1alpha1/namespaces/serving/modeldeployments/f";
    assert_eq!(
        tail,
        [
            format!("PATCH {path}/status"),
            format!("GET {path}"),
            format!("PATCH {path}/status"),
            format!("PATCH {path}/status"),
            format!("GET {path}"),
        ]
    );
    let first_patch = &d.requests()[1];
    assert_eq!(first_patch.content_type.as_deref(), Some("application/merge-patch+json"));
    assert_eq!(first_patch.body, Some(json!({"status": {"replicas": 1}})));
    let stored: ModelDeployment = d.get(Some(NS), "f").unwrap();
    assert_eq!(stored.status.unwrap().replicas, 1, "only the unfaulted patch landed");
}

#[tokio::test]
async fn seeded_objects_keep_their_status_and_are_watchable() {
    let d = brink_kube_double::KubeDouble::new();
    let mut dep = deployment("seeded", 2);
    dep.status = serde_json::from_value(json!({"replicas": 2, "readyReplicas": 1})).unwrap();
    let stored = d.seed(&dep).unwrap();
    assert_eq!(stored.status.as_ref().unwrap().ready_replicas, 1);
    assert!(stored.metadata.uid.is_some() && stored.metadata.resource_version.is_some());
    let deps: kube::Api<ModelDeployment> = kube::Api::namespaced(d.client(), NS);
    assert_eq!(deps.get("seeded").await.unwrap().status, stored.status);
    assert!(d.seed_value(json!({"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w"}})).is_err());
    assert!(d.seed_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "no-namespace"}})).is_err());
}
