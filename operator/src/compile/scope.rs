//! Which proxies serve what: the unit a snapshot is compiled for. A leaf, so every compiler
//! module (and status) can name a scope without importing the Gateway compiler.

use super::status::ObjectKey;

/// Which proxies serve a Gateway.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScopeKey {
    SharedPool,
    Gateway(ObjectKey),
}
