//! `crisp timeline`: reads a tap recording (or the live tap) and prints
//! [`crisp::cli::timeline`]'s waterfall, optionally writing its SVG.

use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use crisp::admin_api as pb;
use crisp::cli::timeline::{self, Parsed, Pod, TEXT_WIDTH};
use crisp::cli::{client, view};

use super::exit;
use super::tap::AdminSocketArgs;

/// Draw one pod's CRI calls as a waterfall, from a recorded tap.
///
/// Reads JSON lines written by `crisp tap -o FILE` (or `crisp tap --json`), from INPUT or
/// standard input; or, with --live, attaches to the running crisp and draws on Ctrl-C. Each row
/// is one call: its forwarded time (█), the time crisp held it (░),
/// and failed or refused calls (×) with their status. Polling calls are left out, except
/// ImageStatus (record with `crisp tap --all -o FILE` to have those).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TimelineArgs {
    /// The tap recording (JSON lines) [default: standard input].
    #[arg(value_name = "INPUT.jsonl")]
    pub input: Option<PathBuf>,
    /// The pod to draw (`namespace/name`, or `name` if it is unique). Without it: every pod in
    /// the file.
    #[arg(long, value_name = "NS/NAME")]
    pub pod: Option<String>,
    /// Also write the timeline as a self-contained SVG file (needs one pod: --pod when the file
    /// has several).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Draw the pod as a sequence instead of a waterfall: kubelet, crisp and the runtime as
    /// lanes, each call as arrows, a hold as the gap before crisp's forward with its probe
    /// rounds beside it. Prints Mermaid text (paste it into an issue or a doc); --svg writes the
    /// same as a picture. Needs one pod (--pod when the recording has several).
    #[arg(long)]
    pub sequence: bool,
    /// Include polling calls (ContainerStatus, PodSandboxStatus, ...).
    #[arg(long)]
    pub all: bool,
    /// Attach to the running crisp's tap instead of reading a recording; draw on Ctrl-C (or
    /// after --count calls).
    #[arg(long, conflicts_with = "input")]
    pub live: bool,
    /// With --live: crisp's admin socket [default: `admin.socket` from the config].
    #[arg(long, value_name = "PATH", requires = "live")]
    pub admin_socket: Option<PathBuf>,
    /// With --live: the config file to read the admin socket from.
    #[arg(long, short = 'c', value_name = "FILE", requires = "live")]
    pub config: Option<PathBuf>,
    /// With --live: draw after this many calls.
    #[arg(long, value_name = "N", requires = "live")]
    pub count: Option<u64>,
}

/// Runs `crisp timeline`: EX_USAGE for bad flags or a pod not in the recording, EX_NOINPUT for
/// an unreadable or empty one, EX_UNAVAILABLE for no crisp to attach to, EX_CANTCREAT for an
/// SVG that cannot be written.
pub fn run(args: TimelineArgs) -> ExitCode {
    let parsed = if args.live {
        match live(&args) {
            Ok(p) => p,
            Err(code) => return code,
        }
    } else {
        let read = match &args.input {
            Some(p) => std::fs::File::open(p).map(|f| timeline::parse(io::BufReader::new(f))),
            None => Ok(timeline::parse(io::stdin().lock())),
        };
        match read.and_then(|r| r) {
            Ok(p) => p,
            Err(e) => {
                eprintln!(
                    "crisp timeline: {}: {e}",
                    args.input
                        .as_ref()
                        .map_or("stdin".into(), |p| p.display().to_string())
                );
                return ExitCode::from(exit::NOINPUT);
            }
        }
    };
    if parsed.malformed > 0 {
        eprintln!(
            "crisp timeline: {} lines are not JSON (a recording cut short?); skipped",
            parsed.malformed
        );
    }
    let mut pods = timeline::group(parsed.calls, args.all);
    timeline::attach_holds(&mut pods, parsed.holds);
    let chosen: Vec<&Pod> = match &args.pod {
        Some(want) => match timeline::select(&pods, want) {
            Ok(p) => vec![p],
            Err(e) => {
                eprintln!("crisp timeline: {e}");
                return ExitCode::from(exit::USAGE);
            }
        },
        None => pods.iter().collect(),
    };
    if chosen.is_empty() {
        eprintln!(
            "crisp timeline: no pod's calls in the recording (record with `crisp tap -o FILE`)"
        );
        return ExitCode::from(exit::NOINPUT);
    }
    if args.sequence || args.svg.is_some() {
        let [pod] = chosen.as_slice() else {
            eprintln!(
                "crisp timeline: {} draws one pod; choose one with --pod: {}",
                if args.sequence { "--sequence" } else { "--svg" },
                timeline::list(&pods)
            );
            return ExitCode::from(exit::USAGE);
        };
        if let Some(path) = &args.svg {
            let picture = if args.sequence {
                timeline::sequence_svg(pod)
            } else {
                timeline::svg(pod)
            };
            if let Err(e) = std::fs::write(path, picture) {
                eprintln!("crisp timeline: {}: {e}", path.display());
                return ExitCode::from(exit::CANTCREAT);
            }
        }
        if args.sequence {
            print!("{}", timeline::mermaid(pod));
            return ExitCode::SUCCESS;
        }
    }
    let mut out = String::new();
    for (i, pod) in chosen.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&timeline::text(pod, TEXT_WIDTH));
    }
    print!("{out}");
    ExitCode::SUCCESS
}

/// The calls a live tap shows until Ctrl-C or `--count` ([`timeline::live_request`] says
/// which); `--pod` is applied afterwards, since ImageStatus names no pod.
fn live(args: &TimelineArgs) -> Result<Parsed, ExitCode> {
    let fail = |code: u8, msg: String| {
        eprintln!("crisp timeline: {msg}");
        ExitCode::from(code)
    };
    let admin = AdminSocketArgs {
        admin_socket: args.admin_socket.clone(),
        config: args.config.clone(),
    };
    let socket = admin.path().map_err(|e| fail(exit::USAGE, e))?;
    let request = timeline::live_request(args.all);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| fail(1, format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async {
        let mut admin = client::connect(&socket).await.map_err(|e| {
            fail(
                exit::UNAVAILABLE,
                format!(
                    "cannot connect to {}: {} (is crisp running? the admin socket is root-only by default)",
                    socket.display(),
                    super::chain(e)
                ),
            )
        })?;
        let mut stream = admin
            .tap(request)
            .await
            .map_err(|s| fail(exit::UNAVAILABLE, format!("{}: {}", s.code(), s.message())))?
            .into_inner();
        // Scripts (and tests) wait for this line before they start the pod.
        eprintln!(
            "crisp timeline: attached to {}; drawing on Ctrl-C",
            socket.display()
        );
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        let mut out = Parsed::default();
        while args.count.is_none_or(|n| (out.calls.len() as u64) < n) {
            let msg = tokio::select! {
                _ = &mut ctrl_c => break,
                m = stream.message() => m,
            };
            match msg {
                Ok(Some(pb::TapEvent { event: Some(e) })) => {
                    let line = view::json_line(&e);
                    match (timeline::call_of(&line), timeline::hold_of(&line)) {
                        (Some(c), _) => out.calls.push(c),
                        (None, Some(h)) => out.holds.push(h),
                        (None, None) => out.skipped += 1,
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(s) => {
                    return Err(fail(
                        exit::UNAVAILABLE,
                        format!("stream failed: {}: {}", s.code(), s.message()),
                    ))
                }
            }
        }
        Ok(out)
    })
}
