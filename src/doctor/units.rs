//! Check 5: the systemd units are installed and enabled (when systemctl exists).

use std::path::Path;
use std::process::Command;

use super::*;

const UNIT_DIR: &str = "/etc/systemd/system";
const KUBELET_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/90-crisp.conf";
/// Where the crisp .deb installs the units.
const PACKAGE_UNIT_DIR: &str = "/lib/systemd/system";

pub(super) fn systemctl_available() -> bool {
    Command::new("systemctl")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `ListenStream=` of a socket unit.
fn unit_listen_stream(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("ListenStream="))
        .map(|v| v.trim().to_string())
}

pub(super) fn check_units(opts: &Options, listen: &Path, r: &mut Report) {
    if !systemctl_available() {
        r.ok(
            "units",
            "systemctl not found: not a systemd node, unit checks skipped",
        );
        return;
    }
    let root = &opts.root;
    let install = "install them: hack/install.sh (copies systemd/* and enables them), or crisp-install with the crisp package";
    // hack/install.sh puts the units in /etc/systemd/system; the .deb in /lib/systemd/system.
    let unit_dir = [UNIT_DIR, PACKAGE_UNIT_DIR]
        .into_iter()
        .find(|d| under_root(root, &Path::new(d).join("crisp.service")).exists())
        .unwrap_or(UNIT_DIR);
    let mut missing = Vec::new();
    for unit in ["crisp.service", "crisp.socket"] {
        let p = under_root(root, &Path::new(unit_dir).join(unit));
        if !p.exists() {
            missing.push(p.display().to_string());
        }
    }
    let dropin = under_root(root, Path::new(KUBELET_DROPIN));
    if !dropin.exists() {
        missing.push(dropin.display().to_string());
    }
    if !missing.is_empty() {
        r.warn(
            "units",
            format!("not installed: {}", missing.join(", ")),
            install,
        );
        return;
    }
    let socket_unit =
        std::fs::read_to_string(under_root(root, &Path::new(unit_dir).join("crisp.socket")))
            .unwrap_or_default();
    if let Some(ls) = unit_listen_stream(&socket_unit) {
        if Path::new(&ls) != listen {
            r.fail(
                "units",
                format!(
                    "crisp.socket listens on {ls} but crisp's `listen` is {}",
                    listen.display()
                ),
                "make ListenStream= in crisp.socket and `listen` in the config the same path (kubelet points at it)",
            );
        }
    }
    let mut not_enabled = Vec::new();
    for unit in ["crisp.socket", "crisp.service"] {
        let out = Command::new("systemctl")
            .arg(format!("--root={}", root.display()))
            .args(["is-enabled", unit])
            .output();
        let state = out
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        if state != "enabled" {
            not_enabled.push(format!(
                "{unit} ({})",
                if state.is_empty() { "unknown" } else { &state }
            ));
        }
    }
    if !not_enabled.is_empty() {
        r.warn(
            "units",
            format!("not enabled: {}", not_enabled.join(", ")),
            "systemctl enable --now crisp.socket crisp.service",
        );
        return;
    }
    let live = root == Path::new("/") && Path::new("/run/systemd/system").exists();
    if !live {
        r.ok(
            "units",
            "crisp.socket, crisp.service and the kubelet drop-in are installed and enabled",
        );
        return;
    }
    let mut inactive = Vec::new();
    for unit in ["crisp.socket", "crisp.service", "kubelet.service"] {
        let out = Command::new("systemctl").args(["is-active", unit]).output();
        let state = out
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        if state != "active" {
            inactive.push(format!("{unit} ({state})"));
        }
    }
    if inactive.is_empty() {
        r.ok(
            "units",
            "crisp.socket, crisp.service and kubelet.service are enabled and active",
        );
    } else {
        r.warn(
            "units",
            format!(
                "installed and enabled, but not active: {}",
                inactive.join(", ")
            ),
            "systemctl start crisp.socket crisp.service; journalctl -u crisp -u kubelet",
        );
    }
}
