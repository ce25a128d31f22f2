//! Coxswain's data plane: a Pingora proxy that serves routing snapshots pushed by the
//! controller over the mTLS discovery stream.
//!
//! - [`router`]: the routing table built from a snapshot once, answering "which route serves
//!   this request" with one host lookup and a scan of that host's routes in precedence order.
//!
//! This crate holds no Kubernetes credentials by construction: it must never depend on kube's
//! client or runtime (`hack/check-proxy-deps.sh`, run by `make test`, enforces it).
#![forbid(unsafe_code)]

pub mod access_log;
pub mod addresses;
pub mod admin;
pub mod auth;
pub mod balance;
pub mod callout;
pub mod client_auth;
mod conn;
pub mod discovery;
pub mod external_auth;
pub mod fastpath;
pub mod filters;
pub mod forwarded;
pub mod handler;
pub mod head;
pub mod hpack;
pub mod http1;
pub mod http2;
pub mod jwt;
pub mod limits;
pub mod listeners;
pub mod metrics;
pub mod mirror;
pub mod outlier;
pub mod policy;
pub mod proxy_protocol;
pub mod ratelimit;
pub mod relay;
pub mod request;
pub mod request_trace;
pub mod router;
pub mod snapshot_cache;
pub mod standalone;
pub mod table;
pub mod tls;
pub mod tls_accept;
pub mod trace;
pub mod upstream;
pub mod upstream_tls;
pub mod virtual_socket;
pub mod workers;
