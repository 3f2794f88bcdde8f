//! The replica Pod's optional parts: API keys from a Secret and an OTLP endpoint appear only
//! when the operator is configured with them, and leave every other Pod byte for byte as it
//! was (an operator upgrade must not recreate serving replicas for options they do not use).

mod common;

use brink_operator::controllers::Config;
use brink_operator::controllers::pod::desired_pod;
use common::*;

#[test]
fn api_keys_and_otlp_reach_the_pod_only_when_configured() {
    let replica = replica("qwen-0", "n1", None);
    let plain = desired_pod(&replica, &model(), &Config::default()).expect("pod");
    let config = Config {
        replica_api_keys_secret: Some("brink-api-keys".into()),
        replica_otlp_endpoint: Some("http://otel-collector.monitoring:4318".into()),
        ..Config::default()
    };
    let with = desired_pod(&replica, &model(), &config).expect("pod");

    let spec = with.spec.as_ref().expect("spec");
    let c = &spec.containers[0];
    let command = c.command.as_ref().expect("command");
    assert!(command.contains(&"--api-key-file=/etc/brink/api-keys/keys".to_string()), "{command:?}");
    let mount = c.volume_mounts.as_ref().and_then(|m| m.iter().find(|m| m.name == "api-keys")).expect("api-keys mount");
    assert_eq!((mount.mount_path.as_str(), mount.read_only), ("/etc/brink/api-keys", Some(true)));
    let volume = spec.volumes.as_ref().and_then(|v| v.iter().find(|v| v.name == "api-keys")).expect("api-keys volume");
    assert_eq!(volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()), Some("brink-api-keys"));
    let env = c.env.as_ref().expect("env");
    let otlp = env.iter().find(|e| e.name == "OTEL_EXPORTER_OTLP_ENDPOINT").and_then(|e| e.value.as_deref());
    assert_eq!(otlp, Some("http://otel-collector.monitoring:4318"));

    // Unconfigured: none of it, and the spec hash differs only because of the options.
    let p = plain.spec.as_ref().expect("spec");
    let pc = &p.containers[0];
    assert!(!pc.command.as_ref().expect("command").iter().any(|a| a.starts_with("--api-key-file")));
    assert!(!pc.env.as_ref().expect("env").iter().any(|e| e.name.starts_with("OTEL_")));
    assert!(!p.volumes.as_ref().expect("volumes").iter().any(|v| v.name == "api-keys"));
    let hash =
        |pod: &k8s_openapi::api::core::v1::Pod| pod.metadata.annotations.as_ref().and_then(|a| a.get("brink.dev/pod-spec-hash")).cloned();
    assert_ne!(hash(&plain), hash(&with), "a Pod with the options must be told apart from one without");
    assert_eq!(hash(&plain), hash(&desired_pod(&replica, &model(), &Config::default()).expect("pod")), "the hash is stable");
}
