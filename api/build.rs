//! Compiles the .proto contracts with protox (pure Rust), so no protoc binary is needed.

const SNAPSHOT: &str = "proto/coxswain/snapshot/v1/snapshot.proto";
const DISCOVERY: &str = "proto/coxswain/discovery/v1/discovery.proto";
const EXT_AUTHZ: &str = "proto/envoy/service/auth/v3/external_auth.proto";
const RATELIMIT: &str = "proto/envoy/service/ratelimit/v3/rls.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in [SNAPSHOT, DISCOVERY, EXT_AUTHZ, RATELIMIT] {
        println!("cargo:rerun-if-changed={p}");
    }
    // The snapshot: messages only, with serde so it prints as JSON/YAML.
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        .type_attribute(".", "#[serde(rename_all = \"camelCase\")]")
        // Absent fields take their proto3 defaults, as on the wire.
        .message_attribute(".", "#[serde(default)]")
        // Enum fields are i32 on the wire; print them by name.
        .field_attribute(
            "Listener.protocol",
            "#[serde(with = \"crate::snapshot::serde_enum::protocol\")]",
        )
        .field_attribute(
            "PathMatch.kind",
            "#[serde(with = \"crate::snapshot::serde_enum::path_kind\")]",
        )
        .field_attribute(
            "HeaderMatch.kind",
            "#[serde(with = \"crate::snapshot::serde_enum::header_kind\")]",
        )
        .field_attribute(
            "QueryParamMatch.kind",
            "#[serde(with = \"crate::snapshot::serde_enum::query_kind\")]",
        )
        .field_attribute(
            "Cluster.app_protocol",
            "#[serde(with = \"crate::snapshot::serde_enum::app_protocol\")]",
        )
        .field_attribute(
            "Route.upstream_protocol",
            "#[serde(with = \"crate::snapshot::serde_enum::upstream_protocol\")]",
        )
        .field_attribute(
            "LoadBalancer.algorithm",
            "#[serde(with = \"crate::snapshot::serde_enum::lb_algorithm\")]",
        )
        .field_attribute(
            "SessionPersistence.kind",
            "#[serde(with = \"crate::snapshot::serde_enum::session_kind\")]",
        )
        .field_attribute(
            "RateLimit.key",
            "#[serde(with = \"crate::snapshot::serde_enum::rate_limit_key\")]",
        )
        .field_attribute(
            "ExternalAuth.protocol",
            "#[serde(with = \"crate::snapshot::serde_enum::external_auth_protocol\")]",
        )
        .field_attribute(
            "RateLimitDescriptor.Entry.source",
            "#[serde(with = \"crate::snapshot::serde_enum::descriptor_source\")]",
        )
        .compile_fds(protox::compile([SNAPSHOT], ["proto"])?)?;
    // Discovery: gRPC services; snapshot types come from the module above.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .extern_path(".coxswain.snapshot.v1", "crate::snapshot")
        // Shared, not copied, by every stream a snapshot is pushed on.
        .bytes(".coxswain.discovery.v1.SnapshotPush.snapshot")
        .compile_fds(protox::compile([DISCOVERY], ["proto"])?)?;
    // External authorization (Envoy's protocol): the proxy's client; the server for tests and
    // for anyone writing an authorization service against these types.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(protox::compile([EXT_AUTHZ], ["proto"])?)?;
    // Global rate limits (Envoy's rate limit service): the proxy's client; the server for tests.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(protox::compile([RATELIMIT], ["proto"])?)?;
    Ok(())
}
