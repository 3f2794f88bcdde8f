//! The stored objects, the resourceVersion counter, the event history watches resume from, and the
//! open watches. Every change goes through [`Store::put`] or [`Store::remove`], so each one gets the
//! next resourceVersion and reaches every watch exactly once, in order.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::selector::{FieldSelector, LabelSelector};

/// Objects are stored per (group, plural), independent of the version they were written through.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub group: String,
    pub plural: String,
    /// `""` for cluster-scoped kinds.
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone)]
pub struct HistoryEvent {
    pub rv: u64,
    pub key: ObjectKey,
    /// The object before the change (`None` for a creation).
    pub previous: Option<Value>,
    /// The object after the change (for a deletion: the last state, with the deletion's resourceVersion).
    pub object: Value,
    pub deleted: bool,
}

impl HistoryEvent {
    /// The event a watch with `filter` sees, if any. As the API server's watch cache does, an
    /// object that starts matching a selector arrives as ADDED and one that stops matching
    /// leaves as DELETED.
    pub fn seen_by(&self, filter: &WatchFilter) -> Option<&'static str> {
        let before = self.previous.as_ref().is_some_and(|p| filter.matches(&self.key, p));
        let after = filter.matches(&self.key, &self.object);
        match (before, after, self.deleted) {
            (_, true, true) => Some("DELETED"),
            (true, true, false) => Some("MODIFIED"),
            (false, true, false) => Some("ADDED"),
            (true, false, _) => Some("DELETED"),
            (false, false, _) => None,
        }
    }
}

/// What one watch receives.
#[derive(Debug, Clone)]
pub struct WatchFilter {
    pub group: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchFilter {
    pub fn matches(&self, key: &ObjectKey, obj: &Value) -> bool {
        key.group == self.group
            && key.plural == self.plural
            && self.namespace.as_ref().is_none_or(|ns| *ns == key.namespace)
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }
}

struct Watcher {
    filter: WatchFilter,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// One watch event as a JSON line.
pub fn event_line(event_type: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

pub struct Store {
    objects: BTreeMap<ObjectKey, Value>,
    rv: u64,
    history: VecDeque<HistoryEvent>,
    /// Every event with a resourceVersion above this is in `history`.
    history_floor: u64,
    history_limit: usize,
    watchers: Vec<Watcher>,
}

impl Default for Store {
    fn default() -> Self {
        Self { objects: BTreeMap::new(), rv: 0, history: VecDeque::new(), history_floor: 0, history_limit: 10_000, watchers: Vec::new() }
    }
}

impl Store {
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn history_floor(&self) -> u64 {
        self.history_floor
    }

    pub fn set_history_limit(&mut self, limit: usize) {
        self.history_limit = limit;
        self.trim_history();
    }

    /// Forgets the event history, as etcd compaction does: watches from any earlier resourceVersion get 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.history_floor = self.rv;
    }

    fn trim_history(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(e) = self.history.pop_front() {
                self.history_floor = e.rv;
            }
        }
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of one resource, in (namespace, name) order.
    pub fn list(&self, group: &str, plural: &str, namespace: Option<&str>) -> Vec<(&ObjectKey, &Value)> {
        self.objects
            .iter()
            .filter(|(k, _)| k.group == group && k.plural == plural && namespace.is_none_or(|ns| ns == k.namespace))
            .collect()
    }

    pub fn find_uid(&self, uid: &str) -> Option<(&ObjectKey, &Value)> {
        self.objects.iter().find(|(_, v)| v.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid))
    }

    /// Objects with an ownerReference to `uid`.
    pub fn dependents_of(&self, uid: &str) -> Vec<ObjectKey> {
        self.objects
            .iter()
            .filter(|(_, v)| {
                v.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| r.get("uid").and_then(Value::as_str) == Some(uid)))
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores `obj` under the next resourceVersion and tells the watches. Returns the stored object.
    pub fn put(&mut self, key: ObjectKey, mut obj: Value) -> Value {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let previous = self.objects.insert(key.clone(), obj.clone());
        self.record(HistoryEvent { rv, key, previous, object: obj.clone(), deleted: false });
        obj
    }

    /// Removes the object; its DELETED event carries a fresh resourceVersion.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Value> {
        let mut obj = self.objects.remove(key)?;
        let rv = self.next_rv();
        let previous = Some(obj.clone());
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(HistoryEvent { rv, key: key.clone(), previous, object: obj.clone(), deleted: true });
        Some(obj)
    }

    fn record(&mut self, event: HistoryEvent) {
        self.watchers.retain(|w| match event.seen_by(&w.filter) {
            Some(event_type) => w.tx.send(event_line(event_type, &event.object)).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push_back(event);
        self.trim_history();
    }

    /// The events after `rv` a watch with `filter` sees, as (type, object); `None` when that part
    /// of the history is gone.
    pub fn events_since(&self, rv: u64, filter: &WatchFilter) -> Option<Vec<(&'static str, &Value)>> {
        if rv < self.history_floor {
            return None;
        }
        Some(self.history.iter().filter(|e| e.rv > rv).filter_map(|e| e.seen_by(filter).map(|t| (t, &e.object))).collect())
    }

    pub fn add_watcher(&mut self, filter: WatchFilter, tx: mpsc::UnboundedSender<Bytes>) {
        self.watchers.push(Watcher { filter, tx });
    }

    /// Open watches (closed ones are dropped at the next event).
    pub fn watcher_count(&self) -> usize {
        self.watchers.iter().filter(|w| !w.tx.is_closed()).count()
    }
}
