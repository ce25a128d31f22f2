//! Cluster names: one cluster per Service port, named after it, and the cleartext HTTP/2
//! variant a GRPCRoute asks for. A leaf: the policy modules key their decisions on these names,
//! and the reference index that builds clusters imports those policy modules.

/// Appended to a cluster's name when a GRPCRoute makes the proxy speak cleartext HTTP/2 to a
/// Service port whose appProtocol does not say so.
pub const H2C_CLUSTER_SUFFIX: &str = "/h2c";

pub fn cluster_name(namespace: &str, name: &str, port: i32) -> String {
    format!("{namespace}/{name}:{port}")
}
