//! The checks before the controllers start: the API server answers, and the `brink.dev` CRDs
//! are installed. Each failure says what to do about it.

use std::collections::BTreeSet;

use kube::Client;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StartupError {
    #[error("cannot reach the Kubernetes API server ({cluster_url}): {source}; check the kubeconfig's server and credentials")]
    Unreachable {
        cluster_url: String,
        #[source]
        source: kube::Error,
    },
    #[error("the brink.dev CRDs are not installed: missing {}; install them with `brink-operator crds | kubectl apply -f -`", missing.join(", "))]
    MissingCrds { missing: Vec<String> },
    #[error("listing the resources of brink.dev/v1alpha1: {0}")]
    Discovery(#[source] kube::Error),
}

/// The plural and full name of every CRD of the group: the controllers use them all (the
/// sweep controllers too), and the chart installs them together.
fn required() -> Vec<(String, String)> {
    brink_api::crd::crds().into_iter().map(|c| (c.spec.names.plural.clone(), c.metadata.name.unwrap_or_default())).collect()
}

/// The names of the required CRDs whose plural is not in `served`.
pub fn missing_crds(served: &BTreeSet<String>) -> Vec<String> {
    required().into_iter().filter(|(plural, _)| !served.contains(plural)).map(|(_, name)| name).collect()
}

/// Fails unless the API server answers and serves every brink.dev resource.
pub async fn preflight(client: &Client, cluster_url: &str) -> Result<(), StartupError> {
    client.apiserver_version().await.map_err(|source| StartupError::Unreachable { cluster_url: cluster_url.to_string(), source })?;
    let served: BTreeSet<String> = match client.list_api_group_resources("brink.dev/v1alpha1").await {
        Ok(list) => list.resources.into_iter().map(|r| r.name).collect(),
        // The group itself is unknown: none of the CRDs is installed.
        Err(kube::Error::Api(status)) if status.code == 404 => BTreeSet::new(),
        Err(e) => return Err(StartupError::Discovery(e)),
    };
    let missing = missing_crds(&served);
    if missing.is_empty() { Ok(()) } else { Err(StartupError::MissingCrds { missing }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_missing_crd() {
        let served: BTreeSet<String> = ["sparknodes", "sparknodes/status", "models"].iter().map(|s| s.to_string()).collect();
        assert_eq!(
            missing_crds(&served),
            [
                "modeldeployments.brink.dev",
                "modelreplicas.brink.dev",
                "regressionsweeps.brink.dev",
                "sweepruns.brink.dev",
                "sweepresults.brink.dev"
            ]
        );
        let all: BTreeSet<String> =
            ["sparknodes", "models", "modeldeployments", "modelreplicas", "regressionsweeps", "sweepruns", "sweepresults"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        assert!(missing_crds(&all).is_empty());
        let msg = StartupError::MissingCrds { missing: missing_crds(&BTreeSet::new()) }.to_string();
        assert!(msg.contains("sparknodes.brink.dev") && msg.contains("brink-operator crds | kubectl apply -f -"), "{msg}");
    }
}
