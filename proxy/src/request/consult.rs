//! The questions a request puts to services outside the proxy (`Decision::Consult`): what the
//! global rate limit service and the authorization service are told.

use super::{Arrival, Body, Checked, Head, RoutePolicy, Version};
use std::sync::Arc;

/// What a route asks of services outside the proxy before a request may go on: the global
/// rate limit service first (is the request over the limit?), then the authorization service.
#[derive(Debug)]
pub struct Consult<'t> {
    pub policy: &'t Arc<RoutePolicy>,
    /// The question for the global rate limit service; None: nothing to count.
    pub limit: Option<coxswain_api::ratelimit::RateLimitRequest>,
    /// Whether the authorization service (`policy.external_auth`) is to be asked.
    pub authorize: bool,
    /// The request's places under in-progress limits, held until it ends.
    pub slots: Vec<crate::ratelimit::Slot>,
    /// Fields a verified JWT sets on the request, kept for the forward after.
    pub edits: crate::external_auth::Edits,
}

/// What the route's authorization service is told about a request (owned: the engine's head
/// is released while the service thinks).
pub fn auth_request<H: Head + ?Sized>(
    head: &H,
    checked: &Checked<'_>,
    arrival: &Arrival,
    sni: Option<&str>,
) -> crate::external_auth::AuthRequest {
    let mut fields = Vec::new();
    head.each_header(&mut |name, value| {
        fields.push((
            String::from_utf8_lossy(name).to_ascii_lowercase(),
            String::from_utf8_lossy(value).into_owned(),
        ));
    });
    crate::external_auth::AuthRequest {
        method: head.method().to_owned(),
        scheme: if arrival.https { "https" } else { "http" },
        host: checked.host.to_owned(),
        hostname: crate::router::strip_port(checked.host).to_owned(),
        path_and_query: checked.path_and_query.clone().into_owned(),
        fields,
        client: arrival.client,
        port: arrival.port,
        protocol: match head.version() {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
            Version::Http2 => "HTTP/2",
        },
        body_size: match checked.body {
            Body::None => 0,
            Body::Length(n) => i64::try_from(n).unwrap_or(-1),
            Body::Chunked => -1,
        },
        sni: sni.map(str::to_owned),
    }
}
