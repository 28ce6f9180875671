//! Issue #21 item 3 end to end: the README demo's pod (e2e/pods/demo.yaml: an app listed before
//! its proxy sidecar, which needs 3 s to get ready) runs through crisp on a real containerd, via
//! kubelet's grpc-go transport; a real `crisp tap` records it, `crisp timeline` draws it, and
//! librsvg renders the SVG. The picture must show the app's refusal and its start hold, and the
//! proxy's stop hold, in their colours.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use crisp::cli::timeline::{colour, TEXT_WIDTH};
use crisp_e2e::crisp::crisp_binary;
use crisp_e2e::emulator::PodSpec;
use crisp_e2e::picture::{render_svg, Picture};
use crisp_e2e::stack::{Stack, StackOpts};
use tokio::time::Instant;

const STEP: Duration = Duration::from_secs(60);

/// Waits until `file` has a line containing every one of `needles`.
pub(crate) async fn await_line(file: &Path, needles: &[&str], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.lines().any(|l| needles.iter().all(|n| l.contains(n))) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "no line with {needles:?} in {} within {timeout:?}:\n{text}",
                file.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies `files` to `$CRISP_TIMELINE_KEEP_DIR`, when set: to look at the picture.
fn keep(files: &[&Path]) -> Result<()> {
    if let Some(dir) = std::env::var_os("CRISP_TIMELINE_KEEP_DIR") {
        for f in files {
            if f.exists() {
                std::fs::copy(f, Path::new(&dir).join(f.file_name().unwrap_or_default()))?;
            }
        }
    }
    Ok(())
}

/// Starts `cmd` (a `crisp tap` or `crisp timeline --live` on the admin socket) and waits until it
/// says its subscription is live ("attached to" on stderr).
pub(crate) async fn spawn_attached(mut cmd: Command, what: &str) -> Result<Child> {
    let mut child = cmd.stdin(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let stderr = child.stderr.take().context("stderr")?;
    let attached = tokio::task::spawn_blocking(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("attached to"))
    });
    ensure!(
        tokio::time::timeout(Duration::from_secs(20), attached).await??,
        "{what} did not attach"
    );
    Ok(child)
}

/// The stack the demo pod runs on: CNI, and the emulator reaching crisp through grpc-go, as
/// kubelet does.
pub(crate) async fn demo_stack() -> Result<Stack> {
    Stack::start_with(
        StackOpts {
            cni: true,
            via_grpcgo: true,
            ..Default::default()
        },
        |_| {},
    )
    .await
}

/// `crisp tap --all --json [--full] --output RECORDING` on the stack's admin socket, attached
/// (polling calls too: ImageStatus is one).
pub(crate) async fn record(st: &Stack, recording: &Path, full: bool) -> Result<Child> {
    let admin = st.crisp.socket().with_file_name("admin.sock");
    let mut tap = Command::new(crisp_binary()?);
    tap.args(["tap", "--all", "--json", "--admin-socket"])
        .arg(&admin)
        .arg("--output")
        .arg(recording)
        .stdout(Stdio::null());
    if full {
        tap.arg("--full");
    }
    spawn_attached(tap, "crisp tap").await
}

/// Runs the README demo's pod (e2e/pods/demo.yaml) and deletes it; returns once `recording`
/// has its StopPodSandbox, with the tap (`tap`) stopped.
pub(crate) async fn run_demo_pod(st: &Stack, recording: &Path, mut tap: Child) -> Result<()> {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("pods/demo.yaml");
    let uid = st
        .run_pod(PodSpec::from_file(&demo)?.remove(0), STEP)
        .await?;
    st.delete_pod(&uid, None, STEP).await?;
    await_line(
        recording,
        &["\"StopPodSandbox\"", "\"web\""],
        Duration::from_secs(30),
    )
    .await?;
    tap.kill()?;
    tap.wait()?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_pod_timeline_renders_its_holds_and_refusal() -> Result<()> {
    let st = demo_stack().await?;
    ensure!(
        !st.bridges.is_empty(),
        "the emulator reaches crisp through grpc-go"
    );
    let out_dir = tempfile::Builder::new()
        .prefix("crisp-timeline-")
        .tempdir()?;
    let recording = out_dir.path().join("calls.jsonl");
    let tap = record(&st, &recording, false).await?;
    let admin = st.crisp.socket().with_file_name("admin.sock");

    // And the live view: `crisp timeline --live` attached to the same crisp, drawing on Ctrl-C.
    let live_svg = out_dir.path().join("live.svg");
    let mut live = Command::new(crisp_binary()?);
    live.args(["timeline", "--live", "--pod", "demo/web", "--admin-socket"])
        .arg(&admin)
        .arg("--svg")
        .arg(&live_svg)
        .stdout(Stdio::piped());
    let live = spawn_attached(live, "crisp timeline --live").await?;

    run_demo_pod(&st, &recording, tap).await?;
    Command::new("kill")
        .args(["-INT", &live.id().to_string()])
        .status()?;
    let live_out = tokio::task::spawn_blocking(move || live.wait_with_output());
    let live_out = tokio::time::timeout(Duration::from_secs(20), live_out).await???;
    let live_text = String::from_utf8_lossy(&live_out.stdout).into_owned();
    ensure!(
        live_out.status.success(),
        "crisp timeline --live exited {}",
        live_out.status
    );
    eprintln!("--- live ---\n{live_text}");
    ensure!(
        live_text.starts_with("demo/web")
            && live_text
                .lines()
                .any(|l| l.starts_with("CreateContainer   app") && l.contains(" held ")),
        "live view: {live_text}"
    );
    render_svg(&live_svg)?;

    let svg = out_dir.path().join("web.svg");
    let out = Command::new(crisp_binary()?)
        .args(["timeline", "--pod", "demo/web", "--svg"])
        .arg(&svg)
        .arg(&recording)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    keep(&[&recording, &svg])?;
    ensure!(
        out.status.success(),
        "crisp timeline: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    ensure!(
        text.lines().all(|l| l.chars().count() <= TEXT_WIDTH),
        "wider than {TEXT_WIDTH} columns"
    );
    let rows: Vec<&str> = text.lines().filter(|l| l.contains('|')).collect();
    let row = |method: &str, target: &str| {
        rows.iter()
            .filter(|r| r.split_whitespace().take(2).eq([method, target]))
            .copied()
            .collect::<Vec<_>>()
    };
    ensure!(
        row("RunPodSandbox", "pod").len() == 1,
        "one sandbox: {rows:?}"
    );
    ensure!(
        row("ImageStatus", "proxy").len() + row("ImageStatus", "app").len() >= 2,
        "ImageStatus calls attributed to the pod's containers"
    );
    let app_creates = row("CreateContainer", "app");
    ensure!(
        app_creates
            .iter()
            .any(|r| r.contains("FailedPrecondition") && r.contains('×')),
        "the app's refusal: {app_creates:?}"
    );
    // The proxy sleeps 3 s before it serves.
    let held_create = app_creates
        .iter()
        .find(|r| r.contains(" held "))
        .context("the app's held CreateContainer")?;
    ensure!(held_create.contains('░'), "{held_create}");
    ensure!(
        row("StopContainer", "proxy")
            .iter()
            .any(|r| r.contains(" held ")),
        "the proxy's stop hold: {rows:?}"
    );
    ensure!(row("StopPodSandbox", "pod").len() == 1);

    let png = render_svg(&svg)?;
    keep(&[&png])?;
    let pic = Picture::load(&png)?;
    let (held, failed) = (pic.count(colour::HELD), pic.count(colour::FAILED));
    eprintln!(
        "picture {}x{}: {held} px held colour, {failed} px failure colour",
        pic.width, pic.height
    );
    ensure!(
        pic.width == 1100 && pic.height as usize > 78 + rows.len() * 20,
        "{}x{} for {} rows",
        pic.width,
        pic.height,
        rows.len()
    );
    // Legend swatch 140 px; a 3 s hold in a ~10 s timeline spans ~180 px of 600, 12 px high.
    ensure!(held > 140 + 12 * 100, "{held} px of the held colour");
    ensure!(failed > 140, "{failed} px of the failure colour");
    Ok(())
}
