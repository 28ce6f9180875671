//! Issue #8, crisp faults: crisp SIGKILLed and restarted at random points of a wave (a seeded
//! RNG picks the points; the seed is printed, `CRISP_SEED` replays it) — once while it holds a
//! call, then at random times during the start and during the stop.
//!
//! - as a plain process binding its own socket (kubelet's calls fail while it is down, kubelet
//!   retries), and
//! - socket-activated: the test holds the listening socket as systemd does for crisp.socket, so
//!   calls queue in the backlog while crisp restarts.
//!
//! Either way: the ordering holds for every pod (containerd's timestamps), exactly one running
//! instance per container per pod (no duplicate from a call forwarded twice or late), nothing
//! stays held, no call outlived kubelet's deadline, and the last crisp tracks nothing once the
//! pods are removed.
//!
//! The kill matrix (issue #37, below) kills crisp instead at exact protocol points of kubelet's
//! grpc-go connection and asks whether a call made then is answered before its deadline; its
//! held cells (issue #43) kill it while it holds an app's create and a sidecar's stop, and ask
//! containerd whether the order was kept anyway.
//! Nothing here runs one at a time: all of it runs side by side.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::reliability_support::*;
use anyhow::{bail, ensure, Context, Result};
use crisp_e2e::emulator::{Kubelet, KubeletConfig};
use crisp_e2e::harness::{Containerd, ContainerdOpts};
use crisp_e2e::stack::{secs, Stack};

const UP: Duration = Duration::from_secs(120);
/// crisp's start timeout here: also how long it refuses an app whose sidecar's start a kill
/// aborted (containerd sees the StartContainer cancelled; kubelet never retries it under
/// restartPolicy Never) before letting it through.
const START_TIMEOUT: Duration = Duration::from_secs(5);
const CRISP_CONFIG: &str = "[ordering]\nstart_timeout = \"5s\"\n";

/// A crisp process the test can SIGKILL and start again.
trait Restartable: Send {
    fn restart(&mut self) -> Result<()>;
    fn log_text(&self) -> String;
}

impl Restartable for crisp_e2e::crisp::Crisp {
    fn restart(&mut self) -> Result<()> {
        crisp_e2e::crisp::Crisp::restart(self)
    }
    fn log_text(&self) -> String {
        crisp_e2e::crisp::Crisp::log_text(self)
    }
}

struct Chaos<'a> {
    containerd: &'a Path,
    kubelet: &'a Kubelet,
    admin: PathBuf,
    state_dir: PathBuf,
    crisp: &'a mut dyn Restartable,
    /// When each restarted crisp came up (wall clock, ns).
    crisp_started: Vec<i64>,
}

impl<'a> Chaos<'a> {
    /// A chaos run on `crisp`, whose admin socket and state directory are in `crisp_dir`.
    fn new(
        containerd: &'a Path,
        kubelet: &'a Kubelet,
        crisp_dir: &Path,
        crisp: &'a mut dyn Restartable,
    ) -> Chaos<'a> {
        Chaos {
            containerd,
            kubelet,
            admin: crisp_dir.join("admin.sock"),
            state_dir: crisp_dir.join("state"),
            crisp,
            crisp_started: Vec::new(),
        }
    }

    /// [`Chaos::run`]; when it fails, crisp's call counters and the grpc-go client's side: its
    /// connections' states and warnings, with their times (RELIABILITY.md: the open hang after
    /// a kill).
    async fn run_reporting(
        &mut self,
        rng: &mut Rng,
        bridges: &[crisp_e2e::grpcgo::GoBridge],
    ) -> Result<()> {
        let r = self.run(rng).await;
        if r.is_err() {
            eprintln!(
                "--- crisp's call counters ---\n{}",
                call_counters(&self.admin).await
            );
            for b in bridges {
                eprintln!("--- grpc-go bridge log ---\n{}", b.log_text());
            }
        }
        r
    }

    fn kill(&mut self, when: &str, kills: &mut Vec<String>) -> Result<()> {
        tokio::task::block_in_place(|| self.crisp.restart())
            .with_context(|| format!("restarting crisp ({when})"))?;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        self.crisp_started.push(now.as_nanos() as i64);
        kills.push(when.to_string());
        eprintln!("crisp SIGKILLed and restarted: {when}");
        Ok(())
    }

    /// The kubelet's calls and crisp's log lines of each pod named in a violation.
    /// No violation in `phase` (start, stop); else what crisp logged of the pods they name,
    /// and an error listing them with the kills of the cell.
    fn ensure_none(
        &self,
        pods: &[(String, Planned)],
        violations: &[String],
        phase: &str,
        kills: &[String],
    ) -> Result<()> {
        if !violations.is_empty() {
            self.dump_violating(pods, violations);
        }
        ensure!(
            violations.is_empty(),
            "{phase} with crisp kills {kills:?}:\n{}",
            violations.join("\n")
        );
        Ok(())
    }

    fn dump_violating(&self, pods: &[(String, Planned)], violations: &[String]) {
        let log = self.crisp.log_text();
        for (uid, p) in pods {
            let name = &p.spec.name;
            if violations
                .iter()
                .any(|v| v.starts_with(&format!("{name}:")) || v.contains(&format!(" {name} ")))
            {
                eprintln!("=== {name} ({uid}): kubelet's calls ===");
                dump_pod(self.kubelet, uid);
                eprintln!("=== {name}: crisp's log ===");
                for l in log.lines().filter(|l| {
                    l.contains(&format!("/{name}"))
                        || l.contains("SIGKILL")
                        || l.starts_with("--- crisp #")
                        || l.contains("crisp listening")
                }) {
                    eprintln!("{l}");
                }
            }
        }
    }

    async fn run(&mut self, rng: &mut Rng) -> Result<()> {
        let mut pods = Vec::new();
        for i in 0..env_usize("CRISP_CHAOS_PODS", 8) {
            let p = plan(i, rng, false, "not-checked-here");
            pods.push((self.kubelet.add_pod(p.spec.clone())?, p));
        }
        let mut kills = Vec::new();
        let t0 = Instant::now();
        // While a CreateContainer is held (crisp polls its probes).
        let deadline = Instant::now() + UP;
        while gauge(&self.admin, "crisp_holds_in_flight")
            .await
            .unwrap_or(0.0)
            < 1.0
        {
            ensure!(Instant::now() < deadline, "crisp never held a call");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill(
            &format!("holding, start +{:.2}s", t0.elapsed().as_secs_f64()),
            &mut kills,
        )?;
        // Random points of the start (the sleeps *are* the random kill points).
        for _ in 0..2 {
            tokio::time::sleep(rng.millis(100, 1500)).await;
            self.kill(
                &format!("start +{:.2}s", t0.elapsed().as_secs_f64()),
                &mut kills,
            )?;
        }
        let failed = match wait_settled(self.kubelet, &pods, UP).await {
            Ok(f) => f,
            Err(e) => {
                for (uid, _) in &pods {
                    dump_pod(self.kubelet, uid);
                }
                eprintln!("--- crisp log ---\n{}", self.crisp.log_text());
                return Err(e);
            }
        };
        let mut violations = Vec::new();
        // A Job may fail only because a kill aborted a container's start (its exit code 128 is
        // the pod's, as it would be without crisp; kubelet never retries it under Never).
        for uid in &failed {
            let all = instances(self.containerd, uid).await?;
            let p = &pods.iter().find(|(u, _)| u == uid).expect("planned").1;
            if !p
                .sidecars
                .iter()
                .map(|(n, _)| n)
                .chain([&p.app])
                .any(|n| start_aborted(&all, n).is_some())
            {
                violations.push(format!(
                    "Job {} Failed without an aborted container start",
                    p.spec.name
                ));
            }
        }
        for (uid, p) in &pods {
            violations.extend(
                start_violations(
                    self.containerd,
                    uid,
                    p,
                    Allow {
                        aborted: Some(AbortedOk {
                            timeout: START_TIMEOUT,
                            kubelet: self.kubelet,
                            crisp_started: &self.crisp_started,
                        }),
                        ..Default::default()
                    },
                )
                .await?,
            );
            violations.extend(duplicate_running(self.containerd, uid, p).await?);
        }
        self.ensure_none(&pods, &violations, "start", &kills)?;

        let t1 = Instant::now();
        for (uid, _) in &pods {
            self.kubelet.delete_pod(uid, Some(10))?;
        }
        for _ in 0..2 {
            tokio::time::sleep(rng.millis(50, 900)).await;
            self.kill(
                &format!("stop +{:.2}s", t1.elapsed().as_secs_f64()),
                &mut kills,
            )?;
        }
        if let Err(e) = wait_terminated(self.kubelet, &pods, UP).await {
            for (uid, _) in &pods {
                dump_pod(self.kubelet, uid);
            }
            eprintln!("--- crisp log ---\n{}", self.crisp.log_text());
            return Err(e);
        }
        for (uid, p) in &pods {
            violations.extend(stop_violations(self.containerd, uid, p, true).await?);
        }
        self.ensure_none(&pods, &violations, "stop", &kills)?;

        let uids: Vec<String> = pods.iter().map(|(u, _)| u.clone()).collect();
        remove_pods(self.containerd, self.kubelet, &uids).await?;
        wait_no_holds(&self.admin, Duration::from_secs(10)).await?;
        let text = metrics(&self.admin).await?;
        ensure!(
            sample(&text, "crisp_tracked_pods") == Some(0.0)
                && sample(&text, "crisp_tracked_containers") == Some(0.0),
            "crisp still tracks pods/containers"
        );
        ensure!(
            terminated_marks(&self.state_dir) == 0,
            "job-mode marks left behind"
        );
        let j = self.kubelet.journal();
        if !deadline_violations(j).is_empty() {
            eprintln!("--- crisp log ---\n{}", self.crisp.log_text());
        }
        ensure_calls_ended(j)?;
        let unavailable = count(j, |r| {
            r.done.is_some() && r.code == tonic::Code::Unavailable
        });
        eprintln!(
            "chaos: {} pods, {} crisp kills {kills:?}, {unavailable} kubelet calls failed UNAVAILABLE, {} Job(s) Failed by an aborted container start, 0 violations",
            pods.len(),
            kills.len(),
            failed.len()
        );
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crisp_sigkilled_at_random_points_of_a_wave() -> Result<()> {
    let mut rng = Rng::from_env("chaos");
    let mut st = Stack::start(false, CRISP_CONFIG, |_| {}).await?;
    let Stack {
        kubelet,
        crisp,
        containerd,
        bridges,
        ..
    } = &mut st;
    let crisp_dir = crisp.dir().to_path_buf();
    Chaos::new(containerd.socket(), kubelet, &crisp_dir, crisp)
        .run_reporting(&mut rng, bridges)
        .await
}

/// crisp started the way systemd starts a socket-activated service: fd 3 is the listening
/// socket the test holds (crisp.socket), LISTEN_FDS=1, LISTEN_PID = crisp's pid.
struct Activated {
    dir: tempfile::TempDir,
    listener: std::os::unix::net::UnixListener,
    config: PathBuf,
    child: Option<Child>,
    spawned: usize,
}

impl Activated {
    fn start(upstream: &Path) -> Result<Activated> {
        let dir = tempfile::Builder::new().prefix("crisp-sa-").tempdir()?;
        let sock = dir.path().join("crisp.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock)?;
        let config = dir.path().join("config.toml");
        std::fs::write(
            &config,
            format!("listen = {:?}\nupstream = {:?}\nstate_dir = {:?}\n[log]\nlevel = {CHAOS_LOG:?}\n{CRISP_CONFIG}", sock, upstream, dir.path().join("state")),
        )?;
        let mut a = Activated {
            dir,
            listener,
            config,
            child: None,
            spawned: 0,
        };
        a.spawn()?;
        Ok(a)
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("crisp.sock")
    }

    fn log_path(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("crisp-{n}.log"))
    }

    fn spawn(&mut self) -> Result<()> {
        let bin = crisp_e2e::crisp::crisp_binary()?;
        let n = self.spawned;
        self.spawned += 1;
        let log = std::fs::File::create(self.log_path(n))?;
        let fd = self.listener.as_raw_fd();
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg(r#"LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@""#)
            .arg(&bin)
            .arg("--config")
            .arg(&self.config);
        c.env("LISTEN_FDS", "1")
            .env("LISTEN_FDNAMES", "crisp")
            .env_remove("RUST_LOG")
            .env_remove("NOTIFY_SOCKET");
        c.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
        unsafe {
            c.pre_exec(move || {
                if fd == 3 {
                    let flags = libc_fcntl(3, F_GETFD, 0);
                    if flags < 0 || libc_fcntl(3, F_SETFD, flags & !FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if libc_dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.child = Some(c.spawn().context("spawning crisp")?);
        // Ready once this instance says it serves (its socket is the test's and always
        // accepts, so a connect would prove nothing).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(self.log_path(n)).unwrap_or_default();
            if text.contains("serving on the socket inherited from systemd")
                && text.contains("admin socket listening")
            {
                return Ok(());
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("crisp exited with {st}:\n{text}");
            }
            if Instant::now() > deadline {
                bail!("socket-activated crisp not serving within 10 s:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Restartable for Activated {
    fn restart(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill()?;
            c.wait()?;
        }
        self.spawn()
    }

    fn log_text(&self) -> String {
        (0..self.spawned)
            .map(|n| {
                format!(
                    "--- crisp #{n} ---\n{}",
                    std::fs::read_to_string(self.log_path(n)).unwrap_or_default()
                )
            })
            .collect()
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// libc without the crate (e2e does not depend on it).
const F_GETFD: i32 = 1;
const F_SETFD: i32 = 2;
const FD_CLOEXEC: i32 = 1;
extern "C" {
    #[link_name = "fcntl"]
    fn libc_fcntl(fd: i32, cmd: i32, arg: i32) -> i32;
    #[link_name = "dup2"]
    fn libc_dup2(old: i32, new: i32) -> i32;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_activated_crisp_sigkilled_at_random_points_of_a_wave() -> Result<()> {
    let mut rng = Rng::from_env("chaos (socket activation)");
    crisp_e2e::harness::require_root();
    let containerd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let mut crisp = Activated::start(containerd.socket())?;
    let dir = tempfile::Builder::new().prefix("crisp-stack-").tempdir()?;
    let mut cfg = KubeletConfig::fast(crisp.socket(), dir.path().join("pods"));
    cfg.root_dir = Some(dir.path().join("kubelet"));
    cfg.container_deletor = false;
    // kubelet's grpc-go transport, as in `Stack::start`.
    let bridges = if crisp_e2e::grpcgo::via_grpcgo_default() {
        crisp_e2e::grpcgo::bridge_kubelet(&mut cfg, dir.path(), Default::default())?
    } else {
        Vec::new()
    };
    let kubelet = Kubelet::new(cfg).await?;
    let crisp_dir = crisp.dir.path().to_path_buf();
    let r = Chaos::new(containerd.socket(), &kubelet, &crisp_dir, &mut crisp)
        .run_reporting(&mut rng, &bridges)
        .await;
    kubelet.shutdown().await;
    r
}

// ---------------------------------------------------------------------------------------------
// The kill matrix (issue #37): crisp SIGKILLed at a protocol point of kubelet's client
// connection, then a call from that client a set time later. The grpc-go bridge is the client
// (kubelet's grpc-go 1.33 transport, dialled as kubelet dials) and does the killing itself, from
// inside its connection's reads and writes (`--trap`, e2e/go/grpcgo/main.go), so the point is
// exact and needs no hook in crisp; the test restarts crisp the moment the bridge reports the
// kill (readiness: the socket accepts, or the socket-activated instance says it serves).
//
// Each cell: a fresh bridge against the running crisp; the kill at the point; `after` later a
// ListPodSandbox (the bridge's runtime connection) and an ImageFsInfo (its image connection),
// sent through the bridge's own server as the emulator's calls are, so they take the bridge's
// real forwarding path; deadline 30 s. The `queued` point has no "later": its call is queued
// on the connection before the kill (the chaos hang's moment, RELIABILITY.md). The calls made
// at the kill must each be answered — OK or UNAVAILABLE — within MATRIX_BOUND (at most half its
// deadline); an UNAVAILABLE alone does not pass the cell: once crisp is ready again, the same
// bridge's calls (retried as kubelet retries, every 100 ms) must get an OK within MATRIX_BOUND,
// on both its connections. The "later" calls go 0–50 ms after the kill (grpc-go fails fast
// either way then) and also 500 ms and 2 s after it, when crisp is back or coming back.
// `CRISP_MATRIX_PASSES` repeats the whole matrix; `CRISP_MATRIX_POINTS` /
// `CRISP_MATRIX_AFTER_MS` (comma-separated) narrow it; `CRISP_MATRIX_FORWARD=stream` runs it
// with the bridge's old forwarder; `CRISP_MATRIX_OUT` appends one JSON line per cell to a file.

/// crisp's log filter in the chaos tests: `crisp=debug` covers every `crisp::*` target, the
/// per-call record `crisp::calls` included (the wave test's `Stack` crisp has the same default).
const CHAOS_LOG: &str = "info,crisp=debug";
const POINTS: [&str; 6] = [
    "connect", "accepted", "settings", "request", "response", "queued",
];
const AFTER_MS: [u64; 6] = [0, 1, 10, 50, 500, 2000];
/// The trap's calls' deadline, as in the failures seen (the emulator's 30 s).
const MATRIX_DEADLINE: Duration = Duration::from_secs(30);
/// "Well before the deadline": grpc-go's first reconnect backoff is 1 s (+/- 20 %), and crisp
/// restarts in well under a second.
const MATRIX_BOUND: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, serde::Serialize)]
struct Cell {
    mode: &'static str,
    forward: String,
    point: String,
    after_ms: u64,
    killed: bool,
    restart_ms: f64,
    /// conn → (code, ms, sent_after_kill_ms)
    calls: Vec<(String, String, f64, f64)>,
    /// Once crisp was ready again: ms until the bridge's runtime and image calls got an OK
    /// (None: not within MATRIX_BOUND).
    recovered_ms: Option<f64>,
    hang: bool,
    /// The held cells: each way the ordering promise was broken (containerd's timestamps).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    broken: Vec<String>,
    /// The cell's whole run, setup and checks included.
    cell_ms: f64,
}

impl Cell {
    /// A cell of the matrix before it runs: nothing killed, called or measured yet.
    fn new(mode: &'static str, forward: &str, point: &str, after_ms: u64) -> Cell {
        Cell {
            mode,
            forward: forward.to_string(),
            point: point.to_string(),
            after_ms,
            killed: false,
            restart_ms: 0.0,
            calls: Vec::new(),
            recovered_ms: None,
            hang: false,
            broken: Vec::new(),
            cell_ms: 0.0,
        }
    }
}

fn env_list<T: std::str::FromStr + Clone>(name: &str, default: &[T]) -> Vec<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            v.split(',').filter_map(|x| x.trim().parse().ok()).collect()
        }
        _ => default.to_vec(),
    }
}

/// The running crisp's call counters (`crisp_cri_calls_total`, `code="None"` included: calls
/// whose client went first) and calls in flight, for a failure's report.
async fn call_counters(admin: &Path) -> String {
    match metrics(admin).await {
        Ok(t) => t
            .lines()
            .filter(|l| {
                l.starts_with("crisp_cri_calls_total") || l.starts_with("crisp_cri_calls_in_flight")
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("(no metrics: {e:#})"),
    }
}

trait Matrixable: Restartable {
    fn pid(&self) -> Option<u32>;
    fn socket_path(&self) -> PathBuf;
    fn admin(&self) -> PathBuf;
    /// The current instance's log.
    fn last_log(&self) -> String;
}

impl Matrixable for crisp_e2e::crisp::Crisp {
    fn pid(&self) -> Option<u32> {
        crisp_e2e::crisp::Crisp::pid(self)
    }
    fn socket_path(&self) -> PathBuf {
        self.socket().to_path_buf()
    }
    fn admin(&self) -> PathBuf {
        self.dir().join("admin.sock")
    }
    fn last_log(&self) -> String {
        let t = self.log_text();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(150)..].join("\n")
    }
}

impl Matrixable for Activated {
    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
    fn socket_path(&self) -> PathBuf {
        self.socket()
    }
    fn admin(&self) -> PathBuf {
        self.dir.path().join("admin.sock")
    }
    fn last_log(&self) -> String {
        let n = self.spawned.saturating_sub(2);
        (n..self.spawned)
            .map(|n| {
                format!(
                    "--- crisp #{n} ---\n{}",
                    std::fs::read_to_string(self.log_path(n)).unwrap_or_default()
                )
            })
            .collect()
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_cell(
    mode: &'static str,
    crisp: &mut dyn Matrixable,
    dir: &Path,
    n: usize,
    point: &str,
    after_ms: u64,
    forward: &str,
    deadline: Duration,
) -> Result<Cell> {
    let pid = crisp.pid().context("crisp not running")?;
    let bridge = crisp_e2e::grpcgo::GoBridge::start(
        &dir.join(format!("bridge-{n}.sock")),
        &crisp.socket_path(),
        crisp_e2e::grpcgo::GoBridgeOpts {
            trap: Some(crisp_e2e::grpcgo::Trap {
                point: point.to_string(),
                pid,
                after: Duration::from_millis(after_ms),
                timeout: deadline,
            }),
            forward: Some(forward.to_string()),
            ..Default::default()
        },
    )?;
    let began = Instant::now();
    let mut cell = Cell::new(mode, forward, point, after_ms);
    // request, response: a trigger call, then the runtime and image calls; queued: the trigger
    // and the queued runtime call; the others: the runtime and image calls.
    let want = if matches!(point, "request" | "response") {
        3
    } else {
        2
    };
    let wait_until = Instant::now() + deadline + Duration::from_secs(15);
    // The kill is reported by the goroutine that made it, which a loaded machine can preempt
    // before it prints: the calls it failed may be reported first.
    while cell.calls.len() < want || !cell.killed {
        let left = wait_until.saturating_duration_since(Instant::now());
        let ev = tokio::task::block_in_place(|| bridge.next_event(left));
        let Some(ev) = ev else {
            cell.hang = true;
            break;
        };
        match ev["trap"].as_str() {
            Some("killed") => {
                ensure!(ev.get("error").is_none(), "the trap's kill failed: {ev}");
                cell.killed = true;
                let t = Instant::now();
                tokio::task::block_in_place(|| crisp.restart()).context("restarting crisp")?;
                cell.restart_ms = t.elapsed().as_secs_f64() * 1000.0;
            }
            Some("error") => bail!("kill matrix {point}: the trap failed: {ev}"),
            Some("call") => {
                let code = ev["code"].as_str().unwrap_or("?").to_string();
                let ms = ev["ms"].as_f64().unwrap_or(f64::NAN);
                if !matches!(code.as_str(), "OK" | "Unavailable")
                    || ms > MATRIX_BOUND.min(deadline / 2).as_secs_f64() * 1000.0
                {
                    cell.hang = true;
                }
                cell.calls.push((
                    ev["conn"].as_str().unwrap_or("?").to_string(),
                    code,
                    ms,
                    ev["sent_after_kill_ms"].as_f64().unwrap_or(f64::NAN),
                ));
            }
            _ => {}
        }
    }
    if !cell.killed {
        cell.hang = true;
    } else {
        // crisp is ready again (restart() waits for it): kubelet's next calls must succeed.
        cell.recovered_ms = ok_again(bridge.socket(), MATRIX_BOUND).await;
        if cell.recovered_ms.is_none() {
            cell.hang = true;
        }
    }
    if cell.hang {
        eprintln!(
            "=== kill matrix: {mode} {point} +{after_ms} ms FAILED: {cell:?}\n--- crisp's call counters ---\n{}\n--- crisp's log ---\n{}\n--- grpc-go bridge log ---\n{}",
            call_counters(&crisp.admin()).await,
            crisp.last_log(),
            bridge.log_text()
        );
    }
    if !cell.killed {
        // The trap never fired: crisp still runs the old instance; restart to keep cells apart.
        tokio::task::block_in_place(|| crisp.restart())?;
    }
    cell.cell_ms = began.elapsed().as_secs_f64() * 1000.0;
    Ok(cell)
}

/// Calls through the bridge at `socket` (its runtime and image connections to crisp), retried
/// every 100 ms as kubelet retries, until both get an OK: the ms that took, or None if not
/// within `bound`.
async fn ok_again(socket: &Path, bound: Duration) -> Option<f64> {
    let t = Instant::now();
    let (mut rt, mut img) = crisp_e2e::harness::cri_clients(socket).await.ok()?;
    let (mut rt_ok, mut img_ok) = (false, false);
    while t.elapsed() < bound {
        let left = bound.saturating_sub(t.elapsed());
        if !rt_ok {
            let req = k8s_cri::v1::ListPodSandboxRequest::default();
            rt_ok = tokio::time::timeout(left, rt.list_pod_sandbox(req))
                .await
                .is_ok_and(|r| r.is_ok());
        }
        if !img_ok {
            let req = k8s_cri::v1::ImageFsInfoRequest::default();
            img_ok = tokio::time::timeout(left, img.image_fs_info(req))
                .await
                .is_ok_and(|r| r.is_ok());
        }
        if rt_ok && img_ok {
            return Some(t.elapsed().as_secs_f64() * 1000.0);
        }
        // kubelet's pace between retries of its periodic calls, at the fastest.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The held cells (issue #43): crisp SIGKILLed while it holds calls kubelet sent through the
// grpc-go bridge (kubelet's transport), the kill placed by crisp's own hold gauge instead of a
// protocol point. The test then sends only what kubelet sends again: a failed CreateContainer
// of a pod that should run (its pod worker re-syncs after its error back-off; the emulator's
// pace, 500 ms, here), never a failed StopContainer (kubelet 1.26 with a removed static pod,
// issue #43 item 1). The promise is checked on containerd's own timestamps:
//
// - `held-create`: two pods whose apps' creates are held 3 s when crisp dies. Pod `late`'s
//   sidecar gets ready 4.5 s after it starts: its app must be created after that, and within
//   the start timeout of the original hold. Pod `never`'s sidecar is not ready within the cell:
//   its app must be created at the start timeout counted from the *original* hold (not before,
//   not 3 s later as a clock restarted with crisp would have it).
// - `held-stop`: the app (3 s to exit on SIGTERM) and the sidecar stopped at once; crisp holds
//   the sidecar's stop and dies 1 s into it. The sidecar must finish after the app and within
//   the pod's grace counted from the first stop, with nobody sending its stop again.
//
// Either cell also requires an OK call through the same bridge once crisp is ready again.

const HELD: [&str; 2] = ["held-create", "held-stop"];
/// The held cells' pods' start timeout (`CRISP_CONFIG`).
const HELD_TIMEOUT: Duration = START_TIMEOUT;
/// Into the create holds when crisp is killed.
const CREATE_KILL_AT: Duration = Duration::from_secs(3);
/// Pod `late`'s sidecar is ready this long after it started: after the kill, before the
/// timeout.
const LATE_READY: Duration = Duration::from_millis(4500);
/// kubelet's pace re-sending a failed CreateContainer (the emulator's error back-off).
const CREATE_RETRY: Duration = Duration::from_millis(500);
/// How late past its due time an app may be created: a retry's pace, a probe's turn and
/// containerd's create on a loaded node. A clock restarted with crisp is `CREATE_KILL_AT` late
/// (and crisp's restart on top).
const CREATE_SLACK: Duration = Duration::from_millis(2000);
/// The held-stop pod's grace (StopContainer's timeout).
const HELD_GRACE: i64 = 10;
/// Into the sidecar's held stop when crisp is killed.
const STOP_KILL_AT: Duration = Duration::from_secs(1);

type Runtime = k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// A host-network sandbox whose sidecar `proxy` is ready once `/tmp/ready` exists.
fn held_sandbox(name: &str, logs: &Path) -> k8s_cri::v1::PodSandboxConfig {
    let mut sb = crisp_e2e::harness::host_network_sandbox(name, "kill-matrix", logs);
    sb.annotations
        .insert("crisp.dev/sidecars".into(), "proxy".into());
    sb.annotations.insert(
        "crisp.dev/ready.proxy".into(),
        r#"exec:["test","-f","/tmp/ready"]"#.into(),
    );
    sb
}

fn busybox(name: &str, cmd: &str) -> k8s_cri::v1::ContainerConfig {
    crisp_e2e::harness::shell_container(name, crisp_e2e::harness::BUSYBOX_IMAGE, cmd)
}

/// RunPodSandbox, then the sidecar created and started: (sandbox id, sidecar id).
async fn start_sidecar(
    rt: &mut Runtime,
    sb: &k8s_cri::v1::PodSandboxConfig,
    sidecar_cmd: &str,
) -> Result<(String, String)> {
    crisp_e2e::harness::run_pod_with(rt, sb, busybox("proxy", sidecar_cmd)).await
}

/// CreateContainer as kubelet's pod worker sends it: once, and again every `CREATE_RETRY`
/// while it fails (crisp's death answers it UNAVAILABLE; grpc-go fails fast while it waits to
/// reconnect). `first` gets the first attempt's code and ms; the answer is the container's id
/// and when the attempt that got it was sent (wall clock, ns).
async fn create_as_kubelet(
    mut rt: Runtime,
    sandbox: String,
    sb: k8s_cri::v1::PodSandboxConfig,
    config: k8s_cri::v1::ContainerConfig,
    first: tokio::sync::oneshot::Sender<(String, f64)>,
) -> Result<(String, i64)> {
    let mut first = Some(first);
    let give_up = Instant::now() + UP;
    loop {
        let t = Instant::now();
        let sent = now_ns();
        let mut req = tonic::Request::new(k8s_cri::v1::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(config.clone()),
            sandbox_config: Some(sb.clone()),
        });
        req.set_timeout(Duration::from_secs(60));
        let r = rt.create_container(req).await;
        if let Some(tx) = first.take() {
            let code = match &r {
                Ok(_) => "OK".to_string(),
                Err(s) => format!("{:?}", s.code()),
            };
            let _ = tx.send((code, t.elapsed().as_secs_f64() * 1000.0));
        }
        match r {
            Ok(r) => return Ok((r.into_inner().container_id, sent)),
            Err(e) if Instant::now() > give_up => bail!("CreateContainer: {e}"),
            Err(_) => tokio::time::sleep(CREATE_RETRY).await,
        }
    }
}

/// Waits (`crisp_holds_in_flight`) until crisp holds at least `n` calls.
async fn wait_holds(admin: &Path, n: f64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while gauge(admin, "crisp_holds_in_flight").await.unwrap_or(0.0) < n {
        ensure!(Instant::now() < deadline, "crisp never held {n} calls");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One held cell (`held-create` or `held-stop`, see above) against the running crisp.
async fn run_held_cell(
    mode: &'static str,
    crisp: &mut dyn Matrixable,
    containerd: &Path,
    dir: &Path,
    n: usize,
    point: &str,
) -> Result<Cell> {
    let began = Instant::now();
    let bridge = crisp_e2e::grpcgo::GoBridge::start(
        &dir.join(format!("bridge-{n}.sock")),
        &crisp.socket_path(),
        Default::default(),
    )?;
    let logs = dir.join(format!("logs-{n}"));
    std::fs::create_dir_all(&logs)?;
    let (rt, _) = crisp_e2e::harness::cri_clients(bridge.socket()).await?;
    let (mut direct, _) = crisp_e2e::harness::cri_clients(containerd).await?;
    let mut cell = Cell::new(mode, "invoke", point, 0);
    let restart = |cell: &mut Cell, crisp: &mut dyn Matrixable| -> Result<()> {
        let t = Instant::now();
        tokio::task::block_in_place(|| crisp.restart()).context("restarting crisp")?;
        cell.killed = true;
        cell.restart_ms = t.elapsed().as_secs_f64() * 1000.0;
        Ok(())
    };
    let mut sandboxes = Vec::new();
    if point == "held-create" {
        cell.after_ms = CREATE_KILL_AT.as_millis() as u64;
        let mut pods = Vec::new();
        // Both sidecars first (`late`'s last: its readiness counts from its start), then both
        // apps' creates together, so both holds are 3 s old at the kill.
        let mut started = Vec::new();
        for (name, ready_after) in [("never", UP), ("late", LATE_READY)] {
            let name = format!("{mode}-{n}-{name}");
            let sb = held_sandbox(&name, &logs);
            let cmd = format!(
                "trap 'exit 0' TERM; sleep {:.1}; touch /tmp/ready; sleep 3600 & wait",
                ready_after.as_secs_f64()
            );
            let (sandbox, proxy) = start_sidecar(&mut rt.clone(), &sb, &cmd).await?;
            sandboxes.push(sandbox.clone());
            started.push((name, ready_after, sb, sandbox, proxy));
        }
        for (name, ready_after, sb, sandbox, proxy) in started {
            let app = busybox("app", "trap 'exit 0' TERM; while true; do sleep 0.1; done");
            let (tx, rx) = tokio::sync::oneshot::channel();
            let held_since = now_ns();
            let task = tokio::spawn(create_as_kubelet(rt.clone(), sandbox, sb, app, tx));
            pods.push((name, ready_after, proxy, held_since, task, rx));
        }
        wait_holds(&crisp.admin(), 2.0).await?;
        let first_hold = pods.iter().map(|p| p.3).min().unwrap_or_default();
        let kill_at = first_hold + CREATE_KILL_AT.as_nanos() as i64;
        tokio::time::sleep(Duration::from_nanos((kill_at - now_ns()).max(0) as u64)).await;
        ensure!(
            pods.iter().all(|p| !p.4.is_finished()),
            "an app's create was not held {CREATE_KILL_AT:?}"
        );
        restart(&mut cell, crisp)?;
        for (name, ready_after, proxy, held_since, task, rx) in pods {
            let (app, last_sent) = tokio::time::timeout(UP, task)
                .await
                .with_context(|| format!("{name}: the app was never created"))???;
            if let Ok((code, ms)) = rx.await {
                cell.calls
                    .push((format!("create {name}"), code, ms, f64::NAN));
            }
            let proxy = crisp_e2e::harness::container_status(&mut direct, &proxy).await?;
            let app = crisp_e2e::harness::container_status(&mut direct, &app).await?;
            let timeout = HELD_TIMEOUT.as_nanos() as i64;
            let slack = CREATE_SLACK.as_nanos() as i64;
            let ready = proxy.started_at + ready_after.as_nanos() as i64;
            // Due: when the sidecar got ready, or at the start timeout of the first hold.
            let due = ready.min(held_since + timeout);
            if app.created_at < due {
                cell.broken.push(format!(
                    "{name}: app created {:.2} s before it was due (its sidecar not ready, the \
                     start timeout counted from the first hold not over)",
                    secs(due - app.created_at)
                ));
            }
            // A create can be answered no sooner than kubelet sent it: when grpc-go's reconnect
            // brings the retry after its due time, the retry is due at once.
            if app.created_at > due.max(last_sent) + slack {
                cell.broken.push(format!(
                    "{name}: app created {:.2} s after it was due (the first hold + {:?} \
                     start timeout, or its sidecar's readiness; retry sent {:.2} s after the \
                     first hold)",
                    secs(app.created_at - due.max(last_sent)),
                    HELD_TIMEOUT,
                    secs(last_sent - held_since)
                ));
            }
            let sidecar = if ready <= app.created_at {
                format!(
                    "{:.2} s after its sidecar was ready",
                    secs(app.created_at - ready)
                )
            } else {
                "its sidecar not ready".to_string()
            };
            eprintln!(
                "kill matrix {mode} held-create {name}: app created {:.2} s after its first \
                 hold ({sidecar}), due {:.2} s, the answered retry sent at {:.2} s",
                secs(app.created_at - held_since),
                secs(due - held_since),
                secs(last_sent - held_since)
            );
        }
    } else {
        cell.after_ms = STOP_KILL_AT.as_millis() as u64;
        let name = format!("{mode}-{n}-stop");
        let sb = held_sandbox(&name, &logs);
        let mut rt1 = rt.clone();
        let (sandbox, proxy) = start_sidecar(
            &mut rt1,
            &sb,
            "trap 'exit 0' TERM; touch /tmp/ready; sleep 3600 & wait",
        )
        .await?;
        sandboxes.push(sandbox.clone());
        let app = crisp_e2e::harness::create_and_start(
            &mut rt1,
            &sandbox,
            &sb,
            busybox(
                "app",
                "trap 'sleep 3; exit 0' TERM; while true; do sleep 0.1; done",
            ),
        )
        .await?;
        // "kubelet" stops the pod: the app's stop and the sidecar's at once, each sent once.
        let stop = |id: String, mut rt: Runtime| {
            tokio::spawn(async move {
                let t = Instant::now();
                let mut req = tonic::Request::new(k8s_cri::v1::StopContainerRequest {
                    container_id: id,
                    timeout: HELD_GRACE,
                });
                req.set_timeout(Duration::from_secs(HELD_GRACE as u64 + 30));
                let r = rt.stop_container(req).await;
                (r.map(|_| ()), t.elapsed().as_secs_f64() * 1000.0)
            })
        };
        let first_stop = now_ns();
        let app_stop = stop(app.clone(), rt.clone());
        let proxy_stop = stop(proxy.clone(), rt.clone());
        wait_holds(&crisp.admin(), 1.0).await?;
        let kill_at = first_stop + STOP_KILL_AT.as_nanos() as i64;
        tokio::time::sleep(Duration::from_nanos((kill_at - now_ns()).max(0) as u64)).await;
        ensure!(!proxy_stop.is_finished(), "the sidecar's stop was not held");
        restart(&mut cell, crisp)?;
        for (what, task) in [("stop app", app_stop), ("stop proxy", proxy_stop)] {
            let (r, ms) = task.await?;
            let code = r.map_or_else(|s| format!("{:?}", s.code()), |_| "OK".into());
            cell.calls.push((what.into(), code, ms, f64::NAN));
        }
        let exited = |s: &k8s_cri::v1::ContainerStatus| s.finished_at > 0;
        let grace = Duration::from_secs(HELD_GRACE as u64 + 5);
        let proxy =
            crisp_e2e::harness::wait_container(&mut direct, &proxy, "exited", grace, exited).await;
        let app = crisp_e2e::harness::container_status(&mut direct, &app).await?;
        match proxy {
            Err(e) => cell
                .broken
                .push(format!("{name}: the sidecar was never stopped: {e:#}")),
            Ok(proxy) => {
                if app.finished_at == 0 {
                    cell.broken.push(format!(
                        "{name}: the sidecar finished while the app still ran"
                    ));
                } else if proxy.finished_at < app.finished_at {
                    cell.broken.push(format!(
                        "{name}: the sidecar finished {:.2} s before the app",
                        secs(app.finished_at - proxy.finished_at)
                    ));
                }
                if proxy.finished_at - first_stop > HELD_GRACE * 1_000_000_000 {
                    cell.broken.push(format!(
                        "{name}: the sidecar finished {:.2} s after the first stop, grace {HELD_GRACE} s",
                        secs(proxy.finished_at - first_stop)
                    ));
                }
                eprintln!(
                    "kill matrix {mode} held-stop: sidecar finished {:.2} s after the app, \
                     {:.2} s after the first stop",
                    secs(proxy.finished_at - app.finished_at),
                    secs(proxy.finished_at - first_stop)
                );
            }
        }
    }
    cell.recovered_ms = ok_again(bridge.socket(), MATRIX_BOUND).await;
    cell.hang = cell.recovered_ms.is_none();
    if cell.hang || !cell.broken.is_empty() {
        eprintln!(
            "=== kill matrix: {mode} {point} FAILED: {cell:?}\n--- crisp's log ---\n{}\n--- grpc-go bridge log ---\n{}",
            crisp.last_log(),
            bridge.log_text()
        );
    }
    // The pods go straight through containerd: the next cells start from an idle node.
    for sandbox in sandboxes {
        let _ = direct
            .stop_pod_sandbox(k8s_cri::v1::StopPodSandboxRequest {
                pod_sandbox_id: sandbox.clone(),
            })
            .await;
        let _ = direct
            .remove_pod_sandbox(k8s_cri::v1::RemovePodSandboxRequest {
                pod_sandbox_id: sandbox,
            })
            .await;
    }
    cell.cell_ms = began.elapsed().as_secs_f64() * 1000.0;
    Ok(cell)
}

async fn run_matrix(
    mode: &'static str,
    crisp: &mut dyn Matrixable,
    containerd: &Path,
) -> Result<()> {
    let passes = env_usize("CRISP_MATRIX_PASSES", 1);
    let all: Vec<String> = POINTS.iter().chain(&HELD).map(|p| p.to_string()).collect();
    let points: Vec<String> = env_list("CRISP_MATRIX_POINTS", &all);
    let afters: Vec<u64> = env_list("CRISP_MATRIX_AFTER_MS", &AFTER_MS);
    let forward = std::env::var("CRISP_MATRIX_FORWARD").unwrap_or_else(|_| "invoke".into());
    let dir = tempfile::Builder::new().prefix("crisp-matrix-").tempdir()?;
    let out = std::env::var_os("CRISP_MATRIX_OUT");
    let mut cells = Vec::new();
    let mut n = 0;
    for _ in 0..passes {
        for p in &points {
            for &a in &afters {
                if p == "queued" && a != afters[0] {
                    // Its call is queued before the kill: no "later".
                    continue;
                }
                let held = HELD.contains(&p.as_str());
                if held && a != afters[0] {
                    // Killed at a point in the hold, not after a protocol point: run once.
                    continue;
                }
                n += 1;
                let c = if held {
                    run_held_cell(mode, crisp, containerd, dir.path(), n, p).await?
                } else {
                    run_cell(mode, crisp, dir.path(), n, p, a, &forward, MATRIX_DEADLINE).await?
                };
                if let Some(o) = &out {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(o)?;
                    writeln!(f, "{}", serde_json::to_string(&c)?)?;
                }
                cells.push(c);
            }
        }
    }
    let hangs: Vec<&Cell> = cells.iter().filter(|c| c.hang).collect();
    for p in &points {
        for &a in &afters {
            // A held cell's after_ms is its kill's time into the hold: listed once.
            let held = HELD.contains(&p.as_str());
            let these: Vec<&Cell> = cells
                .iter()
                .filter(|c| &c.point == p && (c.after_ms == a || (held && a == afters[0])))
                .collect();
            if these.is_empty() {
                continue;
            }
            let max = these
                .iter()
                .flat_map(|c| c.calls.iter().map(|x| x.2))
                .fold(0.0, f64::max);
            let unavailable = these
                .iter()
                .flat_map(|c| c.calls.iter())
                .filter(|x| x.1 == "Unavailable")
                .count();
            let recovered = these
                .iter()
                .filter_map(|c| c.recovered_ms)
                .fold(0.0, f64::max);
            let longest = these.iter().map(|c| c.cell_ms).fold(0.0, f64::max);
            // A held cell's kill: this far into the hold.
            let a = if held { these[0].after_ms } else { a };
            eprintln!(
                "kill matrix {mode} ({forward}) {p:>8} +{a:>4} ms: {} runs, {} hangs, {} broken, {unavailable} UNAVAILABLE, slowest call {max:.1} ms, OK again after ≤ {recovered:.1} ms, cell ≤ {longest:.0} ms",
                these.len(),
                these.iter().filter(|c| c.hang).count(),
                these.iter().filter(|c| !c.broken.is_empty()).count()
            );
        }
    }
    let broken: Vec<&String> = cells.iter().flat_map(|c| &c.broken).collect();
    ensure!(
        broken.is_empty(),
        "crisp's death broke the ordering of calls it held:\n{}",
        broken
            .iter()
            .map(|b| b.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    ensure!(
        hangs.is_empty(),
        "{} of {} kill-matrix cells had a call unanswered, or no OK call once crisp was ready again, within {MATRIX_BOUND:?}: {hangs:?}",
        hangs.len(),
        cells.len()
    );
    Ok(())
}

/// The chaos tests' crisp as a plain process in front of the runtime at `upstream`.
fn plain_crisp(upstream: &Path) -> Result<crisp_e2e::crisp::Crisp> {
    crisp_e2e::crisp::Crisp::start(
        upstream,
        crisp_e2e::crisp::CrispOpts {
            extra_config: CRISP_CONFIG.to_string(),
            log_level: Some(CHAOS_LOG.to_string()),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_matrix_plain() -> Result<()> {
    crisp_e2e::harness::require_root();
    let containerd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let mut crisp = plain_crisp(containerd.socket())?;
    run_matrix("plain", &mut crisp, containerd.socket()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_matrix_socket_activated() -> Result<()> {
    crisp_e2e::harness::require_root();
    let containerd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let mut crisp = Activated::start(containerd.socket())?;
    run_matrix("socket-activated", &mut crisp, containerd.socket()).await
}

/// The chaos hang, reproduced deterministically: the bridge's runtime connection's writer is
/// held inside a write, a ListPodSandbox is queued behind it, crisp is SIGKILLed, the writer
/// let go. grpc-go 1.33 ends the queued stream "unprocessed" without a status; the old
/// forwarder (`--forward stream`: NewStream, SendMsg, Header(), then a wait for a stats event)
/// got no header and no error and waited for the call's deadline; kubelet's own call path
/// (`Invoke`, the default forwarder) retries the stream transparently and is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_queued_as_its_connection_closes_is_answered() -> Result<()> {
    crisp_e2e::harness::require_root();
    let containerd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let mut crisp = plain_crisp(containerd.socket())?;
    let dir = tempfile::Builder::new().prefix("crisp-queued-").tempdir()?;
    let deadline = Duration::from_secs(4);
    let invoke = run_cell(
        "plain",
        &mut crisp,
        dir.path(),
        1,
        "queued",
        0,
        "invoke",
        deadline,
    )
    .await?;
    eprintln!("kubelet's call path (Invoke): {:?}", invoke.calls);
    ensure!(
        !invoke.hang,
        "a call queued as its connection closed was not answered within half its deadline: {invoke:?}"
    );
    let stream = run_cell(
        "plain",
        &mut crisp,
        dir.path(),
        2,
        "queued",
        0,
        "stream",
        deadline,
    )
    .await?;
    eprintln!(
        "the old forwarder (NewStream + Header()): {:?}",
        stream.calls
    );
    // The mechanism, shown: with grpc-go 1.33 (Debian's) the old forwarder waits for the whole
    // deadline (then answers DeadlineExceeded, or UNAVAILABLE when its RecvMsg wins the race
    // with the caller's own deadline). If this starts failing, grpc-go changed, not crisp: see
    // RELIABILITY.md.
    ensure!(
        stream.hang
            && stream
                .calls
                .iter()
                .any(|c| c.0 == "runtime" && c.2 >= deadline.as_millis() as f64 - 50.0),
        "the old forwarder no longer waits for the deadline of a call queued as its connection closed: {stream:?}"
    );
    Ok(())
}
