//! The Identity (bootstrap) gRPC service: token in, SVID out.

use super::{Allowlist, Ca, DEFAULT_SVID_LIFETIME, spiffe_id_for};
use coxswain_api::discovery::identity_server::Identity;
use coxswain_api::discovery::{BootstrapRequest, BootstrapResponse};
use coxswain_api::names::TOKEN_AUDIENCE;
use std::sync::{Arc, RwLock};
use time::OffsetDateTime;
use tonic::{Request, Response, Status};

/// What TokenReview said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Review {
    Authenticated { username: String },
    Rejected { reason: String },
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
        match (status.authenticated, status.user.and_then(|u| u.username)) {
            (Some(true), Some(username)) if audience_ok => Ok(Review::Authenticated { username }),
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
}

#[tonic::async_trait]
impl<R: TokenReviewer> Identity for IdentityService<R> {
    async fn bootstrap(
        &self,
        request: Request<BootstrapRequest>,
    ) -> Result<Response<BootstrapResponse>, Status> {
        let req = request.into_inner();
        if req.token.is_empty() {
            return Err(Status::unauthenticated("no service-account token"));
        }
        let username = match self.reviewer.review(&req.token, TOKEN_AUDIENCE).await {
            Ok(Review::Authenticated { username }) => username,
            Ok(Review::Rejected { reason }) => {
                tracing::info!(%reason, "bootstrap refused: token not accepted");
                return Err(Status::unauthenticated(format!(
                    "token not accepted for audience {TOKEN_AUDIENCE}: {reason}"
                )));
            }
            Err(e) => return Err(Status::unavailable(e)),
        };
        let id = spiffe_id_for(&username, &self.trust_domain)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        {
            let allow = self.allowlist.read().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = allow.check(&id) {
                tracing::info!(%id, "bootstrap refused: identity not deployed by Coxswain");
                return Err(Status::permission_denied(e.to_string()));
            }
        }
        let now = OffsetDateTime::now_utc();
        let (chain, not_after) = self
            .ca
            .sign_svid(&req.csr_pem, &id, now, DEFAULT_SVID_LIFETIME)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        tracing::info!(%id, %not_after, "SVID issued");
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
