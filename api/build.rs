//! Compiles the .proto contracts with protox (pure Rust), so no protoc binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/coxswain/snapshot/v1/snapshot.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        // serde so snapshots print as JSON/YAML for `coxswain snapshot compile -o json`.
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
        .compile_fds(fds)?;
    Ok(())
}
