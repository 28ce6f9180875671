//! `crisp pcap`: converts a tap recording (`crisp tap -o FILE`) to a pcapng capture,
//! [`crisp::cli::pcap`]'s.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter};
use std::path::PathBuf;
use std::process::ExitCode;

use crisp::cli::{output, pcap};

use super::exit;

/// Convert a tap recording to a pcapng capture for Wireshark or tshark.
///
/// Reads JSON lines written by `crisp tap -o FILE` (or `crisp tap --json`) from INPUT or
/// standard input, and writes each call as an HTTP/2 stream of gRPC on a synthetic TCP
/// connection, with the pod, the container and crisp's hold as packet comments. Decode TCP port
/// 50051 as HTTP/2 and put the CRI's api.proto on the protobuf search path (docs/TAP.md). The
/// messages are in the capture when the recording has them (`crisp tap --full`), redacted as
/// the recording is.
#[derive(clap::Args, Debug, Clone)]
pub struct PcapArgs {
    /// The tap recording (JSON lines) [default: standard input].
    #[arg(value_name = "INPUT.jsonl")]
    pub input: Option<PathBuf>,
    /// The capture to write (mode 0600, no symlink, never an existing file).
    #[arg(long, short = 'o', value_name = "OUTPUT.pcapng")]
    pub output: PathBuf,
}

/// Runs `crisp pcap`: EX_NOINPUT for an unreadable recording or one with no call, EX_CANTCREAT
/// for a capture that cannot be written.
pub fn run(args: PcapArgs) -> ExitCode {
    let input: Box<dyn BufRead> = match &args.input {
        Some(p) => match File::open(p) {
            Ok(f) => Box::new(BufReader::new(f)),
            Err(e) => {
                eprintln!("crisp pcap: {}: {e}", p.display());
                return ExitCode::from(exit::NOINPUT);
            }
        },
        None => Box::new(io::stdin().lock()),
    };
    let mut capture = None;
    let (mut malformed, mut skipped) = (0u64, 0u64);
    for line in input.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("crisp pcap: reading the recording: {e}");
                return ExitCode::from(exit::NOINPUT);
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
            malformed += 1;
            continue;
        };
        if capture.is_none() {
            // The connection starts at the first event's time.
            let Some(start) = pcap::timestamp(&event) else {
                skipped += 1;
                continue;
            };
            let file = match output::open(&args.output, false) {
                Ok(f) => BufWriter::new(f),
                Err(e) => {
                    eprintln!("crisp pcap: {}: {e}", args.output.display());
                    return ExitCode::from(exit::CANTCREAT);
                }
            };
            match pcap::Capture::new(file, start) {
                Ok(c) => capture = Some(c),
                Err(e) => {
                    eprintln!("crisp pcap: {}: {e}", args.output.display());
                    return ExitCode::from(exit::CANTCREAT);
                }
            }
        }
        let Some(c) = capture.as_mut() else { continue };
        match c.event(&event) {
            Ok(true) => {}
            Ok(false) => skipped += 1,
            Err(e) => {
                eprintln!("crisp pcap: {}: {e}", args.output.display());
                return ExitCode::from(exit::CANTCREAT);
            }
        }
    }
    let Some(mut c) = capture else {
        eprintln!("crisp pcap: no event in the recording (record with `crisp tap -o FILE`)");
        return ExitCode::from(exit::NOINPUT);
    };
    if let Err(e) = c.flush() {
        eprintln!("crisp pcap: {}: {e}", args.output.display());
        return ExitCode::from(exit::CANTCREAT);
    }
    if malformed > 0 {
        eprintln!("crisp pcap: {malformed} lines are not JSON (a recording cut short?); skipped");
    }
    eprintln!(
        "crisp pcap: {} calls written to {} ({skipped} other events: holds as comments, markers)",
        c.calls(),
        args.output.display()
    );
    ExitCode::SUCCESS
}
