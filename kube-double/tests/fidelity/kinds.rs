//! Built-in kinds beyond the core group: Leases (leader election's optimistic concurrency) and
//! events.k8s.io Events (kube's `Recorder`, which creates and then merge-patches a series).

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use kube::api::{ListParams, PostParams};
use kube::runtime::events::{Event as RecordedEvent, EventType, Recorder, Reporter};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::{NS, api_error};

#[tokio::test]
async fn lease_renewals_race_on_the_resource_version() {
    let d = brink_kube_double::KubeDouble::new();
    let leases: Api<Lease> = Api::namespaced(d.client(), NS);
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "brink-operator"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}),
    )
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();

    // Two candidates read the same version; the first renewal wins, the second gets 409.
    let mut a = created.clone();
    a.spec.as_mut().unwrap().holder_identity = Some("a".into());
    a.spec.as_mut().unwrap().lease_transitions = Some(1);
    let mut b = created;
    b.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases.replace("brink-operator", &PostParams::default(), &a).await.unwrap();
    let err = api_error(leases.replace("brink-operator", &PostParams::default(), &b).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(err.message.contains("leases.coordination.k8s.io \"brink-operator\""), "{}", err.message);
    assert_eq!(leases.get("brink-operator").await.unwrap().spec.unwrap().holder_identity.as_deref(), Some("a"));
}

#[tokio::test]
async fn recorder_creates_an_event_then_patches_its_series() {
    let d = brink_kube_double::KubeDouble::new();
    let recorder = Recorder::new(d.client(), Reporter { controller: "brink-operator".into(), instance: None });
    let reference = ObjectReference {
        api_version: Some("brink.dev/v1alpha1".into()),
        kind: Some("ModelDeployment".into()),
        name: Some("qwen3".into()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    let ev = RecordedEvent {
        type_: EventType::Normal,
        reason: "Placed".into(),
        note: Some("qwen3-x7k2 on spark-02".into()),
        action: "Place".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();

    let events: Api<Event> = Api::namespaced(d.client(), NS);
    let all = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 1, "the second publish patches the first event");
    let e = &all.items[0];
    assert_eq!(e.reason.as_deref(), Some("Placed"));
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    let methods: Vec<String> = d.requests().iter().map(|r| format!("{} {}", r.method, r.path)).collect();
    assert_eq!(
        methods,
        [
            format!("POST /apis/events.k8s.io/v1/namespaces/{NS}/events"),
            format!("PATCH /apis/events.k8s.io/v1/namespaces/{NS}/events/{}", e.name_any()),
            format!("GET /apis/events.k8s.io/v1/namespaces/{NS}/events"),
        ]
    );
}

/// A CRD outside brink's four kinds, served once added.
#[derive(kube::CustomResource, serde::Serialize, serde::Deserialize, schemars::JsonSchema, Clone, Debug, Default)]
#[kube(group = "example.dev", version = "v1", kind = "Widget", namespaced, status = "WidgetStatus")]
pub struct WidgetSpec {
    size: u32,
}

#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, Clone, Debug, Default)]
pub struct WidgetStatus {
    ok: bool,
}

#[tokio::test]
async fn added_crds_are_served_with_their_subresources() {
    use kube::CustomResourceExt;
    let d = brink_kube_double::KubeDouble::new();
    let widgets: Api<Widget> = Api::namespaced(d.client(), NS);
    let w = Widget::new("w", WidgetSpec { size: 1 });
    assert_eq!(api_error(widgets.create(&PostParams::default(), &w).await).code, 404, "unknown before the CRD is added");
    d.add_crd(&Widget::crd());
    let created = widgets.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let st = widgets
        .patch_status("w", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(json!({"status": {"ok": true}})))
        .await
        .unwrap();
    assert!(st.status.unwrap().ok);
    assert_eq!(st.metadata.generation, Some(1));
}

#[tokio::test]
async fn metadata_only_reads_and_watches_work() {
    use futures::TryStreamExt;
    use kube::core::PartialObjectMeta;
    use kube::runtime::{WatchStreamExt, watcher};
    let d = brink_kube_double::KubeDouble::new();
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(d.client(), NS);
    let cm = serde_json::from_value(json!({"metadata": {"name": "m", "labels": {"a": "b"}}, "data": {"k": "v"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let meta = cms.get_metadata("m").await.unwrap();
    assert_eq!(meta.metadata.labels.unwrap()["a"], "b");
    let listed = cms.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    let metas: Api<PartialObjectMeta<k8s_openapi::api::core::v1::ConfigMap>> = Api::namespaced(d.client(), NS);
    let mut stream = watcher(metas, watcher::Config::default()).applied_objects().boxed();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), stream.try_next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.name_any(), "m");
}
