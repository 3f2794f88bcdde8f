//! Request paths: `/api/v1/...` (core group) and `/apis/<group>/<version>/...`, namespaced or not,
//! for a collection, one object, or one object's subresource.

use crate::error::{ApiError, ApiResult};

/// What a request path addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    pub plural: String,
    /// `None`: cluster-scoped, or a namespaced kind listed/watched across all namespaces.
    pub namespace: Option<String>,
    /// `None`: the collection.
    pub name: Option<String>,
    /// `status` or `scale` (or whatever the client asked; the router rejects unknown ones).
    pub subresource: Option<String>,
}

pub fn parse(path: &str) -> ApiResult<ResourcePath> {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ((String::new(), version.to_string()), rest),
        ["apis", group, version, rest @ ..] => ((group.to_string(), version.to_string()), rest),
        _ => return Err(ApiError::new(404, "NotFound", format!("the server could not find the requested resource (path {path})"))),
    };
    let (namespace, rest) = match rest {
        // `/namespaces/<ns>/<plural>...`; but `/namespaces/<ns>` and `/namespaces/<ns>/status` address the Namespace itself.
        ["namespaces", ns, plural, tail @ ..] if !(tail.is_empty() && (*plural == "status" || *plural == "finalize")) => {
            (Some(ns.to_string()), [&[*plural][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let (plural, name, subresource) = match rest.as_slice() {
        [plural] => (plural.to_string(), None, None),
        [plural, name] => (plural.to_string(), Some(name.to_string()), None),
        [plural, name, sub] => (plural.to_string(), Some(name.to_string()), Some(sub.to_string())),
        _ => return Err(ApiError::new(404, "NotFound", format!("the server could not find the requested resource (path {path})"))),
    };
    Ok(ResourcePath { group: group.0, version: group.1, plural, namespace, name, subresource })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(g: &str, v: &str, pl: &str, ns: Option<&str>, name: Option<&str>, sub: Option<&str>) -> ResourcePath {
        ResourcePath {
            group: g.into(),
            version: v.into(),
            plural: pl.into(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        }
    }

    #[test]
    fn parses_every_shape() {
        let cases = [
            ("/api/v1/namespaces/ns/pods", p("", "v1", "pods", Some("ns"), None, None)),
            ("/api/v1/namespaces/ns/pods/a", p("", "v1", "pods", Some("ns"), Some("a"), None)),
            ("/api/v1/namespaces/ns/pods/a/status", p("", "v1", "pods", Some("ns"), Some("a"), Some("status"))),
            ("/api/v1/pods", p("", "v1", "pods", None, None, None)),
            ("/api/v1/nodes/n1", p("", "v1", "nodes", None, Some("n1"), None)),
            ("/api/v1/namespaces", p("", "v1", "namespaces", None, None, None)),
            ("/api/v1/namespaces/ns", p("", "v1", "namespaces", None, Some("ns"), None)),
            ("/api/v1/namespaces/ns/status", p("", "v1", "namespaces", None, Some("ns"), Some("status"))),
            (
                "/apis/brink.dev/v1alpha1/namespaces/x/modeldeployments/d/scale",
                p("brink.dev", "v1alpha1", "modeldeployments", Some("x"), Some("d"), Some("scale")),
            ),
            ("/apis/brink.dev/v1alpha1/sparknodes/n", p("brink.dev", "v1alpha1", "sparknodes", None, Some("n"), None)),
        ];
        for (path, want) in cases {
            assert_eq!(parse(path).unwrap(), want, "{path}");
        }
    }

    #[test]
    fn rejects_unknown_shapes() {
        for path in ["/", "/healthz", "/api", "/apis/brink.dev", "/api/v1/namespaces/ns/pods/a/status/extra"] {
            assert_eq!(parse(path).unwrap_err().code, 404, "{path}");
        }
    }
}
