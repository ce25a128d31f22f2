//! Shared Gateways' own Services (`compile::gateway_services` decides them): server-side
//! applied in the controller's namespace after each compile, and deleted when their Gateway
//! is gone or leaves the shared pool. Only the leader writes.
//!
//! A Service selects the shared proxies' Pods and maps each listener port to the Gateway's
//! internal port. It cannot be owned by its Gateway (another namespace), so garbage
//! collection does not remove it: this writer does, by its labels.

use crate::compile::gateway_services::{Allocation, GATEWAY_ANNOTATION, GatewayService};
use crate::compile::status::ObjectKey;
use crate::compile::store::Store;
use coxswain_api::names::{self, labels};
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct ServiceWriter {
    client: Client,
    namespace: String,
    controller_name: String,
    leader: Arc<AtomicBool>,
    /// What was last applied, by Service name: applied again only when it changes or the
    /// Service is gone.
    applied: BTreeMap<String, Value>,
}

impl ServiceWriter {
    pub fn new(
        client: Client,
        namespace: String,
        controller_name: String,
        leader: Arc<AtomicBool>,
    ) -> Self {
        Self {
            client,
            namespace,
            controller_name,
            leader,
            applied: BTreeMap::new(),
        }
    }

    /// Makes the Services in the controller's namespace what `allocation` says.
    pub async fn sync(&mut self, store: &Store, allocation: &Allocation) {
        if !self.leader.load(Ordering::Acquire) {
            // A new leader applies everything once: another replica may have written since.
            self.applied.clear();
            return;
        }
        let api: Api<Service> = Api::namespaced(self.client.clone(), &self.namespace);
        let existing: Vec<&Service> = store
            .services
            .iter()
            .filter(|s| self.is_ours(s))
            .map(|s| &**s)
            .collect();
        for (gateway, service) in &allocation.services {
            let body = render(&self.namespace, &self.controller_name, gateway, service);
            let present = existing
                .iter()
                .any(|s| s.metadata.name.as_deref() == Some(service.name.as_str()));
            if present && self.applied.get(&service.name) == Some(&body) {
                continue;
            }
            let params = PatchParams::apply(names::FIELD_MANAGER).force();
            match api
                .patch(&service.name, &params, &Patch::Apply(&body))
                .await
            {
                Ok(_) => {
                    tracing::info!(gateway = %gateway, service = %service.name, "shared Gateway's Service applied");
                    self.applied.insert(service.name.clone(), body);
                }
                Err(error) => {
                    tracing::warn!(gateway = %gateway, service = %service.name, %error, "applying a shared Gateway's Service failed; retrying at the next change");
                    self.applied.remove(&service.name);
                }
            }
        }
        let wanted: std::collections::BTreeSet<&str> = allocation
            .services
            .values()
            .map(|s| s.name.as_str())
            .collect();
        for svc in existing {
            let Some(name) = svc.metadata.name.as_deref() else {
                continue;
            };
            if wanted.contains(name) {
                continue;
            }
            match api.delete(name, &DeleteParams::background()).await {
                Ok(_) => {
                    tracing::info!(
                        service = name,
                        "Service of a Gateway no longer on the shared pool removed"
                    );
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    tracing::warn!(service = name, %error, "removing a shared Gateway's Service failed");
                }
            }
            self.applied.remove(name);
        }
    }

    /// A Service this controller made for a shared Gateway.
    fn is_ours(&self, s: &Service) -> bool {
        let meta = &s.metadata;
        meta.namespace.as_deref() == Some(self.namespace.as_str())
            && meta
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::COMPONENT))
                .is_some_and(|c| c == labels::COMPONENT_GATEWAY_SERVICE)
            && meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::render::CONTROLLER_ANNOTATION))
                .is_some_and(|c| *c == self.controller_name)
    }
}

/// The Service of a shared Gateway, as server-side apply wants it.
pub fn render(
    namespace: &str,
    controller_name: &str,
    gateway: &ObjectKey,
    service: &GatewayService,
) -> Value {
    // spec.infrastructure labels and annotations first, so ours win on a clash (GEP-1867).
    let mut object_labels = service.labels.clone();
    object_labels.extend([
        (labels::NAME.to_owned(), labels::NAME_VALUE.to_owned()),
        (
            labels::COMPONENT.to_owned(),
            labels::COMPONENT_GATEWAY_SERVICE.to_owned(),
        ),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ]);
    // A label value holds 63 characters; longer Gateway names are in the annotation only.
    if gateway.name.len() <= 63 {
        object_labels.insert(labels::GATEWAY_NAME.to_owned(), gateway.name.clone());
    }
    let mut annotations = service.annotations.clone();
    annotations.insert(
        super::render::CONTROLLER_ANNOTATION.to_owned(),
        controller_name.to_owned(),
    );
    annotations.insert(GATEWAY_ANNOTATION.to_owned(), gateway.to_string());
    let ports: Vec<Value> = service
        .ports
        .iter()
        .map(|p| {
            json!({
                "name": format!("{}-{}", p.transport.as_str().to_ascii_lowercase(), p.port),
                "port": p.port,
                "targetPort": p.internal,
                "protocol": p.transport.as_str(),
            })
        })
        .collect();
    let mut spec = json!({
        "type": "LoadBalancer",
        // Client addresses reach the proxies unchanged, as on the pool's own Service.
        "externalTrafficPolicy": "Local",
        "selector": {
            labels::NAME: labels::NAME_VALUE,
            labels::COMPONENT: labels::COMPONENT_SHARED_PROXY,
        },
        "ports": ports,
    });
    // The one field load-balancer providers commonly honour; with several addresses nothing
    // is asked and the Gateway's status says why (as for dedicated proxies).
    if let [ip] = service.addresses.as_slice() {
        spec["loadBalancerIP"] = json!(ip.to_string());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service.name,
            "namespace": namespace,
            "labels": object_labels,
            "annotations": annotations,
        },
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::gateway_services::{ServicePort, Transport};

    #[test]
    fn a_gateway_service_selects_the_shared_proxies_and_maps_ports_to_internal_ones() {
        let service = GatewayService {
            name: "web-shop-1234abcd".into(),
            ports: vec![
                ServicePort {
                    port: 53,
                    transport: Transport::Udp,
                    internal: 20000,
                },
                ServicePort {
                    port: 80,
                    transport: Transport::Tcp,
                    internal: 20001,
                },
            ],
            addresses: vec!["10.97.3.250".parse().unwrap()],
            labels: [(labels::COMPONENT.to_owned(), "mine".to_owned())].into(),
            annotations: [("note".to_owned(), "hello".to_owned())].into(),
        };
        let v = render(
            "coxswain-system",
            "coxswain-labs.dev/gateway-controller",
            &ObjectKey::new("shop", "web"),
            &service,
        );
        assert_eq!(v["metadata"]["namespace"], "coxswain-system");
        assert_eq!(
            v["metadata"]["labels"][labels::COMPONENT],
            labels::COMPONENT_GATEWAY_SERVICE,
            "our labels win over spec.infrastructure's"
        );
        assert_eq!(v["metadata"]["labels"][labels::GATEWAY_NAME], "web");
        assert_eq!(v["metadata"]["annotations"]["note"], "hello");
        assert_eq!(v["metadata"]["annotations"][GATEWAY_ANNOTATION], "shop/web");
        assert_eq!(
            v["spec"]["selector"][labels::COMPONENT],
            labels::COMPONENT_SHARED_PROXY
        );
        assert_eq!(
            v["spec"]["ports"],
            json!([
                {"name": "udp-53", "port": 53, "targetPort": 20000, "protocol": "UDP"},
                {"name": "tcp-80", "port": 80, "targetPort": 20001, "protocol": "TCP"},
            ])
        );
        assert_eq!(v["spec"]["loadBalancerIP"], "10.97.3.250");
    }
}
