//! Envoy's rate limit service protocol (`envoy.service.ratelimit.v3.RateLimitService`).
//!
//! Generated from `proto/envoy/service/ratelimit/v3/rls.proto`, a wire-compatible subset of
//! Envoy's definition: the proxy asks with [`RateLimitRequest`] for a route's global rate limit
//! and acts on [`RateLimitResponse`].

#![allow(clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/envoy.service.ratelimit.v3.rs"));
