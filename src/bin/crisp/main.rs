//! The `crisp` binary: parse flags, load config, set up logging, run the daemon (or `doctor`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use crisp::config::{self, Config, LogFormat};

/// sysexits.h EX_USAGE: bad configuration or flags.
const EX_USAGE: u8 = 64;

/// crisp — CRI Sidecar Proxy.
///
/// Sits on the CRI socket between kubelet and the container runtime and forwards every call
/// byte-exact. Point kubelet's --container-runtime-endpoint (and --image-service-endpoint) at
/// --listen. Flags override the config file. Without a subcommand, crisp serves.
#[derive(Parser, Debug)]
#[command(version, about, long_about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve (the default when no subcommand is given).
    Serve(ServeArgs),
    /// Check this node: config, the runtime's socket, crisp's socket, kubelet's endpoint and
    /// the systemd units. Prints OK/WARN/FAIL with a fix for each; exits 1 if anything FAILs.
    Doctor(DoctorArgs),
    /// Watch the CRI calls a running crisp forwards, live (secrets redacted).
    Tap(crisp::tap::cli::TapArgs),
    /// Draw a pod's CRI calls (a tap recording, or the live tap) as a waterfall: text and SVG.
    Timeline(crisp::tap::timeline::TimelineArgs),
    /// Show the pods crisp orders: sidecars, calls held now and why, time left, refusals.
    Pods(crisp::tap::pods::PodsArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Config file (TOML). Default: /etc/crisp/config.toml if it exists.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Socket kubelet connects to [default: /run/crisp/crisp.sock]. Under systemd socket
    /// activation (LISTEN_FDS) the inherited socket is used instead.
    #[arg(long, value_name = "PATH")]
    listen: Option<PathBuf>,
    /// Mode of the listening socket, octal [default: 0660].
    #[arg(long, value_name = "MODE")]
    listen_mode: Option<String>,
    /// The runtime's CRI socket [default: /run/containerd/containerd.sock].
    #[arg(long, value_name = "PATH")]
    upstream: Option<PathBuf>,
    /// Log filter, e.g. info, debug, crisp=trace [default: info]. RUST_LOG overrides.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
    /// Log format.
    #[arg(long, value_enum)]
    log_format: Option<LogFormatArg>,
    /// Validate the configuration, print it, and exit.
    #[arg(long)]
    check_config: bool,
}

#[derive(Args, Debug)]
struct DoctorArgs {
    /// Config file to check. Default: ROOT/etc/crisp/config.toml if it exists.
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// crisp's socket, a node path [default: `listen` from the config].
    #[arg(long, value_name = "PATH")]
    listen: Option<PathBuf>,
    /// The runtime's socket, a node path [default: `upstream` from the config].
    #[arg(long, value_name = "PATH")]
    upstream: Option<PathBuf>,
    /// The node's filesystem root: node paths (sockets, kubelet files, units) are looked up under it.
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormatArg {
    Text,
    Json,
}

fn load(cli: &ServeArgs) -> Result<Config, String> {
    let mut cfg = Config::load(cli.config.as_deref()).map_err(|e| e.to_string())?;
    if let Some(p) = &cli.listen {
        cfg.listen = p.clone();
    }
    if let Some(m) = &cli.listen_mode {
        cfg.listen_mode = config::parse_mode(m).map_err(|e| format!("--listen-mode: {e}"))?;
    }
    if let Some(p) = &cli.upstream {
        cfg.upstream = p.clone();
    }
    if let Some(l) = &cli.log_level {
        cfg.log.level = l.clone();
    }
    if let Some(f) = cli.log_format {
        cfg.log.format = match f {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        };
    }
    cfg.validate("command line").map_err(|e| e.to_string())?;
    Ok(cfg)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => serve(&cli.serve),
        Some(Cmd::Serve(args)) => serve(&args),
        Some(Cmd::Doctor(args)) => doctor(args),
        Some(Cmd::Tap(args)) => crisp::tap::cli::run(args),
        Some(Cmd::Timeline(args)) => crisp::tap::timeline::run(args),
        Some(Cmd::Pods(args)) => crisp::tap::pods::run(args),
    }
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("crisp: cannot start the async runtime: {e}");
            None
        }
    }
}

fn serve(cli: &ServeArgs) -> ExitCode {
    let cfg = match load(cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crisp: {e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    if cli.check_config {
        println!("{cfg:#?}");
        return ExitCode::SUCCESS;
    }
    crisp::telemetry::init(&cfg.log.level, cfg.log.format);
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    // Before any socket exists: a SIGTERM sent once crisp is reachable must never be lost.
    let signals = {
        let _in_runtime = rt.enter();
        Signals::install()
    };
    match rt.block_on(crisp::daemon::run(cfg, signals.shutdown())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "crisp failed");
            eprintln!("crisp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn doctor(args: DoctorArgs) -> ExitCode {
    let opts = crisp::doctor::Options {
        root: args.root,
        config: args.config,
        listen: args.listen,
        upstream: args.upstream,
        ..Default::default()
    };
    let Some(rt) = runtime() else {
        return ExitCode::FAILURE;
    };
    let report = rt.block_on(crisp::doctor::run(&opts));
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Resolves on the first SIGTERM or SIGINT.
/// SIGTERM and SIGINT, caught from before crisp binds its sockets until it exits.
///
/// Installed up front, not on the shutdown future's first poll: tokio turns a signal's delivery
/// on and then subscribes to it, and a signal its reactor handles between the two reaches no
/// one. A SIGTERM sent the moment the socket accepted connections (systemd stopping a unit
/// that just started) was lost that way, and crisp ran on until SIGKILL.
struct Signals(Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>);

impl Signals {
    /// Must run inside the runtime.
    fn install() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Signals(Some((term, int))),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot install signal handlers; only SIGKILL will stop crisp");
                Signals(None)
            }
        }
    }

    async fn shutdown(self) {
        let Some((mut term, mut int)) = self.0 else {
            return std::future::pending().await;
        };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutdown requested");
    }
}
