//! Events for `kubectl describe`: placements, replacements, deletions, failures. An Event that
//! cannot be written is logged and dropped: it never fails the reconcile that caused it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tracing::warn;

use super::context::Context;

/// A reference to a `ModelReplica` by name (for one already deleted or not read back).
pub fn replica_ref(namespace: &str, name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("brink.dev/v1alpha1".into()),
        kind: Some("ModelReplica".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// Events API limit on a note.
const MAX_NOTE: usize = 1024;

/// Publishes an Event about `on`. `related` names the other object it concerns (the replica a
/// deployment's Event is about): kube's recorder folds Events with the same reason, object and
/// related object into one series, so without it a second placement would only bump a count.
pub async fn publish(
    ctx: &Context,
    on: &ObjectReference,
    related: Option<ObjectReference>,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let mut note = note;
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let event = Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: related };
    if let Err(e) = ctx.recorder.publish(&event, on).await {
        warn!(reason, error = %e, "could not write an Event");
    }
}
