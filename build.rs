//! Compiles crisp's own admin API (`proto/crisp/admin/v1/admin.proto`) and the decoded views of
//! CRI messages (`proto/crisp/cri/views.proto`, the few fields crisp reads) with
//! tonic-prost-build. protoc comes from the host (`hack/setup.sh` installs protobuf-compiler);
//! the CRI's full types come from the k8s-cri crate, not from here.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/crisp/admin/v1/admin.proto");
    println!("cargo:rerun-if-changed=proto/crisp/cri/views.proto");
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
    Ok(())
}
