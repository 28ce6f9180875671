//! crisp's own socket over its life: graceful shutdown drains in-flight calls and removes the
//! socket file; a stale socket file is replaced at start, a live one is refused.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use tokio::net::UnixStream;

use crate::support::*;
use k8s_cri::v1::{ExecSyncRequest, ExecSyncResponse, VersionRequest};

const EXEC_SYNC: &str = "/runtime.v1.RuntimeService/ExecSync";

/// Polls (with a deadline) until something listens on `path`.
async fn wait_listening(path: &Path) {
    within(
        PATIENCE,
        &format!("crisp to listen on {}", path.display()),
        async {
            while UnixStream::connect(path).await.is_err() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
}

fn run_daemon(
    cfg: crisp::config::Config,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), crisp::daemon::Error>>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(crisp::daemon::run(cfg, async {
        let _ = rx.await;
    }));
    (tx, task)
}

/// A fake runtime, and a fresh directory with the path of crisp's socket in it (`sock`, relative).
async fn fake_and_socket_dir(sock: &str) -> (Fake, tempfile::TempDir, PathBuf) {
    init_logging();
    let fake = Fake::start().await;
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join(sock);
    (fake, dir, sock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_refuses_new_connections_finishes_in_flight_calls_and_removes_the_socket()
{
    let (fake, dir, sock) = fake_and_socket_dir("run/crisp.sock").await;
    let (shutdown, daemon) = run_daemon(test_config(&sock, fake.path(), dir.path()));
    wait_listening(&sock).await;

    let (held, release) = Reply::after();
    fake.reply_once(EXEC_SYNC, held);
    let mut client = runtime_client(&sock).await;
    let req = ExecSyncRequest {
        container_id: "c1".into(),
        cmd: vec!["true".into()],
        timeout: 0,
    };
    let call = tokio::spawn(async move { client.exec_sync(req).await });
    fake.wait_call(EXEC_SYNC, 0).await;

    shutdown.send(()).unwrap();
    within(PATIENCE, "crisp to stop accepting connections", async {
        while UnixStream::connect(&sock).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        !call.is_finished(),
        "the in-flight call ended before the runtime answered it"
    );
    assert!(!daemon.is_finished(), "crisp exited with a call in flight");

    let answer = ExecSyncResponse {
        stdout: b"done".to_vec(),
        stderr: vec![],
        exit_code: 0,
    };
    release
        .send(Reply::unary(&answer.encode_to_vec()))
        .ok()
        .unwrap();
    let got = within(PATIENCE, "the in-flight call to finish", call)
        .await
        .unwrap()
        .expect("in-flight call failed");
    assert_eq!(got.into_inner(), answer);

    within(PATIENCE, "crisp to exit after draining", daemon)
        .await
        .unwrap()
        .unwrap();
    assert!(!sock.exists(), "socket file {} left behind", sock.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_still_running_when_the_shutdown_grace_ends_are_cut_off() {
    let fake = Fake::start().await;
    fake.reply_once(EXEC_SYNC, Reply::Hold);
    let opts = crisp::proxy::ProxyOptions {
        shutdown_grace: Duration::from_millis(300),
        ..Default::default()
    };
    let mut crisp = Crisp::start_with(fake.path(), vec![], opts).await;
    let mut client = runtime_client(&crisp.path).await;
    let req = ExecSyncRequest {
        container_id: "c1".into(),
        cmd: vec!["sleep".into(), "inf".into()],
        timeout: 0,
    };
    let call = tokio::spawn(async move { client.exec_sync(req).await });
    let held = fake.wait_call(EXEC_SYNC, 0).await;

    let serve = crisp.shutdown();
    within(
        Duration::from_secs(5),
        "serve to return after the grace",
        serve,
    )
    .await
    .unwrap();
    // Returning means the call is over: the runtime sees it cancelled, the client gets an error.
    held.expect_cancelled(Duration::from_secs(5)).await;
    let r = within(Duration::from_secs(5), "the cut-off call to end", call)
        .await
        .unwrap();
    assert!(r.is_err(), "a call cut off at shutdown succeeded: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_file_is_replaced_at_start() {
    let (fake, dir, sock) = fake_and_socket_dir("crisp.sock").await;
    // A socket file whose process is gone: the file stays, nothing listens.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    assert!(UnixStream::connect(&sock).await.is_err());

    let (shutdown, daemon) = run_daemon(test_config(&sock, fake.path(), dir.path()));
    wait_listening(&sock).await;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o660,
        "socket mode"
    );
    let mut client = runtime_client(&sock).await;
    let v = within(
        PATIENCE,
        "a call through the new socket",
        client.version(VersionRequest {
            version: "0.1.0".into(),
        }),
    )
    .await
    .unwrap();
    assert_eq!(v.into_inner().version, "0.1.0"); // the fake echoes the request

    shutdown.send(()).unwrap();
    drop(client);
    within(PATIENCE, "crisp to exit", daemon)
        .await
        .unwrap()
        .unwrap();
    assert!(!sock.exists(), "socket file left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_socket_is_refused_with_an_error_naming_the_path() {
    let (fake, dir, sock) = fake_and_socket_dir("crisp.sock").await;
    let live = tokio::net::UnixListener::bind(&sock).unwrap();

    let (_shutdown, daemon) = run_daemon(test_config(&sock, fake.path(), dir.path()));
    let err = within(PATIENCE, "crisp to refuse the live socket", daemon)
        .await
        .unwrap()
        .expect_err("crisp took over a live socket");
    let msg = format!("{err:#}");
    assert!(
        msg.contains(&sock.display().to_string()),
        "error {msg:?} does not name {}",
        sock.display()
    );

    // The live socket is untouched and still served by its owner.
    let (connected, accepted) = tokio::join!(
        UnixStream::connect(&sock),
        within(PATIENCE, "the owner to accept", live.accept())
    );
    connected.expect("the live socket was replaced");
    accepted.unwrap();
}
