//! Renders a dedicated Gateway's proxy objects from its effective parameters. Pure: the same
//! inputs always give the same objects, so reconciles are idempotent and testable offline.

use coxswain_api::crd::gateway::{
    ClientAddress, CoxswainGatewayParametersSpec, ServiceType, Tracing,
};
use coxswain_api::names::{self, labels};
use gateway_api::apis::standard::gateways::Gateway;
use k8s_openapi::DeepMerge;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::autoscaling::v2::{
    HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec, MetricTarget,
    ResourceMetricSource,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, ObjectFieldSelector, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ProjectedVolumeSource, SeccompProfile, SecurityContext, Service,
    ServiceAccount, ServiceAccountTokenProjection, ServicePort, ServiceSpec, Toleration, Volume,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// Names the controller (its `controllerName`) that rendered a dedicated proxy object.
pub const CONTROLLER_ANNOTATION: &str = "gateway.coxswain-labs.dev/controller-name";
/// The proxy container's name; podTemplate entries with this name patch it.
pub const PROXY_CONTAINER: &str = "proxy";
/// Non-root user and group of the proxy (the distroless "nonroot" ids).
const PROXY_UID: i64 = 65532;
const TOKEN_DIR: &str = "/var/run/secrets/coxswain";
const TRUST_DIR: &str = "/var/run/coxswain/trust";
/// The last applied snapshot (`--snapshot-cache-dir`), on an emptyDir: a restarted container
/// serves it at once, even with the controller away; a new Pod starts empty.
const SNAPSHOT_CACHE_DIR: &str = "/var/run/coxswain/snapshot";
/// The proxy keeps accepting for 5 s after SIGTERM, then drains for up to 15 s (its defaults),
/// inside this.
const TERMINATION_GRACE_SECONDS: i64 = 30;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RenderError {
    #[error("podTemplate of {layer} is not a valid PodTemplateSpec: {message}")]
    PodTemplate { layer: String, message: String },
    #[error("autoscaling is enabled in {layer} without maxReplicas")]
    AutoscalingWithoutMax { layer: String },
    #[error("the Gateway has no name or namespace")]
    Unnamed,
    #[error("clientAddress.trustedProxies of {layer}: {source}")]
    TrustedProxies {
        layer: String,
        #[source]
        source: coxswain_proxy::policy::BadCidr,
    },
    #[error("tracing of {layer}: {source}")]
    Tracing {
        layer: String,
        #[source]
        source: coxswain_proxy::trace::SettingsError,
    },
}

/// What a reconcile knows: the Gateway, both parameter layers, and the controller's settings.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub gateway: &'a Gateway,
    pub class_params: Option<&'a CoxswainGatewayParametersSpec>,
    pub gateway_params: Option<&'a CoxswainGatewayParametersSpec>,
    /// Names the parameter objects in error messages.
    pub class_params_name: &'a str,
    pub gateway_params_name: &'a str,
    pub controller_namespace: &'a str,
    /// This controller's `controllerName`, recorded on every object.
    pub controller_name: &'a str,
    pub default_image: &'a str,
    pub trust_bundle_pem: &'a str,
    /// Name of every object: `{gateway}-{gatewayclass}` unless another Gateway holds it
    /// (see [`crate::compile::proxies`]).
    pub proxy_name: &'a str,
}

/// Every object of one dedicated proxy, named `inputs.proxy_name`.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub name: String,
    pub service_account: ServiceAccount,
    pub trust_bundle: ConfigMap,
    pub deployment: Deployment,
    pub service: Service,
    pub autoscaler: Option<HorizontalPodAutoscaler>,
    pub disruption_budget: Option<PodDisruptionBudget>,
    /// Security settings a podTemplate tried to change, restored; each becomes an Event.
    pub overrides: Vec<String>,
}

/// Field-by-field: the Gateway's layer wins, the class's fills the rest (podTemplate is merged
/// separately).
pub fn effective(
    class: Option<&CoxswainGatewayParametersSpec>,
    gateway: Option<&CoxswainGatewayParametersSpec>,
) -> CoxswainGatewayParametersSpec {
    let pick = |f: &dyn Fn(&CoxswainGatewayParametersSpec) -> bool| {
        gateway.filter(|g| f(g)).or(class.filter(|c| f(c)))
    };
    let class_auto = class.and_then(|c| c.autoscaling.as_ref());
    let gateway_auto = gateway.and_then(|g| g.autoscaling.as_ref());
    let autoscaling = match (class_auto, gateway_auto) {
        (None, None) => None,
        (c, g) => Some(coxswain_api::crd::gateway::Autoscaling {
            enabled: g.and_then(|a| a.enabled).or(c.and_then(|a| a.enabled)),
            min_replicas: g
                .and_then(|a| a.min_replicas)
                .or(c.and_then(|a| a.min_replicas)),
            max_replicas: g
                .and_then(|a| a.max_replicas)
                .or(c.and_then(|a| a.max_replicas)),
            target_cpu_utilization_percentage: g
                .and_then(|a| a.target_cpu_utilization_percentage)
                .or(c.and_then(|a| a.target_cpu_utilization_percentage)),
        }),
    };
    CoxswainGatewayParametersSpec {
        replicas: pick(&|p| p.replicas.is_some()).and_then(|p| p.replicas),
        image: pick(&|p| p.image.is_some()).and_then(|p| p.image.clone()),
        resources: pick(&|p| p.resources.is_some()).and_then(|p| p.resources.clone()),
        service_type: pick(&|p| p.service_type.is_some()).and_then(|p| p.service_type),
        pod_template: None,
        autoscaling,
        client_address: client_address(class, gateway),
        tracing: tracing(class, gateway),
    }
}

/// tracing field by field: each of the Gateway's fields wins over the class's.
fn tracing(
    class: Option<&CoxswainGatewayParametersSpec>,
    gateway: Option<&CoxswainGatewayParametersSpec>,
) -> Option<Tracing> {
    let c = class.and_then(|c| c.tracing.as_ref());
    let g = gateway.and_then(|g| g.tracing.as_ref());
    if c.is_none() && g.is_none() {
        return None;
    }
    Some(Tracing {
        endpoint: g
            .and_then(|g| g.endpoint.clone())
            .or_else(|| c.and_then(|c| c.endpoint.clone())),
        sampling_ratio: g
            .and_then(|g| g.sampling_ratio)
            .or(c.and_then(|c| c.sampling_ratio)),
    })
}

/// The first tracing field of either layer the proxy would refuse: an endpoint that is not
/// `http://host:port`, or a sampling ratio outside 0..=1.
pub fn check_tracing(
    layers: &[(&str, Option<&CoxswainGatewayParametersSpec>)],
) -> Result<(), RenderError> {
    for (layer, spec) in layers {
        let Some(t) = spec.and_then(|s| s.tracing.as_ref()) else {
            continue;
        };
        let checked = t
            .endpoint
            .as_deref()
            .map_or(Ok(()), coxswain_proxy::trace::check_endpoint)
            .and_then(|()| {
                t.sampling_ratio
                    .map_or(Ok(()), coxswain_proxy::trace::check_ratio)
            });
        checked.map_err(|source| RenderError::Tracing {
            layer: (*layer).to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// clientAddress field by field: each of the Gateway's fields wins over the class's.
fn client_address(
    class: Option<&CoxswainGatewayParametersSpec>,
    gateway: Option<&CoxswainGatewayParametersSpec>,
) -> Option<ClientAddress> {
    let c = class.and_then(|c| c.client_address.as_ref());
    let g = gateway.and_then(|g| g.client_address.as_ref());
    if c.is_none() && g.is_none() {
        return None;
    }
    let trusted = g
        .map(|g| &g.trusted_proxies)
        .filter(|t| !t.is_empty())
        .or(c.map(|c| &c.trusted_proxies))
        .cloned()
        .unwrap_or_default();
    Some(ClientAddress {
        trusted_proxies: trusted,
        proxy_protocol: g
            .and_then(|g| g.proxy_protocol)
            .or(c.and_then(|c| c.proxy_protocol)),
    })
}

/// The first trusted-proxy entry of either layer that is not an address block.
pub fn check_client_address(
    layers: &[(&str, Option<&CoxswainGatewayParametersSpec>)],
) -> Result<(), RenderError> {
    for (layer, spec) in layers {
        if let Some(a) = spec.and_then(|s| s.client_address.as_ref()) {
            coxswain_proxy::policy::AddressSet::parse(&a.trusted_proxies).map_err(|source| {
                RenderError::TrustedProxies {
                    layer: (*layer).to_owned(),
                    source,
                }
            })?;
        }
    }
    Ok(())
}

pub fn render(inputs: &Inputs<'_>) -> Result<Rendered, RenderError> {
    let gw = inputs.gateway;
    let (Some(gw_name), Some(ns)) = (
        gw.metadata.name.as_deref(),
        gw.metadata.namespace.as_deref(),
    ) else {
        return Err(RenderError::Unnamed);
    };
    let name = inputs.proxy_name.to_owned();
    let layers = [
        (inputs.class_params_name, inputs.class_params),
        (inputs.gateway_params_name, inputs.gateway_params),
    ];
    check_client_address(&layers)?;
    check_tracing(&layers)?;
    let params = effective(inputs.class_params, inputs.gateway_params);
    let infra = gw.spec.infrastructure.as_ref();

    let selector: BTreeMap<String, String> = [
        (labels::NAME.to_owned(), labels::NAME_VALUE.to_owned()),
        (
            labels::COMPONENT.to_owned(),
            labels::COMPONENT_DEDICATED_PROXY.to_owned(),
        ),
        (labels::INSTANCE.to_owned(), name.clone()),
    ]
    .into();
    // spec.infrastructure.labels/annotations go on every object (GEP-1867); ours win on clash.
    let mut object_labels: BTreeMap<String, String> =
        infra.and_then(|i| i.labels.clone()).unwrap_or_default();
    object_labels.extend(selector.clone());
    object_labels.insert(labels::GATEWAY_NAME.to_owned(), gw_name.to_owned());
    object_labels.insert(
        labels::MANAGED_BY.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    );
    let annotations = infra
        .and_then(|i| i.annotations.clone())
        .filter(|a| !a.is_empty());
    // Which controller made the object (controller names are not valid label values): on a
    // cluster with several, each cleans up only its own.
    let mut object_annotations = annotations.clone().unwrap_or_default();
    object_annotations.insert(
        CONTROLLER_ANNOTATION.to_owned(),
        inputs.controller_name.to_owned(),
    );
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        labels: Some(object_labels.clone()),
        annotations: Some(object_annotations.clone()),
        owner_references: Some(vec![OwnerReference {
            api_version: "gateway.networking.k8s.io/v1".into(),
            kind: "Gateway".into(),
            name: gw_name.to_owned(),
            uid: gw.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    };

    let mut ports: Vec<ListenPort> = gw
        .spec
        .listeners
        .iter()
        .map(|l| ListenPort {
            port: l.port,
            udp: l.protocol.eq_ignore_ascii_case("UDP"),
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    let low_port = ports.iter().any(|p| p.port < 1024);

    let trust_name = format!("{name}-trust");
    let base = proxy_pod_template(&ProxyPod {
        name: &name,
        gateway: gw_name,
        namespace: ns,
        controller_namespace: inputs.controller_namespace,
        image: params.image.as_deref().unwrap_or(inputs.default_image),
        resources: params.resources.clone(),
        ports: &ports,
        trust_configmap: &trust_name,
        labels: object_labels.clone(),
        annotations: annotations.clone(),
        client_address: params.client_address.as_ref(),
        tracing: params.tracing.as_ref(),
    });
    let (template, overrides) = merge_pod_templates(
        base,
        &[
            (inputs.class_params_name, inputs.class_params),
            (inputs.gateway_params_name, inputs.gateway_params),
        ],
        low_port,
        &name,
    )?;

    let auto = params
        .autoscaling
        .as_ref()
        .filter(|a| a.enabled == Some(true));
    let replicas = params.replicas.unwrap_or(1);
    let autoscaler = match auto {
        None => None,
        Some(a) => {
            let Some(max) = a.max_replicas else {
                let layer = if inputs
                    .gateway_params
                    .and_then(|g| g.autoscaling.as_ref())
                    .is_some_and(|g| g.enabled == Some(true))
                {
                    inputs.gateway_params_name
                } else {
                    inputs.class_params_name
                };
                return Err(RenderError::AutoscalingWithoutMax {
                    layer: layer.to_owned(),
                });
            };
            Some(HorizontalPodAutoscaler {
                metadata: meta(&name),
                spec: HorizontalPodAutoscalerSpec {
                    scale_target_ref:
                        k8s_openapi::api::autoscaling::v2::CrossVersionObjectReference {
                            api_version: Some("apps/v1".into()),
                            kind: "Deployment".into(),
                            name: name.clone(),
                        },
                    min_replicas: Some(a.min_replicas.unwrap_or(1)),
                    max_replicas: max,
                    metrics: Some(vec![MetricSpec {
                        type_: "Resource".into(),
                        resource: Some(ResourceMetricSource {
                            name: "cpu".into(),
                            target: MetricTarget {
                                type_: "Utilization".into(),
                                average_utilization: Some(
                                    a.target_cpu_utilization_percentage.unwrap_or(80),
                                ),
                                ..Default::default()
                            },
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                ..Default::default()
            })
        }
    };
    let floor = match auto {
        Some(a) => a.min_replicas.unwrap_or(1),
        None => replicas,
    };
    let disruption_budget = (floor >= 2).then(|| PodDisruptionBudget {
        metadata: meta(&name),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });

    let deployment = Deployment {
        metadata: meta(&name),
        spec: Some(DeploymentSpec {
            // With an autoscaler the replica count is its to set.
            replicas: auto.is_none().then_some(replicas),
            selector: LabelSelector {
                match_labels: Some(selector.clone()),
                ..Default::default()
            },
            template,
            ..Default::default()
        }),
        ..Default::default()
    };
    let service = Service {
        metadata: meta(&name),
        spec: Some(ServiceSpec {
            type_: Some(
                params
                    .service_type
                    .unwrap_or(ServiceType::LoadBalancer)
                    .as_str()
                    .to_owned(),
            ),
            selector: Some(selector),
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        name: Some(p.name()),
                        port: p.port,
                        target_port: Some(IntOrString::Int(p.port)),
                        protocol: Some(p.protocol().into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let service_account = ServiceAccount {
        metadata: meta(&name),
        // The proxy has no Kubernetes credentials: its one token is the projected,
        // discovery-audience one.
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    let trust_bundle = ConfigMap {
        metadata: meta(&trust_name),
        data: Some([("ca.crt".to_owned(), inputs.trust_bundle_pem.to_owned())].into()),
        ..Default::default()
    };
    Ok(Rendered {
        name,
        service_account,
        trust_bundle,
        deployment,
        service,
        autoscaler,
        disruption_budget,
        overrides,
    })
}

struct ProxyPod<'a> {
    name: &'a str,
    gateway: &'a str,
    namespace: &'a str,
    controller_namespace: &'a str,
    image: &'a str,
    resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    ports: &'a [ListenPort],
    trust_configmap: &'a str,
    labels: BTreeMap<String, String>,
    annotations: Option<BTreeMap<String, String>>,
    client_address: Option<&'a ClientAddress>,
    tracing: Option<&'a Tracing>,
}

/// A port a Gateway's listeners use, with its transport: UDP listeners need UDP Service and
/// container ports (a TCP listener may use the same number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ListenPort {
    port: i32,
    udp: bool,
}

impl ListenPort {
    fn protocol(self) -> &'static str {
        if self.udp { "UDP" } else { "TCP" }
    }

    /// Service port names are unique per Service; TCP keeps the name it always had.
    fn name(self) -> String {
        if self.udp {
            format!("udp-{}", self.port)
        } else {
            format!("port-{}", self.port)
        }
    }
}

fn proxy_security_context(low_port: bool) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: low_port.then(|| vec!["NET_BIND_SERVICE".into()]),
        }),
        ..Default::default()
    }
}

fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(PROXY_UID),
        run_as_group: Some(PROXY_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn proxy_pod_template(p: &ProxyPod<'_>) -> PodTemplateSpec {
    let low_port = p.ports.iter().any(|port| port.port < 1024);
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("health".into()),
            ..Default::default()
        }),
        period_seconds: Some(5),
        ..Default::default()
    };
    let mut container_ports: Vec<ContainerPort> = p
        .ports
        .iter()
        .map(|port| ContainerPort {
            container_port: port.port,
            protocol: Some(port.protocol().into()),
            ..Default::default()
        })
        .collect();
    container_ports.push(ContainerPort {
        name: Some("health".into()),
        container_port: i32::from(names::HEALTH_PORT),
        protocol: Some("TCP".into()),
        ..Default::default()
    });
    container_ports.push(ContainerPort {
        name: Some("metrics".into()),
        container_port: i32::from(names::METRICS_PORT),
        protocol: Some("TCP".into()),
        ..Default::default()
    });
    let controller = p.controller_namespace;
    let mut args: Vec<String> = vec![
        "serve".into(),
        "proxy".into(),
        "--dedicated".into(),
        "--gateway-name".into(),
        p.gateway.to_owned(),
        "--gateway-namespace".into(),
        p.namespace.to_owned(),
        "--discovery-endpoint".into(),
        format!(
            "https://{}.{controller}.svc:{}",
            names::DISCOVERY_SERVICE,
            names::DISCOVERY_PORT
        ),
        "--discovery-bootstrap-endpoint".into(),
        format!(
            "https://{}.{controller}.svc:{}",
            names::BOOTSTRAP_SERVICE,
            names::BOOTSTRAP_PORT
        ),
        "--snapshot-cache-dir".into(),
        SNAPSHOT_CACHE_DIR.into(),
    ];
    if let Some(a) = p.client_address {
        if !a.trusted_proxies.is_empty() {
            args.push("--trusted-proxies".into());
            args.push(a.trusted_proxies.join(","));
        }
        if a.proxy_protocol == Some(true) {
            args.push("--proxy-protocol".into());
        }
    }
    // Without an endpoint a ratio means nothing: no flag, tracing stays off.
    if let Some(t) = p.tracing
        && let Some(endpoint) = &t.endpoint
    {
        args.push("--otlp-endpoint".into());
        args.push(endpoint.clone());
        if let Some(ratio) = t.sampling_ratio {
            args.push("--trace-sampling-ratio".into());
            args.push(ratio.to_string());
        }
    }
    let container = Container {
        name: PROXY_CONTAINER.into(),
        image: Some(p.image.to_owned()),
        args: Some(args),
        env: Some(vec![EnvVar {
            name: "COXSWAIN_POD_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ports: Some(container_ports),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        resources: p.resources.clone(),
        security_context: Some(proxy_security_context(low_port)),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "discovery-token".into(),
                mount_path: TOKEN_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: "discovery-trust".into(),
                mount_path: TRUST_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: "snapshot-cache".into(),
                mount_path: SNAPSHOT_CACHE_DIR.into(),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(p.labels.clone()),
            annotations: p.annotations.clone(),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(p.name.to_owned()),
            automount_service_account_token: Some(false),
            security_context: Some(pod_security_context()),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            containers: vec![container],
            volumes: Some(vec![
                Volume {
                    name: "discovery-token".into(),
                    projected: Some(ProjectedVolumeSource {
                        sources: Some(vec![VolumeProjection {
                            service_account_token: Some(ServiceAccountTokenProjection {
                                audience: Some(names::TOKEN_AUDIENCE.into()),
                                expiration_seconds: Some(3600),
                                path: "token".into(),
                            }),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "discovery-trust".into(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: p.trust_configmap.to_owned(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Volume {
                    name: "snapshot-cache".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
    }
}

/// Strategic-merges each layer's podTemplate onto `base` in order (k8s-openapi's DeepMerge
/// follows the API's merge keys, as `kubectl apply` does: containers, initContainers, volumes,
/// env and imagePullSecrets by name, ports by containerPort, volumeMounts by mountPath; maps
/// merged; other lists replaced). Tolerations are the one exception: merged by key and
/// operator, so a Gateway can add one to its class's. Then the security settings are restored.
pub fn merge_pod_templates(
    base: PodTemplateSpec,
    layers: &[(&str, Option<&CoxswainGatewayParametersSpec>)],
    low_port: bool,
    service_account: &str,
) -> Result<(PodTemplateSpec, Vec<String>), RenderError> {
    let mut merged = base;
    let mut tolerations: Vec<Toleration> = merged
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    for (layer, params) in layers {
        let Some(raw) = params.and_then(|p| p.pod_template.as_ref()) else {
            continue;
        };
        let overlay: PodTemplateSpec =
            serde_json::from_value(raw.clone()).map_err(|e| RenderError::PodTemplate {
                layer: (*layer).to_owned(),
                message: e.to_string(),
            })?;
        // Containers merge by name: a nameless one could only be appended as invalid.
        if let Some(spec) = &overlay.spec {
            for (list, containers) in [
                ("containers", &spec.containers),
                (
                    "initContainers",
                    spec.init_containers.as_ref().unwrap_or(&Vec::new()),
                ),
            ] {
                if let Some(i) = containers.iter().position(|c| c.name.is_empty()) {
                    return Err(RenderError::PodTemplate {
                        layer: (*layer).to_owned(),
                        message: format!("spec.{list}[{i}] has no name"),
                    });
                }
            }
        }
        for t in overlay
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default()
        {
            match tolerations
                .iter_mut()
                .find(|x| x.key == t.key && x.operator == t.operator)
            {
                Some(existing) => *existing = t,
                None => tolerations.push(t),
            }
        }
        let before = merged.clone();
        merged.merge_from(overlay.clone());
        order_like_kubectl(&mut merged, &before, &overlay);
    }
    let spec = merged.spec.get_or_insert_with(Default::default);
    spec.tolerations = (!tolerations.is_empty()).then_some(tolerations);
    let overrides = restore_security(&mut merged, low_port, service_account);
    Ok((merged, overrides))
}

/// DeepMerge keeps the base's order and appends new items; kubectl's strategic merge puts the
/// patch's items first, in patch order, and slots the items only the original has in between
/// where the original order allows. Order matters (env entries may refer to earlier ones), so
/// every merge-keyed list is put in kubectl's order.
fn order_like_kubectl(
    merged: &mut PodTemplateSpec,
    before: &PodTemplateSpec,
    patch: &PodTemplateSpec,
) {
    let (Some(spec), Some(patch_spec)) = (merged.spec.as_mut(), patch.spec.as_ref()) else {
        return;
    };
    let before_spec = before.spec.clone().unwrap_or_default();
    for (list, original, patched) in [
        (
            &mut spec.containers,
            &before_spec.containers,
            &patch_spec.containers,
        ),
        (
            spec.init_containers.get_or_insert_with(Vec::new),
            before_spec.init_containers.as_ref().unwrap_or(&Vec::new()),
            patch_spec.init_containers.as_ref().unwrap_or(&Vec::new()),
        ),
    ] {
        for container in list.iter_mut() {
            let (Some(orig), Some(pat)) = (
                original.iter().find(|c| c.name == container.name),
                patched.iter().find(|c| c.name == container.name),
            ) else {
                continue;
            };
            order_option(&mut container.env, &orig.env, &pat.env, |e| e.name.clone());
            order_option(&mut container.ports, &orig.ports, &pat.ports, |p| {
                p.container_port.to_string()
            });
            order_option(
                &mut container.volume_mounts,
                &orig.volume_mounts,
                &pat.volume_mounts,
                |m| m.mount_path.clone(),
            );
        }
        strategic_order(list, original, patched, |c| c.name.clone());
    }
    if spec.init_containers.as_ref().is_some_and(Vec::is_empty) {
        spec.init_containers = None;
    }
    order_option(
        &mut spec.volumes,
        &before_spec.volumes,
        &patch_spec.volumes,
        |v| v.name.clone(),
    );
    order_option(
        &mut spec.image_pull_secrets,
        &before_spec.image_pull_secrets,
        &patch_spec.image_pull_secrets,
        |s| s.name.clone(),
    );
}

fn order_option<T: Clone>(
    merged: &mut Option<Vec<T>>,
    original: &Option<Vec<T>>,
    patch: &Option<Vec<T>>,
    key: impl Fn(&T) -> String,
) {
    if let (Some(list), Some(patch)) = (merged.as_mut(), patch.as_ref()) {
        strategic_order(list, original.as_deref().unwrap_or_default(), patch, key);
    }
}

/// kubectl's order for a merged list: the patch's items in patch order ("right"), with the
/// original-only items ("left", in original order) placed before a patch item only when both
/// are in the original and the original had them in that order.
fn strategic_order<T: Clone>(
    merged: &mut Vec<T>,
    original: &[T],
    patch: &[T],
    key: impl Fn(&T) -> String,
) {
    let find = |k: &str| merged.iter().find(|m| key(m) == k).cloned();
    let in_patch = |k: &str| patch.iter().any(|p| key(p) == k);
    let right: Vec<T> = patch.iter().filter_map(|p| find(&key(p))).collect();
    let left: Vec<T> = original
        .iter()
        .filter(|o| !in_patch(&key(o)))
        .filter_map(|o| find(&key(o)))
        .collect();
    let position = |item: &T| original.iter().position(|o| key(o) == key(item));
    let mut out = Vec::with_capacity(merged.len());
    let (mut l, mut r) = (left.into_iter().peekable(), right.into_iter().peekable());
    loop {
        match (l.peek(), r.peek()) {
            (Some(a), Some(b)) => {
                let left_first = matches!((position(a), position(b)), (Some(x), Some(y)) if x < y);
                let next = if left_first { l.next() } else { r.next() };
                out.extend(next);
            }
            (Some(_), None) => out.extend(l.next()),
            (None, Some(_)) => out.extend(r.next()),
            (None, None) => break,
        }
    }
    *merged = out;
}

/// What no podTemplate may change: the proxy's identity, privileges and credentials.
fn restore_security(
    template: &mut PodTemplateSpec,
    low_port: bool,
    service_account: &str,
) -> Vec<String> {
    let mut overrides = Vec::new();
    let spec = template.spec.get_or_insert_with(Default::default);
    let mut restore = |what: &str, changed: bool| {
        if changed {
            overrides.push(format!(
                "podTemplate may not change {what}; the controller's value was restored"
            ));
        }
    };
    restore(
        "spec.serviceAccountName",
        spec.service_account_name.as_deref() != Some(service_account),
    );
    spec.service_account_name = Some(service_account.to_owned());
    restore(
        "spec.serviceAccount",
        spec.service_account
            .as_deref()
            .is_some_and(|sa| sa != service_account),
    );
    spec.service_account = None;
    restore(
        "spec.automountServiceAccountToken",
        spec.automount_service_account_token != Some(false),
    );
    spec.automount_service_account_token = Some(false);
    let pod_ctx = pod_security_context();
    restore(
        "spec.securityContext",
        spec.security_context.as_ref() != Some(&pod_ctx),
    );
    spec.security_context = Some(pod_ctx);
    for (field, value) in [
        ("spec.hostNetwork", &mut spec.host_network),
        ("spec.hostPID", &mut spec.host_pid),
        ("spec.hostIPC", &mut spec.host_ipc),
    ] {
        restore(field, *value == Some(true));
        *value = None;
    }
    for c in spec.containers.iter_mut() {
        if c.name == PROXY_CONTAINER {
            let wanted = proxy_security_context(low_port);
            restore(
                "the proxy container's securityContext",
                c.security_context.as_ref() != Some(&wanted),
            );
            c.security_context = Some(wanted);
        } else if let Some(ctx) = c.security_context.as_mut() {
            restore(
                &format!("container {}: privileged", c.name),
                ctx.privileged == Some(true),
            );
            ctx.privileged = Some(false);
            ctx.allow_privilege_escalation = Some(false);
        }
    }
    overrides
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn gateway(yaml: &str) -> Gateway {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn params(yaml: &str) -> CoxswainGatewayParametersSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    const GW: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: web, uid: "1234"}
spec:
  gatewayClassName: coxswain
  infrastructure:
    labels: {team: payments}
    annotations: {cost-center: "42"}
  listeners:
  - {name: http, port: 8080, protocol: HTTP}
  - {name: https, port: 8443, protocol: HTTPS}
"#;

    fn render_with(
        gw: &str,
        class: Option<&CoxswainGatewayParametersSpec>,
        own: Option<&CoxswainGatewayParametersSpec>,
    ) -> Result<Rendered, RenderError> {
        let gw = gateway(gw);
        render(&Inputs {
            gateway: &gw,
            class_params: class,
            gateway_params: own,
            class_params_name: "class params",
            gateway_params_name: "gateway params",
            controller_namespace: "coxswain-system",
            controller_name: "coxswain-labs.dev/gateway-controller",
            default_image: "ghcr.io/coxswain-labs/coxswain:v0.1.0",
            trust_bundle_pem: "PEM",
            proxy_name: "edge-coxswain",
        })
    }

    fn pod(r: &Rendered) -> &PodSpec {
        r.deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
    }

    #[test]
    fn gateway_parameters_win_field_by_field() {
        let class = params(
            "{replicas: 2, image: class-image, serviceType: NodePort, autoscaling: {maxReplicas: 5, targetCPUUtilizationPercentage: 60}}",
        );
        let own = params("{image: own-image, autoscaling: {enabled: false}}");
        let e = effective(Some(&class), Some(&own));
        assert_eq!(e.replicas, Some(2));
        assert_eq!(e.image.as_deref(), Some("own-image"));
        assert_eq!(e.service_type, Some(ServiceType::NodePort));
        let auto = e.autoscaling.unwrap();
        assert_eq!(auto.enabled, Some(false));
        assert_eq!(auto.max_replicas, Some(5));
        assert_eq!(auto.target_cpu_utilization_percentage, Some(60));
    }

    #[test]
    fn client_address_reaches_the_proxy_field_by_field() {
        let class = params("{clientAddress: {trustedProxies: [10.0.0.0/8], proxyProtocol: true}}");
        let own = params("{clientAddress: {trustedProxies: [192.0.2.0/24, \"2001:db8::/32\"]}}");
        let r = render_with(GW, Some(&class), Some(&own)).unwrap();
        let args = pod(&r).containers[0].args.clone().unwrap();
        let at = args.iter().position(|a| a == "--trusted-proxies").unwrap();
        assert_eq!(args[at + 1], "192.0.2.0/24,2001:db8::/32");
        assert!(args.contains(&"--proxy-protocol".to_owned()), "{args:?}");
        // Without the field, neither flag: the proxy's defaults (nothing trusted, no header).
        let r = render_with(GW, Some(&params("{replicas: 1}")), None).unwrap();
        let args = pod(&r).containers[0].args.clone().unwrap();
        assert!(
            !args
                .iter()
                .any(|a| a == "--trusted-proxies" || a == "--proxy-protocol")
        );
        // A bad block in either layer: nothing is rendered, and the error names layer and value.
        let bad = params("{clientAddress: {trustedProxies: [10.0.0.0/8, not-a-cidr]}}");
        let err = render_with(GW, Some(&bad), Some(&own)).unwrap_err();
        assert!(
            matches!(&err, RenderError::TrustedProxies { layer, source } if layer == "class params" && source.given == "not-a-cidr"),
            "{err}"
        );
    }

    #[test]
    fn tracing_reaches_the_proxy_field_by_field() {
        let class = params(
            "{tracing: {endpoint: \"http://collector.observability:4317\", samplingRatio: 0.5}}",
        );
        let own = params("{tracing: {samplingRatio: 0.01}}");
        let r = render_with(GW, Some(&class), Some(&own)).unwrap();
        let args = pod(&r).containers[0].args.clone().unwrap();
        let at = args.iter().position(|a| a == "--otlp-endpoint").unwrap();
        assert_eq!(args[at + 1], "http://collector.observability:4317");
        let at = args
            .iter()
            .position(|a| a == "--trace-sampling-ratio")
            .unwrap();
        assert_eq!(args[at + 1], "0.01");
        // A ratio without an endpoint in either layer: tracing stays off, no flag.
        let r = render_with(GW, None, Some(&own)).unwrap();
        let args = pod(&r).containers[0].args.clone().unwrap();
        assert!(
            !args
                .iter()
                .any(|a| a == "--otlp-endpoint" || a == "--trace-sampling-ratio"),
            "{args:?}"
        );
        // What the proxy would refuse is not rendered; the error names the layer and the field.
        for (bad, says) in [
            ("{tracing: {endpoint: \"collector:4317\"}}", "http://"),
            ("{tracing: {endpoint: \"http://collector\"}}", "no port"),
            ("{tracing: {samplingRatio: 2}}", "not between 0 and 1"),
        ] {
            let err = render_with(GW, Some(&class), Some(&params(bad))).unwrap_err();
            assert!(
                matches!(&err, RenderError::Tracing { layer, .. } if layer == "gateway params"),
                "{err}"
            );
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn renders_named_owned_labelled_objects() {
        let r = render_with(GW, Some(&params("{replicas: 2}")), None).unwrap();
        assert_eq!(r.name, "edge-coxswain");
        for meta in [
            &r.deployment.metadata,
            &r.service.metadata,
            &r.service_account.metadata,
            &r.trust_bundle.metadata,
        ] {
            assert_eq!(meta.namespace.as_deref(), Some("web"));
            let owner = &meta.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
                ("Gateway", "edge", "1234")
            );
            assert_eq!(owner.controller, Some(true));
            let labels = meta.labels.as_ref().unwrap();
            assert_eq!(
                labels["team"], "payments",
                "infrastructure labels propagate"
            );
            assert_eq!(labels[labels::GATEWAY_NAME], "edge");
            assert_eq!(meta.annotations.as_ref().unwrap()["cost-center"], "42");
            assert_eq!(
                meta.annotations.as_ref().unwrap()[CONTROLLER_ANNOTATION],
                "coxswain-labs.dev/gateway-controller"
            );
        }
        assert_eq!(
            r.trust_bundle.metadata.name.as_deref(),
            Some("edge-coxswain-trust")
        );
        assert_eq!(
            r.service_account.automount_service_account_token,
            Some(false)
        );
        let svc = r.service.spec.as_ref().unwrap();
        assert_eq!(
            svc.type_.as_deref(),
            Some("LoadBalancer"),
            "the default service type"
        );
        let ports: Vec<i32> = svc.ports.as_ref().unwrap().iter().map(|p| p.port).collect();
        assert_eq!(ports, [8080, 8443]);
        assert_eq!(r.deployment.spec.as_ref().unwrap().replicas, Some(2));
        assert!(r.disruption_budget.is_some(), "a floor of 2 gets a PDB");
        assert!(r.autoscaler.is_none());

        let pod = pod(&r);
        assert_eq!(pod.service_account_name.as_deref(), Some("edge-coxswain"));
        let proxy = &pod.containers[0];
        let args = proxy.args.as_ref().unwrap().join(" ");
        assert!(
            args.starts_with("serve proxy --dedicated --gateway-name edge --gateway-namespace web"),
            "{args}"
        );
        assert!(
            args.contains("https://coxswain-controller-discovery.coxswain-system.svc:50051"),
            "{args}"
        );
        let ctx = proxy.security_context.as_ref().unwrap();
        assert_eq!(ctx.read_only_root_filesystem, Some(true));
        assert_eq!(
            ctx.capabilities.as_ref().unwrap().add,
            None,
            "no NET_BIND_SERVICE above 1024"
        );
        let token = pod.volumes.as_ref().unwrap()[0]
            .projected
            .as_ref()
            .unwrap()
            .sources
            .as_ref()
            .unwrap()[0]
            .service_account_token
            .clone()
            .unwrap();
        assert_eq!(token.audience.as_deref(), Some(names::TOKEN_AUDIENCE));
        // The snapshot cache: the flag names a mounted emptyDir.
        assert!(
            args.contains(&format!("--snapshot-cache-dir {SNAPSHOT_CACHE_DIR}")),
            "{args}"
        );
        let mount = proxy
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == SNAPSHOT_CACHE_DIR)
            .unwrap();
        assert!(
            pod.volumes
                .as_ref()
                .unwrap()
                .iter()
                .any(|v| v.name == mount.name && v.empty_dir.is_some())
        );
    }

    #[test]
    fn udp_listeners_get_udp_ports_beside_tcp_ones_of_the_same_number() {
        let gw = GW.replace(
            "  - {name: https, port: 8443, protocol: HTTPS}",
            "  - {name: dns-tcp, port: 5353, protocol: TCP}\n  - {name: dns, port: 5353, protocol: UDP}",
        );
        let r = render_with(&gw, None, None).unwrap();
        let svc = r.service.spec.as_ref().unwrap();
        let ports: Vec<(&str, i32, &str)> = svc
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p.name.as_deref().unwrap(),
                    p.port,
                    p.protocol.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                ("port-5353", 5353, "TCP"),
                ("udp-5353", 5353, "UDP"),
                ("port-8080", 8080, "TCP")
            ]
        );
        let container = &pod(&r).containers[0];
        assert!(
            container
                .ports
                .as_ref()
                .unwrap()
                .iter()
                .any(|p| p.container_port == 5353 && p.protocol.as_deref() == Some("UDP"))
        );
    }

    #[test]
    fn low_ports_get_net_bind_service_only() {
        let gw = GW.replace("port: 8080", "port: 80");
        let r = render_with(&gw, None, Some(&params("{}"))).unwrap();
        let caps = pod(&r).containers[0]
            .security_context
            .as_ref()
            .unwrap()
            .capabilities
            .clone()
            .unwrap();
        assert_eq!(caps.add, Some(vec!["NET_BIND_SERVICE".to_owned()]));
        assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    }

    #[test]
    fn pod_templates_merge_by_the_api_merge_keys() {
        let class = params(
            r#"
replicas: 2
resources: {requests: {cpu: 100m}}
podTemplate:
  metadata: {labels: {tier: edge}}
  spec:
    tolerations: [{key: dedicated, operator: Equal, value: edge, effect: NoSchedule}]
    containers:
    - name: proxy
      env: [{name: LOG_LEVEL, value: info}, {name: KEEP, value: class}]
"#,
        );
        let own = params(
            r#"
image: example.com/custom:1
podTemplate:
  spec:
    tolerations: [{key: spot, operator: Exists, effect: NoSchedule}]
    containers:
    - name: proxy
      env: [{name: LOG_LEVEL, value: debug}]
    - name: sidecar
      image: example.com/sidecar:1
"#,
        );
        let r = render_with(GW, Some(&class), Some(&own)).unwrap();
        let pod = pod(&r);
        let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["proxy", "sidecar"]);
        let proxy = &pod.containers[0];
        assert_eq!(proxy.image.as_deref(), Some("example.com/custom:1"));
        let env: Vec<(String, Option<String>)> = proxy
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        assert_eq!(
            env,
            // kubectl's order: the class's patch items first, the base's own after them.
            [
                ("LOG_LEVEL".to_owned(), Some("debug".to_owned())),
                ("KEEP".to_owned(), Some("class".to_owned())),
                ("COXSWAIN_POD_NAME".to_owned(), None),
            ]
        );
        assert_eq!(
            proxy.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0,
            "100m"
        );
        assert!(
            proxy.args.is_some(),
            "the rendered args survive a partial container"
        );
        let tolerations: Vec<&str> = pod
            .tolerations
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|t| t.key.as_deref())
            .collect();
        assert_eq!(tolerations, ["dedicated", "spot"]);
        let labels = r
            .deployment
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        assert_eq!(labels["tier"], "edge");
        assert_eq!(labels[labels::INSTANCE], "edge-coxswain");
        assert!(r.overrides.is_empty(), "{:?}", r.overrides);
    }

    #[test]
    fn merged_lists_take_kubectls_order() {
        fn order(
            merged: &[&'static str],
            original: &[&'static str],
            patch: &[&'static str],
        ) -> Vec<&'static str> {
            let mut m = merged.to_vec();
            strategic_order(&mut m, original, patch, |s| s.to_string());
            m
        }
        // New patch items come before original-only ones.
        assert_eq!(
            order(&["a", "x", "y"], &["a"], &["x", "y"]),
            ["x", "y", "a"]
        );
        // Original items keep their relative order around patched ones.
        assert_eq!(
            order(&["a", "b", "c"], &["a", "b", "c"], &["b"]),
            ["a", "b", "c"]
        );
        assert_eq!(
            order(&["a", "b", "c", "n"], &["a", "b", "c"], &["c", "n", "a"]),
            ["b", "c", "n", "a"]
        );
    }

    #[test]
    fn security_settings_are_restored_and_reported() {
        let own = params(
            r#"
podTemplate:
  spec:
    serviceAccountName: cluster-admin
    hostNetwork: true
    automountServiceAccountToken: true
    securityContext: {runAsUser: 0}
    containers:
    - name: proxy
      securityContext: {privileged: true, readOnlyRootFilesystem: false}
    - name: helper
      image: example.com/helper:1
      securityContext: {privileged: true}
"#,
        );
        let r = render_with(GW, None, Some(&own)).unwrap();
        let pod = pod(&r);
        assert_eq!(pod.service_account_name.as_deref(), Some("edge-coxswain"));
        assert_eq!(pod.host_network, None);
        assert_eq!(pod.automount_service_account_token, Some(false));
        assert_eq!(
            pod.security_context.as_ref().unwrap().run_as_user,
            Some(65532)
        );
        let proxy = pod.containers[0].security_context.as_ref().unwrap();
        assert_eq!(
            (proxy.privileged, proxy.read_only_root_filesystem),
            (Some(false), Some(true))
        );
        assert_eq!(
            pod.containers[1]
                .security_context
                .as_ref()
                .unwrap()
                .privileged,
            Some(false)
        );
        let notes = r.overrides.join("\n");
        for field in [
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "spec.automountServiceAccountToken",
            "spec.securityContext",
            "the proxy container's securityContext",
            "container helper: privileged",
        ] {
            assert!(notes.contains(field), "{field} reported in:\n{notes}");
        }
    }

    #[test]
    fn autoscaling_gets_an_hpa_and_leaves_replicas_to_it() {
        let r = render_with(
            GW,
            Some(&params(
                "{replicas: 3, autoscaling: {enabled: true, minReplicas: 2, maxReplicas: 6}}",
            )),
            None,
        )
        .unwrap();
        assert_eq!(r.deployment.spec.as_ref().unwrap().replicas, None);
        let hpa = r.autoscaler.unwrap().spec;
        assert_eq!((hpa.min_replicas, hpa.max_replicas), (Some(2), 6));
        let target = &hpa.metrics.unwrap()[0].resource.clone().unwrap().target;
        assert_eq!(target.average_utilization, Some(80));
        assert!(r.disruption_budget.is_some(), "min 2 is a floor of 2");

        let single = render_with(
            GW,
            Some(&params("{autoscaling: {enabled: true, maxReplicas: 4}}")),
            None,
        )
        .unwrap();
        assert!(
            single.disruption_budget.is_none(),
            "a floor of 1 gets no PDB"
        );
    }

    #[test]
    fn invalid_parameters_are_errors_naming_their_layer() {
        let err =
            render_with(GW, None, Some(&params("{autoscaling: {enabled: true}}"))).unwrap_err();
        assert_eq!(
            err,
            RenderError::AutoscalingWithoutMax {
                layer: "gateway params".into()
            }
        );
        let err = render_with(
            GW,
            Some(&params("{podTemplate: {spec: {containers: [{image: x}]}}}")),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(&err, RenderError::PodTemplate { layer, message } if layer == "class params" && message.contains("name")),
            "{err}"
        );
    }
}
