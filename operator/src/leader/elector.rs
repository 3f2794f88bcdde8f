//! The election loop: stand by until the Lease is ours, run the work while renewing it every
//! third of its duration, stop the work the moment leadership is lost (or cannot be proven in
//! time), and release the Lease on shutdown so a successor need not wait out the duration.
//!
//! Every write is a create (the API server refuses a second one) or a replace carrying the
//! resourceVersion read, so two candidates never both win: the slower one gets a 409.

use std::future::Future;
use std::time::Duration;

use futures::future::{Fuse, FusedFuture, FutureExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::{Client, Error as KubeError};
use tokio::time::{Instant, sleep};

use super::decision::{Decision, Observed, decide, observe, release};

/// How the election ended.
#[derive(Debug, PartialEq)]
pub enum Outcome<T> {
    /// The work returned while leading; `released`: the Lease was released.
    Finished { output: T, released: bool },
    /// Shutdown was asked; the work (if it ran) was stopped and the Lease released.
    /// `released`: the release write succeeded (else a successor waits out the duration).
    Shutdown { released: bool },
    /// Leadership was lost and the work stopped. The caller should exit, to stand by afresh
    /// (the work cannot be started twice).
    Lost { holder: Option<String>, why: String },
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leader election: {0}")]
    Invalid(String),
    #[error("leader election: {action} Lease {namespace}/{name}: {source}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: KubeError,
    },
}

/// Runs `work` while this process (`identity`, e.g. its Pod name) holds the Lease
/// `namespace/name`, until the work returns, `shutdown` resolves or leadership is lost.
/// API errors while standing by are retried when transient (5xx, 429, transport) and returned
/// otherwise (e.g. 403: the operator's RBAC lacks leases).
pub async fn run_as_leader<F: Future>(
    client: Client,
    namespace: &str,
    name: &str,
    identity: &str,
    duration: Duration,
    work: impl FnOnce() -> F,
    shutdown: impl Future<Output = ()>,
) -> Result<Outcome<F::Output>, LeaderError> {
    if identity.is_empty() || name.is_empty() || namespace.is_empty() {
        return Err(LeaderError::Invalid(format!("identity {identity:?}, namespace {namespace:?} and name {name:?} must not be empty")));
    }
    if duration < Duration::from_secs(3) || duration.as_secs() > i32::MAX as u64 {
        return Err(LeaderError::Invalid(format!(
            "lease duration {duration:?} must be from 3 s (it is renewed every third) to {} s",
            i32::MAX
        )));
    }
    let lease = LeaseApi { api: Api::namespaced(client, namespace), namespace: namespace.into(), name: name.into() };
    let clock = Clock::start();
    let retry = duration / 3;
    let mut shutdown = std::pin::pin!(shutdown);

    // Stand by until the Lease is ours.
    let mut observed: Option<Observed> = None;
    loop {
        let step = tokio::select! {
            s = lease.try_acquire(identity, false, &mut observed, &clock, duration) => s,
            _ = &mut shutdown => return Ok(Outcome::Shutdown { released: false }),
        };
        let wait = match step {
            Ok(Step::Holding) => break,
            Ok(Step::Raced) => Duration::ZERO,
            Ok(Step::Waiting(d)) => d.min(retry),
            Ok(Step::Lost(_)) => retry,
            Err(e) if transient(&e) => retry,
            Err(e) => return Err(lease.error("acquire", e)),
        };
        tokio::select! {
            _ = sleep(wait) => {}
            _ = &mut shutdown => return Ok(Outcome::Shutdown { released: false }),
        }
    }

    // Leading. The work runs while renewals are in flight (they are polled side by side). A
    // renewal must succeed within two thirds of the duration, whether the API server answers
    // or hangs: a candidate that saw our last write takes over one full duration later, so we
    // stop the work a third before that.
    let renew_deadline = duration - retry;
    let mut last_renew = Instant::now();
    let mut problem = String::from("no answer from the API server");
    let mut work = Box::pin(work());
    let tick = sleep(retry);
    let deadline = sleep(renew_deadline);
    let renewal = Fuse::terminated();
    tokio::pin!(tick, deadline, renewal);
    loop {
        tokio::select! {
            // In this order: at the deadline, a renewal that would start or end then is too late.
            biased;
            out = &mut work => {
                let released = lease.release(identity, &clock).await;
                return Ok(Outcome::Finished { output: out, released });
            }
            _ = &mut shutdown => {
                // Stop the controllers before a successor may start.
                drop(work);
                let released = lease.release(identity, &clock).await;
                return Ok(Outcome::Shutdown { released });
            }
            _ = &mut deadline => {
                return Ok(Outcome::Lost { holder: None, why: format!("not renewed for {:?}: {problem}", last_renew.elapsed()) });
            }
            step = &mut renewal => {
                tick.as_mut().reset(Instant::now() + retry);
                problem = match step {
                    Ok(Step::Holding) => {
                        last_renew = Instant::now();
                        deadline.as_mut().reset(last_renew + renew_deadline);
                        continue;
                    }
                    Ok(Step::Lost(holder)) => return Ok(Outcome::Lost { why: format!("the Lease is held by {holder}"), holder: Some(holder) }),
                    Ok(Step::Raced) => "renewal conflicted twice (409)".to_string(),
                    Ok(Step::Waiting(_)) => "the Lease is held by another".to_string(),
                    Err(e) => lease.error("renew", e).to_string(),
                };
            }
            _ = &mut tick, if renewal.is_terminated() => {
                renewal.set(lease.renew(identity, &clock, duration).fuse());
            }
        }
    }
}

/// Wall-clock time that advances with tokio's monotonic clock: immune to the host's clock
/// being stepped while we lead, and paused with tokio's in tests.
struct Clock {
    wall: Timestamp,
    start: Instant,
}

impl Clock {
    fn start() -> Clock {
        Clock { wall: Timestamp::now(), start: Instant::now() }
    }

    fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(self.start.elapsed()).unwrap_or(SignedDuration::MAX);
        self.wall.checked_add(elapsed).unwrap_or(Timestamp::MAX)
    }
}

enum Step {
    /// The write succeeded: we hold the Lease.
    Holding,
    /// Someone else wrote first (409): read again at once.
    Raced,
    /// Held by another; look again after this.
    Waiting(Duration),
    /// We were leading and another holds it.
    Lost(String),
}

struct LeaseApi {
    api: Api<Lease>,
    namespace: String,
    name: String,
}

impl LeaseApi {
    fn error(&self, action: &'static str, source: KubeError) -> LeaderError {
        LeaderError::Api { action, namespace: self.namespace.clone(), name: self.name.clone(), source }
    }

    /// Reads the Lease, decides, and makes the write the decision asks for.
    async fn try_acquire(
        &self,
        me: &str,
        leading: bool,
        observed: &mut Option<Observed>,
        clock: &Clock,
        duration: Duration,
    ) -> Result<Step, KubeError> {
        let read = self.api.get_opt(&self.name).await?;
        let now = clock.now();
        let spec = read.as_ref().and_then(|l| l.spec.as_ref());
        *observed = observe(observed.take(), spec, now);
        let written = match decide(spec, observed.as_ref(), me, leading, now, duration) {
            Decision::Create(spec) => self.api.create(&PostParams::default(), &self.lease(None, spec)).await,
            Decision::Acquire(spec) | Decision::Renew(spec) => {
                self.api.replace(&self.name, &PostParams::default(), &self.lease(read, spec)).await
            }
            Decision::StandBy { retry_in, .. } => return Ok(Step::Waiting(retry_in)),
            Decision::Lost { holder } => return Ok(Step::Lost(holder)),
        };
        match written {
            Ok(_) => Ok(Step::Holding),
            Err(KubeError::Api(s)) if s.is_conflict() || s.is_already_exists() => Ok(Step::Raced),
            Err(e) => Err(e),
        }
    }

    /// The Lease to write: `read`'s metadata (its resourceVersion makes the replace
    /// conditional) or a new one's, with `spec`.
    fn lease(&self, read: Option<Lease>, spec: LeaseSpec) -> Lease {
        let metadata = match read {
            Some(l) => l.metadata,
            None => ObjectMeta { name: Some(self.name.clone()), namespace: Some(self.namespace.clone()), ..ObjectMeta::default() },
        };
        Lease { metadata, spec: Some(spec) }
    }

    /// Renews a Lease we hold. A 409 means someone wrote since our read: read once more to
    /// see who holds it now.
    async fn renew(&self, me: &str, clock: &Clock, duration: Duration) -> Result<Step, KubeError> {
        match self.try_acquire(me, true, &mut None, clock, duration).await? {
            Step::Raced => self.try_acquire(me, true, &mut None, clock, duration).await,
            step => Ok(step),
        }
    }

    /// Clears the holder if the Lease is still ours. Best effort: returns whether it was
    /// released (a failure only makes a successor wait out the duration).
    async fn release(&self, me: &str, clock: &Clock) -> bool {
        let Ok(Some(read)) = self.api.get_opt(&self.name).await else { return false };
        let Some(spec) = read.spec.as_ref().and_then(|s| release(s, me, clock.now())) else { return false };
        self.api.replace(&self.name, &PostParams::default(), &self.lease(Some(read), spec)).await.is_ok()
    }
}

/// Worth retrying: the API server or the network, not our request.
fn transient(e: &KubeError) -> bool {
    match e {
        KubeError::Api(s) => s.code >= 500 || s.code == 429,
        KubeError::HyperError(_) | KubeError::Service(_) => true,
        _ => false,
    }
}
