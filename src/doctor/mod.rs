//! `crisp doctor`: checks a node's crisp installation and says what to fix.
//!
//! Each check reports OK, WARN or FAIL with a concrete fix; the command exits non-zero only when
//! something FAILs. Checks, in order:
//! 1. the config file parses and validates (the same code as `crisp` itself);
//! 2. the runtime's socket (`upstream`) exists and answers CRI `Version`, in runtime.v1 and/or
//!    runtime.v1alpha2;
//! 3. crisp's socket (`listen`) exists, is mode 0660 and owned by root, and a live crisp answers;
//!    the admin socket (tap, `crisp pods`, metrics) is root's and not group- or world-accessible
//!    unless `admin.allow_shared_mode` says so;
//! 4. kubelet's configured runtime (and image) endpoint, read from the same files
//!    `hack/install.sh` edits, points at crisp; kubelet's version, and whether its native
//!    sidecars (1.29+) make crisp unnecessary;
//! 5. the node's cgroup version against what this kubelet does on it (kubelet 1.35+ refuses
//!    cgroup v1 unless `failCgroupV1: false`);
//! 6. the systemd units are installed and enabled (when systemctl exists);
//! 7. the state directory (`state_dir`: Job-mode marks, held calls' intents) can be written
//!    durably.
//!
//! One file per check: `config.rs`, `runtime.rs`, `sockets.rs` (with `progress.rs`, the
//! watchdog's view of a live crisp), `kubelet.rs`, `cgroup.rs`, `units.rs`, `state.rs`; this file
//! runs them in order
//! and keeps the report.
//!
//! `--root DIR` inspects a node whose filesystem is at DIR (tests, a mounted image): every node
//! path — the default config file, the sockets, kubelet's files, the units — is looked up under
//! it. Paths in the config and `--listen`/`--upstream` are node paths; `--config FILE` is read as
//! given.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod cgroup;
mod config;
mod kubelet;
mod progress;
mod runtime;
mod sockets;
mod state;
mod units;

use cgroup::check_cgroup;
use config::check_config;
use kubelet::{check_kubelet, check_kubelet_version, kubelet_version};
use progress::check_progress;
use runtime::check_upstream;
use sockets::{check_admin_socket, check_crisp_socket};
use state::check_state_dir;
use units::check_units;

use crate::config::Config;

/// What `crisp doctor` looks at.
#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    pub config: Option<PathBuf>,
    pub listen: Option<PathBuf>,
    pub upstream: Option<PathBuf>,
    /// Per CRI call.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            root: "/".into(),
            config: None,
            listen: None,
            upstream: None,
            timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Ok,
    Warn,
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Check {
    /// Short stable name: `config`, `upstream`, `crisp-socket`, `kubelet`, `kubelet-version`,
    /// `cgroup`, `units`.
    pub(crate) name: &'static str,
    pub(crate) level: Level,
    pub(crate) detail: String,
    /// What to do about a WARN or FAIL.
    pub(crate) fix: Option<String>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub(crate) checks: Vec<Check>,
}

impl Report {
    fn push(
        &mut self,
        name: &'static str,
        level: Level,
        detail: impl Into<String>,
        fix: Option<String>,
    ) {
        self.checks.push(Check {
            name,
            level,
            detail: detail.into(),
            fix,
        });
    }
    fn ok(&mut self, name: &'static str, detail: impl Into<String>) {
        self.push(name, Level::Ok, detail, None);
    }
    fn warn(&mut self, name: &'static str, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(name, Level::Warn, detail, Some(fix.into()));
    }
    fn fail(&mut self, name: &'static str, detail: impl Into<String>, fix: impl Into<String>) {
        self.push(name, Level::Fail, detail, Some(fix.into()));
    }

    /// True when nothing FAILed (exit code 0).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.level != Level::Fail)
    }

    pub(crate) fn count(&self, level: Level) -> usize {
        self.checks.iter().filter(|c| c.level == level).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            writeln!(
                f,
                "[{:<4}] {:<12} {}",
                c.level.to_string(),
                c.name,
                c.detail
            )?;
            if let Some(fix) = &c.fix {
                for (i, line) in fix.lines().enumerate() {
                    writeln!(
                        f,
                        "{:20}{} {}",
                        "",
                        if i == 0 { "fix:" } else { "    " },
                        line
                    )?;
                }
            }
        }
        write!(
            f,
            "{} FAIL, {} WARN, {} OK",
            self.count(Level::Fail),
            self.count(Level::Warn),
            self.count(Level::Ok)
        )
    }
}

/// `path` (a node path) as seen from here.
pub(crate) fn under_root(root: &Path, path: &Path) -> PathBuf {
    if root == Path::new("/") {
        return path.to_path_buf();
    }
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Runs every check.
pub async fn run(opts: &Options) -> Report {
    let mut r = Report::default();
    let cfg = check_config(opts, &mut r);
    let listen = opts.listen.clone().unwrap_or_else(|| cfg.listen.clone());
    let upstream = opts
        .upstream
        .clone()
        .unwrap_or_else(|| cfg.upstream.clone());
    check_upstream(opts, &upstream, &mut r).await;
    check_crisp_socket(opts, &listen, &mut r).await;
    check_admin_socket(
        opts,
        &Config {
            listen: listen.clone(),
            ..cfg.clone()
        },
        &mut r,
    );
    check_progress(opts, &cfg, &listen, &mut r).await;
    check_kubelet(opts, &listen, &upstream, &mut r);
    let version = kubelet_version(&opts.root);
    check_kubelet_version(version, &mut r);
    check_cgroup(opts, version, &mut r);
    check_units(opts, &listen, &mut r);
    check_state_dir(opts, &cfg, &mut r);
    r
}

#[cfg(test)]
mod tests;
