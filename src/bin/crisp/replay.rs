//! `crisp replay`: plays the kubelet side of a tap recording against a CRI runtime and prints
//! [`crisp::cli::replay`]'s report; with `--as-runtime`, plays the runtime side to a peer
//! instead ([`crisp::cli::replay::Script`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crisp::cli::replay::{self, Options, Pace, Runtime};
use crisp::config::Config;

use super::exit;

/// Replay a recorded pod (or node) against a CRI runtime and report what answers differently.
///
/// Plays the kubelet side of a tap recording (`crisp tap --full -o FILE`; `--all` to have the
/// polling calls too) against the CRI socket --runtime: a containerd, or crisp in front of one.
/// Each call is sent at its recorded offset (÷ --speed), concurrent calls stay concurrent, and
/// ids the runtime hands out anew (sandboxes, containers) are rewritten in later requests; a call
/// naming an id no replayed call made is reported, not sent. The report compares each answer
/// with the recorded one: status and message, duration (beyond --tolerance: a hold that is
/// gone, a call that is slow now) and order (answered before another call in the recording,
/// after it now), and lists the fields replayed redacted (env values, command lines, registry
/// auth: the recording never has them).
///
/// This creates real sandboxes and containers, under a new pod uid, without container logs.
/// Sandboxes the replay made are stopped and removed at the end or on Ctrl-C (not with --keep).
/// The runtime kubelet uses (crisp's upstream or listen socket in its config) is refused
/// without --yes: kubelet would see, and remove, pods it does not know.
///
/// With --as-runtime SOCKET instead, crisp plays the runtime side: it listens on SOCKET and
/// answers a kubelet, crictl or the kubelet emulator with the recorded answers — status,
/// message and response of the recorded call that matches each call (same method, same ids:
/// the recorded answers hand out the recorded ids). Mutating calls are answered once each in
/// recorded order; polling calls (Version, Status, List*, *Status) with the latest recorded
/// answer at the point reached. A call the recording does not have is answered Unimplemented.
/// Answers keep what the recording redacted (never a value it does not have). --speed X delays
/// each answer by its recorded duration ÷ X; without it, answers come at once. Ctrl-C or
/// SIGTERM ends it and prints what was answered, what was not in the recording, recorded calls
/// never made, and answers given in another order than recorded.
///
/// Exit status: 0 when every call was replayed and answered as recorded (--as-runtime: every
/// call was in the recording, every recorded mutating call made, in order), 1 otherwise; 64
/// for bad flags, 66 for an unreadable recording, 69 for no runtime (or a socket it cannot
/// listen on).
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The tap recording (JSON lines, `crisp tap --full -o FILE`).
    #[arg(value_name = "FILE.jsonl")]
    pub input: PathBuf,
    /// The CRI runtime's socket to replay against (containerd's, or a crisp's).
    #[arg(long, value_name = "SOCKET", required_unless_present = "as_runtime")]
    pub runtime: Option<PathBuf>,
    /// Play the recording's runtime side instead, listening on SOCKET (a new path) for a
    /// kubelet, crictl or the emulator; every call of the file (polling calls included).
    #[arg(long, value_name = "SOCKET", conflicts_with_all = [
        "runtime", "pod", "as_fast_as_possible", "all", "keep", "yes", "tolerance", "timeout",
    ])]
    pub as_runtime: Option<PathBuf>,
    /// Replay one pod (`namespace/name`, or `name` if unique). Without it: every call in the file.
    #[arg(long, value_name = "NS/NAME")]
    pub pod: Option<String>,
    /// Send calls at their recorded offsets divided by X (2: twice as fast) [default: 1].
    /// With --as-runtime: answer each call after its recorded duration divided by X.
    #[arg(long, value_name = "X", value_parser = speed)]
    pub speed: Option<f64>,
    /// Send each call once the calls answered before it in the recording are answered now.
    #[arg(long, conflicts_with = "speed")]
    pub as_fast_as_possible: bool,
    /// Replay polling calls too (List*, *Status, Version), as `crisp tap --all` shows them.
    #[arg(long)]
    pub all: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// A duration differs when it is this many milliseconds off the recorded one.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub tolerance: u64,
    /// Longest a call may take, in seconds (its deadline on the runtime too).
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub timeout: u64,
    /// Leave the sandboxes the replay made (default: stop and remove them at the end).
    #[arg(long)]
    pub keep: bool,
    /// Replay even against the runtime the node's kubelet uses (crisp's upstream or listen).
    #[arg(long)]
    pub yes: bool,
    /// crisp's config file, to know the node's runtime socket [default: crisp's default path].
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
}

fn speed(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 && x <= 1000.0 => Ok(x),
        _ => Err(format!("{s:?}: a factor above 0, at most 1000")),
    }
}

/// Runs `crisp replay`.
pub fn run(args: ReplayArgs) -> ExitCode {
    let fail = |code: u8, msg: String| {
        eprintln!("crisp replay: {msg}");
        ExitCode::from(code)
    };
    let Some(runtime) = args.runtime.clone() else {
        return match args.as_runtime.clone() {
            Some(socket) => as_runtime(&args, &socket),
            None => fail(exit::USAGE, "--runtime or --as-runtime is needed".into()),
        };
    };
    if let Err(msg) = check_target(&args, &runtime) {
        return fail(exit::USAGE, msg);
    }
    let plan = match std::fs::File::open(&args.input) {
        Ok(f) => replay::plan(std::io::BufReader::new(f), args.pod.as_deref(), args.all),
        Err(e) => return fail(exit::NOINPUT, format!("{}: {e}", args.input.display())),
    };
    let plan = match plan {
        Ok(p) => p,
        Err(replay::PlanError::Pod(e)) => return fail(exit::USAGE, e),
        Err(e) => return fail(exit::NOINPUT, format!("{}: {e}", args.input.display())),
    };
    if plan.malformed > 0 {
        eprintln!(
            "crisp replay: {} lines are not JSON (a recording cut short?); skipped",
            plan.malformed
        );
    }
    let pace = if args.as_fast_as_possible {
        Pace::AsFastAsPossible
    } else {
        Pace::Recorded(args.speed.unwrap_or(1.0))
    };
    // What it will do, before it does it.
    eprintln!(
        "crisp replay: {} — {} calls recorded over {:.2}s, against {}; sandboxes it creates: {}{}",
        plan.scope,
        plan.steps.len(),
        plan.span().as_secs_f64(),
        runtime.display(),
        plan.sandboxes(),
        if args.keep {
            " and leaves them (--keep)"
        } else {
            ", stopped and removed at the end or on Ctrl-C"
        }
    );
    if plan.without_request() > 0 {
        eprintln!(
            "crisp replay: {} calls have no recorded request and will not be sent (record with `crisp tap --full`)",
            plan.without_request()
        );
    }
    let opts = Options {
        pace,
        timeout: Duration::from_secs(args.timeout.max(1)),
        keep: args.keep,
        tolerance: Duration::from_millis(args.tolerance),
    };
    let report = super::block_on("replay", async {
        let runtime = Runtime::connect(&runtime).await.map_err(|e| {
            fail(
                exit::UNAVAILABLE,
                format!(
                    "cannot connect to {}: {}",
                    runtime.display(),
                    super::chain(e)
                ),
            )
        })?;
        let interrupt = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        Ok(replay::play(&plan, &runtime, &opts, interrupt).await)
    });
    let report = match report {
        Some(Ok(r)) => r,
        Some(Err(code)) => return code,
        None => return ExitCode::FAILURE,
    };
    let shown = if args.json {
        report.json_text()
    } else {
        report.text()
    };
    print_report(&shown, args.json, report.differs())
}

/// Prints a report (`json`: one JSON object on a line of its own); fails when it says the
/// runtime answered differently.
fn print_report(shown: &str, json: bool, differs: bool) -> ExitCode {
    if json {
        println!("{shown}");
    } else {
        print!("{shown}");
    }
    if differs {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Refuses the node's own runtime without `--yes`: crisp's upstream, or its listen socket.
fn check_target(args: &ReplayArgs, runtime: &Path) -> Result<(), String> {
    if args.yes {
        return Ok(());
    }
    let config = Config::load(args.config.as_deref()).map_err(super::chain)?;
    let same = |p: &Path| match (p.canonicalize(), runtime.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => p == runtime,
    };
    for (what, socket) in [
        (
            "the runtime crisp forwards to (its `upstream`)",
            &config.upstream,
        ),
        ("crisp's own socket (kubelet's runtime)", &config.listen),
    ] {
        if same(socket) {
            return Err(format!(
                "{} is {what}: a replay there creates pods this node's kubelet does not know \
                 (and removes as strays); use a runtime of its own (hack/demo.sh starts one), \
                 or pass --yes",
                runtime.display()
            ));
        }
    }
    Ok(())
}

/// Runs `crisp replay --as-runtime SOCKET`: serves the recording's runtime side on `socket`
/// until Ctrl-C or SIGTERM, then prints what it answered against the recording.
fn as_runtime(args: &ReplayArgs, socket: &Path) -> ExitCode {
    let fail = |code: u8, msg: String| {
        eprintln!("crisp replay: {msg}");
        ExitCode::from(code)
    };
    let plan = match std::fs::File::open(&args.input) {
        Ok(f) => replay::plan(std::io::BufReader::new(f), None, true),
        Err(e) => return fail(exit::NOINPUT, format!("{}: {e}", args.input.display())),
    };
    let plan = match plan {
        Ok(p) => p,
        Err(e) => return fail(exit::NOINPUT, format!("{}: {e}", args.input.display())),
    };
    if plan.malformed > 0 {
        eprintln!(
            "crisp replay: {} lines are not JSON (a recording cut short?); skipped",
            plan.malformed
        );
    }
    // Never replaces a socket (or anything) at that path: it may be a live runtime's.
    if socket.symlink_metadata().is_ok() {
        return fail(
            exit::USAGE,
            format!(
                "{} exists: --as-runtime listens on a new path (remove it first if it is stale)",
                socket.display()
            ),
        );
    }
    let (calls, mutating) = (plan.steps.len(), plan.mutating());
    let script = Arc::new(parking_lot::Mutex::new(replay::Script::new(
        plan, args.speed,
    )));
    let served = super::block_on("replay", async {
        let listener = tokio::net::UnixListener::bind(socket).map_err(|e| {
            fail(
                exit::UNAVAILABLE,
                format!("cannot listen on {}: {e}", socket.display()),
            )
        })?;
        // The answers are a node's recorded calls: for the socket's owner only.
        let _ = std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600));
        eprintln!(
            "crisp replay: serving {} as the runtime on {}: {calls} recorded calls, {mutating} \
             mutating; answers {}; Ctrl-C or SIGTERM ends it and prints the report",
            args.input.display(),
            socket.display(),
            match args.speed {
                Some(x) => format!("after their recorded duration ÷ {x}"),
                None => "at once".to_string(),
            }
        );
        replay::serve_script(listener, script.clone(), interrupted()).await;
        Ok(())
    });
    let _ = std::fs::remove_file(socket);
    match served {
        Some(Ok(())) => {}
        Some(Err(code)) => return code,
        None => return ExitCode::FAILURE,
    }
    let report = script.lock().report();
    let shown = if args.json {
        report.json_text()
    } else {
        report.text()
    };
    print_report(&shown, args.json, report.differs())
}

/// Resolves on Ctrl-C or SIGTERM (how a test or a unit stops the server).
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
