//! Fixture-driven tests of the compiler, by topic. Each fixture is the YAML a user would apply;
//! each test names the Gateway API (or Ingress) rule it checks. [`fixtures`] holds what many
//! topics share.

mod access_policy;
mod backend_tls;
mod fixtures;
mod gateway;
mod gateway_services;
mod gateway_tls;
mod golden;
mod grpc;
mod httproute;
mod incremental;
mod ingress;
mod ingress_access;
mod ingress_annotations;
mod inputs;
mod listener_sets;
mod load_balancing;
mod retry;
mod tcp_udp;
mod tls;
