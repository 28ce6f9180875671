//! Check 3: crisp's socket (mode, owner, a live crisp answering) and the admin socket's
//! mode and owner.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::runtime::{client_for, describe, socket_exists};
use super::*;
use crate::config::{Config, DEFAULT_CONFIG_PATH};
use crate::cri::ApiVersion;
use crate::proxy::client::ClientError;

pub(super) async fn check_crisp_socket(opts: &Options, listen: &Path, r: &mut Report) {
    let path = under_root(&opts.root, listen);
    let md = match socket_exists(
        &path,
        "listen, crisp's socket",
        "start crisp: systemctl start crisp.socket crisp.service (install: hack/install.sh)",
    ) {
        Ok(md) => md,
        Err((detail, fix)) => return r.fail("crisp-socket", detail, fix),
    };
    let mode = md.mode() & 0o7777;
    let (uid, gid) = (md.uid(), md.gid());
    let perm = format!("mode {mode:04o}, owner {uid}:{gid}");
    let fix_perm = format!(
        "set SocketMode=0660, SocketUser=root in crisp.socket (or listen_mode = \"0660\" in the config) and restart: systemctl restart crisp.socket crisp.service; by hand: chown root {p} && chmod 0660 {p}",
        p = path.display()
    );
    // Connecting to a unix socket needs write permission on it.
    if mode & 0o002 != 0 || uid != 0 {
        r.fail("crisp-socket", format!("{} has {perm}: whoever can connect controls the container runtime (root on this node)", path.display()), fix_perm);
    } else if mode != 0o660 {
        r.warn(
            "crisp-socket",
            format!("{} has {perm}, expected 0660 owned by root", path.display()),
            fix_perm,
        );
    } else if gid != 0 {
        r.warn(
            "crisp-socket",
            format!(
                "{} has {perm}: members of group {gid} can drive the container runtime",
                path.display()
            ),
            format!(
                "unless that is intended, set SocketGroup=root in crisp.socket (by hand: chgrp root {})",
                path.display()
            ),
        );
    } else {
        r.ok("crisp-socket", format!("{} has {perm}", path.display()));
    }
    let client = client_for(&path, opts.timeout);
    match client.version(ApiVersion::V1).await {
        Ok(v) => r.ok("crisp-socket", format!("crisp answers on {}, forwarding to {}", path.display(), describe(&v))),
        Err(ClientError::Status { status, .. }) => r.warn(
            "crisp-socket",
            format!(
                "crisp answers on {} but the forwarded Version call failed: {status}",
                path.display()
            ),
            "see the `upstream` check above; journalctl -u crisp",
        ),
        Err(e) => r.fail(
            "crisp-socket",
            format!("nothing answers on {}: {e}", path.display()),
            "start crisp (systemctl start crisp.service) and read why it is not serving: journalctl -u crisp",
        ),
    }
}

/// The admin socket shows every pod's CRI calls (`crisp tap`) and every pod crisp tracks
/// (`crisp pods`): it must be root's, and only root's unless the config opted in.
pub(super) fn check_admin_socket(opts: &Options, cfg: &Config, r: &mut Report) {
    const NAME: &str = "admin-socket";
    if !cfg.admin.enabled {
        return r.ok(NAME, "the admin socket is off (admin.enabled = false)");
    }
    let path = under_root(&opts.root, &cfg.admin_socket());
    let md = match socket_exists(
        &path,
        "admin.socket, crisp's admin socket",
        "start crisp (systemctl start crisp.service); if it runs, `journalctl -u crisp` says why it could not bind the admin socket",
    ) {
        Ok(md) => md,
        Err((detail, fix)) => return r.warn(NAME, format!("{detail}: crisp tap, crisp pods and GET /metrics are unavailable"), fix),
    };
    let mode = md.mode() & 0o7777;
    let (uid, gid) = (md.uid(), md.gid());
    let perm = format!("mode {mode:04o}, owner {uid}:{gid}");
    let sees = "can connect and see every pod's CRI calls (crisp tap) and every pod crisp tracks (crisp pods)";
    let fix_mode = format!(
        "set admin.mode = \"0600\" in the config ({DEFAULT_CONFIG_PATH}) and restart crisp: systemctl restart crisp.service; by hand: chmod 0600 {}",
        path.display()
    );
    let opted = cfg.admin.allow_shared_mode;
    if uid != 0 {
        r.fail(NAME, format!("{} has {perm}: uid {uid} {sees}", path.display()), format!("crisp creates it root's: restart crisp (systemctl restart crisp.service); by hand: chown root {}", path.display()));
    } else if mode & 0o007 != 0 {
        let detail = format!(
            "{} has {perm}: every user on this node {sees}",
            path.display()
        );
        if opted {
            r.warn(
                NAME,
                format!("{detail} (admin.allow_shared_mode = true)"),
                fix_mode,
            );
        } else {
            r.fail(NAME, detail, fix_mode);
        }
    } else if mode & 0o070 != 0 {
        let detail = format!(
            "{} has {perm}: members of group {gid} {sees}",
            path.display()
        );
        if opted {
            r.ok(
                NAME,
                format!("{detail}, as admin.allow_shared_mode = true allows"),
            );
        } else {
            r.warn(NAME, detail, fix_mode);
        }
    } else {
        r.ok(NAME, format!("{} has {perm}", path.display()));
    }
}
