//! The Identity (bootstrap) gRPC service: token in, SVID out.
//!
//! Anyone who reaches the listener may call it, and each call costs a TokenReview, so calls
//! are rate limited per source address before anything else. Refusals never carry the API
//! server's words (they can describe the cluster's authenticators); those go to the log.

use super::ratelimit::{RateLimiter, Source};
use super::{Allowlist, Ca, DEFAULT_SVID_LIFETIME, spiffe_id_for};
use crate::admin;
use coxswain_api::discovery::identity_server::Identity;
use coxswain_api::discovery::{BootstrapRequest, BootstrapResponse};
use coxswain_api::names::TOKEN_AUDIENCE;
use std::sync::{Arc, RwLock};
use time::OffsetDateTime;
use tonic::{Request, Response, Status};

/// The TokenReview `user.extra` key naming the Pod a token is bound to (set for projected
/// ServiceAccount tokens, which the kubelet binds to their Pod).
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// What TokenReview said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    /// `pod`: the Pod the token is bound to, if it is.
    Authenticated {
        username: String,
        pod: Option<String>,
    },
    Rejected {
        reason: String,
    },
}

/// Labels of `coxswain_controller_bootstrap_refused_total`.
pub mod refused {
    pub const RATE_LIMITED: &str = "rate_limited";
    pub const NO_TOKEN: &str = "no_token";
    pub const TOKEN_REJECTED: &str = "token_rejected";
    pub const REVIEW_FAILED: &str = "review_failed";
    pub const NOT_SERVICE_ACCOUNT: &str = "not_service_account";
    pub const NOT_POD_BOUND: &str = "not_pod_bound";
    pub const NOT_ALLOWED: &str = "not_allowed";
    pub const BAD_CSR: &str = "bad_csr";
}

/// Asks the API server whether a token is valid for an audience. A trait so the service's
/// rules can be exercised without a cluster; the controller uses [`KubeTokenReviewer`].
#[tonic::async_trait]
pub trait TokenReviewer: Send + Sync + 'static {
    async fn review(&self, token: &str, audience: &str) -> Result<Review, String>;
}

/// TokenReview through the Kubernetes API.
pub struct KubeTokenReviewer {
    pub client: kube::Client,
}

#[tonic::async_trait]
impl TokenReviewer for KubeTokenReviewer {
    async fn review(&self, token: &str, audience: &str) -> Result<Review, String> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![audience.to_owned()]),
            },
            ..Default::default()
        };
        let api = kube::Api::<TokenReview>::all(self.client.clone());
        let result = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(|e| format!("TokenReview failed: {e}"))?;
        let status = result.status.unwrap_or_default();
        // The API server must confirm the audience we asked for, not just any.
        let audience_ok = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|x| x == audience));
        let user = status.user.unwrap_or_default();
        let pod = match user.extra.as_ref().and_then(|e| e.get(POD_NAME_EXTRA)) {
            Some(values) if values.len() == 1 => values.first().cloned(),
            _ => None,
        };
        match (status.authenticated, user.username) {
            (Some(true), Some(username)) if audience_ok => {
                Ok(Review::Authenticated { username, pod })
            }
            _ => Ok(Review::Rejected {
                reason: status
                    .error
                    .unwrap_or_else(|| "token not authenticated".into()),
            }),
        }
    }
}

/// The bootstrap service.
pub struct IdentityService<R> {
    pub ca: Arc<Ca>,
    pub reviewer: R,
    pub allowlist: Arc<RwLock<Allowlist>>,
    pub trust_domain: String,
    /// Calls per source address, checked before anything else.
    pub limiter: RateLimiter,
    /// Counts refusals by reason for `/metrics`.
    pub admin: Arc<admin::State>,
}

impl<R> IdentityService<R> {
    fn refuse(&self, reason: &'static str, status: Status) -> Status {
        self.admin.bootstrap_refused(reason);
        status
    }
}

#[tonic::async_trait]
impl<R: TokenReviewer> Identity for IdentityService<R> {
    async fn bootstrap(
        &self,
        request: Request<BootstrapRequest>,
    ) -> Result<Response<BootstrapResponse>, Status> {
        let peer = request.remote_addr();
        let peer_ip = peer.map(|a| a.ip());
        if !self
            .limiter
            .allow(Source::from(peer_ip), std::time::Instant::now())
        {
            tracing::debug!(peer = ?peer_ip, "bootstrap refused: rate limited");
            return Err(self.refuse(
                refused::RATE_LIMITED,
                Status::resource_exhausted(
                    "too many bootstrap calls from this address; retry later",
                ),
            ));
        }
        let req = request.into_inner();
        if req.token.is_empty() {
            return Err(self.refuse(
                refused::NO_TOKEN,
                Status::unauthenticated("no service-account token"),
            ));
        }
        let (username, pod) = match self.reviewer.review(&req.token, TOKEN_AUDIENCE).await {
            Ok(Review::Authenticated { username, pod }) => (username, pod),
            Ok(Review::Rejected { reason }) => {
                tracing::info!(peer = ?peer_ip, %reason, "bootstrap refused: token not accepted");
                return Err(self.refuse(
                    refused::TOKEN_REJECTED,
                    Status::unauthenticated(format!(
                        "token not accepted for audience {TOKEN_AUDIENCE}"
                    )),
                ));
            }
            Err(error) => {
                tracing::warn!(peer = ?peer_ip, %error, "bootstrap refused: TokenReview failed");
                return Err(self.refuse(
                    refused::REVIEW_FAILED,
                    Status::unavailable("the token could not be reviewed; retry later"),
                ));
            }
        };
        let id = spiffe_id_for(&username, &self.trust_domain).map_err(|e| {
            tracing::info!(peer = ?peer_ip, %username, "bootstrap refused: not a ServiceAccount");
            self.refuse(
                refused::NOT_SERVICE_ACCOUNT,
                Status::permission_denied(e.to_string()),
            )
        })?;
        {
            let allow = self.allowlist.read().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = allow.check(&id) {
                tracing::info!(%id, "bootstrap refused: identity not deployed by Coxswain");
                return Err(self.refuse(
                    refused::NOT_ALLOWED,
                    Status::permission_denied(e.to_string()),
                ));
            }
        }
        // Replicas share a ServiceAccount; the Pod tells them apart on the discovery stream.
        let Some(pod) = pod else {
            tracing::info!(%id, "bootstrap refused: token not bound to a Pod");
            return Err(self.refuse(
                refused::NOT_POD_BOUND,
                Status::permission_denied(format!(
                    "{id}: the token is not bound to a Pod; mount a projected ServiceAccount \
                     token with audience {TOKEN_AUDIENCE}"
                )),
            ));
        };
        let now = OffsetDateTime::now_utc();
        let (chain, not_after) = self
            .ca
            .sign_svid(&req.csr_pem, &id, &pod, now, DEFAULT_SVID_LIFETIME)
            .map_err(|e| self.refuse(refused::BAD_CSR, Status::invalid_argument(e.to_string())))?;
        self.admin.svid_issued();
        tracing::info!(%id, %pod, %not_after, "SVID issued");
        Ok(Response::new(BootstrapResponse {
            certificate_chain_pem: chain,
            trust_bundle_pem: self.ca.cert_pem().to_owned(),
            spiffe_id: id.to_string(),
            not_after: not_after.unix_timestamp(),
        }))
    }
}

/// Serves the bootstrap service on `listener` with server-authenticated TLS (the proxy has no
/// certificate yet; it verifies ours against the trust bundle) until `shutdown` completes.
pub async fn serve<R: TokenReviewer>(
    listener: tokio::net::TcpListener,
    cert_pem: &str,
    key_pem: &str,
    service: IdentityService<R>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    use coxswain_api::discovery::identity_server::IdentityServer;
    use tonic::transport::{Identity as TlsIdentity, Server, ServerTlsConfig};
    Server::builder()
        .tls_config(ServerTlsConfig::new().identity(TlsIdentity::from_pem(cert_pem, key_pem)))?
        .add_service(IdentityServer::new(service))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
}
