//! Watches through `kube::runtime::watcher` and `Api::watch`: order, resume, 410 Gone, and a
//! `Controller` that reconciles an object created after it started.

use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::ModelDeployment;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::time::timeout;

use crate::{NS, deployment, double_with_apis};

const WAIT: Duration = Duration::from_secs(10);

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": "1"}})).unwrap()
}

/// `kind:name[:v]` of a watcher event, for comparing sequences.
fn describe(e: &watcher::Event<ConfigMap>) -> String {
    let v = |c: &ConfigMap| c.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default();
    match e {
        watcher::Event::Init => "Init".into(),
        watcher::Event::InitApply(c) => format!("InitApply:{}:{}", c.name_any(), v(c)),
        watcher::Event::InitDone => "InitDone".into(),
        watcher::Event::Apply(c) => format!("Apply:{}:{}", c.name_any(), v(c)),
        watcher::Event::Delete(c) => format!("Delete:{}", c.name_any()),
    }
}

async fn watcher_delivers_in_order(config: watcher::Config) {
    let d = brink_kube_double::KubeDouble::new();
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    cms.create(&PostParams::default(), &cm("before")).await.unwrap();
    let mut events = watcher(cms.clone(), config).boxed();
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("InitDone") {
        seen.push(describe(&timeout(WAIT, events.try_next()).await.expect("an event in time").unwrap().unwrap()));
    }
    assert_eq!(seen, ["Init", "InitApply:before:1", "InitDone"]);

    cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    cms.patch("a", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    cms.patch("before", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "3"}}))).await.unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    let mut live = Vec::new();
    for _ in 0..4 {
        live.push(describe(&timeout(WAIT, events.try_next()).await.expect("an event in time").unwrap().unwrap()));
    }
    assert_eq!(live, ["Apply:a:1", "Apply:a:2", "Apply:before:3", "Delete:a"]);
}

#[tokio::test]
async fn watcher_sees_added_modified_deleted_in_order() {
    watcher_delivers_in_order(watcher::Config::default()).await;
}

#[tokio::test]
async fn watcher_with_streaming_lists_gets_the_initial_events_bookmark() {
    watcher_delivers_in_order(watcher::Config::default().streaming_lists()).await;
}

#[tokio::test]
async fn watch_resumes_from_a_resource_version_and_410s_after_compaction() {
    let d = brink_kube_double::KubeDouble::new();
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    let created = cms.create(&PostParams::default(), &cm("r")).await.unwrap();
    let from = created.resource_version().unwrap();
    cms.patch("r", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    cms.create(&PostParams::default(), &cm("s")).await.unwrap();
    cms.delete("r", &DeleteParams::default()).await.unwrap();

    // Everything after `from`, in order, without the ADDED of r itself.
    let mut stream = cms.watch(&WatchParams::default(), &from).await.unwrap().boxed();
    let mut got = Vec::new();
    for _ in 0..3 {
        let e = timeout(WAIT, stream.try_next()).await.expect("an event in time").unwrap().unwrap();
        got.push(match e {
            WatchEvent::Added(c) => format!("ADDED {}", c.name_any()),
            WatchEvent::Modified(c) => format!("MODIFIED {}", c.name_any()),
            WatchEvent::Deleted(c) => format!("DELETED {}", c.name_any()),
            other => format!("{other:?}"),
        });
    }
    assert_eq!(got, ["MODIFIED r", "ADDED s", "DELETED r"]);
    // Events keep coming on the open watch.
    cms.patch("s", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "9"}}))).await.unwrap();
    match timeout(WAIT, stream.try_next()).await.expect("an event in time").unwrap().unwrap() {
        WatchEvent::Modified(c) => assert_eq!(c.data.unwrap()["v"], "9"),
        other => panic!("expected MODIFIED s, got {other:?}"),
    }

    d.compact();
    let mut stale = cms.watch(&WatchParams::default(), &from).await.unwrap().boxed();
    match timeout(WAIT, stale.try_next()).await.expect("an event in time").unwrap().unwrap() {
        WatchEvent::Error(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
    // The current resourceVersion is still watchable after compaction.
    let mut fresh = cms.watch(&WatchParams::default(), &d.resource_version()).await.unwrap().boxed();
    cms.delete("s", &DeleteParams::default()).await.unwrap();
    assert!(matches!(timeout(WAIT, fresh.try_next()).await.unwrap().unwrap().unwrap(), WatchEvent::Deleted(_)));
}

#[tokio::test(start_paused = true)]
async fn watch_closes_at_its_timeout_with_a_bookmark() {
    let d = brink_kube_double::KubeDouble::new();
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    let mut wp = WatchParams::default().timeout(30);
    wp.bookmarks = true;
    let mut stream = cms.watch(&wp, "0").await.unwrap().boxed();
    cms.create(&PostParams::default(), &cm("t")).await.unwrap();
    assert!(matches!(stream.try_next().await.unwrap().unwrap(), WatchEvent::Added(_)));
    // Paused time: the 30 s pass without waiting; the watch ends after a bookmark at the newest version.
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Bookmark(b) => assert_eq!(b.metadata.resource_version, d.resource_version()),
        other => panic!("expected a bookmark, got {other:?}"),
    }
    assert!(stream.try_next().await.unwrap().is_none(), "the watch is closed");
}

#[tokio::test]
async fn controller_reconciles_a_deployment_created_after_it_started() {
    let (d, deps, _) = double_with_apis();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    struct Ctx {
        api: Api<ModelDeployment>,
        seen: tokio::sync::mpsc::UnboundedSender<String>,
    }
    async fn reconcile(obj: Arc<ModelDeployment>, ctx: Arc<Ctx>) -> Result<Action, kube::Error> {
        let generation = obj.metadata.generation.unwrap_or(0);
        if obj.status.as_ref().and_then(|s| s.observed_generation) != Some(generation) {
            let patch = json!({"status": {"observedGeneration": generation, "replicas": 0}});
            ctx.api
                .patch_status(
                    &obj.name_any(),
                    &PatchParams::apply("brink-operator"),
                    &Patch::Apply(json!({
                        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment", "status": patch["status"]
                    })),
                )
                .await?;
        }
        let _ = ctx.seen.send(format!("{}@{generation}", obj.name_any()));
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<ModelDeployment>, _: &kube::Error, _: Arc<Ctx>) -> Action {
        Action::requeue(Duration::from_millis(50))
    }
    let ctx = Arc::new(Ctx { api: deps.clone(), seen: tx });
    let controller = Controller::new(deps.clone(), watcher::Config::default()).run(reconcile, error_policy, ctx).for_each(|_| async {});
    let handle = tokio::spawn(controller);
    // The controller's initial list and watch are open before the object exists.
    timeout(WAIT, async {
        while d.open_watches() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the controller opens a watch");

    deps.create(&PostParams::default(), &deployment("late", 2)).await.unwrap();
    let first = timeout(WAIT, rx.recv()).await.expect("reconciled in time").unwrap();
    assert_eq!(first, "late@1");
    let stored: ModelDeployment = d.get(Some(NS), "late").unwrap();
    assert_eq!(stored.status.and_then(|s| s.observed_generation), Some(1));

    // A spec change is a new generation; the controller sees it through the watch.
    deps.patch("late", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 3}}))).await.unwrap();
    loop {
        let next = timeout(WAIT, rx.recv()).await.expect("reconciled in time").unwrap();
        if next == "late@2" {
            break;
        }
    }
    handle.abort();
}

#[tokio::test]
async fn a_selector_watch_sees_objects_enter_and_leave_the_selection() {
    let d = brink_kube_double::KubeDouble::new();
    let cms: Api<ConfigMap> = Api::namespaced(d.client(), NS);
    cms.create(&PostParams::default(), &cm("x")).await.unwrap();
    let from = d.resource_version();
    let mut stream = cms.watch(&WatchParams::default().labels("tier=gpu"), &from).await.unwrap().boxed();
    let label = |v: Option<&str>| Patch::Merge(json!({"metadata": {"labels": {"tier": v}}}));
    cms.patch("x", &PatchParams::default(), &label(Some("gpu"))).await.unwrap();
    cms.patch("x", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "2"}}))).await.unwrap();
    cms.patch("x", &PatchParams::default(), &label(Some("cpu"))).await.unwrap();
    cms.patch("x", &PatchParams::default(), &Patch::Merge(json!({"data": {"v": "3"}}))).await.unwrap();
    cms.patch("x", &PatchParams::default(), &label(Some("gpu"))).await.unwrap();
    cms.delete("x", &DeleteParams::default()).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(match timeout(WAIT, stream.try_next()).await.expect("an event in time").unwrap().unwrap() {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
            other => panic!("unexpected {other:?}"),
        });
    }
    // Relabelled in, changed, relabelled out (DELETED), changed unseen, back in, deleted.
    assert_eq!(got, ["ADDED", "MODIFIED", "DELETED", "ADDED", "DELETED"]);

    // A resumed watch replays the same translation from the history.
    let mut replay = cms.watch(&WatchParams::default().labels("tier=gpu"), &from).await.unwrap().boxed();
    let mut again = Vec::new();
    for _ in 0..5 {
        again.push(match timeout(WAIT, replay.try_next()).await.expect("an event in time").unwrap().unwrap() {
            WatchEvent::Added(_) => "ADDED",
            WatchEvent::Modified(_) => "MODIFIED",
            WatchEvent::Deleted(_) => "DELETED",
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(again, got);
}
