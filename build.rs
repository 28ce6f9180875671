//! Compiles crisp's own admin API (`proto/crisp/admin/v1/admin.proto`), the decoded views of
//! CRI messages (`proto/crisp/cri/views.proto`, the few fields crisp reads), and the full CRI
//! types (`proto/k8s/cri-api/v1/api.proto`, kubernetes/cri-api's file as pinned in
//! proto/README.md: the tap's `--full` decoding) with tonic-prost-build. protoc comes from the
//! host (`hack/setup.sh` installs protobuf-compiler).

use std::path::PathBuf;

/// The pinned CRI api.proto, kept byte for byte as kubernetes/cri-api has it.
const CRI_API: &str = "proto/k8s/cri-api/v1/api.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/crisp/admin/v1/admin.proto");
    println!("cargo:rerun-if-changed=proto/crisp/cri/views.proto");
    println!("cargo:rerun-if-changed={CRI_API}");
    tonic_prost_build::configure()
        // The CLI (`crisp tap`) and the tests are clients; the daemon is the server.
        .build_client(true)
        .build_server(true)
        // protoc 3.12–3.14 need this for `optional` in proto3; newer ones ignore it.
        .protoc_arg("--experimental_allow_proto3_optional")
        // Views that only the tests and fuzz targets decode (crisp reads an ExecSync answer's exit
        // code as it streams, and a container event's statuses by field number): compiled where
        // those are, so a release build has no dead message types.
        .message_attribute(
            "crisp.cri.views.ExecSyncResponse",
            "#[cfg(any(test, feature = \"test-util\"))]",
        )
        .message_attribute(
            "crisp.cri.views.ContainerEventResponse",
            "#[cfg(any(test, feature = \"test-util\"))]",
        )
        .compile_protos(
            &[
                "proto/crisp/admin/v1/admin.proto",
                "proto/crisp/cri/views.proto",
            ],
            &["proto"],
        )?;

    // The CRI's types: messages only (crisp relays calls, it serves and calls none by these
    // types), serialisable for the tap and readable back for its captures (`crisp tap --pcap`). protoc before 22 does not know the `debug_redact` field
    // option the file uses (AuthConfig's secrets; it has no effect on the wire or on prost's
    // types), so a copy without it is compiled. Comments are left out: api.proto's are Go-doc,
    // not rustdoc (indented blocks would become doctests).
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("cri-api");
    std::fs::create_dir_all(&out)?;
    let api = std::fs::read_to_string(CRI_API)?.replace(" [debug_redact = true]", "");
    std::fs::write(out.join("api.proto"), api)?;
    let mut config = tonic_prost_build::Config::new();
    config.disable_comments(["."]);
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        // A view without some fields (an older crisp's recording) reads as protobuf does.
        .message_attribute(".", "#[serde(default)]")
        // An env value is bytes on the wire and text in the tap's view (redacted, or escaped):
        // read back as either (`crisp tap --pcap` re-encodes the view).
        .field_attribute(
            "runtime.v1.KeyValue.value",
            "#[serde(deserialize_with = \"bytes_or_text\")]",
        )
        .compile_with_config(config, &[out.join("api.proto")], &[out])?;
    Ok(())
}
