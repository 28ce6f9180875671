//! The burst lane (issue #47, "bursts of ordered pods"): `--burst-pods` pods created at once
//! through crisp against the fake runtime, each a sidecar `proxy` with an exec readiness
//! (`crisp.dev/ready.proxy: exec:[...]`, answered by the fake's ExecSync) and an app whose
//! CreateContainer crisp holds until the sidecar is ready, while kubelet's relist (grpc-go,
//! `crisp-grpcgo bench`) runs. Per pod, both read on the fake's own clock, to the instant the
//! app's CreateContainer reaches the fake (it left crisp): from the fake's first ExecSync answered
//! exit 0 (the probe's own success: issue #47's measure, "success → release"), and from the
//! instant the fake started answering "ready" (which adds the wait for a probe turn under the
//! exec budget, "ready → release").

use std::collections::HashMap;
use std::fmt::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use crisp_e2e::fakert::{self, Burst, BurstState, Canned};
use crisp_e2e::raw::frame;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use k8s_cri::v1 as cri;
use prost::Message;

use super::{
    connect, grpcgo_relist, machine_line, relist_flags, relist_methods, start_crisp_own_dir,
    steal_jiffies, Args, Lane, RelistRuns,
};

/// The sidecar's name and its readiness, as a pod's author writes them (docs/ANNOTATIONS.md).
const SIDECAR: &str = "proxy";
const READY: &str = r#"exec:["test","-e","/tmp/ready"]"#;

/// One unary call through `sender`; the answer's message (without its gRPC frame header).
async fn unary(
    sender: &mut SendRequest<Full<Bytes>>,
    method: &str,
    msg: &impl Message,
) -> Result<Bytes> {
    let req = Request::post(format!(
        "http://localhost/runtime.v1.RuntimeService/{method}"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", "120S")
    .body(Full::new(frame(&msg.encode_to_vec())))?;
    let resp = sender.send_request(req).await?;
    let collected = resp.into_body().collect().await?;
    let status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.to_str().unwrap_or("?").to_string());
    if status.as_deref() != Some("0") {
        bail!("{method}: grpc-status {status:?}");
    }
    let bytes = collected.to_bytes();
    Ok(bytes.slice(5.min(bytes.len())..))
}

/// What kubelet sends for one pod, one call at a time: RunPodSandbox, the sidecar's
/// CreateContainer and StartContainer, then the app's CreateContainer (held by crisp). Returns
/// when the app's create was sent.
async fn pod(mut sender: SendRequest<Full<Bytes>>, i: usize) -> Result<Instant> {
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("burst-{i}"),
            uid: format!("{i:032x}"),
            namespace: "burst".into(),
            attempt: 0,
        }),
        annotations: HashMap::from([
            ("crisp.dev/sidecars".to_string(), SIDECAR.to_string()),
            (format!("crisp.dev/ready.{SIDECAR}"), READY.to_string()),
        ]),
        ..Default::default()
    };
    let run = cri::RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: String::new(),
    };
    let sandbox =
        cri::RunPodSandboxResponse::decode(unary(&mut sender, "RunPodSandbox", &run).await?)?
            .pod_sandbox_id;
    let create = |name: &str| cri::CreateContainerRequest {
        pod_sandbox_id: sandbox.clone(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: format!("registry.example.com/{name}:1"),
                ..Default::default()
            }),
            ..Default::default()
        }),
        sandbox_config: Some(config.clone()),
    };
    let sidecar = cri::CreateContainerResponse::decode(
        unary(&mut sender, "CreateContainer", &create(SIDECAR)).await?,
    )?
    .container_id;
    let start = cri::StartContainerRequest {
        container_id: sidecar,
    };
    unary(&mut sender, "StartContainer", &start).await?;
    let sent = Instant::now();
    unary(&mut sender, "CreateContainer", &create("app"))
        .await
        .with_context(|| format!("pod burst-{i}: the app's CreateContainer"))?;
    Ok(sent)
}

/// One run's findings.
pub(super) struct Run {
    /// Per pod, ms from its sidecar's first successful probe (the fake's first ExecSync answered
    /// exit 0) to its app's create reaching the runtime, sorted.
    pub(super) success_ms: Vec<f64>,
    /// Per pod, ms from its sidecar turning ready to its app's create reaching the runtime,
    /// sorted: the wait for a probe turn included.
    pub(super) release_ms: Vec<f64>,
    /// Pods whose app create was sent after the sidecar was ready already (their release is
    /// only crisp's first check, not a hold).
    pub(super) sent_late: usize,
    /// From the first RunPodSandbox sent to the last app create answered.
    pub(super) burst: Duration,
    /// ExecSync calls and the span from the first to the last.
    pub(super) execs: usize,
    pub(super) exec_span: Duration,
    /// Most ExecSync calls in any one second.
    pub(super) exec_peak: usize,
    /// Mean ExecSync calls a pod, before and after its sidecar was ready.
    pub(super) execs_not_ready: f64,
    pub(super) execs_ready: f64,
    /// Per pod, ms from ready to its turn had the exec budget's turns gone to the pods in the
    /// order they turned ready, one every 1 ÷ `exec_probes_per_second` (an oracle: crisp
    /// cannot know when a sidecar will be ready), sorted.
    pub(super) in_order_ms: Vec<f64>,
    /// ExecSyncs answered "not ready" while another pod's sidecar was ready and waited for its
    /// probe: the exec turns an order that knew the ready instants would have given to it.
    pub(super) turns_lost: usize,
    /// Relists (direct, crisp) in the quiet before the burst and during it.
    pub(super) quiet: RelistRuns,
    pub(super) during: RelistRuns,
    /// How long the relist during the burst ran.
    pub(super) relist_span: Duration,
}

/// The waits, sorted, in ms, of pods turning ready at `ready` for one turn each of a budget
/// of `rate` turns a second handed out in the order they turned ready.
fn in_ready_order(mut ready: Vec<Instant>, rate: f64) -> Vec<f64> {
    ready.sort();
    let step = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let mut turn: Option<Instant> = None;
    let mut waits: Vec<f64> = ready
        .iter()
        .map(|r| {
            let t = turn.map_or(*r, |prev| (prev + step).max(*r));
            turn = Some(t);
            ms_between(*r, t)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    waits
}

/// `to − from` in ms, negative when `to` came first.
fn ms_between(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(from.duration_since(to).as_secs_f64() * 1e3),
    }
}

/// The machine's load average (1, 5, 15 min) as /proc/loadavg says it now.
pub(super) fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// "p50 / p90 / p99 / max" of a sorted sample, in whole ms.
fn dist(sorted: &[f64]) -> String {
    format!(
        "{:.0} / {:.0} / {:.0} / {:.0}",
        pct(sorted, 0.5),
        pct(sorted, 0.9),
        pct(sorted, 0.99),
        pct(sorted, 1.0)
    )
}

pub(super) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub(super) async fn run(args: &Args, dir: &Path, k: usize) -> Result<Run> {
    let burst = Arc::new(Burst::new(
        SIDECAR,
        Duration::from_millis(args.burst_ready_ms),
        Duration::from_millis(100),
    ));
    // The node the relist reads: the relist lane's small node (500 pods, 2,000 containers)
    // unless `--burst-node-pods` says otherwise.
    let node_pods = args.burst_node_pods;
    let mut canned = Canned::node(node_pods, 4 * node_pods);
    canned.burst = Some(burst.clone());
    let canned = Arc::new(canned);
    let tag = format!("burst-{k}");
    let upstream = dir.join(format!("{tag}-fake.sock"));
    let _fake = fakert::serve(&upstream, canned.clone())?;
    let (_crisp, crisp_sock) = start_crisp_own_dir(args, &tag, dir, &upstream)?;
    // crisp reads the node when it starts (its recovery: a PodSandboxStatus per sandbox): let
    // that end before measuring.
    let recovered = Instant::now();
    while canned.calls.get("PodSandboxStatus") < node_pods as u64 {
        if recovered.elapsed() > Duration::from_secs(120) {
            bail!("crisp's recovery did not read the node's {node_pods} sandboxes in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lanes = vec![
        Lane::new("direct", upstream.clone()),
        Lane::new("crisp", crisp_sock.clone()),
    ];
    let relist = RelistArgs {
        pace: args.burst_relist_pace_ms,
        count: args.burst_relists,
    };
    let quiet = tokio::task::block_in_place(|| relist.run(&lanes))?;
    let relists = {
        let lanes = lanes.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = relist.run(&lanes);
            (r, t.elapsed())
        })
    };
    // The relist's warm-up (3 relists a lane) first: the burst falls on measured relists.
    tokio::time::sleep(Duration::from_millis(
        3 * 2 * (20 + args.burst_relist_pace_ms),
    ))
    .await;
    // kubelet's one connection to the runtime, as it has.
    let sender = connect(&crisp_sock).await?;
    let t0 = Instant::now();
    let pods: Vec<_> = (0..args.burst_pods)
        .map(|i| tokio::spawn(pod(sender.clone(), i)))
        .collect();
    let mut sent = Vec::with_capacity(pods.len());
    for p in pods {
        sent.push(p.await??);
    }
    let burst_took = t0.elapsed();
    let (during, relist_span) = match relists.join() {
        Ok((r, span)) => (r?, span),
        Err(_) => bail!("the relist thread panicked"),
    };
    let seen: BurstState = burst.seen();
    let mut release_ms = Vec::new();
    let mut success_ms = Vec::new();
    let mut sent_late = 0;
    for (i, p) in seen.pods.iter().enumerate() {
        let (Some(ready), Some(success), Some(created)) =
            (p.ready_at, p.first_success, p.app_created)
        else {
            bail!("pod burst-{i}: the runtime saw no ready instant, no successful probe or no app create");
        };
        if sent.get(i).is_some_and(|s| *s >= ready) {
            sent_late += 1;
        }
        release_ms.push(ms_between(ready, created));
        success_ms.push(ms_between(success, created));
    }
    release_ms.sort_by(f64::total_cmp);
    success_ms.sort_by(f64::total_cmp);
    let execs = &seen.execs;
    let exec_span = match (execs.first(), execs.last()) {
        (Some(a), Some(b)) => b.duration_since(*a),
        _ => Duration::ZERO,
    };
    let mut exec_peak = 0;
    let mut lo = 0;
    for (hi, t) in execs.iter().enumerate() {
        while t.duration_since(execs[lo]) >= Duration::from_secs(1) {
            lo += 1;
        }
        exec_peak = exec_peak.max(hi + 1 - lo);
    }
    let waiting_ready = |t: &Instant| {
        seen.pods
            .iter()
            .any(|p| p.ready_at.is_some_and(|r| r <= *t) && p.first_success.is_some_and(|s| *t < s))
    };
    let in_order_ms = in_ready_order(
        seen.pods.iter().filter_map(|p| p.ready_at).collect(),
        exec_probes_per_second(&args.crisp_config),
    );
    let turns_lost = seen
        .not_ready_execs
        .iter()
        .filter(|t| waiting_ready(t))
        .count();
    let n = seen.pods.len().max(1) as f64;
    Ok(Run {
        success_ms,
        release_ms,
        sent_late,
        burst: burst_took,
        execs: execs.len(),
        exec_span,
        exec_peak,
        execs_not_ready: seen
            .pods
            .iter()
            .map(|p| f64::from(p.execs_not_ready))
            .sum::<f64>()
            / n,
        execs_ready: seen
            .pods
            .iter()
            .map(|p| f64::from(p.execs_ready))
            .sum::<f64>()
            / n,
        in_order_ms,
        turns_lost,
        quiet,
        during,
        relist_span,
    })
}

/// The relist's settings, owned, for its own thread.
struct RelistArgs {
    pace: u64,
    count: usize,
}

impl RelistArgs {
    fn run(&self, lanes: &[Lane]) -> Result<RelistRuns> {
        grpcgo_relist(
            lanes,
            &[],
            &relist_methods(),
            &relist_flags(1, self.count, 3, self.pace),
        )
    }
}

/// The value of `key` in `--crisp-config`, if it sets one (quotes trimmed).
fn setting<'c>(crisp_config: &'c str, key: &str) -> Option<&'c str> {
    crisp_config
        .lines()
        .filter_map(|l| l.trim().strip_prefix(key))
        .filter_map(|rest| rest.trim_start().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"'))
        .next()
}

/// crisp's `[ordering] probe_interval`: from `--crisp-config` when it sets one, else crisp's
/// default (`src/config.rs`).
pub(super) fn probe_interval(crisp_config: &str) -> Duration {
    setting(crisp_config, "probe_interval")
        .and_then(|v| humantime::parse_duration(v).ok())
        .unwrap_or(Duration::from_millis(50))
}

/// crisp's `[ordering] exec_probes_per_second`: from `--crisp-config` when it sets one, else
/// crisp's default (`src/config.rs`).
pub(super) fn exec_probes_per_second(crisp_config: &str) -> f64 {
    setting(crisp_config, "exec_probes_per_second")
        .and_then(|v| v.parse().ok())
        .unwrap_or(50.0)
}

/// The whole relist's (p50, p99) in ms of lane `i` of a one-run relist.
pub(super) fn relist_ms(r: &RelistRuns, i: usize) -> (f64, f64) {
    let whole = r.latency.last().and_then(|runs| runs.first());
    whole.map_or((f64::NAN, f64::NAN), |lanes| {
        (lanes[i].0 / 1e3, lanes[i].1 / 1e3)
    })
}

pub(super) async fn report(args: &Args, dir: &Path) -> Result<String> {
    let mut out = String::new();
    let (steal0, total0) = steal_jiffies();
    let interval = probe_interval(&args.crisp_config);
    let interval_ms = interval.as_secs_f64() * 1e3;
    writeln!(
        out,
        "\n### A burst of {} ordered pods during kubelet's relist, fake runtime (in-process)\n",
        args.burst_pods
    )?;
    writeln!(out, "Machine: {}.\n", machine_line())?;
    writeln!(
        out,
        "Each pod: RunPodSandbox, the sidecar `{SIDECAR}`'s CreateContainer and StartContainer, then the app's CreateContainer, one call at a time, all pods at once on one HTTP/2 connection to crisp (the bench's hyper client). `crisp.dev/ready.{SIDECAR}: {READY}`: the fake runtime answers that ExecSync exit 1 until {} ms + (pod mod 10) × 10 ms after the sidecar's StartContainer reached it, exit 0 from then on. Per pod, to the app's CreateContainer reaching the fake: **success → release** from the fake's first ExecSync answered exit 0 (the probe's own success, issue #47's measure); **ready → release** from the instant the fake started answering exit 0 (the wait for a probe turn included). crisp's settings: its defaults unless `--crisp-config` says otherwise (`{}`): `probe_interval` {interval_ms:.0} ms, reads 100/s (16 in flight), exec probes 50/s node-wide, 4 in flight, 20/s a pod. kubelet's relist (grpc-go, ListPodSandbox then ListContainers over a node of {} pods / {} containers, direct and crisp interleaved, {} ms pause after each): {} relists a lane in the quiet before the burst, {} from the burst's start.\n",
        args.burst_ready_ms,
        args.crisp_config.replace('\n', " "),
        args.burst_node_pods,
        4 * args.burst_node_pods,
        args.burst_relist_pace_ms,
        args.burst_relists,
        args.burst_relists,
    )?;
    writeln!(
        out,
        "| run | burst s | success → release p50 / p90 / p99 / max ms | ≤ {interval_ms:.0} ms | ready → release p50 / p90 / p99 / max ms | ≤ {interval_ms:.0} ms | sent after ready | ExecSync: calls, per s (peak 1 s) | per pod not ready / ready | not ready while one ready waited | relist p50 / p99 ms, crisp: quiet → burst (s) | direct: quiet → burst |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    let within = |v: &[f64]| v.iter().filter(|ms| **ms <= interval_ms).count();
    let (mut all, mut all_success, mut loads) = (Vec::new(), Vec::new(), Vec::new());
    let mut in_order = Vec::new();
    for k in 0..args.burst_runs.max(1) {
        let r = run(args, dir, k).await?;
        loads.push(load_average());
        let (cq, cb) = (relist_ms(&r.quiet, 1), relist_ms(&r.during, 1));
        let (dq, db) = (relist_ms(&r.quiet, 0), relist_ms(&r.during, 0));
        writeln!(
            out,
            "| {} | {:.2} | {} | {} of {} | {} | {} of {} | {} | {}, {:.1} ({}) | {:.1} / {:.1} | {} | {:.1} / {:.1} → {:.1} / {:.1} ({:.1}) | {:.1} / {:.1} → {:.1} / {:.1} |",
            k + 1,
            r.burst.as_secs_f64(),
            dist(&r.success_ms),
            within(&r.success_ms),
            r.success_ms.len(),
            dist(&r.release_ms),
            within(&r.release_ms),
            r.release_ms.len(),
            r.sent_late,
            r.execs,
            r.execs as f64 / r.exec_span.as_secs_f64().max(1e-3),
            r.exec_peak,
            r.execs_not_ready,
            r.execs_ready,
            r.turns_lost,
            cq.0,
            cq.1,
            cb.0,
            cb.1,
            r.relist_span.as_secs_f64(),
            dq.0,
            dq.1,
            db.0,
            db.1,
        )?;
        all.extend_from_slice(&r.release_ms);
        all_success.extend_from_slice(&r.success_ms);
        in_order.extend_from_slice(&r.in_order_ms);
    }
    writeln!(
        out,
        "\nLoad average (1 / 5 / 15 min) at the end of each run: {}. Each pod needs one ExecSync that answers exit 0: at `exec_probes_per_second` the last of {} pods gets its turn {:.2} s after the first (the floor of ready → release's max).",
        loads.join("; "),
        args.burst_pods,
        args.burst_pods as f64 / exec_probes_per_second(&args.crisp_config),
    )?;
    all.sort_by(f64::total_cmp);
    all_success.sort_by(f64::total_cmp);
    in_order.sort_by(f64::total_cmp);
    for (name, v) in [
        ("success → release", &all_success),
        ("ready → release", &all),
        (
            "ready → a turn, had the turns gone in ready order (an oracle's bound)",
            &in_order,
        ),
    ] {
        writeln!(
            out,
            "\nAll runs pooled ({} pods), {name}: p50 / p90 / p99 / max {} ms; min {:.0} ms; {} within one probe interval ({interval_ms:.0} ms).",
            v.len(),
            dist(v),
            pct(v, 0.0),
            within(v),
        )?;
    }
    let (steal1, total1) = steal_jiffies();
    writeln!(
        out,
        "{} % of the CPU time stolen by the host during the burst lane.",
        100 * (steal1 - steal0) / (total1 - total0).max(1)
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle's turns: one every 1 ÷ rate, in ready order, never before a pod is ready.
    #[test]
    fn turns_in_ready_order_wait_only_for_the_rate() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let ready = vec![t + ms(30), t, t + ms(5), t + ms(100)];
        let waits: Vec<f64> = in_ready_order(ready, 50.0)
            .iter()
            .map(|w| w.round())
            .collect();
        // Turns at t, t+20 (5 ms late: 15), t+40 (30: 10), t+100 (100: 0).
        assert_eq!(waits, [0.0, 0.0, 10.0, 15.0]);
    }

    /// The release column counts against the interval crisp runs with, not always the default.
    #[test]
    fn the_probe_interval_is_read_from_the_extra_config() {
        assert_eq!(probe_interval(""), Duration::from_millis(50));
        let cfg = "[ordering]\nexec_probes_per_second = 100\nprobe_interval = \"200ms\"";
        assert_eq!(probe_interval(cfg), Duration::from_millis(200));
        assert_eq!(
            probe_interval("probe_interval_x = 1"),
            Duration::from_millis(50)
        );
        assert_eq!(exec_probes_per_second(""), 50.0);
        assert_eq!(exec_probes_per_second(cfg), 100.0);
        let per_pod = "exec_probes_per_pod_per_second = 7";
        assert_eq!(exec_probes_per_second(per_pod), 50.0);
    }
}
