//! What a candidate does with the Lease it just read: create it, take it, renew it, wait, or
//! notice that it lost it. Pure: the time and the previous observation are inputs.
//!
//! Expiry of another holder's Lease is judged on this candidate's own clock, from when it first
//! saw the Lease's current content, never from the `renewTime` the holder wrote: clocks of two
//! hosts disagree, and a holder whose clock runs behind would otherwise look expired while it
//! still renews (the rule client-go follows). A new candidate therefore waits one full lease
//! duration before it takes over a Lease it has never seen change, unless the holder released
//! it (an empty `holderIdentity`), which takes effect at once.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The Lease's content as last seen, and when this candidate first saw it so.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub spec: LeaseSpec,
    pub at: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// No Lease: create it, held by me.
    Create(LeaseSpec),
    /// Released or expired: take it over (replace, with the resourceVersion read).
    Acquire(LeaseSpec),
    /// Mine: renew it (replace, with the resourceVersion read).
    Renew(LeaseSpec),
    /// Someone else holds it and it has not expired: look again in `retry_in`.
    StandBy { holder: String, retry_in: Duration },
    /// I was leading and someone else holds it now: stop the work at once.
    Lost { holder: String },
}

/// The Lease's `leaseDurationSeconds` for `duration`: whole seconds, rounded up, at least 1.
pub fn lease_seconds(duration: Duration) -> i32 {
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i32::try_from(secs.max(1)).unwrap_or(i32::MAX)
}

/// Updates the observation with the Lease just read (`None`: there is none).
pub fn observe(previous: Option<Observed>, read: Option<&LeaseSpec>, now: Timestamp) -> Option<Observed> {
    let read = read?;
    match previous {
        Some(p) if p.spec == *read => Some(p),
        _ => Some(Observed { spec: read.clone(), at: now }),
    }
}

fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// Decides for candidate `me`, `leading` or not, at `now`, wanting a lease of `duration`.
/// `observed` should come from [`observe`] with the same `read`.
pub fn decide(
    read: Option<&LeaseSpec>,
    observed: Option<&Observed>,
    me: &str,
    leading: bool,
    now: Timestamp,
    duration: Duration,
) -> Decision {
    let mine = |previous: Option<&LeaseSpec>, acquired: bool| {
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        let keep = previous.cloned().unwrap_or_default();
        LeaseSpec {
            holder_identity: Some(me.to_string()),
            lease_duration_seconds: Some(lease_seconds(duration)),
            acquire_time: if acquired { Some(MicroTime(now)) } else { keep.acquire_time.or(Some(MicroTime(now))) },
            renew_time: Some(MicroTime(now)),
            // Counts changes of holder; a first holder of a new Lease is transition 0.
            lease_transitions: Some(if acquired && previous.is_some() { transitions.saturating_add(1) } else { transitions }),
            preferred_holder: keep.preferred_holder,
            strategy: keep.strategy,
        }
    };
    let Some(spec) = read else {
        return Decision::Create(mine(None, true));
    };
    match holder(spec) {
        Some(h) if h == me => Decision::Renew(mine(Some(spec), false)),
        None => Decision::Acquire(mine(Some(spec), true)),
        Some(h) if leading => Decision::Lost { holder: h.to_string() },
        Some(h) => {
            let seen_at = observed.filter(|o| o.spec == *spec).map_or(now, |o| o.at);
            // The holder's own duration, not mine: it renews on its schedule.
            let held_for = match spec.lease_duration_seconds {
                Some(s) if s > 0 => Duration::from_secs(s as u64),
                _ => duration,
            };
            let elapsed = now.duration_since(seen_at);
            let left = SignedDuration::try_from(held_for).unwrap_or(SignedDuration::MAX) - elapsed;
            if left <= SignedDuration::ZERO {
                Decision::Acquire(mine(Some(spec), true))
            } else {
                Decision::StandBy { holder: h.to_string(), retry_in: left.unsigned_abs() }
            }
        }
    }
}

/// The Lease released by `me` (no holder, so a successor takes it at once), or `None` when it
/// is not mine to release.
pub fn release(spec: &LeaseSpec, me: &str, now: Timestamp) -> Option<LeaseSpec> {
    (holder(spec) == Some(me)).then(|| LeaseSpec {
        holder_identity: None,
        acquire_time: None,
        renew_time: Some(MicroTime(now)),
        ..spec.clone()
    })
}
