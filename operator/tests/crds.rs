//! `brink-operator crds` prints every CRD of the group as YAML that parses back to exactly the generated
//! objects (a YAML writer that lost a quote or an escape in a CEL rule or pattern fails here).

use std::process::Command;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

#[test]
fn crds_yaml_parses_back_as_the_generated_crds() {
    let out = Command::new(env!("CARGO_BIN_EXE_brink-operator")).arg("crds").output().expect("run brink-operator crds");
    assert!(out.status.success(), "brink-operator crds failed: {}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).expect("UTF-8");
    let docs: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let names: Vec<_> = docs.iter().map(|c| c.metadata.name.clone().unwrap_or_default()).collect();
    assert_eq!(
        names,
        [
            "sparknodes.brink.dev",
            "models.brink.dev",
            "modeldeployments.brink.dev",
            "modelreplicas.brink.dev",
            "regressionsweeps.brink.dev",
            "sweepruns.brink.dev",
            "sweepresults.brink.dev"
        ]
    );
    assert_eq!(docs, brink_api::crd::crds(), "the YAML round trip changed a CRD");
    for doc in &docs {
        assert_eq!(doc.spec.versions[0].name, "v1alpha1");
    }
    assert!(yaml.contains("apiVersion: apiextensions.k8s.io/v1"), "{yaml}");
    assert_eq!(yaml.matches("kind: CustomResourceDefinition").count(), 7);
}
