//! The Pods of a replica that runs another engine than brink's, or spans several nodes (a
//! gang), pure. Each member Pod is pinned to its node and runs the engine's command for its
//! rank (`crate::engines`). The leader (or the only member) also runs the qualification
//! sidecar, `brink-agent qualify` against the engine's HTTP API, which owns the Pod's
//! readiness: the Pod is Ready only once the engine passed its black-box qualification.
//! The engine's liveness follows its own progress metrics (token counters moving while
//! requests are pending), so a hung engine is restarted though its HTTP server still answers.
//!
//! A gang's members use host networking (NCCL, Ray and llama.cpp's RPC connect node to node
//! over the fabric's interfaces), resolve each other through a headless Service whose
//! subdomain names every member, and, where every member's node has RDMA devices
//! (`brink.dev/rdma: "true"`), get `/dev/infiniband` and `IPC_LOCK` (which lifts the memlock
//! limit RDMA needs to register memory; without both NCCL silently falls back to TCP sockets).
//! Workers do not carry the deployment label, so the deployment's Service selects leaders only.

use std::collections::BTreeMap;

use brink_api::crd::{EngineKind, GangSettings, Model, ModelReplica};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, ExecAction, HTTPGetAction, Pod, PodSpec, Probe,
    ResourceRequirements, SecurityContext, Service, ServicePort, ServiceSpec, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use super::context::Config;
use super::error::{Error, Result};
use super::names::{DEPLOYMENT_LABEL, MODEL_LABEL, POD_SPEC_ANNOTATION, REPLICA_LABEL, REVISION_LABEL, dns_label, label_value};
use super::pod::{NODE_STATE_DIR, PodScheduling, env, field_env, host_path, model_mount, spec_hash};
use super::views::replica_memory;
use crate::engines::{self, GangRank, Launch};

/// `leader` or `worker` on a gang member's Pod.
pub const GANG_ROLE_LABEL: &str = "brink.dev/gang-role";
/// The member's rank on a gang member's Pod (0: the leader).
pub const GANG_RANK_LABEL: &str = "brink.dev/gang-rank";
/// On the engine's Pod: how its liveness is judged, for people reading the Pod.
pub const LIVENESS_ANNOTATION: &str = "brink.dev/liveness";
/// On the engine's Pod: what owns its readiness.
pub const READINESS_ANNOTATION: &str = "brink.dev/readiness";

const STATE_DIR: &str = "/var/lib/brink/state";
const TERMINATION_GRACE_S: i64 = 45;
const RUNTIME_CLASS: &str = "nvidia";

/// One Pod of a replica: its name, node, DNS hostname and, in a gang, its rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub pod: String,
    pub node: String,
    pub rank: Option<GangRank>,
}

/// The headless Service that names a gang's members (`<member>.<service>.<namespace>.svc`).
pub fn gang_service_name(replica: &str) -> String {
    dns_label(&format!("{replica}-gang"))
}

/// A member's Pod name: the leader takes the replica's name, worker `r` `<replica>-w<r>`.
pub fn member_pod_name(replica: &str, rank: u32) -> String {
    if rank == 0 { replica.to_string() } else { format!("{replica}-w{rank}") }
}

/// A member Pod's DNS hostname (a label of at most 63 characters).
fn hostname(pod: &str) -> String {
    dns_label(pod)
}

/// The members of `replica`, leader first, with each member's address book: bare Pods found
/// through the gang's headless Service.
pub fn members(replica: &ModelReplica) -> Vec<Member> {
    let name = replica.name_any();
    let ns = replica.namespace().unwrap_or_default();
    let service = gang_service_name(&name);
    members_with(replica, &|rank| format!("{}.{service}.{ns}.svc", hostname(&member_pod_name(&name, rank))))
}

/// The members of `replica` with the address of rank `r` given by `address`.
pub fn members_with(replica: &ModelReplica, address: &dyn Fn(u32) -> String) -> Vec<Member> {
    let name = replica.name_any();
    let Some(gang) = &replica.spec.gang else {
        return vec![Member { pod: name, node: replica.spec.node.clone(), rank: None }];
    };
    let size = u32::try_from(gang.workers.len() + 1).unwrap_or(u32::MAX);
    let workers: Vec<String> = (1..size).map(address).collect();
    replica
        .spec
        .nodes()
        .into_iter()
        .zip(0u32..)
        .map(|(node, rank)| Member {
            pod: member_pod_name(&name, rank),
            node: node.to_string(),
            rank: Some(GangRank { rank, size, leader_address: address(0), worker_addresses: workers.clone() }),
        })
        .collect()
}

/// The engine's port for `replica`.
pub fn engine_port(replica: &ModelReplica, config: &Config) -> u16 {
    let e = &replica.spec.engine;
    e.port.unwrap_or_else(|| engines::default_port(e.kind, config.serve_port))
}

fn exec_probe(command: Vec<String>, period: i32, failures: i32, timeout: i32) -> Probe {
    Probe {
        exec: Some(ExecAction { command: Some(command) }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(timeout),
        ..Probe::default()
    }
}

fn empty_dir(name: &str, medium: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource { medium: medium.map(Into::into), ..EmptyDirVolumeSource::default() }),
        ..Volume::default()
    }
}

fn mount(name: &str, at: &str) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: at.into(), ..VolumeMount::default() }
}

/// The interface settings of the fabric as the collective libraries read them.
fn network_env(settings: &GangSettings) -> Vec<EnvVar> {
    let mut out = Vec::new();
    if let Some(i) = &settings.socket_interface {
        out.push(env("NCCL_SOCKET_IFNAME", i));
        out.push(env("GLOO_SOCKET_IFNAME", i));
        // Ray and vLLM pick the node's address on the same interface.
        out.push(env("TP_SOCKET_IFNAME", i));
    }
    if let Some(d) = &settings.ucx_net_devices {
        out.push(env("UCX_NET_DEVICES", d));
    }
    if let Some(h) = &settings.ib_hca {
        out.push(env("NCCL_IB_HCA", h));
    }
    out
}

/// What the liveness of `kind` follows, in words (the Pod's annotation).
fn liveness_words(kind: EngineKind) -> String {
    match engines::progress_metrics(kind) {
        Some(m) => format!(
            "exec probe every 15 s: fails when {} sum above 0 and {} have not moved for {} s, or {} is unreachable 4 times in a row",
            m.pending.join(" + "),
            m.progress.join(" + "),
            engines::STALL_SECONDS,
            m.path
        ),
        None => "the engine's own /live (its progress heartbeat)".into(),
    }
}

/// Every Pod of `replica` on an engine other than brink or over several nodes.
pub fn member_pods(replica: &ModelReplica, model: &Model, config: &Config) -> Result<Vec<Pod>> {
    members(replica).iter().map(|m| member_pod(replica, model, config, m)).collect()
}

pub(crate) fn member_pod(replica: &ModelReplica, model: &Model, config: &Config, member: &Member) -> Result<Pod> {
    let name = replica.name_any();
    let invalid = |why: String| Error::InvalidSpec { what: format!("ModelReplica {name}"), why };
    let owner = replica.controller_owner_ref(&()).ok_or_else(|| Error::MissingField {
        kind: "ModelReplica",
        name: name.clone(),
        field: "metadata.uid",
    })?;
    let model_mount = model_mount(model, &config.model_cache_dir).map_err(&invalid)?;
    let s = &replica.spec;
    let kind = s.engine.kind;
    let port = engine_port(replica, config);
    let rank = member.rank.as_ref();
    let leads = rank.is_none_or(GangRank::is_leader);
    let launch =
        Launch { kind, model_path: &model_mount.path, served_name: &s.model, port, serving: &s.serving, args: &s.engine.args, gang: rank };
    let command = engines::command(&launch).map_err(|e| invalid(e.to_string()))?;

    let mut envs = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_IP", "status.podIP"),
        env("BRINK_REPLICA", &name),
        env("NVIDIA_VISIBLE_DEVICES", "all"),
        env("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ];
    if let Some(g) = rank {
        envs.push(env("BRINK_GANG_RANK", &g.rank.to_string()));
        envs.push(env("BRINK_GANG_SIZE", &g.size.to_string()));
        envs.push(env("BRINK_GANG_LEADER", &g.leader_address));
        envs.extend(network_env(&s.gang.as_ref().and_then(|g| g.network.clone()).unwrap_or_default()));
    }
    if let Some(endpoint) = &config.replica_otlp_endpoint {
        envs.push(env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint));
        envs.push(env("OTEL_SERVICE_NAME", "brink-replica"));
    }

    let rdma = s.gang.as_ref().is_some_and(|g| g.rdma);
    let mut mounts = vec![model_mount.mount.clone(), mount("state", STATE_DIR), mount("dshm", "/dev/shm")];
    let mut volumes = vec![model_mount.volume.clone(), empty_dir("state", None), empty_dir("dshm", Some("Memory"))];
    if rdma {
        mounts.push(mount("infiniband", "/dev/infiniband"));
        volumes.push(host_path("infiniband", "/dev/infiniband", "Directory"));
    }
    let memory = replica_memory(replica);
    let resources = (memory > 0).then(|| ResourceRequirements {
        requests: Some(BTreeMap::from([("memory".to_string(), Quantity(memory.to_string()))])),
        ..ResourceRequirements::default()
    });
    let ports: Vec<ContainerPort> = engines::ports(kind, port, rank)
        .into_iter()
        .map(|(n, p)| ContainerPort { name: Some(n.into()), container_port: i32::from(p), ..ContainerPort::default() })
        .collect();
    let startup_failures = i32::try_from(config.startup_seconds.div_ceil(10).max(1)).unwrap_or(i32::MAX);
    // The leader's API answers /health once the model is loaded (and the gang joined): the
    // liveness check starts after that. A llama.cpp worker's ggml-rpc-server is alive while its port
    // accepts; a Ray or SGLang worker lives and dies with its process (and its leader's check).
    let (startup, liveness) = match (leads, kind) {
        (true, _) => {
            let startup = Probe {
                http_get: Some(HTTPGetAction {
                    path: Some("/health".into()),
                    port: IntOrString::String("http".into()),
                    ..HTTPGetAction::default()
                }),
                period_seconds: Some(10),
                failure_threshold: Some(startup_failures),
                timeout_seconds: Some(5),
                ..Probe::default()
            };
            let live = engines::progress_metrics(kind).map(|m| {
                exec_probe(vec!["sh".into(), "-c".into(), engines::liveness_script(&m, port, engines::STALL_SECONDS, STATE_DIR)], 15, 4, 10)
            });
            (Some(startup), live)
        }
        (false, EngineKind::Llamacpp) => {
            let tcp = Probe {
                tcp_socket: Some(TCPSocketAction { port: IntOrString::String("rpc".into()), ..TCPSocketAction::default() }),
                period_seconds: Some(10),
                failure_threshold: Some(6),
                ..Probe::default()
            };
            (None, Some(tcp))
        }
        (false, _) => (None, None),
    };
    let security = rdma.then(|| SecurityContext {
        capabilities: Some(Capabilities { add: Some(vec!["IPC_LOCK".into()]), ..Capabilities::default() }),
        ..SecurityContext::default()
    });
    let mut containers = vec![Container {
        name: "engine".into(),
        image: Some(s.engine.image.clone()),
        command: Some(command),
        ports: (!ports.is_empty()).then_some(ports),
        env: Some(envs),
        resources,
        startup_probe: startup,
        liveness_probe: liveness,
        volume_mounts: Some(mounts),
        security_context: security,
        ..Container::default()
    }];
    let mut annotations = BTreeMap::new();
    if leads {
        let image = config.agent_image.clone().ok_or_else(|| {
            invalid(format!(
                "engine kind {} needs the qualification sidecar, and the operator has no --agent-image (brink-agent's image)",
                kind.as_str()
            ))
        })?;
        let report = engines::replica_report_path(NODE_STATE_DIR, &replica.namespace().unwrap_or_default(), &name);
        containers.push(Container {
            name: "qualify".into(),
            image: Some(image),
            command: Some(vec!["bash".into(), "-c".into(), engines::sidecar_script(port, &s.model, &s.serving, &report)]),
            readiness_probe: Some(exec_probe(vec!["test".into(), "-f".into(), engines::QUALIFIED_MARKER.into()], 5, 1, 2)),
            // The node's state directory: the verdict goes where brink's replicas write theirs,
            // and the node's agent publishes it in the replica's status.
            volume_mounts: Some(vec![mount("qualification", engines::QUALIFICATION_DIR), mount("node-state", NODE_STATE_DIR)]),
            ..Container::default()
        });
        volumes.push(empty_dir("qualification", None));
        volumes.push(host_path("node-state", &config.node_state_dir, "DirectoryOrCreate"));
        annotations.insert(LIVENESS_ANNOTATION.to_string(), liveness_words(kind));
        annotations.insert(
            READINESS_ANNOTATION.to_string(),
            format!(
                "container qualify: brink-agent qualify against the engine's HTTP API on port {port}; Ready once it passed (or passed clamped), report in {}/report.json; the verdict (pass, clamp with the longest admitted prompt, refuse) in the replica's status.qualification",
                engines::QUALIFICATION_DIR
            ),
        );
    }

    let scheduling = PodScheduling::of(replica)?;
    let gang = s.gang.is_some();
    let spec = PodSpec {
        node_name: Some(member.node.clone()),
        runtime_class_name: Some(RUNTIME_CLASS.into()),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_S),
        containers,
        volumes: Some(volumes),
        host_network: gang.then_some(true),
        // Host networking keeps cluster DNS only with this policy (members find each other by name).
        dns_policy: gang.then(|| "ClusterFirstWithHostNet".to_string()),
        hostname: gang.then(|| hostname(&member.pod)),
        subdomain: gang.then(|| gang_service_name(&name)),
        tolerations: (!scheduling.tolerations.is_empty()).then_some(scheduling.tolerations),
        node_selector: (!scheduling.node_selector.is_empty()).then_some(scheduling.node_selector),
        priority_class_name: scheduling.priority_class_name,
        ..PodSpec::default()
    };
    annotations.insert(POD_SPEC_ANNOTATION.to_string(), spec_hash(&spec)?);
    let mut labels = BTreeMap::from([
        (REPLICA_LABEL.to_string(), label_value(&name)),
        (REVISION_LABEL.to_string(), s.revision.clone()),
        (MODEL_LABEL.to_string(), label_value(&s.model)),
        ("app.kubernetes.io/name".to_string(), "brink-replica".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), "brink-operator".to_string()),
    ]);
    // The deployment's Service (and /scale) selects by the deployment label: leaders only.
    if leads {
        labels.insert(DEPLOYMENT_LABEL.to_string(), label_value(&s.deployment));
    }
    if let Some(g) = rank {
        labels.insert(GANG_ROLE_LABEL.to_string(), if g.is_leader() { "leader" } else { "worker" }.to_string());
        labels.insert(GANG_RANK_LABEL.to_string(), g.rank.to_string());
    }
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(member.pod.clone()),
            namespace: replica.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// The headless Service of a gang: it gives every member a DNS name (published before the
/// members are ready, since the leader is ready only once its workers serve with it).
pub fn gang_service(replica: &ModelReplica, config: &Config) -> Result<Service> {
    let name = replica.name_any();
    let owner = replica.controller_owner_ref(&()).ok_or_else(|| Error::MissingField {
        kind: "ModelReplica",
        name: name.clone(),
        field: "metadata.uid",
    })?;
    let selector = BTreeMap::from([(REPLICA_LABEL.to_string(), label_value(&name))]);
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(gang_service_name(&name)),
            namespace: replica.namespace(),
            labels: Some(selector.clone()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(selector),
            publish_not_ready_addresses: Some(true),
            // Headless: the ports only document what members listen on.
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: i32::from(engine_port(replica, config)),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}
