//! `crisp doctor` on a fake node root: before install it names what is wrong (kubelet bypasses
//! crisp, no crisp socket, no units); after hack/install.sh with crisp running, everything is
//! OK and the exit code is 0; broken permissions, a bad config and a v1alpha2-only runtime are
//! reported with a fix.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::systemd_support::*;

const T: Duration = Duration::from_secs(20);

struct Doctor {
    code: i32,
    out: String,
}

impl Doctor {
    /// The lines of check `name`.
    fn lines(&self, name: &str) -> Vec<&str> {
        self.out
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .nth(if l.starts_with("[OK") { 2 } else { 1 })
                    == Some(name)
            })
            .collect()
    }
    fn has(&self, level: &str, name: &str, text: &str) -> bool {
        self.lines(name)
            .iter()
            .any(|l| l.starts_with(&format!("[{level}")) && l.contains(text))
    }
}

fn doctor(root: &Path, extra: &[&str]) -> Doctor {
    let out = Command::new(CRISP)
        .arg("doctor")
        .arg("--root")
        .arg(root)
        .args(extra)
        .output()
        .unwrap();
    let text = output_text(&out);
    Doctor {
        code: out.status.code().unwrap_or(-1),
        out: text,
    }
}

/// [`doctor`] from an async test: off the runtime's threads, since the fake runtime it asks
/// runs on them.
async fn doctor_async(root: &Path, extra: &[&str]) -> Doctor {
    let (root, extra): (PathBuf, Vec<String>) = (
        root.to_path_buf(),
        extra.iter().map(|s| s.to_string()).collect(),
    );
    tokio::task::spawn_blocking(move || {
        doctor(&root, &extra.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap()
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("crisp-dr")
        .tempdir_in("/tmp")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_before_and_after_install() {
    let tmp = tempdir();
    let root = tmp.path().join("root");
    put(&root, "/var/lib/kubelet/kubeadm-flags.env", "KUBELET_KUBEADM_ARGS=\"--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n");
    put(
        &root,
        "/var/lib/kubelet/config.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
    );
    let _rt = fake_runtime(&root.join("run/containerd/containerd.sock"), true).await;

    let d = doctor_async(&root, &[]).await;
    assert_eq!(d.code, 1, "{}", d.out);
    assert!(d.has("OK", "config", "built-in defaults"), "{}", d.out);
    assert!(
        d.has(
            "OK",
            "upstream",
            "fake-runtime 1.2.3 (CRI v1); serves runtime.v1 and runtime.v1alpha2"
        ),
        "{}",
        d.out
    );
    assert!(d.has("FAIL", "crisp-socket", "No such file"), "{}", d.out);
    assert!(
        d.has(
            "FAIL",
            "kubelet",
            "is the runtime itself: kubelet bypasses crisp"
        ),
        "{}",
        d.out
    );
    assert!(d.out.contains("fix: run hack/install.sh"), "{}", d.out);
    assert!(d.has("WARN", "units", "not installed"), "{}", d.out);

    let r = install_into(&root);
    assert!(r.ok, "{}", r.all());
    // Run the installed crisp the way crisp.service does (its config), at the node's paths.
    let notify = Notify::at_path(&tmp.path().join("notify.sock"));
    let log = tmp.path().join("crisp.log");
    // The installed config, plus a state directory inside the test (not the host's /var/lib).
    let run_cfg = tmp.path().join("run-config.toml");
    let installed_cfg = std::fs::read_to_string(root.join("etc/crisp/config.toml")).unwrap();
    std::fs::write(
        &run_cfg,
        format!(
            "state_dir = {:?}\n{installed_cfg}",
            tmp.path().join("state").display().to_string()
        ),
    )
    .unwrap();
    let mut c = Command::new(root.join("usr/local/bin/crisp"));
    c.arg("--config").arg(&run_cfg);
    c.arg("--listen")
        .arg(root.join("run/crisp/crisp.sock"))
        .arg("--upstream")
        .arg(root.join("run/containerd/containerd.sock"));
    c.env("NOTIFY_SOCKET", &notify.env)
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID");
    c.stderr(std::fs::File::create(&log).unwrap());
    let _crisp = spawn(c, &log);
    notify.wait_for("READY=1", T).await;

    let d = doctor_async(&root, &[]).await;
    assert_eq!(d.code, 0, "{}", d.out);
    assert!(d.out.contains("\n0 FAIL, 0 WARN, "), "{}", d.out);
    assert!(d.has("OK", "config", "/etc/crisp/config.toml is valid (listen /run/crisp/crisp.sock, upstream /run/containerd/containerd.sock)"), "{}", d.out);
    assert!(
        d.has("OK", "crisp-socket", "mode 0660, owner 0:0"),
        "{}",
        d.out
    );
    assert!(d.has("OK", "crisp-socket", "crisp answers on"), "{}", d.out);
    assert!(d.has("OK", "kubelet", "runtime endpoint unix:///run/crisp/crisp.sock (set in /var/lib/kubelet/kubeadm-flags.env) is crisp"), "{}", d.out);
    assert!(d.has("OK", "units", "installed and enabled"), "{}", d.out);

    // A socket anyone can connect to is root for anyone.
    let sock = root.join("run/crisp/crisp.sock");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let d = doctor(&root, &[]);
    assert_eq!(d.code, 1);
    assert!(d.has("FAIL", "crisp-socket", "mode 0666"), "{}", d.out);
    assert!(
        d.out.contains("SocketMode=0660"),
        "the fix names the setting: {}",
        d.out
    );
    // Root-only works for kubelet, but is not what crisp.socket sets.
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    let d = doctor(&root, &[]);
    assert_eq!(d.code, 0, "a WARN alone does not fail: {}", d.out);
    assert!(
        d.has(
            "WARN",
            "crisp-socket",
            "mode 0600, owner 0:0, expected 0660"
        ),
        "{}",
        d.out
    );
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o660)).unwrap();

    // A config crisp would refuse.
    let cfg = root.join("etc/crisp/config.toml");
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        format!("{good}\n[proxy]\nmax_concurrent_streams = 0\n"),
    )
    .unwrap();
    let d = doctor(&root, &[]);
    assert_eq!(d.code, 1);
    assert!(
        d.has("FAIL", "config", "proxy.max_concurrent_streams"),
        "{}",
        d.out
    );
    assert!(d.out.contains("crisp --check-config --config"), "{}", d.out);
    std::fs::write(&cfg, good).unwrap();

    // Back to the runtime directly: doctor says kubelet bypasses crisp again.
    let r = hack("uninstall.sh", &["--root", &root.display().to_string()]);
    assert!(r.ok, "{}", r.all());
    let d = doctor(&root, &[]);
    assert!(d.has("FAIL", "kubelet", "bypasses crisp"), "{}", d.out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_on_a_v1alpha2_only_runtime_and_a_foreign_endpoint() {
    let tmp = tempdir();
    let root = tmp.path().join("root");
    put(&root, "/etc/default/kubelet", "KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix:///run/other.sock --image-service-endpoint=unix:///run/images.sock\n");
    let _rt = fake_runtime_apis(&root.join("run/old/cri.sock"), false, true).await;
    let d = doctor_async(&root, &["--upstream", "/run/old/cri.sock"]).await;
    assert_eq!(d.code, 1, "{}", d.out);
    assert!(
        d.has("WARN", "upstream", "serves runtime.v1alpha2 only"),
        "{}",
        d.out
    );
    assert!(
        d.out.contains("kubelet 1.26+ requires runtime.v1"),
        "{}",
        d.out
    );
    assert!(
        d.has(
            "FAIL",
            "kubelet",
            "runtime endpoint unix:///run/other.sock (set in /etc/default/kubelet) is not crisp"
        ),
        "{}",
        d.out
    );
    assert!(
        d.has("WARN", "kubelet", "image endpoint unix:///run/images.sock"),
        "{}",
        d.out
    );

    // Nothing answers at all.
    let d = doctor(&root, &["--upstream", "/run/nothing.sock"]);
    assert!(d.has("FAIL", "upstream", "/run/nothing.sock"), "{}", d.out);
}

/// doctor reports kubelet's version (from the kubelet binary on the node) and says when native
/// sidecars make crisp unnecessary.
#[test]
fn doctor_reports_the_kubelet_version_and_native_sidecars() {
    let tmp = tempdir();
    let root = tmp.path().join("root");
    put(
        &root,
        "/etc/default/kubelet",
        "KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix:///run/crisp/crisp.sock\n",
    );
    let d = doctor(&root, &["--upstream", "/run/nothing.sock"]);
    assert!(d.has("OK", "kubelet-version", "unknown"), "{}", d.out);
    let kubelet = |version: &str| {
        put(
            &root,
            "/usr/bin/kubelet",
            &format!("#!/bin/sh\necho Kubernetes {version}\n"),
        );
        std::fs::set_permissions(
            root.join("usr/bin/kubelet"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    };
    kubelet("v1.26.15");
    let d = doctor(&root, &["--upstream", "/run/nothing.sock"]);
    assert!(
        d.has(
            "OK",
            "kubelet-version",
            "kubelet 1.26 has no native sidecars"
        ),
        "{}",
        d.out
    );
    kubelet("v1.28.4");
    let d = doctor(&root, &["--upstream", "/run/nothing.sock"]);
    assert!(
        d.has("OK", "kubelet-version", "native sidecars are alpha"),
        "{}",
        d.out
    );
    kubelet("v1.29.0");
    let d = doctor(&root, &["--upstream", "/run/nothing.sock"]);
    assert!(
        d.has("WARN", "kubelet-version", "needs no crisp"),
        "{}",
        d.out
    );
}
