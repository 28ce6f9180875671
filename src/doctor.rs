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
//! 5. the systemd units are installed and enabled (when systemctl exists).
//!
//! `--root DIR` inspects a node whose filesystem is at DIR (tests, a mounted image): every node
//! path — the default config file, the sockets, kubelet's files, the units — is looked up under
//! it. Paths in the config and `--listen`/`--upstream` are node paths; `--config FILE` is read as
//! given.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, DEFAULT_CONFIG_PATH};
use crate::cri::ApiVersion;
use crate::proxy::client::{ClientError, RuntimeClient, VersionResponse};
use crate::proxy::{Upstream, UpstreamOptions};

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
    /// `units`.
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
    check_kubelet_version(opts, &mut r);
    check_units(opts, &listen, &mut r);
    r
}

fn check_config(opts: &Options, r: &mut Report) -> Config {
    let (path, explicit) = match &opts.config {
        Some(p) => (p.clone(), true),
        None => (
            under_root(&opts.root, Path::new(DEFAULT_CONFIG_PATH)),
            false,
        ),
    };
    if !explicit && !path.exists() {
        r.ok(
            "config",
            format!(
                "no config file at {}: built-in defaults apply",
                path.display()
            ),
        );
        return Config::default();
    }
    match Config::load(Some(&path)) {
        Ok(mut cfg) => {
            let (l, u) = (
                opts.listen.clone().unwrap_or(cfg.listen.clone()),
                opts.upstream.clone().unwrap_or(cfg.upstream.clone()),
            );
            cfg.listen = l;
            cfg.upstream = u;
            match cfg.validate("command line") {
                Ok(()) => r.ok(
                    "config",
                    format!(
                        "{} is valid (listen {}, upstream {})",
                        path.display(),
                        cfg.listen.display(),
                        cfg.upstream.display()
                    ),
                ),
                Err(e) => r.fail(
                    "config",
                    e.to_string(),
                    "pass different --listen/--upstream".to_string(),
                ),
            }
            cfg
        }
        Err(e) => {
            r.fail("config", e.to_string(), format!("edit {} (keys: docs/INSTALL.md), then check it with `crisp --check-config --config {}`", path.display(), path.display()));
            Config::default()
        }
    }
}

fn client_for(path: &Path, timeout: Duration) -> RuntimeClient {
    let opts = UpstreamOptions {
        connect_timeout: timeout.min(Duration::from_secs(2)),
        ..Default::default()
    };
    RuntimeClient::new(Arc::new(Upstream::new(path.to_path_buf(), opts)), timeout)
}

fn describe(v: &VersionResponse) -> String {
    format!(
        "{} {} (CRI {})",
        v.runtime_name, v.runtime_version, v.runtime_api_version
    )
}

/// `Err(detail, fix)` unless `path` is an existing unix socket.
fn socket_exists(
    path: &Path,
    what: &str,
    fix_missing: &str,
) -> Result<std::fs::Metadata, (String, String)> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_socket() => Ok(md),
        Ok(_) => Err((
            format!(
                "{} ({what}) exists but is not a unix socket",
                path.display()
            ),
            format!("remove {} and {fix_missing}", path.display()),
        )),
        Err(e) => Err((
            format!("{} ({what}): {e}", path.display()),
            fix_missing.to_string(),
        )),
    }
}

async fn check_upstream(opts: &Options, upstream: &Path, r: &mut Report) {
    let path = under_root(&opts.root, upstream);
    let fix_missing = format!(
        "start the runtime (systemctl start containerd), or set `upstream` in {} to the runtime's socket",
        DEFAULT_CONFIG_PATH
    );
    if let Err((detail, fix)) = socket_exists(&path, "upstream, the runtime's socket", &fix_missing)
    {
        r.fail("upstream", detail, fix);
        return;
    }
    let client = client_for(&path, opts.timeout);
    let v1 = client.version(ApiVersion::V1).await;
    let v1alpha2 = client.version(ApiVersion::V1alpha2).await;
    let served = |res: &Result<VersionResponse, ClientError>| res.is_ok();
    let apis: Vec<&str> = [
        ("runtime.v1", served(&v1)),
        ("runtime.v1alpha2", served(&v1alpha2)),
    ]
    .iter()
    .filter(|(_, s)| *s)
    .map(|(n, _)| *n)
    .collect();
    match (&v1, &v1alpha2) {
        (Ok(v), _) => r.ok("upstream", format!("{} answers: {}; serves {}", path.display(), describe(v), apis.join(" and "))),
        (Err(_), Ok(v)) => r.warn(
            "upstream",
            format!("{} answers: {}; serves runtime.v1alpha2 only", path.display(), describe(v)),
            "kubelet 1.26+ requires runtime.v1: upgrade the runtime (containerd 1.6+) before upgrading kubelet",
        ),
        (Err(e), Err(_)) => r.fail(
            "upstream",
            format!("{} does not answer CRI Version: {e}", path.display()),
            "check the runtime: systemctl status containerd; journalctl -u containerd; for containerd, the `cri` plugin must not be disabled in /etc/containerd/config.toml",
        ),
    }
}

/// Whether the running crisp makes progress (its watchdog's verdict, `GET /healthz` on the
/// admin socket). A crisp can answer a new connection while an old one, kubelet's, is stuck:
/// this asks crisp itself. Skipped when crisp's socket already failed its check.
async fn check_progress(opts: &Options, cfg: &Config, listen: &Path, r: &mut Report) {
    if r.checks
        .iter()
        .any(|c| c.name == "crisp-socket" && c.level == Level::Fail)
    {
        return;
    }
    let admin = cfg
        .admin
        .socket
        .clone()
        .unwrap_or_else(|| listen.with_file_name("admin.sock"));
    let path = under_root(&opts.root, &admin);
    if !cfg.admin.enabled {
        return r.ok(
            "progress",
            "not checked: the admin socket is disabled ([admin] enabled = false)",
        );
    }
    if !path.exists() {
        // The admin-socket check has said so already.
        return;
    }
    match tokio::time::timeout(Duration::from_secs(3), healthz(&path)).await {
        Ok(Ok((200, body))) => r.ok(
            "progress",
            format!("crisp's relay threads and async runtime make progress ({body})"),
        ),
        Ok(Ok((code, body))) => r.fail(
            "progress",
            format!(
                "crisp is stuck (HTTP {code} from {}): {body}",
                path.display()
            ),
            "systemd restarts it after WatchdogSec; until then see journalctl -u crisp and \
             curl --unix-socket ADMIN_SOCKET http://x/debug/connections (a bug: report both)"
                .replace("ADMIN_SOCKET", &path.display().to_string()),
        ),
        Ok(Err(e)) => r.warn(
            "progress",
            format!("cannot ask crisp on {}: {e}", path.display()),
            "run crisp doctor as root; check [admin] in the config and journalctl -u crisp",
        ),
        Err(_) => r.fail(
            "progress",
            format!(
                "crisp's admin socket {} did not answer in 3 s",
                path.display()
            ),
            "crisp may be wedged: systemd restarts it after WatchdogSec; journalctl -u crisp",
        ),
    }
}

/// `GET /healthz` on the admin socket: the status and the first line of the body.
async fn healthz(path: &Path) -> Result<(u16, String), String> {
    use http_body_util::BodyExt;
    let io = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| e.to_string())?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = http::Request::get("/healthz")
        .header(http::header::HOST, "crisp")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let code = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    Ok((code, text.lines().next().unwrap_or("").trim().to_string()))
}

async fn check_crisp_socket(opts: &Options, listen: &Path, r: &mut Report) {
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
fn check_admin_socket(opts: &Options, cfg: &Config, r: &mut Report) {
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

// ---- kubelet's configured endpoint ----

/// Where kubelet reads its flags and config on a kubeadm-style node, lowest precedence first
/// (10-kubeadm.conf: `$KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS`; on the
/// command line the last flag wins, and flags win over the config file).
pub(crate) const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
pub(crate) const KUBEADM_FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";
pub(crate) const EXTRA_ARGS_FILES: [&str; 2] = ["/etc/sysconfig/kubelet", "/etc/default/kubelet"];

/// A setting and the file that set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setting {
    pub(crate) value: String,
    pub(crate) file: PathBuf,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct KubeletSettings {
    pub(crate) runtime_endpoint: Option<Setting>,
    pub(crate) image_endpoint: Option<Setting>,
    /// `--container-runtime=...` (removed in kubelet 1.27).
    pub(crate) container_runtime: Option<Setting>,
    /// Files that exist, as node paths.
    pub(crate) files: Vec<PathBuf>,
}

/// The value of the last `name=...` assignment in an EnvironmentFile, unquoted.
pub(crate) fn env_file_var(text: &str, name: &str) -> Option<String> {
    let mut found = None;
    for line in text.lines() {
        let l = line.trim_start();
        if l.starts_with('#') || l.starts_with(';') {
            continue;
        }
        let Some((k, v)) = l.split_once('=') else {
            continue;
        };
        if k.trim() != name {
            continue;
        }
        let v = v.trim();
        let unq = ['"', '\'']
            .iter()
            .find_map(|q| v.strip_prefix(*q).and_then(|x| x.strip_suffix(*q)));
        found = Some(unq.unwrap_or(v).to_string());
    }
    found
}

/// The last value of `--flag=v` / `--flag v` in a kubelet argument string.
pub(crate) fn flag_value(args: &str, flag: &str) -> Option<String> {
    let toks: Vec<&str> = args.split_whitespace().collect();
    let mut found = None;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i];
        if let Some(v) = t.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_string());
        } else if t == flag && i + 1 < toks.len() {
            found = Some(toks[i + 1].to_string());
            i += 1;
        }
        i += 1;
    }
    found
}

/// A top-level `key: value` of a (kubeadm-written, block-style) YAML file, unquoted.
pub(crate) fn yaml_top_level(text: &str, key: &str) -> Option<String> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(key).and_then(|r| r.strip_prefix(':')) else {
            continue;
        };
        let mut v = rest.trim();
        if let Some(i) = v.find(" #") {
            v = v[..i].trim_end();
        }
        let unq = ['"', '\'']
            .iter()
            .find_map(|q| v.strip_prefix(*q).and_then(|x| x.strip_suffix(*q)));
        found = Some(unq.unwrap_or(v).to_string());
    }
    found
}

/// Reads kubelet's endpoint settings from the files `hack/install.sh` edits.
pub(crate) fn kubelet_settings(root: &Path) -> KubeletSettings {
    let mut s = KubeletSettings::default();
    let read = |p: &str| std::fs::read_to_string(under_root(root, Path::new(p))).ok();
    if let Some(text) = read(KUBELET_CONFIG) {
        s.files.push(KUBELET_CONFIG.into());
        let set = |v: Option<String>| {
            v.filter(|v| !v.is_empty()).map(|value| Setting {
                value,
                file: KUBELET_CONFIG.into(),
            })
        };
        s.runtime_endpoint = set(yaml_top_level(&text, "containerRuntimeEndpoint"));
        s.image_endpoint = set(yaml_top_level(&text, "imageServiceEndpoint"));
    }
    let mut args_files: Vec<(&str, &str)> = vec![(KUBEADM_FLAGS, "KUBELET_KUBEADM_ARGS")];
    args_files.extend(EXTRA_ARGS_FILES.iter().map(|f| (*f, "KUBELET_EXTRA_ARGS")));
    for (file, var) in args_files {
        let Some(text) = read(file) else { continue };
        s.files.push(file.into());
        let Some(args) = env_file_var(&text, var) else {
            continue;
        };
        let set = |flag: &str, slot: &mut Option<Setting>| {
            if let Some(value) = flag_value(&args, flag) {
                *slot = Some(Setting {
                    value,
                    file: file.into(),
                });
            }
        };
        set("--container-runtime-endpoint", &mut s.runtime_endpoint);
        set("--image-service-endpoint", &mut s.image_endpoint);
        set("--container-runtime", &mut s.container_runtime);
    }
    s
}

/// `unix:///a/b` and `/a/b` → the path; anything else (tcp://, npipe://) → None.
pub(crate) fn endpoint_path(endpoint: &str) -> Option<PathBuf> {
    let p = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    p.starts_with('/').then(|| PathBuf::from(p))
}

/// kubelet's version as (major, minor), from `kubelet --version` ("Kubernetes v1.27.3").
pub(crate) fn parse_kubelet_version(s: &str) -> Option<(u32, u32)> {
    let v = s.split_whitespace().last()?.trim_start_matches('v');
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.trim_end_matches('+').parse().ok()?;
    Some((major, minor))
}

/// Where kubelet's binary is looked for under `--root` (on `/`, `kubelet` on PATH first).
pub(crate) const KUBELET_BINS: [&str; 3] = [
    "/usr/bin/kubelet",
    "/usr/local/bin/kubelet",
    "/opt/bin/kubelet",
];

/// kubelet's version, from running `kubelet --version`.
fn kubelet_version(root: &Path) -> Option<(u32, u32)> {
    let run = |bin: &Path| -> Option<(u32, u32)> {
        let out = Command::new(bin).arg("--version").output().ok()?;
        parse_kubelet_version(&String::from_utf8_lossy(&out.stdout))
    };
    if root == Path::new("/") {
        if let Some(v) = run(Path::new("kubelet")) {
            return Some(v);
        }
    }
    KUBELET_BINS
        .iter()
        .map(|b| under_root(root, Path::new(b)))
        .filter(|b| b.exists())
        .find_map(|b| run(&b))
}

/// What the kubelet's version means for crisp (README "Support matrix").
fn check_kubelet_version(opts: &Options, r: &mut Report) {
    let Some((major, minor)) = kubelet_version(&opts.root) else {
        // Not a problem with the installation (kubelet may run from elsewhere): reported, not
        // warned about.
        r.ok(
            "kubelet-version",
            "kubelet's version is unknown (no kubelet binary found to run `kubelet --version`); crisp is for kubelet 1.20–1.28, on 1.29+ see README: Support matrix",
        );
        return;
    };
    let v = format!("{major}.{minor}");
    match (major, minor) {
        (1, m) if m < 20 => r.warn("kubelet-version", format!("kubelet {v}: older than crisp was built against (1.20–1.27)"), "upgrade kubelet to 1.20 or later"),
        (1, m) if m <= 27 => r.ok("kubelet-version", format!("kubelet {v} has no native sidecars: crisp orders sidecars, stops them last and ends Job sidecars")),
        (1, 28) => r.ok(
            "kubelet-version",
            format!(
                "kubelet {v}: native sidecars are alpha (feature gate SidecarContainers, off by default); crisp orders legacy sidecars and leaves native ones (init containers with restartPolicy: Always) to kubelet"
            ),
        ),
        _ => r.warn(
            "kubelet-version",
            format!(
                "kubelet {v} has native sidecars (KEP-753, on by default since 1.29): a pod that declares its sidecars as init containers with restartPolicy: Always needs no crisp"
            ),
            "move sidecars to native ones (Istio and Linkerd have a native-sidecar mode) and uninstall crisp with hack/uninstall.sh — or keep it for pods you cannot change, and for `crisp tap`",
        ),
    }
}

fn check_kubelet(opts: &Options, listen: &Path, upstream: &Path, r: &mut Report) {
    let s = kubelet_settings(&opts.root);
    let crisp = format!("unix://{}", listen.display());
    let install = "run hack/install.sh (it edits the file that sets the endpoint, keeps a backup and restarts kubelet)";
    if s.files.is_empty() {
        r.warn(
            "kubelet",
            format!(
                "no kubelet configuration found under {} (looked for {KUBELET_CONFIG}, {KUBEADM_FLAGS}, {})",
                opts.root.display(),
                EXTRA_ARGS_FILES.join(", ")
            ),
            format!(
                "not a kubeadm-style node? start kubelet with --container-runtime-endpoint={crisp} (or containerRuntimeEndpoint: {crisp} in its config file)"
            ),
        );
        return;
    }
    match &s.runtime_endpoint {
        Some(set) if endpoint_path(&set.value).as_deref() == Some(listen) => r.ok("kubelet", format!("runtime endpoint {} (set in {}) is crisp", set.value, set.file.display())),
        Some(set) if endpoint_path(&set.value).as_deref() == Some(upstream) => {
            r.fail("kubelet", format!("runtime endpoint {} (set in {}) is the runtime itself: kubelet bypasses crisp", set.value, set.file.display()), install)
        }
        Some(set) => r.fail("kubelet", format!("runtime endpoint {} (set in {}) is not crisp ({crisp})", set.value, set.file.display()), format!("point it at {crisp}: {install}")),
        None => r.fail("kubelet", "no runtime endpoint configured: kubelet uses its default (containerd's socket), bypassing crisp", install),
    }
    if let Some(set) = &s.image_endpoint {
        if endpoint_path(&set.value).as_deref() != Some(listen) {
            r.warn(
                "kubelet",
                format!(
                    "image endpoint {} (set in {}) is not crisp: image calls bypass crisp and are not tapped",
                    set.value,
                    set.file.display()
                ),
                format!(
                    "set it to {crisp} or remove it (it defaults to the runtime endpoint): {install}"
                ),
            );
        }
    }
    if let Some(set) = &s.container_runtime {
        if let Some(v) = kubelet_version(&opts.root).filter(|v| *v >= (1, 27)) {
            r.fail(
                "kubelet",
                format!(
                    "--container-runtime={} (in {}) was removed in kubelet 1.27; this kubelet is {}.{} and will not start",
                    set.value,
                    set.file.display(),
                    v.0,
                    v.1
                ),
                format!("remove the flag from {}: hack/install.sh does it", set.file.display()),
            );
        }
    }
}

// ---- systemd units ----

pub(crate) const UNIT_DIR: &str = "/etc/systemd/system";
pub(crate) const KUBELET_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/90-crisp.conf";
/// Where the crisp .deb installs the units.
pub(crate) const PACKAGE_UNIT_DIR: &str = "/lib/systemd/system";

fn systemctl_available() -> bool {
    Command::new("systemctl")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// `ListenStream=` of a socket unit.
pub(crate) fn unit_listen_stream(text: &str) -> Option<String> {
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("ListenStream="))
        .map(|v| v.trim().to_string())
}

fn check_units(opts: &Options, listen: &Path, r: &mut Report) {
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

#[cfg(test)]
mod tests {
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
}
