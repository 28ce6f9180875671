//! deploy/: the installer DaemonSet (plain manifest, kustomize base and uninstall overlay)
//! validates offline against the Kubernetes API models and follows the fleet rules
//! (hack/check-manifests.py: privileged + hostPID + the node's / at /host, opt-in label, one
//! node at a time, readiness through `crisp doctor`); a broken manifest is refused.

use std::path::Path;
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn check(args: &[&str]) -> (bool, String) {
    let o = Command::new("/usr/bin/python3")
        .arg(Path::new(REPO).join("hack/check-manifests.py"))
        .args(args)
        .output()
        .expect("/usr/bin/python3 (hack/setup.sh installs python3-kubernetes)");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

#[test]
fn the_installer_manifests_validate() {
    let (ok, out) = check(&[]);
    assert!(ok, "{out}");
    assert!(
        out.contains("checked") && out.contains("deploy/base/crisp-installer.yaml"),
        "{out}"
    );
    // Say in the test log whether kustomize rendering was part of it (it needs kubectl).
    eprintln!("{out}");
}

#[test]
fn a_broken_manifest_is_refused() {
    let good =
        std::fs::read_to_string(Path::new(REPO).join("deploy/base/crisp-installer.yaml")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    for (from, to, expect) in [
        ("hostPID: true", "hostPid: true", "unknown field 'hostPid'"),
        (
            "terminationGracePeriodSeconds: 120",
            "terminationGracePeriodSeconds: \"120\"",
            "expected int",
        ),
        (
            "      - name: installer\n        image:",
            "      - image:",
            "missing required field 'name'",
        ),
        (
            "maxUnavailable: 1",
            "maxUnavailable: 10%",
            "maxUnavailable: 1",
        ),
        (
            "crisp.dev/install: \"true\"",
            "kubernetes.io/os: linux",
            "opt-in label",
        ),
        (
            "mountPropagation: HostToContainer",
            "mountPropagation: None",
            "HostToContainer",
        ),
    ] {
        assert!(good.contains(from), "{from}");
        let p = tmp.path().join("bad.yaml");
        std::fs::write(&p, good.replacen(from, to, 1)).unwrap();
        let (ok, out) = check(&[p.to_str().unwrap()]);
        assert!(
            !ok && out.contains(expect),
            "{from} -> {to}: expected '{expect}':\n{out}"
        );
    }
}
