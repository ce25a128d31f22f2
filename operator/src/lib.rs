//! The controller role of Coxswain and the wiring of the `coxswain` binary.
#![forbid(unsafe_code)]

pub mod admin;
pub mod bundle;
pub mod cli;
pub mod compile;
pub mod controller;
pub mod discovery;
pub mod helm;
pub mod identity;
pub mod jwks;
pub mod leader;
pub mod manifests;
pub mod parameters_status;
pub mod provision;
pub mod reflector;
pub mod snapshot_cmd;
pub mod status;
pub mod telemetry;
