//! What happens when things go wrong: clients that give up, a runtime that dies and comes back,
//! and garbage on crisp's socket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Frame;
use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc::UnboundedSender;

use crate::support::*;
use crisp::intercept::{Call, Interceptor, Interest};
use crisp::proxy::ProxyOptions;
use k8s_cri::v1::{ContainerEventResponse, ExecSyncRequest, VersionRequest, VersionResponse};

const EXEC_SYNC: &str = "/runtime.v1.RuntimeService/ExecSync";
const EVENTS: &str = "/runtime.v1.RuntimeService/GetContainerEvents";
const VERSION: &str = "/runtime.v1.RuntimeService/Version";

fn exec_req() -> ExecSyncRequest {
    ExecSyncRequest {
        container_id: "c1".into(),
        cmd: vec!["sleep".into(), "3600".into()],
        timeout: 0,
    }
}

/// Observes every call (so it takes the buffered path) and changes nothing.
struct ObserveAll;

impl Interceptor for ObserveAll {
    fn interest(&self, _call: &Call) -> Interest {
        Interest::ALL
    }
}

// ---------------------------------------------------------------------------------------------
// Client cancellation

/// A fake runtime and crisp in front of it; with `observe`, crisp runs [`ObserveAll`], so that
/// every call takes the buffered path instead of the relay.
async fn fake_and_crisp(observe: bool) -> (Fake, Crisp) {
    let fake = Fake::start().await;
    let crisp = if observe {
        Crisp::start_with(
            fake.path(),
            vec![Arc::new(ObserveAll)],
            ProxyOptions::default(),
        )
        .await
    } else {
        Crisp::start(fake.path()).await
    };
    (fake, crisp)
}

/// Opens a GetContainerEvents stream through crisp and checks that its first event arrives.
/// Returns the client, the stream, the fake's sender for the rest of it, and the event.
async fn open_event_stream(
    crisp: &Crisp,
    fake: &Fake,
) -> (
    RuntimeClient,
    tonic::Streaming<ContainerEventResponse>,
    UnboundedSender<Frame<Bytes>>,
    ContainerEventResponse,
) {
    let (client, mut stream, tx) = open_events(&crisp.path, fake).await;
    let ev = ContainerEventResponse {
        container_id: "ctr-1".into(),
        ..Default::default()
    };
    passes_through(&tx, &mut stream, &ev, "first event").await;
    (client, stream, tx, ev)
}

async fn assert_cancel_of_held_unary_reaches_upstream(observe: bool) {
    let (fake, crisp) = fake_and_crisp(observe).await;
    fake.reply_once(EXEC_SYNC, Reply::Hold);
    let mut client = runtime_client(&crisp.path).await;
    let call = tokio::spawn(async move { client.exec_sync(exec_req()).await });
    let held = fake.wait_call(EXEC_SYNC, 0).await;
    assert_eq!(held.end(), End::Open);
    // Dropping the call's future is how a tonic/grpc-go client cancels: RST_STREAM(CANCEL).
    call.abort();
    held.expect_cancelled(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancelling_a_held_unary_call_cancels_it_upstream() {
    assert_cancel_of_held_unary_reaches_upstream(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_cancelling_an_observed_held_unary_call_cancels_it_upstream() {
    assert_cancel_of_held_unary_reaches_upstream(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_dropping_a_server_stream_cancels_it_upstream() {
    let (fake, crisp) = fake_and_crisp(false).await;
    let (_client, stream, tx, _) = open_event_stream(&crisp, &fake).await;
    let upstream = fake.wait_call(EVENTS, 0).await;
    assert_eq!(upstream.end(), End::Open);
    drop(stream);
    upstream.expect_cancelled(Duration::from_secs(5)).await;
    drop(tx);
}

// ---------------------------------------------------------------------------------------------
// The runtime dies and comes back

fn assert_unavailable_naming(status: &tonic::Status, fake: &Fake, what: &str) {
    assert_eq!(
        status.code(),
        tonic::Code::Unavailable,
        "{what}: {status:?}"
    );
    let sock = fake.path().display().to_string();
    assert!(
        status.message().contains(&sock),
        "{what}: message {:?} does not name the upstream socket {sock}",
        status.message()
    );
}

/// An ExecSync through crisp that the runtime has received, then the runtime dies: the call
/// fails UNAVAILABLE naming the runtime's socket.
async fn exec_sync_cut_by_a_runtime_crash(fake: &Fake, crisp: &Crisp, what: &str) {
    let mut client = runtime_client(&crisp.path).await;
    let call = tokio::spawn(async move { client.exec_sync(exec_req()).await });
    fake.wait_call(EXEC_SYNC, 0).await;
    fake.stop().await;
    let status = within(Duration::from_secs(5), "the call to fail", call)
        .await
        .unwrap()
        .unwrap_err();
    assert_unavailable_naming(&status, fake, what);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_fails_a_held_call_with_unavailable_naming_the_socket() {
    let (fake, crisp) = fake_and_crisp(false).await;
    fake.reply_once(EXEC_SYNC, Reply::Hold);
    exec_sync_cut_by_a_runtime_crash(&fake, &crisp, "held call").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_mid_stream_ends_the_stream_with_unavailable_naming_the_socket() {
    let (fake, crisp) = fake_and_crisp(false).await;
    let (_client, mut stream, _tx, _) = open_event_stream(&crisp, &fake).await;
    fake.stop().await;
    let status = within(
        Duration::from_secs(5),
        "the stream to fail",
        stream.message(),
    )
    .await
    .unwrap_err();
    assert_unavailable_naming(&status, &fake, "stream");
}

async fn assert_crash_mid_unary_response_is_unavailable(observe: bool) {
    let (fake, crisp) = fake_and_crisp(observe).await;
    // Headers and half a message, then the runtime dies.
    let (reply, tx) = Reply::channel(grpc_headers());
    fake.reply_once(EXEC_SYNC, reply);
    let msg = k8s_cri::v1::ExecSyncResponse {
        stdout: vec![b'x'; 1000],
        stderr: vec![],
        exit_code: 0,
    }
    .encode_to_vec();
    tx.send(Frame::data(grpc_frame(&msg).slice(..500))).unwrap();
    exec_sync_cut_by_a_runtime_crash(&fake, &crisp, "unary call cut mid-response").await;
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_mid_unary_response_fails_the_call_with_unavailable_naming_the_socket() {
    assert_crash_mid_unary_response_is_unavailable(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_crash_mid_observed_unary_response_fails_the_call_with_unavailable_naming_the_socket(
) {
    assert_crash_mid_unary_response_is_unavailable(true).await;
}

/// The runtime sends `ev` on the stream, and the client receives it.
async fn passes_through(
    tx: &UnboundedSender<Frame<Bytes>>,
    stream: &mut tonic::Streaming<ContainerEventResponse>,
    ev: &ContainerEventResponse,
    what: &str,
) {
    tx.send(Frame::data(grpc_frame(&ev.encode_to_vec())))
        .unwrap();
    assert_eq!(
        within(PATIENCE, what, stream.message()).await.unwrap(),
        Some(ev.clone())
    );
}

/// A fake runtime that answers every Version call with the returned response.
async fn fake_answering_version() -> (Fake, VersionResponse) {
    let fake = Fake::start().await;
    let answer = answer_version(&fake);
    (fake, answer)
}

async fn version(client: &mut RuntimeClient) -> Result<VersionResponse, tonic::Status> {
    client
        .version(VersionRequest {
            version: "0.1.0".into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// A Version call through `client` answers `answer` within [`PATIENCE`].
async fn answers_version(client: &mut RuntimeClient, what: &str, answer: &VersionResponse) {
    let got = within(PATIENCE, what, version(client)).await.unwrap();
    assert_eq!(&got, answer, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_while_upstream_is_down_and_succeed_once_it_is_back() {
    let (fake, answer) = fake_answering_version().await;
    let crisp = Crisp::start(fake.path()).await;
    let mut client = runtime_client(&crisp.path).await;
    answers_version(&mut client, "Version", &answer).await;

    fake.stop().await;
    // The first call may still meet the dead connection, the next ones re-dial: all fail fast.
    for i in 0..3 {
        let start = Instant::now();
        let status = within(
            Duration::from_secs(5),
            "a call while the runtime is down",
            version(&mut client),
        )
        .await
        .unwrap_err();
        let took = start.elapsed();
        assert_unavailable_naming(&status, &fake, &format!("call #{i} while down"));
        assert!(
            took < Duration::from_secs(1),
            "call #{i} while down took {took:?}"
        );
    }

    fake.restart().await;
    // Same crisp, same client connection.
    answers_version(&mut client, "Version after restart", &answer).await;
    answers_version(&mut client, "Version after restart", &answer).await;
}

/// After the runtime came back, a client connection that crisp had been serving through its
/// observed path is moved back to a relay of its own: crisp sends it GOAWAY while it is idle, the
/// client reconnects, and crisp dials the runtime for that new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_degraded_client_connection_is_moved_back_to_a_relay_once_the_runtime_returns() {
    let (fake, answer) = fake_answering_version().await;
    let crisp = Crisp::start_with(fake.path(), vec![], strict_options()).await;
    let mut client = runtime_client(&crisp.path).await;
    answers_version(&mut client, "Version", &answer).await;
    fake.stop().await;
    let down = within(
        PATIENCE,
        "a call while the runtime is down",
        version(&mut client),
    )
    .await;
    assert!(down.is_err(), "a call succeeded with the runtime down");
    fake.restart().await;
    // Served through crisp's pooled connections (two, round-robin), back to back so that the
    // client is never idle long enough to be moved yet.
    for _ in 0..4 {
        answers_version(&mut client, "Version after restart", &answer).await;
    }
    let pooled = fake.connections();
    // A kubelet-like pace (idle gaps longer than crisp's 200 ms) until the client has been moved:
    // a new client connection, relayed on a runtime connection of its own.
    let mut calls = 0;
    within(
        PATIENCE,
        "the client connection to be relayed again",
        async {
            while fake.connections() == pooled {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let v = version(&mut client).await;
                assert!(
                    v.is_ok(),
                    "call #{calls} while crisp moved the client: {v:?}"
                );
                calls += 1;
            }
        },
    )
    .await;
    answers_version(&mut client, "Version on the new relay", &answer).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_goaway_with_a_stream_open_does_not_fail_new_calls() {
    let (fake, crisp) = fake_and_crisp(false).await;
    // kubelet keeps a GetContainerEvents stream open on the runtime connection.
    let (mut client, mut stream, tx, ev) = open_event_stream(&crisp, &fake).await;

    // The runtime stops gracefully: GOAWAY on the old connection, new connections accepted.
    fake.goaway().await;
    // An event sent after the GOAWAY reaches the client: crisp has read the GOAWAY (frames on a
    // connection arrive in order), so what follows is not a race with it.
    passes_through(&tx, &mut stream, &ev, "event after GOAWAY").await;
    for i in 0..3 {
        let v = within(PATIENCE, "Version after GOAWAY", version(&mut client)).await;
        assert!(
            v.is_ok(),
            "call #{i} after the runtime's GOAWAY failed: {v:?}"
        );
    }
    // The stream that was open keeps flowing and ends cleanly.
    tx.send(Frame::data(grpc_frame(&ev.encode_to_vec())))
        .unwrap();
    assert_eq!(
        within(PATIENCE, "event after GOAWAY", stream.message())
            .await
            .unwrap(),
        Some(ev)
    );
    tx.send(Frame::trailers(ok_trailers())).unwrap();
    assert!(matches!(
        within(PATIENCE, "end of stream", stream.message()).await,
        Ok(None)
    ));
}

// ---------------------------------------------------------------------------------------------
// Bad input on crisp's socket

fn strict_options() -> ProxyOptions {
    ProxyOptions {
        handshake_timeout: Duration::from_millis(500),
        keepalive_interval: Duration::from_millis(300),
        keepalive_timeout: Duration::from_millis(300),
        ..Default::default()
    }
}

/// How long crisp may take to close a bad connection with `strict_options` (well above
/// handshake or keepalive interval + timeout, well below a test's patience).
const CLOSE_LIMIT: Duration = Duration::from_secs(5);

/// A well-behaved kubelet-like client that keeps calling Version on its own connection until
/// stopped; every call must succeed promptly.
struct GoodClient {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<u64, String>>,
    answered: tokio::sync::watch::Receiver<u64>,
}

impl GoodClient {
    async fn start(crisp: &Crisp) -> GoodClient {
        let mut client = runtime_client(&crisp.path).await;
        let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
        let (count_tx, answered) = tokio::sync::watch::channel(0u64);
        let task = tokio::spawn(async move {
            loop {
                if *stop_rx.borrow_and_update() {
                    return Ok(*count_tx.borrow());
                }
                match tokio::time::timeout(Duration::from_secs(2), version(&mut client)).await {
                    Ok(Ok(_)) => count_tx.send_modify(|n| *n += 1),
                    Ok(Err(e)) => return Err(format!("good client's call failed: {e}")),
                    Err(_) => return Err("good client's call took more than 2 s".into()),
                };
                // Pace the calls a little; stop at once when told.
                let _ = tokio::time::timeout(Duration::from_millis(20), stop_rx.changed()).await;
            }
        });
        GoodClient {
            stop,
            task,
            answered,
        }
    }

    /// Waits for at least one more answer than now, proving the client is still being served.
    async fn one_more_answer(&mut self) {
        let now = *self.answered.borrow_and_update();
        let got = within(
            PATIENCE,
            "the good client to get another answer",
            self.answered.wait_for(|n| *n > now),
        )
        .await
        .is_ok();
        if !got {
            // The client's task ended: it failed.
            let r = (&mut self.task).await.unwrap();
            panic!("good client stopped: {r:?}");
        }
    }

    async fn finish(mut self) -> u64 {
        self.one_more_answer().await;
        let _ = self.stop.send(true);
        let n = within(PATIENCE, "the good client to stop", self.task)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(n >= 2, "the good client got only {n} answers");
        n
    }
}

/// Runs `bad` against crisp while a good client calls throughout.
async fn with_good_client<F: std::future::Future<Output = ()>>(crisp: &Crisp, bad: F) {
    let mut good = GoodClient::start(crisp).await;
    good.one_more_answer().await;
    bad.await;
    good.finish().await;
}

/// Starts crisp (`strict_options`) on a fake runtime and runs `bad` on a connection of its own
/// while a good client calls throughout. Returns the fake and crisp, still running.
async fn on_a_bad_connection<F: std::future::Future<Output = ()>>(
    bad: impl FnOnce(UnixStream) -> F,
) -> (Fake, Crisp) {
    let fake = Fake::start().await;
    let crisp = Crisp::start_with(fake.path(), vec![], strict_options()).await;
    with_good_client(&crisp, async {
        let sock = UnixStream::connect(&crisp.path).await.unwrap();
        bad(sock).await;
    })
    .await;
    (fake, crisp)
}

/// Only the good client's calls (Version) reached the runtime, not `what` the bad one sent.
fn assert_only_good_calls_reached(fake: &Fake, what: &str) {
    assert_eq!(
        fake.started_total(),
        fake.calls_to(VERSION).len(),
        "{what} reached the runtime"
    );
}

async fn assert_closed_within(sock: &mut UnixStream, limit: Duration, what: &str) -> Vec<u8> {
    within(
        limit,
        &format!("crisp to close the {what} connection"),
        read_until_closed(sock),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_connection_is_closed() {
    use rand::RngCore;
    let (fake, _crisp) = on_a_bad_connection(|mut sock| async move {
        let mut junk = vec![0u8; 4096];
        rand::thread_rng().fill_bytes(&mut junk);
        let _ = sock.write_all(&junk).await; // crisp may hang up before it has read it all
        assert_closed_within(&mut sock, CLOSE_LIMIT, "random-bytes").await;
    })
    .await;
    assert_only_good_calls_reached(&fake, "junk");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_request_connection_is_closed() {
    let (fake, _crisp) = on_a_bad_connection(|mut sock| async move {
        let req = b"POST /runtime.v1.RuntimeService/Version HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/grpc\r\nContent-Length: 0\r\n\r\n";
        sock.write_all(req).await.unwrap();
        let seen = assert_closed_within(&mut sock, CLOSE_LIMIT, "HTTP/1.1").await;
        assert!(!seen.starts_with(b"HTTP/1.1 2"), "crisp answered HTTP/1.1: {:?}", String::from_utf8_lossy(&seen));
    })
    .await;
    assert_only_good_calls_reached(&fake, "the HTTP/1.1 request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_that_stops_mid_preface_is_closed() {
    let (_fake, _crisp) = on_a_bad_connection(|mut sock| async move {
        sock.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
        assert_closed_within(&mut sock, CLOSE_LIMIT, "half-preface").await;
    })
    .await;
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
const EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 0x4, 0, 0, 0, 0, 0];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_frame_after_a_valid_preface_connection_is_closed() {
    let (fake, _crisp) = on_a_bad_connection(|mut sock| async move {
        sock.write_all(PREFACE).await.unwrap();
        sock.write_all(EMPTY_SETTINGS).await.unwrap();
        // A HEADERS frame header announcing 64 bytes for stream 1, then only 10 of them; and
        // silence: crisp's pings are never answered.
        sock.write_all(&[0, 0, 64, 0x1, 0x5, 0, 0, 0, 1])
            .await
            .unwrap();
        sock.write_all(&[0x83, 0x86, 0x84, 0x41, 0x8a, 0x08, 0x9d, 0x5c, 0x0b, 0x81])
            .await
            .unwrap();
        assert_closed_within(&mut sock, CLOSE_LIMIT, "truncated-frame").await;
    })
    .await;
    assert_only_good_calls_reached(&fake, "the truncated request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_with_a_thousand_open_streams_is_disconnected() {
    const N: usize = 1000;
    let fake = Fake::start().await;
    fake.script(EXEC_SYNC, |_| Reply::Hold);
    let crisp = Crisp::start_with(fake.path(), vec![], strict_options()).await;
    with_good_client(&crisp, async {
        // Two handles on one socket: h2 talks on one; once it goes silent, the test reads the
        // other to see when crisp hangs up.
        let std_sock = std::os::unix::net::UnixStream::connect(&crisp.path).unwrap();
        let watch_sock = std_sock.try_clone().unwrap();
        std_sock.set_nonblocking(true).unwrap();
        let (mut send, conn) = h2_builder()
            .handshake::<_, Bytes>(UnixStream::from_std(std_sock).unwrap())
            .await
            .unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let driver = tokio::spawn(async move {
            let mut conn = Box::pin(conn);
            tokio::select! {
                _ = conn.as_mut() => None,
                _ = stop_rx => Some(conn),
            }
        });
        let req = RawRequest::grpc(EXEC_SYNC, &exec_req().encode_to_vec());
        let mut open = Vec::with_capacity(N);
        for _ in 0..N {
            open.push(send_raw(&mut send, &req).await.unwrap());
        }
        fake.wait_until(PATIENCE, "1000 streams to reach the runtime", |calls| {
            (calls.iter().filter(|c| c.path() == EXEC_SYNC).count() >= N).then_some(())
        })
        .await;

        // Go silent: keep the connection and the streams, but never poll them again.
        stop_tx.send(()).unwrap();
        let silent_conn = driver
            .await
            .unwrap()
            .expect("h2 connection ended before going silent");
        let mut watch_sock = UnixStream::from_std(watch_sock).unwrap();
        assert_closed_within(&mut watch_sock, CLOSE_LIMIT, "silent 1000-stream").await;

        // Every call it left behind is cancelled upstream.
        let held = fake.calls_to(EXEC_SYNC);
        assert_eq!(held.len(), N);
        within(
            CLOSE_LIMIT,
            "the silent client's calls to be cancelled upstream",
            async {
                for c in &held {
                    assert_eq!(c.ended().await, End::Cancelled);
                }
            },
        )
        .await;
        drop((silent_conn, open, send));
    })
    .await;
}
