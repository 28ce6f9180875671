//! Issue #46, the writing side of a recording's snapshot: kubelet's handshake (Version,
//! ImageFsInfo) goes through crisp *before* `crisp tap --full -o` starts, so the recording has
//! none of it. `crisp tap -o` asks crisp for the runtime's snapshot by default: the file must
//! open with crisp's own Version, RuntimeConfig, Status and ImageFsInfo, each marked
//! `"snapshot": true` with its answer, before the first live call; and `crisp replay
//! --as-runtime` must answer a fresh client's handshake from them. With `--no-snapshot` the
//! file has no such line. The runtime is the fake (`fakert`): its answers are known.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use crisp_e2e::crisp::{crisp_binary, Crisp, CrispOpts};
use crisp_e2e::emulator::connect_uds;
use crisp_e2e::fakert::{self, Canned};
use serde_json::Value;

use super::timeline_demo::{await_line, spawn_attached};

type Runtime = k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;
type Images = k8s_cri::v1::image_service_client::ImageServiceClient<tonic::transport::Channel>;

/// What a kubelet's handshake reads: Version, then the image service's ImageFsInfo.
type Handshake = (
    k8s_cri::v1::VersionResponse,
    k8s_cri::v1::ImageFsInfoResponse,
);

/// The handshake a kubelet makes when it connects, through `socket`.
async fn handshake(socket: &Path) -> Result<Handshake> {
    let version = Runtime::new(connect_uds(socket).await?)
        .version(k8s_cri::v1::VersionRequest {
            version: "0.1.0".into(),
        })
        .await?
        .into_inner();
    let fs = Images::new(connect_uds(socket).await?)
        .image_fs_info(k8s_cri::v1::ImageFsInfoRequest {})
        .await?
        .into_inner();
    Ok((version, fs))
}

/// `crisp tap --full -o recording` (and `extra` flags) on `crisp`'s admin socket, attached.
async fn record(crisp: &Crisp, recording: &Path, extra: &[&str]) -> Result<std::process::Child> {
    let mut tap = Command::new(crisp_binary()?);
    tap.args(["tap", "--full", "--admin-socket"])
        .arg(crisp.socket().with_file_name("admin.sock"))
        .arg("-o")
        .arg(recording)
        .args(extra)
        .stdout(Stdio::null());
    spawn_attached(tap, "crisp tap").await
}

/// A mutating call through crisp, made once the tap attached: the recording's first live line.
async fn live_call(crisp: &Crisp) -> Result<()> {
    Runtime::new(connect_uds(crisp.socket()).await?)
        .remove_pod_sandbox(k8s_cri::v1::RemovePodSandboxRequest {
            pod_sandbox_id: "live-after-the-snapshot".into(),
        })
        .await?;
    Ok(())
}

fn lines(recording: &Path) -> Result<Vec<Value>> {
    std::fs::read_to_string(recording)?
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// Records with `crisp tap --full -o recording` and `flags` while one live call
/// (RemovePodSandbox) goes through crisp: the recording's lines once that call is in it.
async fn record_a_live_call(crisp: &Crisp, recording: &Path, flags: &[&str]) -> Result<Vec<Value>> {
    let mut tap = record(crisp, recording, flags).await?;
    live_call(crisp).await?;
    await_line(
        recording,
        &["\"RemovePodSandbox\""],
        Duration::from_secs(30),
    )
    .await?;
    tap.kill()?;
    tap.wait()?;
    lines(recording)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_begins_with_the_runtimes_snapshot_and_replays_a_handshake() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("crisp-snap-").tempdir()?;
    let fake = fakert::serve(&dir.path().join("fake.sock"), Arc::new(Canned::new(1, 0)))?;
    let crisp = Crisp::start(&fake.socket, CrispOpts::default())?;
    // kubelet connected long before anyone records.
    let through_crisp = handshake(crisp.socket()).await?;
    ensure!(through_crisp.0.runtime_name == "fake", "{through_crisp:?}");

    let recording = dir.path().join("calls.jsonl");
    let lines = record_a_live_call(&crisp, &recording, &[]).await?;
    let methods: Vec<&str> = lines
        .iter()
        .map(|l| l["method"].as_str().unwrap_or("?"))
        .collect();
    ensure!(
        methods[..]
            == [
                "Version",
                "RuntimeConfig",
                "Status",
                "ImageFsInfo",
                "RemovePodSandbox"
            ],
        "the snapshot first, then the live call: {methods:?}"
    );
    for l in &lines[..4] {
        ensure!(
            l["snapshot"] == true
                && l["code_name"] == "OK"
                && l["response"].is_object()
                && l["cri_version"] == "v1"
                && l["redacted"] == true,
            "a snapshot line with its answer: {l}"
        );
    }
    ensure!(
        lines[0]["response"]["runtime_name"] == "fake"
            && lines[0]["path"] == "/runtime.v1.RuntimeService/Version"
            && lines[3]["path"] == "/runtime.v1.ImageService/ImageFsInfo"
            && lines[3]["response"]["image_filesystems"][0]["fs_id"]["mountpoint"]
                == "/var/lib/fake/images",
        "the runtime's Version, and ImageFsInfo of the ImageService: {} / {}",
        lines[0],
        lines[3]
    );
    ensure!(
        lines[2]["response"]["status"]["conditions"][0]["type"] == "RuntimeReady",
        "the runtime's Status: {}",
        lines[2]
    );
    ensure!(
        lines[4].get("snapshot").is_none(),
        "a live call is no snapshot: {}",
        lines[4]
    );

    // crisp and the runtime gone, the recording answers a fresh client's handshake: it has no
    // Version or ImageFsInfo of kubelet's, only the snapshot's.
    drop(crisp);
    drop(fake);
    let socket = dir.path().join("replay.sock");
    let mut server = Command::new(crisp_binary()?)
        .arg("replay")
        .arg(&recording)
        .arg("--as-runtime")
        .arg(&socket)
        .arg("--json")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut listening = false;
    for _ in 0..200 {
        if socket.exists() {
            listening = true;
            break;
        }
        if let Some(status) = server.try_wait()? {
            bail!("crisp replay --as-runtime exited {status} before listening");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(listening, "crisp replay --as-runtime is not listening");
    let replayed = handshake(&socket).await;
    let pid = server.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status()?;
    let done = tokio::task::spawn_blocking(move || server.wait_with_output()).await??;
    eprintln!("{}", String::from_utf8_lossy(&done.stderr));
    let replayed = replayed.context("the handshake against the recording")?;
    ensure!(
        replayed == through_crisp,
        "the snapshot's answers: {replayed:?}, the runtime's {through_crisp:?}"
    );
    Ok(())
}

/// `--no-snapshot`: a recording of live calls only, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_snapshot_records_live_calls_only() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("crisp-snap-").tempdir()?;
    let fake = fakert::serve(&dir.path().join("fake.sock"), Arc::new(Canned::new(1, 0)))?;
    let crisp = Crisp::start(&fake.socket, CrispOpts::default())?;
    let recording = dir.path().join("calls.jsonl");
    let lines = record_a_live_call(&crisp, &recording, &["--no-snapshot"]).await?;
    ensure!(
        lines.len() == 1 && lines[0]["method"] == "RemovePodSandbox",
        "{lines:?}"
    );
    Ok(())
}
