//! Coxswain's contracts, shared by the controller and the data plane.
//!
//! - [`crd`]: the custom resources (`CoxswainGatewayParameters`, `CoxswainIngressClassParameters`,
//!   `CoxswainBackendPolicy`, `CoxswainAccessPolicy`)
//!   and the generated CRD manifests, whose only source is these Rust types.
//! - [`names`]: every well-known name (controller name, labels, Lease, Services, ports, token
//!   audience, SPIFFE IDs) so no other crate spells one.
//! - [`snapshot`]: the compiled routing snapshot a proxy serves (protobuf).
//! - [`discovery`]: the controller-proxy protocol (gRPC): SVID bootstrap and the snapshot stream.
//! - [`ext_authz`]: Envoy's external authorization protocol, which the proxy speaks to
//!   authorization services.
//! - [`ratelimit`]: Envoy's rate limit service protocol, which the proxy speaks for global
//!   rate limits.
//!
//! This crate depends on kube's derive and core types only, never on its client: the proxy
//! links it and must hold no Kubernetes credentials.
#![forbid(unsafe_code)]

pub mod crd;
pub mod discovery;
pub mod ext_authz;
pub mod names;
pub mod ratelimit;
pub mod snapshot;

pub use crd::accesspolicy::{
    AccessPolicyTargetRef, CaBundleRef, ClaimToHeader, CoxswainAccessPolicy,
    CoxswainAccessPolicySpec, CoxswainAccessPolicyStatus, FailureMode, GlobalRateLimit, JwksRef,
    Jwt, JwtProvider, RateLimit, RateLimitKey, RateLimitKeyType, RateUnit, RemoteJwks, SecretName,
    ServicePort,
};
pub use crd::backendpolicy::{
    AncestorRef, BackendPolicyTargetRef, ConsistentHash, CoxswainBackendPolicy,
    CoxswainBackendPolicySpec, CoxswainBackendPolicyStatus, HashName, LoadBalancer,
    LoadBalancerType, PolicyAncestorStatus, SourceIp,
};
pub use crd::gateway::{
    Autoscaling, CoxswainGatewayParameters, CoxswainGatewayParametersSpec,
    CoxswainGatewayParametersStatus, NamespacedName, ServiceType,
};
pub use crd::ingress::{
    CoxswainIngressClassParameters, CoxswainIngressClassParametersSpec,
    CoxswainIngressClassParametersStatus,
};
