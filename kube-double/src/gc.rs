//! Deletion as the API server and the garbage collector do it together: finalizers hold an object
//! (with a `deletionTimestamp`) until they are removed; once an owner is gone, its dependents are
//! deleted (background), stripped of the reference (orphan, or when another owner lives), or
//! deleted before the owner (foreground: the owner waits with the `foregroundDeletion` finalizer
//! until no dependent is left). The collector runs inside the request, so tests need no waiting.

use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::state::State;
use crate::store::ObjectKey;

/// The finalizer an owner waits with while its dependents are deleted first.
pub const FOREGROUND: &str = "foregroundDeletion";

/// How deleting an owner treats its dependents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// The owner goes now; dependents are collected after it.
    Background,
    /// Dependents go first; the owner stays (finalizer `foregroundDeletion`) until they are gone.
    Foreground,
    /// Dependents lose their ownerReference and stay.
    Orphan,
}

impl Propagation {
    pub fn parse(s: Option<&str>) -> ApiResult<Self> {
        match s {
            None | Some("Background") => Ok(Self::Background),
            Some("Foreground") => Ok(Self::Foreground),
            Some("Orphan") => Ok(Self::Orphan),
            Some(other) => Err(ApiError::bad_request(format!("unknown propagationPolicy {other:?} (Background, Foreground, Orphan)"))),
        }
    }
}

fn uid_of(obj: &Value) -> Option<String> {
    obj.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string)
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|f| f.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(|refs| refs.iter().filter_map(|r| r.get("uid").and_then(Value::as_str)).map(str::to_string).collect())
        .unwrap_or_default()
}

/// Deletes a stored object; returns it as the DELETE response shows it (removed, or marked for
/// deletion while finalizers remain). `None` when it does not exist.
pub fn delete_object(st: &mut State, key: &ObjectKey, policy: Propagation) -> Option<Value> {
    let existing = st.store.get(key)?.clone();
    let uid = uid_of(&existing).unwrap_or_default();
    if policy == Propagation::Orphan {
        // The API server's `orphan` finalizer, run at once: dependents let go before anything else.
        collect_dependents(st, &uid, Propagation::Orphan);
    }
    let mut fins = finalizers(&existing);
    let foreground = policy == Propagation::Foreground && !st.store.dependents_of(&uid).is_empty();
    if foreground && !fins.iter().any(|f| f == FOREGROUND) {
        fins.push(FOREGROUND.to_string());
    }
    if fins.is_empty() {
        return remove_object_with(st, key, policy);
    }
    let already_deleting = existing.pointer("/metadata/deletionTimestamp").is_some();
    let mut response = existing.clone();
    if !already_deleting || fins != finalizers(&existing) {
        let mut marked = existing.clone();
        marked["metadata"]["finalizers"] = json!(fins);
        if !already_deleting {
            marked["metadata"]["deletionTimestamp"] = json!(st.clock.now());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            let g = existing.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            marked["metadata"]["generation"] = json!(g + 1);
        }
        response = st.store.put(key.clone(), marked);
    }
    if foreground {
        collect_dependents(st, &uid, Propagation::Foreground);
        release_if_unblocked(st, &uid);
    }
    // The owner as the request left it (a foreground owner may already be gone with its dependents).
    Some(st.store.get(key).cloned().unwrap_or(response))
}

/// Removes an object whose finalizers are all gone, then collects its dependents (background).
pub fn remove_object(st: &mut State, key: &ObjectKey) -> Option<Value> {
    remove_object_with(st, key, Propagation::Background)
}

fn remove_object_with(st: &mut State, key: &ObjectKey, policy: Propagation) -> Option<Value> {
    let removed = st.store.remove(key)?;
    if let Some(uid) = uid_of(&removed) {
        collect_dependents(st, &uid, policy);
    }
    // An owner waiting in foreground deletion may have lost its last dependent.
    for owner in owner_uids(&removed) {
        release_if_unblocked(st, &owner);
    }
    Some(removed)
}

/// The garbage collector's pass over the dependents of `uid`, which is gone or going.
fn collect_dependents(st: &mut State, uid: &str, policy: Propagation) {
    for key in st.store.dependents_of(uid) {
        let Some(dep) = st.store.get(&key).cloned() else { continue };
        let other_owner_lives = owner_uids(&dep).iter().any(|u| u != uid && st.store.find_uid(u).is_some());
        if policy == Propagation::Orphan || other_owner_lives {
            let refs: Vec<Value> = dep
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter(|r| r.get("uid").and_then(Value::as_str) != Some(uid)).cloned().collect())
                .unwrap_or_default();
            let mut kept = dep;
            kept["metadata"]["ownerReferences"] = Value::Array(refs);
            st.store.put(key, kept);
            continue;
        }
        let dep_policy = if policy == Propagation::Foreground { Propagation::Foreground } else { Propagation::Background };
        delete_object(st, &key, dep_policy);
    }
}

/// An owner in foreground deletion with no dependents left loses `foregroundDeletion` (and is
/// removed when that was its last finalizer).
fn release_if_unblocked(st: &mut State, uid: &str) {
    let Some((key, owner)) = st.store.find_uid(uid).map(|(k, v)| (k.clone(), v.clone())) else { return };
    let fins = finalizers(&owner);
    if !fins.iter().any(|f| f == FOREGROUND) || !st.store.dependents_of(uid).is_empty() {
        return;
    }
    let rest: Vec<String> = fins.into_iter().filter(|f| f != FOREGROUND).collect();
    if rest.is_empty() {
        remove_object_with(st, &key, Propagation::Background);
    } else {
        let mut released = owner;
        released["metadata"]["finalizers"] = json!(rest);
        st.store.put(key, released);
    }
}
