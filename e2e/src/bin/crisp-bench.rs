//! crisp-bench: measures the same workloads three ways in one run — client → runtime directly,
//! client → socat (a raw byte splice: the floor for any proxy hop) → runtime, and client → crisp
//! → runtime — and prints a Markdown report. `hack/bench.sh` runs it and writes BENCHMARKS.md.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::Parser;
use crisp_e2e::fakert::{self, Canned};
use crisp_e2e::raw::frame;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_cri::v1 as cri;
use prost::Message;

#[cfg(test)]
#[path = "crisp-bench/bench_regress.rs"]
mod bench_regress;
#[path = "crisp-bench/burst.rs"]
mod burst;
#[path = "crisp-bench/counted.rs"]
mod counted;
#[path = "crisp-bench/ctrd_relist.rs"]
mod ctrd_relist;
#[path = "crisp-bench/ownwork.rs"]
mod ownwork;

#[derive(Parser, Debug)]
#[command(about = "Benchmark crisp against a direct connection and a socat splice")]
struct Args {
    /// Sequential calls for the latency workload.
    #[arg(long, default_value_t = 5000)]
    calls: usize,
    /// Seconds of each round of the throughput workload.
    #[arg(long, default_value_t = 1)]
    seconds: u64,
    /// Rounds of the throughput workload; the lanes take turns, so load changes on the machine
    /// fall on all three alike (and each round's ratios compare lanes run back to back).
    #[arg(long, default_value_t = 8)]
    rounds: u32,
    /// Run only these workloads (comma-separated: latency, throughput, list, events, mix, grpcgo).
    #[arg(long, value_delimiter = ',', value_name = "WORKLOADS")]
    only: Vec<Workload>,
    /// Concurrency of the throughput workload.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Containers in the big ListContainers answer.
    #[arg(long, default_value_t = 10_000)]
    containers: usize,
    /// Also measure against a real private containerd (needs root and hack/setup.sh).
    #[arg(long)]
    containerd: bool,
    /// Only drive Version calls at this socket and exit (for profiling a crisp started by hand,
    /// e.g. under valgrind --tool=callgrind): `--calls` sequential ones, then `--seconds` at
    /// `--concurrency` (`--only` picks one of the two).
    #[arg(long, value_name = "SOCKET")]
    drive: Option<PathBuf>,
    /// Pods in the kubelet-mix workload (three containers each).
    #[arg(long, default_value_t = 300)]
    mix_pods: usize,
    /// Seconds of the kubelet-mix workload per lane.
    #[arg(long, default_value_t = 10)]
    mix_seconds: u64,
    /// Extra TOML appended to crisp's config (e.g. to compare settings).
    #[arg(long, default_value = "")]
    crisp_config: String,
    /// grpc-go lanes: runs (each on fresh connections, after a warm-up).
    #[arg(long, default_value_t = 5)]
    grpcgo_runs: usize,
    /// grpc-go lanes: measured `Version` calls per lane and run (interleaved call by call).
    #[arg(long, default_value_t = 2000)]
    grpcgo_calls: usize,
    /// grpc-go lanes: measured calls of the 10,000-container `ListContainers` per lane and run.
    #[arg(long, default_value_t = 40)]
    grpcgo_list_calls: usize,
    /// Relist lane: runs (each on fresh connections, after a warm-up), min / median / max.
    #[arg(long, default_value_t = 3)]
    relist_runs: usize,
    /// Relist lane: measured relists per lane and run of the 10,000-container node (the
    /// 2,000-container node gets three times as many).
    #[arg(long, default_value_t = 100)]
    relist_calls: usize,
    /// Relist lane: pause after every lane's relist, in ms (kubelet relists once a second; the
    /// bench paces a tight loop so that the relists do not queue behind each other's GC).
    #[arg(long, default_value_t = 20)]
    relist_pace_ms: u64,
    /// Burst lane: ordered pods created at once (each a sidecar with an exec readiness, then
    /// an app crisp holds until it is ready).
    #[arg(long, default_value_t = 100)]
    burst_pods: usize,
    /// Relist lane on real containerd (`--only ctrd-relist`): pods created on it, each a
    /// host-network sandbox and a busybox container running.
    #[arg(long, default_value_t = 300)]
    ctrd_pods: usize,
    /// Relist lane on real containerd: measured relists per lane and run.
    #[arg(long, default_value_t = 100)]
    ctrd_relists: usize,
    /// Burst lane: pods on the node the relist reads (four containers each) besides the burst's
    /// own: crisp's recovery reads every one of them at start.
    #[arg(long, default_value_t = 500)]
    burst_node_pods: usize,
    /// Burst lane: runs, each with a fresh fake runtime and a fresh crisp.
    #[arg(long, default_value_t = 5)]
    burst_runs: usize,
    /// Burst lane: a sidecar turns ready this long after its StartContainer reached the
    /// runtime (plus 0–90 ms by pod, so that the ready instants do not fall in step).
    #[arg(long, default_value_t = 500)]
    burst_ready_ms: u64,
    /// Burst lane: measured relists per lane in the quiet before the burst and during it.
    #[arg(long, default_value_t = 20)]
    burst_relists: usize,
    /// Burst lane: pause after every lane's relist, in ms (kubelet relists once a second; the
    /// default paces 20 relists a lane into the 2.5 s that 100 pods take on crisp's defaults).
    #[arg(long, default_value_t = 50)]
    burst_relist_pace_ms: u64,
    /// A second crisp binary (say, a build of main) run as a lane of its own, "crisp-before",
    /// interleaved with the others: before/after from the same runs. Also `$CRISP_BEFORE_BIN`.
    #[arg(long, env = "CRISP_BEFORE_BIN")]
    before: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Latency,
    Throughput,
    List,
    Events,
    Mix,
    /// Sequential unary calls from a grpc-go client (`crisp-grpcgo call`, kubelet's transport).
    Grpcgo,
    /// kubelet's client (`crisp-grpcgo bench`), the lanes interleaved call by call: Version,
    /// ListContainers of 10,000 (fake runtime), throughput at `--concurrency`; with syscall and
    /// CPU counts of crisp per call. The first table of the report.
    Kubelet,
    /// kubelet's relist (`crisp-grpcgo bench`: ListPodSandbox, then ListContainers) against a
    /// fake node of 500 pods / 2,000 containers and of 2,500 pods / 10,000 containers (~15 MB),
    /// the lanes interleaved relist by relist; crisp's CPU, context switches and RSS per relist
    /// (issue #47).
    Relist,
    /// A burst of ordered pods (`--burst-pods`, each a sidecar with an exec readiness and an
    /// app) created at once through crisp while kubelet's relist runs: per pod, the time to
    /// the app's CreateContainer leaving crisp from the sidecar's first successful probe and
    /// from its turning ready; the node's ExecSync rate; the relist's latency during the burst
    /// and before it (issue #47).
    Burst,
    /// crisp's own work on a fake node of 500 pods / 2,000 containers and of 2,500 pods /
    /// 10,000 containers (issue #47): its recovery at start, Job mode's status check, `crisp
    /// tap --json --all` during the relist, `crisp pods`.
    Ownwork,
    /// kubelet's relist on a real containerd filled with `--ctrd-pods` pods (a sandbox and a
    /// busybox container each): direct / socat / crisp / socat-64k interleaved (issue #47).
    /// Needs root.
    CtrdRelist,
}

impl Args {
    fn runs(&self, w: Workload) -> bool {
        self.only.is_empty() || self.only.contains(&w)
    }
}

#[derive(Clone)]
struct Lane {
    name: &'static str,
    socket: PathBuf,
}

impl Lane {
    fn new(name: &'static str, socket: PathBuf) -> Lane {
        Lane { name, socket }
    }

    /// The lanes every comparison starts from: the runtime's own socket, socat's splice of it,
    /// and crisp.
    fn direct_socat_crisp(upstream: &Path, socat: PathBuf, crisp: PathBuf) -> Vec<Lane> {
        vec![
            Lane::new("direct", upstream.to_path_buf()),
            Lane::new("socat", socat),
            Lane::new("crisp", crisp),
        ]
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn connect(socket: &Path) -> Result<SendRequest<Full<Bytes>>> {
    let s = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connect {}", socket.display()))?;
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(2 << 20)
        .initial_connection_window_size(16 << 20)
        .max_frame_size(1 << 20)
        .handshake(TokioIo::new(s))
        .await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One unary call; returns (latency, response bytes).
async fn call(
    sender: &mut SendRequest<Full<Bytes>>,
    path: &str,
    body: &Bytes,
) -> Result<(Duration, usize)> {
    let req = Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "120S")
        .body(Full::new(body.clone()))?;
    let t = Instant::now();
    let resp = sender.send_request(req).await?;
    let collected = resp.into_body().collect().await?;
    let ok = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .is_some_and(|v| v == "0");
    let n = collected.to_bytes().len();
    let d = t.elapsed();
    if !ok {
        bail!("{path}: call did not end with grpc-status 0");
    }
    Ok((d, n))
}

struct Latency {
    p50: Duration,
    p99: Duration,
}

/// `n` sequential calls on a fresh connection (after a warm-up); their latencies, unsorted.
async fn latency(socket: &Path, path: &str, body: &Bytes, n: usize) -> Result<Vec<Duration>> {
    let mut s = connect(socket).await?;
    for _ in 0..(n / 10).max(10) {
        call(&mut s, path, body).await?;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(call(&mut s, path, body).await?.0);
    }
    Ok(v)
}

async fn throughput(
    socket: &Path,
    path: &str,
    body: &Bytes,
    conc: usize,
    secs: u64,
) -> Result<f64> {
    let s = connect(socket).await?;
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let mut s = s.clone();
        let body = body.clone();
        let path = path.to_string();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                call(&mut s, &path, &body).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let t = Instant::now();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / t.elapsed().as_secs_f64())
}

async fn stream_events(socket: &Path) -> Result<(Duration, usize)> {
    let mut s = connect(socket).await?;
    let body = frame(&[]);
    let req = Request::post("http://localhost/runtime.v1.RuntimeService/GetContainerEvents")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(body))?;
    let t = Instant::now();
    let resp = s.send_request(req).await?;
    let mut b = resp.into_body();
    let mut bytes = 0;
    while let Some(f) = b.frame().await {
        if let Ok(d) = f?.into_data() {
            bytes += d.len();
        }
    }
    Ok((t.elapsed(), bytes))
}

/// kubelet's traffic for `pods` pods, at 10× its rate so that one run yields enough samples:
/// every 100 ms a PLEG relist (ListPodSandbox + ListContainers) and a pod sync
/// (PodSandboxStatus and three ContainerStatus); and 20 pods a second started and stopped one call at a time
/// (RunPodSandbox, CreateContainer/StartContainer ×2, StopContainer ×2, StopPodSandbox,
/// RemoveContainer ×2, RemovePodSandbox) — the calls crisp's ordering engine inspects. Pods
/// declare no sidecars (nothing waits: the fake runtime runs no containers), so this measures
/// the engine's and the relay's cost, not a hold. Returns sorted latencies per kind.
async fn kubelet_mix(socket: &Path, secs: u64) -> Result<[Vec<Duration>; 3]> {
    let s = connect(socket).await?;
    let stop = Instant::now() + Duration::from_secs(secs);
    let relist = {
        let mut s = s.clone();
        tokio::spawn(async move {
            let (mut lists, mut statuses) = (Vec::new(), Vec::new());
            let list_s = frame(&cri::ListPodSandboxRequest::default().encode_to_vec());
            let list_c = frame(&cri::ListContainersRequest::default().encode_to_vec());
            let sb = frame(
                &cri::PodSandboxStatusRequest {
                    pod_sandbox_id: format!("{:064x}", 1_000_000),
                    verbose: false,
                }
                .encode_to_vec(),
            );
            let cs = frame(
                &cri::ContainerStatusRequest {
                    container_id: format!("{:064x}", 0),
                    verbose: false,
                }
                .encode_to_vec(),
            );
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while Instant::now() < stop {
                tick.tick().await;
                lists.push(
                    call(&mut s, "/runtime.v1.RuntimeService/ListPodSandbox", &list_s)
                        .await?
                        .0,
                );
                lists.push(
                    call(&mut s, "/runtime.v1.RuntimeService/ListContainers", &list_c)
                        .await?
                        .0,
                );
                statuses.push(
                    call(&mut s, "/runtime.v1.RuntimeService/PodSandboxStatus", &sb)
                        .await?
                        .0,
                );
                for _ in 0..3 {
                    statuses.push(
                        call(&mut s, "/runtime.v1.RuntimeService/ContainerStatus", &cs)
                            .await?
                            .0,
                    );
                }
            }
            anyhow::Ok((lists, statuses))
        })
    };
    let churn = {
        let mut s = s.clone();
        tokio::spawn(async move {
            let mut muts = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            let mut i = 0u64;
            while Instant::now() < stop {
                tick.tick().await;
                i += 1;
                let calls = pod_lifecycle(i);
                for (m, body) in calls {
                    muts.push(
                        call(
                            &mut s,
                            &format!("/runtime.v1.RuntimeService/{m}"),
                            &frame(&body),
                        )
                        .await?
                        .0,
                    );
                }
            }
            anyhow::Ok(muts)
        })
    };
    let (mut lists, mut statuses) = relist.await??;
    let mut muts = churn.await??;
    for v in [&mut lists, &mut statuses, &mut muts] {
        v.sort();
    }
    Ok([lists, statuses, muts])
}

/// The mutating calls of mix pod `i`'s life, as kubelet makes them: its sandbox, a sidecar and
/// an app created and started, stopped, and removed.
fn pod_lifecycle(i: u64) -> Vec<(&'static str, Vec<u8>)> {
    fn req(method: &'static str, m: impl Message) -> (&'static str, Vec<u8>) {
        (method, m.encode_to_vec())
    }
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("mix-{i}"),
            uid: format!("{i:032x}"),
            namespace: "bench".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    let sandbox = "0.1.0".to_string(); // what the fake answers as the id
    let id = |c: &str| format!("{c}-{i}");
    let mut calls = vec![req(
        "RunPodSandbox",
        cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        },
    )];
    for c in ["sidecar", "app"] {
        let container = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: c.into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        calls.push(req(
            "CreateContainer",
            cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(container),
                sandbox_config: Some(config.clone()),
            },
        ));
        calls.push(req(
            "StartContainer",
            cri::StartContainerRequest {
                container_id: id(c),
            },
        ));
    }
    for c in ["app", "sidecar"] {
        let stop = cri::StopContainerRequest {
            container_id: id(c),
            timeout: 30,
        };
        calls.push(req("StopContainer", stop));
    }
    let stop = cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.clone(),
    };
    calls.push(req("StopPodSandbox", stop));
    for c in ["app", "sidecar"] {
        calls.push(req(
            "RemoveContainer",
            cri::RemoveContainerRequest {
                container_id: id(c),
            },
        ));
    }
    calls.push(req(
        "RemovePodSandbox",
        cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox,
        },
    ));
    calls
}

fn proc_status(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime+stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let g = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    g(11) + g(12)
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_socket(p: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(p).is_err() {
        if Instant::now() > deadline {
            bail!("{} never accepted connections", p.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn start_socat(listen: &Path, upstream: &Path) -> Result<Proc> {
    start_socat_with(listen, upstream, &[])
}

/// socat with options of its own before the addresses (e.g. `-b 65536`, its read size).
fn start_socat_with(listen: &Path, upstream: &Path, opts: &[&str]) -> Result<Proc> {
    let child = Command::new("socat")
        .args(opts)
        .arg(format!("UNIX-LISTEN:{},fork", listen.display()))
        .arg(format!("UNIX-CONNECT:{}", upstream.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("socat (hack/setup.sh installs it)")?;
    let p = Proc(child);
    wait_socket(listen)?;
    Ok(p)
}

fn start_crisp(dir: &Path, listen: &Path, upstream: &Path, extra: &str) -> Result<Proc> {
    start_crisp_bin(
        &crisp_e2e::crisp::crisp_binary()?,
        "crisp",
        dir,
        listen,
        upstream,
        extra,
        &[],
    )
}

/// This build's crisp (`--crisp-config` added to its config) on `upstream`, in a directory of
/// its own, `dir/{name}-crisp` (crisp puts its admin socket beside its listening one): the
/// process and the socket it listens on.
fn start_crisp_own_dir(
    args: &Args,
    name: &str,
    dir: &Path,
    upstream: &Path,
) -> Result<(Proc, PathBuf)> {
    let crisp_dir = dir.join(format!("{name}-crisp"));
    std::fs::create_dir_all(&crisp_dir)?;
    let listen = crisp_dir.join("crisp.sock");
    let crisp = start_crisp_bin(
        &crisp_e2e::crisp::crisp_binary()?,
        name,
        dir,
        &listen,
        upstream,
        &args.crisp_config,
        &[],
    )?;
    Ok((crisp, listen))
}

/// crisp spliced on its relay threads (`CRISP_RELAY_SPLICE=1`, `src/proxy/relay/splice.rs`):
/// the same accept, threads and sockets as crisp, none of its protocol work. The machine's floor
/// for crisp's added latency: crisp's addition over it is what the relay core costs.
fn start_crisp_splice(dir: &Path, name: &str, listen: &Path, upstream: &Path) -> Result<Proc> {
    let bin = crisp_e2e::crisp::crisp_binary()?;
    start_crisp_bin(
        &bin,
        name,
        dir,
        listen,
        upstream,
        "",
        &[("CRISP_RELAY_SPLICE", "1")],
    )
}

/// The crisp `bin` on `upstream`, listening on `listen`, `extra` added to its config and `env` to
/// its environment; its config and state under `dir`, named by `name`.
fn start_crisp_bin(
    bin: &Path,
    name: &str,
    dir: &Path,
    listen: &Path,
    upstream: &Path,
    extra: &str,
    env: &[(&str, &str)],
) -> Result<Proc> {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, format!("listen = {listen:?}\nupstream = {upstream:?}\nstate_dir = {:?}\n[log]\nlevel = \"warn\"\n{extra}\n", dir.join(format!("{name}-state"))))?;
    let child = Command::new(bin)
        .envs(env.iter().copied())
        .arg("--config")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    let p = Proc(child);
    wait_socket(listen)?;
    Ok(p)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// min / median / max of a list of figures.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn fmt_spread(v: &[f64], digits: usize) -> String {
    let (lo, mid, hi) = spread(v);
    format!("{lo:.digits$} / **{mid:.digits$}** / {hi:.digits$}")
}

/// `crisp-grpcgo bench` calling `path` with the protobuf `req` on every lane.
fn grpcgo_command(lanes: &[Lane], path: &str, req: &[u8]) -> Result<Command> {
    let mut cmd = Command::new(crisp_e2e::grpcgo::grpcgo_binary()?);
    cmd.arg("bench")
        .arg("--method")
        .arg(path)
        .arg("--hex")
        .arg(crisp_e2e::grpcgo::hex(req));
    for l in lanes {
        cmd.arg("--lane")
            .arg(format!("{}={}", l.name, l.socket.display()));
    }
    Ok(cmd)
}

/// Runs a [`grpcgo_command`] (`what`: its method, for errors) to its end: its output's lines.
fn run_grpcgo(mut cmd: Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("crisp-grpcgo bench {what}"))?;
    if !out.status.success() {
        bail!("crisp-grpcgo bench {what} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Per run, every lane's figure (see [`grpcgo_bench`]).
type LaneRuns = Vec<Vec<(f64, f64)>>;

/// One `crisp-grpcgo bench` run set: every lane's figure per run (latency: (p50, p99) in µs;
/// throughput: (calls/s, 0)).
fn grpcgo_bench(
    lanes: &[Lane],
    method: &str,
    req: &[u8],
    authority: Option<&str>,
    extra: &[String],
) -> Result<Vec<Vec<(f64, f64)>>> {
    Ok(grpcgo_bench_watched(lanes, &[], method, req, authority, extra)?.0)
}

/// [`grpcgo_bench`], and the processes `watch` sampled around each run's measured calls (their
/// warm-up and the dial left out): CPU and context switches per run.
fn grpcgo_bench_watched(
    lanes: &[Lane],
    watch: &[(&str, u32)],
    method: &str,
    req: &[u8],
    authority: Option<&str>,
    extra: &[String],
) -> Result<(LaneRuns, Vec<Vec<Watched>>)> {
    let mut cmd = grpcgo_command(lanes, &format!("/runtime.v1.RuntimeService/{method}"), req)?;
    if let Some(a) = authority {
        cmd.arg("--authority").arg(a);
    }
    for (name, pid) in watch {
        cmd.arg("--watch").arg(format!("{name}={pid}"));
    }
    cmd.args(extra);
    let out = run_grpcgo(cmd, method)?;
    let mut runs = Vec::new();
    let mut watched: Vec<Vec<Watched>> = watch.iter().map(|_| Vec::new()).collect();
    for line in out.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("crisp-grpcgo bench printed {line:?}"))?;
        for ((name, _), runs) in watch.iter().zip(&mut watched) {
            runs.push(Watched::of(&v["watch"][name]));
        }
        let mut per = Vec::new();
        for l in lanes {
            if let Some(lat) = v.get("latency") {
                let f = |k: &str| lat[l.name][k].as_f64().unwrap_or(f64::NAN);
                per.push((f("p50_us"), f("p99_us")));
            } else {
                per.push((v["calls_per_s"][l.name].as_f64().unwrap_or(f64::NAN), 0.0));
            }
        }
        runs.push(per);
    }
    Ok((runs, watched))
}

/// kubelet's own client against direct / socat / crisp (/ crisp-before), interleaved call by
/// call: added latency per run, and crisp's (and crisp-before's) ratio to socat's addition as
/// min / median / max over the runs.
fn kubelet_latency_table(
    out: &mut String,
    lanes: &[Lane],
    runs: &[Vec<(f64, f64)>],
    unit_ms: bool,
) -> Result<()> {
    use std::fmt::Write;
    let scale = if unit_ms { 1e-3 } else { 1.0 };
    let u = if unit_ms { "ms" } else { "µs" };
    let d = if unit_ms { 2 } else { 1 };
    writeln!(
        out,
        "| lane | p50 {u} | p99 {u} | added p50 {u} | added p99 {u} |\n|---|---|---|---|---|"
    )?;
    for (i, l) in lanes.iter().enumerate() {
        let p50: Vec<f64> = runs.iter().map(|r| r[i].0 * scale).collect();
        let p99: Vec<f64> = runs.iter().map(|r| r[i].1 * scale).collect();
        let a50: Vec<f64> = runs.iter().map(|r| (r[i].0 - r[0].0) * scale).collect();
        let a99: Vec<f64> = runs.iter().map(|r| (r[i].1 - r[0].1) * scale).collect();
        if i == 0 {
            writeln!(
                out,
                "| {} | {} | {} | — | — |",
                l.name,
                fmt_spread(&p50, d),
                fmt_spread(&p99, d)
            )?;
        } else {
            writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                l.name,
                fmt_spread(&p50, d),
                fmt_spread(&p99, d),
                fmt_spread(&a50, d),
                fmt_spread(&a99, d)
            )?;
        }
    }
    writeln!(
        out,
        "\n| added / socat's added | p50 (min / median / max of runs) | p99 |\n|---|---|---|"
    )?;
    let ratio = |i: usize, base: usize, k: usize| -> Vec<f64> {
        runs.iter()
            .map(|r| {
                let pick = |x: (f64, f64)| if k == 0 { x.0 } else { x.1 };
                (pick(r[i]) - pick(r[0])) / (pick(r[base]) - pick(r[0]))
            })
            .collect()
    };
    for (i, l) in lanes.iter().enumerate().skip(2) {
        writeln!(
            out,
            "| {} | {} | {} |",
            l.name,
            fmt_spread(&ratio(i, 1, 0), 2),
            fmt_spread(&ratio(i, 1, 1), 2)
        )?;
    }
    // The machine's own floor for crisp: the same process spliced on its relay threads. crisp's
    // addition over it is the relay core's work; the floor's over socat's, crisp's threads and
    // sockets against socat's.
    if let Some(floor) = lanes.iter().position(|l| l.name == FLOOR) {
        writeln!(
            out,
            "\n| added / {FLOOR}'s added (the machine's floor for crisp) | p50 | p99 |\n|---|---|---|"
        )?;
        for (i, l) in lanes.iter().enumerate().skip(2) {
            if i != floor {
                writeln!(
                    out,
                    "| {} | {} | {} |",
                    l.name,
                    fmt_spread(&ratio(i, floor, 0), 2),
                    fmt_spread(&ratio(i, floor, 1), 2)
                )?;
            }
        }
    }
    Ok(())
}

/// A runtime the lanes run on.
struct Upstream<'a> {
    /// Its name in the report.
    title: &'a str,
    socket: &'a Path,
    /// The fake runtime, whose ListContainers is the big canned list (and which, a hyper
    /// server, wants `localhost` as `:authority`).
    big_list: bool,
}

impl<'a> Upstream<'a> {
    fn fake(socket: &'a Path) -> Upstream<'a> {
        Upstream {
            title: "fake runtime (in-process, canned answers)",
            socket,
            big_list: true,
        }
    }

    fn containerd(title: &'a str, containerd: &'a crisp_e2e::harness::Containerd) -> Upstream<'a> {
        Upstream {
            title,
            socket: containerd.socket(),
            big_list: false,
        }
    }
}

/// The lane of crisp spliced on its relay threads ([`start_crisp_splice`]).
const FLOOR: &str = "crisp-splice";

/// The grpc-go (kubelet) lanes on one upstream: Version, ListContainers, throughput at
/// `--concurrency`, and crisp's CPU and wakeups per call.
async fn kubelet_report(args: &Args, target: &Upstream<'_>, dir: &Path) -> Result<String> {
    use std::fmt::Write;
    let &Upstream {
        title,
        socket: upstream,
        big_list,
    } = target;
    let tag = if big_list { "kf" } else { "kc" };
    let socat_sock = dir.join(format!("{tag}-socat.sock"));
    // A directory per crisp: each puts its admin socket next to its listening one.
    let before_dir = dir.join(format!("{tag}-before"));
    std::fs::create_dir_all(&before_dir)?;
    let before_sock = before_dir.join("crisp.sock");
    let floor_dir = dir.join(format!("{tag}-splice"));
    std::fs::create_dir_all(&floor_dir)?;
    let floor_sock = floor_dir.join("crisp.sock");
    let _socat = start_socat(&socat_sock, upstream)?;
    let floor = start_crisp_splice(dir, &format!("{tag}-splice"), &floor_sock, upstream)?;
    let (crisp, crisp_sock) = start_crisp_own_dir(args, tag, dir, upstream)?;
    let before = match &args.before {
        Some(b) => Some(start_crisp_bin(
            b,
            &format!("{tag}-before"),
            dir,
            &before_sock,
            upstream,
            &args.crisp_config,
            &[],
        )?),
        None => None,
    };
    let mut lanes = Lane::direct_socat_crisp(upstream, socat_sock, crisp_sock);
    lanes.push(Lane::new(FLOOR, floor_sock));
    let mut pids = vec![("crisp", crisp.0.id()), (FLOOR, floor.0.id())];
    if let Some(b) = &before {
        lanes.push(Lane::new("crisp-before", before_sock));
        pids.push(("crisp-before", b.0.id()));
    }
    // The fake is a hyper server, which rejects grpc-go's default `:authority` (the socket path,
    // KUBELET-CRI §11): there the client sends `localhost`, as crictl-like clients do.
    let authority = big_list.then_some("localhost");
    let mut out = String::new();
    writeln!(out, "\n### kubelet's client (grpc-go 1.33), {title}\n")?;
    // The host decides what crisp's work per call costs (BENCHMARKS.md, "The code a call
    // runs"): every table says which it ran on.
    writeln!(out, "Machine: {}.\n", machine_line())?;
    if let Some(b) = &args.before {
        writeln!(
            out,
            "crisp-before: `{}`; crisp: `{}`.\n",
            b.display(),
            crisp_e2e::crisp::crisp_binary()?.display()
        )?;
    }
    let runs = args.grpcgo_runs.max(1);
    let std_args = |count: usize, warmup: usize| run_flags(runs, count, warmup);

    let version = cri::VersionRequest {
        version: "v1".into(),
    }
    .encode_to_vec();
    let warm = (args.grpcgo_calls / 10).max(10);
    let (v, watched) = grpcgo_bench_watched(
        &lanes,
        &pids,
        "Version",
        &version,
        authority,
        &std_args(args.grpcgo_calls, warm),
    )?;
    writeln!(
        out,
        "Unary `Version`, concurrency 1, {runs} runs of {} calls per lane, the lanes interleaved call by call (min / **median** / max over the runs):\n",
        args.grpcgo_calls
    )?;
    kubelet_latency_table(&mut out, &lanes, &v, false)?;
    writeln!(out)?;
    // Sampled from /proc around each run's measured calls: a `perf stat` attached before the
    // run counted a fixed 100–200 ms more for whichever process it attached to first, which
    // at a few thousand calls read as a lane's CPU (BENCHMARKS.md, 2026-11-29).
    for ((name, _), w) in pids.iter().zip(&watched) {
        writeln!(
            out,
            "{name}: {} ms of CPU per 1,000 sequential calls, {} context switches per call \
             (/proc, the measured calls; min / **median** / max of runs)",
            fmt_spread(&per_turn(w, |x| x.cpu_ticks as f64 * 10.0 * 1000.0), 1),
            fmt_spread(&per_turn(w, |x| x.switches as f64), 2),
        )?;
    }

    let list = cri::ListContainersRequest { filter: None }.encode_to_vec();
    let n = if big_list {
        args.grpcgo_list_calls
    } else {
        args.grpcgo_calls
    };
    let l = grpcgo_bench(
        &lanes,
        "ListContainers",
        &list,
        authority,
        &std_args(n, (n / 10).max(3)),
    )?;
    if big_list {
        writeln!(out, "\nUnary `ListContainers` of {} containers (6.4 MiB; the fake runtime's canned answer), {runs} runs of {n} calls per lane, interleaved:\n", args.containers)?;
    } else {
        writeln!(out, "\nUnary `ListContainers` (the private containerd's, empty), {runs} runs of {n} calls per lane, interleaved:\n")?;
    }
    kubelet_latency_table(&mut out, &lanes, &l, big_list)?;

    // CPU from /proc before and after (its exited relay threads included): nothing is attached
    // to a process while it is timed. `perf stat` attached to crisp's lanes and not to socat's
    // cost each of their calls 4-5 µs (BENCHMARKS.md, "where the issue's extra microseconds
    // came from").
    let ticks: Vec<u64> = pids.iter().map(|(_, p)| cpu_ticks(*p)).collect();
    let rounds = args.rounds.max(1) as usize;
    let t = grpcgo_bench(
        &lanes,
        "Version",
        &version,
        authority,
        &[
            "--runs".to_string(),
            rounds.to_string(),
            "--warmup".into(),
            "50".into(),
            "--concurrency".into(),
            args.concurrency.to_string(),
            "--seconds".into(),
            args.seconds.to_string(),
        ],
    )?;
    writeln!(
        out,
        "\nUnary `Version`, concurrency {} on one connection per lane, {rounds} rounds of {} s (lanes take turns, the order rotating), calls/s:\n",
        args.concurrency, args.seconds
    )?;
    writeln!(out, "| lane | calls/s (min / median / max of rounds) | / direct, median of rounds | / socat, median of rounds |\n|---|---|---|---|")?;
    for (i, l) in lanes.iter().enumerate() {
        let rate: Vec<f64> = t.iter().map(|r| r[i].0).collect();
        let vs = |j: usize| -> Vec<f64> { t.iter().map(|r| r[i].0 / r[j].0).collect() };
        writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} |",
            l.name,
            fmt_spread(&rate, 0),
            spread(&vs(0)).1,
            spread(&vs(1)).1
        )?;
    }
    writeln!(out)?;
    for (k, ((name, pid), t0)) in pids.iter().zip(ticks).enumerate() {
        let relayed: f64 = t
            .iter()
            .map(|r| r[2 + k].0 * args.seconds as f64)
            .sum::<f64>()
            + (rounds * 50) as f64;
        let ms = cpu_ticks(*pid).saturating_sub(t0) as f64 * 10.0;
        writeln!(
            out,
            "{name}: {:.1} ms of CPU per 1,000 calls at concurrency {} (/proc, 10 ms ticks)",
            ms / (relayed / 1000.0),
            args.concurrency
        )?;
    }
    Ok(out)
}

/// One `crisp-grpcgo bench` relist run set, parsed: per run, the figures of each method and of
/// the whole relist (per lane: p50, p99 in µs), and what `--watch` saw of crisp.
struct RelistRuns {
    /// `[method][run][lane]`; the last method is the relist as a whole.
    latency: Vec<Vec<Vec<(f64, f64)>>>,
    /// Per watched process, per run.
    watch: Vec<Vec<Watched>>,
}

/// What `crisp-grpcgo bench --watch` saw of a process (and its children) in one run.
struct Watched {
    cpu_ticks: u64,
    /// Voluntary and nonvoluntary, summed over its threads.
    switches: u64,
    relists: u64,
    /// VmRSS once the connections were warm.
    rss_kib: u64,
    /// VmHWM at the end of the run.
    peak_kib: u64,
}

impl Watched {
    /// A process's figures in a run's line of `crisp-grpcgo bench` (`"watch": {NAME: ...}`).
    fn of(w: &serde_json::Value) -> Watched {
        let g = |k: &str| w[k].as_u64().unwrap_or(0);
        Watched {
            cpu_ticks: g("cpu_ticks"),
            switches: g("voluntary_cs") + g("nonvoluntary_cs"),
            relists: g("turns"),
            rss_kib: g("rss_kib_before"),
            peak_kib: g("hwm_kib"),
        }
    }
}

fn grpcgo_relist(
    lanes: &[Lane],
    watch: &[(&str, u32)],
    methods: &[(&str, Vec<u8>)],
    extra: &[String],
) -> Result<RelistRuns> {
    let full = |m: &str| format!("/runtime.v1.RuntimeService/{m}");
    let mut cmd = grpcgo_command(lanes, &full(methods[0].0), &methods[0].1)?;
    for (m, req) in &methods[1..] {
        cmd.arg("--also")
            .arg(format!("{}={}", full(m), crisp_e2e::grpcgo::hex(req)));
    }
    // The fake is a hyper server, which rejects grpc-go's default `:authority` (the socket
    // path, KUBELET-CRI §11): the client sends `localhost`, as crictl-like clients do.
    cmd.args(["--authority", "localhost"]);
    for (name, pid) in watch {
        cmd.arg("--watch").arg(format!("{name}={pid}"));
    }
    cmd.args(extra);
    let out = run_grpcgo(cmd, "(relist)")?;
    let mut latency = vec![Vec::new(); methods.len() + 1];
    let mut watched: Vec<Vec<Watched>> = watch.iter().map(|_| Vec::new()).collect();
    for line in out.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("crisp-grpcgo bench printed {line:?}"))?;
        for (k, per_run) in latency.iter_mut().enumerate() {
            // One method: crisp-grpcgo prints its figures (the turn's too) as "latency".
            let table = match methods.get(k) {
                _ if methods.len() == 1 => &v["latency"],
                Some((m, _)) => &v["methods"][full(m)],
                None => &v["turn"],
            };
            let f = |l: &Lane, q: &str| table[l.name][q].as_f64().unwrap_or(f64::NAN);
            per_run.push(
                lanes
                    .iter()
                    .map(|l| (f(l, "p50_us"), f(l, "p99_us")))
                    .collect(),
            );
        }
        for ((name, _), runs) in watch.iter().zip(&mut watched) {
            runs.push(Watched::of(&v["watch"][name]));
        }
    }
    Ok(RelistRuns {
        latency,
        watch: watched,
    })
}

/// The machine a lane ran on, and what it was doing meanwhile: ratios are read against it.
fn machine_line() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("?", |x| x.1.trim())
        .to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{cores} cores, {model}, kernel {}, load average {}",
        kernel.trim(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// (steal, total) jiffies of all CPUs so far.
fn steal_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|v| v.parse().ok())
        .collect();
    (f.get(7).copied().unwrap_or(0), f.iter().sum())
}

/// kubelet's relist at two node sizes (issue #47): direct, socat and crisp interleaved relist by
/// relist, min / median / max over runs; crisp's CPU, context switches and RSS per relist.
async fn relist_report(args: &Args, dir: &Path) -> Result<String> {
    use std::fmt::Write;
    let mut out = String::new();
    let (steal0, total0) = steal_jiffies();
    writeln!(
        out,
        "\n### kubelet's relist (grpc-go 1.33), fake runtime (in-process, canned answers)\n"
    )?;
    writeln!(out, "Machine floor: {}.\n", machine_line())?;
    writeln!(
        out,
        "Lanes: direct; socat (a raw byte splice, 8 KiB reads: the floor every other lane of this report uses); crisp; socat-64k (the same splice reading 64 KiB at a time, as crisp's relay thread does: the floor for a large answer). Ratios are to socat's added latency.\n"
    )?;
    let runs = args.relist_runs.max(1);
    let methods = relist_methods();
    for (pods, containers, calls) in [
        (500, 2_000, args.relist_calls * 3),
        (2_500, 10_000, args.relist_calls),
    ] {
        let canned = Arc::new(Canned::node(pods, containers));
        let (sb_bytes, c_bytes) = (canned.list_sandboxes.len(), canned.list_containers.len());
        let tag = format!("relist-{containers}");
        let upstream = dir.join(format!("{tag}-fake.sock"));
        let _fake = fakert::serve(&upstream, canned)?;
        // A fresh crisp per node size: its peak RSS is this size's. Its RSS as soon as its
        // socket accepts: before crisp has read the node (its recovery at start, which holds
        // most of what its RSS grows by on a big node; BENCHMARKS.md, issue #47).
        let relist = RelistLanes::start(args, &tag, dir, &upstream)?;
        let warmup = (calls / 10).max(3);
        let watched = relist.watched();
        let r = grpcgo_relist(
            &relist.lanes,
            &watched,
            &methods,
            &relist_args(runs, calls, args.relist_pace_ms),
        )?;
        let mib = |b: usize| b as f64 / f64::from(1 << 20);
        writeln!(
            out,
            "#### {pods} pods, {containers} containers: `ListPodSandbox` {:.2} MiB ({} B a pod), then `ListContainers` {:.2} MiB ({} B a container)\n",
            mib(sb_bytes),
            sb_bytes / pods,
            mib(c_bytes),
            c_bytes / containers
        )?;
        writeln!(
            out,
            "{runs} runs of {calls} relists per lane (after {warmup} unmeasured), the lanes interleaved relist by relist in a new random order each round, {} ms pause after each; min / **median** / max over the runs.\n",
            args.relist_pace_ms
        )?;
        relist_latency_tables(&mut out, &relist.lanes, &r)?;
        writeln!(
            out,
            "Per relist (from /proc, the measured relists only: utime+stime in 10 ms ticks; context switches summed over the threads, socat's forked child included; min / **median** / max over the runs):\n"
        )?;
        writeln!(
            out,
            "| process | CPU ms per relist | context switches per relist | RSS KiB |\n|---|---|---|---|"
        )?;
        for ((name, _), w) in watched.iter().zip(&r.watch) {
            let peak = w.iter().map(|x| x.peak_kib).max().unwrap_or(0);
            let rss = if *name == "crisp" {
                format!(
                    "idle {}, warm {}, peak (VmHWM) {peak}",
                    relist.idle_rss,
                    w.first().map_or(0, |x| x.rss_kib),
                )
            } else {
                format!("peak (VmHWM) {peak}")
            };
            relist_process_row(&mut out, name, w, &rss)?;
        }
        writeln!(out)?;
    }
    let (steal1, total1) = steal_jiffies();
    writeln!(
        out,
        "{} % of the CPU time stolen by the host during the relist lane.",
        100 * (steal1 - steal0) / (total1 - total0).max(1)
    )?;
    Ok(out)
}

/// kubelet's relist: ListPodSandbox, then ListContainers, both unfiltered.
fn relist_methods() -> [(&'static str, Vec<u8>); 2] {
    [
        (
            "ListPodSandbox",
            cri::ListPodSandboxRequest::default().encode_to_vec(),
        ),
        (
            "ListContainers",
            cri::ListContainersRequest::default().encode_to_vec(),
        ),
    ]
}

/// `crisp-grpcgo bench` flags for a relist run set: `runs` runs of `count` relists a lane,
/// after a tenth of that (at least 3) unmeasured, `pace_ms` apart.
fn relist_args(runs: usize, count: usize, pace_ms: u64) -> Vec<String> {
    relist_flags(runs, count, (count / 10).max(3), pace_ms)
}

/// `crisp-grpcgo bench` flags: `runs` runs of `count` calls (or relists) a lane after `warmup`
/// unmeasured ones, `pace_ms` apart, each within 60 s.
fn relist_flags(runs: usize, count: usize, warmup: usize, pace_ms: u64) -> Vec<String> {
    let mut flags = run_flags(runs, count, warmup);
    flags.extend(["--pace".into(), format!("{pace_ms}ms")]);
    flags.extend(["--timeout".into(), "60s".into()]);
    flags
}

/// `crisp-grpcgo bench` flags: `runs` runs of `count` calls a lane after `warmup` unmeasured.
fn run_flags(runs: usize, count: usize, warmup: usize) -> Vec<String> {
    let flags = [("--runs", runs), ("--count", count), ("--warmup", warmup)];
    flags
        .iter()
        .flat_map(|(flag, n)| [flag.to_string(), n.to_string()])
        .collect()
}

/// The relist's latency tables: each method's, then the relist's as a whole.
fn relist_latency_tables(out: &mut String, lanes: &[Lane], r: &RelistRuns) -> Result<()> {
    use std::fmt::Write;
    let names = [
        "`ListPodSandbox`",
        "`ListContainers`",
        "the relist (both calls)",
    ];
    for (name, latency) in names.iter().zip(&r.latency) {
        writeln!(out, "{name}:\n")?;
        kubelet_latency_table(out, lanes, latency, true)?;
        writeln!(out)?;
    }
    Ok(())
}

/// `f` of each run of a watched process, per turn of that run (a relist, or a call).
fn per_turn(w: &[Watched], f: fn(&Watched) -> f64) -> Vec<f64> {
    w.iter().map(|x| f(x) / x.relists.max(1) as f64).collect()
}

/// A row of the per-relist table: process `name`'s CPU and context switches per relist over
/// the runs `w`, then `rss`.
fn relist_process_row(out: &mut String, name: &str, w: &[Watched], rss: &str) -> Result<()> {
    use std::fmt::Write;
    writeln!(
        out,
        "| {name} | {} | {} | {rss} |",
        fmt_spread(&per_turn(w, |x| x.cpu_ticks as f64 * 10.0), 2),
        fmt_spread(&per_turn(w, |x| x.switches as f64), 1),
    )?;
    Ok(())
}

/// The relist lanes' processes on `upstream`: socat; socat-64k, a second splice reading 64 KiB
/// at a time (socat reads 8 KiB, crisp's relay thread 64 KiB: on a 15 MB answer that alone
/// makes socat's splice cost more wakeups and system calls than crisp's; this one puts the
/// floor where crisp's transport is); and a fresh crisp.
struct RelistLanes {
    /// direct, socat, crisp, socat-64k.
    lanes: Vec<Lane>,
    socat: Proc,
    splice: Proc,
    crisp: Proc,
    /// When crisp was spawned.
    spawned: Instant,
    /// crisp's VmRSS as soon as its socket accepted.
    idle_rss: u64,
}

impl RelistLanes {
    fn start(args: &Args, tag: &str, dir: &Path, upstream: &Path) -> Result<RelistLanes> {
        let socat_sock = dir.join(format!("{tag}-socat.sock"));
        let socat = start_socat(&socat_sock, upstream)?;
        let splice_sock = dir.join(format!("{tag}-splice64k.sock"));
        let splice = start_socat_with(&splice_sock, upstream, &["-b", "65536"])?;
        let spawned = Instant::now();
        let (crisp, crisp_sock) = start_crisp_own_dir(args, tag, dir, upstream)?;
        let idle_rss = proc_status(crisp.0.id(), "VmRSS:");
        let mut lanes = Lane::direct_socat_crisp(upstream, socat_sock, crisp_sock);
        lanes.push(Lane::new("socat-64k", splice_sock));
        Ok(RelistLanes {
            lanes,
            socat,
            splice,
            crisp,
            spawned,
            idle_rss,
        })
    }

    /// The processes `crisp-grpcgo bench` watches, by name.
    fn watched(&self) -> [(&'static str, u32); 3] {
        [
            ("socat", self.socat.0.id()),
            ("crisp", self.crisp.0.id()),
            ("socat-64k", self.splice.0.id()),
        ]
    }
}

async fn run_lanes(args: &Args, target: &Upstream<'_>, dir: &Path) -> Result<String> {
    let (title, upstream, big_list) = (target.title, target.socket, target.big_list);
    let socat_sock = dir.join(format!("{title}-socat.sock"));
    let crisp_sock = dir.join(format!("{title}-crisp.sock"));
    let _socat = start_socat(&socat_sock, upstream)?;
    let crisp = start_crisp(dir, &crisp_sock, upstream, &args.crisp_config)?;
    let pid = crisp.0.id();
    let idle_rss = proc_status(pid, "VmRSS:");
    let lanes = Lane::direct_socat_crisp(upstream, socat_sock.clone(), crisp_sock.clone());
    let version = frame(
        &cri::VersionRequest {
            version: "v1".into(),
        }
        .encode_to_vec(),
    );
    let vpath = "/runtime.v1.RuntimeService/Version";
    let mut out = String::new();
    use std::fmt::Write;
    writeln!(out, "\n### {title}\n")?;

    if args.runs(Workload::Latency) {
        latency_report(&mut out, args, &lanes, vpath, &version).await?;
    }
    if args.runs(Workload::Throughput) {
        throughput_report(&mut out, args, &lanes, vpath, &version, pid).await?;
    }
    if args.runs(Workload::Grpcgo) {
        let mut methods = vec![(
            "Version",
            cri::VersionRequest {
                version: "v1".into(),
            }
            .encode_to_vec(),
        )];
        if !big_list {
            // The real runtime: a call that reaches its store too (the fake's list is 6 MiB).
            methods.push((
                "ListContainers",
                cri::ListContainersRequest { filter: None }.encode_to_vec(),
            ));
        }
        // The fake is a hyper server, which rejects grpc-go's default `:authority` (the socket
        // path, KUBELET-CRI §11): the client sends `localhost` there, as crictl-like clients do.
        let authority = big_list.then(|| "localhost".to_string());
        for (m, req) in methods {
            grpcgo_report(&mut out, args, &lanes, m, &req, authority.clone()).await?;
        }
    }
    let load_rss = proc_status(pid, "VmRSS:");

    if big_list && args.runs(Workload::List) {
        let list = frame(&cri::ListContainersRequest { filter: None }.encode_to_vec());
        let lpath = "/runtime.v1.RuntimeService/ListContainers";
        writeln!(
            out,
            "\n`ListContainers` of {} containers (20 calls each, in 4 turns of 5):\n",
            args.containers
        )?;
        writeln!(out, "| lane | p50 ms | response MiB |\n|---|---|---|")?;
        let hwm_before = proc_status(pid, "VmHWM:");
        let mut conns = Vec::new();
        for l in &lanes {
            conns.push(connect(&l.socket).await?);
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); lanes.len()];
        let mut size = 0;
        for _ in 0..4 {
            for (s, v) in conns.iter_mut().zip(&mut times) {
                for _ in 0..5 {
                    let (d, n) = call(s, lpath, &list).await?;
                    v.push(d);
                    size = n;
                }
            }
        }
        for (l, v) in lanes.iter().zip(&mut times) {
            v.sort();
            writeln!(
                out,
                "| {} | {:.2} | {:.2} |",
                l.name,
                pct(v, 0.5).as_secs_f64() * 1e3,
                size as f64 / (1 << 20) as f64
            )?;
        }
        let hwm_after = proc_status(pid, "VmHWM:");
        writeln!(
            out,
            "\ncrisp peak RSS (VmHWM) before the big lists: {} KiB, after: {} KiB (grew {} KiB)",
            hwm_before,
            hwm_after,
            hwm_after.saturating_sub(hwm_before)
        )?;
    }
    if big_list && args.runs(Workload::Events) {
        writeln!(out, "\n`GetContainerEvents` stream of {} messages (median of 5 streams each, lanes taking turns):\n", 10_000)?;
        writeln!(out, "| lane | ms | msgs/s |\n|---|---|---|")?;
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); lanes.len()];
        for _ in 0..5 {
            for (l, v) in lanes.iter().zip(&mut times) {
                v.push(
                    stream_events(&l.socket)
                        .await
                        .with_context(|| format!("GetContainerEvents on the {} lane", l.name))?
                        .0,
                );
            }
        }
        for (l, v) in lanes.iter().zip(&mut times) {
            v.sort();
            let d = pct(v, 0.5);
            writeln!(
                out,
                "| {} | {:.2} | {:.0} |",
                l.name,
                d.as_secs_f64() * 1e3,
                10_000.0 / d.as_secs_f64()
            )?;
        }
    }
    writeln!(
        out,
        "\ncrisp RSS: idle {} KiB, after load {} KiB",
        idle_rss, load_rss
    )?;
    Ok(out)
}

/// Latency at concurrency 1: the lanes take turns (5 rounds), so that a change in the machine's
/// load during the run falls on all three alike.
async fn latency_report(
    out: &mut String,
    args: &Args,
    lanes: &[Lane],
    vpath: &str,
    version: &Bytes,
) -> Result<()> {
    use std::fmt::Write;
    let mut samples = vec![Vec::new(); lanes.len()];
    for _ in 0..5 {
        for (i, l) in lanes.iter().enumerate() {
            samples[i].extend(latency(&l.socket, vpath, version, args.calls / 5).await?);
        }
    }
    let lat: Vec<Latency> = samples
        .iter_mut()
        .map(|v| {
            v.sort();
            Latency {
                p50: pct(v, 0.5),
                p99: pct(v, 0.99),
            }
        })
        .collect();
    writeln!(
        out,
        "Unary `Version`, concurrency 1, {} calls:\n",
        args.calls
    )?;
    writeln!(
        out,
        "| lane | p50 µs | p99 µs | added p50 µs | added p99 µs |\n|---|---|---|---|---|"
    )?;
    for (l, r) in lanes.iter().zip(&lat) {
        writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            l.name,
            us(r.p50),
            us(r.p99),
            us(r.p50) - us(lat[0].p50),
            us(r.p99) - us(lat[0].p99)
        )?;
    }
    let socat_add50 = us(lat[1].p50) - us(lat[0].p50);
    let crisp_add50 = us(lat[2].p50) - us(lat[0].p50);
    let socat_add99 = us(lat[1].p99) - us(lat[0].p99);
    let crisp_add99 = us(lat[2].p99) - us(lat[0].p99);
    writeln!(
        out,
        "\ncrisp's added latency / socat's: **p50 {}** (target ≤ 1.5×), **p99 {}** (target ≤ 2×)\n",
        added_ratio(crisp_add50, socat_add50),
        added_ratio(crisp_add99, socat_add99)
    )?;
    Ok(())
}

/// Latency at concurrency 1 from kubelet's own gRPC client: `crisp-grpcgo call` (grpc-go 1.33,
/// dialing like kubelet) makes `--calls` sequential calls of `method` per lane, in 5 rounds in
/// which the lanes take turns, each round on a fresh connection after a warm-up.
async fn grpcgo_report(
    out: &mut String,
    args: &Args,
    lanes: &[Lane],
    method: &str,
    req: &[u8],
    authority: Option<String>,
) -> Result<()> {
    use crisp_e2e::grpcgo::{self, CallOpts};
    use std::fmt::Write;
    let path = format!("/runtime.v1.RuntimeService/{method}");
    let per_round = (args.calls / 5).max(1);
    let size = grpcgo::call(
        &lanes[0].socket,
        &path,
        req,
        CallOpts {
            authority: authority.clone(),
            ..Default::default()
        },
    )
    .await?
    .calls
    .first()
    .map_or(0, |c| c.response_hex.len() / 2);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); lanes.len()];
    for _ in 0..5 {
        for (i, l) in lanes.iter().enumerate() {
            let o = grpcgo::call(
                &l.socket,
                &path,
                req,
                CallOpts {
                    authority: authority.clone(),
                    count: per_round,
                    warmup: (per_round / 10).max(10),
                    latencies: true,
                    ..Default::default()
                },
            )
            .await?;
            if o.summary.failed > 0 {
                bail!(
                    "crisp-grpcgo call {method} on the {} lane: {} failed, first: {:?}",
                    l.name,
                    o.summary.failed,
                    o.summary.first_error
                );
            }
            samples[i].extend(o.summary.latencies_us);
        }
    }
    let q: Vec<(f64, f64)> = samples
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            let at = |p: f64| {
                v.get(((v.len() as f64 - 1.0) * p).round() as usize)
                    .copied()
                    .unwrap_or(0.0)
            };
            (at(0.5), at(0.99))
        })
        .collect();
    let sends = authority
        .as_deref()
        .map_or("the socket path".to_string(), |a| format!("`{a}`"));
    writeln!(
        out,
        "\ngrpc-go client (`crisp-grpcgo call`: grpc-go 1.33 dialing like kubelet, `:authority` {sends}): unary `{method}` ({size} B response), concurrency 1, {} calls:\n",
        per_round * 5
    )?;
    writeln!(
        out,
        "| lane | p50 µs | p99 µs | added p50 µs | added p99 µs |\n|---|---|---|---|---|"
    )?;
    for (l, (p50, p99)) in lanes.iter().zip(&q) {
        writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} |",
            l.name,
            p50,
            p99,
            p50 - q[0].0,
            p99 - q[0].1
        )?;
    }
    writeln!(
        out,
        "\ncrisp's added latency / socat's (grpc-go client, `{method}`): **p50 {}**, **p99 {}**",
        added_ratio(q[2].0 - q[0].0, q[1].0 - q[0].0),
        added_ratio(q[2].1 - q[0].1, q[1].1 - q[0].1)
    )?;
    Ok(())
}

/// crisp's added latency over socat's, in words when either is within noise: a ratio to an
/// added latency of a few µs, or of a negative one (the lane beat direct), says nothing.
fn added_ratio(crisp: f64, socat: f64) -> String {
    if socat < 5.0 {
        format!("n/a (socat adds {socat:.1} µs: noise)")
    } else if crisp <= 0.0 {
        format!("≤ 0× (crisp adds {crisp:.1} µs: noise)")
    } else {
        format!("{:.2}×", crisp / socat)
    }
}

/// Throughput at `--concurrency`: `--rounds` rounds in which the lanes take turns; each lane's
/// figure is its calls over its time in all rounds, with the spread of its rounds.
async fn throughput_report(
    out: &mut String,
    args: &Args,
    lanes: &[Lane],
    vpath: &str,
    version: &Bytes,
    pid: u32,
) -> Result<()> {
    use std::fmt::Write;
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); lanes.len()];
    let mut crisp_ticks = 0;
    for _ in 0..args.rounds.max(1) {
        for (i, l) in lanes.iter().enumerate() {
            let t0 = cpu_ticks(pid);
            rates[i]
                .push(throughput(&l.socket, vpath, version, args.concurrency, args.seconds).await?);
            if l.name == "crisp" {
                crisp_ticks += cpu_ticks(pid) - t0;
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let direct = mean(&rates[0]);
    let crisp_calls: f64 = rates[2].iter().map(|r| r * args.seconds as f64).sum();
    // USER_HZ = 100 on Linux: a tick is 10 ms.
    writeln!(
        out,
        "crisp CPU during its throughput runs: {:.1} ms per 1,000 calls",
        crisp_ticks as f64 * 10.0 / (crisp_calls / 1000.0)
    )?;
    writeln!(
        out,
        "\nUnary `Version`, concurrency {}, {} rounds of {} s (lanes take turns):\n",
        args.concurrency, args.rounds, args.seconds
    )?;
    writeln!(out, "| lane | calls/s | vs direct | vs direct, median of rounds | rounds (calls/s) |\n|---|---|---|---|---|")?;
    for (l, r) in lanes.iter().zip(&rates) {
        let each: Vec<String> = r.iter().map(|x| format!("{x:.0}")).collect();
        let paired = median_ratio(r, &rates[0]);
        writeln!(
            out,
            "| {} | {:.0} | {:.1} % | {:.1} % | {} |",
            l.name,
            mean(r),
            100.0 * mean(r) / direct,
            100.0 * paired,
            each.join(", ")
        )?;
    }
    writeln!(
        out,
        "\ncrisp / socat, median of rounds: {:.1} %",
        100.0 * median_ratio(&rates[2], &rates[1])
    )?;
    Ok(())
}

/// The median over rounds of `a[i] / b[i]`: lanes measured back to back in one round share the
/// machine's load of the moment, which the mean over all rounds does not cancel.
fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    r.sort_by(f64::total_cmp);
    match r.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => r[n / 2],
        n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
    }
}

/// The kubelet mix against its own fake runtime (sized for `--mix-pods`), three lanes.
async fn run_mix(args: &Args, dir: &Path) -> Result<String> {
    use std::fmt::Write;
    let upstream = dir.join("mix-fake.sock");
    let _fake = fakert::serve(&upstream, Arc::new(Canned::new(args.mix_pods * 3, 1)))?;
    let socat_sock = dir.join("mix-socat.sock");
    let crisp_sock = dir.join("mix-crisp.sock");
    let _socat = start_socat(&socat_sock, &upstream)?;
    let crisp = start_crisp(dir, &crisp_sock, &upstream, &args.crisp_config)?;
    let pid = crisp.0.id();
    let lanes = Lane::direct_socat_crisp(&upstream, socat_sock, crisp_sock);
    let mut out = String::new();
    writeln!(
        out,
        "\n### kubelet mix (fake runtime)\n\n{} pods at 10× kubelet's rate for {} s: a relist and a pod sync every 100 ms, 20 pods a second started and stopped (220 mutating calls/s, all inspected by the ordering engine):\n",
        args.mix_pods, args.mix_seconds
    )?;
    writeln!(out, "| lane | List* p50 / p99 ms | *Status p50 / p99 µs | mutating p50 / p99 µs |\n|---|---|---|---|")?;
    for l in &lanes {
        let t0 = cpu_ticks(pid);
        let [lists, statuses, muts] = kubelet_mix(&l.socket, args.mix_seconds).await?;
        writeln!(
            out,
            "| {} | {:.2} / {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
            l.name,
            pct(&lists, 0.5).as_secs_f64() * 1e3,
            pct(&lists, 0.99).as_secs_f64() * 1e3,
            us(pct(&statuses, 0.5)),
            us(pct(&statuses, 0.99)),
            us(pct(&muts, 0.5)),
            us(pct(&muts, 0.99))
        )?;
        if l.name == "crisp" {
            let ms = (cpu_ticks(pid) - t0) as f64 * 10.0;
            writeln!(
                out,
                "\ncrisp CPU during its mix run: {:.1} ms per second; RSS after: {} KiB",
                ms / args.mix_seconds as f64,
                proc_status(pid, "VmRSS:")
            )?;
        }
    }
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(sock) = &args.drive {
        let version = frame(
            &cri::VersionRequest {
                version: "v1".into(),
            }
            .encode_to_vec(),
        );
        let vpath = "/runtime.v1.RuntimeService/Version";
        if args.runs(Workload::Latency) {
            let mut l = latency(sock, vpath, &version, args.calls).await?;
            l.sort();
            println!(
                "{} calls: p50 {:.1} µs p99 {:.1} µs",
                args.calls,
                us(pct(&l, 0.5)),
                us(pct(&l, 0.99))
            );
        }
        if args.runs(Workload::Throughput) {
            let r = throughput(sock, vpath, &version, args.concurrency, args.seconds).await?;
            println!(
                "concurrency {}, {} s: {r:.0} calls/s",
                args.concurrency, args.seconds
            );
        }
        return Ok(());
    }
    if args.drive.is_none() && std::env::var_os("CRISP_BENCH_FAKE_ONLY").is_some() {
        let dir = tempfile::Builder::new().prefix("crisp-fake-").tempdir()?;
        let sock = dir.path().join("fake.sock");
        let _fake = fakert::serve(&sock, Arc::new(Canned::new(args.containers, 10_000)))?;
        println!("fake runtime on {}", sock.display());
        std::future::pending::<()>().await;
    }
    let dir = tempfile::Builder::new().prefix("crisp-bench-").tempdir()?;
    let mut report = String::new();
    let fake_sock = dir.path().join("fake.sock");
    let _fake = fakert::serve(&fake_sock, Arc::new(Canned::new(args.containers, 10_000)))?;
    // The relist lane runs on the fake runtime only (a real containerd at 500 pods is the next
    // step of issue #47): alone, it needs no containerd.
    let relist_only = !args.only.is_empty()
        && args.only.iter().all(|w| {
            matches!(
                w,
                Workload::Relist | Workload::Burst | Workload::Ownwork | Workload::CtrdRelist
            )
        });
    let ctrd = match args.containerd && !relist_only {
        true => Some(
            crisp_e2e::harness::Containerd::start_async(crisp_e2e::harness::ContainerdOpts {
                cni: false,
            })
            .await?,
        ),
        false => None,
    };
    // kubelet's own client first: the figures the targets are judged by.
    if args.runs(Workload::Kubelet) {
        if let Some(c) = &ctrd {
            let containerd = Upstream::containerd("real containerd 1.6", c);
            report += &kubelet_report(&args, &containerd, dir.path()).await?;
        }
        report += &kubelet_report(&args, &Upstream::fake(&fake_sock), dir.path()).await?;
        let (crisp, before) = (crisp_e2e::crisp::crisp_binary()?, args.before.clone());
        report += &tokio::task::spawn_blocking(move || counted::report(&crisp, before.as_deref()))
            .await??;
    }
    if args.runs(Workload::Relist) {
        report += &relist_report(&args, dir.path()).await?;
    }
    if args.runs(Workload::Burst) {
        report += &burst::report(&args, dir.path()).await?;
    }
    if args.runs(Workload::Ownwork) {
        report += &ownwork::report(&args, dir.path()).await?;
    }
    // Only when asked for: it fills a containerd with hundreds of pods (minutes).
    if args.only.contains(&Workload::CtrdRelist) {
        report += &ctrd_relist::report(&args, dir.path()).await?;
    }
    if !args.only.is_empty()
        && args.only.iter().all(|w| {
            matches!(
                w,
                Workload::Kubelet
                    | Workload::Relist
                    | Workload::Burst
                    | Workload::Ownwork
                    | Workload::CtrdRelist
            )
        })
    {
        println!("{report}");
        return Ok(());
    }
    report += "\n### Secondary lanes (the hyper client; grpc-go per lane in turn)\n";
    report += &run_lanes(&args, &Upstream::fake(&fake_sock), dir.path()).await?;
    if args.runs(Workload::Mix) {
        report += &run_mix(&args, dir.path()).await?;
    }
    if let Some(c) = &ctrd {
        let containerd = Upstream::containerd("real containerd", c);
        report += &run_lanes(&args, &containerd, dir.path()).await?;
    }
    println!("{report}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{added_ratio, median_ratio};

    #[test]
    fn added_ratio_says_noise_instead_of_a_meaningless_ratio() {
        assert_eq!(added_ratio(90.0, 100.0), "0.90×");
        assert_eq!(
            added_ratio(-50.0, 100.0),
            "≤ 0× (crisp adds -50.0 µs: noise)"
        );
        assert_eq!(added_ratio(30.0, -5.0), "n/a (socat adds -5.0 µs: noise)");
    }

    #[test]
    fn median_ratio_pairs_rounds() {
        // Round by round: 0.5, 0.9, 1.0 — not the ratio of the means (1.6/2.6).
        assert_eq!(median_ratio(&[1.0, 0.45, 0.15], &[2.0, 0.5, 0.15]), 0.9);
        assert_eq!(median_ratio(&[1.0, 3.0], &[2.0, 2.0]), 1.0);
        assert!(median_ratio(&[], &[]).is_nan());
    }
}
