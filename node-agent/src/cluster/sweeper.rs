//! This node's part of the operator's `SweepRun`s: finds the run that is due here
//! ([`sweep_plan::decide`]), marks its `SweepResult` `Running` (so a restarted agent does not
//! start it twice), makes the run's Model present through the model cache, runs the executor
//! ([`crate::sweep::execute`], behind [`SweepExecutor`] so tests can replace it) and writes the
//! final result. Results are owned by their run and written with server-side apply (field
//! manager [`MANAGER`]); the operator adds `status.judgement` with its own manager.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use brink_api::DeviceReport;
use brink_api::crd::{CachePhase, Model, ModelReplica, ResultState, Serving, SweepResult, SweepResultStatus, SweepRun};
use brink_engine::BackendKind;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource};
use serde_json::json;

use super::agent::{Agent, AgentError, MANAGER, ModelFileError};
use super::cache_plan;
use super::errors::Call;
use super::sweep_plan::{self, Busy, Decision, RunRef};
use crate::model_cache::ModelCache;
use crate::sweep::{External, ExtraCase, Plan};

/// Runs one node's sweep (blocking: the self-test and the engine run in child processes).
pub trait SweepExecutor: Send + Sync + 'static {
    fn execute(&self, plan: &Plan) -> SweepResultStatus;
}

/// The real executor on the device discovery found.
pub struct RealExecutor {
    pub device: DeviceReport,
}

impl SweepExecutor for RealExecutor {
    fn execute(&self, plan: &Plan) -> SweepResultStatus {
        crate::sweep::execute(plan, &self.device)
    }
}

/// How this node runs sweeps (the run's spec says what to run).
#[derive(Clone, Debug)]
pub struct SweepSettings {
    pub backend: BackendKind,
    pub state_dir: PathBuf,
    pub max_batch_tokens: u64,
    pub prefill_chunk: u64,
    pub point_timeout: Duration,
    pub load_timeout: Duration,
    pub stall_timeout: f64,
}

/// What became of one sweep round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Round {
    Ran(RunRef, ResultState),
    Waiting(RunRef, sweep_plan::WaitReason),
    Nothing,
}

/// The result's message when the agent stops mid-sweep.
pub const STOPPED: &str = "agent stopped: the sweep was abandoned mid-run";

impl Agent {
    /// One round: decides what is due here and, when a run is, runs it to its end.
    pub async fn sweep_round(&self, cache: &ModelCache, executor: Arc<dyn SweepExecutor>, s: &SweepSettings) -> Result<Round, AgentError> {
        let node = self.settings.node.clone();
        let runs = Api::<SweepRun>::all(self.client().clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| self.problem(Call::new("list", "sweepruns", None), e))?
            .items;
        let results: HashSet<(String, String)> = Api::<SweepResult>::all(self.client().clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| self.problem(Call::new("list", "sweepresults", None), e))?
            .items
            .into_iter()
            .map(|r| (r.metadata.namespace.unwrap_or_default(), r.metadata.name.unwrap_or_default()))
            .collect();
        // Taken for the whole sweep; a qualification holding it makes the run wait.
        let gpu = self.gpu.clone().try_lock_owned();
        let busy = Busy { qualifying: gpu.is_err(), sweeping: false };
        let run = match sweep_plan::decide(&node, &runs, &results, busy) {
            Decision::Nothing => return Ok(Round::Nothing),
            Decision::Wait { due, why } => return Ok(Round::Waiting(due, why)),
            Decision::Start(run) => run,
        };
        let Some(spec) = runs.iter().find(|r| RunRef::of(r) == run) else { return Ok(Round::Nothing) };
        *self.sweeping_now() = Some(run.clone());
        let outcome = self.sweep(spec, &run, cache, executor, s).await;
        *self.sweeping_now() = None;
        drop(gpu);
        let state = outcome?;
        *self.finished().entry(state_name(state)).or_insert(0) += 1;
        Ok(Round::Ran(run, state))
    }

    /// Runs `run` here: the `Running` result first, then the model, the executor and the final
    /// result. Anything that stops the sweep short is in the result (`Failed`, why).
    async fn sweep(
        &self,
        run: &SweepRun,
        r: &RunRef,
        cache: &ModelCache,
        executor: Arc<dyn SweepExecutor>,
        s: &SweepSettings,
    ) -> Result<ResultState, AgentError> {
        let started = SweepResultStatus { state: ResultState::Running, started_at: Some(self.now()), ..SweepResultStatus::default() };
        self.create_result(run, r).await?;
        self.write_result(r, &started).await?;
        eprintln!("brink-agent run: sweep {r}: started on {}", self.settings.node);

        let status = match self.measure(run, r, cache, executor, s, &started).await {
            Ok(status) => status,
            // The API failed mid-sweep: the result says so rather than staying Running.
            Err(e) => {
                SweepResultStatus { state: ResultState::Failed, error: Some(e.to_string()), finished_at: Some(self.now()), ..started }
            }
        };
        // The judgement is the operator's field: never sent from here.
        let status = SweepResultStatus { judgement: None, ..status };
        self.write_result(r, &status).await?;
        eprintln!(
            "brink-agent run: sweep {r}: {:?}{}",
            status.state,
            status.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()
        );
        Ok(status.state)
    }

    /// The model, the plan and the executor's status (`Failed` with why when the model is not
    /// there). Err: an API call failed.
    async fn measure(
        &self,
        run: &SweepRun,
        r: &RunRef,
        cache: &ModelCache,
        executor: Arc<dyn SweepExecutor>,
        s: &SweepSettings,
        started: &SweepResultStatus,
    ) -> Result<SweepResultStatus, AgentError> {
        // Read now, not from the last cache round: a replica placed here meanwhile counts.
        let replicas: Vec<ModelReplica> = Api::all(self.client().clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| self.problem(Call::new("list", "modelreplicas", None), e))?
            .items;
        let hosted = cache_plan::wanted(&self.settings.node, &replicas).iter().map(|w| w.replicas.len()).sum();
        let failed = |error: String| SweepResultStatus {
            state: ResultState::Failed,
            error: Some(error),
            finished_at: Some(self.now()),
            ..started.clone()
        };
        // A run over a deployment measures its replica here through the engine's API.
        let replica = match run.spec.deployment.as_deref() {
            None => None,
            Some(d) => match sweep_plan::replica_target(&replicas, &r.namespace, d, &self.settings.node) {
                Ok((replica, url)) => Some((replica.spec.serving.clone(), url)),
                Err(why) => return Ok(failed(why.to_string())),
            },
        };
        let model = match self.sweep_model(cache, &r.namespace, &run.spec.model, &replicas).await {
            Ok(model) => model,
            Err(why) => return Ok(failed(format!("Model {}/{}: {why}", r.namespace, run.spec.model))),
        };
        let (plan, skipped_controls) = match replica {
            None => self.plan(run, model, s, hosted),
            Some((serving, url)) => match replica_plan(run, model, s, &serving, url) {
                Ok(plan) => (plan, None),
                Err(why) => return Ok(failed(format!("Model {}/{}: {why}", r.namespace, run.spec.model))),
            },
        };
        let task = tokio::task::spawn_blocking(move || executor.execute(&plan)).await;
        let mut status = task.unwrap_or_else(|e| SweepResultStatus {
            state: ResultState::Failed,
            error: Some(format!("the sweep task failed: {e}")),
            finished_at: Some(self.now()),
            ..started.clone()
        });
        if let (Some(why), Some(st)) = (skipped_controls, status.self_test.as_mut()) {
            // The outcome's flag says they did not run; the log says why.
            st.negative_controls_ran = false;
            eprintln!("brink-agent run: sweep {r}: negative controls skipped: {why}");
        }
        Ok(status)
    }

    /// The executor's plan for `run` with the model at `model`, and why the negative controls
    /// are skipped when they are.
    fn plan(&self, run: &SweepRun, model: PathBuf, s: &SweepSettings, hosted_replicas: usize) -> (Plan, Option<String>) {
        let controls = sweep_plan::negative_controls(run.spec.self_test.negative_controls, hosted_replicas);
        let (slots, context) = sweep_plan::engine_shape(&run.spec.workload);
        let plan = Plan {
            model,
            backend: s.backend,
            grid: run.spec.workload.clone(),
            self_test: run.spec.self_test,
            negative_controls_allowed: controls.is_ok(),
            extra_cases: run
                .spec
                .extra_cases
                .iter()
                .map(|c| ExtraCase { tokens: c.tokens, sequences: c.sequences, source: c.source.clone() })
                .collect(),
            max_batch_tokens: s.max_batch_tokens,
            prefill_chunk: s.prefill_chunk,
            context,
            slots,
            point_timeout: s.point_timeout,
            load_timeout: s.load_timeout,
            stall_timeout: s.stall_timeout,
            state_dir: s.state_dir.clone(),
            // The node's own brink engine; a run over a deployment measures its replica's API
            // instead ([`replica_plan`]).
            external: None,
        };
        (plan, controls.err().map(|e| e.to_string()))
    }

    /// Creates this node's result owned by the run (server-side apply: the object is this node's).
    async fn create_result(&self, run: &SweepRun, r: &RunRef) -> Result<(), AgentError> {
        let name = r.result(&self.settings.node);
        let owner = run.controller_owner_ref(&());
        let body = json!({
            "apiVersion": "brink.dev/v1alpha1",
            "kind": "SweepResult",
            "metadata": { "name": name, "namespace": r.namespace, "ownerReferences": owner.into_iter().collect::<Vec<_>>() },
            "spec": { "run": r.name, "node": self.settings.node },
        });
        Api::<SweepResult>::namespaced(self.client().clone(), &r.namespace)
            .patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .map_err(|e| self.problem(Call::new("patch", "sweepresults", Some(&name)), e))?;
        Ok(())
    }

    /// Applies the result's status (everything this node measured; not the judgement).
    async fn write_result(&self, r: &RunRef, status: &SweepResultStatus) -> Result<(), AgentError> {
        let name = r.result(&self.settings.node);
        let body = json!({ "apiVersion": "brink.dev/v1alpha1", "kind": "SweepResult", "metadata": { "name": name }, "status": status });
        Api::<SweepResult>::namespaced(self.client().clone(), &r.namespace)
            .patch_status(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&body))
            .await
            .map_err(|e| self.problem(Call::new("patch", "sweepresults/status", Some(&name)), e))?;
        Ok(())
    }

    /// After SIGTERM: the result of the sweep in flight says it was abandoned.
    pub async fn abandon_sweep(&self) -> Result<Option<RunRef>, AgentError> {
        let Some(r) = self.sweeping_now().take() else { return Ok(None) };
        let status = SweepResultStatus {
            state: ResultState::Failed,
            error: Some(STOPPED.into()),
            finished_at: Some(self.now()),
            ..Default::default()
        };
        // The status apply keeps what the Running write set (startedAt) only if sent again:
        // this manager's apply replaces its own fields, so read them back first.
        let api: Api<SweepResult> = Api::namespaced(self.client().clone(), &r.namespace);
        let name = r.result(&self.settings.node);
        let started = api.get_opt(&name).await.ok().flatten().and_then(|x| x.status).and_then(|s| s.started_at);
        self.write_result(&r, &SweepResultStatus { started_at: started, ..status }).await?;
        *self.finished().entry(state_name(ResultState::Failed)).or_insert(0) += 1;
        Ok(Some(r))
    }

    /// `namespace/name`'s file on this node: from the cache (downloaded if needed, its status
    /// written as for a replica's model), or a local file verified in place.
    async fn sweep_model(
        &self,
        cache: &ModelCache,
        namespace: &str,
        name: &str,
        replicas: &[ModelReplica],
    ) -> Result<PathBuf, ModelFileError> {
        let node = self.settings.node.clone();
        let models: Api<Model> = Api::namespaced(self.client().clone(), namespace);
        let model = match models.get_opt(name).await {
            Ok(Some(m)) => m,
            Ok(None) => return Err(ModelFileError::NoModel),
            Err(e) => return Err(self.problem(Call::new("get", "models", Some(name)), e).into()),
        };
        // One user of the cache at a time: the model-cache round may be downloading this model.
        let _one_at_a_time = self.caching.lock().await;
        let in_use = self.models_in_use(replicas).await?;
        if cache_plan::our_entry(&model, &node).is_some_and(|e| e.phase == CachePhase::Ready) {
            let credentials = self.credentials(&model, namespace).await?;
            let source = cache_plan::source(&model, credentials, &self.settings.pvc_root)?;
            return Ok(cache.ensure(&source, &in_use, &mut |_, _| {}).await.map(|m| m.path)?);
        }
        let w = cache_plan::Wanted { namespace: namespace.into(), model: name.into(), replicas: Vec::new() };
        Ok(self.fetch(cache, &model, &w, &in_use).await??.path)
    }

    /// Cache keys of the Models replicas on this node use: never evicted for a sweep's model.
    async fn models_in_use(&self, replicas: &[ModelReplica]) -> Result<HashSet<String>, AgentError> {
        let models: Vec<Model> = Api::all(self.client().clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| self.problem(Call::new("list", "models", None), e))?
            .items;
        let wanted = cache_plan::wanted(&self.settings.node, replicas);
        Ok(models
            .iter()
            .filter(|m| {
                wanted.iter().any(|w| Some(&w.namespace) == m.metadata.namespace.as_ref() && Some(&w.model) == m.metadata.name.as_ref())
            })
            .filter_map(cache_plan::key)
            .collect())
    }

    fn sweeping_now(&self) -> std::sync::MutexGuard<'_, Option<RunRef>> {
        self.sweeping.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn finished(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<&'static str, u64>> {
        self.sweeps_finished.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sweeps finished by this process, by final state (`Done`, `Failed`).
    pub fn sweeps_finished(&self) -> Vec<(&'static str, u64)> {
        let f = self.finished();
        ["Done", "Failed"].iter().map(|k| (*k, f.get(k).copied().unwrap_or(0))).collect()
    }
}

/// The executor's plan for a run over a deployment: the replica's engine measured at `url`
/// through its API, at the replica's serving limits, with the black-box qualification in the
/// self-test's place (it has no negative controls; the extra cases are brink's engine's own).
/// Err: the Model's file has no shape to derive the qualification's lengths from.
fn replica_plan(run: &SweepRun, model: PathBuf, s: &SweepSettings, serving: &Serving, url: String) -> Result<Plan, crate::error::Error> {
    let shape = crate::cmd::flags::model_shape("the Model's file", &model)?;
    let external = External {
        url,
        model_name: None,
        api_key: None,
        shape,
        context: Some(serving.context),
        case_deadline: sweep_plan::REPLICA_CASE_DEADLINE,
    };
    Ok(Plan {
        model,
        backend: s.backend,
        grid: run.spec.workload.clone(),
        self_test: run.spec.self_test,
        negative_controls_allowed: false,
        extra_cases: Vec::new(),
        max_batch_tokens: serving.max_batch_tokens,
        prefill_chunk: serving.prefill_chunk,
        context: usize::try_from(serving.context).unwrap_or(usize::MAX),
        slots: serving.concurrency as usize,
        point_timeout: s.point_timeout,
        load_timeout: s.load_timeout,
        stall_timeout: s.stall_timeout,
        state_dir: s.state_dir.clone(),
        external: Some(external),
    })
}

/// The state as the API serialises it.
fn state_name(s: ResultState) -> &'static str {
    match s {
        ResultState::Running => "Running",
        ResultState::Done => "Done",
        ResultState::Failed => "Failed",
    }
}
