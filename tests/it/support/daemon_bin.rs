//! The real `crisp` binary for tests that need a process of its own (signals, socket modes):
//! a minimal config and the command that starts it, detached from the caller's systemd and
//! logging environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `DIR/config.toml`: listening on `DIR/crisp.sock` (admin socket `DIR/admin.sock`), for a
/// runtime that is not there, logging at info.
pub fn write_config(dir: &Path) -> PathBuf {
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = {:?}\nupstream = {:?}\nstate_dir = {:?}\n[log]\nlevel = \"info\"\n",
            dir.join("crisp.sock"),
            dir.join("no-runtime.sock"),
            dir.join("state")
        ),
    )
    .unwrap();
    cfg
}

/// `crisp --config CFG`, its stderr (the log) into `log`.
pub fn crisp(cfg: &Path, log: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_crisp"));
    c.arg("--config").arg(cfg);
    for k in [
        "NOTIFY_SOCKET",
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
        "RUST_LOG",
    ] {
        c.env_remove(k);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    c
}
