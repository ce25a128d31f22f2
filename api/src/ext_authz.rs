//! Envoy's external authorization protocol (`envoy.service.auth.v3.Authorization/Check`).
//!
//! Generated from `proto/envoy/service/auth/v3/external_auth.proto`, a wire-compatible subset
//! of Envoy's definition: the proxy asks with [`CheckRequest`] and acts on [`CheckResponse`].

#![allow(clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/envoy.service.auth.v3.rs"));
