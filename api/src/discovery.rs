//! The discovery protocol (`proto/coxswain/discovery/v1/discovery.proto`): the Identity service
//! that issues SVIDs and the Discovery stream that carries snapshots.

#![allow(clippy::large_enum_variant, clippy::doc_lazy_continuation)]

include!(concat!(env!("OUT_DIR"), "/coxswain.discovery.v1.rs"));

/// The protocol version this build speaks. A peer with another version is refused with
/// FAILED_PRECONDITION naming both; later additions are additive and keep the version.
pub const WIRE_VERSION: u32 = 1;

/// How each end of a discovery connection tells a peer that went silent from one with nothing
/// to say: an HTTP/2 PING every `ping_every`, and the connection is dropped when one is not
/// answered within `answer_within`.
///
/// Without it a proxy whose controller vanished without a FIN (a Pod's network torn down, a
/// node lost) waited on the dead stream for good: it never heard of a new leader, and the
/// controller kept counting a proxy that was gone as one that must ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// How often each end sends a PING, whether or not anything else is moving.
    pub ping_every: std::time::Duration,
    /// How long a PING may go unanswered before the connection is dropped.
    pub answer_within: std::time::Duration,
}

impl Default for Liveness {
    /// A dead peer is noticed within 10 s: a PING costs a few dozen bytes, and a standby takes
    /// a lapsed Lease over within 15 s.
    fn default() -> Self {
        Self {
            ping_every: std::time::Duration::from_secs(5),
            answer_within: std::time::Duration::from_secs(5),
        }
    }
}
