//! The agent's Kubernetes I/O: start-up checks, the SparkNode (created owned by its Node,
//! status applied whole), the heartbeat, a qualification round and a model-cache round. Only
//! ordinary `kube::Api` calls; every decision is made by the pure modules beside this one.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use brink_api::UnifiedMemory;
use brink_api::crd::{CachePhase, Capacity, DownloadProgress, Model, ModelReplica, ReplicaQualification, SparkNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::cache_plan;
use super::errors::{ApiProblem, Call, explain};
use super::lease::{self, LeaseError, RenewOutcome};
use super::node_status::{Liveness, NodeState};
use super::qualifier::{Qualifier, QualifyError, QualifyJob};
use super::qualify_plan;
use crate::model_cache::{CacheError, CachedModel, Credentials, ModelCache, ModelFacts, ModelSource, Progress};

/// The SparkNode's field manager (one per node is not needed: the object is this node's alone).
pub const MANAGER: &str = "brink-agent";

/// The field manager for what this node writes into shared objects (a Model's per-node cache
/// entry, a replica's download progress): one per node, so agents never take each other's
/// fields.
pub fn node_manager(node: &str) -> String {
    format!("brink-agent-{node}")
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub node: String,
    pub lease_namespace: String,
    pub lease_seconds: i32,
    /// The API server's URL, for error messages.
    pub api_url: String,
    /// Where the DaemonSet mounts PVCs: `<root>/<claimName>`.
    pub pvc_root: PathBuf,
    /// Bytes of unified memory kept free for the OS and the agent.
    pub reserved_memory_bytes: u64,
    /// How often download progress is written while a model downloads.
    pub progress_every: Duration,
    /// The node's state directory, where replica Pods (which mount it) write what they proved
    /// before `/ready` (`qualify::replica::report_path`); published in their status.
    pub replica_reports: Option<PathBuf>,
}

/// What the agent reads from its surroundings, replaceable in tests.
#[derive(Clone)]
pub struct Probes {
    pub now: Arc<dyn Fn() -> Timestamp + Send + Sync>,
    /// Unified memory as the OS reports it (`/proc/meminfo`), None when unreadable.
    pub memory: Arc<dyn Fn() -> Option<UnifiedMemory> + Send + Sync>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    Api(#[from] ApiProblem),
    #[error("the heartbeat Lease: {0}")]
    Lease(String),
    #[error("Node {node} does not exist: --node-name (NODE_NAME, from the downward API's spec.nodeName) must name this node")]
    NoNode { node: String },
    #[error("the model cache: {0}")]
    Cache(#[from] CacheError),
}

/// Why a Model's file could not be read or made present on this node; each names its Model,
/// Secret, API call or cache path. Kept as text in the Model's status and the agent's log.
#[derive(Debug, thiserror::Error)]
pub enum ModelFileError {
    #[error("{0}")]
    Api(#[from] ApiProblem),
    #[error(transparent)]
    Credentials(#[from] cache_plan::CredentialsError),
    #[error(transparent)]
    Source(#[from] cache_plan::SourceError),
    #[error("{0}")]
    Cache(#[from] CacheError),
    /// The Model a sweep names is not in its namespace.
    #[error("does not exist")]
    NoModel,
    /// A status write (or a list) of the agent's own failed meanwhile.
    #[error("{0}")]
    Agent(#[from] AgentError),
}

pub struct Agent {
    client: Client,
    pub settings: Settings,
    probes: Probes,
    state: Mutex<NodeState>,
    /// Serialises status writes, so an older status is never applied after a newer one.
    writing: tokio::sync::Mutex<()>,
    /// Models whose header facts could not be read, by `namespace/name`: the cache key then
    /// and when, so a broken source is retried after [`FACTS_RETRY`], not every round.
    facts_failures: Mutex<BTreeMap<String, (String, Time)>>,
    /// Held by whatever uses the GPU for a test: a qualification's self-test or a sweep. A sweep
    /// that finds it taken waits for the next round; a qualification waits for the sweep.
    pub(super) gpu: Arc<tokio::sync::Mutex<()>>,
    /// Sweeps this process finished, by final state: `brink_agent_sweeps_total{result}`.
    pub(super) sweeps_finished: Mutex<BTreeMap<&'static str, u64>>,
    /// The run whose sweep is in flight here, if any (to say "agent stopped" in its result).
    pub(super) sweeping: Mutex<Option<super::sweep_plan::RunRef>>,
    /// One model-cache user at a time (the cache round, a sweep's model): two downloads of one
    /// model would collide in the cache.
    pub(super) caching: tokio::sync::Mutex<()>,
}

/// How long a Model whose facts could not be read waits before this node tries again.
pub const FACTS_RETRY: Duration = Duration::from_secs(600);

impl Agent {
    pub fn new(client: Client, settings: Settings, probes: Probes, state: NodeState) -> Agent {
        Agent {
            client,
            settings,
            probes,
            state: Mutex::new(state),
            writing: tokio::sync::Mutex::new(()),
            facts_failures: Mutex::new(BTreeMap::new()),
            gpu: Arc::new(tokio::sync::Mutex::new(())),
            sweeps_finished: Mutex::new(BTreeMap::new()),
            sweeping: Mutex::new(None),
            caching: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    /// What the SparkNode's status says now (qualifications, hosted replicas), for the metrics.
    pub fn snapshot(&self) -> NodeState {
        self.state().clone()
    }

    fn state(&self) -> MutexGuard<'_, NodeState> {
        // Nothing holding the lock can leave the state half-updated (plain assignments).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn now(&self) -> Time {
        Time((self.probes.now)())
    }

    pub(super) fn problem(&self, call: Call<'_>, e: kube::Error) -> AgentError {
        AgentError::Api(explain(call, &self.settings.api_url, &e))
    }

    /// Start-up: the API answers and has the CRDs, the Node exists, the SparkNode exists (owned
    /// by the Node), the Lease is renewed and the status written with Ready=True.
    pub async fn start(&self) -> Result<(), AgentError> {
        let node = self.settings.node.clone();
        let nodes: Api<SparkNode> = Api::all(self.client.clone());
        nodes.list(&ListParams::default().limit(1)).await.map_err(|e| self.problem(Call::new("list", "sparknodes", None), e))?;
        let core: Api<Node> = Api::all(self.client.clone());
        let k8s_node = match core.get_opt(&node).await {
            Ok(Some(n)) => n,
            Ok(None) => return Err(AgentError::NoNode { node }),
            Err(e) => return Err(self.problem(Call::new("get", "nodes", Some(&node)), e)),
        };
        let uid = k8s_node.metadata.uid.unwrap_or_default();
        // Owned by its Node: deleting the Node collects the SparkNode.
        let body = json!({
            "apiVersion": "brink.dev/v1alpha1",
            "kind": "SparkNode",
            "metadata": {
                "name": node,
                "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": node, "uid": uid }],
            },
            // An object created without `spec` comes back without it, which the typed client
            // cannot read (found by the whole-loop test against the API double). An empty
            // spec owns no field: the operator's `shapeClasses` stay its own.
            "spec": {},
        });
        let pp = PatchParams::apply(MANAGER).force();
        let current = nodes
            .patch(&node, &pp, &Patch::Apply(&body))
            .await
            .map_err(|e| self.problem(Call::new("patch", "sparknodes", Some(&node)), e))?;
        if let Some(status) = &current.status {
            self.state().adopt(&status.qualifications);
        }
        self.heartbeat().await
    }

    /// Renews the Lease, then writes the status with the heartbeat time and fresh capacity.
    pub async fn heartbeat(&self) -> Result<(), AgentError> {
        let s = &self.settings;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &s.lease_namespace);
        let now = self.probes.now.clone();
        match lease::renew(&leases, &s.lease_namespace, &s.node, s.lease_seconds, move || now()).await {
            Ok(RenewOutcome::Created | RenewOutcome::Renewed) => {}
            Ok(RenewOutcome::HeldByOther { holder }) => {
                return Err(AgentError::Lease(format!(
                    "Lease {}/{} is held by {holder:?}, not this node: is a second agent running for node {}?",
                    s.lease_namespace,
                    lease::lease_name(&s.node),
                    s.node
                )));
            }
            Err(LeaseError::Api(e)) => return Err(self.problem(Call::new("update", "leases", Some(&lease::lease_name(&s.node))), e)),
            Err(e @ LeaseError::Conflicts { .. }) => return Err(AgentError::Lease(e.to_string())),
        }
        {
            let mut st = self.state();
            st.heartbeat = Some(self.now());
            st.capacity = (self.probes.memory)().map(|m| capacity(m, &st, s.reserved_memory_bytes));
        }
        self.write_status().await
    }

    /// Applies the whole status.
    pub async fn write_status(&self) -> Result<(), AgentError> {
        let _one_at_a_time = self.writing.lock().await;
        let status = self.state().status(self.now());
        let node = &self.settings.node;
        let body = json!({ "apiVersion": "brink.dev/v1alpha1", "kind": "SparkNode", "metadata": { "name": node }, "status": status });
        let nodes: Api<SparkNode> = Api::all(self.client.clone());
        nodes
            .patch_status(node, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .map_err(|e| self.problem(Call::new("patch", "sparknodes/status", Some(node)), e))?;
        Ok(())
    }

    /// Marks the agent stopping (Ready=False, `AgentStopping`).
    pub async fn stop(&self) -> Result<(), AgentError> {
        self.state().liveness = Liveness::Stopping;
        self.write_status().await
    }

    /// Qualifies at most one requested class that has no current result. Returns the class
    /// qualified, if any.
    pub async fn qualify_round(&self, qualifier: Arc<dyn Qualifier>) -> Result<Option<String>, AgentError> {
        let node = &self.settings.node;
        let nodes: Api<SparkNode> = Api::all(self.client.clone());
        let me = nodes.get(node).await.map_err(|e| self.problem(Call::new("get", "sparknodes", Some(node)), e))?;
        let requested = me.spec.shape_classes;
        let (pending, resident, local) = {
            let st = self.state();
            (qualify_plan::pending(&requested, &st.qualifications, &st.fingerprint), st.replicas.len(), st.local_models.clone())
        };
        let job = |class: &str| QualifyJob {
            shape_class: class.to_string(),
            negative_controls: qualify_plan::negative_controls(resident),
            model_file: local.get(class).cloned(),
        };
        // Rebuilt each round: classes no longer asked for are no longer waiting.
        let mut blocked = BTreeMap::new();
        let mut next = None;
        for (i, class) in pending.iter().enumerate() {
            let candidate = job(class);
            match qualifier.check(&candidate) {
                Ok(()) => {
                    next = Some((candidate, pending.len() - i - 1));
                    break;
                }
                Err(why) => {
                    blocked.insert(class.clone(), why.to_string());
                }
            }
        }
        let Some((job, more)) = next else {
            let changed = {
                let mut st = self.state();
                let changed = st.blocked != blocked || st.qualifying.is_some();
                st.blocked = blocked;
                st.qualifying = None;
                changed
            };
            if changed {
                self.write_status().await?;
            }
            return Ok(None);
        };
        let class = job.shape_class.clone();
        {
            let mut st = self.state();
            st.blocked = blocked;
            st.qualifying = Some((class.clone(), more));
        }
        self.write_status().await?;
        // A sweep in flight has the GPU: the self-test waits for it (never measured beside it).
        let _gpu = self.gpu.clone().lock_owned().await;
        let run = tokio::task::spawn_blocking(move || qualifier.qualify(&job)).await;
        let outcome = run.unwrap_or_else(|e| Err(QualifyError::Failed(format!("the qualification task failed: {e}"))));
        {
            let mut st = self.state();
            st.qualifying = None;
            match outcome {
                Ok(result) => {
                    st.qualifications.insert(class.clone(), result);
                }
                Err(QualifyError::Unresolved(why) | QualifyError::Failed(why)) => {
                    st.blocked.insert(class.clone(), why);
                }
            }
        }
        self.write_status().await?;
        Ok(Some(class))
    }

    /// One model-cache round: every Model a replica on this node uses (and one Model of each
    /// shape class waiting to be qualified) is made present (downloaded, or verified in place),
    /// its status and its replicas' download progress written; models evicted to make room are
    /// marked so in their status; then the header facts of Models that lack them are read
    /// without downloading them (see [`Agent::fill_facts`]).
    pub async fn sync_models(&self, cache: &ModelCache) -> Result<(), AgentError> {
        let _one_at_a_time = self.caching.lock().await;
        let node = self.settings.node.clone();
        let replicas: Vec<ModelReplica> = Api::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| self.problem(Call::new("list", "modelreplicas", None), e))?
            .items;
        let models: Vec<Model> = Api::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| self.problem(Call::new("list", "models", None), e))?
            .items;
        let by_name: BTreeMap<(String, String), &Model> = models
            .iter()
            .map(|m| ((m.metadata.namespace.clone().unwrap_or_default(), m.metadata.name.clone().unwrap_or_default()), m))
            .collect();
        let sizes: BTreeMap<String, u64> =
            by_name.iter().filter_map(|((ns, name), m)| Some((format!("{ns}/{name}"), m.status.as_ref()?.size_bytes?))).collect();
        self.publish_replica_reports(&replicas).await?;
        let hosted = cache_plan::hosted(&node, &replicas, &sizes);
        let changed = {
            let mut st = self.state();
            let changed = st.replicas != hosted;
            st.replicas = hosted;
            changed
        };
        if changed {
            self.write_status().await?;
        }
        let local = cache_plan::local_models(&node, &models, &self.settings.pvc_root);
        self.state().local_models = local;
        let mut wanted = cache_plan::wanted(&node, &replicas);
        let waiting: Vec<String> = self.state().blocked.keys().cloned().collect();
        wanted.extend(cache_plan::for_qualification(&waiting, &models, &wanted));
        let in_use: HashSet<String> =
            wanted.iter().filter_map(|w| by_name.get(&(w.namespace.clone(), w.model.clone())).and_then(|m| cache_plan::key(m))).collect();
        // A partial download of a Model that no longer exists would hold its bytes forever.
        let every_part: HashSet<String> = models.iter().flat_map(all_digests).collect();
        let freed = cache.prune_partials(&every_part)?;
        if freed > 0 {
            eprintln!("brink-agent run: removed {freed} bytes of abandoned partial downloads");
        }
        let before: HashSet<String> = cache.entries()?.into_iter().map(|e| e.sha256).collect();
        let mut fetched = BTreeSet::new();
        for w in &wanted {
            let Some(model) = by_name.get(&(w.namespace.clone(), w.model.clone())) else {
                eprintln!("brink-agent run: replicas {:?} use Model {}/{}, which does not exist", w.replicas, w.namespace, w.model);
                continue;
            };
            let ready_here = cache_plan::our_entry(model, &node).is_some_and(|e| e.phase == CachePhase::Ready);
            let key = cache_plan::key(model);
            let local = model.spec.source.https.is_none();
            if ready_here && (local || key.as_ref().is_some_and(|k| before.contains(k))) {
                continue;
            }
            fetched.insert((w.namespace.clone(), w.model.clone()));
            // A failure is in the Model's status; the replicas' Pods wait for it.
            let _ = self.fetch(cache, model, w, &in_use).await?;
        }
        let after: HashSet<String> = cache.entries()?.into_iter().map(|e| e.sha256).collect();
        for model in &models {
            let evicted = cache_plan::key(model).is_some_and(|k| before.contains(&k) && !after.contains(&k));
            if evicted && cache_plan::our_entry(model, &node).is_some_and(|e| e.phase == CachePhase::Ready) {
                let message = Some("evicted to make room for a model a replica on this node uses".to_string());
                let entry = cache_plan::entry(&node, CachePhase::Evicted, 0, None, message, self.now());
                self.apply_model(model, cache_plan::model_status(model, entry, None)).await?;
            }
        }
        self.fill_facts(cache, &models, &fetched).await
    }

    /// Writes the header facts (shape class, size, KV bytes per token) of every Model whose
    /// status lacks them and that this round did not fetch, so the operator can place a Model
    /// no replica uses yet: from this node's cache when it holds the file, otherwise read
    /// without downloading it ([`ModelCache::probe`]: a local file in place, https by `Range`).
    /// Every node's agent may do this; each applies with its own field manager, so agents that
    /// read the same facts co-own them, and one that read other facts writes nothing (see
    /// [`cache_plan::facts_status`]); the apply carries the listed resourceVersion, so an agent
    /// whose list is older than another's write gets 409 and decides again next round. A failure is logged and retried after [`FACTS_RETRY`]: it
    /// fails no round, as another node may read the facts, and a local file that is not on this
    /// node is skipped quietly.
    pub async fn fill_facts(&self, cache: &ModelCache, models: &[Model], fetched: &BTreeSet<(String, String)>) -> Result<(), AgentError> {
        let node = self.settings.node.clone();
        for model in cache_plan::facts_needed(models, fetched) {
            let namespace = model.metadata.namespace.clone().unwrap_or_default();
            let id = format!("{namespace}/{}", model.metadata.name.clone().unwrap_or_default());
            let Some(key) = cache_plan::key(model) else { continue };
            let now = self.now();
            if !cache_plan::probe_due(self.failures().get(&id), &key, &now, FACTS_RETRY) {
                continue;
            }
            let found = match cache.indexed_facts(&key) {
                Ok(Some(f)) => Ok(Some(f)),
                Ok(None) => self.probe(cache, model, &namespace).await,
                Err(e) => Err(ModelFileError::from(e)),
            };
            match found {
                Ok(Some(f)) => {
                    self.failures().remove(&id);
                    let Some(body) = cache_plan::facts_status(model, &node, &f.facts, f.size) else { continue };
                    match self.apply_model_raw(model, body).await {
                        Ok(()) => {}
                        // The Model changed since it was listed (another agent wrote facts, or
                        // it was deleted): the next round decides on what it holds then.
                        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                            eprintln!(
                                "brink-agent run: Model {id} changed while its facts were read ({}); reading it again next round",
                                s.code
                            );
                        }
                        Err(e) => return Err(self.problem(Call::new("patch", "models/status", model.metadata.name.as_deref()), e)),
                    }
                }
                Ok(None) => {}
                Err(why) => {
                    eprintln!(
                        "brink-agent run: Model {id}: the header facts could not be read (next try in {} s): {why}",
                        FACTS_RETRY.as_secs()
                    );
                    self.failures().insert(id, (key, now));
                }
            }
        }
        Ok(())
    }

    fn failures(&self) -> MutexGuard<'_, BTreeMap<String, (String, Time)>> {
        self.facts_failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `model`'s facts read without downloading it; None for a local file not on this node.
    async fn probe(&self, cache: &ModelCache, model: &Model, namespace: &str) -> Result<Option<ModelFacts>, ModelFileError> {
        let credentials = self.credentials(model, namespace).await?;
        let source = cache_plan::source(model, credentials, &self.settings.pvc_root)?;
        if let ModelSource::Local { path, .. } = &source
            && !path.exists()
        {
            return Ok(None);
        }
        Ok(cache.probe(&source).await.map(Some)?)
    }

    /// The credentials from `model`'s Secret, if it names one.
    pub(super) async fn credentials(&self, model: &Model, namespace: &str) -> Result<Option<Credentials>, ModelFileError> {
        let Some(secret) = cache_plan::secret_name(model) else { return Ok(None) };
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        match secrets.get(secret).await {
            Ok(s) => Ok(cache_plan::credentials(&format!("{namespace}/{secret}"), &s.data.unwrap_or_default()).map(Some)?),
            Err(e) => Err(explain(Call::new("get", "secrets", Some(secret)), &self.settings.api_url, &e).into()),
        }
    }

    /// Makes one model present, writing its progress and outcome. Outer error: a status write
    /// failed; inner: the model could not be made present (as its status now says).
    pub(super) async fn fetch(
        &self,
        cache: &ModelCache,
        model: &Model,
        w: &cache_plan::Wanted,
        in_use: &HashSet<String>,
    ) -> Result<Result<CachedModel, ModelFileError>, AgentError> {
        let node = self.settings.node.clone();
        let credentials = self.credentials(model, &w.namespace).await;
        let source = credentials.and_then(|c| Ok(cache_plan::source(model, c, &self.settings.pvc_root)?));
        let source = match source {
            Ok(s) => s,
            Err(why) => {
                let entry = cache_plan::entry(&node, CachePhase::Failed, 0, None, Some(why.to_string()), self.now());
                self.apply_model(model, cache_plan::model_status(model, entry, None)).await?;
                return Ok(Err(why));
            }
        };
        let entry = cache_plan::entry(&node, CachePhase::Downloading, 0, None, None, self.now());
        self.apply_model(model, cache_plan::model_status(model, entry, None)).await?;
        self.apply_downloads(w, Some(DownloadProgress { bytes_done: 0, bytes_total: None })).await?;

        // The cache reports per part; the status shows the model's bytes so far.
        let latest: Arc<Mutex<Option<DownloadProgress>>> = Arc::new(Mutex::new(None));
        let sink = latest.clone();
        let mut tally = cache_plan::PartTally::new(match &source {
            crate::model_cache::ModelSource::Http { parts, .. } => parts.len(),
            crate::model_cache::ModelSource::Local { .. } => 1,
        });
        let mut on_progress = move |part: usize, p: Progress| {
            let done = tally.update(part, p);
            *sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(done);
        };
        let ensure = cache.ensure(&source, in_use, &mut on_progress);
        tokio::pin!(ensure);
        let every = self.settings.progress_every;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let outcome = loop {
            tokio::select! {
                r = &mut ensure => break r,
                _ = tick.tick() => {
                    let p = latest.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(p) = p {
                        let entry = cache_plan::entry(&node, CachePhase::Downloading, p.bytes_done, p.bytes_total, None, self.now());
                        // Progress is best effort: a failed write is retried at the next tick.
                        if let Err(e) = self.apply_model(model, cache_plan::model_status(model, entry, None)).await {
                            eprintln!("brink-agent run: {e}");
                        }
                        if let Err(e) = self.apply_downloads(w, Some(p)).await {
                            eprintln!("brink-agent run: {e}");
                        }
                    }
                }
            }
        };
        let body = match &outcome {
            Ok(m) => {
                let entry = cache_plan::entry(&node, CachePhase::Ready, m.size, Some(m.size), None, self.now());
                cache_plan::model_status(model, entry, Some((&m.facts, m.size)))
            }
            Err(e) => {
                let entry = cache_plan::entry(&node, CachePhase::Failed, 0, None, Some(e.to_string()), self.now());
                cache_plan::model_status(model, entry, None)
            }
        };
        self.apply_model(model, body).await?;
        self.apply_downloads(w, None).await?;
        Ok(outcome.map_err(ModelFileError::from))
    }

    async fn apply_model(&self, model: &Model, body: serde_json::Value) -> Result<(), AgentError> {
        let name = model.metadata.name.clone().unwrap_or_default();
        self.apply_model_raw(model, body).await.map_err(|e| self.problem(Call::new("patch", "models/status", Some(&name)), e))
    }

    async fn apply_model_raw(&self, model: &Model, body: serde_json::Value) -> Result<(), kube::Error> {
        let ns = model.metadata.namespace.clone().unwrap_or_default();
        let name = model.metadata.name.clone().unwrap_or_default();
        let api: Api<Model> = Api::namespaced(self.client.clone(), &ns);
        let pp = PatchParams::apply(&node_manager(&self.settings.node)).force();
        api.patch_status(&name, &pp, &Patch::Apply(&body)).await.map(|_| ())
    }

    /// Publishes what each replica Pod on this node proved before `/ready` (the report its
    /// `serve` keeps under the node's state directory) in the `ModelReplica`'s status, when it
    /// differs from what the status says. Under a field manager of its own: the download
    /// progress applies (the node's manager) do not carry it and must not remove it.
    pub(super) async fn publish_replica_reports(&self, replicas: &[ModelReplica]) -> Result<(), AgentError> {
        let Some(dir) = &self.settings.replica_reports else { return Ok(()) };
        let pp = PatchParams::apply(&format!("{}-replicas", node_manager(&self.settings.node))).force();
        for r in replicas.iter().filter(|r| r.spec.node == self.settings.node) {
            let (ns, name) = (r.metadata.namespace.clone().unwrap_or_default(), r.metadata.name.clone().unwrap_or_default());
            let path = crate::qualify::replica::report_path(dir, &ns, &name);
            let Some(report) = std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str::<ReplicaQualification>(&t).ok())
            else {
                continue;
            };
            if r.status.as_ref().and_then(|s| s.qualification.as_ref()) == Some(&report) {
                continue;
            }
            let body = serde_json::json!({
                "apiVersion": "brink.dev/v1alpha1",
                "kind": "ModelReplica",
                "metadata": { "name": name, "namespace": ns },
                "status": { "qualification": report },
            });
            Api::<ModelReplica>::namespaced(self.client.clone(), &ns)
                .patch_status(&name, &pp, &Patch::Apply(&body))
                .await
                .map_err(|e| self.problem(Call::new("patch", "modelreplicas/status", Some(&name)), e))?;
        }
        Ok(())
    }

    async fn apply_downloads(&self, w: &cache_plan::Wanted, progress: Option<DownloadProgress>) -> Result<(), AgentError> {
        let api: Api<ModelReplica> = Api::namespaced(self.client.clone(), &w.namespace);
        let pp = PatchParams::apply(&node_manager(&self.settings.node)).force();
        for name in &w.replicas {
            let body = cache_plan::replica_download(&w.namespace, name, progress);
            api.patch_status(name, &pp, &Patch::Apply(&body))
                .await
                .map_err(|e| self.problem(Call::new("patch", "modelreplicas/status", Some(name)), e))?;
        }
        Ok(())
    }
}

/// Every file digest of `model`, lowercase (the names of its partial downloads).
fn all_digests(model: &Model) -> Vec<String> {
    let parts = model.spec.parts.iter().flatten().map(|p| p.sha256.to_ascii_lowercase());
    model.spec.sha256.iter().map(|s| s.to_ascii_lowercase()).chain(parts).collect()
}

/// The node's capacity: unified memory from the OS, what its replicas' models take, the reserve.
pub fn capacity(memory: UnifiedMemory, state: &NodeState, reserved: u64) -> Capacity {
    Capacity {
        unified_memory: memory,
        resident_replica_bytes: state.replicas.iter().map(|r| r.memory_bytes).fold(0u64, u64::saturating_add),
        reserved_bytes: reserved,
    }
}
