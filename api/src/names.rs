//! Well-known names. Every crate takes them from here so that no two spell one differently.

use std::fmt;

/// `spec.controllerName` of the GatewayClass and IngressClass Coxswain serves.
pub const CONTROLLER_NAME: &str = "coxswain-labs.dev/gateway-controller";
/// Name of the GatewayClass and IngressClass that a default install creates.
pub const CLASS_NAME: &str = "coxswain";
/// Namespace the controller and the shared proxy pool run in by default.
pub const DEFAULT_NAMESPACE: &str = "coxswain-system";

/// API groups of Coxswain's own resources.
pub const GATEWAY_GROUP: &str = "gateway.coxswain-labs.dev";
pub const INGRESS_GROUP: &str = "ingress.coxswain-labs.dev";
/// Prefix of the typed Ingress annotations (`ingress.coxswain-labs.dev/<key>`).
pub const INGRESS_ANNOTATION_PREFIX: &str = "ingress.coxswain-labs.dev/";

/// Lease that elects the controller replica allowed to write status and serve discovery.
pub const LEADER_LEASE: &str = "coxswain-leader";
/// Label the leader puts on its own pod so the discovery Service routes to it.
pub const LEADER_LABEL: &str = "discovery.coxswain-labs.dev/leader";
pub const LEADER_LABEL_VALUE: &str = "true";

/// ServiceAccount of the shared proxy pool, in the controller's namespace.
pub const SHARED_PROXY_SERVICE_ACCOUNT: &str = "coxswain-proxy";
/// The shared proxy pool's client-facing Service (LoadBalancer), in the controller's namespace:
/// its address is every shared-pool Gateway's and Ingress's address.
pub const SHARED_PROXY_SERVICE: &str = "coxswain-proxy";
/// Service in front of the leader's discovery stream listener.
pub const DISCOVERY_SERVICE: &str = "coxswain-controller-discovery";
/// Service in front of every replica's bootstrap (identity) listener.
pub const BOOTSTRAP_SERVICE: &str = "coxswain-controller-discovery-bootstrap";
/// Discovery stream listener: mTLS mandatory, leader only.
pub const DISCOVERY_PORT: u16 = 50051;
/// Bootstrap identity listener: server-authenticated TLS, every replica.
pub const BOOTSTRAP_PORT: u16 = 50052;
/// Health endpoints (`/healthz`, `/readyz`) of every role.
pub const HEALTH_PORT: u16 = 8081;
/// Prometheus metrics (`/metrics`) of every role.
pub const METRICS_PORT: u16 = 8083;

/// Secret holding the discovery CA certificate and key.
pub const CA_SECRET: &str = "coxswain-discovery-ca";
/// ConfigMap publishing the discovery CA certificate (key `ca.crt`) for proxies to mount.
pub const TRUST_BUNDLE_CONFIGMAP: &str = "coxswain-discovery-trust";
/// Audience of the projected ServiceAccount token a proxy presents for SVID bootstrap.
pub const TOKEN_AUDIENCE: &str = "coxswain-discovery";
/// SPIFFE trust domain used when none is configured.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// Field manager for every server-side apply the controller makes.
pub const FIELD_MANAGER: &str = "coxswain-controller";
/// Finalizer on Gateways with a dedicated proxy, removed once its objects are cleaned up.
pub const DEDICATED_CLEANUP_FINALIZER: &str = "gateway.coxswain-labs.dev/dedicated-cleanup";

/// Labels on objects Coxswain creates.
pub mod labels {
    pub const NAME: &str = "app.kubernetes.io/name";
    pub const NAME_VALUE: &str = "coxswain";
    pub const INSTANCE: &str = "app.kubernetes.io/instance";
    pub const COMPONENT: &str = "app.kubernetes.io/component";
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    pub const MANAGED_BY_VALUE: &str = "coxswain-controller";
    /// Gateway API's label naming the Gateway a generated resource serves (GEP-1762).
    pub const GATEWAY_NAME: &str = "gateway.networking.k8s.io/gateway-name";

    pub const COMPONENT_CONTROLLER: &str = "controller";
    pub const COMPONENT_SHARED_PROXY: &str = "shared-proxy";
    pub const COMPONENT_DEDICATED_PROXY: &str = "dedicated-proxy";
    /// A shared-pool Gateway's own Service (in the controller's namespace).
    pub const COMPONENT_GATEWAY_SERVICE: &str = "gateway-service";
}

/// Longest name a Kubernetes object that also names a Service (a DNS label) may have.
const DNS_LABEL_MAX: usize = 63;

/// Name of a Gateway's dedicated proxy Deployment, Service and ServiceAccount:
/// `{gateway}-{gatewayclass}` (GEP-1762).
///
/// Names that would exceed a DNS label are cut and suffixed with a hash of the full name, so
/// two long Gateways never collide and the name is stable across restarts.
pub fn dedicated_proxy_name(gateway: &str, gateway_class: &str) -> String {
    let full = format!("{gateway}-{gateway_class}");
    if full.len() <= DNS_LABEL_MAX {
        return full;
    }
    with_hash_suffix(&full, fnv1a64(full.as_bytes()))
}

/// The name a dedicated proxy gets instead of [`dedicated_proxy_name`] when another Gateway in
/// its namespace already holds that name (Gateway `a-b` of class `c` and Gateway `a` of class
/// `b-c` both give `a-b-c`): the plain name, cut to fit, then a hash of the Gateway and class
/// names kept apart. `attempt` (0 first) picks another hash in the unlikely case that one is
/// taken too. Stable: the same inputs always give the same name.
pub fn disambiguated_proxy_name(gateway: &str, gateway_class: &str, attempt: u32) -> String {
    // '/' cannot occur in either name, so the hashed string is unambiguous.
    let mut key = format!("{gateway}/{gateway_class}");
    if attempt > 0 {
        key.push_str(&format!("/{attempt}"));
    }
    with_hash_suffix(
        &format!("{gateway}-{gateway_class}"),
        fnv1a64(key.as_bytes()),
    )
}

/// Name of the Service a Gateway on the shared pool is reached through, in the controller's
/// namespace: `{gateway}-{namespace}`, cut to fit a DNS label, then a hash of both kept apart
/// (Gateway `a-b` in `c` and Gateway `a` in `b-c` differ). Dots, valid in Gateway names but not
/// in Service names, become dashes.
pub fn shared_gateway_service_name(namespace: &str, gateway: &str) -> String {
    // '/' cannot occur in either name, so the hashed string is unambiguous.
    let hash = fnv1a64(format!("{namespace}/{gateway}").as_bytes());
    let mut plain = format!("{gateway}-{namespace}").replace('.', "-");
    // A Service name must start with a letter (RFC 1035); a Gateway name need not.
    if !plain.starts_with(|c: char| c.is_ascii_lowercase()) {
        plain.insert_str(0, "gw-");
    }
    with_hash_suffix(&plain, hash)
}

/// `name` cut so that `{head}-{8 hex digits of hash}` fits a DNS label.
fn with_hash_suffix(name: &str, hash: u64) -> String {
    let hash = format!("{hash:016x}");
    let suffix = &hash[..8];
    // Names are ASCII (DNS labels), so byte slicing is on character boundaries.
    let keep = (DNS_LABEL_MAX - suffix.len() - 1).min(name.len());
    let head = name[..keep].trim_end_matches('-');
    format!("{head}-{suffix}")
}

/// FNV-1a: a tiny stable hash; stability across releases matters more than strength here.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A workload identity: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpiffeId {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

/// Why a string is not a Coxswain SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpiffeIdError {
    #[error("SPIFFE ID {0:?} does not start with spiffe://")]
    Scheme(String),
    #[error("SPIFFE ID {0:?} is not of the form spiffe://<trust-domain>/ns/<namespace>/sa/<name>")]
    Shape(String),
    #[error("SPIFFE ID {id:?} has an invalid {part}: {value:?}")]
    Part {
        id: String,
        part: &'static str,
        value: String,
    },
}

impl SpiffeId {
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Self {
        Self {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        }
    }

    /// Parses the URI SAN of an SVID. Strict: any other shape is an error, because this string
    /// decides which snapshots a peer may receive.
    pub fn parse(uri: &str) -> Result<Self, SpiffeIdError> {
        let rest = uri
            .strip_prefix("spiffe://")
            .ok_or_else(|| SpiffeIdError::Scheme(uri.to_owned()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [trust_domain, "ns", namespace, "sa", service_account] = parts.as_slice() else {
            return Err(SpiffeIdError::Shape(uri.to_owned()));
        };
        let check = |part: &'static str, value: &str, valid: fn(&str) -> bool| {
            if valid(value) {
                Ok(())
            } else {
                Err(SpiffeIdError::Part {
                    id: uri.to_owned(),
                    part,
                    value: value.to_owned(),
                })
            }
        };
        check("trust domain", trust_domain, is_trust_domain)?;
        check("namespace", namespace, is_dns_label)?;
        check("service account", service_account, is_dns_subdomain)?;
        Ok(Self::new(*trust_domain, *namespace, *service_account))
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

/// RFC 1123 label: what a namespace name must be.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= DNS_LABEL_MAX
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: what a ServiceAccount name must be.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// SPIFFE trust domains: lowercase letters, digits, `.`, `-`, `_`.
fn is_trust_domain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spiffe_id_round_trips() {
        let id = SpiffeId::new("cluster.local", "gw-ns", "edge-coxswain");
        let uri = id.to_string();
        assert_eq!(uri, "spiffe://cluster.local/ns/gw-ns/sa/edge-coxswain");
        assert_eq!(SpiffeId::parse(&uri).unwrap(), id);
    }

    #[test]
    fn spiffe_id_rejects_other_shapes() {
        for bad in [
            "https://cluster.local/ns/a/sa/b",
            "spiffe://cluster.local/ns/a/sa",
            "spiffe://cluster.local/ns/a/sa/b/extra",
            "spiffe://cluster.local/sa/b/ns/a",
            "spiffe://cluster.local/ns//sa/b",
            "spiffe://Cluster.Local/ns/a/sa/b",
            "spiffe://cluster.local/ns/A/sa/b",
            "spiffe://cluster.local/ns/a/sa/b?x=1",
            "spiffe:///ns/a/sa/b",
        ] {
            assert!(SpiffeId::parse(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn dedicated_proxy_name_follows_gep_1762() {
        assert_eq!(dedicated_proxy_name("edge", "coxswain"), "edge-coxswain");
    }

    #[test]
    fn long_dedicated_proxy_names_are_cut_to_a_dns_label_and_stay_distinct() {
        let a = dedicated_proxy_name(&"a".repeat(60), "coxswain");
        let b = dedicated_proxy_name(&format!("{}b", "a".repeat(59)), "coxswain");
        assert!(a.len() <= 63 && b.len() <= 63);
        assert!(is_dns_label(&a) && is_dns_label(&b), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, dedicated_proxy_name(&"a".repeat(60), "coxswain"));
    }

    #[test]
    fn disambiguated_names_differ_for_gateways_whose_plain_names_collide() {
        assert_eq!(
            dedicated_proxy_name("a-b", "c"),
            dedicated_proxy_name("a", "b-c")
        );
        let one = disambiguated_proxy_name("a-b", "c", 0);
        let other = disambiguated_proxy_name("a", "b-c", 0);
        assert_ne!(one, other);
        assert!(
            one.starts_with("a-b-c-") && other.starts_with("a-b-c-"),
            "{one} {other}"
        );
        assert_ne!(one, disambiguated_proxy_name("a-b", "c", 1));
        assert_eq!(one, disambiguated_proxy_name("a-b", "c", 0), "stable");
        let long = disambiguated_proxy_name(&"g".repeat(63), &"c".repeat(63), 0);
        assert!(is_dns_label(&long), "{long}");
        assert_eq!(long.len(), 63);
    }

    #[test]
    fn shared_gateway_service_names_are_dns_labels_apart_for_every_gateway() {
        let a = shared_gateway_service_name("web", "shop");
        assert!(a.starts_with("shop-web-") && is_dns_label(&a), "{a}");
        assert_ne!(
            shared_gateway_service_name("c", "a-b"),
            shared_gateway_service_name("b-c", "a"),
            "the plain names collide, the hashes do not"
        );
        let dotted = shared_gateway_service_name("web", "edge.v2");
        assert!(
            dotted.starts_with("edge-v2-web-") && is_dns_label(&dotted),
            "{dotted}"
        );
        let digit = shared_gateway_service_name("web", "1st");
        assert!(digit.starts_with("gw-1st-web-"), "{digit}");
        let long = shared_gateway_service_name(&"n".repeat(63), &"g".repeat(253));
        assert!(is_dns_label(&long) && long.len() == 63, "{long}");
        assert_eq!(a, shared_gateway_service_name("web", "shop"), "stable");
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_label("coxswain-system"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_dns_subdomain("a.b-c"));
        assert!(!is_dns_subdomain("a..b"));
    }
}
