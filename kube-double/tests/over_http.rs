//! The double over HTTP, as a process sees it: a `kube::Client` built from the kubeconfig file
//! the double writes (no in-process transport) creates, reads, lists, watches and applies; a
//! watch stream delivers an event written after it opened; the discovery the operator's start-up
//! asks (`/version`, `/apis/brink.dev/v1alpha1`) is answered, and an unknown group is 404.

use std::time::Duration;

use brink_api::crd::{ModelDeployment, SparkNode};
use brink_kube_double::KubeDouble;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;

async fn client_from_file(path: &std::path::Path) -> Client {
    // A workspace build links two rustls providers (kube's ring, reqwest's aws-lc-rs), and rustls
    // will not choose: a client panics unless one is installed, as the binaries do at start.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap();
    assert_eq!(config.default_namespace, "serving");
    Client::try_from(config).unwrap()
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "serving"}, "data": {"k": value}})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_from_the_kubeconfig_file_reads_writes_and_watches() {
    let double = KubeDouble::new();
    let (addr, server) = double.serve_http("127.0.0.1:0".parse().unwrap()).await.unwrap();
    assert_ne!(addr.port(), 0);
    assert_eq!(server.url(), format!("http://{addr}"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path, "serving").unwrap();
    let client = client_from_file(&path).await;

    // create / get / list through the default namespace of the kubeconfig's context
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let created = cms.create(&PostParams::default(), &config_map("a", "1")).await.unwrap();
    assert_eq!(created.metadata.resource_version.as_deref(), Some(double.resource_version().as_str()));
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["k"], "1");
    cms.create(&PostParams::default(), &config_map("b", "2")).await.unwrap();
    let names: Vec<String> = cms.list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|c| c.metadata.name).collect();
    assert_eq!(names, ["a", "b"]);
    // a stale write is refused over HTTP as in process
    let mut stale = created.clone();
    stale.data = Some([("k".to_string(), "stale".to_string())].into());
    cms.replace("a", &PostParams::default(), &stale).await.unwrap();
    match cms.replace("a", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("expected 409, got {other:?}"),
    }

    // server-side apply on a CRD's status: the field manager is recorded
    let nodes: Api<SparkNode> = Api::all(client.clone());
    let node = json!({"apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "metadata": {"name": "spark-01"}, "spec": {}});
    nodes.patch("spark-01", &PatchParams::apply("brink-agent"), &Patch::Apply(&node)).await.unwrap();
    let got = nodes.get("spark-01").await.unwrap();
    let managers: Vec<String> = got.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|m| m.manager).collect();
    assert_eq!(managers, ["brink-agent"]);

    // a watcher over HTTP sees the initial state, then an object created after it started
    let deps: Api<ModelDeployment> = Api::namespaced(client.clone(), "serving");
    let mut events = watcher(deps.clone(), watcher::Config::default()).applied_objects().boxed();
    let dep = json!({
        "apiVersion": "brink.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "chat", "namespace": "serving"},
        "spec": {
            "modelRef": {"name": "m"}, "replicas": 1, "engine": {"image": "i", "version": "0.1.0"},
            "serving": {"context": 4096, "maxBatchTokens": 4096, "prefillChunk": 1024, "concurrency": 4, "kvFraction": 0.9}
        }
    });
    let writer = tokio::spawn(async move {
        // after the watch is open (the double counts it), not before
        tokio::time::sleep(Duration::from_millis(200)).await;
        deps.patch("chat", &PatchParams::apply("test"), &Patch::Apply(&dep)).await.unwrap();
    });
    let first = tokio::time::timeout(Duration::from_secs(10), events.try_next()).await.expect("no watch event in 10 s").unwrap().unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("chat"));
    assert!(double.open_watches() >= 1, "the event came through an open watch");
    writer.await.unwrap();
    drop(events);

    // the requests went through the server, in order
    let lines = double.request_lines();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("GET /apis/brink.dev/v1alpha1/namespaces/serving/modeldeployments?") && l.contains("watch=true")),
        "{lines:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_answers_what_the_operator_start_up_asks() {
    let double = KubeDouble::new();
    let (_, server) = double.serve_http("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path, "serving").unwrap();
    let client = client_from_file(&path).await;

    let version = client.apiserver_version().await.unwrap();
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "37"));
    let brink = client.list_api_group_resources("brink.dev/v1alpha1").await.unwrap();
    let served: std::collections::BTreeSet<String> = brink.resources.into_iter().map(|r| r.name).collect();
    for crd in brink_api::crd::crds() {
        assert!(served.contains(&crd.spec.names.plural), "{} not discovered: {served:?}", crd.spec.names.plural);
    }
    let groups = client.list_api_groups().await.unwrap();
    assert!(groups.groups.iter().any(|g| g.name == "coordination.k8s.io"));
    assert_eq!(client.list_core_api_versions().await.unwrap().versions, ["v1"]);
    let core = client.list_core_api_resources("v1").await.unwrap();
    assert!(core.resources.iter().any(|r| r.name == "nodes" && !r.namespaced));
    match client.list_api_group_resources("widgets.example/v1").await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 404),
        other => panic!("expected 404, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_stops_the_server() {
    let double = KubeDouble::new();
    let (addr, server) = double.serve_http("127.0.0.1:0".parse().unwrap()).await.unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
    drop(server);
    // the abort lands at the accept loop's next poll
    let t0 = std::time::Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(t0.elapsed() < Duration::from_secs(5), "still accepting connections after the handle was dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
