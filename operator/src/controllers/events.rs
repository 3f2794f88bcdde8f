//! Events for `kubectl describe`: placements, replacements, deletions, failures. An Event that
//! cannot be written is logged and dropped: it never fails the reconcile that caused it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tracing::warn;

use super::context::Context;

/// Events API limit on a note.
const MAX_NOTE: usize = 1024;

pub async fn publish(ctx: &Context, on: &ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
    let mut note = note;
    if note.len() > MAX_NOTE {
        let mut cut = MAX_NOTE - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    let event = Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&event, on).await {
        warn!(reason, error = %e, "could not write an Event");
    }
}
