//! Status conditions as the Kubernetes API conventions define them: `type`, `status`
//! (`True`/`False`/`Unknown`), a CamelCase `reason`, a human `message`, the `observedGeneration`
//! they were computed from and the `lastTransitionTime` of their status. Positive polarity: a
//! condition names what is good (`Ready`, `Qualified`, `Progressing`) or what a reader must act on
//! (`Degraded`, `Stalled`) so that `True` always means the named state holds.
//!
//! The helpers are pure (the caller passes `now`) so controllers and tests share them.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition types brink writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionType {
    /// Serving (replica, deployment) or able to host replicas (node); a model whose file is cached somewhere.
    Ready,
    /// The node passed the self-test for a shape class (clamped counts as qualified).
    Qualified,
    /// A rollout, download or load is moving forward.
    Progressing,
    /// Working below what was asked (fewer ready replicas, a clamped envelope).
    Degraded,
    /// Work is pending and no progress is made (the engine's progress heartbeat stopped).
    Stalled,
    /// A deployment's replica passed its qualification clamped: it serves, but admits only
    /// prompts shorter than the deployment's context (the message names the replica and the
    /// admitted token count). Absent while no replica is clamped.
    Clamped,
}

impl ConditionType {
    pub const ALL: [ConditionType; 6] = [
        ConditionType::Ready,
        ConditionType::Qualified,
        ConditionType::Progressing,
        ConditionType::Degraded,
        ConditionType::Stalled,
        ConditionType::Clamped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::Ready => "Ready",
            ConditionType::Qualified => "Qualified",
            ConditionType::Progressing => "Progressing",
            ConditionType::Degraded => "Degraded",
            ConditionType::Stalled => "Stalled",
            ConditionType::Clamped => "Clamped",
        }
    }
}

/// A condition's `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

impl ConditionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(b: bool) -> ConditionStatus {
        if b { ConditionStatus::True } else { ConditionStatus::False }
    }
}

/// A reason that breaks the convention (`CamelCase`, letters first, no spaces): the API server
/// rejects such a condition, so it is caught where it is built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadReason(pub String);

impl std::fmt::Display for BadReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "condition reason {:?} is not CamelCase (letters, digits, `_`, `,`, `:`; starting with a letter)", self.0)
    }
}

impl std::error::Error for BadReason {}

/// The API server's pattern for `reason`: `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024 characters.
fn valid_reason(reason: &str) -> bool {
    let b = reason.as_bytes();
    let body = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':');
    !b.is_empty()
        && b.len() <= 1024
        && b[0].is_ascii_alphabetic()
        && b.iter().all(body)
        && b.last().is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Builds a condition; `now` becomes its `lastTransitionTime` unless [`set_condition`] keeps an
/// older one because the status did not change.
pub fn condition(
    type_: ConditionType,
    status: ConditionStatus,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Time,
) -> Result<Condition, BadReason> {
    if !valid_reason(reason) {
        return Err(BadReason(reason.to_string()));
    }
    Ok(Condition {
        type_: type_.as_str().to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: message.into(),
        observed_generation,
        last_transition_time: now,
    })
}

/// Sets `update` in `conditions` (one entry per type). The transition time moves only when the
/// status changes: a reader can tell how long a node has been not-Ready, however often the
/// reason or message is rewritten. Returns whether anything changed (so a controller can skip a
/// status write that would change nothing).
pub fn set_condition(conditions: &mut Vec<Condition>, update: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == update.type_) {
        None => {
            conditions.push(update);
            true
        }
        Some(existing) => {
            let last_transition_time =
                if existing.status == update.status { existing.last_transition_time.clone() } else { update.last_transition_time.clone() };
            let next = Condition { last_transition_time, ..update };
            let changed = *existing != next;
            *existing = next;
            changed
        }
    }
}

pub fn find_condition(conditions: &[Condition], type_: ConditionType) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == type_.as_str())
}

/// True when the condition is present with status `True` (absent or `Unknown` is not true).
pub fn is_true(conditions: &[Condition], type_: ConditionType) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    fn ready(status: ConditionStatus, reason: &str, gen_: i64, t: i64) -> Condition {
        condition(ConditionType::Ready, status, reason, format!("{reason} at {t}"), Some(gen_), at(t)).unwrap()
    }

    #[test]
    fn transition_time_moves_only_with_the_status() {
        let mut cs = Vec::new();
        assert!(set_condition(&mut cs, ready(ConditionStatus::False, "Downloading", 1, 0)));
        // Same status, new reason: reason/message/generation follow, the transition time stays.
        assert!(set_condition(&mut cs, ready(ConditionStatus::False, "Loading", 2, 10)));
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].reason, "Loading");
        assert_eq!(cs[0].observed_generation, Some(2));
        assert_eq!(cs[0].last_transition_time, at(0));
        // Status flips: the transition time moves.
        assert!(set_condition(&mut cs, ready(ConditionStatus::True, "Serving", 2, 20)));
        assert_eq!(cs[0].last_transition_time, at(20));
        assert!(is_true(&cs, ConditionType::Ready));
        // Rewriting the identical condition later is no change at all.
        let same = Condition { last_transition_time: at(30), ..cs[0].clone() };
        assert!(!set_condition(&mut cs, same));
        assert_eq!(cs[0].last_transition_time, at(20));
    }

    #[test]
    fn one_entry_per_type() {
        let mut cs = Vec::new();
        for (i, t) in ConditionType::ALL.iter().enumerate() {
            let c = condition(*t, ConditionStatus::Unknown, "Pending", "", None, at(i as i64)).unwrap();
            assert!(set_condition(&mut cs, c));
        }
        assert_eq!(cs.len(), ConditionType::ALL.len());
        assert!(!is_true(&cs, ConditionType::Stalled), "Unknown is not True");
        assert_eq!(find_condition(&cs, ConditionType::Degraded).map(|c| c.type_.as_str()), Some("Degraded"));
        assert!(find_condition(&[], ConditionType::Ready).is_none());
    }

    #[test]
    fn reasons_follow_the_api_servers_pattern() {
        for good in ["Serving", "NotQualified", "A", "Clamped_8191", "Node:gone,cordoned"] {
            assert!(condition(ConditionType::Ready, ConditionStatus::True, good, "", None, at(0)).is_ok(), "{good}");
        }
        for bad in ["", "not qualified", "9Lives", "Ends,", "Ends:", "Tab\tHere", &"A".repeat(1025)] {
            let err = condition(ConditionType::Ready, ConditionStatus::True, bad, "", None, at(0)).unwrap_err();
            assert!(err.to_string().contains("not CamelCase"), "{err}");
        }
    }
}
