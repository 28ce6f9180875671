//! Real grpc-go peers: `crisp-grpcgo` (`e2e/go/grpcgo/main.go`, built offline from Debian's
//! grpc-go 1.33 by `hack/build-grpcgo.sh`).
//!
//! kubelet, crictl and containerd speak gRPC through grpc-go; the Rust clients of this crate
//! (tonic, hyper, h2) differ on the wire (KUBELET-CRI §11): grpc-go sends the bare socket path
//! as `:authority`, a BDP PING on receiving DATA, indexes headers in HPACK's dynamic table, and
//! its server polices PINGs (GOAWAY `ENHANCE_YOUR_CALM`). A [`GoBridge`] is a grpc-go server on
//! one socket that forwards every call through a kubelet-style grpc-go client connection to
//! another — put in front of crisp, crisp sees kubelet's transport; put in front of a fake
//! runtime, crisp talks to a grpc-go server, like containerd.
//!
//! ```no_run
//! # fn demo(crisp_sock: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
//! use crisp_e2e::grpcgo::{GoBridge, GoBridgeOpts};
//! let bridge = GoBridge::start(&dir.join("kubelet.sock"), crisp_sock, GoBridgeOpts::default())?;
//! // a tonic client on bridge.socket() now reaches crisp through grpc-go
//! # Ok(()) }
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

/// How long a bridge may take to print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where `hack/build-grpcgo.sh` puts the binary.
pub fn default_binary_path() -> PathBuf {
    crate::harness::repo_root().join("target/grpcgo/crisp-grpcgo")
}

/// The `crisp-grpcgo` binary: `$CRISP_GRPCGO_BIN` if set, else built (or found up to date) by
/// `hack/build-grpcgo.sh`, at most once per process.
pub fn grpcgo_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CRISP_GRPCGO_BIN") {
        return Ok(PathBuf::from(p));
    }
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let script = crate::harness::hack_dir().join("build-grpcgo.sh");
            let out = Command::new("bash").arg(&script).stdin(Stdio::null()).output().map_err(|e| format!("running {}: {e}", script.display()))?;
            if !out.status.success() {
                return Err(format!("{} failed ({}):\n{}", script.display(), out.status, String::from_utf8_lossy(&out.stderr)));
            }
            let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if !path.is_file() {
                return Err(format!("{} printed {path:?}, which is not a file", script.display()));
            }
            Ok(path)
        })
        .clone()
        .map_err(|e| anyhow!("building crisp-grpcgo (needs golang-go and golang-google-grpc-dev; hack/setup.sh installs them): {e}"))
}

/// The binary if it is already built (`$CRISP_GRPCGO_BIN`, `target/grpcgo/` of this checkout,
/// or next to the running executable's profile directory); never builds.
pub fn prebuilt_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CRISP_GRPCGO_BIN") {
        return Some(PathBuf::from(p));
    }
    let mut cands = vec![default_binary_path()];
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/kubelet-emu → target/grpcgo/crisp-grpcgo
        for dir in exe.ancestors().skip(1).take(3) {
            cands.push(dir.join("grpcgo/crisp-grpcgo"));
        }
    }
    cands.into_iter().find(|p| p.is_file())
}

/// Options for [`GoBridge::start`].
#[derive(Debug, Clone, Default)]
pub struct GoBridgeOpts {
    /// `:authority` the client side sends instead of the target path, e.g. kubelet 1.29's
    /// percent-encoded path ([`percent_encoded_authority`]) or `localhost`.
    pub authority: Option<String>,
    /// The server side's keep-alive enforcement: `default` (grpc-go's, as containerd runs it:
    /// MinTime 5 min, no pings without streams) or `permissive`. `None` = default.
    pub server_keepalive_policy: Option<String>,
    /// Extra environment, e.g. `GRPC_GO_LOG_SEVERITY_LEVEL=info`.
    pub env: Vec<(String, String)>,
    /// Use this binary instead of [`grpcgo_binary`].
    pub binary: Option<PathBuf>,
    /// The kill matrix's trap ([`Trap`]).
    pub trap: Option<Trap>,
    /// How unary calls are forwarded: `invoke` (the default: as kubelet makes them) or `stream`
    /// (the old forwarder, which can wait for a call's whole deadline after its connection
    /// closed under it; RELIABILITY.md, the chaos hang).
    pub forward: Option<String>,
}

/// The kill matrix (`reliability_crisp_chaos`): the bridge SIGKILLs `pid` at `point` of its
/// first runtime connection to the target, then makes a call on each of its two client
/// connections `after` later, as it forwards kubelet's calls; events come as JSON lines
/// ([`GoBridge::next_event`]). Points: `connect`, `accepted`, `settings`, `request`, `response`,
/// `queued` (e2e/go/grpcgo/main.go says what each is).
#[derive(Debug, Clone)]
pub struct Trap {
    pub point: String,
    pub pid: u32,
    pub after: Duration,
    /// Deadline of the trap's calls.
    pub timeout: Duration,
}

/// `/run/x.sock` → `%2Frun%2Fx.sock`: what a kubelet 1.29 sends as `:authority` (KUBELET-CRI §11).
pub fn percent_encoded_authority(path: &Path) -> String {
    path.display()
        .to_string()
        .replace('%', "%25")
        .replace('/', "%2F")
}

/// HTTP/2 frame counters of one side of a bridge (or of a `call` run).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct WireStats {
    pub conns: u64,
    pub headers_sent: u64,
    pub headers_recv: u64,
    pub data_sent: u64,
    pub data_recv: u64,
    pub pings_sent: u64,
    pub bdp_pings_sent: u64,
    pub pings_recv: u64,
    pub bdp_pings_recv: u64,
    pub ping_acks_sent: u64,
    pub ping_acks_recv: u64,
    pub rst_sent: u64,
    pub rst_recv: u64,
    pub goaway_sent: u64,
    pub goaway_recv: u64,
    /// One line per GOAWAY seen (first 20).
    pub goaways: Vec<String>,
}

/// A bridge's counters: `upstream` = its grpc-go client connection(s) to the target,
/// `downstream` = its grpc-go server's connections from callers.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct BridgeStats {
    pub upstream: WireStats,
    pub downstream: WireStats,
}

/// A running `crisp-grpcgo bridge`: a grpc-go server on [`GoBridge::socket`] forwarding every
/// call through one kubelet-style grpc-go client connection to the target. Killed on drop; its
/// stderr (GOAWAYs, grpc-go warnings) is kept in a file and printed if the thread panics.
pub struct GoBridge {
    socket: PathBuf,
    target: PathBuf,
    child: Child,
    log: PathBuf,
    _logdir: tempfile::TempDir,
    lines: Mutex<mpsc::Receiver<String>>,
}

impl std::fmt::Debug for GoBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoBridge")
            .field("socket", &self.socket)
            .field("target", &self.target)
            .field("pid", &self.child.id())
            .finish()
    }
}

impl GoBridge {
    /// Starts a bridge listening on `listen` (a stale file there is replaced) and forwarding to
    /// `target`; returns once it printed `ready` (it listens by then). Blocking, ~10 ms.
    pub fn start(listen: &Path, target: &Path, opts: GoBridgeOpts) -> Result<GoBridge> {
        let bin = match &opts.binary {
            Some(b) => b.clone(),
            None => grpcgo_binary()?,
        };
        let logdir = tempfile::Builder::new().prefix("crisp-grpcgo-").tempdir()?;
        let log = logdir.path().join("bridge.log");
        let logf = File::create(&log)?;
        let mut cmd = Command::new(&bin);
        cmd.arg("bridge")
            .arg("--listen")
            .arg(listen)
            .arg("--target")
            .arg(target);
        if let Some(a) = &opts.authority {
            cmd.arg("--authority").arg(a);
        }
        if let Some(p) = &opts.server_keepalive_policy {
            cmd.arg("--server-keepalive-policy").arg(p);
        }
        if let Some(f) = &opts.forward {
            cmd.arg("--forward").arg(f);
        }
        if let Some(t) = &opts.trap {
            cmd.arg("--trap")
                .arg(&t.point)
                .arg("--trap-pid")
                .arg(t.pid.to_string())
                .arg("--trap-after")
                .arg(format!("{}us", t.after.as_micros()))
                .arg("--trap-timeout")
                .arg(format!("{}ms", t.timeout.as_millis()));
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(logf);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("bridge stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("grpcgo-bridge-stdout".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .context("spawning the bridge's stdout reader")?;
        let bridge = GoBridge {
            socket: listen.to_path_buf(),
            target: target.to_path_buf(),
            child,
            log,
            _logdir: logdir,
            lines: Mutex::new(rx),
        };
        let first = bridge.lines.lock().unwrap().recv_timeout(READY_TIMEOUT);
        match first {
            Ok(l) if l.trim() == "ready" => Ok(bridge),
            Ok(l) => bail!(
                "crisp-grpcgo bridge printed {l:?} instead of `ready`; its log:\n{}",
                bridge.log_text()
            ),
            Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                "crisp-grpcgo bridge not ready within {READY_TIMEOUT:?}; its log:\n{}",
                bridge.log_text()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!(
                "crisp-grpcgo bridge exited during start; its log:\n{}",
                bridge.log_text()
            ),
        }
    }

    /// The socket callers connect to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// What it forwards to.
    pub fn target(&self) -> &Path {
        &self.target
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far: one line per GOAWAY it saw, grpc-go warnings.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Lines of its log that report a GOAWAY.
    pub fn goaway_lines(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains("GOAWAY"))
            .map(str::to_string)
            .collect()
    }

    /// The HTTP/2 frame counters so far (asks the bridge with SIGUSR1; it answers on stdout).
    pub fn stats(&self) -> Result<BridgeStats> {
        let rx = self.lines.lock().unwrap();
        while rx.try_recv().is_ok() {}
        let st = Command::new("kill")
            .args(["-USR1", &self.child.id().to_string()])
            .status()?;
        if !st.success() {
            bail!("kill -USR1 {} failed: {st}", self.child.id());
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .map_err(|e| anyhow!("no stats from the bridge: {e}"))?;
            #[derive(Deserialize)]
            struct Line {
                stats: BridgeStats,
            }
            if let Ok(l) = serde_json::from_str::<Line>(&line) {
                return Ok(l.stats);
            }
        }
    }

    /// The next JSON line the bridge prints on stdout (the trap's events), within `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<serde_json::Value> {
        let rx = self.lines.lock().unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).ok()?;
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if v.get("trap").is_some() {
                    return Some(v);
                }
            }
        }
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for GoBridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
        if std::thread::panicking() {
            eprintln!(
                "---- crisp-grpcgo bridge {} → {} ----\n{}",
                self.socket.display(),
                self.target.display(),
                self.log_text()
            );
        }
    }
}

/// Options for [`call`].
#[derive(Debug, Clone)]
pub struct CallOpts {
    pub authority: Option<String>,
    pub timeout: Duration,
    pub count: usize,
    pub concurrency: usize,
    /// Each worker starts one call per interval (a ticker; a late call starts at once).
    pub interval: Option<Duration>,
    /// Keep calling until this has passed, instead of `count` calls.
    pub duration: Option<Duration>,
    /// Calls made first, one at a time, and not measured (a failed one fails the run).
    pub warmup: usize,
    /// Every measured call's latency in [`CallSummary::latencies_us`].
    pub latencies: bool,
    /// A [`CallResult`] line for every failed call (with `count > 1`).
    pub errors: bool,
    /// One server-streaming call (kubelet's GetContainerEvents, 1.36's `Stream*` calls): every
    /// response message in [`CallResult::responses_hex`]. `count` must be 1.
    pub stream: bool,
    /// Request metadata sent with every call (e.g. kubelet's `traceparent`).
    pub metadata: Vec<(String, String)>,
}

impl Default for CallOpts {
    fn default() -> Self {
        CallOpts {
            authority: None,
            timeout: Duration::from_secs(10),
            count: 1,
            concurrency: 1,
            interval: None,
            duration: None,
            warmup: 0,
            latencies: false,
            errors: false,
            stream: false,
            metadata: Vec::new(),
        }
    }
}

/// The summary line of `crisp-grpcgo call`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct CallSummary {
    pub ok: u64,
    pub failed: u64,
    pub codes: std::collections::BTreeMap<String, u64>,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub elapsed_ms: f64,
    pub first_error: Option<String>,
    pub wire: WireStats,
    /// Every measured call's latency, µs, in completion order (with [`CallOpts::latencies`]).
    pub latencies_us: Vec<f64>,
}

/// One line per call of `crisp-grpcgo call` (with `count == 1`; with [`CallOpts::errors`], per
/// failed call).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct CallResult {
    /// When the call was sent (RFC 3339, UTC).
    pub at: String,
    pub code: String,
    pub message: String,
    pub response_hex: String,
    pub ms: f64,
    /// The response's header and trailer metadata, as grpc-go hands them to the caller.
    pub header: std::collections::BTreeMap<String, Vec<String>>,
    pub trailer: std::collections::BTreeMap<String, Vec<String>>,
    /// [`CallOpts::stream`]: every response message, in order.
    pub responses_hex: Vec<String>,
}

/// Output of [`call`]: per-call results (only when `count == 1`) and the summary.
#[derive(Debug, Clone, Default)]
pub struct CallOutput {
    pub calls: Vec<CallResult>,
    pub summary: CallSummary,
    pub stderr: String,
}

/// Runs `crisp-grpcgo call`: `count` unary calls of `method` with message `req` to `target`
/// from a kubelet-style grpc-go client. Failed calls are reported in the summary, not as `Err`.
pub async fn call(target: &Path, method: &str, req: &[u8], opts: CallOpts) -> Result<CallOutput> {
    let bin = grpcgo_binary()?;
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.arg("call")
        .arg("--target")
        .arg(target)
        .arg("--method")
        .arg(method)
        .arg("--hex")
        .arg(hex(req));
    cmd.arg("--timeout")
        .arg(format!("{}ms", opts.timeout.as_millis()));
    cmd.arg("--count")
        .arg(opts.count.to_string())
        .arg("--concurrency")
        .arg(opts.concurrency.to_string());
    if let Some(a) = &opts.authority {
        cmd.arg("--authority").arg(a);
    }
    if let Some(i) = opts.interval {
        cmd.arg("--interval").arg(format!("{}us", i.as_micros()));
    }
    if let Some(d) = opts.duration {
        cmd.arg("--duration").arg(format!("{}ms", d.as_millis()));
    }
    if opts.warmup > 0 {
        cmd.arg("--warmup").arg(opts.warmup.to_string());
    }
    if opts.latencies {
        cmd.arg("--latencies");
    }
    if opts.errors {
        cmd.arg("--errors");
    }
    if opts.stream {
        cmd.arg("--stream");
    }
    for (k, v) in &opts.metadata {
        cmd.arg("--md").arg(format!("{k}={v}"));
    }
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = cmd
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut res = CallOutput {
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        ..Default::default()
    };
    let mut got_summary = false;
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("crisp-grpcgo call printed {line:?}"))?;
        if v.get("summary").is_some() {
            res.summary = serde_json::from_value(v)?;
            got_summary = true;
        } else {
            res.calls.push(serde_json::from_value(v)?);
        }
    }
    if !got_summary {
        bail!(
            "crisp-grpcgo call exited {} without a summary; stderr:\n{}",
            out.status,
            res.stderr
        );
    }
    Ok(res)
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of lower-case or upper-case hex.
pub fn unhex(s: &str) -> Result<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        bail!("odd-length hex");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| anyhow!("hex: {e}")))
        .collect()
}

/// Whether end-to-end stacks should put kubelet's grpc-go transport between the emulator and
/// crisp: yes unless `CRISP_E2E_VIA_GRPCGO=0` (for A/B runs with the Rust client only).
pub fn via_grpcgo_default() -> bool {
    !matches!(
        std::env::var("CRISP_E2E_VIA_GRPCGO").as_deref(),
        Ok("0") | Ok("false") | Ok("no")
    )
}

/// Puts a bridge in front of `cfg.endpoint` (and a second one in front of a different
/// `cfg.image_endpoint`), listening in `dir`, and points the config at them: the emulator then
/// reaches its runtime through kubelet's own gRPC transport. Keep the returned bridges alive
/// as long as the kubelet.
pub fn bridge_kubelet(
    cfg: &mut crate::emulator::KubeletConfig,
    dir: &Path,
    opts: GoBridgeOpts,
) -> Result<Vec<GoBridge>> {
    let mut bridges = Vec::new();
    let runtime = GoBridge::start(
        &dir.join("kubelet-grpcgo.sock"),
        &cfg.endpoint,
        opts.clone(),
    )
    .context("starting the grpc-go bridge for the kubelet")?;
    let same_image = cfg
        .image_endpoint
        .as_ref()
        .is_none_or(|i| *i == cfg.endpoint);
    cfg.endpoint = runtime.socket().to_path_buf();
    if !same_image {
        let target = cfg.image_endpoint.clone().expect("image endpoint");
        let image = GoBridge::start(&dir.join("kubelet-grpcgo-image.sock"), &target, opts)
            .context("starting the grpc-go bridge for the kubelet's image service")?;
        cfg.image_endpoint = Some(image.socket().to_path_buf());
        bridges.push(runtime);
        bridges.push(image);
    } else {
        cfg.image_endpoint = None;
        bridges.push(runtime);
    }
    Ok(bridges)
}
