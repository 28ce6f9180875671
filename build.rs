//! Compiles crisp's own admin API (`proto/crisp/admin/v1/admin.proto`) and the decoded views of
//! CRI messages (`proto/crisp/cri/views.proto`, the few fields crisp reads) with
//! tonic-prost-build. protoc comes from the host (`hack/setup.sh` installs protobuf-compiler);
//! the CRI's full types come from the k8s-cri crate, not from here.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/crisp/admin/v1/admin.proto");
    println!("cargo:rerun-if-changed=proto/crisp/cri/views.proto");
    test_prerequisites();
    tonic_prost_build::configure()
        // The CLI (`crisp tap`) and the tests are clients; the daemon is the server.
        .build_client(true)
        .build_server(true)
        // protoc 3.12–3.14 need this for `optional` in proto3; newer ones ignore it.
        .protoc_arg("--experimental_allow_proto3_optional")
        .compile_protos(
            &[
                "proto/crisp/admin/v1/admin.proto",
                "proto/crisp/cri/views.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}

/// Tests that need root or a tool are compiled as ignored (with the reason) where the build
/// runs without them, so a plain `cargo test` reports them ignored instead of letting them pass
/// without running. CI and `sudo hack/test.sh` build as root with every tool installed.
fn test_prerequisites() {
    println!("cargo::rustc-check-cfg=cfg(crisp_test_root)");
    println!("cargo::rustc-check-cfg=cfg(crisp_test_strace)");
    println!("cargo::rustc-check-cfg=cfg(crisp_test_shellcheck)");
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false);
    if root {
        println!("cargo:rustc-cfg=crisp_test_root");
    }
    let have = |tool: &str, arg: &str| {
        std::process::Command::new(tool)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if have("strace", "-V") {
        println!("cargo:rustc-cfg=crisp_test_strace");
    }
    if have("shellcheck", "--version") {
        println!("cargo:rustc-cfg=crisp_test_shellcheck");
    }
}
