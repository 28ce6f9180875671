//! Issue #33, the exec flood: what an operator's `crisp tap --full --json --all` costs while a
//! tenant's exec probe prints 8 MB to stdout and 8 MB to stderr every second — through real
//! containerd and kubelet's own client (the emulator's calls go through the grpc-go bridge).
//! Measured: crisp's peak RSS growth and CPU over the flood, and an ordinary pod's start (its
//! sidecar first) beside it, against the same start on the quiet node (best of 3 each).
//!
//! Before the tap streamed answers (fdbfd10), a real kubelet 1.26 run of the same flood grew
//! crisp's peak RSS by 590 MiB. The bound here is the flow-control windows an answer streams
//! through, whatever the number of answers.
//!
//! `CRISP_FLOOD_SECS` (default 20) sets the flood's length; `CRISP_BIN` picks the crisp binary
//! (a release build, or an older one for the before numbers).

use std::time::{Duration, Instant};

use crate::reliability_support::*;
use anyhow::{ensure, Result};
use crisp_e2e::emulator::{CallMeta, ContainerSpec, PodSpec};
use crisp_e2e::stack::Stack;
use crisp_e2e::tapcli::TapCli;

/// crisp's peak RSS may grow by at most this much over the flood (MiB), however many answers
/// pass: an observed answer streams within HTTP/2 flow control, so what crisp holds is at most
/// kubelet's grpc-go window for it (BDP-grown, up to 16 MiB) plus crisp's own stream window
/// towards the runtime (2 MiB, `proxy/runtime_pool.rs`) and read buffers. Collected and decoded
/// whole (fdbfd10), 20 answers grew it by hundreds of MiB.
const RSS_GROWTH_LIMIT_MIB: u64 = 24;
/// One answer: 8 MB of stdout and 8 MB of stderr (16 MB: under kubelet's 16 MiB message limit,
/// which an answer of 2 × 8 MiB exceeds).
const FLOOD: &str =
    "head -c 8000000 /dev/zero | tr '\\0' o; head -c 8000000 /dev/zero | tr '\\0' e >&2";

fn ordinary_pod(i: usize) -> PodSpec {
    let mut p = PodSpec::new(
        &format!("ordinary-{i}"),
        vec![
            ContainerSpec::sh("app", "trap 'exit 0' TERM; sleep 3600 & wait"),
            ContainerSpec::sh("proxy", "trap 'exit 0' TERM; sleep 3600 & wait"),
        ],
    );
    p.host_network = true;
    p.termination_grace_period_seconds = 2;
    p.annotations
        .insert("crisp.dev/sidecars".to_string(), "proxy".to_string());
    p
}

/// The best of 3 starts of an ordinary pod (all containers running), each deleted after.
async fn best_start(st: &Stack, base: usize) -> Result<Duration> {
    let mut best = Duration::MAX;
    for i in 0..3 {
        let t = Instant::now();
        let uid = st
            .run_pod(ordinary_pod(base + i), Duration::from_secs(60))
            .await?;
        best = best.min(t.elapsed());
        st.delete_pod(&uid, Some(2), Duration::from_secs(60))
            .await?;
    }
    Ok(best)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement (about 1 min): hack/lanes.sh, numbers in SECURITY.md"]
async fn an_exec_flood_with_a_full_tap_attached_costs_what_the_tap_shows() -> Result<()> {
    let secs = env_usize("CRISP_FLOOD_SECS", 20) as u64;
    let st = Stack::start(false, "", |_| {}).await?;
    let quiet = best_start(&st, 0).await?;

    let mut target = PodSpec::new(
        "flood",
        vec![ContainerSpec::sh(
            "app",
            "trap 'exit 0' TERM; sleep 3600 & wait",
        )],
    );
    target.host_network = true;
    target.termination_grace_period_seconds = 2;
    let uid = st.run_pod(target, Duration::from_secs(60)).await?;
    let id = st.status(&uid, "app").await?.id;
    let tap = TapCli::start(&st, &["--full", "--json", "--all"])?;

    let before = st.crisp.usage()?;
    let flood = {
        let cri = st.kubelet.cri().clone();
        let id = id.clone();
        tokio::spawn(async move {
            let (mut execs, mut bytes) = (0u64, 0u64);
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                let t = Instant::now();
                let cmd = vec!["sh".into(), "-c".into(), FLOOD.into()];
                let out = cri.exec_sync(&id, cmd, 10, CallMeta::default()).await?;
                execs += 1;
                bytes += (out.stdout.len() + out.stderr.len()) as u64;
                // One probe a second, as kubelet's periodSeconds: 1.
                tokio::time::sleep(Duration::from_secs(1).saturating_sub(t.elapsed())).await;
            }
            anyhow::Ok((execs, bytes))
        })
    };
    // The ordinary pod's start, beside the flood.
    let busy = best_start(&st, 10).await?;
    let (execs, bytes) = flood.await??;
    let after = st.crisp.usage()?;
    let shown = tap.drain(Duration::from_millis(500), Duration::from_secs(5));
    let exec_lines = shown.iter().filter(|l| l.contains("ExecSync")).count();
    let growth_mib = after.peak_rss_kib.saturating_sub(before.peak_rss_kib) / 1024;
    let cpu = after.cpu.saturating_sub(before.cpu);
    eprintln!(
        "exec flood: {execs} ExecSync answers of 16 MB ({} MiB) in {secs} s with `crisp tap \
         --full --json --all` attached ({exec_lines} ExecSync events shown); crisp peak RSS \
         {} → {} KiB (+{growth_mib} MiB), CPU {:.2} s; an ordinary pod's start (best of 3): \
         {:.3} s quiet, {:.3} s beside the flood",
        bytes >> 20,
        before.peak_rss_kib,
        after.peak_rss_kib,
        cpu.as_secs_f64(),
        quiet.as_secs_f64(),
        busy.as_secs_f64()
    );
    ensure!(execs >= secs / 2, "the flood ran: {execs} answers");
    ensure!(
        bytes == execs * 16_000_000,
        "every answer reached the client whole: {bytes} bytes"
    );
    ensure!(exec_lines > 0, "the tap showed the ExecSync calls");
    ensure!(
        shown
            .iter()
            .all(|l| !l.contains("oooooooo") && !l.contains("eeeeeeee")),
        "the tap never shows exec output"
    );
    ensure!(
        growth_mib <= RSS_GROWTH_LIMIT_MIB,
        "crisp's peak RSS grew by {growth_mib} MiB (bound {RSS_GROWTH_LIMIT_MIB} MiB)"
    );
    st.delete_pod(&uid, Some(2), Duration::from_secs(60))
        .await?;
    Ok(())
}
