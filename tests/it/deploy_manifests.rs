//! deploy/: the installer DaemonSet (plain manifest, kustomize base and uninstall overlay)
//! validates offline against the Kubernetes API models and follows the fleet rules
//! (hack/check-manifests.py: a privileged init container with the node's / at /host, an
//! unprivileged reporter with a uid of its own that stays, no hostPID, hostNetwork, hostIPC or
//! shareProcessNamespace, no service account token, images pinned by digest where
//! applied, opt-in label, one node at a time, readiness once `crisp doctor` passed); a broken
//! manifest is refused.

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

/// The base manifest with its images pinned as hack/release.sh pins them.
fn pinned() -> String {
    let base =
        std::fs::read_to_string(Path::new(REPO).join("deploy/base/crisp-installer.yaml")).unwrap();
    let digest = format!("@sha256:{}", "ab".repeat(32));
    let pinned = base.replace(
        "image: crisp-installer:0.1.0\n",
        &format!("image: crisp-installer:0.1.0{digest}\n"),
    );
    assert_eq!(pinned.matches(&digest).count(), 2, "{pinned}");
    pinned
}

/// The pinned base, written into `dir` and checked: it passes.
fn pinned_and_passing(dir: &Path) -> String {
    let good = pinned();
    let p = dir.join("pinned.yaml");
    std::fs::write(&p, &good).unwrap();
    let (ok, out) = check(&[p.to_str().unwrap()]);
    assert!(ok, "{out}");
    good
}

/// `good` with `from` replaced by `to`, written into `dir`, is refused with a message naming
/// `expect`.
fn refused(dir: &Path, good: &str, from: &str, to: &str, expect: &str) {
    assert!(good.contains(from), "{from}");
    let p = dir.join("bad.yaml");
    std::fs::write(&p, good.replacen(from, to, 1)).unwrap();
    let (ok, out) = check(&[p.to_str().unwrap()]);
    assert!(
        !ok && out.contains(expect),
        "{from} -> {to}: expected '{expect}':\n{out}"
    );
}

#[test]
fn a_broken_manifest_is_refused() {
    let good = pinned();
    let tmp = tempfile::tempdir().unwrap();
    for (from, to, expect) in [
        (
            "enableServiceLinks: false",
            "enableServicelinks: false",
            "unknown field 'enableServicelinks'",
        ),
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
        refused(tmp.path(), &good, from, to, expect);
    }
}

/// Issue #33: the installer holds no more than it needs. A manifest with hostNetwork, an image
/// not pinned by digest, or a container that stays running with privileges, capabilities, root
/// or a host path is refused; the pinned base passes.
#[test]
fn the_installer_holds_no_more_than_it_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let good = pinned_and_passing(tmp.path());
    let digest = format!("@sha256:{}", "ab".repeat(32));
    for (from, to, expect) in [
        (
            "      enableServiceLinks: false\n",
            "      enableServiceLinks: false\n      hostNetwork: true\n",
            "hostNetwork must not be set",
        ),
        (digest.as_str(), "", "is not pinned by digest"),
        (digest.as_str(), ":latest", "is not pinned by digest"),
        (
            "          privileged: false\n",
            "          privileged: true\n",
            "container report stays running: it must not be privileged",
        ),
        (
            "            drop: [\"ALL\"]\n",
            "            drop: [\"NET_RAW\"]\n",
            "must drop every capability",
        ),
        (
            "          runAsNonRoot: true\n",
            "          runAsNonRoot: false\n",
            "non-root user",
        ),
        (
            "          readOnly: true\n",
            "          readOnly: true\n        - name: host\n          mountPath: /host\n",
            "it must mount no host path",
        ),
        ("args: [\"once\"]", "args: []", "`once`"),
    ] {
        refused(tmp.path(), &good, from, to, expect);
    }
    // A deploy/ tree as released must be pinned: the source tree (by tag) is refused there.
    let (ok, out) = check(&[
        "--deploy",
        &Path::new(REPO).join("deploy").display().to_string(),
    ]);
    assert!(!ok && out.contains("is not pinned by digest"), "{out}");
    let tree = tmp.path().join("deploy");
    for d in ["base", "uninstall"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
        for f in std::fs::read_dir(Path::new(REPO).join("deploy").join(d)).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, tree.join(d).join(f.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(tree.join("base/crisp-installer.yaml"), &good).unwrap();
    let (ok, out) = check(&["--deploy", tree.to_str().unwrap()]);
    assert!(ok, "{out}");
}

/// Issue #44: every pod-level field SECURITY.md names is checked, and the reporter runs as a
/// uid of its own. Each mutation of the pinned base is refused, naming the field; on bde328c
/// check-manifests.py let hostIPC, shareProcessNamespace, a missing pod seccompProfile, a
/// token mount and uid 65534 through. hostPID is refused too: the installer reaches systemd
/// over the node's D-Bus system bus (8fa4613 required it, and the checker then let it through).
#[test]
fn every_field_security_md_names_is_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let good = pinned_and_passing(tmp.path());
    assert!(
        !good.lines().any(|l| l.trim().starts_with("hostPID:")),
        "the base shares no PID namespace with the node"
    );
    let links = "      enableServiceLinks: false\n";
    for (from, to, expect) in [
        (
            links,
            "      enableServiceLinks: false\n      hostPID: true\n",
            "hostPID must not be set",
        ),
        (
            links,
            "      enableServiceLinks: false\n      hostIPC: true\n",
            "hostIPC must not be set",
        ),
        (
            links,
            "      enableServiceLinks: false\n      shareProcessNamespace: true\n",
            "shareProcessNamespace must not be set",
        ),
        (
            "      automountServiceAccountToken: false\n",
            "      automountServiceAccountToken: true\n",
            "automountServiceAccountToken: false is required",
        ),
        (
            "      automountServiceAccountToken: false\n",
            "",
            "automountServiceAccountToken: false is required",
        ),
        (
            "      securityContext:\n        seccompProfile:\n          type: RuntimeDefault\n",
            "",
            "seccompProfile must be RuntimeDefault",
        ),
        (
            "          runAsUser: 64071\n",
            "          runAsUser: 65534\n",
            "a uid and gid of its own",
        ),
        (
            "          runAsGroup: 64071\n",
            "          runAsGroup: 65534\n",
            "a uid and gid of its own",
        ),
        (
            "          seccompProfile:\n            type: RuntimeDefault\n",
            "          seccompProfile:\n            type: Unconfined\n",
            "seccompProfile must stay RuntimeDefault",
        ),
    ] {
        refused(tmp.path(), &good, from, to, expect);
    }
}
