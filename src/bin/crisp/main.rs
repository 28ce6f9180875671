//! The `crisp` binary: parses the command line, then runs one subcommand (one file each), over
//! the `crisp` library. Flags, `println!` of command output and exit codes live here only; the
//! library returns values and typed errors.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod doctor;
mod pcap;
mod pods;
mod replay;
mod serve;
mod tap;
mod timeline;

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
    serve: serve::ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Serve (the default when no subcommand is given).
    Serve(serve::ServeArgs),
    /// Check this node: config, the runtime's socket, crisp's socket, kubelet's endpoint and
    /// the systemd units. Prints OK/WARN/FAIL with a fix for each; exits 1 if anything FAILs.
    Doctor(doctor::DoctorArgs),
    /// Watch the CRI calls a running crisp forwards, live (secrets redacted).
    Tap(tap::TapArgs),
    /// Draw a pod's CRI calls (a tap recording, or the live tap) as a waterfall: text and SVG.
    Timeline(timeline::TimelineArgs),
    /// Show the pods crisp orders: sidecars, calls held now and why, time left, refusals.
    Pods(pods::PodsArgs),
    /// Convert a tap recording to a pcapng capture for Wireshark or tshark.
    Pcap(pcap::PcapArgs),
    /// Replay a tap recording's calls against a CRI runtime, or serve them as the runtime
    /// (--as-runtime); report what answers differently.
    ///
    /// --runtime SOCKET plays the recording's kubelet side against a runtime (containerd, or
    /// crisp in front of one): each call at its recorded offset (÷ --speed), ids rewritten,
    /// redacted fields sent as placeholders, what it made removed at the end; the report
    /// compares status, duration and order with the recording.
    ///
    /// --as-runtime SOCKET plays the runtime side: it listens on SOCKET (a new path) and answers
    /// a kubelet, crictl or the emulator with the recorded answer of the recorded call that
    /// matches each call (same method, same ids; mutating calls once each in recorded order,
    /// polling calls with the latest recorded answer at the point reached). A call the
    /// recording lacks is answered Unimplemented; redacted fields stay redacted; --speed X
    /// delays each answer by its recorded duration ÷ X (default: at once). Ctrl-C or SIGTERM
    /// ends it and prints the calls answered, those not in the recording, recorded calls never
    /// made and order differences.
    ///
    /// Exit status: 0 when nothing differs, 1 when something does (a call not sent or not in
    /// the recording, a recorded call never made, another status or order). docs/TAP.md has the
    /// rules.
    Replay(replay::ReplayArgs),
}

/// sysexits.h codes, so scripts can tell why a command stopped.
mod exit {
    /// Bad configuration or flags.
    pub const USAGE: u8 = 64;
    /// An input file that cannot be read.
    pub const NOINPUT: u8 = 66;
    /// No crisp to talk to, or it went away.
    pub const UNAVAILABLE: u8 = 69;
    /// An output file that cannot be created.
    pub const CANTCREAT: u8 = 73;
    /// The admin socket refused this user.
    pub const NOPERM: u8 = 77;
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => serve::run(&cli.serve),
        Some(Cmd::Serve(args)) => serve::run(&args),
        Some(Cmd::Doctor(args)) => doctor::run(args),
        Some(Cmd::Tap(args)) => tap::run(args),
        Some(Cmd::Timeline(args)) => timeline::run(args),
        Some(Cmd::Pods(args)) => pods::run(args),
        Some(Cmd::Pcap(args)) => pcap::run(args),
        Some(Cmd::Replay(args)) => replay::run(args),
    }
}

/// Runs a client command's future on a current-thread runtime; `None`, said on stderr as
/// `crisp <command>: …`, when the runtime cannot start.
fn block_on<F: std::future::Future>(command: &str, fut: F) -> Option<F::Output> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt.block_on(fut)),
        Err(e) => {
            eprintln!("crisp {command}: cannot start the async runtime: {e}");
            None
        }
    }
}

/// An error and its sources, `: `-separated (anyhow's `{:#}`).
fn chain(e: impl std::error::Error + Send + Sync + 'static) -> String {
    format!("{:#}", anyhow::Error::new(e))
}
