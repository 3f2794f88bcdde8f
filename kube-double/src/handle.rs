//! The test handle: a client wired to the double, seeding, injected faults, the request log, and
//! the watch history.

use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::kinds::KindRegistry;
use crate::ops::{Target, WriteOptions, create};
use crate::service::DoubleService;
use crate::state::{Fault, RecordedRequest, State};

/// One in-memory API server; clones share it.
#[derive(Clone)]
pub struct KubeDouble {
    service: DoubleService,
}

impl Default for KubeDouble {
    fn default() -> Self {
        Self::new()
    }
}

impl KubeDouble {
    /// The built-in kinds plus brink's CRDs.
    pub fn new() -> Self {
        Self::with_registry(KindRegistry::standard())
    }

    pub fn with_registry(registry: KindRegistry) -> Self {
        Self { service: DoubleService { state: Arc::new(Mutex::new(State::new(registry))) } }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a test already panicked; the data is still what it was.
        self.service.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves another CRD (every served version).
    pub fn add_crd(&self, crd: &CustomResourceDefinition) {
        self.state().registry.add_crd(crd);
    }

    /// A `kube::Client` whose requests this double serves; default namespace `default`.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.service.clone(), "default")
    }

    pub fn service(&self) -> DoubleService {
        self.service.clone()
    }

    /// Stores an object as a create would (uid, resourceVersion, generation 1, timestamps,
    /// schema defaults, an `Update` managedFields entry for `seed`) but keeps its status, and
    /// emits ADDED. Its `metadata.namespace` picks the namespace of a namespaced kind.
    pub fn seed<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned>(&self, obj: &K) -> ApiResult<K> {
        let v = serde_json::to_value(obj).map_err(|e| ApiError::bad_request(format!("seed: the object does not serialise: {e}")))?;
        let stored = self.seed_value(v)?;
        serde_json::from_value(stored).map_err(|e| ApiError::bad_request(format!("seed: the stored object does not deserialise: {e}")))
    }

    /// [`KubeDouble::seed`] for an untyped object (`apiVersion` and `kind` required).
    pub fn seed_value(&self, obj: Value) -> ApiResult<Value> {
        let mut st = self.state();
        let api_version =
            obj.get("apiVersion").and_then(Value::as_str).ok_or_else(|| ApiError::bad_request("seed: apiVersion is required"))?;
        let kind_name = obj.get("kind").and_then(Value::as_str).ok_or_else(|| ApiError::bad_request("seed: kind is required"))?;
        let kind = st.registry.by_kind(api_version, kind_name)?.clone();
        let namespace = obj.pointer("/metadata/namespace").and_then(Value::as_str).map(str::to_string);
        if kind.namespaced && namespace.is_none() {
            return Err(ApiError::bad_request(format!("seed: {kind_name} is namespaced: metadata.namespace is required")));
        }
        let t = Target { kind: &kind, namespace: if kind.namespaced { namespace.as_deref() } else { None } };
        let opts = WriteOptions { manager: "seed".into(), force: false, dry_run: true };
        let mut created = create(&mut st, &t, obj.clone(), &opts)?;
        if let Some(status) = obj.get("status") {
            created["status"] = status.clone();
        }
        let name = created.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        Ok(st.store.put(t.key(&name), created))
    }

    /// The stored object, if any (`namespace` ignored for cluster-scoped kinds).
    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(&self, namespace: Option<&str>, name: &str) -> Option<K> {
        let v = self.get_value(&K::group(&()), &K::plural(&()), namespace, name)?;
        serde_json::from_value(v).ok()
    }

    pub fn get_value(&self, group: &str, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let st = self.state();
        st.store
            .list(group, plural, None)
            .into_iter()
            .find(|(k, _)| k.name == name && (k.namespace.is_empty() || Some(k.namespace.as_str()) == namespace))
            .map(|(_, v)| v.clone())
    }

    /// The next `times` requests whose path contains `path_contains` (and whose method is
    /// `method`, when given) fail with `code` and the reason the API server uses for it.
    pub fn fail_next(&self, method: Option<http::Method>, path_contains: &str, times: u32, code: u16) {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        self.fail_next_with(method, path_contains, times, ApiError::new(code, reason, format!("injected by the test: {code} {reason}")));
    }

    /// [`KubeDouble::fail_next`] with a chosen error.
    pub fn fail_next_with(&self, method: Option<http::Method>, path_contains: &str, times: u32, error: ApiError) {
        self.state().faults.push(Fault { method, path_contains: path_contains.to_string(), remaining: times, error });
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state().log.clone()
    }

    /// `METHOD path?query` of every request so far.
    pub fn request_lines(&self) -> Vec<String> {
        self.state().log.iter().map(RecordedRequest::line).collect()
    }

    pub fn clear_requests(&self) {
        self.state().log.clear();
    }

    /// The newest resourceVersion (as the string clients see).
    pub fn resource_version(&self) -> String {
        self.state().store.resource_version().to_string()
    }

    /// Sets the server's wall clock to `unix_s` seconds now (it advances with tokio's clock):
    /// a test whose controllers run on a fixed clock makes the server agree with it, as the
    /// clocks of a real cluster agree (creationTimestamp and the controllers' "now").
    pub fn set_wall_clock(&self, unix_s: i64) {
        if let Ok(at) = jiff::Timestamp::from_second(unix_s) {
            self.state().clock = crate::state::Clock::starting_at(at);
        }
    }

    /// Drops the watch history, as etcd compaction does: watches from older resourceVersions get 410.
    pub fn compact(&self) {
        self.state().store.compact();
    }

    /// How many change events watches can resume across (default 10 000).
    pub fn set_history_limit(&self, events: usize) {
        self.state().store.set_history_limit(events);
    }

    /// Watches currently open.
    pub fn open_watches(&self) -> usize {
        self.state().store.watcher_count()
    }
}
