//! The replica Pod a `ModelReplica` wants, pure: pinned to its node, `brink-agent serve` from
//! the engine build over the cached model, a memory request for model plus KV, the probes the
//! design states, GPU access through the NVIDIA runtime class. And the phase a Pod implies.

use std::collections::BTreeMap;

use brink_api::crd::{Model, ModelReplica, ReplicaPhase};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction, HostPathVolumeSource, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, Probe, ResourceRequirements, SecretVolumeSource, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::context::Config;
use super::error::{Error, Result};
use super::names::{DEPLOYMENT_LABEL, MODEL_LABEL, POD_SPEC_ANNOTATION, REPLICA_LABEL, REVISION_LABEL, SCHEDULING_ANNOTATION, label_value};
use super::views::replica_memory;
use crate::decide::{PodState, RecoveryPolicy};

/// Where a PVC source is mounted in the Pod.
const PVC_MOUNT: &str = "/models/pvc";
/// The engine's scratch state (stall reports) inside the Pod.
const STATE_DIR: &str = "/var/lib/brink/state";
/// Where the node's state directory (the agent's, from the host) is mounted in the Pod: the
/// replica's model-level test result is reused from and kept there, beside `up`'s.
pub(crate) const NODE_STATE_DIR: &str = "/var/lib/brink/node";
/// Where the API keys Secret is mounted in replica Pods (its key `keys`).
const API_KEYS_DIR: &str = "/etc/brink/api-keys";
const RUNTIME_CLASS: &str = "nvidia";
/// Seconds the engine gets to drain after SIGTERM: its own grace (30 s) plus margin.
const TERMINATION_GRACE_S: i64 = 45;

/// Where the replica Pod may run, from the deployment's placement when the replica was made
/// (kept on the replica in [`SCHEDULING_ANNOTATION`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodScheduling {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
}

impl PodScheduling {
    pub fn from_placement(p: &brink_api::crd::Placement) -> PodScheduling {
        PodScheduling {
            tolerations: p.tolerations.clone(),
            node_selector: p.node_selector.clone(),
            priority_class_name: p.priority_class_name.clone(),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == PodScheduling::default()
    }

    /// The annotation's value (`None`: nothing to record).
    pub fn annotation(&self) -> Result<Option<String>> {
        if self.is_empty() {
            return Ok(None);
        }
        serde_json::to_string(self).map(Some).map_err(|source| Error::Serialize { what: "the replica Pod's scheduling", source })
    }

    /// What `replica` recorded; none when it has no annotation (made before tolerations existed).
    pub fn of(replica: &ModelReplica) -> Result<PodScheduling> {
        let Some(json) = replica.annotations().get(SCHEDULING_ANNOTATION) else { return Ok(PodScheduling::default()) };
        serde_json::from_str(json).map_err(|e| Error::InvalidSpec {
            what: format!("ModelReplica {}", replica.name_any()),
            why: format!(
                "annotation {SCHEDULING_ANNOTATION} is not a scheduling record ({{tolerations, nodeSelector, priorityClassName}}): {e}"
            ),
        })
    }
}

/// The model file as the Pod sees it, and the volume that brings it there.
#[derive(Debug, PartialEq)]
pub struct ModelMount {
    pub path: String,
    pub volume: Volume,
    pub mount: VolumeMount,
}

pub(crate) fn host_path(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource { path: path.into(), type_: Some(type_.into()) }),
        ..Volume::default()
    }
}

fn read_only(name: &str, at: &str) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: at.into(), read_only: Some(true), ..VolumeMount::default() }
}

/// Where `model`'s file is inside the replica Pod: the agent's cache (an https source, named as
/// the cache names it: `models/<sha256>.gguf`, or llama.cpp's split names under the first
/// part's checksum), the node path itself, or the mounted claim.
pub fn model_mount(model: &Model, cache_dir: &str) -> Result<ModelMount, String> {
    let spec = &model.spec;
    let name = model.name_any();
    let parts = spec.parts.as_deref().unwrap_or_default();
    let source = &spec.source;
    if source.https.is_some() {
        let key = match (&spec.sha256, parts.first()) {
            (Some(sha), _) => sha.to_ascii_lowercase(),
            (None, Some(first)) => first.sha256.to_ascii_lowercase(),
            (None, None) => return Err(format!("Model {name}: neither spec.sha256 nor spec.parts is set")),
        };
        let file = if parts.len() > 1 { format!("{key}-00001-of-{:05}.gguf", parts.len()) } else { format!("{key}.gguf") };
        let dir = cache_dir.trim_end_matches('/');
        return Ok(ModelMount {
            path: format!("{dir}/models/{file}"),
            volume: host_path("model-cache", dir, "Directory"),
            mount: read_only("model-cache", dir),
        });
    }
    if let Some(np) = &source.node_path {
        return Ok(match parts.first() {
            Some(first) => ModelMount {
                path: format!("{}/{}", np.path.trim_end_matches('/'), first.file),
                volume: host_path("model", &np.path, "Directory"),
                mount: read_only("model", &np.path),
            },
            None => ModelMount { path: np.path.clone(), volume: host_path("model", &np.path, "File"), mount: read_only("model", &np.path) },
        });
    }
    if let Some(pvc) = &source.pvc {
        let inner = format!("{PVC_MOUNT}/{}", pvc.path.trim_end_matches('/'));
        return Ok(ModelMount {
            path: match parts.first() {
                Some(first) => format!("{inner}/{}", first.file),
                None => inner,
            },
            volume: Volume {
                name: "model".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: pvc.claim_name.clone(),
                    read_only: Some(true),
                }),
                ..Volume::default()
            },
            mount: read_only("model", PVC_MOUNT),
        });
    }
    Err(format!("Model {name}: spec.source sets none of https, nodePath, pvc"))
}

fn http_probe(path: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction { path: Some(path.into()), port: IntOrString::String("http".into()), ..HTTPGetAction::default() }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(5),
        ..Probe::default()
    }
}

pub(crate) fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..ObjectFieldSelector::default() }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

pub(crate) fn env(name: &str, value: &str) -> EnvVar {
    EnvVar { name: name.into(), value: Some(value.into()), ..EnvVar::default() }
}

/// Every Pod `replica` wants: brink's one Pod on one node, or the members of another engine's
/// replica (one, or a gang's leader and workers: see [`super::member_pod`]).
pub fn desired_pods(replica: &ModelReplica, model: &Model, config: &Config) -> Result<Vec<Pod>> {
    if replica.spec.engine.kind.is_brink() && replica.spec.gang.is_none() {
        return Ok(vec![desired_pod(replica, model, config)?]);
    }
    super::member_pod::member_pods(replica, model, config)
}

/// The Pod of a brink replica, with the hash of its spec in an annotation.
pub fn desired_pod(replica: &ModelReplica, model: &Model, config: &Config) -> Result<Pod> {
    let name = replica.name_any();
    let owner = replica.controller_owner_ref(&()).ok_or_else(|| Error::MissingField {
        kind: "ModelReplica",
        name: name.clone(),
        field: "metadata.uid",
    })?;
    let mount =
        model_mount(model, &config.model_cache_dir).map_err(|why| Error::InvalidSpec { what: format!("ModelReplica {name}"), why })?;
    let s = &replica.spec;
    let launch = crate::engines::Launch {
        kind: s.engine.kind,
        model_path: &mount.path,
        served_name: &s.model,
        port: config.serve_port,
        serving: &s.serving,
        args: &s.engine.args,
        gang: None,
    };
    let serve =
        crate::engines::command(&launch).map_err(|e| Error::InvalidSpec { what: format!("ModelReplica {name}"), why: e.to_string() })?;
    let command: Vec<String> =
        serve.into_iter().chain(config.replica_api_keys_secret.as_ref().map(|_| format!("--api-key-file={API_KEYS_DIR}/keys"))).collect();
    // Optional parts are added only when configured, so the Pods of an operator without them
    // keep their spec hash (and are not recreated by an upgrade).
    let mut envs = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("NODE_NAME", "spec.nodeName"),
        env("BRINK_REPLICA", &name),
        env("BRINK_STATE_DIR", STATE_DIR),
        // The NVIDIA runtime exposes the GPU; GB10 has one, shared by the node's replicas.
        env("NVIDIA_VISIBLE_DEVICES", "all"),
        env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ];
    if let Some(endpoint) = &config.replica_otlp_endpoint {
        envs.push(env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
        envs.push(env("OTEL_SERVICE_NAME", "brink-replica"));
    }
    let mut mounts = vec![
        mount.mount.clone(),
        VolumeMount { name: "state".into(), mount_path: STATE_DIR.into(), ..VolumeMount::default() },
        VolumeMount { name: "node-state".into(), mount_path: NODE_STATE_DIR.into(), ..VolumeMount::default() },
    ];
    let mut volumes = vec![
        mount.volume,
        Volume { name: "state".into(), empty_dir: Some(Default::default()), ..Volume::default() },
        host_path("node-state", &config.node_state_dir, "DirectoryOrCreate"),
    ];
    if let Some(secret) = &config.replica_api_keys_secret {
        mounts.push(VolumeMount {
            name: "api-keys".into(),
            mount_path: API_KEYS_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        volumes.push(Volume {
            name: "api-keys".into(),
            secret: Some(SecretVolumeSource { secret_name: Some(secret.clone()), ..SecretVolumeSource::default() }),
            ..Volume::default()
        });
    }
    let memory = replica_memory(replica);
    let resources = (memory > 0).then(|| ResourceRequirements {
        requests: Some(BTreeMap::from([("memory".to_string(), Quantity(memory.to_string()))])),
        ..ResourceRequirements::default()
    });
    // Startup covers the model load and the model-level threshold test (both before `/ready`:
    // `serve --model-test`); a Pod recreated on the node reuses the node's result and pays
    // only the load. See `startup_seconds` for the budget.
    let startup_failures = i32::try_from(config.startup_seconds.div_ceil(10).max(1)).unwrap_or(i32::MAX);
    let container = Container {
        name: "engine".into(),
        image: Some(s.engine.image.clone()),
        command: Some(command),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: i32::from(config.serve_port),
            ..ContainerPort::default()
        }]),
        env: Some(envs),
        resources,
        startup_probe: Some(http_probe("/ready", 10, startup_failures)),
        readiness_probe: Some(http_probe("/ready", 5, 2)),
        // `/live` follows the progress heartbeat; 60 s covers the supervisor's own engine restart.
        liveness_probe: Some(http_probe("/live", 10, 6)),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    let scheduling = PodScheduling::of(replica)?;
    let spec = PodSpec {
        node_name: Some(s.node.clone()),
        runtime_class_name: Some(RUNTIME_CLASS.into()),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_S),
        containers: vec![container],
        volumes: Some(volumes),
        // The Pod is bound by nodeName, past the scheduler: these matter to the kubelet's
        // admission (node selector), the taint manager (NoExecute) and preemption (priority).
        tolerations: (!scheduling.tolerations.is_empty()).then_some(scheduling.tolerations),
        node_selector: (!scheduling.node_selector.is_empty()).then_some(scheduling.node_selector),
        priority_class_name: scheduling.priority_class_name,
        ..PodSpec::default()
    };
    let hash = spec_hash(&spec)?;
    let labels = BTreeMap::from([
        (DEPLOYMENT_LABEL.to_string(), label_value(&s.deployment)),
        (REPLICA_LABEL.to_string(), label_value(&name)),
        (REVISION_LABEL.to_string(), s.revision.clone()),
        (MODEL_LABEL.to_string(), label_value(&s.model)),
        ("app.kubernetes.io/name".to_string(), "brink-replica".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), "brink-operator".to_string()),
    ]);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: replica.namespace(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(POD_SPEC_ANNOTATION.to_string(), hash)])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// A hash of the spec: the Pod spec is immutable in everything this operator sets, so a Pod
/// whose hash differs from the desired one is recreated (as a ReplicaSet's template hash).
pub(crate) fn spec_hash(spec: &PodSpec) -> Result<String> {
    let bytes = serde_json::to_vec(spec).map_err(|source| Error::Serialize { what: "the replica Pod spec", source })?;
    Ok(Sha256::digest(&bytes).iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// What to do with the Pod that exists.
#[derive(Debug, PartialEq, Eq)]
pub enum PodAction {
    Create,
    Keep,
    /// It differs from the desired Pod: delete it; the next reconcile creates the new one.
    Recreate,
    /// The Pod of an earlier replica of the same name (a rollout recreates replicas under their
    /// name): garbage collection removes it once its owner is gone; wait, then create ours.
    Predecessor,
    /// A Pod of that name that this replica does not own: left alone, reported.
    Foreign,
}

pub fn pod_action(existing: Option<&Pod>, desired: &Pod, replica: &ModelReplica) -> PodAction {
    let Some(pod) = existing else { return PodAction::Create };
    let uid = replica.uid();
    let controller = pod.owner_references().iter().find(|o| o.controller == Some(true));
    match controller {
        Some(o) if Some(&o.uid) == uid.as_ref() => {}
        Some(o)
            if o.kind == "ModelReplica" && o.api_version.starts_with("brink.dev/") && Some(&o.name) == replica.metadata.name.as_ref() =>
        {
            return PodAction::Predecessor;
        }
        _ => return PodAction::Foreign,
    }
    if pod.metadata.deletion_timestamp.is_some() {
        // Going away already: wait for it.
        return PodAction::Keep;
    }
    let hash = |p: &Pod| p.annotations().get(POD_SPEC_ANNOTATION).cloned();
    if hash(pod) == hash(desired) { PodAction::Keep } else { PodAction::Recreate }
}

/// The Pod as `decide::pod_recovery` sees it at `now_s`: failed when the Pod or a container
/// says so, or when the replica served (`was_serving`) and the Pod has been not ready for the
/// policy's `not_ready_s` since; a Pod being deleted is as good as gone.
pub fn pod_state(pod: Option<&Pod>, was_serving: bool, now_s: u64, policy: &RecoveryPolicy) -> PodState {
    let Some(pod) = pod.filter(|p| p.metadata.deletion_timestamp.is_none()) else { return PodState::Absent };
    let uid = pod.uid().unwrap_or_default();
    if let (ReplicaPhase::Failed, why) = phase_from_pod(Some(pod)) {
        return PodState::Failed { uid, why: why.unwrap_or_else(|| "the replica Pod failed".into()) };
    }
    let ready = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    // Seconds since the Ready condition last changed (0 when the kubelet did not say).
    let since = ready
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or(0, |t| now_s.saturating_sub(u64::try_from(t.0.as_second()).unwrap_or(0)));
    match ready {
        Some(c) if c.status == "True" => PodState::Up { uid, ready_for_s: Some(since) },
        Some(c) if was_serving && c.last_transition_time.is_some() && since >= policy.not_ready_s => {
            PodState::Failed { uid, why: format!("not ready for {since} s after it served") }
        }
        _ => PodState::Up { uid, ready_for_s: None },
    }
}

/// Container waiting reasons after which the Pod will not start without a change.
const STUCK: [&str; 5] = ["CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"];

/// The replica phase the Pod implies, and why when it is `Failed`.
pub fn phase_from_pod(pod: Option<&Pod>) -> (ReplicaPhase, Option<String>) {
    let Some(status) = pod.and_then(|p| p.status.as_ref()) else { return (ReplicaPhase::Pending, None) };
    match status.phase.as_deref() {
        Some("Failed") | Some("Succeeded") => {
            // The kubelet's reason (`Evicted`, `OutOfmemory`, `NodeAffinity`...) and its message.
            let why = match (&status.reason, &status.message) {
                (Some(r), Some(m)) => format!("{r}: {m}"),
                (r, m) => m.clone().or(r.clone()).unwrap_or_else(|| "the replica Pod exited".into()),
            };
            return (ReplicaPhase::Failed, Some(why));
        }
        Some("Running") => {}
        _ => return (ReplicaPhase::Pending, None),
    }
    for c in status.container_statuses.iter().flatten() {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref())
            && let Some(reason) = w.reason.as_deref().filter(|r| STUCK.contains(r))
        {
            return (ReplicaPhase::Failed, Some(format!("container {}: {reason}: {}", c.name, w.message.clone().unwrap_or_default())));
        }
    }
    let ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    if ready { (ReplicaPhase::Serving, None) } else { (ReplicaPhase::Loading, None) }
}

#[cfg(test)]
mod tests {
    use brink_api::crd::{ModelPart, ModelSource, ModelSpec, NodePathSource, PvcSource};
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, ContainerStatus, PodCondition, PodStatus};

    use super::*;

    fn model(source: ModelSource, parts: Option<Vec<ModelPart>>) -> Model {
        let sha = parts.is_none().then(|| "AB".repeat(32));
        Model::new("m", ModelSpec { source, sha256: sha, format: Default::default(), parts })
    }

    fn parts() -> Option<Vec<ModelPart>> {
        Some(vec![
            ModelPart { file: "m-00001-of-00002.gguf".into(), sha256: "cd".repeat(32) },
            ModelPart { file: "m-00002-of-00002.gguf".into(), sha256: "ef".repeat(32) },
        ])
    }

    fn https() -> ModelSource {
        ModelSource {
            https: Some(brink_api::crd::HttpsSource { url: "https://h/m/".into(), credentials_secret_ref: None }),
            node_path: None,
            pvc: None,
        }
    }

    #[test]
    fn the_model_path_follows_the_source() {
        let m = model_mount(&model(https(), None), "/cache/").expect("mount");
        assert_eq!(m.path, format!("/cache/models/{}.gguf", "ab".repeat(32)));
        assert_eq!(m.volume.host_path.as_ref().map(|h| h.path.as_str()), Some("/cache"));
        assert_eq!(m.mount.read_only, Some(true));
        // Split: llama.cpp's names under the first part's checksum, as the cache writes them.
        let m = model_mount(&model(https(), parts()), "/cache").expect("mount");
        assert_eq!(m.path, format!("/cache/models/{}-00001-of-00002.gguf", "cd".repeat(32)));

        let node_path = |p: &str| ModelSource { https: None, node_path: Some(NodePathSource { path: p.into() }), pvc: None };
        let m = model_mount(&model(node_path("/data/m.gguf"), None), "/cache").expect("mount");
        assert_eq!((m.path.as_str(), m.volume.host_path.as_ref().and_then(|h| h.type_.as_deref())), ("/data/m.gguf", Some("File")));
        let m = model_mount(&model(node_path("/data/m/"), parts()), "/cache").expect("mount");
        assert_eq!(
            (m.path.as_str(), m.volume.host_path.as_ref().and_then(|h| h.type_.as_deref())),
            ("/data/m/m-00001-of-00002.gguf", Some("Directory"))
        );

        let pvc =
            ModelSource { https: None, node_path: None, pvc: Some(PvcSource { claim_name: "models".into(), path: "qwen/m.gguf".into() }) };
        let m = model_mount(&model(pvc, None), "/cache").expect("mount");
        assert_eq!(m.path, "/models/pvc/qwen/m.gguf");
        assert_eq!(m.volume.persistent_volume_claim.as_ref().map(|c| (c.claim_name.as_str(), c.read_only)), Some(("models", Some(true))));

        let none = ModelSource { https: None, node_path: None, pvc: None };
        assert_eq!(
            model_mount(&model(none, None), "/cache").expect_err("no source"),
            "Model m: spec.source sets none of https, nodePath, pvc"
        );
    }

    fn pod(phase: &str, ready: bool, waiting: Option<&str>) -> Pod {
        Pod {
            status: Some(PodStatus {
                phase: Some(phase.into()),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                container_statuses: waiting.map(|w| {
                    vec![ContainerStatus {
                        name: "engine".into(),
                        state: Some(ContainerState {
                            waiting: Some(ContainerStateWaiting { reason: Some(w.into()), message: None }),
                            ..ContainerState::default()
                        }),
                        ..ContainerStatus::default()
                    }]
                }),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn the_phase_follows_the_pod() {
        assert_eq!(phase_from_pod(None).0, ReplicaPhase::Pending);
        assert_eq!(phase_from_pod(Some(&pod("Pending", false, None))).0, ReplicaPhase::Pending);
        assert_eq!(phase_from_pod(Some(&pod("Running", false, None))).0, ReplicaPhase::Loading);
        assert_eq!(phase_from_pod(Some(&pod("Running", true, None))).0, ReplicaPhase::Serving);
        assert_eq!(phase_from_pod(Some(&pod("Failed", false, None))).0, ReplicaPhase::Failed);
        assert_eq!(phase_from_pod(Some(&pod("Running", false, Some("CrashLoopBackOff")))).0, ReplicaPhase::Failed);
        // Waiting for a reason that passes (creating the container) is still loading.
        assert_eq!(phase_from_pod(Some(&pod("Running", false, Some("ContainerCreating")))).0, ReplicaPhase::Loading);
    }

    #[test]
    fn a_same_named_pod_is_ours_a_predecessors_or_foreign() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let replica: ModelReplica = serde_json::from_value(serde_json::json!({
            "apiVersion": "brink.dev/v1alpha1", "kind": "ModelReplica",
            "metadata": {"name": "chat-0", "namespace": "ai", "uid": "new-uid"},
            "spec": {"deployment": "chat", "node": "spark-1", "model": "m", "revision": "r2",
                     "engine": {"image": "i", "version": "v"},
                     "serving": {"context": 4096, "maxBatchTokens": 2048, "prefillChunk": 512, "concurrency": 4, "kvFraction": 0.5}}
        }))
        .expect("replica");
        let pod = |kind: &str, name: &str, uid: &str| {
            let mut p = Pod::default();
            p.metadata.name = Some("chat-0".into());
            p.metadata.owner_references = Some(vec![OwnerReference {
                api_version: if kind == "ModelReplica" { "brink.dev/v1alpha1".into() } else { "apps/v1".into() },
                kind: kind.into(),
                name: name.into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]);
            p
        };
        let desired = pod("ModelReplica", "chat-0", "new-uid");
        assert_eq!(pod_action(None, &desired, &replica), PodAction::Create);
        assert_eq!(pod_action(Some(&desired), &desired, &replica), PodAction::Keep);
        assert_eq!(pod_action(Some(&pod("ModelReplica", "chat-0", "old-uid")), &desired, &replica), PodAction::Predecessor);
        assert_eq!(pod_action(Some(&pod("ModelReplica", "other", "old-uid")), &desired, &replica), PodAction::Foreign);
        assert_eq!(pod_action(Some(&pod("ReplicaSet", "chat-0", "x")), &desired, &replica), PodAction::Foreign);
        let mut unowned = desired.clone();
        unowned.metadata.owner_references = None;
        assert_eq!(pod_action(Some(&unowned), &desired, &replica), PodAction::Foreign);
    }
}
