//! The systemd units in systemd/: systemd's own verifier accepts them (as shipped, and as
//! hack/install.sh installs them next to the binary it installs), their hardening stays scored
//! "OK" by `systemd-analyze security`, and they say what DESIGN.md §7 asks for.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::systemd_support::*;

const INSTALLED_BIN: &str = "ExecStart=/usr/local/bin/crisp";

fn repo_file(p: &str) -> String {
    std::fs::read_to_string(Path::new(REPO).join(p)).unwrap_or_else(|e| panic!("read {p}: {e}"))
}

/// All `Key=` values of a unit file (every section), in order.
fn values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix(&format!("{key}=")))
        .map(|v| v.trim().to_string())
        .collect()
}

fn words(unit: &str, key: &str) -> Vec<String> {
    values(unit, key)
        .iter()
        .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// Lays out units for `systemd-analyze verify` in `dir`: crisp.service with its ExecStart
/// pointed at `binary` (verify insists the command exists and is executable), crisp.socket,
/// and a stand-in kubelet.service carrying crisp's drop-in.
fn verify_dir(
    dir: &Path,
    service: &str,
    socket: &str,
    dropin: &str,
    binary: &Path,
) -> Vec<PathBuf> {
    assert_eq!(
        service
            .lines()
            .filter(|l| l.starts_with("ExecStart="))
            .collect::<Vec<_>>(),
        vec![INSTALLED_BIN],
        "one ExecStart, the installed binary"
    );
    let service = service.replace(INSTALLED_BIN, &format!("ExecStart={}", binary.display()));
    std::fs::create_dir_all(dir.join("kubelet.service.d")).unwrap();
    std::fs::write(dir.join("crisp.service"), service).unwrap();
    std::fs::write(dir.join("crisp.socket"), socket).unwrap();
    std::fs::write(
        dir.join("kubelet.service"),
        "[Unit]\nDescription=kubelet stand-in\n[Service]\nExecStart=/bin/true\n",
    )
    .unwrap();
    std::fs::write(dir.join("kubelet.service.d/90-crisp.conf"), dropin).unwrap();
    ["crisp.socket", "crisp.service", "kubelet.service"]
        .iter()
        .map(|u| dir.join(u))
        .collect()
}

/// `systemd-analyze verify`: success and not a single warning.
fn verify(units: &[PathBuf]) -> Result<(), String> {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .args(units)
        .output()
        .expect("run systemd-analyze");
    let text = output_text(&out);
    if out.status.success() && text.trim().is_empty() {
        Ok(())
    } else {
        Err(format!(
            "systemd-analyze verify {:?} ({}):\n{text}",
            units, out.status
        ))
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_units() {
    ensure_tool("systemd-analyze", "systemd");
    let tmp = tempfile::tempdir().unwrap();

    // As shipped in systemd/, run against the binary cargo built.
    let units = verify_dir(
        &tmp.path().join("repo"),
        &repo_file("systemd/crisp.service"),
        &repo_file("systemd/crisp.socket"),
        &repo_file("systemd/kubelet.service.d/90-crisp.conf"),
        Path::new(CRISP),
    );
    verify(&units).unwrap();

    // As hack/install.sh installs them, with the binary it installed.
    let root = tmp.path().join("root");
    put(&root, "/var/lib/kubelet/kubeadm-flags.env", "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/containerd/containerd.sock\"\n");
    let r = install_into(&root);
    assert!(r.ok, "{}", r.all());
    let installed = |p: &str| read(&root, p);
    let bin = root.join("usr/local/bin/crisp");
    let units = verify_dir(
        &tmp.path().join("installed"),
        &installed("/etc/systemd/system/crisp.service"),
        &installed("/etc/systemd/system/crisp.socket"),
        &installed("/etc/systemd/system/kubelet.service.d/90-crisp.conf"),
        &bin,
    );
    verify(&units).unwrap();
    let v = Command::new(&bin).arg("--version").output().unwrap();
    assert!(
        v.status.success() && String::from_utf8_lossy(&v.stdout).starts_with("crisp "),
        "the installed binary runs"
    );

    // The verifier has teeth: a unit that cannot work is refused.
    let broken = tmp.path().join("broken");
    let units = verify_dir(
        &broken,
        &repo_file("systemd/crisp.service"),
        &repo_file("systemd/crisp.socket"),
        "",
        Path::new("/nonexistent/crisp"),
    );
    assert!(
        verify(&units).is_err(),
        "a missing ExecStart binary must fail verification"
    );
    std::fs::write(
        broken.join("crisp.service"),
        repo_file("systemd/crisp.service")
            .replace(INSTALLED_BIN, &format!("ExecStart={CRISP}"))
            .replace("Type=notify", "Type=notifyy"),
    )
    .unwrap();
    assert!(
        verify(&units).is_err(),
        "a bad Type= must fail verification"
    );
}

#[test]
fn hardening_is_scored_ok_by_systemd_analyze_security() {
    ensure_tool("systemd-analyze", "systemd");
    let tmp = tempfile::tempdir().unwrap();
    let units = verify_dir(
        tmp.path(),
        &repo_file("systemd/crisp.service"),
        &repo_file("systemd/crisp.socket"),
        "",
        Path::new(CRISP),
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&units[1])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no score:\n{text}{}", String::from_utf8_lossy(&out.stderr)));
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect(line);
    assert!(
        score <= 2.5,
        "crisp.service exposure {score} (want <= 2.5, \"OK\"): {line}"
    );
}

#[test]
fn units_say_what_the_design_asks() {
    let service = repo_file("systemd/crisp.service");
    let socket = repo_file("systemd/crisp.socket");
    let dropin = repo_file("systemd/kubelet.service.d/90-crisp.conf");

    assert_eq!(
        values(&service, "Type"),
        ["notify"],
        "crisp tells systemd when it listens (sd_notify READY=1)"
    );
    assert_eq!(values(&service, "NotifyAccess"), ["main"]);
    assert_eq!(values(&service, "Restart"), ["always"]);
    let restart_sec: f64 = values(&service, "RestartSec")[0]
        .trim_end_matches('s')
        .parse()
        .unwrap();
    assert!(restart_sec <= 2.0, "short restart delay");
    // A frozen or wedged crisp is restarted: it sends WATCHDOG=1 only while it makes progress
    // (src/watchdog.rs), within systemd's interval, and the interval leaves room for its bounds
    // (a stuck relay thread counts as stuck for good after twice watchdog.relay_stall).
    let watchdog_sec: f64 = values(&service, "WatchdogSec")
        .first()
        .expect("WatchdogSec= in crisp.service")
        .trim_end_matches('s')
        .parse()
        .unwrap();
    let relay_stall = crisp::config::Config::default().watchdog_relay_stall();
    assert!(
        watchdog_sec >= 2.0 * relay_stall.as_secs_f64() && watchdog_sec <= 30.0,
        "WatchdogSec={watchdog_sec}s: at least twice relay_stall ({relay_stall:?}), and short"
    );
    assert_eq!(
        values(&service, "StartLimitIntervalSec"),
        ["0"],
        "never stop restarting"
    );
    for dep in ["After", "Requires"] {
        assert!(
            words(&service, dep).contains(&"containerd.service".to_string()),
            "{dep}=containerd.service"
        );
        assert!(
            words(&service, dep).contains(&"crisp.socket".to_string()),
            "{dep}=crisp.socket"
        );
    }
    assert!(words(&service, "Before").contains(&"kubelet.service".to_string()));
    for (k, v) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", "CAP_SYS_ADMIN"),
        ("RestrictNamespaces", "net"),
    ] {
        assert_eq!(values(&service, k), [v], "{k}={v}");
    }
    // RuntimeDirectory= would delete /run/crisp (and the socket systemd holds there) on stop.
    assert_eq!(values(&service, "RuntimeDirectoryPreserve"), ["yes"]);
    // ProtectSystem=strict: crisp's only writable places are the ones it uses by default.
    assert_eq!(values(&service, "RuntimeDirectory"), ["crisp"]);
    assert_eq!(
        Path::new(crisp::config::DEFAULT_LISTEN).parent(),
        Some(Path::new("/run/crisp"))
    );
    assert_eq!(values(&service, "StateDirectory"), ["crisp"]);
    assert_eq!(crisp::config::DEFAULT_STATE_DIR, "/var/lib/crisp");

    assert_eq!(
        values(&socket, "ListenStream"),
        [crisp::config::DEFAULT_LISTEN],
        "the socket is crisp's default `listen`"
    );
    assert_eq!(values(&socket, "SocketMode"), ["0660"]);
    assert_eq!(values(&socket, "SocketUser"), ["root"]);
    assert_eq!(
        values(&socket, "FileDescriptorName"),
        [crisp::systemd::FD_NAME]
    );
    assert!(
        values(&socket, "Accept").iter().all(|v| v == "no"),
        "crisp takes the listening socket, not one per connection"
    );
    assert!(
        values(&socket, "PartOf").is_empty() && values(&socket, "BindsTo").is_empty(),
        "restarting crisp must not close the socket"
    );
    assert_eq!(values(&socket, "WantedBy"), ["sockets.target"]);

    assert!(
        words(&dropin, "Wants").contains(&"crisp.service".to_string())
            && words(&dropin, "After").contains(&"crisp.service".to_string())
    );
    assert!(
        values(&dropin, "Requires").is_empty() && values(&dropin, "BindsTo").is_empty(),
        "crisp restarts must never take kubelet down"
    );
}

#[test]
fn scripts_are_shellcheck_clean() {
    crate::prerequisites::require_tool("shellcheck", "--version");
    // Every bash script of hack/: the `.sh` files and the wrappers that start with a bash
    // shebang (a script added later is checked without being listed here).
    let mut scripts: Vec<String> = std::fs::read_dir(Path::new(REPO).join("hack"))
        .unwrap()
        .flatten()
        .filter(|e| {
            let p = e.path();
            p.extension().is_some_and(|x| x == "sh")
                || std::fs::read_to_string(&p).is_ok_and(|t| t.starts_with("#!/usr/bin/env bash"))
                || std::fs::read_to_string(&p).is_ok_and(|t| t.starts_with("#!/bin/bash"))
        })
        .map(|e| format!("hack/{}", e.file_name().to_string_lossy()))
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 20, "hack/ scripts: {scripts:?}");
    for s in &scripts {
        let out = Command::new("shellcheck")
            .arg(Path::new(REPO).join(s))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "shellcheck {s}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // POSIX sh: the installer image's entrypoint (busybox) and the .deb's maintainer scripts.
    for s in [
        "deploy/installer/entrypoint.sh",
        "packaging/deb/postinst",
        "packaging/deb/prerm",
        "packaging/deb/postrm",
        "packaging/deb/crisp-install",
        "packaging/deb/crisp-uninstall",
    ] {
        let out = Command::new("shellcheck")
            .args(["-s", "sh"])
            .arg(Path::new(REPO).join(s))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "shellcheck -s sh {s}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// What breaks "crisp outlives the pods' stops" in a set of units. At a shutdown systemd stops
/// units in the reverse of their start order, so crisp must start after the runtime and before
/// kubelet: then kubelet (whose shutdown manager stops the pods, and whose calls are in flight
/// through crisp) stops first, crisp next, containerd last. DefaultDependencies=no would drop
/// the implicit Conflicts=/Before=shutdown.target and leave crisp's stop unordered.
fn shutdown_order_problems(service: &str, socket: &str, dropin: &str) -> Vec<String> {
    let has = |unit: &str, key: &str, v: &str| words(unit, key).iter().any(|w| w == v);
    let mut p = Vec::new();
    if !has(service, "After", "containerd.service") {
        p.push(
            "crisp.service: no After=containerd.service (crisp would stop after the runtime)"
                .into(),
        );
    }
    if !has(service, "Before", "kubelet.service") {
        p.push(
            "crisp.service: no Before=kubelet.service (crisp could stop while kubelet stops pods)"
                .into(),
        );
    }
    if !has(dropin, "After", "crisp.service") {
        p.push("kubelet drop-in: no After=crisp.service".into());
    }
    if !has(socket, "Before", "kubelet.service") {
        p.push(
            "crisp.socket: no Before=kubelet.service (kubelet's endpoint could go first)".into(),
        );
    }
    for (name, unit) in [("crisp.service", service), ("crisp.socket", socket)] {
        if values(unit, "DefaultDependencies")
            .iter()
            .any(|v| v == "no")
        {
            p.push(format!(
                "{name}: DefaultDependencies=no (unordered against shutdown.target)"
            ));
        }
        for target in ["shutdown.target", "final.target", "umount.target"] {
            if has(unit, "After", target) {
                p.push(format!(
                    "{name}: After={target} (stopped before what it must outlive)"
                ));
            }
        }
    }
    p
}

/// Issue #34: crisp's units order it between the runtime and kubelet, so that at a node shutdown
/// systemd stops kubelet, then crisp, then containerd (the graceful-shutdown lane sees that order
/// in the node's journal: cluster_rollout::graceful_node_shutdown_…). The check has teeth: each
/// ordering removed from the shipped units is reported.
#[test]
fn units_stop_crisp_after_kubelet_and_before_the_runtime() {
    let service = repo_file("systemd/crisp.service");
    let socket = repo_file("systemd/crisp.socket");
    let dropin = repo_file("systemd/kubelet.service.d/90-crisp.conf");
    assert_eq!(
        shutdown_order_problems(&service, &socket, &dropin),
        Vec::<String>::new()
    );
    let broken = [
        (
            service.replace("After=containerd.service ", "After="),
            socket.clone(),
            dropin.clone(),
        ),
        (
            service.replace("Before=kubelet.service", ""),
            socket.clone(),
            dropin.clone(),
        ),
        (
            service.replace("[Unit]\n", "[Unit]\nDefaultDependencies=no\n"),
            socket.clone(),
            dropin.clone(),
        ),
        (
            service.clone(),
            socket.replace("Before=kubelet.service", ""),
            dropin.clone(),
        ),
        (
            service.clone(),
            socket.clone(),
            dropin.replace("After=crisp.socket crisp.service", "After=crisp.socket"),
        ),
    ];
    for (i, (s, so, d)) in broken.iter().enumerate() {
        assert_eq!(
            shutdown_order_problems(s, so, d).len(),
            1,
            "mutation {i} must be reported"
        );
    }
}
