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
    fmt_spread, grpcgo_relist, kubelet_latency_table, machine_line, proc_status, start_crisp_bin,
    start_socat, start_socat_with, steal_jiffies, Args, Lane, Watched,
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
    let socat_sock = dir.join("ctrd-relist-socat.sock");
    let socat = start_socat(&socat_sock, &upstream)?;
    let splice_sock = dir.join("ctrd-relist-splice64k.sock");
    let splice = start_socat_with(&splice_sock, &upstream, &["-b", "65536"])?;
    let crisp_dir = dir.join("ctrd-relist-crisp");
    std::fs::create_dir_all(&crisp_dir)?;
    let crisp_sock = crisp_dir.join("crisp.sock");
    let t = Instant::now();
    let crisp = start_crisp_bin(
        &crisp_e2e::crisp::crisp_binary()?,
        "ctrd-relist",
        dir,
        &crisp_sock,
        &upstream,
        &args.crisp_config,
    )?;
    let pid = crisp.0.id();
    let idle_rss = proc_status(pid, "VmRSS:");
    // crisp's recovery reads every sandbox's status from containerd: wait until its CPU rests.
    let cpu = super::ownwork::settled_cpu(pid);
    let recovered = t.elapsed();
    let lanes = [
        Lane {
            name: "direct",
            socket: upstream.clone(),
        },
        Lane {
            name: "socat",
            socket: socat_sock,
        },
        Lane {
            name: "crisp",
            socket: crisp_sock,
        },
        Lane {
            name: "socat-64k",
            socket: splice_sock,
        },
    ];
    let watched = [
        ("socat", socat.0.id()),
        ("crisp", pid),
        ("socat-64k", splice.0.id()),
    ];
    let methods = [
        (
            "ListPodSandbox",
            cri::ListPodSandboxRequest::default().encode_to_vec(),
        ),
        (
            "ListContainers",
            cri::ListContainersRequest::default().encode_to_vec(),
        ),
    ];
    let runs = args.relist_runs.max(1);
    let calls = args.ctrd_relists;
    let r = grpcgo_relist(
        &lanes,
        &watched,
        &methods,
        &[
            "--runs".into(),
            runs.to_string(),
            "--count".into(),
            calls.to_string(),
            "--warmup".into(),
            (calls / 10).max(3).to_string(),
            "--pace".into(),
            format!("{}ms", args.relist_pace_ms),
            "--timeout".into(),
            "60s".into(),
        ],
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
        "crisp at start: its socket accepted at RSS {idle_rss} KiB; its recovery (a PodSandboxStatus per sandbox, from containerd) done and its CPU at rest {:.1} s after the spawn, {} ms of CPU, RSS then {} KiB.\n",
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
    for (k, name) in [
        "`ListPodSandbox`",
        "`ListContainers`",
        "the relist (both calls)",
    ]
    .iter()
    .enumerate()
    {
        writeln!(out, "{name}:\n")?;
        kubelet_latency_table(&mut out, &lanes, &r.latency[k], true)?;
        writeln!(out)?;
    }
    let per_relist = |w: &[Watched], f: fn(&Watched) -> f64| -> Vec<f64> {
        w.iter().map(|x| f(x) / x.relists.max(1) as f64).collect()
    };
    writeln!(
        out,
        "Per relist (from /proc, the measured relists only; min / **median** / max over the runs):\n"
    )?;
    writeln!(
        out,
        "| process | CPU ms per relist | context switches per relist | peak RSS KiB |\n|---|---|---|---|"
    )?;
    for ((name, _), w) in watched.iter().zip(&r.watch) {
        writeln!(
            out,
            "| {name} | {} | {} | {} |",
            fmt_spread(&per_relist(w, |x| x.cpu_ticks as f64 * 10.0), 2),
            fmt_spread(&per_relist(w, |x| x.switches as f64), 1),
            w.iter().map(|x| x.peak_kib).max().unwrap_or(0)
        )?;
    }
    writeln!(
        out,
        "\n{} % of the CPU time stolen by the host during the relists.",
        100 * (steal1 - steal0) / (total1 - total0).max(1)
    )?;
    drop(crisp);
    drop(socat);
    drop(splice);
    let t = Instant::now();
    drop(ctrd);
    eprintln!(
        "ctrd-relist: containerd and its {} pods stopped in {:.0} s",
        pods.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(out)
}
