//! The discovery protocol (`proto/coxswain/discovery/v1/discovery.proto`): the Identity service
//! that issues SVIDs and the Discovery stream that carries snapshots.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/coxswain.discovery.v1.rs"));

/// The protocol version this build speaks. A peer with another version is refused with
/// FAILED_PRECONDITION naming both; later additions are additive and keep the version.
pub const WIRE_VERSION: u32 = 1;
