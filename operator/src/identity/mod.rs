//! The discovery certificate authority: it issues SPIFFE SVIDs to proxies whose
//! ServiceAccount token the API server vouched for, and only to identities Coxswain deploys.
//!
//! `ca` and the rules here are pure: key material, certificate issuance, identity rules.
//! `server` is the gRPC bootstrap service, which asks the API server (TokenReview);
//! `ratelimit` bounds how often one source may make it ask.

mod ca;
pub mod ratelimit;
pub mod server;
pub mod store;

pub use ca::{Ca, CaError, DEFAULT_SVID_LIFETIME};

use coxswain_api::names::SpiffeId;
use std::collections::BTreeSet;

/// Why a token's identity cannot have a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("{0:?} is not a ServiceAccount identity (system:serviceaccount:<namespace>:<name>)")]
    NotServiceAccount(String),
    #[error("ServiceAccount {namespace}/{name} is not a proxy Coxswain deploys")]
    NotAllowed { namespace: String, name: String },
}

/// The SPIFFE ID of an authenticated ServiceAccount user name, as TokenReview reports it.
pub fn spiffe_id_for(username: &str, trust_domain: &str) -> Result<SpiffeId, IdentityError> {
    let not_sa = || IdentityError::NotServiceAccount(username.to_owned());
    let rest = username
        .strip_prefix("system:serviceaccount:")
        .ok_or_else(not_sa)?;
    let (namespace, name) = rest.split_once(':').ok_or_else(not_sa)?;
    if !coxswain_api::names::is_dns_label(namespace) || !coxswain_api::names::is_dns_subdomain(name)
    {
        return Err(not_sa());
    }
    Ok(SpiffeId::new(trust_domain, namespace, name))
}

/// The ServiceAccounts that may hold SVIDs: the shared proxy's, and each dedicated Gateway's
/// (`{gateway}-{gatewayclass}` per GEP-1762, unless disambiguated: see
/// [`crate::compile::proxies`]). Rebuilt from each compile's output as Gateways come and go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    accounts: BTreeSet<(String, String)>,
}

impl Allowlist {
    pub fn new(shared_proxy: (&str, &str)) -> Self {
        let mut accounts = BTreeSet::new();
        accounts.insert((shared_proxy.0.to_owned(), shared_proxy.1.to_owned()));
        Self { accounts }
    }

    /// Adds the ServiceAccount of a dedicated Gateway's proxy.
    pub fn allow(&mut self, namespace: &str, service_account: &str) {
        self.accounts
            .insert((namespace.to_owned(), service_account.to_owned()));
    }

    /// Whether `id` names an allowed ServiceAccount.
    pub fn check(&self, id: &SpiffeId) -> Result<(), IdentityError> {
        if self
            .accounts
            .contains(&(id.namespace.clone(), id.service_account.clone()))
        {
            Ok(())
        } else {
            Err(IdentityError::NotAllowed {
                namespace: id.namespace.clone(),
                name: id.service_account.clone(),
            })
        }
    }
}

/// Exactly the (namespace, ServiceAccount) pairs given: the compiler's list of proxy
/// identities becomes the allowlist as it is.
impl<'a> FromIterator<(&'a str, &'a str)> for Allowlist {
    fn from_iter<I: IntoIterator<Item = (&'a str, &'a str)>>(accounts: I) -> Self {
        let mut allow = Self::default();
        for (namespace, service_account) in accounts {
            allow.allow(namespace, service_account);
        }
        allow
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_usernames_map_to_spiffe_ids() {
        let id = spiffe_id_for("system:serviceaccount:web:edge-coxswain", "cluster.local").unwrap();
        assert_eq!(
            id.to_string(),
            "spiffe://cluster.local/ns/web/sa/edge-coxswain"
        );
        for bad in [
            "admin",
            "system:node:worker-1",
            "system:serviceaccount:web",
            "system:serviceaccount:Web:x",
            "system:serviceaccount:web:",
        ] {
            assert!(spiffe_id_for(bad, "cluster.local").is_err(), "{bad}");
        }
    }

    #[test]
    fn only_deployed_proxies_are_allowed() {
        let mut allow = Allowlist::new(("coxswain-system", "coxswain-proxy"));
        allow.allow("web", "edge-coxswain");
        let id = |ns: &str, sa: &str| SpiffeId::new("cluster.local", ns, sa);
        assert!(
            allow
                .check(&id("coxswain-system", "coxswain-proxy"))
                .is_ok()
        );
        assert!(allow.check(&id("web", "edge-coxswain")).is_ok());
        assert_eq!(
            allow.check(&id("web", "default")),
            Err(IdentityError::NotAllowed {
                namespace: "web".into(),
                name: "default".into()
            })
        );
        assert!(
            allow.check(&id("other", "edge-coxswain")).is_err(),
            "namespace matters"
        );
    }

    #[test]
    fn an_allowlist_collected_from_accounts_allows_exactly_those() {
        let allow: Allowlist = [
            ("coxswain-system", "coxswain-proxy"),
            ("web", "edge-coxswain"),
        ]
        .into_iter()
        .collect();
        let mut expected = Allowlist::new(("coxswain-system", "coxswain-proxy"));
        expected.allow("web", "edge-coxswain");
        assert_eq!(allow, expected);
    }
}
