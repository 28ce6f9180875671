//! Issue #46, the runtime side of a recorded incident: the README demo's pod runs through crisp
//! on a real containerd while `crisp tap --all --full -o` records it (crisp refuses the app's
//! first CreateContainer: its sidecar is not ready). `crisp replay --as-runtime` then serves that
//! recording on a socket of its own, with containerd and crisp gone, and the kubelet emulator —
//! through kubelet's grpc-go transport, which sends the socket path as `:authority` — runs the
//! same pod against it. The emulator must get the recorded refusal (code and message) and then
//! the recorded container, run and delete the pod on recorded answers alone; the report must
//! have every recorded mutating call answered, and a call the recording lacks answered
//! Unimplemented and listed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use crisp_e2e::crisp::{crisp_binary, Crisp, CrispOpts};
use crisp_e2e::emulator::{connect_uds, Kubelet, KubeletConfig, PodSpec};
use crisp_e2e::fakert::{self, Canned};
use crisp_e2e::grpcgo::{self, bridge_kubelet, CallOpts, GoBridgeOpts};
use crisp_e2e::stack::Stack;
use prost::Message;
use serde_json::Value;

use super::timeline_demo::{await_line, demo_stack, record, run_demo_pod, spawn_attached};

const STEP: Duration = Duration::from_secs(60);

/// Waits until `socket` exists (the server is listening).
async fn await_socket(socket: &Path, server: &mut std::process::Child) -> Result<()> {
    for _ in 0..200 {
        if socket.exists() {
            return Ok(());
        }
        if let Some(status) = server.try_wait()? {
            bail!("crisp replay --as-runtime exited {status} before listening");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{} not there after 10 s", socket.display())
}

/// Starts `crisp replay RECORDING --as-runtime SOCKET --json` and waits until it listens.
async fn serve_as_runtime(recording: &Path, socket: &Path) -> Result<std::process::Child> {
    let mut server = Command::new(crisp_binary()?)
        .arg("replay")
        .arg(recording)
        .arg("--as-runtime")
        .arg(socket)
        .arg("--json")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    await_socket(socket, &mut server).await?;
    Ok(server)
}

/// The recording's lines that parse as JSON.
fn read_lines(recording: &Path) -> Result<Vec<Value>> {
    Ok(std::fs::read_to_string(recording)?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// The handshake a kubelet makes when it starts (Version, then the image service's
/// ImageFsInfo), through grpc-go: the stack's emulator made its own before the tap attached, and
/// a peer's handshake is answered only from a recorded one.
async fn handshake(st: &Stack) -> Result<()> {
    st.via_grpcgo()
        .await?
        .version(k8s_cri::v1::VersionRequest {
            version: "v1".into(),
        })
        .await?;
    k8s_cri::v1::image_service_client::ImageServiceClient::new(
        connect_uds(st.kubelet_endpoint()).await?,
    )
    .image_fs_info(k8s_cri::v1::ImageFsInfoRequest {})
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_refusal_is_served_to_the_emulator_as_the_runtime() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("crisp-asrt-").tempdir()?;
    let recording = dir.path().join("calls.jsonl");
    {
        let st = demo_stack().await?;
        let tap = record(&st, &recording, true).await?;
        handshake(&st).await?;
        run_demo_pod(&st, &recording, tap).await?;
        // The stack (containerd, crisp) goes: only the recording answers from here on.
    }
    let recorded: Vec<Value> = read_lines(&recording)?
        .into_iter()
        .filter(|v| {
            v.get("kind")
                .is_some_and(|k| k == "mutating" || k == "polling")
        })
        .collect();
    let refusal = recorded
        .iter()
        .find(|v| v["method"] == "CreateContainer" && v["code_name"] == "FailedPrecondition")
        .context("the recording has crisp's refusal")?;
    let refusal_message = refusal["message"].as_str().unwrap_or("").to_string();
    let mutating = recorded.iter().filter(|v| v["kind"] == "mutating").count();

    let socket = dir.path().join("replay.sock");
    let server = serve_as_runtime(&recording, &socket).await?;

    let mut cfg = KubeletConfig::fast(&socket, dir.path().join("pods"));
    cfg.root_dir = Some(dir.path().join("kubelet"));
    cfg.container_deletor = false;
    // kubelet's transport: grpc-go, `:authority` the socket path.
    let bridges = bridge_kubelet(&mut cfg, dir.path(), GoBridgeOpts::default())?;
    let kubelet = Kubelet::new(cfg)
        .await
        .context("the emulator's CRI handshake")?;
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("pods/demo.yaml");
    let uid = kubelet.add_pod(PodSpec::from_file(&demo)?.remove(0))?;
    let ran = kubelet.wait_all_running(&uid, STEP).await.map(|_| ());
    let deleted = match ran {
        Ok(()) => {
            kubelet.delete_pod(&uid, None)?;
            kubelet.wait_terminated(&uid, STEP).await.map(|_| ())
        }
        Err(_) => Ok(()),
    };
    let journal = kubelet.journal().clone();
    let creates = journal.container_calls("CreateContainer", "app");
    // A call the recording does not have, through grpc-go too.
    let stray = k8s_cri::v1::StartContainerRequest {
        container_id: "not-in-the-recording".into(),
    };
    let out = grpcgo::call(
        &socket,
        "/runtime.v1.RuntimeService/StartContainer",
        &stray.encode_to_vec(),
        CallOpts {
            timeout: Duration::from_secs(5),
            count: 1,
            concurrency: 1,
            errors: true,
            ..Default::default()
        },
    )
    .await?;
    kubelet.shutdown().await;
    drop(kubelet);
    drop(bridges);

    let pid = server.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status()?;
    let done = tokio::task::spawn_blocking(move || server.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    eprintln!("{stderr}");
    for r in journal.calls().iter().filter(|r| !r.is_polling()) {
        eprintln!("{}", journal.format_record(r));
    }
    let report: Value = serde_json::from_slice(&done.stdout)
        .with_context(|| String::from_utf8_lossy(&done.stdout).into_owned())?;
    eprintln!("{}", serde_json::to_string_pretty(&report)?);
    ran.context("the pod ran on the recorded answers")?;
    deleted.context("and was deleted on them")?;

    ensure!(
        out.summary.codes.get("Unimplemented") == Some(&1)
            && out
                .summary
                .first_error
                .as_deref()
                .is_some_and(|e| e.contains("not-in-the-recording")),
        "an unrecorded call is answered Unimplemented, naming it: {:?}",
        out.summary
    );
    let first = creates
        .first()
        .context("the emulator's CreateContainer app")?;
    ensure!(
        first.code == tonic::Code::FailedPrecondition && first.message == refusal_message,
        "the recorded refusal came back: {:?} {:?} (recorded {refusal_message:?})",
        first.code,
        first.message
    );
    ensure!(
        creates.iter().any(|c| c.is_ok()),
        "then the recorded container"
    );
    let summary = &report["summary"];
    ensure!(
        summary["answered"] == mutating && summary["not_asked"] == 0,
        "every recorded mutating call ({mutating}) answered: {summary}"
    );
    ensure!(
        summary["unmatched"].as_u64() >= Some(1)
            && report["unmatched"]
                .as_array()
                .is_some_and(|u| u.iter().any(|c| c["method"] == "StartContainer"
                    && c["container_id"] == "not-in-the-recording")),
        "the unrecorded call is reported: {}",
        report["unmatched"]
    );
    ensure!(
        report["answered"].as_array().is_some_and(|a| a
            .iter()
            .any(|c| c["method"] == "CreateContainer" && c["code_name"] == "FailedPrecondition")),
        "the refusal is among the answered calls"
    );
    ensure!(
        done.status.code() == Some(1),
        "a call not in the recording makes the exit status 1: {:?}",
        done.status
    );
    Ok(())
}

/// Events a fake runtime streams on each GetContainerEvents in the recording below.
const EVENTS: usize = 5;

/// crisp in front of a fake runtime whose GetContainerEvents streams [`EVENTS`] events, and
/// `crisp tap --all --full -o` recording a call that reads them all: the recording's path.
async fn record_event_stream(dir: &Path) -> Result<std::path::PathBuf> {
    let recording = dir.join("calls.jsonl");
    let fake = fakert::serve(&dir.join("fake.sock"), Arc::new(Canned::new(1, EVENTS)))?;
    let crisp = Crisp::start(&fake.socket, CrispOpts::default())?;
    let mut tap = Command::new(crisp_binary()?);
    tap.args(["tap", "--all", "--json", "--full", "--admin-socket"])
        .arg(crisp.socket().with_file_name("admin.sock"))
        .arg("--output")
        .arg(&recording)
        .stdout(Stdio::null());
    let mut tap = spawn_attached(tap, "crisp tap").await?;
    let mut rt = k8s_cri::v1::runtime_service_client::RuntimeServiceClient::new(
        connect_uds(crisp.socket()).await?,
    );
    let mut events = rt
        .get_container_events(k8s_cri::v1::GetEventsRequest {})
        .await?
        .into_inner();
    let mut read = 0;
    while events.message().await?.is_some() {
        read += 1;
    }
    ensure!(read == EVENTS, "{read} events through crisp");
    await_line(
        &recording,
        &["\"GetContainerEvents\"", "\"code_name\""],
        Duration::from_secs(30),
    )
    .await?;
    tap.kill()?;
    tap.wait()?;
    Ok(recording)
}

/// Issue #46, a recorded stream served back: `crisp replay --as-runtime` serves the recording
/// of [`record_event_stream`], and a grpc-go client (kubelet's transport) calling
/// GetContainerEvents gets the five recorded events, as recorded, and the recorded status; the
/// report counts the messages sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_event_stream_is_served_with_its_messages() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("crisp-asrt-").tempdir()?;
    let recording = record_event_stream(dir.path()).await?;
    let lines = read_lines(&recording)?;
    let recorded: Vec<&Value> = lines
        .iter()
        .filter(|v| v["event"] == "message" && v["method"] == "GetContainerEvents")
        .collect();
    ensure!(
        recorded.len() == EVENTS && recorded.iter().all(|m| m["response"].is_object()),
        "the recording has each event with its view: {recorded:?}"
    );

    let socket = dir.path().join("replay.sock");
    let server = serve_as_runtime(&recording, &socket).await?;
    let out = grpcgo::call(
        &socket,
        "/runtime.v1.RuntimeService/GetContainerEvents",
        &[],
        CallOpts {
            timeout: Duration::from_secs(10),
            stream: true,
            ..Default::default()
        },
    )
    .await?;
    let pid = server.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status()?;
    let done = tokio::task::spawn_blocking(move || server.wait_with_output()).await??;
    eprintln!("{}", String::from_utf8_lossy(&done.stderr));
    let report: Value = serde_json::from_slice(&done.stdout)
        .with_context(|| String::from_utf8_lossy(&done.stdout).into_owned())?;
    eprintln!("{}", serde_json::to_string_pretty(&report)?);

    let call = out.calls.first().context("the grpc-go call's result")?;
    ensure!(call.code == "OK", "the recorded status: {call:?}");
    let got: Vec<k8s_cri::v1::ContainerEventResponse> = call
        .responses_hex
        .iter()
        .map(|h| {
            let bytes = (0..h.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&h[i..i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()?;
            Ok(k8s_cri::v1::ContainerEventResponse::decode(
                bytes.as_slice(),
            )?)
        })
        .collect::<Result<_>>()?;
    ensure!(
        got.len() == EVENTS,
        "every recorded event sent: {} of {EVENTS}",
        got.len()
    );
    for (event, line) in got.iter().zip(&recorded) {
        ensure!(
            event.container_id == line["response"]["container_id"].as_str().unwrap_or("?")
                && event.containers_statuses.len() == 1,
            "as recorded: {event:?} against {line}"
        );
    }
    ensure!(
        report["streams"][0]["sent"] == EVENTS
            && report["summary"]["stream_messages_sent"] == EVENTS,
        "the report counts the messages sent: {}",
        report["streams"]
    );
    Ok(())
}

/// Issue #46, the kubelet side of a recorded stream: `crisp replay` sends the recorded
/// GetContainerEvents to a runtime and reads its stream to its end. A runtime that streams the
/// five recorded events is the same; one that streams three differs in its message count, in
/// the report and its exit status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_event_stream_is_replayed_and_its_messages_counted() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("crisp-replay-").tempdir()?;
    let recording = record_event_stream(dir.path()).await?;
    for (now, differs) in [(EVENTS, false), (3, true)] {
        let fake = fakert::serve(
            &dir.path().join(format!("now-{now}.sock")),
            Arc::new(Canned::new(1, now)),
        )?;
        let out = tokio::process::Command::new(crisp_binary()?)
            .arg("replay")
            .arg(&recording)
            .arg("--runtime")
            .arg(&fake.socket)
            .arg("--json")
            .stdin(Stdio::null())
            .output()
            .await?;
        let report: Value = serde_json::from_slice(&out.stdout)
            .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
        let call = report["calls"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["method"] == "GetContainerEvents"))
            .with_context(|| format!("the stream in the report: {report}"))?;
        ensure!(
            call["messages"] == serde_json::json!({"recorded": EVENTS, "now": now})
                && call["now"]["code_name"] == "OK",
            "{now} events read, {EVENTS} recorded: {call}"
        );
        let counted = call["differences"]
            .as_array()
            .is_some_and(|d| d.iter().any(|d| d["kind"] == "messages"));
        ensure!(
            counted == differs && out.status.code() == Some(i32::from(differs)),
            "a differing count is a difference ({differs}): {call}, exit {:?}",
            out.status
        );
    }
    Ok(())
}
