//! Shared code of crisp's integration tests: a fake CRI runtime that records exactly what arrives
//! and answers exactly what a test scripts, a harness that runs crisp on a temp socket, and raw
//! HTTP/2 and tonic clients.
//!
//! The fake is a raw hyper HTTP/2 server (not tonic): it never parses, normalises or adds anything
//! (no `date`, no `content-length`), so a test can compare what a client sends/gets through crisp
//! with what it sends/gets talking to the fake directly.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crisp::intercept::{Interceptor, Interceptors};
use crisp::proxy::{Proxy, ProxyOptions, Upstream, UpstreamOptions};

/// Upper bound for anything a test awaits; a test that hits it has failed.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing the test with `what` if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?} waiting for: {what}"),
    }
}

/// Logs to the test output when `CRISP_TEST_LOG` is set (e.g. `CRISP_TEST_LOG=debug`).
pub fn init_logging() {
    if let Ok(filter) = std::env::var("CRISP_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
}

// ---------------------------------------------------------------------------------------------
// gRPC / protobuf helpers (independent of crisp's own code, so they can't share its bugs)

/// Frames `msg` as one uncompressed gRPC message.
pub fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

/// The message inside a body holding exactly one gRPC message.
pub fn grpc_unframe(body: &[u8]) -> &[u8] {
    assert!(
        body.len() >= 5,
        "body shorter than a gRPC prefix: {} bytes",
        body.len()
    );
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    assert_eq!(body.len(), 5 + len, "body is not exactly one gRPC message");
    &body[5..]
}

fn pb_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Appends a length-delimited protobuf field.
pub fn pb_bytes(buf: &mut Vec<u8>, field: u32, value: &[u8]) {
    pb_varint(buf, ((field as u64) << 3) | 2);
    pb_varint(buf, value.len() as u64);
    buf.extend_from_slice(value);
}

/// Appends a varint protobuf field.
pub fn pb_uint(buf: &mut Vec<u8>, field: u32, value: u64) {
    pb_varint(buf, (field as u64) << 3);
    pb_varint(buf, value);
}

/// A valid protobuf message that no CRI message fully describes: field 1 string, field 2
/// varint, a nested message, and field 999 (not in any CRI proto).
pub fn arbitrary_message(tag: &str) -> Vec<u8> {
    let mut m = Vec::new();
    pb_bytes(&mut m, 1, format!("id-{tag}").as_bytes());
    pb_uint(&mut m, 2, 42);
    let mut nested = Vec::new();
    pb_bytes(&mut nested, 1, b"nested-name");
    pb_bytes(&mut nested, 999, b"nested unknown field");
    pb_bytes(&mut m, 3, &nested);
    pb_bytes(&mut m, 999, b"\x00\xffunknown field 999 \xe2\x9c\x93");
    m
}

/// Every method of runtime.v1 and runtime.v1alpha2 RuntimeService and ImageService (v1.36 set for
/// v1, k8s-cri's proto for v1alpha2), as gRPC paths.
pub fn all_cri_paths() -> Vec<String> {
    // v1 has every v1alpha2 method, in the same order, and then its own.
    const V1ALPHA2_RUNTIME: &[&str] = &[
        "Version",
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "PodSandboxStatus",
        "ListPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
        "ListContainers",
        "ContainerStatus",
        "UpdateContainerResources",
        "ReopenContainerLog",
        "ExecSync",
        "Exec",
        "Attach",
        "PortForward",
        "ContainerStats",
        "ListContainerStats",
        "PodSandboxStats",
        "ListPodSandboxStats",
        "UpdateRuntimeConfig",
        "Status",
    ];
    const V1_ONLY_RUNTIME: &[&str] = &[
        "CheckpointContainer",
        "GetContainerEvents",
        "ListMetricDescriptors",
        "ListPodSandboxMetrics",
        "RuntimeConfig",
        "UpdatePodSandboxResources",
        "StreamPodSandboxes",
        "StreamContainers",
        "StreamContainerStats",
        "StreamPodSandboxStats",
        "StreamPodSandboxMetrics",
    ];
    const V1ALPHA2_IMAGE: &[&str] = &[
        "ListImages",
        "ImageStatus",
        "PullImage",
        "RemoveImage",
        "ImageFsInfo",
    ];
    const V1_ONLY_IMAGE: &[&str] = &["StreamImages"];
    let mut out = Vec::new();
    for (svc, list) in [
        (
            "runtime.v1.RuntimeService",
            V1ALPHA2_RUNTIME
                .iter()
                .chain(V1_ONLY_RUNTIME)
                .collect::<Vec<_>>(),
        ),
        (
            "runtime.v1.ImageService",
            V1ALPHA2_IMAGE.iter().chain(V1_ONLY_IMAGE).collect(),
        ),
        (
            "runtime.v1alpha2.RuntimeService",
            V1ALPHA2_RUNTIME.iter().collect(),
        ),
        (
            "runtime.v1alpha2.ImageService",
            V1ALPHA2_IMAGE.iter().collect(),
        ),
    ] {
        for m in list {
            out.push(format!("/{svc}/{m}"));
        }
    }
    out
}

/// Headers as an ordered list of (name, value) pairs, for exact comparison.
pub fn pairs(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    h.iter()
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

pub fn header_map(list: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in list {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_bytes(v).unwrap(),
        );
    }
    h
}

/// Response headers of a successful gRPC call.
pub fn grpc_headers() -> HeaderMap {
    header_map(&[("content-type", b"application/grpc")])
}

/// Trailers `grpc-status: 0`.
pub fn ok_trailers() -> HeaderMap {
    header_map(&[("grpc-status", b"0")])
}

// ---------------------------------------------------------------------------------------------
// The fake runtime

/// How one call to the fake ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Still running (held, or its response is still streaming).
    Open,
    /// The whole response was handed to the HTTP/2 layer.
    Completed,
    /// The call was dropped before its response ended: the client reset the stream or the
    /// connection went away.
    Cancelled,
}

/// One call as the fake received it.
#[derive(Debug)]
pub struct Recorded {
    pub seq: u64,
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
    end: watch::Sender<End>,
}

impl Recorded {
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    pub fn end(&self) -> End {
        *self.end.borrow()
    }

    /// Waits until the call is over (completed or cancelled) and says how it ended.
    pub async fn ended(&self) -> End {
        let mut rx = self.end.subscribe();
        let r = rx.wait_for(|e| *e != End::Open).await.map(|e| *e);
        r.unwrap_or(End::Cancelled)
    }

    /// Asserts that the call gets cancelled within `limit`.
    pub async fn expect_cancelled(&self, limit: Duration) {
        let end = within(
            limit,
            &format!("upstream to observe cancellation of {}", self.path()),
            self.ended(),
        )
        .await;
        assert_eq!(
            end,
            End::Cancelled,
            "call {} ended, but was not cancelled",
            self.path()
        );
    }

    /// The gRPC message the call carried.
    pub fn message(&self) -> &[u8] {
        grpc_unframe(&self.body)
    }
}

/// What the fake answers to one call.
pub enum Reply {
    /// headers {content-type: application/grpc}, the request body echoed, trailers {grpc-status: 0}.
    Echo,
    /// Response headers, then each body chunk (after its delay), then the trailers (none: the
    /// body ends with an empty END_STREAM DATA frame).
    Full {
        headers: HeaderMap,
        chunks: Vec<(Duration, Bytes)>,
        trailers: Option<HeaderMap>,
    },
    /// One HEADERS frame with END_STREAM (the gRPC error form).
    TrailersOnly(HeaderMap),
    /// Response headers, then whatever the test pushes through the channel (data or trailers);
    /// the body ends when the sender is dropped.
    Channel {
        headers: HeaderMap,
        frames: mpsc::UnboundedReceiver<Frame<Bytes>>,
    },
    /// Never answers; the call stays open until the client or connection goes away.
    Hold,
    /// Holds until the test sends the reply (dropping the sender holds forever).
    After(oneshot::Receiver<Reply>),
}

impl Reply {
    /// A successful unary answer carrying `msg`.
    pub fn unary(msg: &[u8]) -> Reply {
        Reply::Full {
            headers: grpc_headers(),
            chunks: vec![(Duration::ZERO, grpc_frame(msg))],
            trailers: Some(ok_trailers()),
        }
    }

    /// A channel-driven reply and the sender that drives it.
    pub fn channel(headers: HeaderMap) -> (Reply, mpsc::UnboundedSender<Frame<Bytes>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            Reply::Channel {
                headers,
                frames: rx,
            },
            tx,
        )
    }

    /// A held reply and the sender that releases it.
    pub fn after() -> (Reply, oneshot::Sender<Reply>) {
        let (tx, rx) = oneshot::channel();
        (Reply::After(rx), tx)
    }
}

type Script = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

#[derive(Default)]
struct FakeState {
    calls: Mutex<Vec<Arc<Recorded>>>,
    /// Paths whose request headers arrived (recorded before the body is read).
    started: Mutex<Vec<String>>,
    once: Mutex<HashMap<String, VecDeque<Reply>>>,
    scripts: Mutex<HashMap<String, Script>>,
    events: Option<watch::Sender<u64>>,
    seq: std::sync::atomic::AtomicU64,
}

impl FakeState {
    fn bump(&self) {
        if let Some(tx) = &self.events {
            tx.send_modify(|n| *n += 1);
        }
    }

    fn reply_for(&self, rec: &Recorded) -> Reply {
        if let Some(r) = self
            .once
            .lock()
            .unwrap()
            .get_mut(rec.path())
            .and_then(|q| q.pop_front())
        {
            return r;
        }
        let script = self.scripts.lock().unwrap().get(rec.path()).cloned();
        match script {
            Some(s) => s(rec),
            None => Reply::Echo,
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<FakeBody> {
        self.started
            .lock()
            .unwrap()
            .push(req.uri().path().to_string());
        self.bump();
        let (parts, body) = req.into_parts();
        let (body, trailers) = match body.collect().await {
            Ok(c) => {
                let trailers = c.trailers().cloned();
                (c.to_bytes(), trailers)
            }
            Err(_) => (Bytes::new(), None),
        };
        let (end, _) = watch::channel(End::Open);
        let rec = Arc::new(Recorded {
            seq: self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
            method: parts.method,
            uri: parts.uri,
            headers: parts.headers,
            body,
            trailers,
            end,
        });
        self.calls.lock().unwrap().push(rec.clone());
        self.bump();
        let guard = CallGuard {
            rec: rec.clone(),
            done: false,
        };
        let mut reply = self.reply_for(&rec);
        loop {
            reply = match reply {
                Reply::After(rx) => match rx.await {
                    Ok(r) => r,
                    Err(_) => Reply::Hold,
                },
                Reply::Hold => {
                    // The guard lives in this future: dropping it (client reset) marks the call.
                    let _guard = guard;
                    std::future::pending::<()>().await;
                    unreachable!()
                }
                other => break build_response(other, rec.body.clone(), guard),
            };
        }
    }
}

fn build_response(reply: Reply, req_body: Bytes, mut guard: CallGuard) -> Response<FakeBody> {
    let (headers, kind) = match reply {
        Reply::Echo => (
            grpc_headers(),
            BodyKind::Script {
                chunks: VecDeque::from([(Duration::ZERO, req_body)]),
                trailers: Some(ok_trailers()),
                sleep: None,
            },
        ),
        Reply::Full {
            headers,
            chunks,
            trailers,
        } => (
            headers,
            BodyKind::Script {
                chunks: chunks.into(),
                trailers,
                sleep: None,
            },
        ),
        Reply::TrailersOnly(headers) => (headers, BodyKind::Empty),
        Reply::Channel { headers, frames } => (headers, BodyKind::Channel(frames)),
        Reply::Hold | Reply::After(_) => unreachable!(),
    };
    if matches!(kind, BodyKind::Empty) {
        guard.complete();
    }
    let mut resp = Response::new(FakeBody {
        kind,
        guard: Some(guard),
    });
    *resp.headers_mut() = headers;
    resp
}

/// Marks the call `Cancelled` when dropped before `complete()`.
struct CallGuard {
    rec: Arc<Recorded>,
    done: bool,
}

impl CallGuard {
    fn complete(&mut self) {
        self.done = true;
        self.rec.end.send_replace(End::Completed);
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if !self.done {
            self.rec.end.send_replace(End::Cancelled);
        }
    }
}

enum BodyKind {
    Empty,
    Script {
        chunks: VecDeque<(Duration, Bytes)>,
        trailers: Option<HeaderMap>,
        sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    },
    Channel(mpsc::UnboundedReceiver<Frame<Bytes>>),
}

pub struct FakeBody {
    kind: BodyKind,
    guard: Option<CallGuard>,
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let out = match &mut this.kind {
            BodyKind::Empty => None,
            BodyKind::Script {
                chunks,
                trailers,
                sleep,
            } => {
                if let Some((delay, _)) = chunks.front() {
                    if !delay.is_zero() {
                        let s = sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(*delay)));
                        ready!(s.as_mut().poll(cx));
                        *sleep = None;
                    }
                    let (_, data) = chunks.pop_front().unwrap();
                    Some(Frame::data(data))
                } else {
                    trailers.take().map(Frame::trailers)
                }
            }
            BodyKind::Channel(rx) => ready!(rx.poll_recv(cx)),
        };
        let last = match &out {
            None => true,
            Some(f) => f.is_trailers(),
        };
        if last {
            if let Some(g) = this.guard.as_mut() {
                g.complete();
            }
        }
        Poll::Ready(out.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            BodyKind::Empty => true,
            BodyKind::Script {
                chunks, trailers, ..
            } => chunks.is_empty() && trailers.is_none(),
            BodyKind::Channel(_) => false,
        }
    }
    // size_hint: the default (inexact), so hyper adds no content-length.
}

/// One accepted connection: its task, and a way to ask it for a graceful stop (acknowledged
/// once the GOAWAY is queued).
struct FakeConn {
    task: JoinHandle<()>,
    goaway: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

struct Running {
    accept: JoinHandle<()>,
    kill: watch::Sender<bool>,
    conns: Arc<Mutex<Vec<FakeConn>>>,
}

/// A fake CRI runtime on a unix socket. Stoppable and restartable on the same path; the script
/// and the record survive restarts.
pub struct Fake {
    path: PathBuf,
    state: Arc<FakeState>,
    events: watch::Receiver<u64>,
    running: Mutex<Option<Running>>,
    _dir: Option<tempfile::TempDir>,
}

impl Fake {
    /// Starts a fake on a socket in a fresh temp dir.
    pub async fn start() -> Fake {
        let dir = tempfile::Builder::new()
            .prefix("crisp-fake")
            .tempdir()
            .unwrap();
        let mut f = Fake::start_at(&dir.path().join("containerd.sock")).await;
        f._dir = Some(dir);
        f
    }

    pub async fn start_at(path: &Path) -> Fake {
        let (tx, rx) = watch::channel(0u64);
        let state = Arc::new(FakeState {
            events: Some(tx),
            ..Default::default()
        });
        let f = Fake {
            path: path.to_path_buf(),
            state,
            events: rx,
            running: Mutex::new(None),
            _dir: None,
        };
        f.restart().await;
        f
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// (Re)starts listening on the same path.
    pub async fn restart(&self) {
        assert!(
            self.running.lock().unwrap().is_none(),
            "fake already running"
        );
        let listener = UnixListener::bind(&self.path)
            .unwrap_or_else(|e| panic!("fake: bind {}: {e}", self.path.display()));
        let (kill, kill_rx) = watch::channel(false);
        let conns: Arc<Mutex<Vec<FakeConn>>> = Arc::default();
        let state = self.state.clone();
        let conns2 = conns.clone();
        let accept = tokio::spawn(async move {
            let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            builder
                .timer(TokioTimer::new())
                .auto_date_header(false)
                .max_concurrent_streams(None::<u32>)
                .initial_stream_window_size(4 << 20)
                .initial_connection_window_size(16 << 20)
                .max_frame_size(1 << 20)
                .max_header_list_size(1 << 20);
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                let svc = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(state.handle(req).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), svc);
                let mut kill_rx = kill_rx.clone();
                let (goaway, mut goaway_rx) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
                let task = tokio::spawn(async move {
                    let mut conn = std::pin::pin!(conn);
                    loop {
                        tokio::select! {
                            _ = conn.as_mut() => break,
                            // Dropping the connection closes the socket at once, like a runtime that died.
                            _ = kill_rx.wait_for(|k| *k) => break,
                            Some(ack) = goaway_rx.recv() => {
                                conn.as_mut().graceful_shutdown();
                                let _ = ack.send(());
                            }
                        }
                    }
                });
                conns2.lock().unwrap().push(FakeConn { task, goaway });
            }
        });
        *self.running.lock().unwrap() = Some(Running {
            accept,
            kill,
            conns,
        });
    }

    /// Stops abruptly, like a runtime that crashed: closes the listener and every connection
    /// (no GOAWAY) and removes the socket file.
    pub async fn stop(&self) {
        let running = self
            .running
            .lock()
            .unwrap()
            .take()
            .expect("fake not running");
        running.accept.abort();
        let _ = running.accept.await;
        let _ = running.kill.send(true);
        let conns: Vec<_> = std::mem::take(&mut *running.conns.lock().unwrap());
        for c in conns {
            let _ = c.task.await;
        }
        let _ = std::fs::remove_file(&self.path);
    }

    /// Sends GOAWAY on every open connection (a graceful stop: streams in flight may finish, no
    /// new ones are accepted on those connections) while still accepting new connections, like
    /// a runtime handing over to its successor.
    /// Returns once every open connection has queued its GOAWAY.
    pub async fn goaway(&self) {
        let acks: Vec<_> = {
            let running = self.running.lock().unwrap();
            let conns = running
                .as_ref()
                .expect("fake not running")
                .conns
                .lock()
                .unwrap();
            conns
                .iter()
                .filter(|c| !c.task.is_finished())
                .map(|c| {
                    let (tx, rx) = oneshot::channel();
                    let _ = c.goaway.send(tx);
                    rx
                })
                .collect()
        };
        for ack in acks {
            let _ = within(PATIENCE, "the fake to start a graceful stop", ack).await;
        }
    }

    /// Answers the next call to `path` with `reply` (FIFO, before any script).
    pub fn reply_once(&self, path: &str, reply: Reply) {
        self.state
            .once
            .lock()
            .unwrap()
            .entry(path.to_string())
            .or_default()
            .push_back(reply);
    }

    /// Answers every call to `path` with what `f` returns.
    pub fn script(&self, path: &str, f: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) {
        self.state
            .scripts
            .lock()
            .unwrap()
            .insert(path.to_string(), Arc::new(f));
    }

    pub fn calls(&self) -> Vec<Arc<Recorded>> {
        self.state.calls.lock().unwrap().clone()
    }

    pub fn calls_to(&self, path: &str) -> Vec<Arc<Recorded>> {
        self.calls()
            .into_iter()
            .filter(|c| c.path() == path)
            .collect()
    }

    /// The most recent call to `path`.
    pub fn last(&self, path: &str) -> Arc<Recorded> {
        self.calls_to(path)
            .pop()
            .unwrap_or_else(|| panic!("fake never received {path}"))
    }

    /// The most recent call to `path` whose body is `body` (crisp's own calls, e.g. the ordering
    /// engine's status reads, carry other bodies).
    pub fn last_with_body(&self, path: &str, body: &[u8]) -> Arc<Recorded> {
        self.calls_to(path)
            .into_iter()
            .rev()
            .find(|c| c.body == body)
            .unwrap_or_else(|| panic!("fake never received {path} with the test's body"))
    }

    /// How many calls to `path` arrived (counted when their headers arrive).
    pub fn started(&self, path: &str) -> usize {
        self.state
            .started
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == path)
            .count()
    }

    /// Connections the running fake has accepted since it (re)started.
    pub fn connections(&self) -> usize {
        self.running
            .lock()
            .unwrap()
            .as_ref()
            .map_or(0, |r| r.conns.lock().unwrap().len())
    }

    pub fn started_total(&self) -> usize {
        self.state.started.lock().unwrap().len()
    }

    /// Waits (up to `limit`) until `f` returns `Some` for the recorded calls.
    pub async fn wait_until<T>(
        &self,
        limit: Duration,
        what: &str,
        f: impl Fn(&[Arc<Recorded>]) -> Option<T>,
    ) -> T {
        let mut rx = self.events.clone();
        within(limit, what, async move {
            loop {
                if let Some(v) = f(&self.calls()) {
                    return v;
                }
                rx.changed().await.expect("fake state dropped");
            }
        })
        .await
    }

    /// Waits for the `n`th (0-based) call to `path`.
    pub async fn wait_call(&self, path: &str, n: usize) -> Arc<Recorded> {
        let what = format!("call #{n} to {path} to reach the fake");
        self.wait_until(PATIENCE, &what, |calls| {
            calls.iter().filter(|c| c.path() == path).nth(n).cloned()
        })
        .await
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(r) = self.running.lock().unwrap().take() {
            r.accept.abort();
            let _ = r.kill.send(true);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// crisp under test

pub struct Crisp {
    pub path: PathBuf,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
    _guard: Option<crisp::proxy::listener::SocketFileGuard>,
    _dir: tempfile::TempDir,
}

/// crisp as the daemon runs it (default chain: tap + ordering engine, admin socket), in a temp
/// dir; started once its admin socket listens (the daemon says so: nothing is polled).
pub struct Daemon {
    pub sock: PathBuf,
    pub admin: PathBuf,
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    pub task: JoinHandle<()>,
    _guard: crisp::proxy::listener::SocketFileGuard,
}

impl Daemon {
    pub async fn start(upstream: &Path, tweak: impl FnOnce(&mut crisp::config::Config)) -> Daemon {
        init_logging();
        let dir = tempfile::Builder::new()
            .prefix("crisp-daemon")
            .tempdir()
            .unwrap();
        let sock = dir.path().join("crisp.sock");
        let (listener, guard) = crisp::proxy::listener::bind(&sock, 0o660).await.unwrap();
        let mut cfg = test_config(&sock, upstream, dir.path());
        tweak(&mut cfg);
        let admin = cfg.admin_socket();
        let (tx, rx) = oneshot::channel::<()>();
        let (ready_tx, ready) = oneshot::channel();
        let task = tokio::spawn(crisp::daemon::serve_on_notify(
            listener,
            cfg,
            async {
                let _ = rx.await;
            },
            ready_tx,
        ));
        within(PATIENCE, "the admin socket to listen", ready)
            .await
            .expect("the daemon ended before its admin socket was bound");
        Daemon {
            sock,
            admin,
            dir,
            stop: Some(tx),
            task,
            _guard: guard,
        }
    }

    /// Resolves the daemon's shutdown future and waits for it to finish.
    pub async fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        within(PATIENCE, "crisp to stop", &mut self.task)
            .await
            .unwrap();
    }
}

/// The daemon's default configuration, with every path inside `dir`.
pub fn test_config(listen: &Path, upstream: &Path, dir: &Path) -> crisp::config::Config {
    crisp::config::Config {
        listen: listen.to_path_buf(),
        upstream: upstream.to_path_buf(),
        state_dir: dir.join("state"),
        ..Default::default()
    }
}

fn crisp_socket() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("crisp-test")
        .tempdir()
        .unwrap();
    let path = dir.path().join("crisp.sock");
    (dir, path)
}

impl Crisp {
    /// Runs crisp as the daemon does (default configuration, its default interceptor chain) in
    /// front of `upstream`.
    pub async fn start(upstream: &Path) -> Crisp {
        init_logging();
        let (dir, path) = crisp_socket();
        let (listener, guard) = crisp::proxy::listener::bind(&path, 0o660).await.unwrap();
        let cfg = test_config(&path, upstream, dir.path());
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(crisp::daemon::serve_on(listener, cfg, async {
            let _ = rx.await;
        }));
        Crisp {
            path,
            shutdown: Some(tx),
            task: Some(task),
            _guard: Some(guard),
            _dir: dir,
        }
    }

    /// Runs crisp with the given interceptors and options.
    pub async fn start_with(
        upstream: &Path,
        interceptors: Vec<Arc<dyn Interceptor>>,
        opts: ProxyOptions,
    ) -> Crisp {
        init_logging();
        let (dir, path) = crisp_socket();
        let (listener, guard) = crisp::proxy::listener::bind(&path, 0o660).await.unwrap();
        let upstream = Arc::new(Upstream::new(upstream, UpstreamOptions::default()));
        let proxy = Proxy::new(upstream, Interceptors::new(interceptors), opts);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(crisp::proxy::serve(listener, proxy, async {
            let _ = rx.await;
        }));
        Crisp {
            path,
            shutdown: Some(tx),
            task: Some(task),
            _guard: Some(guard),
            _dir: dir,
        }
    }
}

impl Crisp {
    /// Resolves crisp's shutdown future; the returned task ends when `serve` returns.
    pub fn shutdown(&mut self) -> JoinHandle<()> {
        let _ = self.shutdown.take().expect("already shut down").send(());
        self.task.take().expect("already shut down")
    }
}

impl Drop for Crisp {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Clients

/// Connects tonic to a unix socket.
#[derive(Clone)]
pub struct UdsConnector(pub PathBuf);

impl tonic::codegen::Service<Uri> for UdsConnector {
    type Response = TokioIo<UnixStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<UnixStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(TokioIo::new(UnixStream::connect(path).await?)) })
    }
}

/// A tonic channel (one HTTP/2 connection, like kubelet's) to a unix socket.
pub async fn channel(path: &Path) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(UdsConnector(path.to_path_buf()))
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", path.display()))
}

pub type RuntimeClient =
    k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;
pub type ImageClient =
    k8s_cri::v1::image_service_client::ImageServiceClient<tonic::transport::Channel>;

pub async fn runtime_client(path: &Path) -> RuntimeClient {
    RuntimeClient::new(channel(path).await)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX)
}

/// PullImage of `image` with registry credentials, as kubelet sends it for a private image.
pub async fn pull_with_auth(
    path: &Path,
    image: &str,
    auth: k8s_cri::v1::AuthConfig,
    sandbox_config: Option<k8s_cri::v1::PodSandboxConfig>,
) {
    let image = Some(k8s_cri::v1::ImageSpec {
        image: image.into(),
        ..Default::default()
    });
    let req = k8s_cri::v1::PullImageRequest {
        image,
        auth: Some(auth),
        sandbox_config,
    };
    ImageClient::new(channel(path).await)
        .pull_image(req)
        .await
        .unwrap_or_else(|e| panic!("PullImage: {e}"));
}

/// A request as a raw HTTP/2 client sends it.
#[derive(Clone, Debug)]
pub struct RawRequest {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl RawRequest {
    /// A gRPC call with the headers grpc-go sends.
    pub fn grpc(path: &str, msg: &[u8]) -> RawRequest {
        RawRequest {
            path: path.to_string(),
            headers: header_map(&[("content-type", b"application/grpc"), ("te", b"trailers")]),
            body: grpc_frame(msg),
            trailers: None,
        }
    }
}

/// A response as a raw HTTP/2 client sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct RawResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl RawResponse {
    /// The gRPC status, from the trailers or (trailers-only) the headers.
    pub fn grpc_status(&self) -> Option<&str> {
        self.trailers
            .as_ref()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .map(|v| v.to_str().unwrap())
    }

    pub fn grpc_message(&self) -> Option<String> {
        let v = self
            .trailers
            .as_ref()
            .and_then(|t| t.get("grpc-message"))
            .or_else(|| self.headers.get("grpc-message"))?;
        Some(percent_decode(v.as_bytes()))
    }
}

fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A raw HTTP/2 client (the `h2` crate): sends exactly the headers, body and trailers given and
/// reports exactly what came back.
pub struct Raw {
    send: h2::client::SendRequest<Bytes>,
    conn: JoinHandle<()>,
}

pub fn h2_builder() -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(8 << 20)
        .initial_connection_window_size(32 << 20)
        .max_frame_size(1 << 20)
        .max_header_list_size(1 << 20);
    b
}

impl Raw {
    pub async fn connect(path: &Path) -> Raw {
        let io = UnixStream::connect(path)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        let (send, conn) = h2_builder()
            .handshake::<_, Bytes>(io)
            .await
            .expect("h2 handshake");
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Raw { send, conn }
    }

    /// Opens a stream: sends the headers, body and trailers; returns the response future.
    pub async fn start(
        &mut self,
        req: &RawRequest,
    ) -> Result<h2::client::ResponseFuture, h2::Error> {
        send_raw(&mut self.send, req).await
    }

    pub async fn call(&mut self, req: &RawRequest) -> Result<RawResponse, h2::Error> {
        let fut = self.start(req).await?;
        read_response(fut).await
    }
}

/// Opens a stream on `send`: sends the headers, body and trailers; returns the response future.
pub async fn send_raw(
    send: &mut h2::client::SendRequest<Bytes>,
    req: &RawRequest,
) -> Result<h2::client::ResponseFuture, h2::Error> {
    *send = send.clone().ready().await?;
    let mut r = Request::builder()
        .method(Method::POST)
        .uri(format!("http://localhost{}", req.path))
        .body(())
        .unwrap();
    *r.headers_mut() = req.headers.clone();
    let end = req.body.is_empty() && req.trailers.is_none();
    let (fut, mut stream) = send.send_request(r, end)?;
    if !req.body.is_empty() {
        stream.send_data(req.body.clone(), req.trailers.is_none())?;
    }
    if let Some(t) = &req.trailers {
        stream.send_trailers(t.clone())?;
    }
    Ok(fut)
}

pub async fn read_response(fut: h2::client::ResponseFuture) -> Result<RawResponse, h2::Error> {
    let resp = fut.await?;
    let (parts, mut body) = resp.into_parts();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?;
    Ok(RawResponse {
        status: parts.status,
        headers: parts.headers,
        body: data.freeze(),
        trailers,
    })
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

/// Reads `sock` until the peer closes it (EOF or reset). Returns what was read before.
pub async fn read_until_closed(sock: &mut UnixStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match sock.read(&mut buf).await {
            Ok(0) => return seen,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e)
                if e.kind() == io::ErrorKind::ConnectionReset
                    || e.kind() == io::ErrorKind::BrokenPipe =>
            {
                return seen
            }
            Err(e) => panic!("unexpected read error: {e}"),
        }
    }
}
