//! The access log: one line per request on the `coxswain::access` target, written the same
//! way whichever engine served the request.

use coxswain_api::snapshot as snap;
use std::net::SocketAddr;

/// The fields of one access log line, whichever path served the request.
pub struct AccessLine<'a> {
    pub client: Option<std::net::IpAddr>,
    pub method: &'a str,
    pub host: &'a str,
    pub path: &'a str,
    pub status: u16,
    pub route: Option<&'a snap::RouteSource>,
    pub upstream: Option<SocketAddr>,
    pub duration_ms: u64,
}

pub fn access_line(line: &AccessLine<'_>) {
    tracing::info!(
        target: "coxswain::access",
        client = line.client.map(tracing::field::display),
        method = line.method,
        host = line.host,
        path = line.path,
        status = line.status,
        route = %SourceName(line.route),
        upstream = line.upstream.map(tracing::field::display),
        duration_ms = line.duration_ms,
        "request"
    );
}

/// "Kind/namespace/name" for log lines, without building a String.
struct SourceName<'a>(Option<&'a snap::RouteSource>);

impl std::fmt::Display for SourceName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(s) => write!(f, "{}/{}/{}", s.kind, s.namespace, s.name),
            None => Ok(()),
        }
    }
}
