//! The ownwork lane (issue #47, "where crisp's own work grows with the node"): what crisp spends
//! of its own on a node of 500 pods / 2,000 containers and of 2,500 pods / 10,000 containers
//! (the relist lane's fake, whose PodSandboxStatus answers each sandbox with its own Istio
//! annotations, so crisp's recovery finds a sidecar in every pod):
//!
//! - its recovery at start (`Engine::recover_in_background`: ListPodSandbox, then a
//!   PodSandboxStatus per sandbox; with Job-mode marks on disk also the prune's list of every
//!   container): time from the spawn to the last status read, CPU, RSS;
//! - Job mode's status check: ContainerStatus and PodSandboxStatus through a crisp holding
//!   marks (every status call diverted, its response collected only when it is about a marked
//!   container or sandbox) beside one holding none and the direct socket;
//! - `crisp tap --json --all` attached while kubelet's client relists: crisp's CPU per relist
//!   and the relist's latency beside an identical crisp without a tap;
//! - `crisp pods`: answer time and size, all pods and one pod.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crisp_e2e::fakert::{self, Canned};
use crisp_e2e::raw::frame;
use k8s_cri::v1 as cri;
use prost::Message;

use super::{
    cpu_ticks, fmt_spread, grpcgo_relist, latency, machine_line, per_turn, proc_status,
    relist_args, relist_methods, spread, start_crisp_bin, steal_jiffies, Args, Lane, Proc,
    RelistRuns,
};

/// Job-mode marks put in the marked crisp's state directory: one Job pod in ten, its sidecar.
const MARKED_EVERY: usize = 10;

/// The node's container ids and sandbox ids, as `Canned::node` numbers them.
fn container_id(i: usize) -> String {
    format!("{i:064x}")
}

fn sandbox_id(pod: usize) -> String {
    format!("{:064x}", pod + 1_000_000)
}

/// Polls `done` every 5 ms until it holds; how long that took, or an error after `limit`.
fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Result<Duration> {
    let t = Instant::now();
    while !done() {
        if t.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(t.elapsed())
}

/// crisp's CPU ticks once they stop moving (three 100 ms samples alike, 10 s at most): its
/// work at start is done.
pub(super) fn settled_cpu(pid: u32) -> u64 {
    let mut last = cpu_ticks(pid);
    let mut same = 0;
    let t = Instant::now();
    while same < 3 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        let now = cpu_ticks(pid);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// One crisp started on the node, its recovery waited for.
pub(super) struct Started {
    pub(super) proc: Proc,
    socket: PathBuf,
    pub(super) admin: PathBuf,
    /// From the spawn to the fake's last PodSandboxStatus (and, with marks, its list of every
    /// container) of the recovery.
    pub(super) recovered: Duration,
    pub(super) cpu_ms: f64,
    idle_rss: u64,
    rss: u64,
}

pub(super) fn start(
    canned: &Canned,
    pods: usize,
    name: &str,
    dir: &Path,
    upstream: &Path,
    marks: bool,
    extra: &str,
) -> Result<Started> {
    let own = dir.join(name);
    std::fs::create_dir_all(&own)?;
    let socket = own.join("crisp.sock");
    if marks {
        let terminated = dir.join(format!("{name}-state")).join("terminated");
        std::fs::create_dir_all(&terminated)?;
        for pod in (0..pods).step_by(MARKED_EVERY) {
            // The pod's second container: its istio-proxy (`Canned::node`).
            std::fs::write(terminated.join(container_id(pod * 4 + 1)), sandbox_id(pod))?;
        }
    }
    let (statuses, lists) = (
        canned.calls.get("PodSandboxStatus"),
        canned.calls.get("StreamContainers") + canned.calls.get("ListContainers"),
    );
    let t0 = Instant::now();
    let bin = crisp_e2e::crisp::crisp_binary()?;
    let proc = start_crisp_bin(&bin, name, dir, &socket, upstream, extra, &[])?;
    let pid = proc.0.id();
    let idle_rss = proc_status(pid, "VmRSS:");
    wait_for(Duration::from_secs(120), "crisp's recovery", || {
        canned.calls.get("PodSandboxStatus") - statuses >= pods as u64
            && (!marks
                || canned.calls.get("StreamContainers") + canned.calls.get("ListContainers")
                    > lists)
    })?;
    let recovered = t0.elapsed();
    let cpu_ms = settled_cpu(pid) as f64 * 10.0;
    Ok(Started {
        socket,
        admin: own.join("admin.sock"),
        recovered,
        cpu_ms,
        idle_rss,
        rss: proc_status(pid, "VmRSS:"),
        proc,
    })
}

/// `crisp pods --json [pod]` against `admin`: the time it took, the bytes printed, the pods.
pub(super) fn crisp_pods(admin: &Path, pod: Option<&str>) -> Result<(Duration, usize, usize)> {
    let bin = crisp_e2e::crisp::crisp_binary()?;
    let mut cmd = Command::new(bin);
    cmd.args(["pods", "--json", "--admin-socket"]).arg(admin);
    cmd.args(pod);
    let t = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("crisp pods")?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("crisp pods failed ({})", out.status);
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("crisp pods --json")?;
    let n = v["pods"].as_array().map_or(0, Vec::len);
    Ok((took, out.stdout.len(), n))
}

/// Added p50 and p99 (ms) of lane `i` over lane 0, per run, of method `k` of `r`.
fn added_ms(r: &RelistRuns, k: usize, i: usize) -> (Vec<f64>, Vec<f64>) {
    r.latency[k]
        .iter()
        .map(|lanes| {
            (
                (lanes[i].0 - lanes[0].0) / 1e3,
                (lanes[i].1 - lanes[0].1) / 1e3,
            )
        })
        .unzip()
}

fn mid(v: &[f64]) -> f64 {
    spread(v).1
}

pub(super) async fn report(args: &Args, dir: &Path) -> Result<String> {
    tokio::task::block_in_place(|| report_blocking(args, dir))
}

fn report_blocking(args: &Args, dir: &Path) -> Result<String> {
    use std::fmt::Write;
    let mut out = String::new();
    let (steal0, total0) = steal_jiffies();
    writeln!(
        out,
        "\n### crisp's own work at a node's size (issue #47), fake runtime\n"
    )?;
    writeln!(out, "Machine: {}.\n", machine_line())?;
    let runs = args.relist_runs.max(1);
    for (pods, containers, relists) in [(500, 2_000, 100), (2_500, 10_000, 40)] {
        let canned = Arc::new(Canned::node(pods, containers));
        let upstream = dir.join(format!("own-{pods}-fake.sock"));
        let _fake = fakert::serve(&upstream, canned.clone())?;
        writeln!(out, "#### {pods} pods, {containers} containers\n")?;

        // (a) Recovery at start, `runs` times each without and with Job-mode marks.
        let (mut plain, mut marked) = (Vec::new(), Vec::new());
        for k in 0..runs {
            for marks in [false, true] {
                let name = format!("own-{pods}-{}-{k}", if marks { "marks" } else { "plain" });
                let s = start(
                    &canned,
                    pods,
                    &name,
                    dir,
                    &upstream,
                    marks,
                    &args.crisp_config,
                )?;
                if marks { &mut marked } else { &mut plain }.push(s);
            }
            // Keep the last run's crisps for the lanes below; end the others now.
            if k + 1 < runs {
                for s in plain.iter_mut().chain(marked.iter_mut()) {
                    let _ = s.proc.0.kill();
                    let _ = s.proc.0.wait();
                }
            }
        }
        writeln!(
            out,
            "Recovery at start ({runs} runs each; min / **median** / max): from spawning crisp to the fake's last PodSandboxStatus of it (with marks: and its list of every container), crisp's CPU until it went quiet, its RSS as its socket first accepted and after.\n"
        )?;
        writeln!(
            out,
            "| crisp | recovery ms | CPU ms | RSS KiB at accept | RSS KiB after |\n|---|---|---|---|---|"
        )?;
        for (label, set) in [
            ("no marks", &plain),
            (
                &*format!("{} Job-mode marks", pods.div_ceil(MARKED_EVERY)),
                &marked,
            ),
        ] {
            let f = |g: fn(&Started) -> f64| set.iter().map(g).collect::<Vec<_>>();
            writeln!(
                out,
                "| {label} | {} | {} | {} | {} |",
                fmt_spread(&f(|s| s.recovered.as_secs_f64() * 1e3), 0),
                fmt_spread(&f(|s| s.cpu_ms), 0),
                fmt_spread(&f(|s| s.idle_rss as f64), 0),
                fmt_spread(&f(|s| s.rss as f64), 0),
            )?;
        }
        writeln!(out)?;
        let (crisp, marks) = (plain.pop().unwrap(), marked.pop().unwrap());
        drop(plain);
        drop(marked);

        // (c) Job mode's status check.
        let lanes = [
            Lane::new("direct", upstream.clone()),
            Lane::new("crisp", crisp.socket.clone()),
            Lane::new("crisp-marks", marks.socket.clone()),
        ];
        writeln!(
            out,
            "Job mode's status check: kubelet's client (grpc-go), {runs} runs of 1,000 calls a lane interleaved; added p50 / p99 µs over direct (median of the runs), CPU µs a call (median):\n"
        )?;
        writeln!(
            out,
            "| call | direct p50 µs | crisp: added p50 / p99, CPU | crisp with marks: added p50 / p99, CPU |\n|---|---|---|---|"
        )?;
        let unmarked = container_id(2); // pod 0's app
        let calls = [
            (
                "ContainerStatus, a container not marked",
                "ContainerStatus",
                cri::ContainerStatusRequest {
                    container_id: unmarked,
                    verbose: false,
                }
                .encode_to_vec(),
            ),
            (
                "ContainerStatus, a marked container",
                "ContainerStatus",
                cri::ContainerStatusRequest {
                    container_id: container_id(1),
                    verbose: false,
                }
                .encode_to_vec(),
            ),
            (
                "PodSandboxStatus, a sandbox without marks",
                "PodSandboxStatus",
                cri::PodSandboxStatusRequest {
                    pod_sandbox_id: sandbox_id(1),
                    verbose: false,
                }
                .encode_to_vec(),
            ),
            (
                "PodSandboxStatus, a sandbox with a mark",
                "PodSandboxStatus",
                cri::PodSandboxStatusRequest {
                    pod_sandbox_id: sandbox_id(0),
                    verbose: false,
                }
                .encode_to_vec(),
            ),
        ];
        let watched = [
            ("crisp", crisp.proc.0.id()),
            ("crisp-marks", marks.proc.0.id()),
        ];
        for (label, method, req) in calls {
            let r = grpcgo_relist(
                &lanes,
                &watched,
                &[(method, req)],
                &relist_args(runs, 1_000, 0),
            )?;
            let cpu_us = |w: usize| {
                mid(&r.watch[w]
                    .iter()
                    .map(|x| x.cpu_ticks as f64 * 1e4 / x.relists.max(1) as f64)
                    .collect::<Vec<_>>())
            };
            // One method: its figures are the turn's (the last table of `r`).
            let k = r.latency.len() - 1;
            let direct = mid(&r.latency[k].iter().map(|l| l[0].0).collect::<Vec<_>>());
            let (c50, c99) = added_ms(&r, k, 1);
            let (m50, m99) = added_ms(&r, k, 2);
            writeln!(
                out,
                "| {label} | {direct:.0} | {:.0} / {:.0}, {:.0} | {:.0} / {:.0}, {:.0} |",
                mid(&c50) * 1e3,
                mid(&c99) * 1e3,
                cpu_us(0),
                mid(&m50) * 1e3,
                mid(&m99) * 1e3,
                cpu_us(1),
            )?;
        }
        writeln!(out)?;
        drop(marks);

        // (d) The tap with --all, attached to a second crisp like the first.
        let tapped = start(
            &canned,
            pods,
            &format!("own-{pods}-tapped"),
            dir,
            &upstream,
            false,
            &args.crisp_config,
        )?;
        let tap_out = dir.join(format!("own-{pods}-tap.jsonl"));
        let tap = Proc(
            Command::new(crisp_e2e::crisp::crisp_binary()?)
                .args(["tap", "--json", "--all", "--admin-socket"])
                .arg(&tapped.admin)
                .stdout(std::fs::File::create(&tap_out)?)
                .stderr(Stdio::inherit())
                .spawn()
                .context("crisp tap")?,
        );
        // Attached once it has shown a call: Versions through the tapped crisp until it has.
        let version = frame(
            &cri::VersionRequest {
                version: "v1".into(),
            }
            .encode_to_vec(),
        );
        let handle = tokio::runtime::Handle::current();
        wait_for(Duration::from_secs(20), "the tap's first line", || {
            let path = "/runtime.v1.RuntimeService/Version";
            let _ = handle.block_on(latency(&tapped.socket, path, &version, 1));
            std::fs::metadata(&tap_out).is_ok_and(|m| m.len() > 0)
        })?;
        let lanes = [
            Lane::new("direct", upstream.clone()),
            Lane::new("crisp", crisp.socket.clone()),
            Lane::new("crisp-tapped", tapped.socket.clone()),
        ];
        let methods = relist_methods();
        let watched = [
            ("crisp", crisp.proc.0.id()),
            ("crisp-tapped", tapped.proc.0.id()),
            ("tap", tap.0.id()),
        ];
        let r = grpcgo_relist(
            &lanes,
            &watched,
            &methods,
            &relist_args(runs, relists, args.relist_pace_ms),
        )?;
        let lines = std::fs::read_to_string(&tap_out)?.lines().count();
        writeln!(
            out,
            "`crisp tap --json --all` attached to one of two crisps while kubelet's client relists ({runs} runs of {relists} relists a lane, interleaved; median of the runs; the tap printed {lines} lines):\n"
        )?;
        writeln!(
            out,
            "| | relist added p50 / p99 ms | CPU ms per relist | context switches per relist | RSS KiB (peak) |\n|---|---|---|---|---|"
        )?;
        // The relist's added p50 / p99 cell of crisp's lane `i` (the tap process has none).
        let added = |i: usize| {
            let (p50, p99) = added_ms(&r, 2, i);
            format!(" {:.2} / {:.2} ", mid(&p50), mid(&p99))
        };
        let rows = [
            ("crisp", added(1)),
            ("crisp with the tap", added(2)),
            ("the tap process", " ".to_string()),
        ];
        for (w, (label, added)) in rows.iter().enumerate() {
            let watch = &r.watch[w];
            writeln!(
                out,
                "| {label} |{added}| {:.2} | {:.0} | {} |",
                mid(&per_turn(watch, |x| x.cpu_ticks as f64 * 10.0)),
                mid(&per_turn(watch, |x| x.switches as f64)),
                watch.iter().map(|x| x.peak_kib).max().unwrap_or(0)
            )?;
        }
        writeln!(out)?;
        drop(tap);
        drop(tapped);

        // (e) `crisp pods`.
        writeln!(
            out,
            "`crisp pods --json` (crisp's defaults: each pod's containers read under `runtime_reads_per_second`):\n"
        )?;
        writeln!(
            out,
            "| asked for | answer s | bytes | pods shown |\n|---|---|---|---|"
        )?;
        for k in 0..2 {
            let (took, bytes, n) = crisp_pods(&crisp.admin, None)?;
            writeln!(
                out,
                "| every pod (run {}) | {:.2} | {bytes} | {n} |",
                k + 1,
                took.as_secs_f64()
            )?;
        }
        let (took, bytes, n) = crisp_pods(&crisp.admin, Some("checkout-api-7f9c8d6b0-00000"))?;
        writeln!(
            out,
            "| one pod | {:.2} | {bytes} | {n} |\n",
            took.as_secs_f64()
        )?;
        writeln!(
            out,
            "crisp's RSS at the end: {} KiB (VmHWM {} KiB).\n",
            proc_status(crisp.proc.0.id(), "VmRSS:"),
            proc_status(crisp.proc.0.id(), "VmHWM:")
        )?;
    }
    let (steal1, total1) = steal_jiffies();
    writeln!(
        out,
        "{} % of the CPU time stolen by the host during the lane.",
        100 * (steal1 - steal0) / (total1 - total0).max(1)
    )?;
    Ok(out)
}
