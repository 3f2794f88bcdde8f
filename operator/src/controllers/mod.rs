//! The operator's kube-rs controllers. They read from reflector caches, decide with
//! [`crate::decide`] (pure) and write through ordinary `kube::Api` calls:
//!
//! - [`deployment`]: `ModelDeployment` → `ModelReplica`s, qualification requests, its Service
//!   ([`service`]), the rollout of a changed revision ([`rollout`]) and status ([`plan`]);
//! - [`replica`]: `ModelReplica` → its Pod ([`pod`]) and the phase the Pod implies;
//! - [`nodes`]: Node, SparkNode and heartbeat Lease changes re-queue the deployments they concern.
//!
//! [`run`] runs them all until a shutdown signal; leader election wraps it.

pub mod context;
pub mod deployment;
pub mod error;
pub mod events;
pub mod fleet_metrics;
pub mod lws;
pub mod member_pod;
pub mod metrics;
pub mod names;
pub mod nodes;
pub mod plan;
pub mod pod;
pub mod replica;
pub mod rollout;
pub mod rollout_view;
pub mod server;
pub mod service;
pub mod startup;
pub mod sweep;
pub mod sweep_run;
pub mod views;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use brink_api::crd::{Model, ModelDeployment, ModelReplica, SparkNode, SweepRun};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tracing::{Instrument, info, warn};

pub use context::{Caches, Clock, Config, Context, FIELD_MANAGER, FixedClock, Shared, SystemClock};
pub use error::{Error, Result};
pub use metrics::Metrics;

/// The controllers, by the name their metrics carry.
pub const CONTROLLERS: [&str; 4] = [deployment::CONTROLLER, replica::CONTROLLER, sweep::CONTROLLER, sweep_run::CONTROLLER];

/// How long a failed reconcile waits before it is tried again.
pub fn retry_after(error: &Error) -> Duration {
    match error {
        // Another writer holds the field: it may let go soon.
        Error::Conflict { .. } => Duration::from_secs(5),
        Error::Kube { .. } => Duration::from_secs(15),
        // Input that only a change fixes (which re-queues by itself); checked again now and then.
        Error::Decide(_) | Error::InvalidSpec { .. } | Error::MissingField { .. } | Error::Condition(_) | Error::Serialize { .. } => {
            Duration::from_secs(120)
        }
    }
}

/// Runs `reconcile` inside one span per reconcile, named `reconcile`, with the controller, the
/// object (`namespace/name`) and the outcome (`ok`, or the error's kind): what the traces
/// exporter sends; the reconcile's own spans and kube-runtime's nest with it.
pub async fn traced<K, C, F, Fut>(controller: &'static str, reconcile: F, obj: Arc<K>, ctx: Arc<C>) -> Result<Action>
where
    K: Resource,
    F: FnOnce(Arc<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action>>,
{
    let object = match obj.namespace() {
        Some(ns) => format!("{ns}/{}", obj.name_any()),
        None => obj.name_any(),
    };
    let span = tracing::info_span!(
        "reconcile",
        controller,
        object = %object,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty
    );
    let result = reconcile(obj, ctx).instrument(span.clone()).await;
    match &result {
        Ok(_) => span.record("outcome", "ok"),
        Err(e) => span.record("outcome", e.kind()).record("otel.status_code", "ERROR"),
    };
    result
}

fn error_policy<K: Resource<DynamicType = ()>>(obj: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(object = obj.name_any(), %error, "reconcile failed");
    Action::requeue(retry_after(error))
}

/// A reflector store and the future that keeps it filled.
fn cache<K>(api: Api<K>) -> (Store<K>, impl Future<Output = ()> + Send)
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let feed = reflector::reflector(writer, watcher(api, watcher::Config::default().any_semantic())).default_backoff().for_each(|event| {
        if let Err(e) = event {
            warn!(error = %e, "watch failed; retrying");
        }
        futures::future::ready(())
    });
    (store, feed)
}

/// The caches the controllers read and the futures that fill them.
fn caches(shared: &Shared) -> (Caches, Vec<futures::future::BoxFuture<'static, ()>>) {
    let c = &shared.client;
    let (nodes, f1) = cache(Api::<Node>::all(c.clone()));
    let (spark_nodes, f2) = cache(Api::<SparkNode>::all(c.clone()));
    let (leases, f3) = cache(Api::<Lease>::namespaced(c.clone(), &shared.config.lease_namespace));
    let (models, f4) = cache(Api::<Model>::all(c.clone()));
    let (replicas, f5) = cache(Api::<ModelReplica>::all(c.clone()));
    let (sweep_runs, f6) = cache(Api::<SweepRun>::all(c.clone()));
    (
        Caches { nodes, spark_nodes, leases, models, replicas, sweep_runs },
        vec![f1.boxed(), f2.boxed(), f3.boxed(), f4.boxed(), f5.boxed(), f6.boxed()],
    )
}

/// Runs every controller until `shutdown` completes, then lets in-flight reconciles finish
/// (kube's graceful shutdown) and returns.
pub async fn run(shared: Arc<Shared>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let shutdown = shutdown.shared();
    let (caches, feeds) = caches(&shared);
    let feeds = futures::future::join_all(feeds);
    let wait = {
        let c = caches.clone();
        async move {
            // A decision from a half-filled cache would place onto nodes it has not seen yet.
            let _ = futures::join!(
                c.nodes.wait_until_ready(),
                c.spark_nodes.wait_until_ready(),
                c.leases.wait_until_ready(),
                c.models.wait_until_ready(),
                c.replicas.wait_until_ready(),
                c.sweep_runs.wait_until_ready()
            );
        }
    };
    let mut ctx = Context::new(&shared, caches);
    ctx.config.leader_worker_set = lws::served(&shared.client).await;
    let ctx = Arc::new(ctx);
    let controllers = {
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        async move {
            wait.await;
            info!("caches filled; controllers starting");
            futures::join!(deployments(ctx.clone(), shutdown.clone()), replicas(ctx.clone(), shutdown.clone()), sweep::run(ctx, shutdown));
        }
    };
    // The feeds stop when the controllers have drained. The drain is bounded: kube's runner
    // waits for its own cache before it can finish, and a signal that comes while that cache is
    // still filling would otherwise hold the process until the kubelet kills it.
    let limit = Duration::from_secs(shared.config.drain_seconds);
    let deadline = shutdown.then(move |()| tokio::time::sleep(limit));
    futures::pin_mut!(feeds);
    futures::pin_mut!(controllers);
    futures::pin_mut!(deadline);
    match futures::future::select(futures::future::select(feeds, controllers), deadline).await {
        futures::future::Either::Left(_) => info!("controllers stopped"),
        futures::future::Either::Right(_) => {
            warn!(seconds = limit.as_secs(), "controllers did not drain in time after the shutdown signal; exiting")
        }
    }
    // The caches stop with the controllers: a standby (or stopping) operator shows no fleet.
    shared.metrics.set_fleet_source(None);
}

/// Lets `/metrics` compute the fleet gauges from the caches at each scrape.
fn install_fleet_source(ctx: &Arc<Context>, deployments: Store<ModelDeployment>) {
    let (caches, metrics, clock) = (ctx.caches.clone(), Arc::downgrade(&ctx.metrics), ctx.clock.clone());
    ctx.metrics.set_fleet_source(Some(Box::new(move || {
        let unplaced = |ns: &str, d: &str| metrics.upgrade().map_or(0, |m| m.unplaced_of(ns, d));
        fleet_metrics::fleet_series(&fleet_metrics::FleetInput {
            now_s: clock.now().as_second(),
            nodes: &caches.nodes.state(),
            spark_nodes: &caches.spark_nodes.state(),
            leases: &caches.leases.state(),
            replicas: &caches.replicas.state(),
            deployments: &deployments.state(),
            unplaced: &unplaced,
        })
    })));
}

async fn deployments(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let c = ctx.client.clone();
    let wc = watcher::Config::default().any_semantic();
    let controller = Controller::new(Api::<ModelDeployment>::all(c.clone()), wc.clone());
    let store = controller.store();
    install_fleet_source(&ctx, store.clone());
    let (on_node, on_spark, on_lease, on_run) = (ctx.clone(), ctx.clone(), ctx.clone(), ctx.clone());
    controller
        .owns(Api::<ModelReplica>::all(c.clone()), wc.clone())
        .owns(Api::<Service>::all(c.clone()), wc.clone().labels(names::DEPLOYMENT_LABEL))
        .watches(Api::<Node>::all(c.clone()), wc.clone(), move |n: Node| nodes::requeue_for_node(&n.name_any(), &on_node))
        .watches(Api::<SparkNode>::all(c.clone()), wc.clone(), move |s: SparkNode| nodes::requeue_for_node(&s.name_any(), &on_spark))
        .watches(Api::<Lease>::namespaced(c.clone(), &ctx.config.lease_namespace), wc.clone(), move |l: Lease| {
            nodes::lease_node(&l.name_any()).map(|n| nodes::requeue_for_node(n, &on_lease)).unwrap_or_default()
        })
        .watches(Api::<Model>::all(c.clone()), wc.clone(), move |m: Model| nodes::deployments_of_model(&m, &store))
        // A sweep that starts draining a node moves its replicas; one that ends frees the node.
        .watches(Api::<SweepRun>::all(c.clone()), wc, move |r: SweepRun| nodes::requeue_for_run(&r, &on_run))
        .graceful_shutdown_on(shutdown)
        .run(|d, c| traced(deployment::CONTROLLER, deployment::reconcile, d, c), error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                warn!(error = %e, "deployment controller");
            }
            futures::future::ready(())
        })
        .await;
    info!("deployment controller stopped");
}

async fn replicas(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let c = ctx.client.clone();
    let wc = watcher::Config::default().any_semantic();
    let store = ctx.caches.replicas.clone();
    Controller::new(Api::<ModelReplica>::all(c.clone()), wc.clone())
        .owns(Api::<Pod>::all(c.clone()), wc.clone().labels(names::REPLICA_LABEL))
        .watches(Api::<Model>::all(c.clone()), wc, move |m: Model| nodes::replicas_of_model(&m, &store))
        .graceful_shutdown_on(shutdown)
        .run(|r, c| traced(replica::CONTROLLER, replica::reconcile, r, c), error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                warn!(error = %e, "replica controller");
            }
            futures::future::ready(())
        })
        .await;
    info!("replica controller stopped");
}
