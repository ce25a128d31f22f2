//! `CoxswainAccessPolicy`: who may use a route and how often, for Gateway API routes.
//!
//! A policy attached by `targetRefs` (GEP-713) to HTTPRoutes and GRPCRoutes (or one named rule
//! of one) and Gateways (or one named listener) in its own namespace. The Gateway API has no field for
//! Basic authentication or rate limits; Ingresses get the same through annotations.

use super::backendpolicy::PolicyAncestorStatus;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Access control for the routes it targets.
///
/// Each feature (`basicAuth`, `rateLimit`) is taken from the most specific policy that sets
/// it: a policy on an HTTPRoute rule, then on the HTTPRoute, then on the Gateway listener,
/// then on the Gateway. Of two policies on the same target the older holds it
/// (creationTimestamp, then name); the other is `Accepted=False` with reason `Conflicted`.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "gateway.coxswain-labs.dev",
    version = "v1alpha1",
    kind = "CoxswainAccessPolicy",
    plural = "coxswainaccesspolicies",
    singular = "coxswainaccesspolicy",
    shortname = "cxap",
    category = "coxswain",
    namespaced,
    status = "CoxswainAccessPolicyStatus",
    doc = "Basic authentication, JWT validation and rate limits (per proxy or global) for HTTPRoutes, GRPCRoutes and Gateways, attached by targetRefs.",
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.ancestors[0].conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(
    "has(self.basicAuth) || has(self.jwt) || has(self.rateLimit) || has(self.globalRateLimit)"
).message("set basicAuth, jwt, rateLimit, globalRateLimit or several"))]
#[serde(rename_all = "camelCase")]
pub struct CoxswainAccessPolicySpec {
    /// The HTTPRoutes, GRPCRoutes and Gateways this policy applies to, in the policy's own
    /// namespace.
    #[schemars(length(min = 1, max = 16))]
    pub target_refs: Vec<AccessPolicyTargetRef>,

    /// Requests must carry a user and password of an htpasswd list, else 401.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,

    /// Requests must carry a JSON Web Token (`Authorization: Bearer`) one of these providers
    /// signed, else 401.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwt: Option<Jwt>,

    /// Requests over this rate (or over this many in progress) are answered 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,

    /// Requests over this rate, counted once for every proxy replica by a rate limit
    /// service, are answered 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_rate_limit: Option<GlobalRateLimit>,
}

/// A limit shared by every proxy replica: each request is put to a rate limit service
/// speaking Envoy's `envoy.service.ratelimit.v3` protocol over gRPC (envoyproxy/ratelimit with
/// Redis, Limitador, ...), which keeps the count. The request is described to it with the
/// entries `coxswain_policy` (namespace/name of this policy) and, by `key`, `remote_address`
/// (the client's address) or the header's lower-case name (its value).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.unit) || has(self.requests)")
    .message("unit goes with requests"))]
pub struct GlobalRateLimit {
    /// The rate limit service: a Service port in the policy's namespace (gRPC; TLS when a
    /// BackendTLSPolicy targets the Service).
    pub service: ServicePort,

    /// The service's configuration domain. Default: coxswain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub domain: Option<String>,

    /// Requests per `unit` and key, sent with each request as the descriptor's limit
    /// override. Unset: the service's own configuration for the descriptor decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000_000))]
    pub requests: Option<u32>,

    /// Second (default), Minute, Hour or Day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<RateUnit>,

    /// What a count belongs to. Default: the client's address. Route: one count for all the
    /// requests of the policy's targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<RateLimitKey>,

    /// Clients (address blocks such as 10.0.0.0/8, or single addresses) never counted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub exempt: Vec<String>,

    /// What happens to a request when the service cannot answer in time: Open (default, as
    /// Envoy's) lets it through, Closed answers 503.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<FailureMode>,

    /// How long to wait for the service, in milliseconds. Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub timeout_milliseconds: Option<u32>,
}

/// A port of a Service in the policy's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ServicePort {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum FailureMode {
    #[default]
    Open,
    Closed,
}

/// JWT validation (RFC 7519): the signature, `iss`, `aud`, `exp` and `nbf` are checked by the
/// proxy against keys the controller reads from the provider's JWKS; `alg: none` and HS*
/// tokens are always refused.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Jwt {
    /// A token is accepted when one provider accepts it.
    #[schemars(length(min = 1, max = 8))]
    pub providers: Vec<JwtProvider>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JwtProvider {
    /// Names the provider in status messages.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,

    /// The token's `iss` must be this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub issuer: Option<String>,

    /// The token's `aud` must name one of these; unset: not checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub audiences: Vec<String>,

    /// Where the provider's public keys (a JWKS document, RFC 7517) are. A new document there
    /// (an updated object, or a refresh of the URL that returns new keys) rotates the keys on
    /// every proxy without a restart.
    pub jwks: JwksRef,

    /// Claims (string, number or boolean) copied into request fields for the backend; a
    /// client's own value of such a field never reaches it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub claims_to_headers: Vec<ClaimToHeader>,

    /// Leeway for `exp` and `nbf`, in seconds. Default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 600))]
    pub clock_skew_seconds: Option<u32>,
}

/// Where a provider's JWKS document is: a ConfigMap or Secret in the policy's namespace
/// (`name`), or an HTTPS URL the controller fetches (`remote`). Set exactly one of the two.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.kind) || self.kind in ['ConfigMap', 'Secret']")
    .message("kind is ConfigMap or Secret"))]
#[x_kube(validation = Rule::new("has(self.name) != has(self.remote)")
    .message("set name (a ConfigMap or Secret) or remote (a URL), exactly one"))]
#[x_kube(validation = Rule::new("!has(self.remote) || (!has(self.kind) && !has(self.key))")
    .message("kind and key go with name, not with remote"))]
pub struct JwksRef {
    /// ConfigMap (default) or Secret; with `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,

    /// The ConfigMap or Secret holding the document, in the policy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,

    /// The key holding the document, with `name`. Default: jwks.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,

    /// A JWKS URL (an identity provider's `jwks_uri`) that the controller fetches and ships to
    /// the proxies in their snapshots; proxies never reach the provider themselves. A refresh
    /// that fails keeps the last good document; until a first fetch succeeds the provider is
    /// left out and the policy's Accepted message says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteJwks>,
}

/// A JWKS document the controller fetches over HTTPS.
///
/// The controller GETs `uri` every `refreshSeconds` (10 s timeout, documents up to 256 KiB,
/// redirects not followed) and ships each new document to the proxies without a restart. When
/// a refresh fails, or returns a document without a usable key, the last good document stays
/// in use and the fetch is retried with backoff. Until a first fetch succeeds the provider is
/// left out (the policy's Accepted message says why); with no provider left, the policy's
/// rules answer 503.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteJwks {
    /// The document's URL: https only, without user information, e.g.
    /// `https://idp.example.com/.well-known/jwks.json`. The controller must be able to reach
    /// it (mind egress NetworkPolicies of its namespace).
    #[schemars(
        length(min = 9, max = 2048),
        regex(pattern = r"^https://[^\s/?#@]+([/?#]\S*)?$")
    )]
    pub uri: String,

    /// CA certificates the server's certificate may chain to, besides the system's (for a
    /// provider with a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleRef>,

    /// How often the document is fetched again, in seconds. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 86_400))]
    pub refresh_seconds: Option<u32>,
}

/// A ConfigMap in the policy's namespace holding PEM CA certificates.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaBundleRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// The key holding the certificates. Default: ca.crt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimToHeader {
    #[schemars(length(min = 1, max = 256))]
    pub claim: String,

    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
    )]
    pub header: String,
}

/// A route or Gateway in the policy's namespace, optionally one named rule or listener.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.group == 'gateway.networking.k8s.io' && self.kind in ['HTTPRoute', 'GRPCRoute', 'Gateway']"
).message("only HTTPRoutes, GRPCRoutes and Gateways can be targeted: group gateway.networking.k8s.io"))]
pub struct AccessPolicyTargetRef {
    /// API group of the target: gateway.networking.k8s.io.
    #[schemars(length(max = 253))]
    pub group: String,

    /// HTTPRoute, GRPCRoute or Gateway.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,

    #[schemars(length(min = 1, max = 253))]
    pub name: String,

    /// A route rule's name or a Gateway listener's name; without it, all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub section_name: Option<String>,
}

/// Basic authentication (RFC 7617) against an htpasswd list.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BasicAuth {
    /// An Opaque Secret in the policy's namespace whose key `auth` holds an htpasswd file
    /// (`htpasswd -c auth user`): bcrypt, Apache MD5, {SHA}, {SSHA} or {PLAIN} hashes.
    pub secret_ref: SecretName,

    /// Sent in `WWW-Authenticate: Basic realm="..."`. Default: "Authentication Required".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), regex(pattern = r#"^[^"\\\x00-\x1f\x7f]*$"#))]
    pub realm: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretName {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A limit each proxy replica keeps on its own: a bucket per key holding `burst` + 1
/// requests, refilled at `requests` per `unit`; and/or at most `maxInProgress` requests of a
/// key at once.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.requests) || has(self.maxInProgress)")
    .message("set requests, maxInProgress or both"))]
pub struct RateLimit {
    /// Requests per `unit` and key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub requests: Option<u32>,

    /// Second (default), Minute, Hour or Day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<RateUnit>,

    /// Requests above the rate let through at once. Default 0: exactly the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000))]
    pub burst: Option<u32>,

    /// Requests of one key in progress at once, at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_in_progress: Option<u32>,

    /// What a bucket belongs to. Default: the client's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<RateLimitKey>,

    /// Clients (address blocks such as 10.0.0.0/8, or single addresses) never limited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub exempt: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RateUnit {
    #[default]
    Second,
    Minute,
    Hour,
    Day,
}

impl RateUnit {
    pub fn millis(self) -> u64 {
        match self {
            Self::Second => 1_000,
            Self::Minute => 60_000,
            Self::Hour => 3_600_000,
            Self::Day => 86_400_000,
        }
    }
}

/// What a rate-limit bucket belongs to.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.type == 'Header' ? has(self.header) : !has(self.header)"
).message("header is required with type Header and allowed only with it"))]
pub struct RateLimitKey {
    /// ClientAddress (after trusted proxies and the PROXY protocol), Header (one bucket per
    /// value of `header`; requests without it share one), or Route (one bucket for all).
    #[serde(rename = "type")]
    pub type_: RateLimitKeyType,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
    )]
    pub header: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RateLimitKeyType {
    #[default]
    ClientAddress,
    Header,
    Route,
}

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CoxswainAccessPolicyStatus {
    /// One entry per Gateway the policy takes effect under (GEP-713 PolicyAncestorStatus);
    /// while none does, the first target itself, so problems are still reported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub ancestors: Vec<PolicyAncestorStatus>,
}
