//! The node's heartbeat Lease (`coordination.k8s.io/v1`, `brink-node-<node>`): what the next
//! renew writes ([`next_step`], pure) and the renew itself ([`renew`]), with optimistic
//! concurrency: every write carries the resourceVersion it read, a 409 means someone wrote in
//! between, and the agent reads again instead of overwriting that write blindly.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

/// Reads and writes before a renew gives up on conflicts (each conflict is another writer's
/// newer write: the next round reads it).
pub const RENEW_ATTEMPTS: u32 = 4;

/// The Lease's name for `node`.
pub fn lease_name(node: &str) -> String {
    format!("brink-node-{node}")
}

#[derive(Clone, Debug, PartialEq)]
pub enum LeaseStep {
    /// No Lease yet.
    Create(Lease),
    /// Ours (or expired): the same object with the renew time moved, its resourceVersion kept.
    Replace(Lease),
    /// Another holder renewed it and it has not expired: leave it alone.
    HeldByOther { holder: String, renewed: Option<Timestamp> },
}

/// What renewing the Lease `current` (None: absent) as `holder` at `now` writes.
pub fn next_step(current: Option<&Lease>, name: &str, namespace: &str, holder: &str, duration_s: i32, now: Timestamp) -> LeaseStep {
    let Some(current) = current else {
        return LeaseStep::Create(Lease {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), ..ObjectMeta::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(duration_s),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        });
    };
    let spec = current.spec.clone().unwrap_or_default();
    let ours = spec.holder_identity.as_deref() == Some(holder);
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    if !ours && let Some(holder_now) = spec.holder_identity.as_deref().filter(|h| !h.is_empty()) {
        let their_duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(duration_s).max(0)));
        let expired = renewed.is_none_or(|t| t.checked_add(their_duration).is_ok_and(|until| until < now));
        if !expired {
            return LeaseStep::HeldByOther { holder: holder_now.into(), renewed };
        }
    }
    let mut next = current.clone();
    let transitions = spec.lease_transitions.unwrap_or(0);
    next.spec = Some(LeaseSpec {
        holder_identity: Some(holder.into()),
        lease_duration_seconds: Some(duration_s),
        acquire_time: if ours { spec.acquire_time.clone().or(Some(MicroTime(now))) } else { Some(MicroTime(now)) },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours { transitions } else { transitions.saturating_add(1) }),
        ..spec
    });
    LeaseStep::Replace(next)
}

#[derive(Clone, Debug, PartialEq)]
pub enum RenewOutcome {
    Created,
    Renewed,
    /// Another holder has it; nothing was written.
    HeldByOther {
        holder: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("Lease {namespace}/{name}: still conflicting after {attempts} read-and-retry rounds (another writer renews it)")]
    Conflicts { namespace: String, name: String, attempts: u32 },
}

/// Renews (or creates) the Lease: read, decide, write with the read resourceVersion; a 409
/// starts the round again from a fresh read.
pub async fn renew(
    api: &Api<Lease>,
    namespace: &str,
    holder: &str,
    duration_s: i32,
    now: impl Fn() -> Timestamp,
) -> Result<RenewOutcome, LeaseError> {
    let name = lease_name(holder);
    for _ in 0..RENEW_ATTEMPTS {
        let current = api.get_opt(&name).await?;
        let written = match next_step(current.as_ref(), &name, namespace, holder, duration_s, now()) {
            LeaseStep::HeldByOther { holder, .. } => return Ok(RenewOutcome::HeldByOther { holder }),
            LeaseStep::Create(lease) => api.create(&PostParams::default(), &lease).await.map(|_| RenewOutcome::Created),
            LeaseStep::Replace(lease) => api.replace(&name, &PostParams::default(), &lease).await.map(|_| RenewOutcome::Renewed),
        };
        match written {
            Ok(r) => return Ok(r),
            // 409: a stale resourceVersion, or another writer created it first: read again.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(LeaseError::Conflicts { namespace: namespace.into(), name, attempts: RENEW_ATTEMPTS })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: Option<i64>, duration: i32, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("brink-node-n1".into()),
                namespace: Some("brink".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                lease_duration_seconds: Some(duration),
                renew_time: renewed.map(|s| MicroTime(at(s))),
                acquire_time: Some(MicroTime(at(0))),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn table() {
        // (name, current, now, want: "create" | "replace <transitions> <acquired>" | "other")
        let cases: Vec<(&str, Option<Lease>, i64, &str)> = vec![
            ("absent: create", None, 100, "create"),
            ("ours: renew, keep acquire time", Some(lease(Some("n1"), Some(90), 40, 0)), 100, "replace 0 0"),
            ("ours long expired: still ours", Some(lease(Some("n1"), Some(0), 40, 2)), 1000, "replace 2 0"),
            ("other, fresh: leave it", Some(lease(Some("n2"), Some(90), 40, 0)), 100, "other"),
            ("other, exactly at expiry: still theirs", Some(lease(Some("n2"), Some(60), 40, 0)), 100, "other"),
            ("other, expired: take over", Some(lease(Some("n2"), Some(59), 40, 3)), 100, "replace 4 100"),
            ("other, never renewed: take over", Some(lease(Some("n2"), None, 40, 0)), 100, "replace 1 100"),
            ("no holder: take", Some(lease(None, Some(99), 40, 0)), 100, "replace 1 100"),
            ("empty holder: take", Some(lease(Some(""), Some(99), 40, 0)), 100, "replace 1 100"),
        ];
        for (name, current, now, want) in cases {
            let step = next_step(current.as_ref(), "brink-node-n1", "brink", "n1", 40, at(now));
            let got = match &step {
                LeaseStep::Create(l) => {
                    let s = l.spec.as_ref().unwrap();
                    assert_eq!(l.metadata.namespace.as_deref(), Some("brink"), "{name}");
                    assert_eq!((s.renew_time.clone(), s.lease_duration_seconds), (Some(MicroTime(at(now))), Some(40)), "{name}");
                    "create".to_string()
                }
                LeaseStep::Replace(l) => {
                    let s = l.spec.as_ref().unwrap();
                    assert_eq!(l.metadata.resource_version.as_deref(), Some("7"), "{name}: the read version must be kept");
                    assert_eq!(s.holder_identity.as_deref(), Some("n1"), "{name}");
                    assert_eq!(s.renew_time, Some(MicroTime(at(now))), "{name}");
                    let acquired = s.acquire_time.as_ref().unwrap().0.as_second() - 1_800_000_000;
                    format!("replace {} {acquired}", s.lease_transitions.unwrap())
                }
                LeaseStep::HeldByOther { holder, .. } => {
                    assert_eq!(holder, "n2", "{name}");
                    "other".to_string()
                }
            };
            assert_eq!(got, want, "{name}");
        }
    }
}
