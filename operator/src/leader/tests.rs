//! The decision as a table; the loop against kube-rs's mock service (tower-test), asserting the
//! exact requests it sends, with tokio's clock paused so that renewals come at once and a
//! missing request fails on a timeout instead of hanging.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle, SendResponse};

use super::*;

const ME: &str = "op-a";
const OTHER: &str = "op-b";
const D: Duration = Duration::from_secs(15);

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn held_by(holder: Option<&str>, renew: Option<i64>, duration_s: Option<i32>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: holder.map(Into::into),
        lease_duration_seconds: duration_s,
        acquire_time: Some(MicroTime(t(-100))),
        renew_time: renew.map(|s| MicroTime(t(s))),
        lease_transitions: Some(4),
        ..LeaseSpec::default()
    }
}

#[derive(Debug, PartialEq)]
enum Want {
    Create,
    /// Acquire with this many transitions.
    Acquire(i32),
    Renew,
    StandBy(u64),
    Lost,
}

#[test]
fn decision_table() {
    let other = || held_by(Some(OTHER), Some(0), Some(15));
    // (name, lease read, seen unchanged since (s, relative to now=0), leading, want)
    type Case = (&'static str, Option<LeaseSpec>, Option<i64>, bool, Want);
    let cases: Vec<Case> = vec![
        ("missing: create", None, None, false, Want::Create),
        ("missing while leading (deleted): create again", None, None, true, Want::Create),
        ("released (no holder): acquire at once", Some(held_by(None, Some(0), Some(15))), Some(0), false, Want::Acquire(5)),
        ("released (empty holder): acquire at once", Some(held_by(Some(""), Some(0), Some(15))), None, false, Want::Acquire(5)),
        ("held by me: renew", Some(held_by(Some(ME), Some(-5), Some(15))), Some(-5), true, Want::Renew),
        ("held by me after a restart: renew", Some(held_by(Some(ME), Some(-5), Some(15))), None, false, Want::Renew),
        ("held by other, first seen now: wait a full duration", Some(other()), None, false, Want::StandBy(15)),
        ("held by other, seen unchanged 14 s: 1 s left", Some(other()), Some(-14), false, Want::StandBy(1)),
        ("held by other, seen unchanged exactly 15 s: expired", Some(other()), Some(-15), false, Want::Acquire(5)),
        ("held by other, seen unchanged 60 s: expired", Some(other()), Some(-60), false, Want::Acquire(5)),
        ("held by other while I lead: lost", Some(other()), Some(-60), true, Want::Lost),
        (
            "holder's own duration counts (60 s), not mine",
            Some(held_by(Some(OTHER), Some(0), Some(60))),
            Some(-30),
            false,
            Want::StandBy(30),
        ),
        ("no duration on the lease: mine", Some(held_by(Some(OTHER), Some(0), None)), Some(-10), false, Want::StandBy(5)),
        ("zero duration on the lease: mine", Some(held_by(Some(OTHER), Some(0), Some(0))), Some(-15), false, Want::Acquire(5)),
        // The holder's clock runs an hour behind: its renewTime looks ancient, but it renews.
        (
            "clock skew: renewTime an hour old, just seen: wait",
            Some(held_by(Some(OTHER), Some(-3_600), Some(15))),
            None,
            false,
            Want::StandBy(15),
        ),
        // The holder's clock runs an hour ahead: its renewTime is in the future; it stopped.
        (
            "clock skew: renewTime an hour ahead, unchanged 15 s: expired",
            Some(held_by(Some(OTHER), Some(3_600), Some(15))),
            Some(-15),
            false,
            Want::Acquire(5),
        ),
        ("missing renewTime, just seen: wait", Some(held_by(Some(OTHER), None, Some(15))), None, false, Want::StandBy(15)),
        ("missing renewTime, unchanged 20 s: expired", Some(held_by(Some(OTHER), None, Some(15))), Some(-20), false, Want::Acquire(5)),
    ];
    for (name, read, seen, leading, want) in cases {
        let now = t(0);
        let observed = seen.and_then(|s| observe(None, read.as_ref(), t(s)));
        let observed = observe(observed, read.as_ref(), now);
        let got = decide(read.as_ref(), observed.as_ref(), ME, leading, now, D);
        let summary = match &got {
            Decision::Create(s) => {
                assert_eq!(s.lease_transitions, Some(0), "{name}");
                assert_eq!(s.acquire_time, Some(MicroTime(now)), "{name}");
                Want::Create
            }
            Decision::Acquire(s) => {
                assert_eq!(s.acquire_time, Some(MicroTime(now)), "{name}");
                Want::Acquire(s.lease_transitions.unwrap())
            }
            Decision::Renew(s) => {
                assert_eq!(s.acquire_time, read.as_ref().unwrap().acquire_time, "{name}: renewing keeps the acquire time");
                assert_eq!(s.lease_transitions, Some(4), "{name}");
                Want::Renew
            }
            Decision::StandBy { holder, retry_in } => {
                assert_eq!(holder, OTHER, "{name}");
                Want::StandBy(retry_in.as_secs())
            }
            Decision::Lost { holder } => {
                assert_eq!(holder, OTHER, "{name}");
                Want::Lost
            }
        };
        assert_eq!(summary, want, "{name}: {got:?}");
        if let Decision::Create(s) | Decision::Acquire(s) | Decision::Renew(s) = &got {
            assert_eq!(s.holder_identity.as_deref(), Some(ME), "{name}");
            assert_eq!(s.lease_duration_seconds, Some(15), "{name}");
            assert_eq!(s.renew_time, Some(MicroTime(now)), "{name}");
        }
    }
}

#[test]
fn a_renewed_lease_restarts_the_observation() {
    let first = held_by(Some(OTHER), Some(0), Some(15));
    let o = observe(None, Some(&first), t(0));
    // 14 s later the holder renewed: the content changed, so the wait starts over.
    let renewed = held_by(Some(OTHER), Some(14), Some(15));
    let o = observe(o, Some(&renewed), t(14));
    assert_eq!(o.as_ref().unwrap().at, t(14));
    assert_eq!(
        decide(Some(&renewed), o.as_ref(), ME, false, t(20), D),
        Decision::StandBy { holder: OTHER.into(), retry_in: Duration::from_secs(9) }
    );
    // Unchanged, the first sighting stays.
    let o2 = observe(o.clone(), Some(&renewed), t(25));
    assert_eq!(o2.unwrap().at, t(14));
    assert_eq!(observe(o, None, t(30)), None);
}

#[test]
fn release_clears_only_my_hold() {
    let mine = held_by(Some(ME), Some(-1), Some(15));
    let r = release(&mine, ME, t(0)).unwrap();
    assert_eq!(r.holder_identity, None);
    assert_eq!(r.acquire_time, None);
    assert_eq!(r.renew_time, Some(MicroTime(t(0))));
    assert_eq!(r.lease_transitions, Some(4));
    assert_eq!(r.lease_duration_seconds, Some(15));
    assert_eq!(release(&held_by(Some(OTHER), Some(-1), Some(15)), ME, t(0)), None);
    assert_eq!(release(&held_by(None, Some(-1), Some(15)), ME, t(0)), None);
    // A released lease is taken at once by the next candidate.
    assert!(matches!(decide(Some(&r), None, OTHER, false, t(0), D), Decision::Acquire(_)));
}

#[test]
fn lease_seconds_round_up() {
    assert_eq!(lease_seconds(Duration::from_millis(1_500)), 2);
    assert_eq!(lease_seconds(Duration::ZERO), 1);
    assert_eq!(lease_seconds(Duration::from_secs(15)), 15);
    assert_eq!(lease_seconds(Duration::from_secs(u64::MAX)), i32::MAX);
}

// ---- the loop, against the mock API server

const NS: &str = "brink-system";
const NAME: &str = "brink-operator";
const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/brink-system/leases/brink-operator";
const COLLECTION: &str = "/apis/coordination.k8s.io/v1/namespaces/brink-system/leases";

type MockHandle = Handle<Request<Body>, Response<Body>>;

fn mock_client() -> (Client, MockHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, NS), handle)
}

/// The next request, which must be `method path`; its JSON body (Null if none).
async fn expect(handle: &mut MockHandle, method: &str, path: &str) -> (Value, SendResponse<Response<Body>>) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(600), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no request came; expected {method} {path}"))
        .expect("the client was dropped");
    assert_eq!((req.method().as_str(), req.uri().path()), (method, path));
    let body = req.into_body().collect_bytes().await.unwrap();
    let json = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap() };
    (json, send)
}

fn respond(send: SendResponse<Response<Body>>, code: u16, body: &Value) {
    send.send_response(Response::builder().status(code).body(Body::from(serde_json::to_vec(body).unwrap())).unwrap());
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": format!("{reason} ({code})")})
}

fn lease(rv: &str, holder: Option<&str>, transitions: i32) -> Value {
    let mut spec = json!({"leaseDurationSeconds": 15, "leaseTransitions": transitions, "renewTime": "2027-01-15T08:00:00.000000Z"});
    if let Some(h) = holder {
        spec["holderIdentity"] = json!(h);
    }
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": NAME, "namespace": NS, "resourceVersion": rv}, "spec": spec})
}

/// The written Lease `body` is held by `holder` and carries resourceVersion `rv`.
fn assert_written(body: &Value, rv: Option<&str>, holder: Option<&str>, transitions: i64) {
    assert_eq!(body["metadata"]["name"], NAME, "{body}");
    assert_eq!(body["metadata"]["resourceVersion"].as_str(), rv, "{body}");
    assert_eq!(body["spec"]["holderIdentity"].as_str(), holder, "{body}");
    assert_eq!(body["spec"]["leaseDurationSeconds"], 15, "{body}");
    assert_eq!(body["spec"]["leaseTransitions"], transitions, "{body}");
    assert!(body["spec"]["renewTime"].is_string(), "{body}");
}

/// Work that runs until `finish` fires, and notes whether it was dropped (stopped).
fn work(
    finish: tokio::sync::oneshot::Receiver<u32>,
    started: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
) -> impl FnOnce() -> futures::future::BoxFuture<'static, u32> {
    struct OnDrop(Arc<AtomicBool>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    move || {
        Box::pin(async move {
            let _guard = OnDrop(dropped);
            started.store(true, Ordering::SeqCst);
            finish.await.unwrap_or(0)
        })
    }
}

struct Flags {
    started: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

fn flags() -> Flags {
    Flags { started: Arc::new(AtomicBool::new(false)), dropped: Arc::new(AtomicBool::new(false)) }
}

#[tokio::test(start_paused = true)]
async fn acquires_a_missing_lease_runs_the_work_and_releases_when_it_ends() {
    let (client, mut handle) = mock_client();
    let f = flags();
    let (finish, finish_rx) = tokio::sync::oneshot::channel();
    let (_stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_as_leader(client, NS, NAME, ME, D, work(finish_rx, f.started.clone(), f.dropped.clone()), async move {
        let _ = stop_rx.await;
    }));

    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 404, &status(404, "NotFound"));
    let (body, send) = expect(&mut handle, "POST", COLLECTION).await;
    assert_written(&body, None, Some(ME), 0);
    assert_eq!(body["metadata"]["namespace"], NS);
    assert!(!f.started.load(Ordering::SeqCst), "the work starts only once the Lease is ours");
    respond(send, 201, &lease("1", Some(ME), 0));

    tokio::task::yield_now().await;
    while !f.started.load(Ordering::SeqCst) {
        tokio::task::yield_now().await;
    }
    finish.send(7).unwrap();
    // Release: read, then clear the holder under the resourceVersion read.
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 200, &lease("1", Some(ME), 0));
    let (body, send) = expect(&mut handle, "PUT", PATH).await;
    assert_eq!(body["metadata"]["resourceVersion"], "1");
    assert!(body["spec"].get("holderIdentity").is_none(), "released: {body}");
    respond(send, 200, &lease("2", None, 0));

    let out = task.await.unwrap().unwrap();
    assert_eq!(out, Outcome::Finished { output: 7, released: true });
    assert!(handle.next_request().await.is_none(), "no request after the end");
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_duration_and_releases_on_shutdown() {
    let (client, mut handle) = mock_client();
    let f = flags();
    let (_finish, finish_rx) = tokio::sync::oneshot::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_as_leader(client, NS, NAME, ME, D, work(finish_rx, f.started.clone(), f.dropped.clone()), async move {
        let _ = stop_rx.await;
    }));

    // Held by me already (a restart with the same identity): renewed at once.
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 200, &lease("10", Some(ME), 3));
    let (body, send) = expect(&mut handle, "PUT", PATH).await;
    assert_written(&body, Some("10"), Some(ME), 3);
    respond(send, 200, &lease("11", Some(ME), 3));

    let start = tokio::time::Instant::now();
    for (read_rv, new_rv) in [("11", "12"), ("12", "13")] {
        let (_, send) = expect(&mut handle, "GET", PATH).await;
        respond(send, 200, &lease(read_rv, Some(ME), 3));
        let (body, send) = expect(&mut handle, "PUT", PATH).await;
        assert_written(&body, Some(read_rv), Some(ME), 3);
        respond(send, 200, &lease(new_rv, Some(ME), 3));
    }
    assert_eq!(start.elapsed(), Duration::from_secs(10), "two renewals, 5 s apart");
    assert!(f.started.load(Ordering::SeqCst));

    stop.send(()).unwrap();
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    assert!(f.dropped.load(Ordering::SeqCst), "the work is stopped before the Lease is released");
    respond(send, 200, &lease("13", Some(ME), 3));
    let (body, send) = expect(&mut handle, "PUT", PATH).await;
    assert_eq!(body["metadata"]["resourceVersion"], "13");
    assert!(body["spec"].get("holderIdentity").is_none(), "{body}");
    respond(send, 200, &lease("14", None, 3));
    assert_eq!(task.await.unwrap().unwrap(), Outcome::Shutdown { released: true });
}

#[tokio::test(start_paused = true)]
async fn a_conflict_on_renew_to_another_holder_stops_the_work() {
    let (client, mut handle) = mock_client();
    let f = flags();
    let (_finish, finish_rx) = tokio::sync::oneshot::channel();
    let task =
        tokio::spawn(run_as_leader(client, NS, NAME, ME, D, work(finish_rx, f.started.clone(), f.dropped.clone()), std::future::pending()));

    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 404, &status(404, "NotFound"));
    let (_, send) = expect(&mut handle, "POST", COLLECTION).await;
    respond(send, 201, &lease("1", Some(ME), 0));
    // The renewal: read (still mine), write, 409.
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 200, &lease("1", Some(ME), 0));
    let (body, send) = expect(&mut handle, "PUT", PATH).await;
    assert_written(&body, Some("1"), Some(ME), 0);
    respond(send, 409, &status(409, "Conflict"));
    // Read again: op-b holds it now.
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 200, &lease("2", Some(OTHER), 1));

    let out = task.await.unwrap().unwrap();
    assert_eq!(out, Outcome::Lost { holder: Some(OTHER.into()), why: "the Lease is held by op-b".into() });
    assert!(f.dropped.load(Ordering::SeqCst), "the work was stopped");
    assert!(handle.next_request().await.is_none(), "a lost Lease is not released (it is not ours)");
}

#[tokio::test(start_paused = true)]
async fn a_lost_create_race_stands_by_then_takes_over_an_expired_lease() {
    let (client, mut handle) = mock_client();
    let f = flags();
    let (_finish, finish_rx) = tokio::sync::oneshot::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_as_leader(client, NS, NAME, ME, D, work(finish_rx, f.started.clone(), f.dropped.clone()), async move {
        let _ = stop_rx.await;
    }));

    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 404, &status(404, "NotFound"));
    let (_, send) = expect(&mut handle, "POST", COLLECTION).await;
    respond(send, 409, &status(409, "AlreadyExists"));
    // Read at once: op-b created it. Stand by, looking every 5 s; it never changes.
    let start = tokio::time::Instant::now();
    for _ in 0..4 {
        let (_, send) = expect(&mut handle, "GET", PATH).await;
        assert!(!f.started.load(Ordering::SeqCst));
        respond(send, 200, &lease("5", Some(OTHER), 0));
    }
    assert_eq!(start.elapsed(), Duration::from_secs(15));
    // Unchanged for a full duration on my clock: take it, conditionally on what I read.
    let (body, send) = expect(&mut handle, "PUT", PATH).await;
    assert_written(&body, Some("5"), Some(ME), 1);
    respond(send, 200, &lease("6", Some(ME), 1));

    while !f.started.load(Ordering::SeqCst) {
        tokio::task::yield_now().await;
    }
    stop.send(()).unwrap();
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 200, &lease("6", Some(ME), 1));
    let (_, send) = expect(&mut handle, "PUT", PATH).await;
    respond(send, 500, &status(500, "InternalError"));
    assert_eq!(task.await.unwrap().unwrap(), Outcome::Shutdown { released: false });
}

#[tokio::test(start_paused = true)]
async fn renewals_that_keep_failing_give_up_before_a_successor_may_take_over() {
    let (client, mut handle) = mock_client();
    let f = flags();
    let (_finish, finish_rx) = tokio::sync::oneshot::channel();
    let task =
        tokio::spawn(run_as_leader(client, NS, NAME, ME, D, work(finish_rx, f.started.clone(), f.dropped.clone()), std::future::pending()));
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 404, &status(404, "NotFound"));
    let (_, send) = expect(&mut handle, "POST", COLLECTION).await;
    respond(send, 201, &lease("1", Some(ME), 0));
    let start = tokio::time::Instant::now();
    // The renewal at 5 s fails; the next would start at 10 s, when the deadline has come.
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 503, &status(503, "ServiceUnavailable"));
    let out = task.await.unwrap().unwrap();
    // 10 s without a renewal: two thirds of 15 s.
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    match out {
        Outcome::Lost { holder: None, why } => assert!(why.contains("not renewed for 10s") && why.contains("503"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(f.dropped.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn standby_errors_and_bad_input() {
    // Forbidden (RBAC without leases): a typed error naming the Lease, not a retry loop.
    let (client, mut handle) = mock_client();
    let task = tokio::spawn(run_as_leader(client, NS, NAME, ME, D, || async {}, std::future::pending()));
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 403, &status(403, "Forbidden"));
    let err = task.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("acquire Lease brink-system/brink-operator"), "{err}");

    // Shutdown while standing by: no write at all.
    let (client, mut handle) = mock_client();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run_as_leader(client, NS, NAME, ME, D, || async {}, async move {
        let _ = stop_rx.await;
    }));
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 200, &lease("5", Some(OTHER), 0));
    stop.send(()).unwrap();
    assert_eq!(task.await.unwrap().unwrap(), Outcome::Shutdown { released: false });
    assert!(handle.next_request().await.is_none());

    let (client, _handle) = mock_client();
    for (id, d, says) in [
        ("", D, "must not be empty"),
        (ME, Duration::from_secs(2), "must be from 3 s"),
        (ME, Duration::from_secs(1 << 32), "to 2147483647 s"),
    ] {
        let err = run_as_leader(client.clone(), NS, NAME, id, d, || async {}, std::future::pending()).await.unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_renewal_the_api_server_never_answers_stops_the_work_at_the_deadline() {
    let (client, mut handle) = mock_client();
    let f = flags();
    let (_finish, finish_rx) = tokio::sync::oneshot::channel();
    let task =
        tokio::spawn(run_as_leader(client, NS, NAME, ME, D, work(finish_rx, f.started.clone(), f.dropped.clone()), std::future::pending()));
    let (_, send) = expect(&mut handle, "GET", PATH).await;
    respond(send, 404, &status(404, "NotFound"));
    let (_, send) = expect(&mut handle, "POST", COLLECTION).await;
    respond(send, 201, &lease("1", Some(ME), 0));
    let start = tokio::time::Instant::now();
    // The renewal's read hangs: no answer is ever sent (kube's own timeout is minutes).
    let (_, _hung) = expect(&mut handle, "GET", PATH).await;
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(!f.dropped.load(Ordering::SeqCst), "the work keeps running while a renewal is in flight");
    let out = task.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(out, Outcome::Lost { holder: None, why: "not renewed for 10s: no answer from the API server".into() });
    assert!(f.dropped.load(Ordering::SeqCst));
}
