//! Discovery, as the API server answers it: `/version`, `/api`, `/apis`, `/api/v1` and
//! `/apis/<group>/<version>`, built from the kinds the double serves. Processes started against
//! the double over HTTP ask these before anything else (the operator's start-up checks
//! `/version` and that `/apis/brink.dev/v1alpha1` lists every CRD).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
};
use k8s_openapi::apimachinery::pkg::version::Info;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::kinds::{KindRegistry, ResourceKind};

/// The Kubernetes version the double claims (k8s-openapi's `v1_37` types are what it serves).
const MAJOR: &str = "1";
const MINOR: &str = "37";

/// The discovery document for `path`, or `None` when `path` is not a discovery path (a
/// resource path, for the router). Unknown groups and versions are 404, as on a real server.
pub fn answer(registry: &KindRegistry, path: &str) -> Option<ApiResult<Value>> {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let doc = match parts.as_slice() {
        ["version"] => to_value(&version()),
        ["api"] => to_value(&core_versions(registry)),
        ["apis"] => to_value(&groups(registry)),
        ["api", version] => resources(registry, "", version).and_then(|l| to_value(&l)),
        ["apis", group, version] => resources(registry, group, version).and_then(|l| to_value(&l)),
        ["apis", group] => group_of(registry, group).and_then(|g| to_value(&g)),
        _ => return None,
    };
    Some(doc)
}

fn to_value<T: serde::Serialize>(doc: &T) -> ApiResult<Value> {
    serde_json::to_value(doc).map(with_kind::<T>).map_err(|e| ApiError::new(500, "InternalError", format!("discovery document: {e}")))
}

/// k8s-openapi leaves `kind`/`apiVersion` out of these list types' serialisation for some of
/// them; a real server always sends them.
fn with_kind<T>(mut v: Value) -> Value {
    let name = std::any::type_name::<T>().rsplit("::").next().unwrap_or_default().to_string();
    if let Some(o) = v.as_object_mut()
        && name != "Info"
    {
        o.entry("kind").or_insert(Value::String(name));
        o.entry("apiVersion").or_insert(Value::String("v1".into()));
    }
    v
}

fn version() -> Info {
    Info {
        major: MAJOR.into(),
        minor: MINOR.into(),
        git_version: format!("v{MAJOR}.{MINOR}.0-brink-kube-double"),
        git_commit: "0000000000000000000000000000000000000000".into(),
        git_tree_state: "clean".into(),
        build_date: "2026-01-01T00:00:00Z".into(),
        go_version: "none (brink-kube-double)".into(),
        compiler: "rustc".into(),
        platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        ..Info::default()
    }
}

/// Served versions per group, each group's versions sorted (the preferred one first: the
/// newest, by Kubernetes' version order for the few shapes the double serves).
fn versions_by_group(registry: &KindRegistry) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for k in registry.kinds() {
        let v = out.entry(k.group.clone()).or_default();
        if !v.contains(&k.version) {
            v.push(k.version.clone());
        }
    }
    for v in out.values_mut() {
        v.sort_by_key(|s| std::cmp::Reverse(version_rank(s)));
    }
    out
}

/// `v1` > `v1beta2` > `v1beta1` > `v1alpha1`: (major, stability, minor).
fn version_rank(v: &str) -> (u32, u8, u32) {
    let rest = v.trim_start_matches('v');
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let major = digits.parse().unwrap_or(0);
    let tail = &rest[digits.len()..];
    let (stability, minor) = match tail {
        "" => (2, 0),
        t if t.starts_with("beta") => (1, t[4..].parse().unwrap_or(0)),
        t if t.starts_with("alpha") => (0, t[5..].parse().unwrap_or(0)),
        _ => (0, 0),
    };
    (major, stability, minor)
}

fn core_versions(registry: &KindRegistry) -> APIVersions {
    APIVersions { versions: versions_by_group(registry).remove("").unwrap_or_default(), ..APIVersions::default() }
}

fn api_group(group: &str, versions: &[String]) -> APIGroup {
    let gv = |v: &String| GroupVersionForDiscovery { group_version: format!("{group}/{v}"), version: v.clone() };
    APIGroup {
        name: group.to_string(),
        preferred_version: versions.first().map(gv),
        versions: versions.iter().map(gv).collect(),
        ..APIGroup::default()
    }
}

fn groups(registry: &KindRegistry) -> APIGroupList {
    APIGroupList { groups: versions_by_group(registry).iter().filter(|(g, _)| !g.is_empty()).map(|(g, v)| api_group(g, v)).collect() }
}

fn group_of(registry: &KindRegistry, group: &str) -> ApiResult<APIGroup> {
    match versions_by_group(registry).get(group) {
        Some(v) if !group.is_empty() => Ok(api_group(group, v)),
        _ => Err(not_found(group)),
    }
}

fn not_found(what: &str) -> ApiError {
    ApiError::new(404, "NotFound", format!("the server could not find the requested resource ({what})"))
}

const VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

fn resource(k: &ResourceKind, name: String, verbs: &[&str]) -> APIResource {
    APIResource {
        name,
        singular_name: k.kind.to_lowercase(),
        namespaced: k.namespaced,
        kind: k.kind.clone(),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..APIResource::default()
    }
}

/// The resources of one group version, with their `/status` and `/scale` subresources.
fn resources(registry: &KindRegistry, group: &str, version: &str) -> ApiResult<APIResourceList> {
    let mut list = Vec::new();
    for k in registry.kinds().filter(|k| k.group == group && k.version == version) {
        list.push(resource(k, k.plural.clone(), &VERBS));
        if k.status_subresource {
            list.push(resource(k, format!("{}/status", k.plural), &["get", "patch", "update"]));
        }
        if k.scale.is_some() {
            let mut scale = resource(k, format!("{}/scale", k.plural), &["get", "patch", "update"]);
            scale.group = Some("autoscaling".into());
            scale.version = Some("v1".into());
            scale.kind = "Scale".into();
            list.push(scale);
        }
    }
    let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    if list.is_empty() {
        return Err(not_found(&group_version));
    }
    Ok(APIResourceList { group_version, resources: list })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> ApiResult<Value> {
        answer(&KindRegistry::standard(), path).expect("a discovery path")
    }

    #[test]
    fn lists_brink_resources_with_their_subresources() {
        let v = get("/apis/brink.dev/v1alpha1").unwrap();
        assert_eq!(v["kind"], "APIResourceList");
        assert_eq!(v["groupVersion"], "brink.dev/v1alpha1");
        let names: Vec<&str> = v["resources"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
        for want in ["sparknodes", "sparknodes/status", "models", "modeldeployments", "modeldeployments/scale", "sweepresults"] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        let node = v["resources"].as_array().unwrap().iter().find(|r| r["name"] == "sparknodes").unwrap();
        assert_eq!((node["namespaced"].as_bool(), node["kind"].as_str()), (Some(false), Some("SparkNode")));
    }

    #[test]
    fn core_groups_and_version() {
        let core = get("/api").unwrap();
        assert_eq!(core["versions"], serde_json::json!(["v1"]));
        let v1 = get("/api/v1").unwrap();
        let pods = v1["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods").unwrap();
        assert_eq!(pods["namespaced"], true);
        let groups = get("/apis").unwrap();
        let names: Vec<&str> = groups["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
        assert_eq!(names, ["apps", "brink.dev", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io"]);
        let brink = get("/apis/brink.dev").unwrap();
        assert_eq!(brink["preferredVersion"]["groupVersion"], "brink.dev/v1alpha1");
        let version = get("/version").unwrap();
        assert_eq!((version["major"].as_str(), version["minor"].as_str()), (Some("1"), Some("37")));
        assert!(version.get("kind").is_none());
    }

    #[test]
    fn unknown_group_or_version_is_404_and_resources_are_not_discovery() {
        assert_eq!(get("/apis/widgets.example/v1").unwrap_err().code, 404);
        assert_eq!(get("/apis/brink.dev/v9").unwrap_err().code, 404);
        assert_eq!(get("/apis/widgets.example").unwrap_err().code, 404);
        let r = KindRegistry::standard();
        assert!(answer(&r, "/api/v1/pods").is_none());
        assert!(answer(&r, "/apis/brink.dev/v1alpha1/sparknodes").is_none());
    }

    #[test]
    fn preferred_version_is_the_most_stable_newest() {
        let mut v = vec!["v1alpha1", "v2", "v1beta2", "v1", "v1beta1"];
        v.sort_by_key(|s| std::cmp::Reverse(version_rank(s)));
        assert_eq!(v, ["v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }
}
