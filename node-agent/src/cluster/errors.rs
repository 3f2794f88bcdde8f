//! What went wrong talking to the API server, said so a person can act on it: which URL could
//! not be reached, that the brink.dev CRDs are missing, which verb on which resource RBAC
//! forbids. Pure: the caller names the call; [`explain`] turns kube's error into the sentence.

/// One API call as a person would name it (`get`, `nodes`; `patch`, `sparknodes/status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call<'a> {
    pub verb: &'a str,
    pub resource: &'a str,
    /// The object, when the call names one.
    pub name: Option<&'a str>,
}

impl<'a> Call<'a> {
    pub fn new(verb: &'a str, resource: &'a str, name: Option<&'a str>) -> Self {
        Call { verb, resource, name }
    }
}

impl std::fmt::Display for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name {
            Some(n) => write!(f, "{} {} {n}", self.verb, self.resource),
            None => write!(f, "{} {}", self.verb, self.resource),
        }
    }
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiProblem {
    #[error("cannot reach the Kubernetes API at {url} ({call}): {detail}")]
    Unreachable { url: String, call: String, detail: String },
    #[error(
        "the brink.dev CRDs are not installed: run `brink-operator crds | kubectl apply -f -` (the API server at {url} has no {resource})"
    )]
    CrdsMissing { url: String, resource: String },
    #[error(
        "forbidden: the agent may not {verb} {resource} (RBAC: grant the agent's service account `{verb}` on `{resource}`, as the chart's ClusterRole does): {message}"
    )]
    Forbidden { verb: String, resource: String, message: String },
    #[error("unauthorized at {url}: the API server rejected the agent's credentials ({call}): {message}")]
    Unauthorized { url: String, call: String, message: String },
    #[error("{call}: the API server answered {code} {reason}: {message}")]
    Status { call: String, code: u16, reason: String, message: String },
    #[error("{call}: {detail}")]
    Other { call: String, detail: String },
}

/// Explains `err` from `call` against the API server at `url`. `crd_resource`: the call was to
/// a brink.dev resource, so a 404 without an object name means the CRD is missing.
pub fn explain(call: Call<'_>, url: &str, err: &kube::Error) -> ApiProblem {
    match err {
        kube::Error::Api(s) => {
            let brink = call.resource.split('/').next().is_some_and(is_brink_resource);
            match s.code {
                404 if brink && call.name.is_none() => ApiProblem::CrdsMissing { url: url.into(), resource: call.resource.into() },
                403 => ApiProblem::Forbidden { verb: call.verb.into(), resource: call.resource.into(), message: s.message.clone() },
                401 => ApiProblem::Unauthorized { url: url.into(), call: call.to_string(), message: s.message.clone() },
                code => ApiProblem::Status { call: call.to_string(), code, reason: s.reason.clone(), message: s.message.clone() },
            }
        }
        kube::Error::HyperError(e) => ApiProblem::Unreachable { url: url.into(), call: call.to_string(), detail: chain(e) },
        kube::Error::Service(e) => ApiProblem::Unreachable { url: url.into(), call: call.to_string(), detail: chain(e.as_ref()) },
        other => ApiProblem::Other { call: call.to_string(), detail: chain(other) },
    }
}

/// The plural names of the brink.dev kinds.
pub fn is_brink_resource(plural: &str) -> bool {
    matches!(plural, "sparknodes" | "models" | "modeldeployments" | "modelreplicas")
}

/// An error and its sources in one line: a connection failure's cause is in its source.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let more = s.to_string();
        if !out.contains(&more) {
            out.push_str(": ");
            out.push_str(&more);
        }
        next = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code,
            message: message.into(),
            reason: reason.into(),
            metadata: None,
            details: None,
        }))
    }

    #[test]
    fn table() {
        let url = "https://10.0.0.1:6443";
        let list_nodes = Call::new("list", "sparknodes", None);
        let get_node = Call::new("get", "nodes", Some("n1"));
        let lease = Call::new("create", "leases", Some("brink-node-n1"));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let cases: Vec<(Call, kube::Error, &str)> = vec![
            (
                list_nodes,
                api(404, "NotFound", "the server could not find the requested resource"),
                "the brink.dev CRDs are not installed: run `brink-operator crds | kubectl apply -f -` (the API server at https://10.0.0.1:6443 has no sparknodes)",
            ),
            // A named brink.dev object that is absent is not a missing CRD.
            (
                Call::new("get", "sparknodes", Some("n1")),
                api(404, "NotFound", "sparknodes \"n1\" not found"),
                "get sparknodes n1: the API server answered 404 NotFound: sparknodes \"n1\" not found",
            ),
            (get_node, api(404, "NotFound", "nodes \"n1\" not found"), "get nodes n1: the API server answered 404 NotFound"),
            (
                lease,
                api(403, "Forbidden", "leases is forbidden: User \"system:serviceaccount:brink:agent\" cannot create"),
                "forbidden: the agent may not create leases (RBAC: grant the agent's service account `create` on `leases`",
            ),
            (Call::new("patch", "sparknodes/status", Some("n1")), api(403, "Forbidden", "no"), "may not patch sparknodes/status"),
            (list_nodes, api(401, "Unauthorized", "Unauthorized"), "unauthorized at https://10.0.0.1:6443"),
            (
                list_nodes,
                kube::Error::Service(Box::new(io)),
                "cannot reach the Kubernetes API at https://10.0.0.1:6443 (list sparknodes): connection refused",
            ),
            (list_nodes, api(500, "InternalError", "etcd down"), "list sparknodes: the API server answered 500 InternalError: etcd down"),
        ];
        for (call, err, want) in cases {
            let got = explain(call, url, &err).to_string();
            assert!(got.starts_with(want) || got.contains(want), "{call}: {got}\n  want: {want}");
        }
    }
}
