//! Shared helpers of tests/it/systemd_*.rs and tests/it/install_*.rs: a minimal fake CRI runtime, a
//! one-connection-per-call CRI client, crisp processes (optionally with an inherited listening
//! socket), a fake NOTIFY_SOCKET, host tools, and node-root snapshots.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::os::fd::RawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use crisp::proxy::client::{VersionRequest, VersionResponse};
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::{UnixListener, UnixStream};

pub const CRISP: &str = env!("CARGO_BIN_EXE_crisp");
pub const REPO: &str = env!("CARGO_MANIFEST_DIR");

// ---- fake runtime -------------------------------------------------------------------------------

/// A CRI runtime that answers RuntimeService/Version (runtime.v1, and runtime.v1alpha2 when
/// asked) and UNIMPLEMENTED for everything else.
pub struct FakeRuntime {
    pub path: PathBuf,
    pub calls: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type RespBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn grpc_response(status: u32, msg: Option<Vec<u8>>) -> Response<RespBody> {
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::new();
    if let Some(m) = msg {
        frames.push(Ok(Frame::data(crisp::cri::wire::frame(&m))));
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", status.to_string().parse().unwrap());
    if status != 0 {
        trailers.insert(
            "grpc-message",
            "not%20implemented%20by%20the%20fake%20runtime"
                .parse()
                .unwrap(),
        );
    }
    frames.push(Ok(Frame::trailers(trailers)));
    let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
    Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap()
}

/// Binds `path` (parent created, a stale socket removed) and answers every HTTP/2 request on it
/// with `answer(path of the call, its whole request body)` until the returned task is aborted.
fn serve_unix<H, F>(path: &Path, answer: H) -> tokio::task::JoinHandle<()>
where
    H: Fn(String, Bytes) -> F + Clone + Send + Sync + 'static,
    F: std::future::Future<Output = Response<RespBody>> + Send + 'static,
{
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .unwrap_or_else(|e| panic!("bind fake runtime {}: {e}", path.display()));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let answer = answer.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let answer = answer.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        Ok::<_, Infallible>(answer(path, body).await)
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

/// Serves runtime.v1 (and runtime.v1alpha2 if asked) on `path` (parent created) until dropped.
pub async fn fake_runtime(path: &Path, serve_v1alpha2: bool) -> FakeRuntime {
    fake_runtime_apis(path, true, serve_v1alpha2).await
}

/// Serves the CRI API versions asked for on `path` until dropped.
pub async fn fake_runtime_apis(path: &Path, serve_v1: bool, serve_v1alpha2: bool) -> FakeRuntime {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let task = serve_unix(path, move |path, body| {
        let c = c.clone();
        async move {
            let api = if path.starts_with("/runtime.v1.") && serve_v1 {
                Some("v1")
            } else if path.starts_with("/runtime.v1alpha2.") && serve_v1alpha2 {
                Some("v1alpha2")
            } else {
                None
            };
            match api {
                Some(api) if path.ends_with("RuntimeService/Version") => {
                    c.fetch_add(1, Ordering::SeqCst);
                    let req = VersionRequest::decode(body.get(5..).unwrap_or_default())
                        .unwrap_or_default();
                    let v = VersionResponse {
                        version: req.version,
                        runtime_name: "fake-runtime".into(),
                        runtime_version: "1.2.3".into(),
                        runtime_api_version: api.into(),
                    };
                    grpc_response(0, Some(v.encode_to_vec()))
                }
                _ => grpc_response(12, None),
            }
        }
    });
    FakeRuntime {
        path: path.to_path_buf(),
        calls,
        task,
    }
}

/// A runtime whose StartContainer and CreateContainer take `delay` (then succeed; CreateContainer
/// answers container id "c1"), the calls kubelet treats as fatal when they fail. Each call's
/// (arrival, answer) instants are recorded in `calls` once it is answered; `in_flight` counts
/// those that arrived and are not answered yet. Everything else is UNIMPLEMENTED.
pub struct SlowRuntime {
    pub path: PathBuf,
    pub calls: Arc<Mutex<Vec<(std::time::Instant, std::time::Instant)>>>,
    pub in_flight: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SlowRuntime {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn slow_start_runtime(path: &Path, delay: Duration) -> SlowRuntime {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (c, f) = (calls.clone(), in_flight.clone());
    let task = serve_unix(path, move |path, _body| {
        let (c, f) = (c.clone(), f.clone());
        async move {
            let answer = match path.as_str() {
                "/runtime.v1.RuntimeService/StartContainer" => Some(Vec::new()),
                // CreateContainerResponse { container_id: "c1" }
                "/runtime.v1.RuntimeService/CreateContainer" => Some(vec![0x0a, 0x02, b'c', b'1']),
                _ => None,
            };
            match answer {
                Some(msg) => {
                    let t = std::time::Instant::now();
                    f.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    c.lock().unwrap().push((t, std::time::Instant::now()));
                    f.fetch_sub(1, Ordering::SeqCst);
                    grpc_response(0, Some(msg))
                }
                None => grpc_response(12, None),
            }
        }
    });
    SlowRuntime {
        path: path.to_path_buf(),
        calls,
        in_flight,
        task,
    }
}

// ---- client -------------------------------------------------------------------------------------

/// One CRI Version call over an already-connected stream (one connection per call).
pub async fn version_over(stream: UnixStream, api: &str) -> Result<VersionResponse, String> {
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    let msg = VersionRequest {
        version: api.to_string(),
    }
    .encode_to_vec();
    let req = Request::post(format!(
        "http://localhost/runtime.{api}.RuntimeService/Version"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(crisp::cri::wire::frame(&msg)))
    .unwrap();
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("call: {e}"))?;
    let (parts, body) = resp.into_parts();
    if let Some(s) = parts.headers.get("grpc-status") {
        return Err(format!("grpc-status {s:?} (trailers-only)"));
    }
    let collected = body.collect().await.map_err(|e| format!("body: {e}"))?;
    let status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.to_str().unwrap_or("?").to_string());
    let data = collected.to_bytes();
    match status.as_deref() {
        Some("0") => {}
        other => return Err(format!("grpc-status {other:?}")),
    }
    VersionResponse::decode(data.get(5..).unwrap_or_default()).map_err(|e| format!("decode: {e}"))
}

/// Connects and calls Version on `path`.
pub async fn version(path: &Path) -> Result<VersionResponse, String> {
    let s = UnixStream::connect(path)
        .await
        .map_err(|e| format!("connect {}: {e}", path.display()))?;
    version_over(s, "v1").await
}

// ---- crisp processes ----------------------------------------------------------------------------

/// Kills (SIGKILL) and reaps on drop; `log` is crisp's stderr.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(
            unsafe { libc::kill(self.pid(), sig) },
            0,
            "kill({}, {sig})",
            self.pid()
        );
    }
    /// Waits for the exit (bounded: a pidfd polled with a timeout), returning the status.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        if let Some(st) = self.child.try_wait().unwrap() {
            return st;
        }
        // SAFETY: pidfd_open/poll/close on our own child's pid and a local pollfd.
        unsafe {
            let pidfd = libc::syscall(libc::SYS_pidfd_open, self.pid(), 0) as i32;
            assert!(
                pidfd >= 0,
                "pidfd_open: {}",
                std::io::Error::last_os_error()
            );
            let mut pfd = libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            };
            let n = libc::poll(&mut pfd, 1, within.as_millis() as i32);
            libc::close(pidfd);
            assert!(
                n > 0,
                "crisp (pid {}) did not exit within {within:?}; log:\n{}",
                self.pid(),
                self.log_text()
            );
        }
        self.child.wait().unwrap()
    }
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config file in `dir` that keeps crisp's state in `dir` (not the host's /var/lib/crisp) and
/// otherwise uses the defaults (so a host /etc/crisp/config.toml never leaks in).
pub fn test_config(dir: &Path) -> PathBuf {
    let cfg = dir.join("test-config.toml");
    if !cfg.exists() {
        std::fs::write(
            &cfg,
            format!(
                "state_dir = {:?}\n",
                dir.join("state").display().to_string()
            ),
        )
        .unwrap();
    }
    cfg
}

/// A crisp command with a clean environment for systemd variables, [`test_config`] and stderr
/// to `log`.
pub fn crisp_command(dir: &Path, args: &[&str], log: &Path) -> Command {
    let cfg = test_config(dir);
    let mut c = Command::new(CRISP);
    c.arg("--config").arg(&cfg).args(args);
    for k in [
        "NOTIFY_SOCKET",
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
    ] {
        c.env_remove(k);
    }
    c.env("RUST_LOG", "info");
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    c
}

/// [`crisp_command`] for a crisp listening on `sock` in front of the runtime at `upstream`.
pub fn crisp_between(dir: &Path, sock: &Path, upstream: &Path, log: &Path) -> Command {
    let (sock, upstream) = (sock.display().to_string(), upstream.display().to_string());
    crisp_command(dir, &["--listen", &sock, "--upstream", &upstream], log)
}

pub fn spawn(mut c: Command, log: &Path) -> Proc {
    let child = c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    Proc {
        child,
        log: log.to_path_buf(),
    }
}

/// Makes `cmd` (an exec of crisp) inherit `fd` as fd 3 with LISTEN_FDS=1 and LISTEN_PID set to
/// its own pid, the way systemd starts a socket-activated service: `sh` learns its pid ($$) and
/// execs crisp, which keeps it.
pub fn with_listen_fd(crisp_cmd: Command, fd: RawFd, log: &Path) -> Command {
    let mut c = Command::new("/bin/sh");
    c.arg("-c")
        .arg(r#"LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@""#);
    c.arg(crisp_cmd.get_program());
    c.args(crisp_cmd.get_args());
    for (k, v) in crisp_cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.env("LISTEN_FDS", "1").env("LISTEN_FDNAMES", "crisp");
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
    unsafe {
        c.pre_exec(move || {
            if fd == 3 {
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

// ---- fake NOTIFY_SOCKET -------------------------------------------------------------------------

/// A unix datagram socket standing in for systemd's notification socket.
pub struct Notify {
    pub sock: tokio::net::UnixDatagram,
    /// The NOTIFY_SOCKET value: a path, or `@name` for the abstract namespace.
    pub env: String,
}

impl Notify {
    pub fn at_path(path: &Path) -> Notify {
        let sock = tokio::net::UnixDatagram::bind(path).unwrap();
        Notify {
            sock,
            env: path.display().to_string(),
        }
    }
    pub fn abstract_named(name: &str) -> Notify {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let std = std::os::unix::net::UnixDatagram::bind_addr(&addr).unwrap();
        std.set_nonblocking(true).unwrap();
        Notify {
            sock: tokio::net::UnixDatagram::from_std(std).unwrap(),
            env: format!("@{name}"),
        }
    }
    /// Next datagram, as text.
    pub async fn recv(&self, within: Duration) -> String {
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(within, self.sock.recv(&mut buf))
            .await
            .expect("no sd_notify message in time")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
    /// Waits for a message containing the line `assignment` (e.g. "READY=1"); returns it.
    pub async fn wait_for(&self, assignment: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let m = self.recv(left).await;
            if m.lines().any(|l| l == assignment) {
                return m;
            }
        }
    }
}

// ---- host tools ---------------------------------------------------------------------------------

static APT: Mutex<()> = Mutex::new(());

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Makes sure `tool` is on PATH, installing Debian `package` if it is not (tests run as root on
/// Debian; hack/setup.sh installs the same packages up front).
pub fn ensure_tool(tool: &str, package: &str) {
    let _g = APT.lock().unwrap_or_else(|e| e.into_inner());
    if have(tool) {
        return;
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-qq"]).status();
        assert!(
            install(),
            "`{tool}` is missing and `apt-get install {package}` failed; run hack/setup.sh as root"
        );
    }
    assert!(
        have(tool),
        "`{tool}` still missing after installing {package}"
    );
}

// ---- node roots ---------------------------------------------------------------------------------

/// Everything observable about a tree: type, mode, owner, content, link target, and the
/// modification time of regular files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    File {
        mode: u32,
        uid: u32,
        gid: u32,
        mtime_ns: i128,
        content: Vec<u8>,
    },
    Link {
        target: PathBuf,
    },
    Other {
        kind: String,
    },
}

pub type Snapshot = BTreeMap<PathBuf, Node>;

pub fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = md.file_type();
            let node = if ft.is_symlink() {
                Node::Link {
                    target: std::fs::read_link(&p).unwrap(),
                }
            } else if ft.is_dir() {
                walk(root, &p, out);
                Node::Dir {
                    mode: md.mode(),
                    uid: md.uid(),
                    gid: md.gid(),
                }
            } else if ft.is_file() {
                Node::File {
                    mode: md.mode(),
                    uid: md.uid(),
                    gid: md.gid(),
                    mtime_ns: md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128,
                    content: std::fs::read(&p).unwrap(),
                }
            } else {
                Node::Other {
                    kind: if ft.is_socket() {
                        "socket".into()
                    } else {
                        format!("{ft:?}")
                    },
                }
            };
            out.insert(rel, node);
        }
    }
    let mut out = Snapshot::new();
    walk(root, root, &mut out);
    out
}

/// Panics with a readable list of differences.
pub fn assert_same_tree(before: &Snapshot, after: &Snapshot, what: &str) {
    let mut diffs = Vec::new();
    for (p, n) in before {
        match after.get(p) {
            None => diffs.push(format!("missing: {}", p.display())),
            Some(m) if m != n => {
                let show = |x: &Node| match x {
                    Node::File {
                        mode,
                        uid,
                        gid,
                        mtime_ns,
                        content,
                    } => {
                        format!(
                            "file mode {mode:o} {uid}:{gid} mtime {mtime_ns} content {:?}",
                            String::from_utf8_lossy(&content[..content.len().min(300)])
                        )
                    }
                    other => format!("{other:?}"),
                };
                diffs.push(format!(
                    "changed: {}\n  before: {}\n  after:  {}",
                    p.display(),
                    show(n),
                    show(m)
                ))
            }
            _ => {}
        }
    }
    for p in after.keys().filter(|p| !before.contains_key(*p)) {
        diffs.push(format!("added: {}", p.display()));
    }
    assert!(
        diffs.is_empty(),
        "{what}: the tree differs:\n{}",
        diffs.join("\n")
    );
}

/// Output of a script run.
#[derive(Debug)]
pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `hack/install.sh` into `root` with the crisp under test, for a kubelet 1.28 node.
pub fn install_into(root: &Path) -> Run {
    hack(
        "install.sh",
        &[
            "--root",
            &root.display().to_string(),
            "--binary",
            CRISP,
            "--kubelet-version",
            "1.28",
        ],
    )
}

/// What a process wrote, its stdout then its stderr.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `hack/<script>` with `args`.
pub fn hack(script: &str, args: &[&str]) -> Run {
    let out = Command::new("bash")
        .arg(Path::new(REPO).join("hack").join(script))
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap_or_else(|e| panic!("run hack/{script}: {e}"));
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// Writes `content` at node path `p` under `root` (parents created).
pub fn put(root: &Path, p: &str, content: &str) {
    let path = root.join(p.trim_start_matches('/'));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, content).unwrap();
}

pub fn read(root: &Path, p: &str) -> String {
    let path = root.join(p.trim_start_matches('/'));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Lines of a child's stderr, as they come (for tools that announce readiness on stderr).
pub fn stderr_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let err = child.stderr.take().expect("stderr must be piped");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
