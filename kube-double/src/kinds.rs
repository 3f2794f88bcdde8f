//! The resource kinds the double serves: a small table of built-in kinds plus every CRD handed to
//! it (by default brink's, from `brink_api::crd::crds()`), each with its scope, subresources and
//! the list-map keys server-side apply merges list entries by.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// Where `/scale` reads and writes: field paths inside the object (`["spec", "replicas"]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalePaths {
    pub spec_replicas: Vec<String>,
    pub status_replicas: Vec<String>,
    /// `None`: the selector is `spec.selector.matchLabels` serialised (as for apps/v1 Deployments).
    pub label_selector: Option<Vec<String>>,
}

/// List fields whose entries are identified by key fields (`x-kubernetes-list-type: map`), keyed by
/// the field path with list levels left out: `spec.containers.ports` means "the `ports` list of
/// each entry of `spec.containers`". Lists not named here are atomic (replaced whole).
pub type ListMapKeys = BTreeMap<String, Vec<String>>;

#[derive(Debug, Clone)]
pub struct ResourceKind {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    /// With a status subresource, main-resource writes keep the stored status and `/status` writes
    /// change only the status.
    pub status_subresource: bool,
    pub scale: Option<ScalePaths>,
    pub list_keys: ListMapKeys,
    /// The CRD's structural schema, for its `default`s; `None` for built-in kinds.
    pub schema: Option<Value>,
    /// A custom resource: the API server refuses strategic merge patches for these.
    pub custom: bool,
}

impl ResourceKind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// The keys of the list-map at `path` (dot-joined field names, list levels left out).
    pub fn list_keys_at(&self, path: &str) -> Option<&[String]> {
        self.list_keys.get(path).map(Vec::as_slice)
    }
}

/// All kinds the double knows, looked up by (group, version, plural).
#[derive(Debug, Clone, Default)]
pub struct KindRegistry {
    kinds: BTreeMap<(String, String, String), ResourceKind>,
}

impl KindRegistry {
    /// The built-in kinds plus brink's CRDs.
    pub fn standard() -> Self {
        let mut r = Self::default();
        for k in builtin_kinds() {
            r.insert(k);
        }
        for crd in brink_api::crd::crds() {
            r.add_crd(&crd);
        }
        r
    }

    pub fn insert(&mut self, kind: ResourceKind) {
        self.kinds.insert((kind.group.clone(), kind.version.clone(), kind.plural.clone()), kind);
    }

    /// Registers every served version of a CRD.
    pub fn add_crd(&mut self, crd: &CustomResourceDefinition) {
        let spec = &crd.spec;
        for v in spec.versions.iter().filter(|v| v.served) {
            // A typed schema always serialises; `None` only means "no schema" (no defaults, atomic lists).
            let schema = v.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).and_then(|s| serde_json::to_value(s).ok());
            let mut list_keys = common_list_keys();
            if let Some(s) = &schema {
                collect_list_map_keys(s, "", &mut list_keys);
            }
            let sub = v.subresources.as_ref();
            let scale = sub.and_then(|s| s.scale.as_ref()).map(|s| ScalePaths {
                spec_replicas: json_path(&s.spec_replicas_path),
                status_replicas: json_path(&s.status_replicas_path),
                label_selector: s.label_selector_path.as_deref().map(json_path),
            });
            self.insert(ResourceKind {
                group: spec.group.clone(),
                version: v.name.clone(),
                kind: spec.names.kind.clone(),
                plural: spec.names.plural.clone(),
                namespaced: spec.scope == "Namespaced",
                status_subresource: sub.is_some_and(|s| s.status.is_some()),
                scale,
                list_keys,
                schema,
                custom: true,
            });
        }
    }

    /// Every kind, ordered by (group, version, plural).
    pub fn kinds(&self) -> impl Iterator<Item = &ResourceKind> {
        self.kinds.values()
    }

    pub fn get(&self, group: &str, version: &str, plural: &str) -> ApiResult<&ResourceKind> {
        self.kinds.get(&(group.to_string(), version.to_string(), plural.to_string())).ok_or_else(|| {
            let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
            ApiError::new(404, "NotFound", format!("the server could not find the requested resource ({plural} in {gv})"))
        })
    }

    /// The kind for an object's `apiVersion` and `kind` (used to seed objects).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> ApiResult<&ResourceKind> {
        self.kinds
            .values()
            .find(|k| k.api_version() == api_version && k.kind == kind)
            .ok_or_else(|| ApiError::bad_request(format!("no kind {kind} in {api_version} is registered with the double")))
    }
}

/// `.spec.replicas` -> `["spec", "replicas"]`.
fn json_path(p: &str) -> Vec<String> {
    p.trim_start_matches('.').split('.').filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// Walks an OpenAPI v3 schema and records each `x-kubernetes-list-type: map` with its keys.
fn collect_list_map_keys(schema: &Value, path: &str, out: &mut ListMapKeys) {
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
        let keys: Vec<String> = schema
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default();
        if !keys.is_empty() {
            out.insert(path.to_string(), keys);
        }
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            let child_path = if path.is_empty() { name.clone() } else { format!("{path}.{name}") };
            collect_list_map_keys(child, &child_path, out);
        }
    }
    if let Some(items) = schema.get("items") {
        collect_list_map_keys(items, path, out);
    }
}

/// List-maps every kind has in its metadata.
fn common_list_keys() -> ListMapKeys {
    [("metadata.ownerReferences", &["uid"][..])].iter().map(|(p, k)| (p.to_string(), k.iter().map(|s| s.to_string()).collect())).collect()
}

fn keys(entries: &[(&str, &[&str])]) -> ListMapKeys {
    let mut m = common_list_keys();
    for (p, k) in entries {
        m.insert(p.to_string(), k.iter().map(|s| s.to_string()).collect());
    }
    m
}

/// The pod template's list-maps, under `prefix` (`spec` for a Pod, `spec.template.spec` for a Deployment).
fn pod_spec_keys(prefix: &str) -> Vec<(String, Vec<&'static str>)> {
    let mut v = Vec::new();
    for c in ["containers", "initContainers", "ephemeralContainers"] {
        v.push((format!("{prefix}.{c}"), vec!["name"]));
        v.push((format!("{prefix}.{c}.env"), vec!["name"]));
        v.push((format!("{prefix}.{c}.ports"), vec!["containerPort", "protocol"]));
        v.push((format!("{prefix}.{c}.volumeMounts"), vec!["mountPath"]));
    }
    v.push((format!("{prefix}.volumes"), vec!["name"]));
    v.push((format!("{prefix}.imagePullSecrets"), vec!["name"]));
    v
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    status: bool,
    scale: Option<ScalePaths>,
    list_keys: ListMapKeys,
) -> ResourceKind {
    ResourceKind {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        plural: plural.into(),
        namespaced,
        status_subresource: status,
        scale,
        list_keys,
        schema: None,
        custom: false,
    }
}

/// The built-in kinds brink's operator and agent use, with the list-maps of their upstream schemas.
pub fn builtin_kinds() -> Vec<ResourceKind> {
    let conditions: &[(&str, &[&str])] = &[("status.conditions", &["type"])];
    let mut pod = keys(conditions);
    for (p, k) in pod_spec_keys("spec") {
        pod.insert(p, k.into_iter().map(str::to_string).collect());
    }
    let mut deployment = keys(conditions);
    for (p, k) in pod_spec_keys("spec.template.spec") {
        deployment.insert(p, k.into_iter().map(str::to_string).collect());
    }
    let deployment_scale =
        ScalePaths { spec_replicas: json_path(".spec.replicas"), status_replicas: json_path(".status.replicas"), label_selector: None };
    vec![
        builtin("", "v1", "Pod", "pods", true, true, None, pod),
        builtin(
            "",
            "v1",
            "Service",
            "services",
            true,
            true,
            None,
            keys(&[("spec.ports", &["port", "protocol"]), ("status.conditions", &["type"])]),
        ),
        builtin("", "v1", "ConfigMap", "configmaps", true, false, None, keys(&[])),
        builtin("", "v1", "Secret", "secrets", true, false, None, keys(&[])),
        builtin("", "v1", "ServiceAccount", "serviceaccounts", true, false, None, keys(&[])),
        builtin("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true, true, None, keys(conditions)),
        builtin("", "v1", "Event", "events", true, false, None, keys(&[])),
        builtin("", "v1", "Node", "nodes", false, true, None, keys(&[("status.conditions", &["type"]), ("status.addresses", &["type"])])),
        builtin("", "v1", "Namespace", "namespaces", false, true, None, keys(conditions)),
        builtin("apps", "v1", "Deployment", "deployments", true, true, Some(deployment_scale), deployment),
        builtin("coordination.k8s.io", "v1", "Lease", "leases", true, false, None, keys(&[])),
        builtin("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", true, false, None, keys(&[])),
        builtin("events.k8s.io", "v1", "Event", "events", true, false, None, keys(&[])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brink_crds_bring_their_list_map_keys_and_subresources() {
        let r = KindRegistry::standard();
        let node = r.get("brink.dev", "v1alpha1", "sparknodes").unwrap();
        assert!(!node.namespaced);
        assert!(node.status_subresource);
        assert_eq!(node.list_keys_at("status.qualifications"), Some(&["shapeClass".to_string()][..]));
        assert_eq!(node.list_keys_at("status.conditions"), Some(&["type".to_string()][..]));
        let dep = r.get("brink.dev", "v1alpha1", "modeldeployments").unwrap();
        assert!(dep.namespaced);
        let scale = dep.scale.as_ref().expect("ModelDeployment has /scale");
        assert_eq!(scale.spec_replicas, ["spec", "replicas"]);
        assert_eq!(scale.label_selector.as_deref(), Some(&["status".to_string(), "selector".to_string()][..]));
        let model = r.get("brink.dev", "v1alpha1", "models").unwrap();
        assert_eq!(model.list_keys_at("status.cache"), Some(&["node".to_string()][..]));
        assert!(model.scale.is_none());
    }

    #[test]
    fn unknown_resource_is_404() {
        let r = KindRegistry::standard();
        assert_eq!(r.get("brink.dev", "v1alpha1", "widgets").unwrap_err().code, 404);
        assert_eq!(r.get("", "v1", "pods").unwrap().kind, "Pod");
        assert_eq!(r.by_kind("coordination.k8s.io/v1", "Lease").unwrap().plural, "leases");
    }
}
