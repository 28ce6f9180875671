//! The relist lane on a real containerd (issue #47): a private containerd (`harness`, runc, the
//! busybox-static images) filled with `--ctrd-pods` host-network pods, each its pause sandbox
//! and one busybox container running, then kubelet's relist (grpc-go: ListPodSandbox, then
//! ListContainers) through direct, socat, crisp and socat-64k, interleaved relist by relist,
//! min / median / max over runs, as the fake-runtime relist lane does. Needs root.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use crisp_e2e::harness::{self, Containerd, ContainerdOpts, BUSYBOX_IMAGE};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use k8s_cri::v1 as cri;
use prost::Message;

use super::{
    grpcgo_relist, machine_line, proc_status, relist_args, relist_latency_tables, relist_methods,
    relist_process_row, steal_jiffies, Args, RelistLanes,
};

/// Pods created at once while the node fills.
const FILL_CONCURRENCY: usize = 4;

/// Creates `n` pods on `socket`: a host-network sandbox and one busybox container running in
/// each. Their sandbox ids.
async fn fill(socket: &Path, n: usize, logs: &Path) -> Result<Vec<String>> {
    let (rt, _) = harness::cri_clients(socket).await?;
    stream::iter(0..n)
        .map(|i| {
            let mut rt = rt.clone();
            async move {
                let mut sandbox =
                    harness::host_network_sandbox(&format!("relist-{i}"), "bench", logs);
                sandbox.labels = [
                    ("io.kubernetes.pod.name".to_string(), format!("relist-{i}")),
                    ("io.kubernetes.pod.namespace".to_string(), "bench".into()),
                    (
                        "io.kubernetes.pod.uid".to_string(),
                        format!("relist-{i}-uid"),
                    ),
                ]
                .into();
                let container = harness::shell_container("app", BUSYBOX_IMAGE, "sleep 100000");
                let (pod, _) = harness::run_pod_with(&mut rt, &sandbox, container)
                    .await
                    .with_context(|| format!("pod relist-{i}"))?;
                anyhow::Ok(pod)
            }
        })
        .buffer_unordered(FILL_CONCURRENCY)
        .try_collect()
        .await
}

pub(super) async fn report(args: &Args, dir: &Path) -> Result<String> {
    use std::fmt::Write;
    let mut out = String::new();
    let ctrd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let logs = dir.join("ctrd-relist-logs");
    std::fs::create_dir_all(&logs)?;
    let t = Instant::now();
    let pods = fill(ctrd.socket(), args.ctrd_pods, &logs).await?;
    let filled = t.elapsed();
    let upstream = ctrd.socket().to_path_buf();
    // The answers' sizes, read once directly.
    let (mut rt, _) = harness::cri_clients(&upstream).await?;
    let listed = rt
        .list_containers(cri::ListContainersRequest::default())
        .await?
        .into_inner();
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest::default())
        .await?
        .into_inner();
    let (c_bytes, s_bytes) = (listed.encoded_len(), sandboxes.encoded_len());
    let (n_containers, n_sandboxes) = (listed.containers.len(), sandboxes.items.len());
    let ctrd_rss = ctrd.pid().map_or(0, |pid| proc_status(pid, "VmRSS:"));

    let (steal0, total0) = steal_jiffies();
    let relist = RelistLanes::start(args, "ctrd-relist", dir, &upstream)?;
    let pid = relist.crisp.0.id();
    // crisp's recovery reads every sandbox's status from containerd: wait until its CPU rests.
    let cpu = super::ownwork::settled_cpu(pid);
    let recovered = relist.spawned.elapsed();
    let watched = relist.watched();
    let runs = args.relist_runs.max(1);
    let calls = args.ctrd_relists;
    let r = grpcgo_relist(
        &relist.lanes,
        &watched,
        &relist_methods(),
        &relist_args(runs, calls, args.relist_pace_ms),
    )?;
    let (steal1, total1) = steal_jiffies();
    let kib = |b: usize| b as f64 / 1024.0;
    writeln!(
        out,
        "\n### kubelet's relist (grpc-go 1.33), real containerd with {} pods\n",
        pods.len()
    )?;
    writeln!(out, "Machine: {}.\n", machine_line())?;
    writeln!(
        out,
        "containerd ({}) holding {n_sandboxes} sandboxes (host network, pause image) and {n_containers} busybox containers running, created {} at a time in {:.0} s; containerd's RSS {} MiB. `ListPodSandbox` {:.0} KiB ({} B a pod), `ListContainers` {:.0} KiB ({} B a container).\n",
        upstream.display(),
        FILL_CONCURRENCY,
        filled.as_secs_f64(),
        ctrd_rss / 1024,
        kib(s_bytes),
        s_bytes / n_sandboxes.max(1),
        kib(c_bytes),
        c_bytes / n_containers.max(1),
    )?;
    writeln!(
        out,
        "crisp at start: its socket accepted at RSS {} KiB; its recovery (a PodSandboxStatus per sandbox, from containerd) done and its CPU at rest {:.1} s after the spawn, {} ms of CPU, RSS then {} KiB.\n",
        relist.idle_rss,
        recovered.as_secs_f64(),
        cpu * 10,
        proc_status(pid, "VmRSS:"),
    )?;
    writeln!(
        out,
        "{runs} runs of {calls} relists per lane (after {} unmeasured), the lanes interleaved relist by relist in a new random order each round, {} ms pause after each; min / **median** / max over the runs.\n",
        (calls / 10).max(3),
        args.relist_pace_ms
    )?;
    relist_latency_tables(&mut out, &relist.lanes, &r)?;
    writeln!(
        out,
        "Per relist (from /proc, the measured relists only; min / **median** / max over the runs):\n"
    )?;
    writeln!(
        out,
        "| process | CPU ms per relist | context switches per relist | peak RSS KiB |\n|---|---|---|---|"
    )?;
    for ((name, _), w) in watched.iter().zip(&r.watch) {
        let peak = w.iter().map(|x| x.peak_kib).max().unwrap_or(0);
        relist_process_row(&mut out, name, w, &peak.to_string())?;
    }
    writeln!(
        out,
        "\n{} % of the CPU time stolen by the host during the relists.",
        100 * (steal1 - steal0) / (total1 - total0).max(1)
    )?;
    drop(relist);
    let t = Instant::now();
    drop(ctrd);
    eprintln!(
        "ctrd-relist: containerd and its {} pods stopped in {:.0} s",
        pods.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(out)
}
