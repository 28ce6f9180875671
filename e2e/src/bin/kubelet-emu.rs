//! `kubelet-emu`: drive a CRI runtime (or crisp in front of one) the way kubelet 1.23–1.27 does,
//! and print the CRI timeline. A thin wrapper around `crisp_e2e::emulator`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use crisp_e2e::emulator::{
    parse_duration, ApiVersion, ContainerState, Journal, JournalEvent, Kubelet, KubeletConfig,
    KubeletVersion, PodPhase, PodSpec,
};
use tokio::sync::broadcast;

/// A kubelet 1.23–1.27 emulator for the CRI: runs pods from YAML against a CRI socket with
/// kubelet's call order, deadlines, retries, PLEG, kill path and pod phase, and prints a timeline
/// of the CRI calls it made.
///
/// Pod YAML (one or more documents per file; `kind: Pod` manifests also work):
///
///   name: web
///   hostNetwork: true
///   restartPolicy: Never
///   containers:
///     - name: app
///       command: [sh, -c, "sleep 5"]
///       lifecycle: {postStart: {exec: {command: [sh, -c, "true"]}}}
///
/// Exit status: 0 on success, 1 on errors/timeouts, 3 with --until-complete when a pod Failed.
#[derive(Parser, Debug)]
#[command(name = "kubelet-emu", version, verbatim_doc_comment)]
struct Cli {
    /// CRI runtime endpoint: a unix socket path (`unix://` prefix allowed).
    #[arg(long, global = true, value_name = "SOCKET")]
    endpoint: Option<String>,

    /// CRI image endpoint, if different from --endpoint.
    #[arg(long, global = true, value_name = "SOCKET")]
    image_endpoint: Option<String>,

    /// CRI API version: v1 (kubelet 1.26+), v1alpha2 (kubelet ≤1.22), negotiate (1.23: v1, falling
    /// back to v1alpha2 on Unimplemented). Default: what --kubelet-version does.
    #[arg(long, global = true, value_parser = parse_api)]
    api: Option<ApiVersion>,

    /// Which kubelet to emulate where versions differ: 1.23, 1.26 or 1.27.
    #[arg(long, global = true, default_value = "1.26", value_parser = parse_version)]
    kubelet_version: KubeletVersion,

    /// --runtime-request-timeout: the deadline of most CRI calls.
    #[arg(long, global = true, default_value = "2m", value_parser = parse_duration)]
    runtime_request_timeout: Duration,

    /// Root of pod log directories (the runtime writes container logs under it).
    #[arg(long, global = true, default_value = "/var/log/pods")]
    pod_log_dir: PathBuf,

    /// kubelet root dir; when set, containers get kubelet's termination-log and /etc/hosts mounts.
    #[arg(long, global = true)]
    root_dir: Option<PathBuf>,

    /// PLEG relist period.
    #[arg(long, global = true, default_value = "1s", value_parser = parse_duration)]
    relist_period: Duration,

    /// Periodic pod resync (--sync-frequency).
    #[arg(long, global = true, default_value = "1m", value_parser = parse_duration)]
    resync_interval: Duration,

    /// Requeue delay after a failed sync (jittered up to +50%).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    error_backoff: Duration,

    /// Crash-loop back-off start (doubles up to 5m).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    crash_backoff: Duration,

    /// Reach the endpoint through kubelet's own gRPC stack: a grpc-go bridge (crisp-grpcgo,
    /// `hack/build-grpcgo.sh`) sends the calls with grpc-go's transport, as a real kubelet does.
    /// auto: when the binary is built; on: required (built if missing); off: tonic directly.
    #[arg(long, global = true, default_value = "auto", value_parser = ["auto", "on", "off"])]
    via_grpcgo: String,

    /// Run kubelet's container GC with this period. It removes dead containers of every pod this
    /// emulator does not know, so only use it on a runtime of its own.
    #[arg(long, global = true, value_parser = parse_duration)]
    gc_period: Option<Duration>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run pods from YAML files, print the CRI timeline, then tear them down.
    Run(RunArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Pod YAML files.
    #[arg(required = true, value_name = "POD.yaml")]
    pods: Vec<PathBuf>,

    /// Delete each pod this many seconds after it is Running (then wait for termination).
    #[arg(long, value_name = "SECONDS", conflicts_with = "until_complete")]
    delete_after_running: Option<f64>,

    /// Wait until every pod reaches Succeeded/Failed and kubelet has torn it down.
    #[arg(long)]
    until_complete: bool,

    /// Grace period for the deletion (like `kubectl delete --grace-period`); default the pod's.
    #[arg(long, value_name = "SECONDS")]
    grace: Option<i64>,

    /// Print every CRI call, including PLEG polling (List*, *Status, Version, Status).
    #[arg(long)]
    journal: bool,

    /// Give up after this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
}

fn parse_api(s: &str) -> Result<ApiVersion> {
    s.parse()
}

fn parse_version(s: &str) -> Result<KubeletVersion> {
    s.parse()
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kubelet-emu: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubelet-emu: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn socket_path(s: &str) -> PathBuf {
    PathBuf::from(s.strip_prefix("unix://").unwrap_or(s))
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let Some(endpoint) = cli.endpoint.as_deref() else {
        bail!("--endpoint is required")
    };
    let mut cfg = KubeletConfig::new(socket_path(endpoint));
    cfg.image_endpoint = cli.image_endpoint.as_deref().map(socket_path);
    cfg.version = cli.kubelet_version;
    cfg.api = cli.api;
    cfg.runtime_request_timeout = cli.runtime_request_timeout;
    cfg.pod_log_root = cli.pod_log_dir;
    cfg.root_dir = cli.root_dir;
    cfg.relist_period = cli.relist_period;
    cfg.resync_interval = cli.resync_interval;
    cfg.error_backoff = cli.error_backoff;
    cfg.crash_backoff_base = cli.crash_backoff;
    cfg.gc_period = cli.gc_period;
    let Command::Run(args) = cli.command;

    // kubelet's grpc-go transport between the emulator and the endpoint.
    let bridge_dir = tempfile::Builder::new().prefix("kubelet-emu-").tempdir()?;
    let binary = match cli.via_grpcgo.as_str() {
        "on" => Some(crisp_e2e::grpcgo::grpcgo_binary()?),
        "auto" => crisp_e2e::grpcgo::prebuilt_binary(),
        _ => None,
    };
    let _bridges = match binary {
        Some(bin) => {
            let opts = crisp_e2e::grpcgo::GoBridgeOpts {
                binary: Some(bin),
                ..Default::default()
            };
            let b = crisp_e2e::grpcgo::bridge_kubelet(&mut cfg, bridge_dir.path(), opts)?;
            println!("kubelet-emu: CRI calls go through grpc-go (crisp-grpcgo bridge, as kubelet's own client)");
            b
        }
        None => Vec::new(),
    };

    let mut pods = Vec::new();
    for f in &args.pods {
        pods.extend(PodSpec::from_file(f)?);
    }
    if pods.is_empty() {
        bail!("no pods in {:?}", args.pods);
    }

    let kubelet = Kubelet::new(cfg).await?;
    // Subscribe before adding pods so no event is missed.
    let events = kubelet.journal().subscribe();
    let (stop_printer, stopped) = tokio::sync::oneshot::channel();
    let printer = tokio::spawn(print_timeline(
        kubelet.journal().clone(),
        events,
        stopped,
        args.journal,
    ));
    println!(
        "kubelet-emu {:?}: runtime API {:?}, image API {:?}",
        kubelet.config().version,
        kubelet.cri().runtime_package(),
        kubelet.cri().image_package()
    );

    let mut uids = Vec::new();
    for pod in pods {
        let key = pod.key();
        let uid = kubelet
            .add_pod(pod)
            .with_context(|| format!("adding pod {key}"))?;
        uids.push(uid);
    }

    let work = drive(&kubelet, &uids, &args);
    let result = tokio::select! {
        r = tokio::time::timeout(args.timeout, work) => match r {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!("timed out after {:?}", args.timeout)),
        },
        _ = tokio::signal::ctrl_c() => {
            println!("interrupted: deleting pods");
            teardown(&kubelet, &uids, args.grace).await
        }
    };
    // The printer drains what is queued, then exits.
    let _ = stop_printer.send(());
    let _ = printer.await;
    summary(&kubelet, &uids);
    kubelet.shutdown().await;
    result?;
    if args.until_complete
        && uids
            .iter()
            .any(|u| kubelet.pod_phase(u) == Some(PodPhase::Failed))
    {
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

async fn drive(kubelet: &Kubelet, uids: &[String], args: &RunArgs) -> Result<()> {
    let forever = Duration::from_secs(365 * 24 * 3600);
    if args.until_complete {
        for uid in uids {
            kubelet.wait_terminated(uid, forever).await?;
        }
        return Ok(());
    }
    if let Some(secs) = args.delete_after_running {
        let per_pod = uids.iter().map(|uid| async move {
            kubelet.wait_phase(uid, PodPhase::Running, forever).await?;
            tokio::time::sleep(Duration::from_secs_f64(secs.max(0.0))).await;
            kubelet.delete_pod(uid, args.grace)?;
            kubelet.wait_terminated(uid, forever).await?;
            anyhow::Ok(())
        });
        for r in futures_util::future::join_all(per_pod).await {
            r?;
        }
        return Ok(());
    }
    // No stop condition: run until interrupted.
    std::future::pending::<()>().await;
    Ok(())
}

async fn teardown(kubelet: &Kubelet, uids: &[String], grace: Option<i64>) -> Result<()> {
    for uid in uids {
        kubelet.delete_pod(uid, grace)?;
    }
    for uid in uids {
        kubelet
            .wait_terminated(uid, Duration::from_secs(600))
            .await?;
    }
    Ok(())
}

async fn print_timeline(
    journal: Journal,
    mut rx: broadcast::Receiver<JournalEvent>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    all: bool,
) {
    loop {
        let ev = tokio::select! {
            ev = rx.recv() => ev,
            _ = &mut stop => {
                // Print what is already queued, then stop.
                while let Ok(ev) = rx.try_recv() {
                    print_event(&journal, ev, all);
                }
                return;
            }
        };
        match ev {
            Ok(ev) => print_event(&journal, ev, all),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                println!("(timeline dropped {n} events)")
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

fn print_event(journal: &Journal, ev: JournalEvent, all: bool) {
    match ev {
        JournalEvent::Done(r) if all || !r.is_polling() => {
            println!("{}", journal.format_record(&r))
        }
        JournalEvent::Sent(r) if all && !r.is_polling() => {
            println!(
                "+{:>9.1}ms  {:<16} {:<24} {:<14} …sent",
                journal.rel_ms(r.sent),
                r.method,
                r.meta.pod.as_deref().unwrap_or("-"),
                r.meta.container.as_deref().unwrap_or("-")
            )
        }
        JournalEvent::Note { at, pod, text } => {
            println!(
                "+{:>9.1}ms  == {} {text}",
                journal.rel_ms(at),
                pod.as_deref().unwrap_or("")
            )
        }
        _ => {}
    }
}

fn summary(kubelet: &Kubelet, uids: &[String]) {
    for uid in uids {
        let Some(v) = kubelet.pod(uid) else { continue };
        println!(
            "pod {}/{} ({uid}): {:?}",
            v.namespace, v.name, v.status.phase
        );
        for c in v
            .status
            .init_container_statuses
            .iter()
            .chain(&v.status.container_statuses)
        {
            let state = match &c.state {
                ContainerState::Waiting { reason, .. } => format!("Waiting({reason})"),
                ContainerState::Running { .. } => "Running".to_string(),
                ContainerState::Terminated {
                    exit_code, reason, ..
                } => format!("Terminated({exit_code}, {reason})"),
            };
            println!("  {:<16} {state:<32} restarts={}", c.name, c.restart_count);
        }
        if let Some(e) = &v.last_error {
            println!("  last sync error: {e}");
        }
    }
}
