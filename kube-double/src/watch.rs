//! Watches: the initial events (synthetic ADDED for the current state, or the history after a
//! resourceVersion), then every matching change as it is committed, as JSON lines, until the
//! client goes away or `timeoutSeconds` pass on tokio's clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::json;
use tokio::sync::mpsc;

use crate::error::{ApiError, ApiResult};
use crate::state::State;
use crate::store::{WatchFilter, event_line};

/// A real API server closes a watch after 30 to 60 minutes when the client names no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    pub resource_version: Option<String>,
    pub bookmarks: bool,
    pub send_initial_events: bool,
    pub timeout: Option<Duration>,
}

fn bookmark(api_version: &str, kind: &str, rv: u64, initial_events_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line("BOOKMARK", &json!({"apiVersion": api_version, "kind": kind, "metadata": meta}))
}

/// Opens a watch: computes the initial events and registers for the rest under one lock, so no
/// change can fall between them.
pub fn open(
    state: &Arc<Mutex<State>>,
    filter: WatchFilter,
    params: WatchParams,
    api_version: String,
    kind: String,
) -> ApiResult<BoxStream<'static, Bytes>> {
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let mut initial: Vec<Bytes> = Vec::new();
    {
        let mut st = state.lock().map_err(|_| ApiError::new(500, "InternalError", "the double's state lock is poisoned"))?;
        let from = match params.resource_version.as_deref() {
            None | Some("") | Some("0") => None,
            Some(rv) => Some(rv.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?),
        };
        if params.send_initial_events || from.is_none() {
            for (key, obj) in st.store.list(&filter.group, &filter.plural, filter.namespace.as_deref()) {
                if filter.matches(key, obj) {
                    initial.push(event_line("ADDED", obj));
                }
            }
            if params.send_initial_events {
                initial.push(bookmark(&api_version, &kind, st.store.resource_version(), true));
            }
        } else if let Some(rv) = from {
            match st.store.events_since(rv, &filter) {
                Some(events) => initial.extend(events.iter().map(|(t, o)| event_line(t, o))),
                None => {
                    // As the API server: 200, then one ERROR event carrying 410 Gone.
                    let floor = st.store.history_floor();
                    let err = ApiError::gone(format!("too old resource version: {rv} ({floor})"));
                    return Ok(stream::iter(vec![event_line("ERROR", &err.status_body())]).boxed());
                }
            }
        }
        st.store.add_watcher(filter, tx);
    }
    let timeout = params.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let live = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let deadline = tokio::time::sleep(timeout);
    let state = Arc::clone(state);
    let closing = stream::once(async move {
        // A bookmark at the end lets a resuming client start from the newest resourceVersion.
        let rv = state.lock().map(|st| st.store.resource_version()).unwrap_or(0);
        (params.bookmarks, rv)
    })
    .filter_map(move |(wanted, rv)| {
        let line = wanted.then(|| bookmark(&api_version, &kind, rv, false));
        async move { line }
    });
    let body = stream::iter(initial).chain(live.take_until(deadline)).chain(closing);
    Ok(body.boxed())
}

/// `timeoutSeconds` from the query.
pub fn parse_timeout(v: Option<&str>) -> ApiResult<Option<Duration>> {
    v.map(|s| s.parse::<u64>().map(Duration::from_secs).map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {s:?}"))))
        .transpose()
}
