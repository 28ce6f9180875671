//! The fake CRI runtime: a raw hyper HTTP/2 server that records exactly what arrives and
//! answers exactly what a test scripts.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::*;

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

/// The number of the connection a request came on, as the fake accepted them (from 1).
#[derive(Debug, Clone, Copy)]
struct ConnNo(u64);

/// One call as the fake received it.
#[derive(Debug)]
pub struct Recorded {
    pub seq: u64,
    /// Which connection the call came on (numbered as the fake accepted them): a relayed call
    /// comes on its client's own runtime connection, a diverted one on crisp's pool's.
    pub conn: u64,
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

    /// A successful ExecSync answer of `stdout` and `stderr` bytes, framed, as 64 KiB slices of
    /// one buffer (slicing copies nothing): what the memory tests send through crisp.
    pub fn exec_sync(stdout: usize, stderr: usize, exit_code: i32) -> Reply {
        use prost::Message;
        let msg = k8s_cri::v1::ExecSyncResponse {
            stdout: vec![b'x'; stdout],
            stderr: vec![b'y'; stderr],
            exit_code,
        };
        let body: Bytes = grpc_frame(&msg.encode_to_vec());
        let chunks = (0..body.len())
            .step_by(64 << 10)
            .map(|at| {
                (
                    Duration::ZERO,
                    body.slice(at..(at + (64 << 10)).min(body.len())),
                )
            })
            .collect();
        Reply::Full {
            headers: grpc_headers(),
            chunks,
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

/// Scripts the fake to answer every Version call with the returned response.
pub fn answer_version(fake: &Fake) -> k8s_cri::v1::VersionResponse {
    use prost::Message;
    let answer = k8s_cri::v1::VersionResponse {
        version: "0.1.0".into(),
        runtime_name: "fake".into(),
        runtime_version: "1".into(),
        runtime_api_version: "v1".into(),
    };
    let a = answer.encode_to_vec();
    fake.script("/runtime.v1.RuntimeService/Version", move |_| {
        Reply::unary(&a)
    });
    answer
}

/// The pod's name a recorded RunPodSandbox carries ("" where absent), for scripts that answer
/// with an id made from it.
pub fn sandbox_name(rec: &Recorded) -> String {
    use prost::Message;
    let r = k8s_cri::v1::RunPodSandboxRequest::decode(rec.message()).unwrap();
    r.config
        .and_then(|c| c.metadata)
        .map(|m| m.name)
        .unwrap_or_default()
}

/// The pod's and the container's names a recorded CreateContainer carries ("" where absent), for
/// scripts that answer with an id made from them.
pub fn container_names(rec: &Recorded) -> (String, String) {
    use prost::Message;
    let r = k8s_cri::v1::CreateContainerRequest::decode(rec.message()).unwrap();
    let pod = r
        .sandbox_config
        .and_then(|c| c.metadata)
        .map(|m| m.name)
        .unwrap_or_default();
    let name = r
        .config
        .and_then(|c| c.metadata)
        .map(|m| m.name)
        .unwrap_or_default();
    (pod, name)
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
            // What containerd and CRI-O answer today to the streamed list crisp's own
            // container lists try first (KEP-5825); scripted or `reply_once`d, it is served.
            None if rec.path() == "/runtime.v1.RuntimeService/StreamContainers" => {
                let mut h = HeaderMap::new();
                h.insert("content-type", HeaderValue::from_static("application/grpc"));
                h.insert("grpc-status", HeaderValue::from_static("12"));
                h.insert(
                    "grpc-message",
                    HeaderValue::from_static(
                        "unknown method StreamContainers for service runtime.v1.RuntimeService",
                    ),
                );
                Reply::TrailersOnly(h)
            }
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
            conn: parts.extensions.get::<ConnNo>().map_or(0, |c| c.0),
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
            let mut accepted = 0u64;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted += 1;
                let conn_no = ConnNo(accepted);
                let state = state.clone();
                let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    let state = state.clone();
                    req.extensions_mut().insert(conn_no);
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
