//! hack/release.sh's artifacts (built into target/artifacts by hack/test.sh): the binary is static
//! and runs in an empty root filesystem; the .deb and the installer image hold what the
//! install needs; the DaemonSet in dist/deploy is pinned to the image built; the sums match;
//! packaging twice gives identical bytes.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::node_support::{artifact, dist, REPO};

fn run(c: &mut Command) -> String {
    let o = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{c:?}: {text}");
    text
}

#[test]
fn the_binary_is_static_and_runs_in_an_empty_root() {
    let bin = artifact("crisp-", "-linux-amd64");
    let ldd = Command::new("ldd").arg(&bin).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&ldd.stdout),
        String::from_utf8_lossy(&ldd.stderr)
    );
    // glibc's ldd: "not a dynamic executable" (static) or "statically linked" (static-pie).
    assert!(
        text.contains("not a dynamic executable") || text.contains("statically linked"),
        "ldd {}: {text}",
        bin.display()
    );
    let file = run(Command::new("readelf").arg("-lW").arg(&bin));
    assert!(
        !file.contains("INTERP"),
        "no program interpreter (ld.so): {file}"
    );

    // A root with nothing but the binary: no libc, no /etc, no /proc.
    let root = tempfile::tempdir().unwrap();
    std::fs::copy(&bin, root.path().join("crisp")).unwrap();
    let v = run(Command::new("chroot")
        .arg(root.path())
        .args(["/crisp", "--version"]));
    assert!(v.starts_with("crisp "), "{v}");
    let c = run(Command::new("chroot")
        .arg(root.path())
        .args(["/crisp", "--check-config"]));
    assert!(
        c.contains("upstream: \"/run/containerd/containerd.sock\""),
        "{c}"
    );
    // It serves: the tokio runtime, the listener and the admin socket come up.
    std::fs::write(root.path().join("crisp.toml"), "state_dir = \"/state\"\n").unwrap();
    let mut daemon = Command::new("chroot")
        .arg(root.path())
        .args([
            "/crisp",
            "--config",
            "/crisp.toml",
            "--listen",
            "/crisp.sock",
            "--upstream",
            "/nothing.sock",
        ])
        .stderr(std::fs::File::create(root.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !root.path().join("crisp.sock").exists() {
        if let Ok(Some(st)) = daemon.try_wait() {
            panic!(
                "crisp exited in the empty root ({st}): {}",
                std::fs::read_to_string(root.path().join("log")).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "crisp did not listen: {}",
            std::fs::read_to_string(root.path().join("log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let st = daemon.wait().unwrap();
    assert!(
        st.success(),
        "crisp in the empty root ended with {st}: {}",
        std::fs::read_to_string(root.path().join("log")).unwrap_or_default()
    );
}

#[test]
fn sums_deb_and_image_hold_what_the_install_needs() {
    let d = dist();
    run(Command::new("sha256sum")
        .arg("-c")
        .arg("SHA256SUMS")
        .current_dir(&d));
    let bin = std::fs::read(artifact("crisp-", "-linux-amd64")).unwrap();

    // The .deb: static binary at /usr/bin, units pointing at it, conffile, maintainer scripts.
    let deb = artifact("crisp_", "_amd64.deb");
    let x = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb").arg("-R").arg(&deb).arg(x.path()));
    assert_eq!(std::fs::read(x.path().join("usr/bin/crisp")).unwrap(), bin);
    let unit = std::fs::read_to_string(x.path().join("lib/systemd/system/crisp.service")).unwrap();
    assert!(
        unit.lines().any(|l| l == "ExecStart=/usr/bin/crisp"),
        "{unit}"
    );
    assert_eq!(
        std::fs::read(x.path().join("lib/systemd/system/crisp.socket")).unwrap(),
        std::fs::read(Path::new(REPO).join("systemd/crisp.socket")).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(x.path().join("DEBIAN/conffiles")).unwrap(),
        "/etc/crisp/config.toml\n"
    );
    let c = run(Command::new(x.path().join("usr/bin/crisp"))
        .arg("--check-config")
        .arg("--config")
        .arg(x.path().join("etc/crisp/config.toml")));
    assert!(c.contains("listen: \"/run/crisp/crisp.sock\""), "{c}");
    for f in [
        "usr/share/crisp/hack/install.sh",
        "usr/share/crisp/hack/uninstall.sh",
        "usr/share/crisp/systemd/kubelet.service.d/90-crisp.conf",
    ] {
        let repo_path = f.trim_start_matches("usr/share/crisp/");
        assert_eq!(
            std::fs::read(x.path().join(f)).unwrap(),
            std::fs::read(Path::new(REPO).join(repo_path)).unwrap(),
            "{f} is the repository's"
        );
    }
    let postinst = std::fs::read_to_string(x.path().join("DEBIAN/postinst")).unwrap();
    assert!(
        postinst.contains("CRISP_REWIRE_KUBELET"),
        "the postinst rewires kubelet only when asked"
    );
    let control = std::fs::read_to_string(x.path().join("DEBIAN/control")).unwrap();
    assert!(
        control.contains("Package: crisp\n") && control.contains("Architecture: amd64\n"),
        "{control}"
    );

    // The image: named for ctr's importer, entrypoint and bundle in place.
    let img = artifact("crisp-installer-", ".oci.tar");
    let layout = tempfile::tempdir().unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&img)
        .arg("-C")
        .arg(layout.path()));
    let index = std::fs::read_to_string(layout.path().join("index.json")).unwrap();
    assert!(
        index.contains("\"io.containerd.image.name\":\"crisp-installer:"),
        "{index}"
    );
    let tag = index
        .split("\"org.opencontainers.image.ref.name\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let bundle = tempfile::tempdir().unwrap();
    let unpacked = bundle.path().join("b");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{tag}", layout.path().display()))
        .arg(&unpacked));
    let rootfs = unpacked.join("rootfs");
    assert_eq!(std::fs::read(rootfs.join("opt/crisp/crisp")).unwrap(), bin);
    for f in [
        "hack/install.sh",
        "hack/uninstall.sh",
        "systemd/crisp.service",
        "systemd/crisp.socket",
        "systemd/kubelet.service.d/90-crisp.conf",
    ] {
        assert_eq!(
            std::fs::read(rootfs.join("opt/crisp").join(f)).unwrap(),
            std::fs::read(Path::new(REPO).join(f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(
        std::fs::read(rootfs.join("opt/crisp/entrypoint.sh")).unwrap(),
        std::fs::read(Path::new(REPO).join("deploy/installer/entrypoint.sh")).unwrap()
    );
    let config = std::fs::read_to_string(unpacked.join("config.json")).unwrap();
    assert!(
        config.contains("/opt/crisp/entrypoint.sh"),
        "entrypoint: {config}"
    );
    for applet in ["sh", "nsenter", "cp"] {
        assert!(rootfs.join("bin").join(applet).exists(), "busybox {applet}");
    }
}

/// Issue #33: dist/deploy, the DaemonSet as released, names the installer image by the digest of
/// the image in dist/ (its index.json), for every container, and passes the manifest rules with
/// pins required.
#[test]
fn the_released_daemonset_is_pinned_to_the_image_built() {
    let image = artifact("crisp-installer-", ".oci.tar");
    let index = run(Command::new("tar")
        .arg("-xOf")
        .arg(&image)
        .arg("index.json"));
    let digest = std::fs::read_to_string(artifact("crisp-installer-", ".digest")).unwrap();
    let digest = digest.trim();
    assert!(
        digest.len() == 71 && index.contains(&format!("\"digest\":\"{digest}\"")),
        "{digest} is not the image's manifest: {index}"
    );
    let tree = dist().join("deploy");
    let yaml = std::fs::read_to_string(tree.join("base/crisp-installer.yaml")).unwrap();
    let images: Vec<&str> = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    assert_eq!(images.len(), 2, "{yaml}");
    for i in images {
        assert!(
            i.starts_with("crisp-installer:") && i.ends_with(&format!("@{digest}")),
            "{i}"
        );
    }
    run(Command::new("/usr/bin/python3")
        .arg(Path::new(REPO).join("hack/check-manifests.py"))
        .arg("--deploy")
        .arg(&tree));
}

#[test]
fn packaging_twice_gives_identical_bytes() {
    let bin = artifact("crisp-", "-linux-amd64");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    for out in [a.path(), b.path()] {
        run(Command::new("bash")
            .arg(Path::new(REPO).join("hack/release.sh"))
            .arg("--out")
            .arg(out)
            .arg("--binary")
            .arg(&bin)
            .env("SOURCE_DATE_EPOCH", "1700000000"));
    }
    let sa = std::fs::read_to_string(a.path().join("SHA256SUMS")).unwrap();
    let sb = std::fs::read_to_string(b.path().join("SHA256SUMS")).unwrap();
    assert_eq!(sa, sb, "two packaging runs differ");
    assert_eq!(sa.lines().count(), 3, "{sa}");
}
