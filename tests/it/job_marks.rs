//! Job mode's marks on a running daemon (DESIGN.md §5): a status call of a pod crisp terminated
//! no sidecar of is not collected, whatever other pods did; one of a terminated sidecar is still
//! patched to `exit 0, Completed`.

use std::path::Path;
use std::time::Duration;

use http_body::Frame;
use prost::Message;

use crate::support::*;
use k8s_cri::v1::{
    Container, ContainerStatus, ContainerStatusRequest, ContainerStatusResponse,
    ListContainersResponse, PodSandboxStatus, PodSandboxStatusRequest, PodSandboxStatusResponse,
};

const LIST: &str = "/runtime.v1.RuntimeService/ListContainers";
const CONTAINER_STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";
const SANDBOX_STATUS: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";
/// The sidecar crisp terminated (a Job pod's, in sandbox `JOB_SANDBOX`) before it restarted.
const MARKED: &str = "c0ffee";
const JOB_SANDBOX: &str = "0b5b0b";

/// A daemon whose state directory holds the mark of `MARKED`, in front of a runtime that still
/// has that container.
async fn daemon_with_a_mark(fake: &Fake) -> (Daemon, tempfile::TempDir) {
    let list = ListContainersResponse {
        containers: vec![Container {
            id: MARKED.into(),
            pod_sandbox_id: JOB_SANDBOX.into(),
            ..Default::default()
        }],
    }
    .encode_to_vec();
    fake.script(LIST, move |_| Reply::unary(&list));
    let state = tempfile::tempdir().unwrap();
    let marks = state.path().join("terminated");
    std::fs::create_dir_all(&marks).unwrap();
    std::fs::write(marks.join(MARKED), JOB_SANDBOX).unwrap();
    let dir = state.path().to_path_buf();
    let daemon = Daemon::start(fake.path(), move |cfg| cfg.state_dir = dir).await;
    (daemon, state)
}

/// Sends `msg` on `path`; the runtime answers with one message and holds its trailers until the
/// client has that message. Whether it got there first: a proxy that collects the response
/// before passing it on delivers nothing until the trailers.
async fn streamed_through(sock: &Path, fake: &Fake, path: &str, msg: &[u8], answer: &[u8]) -> bool {
    let (reply, tx) = Reply::channel(grpc_headers());
    fake.reply_once(path, reply);
    let mut raw = Raw::connect(sock).await;
    let fut = raw.start(&RawRequest::grpc(path, msg)).await.unwrap();
    tx.send(Frame::data(grpc_frame(answer))).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(2), async {
        let mut body = fut.await.unwrap().into_body();
        body.data().await
    })
    .await;
    tx.send(Frame::trailers(ok_trailers())).unwrap();
    drop(tx);
    match first {
        Ok(Some(Ok(data))) => {
            assert_eq!(grpc_unframe(&data), answer, "forwarded as sent");
            true
        }
        Ok(other) => panic!("no message: {other:?}"),
        Err(_) => false,
    }
}

/// Issue #33: while one Job pod's sidecar is marked, the status calls of every other pod of the
/// node stream through as the runtime answers them — not collected and walked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_calls_of_other_pods_are_not_collected_while_a_job_sidecar_is_marked() {
    let fake = Fake::start().await;
    let (mut crisp, _state) = daemon_with_a_mark(&fake).await;

    let req = PodSandboxStatusRequest {
        pod_sandbox_id: "another-pod".into(),
        verbose: false,
    }
    .encode_to_vec();
    let answer = PodSandboxStatusResponse {
        status: Some(PodSandboxStatus {
            id: "another-pod".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    assert!(
        streamed_through(&crisp.sock, &fake, SANDBOX_STATUS, &req, &answer).await,
        "PodSandboxStatus of another pod was collected"
    );

    let req = ContainerStatusRequest {
        container_id: "another-container".into(),
        verbose: false,
    }
    .encode_to_vec();
    let answer = status_of("another-container", 137).encode_to_vec();
    assert!(
        streamed_through(&crisp.sock, &fake, CONTAINER_STATUS, &req, &answer).await,
        "ContainerStatus of another pod's container was collected"
    );

    // The Job pod's own terminated sidecar is still reported as completed.
    fake.reply_once(
        CONTAINER_STATUS,
        Reply::unary(&status_of(MARKED, 137).encode_to_vec()),
    );
    let mut client = runtime_client(&crisp.sock).await;
    let status = status_through(&mut client, MARKED).await;
    assert_eq!((status.exit_code, status.reason.as_str()), (0, "Completed"));
    crisp.stop().await;
}

fn status_of(id: &str, exit_code: i32) -> ContainerStatusResponse {
    ContainerStatusResponse {
        status: Some(ContainerStatus {
            id: id.into(),
            exit_code,
            reason: "Error".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The container's status as the client gets it (through crisp).
async fn status_through(client: &mut RuntimeClient, id: &str) -> ContainerStatus {
    client
        .container_status(ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap()
}

/// The admin socket's `/debug/connections` dump.
async fn connections(admin: &Path) -> String {
    let admin = admin.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&admin).unwrap();
        write!(
            s,
            "GET /debug/connections HTTP/1.1\r\nHost: crisp\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// Starts a ContainerStatus call of `id` on a connection of its own and, while the runtime
/// holds the answer, returns how the connection dump shows its stream (`stream 1 ...`).
async fn status_stream_in_flight(crisp: &Daemon, fake: &Fake, n: usize, id: &str) -> String {
    let (reply, tx) = Reply::channel(grpc_headers());
    fake.reply_once(CONTAINER_STATUS, reply);
    let mut raw = Raw::connect(&crisp.sock).await;
    let req = ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    }
    .encode_to_vec();
    let fut = raw
        .start(&RawRequest::grpc(CONTAINER_STATUS, &req))
        .await
        .unwrap();
    fake.wait_call(CONTAINER_STATUS, n).await;
    let dump = connections(&crisp.admin).await;
    tx.send(Frame::data(grpc_frame(&status_of(id, 137).encode_to_vec())))
        .unwrap();
    tx.send(Frame::trailers(ok_trailers())).unwrap();
    drop(tx);
    read_response(fut).await.unwrap();
    dump.lines()
        .find(|l| l.trim_start().starts_with("stream 1 "))
        .unwrap_or_else(|| panic!("no stream in flight in the dump:\n{dump}"))
        .trim()
        .to_string()
}

/// Issue #33: while a Job pod's sidecar is marked, a status call of another pod's container
/// stays on the relay (the connection dump names its route); only the marked container's goes
/// to the observed path ("(diverted)").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_calls_of_other_pods_stay_on_the_relay_while_a_job_sidecar_is_marked() {
    let fake = Fake::start().await;
    let (mut crisp, _state) = daemon_with_a_mark(&fake).await;
    let other = status_stream_in_flight(&crisp, &fake, 0, "another-container").await;
    assert!(
        other.contains("/ContainerStatus") && !other.contains("(diverted)"),
        "another pod's status call left the relay: {other}"
    );
    let marked = status_stream_in_flight(&crisp, &fake, 1, MARKED).await;
    assert!(
        marked.contains("(diverted)"),
        "the marked container's status call was not diverted: {marked}"
    );
    crisp.stop().await;
}

/// The cost the hold saves: on one connection, alternating, ContainerStatus calls of another
/// pod's container (held, then relayed) and of the marked container (diverted and patched).
/// A measurement for RELIABILITY.md, not a pass/fail bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (RELIABILITY.md): prints the latency of relayed and diverted status calls while a mark exists"]
async fn measure_status_calls_relayed_and_diverted_while_a_job_sidecar_is_marked() {
    let fake = Fake::start().await;
    let (mut crisp, _state) = daemon_with_a_mark(&fake).await;
    fake.script(CONTAINER_STATUS, |call| {
        let req = ContainerStatusRequest::decode(call.message()).unwrap();
        Reply::unary(&status_of(&req.container_id, 137).encode_to_vec())
    });
    let mut client = runtime_client(&crisp.sock).await;
    let (mut relayed, mut diverted) = (Vec::new(), Vec::new());
    for i in 0..2_000 {
        let id = if i % 2 == 0 {
            "another-container"
        } else {
            MARKED
        };
        let started = std::time::Instant::now();
        let status = status_through(&mut client, id).await;
        let took = started.elapsed();
        if id == MARKED {
            assert_eq!(status.exit_code, 0);
            diverted.push(took);
        } else {
            assert_eq!(status.exit_code, 137);
            relayed.push(took);
        }
    }
    for (what, v) in [("relayed", &mut relayed), ("diverted", &mut diverted)] {
        v.sort();
        eprintln!(
            "{what}: {} calls, min {:?} p50 {:?} p90 {:?}",
            v.len(),
            v[0],
            v[v.len() / 2],
            v[v.len() * 9 / 10]
        );
    }
    crisp.stop().await;
}
