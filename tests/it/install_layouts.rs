//! hack/install.sh and hack/uninstall.sh against fake node roots (`--root`), one per kubelet
//! layout: the right edits, idempotent installs, dry runs that change nothing, and an uninstall
//! that gives back every file byte for byte (content, mode, owner, mtime) and removes every
//! file and directory the install created.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::systemd_support::*;

const CRISP_EP: &str = "unix:///run/crisp/crisp.sock";
const KUBEADM_FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
const DEFAULT_KUBELET: &str = "/etc/default/kubelet";
const SYSCONFIG_KUBELET: &str = "/etc/sysconfig/kubelet";

const KUBELET_YAML: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nclusterDNS:\n- 10.96.0.10\n";

struct FakeNode {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl FakeNode {
    /// A node root holding `files`, plus a small stand-in binary outside the root (these tests
    /// are about files; tests/it/systemd_units.rs installs the real binary).
    fn new(files: &[(&str, &str)]) -> FakeNode {
        let dir = tempfile::Builder::new()
            .prefix("crisp-node")
            .tempdir_in("/tmp")
            .unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        for (p, c) in files {
            put(&root, p, c);
        }
        // Odd modes must survive the round trip too.
        if root.join("etc/default/kubelet").exists() {
            std::fs::set_permissions(
                root.join("etc/default/kubelet"),
                std::fs::Permissions::from_mode(0o640),
            )
            .unwrap();
        }
        let bin = dir.path().join("crisp-bin");
        std::fs::write(&bin, "#!/bin/sh\necho crisp stand-in\n").unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        FakeNode { dir, bin }
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn root_s(&self) -> String {
        self.root().display().to_string()
    }
    fn install(&self, extra: &[&str]) -> Run {
        let (root, bin) = (self.root_s(), self.bin.display().to_string());
        let mut args = vec!["--root", &root, "--binary", &bin];
        args.extend_from_slice(extra);
        hack("install.sh", &args)
    }
    fn uninstall(&self, extra: &[&str]) -> Run {
        let root = self.root_s();
        let mut args = vec!["--root", root.as_str()];
        args.extend_from_slice(extra);
        hack("uninstall.sh", &args)
    }
    fn read(&self, p: &str) -> String {
        read(&self.root(), p)
    }
    fn exists(&self, p: &str) -> bool {
        self.root().join(p.trim_start_matches('/')).exists()
    }
}

fn ok(r: &Run, what: &str) {
    assert!(r.ok, "{what} failed:\n{}", r.all());
}

/// The whole life cycle on one node; returns the installed tree for layout-specific checks.
/// `check` looks at the node after the first install.
fn round_trip(node: &FakeNode, install_args: &[&str], check: impl FnOnce(&FakeNode)) {
    let root = node.root();
    let before = snapshot(&root);

    let dry = node.install(&[install_args, &["--dry-run"]].concat());
    ok(&dry, "install --dry-run");
    assert!(
        dry.stdout.contains("would "),
        "dry run prints what would change:\n{}",
        dry.all()
    );
    assert!(
        dry.stdout
            .contains("would not start or restart anything (--root is not /)"),
        "{}",
        dry.all()
    );
    assert_same_tree(&before, &snapshot(&root), "install --dry-run");

    let first = node.install(install_args);
    ok(&first, "install");
    assert!(
        first
            .stdout
            .contains("not starting or restarting anything: --root is not /"),
        "{}",
        first.all()
    );
    for p in [
        "/usr/local/bin/crisp",
        "/etc/crisp/config.toml",
        "/etc/systemd/system/crisp.service",
        "/etc/systemd/system/crisp.socket",
        "/etc/systemd/system/kubelet.service.d/90-crisp.conf",
        "/var/lib/crisp/install/manifest",
    ] {
        assert!(node.exists(p), "{p} installed:\n{}", first.all());
    }
    let mode = std::fs::metadata(root.join("usr/local/bin/crisp"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o755);
    assert_eq!(
        std::fs::read_link(root.join("etc/systemd/system/sockets.target.wants/crisp.socket"))
            .unwrap(),
        Path::new("/etc/systemd/system/crisp.socket")
    );
    assert_eq!(
        std::fs::read_link(root.join("etc/systemd/system/multi-user.target.wants/crisp.service"))
            .unwrap(),
        Path::new("/etc/systemd/system/crisp.service")
    );
    assert_eq!(
        node.read("/etc/systemd/system/crisp.socket"),
        std::fs::read_to_string(Path::new(REPO).join("systemd/crisp.socket")).unwrap()
    );
    check(node);
    let installed = snapshot(&root);

    let again = node.install(install_args);
    ok(&again, "second install");
    assert!(
        again.stdout.contains("already installed"),
        "{}",
        again.all()
    );
    assert_same_tree(&installed, &snapshot(&root), "second install (idempotent)");
    let dry_again = node.install(&[install_args, &["--dry-run"]].concat());
    ok(&dry_again, "install --dry-run when installed");
    assert!(
        dry_again.stdout.contains("nothing would change"),
        "{}",
        dry_again.all()
    );

    let udry = node.uninstall(&["--dry-run"]);
    ok(&udry, "uninstall --dry-run");
    assert!(
        udry.stdout.contains("would remove /usr/local/bin/crisp"),
        "{}",
        udry.all()
    );
    assert_same_tree(&installed, &snapshot(&root), "uninstall --dry-run");

    let un = node.uninstall(&[]);
    ok(&un, "uninstall");
    assert_same_tree(&before, &snapshot(&root), "uninstall (byte-exact restore)");

    let un2 = node.uninstall(&[]);
    ok(&un2, "second uninstall");
    assert!(un2.stdout.contains("not installed"), "{}", un2.all());
    assert_same_tree(&before, &snapshot(&root), "second uninstall");
}

fn config_upstream(node: &FakeNode) -> String {
    let cfg =
        crisp::config::Config::from_toml(&node.read("/etc/crisp/config.toml"), "installed config")
            .expect("the generated config is valid");
    assert_eq!(
        cfg.listen,
        Path::new(crisp::config::DEFAULT_LISTEN),
        "listen matches crisp.socket"
    );
    cfg.upstream.display().to_string()
}

#[test]
fn kubeadm_flags_env_on_kubelet_1_28() {
    let node = FakeNode::new(&[
        (KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS=\"--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.9\"\n"),
        (KUBELET_CONFIG, KUBELET_YAML),
        (DEFAULT_KUBELET, "KUBELET_EXTRA_ARGS=\n"),
    ]);
    round_trip(&node, &["--kubelet-version", "v1.28.4"], |n| {
        assert_eq!(
            n.read(KUBEADM_FLAGS),
            format!("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={CRISP_EP} --pod-infra-container-image=registry.k8s.io/pause:3.9\"\n"),
            "endpoint points at crisp and --container-runtime=remote (rejected by 1.27+) is gone"
        );
        assert_eq!(
            n.read(KUBELET_CONFIG),
            KUBELET_YAML,
            "the config file sets no endpoint: untouched"
        );
        assert_eq!(
            n.read(DEFAULT_KUBELET),
            "KUBELET_EXTRA_ARGS=\n",
            "no endpoint there: untouched"
        );
        assert_eq!(config_upstream(n), "/run/containerd/containerd.sock");
        assert!(n.exists("/var/lib/crisp/install/backup/var/lib/kubelet/kubeadm-flags.env"));
    });
}

#[test]
fn kubeadm_flags_env_on_kubelet_1_25_keeps_container_runtime_flag() {
    let flags = "KUBELET_KUBEADM_ARGS=\"--container-runtime=remote --container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n";
    for version in [Some("1.25"), None] {
        let node = FakeNode::new(&[(KUBEADM_FLAGS, flags)]);
        let args: Vec<&str> = version
            .map(|v| vec!["--kubelet-version", v])
            .unwrap_or_default();
        if version.is_none() {
            let dry = node.install(&["--dry-run"]);
            assert!(
                dry.stdout.contains("kubelet version unknown"),
                "an unknown version is said out loud:\n{}",
                dry.all()
            );
        }
        round_trip(&node, &args, |n| {
            assert_eq!(n.read(KUBEADM_FLAGS), format!("KUBELET_KUBEADM_ARGS=\"--container-runtime=remote --container-runtime-endpoint={CRISP_EP}\"\n"));
        });
    }
}

#[test]
fn extra_args_in_etc_default_kubelet() {
    let node = FakeNode::new(&[
        (KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS=\"--pod-infra-container-image=registry.k8s.io/pause:3.9\"\n"),
        (
            DEFAULT_KUBELET,
            "# managed by ops\nKUBELET_EXTRA_ARGS=--node-ip=10.0.0.5   --container-runtime-endpoint unix:///run/custom/cri.sock --image-service-endpoint=unix:///run/custom/cri.sock\n# end\n",
        ),
    ]);
    round_trip(&node, &["--kubelet-version", "1.26.1"], |n| {
        assert_eq!(
            n.read(DEFAULT_KUBELET),
            format!("# managed by ops\nKUBELET_EXTRA_ARGS=--node-ip=10.0.0.5 --container-runtime-endpoint={CRISP_EP} --image-service-endpoint={CRISP_EP}\n# end\n"),
            "both endpoints (space and = forms) point at crisp; the rest of the file is unchanged"
        );
        assert_eq!(
            n.read(KUBEADM_FLAGS),
            "KUBELET_KUBEADM_ARGS=\"--pod-infra-container-image=registry.k8s.io/pause:3.9\"\n"
        );
        assert_eq!(
            config_upstream(n),
            "/run/custom/cri.sock",
            "crisp forwards to what kubelet used"
        );
        let mode = std::fs::metadata(n.root().join("etc/default/kubelet"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o640, "an edited file keeps its mode");
    });
}

#[test]
fn extra_args_in_etc_sysconfig_kubelet_quoted_without_final_newline() {
    let node = FakeNode::new(&[(
        SYSCONFIG_KUBELET,
        "KUBELET_EXTRA_ARGS='--container-runtime-endpoint=/run/containerd/containerd.sock --v=2'",
    )]);
    round_trip(&node, &["--kubelet-version", "1.29.0"], |n| {
        assert_eq!(
            n.read(SYSCONFIG_KUBELET),
            format!("KUBELET_EXTRA_ARGS='--container-runtime-endpoint={CRISP_EP} --v=2'"),
            "quotes and the missing final newline are kept"
        );
        assert_eq!(config_upstream(n), "/run/containerd/containerd.sock");
    });
}

#[test]
fn container_runtime_endpoint_in_the_kubelet_config_file() {
    let yaml = format!("{KUBELET_YAML}containerRuntimeEndpoint: \"unix:///run/containerd/containerd.sock\"\nimageServiceEndpoint: unix:///run/containerd/containerd.sock # images\nevictionHard:\n  memory.available: 100Mi\n");
    let node = FakeNode::new(&[
        (KUBELET_CONFIG, &yaml),
        (
            KUBEADM_FLAGS,
            "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.7\"\n",
        ),
        (DEFAULT_KUBELET, "KUBELET_EXTRA_ARGS=\n"),
    ]);
    round_trip(&node, &["--kubelet-version", "1.31.2"], |n| {
        assert_eq!(
            n.read(KUBELET_CONFIG),
            format!("{KUBELET_YAML}containerRuntimeEndpoint: {CRISP_EP}\nimageServiceEndpoint: {CRISP_EP}\nevictionHard:\n  memory.available: 100Mi\n")
        );
        assert_eq!(
            n.read(KUBEADM_FLAGS),
            "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.7\"\n"
        );
        assert_eq!(config_upstream(n), "/run/containerd/containerd.sock");
    });
}

#[test]
fn no_endpoint_anywhere_adds_one_where_the_kubelet_reads_it() {
    // 1.27+: the config file field.
    let node = FakeNode::new(&[
        (KUBELET_CONFIG, KUBELET_YAML),
        (
            KUBEADM_FLAGS,
            "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.8\"\n",
        ),
    ]);
    round_trip(&node, &["--kubelet-version", "1.30.0"], |n| {
        assert_eq!(
            n.read(KUBELET_CONFIG),
            format!("{KUBELET_YAML}containerRuntimeEndpoint: {CRISP_EP}\n")
        );
        assert_eq!(
            n.read(KUBEADM_FLAGS),
            "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.8\"\n"
        );
    });
    // Version unknown: a flag (accepted by every kubelet), in kubeadm-flags.env.
    let node = FakeNode::new(&[
        (KUBELET_CONFIG, KUBELET_YAML),
        (
            KUBEADM_FLAGS,
            "KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.8\"\n",
        ),
    ]);
    round_trip(&node, &[], |n| {
        assert_eq!(n.read(KUBEADM_FLAGS), format!("KUBELET_KUBEADM_ARGS=\"--node-ip=10.0.0.8 --container-runtime-endpoint={CRISP_EP}\"\n"));
        assert_eq!(n.read(KUBELET_CONFIG), KUBELET_YAML);
    });
    // Only /etc/default/kubelet, without the variable: a line is added.
    let node = FakeNode::new(&[(DEFAULT_KUBELET, "# nothing here\n")]);
    round_trip(&node, &["--kubelet-version", "1.26.0"], |n| {
        assert_eq!(
            n.read(DEFAULT_KUBELET),
            format!(
                "# nothing here\nKUBELET_EXTRA_ARGS=\"--container-runtime-endpoint={CRISP_EP}\"\n"
            )
        );
    });
}

#[test]
fn refuses_a_node_without_kubelet_configuration() {
    let node = FakeNode::new(&[("/etc/hostname", "node1\n")]);
    let before = snapshot(&node.root());
    let r = node.install(&[]);
    assert!(!r.ok);
    assert!(
        r.stderr.contains("no kubelet configuration under"),
        "{}",
        r.all()
    );
    assert_same_tree(&before, &snapshot(&node.root()), "failed install");
    let tcp = FakeNode::new(&[(
        KUBEADM_FLAGS,
        "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=tcp://10.0.0.1:1234\"\n",
    )]);
    let before = snapshot(&tcp.root());
    let r = tcp.install(&[]);
    assert!(
        !r.ok && r.stderr.contains("is not a unix socket"),
        "{}",
        r.all()
    );
    assert_same_tree(&before, &snapshot(&tcp.root()), "failed install");
}

#[test]
fn uninstall_does_not_silently_drop_later_changes() {
    let orig = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n";
    let node = FakeNode::new(&[(KUBEADM_FLAGS, orig)]);
    let before = snapshot(&node.root());
    ok(&node.install(&["--kubelet-version", "1.28"]), "install");
    // An operator edits the file crisp changed.
    let edited =
        format!("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={CRISP_EP} --v=4\"\n");
    put(&node.root(), KUBEADM_FLAGS, &edited);
    let changed = snapshot(&node.root());
    let r = node.uninstall(&[]);
    assert!(!r.ok, "uninstall must stop:\n{}", r.all());
    assert!(
        r.stderr.contains("/var/lib/kubelet/kubeadm-flags.env") && r.stderr.contains("--force"),
        "{}",
        r.all()
    );
    assert_same_tree(
        &changed,
        &snapshot(&node.root()),
        "refused uninstall changes nothing",
    );
    ok(&node.uninstall(&["--force"]), "uninstall --force");
    assert_same_tree(
        &before,
        &snapshot(&node.root()),
        "uninstall --force restores the original",
    );
}

#[test]
fn reinstall_after_kubeadm_rewrote_the_file_backs_up_the_new_version() {
    let node = FakeNode::new(&[(KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n")]);
    let pristine = snapshot(&node.root());
    ok(&node.install(&["--kubelet-version", "1.28"]), "install");
    // `kubeadm upgrade` rewrites kubeadm-flags.env: kubelet is back on containerd.
    let upgraded = "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n";
    put(&node.root(), KUBEADM_FLAGS, upgraded);
    let r = node.install(&["--kubelet-version", "1.29"]);
    ok(&r, "reinstall");
    assert!(
        r.stdout.contains("was changed since crisp was installed"),
        "{}",
        r.all()
    );
    assert_eq!(node.read(KUBEADM_FLAGS), format!("KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint={CRISP_EP} --pod-infra-container-image=registry.k8s.io/pause:3.10\"\n"));
    ok(&node.uninstall(&[]), "uninstall");
    assert_eq!(
        node.read(KUBEADM_FLAGS),
        upgraded,
        "uninstall gives back the upgraded file, not the pre-upgrade one"
    );
    let after = snapshot(&node.root());
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        pristine.keys().collect::<Vec<_>>(),
        "everything crisp created is gone"
    );
}

#[test]
fn installs_a_given_config_and_restores_an_existing_one() {
    let node = FakeNode::new(&[
        (KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n"),
        ("/etc/crisp/config.toml", "# old config\n"),
    ]);
    let cfg = node.dir.path().join("my-config.toml");
    std::fs::write(
        &cfg,
        "upstream = \"/run/containerd/containerd.sock\"\n[log]\nlevel = \"debug\"\n",
    )
    .unwrap();
    // --config runs `crisp --check-config` on it: use the real binary here.
    let (root, cfg_s) = (node.root_s(), cfg.display().to_string());
    let before = snapshot(&node.root());
    let r = hack(
        "install.sh",
        &[
            "--root",
            &root,
            "--binary",
            CRISP,
            "--config",
            &cfg_s,
            "--kubelet-version",
            "1.28",
        ],
    );
    ok(&r, "install --config");
    assert_eq!(
        node.read("/etc/crisp/config.toml"),
        std::fs::read_to_string(&cfg).unwrap()
    );
    assert!(node.exists("/var/lib/crisp/install/backup/etc/crisp/config.toml"));
    ok(&node.uninstall(&[]), "uninstall");
    assert_same_tree(&before, &snapshot(&node.root()), "uninstall");

    std::fs::write(&cfg, "no_such_key = 1\n").unwrap();
    let r = hack(
        "install.sh",
        &["--root", &root, "--binary", CRISP, "--config", &cfg_s],
    );
    assert!(
        !r.ok && r.stderr.contains("is not a valid crisp config"),
        "{}",
        r.all()
    );
    assert_same_tree(&before, &snapshot(&node.root()), "refused install");
}

/// The crisp .deb's crisp-install: the package owns binary, units and config; only kubelet's
/// side (drop-in, kubelet's files) is installed and recorded, and uninstall takes back exactly
/// that, leaving the package's files alone.
#[test]
fn packaged_install_rewires_kubelet_only() {
    let node = FakeNode::new(&[(KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n")]);
    let root = node.root();
    // What the .deb puts on the node (a real binary: the config check runs it).
    let pkg_bin = root.join("usr/bin/crisp");
    std::fs::create_dir_all(pkg_bin.parent().unwrap()).unwrap();
    std::fs::copy(CRISP, &pkg_bin).unwrap();
    put(
        &root,
        "/lib/systemd/system/crisp.service",
        "[Service]\nExecStart=/usr/bin/crisp\n",
    );
    put(
        &root,
        "/lib/systemd/system/crisp.socket",
        "[Socket]\nListenStream=/run/crisp/crisp.sock\n",
    );
    put(
        &root,
        "/etc/crisp/config.toml",
        &std::fs::read_to_string(Path::new(REPO).join("packaging/deb/config.toml")).unwrap(),
    );
    let before = snapshot(&root);

    let r = hack(
        "install.sh",
        &[
            "--root",
            &node.root_s(),
            "--packaged",
            "--kubelet-version",
            "1.28",
        ],
    );
    ok(&r, "install --packaged");
    assert!(node
        .read(KUBEADM_FLAGS)
        .contains(&format!("--container-runtime-endpoint={CRISP_EP}")));
    assert!(node.exists("/etc/systemd/system/kubelet.service.d/90-crisp.conf"));
    for p in [
        "/usr/local/bin/crisp",
        "/etc/systemd/system/crisp.service",
        "/etc/systemd/system/crisp.socket",
        "/etc/systemd/system/sockets.target.wants/crisp.socket",
    ] {
        assert!(!node.exists(p), "{p}: the package's, not installed again");
    }
    let manifest = node.read("/var/lib/crisp/install/manifest");
    assert!(
        !manifest.contains("/usr/bin/crisp") && !manifest.contains("/etc/crisp/config.toml"),
        "{manifest}"
    );
    let un = node.uninstall(&[]);
    ok(&un, "uninstall");
    assert_same_tree(&before, &snapshot(&root), "uninstall after --packaged");

    // Without the package there is nothing to rewire to.
    let bare = FakeNode::new(&[(KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n")]);
    let r = hack("install.sh", &["--root", &bare.root_s(), "--packaged"]);
    assert!(
        !r.ok && r.stderr.contains("is the crisp package installed?"),
        "{}",
        r.all()
    );
}

/// A config already on the node that forwards elsewhere than kubelet's runtime would swap the
/// node's runtime under its pods: refused before anything changes.
#[test]
fn refuses_a_config_that_forwards_to_another_runtime() {
    let node = FakeNode::new(&[
        (
            KUBEADM_FLAGS,
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/crio/crio.sock\"\n",
        ),
        (
            "/etc/crisp/config.toml",
            "upstream = \"/run/containerd/containerd.sock\"\n",
        ),
    ]);
    let before = snapshot(&node.root());
    let r = install_into(&node.root());
    assert!(!r.ok && r.stderr.contains("forwards to /run/containerd/containerd.sock but kubelet uses unix:///run/crio/crio.sock"), "{}", r.all());
    assert_same_tree(&before, &snapshot(&node.root()), "refused install");
}
