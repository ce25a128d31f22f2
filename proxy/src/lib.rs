//! Coxswain's data plane: a Pingora proxy that serves routing snapshots pushed by the
//! controller over the mTLS discovery stream.
//!
//! This crate holds no Kubernetes credentials by construction: it must never depend on kube's
//! client or runtime (`hack/check-proxy-deps.sh`, run by `make test`, enforces it).
#![forbid(unsafe_code)]
