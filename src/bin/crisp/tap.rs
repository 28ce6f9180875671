//! `crisp tap`: attaches to a running crisp's admin socket and prints one line per CRI call
//! (or JSON lines with `--json`), optionally recording JSON lines to a file. The lines are
//! [`crisp::cli::view`]'s.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crisp::admin_api::{self as pb, tap_event::Event};
use crisp::cli::{client, output, pcap, view};

use super::exit;

/// Watch the CRI calls crisp forwards, live.
///
/// One line per call as it ends: time, CRI version, method, pod, container, duration, time held
/// by the ordering engine, gRPC status. Polling calls (List*, *Status, *Stats, Version) are hidden
/// unless --all or a --method names them. Secrets are redacted.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TapArgs {
    #[command(flatten)]
    pub admin: AdminSocketArgs,
    /// Print JSON lines instead of the readable view.
    #[arg(long)]
    pub json: bool,
    /// Only methods matching this glob (`Create*`, `*Container`, or a gRPC path). Repeatable.
    /// Selects exactly what it matches, polling calls included.
    #[arg(long = "method", value_name = "GLOB")]
    pub methods: Vec<String>,
    /// Only calls of pods in this namespace.
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Only calls of this pod (`name` or `namespace/name`).
    #[arg(long, value_name = "POD")]
    pub pod: Option<String>,
    /// Only calls that failed (non-OK status, or no status).
    #[arg(long)]
    pub errors: bool,
    /// Only calls that took at least this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub slower_than: Option<u64>,
    /// Include the polling calls (List*, *Status, *Stats, Version, the Stream* lists), hidden by
    /// default.
    #[arg(long)]
    pub all: bool,
    /// Decode requests and responses (unary calls) to JSON; unknown fields are listed.
    #[arg(long)]
    pub full: bool,
    /// Also record every event as JSON lines to this file (mode 0600; no symlink anywhere on
    /// the path; an existing file only with --force; see docs/TAP.md). The file starts with the
    /// runtime's snapshot (see --no-snapshot), then the calls as they end.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// With --output: do not record the runtime's snapshot. By default a recording starts with
    /// crisp's own Version, RuntimeConfig, Status and ImageFsInfo calls to the runtime, marked
    /// "snapshot": true, so that `crisp replay --as-runtime` answers a fresh kubelet's handshake
    /// in a recording begun after kubelet connected (docs/TAP.md).
    #[arg(long, requires = "output")]
    pub no_snapshot: bool,
    /// With --output: replace FILE if it exists (only a regular file of one's own with one
    /// link; never through a symlink). Without it an existing FILE is refused, never truncated.
    #[arg(long, requires = "output")]
    pub force: bool,
    /// Also write the calls as a pcapng capture to this file, for Wireshark or tshark: each call
    /// an HTTP/2 stream of gRPC on a synthetic connection (decode TCP port 50051 as HTTP/2),
    /// redacted as the tap shows it, with --full the messages too (docs/TAP.md). The same rules
    /// as --output: mode 0600, no symlink, never an existing file.
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Show secrets (registry credentials, env values, ...). Only served to root.
    #[arg(long)]
    pub unredacted: bool,
    /// Exit after this many calls.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

impl TapArgs {
    /// The admin API request these flags ask for.
    pub fn request(&self) -> pb::TapRequest {
        pb::TapRequest {
            methods: self.methods.clone(),
            namespace: self.namespace.clone().unwrap_or_default(),
            pod: self.pod.clone().unwrap_or_default(),
            errors_only: self.errors,
            slower_than_ms: self.slower_than.unwrap_or(0),
            include_polling: self.all,
            full: self.full,
            unredacted: self.unredacted,
            // A recording's, not a live view's: what replays a handshake (`--no-snapshot`).
            snapshot: self.output.is_some() && !self.no_snapshot,
        }
    }
}

/// Where the client commands (`crisp tap`, `crisp pods`) find crisp's admin socket.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct AdminSocketArgs {
    /// crisp's admin socket [default: `admin.socket` from the config, /run/crisp/admin.sock].
    #[arg(long, value_name = "PATH")]
    pub admin_socket: Option<PathBuf>,
    /// Config file to read the admin socket from. Default: /etc/crisp/config.toml if it exists.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl AdminSocketArgs {
    /// The socket: `--admin-socket`, else `admin.socket` of the config; `Err`, said as the
    /// command prints it, when the config cannot be read.
    pub fn path(&self) -> Result<PathBuf, String> {
        client::admin_socket(self.admin_socket.as_deref(), self.config.as_deref())
            .map_err(|e| e.to_string())
    }
}

/// Runs `crisp tap`.
pub fn run(args: TapArgs) -> ExitCode {
    super::block_on("tap", tap(args)).unwrap_or(ExitCode::FAILURE)
}

async fn tap(args: TapArgs) -> ExitCode {
    let socket = match args.admin.path() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("crisp tap: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let mut admin = match client::connect(&socket).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "crisp tap: cannot connect to {}: {} (is crisp running? the admin socket is root-only by default)",
                socket.display(),
                super::chain(e)
            );
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let mut stream = match admin.tap(args.request()).await {
        Ok(r) => r.into_inner(),
        Err(s) => {
            eprintln!("crisp tap: {}: {}", s.code(), s.message());
            return ExitCode::from(if s.code() == tonic::Code::PermissionDenied {
                exit::NOPERM
            } else {
                exit::UNAVAILABLE
            });
        }
    };
    let mut file = match args
        .output
        .as_deref()
        .map(|p| create_output(p, args.force))
        .transpose()
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("crisp tap: --output: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let mut pcap = match args.pcap.as_deref().map(open_pcap).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("crisp tap: --pcap: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    // The subscription is live once crisp answered; scripts (and tests) wait for this line.
    eprintln!("crisp tap: attached to {}", socket.display());
    let mut out = BufWriter::new(io::stdout().lock());
    let mut calls = 0u64;
    loop {
        let msg = tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            m = stream.message() => m,
        };
        let event = match msg {
            Ok(Some(pb::TapEvent { event: Some(e) })) => e,
            Ok(Some(_)) => continue,
            Ok(None) => {
                eprintln!("crisp tap: crisp ended the stream (shutting down?)");
                break;
            }
            Err(s) => {
                eprintln!("crisp tap: stream failed: {}: {}", s.code(), s.message());
                let _ = out.flush();
                return ExitCode::from(exit::UNAVAILABLE);
            }
        };
        let line = if args.json {
            view::json_text(&event)
        } else {
            view::human(&event)
        };
        let written = writeln!(out, "{line}").and_then(|_| out.flush());
        if let Some(f) = file.as_mut() {
            if let Err(e) = writeln!(f, "{}", view::json_text(&event)).and_then(|_| f.flush()) {
                eprintln!("crisp tap: --output: {e}");
                return ExitCode::FAILURE;
            }
        }
        if let Some(capture) = pcap.as_mut() {
            let wrote = capture.event(&view::json_line(&event));
            if let Err(e) = wrote
                .map_err(|e| e.to_string())
                .and_then(|_| capture.flush().map_err(|e| e.to_string()))
            {
                eprintln!("crisp tap: --pcap: {e}");
                return ExitCode::FAILURE;
            }
        }
        // A closed pipe (`crisp tap | head`) is a normal way to stop.
        if written.is_err() {
            break;
        }
        // crisp's own calls of the snapshot are no calls of kubelet's.
        if matches!(&event, Event::Call(c) if !c.snapshot) {
            calls += 1;
            if args.count.is_some_and(|n| calls >= n) {
                break;
            }
        }
    }
    ExitCode::SUCCESS
}

/// A capture file, opened as --output's files are (never an existing file), its connection
/// starting now.
fn open_pcap(path: &Path) -> Result<pcap::Capture<BufWriter<File>>, String> {
    let file = create_output(path, false).map_err(|e| e.to_string())?;
    pcap::Capture::new(file, now()).map_err(|e| e.to_string())
}

fn now() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

fn create_output(path: &Path, force: bool) -> Result<BufWriter<File>, output::OutputError> {
    // 0600, no symlink on the path, an existing file only with --force and only one's own: with
    // --unredacted the file holds secrets; even redacted, it is every pod's traffic (see
    // src/cli/output.rs).
    Ok(BufWriter::new(output::open(path, force)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_to_request() {
        let a = TapArgs {
            methods: vec!["Create*".into()],
            pod: Some("ns/p".into()),
            errors: true,
            slower_than: Some(9),
            all: true,
            full: true,
            ..Default::default()
        };
        let r = a.request();
        assert_eq!(r.methods, vec!["Create*"]);
        assert_eq!(r.pod, "ns/p");
        assert!(r.errors_only && r.include_polling && r.full && !r.unredacted);
        assert_eq!(r.slower_than_ms, 9);
        // Live, no snapshot: nothing to replay.
        assert!(!r.snapshot);
    }

    /// Issue #46: a recording asks for the runtime's snapshot unless told not to.
    #[test]
    fn a_recording_asks_for_the_snapshot() {
        let recording = TapArgs {
            output: Some("calls.jsonl".into()),
            ..Default::default()
        };
        assert!(recording.request().snapshot);
        let without = TapArgs {
            no_snapshot: true,
            ..recording
        };
        assert!(!without.request().snapshot);
    }
}
