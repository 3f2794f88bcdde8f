//! Creates, replaces, patches: resourceVersion conflicts, generation, status and scale subresources.

use brink_api::crd::ModelDeployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::{NS, api_error, deployment, double_with_apis};

#[tokio::test]
async fn replace_with_a_stale_resource_version_is_409() {
    let (d, deps, _) = double_with_apis();
    let created = deps.create(&PostParams::default(), &deployment("qwen3", 2)).await.unwrap();
    let rv1 = created.resource_version().expect("a resourceVersion");

    let mut first = created.clone();
    first.spec.replicas = 3;
    let replaced = deps.replace("qwen3", &PostParams::default(), &first).await.unwrap();
    assert_ne!(replaced.resource_version(), Some(rv1.clone()), "every write gets a new resourceVersion");

    // A second writer still holding the first version loses.
    let mut stale = created;
    stale.spec.replicas = 7;
    let err = api_error(deps.replace("qwen3", &PostParams::default(), &stale).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(err.message.contains("the object has been modified; please apply your changes to the latest version"), "{}", err.message);
    let stored: ModelDeployment = d.get(Some(NS), "qwen3").unwrap();
    assert_eq!(stored.spec.replicas, 3, "the stale write changed nothing");

    // A custom resource cannot be replaced unconditionally; a ConfigMap can.
    let mut unconditional = deps.get("qwen3").await.unwrap();
    unconditional.metadata.resource_version = None;
    assert_eq!(api_error(deps.replace("qwen3", &PostParams::default(), &unconditional).await).code, 422);
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "1"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let next: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"a": "2"}})).unwrap();
    let replaced = cms.replace("c", &PostParams::default(), &next).await.unwrap();
    assert_eq!(replaced.data.unwrap()["a"], "2");

    // A merge patch carrying the stale resourceVersion as a precondition fails the same way.
    let patch = json!({"metadata": {"resourceVersion": rv1}, "spec": {"replicas": 9}});
    let err = api_error(deps.patch("qwen3", &PatchParams::default(), &Patch::Merge(&patch)).await);
    assert_eq!(err.code, 409);
}

#[tokio::test]
async fn create_twice_is_already_exists_and_generate_name_makes_unique_names() {
    let (_d, deps, _) = double_with_apis();
    deps.create(&PostParams::default(), &deployment("a", 1)).await.unwrap();
    let err = api_error(deps.create(&PostParams::default(), &deployment("a", 1)).await);
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));

    let mut generated = deployment("", 1);
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("qwen3-".into());
    let x = deps.create(&PostParams::default(), &generated).await.unwrap();
    let y = deps.create(&PostParams::default(), &generated).await.unwrap();
    assert!(x.name_any().starts_with("qwen3-") && x.name_any().len() == "qwen3-".len() + 5, "{}", x.name_any());
    assert_ne!(x.name_any(), y.name_any());
    assert_ne!(x.uid(), y.uid());

    let dry = deps.create(&PostParams { dry_run: true, ..Default::default() }, &deployment("dry", 1)).await.unwrap();
    assert_eq!(dry.metadata.generation, Some(1), "a dry run returns what would be stored");
    assert_eq!(api_error(deps.get("dry").await).code, 404, "and stores nothing");

    let mut nameless = deployment("", 1);
    nameless.metadata.name = None;
    let err = api_error(deps.create(&PostParams::default(), &nameless).await);
    assert_eq!(err.code, 422);
}

#[tokio::test]
async fn generation_bumps_only_on_spec_changes() {
    let (_d, deps, _) = double_with_apis();
    let generation = |d: &ModelDeployment| d.metadata.generation.unwrap_or(-1);
    let created = deps.create(&PostParams::default(), &deployment("g", 1)).await.unwrap();
    assert_eq!(generation(&created), 1);

    let labelled = deps.patch("g", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}}))).await.unwrap();
    assert_eq!(generation(&labelled), 1, "metadata changes leave generation alone");

    let status = json!({"status": {"replicas": 1, "readyReplicas": 0}});
    let with_status = deps.patch_status("g", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    assert_eq!(generation(&with_status), 1, "status changes leave generation alone");

    let scaled = deps.patch("g", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 4}}))).await.unwrap();
    assert_eq!(generation(&scaled), 2);

    let mut relabelled = scaled.clone();
    relabelled.metadata.labels.get_or_insert_default().insert("team".into(), "b".into());
    let same = deps.replace("g", &PostParams::default(), &relabelled).await.unwrap();
    assert_eq!(generation(&same), 2, "a replace with an unchanged spec");
    assert_ne!(same.resource_version(), scaled.resource_version());
}

#[tokio::test]
async fn a_write_that_changes_nothing_keeps_the_resource_version() {
    let (d, deps, _) = double_with_apis();
    let created = deps.create(&PostParams::default(), &deployment("noop", 1)).await.unwrap();
    let status = Patch::Apply(json!({"apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment", "status": {"replicas": 1}}));
    let first = deps.patch_status("noop", &PatchParams::apply("op"), &status).await.unwrap();
    let rv = d.resource_version();
    let again = deps.patch_status("noop", &PatchParams::apply("op"), &status).await.unwrap();
    let replaced = deps.replace("noop", &PostParams::default(), &again).await.unwrap();
    let merged = deps.patch("noop", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await.unwrap();
    assert_eq!(d.resource_version(), rv, "no-op writes are not stored");
    for o in [&again, &replaced, &merged] {
        assert_eq!(o.resource_version(), first.resource_version());
    }
    assert_ne!(first.resource_version(), created.resource_version());
}

#[tokio::test]
async fn status_subresource_isolates_status_from_spec() {
    let (d, deps, _) = double_with_apis();
    let mut with_status = deployment("s", 2);
    with_status.status = serde_json::from_value(json!({"replicas": 5, "readyReplicas": 5})).unwrap();
    let created = deps.create(&PostParams::default(), &with_status).await.unwrap();
    assert!(created.status.is_none(), "create ignores the status: {:?}", created.status);

    deps.patch_status("s", &PatchParams::default(), &Patch::Merge(json!({"status": {"replicas": 1}}))).await.unwrap();
    // A main-resource write that also changes status: the spec change lands, the status does not.
    let mut cur = deps.get("s").await.unwrap();
    cur.spec.replicas = 3;
    cur.status.as_mut().unwrap().replicas = 99;
    let after = deps.replace("s", &PostParams::default(), &cur).await.unwrap();
    assert_eq!((after.spec.replicas, after.status.as_ref().unwrap().replicas), (3, 1));

    // A status write that also changes spec: the status lands, the spec does not.
    let mut cur = deps.get("s").await.unwrap();
    cur.spec.replicas = 8;
    cur.status.as_mut().unwrap().replicas = 2;
    let after = deps.replace_status("s", &PostParams::default(), &cur).await.unwrap();
    assert_eq!((after.spec.replicas, after.status.as_ref().unwrap().replicas), (3, 2));

    // Kinds without the subresource have no /status.
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    let err = api_error(cms.get_status("any").await);
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn scale_subresource_reads_and_writes_replicas() {
    let (d, deps, _) = double_with_apis();
    deps.create(&PostParams::default(), &deployment("sc", 3)).await.unwrap();
    deps.patch_status(
        "sc",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"replicas": 2, "selector": "brink.dev/deployment=sc"}})),
    )
    .await
    .unwrap();

    let scale = deps.get_scale("sc").await.unwrap();
    assert_eq!(scale.spec.as_ref().and_then(|s| s.replicas), Some(3));
    let st = scale.status.as_ref().unwrap();
    assert_eq!((st.replicas, st.selector.as_deref()), (2, Some("brink.dev/deployment=sc")));

    let mut five = scale.clone();
    five.spec.as_mut().unwrap().replicas = Some(5);
    let written = deps.replace_scale("sc", &PostParams::default(), &five).await.unwrap();
    assert_eq!(written.spec.unwrap().replicas, Some(5));
    let dep: ModelDeployment = d.get(Some(NS), "sc").unwrap();
    assert_eq!((dep.spec.replicas, dep.metadata.generation), (5, Some(2)), "a scale write is a spec change");

    // The Scale read before the write is stale now.
    let err = api_error(deps.replace_scale("sc", &PostParams::default(), &scale).await);
    assert_eq!(err.code, 409);

    let patched = deps.patch_scale("sc", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 1}}))).await.unwrap();
    assert_eq!(patched.spec.unwrap().replicas, Some(1));
    let err = api_error(deps.patch_scale("sc", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": -1}}))).await);
    assert_eq!(err.code, 422);

    // Only ModelDeployment has /scale among brink's kinds.
    let nodes: Api<brink_api::crd::SparkNode> = Api::all(d.client());
    assert_eq!(api_error(nodes.get_scale("n").await).code, 404);
}

#[tokio::test]
async fn list_filters_by_selectors_and_pages() {
    let d = brink_kube_double::KubeDouble::new();
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    for (i, tier) in ["gpu", "gpu", "cpu", "gpu", "edge"].iter().enumerate() {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": format!("cm{i}"), "labels": {"tier": tier}}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let other: Api<ConfigMap> = Api::namespaced(d.client(), "other");
    other
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "x", "labels": {"tier": "gpu"}}})).unwrap())
        .await
        .unwrap();

    let names = |l: kube::core::ObjectList<ConfigMap>| l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>();
    assert_eq!(names(cms.list(&ListParams::default().labels("tier=gpu")).await.unwrap()), ["cm0", "cm1", "cm3"]);
    assert_eq!(names(cms.list(&ListParams::default().labels("tier in (cpu,edge)")).await.unwrap()), ["cm2", "cm4"]);
    assert_eq!(names(cms.list(&ListParams::default().labels("tier!=gpu")).await.unwrap()), ["cm2", "cm4"]);
    assert_eq!(names(cms.list(&ListParams::default().fields("metadata.name=cm3")).await.unwrap()), ["cm3"]);
    let all: Api<ConfigMap> = Api::all(d.client());
    assert_eq!(all.list(&ListParams::default().labels("tier=gpu")).await.unwrap().items.len(), 4, "across namespaces");

    let page1 = cms.list(&ListParams::default().limit(2)).await.unwrap();
    let token = page1.metadata.continue_.clone().expect("a continue token");
    let page2 = cms.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap();
    let page3 = cms.list(&ListParams::default().limit(2).continue_token(page2.metadata.continue_.as_deref().unwrap())).await.unwrap();
    assert_eq!([names(page1), names(page2), names(page3.clone())].concat(), ["cm0", "cm1", "cm2", "cm3", "cm4"]);
    assert!(page3.metadata.continue_.as_deref().unwrap_or("").is_empty());

    let err = api_error(cms.list(&ListParams::default().fields("spec.nodeName=x")).await);
    assert_eq!(err.code, 400);
}

#[tokio::test]
async fn strategic_merge_merges_containers_by_name_and_json_patch_tests_hold() {
    let d = brink_kube_double::KubeDouble::new();
    let pods: Api<Pod> = Api::namespaced(d.client(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "engine", "image": "e:1"}, {"name": "sidecar", "image": "s:1"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let patch = json!({"spec": {"containers": [{"name": "engine", "image": "e:2"}]}});
    let p = pods.patch("p", &PatchParams::default(), &Patch::Strategic(patch.clone())).await.unwrap();
    let images: Vec<_> =
        p.spec.as_ref().unwrap().containers.iter().map(|c| format!("{}={}", c.name, c.image.as_deref().unwrap_or(""))).collect();
    assert_eq!(images, ["engine=e:2", "sidecar=s:1"], "strategic merge keeps the other container");
    let p = pods.patch("p", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    assert_eq!(p.spec.unwrap().containers.len(), 1, "a JSON merge patch replaces the list");

    // Custom resources refuse strategic merge (no merge keys in Go types): a test that passed here
    // and failed on a cluster would be worse than useless.
    let deps: Api<ModelDeployment> = Api::namespaced(d.client(), NS);
    deps.create(&PostParams::default(), &crate::deployment("sm", 1)).await.unwrap();
    let err = api_error(deps.patch("sm", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"replicas": 2}}))).await);
    assert_eq!((err.code, err.reason.as_str()), (415, "UnsupportedMediaType"));

    let failing_test: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/name", "value": "not-p"}])).unwrap();
    let err = api_error(pods.patch("p", &PatchParams::default(), &Patch::<()>::Json(failing_test)).await);
    assert_eq!(err.code, 422);
}

#[tokio::test]
async fn schema_defaults_apply_on_create() {
    let (d, _, _) = double_with_apis();
    let ar = ApiResource::erase::<ModelDeployment>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(d.client(), NS, &ar);
    let mut v: Value = crate::deployment_json("minimal", 1);
    v["spec"].as_object_mut().unwrap().remove("replicas");
    let created = raw.create(&PostParams::default(), &serde_json::from_value(v).unwrap()).await.unwrap();
    assert_eq!(created.data["spec"]["replicas"], json!(1), "the CRD schema's default: {}", created.data["spec"]);
    assert_eq!(created.data["spec"]["rollout"], json!({"strategy": "Canary", "progressDeadlineSeconds": 900}));
}
