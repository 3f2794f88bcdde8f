//! The heartbeat: a renew that meets a 409 reads the Lease again and retries with the new
//! resourceVersion; a Lease another holder renewed meanwhile is left alone.

use serde_json::{Value, json};

use super::*;

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/brink/leases/brink-node-n1";

fn lease(rv: &str, holder: &str, renewed: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": "brink-node-n1", "namespace": "brink", "resourceVersion": rv },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 40,
            "acquireTime": "2027-01-15T07:00:00.000000Z",
            "renewTime": renewed,
            "leaseTransitions": 0
        }
    })
}

#[tokio::test]
async fn a_conflict_is_read_again_and_retried() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.heartbeat().await });
    api.expect("GET", LEASE, 200, lease("5", "n1", "2027-01-15T07:59:50.000000Z")).await;
    let first = api
        .expect(
            "PUT",
            &format!("{LEASE}?"),
            409,
            status(
                409,
                "Conflict",
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"brink-node-n1\": the object has been modified",
            ),
        )
        .await;
    assert_eq!(first.body["metadata"]["resourceVersion"], "5");
    assert_eq!(first.body["spec"]["renewTime"], "2027-01-15T08:00:00.000000Z");
    // Someone (a restarted agent of this node) renewed in between: read it, then write on top of it.
    api.expect("GET", LEASE, 200, lease("6", "n1", "2027-01-15T07:59:58.000000Z")).await;
    let second = api.expect("PUT", &format!("{LEASE}?"), 200, lease("7", "n1", "2027-01-15T08:00:00.000000Z")).await;
    assert_eq!(second.body["metadata"]["resourceVersion"], "6", "the retry must carry the version it read, not force");
    assert_eq!(second.body["spec"]["holderIdentity"], "n1");
    assert_eq!(second.body["spec"]["acquireTime"], "2027-01-15T07:00:00.000000Z");
    assert_eq!(second.body["spec"]["renewTime"], "2027-01-15T08:00:00.000000Z");
    let st = api
        .expect("PATCH", "/apis/brink.dev/v1alpha1/sparknodes/n1/status?&force=true&fieldManager=brink-agent", 200, spark_node(&[], None))
        .await;
    assert_eq!(st.body["status"]["lastHeartbeatTime"], NOW_TEXT);
    finish(task).await.unwrap();
}

#[tokio::test]
async fn a_newer_renew_by_another_holder_is_not_overwritten() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.heartbeat().await });
    api.expect("GET", LEASE, 200, lease("5", "n1", "2027-01-15T07:59:50.000000Z")).await;
    api.expect("PUT", &format!("{LEASE}?"), 409, status(409, "Conflict", "the object has been modified")).await;
    api.expect("GET", LEASE, 200, lease("6", "impostor", "2027-01-15T07:59:59.000000Z")).await;
    // No write follows: the heartbeat reports the other holder.
    let err = finish(task).await.unwrap_err().to_string();
    assert!(err.contains("held by \"impostor\""), "{err}");
}

#[tokio::test]
async fn endless_conflicts_give_up_with_a_reason() {
    let (agent, mut api) = agent();
    let task = tokio::spawn(async move { agent.heartbeat().await });
    for rv in 0..crate::cluster::lease::RENEW_ATTEMPTS {
        api.expect("GET", LEASE, 200, lease(&rv.to_string(), "n1", "2027-01-15T07:59:50.000000Z")).await;
        api.expect("PUT", &format!("{LEASE}?"), 409, status(409, "Conflict", "the object has been modified")).await;
    }
    let err = finish(task).await.unwrap_err().to_string();
    assert!(err.contains("still conflicting after 4 read-and-retry rounds"), "{err}");
}
