use super::cgroup::*;
use super::kubelet::*;
use super::sockets::*;
use super::*;

#[test]
fn env_files() {
    let t = "# comment\nKUBELET_KUBEADM_ARGS=\"--a=1 --container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n";
    let v = env_file_var(t, "KUBELET_KUBEADM_ARGS").unwrap();
    assert_eq!(
        flag_value(&v, "--container-runtime-endpoint").as_deref(),
        Some("unix:///run/containerd/containerd.sock")
    );
    assert_eq!(
        env_file_var("KUBELET_EXTRA_ARGS=\n", "KUBELET_EXTRA_ARGS").as_deref(),
        Some("")
    );
    assert_eq!(
        env_file_var(
            "KUBELET_EXTRA_ARGS='--x y'\nKUBELET_EXTRA_ARGS=--z\n",
            "KUBELET_EXTRA_ARGS"
        )
        .as_deref(),
        Some("--z")
    );
    assert_eq!(
        env_file_var("#KUBELET_EXTRA_ARGS=--z\n", "KUBELET_EXTRA_ARGS"),
        None
    );
}

#[test]
fn flags_last_wins_and_space_form() {
    assert_eq!(
        flag_value(
            "--container-runtime-endpoint /a --container-runtime-endpoint=/b",
            "--container-runtime-endpoint"
        )
        .as_deref(),
        Some("/b")
    );
    assert_eq!(
        flag_value(
            "--container-runtime-endpoint=/b --container-runtime remote",
            "--container-runtime"
        )
        .as_deref(),
        Some("remote")
    );
    assert_eq!(
        flag_value("--container-runtime-endpoint=/b", "--container-runtime"),
        None
    );
}

#[test]
fn yaml() {
    let t = "apiVersion: kubelet.config.k8s.io/v1beta1\ncontainerRuntimeEndpoint: \"unix:///run/crisp/crisp.sock\" # crisp\n  containerRuntimeEndpoint: nested\n";
    assert_eq!(
        yaml_top_level(t, "containerRuntimeEndpoint").as_deref(),
        Some("unix:///run/crisp/crisp.sock")
    );
    assert_eq!(yaml_top_level(t, "imageServiceEndpoint"), None);
}

#[test]
fn endpoints_and_versions() {
    assert_eq!(
        endpoint_path("unix:///run/crisp/crisp.sock"),
        Some(PathBuf::from("/run/crisp/crisp.sock"))
    );
    assert_eq!(
        endpoint_path("/run/x.sock"),
        Some(PathBuf::from("/run/x.sock"))
    );
    assert_eq!(endpoint_path("tcp://1.2.3.4:5"), None);
    assert_eq!(parse_kubelet_version("Kubernetes v1.27.3\n"), Some((1, 27)));
    assert_eq!(
        parse_kubelet_version("Kubernetes v1.30.0-rc.1"),
        Some((1, 30))
    );
    assert_eq!(parse_kubelet_version("garbage"), None);
    assert_eq!(
        under_root(Path::new("/"), Path::new("/etc/x")),
        PathBuf::from("/etc/x")
    );
    assert_eq!(
        under_root(Path::new("/tmp/r"), Path::new("/etc/x")),
        PathBuf::from("/tmp/r/etc/x")
    );
}

/// Issue #33: `crisp doctor` checks the admin socket's mode and owner.
#[test]
fn the_admin_socket_is_checked_for_mode_and_owner() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let opts = Options {
        root: root.path().to_path_buf(),
        ..Default::default()
    };
    let cfg = Config::default();
    let sock = under_root(root.path(), &cfg.admin_socket());
    let check = |cfg: &Config| {
        let mut r = Report::default();
        check_admin_socket(&opts, cfg, &mut r);
        assert_eq!(r.checks.len(), 1, "{r}");
        let c = r.checks.remove(0);
        assert_eq!(c.name, "admin-socket");
        (
            c.level,
            format!("{} {}", c.detail, c.fix.unwrap_or_default()),
        )
    };
    let (level, text) = check(&cfg);
    assert!(
        level == Level::Warn && text.contains("unavailable"),
        "{text}"
    );
    std::fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let chmod = |m: u32| {
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(m)).unwrap();
    };
    let mut opted = cfg.clone();
    opted.admin.allow_shared_mode = true;
    let me = crate::sys::effective_uid();
    if me == 0 {
        chmod(0o600);
        assert_eq!(check(&cfg).0, Level::Ok);
        for (mode, plain, with_opt_in) in [
            (0o660, Level::Warn, Level::Ok),
            (0o666, Level::Fail, Level::Warn),
            (0o602, Level::Fail, Level::Warn),
        ] {
            chmod(mode);
            let (level, text) = check(&cfg);
            assert_eq!(level, plain, "{mode:o}: {text}");
            assert!(
                text.contains(&sock.display().to_string())
                    && text.contains(&format!("mode {mode:04o}"))
                    && text.contains("admin.mode = \"0600\""),
                "{text}"
            );
            assert_eq!(check(&opted).0, with_opt_in, "{mode:o}");
        }
        chmod(0o600);
        std::os::unix::fs::chown(&sock, Some(1000), None).unwrap();
    }
    // Not root's (whoever runs the test but root): FAIL whatever the mode.
    let (level, text) = check(&opted);
    assert!(
        level == Level::Fail && text.contains("chown root"),
        "{text}"
    );
}

/// Issue #45: doctor told a newcomer "crisp is for kubelet 1.20–1.28"; it now says what each
/// kubelet up to 1.36 needs, and what 1.37 brings.
#[test]
fn kubelet_versions_say_what_applies_up_to_1_36_and_after() {
    let (level, text, _) = version_advice(None);
    assert_eq!(level, Level::Ok);
    assert!(
        text.contains("1.20–1.36") && !text.contains("1.28"),
        "{text}"
    );
    for (v, want, has) in [
        ((1, 19), Level::Warn, "older than crisp supports"),
        ((1, 26), Level::Ok, "has no native sidecars"),
        ((1, 28), Level::Ok, "native sidecars are alpha"),
        ((1, 34), Level::Warn, "needs no crisp"),
        ((1, 35), Level::Warn, "failCgroupV1: false"),
        ((1, 36), Level::Warn, "--pod-infra-container-image"),
        ((1, 37), Level::Warn, "RuntimeConfig mandatory"),
        ((2, 0), Level::Warn, "newer than crisp has been tried with"),
    ] {
        let (level, text, _) = version_advice(Some(v));
        assert_eq!(level, want, "{v:?}: {text}");
        assert!(text.contains(has), "{v:?}: {text}");
    }
    let (_, text, fix) = version_advice(Some((1, 37)));
    assert!(
        text.contains("KEP-4033") && text.contains("containerd 1.6 and 1.7"),
        "{text}"
    );
    assert!(fix.unwrap().contains("docs/SUPPORT.md"));
}

/// KEP-5573: kubelet 1.35 refuses cgroup v1 unless `failCgroupV1: false`; before 1.35 the
/// option defaults to false. Step by step through the decision.
#[test]
fn cgroup_v1_needs_fail_cgroup_v1_false_from_kubelet_1_35() {
    let advice = |k, c, f| {
        let (level, text, fix) = cgroup_advice(k, c, f);
        (level, format!("{text} | {}", fix.unwrap_or_default()))
    };
    // v2: nothing to do whatever the kubelet.
    for k in [None, Some((1, 30)), Some((1, 36))] {
        assert_eq!(advice(k, Some(Cgroup::V2), None).0, Level::Ok);
    }
    // v1, 1.35+ and no setting: kubelet will not start.
    for k in [(1, 35), (1, 36), (1, 37)] {
        let (level, text) = advice(Some(k), Some(Cgroup::V1), None);
        assert_eq!(level, Level::Fail, "{text}");
        assert!(
            text.contains("failCgroupV1: false") && text.contains("does not set it"),
            "{text}"
        );
    }
    // v1, 1.35+ with the setting: runs, deprecated.
    let (level, text) = advice(Some((1, 36)), Some(Cgroup::V1), Some(false));
    assert_eq!(level, Level::Warn, "{text}");
    assert!(text.contains("runs on it"), "{text}");
    // v1, older kubelet: runs; says what 1.35 will need.
    let (level, text) = advice(Some((1, 34)), Some(Cgroup::V1), None);
    assert_eq!(level, Level::Ok, "{text}");
    assert!(
        text.contains("1.35+ will need failCgroupV1: false"),
        "{text}"
    );
    // v1, failCgroupV1: true set explicitly (1.31–1.34 have the option): will not start.
    let (level, text) = advice(Some((1, 32)), Some(Cgroup::V1), Some(true));
    assert_eq!(level, Level::Fail, "{text}");
    // v1, kubelet unknown: warned.
    assert_eq!(advice(None, Some(Cgroup::V1), None).0, Level::Warn);
    // Unknown hierarchy: reported only.
    assert_eq!(advice(Some((1, 36)), None, None).0, Level::Ok);

    assert_eq!(fail_cgroup_v1("failCgroupV1: false\n"), Some(false));
    assert_eq!(fail_cgroup_v1("failCgroupV1: true # v2 only\n"), Some(true));
    assert_eq!(fail_cgroup_v1("failCgroupV1: maybe\n"), None);
    assert_eq!(fail_cgroup_v1("cgroupDriver: systemd\n"), None);
}

#[test]
fn the_cgroup_version_is_read_under_the_root() {
    let root = tempfile::tempdir().unwrap();
    assert_eq!(cgroup_version(root.path()), None);
    let fs = root.path().join("sys/fs/cgroup");
    std::fs::create_dir_all(fs.join("memory")).unwrap();
    assert_eq!(cgroup_version(root.path()), Some(Cgroup::V1));
    std::fs::write(fs.join("cgroup.controllers"), "cpu memory\n").unwrap();
    assert_eq!(cgroup_version(root.path()), Some(Cgroup::V2));

    // The whole check, on a v1 node whose kubelet config does not set failCgroupV1.
    std::fs::remove_file(fs.join("cgroup.controllers")).unwrap();
    let opts = Options {
        root: root.path().to_path_buf(),
        ..Default::default()
    };
    let mut r = Report::default();
    check_cgroup(&opts, Some((1, 36)), &mut r);
    assert_eq!(r.checks[0].level, Level::Fail, "{r}");
    let config = under_root(root.path(), Path::new(KUBELET_CONFIG));
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "kind: KubeletConfiguration\nfailCgroupV1: false\n").unwrap();
    let mut r = Report::default();
    check_cgroup(&opts, Some((1, 36)), &mut r);
    assert_eq!(
        (r.checks[0].name, r.checks[0].level),
        ("cgroup", Level::Warn),
        "{r}"
    );
}

/// Issue #43 item 5: `crisp doctor` says when the state directory cannot be written durably
/// (FAIL with job mode on: its sidecars would not be stopped; WARN without), with the fix.
#[test]
fn the_state_dir_is_checked_for_durable_writes() {
    let root = tempfile::tempdir().unwrap();
    let opts = Options {
        root: root.path().to_path_buf(),
        ..Default::default()
    };
    let mut cfg = Config::default();
    let check = |cfg: &Config| {
        let mut r = Report::default();
        check_state_dir(&opts, cfg, &mut r);
        assert_eq!(r.checks.len(), 1, "{r}");
        let c = r.checks.remove(0);
        assert_eq!(c.name, "state dir");
        (
            c.level,
            format!("{} {}", c.detail, c.fix.unwrap_or_default()),
        )
    };
    let dir = under_root(root.path(), &cfg.state_dir);
    // Its parent is missing: crisp cannot create it.
    let (level, text) = check(&cfg);
    assert_eq!(level, Level::Fail, "{text}");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    assert_eq!(check(&cfg).0, Level::Ok, "created at start");
    std::fs::create_dir_all(&dir).unwrap();
    let (level, text) = check(&cfg);
    assert_eq!(level, Level::Ok, "{text}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the probe is removed"
    );
    // A file where the directory should be (root ignores modes).
    std::fs::remove_dir(&dir).unwrap();
    std::fs::write(&dir, b"").unwrap();
    let (level, text) = check(&cfg);
    assert_eq!(level, Level::Fail, "{text}");
    assert!(
        text.contains("Job pods' sidecars will not be stopped"),
        "{text}"
    );
    assert!(text.contains("writable directory"), "{text}");
    cfg.job.enabled = false;
    assert_eq!(check(&cfg).0, Level::Warn);
}
