//! `brink-operator crds`: the CRDs generated from the `brink-api` types, as YAML.

/// Every CRD of the `brink.dev` group, one YAML document each (`---` between them).
pub fn render() -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string_multiple(&brink_api::crd::crds())
}
