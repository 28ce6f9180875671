//! `crisp serve` (and `crisp` alone): flags over the config file, logging, signals, then
//! [`crisp::daemon::run`] until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;

use crisp::config::{self, Config, LogFormat};

use super::exit;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
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

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum LogFormatArg {
    Text,
    Json,
}

/// The config file with the flags applied over it, validated.
fn load(args: &ServeArgs) -> Result<Config, String> {
    let mut cfg = Config::load(args.config.as_deref()).map_err(|e| e.to_string())?;
    if let Some(listen) = &args.listen {
        cfg.listen = listen.clone();
    }
    if let Some(mode) = &args.listen_mode {
        cfg.listen_mode = config::parse_mode(mode).map_err(|e| format!("--listen-mode: {e}"))?;
    }
    if let Some(upstream) = &args.upstream {
        cfg.upstream = upstream.clone();
    }
    if let Some(level) = &args.log_level {
        cfg.log.level = level.clone();
    }
    if let Some(format) = args.log_format {
        cfg.log.format = match format {
            LogFormatArg::Text => LogFormat::Text,
            LogFormatArg::Json => LogFormat::Json,
        };
    }
    cfg.validate("command line").map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// The multi-threaded runtime the daemon (and `crisp doctor`) run on; `None`, said on stderr,
/// when it cannot start.
pub fn runtime() -> Option<tokio::runtime::Runtime> {
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

/// Runs the daemon: EX_USAGE (64) on a bad config or flag, 1 when it fails.
pub fn run(args: &ServeArgs) -> ExitCode {
    let cfg = match load(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crisp: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    if args.check_config {
        println!("{cfg:#?}");
        return ExitCode::SUCCESS;
    }
    // Held to the end: the log thread writes what is queued when it drops.
    let _logging = crisp::telemetry::init(&cfg.log.level, cfg.log.format);
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
            let e = anyhow::Error::new(e);
            tracing::error!(error = %format!("{e:#}"), "crisp failed");
            eprintln!("crisp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

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
                tracing::error!(
                    error = %e,
                    "cannot install signal handlers; only SIGKILL will stop crisp"
                );
                Signals(None)
            }
        }
    }

    /// Resolves on the first SIGTERM or SIGINT (never, if the handlers could not be installed).
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
