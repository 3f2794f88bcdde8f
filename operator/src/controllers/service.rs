//! The Service of a deployment: it selects the deployment's replica Pods, so traffic follows
//! Pod readiness through its EndpointSlices.

use std::collections::BTreeMap;

use brink_api::crd::ModelDeployment;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use super::context::{Context, FIELD_MANAGER};
use super::error::{Error, Result};
use super::names::{DEPLOYMENT_LABEL, dns_label, label_value};

/// The port clients use; it forwards to the replicas' `http` port.
pub const SERVICE_PORT: i32 = 80;

pub fn desired_service(dep: &ModelDeployment) -> Result<Service> {
    let name = dep.name_any();
    let owner = dep.controller_owner_ref(&()).ok_or_else(|| Error::MissingField {
        kind: "ModelDeployment",
        name: name.clone(),
        field: "metadata.uid",
    })?;
    let selector = BTreeMap::from([(DEPLOYMENT_LABEL.to_string(), label_value(&name))]);
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(dns_label(&name)),
            namespace: dep.namespace(),
            labels: Some(selector.clone()),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(selector),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: SERVICE_PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// Applies the Service (server-side, forced: the operator owns every field it sets).
pub async fn apply(dep: &ModelDeployment, ctx: &Context) -> Result<()> {
    let svc = desired_service(dep)?;
    let ns = dep.namespace().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&svc))
        .await
        .map_err(|e| Error::kube(format!("applying Service {ns}/{name}"), e))?;
    Ok(())
}
