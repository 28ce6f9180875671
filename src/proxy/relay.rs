//! The relay: crisp's fast path, a frame-level HTTP/2 relay between one client connection and a
//! runtime connection of its own.
//!
//! Every frame is copied through as it is, with three exceptions:
//! - request header blocks are decoded (for the route) and re-encoded statelessly
//!   ([`super::frames::encode_field`]), so crisp may keep some streams from the runtime without
//!   desynchronising the HPACK tables;
//! - a new stream that an interceptor wants to see (or hold) is **diverted**: it never reaches this
//!   runtime connection; its request goes through [`Proxy::handle`] (the observed path and its
//!   pooled upstream connections) and its response is written back into the client connection;
//! - crisp's own keep-alive PINGs, and the flow-control bookkeeping that diverted streams need.
//!
//! Flow control. Settings and windows are negotiated end to end between client and runtime.
//! Bytes crisp writes to the client on a diverted stream use up the client's connection window
//! without the runtime knowing, so (a) crisp keeps that many bytes of the client's connection
//! credits from the runtime ("debt"), and (b) never relays runtime DATA beyond the window the
//! client really has left. Request bytes on a diverted stream never reach the runtime, so crisp
//! returns their connection credit to the client at once, and their stream credit as the
//! observed path consumes them.
//!
//! Failure. When the runtime connection ends or sends GOAWAY, calls in flight on it end with
//! UNAVAILABLE (or REFUSED_STREAM for those the runtime says it never saw, which gRPC retries
//! transparently), new streams are diverted, and the client is sent GOAWAY so that it reconnects
//! — to a fresh relay once the runtime is back. If the runtime is down when a client connects,
//! the whole connection is served by the observed path (UNAVAILABLE until the runtime returns).

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::Request;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Notify};

use super::body::{BoxError, ProxyBody};
use super::h2::Indexer;
use super::h2::{self, Flags, GoAway, Head, IdHasher, IdMap, Kind, Ping, Reason, RstStream, Settings, WindowUpdate};
use super::sock::{self, Sock, Wake};
use super::upstream::{Fields, RawFields};
use super::Proxy;
use crate::cri::Route;
use crate::intercept::{Call, Outcome};
use crate::status::{code, parse_grpc_timeout};

/// Opaque data of crisp's own keep-alive PINGs; their ACKs are not relayed.
const KEEPALIVE: [u8; 8] = *b"crisp-ka";
/// Largest header block crisp accepts (the runtime's limit is usually far lower).
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Largest header list (names and values, decoded) crisp accepts: grpc-go's server default. A
/// block of 1 MiB that refers again and again to one large table entry decodes to gigabytes.
const MAX_HEADER_LIST: usize = 16 << 20;

/// A diverted stream's request body, as the client sends it.
pub struct RelayBody {
    rx: mpsc::UnboundedReceiver<BodyPart>,
    stream: u32,
    shared: Arc<Shared>,
    done: bool,
}

impl std::fmt::Debug for RelayBody {
    fn fmt(&self, fmt: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fmt.debug_struct("RelayBody").field("stream", &self.stream).finish()
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(BodyPart::Trailers(t))) => {
                self.done = true;
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Poll::Ready(Some(BodyPart::Data(b))) => {
                // Consumed: the client may send that much more on this stream.
                if !b.is_empty() {
                    let mut w = Vec::with_capacity(13);
                    WindowUpdate::new(self.stream, b.len() as u32).encode(&mut w);
                    self.shared.send(w);
                }
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// What the client sends on a diverted stream after its headers.
pub enum BodyPart {
    Data(Bytes),
    Trailers(http::HeaderMap),
}

/// A stream relayed to this connection's runtime.
struct Relayed {
    /// Reported to the interceptors when the stream ends (when they asked for it).
    call: Option<Call>,
    /// The runtime has sent the response headers.
    answered: bool,
}

struct State {
    /// How many DATA bytes the client will still accept on the connection.
    client_window: i64,
    /// Connection credits to keep from the runtime: bytes crisp sent the client on its own.
    debt: u64,
    /// The client's SETTINGS_INITIAL_WINDOW_SIZE, as far as crisp may rely on it for the
    /// diverted streams it sends on (see `unacked_windows`).
    client_initial_window: i64,
    /// The client's SETTINGS frames relayed to the runtime and not yet acknowledged by it, oldest
    /// first, with the INITIAL_WINDOW_SIZE each carried. A client (h2, for one) grows its streams'
    /// receive windows only when its SETTINGS are acknowledged, and the runtime's ACK reaches it
    /// through crisp: crisp's own DATA must not count on a larger window before that ACK went
    /// out, or the client sees more than it allowed (FLOW_CONTROL_ERROR). A smaller window is
    /// applied at once.
    unacked_windows: std::collections::VecDeque<Option<i64>>,
    /// Diverted streams: the client's window for their response.
    diverted: IdMap<i64>,
    relayed: IdMap<Relayed>,
    /// Highest stream id the client opened.
    max_stream: u32,
    /// Last stream id crisp told the client it would process (after its GOAWAY).
    goaway: Option<u32>,
    /// No runtime connection (gone, closing, or never made): new streams are diverted.
    degraded: bool,
    last_client_frame: Instant,
    /// When the client last opened a stream.
    last_stream_at: Instant,
}

/// What the two directions and the diverted streams share.
pub struct Shared {
    st: Mutex<State>,
    /// The client's window grew (or a stream ended): waiters re-check.
    window: Notify,
    /// Frames for the client that do not come from the runtime, from other threads (diverted
    /// streams' tasks); the relay thread writes them between the runtime's frames.
    ctl: Mutex<Vec<u8>>,
    /// Wakes the relay thread: `ctl` has frames, or `stop` / `kill` was set.
    wake: Wake,
    /// crisp is shutting down: GOAWAY, then finish what is in flight.
    stop: AtomicBool,
    /// The connection's task was dropped (the shutdown grace ended): close now.
    kill: AtomicBool,
    pings: PingGate,
}

/// Decides which of the client's PINGs go on to the runtime.
///
/// grpc-go clients (kubelet, crictl) send a PING whenever DATA arrives and none is outstanding
/// (BDP estimation). A grpc-go server (containerd) counts a PING as a "strike" unless it has sent
/// HEADERS or DATA on that connection since the previous PING, and closes the connection with
/// GOAWAY ENHANCE_YOUR_CALM after three strikes (KUBELET-CRI.md §11). Through crisp, DATA the
/// client receives may come from crisp itself (a diverted call's response), so its PINGs would
/// reach a runtime connection that said nothing: strikes. crisp therefore forwards a client PING
/// only when the runtime has written HEADERS or DATA since the ACK of the previous forwarded
/// one (frames on a connection are ordered, so those were written after that PING was counted),
/// and answers the others itself. The runtime never sees a PING it would count; BDP estimation
/// still measures the runtime's round trip whenever the data came from the runtime.
#[derive(Default)]
struct PingGate(std::sync::atomic::AtomicU8);

impl PingGate {
    /// No HEADERS/DATA from the runtime since the last forwarded PING was answered.
    const STALE: u8 = 0;
    /// The runtime wrote HEADERS or DATA since then: a PING now resets its strikes.
    const FRESH: u8 = 1;
    /// A forwarded PING awaits its ACK.
    const OUTSTANDING: u8 = 2;

    /// The runtime sent HEADERS or DATA (runtime → client direction, in wire order).
    fn runtime_wrote(&self) {
        use std::sync::atomic::Ordering::*;
        if self.0.load(Relaxed) == Self::STALE {
            let _ = self.0.compare_exchange(Self::STALE, Self::FRESH, AcqRel, Relaxed);
        }
    }

    /// The runtime answered a PING.
    fn acked(&self) {
        use std::sync::atomic::Ordering::*;
        let _ = self.0.compare_exchange(Self::OUTSTANDING, Self::STALE, AcqRel, Relaxed);
    }

    /// Whether a client PING may go to the runtime now (and if so, it is outstanding).
    fn try_forward(&self) -> bool {
        use std::sync::atomic::Ordering::*;
        self.0.compare_exchange(Self::FRESH, Self::OUTSTANDING, AcqRel, Relaxed).is_ok()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, frame: Vec<u8>) {
        let was_empty = {
            let mut q = self.ctl.lock().unwrap_or_else(|e| e.into_inner());
            let was_empty = q.is_empty();
            q.extend_from_slice(&frame);
            was_empty
        };
        if was_empty {
            self.wake.notify();
        }
    }

    /// Moves the frames other threads queued for the client into `into`.
    fn take_ctl(&self, into: &mut Vec<u8>) {
        let mut q = self.ctl.lock().unwrap_or_else(|e| e.into_inner());
        if !q.is_empty() {
            into.extend_from_slice(&q);
            q.clear();
        }
    }

    /// Sends a diverted stream's response data within the client's windows.
    async fn send_data(&self, stream: u32, mut data: Bytes) {
        while !data.is_empty() {
            let notified = self.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let n = {
                let mut st = self.lock();
                let Some(&sw) = st.diverted.get(&stream) else { return };
                let n = st.client_window.min(sw).min(h2::MAX_FRAME as i64).min(data.len() as i64);
                if n > 0 {
                    st.client_window -= n;
                    st.debt += n as u64;
                    *st.diverted.get_mut(&stream).expect("checked") -= n;
                }
                n
            };
            if n <= 0 {
                notified.await;
                continue;
            }
            let chunk = data.split_to(n as usize);
            let mut out = Vec::with_capacity(h2::HEADER_LEN + chunk.len());
            h2::data(&mut out, stream, &chunk, false);
            self.send(out);
        }
    }
}

/// Stack of a relay thread: frame handling, the interceptors' `interest`/`on_complete` and
/// logging run on it; none recurses.
const RELAY_STACK: usize = 512 << 10;

/// Serves one client connection, relaying to a runtime connection of its own when the runtime
/// accepts one.
///
/// The handshake (the client's preface, the runtime connection) is async; then the connection
/// moves to a thread of its own that blocks in `poll(2)` on its two sockets (see [`Pump`]): a
/// relayed hop costs a wakeup, a `recv` and a `send`, and no async runtime's scheduler,
/// reactor and timers (BENCHMARKS.md: about a third of crisp's instructions per call on tokio).
/// Diverted streams still run on tokio; their frames reach the thread through [`Shared`].
pub async fn serve_connection(mut client: UnixStream, proxy: Arc<Proxy>, mut shutdown: watch::Receiver<bool>) {
    if !preface(&mut client, &proxy).await {
        return;
    }
    let upstream = connect_upstream(&proxy).await;
    let parts = client.into_std().and_then(Sock::new).and_then(|c| Ok((c, Wake::new()?)));
    let (client, wake) = match parts {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "cannot set up a client connection for relaying; closing it");
            return;
        }
    };
    let shared = Arc::new(Shared::new(wake, upstream.is_none()));
    let tasks = Tasks::default();
    let mut pump = Pump::new(&proxy, &shared, tasks.clone(), client, upstream);
    let (done_tx, mut done) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::runtime::Handle::current();
    let spawned = std::thread::Builder::new().name("crisp-relay".into()).stack_size(RELAY_STACK).spawn(move || {
        // Diverted streams are spawned on crisp's runtime from here.
        let _rt = handle.enter();
        // A bug in here must cost this connection only, and still end its calls below.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pump.run())) {
            Ok(Ok(())) => tracing::debug!("client connection closed"),
            Ok(Err(e)) => tracing::debug!(error = %e, "client connection ended"),
            Err(_) => {
                tracing::error!("the relay thread of a client connection panicked (a bug: please report it with the log above); its connection is closed and kubelet reconnects")
            }
        }
        // The client is gone (or was closed): nothing may stay behind.
        tasks.abort_all();
        let relayed: Vec<Relayed> = pump.up.shared.lock().relayed.drain().map(|(_, r)| r).collect();
        let now = Instant::now();
        for r in relayed {
            complete(&pump.up.proxy, r.call, Some(code::CANCELLED), None, now);
        }
        let _ = done_tx.send(());
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a relay thread; closing the client connection (it will reconnect)");
        return;
    }
    // Dropped before the thread ends (crisp's shutdown grace ran out): the thread closes the
    // connection at once.
    let _kill = KillOnDrop(shared.clone());
    let mut watching = true;
    loop {
        if watching && *shutdown.borrow_and_update() {
            shared.stop.store(true, Ordering::Release);
            shared.wake.notify();
            watching = false;
        }
        tokio::select! {
            _ = &mut done => return,
            r = shutdown.changed(), if watching => if r.is_err() { watching = false },
        }
    }
}

/// Reads the client's HTTP/2 connection preface (and nothing past it); false if the
/// connection is to be closed.
async fn preface(client: &mut UnixStream, proxy: &Proxy) -> bool {
    let mut preface = [0u8; 24];
    match tokio::time::timeout(proxy.opts.handshake_timeout, client.read_exact(&mut preface)).await {
        Ok(Ok(_)) if &preface == h2::PREFACE => true,
        Ok(Ok(_)) => {
            tracing::debug!("client connection closed: not HTTP/2 (no connection preface)");
            false
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "client connection closed during the HTTP/2 preface");
            false
        }
        Err(_) => {
            tracing::debug!(timeout_ms = proxy.opts.handshake_timeout.as_millis() as u64, "client connection closed: no HTTP/2 preface in time");
            false
        }
    }
}

/// This client connection's own runtime connection, its preface written; None: the client is
/// served on the observed path.
async fn connect_upstream(proxy: &Proxy) -> Option<Sock> {
    match proxy.upstream.connect().await {
        Ok(mut s) => match s.write_all(h2::PREFACE).await.and_then(|()| s.into_std()).and_then(Sock::new) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(upstream = %proxy.upstream.path().display(), error = %e, "upstream connection failed at once; serving this client on the observed path");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "serving this client connection on the observed path until the runtime is back");
            None
        }
    }
}

impl Shared {
    fn new(wake: Wake, degraded: bool) -> Shared {
        Shared {
            st: Mutex::new(State {
                client_window: h2::DEFAULT_WINDOW,
                debt: 0,
                client_initial_window: h2::DEFAULT_WINDOW,
                unacked_windows: std::collections::VecDeque::new(),
                diverted: IdMap::default(),
                relayed: IdMap::default(),
                max_stream: 0,
                goaway: None,
                degraded,
                last_client_frame: Instant::now(),
                last_stream_at: Instant::now(),
            }),
            window: Notify::new(),
            ctl: Mutex::new(Vec::new()),
            wake,
            stop: AtomicBool::new(false),
            kill: AtomicBool::new(false),
            pings: PingGate::default(),
        }
    }
}

struct KillOnDrop(Arc<Shared>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill.store(true, Ordering::Release);
        self.0.wake.notify();
    }
}

/// Diverted streams' tasks, aborted when the client resets the stream or goes away.
#[derive(Default, Clone)]
struct Tasks(Arc<Mutex<IdMap<tokio::task::AbortHandle>>>);

impl Tasks {
    fn abort(&self, stream: u32) {
        if let Some(h) = self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream) {
            h.abort();
        }
    }

    fn abort_all(&self) {
        for (_, h) in self.0.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            h.abort();
        }
    }
}

/// Sets the client's initial stream window for crisp's own sends: every diverted stream's window
/// moves by the difference (RFC 9113 §6.9.2).
fn set_client_window(st: &mut State, v: i64) {
    let delta = v - st.client_initial_window;
    st.client_initial_window = v;
    for w in st.diverted.values_mut() {
        *w += delta;
    }
}

/// Reports a relayed call's end; `now` is when its last frame was read.
fn complete(proxy: &Proxy, call: Option<Call>, code: Option<i32>, message: Option<String>, now: Instant) {
    if let Some(call) = call {
        let duration = now.saturating_duration_since(call.received);
        let outcome = Outcome { code, duration, held: Duration::ZERO, request: None, response: None, message };
        proxy.interceptors.on_complete(&call, &outcome);
    }
}

/// A header block still waiting for its CONTINUATION frames.
struct PendingBlock {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error from the client: {0}")]
    Protocol(&'static str),
    #[error("client stopped answering keep-alive pings")]
    KeepAlive,
}

/// Client → runtime.
struct ClientToUpstream {
    proxy: Arc<Proxy>,
    shared: Arc<Shared>,
    tasks: Tasks,
    /// The connection has a runtime connection to relay to.
    upstream: bool,
    dec: super::h2::hpack::Decoder,
    /// Request bodies of diverted streams, until the client ends them.
    bodies: IdMap<mpsc::UnboundedSender<BodyPart>>,
    pending: Option<PendingBlock>,
    /// Highest stream id sent to the runtime.
    max_relayed: u32,
    /// Streams this connection diverted (see [`Self::is_diverted`]).
    diverted_ids: HashSet<u32, BuildHasherDefault<IdHasher>>,
    /// The re-encoded request header block, reused from call to call.
    enc: Vec<u8>,
    /// The fields of the request header block being handled.
    fields: FieldList,
    /// The runtime connection's HPACK table, which crisp alone writes to.
    indexer: Indexer,
    /// Paths this client used, with their routes: no copy or re-validation per call.
    paths: PathCache,
    /// When the frames being handled were read (one clock read per read, not per call).
    now: Instant,
}

impl ClientToUpstream {
    /// Handles the complete frames at the start of `buf` (just read from the client): what goes
    /// on to the runtime is appended to `out`, crisp's own answers to the client to `ctl`.
    fn frames(&mut self, buf: &mut BytesMut, out: &mut Vec<u8>, ctl: &mut Vec<u8>, now: Instant) -> Result<(), RelayError> {
        let mut credit = 0u32;
        let mut got_frame = false;
        self.now = now;
        // Frames are handled where they lie in `buf` (no `Bytes` per frame: its refcount and,
        // for the first split of a buffer, an allocation); the consumed ones are dropped from
        // `buf` at the end.
        let (mut pos, mut missing) = (0, 0);
        while let Some(head) = h2::complete_at(buf, pos, &mut missing) {
            let len = h2::HEADER_LEN + head.len;
            got_frame = true;
            self.frame(head, &buf[pos..pos + len], out, ctl, &mut credit)?;
            pos += len;
        }
        buf.advance(pos);
        if missing > 0 {
            buf.reserve(missing);
        }
        if got_frame {
            self.shared.lock().last_client_frame = self.now;
        }
        if credit > 0 {
            WindowUpdate::new(0, credit).encode(ctl);
        }
        Ok(())
    }

    /// One complete frame from the client: relayed (into `out`), kept, or answered by crisp
    /// (into `ctl`); `credit` collects connection credit to give back for bytes kept.
    fn frame(&mut self, head: Head, frame: &[u8], out: &mut Vec<u8>, ctl: &mut Vec<u8>, credit: &mut u32) -> Result<(), RelayError> {
        let payload = &frame[h2::HEADER_LEN..];
        if self.pending.is_some() {
            return self.continuation(head, payload, out, ctl);
        }
        let relay = |out: &mut Vec<u8>| out.extend_from_slice(frame);
        match head.kind {
            Kind::Data => self.data(head, frame, out, credit),
            Kind::Headers => {
                let r = h2::header_fragment(&head, payload).ok_or(RelayError::Protocol("malformed HEADERS"))?;
                if head.has(Flags::END_HEADERS) {
                    self.header_block(head.stream, head.has(Flags::END_STREAM), &payload[r], out, ctl)?;
                } else {
                    self.pending = Some(PendingBlock { stream: head.stream, end_stream: head.has(Flags::END_STREAM), block: payload[r].to_vec() });
                }
            }
            Kind::Continuation => return Err(RelayError::Protocol("CONTINUATION without HEADERS")),
            Kind::RstStream => {
                if self.bodies.remove(&head.stream).is_some() || self.is_diverted(head.stream) {
                    self.tasks.abort(head.stream);
                    self.shared.lock().diverted.remove(&head.stream);
                    self.shared.window.notify_waiters();
                } else {
                    let r = self.shared.lock().relayed.remove(&head.stream);
                    if let Some(r) = r {
                        complete(&self.proxy, r.call, Some(code::CANCELLED), None, self.now);
                    }
                    if self.upstream {
                        relay(out);
                    }
                }
            }
            Kind::Settings => {
                if !head.has(Flags::ACK) {
                    self.settings(&head, payload, self.upstream);
                    if !self.upstream {
                        Settings::encode_ack(ctl);
                    }
                }
                if self.upstream {
                    relay(out);
                }
            }
            Kind::Ping => self.ping(head, frame, out, ctl),
            Kind::WindowUpdate => self.window_update(head, frame, out),
            // PRIORITY, GOAWAY, unknown extension frames: the runtime's business.
            _ => {
                if self.upstream {
                    relay(out);
                }
            }
        }
        Ok(())
    }

    /// A CONTINUATION of the header block in `self.pending`.
    fn continuation(&mut self, head: Head, payload: &[u8], out: &mut Vec<u8>, ctl: &mut Vec<u8>) -> Result<(), RelayError> {
        let p = self.pending.as_mut().expect("called with a pending block");
        if head.kind != Kind::Continuation || head.stream != p.stream {
            return Err(RelayError::Protocol("header block interrupted"));
        }
        p.block.extend_from_slice(payload);
        if p.block.len() > MAX_HEADER_BLOCK {
            return Err(RelayError::Protocol("header block too large"));
        }
        if head.has(Flags::END_HEADERS) {
            let p = self.pending.take().expect("checked");
            self.header_block(p.stream, p.end_stream, &p.block, out, ctl)?;
        }
        Ok(())
    }

    /// DATA: relayed on a relayed stream; a diverted stream's request body otherwise.
    fn data(&mut self, head: Head, frame: &[u8], out: &mut Vec<u8>, credit: &mut u32) {
        let payload = &frame[h2::HEADER_LEN..];
        if let Some(tx) = self.bodies.get(&head.stream) {
            // Never reaches the runtime: the client gets its connection credit back now.
            *credit = credit.saturating_add(head.len as u32);
            if let Some(r) = h2::data_payload(&head, payload) {
                if !r.is_empty() {
                    // A diverted request's body (a few KiB at most for the calls crisp
                    // diverts): copied out of the read buffer.
                    let _ = tx.send(BodyPart::Data(Bytes::copy_from_slice(&payload[r])));
                }
            }
            if head.has(Flags::END_STREAM) {
                self.bodies.remove(&head.stream);
            }
        } else if self.upstream && head.stream <= self.max_relayed && !self.is_diverted(head.stream) {
            out.extend_from_slice(frame);
        } else {
            *credit = credit.saturating_add(head.len as u32);
        }
    }

    /// PING: ACKs of the runtime's PINGs go back to it; the client's own PINGs go on only when
    /// the runtime would not count them as strikes (see [`PingGate`]), else crisp answers.
    fn ping(&mut self, head: Head, frame: &[u8], out: &mut Vec<u8>, ctl: &mut Vec<u8>) {
        let payload = &frame[h2::HEADER_LEN..];
        if head.has(Flags::ACK) {
            // crisp's own keep-alive's ACKs end here.
            if self.upstream && payload != KEEPALIVE {
                out.extend_from_slice(frame);
            }
        } else if self.upstream && !self.shared.lock().degraded && self.shared.pings.try_forward() {
            out.extend_from_slice(frame);
        } else if payload.len() == 8 {
            Ping::load(&head, payload).expect("8 bytes").pong().encode(ctl);
        } else if self.upstream {
            // Malformed: the runtime's to judge.
            out.extend_from_slice(frame);
        }
    }

    /// WINDOW_UPDATE: the connection's credit pays crisp's debt first (bytes it sent on
    /// diverted streams), a diverted stream's is crisp's, a relayed stream's the runtime's.
    fn window_update(&mut self, head: Head, frame: &[u8], out: &mut Vec<u8>) {
        let payload = &frame[h2::HEADER_LEN..];
        // Malformed (FRAME_SIZE_ERROR): the runtime's to judge; crisp counts no credit.
        let inc = WindowUpdate::load(&head, payload).map_or(0, |w| w.increment);
        if head.stream == 0 {
            let (forward, waiters) = {
                let mut st = self.shared.lock();
                st.client_window += inc as i64;
                let keep = st.debt.min(inc as u64);
                st.debt -= keep;
                // Only diverted streams' tasks wait for the client's window.
                (inc - keep as u32, !st.diverted.is_empty())
            };
            if waiters {
                self.shared.window.notify_waiters();
            }
            if self.upstream && forward > 0 {
                WindowUpdate::new(0, forward).encode(out);
            }
        } else if self.is_diverted(head.stream) {
            if let Some(w) = self.shared.lock().diverted.get_mut(&head.stream) {
                *w += inc as i64;
            }
            self.shared.window.notify_waiters();
        } else if self.upstream {
            out.extend_from_slice(frame);
        }
    }

    /// Without a lock: `diverted_ids` is this direction's own record. A finished diverted
    /// stream may linger in it (pruned in batches): its late frames are dropped, which is right,
    /// as the runtime never saw the stream.
    fn is_diverted(&self, stream: u32) -> bool {
        self.diverted_ids.contains(&stream)
    }

    /// A client SETTINGS frame (not an ACK). `relayed`: it goes on to the runtime, whose ACK
    /// will reach the client through crisp; otherwise crisp acknowledges it itself, at once.
    fn settings(&mut self, head: &Head, payload: &[u8], relayed: bool) {
        // A malformed frame (FRAME_SIZE_ERROR) changes no window: the runtime (or, degraded,
        // the client's next frames) ends the connection.
        let window = Settings::load(head, payload).ok().and_then(|s| s.initial_window_size).map(i64::from);
        let mut st = self.shared.lock();
        if relayed {
            st.unacked_windows.push_back(window);
        }
        match window {
            Some(v) if !relayed || v < st.client_initial_window => set_client_window(&mut st, v),
            _ => return,
        }
        drop(st);
        self.shared.window.notify_waiters();
    }

    /// A complete request header block: relay it re-encoded, or divert its stream.
    fn header_block(&mut self, stream: u32, end_stream: bool, raw: &[u8], out: &mut Vec<u8>, ctl: &mut Vec<u8>) -> Result<(), RelayError> {
        let mut block = std::mem::take(&mut self.enc);
        block.clear();
        let r = self.header_block_into(stream, end_stream, raw, &mut block, out, ctl);
        // Keep the buffer for the next call unless a huge block grew it.
        if block.capacity() <= 64 << 10 {
            self.enc = block;
        }
        r
    }

    fn header_block_into(&mut self, stream: u32, end_stream: bool, raw: &[u8], block: &mut Vec<u8>, out: &mut Vec<u8>, ctl: &mut Vec<u8>) -> Result<(), RelayError> {
        let mut path: Option<(Route, http::uri::PathAndQuery)> = None;
        let mut timeout = None;
        let paths = &mut self.paths;
        let fields = &mut self.fields;
        fields.clear();
        let mut too_large = false;
        let decoded = self.dec.decode(raw, |n, v| {
            match n {
                b":path" => path = Some(paths.get(v)),
                b"grpc-timeout" => timeout = parse_grpc_timeout(v),
                _ => {}
            }
            too_large |= fields.bytes.len() + n.len() + v.len() > MAX_HEADER_LIST;
            if !too_large {
                fields.push(n, v);
            }
        });
        if too_large {
            tracing::warn!(max_bytes = MAX_HEADER_LIST, "client sent a header block that decodes to more than crisp accepts; closing its connection");
            GoAway::new(self.shared.lock().max_stream, Reason::COMPRESSION_ERROR, b"crisp: header list too large").encode(ctl);
            return Err(RelayError::Protocol("header list too large"));
        }
        if let Err(e) = decoded {
            tracing::warn!(error = %e, "client sent a header block crisp cannot decode; closing its connection");
            GoAway::new(self.shared.lock().max_stream, Reason::COMPRESSION_ERROR, b"crisp: bad header block").encode(ctl);
            return Err(RelayError::Protocol("undecodable header block"));
        }
        let now = self.now;
        let new_stream = {
            let mut st = self.shared.lock();
            if stream > st.max_stream && stream % 2 == 1 {
                st.max_stream = stream;
                st.last_stream_at = now;
                true
            } else {
                false
            }
        };
        if !new_stream {
            // Trailers (gRPC clients send none, but HTTP/2 allows them).
            self.fields.stateless(block);
            if let Some(tx) = self.bodies.remove(&stream) {
                match fields_from_block(block) {
                    Ok((_, trailers)) => {
                        let _ = tx.send(BodyPart::Trailers(trailers));
                    }
                    Err(why) => tracing::warn!(stream, why, "client sent request trailers crisp cannot forward; dropped"),
                }
                return Ok(());
            }
            // Or a protocol error for the runtime to judge: relayed streams only.
            if self.upstream && stream <= self.max_relayed && !self.is_diverted(stream) && !self.bodies.contains_key(&stream) {
                // Stateless fields leave the runtime's table alone; owed size updates go first.
                let mut b = Vec::with_capacity(block.len() + 8);
                self.indexer.begin(&mut b);
                b.extend_from_slice(block);
                h2::headers(out, stream, &b, end_stream);
            }
            return Ok(());
        }
        let (route, path) = path.unwrap_or_else(|| (Route::UNKNOWN, http::uri::PathAndQuery::from_static("/")));
        let call = Call { route, path, received: now, deadline: timeout.map(|d| now + d), id: self.proxy.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed) };
        let interest = self.proxy.interceptors.interest(&call);
        let divert = interest.request || interest.response;
        {
            let mut st = self.shared.lock();
            if st.goaway.is_some_and(|last| stream > last) {
                // After crisp's GOAWAY: unprocessed, the client retries it elsewhere.
                drop(st);
                RstStream::new(stream, Reason::REFUSED_STREAM).encode(ctl);
                return Ok(());
            }
            if !(divert || st.degraded) && self.upstream {
                st.relayed.insert(stream, Relayed { call: interest.complete.then_some(call), answered: false });
                drop(st);
                self.max_relayed = stream;
                self.indexer.begin(block);
                for (n, v) in self.fields.iter() {
                    self.indexer.field(block, n, v);
                }
                h2::headers(out, stream, block, end_stream);
                return Ok(());
            }
            let w = st.client_initial_window;
            st.diverted.insert(stream, w);
            self.diverted_ids.insert(stream);
            if self.diverted_ids.len() > 64 {
                self.diverted_ids.retain(|id| st.diverted.contains_key(id));
            }
        }
        self.fields.stateless(block);
        self.divert(call, stream, block, end_stream, ctl);
        Ok(())
    }

    /// Hands a stream to the observed path, with the call as the relay saw it (one call id, the
    /// arrival time of its headers).
    fn divert(&mut self, call: Call, stream: u32, block: &[u8], end_stream: bool, ctl: &mut Vec<u8>) {
        let mut req = match request_from_block(block) {
            Ok(r) => r,
            Err(why) => {
                tracing::warn!(stream, why, "client sent a request crisp cannot forward; resetting the stream");
                self.shared.lock().diverted.remove(&stream);
                RstStream::new(stream, Reason::PROTOCOL_ERROR).encode(ctl);
                return;
            }
        };
        let body = if end_stream {
            ProxyBody::empty()
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            self.bodies.insert(stream, tx);
            ProxyBody::Relay(RelayBody { rx, stream, shared: self.shared.clone(), done: false })
        };
        req.extensions_mut().insert(call);
        let req = req.map(|()| body);
        let (proxy, shared, tasks) = (self.proxy.clone(), self.shared.clone(), self.tasks.clone());
        let mut map = self.tasks.0.lock().unwrap_or_else(|e| e.into_inner());
        let h = tokio::spawn(async move {
            respond(&proxy, &shared, stream, req).await;
            tasks.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&stream);
            shared.lock().diverted.remove(&stream);
            shared.window.notify_waiters();
        });
        map.insert(stream, h.abort_handle());
    }
}

/// Rebuilds a request from a (stateless, so self-contained) header block. The fields go to the
/// runtime in the client's order ([`RawFields`]; `:authority` as docs/ARCHITECTURE.md says); the
/// `http::Request` around them is what crisp itself reads (the path, `grpc-timeout`).
fn request_from_block(block: &[u8]) -> Result<Request<()>, &'static str> {
    let mut fields = Vec::with_capacity(16);
    super::h2::hpack::Decoder::default().decode(block, |n, v| fields.push((Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))).map_err(|_| "header block")?;
    let mut req = Request::new(());
    *req.version_mut() = http::Version::HTTP_2;
    for (n, v) in &fields {
        match n.as_ref() {
            b":method" => {
                if let Ok(m) = http::Method::from_bytes(v) {
                    *req.method_mut() = m;
                }
            }
            b":path" => {
                if let Ok(u) = http::Uri::from_maybe_shared(v.clone()) {
                    *req.uri_mut() = u;
                }
            }
            n if n.starts_with(b":") => {}
            n => {
                // A field http cannot represent still reaches the runtime (RawFields); crisp
                // only does not look at it.
                if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(n), http::HeaderValue::from_maybe_shared(v.clone())) {
                    req.headers_mut().append(name, value);
                }
            }
        }
    }
    req.extensions_mut().insert(RawFields(Fields(fields)));
    Ok(req)
}

type TrailerFields = Vec<(Vec<u8>, Vec<u8>)>;

/// Decodes a (stateless, so self-contained) header block of request trailers.
fn fields_from_block(block: &[u8]) -> Result<(TrailerFields, http::HeaderMap), &'static str> {
    let mut fields = Vec::new();
    super::h2::hpack::Decoder::default().decode(block, |n, v| fields.push((n.to_vec(), v.to_vec()))).map_err(|_| "header block")?;
    let mut pseudo = Vec::new();
    let mut headers = http::HeaderMap::with_capacity(fields.len());
    for (n, v) in fields {
        if n.starts_with(b":") {
            pseudo.push((n, v));
            continue;
        }
        let name = http::HeaderName::from_bytes(&n).map_err(|_| "header name")?;
        let value = http::HeaderValue::from_bytes(&v).map_err(|_| "header value")?;
        headers.append(name, value);
    }
    Ok((pseudo, headers))
}

/// Serves a diverted stream through the observed path and writes its response to the client.
async fn respond(proxy: &Arc<Proxy>, shared: &Shared, stream: u32, req: Request<ProxyBody>) {
    let resp = match proxy.clone().handle(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let (parts, mut body) = resp.into_parts();
    let mut block = Vec::with_capacity(256);
    h2::encode_field(&mut block, b":status", parts.status.as_str().as_bytes());
    for (n, v) in &parts.headers {
        h2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
    }
    let end = body.is_end_stream();
    let mut out = Vec::with_capacity(block.len() + 16);
    h2::headers(&mut out, stream, &block, end);
    if end {
        // The call's completion is reported when its body drops: before the client can see
        // the end of the call (and, say, read the metrics).
        drop(body);
        shared.send(out);
        return;
    }
    shared.send(out);
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => shared.send_data(stream, d).await,
                Err(frame) => {
                    let mut block = Vec::with_capacity(128);
                    if let Ok(t) = frame.into_trailers() {
                        for (n, v) in &t {
                            h2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
                        }
                    }
                    let mut out = Vec::with_capacity(block.len() + 16);
                    h2::headers(&mut out, stream, &block, true);
                    drop(body);
                    shared.send(out);
                    return;
                }
            },
            Some(Err(e)) => {
                tracing::warn!(stream, error = %e, "response body failed; resetting the stream");
                let mut out = Vec::new();
                RstStream::new(stream, Reason::CANCEL).encode(&mut out);
                shared.send(out);
                return;
            }
            None => {
                let mut out = Vec::new();
                h2::data(&mut out, stream, &[], true);
                drop(body);
                shared.send(out);
                return;
            }
        }
    }
}

/// The runtime connection is gone or going: calls on it end (UNAVAILABLE, or REFUSED_STREAM for
/// those above `last`, which the runtime says it never processed) and new streams are diverted.
/// The client keeps its connection; see [`UpstreamToClient::maybe_move_client`].
fn upstream_gone(proxy: &Proxy, shared: &Shared, msg: &str, last: Option<u32>) {
    let mut out = Vec::new();
    let ended: Vec<(u32, Relayed)> = {
        let mut st = shared.lock();
        st.degraded = true;
        let ids: Vec<u32> = st.relayed.keys().copied().filter(|&id| last.is_none_or(|l| id > l)).collect();
        ids.into_iter().filter_map(|id| st.relayed.remove(&id).map(|r| (id, r))).collect()
    };
    let now = Instant::now();
    for (id, r) in ended {
        if last.is_some() {
            RstStream::new(id, Reason::REFUSED_STREAM).encode(&mut out);
            complete(proxy, r.call, Some(code::UNAVAILABLE), Some(format!("{msg} (refused, unprocessed)")), now);
            continue;
        }
        // A clean gRPC error: trailers (or a trailers-only response) with UNAVAILABLE.
        let mut block = Vec::with_capacity(128 + msg.len());
        if !r.answered {
            h2::encode_field(&mut block, b":status", b"200");
            h2::encode_field(&mut block, b"content-type", b"application/grpc");
        }
        for (n, v) in &crate::status::Status::new(code::UNAVAILABLE, msg).to_header_map() {
            if n != http::header::CONTENT_TYPE {
                h2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
            }
        }
        h2::headers(&mut out, id, &block, true);
        complete(proxy, r.call, Some(code::UNAVAILABLE), Some(msg.to_string()), now);
    }
    shared.send(out);
    shared.window.notify_waiters();
}

/// One connection on its relay thread: both directions, the sockets and their buffers.
struct Pump {
    up: ClientToUpstream,
    down: UpstreamToClient,
    client: Sock,
    /// None: no runtime connection (never made, or failed); GOAWAY leaves it in place.
    runtime: Option<Sock>,
    /// What the client sent and was not handled yet (a partial frame).
    cbuf: BytesMut,
    /// What the runtime sent and was not relayed yet (a partial frame, or a DATA frame that
    /// waits for the client's window).
    rbuf: BytesMut,
    /// The client's frames for the runtime, from one read.
    out: Vec<u8>,
    /// Frames crisp itself writes to the client from this thread.
    mine: Vec<u8>,
    /// The runtime's next DATA frame waits for the client's window.
    blocked: bool,
    /// When `poll` last returned: the time of what was read then.
    now: Instant,
}

impl Pump {
    fn new(proxy: &Arc<Proxy>, shared: &Arc<Shared>, tasks: Tasks, client: Sock, runtime: Option<Sock>) -> Pump {
        let mut mine = Vec::new();
        if runtime.is_none() {
            // crisp is the server now: its own (default) SETTINGS.
            Settings::default().encode(&mut mine);
        }
        let up = ClientToUpstream {
            proxy: proxy.clone(),
            shared: shared.clone(),
            tasks,
            upstream: runtime.is_some(),
            dec: super::h2::hpack::Decoder::default(),
            bodies: IdMap::default(),
            pending: None,
            max_relayed: 0,
            diverted_ids: Default::default(),
            enc: Vec::with_capacity(512),
            fields: FieldList::default(),
            indexer: Indexer::default(),
            paths: PathCache::default(),
            now: Instant::now(),
        };
        let down = UpstreamToClient { proxy: proxy.clone(), shared: shared.clone(), dec: super::h2::hpack::Decoder::default(), pending: None, table_size: None, ended: Vec::new() };
        let buf = || BytesMut::with_capacity(64 << 10);
        Pump { up, down, client, runtime, cbuf: buf(), rbuf: buf(), out: Vec::with_capacity(64 << 10), mine, blocked: false, now: Instant::now() }
    }

    /// Relays until the client goes, or until crisp's GOAWAY has drained the connection.
    ///
    /// Backpressure as in a splice: the client is not read while the runtime has bytes of it
    /// queued, nor the runtime while the client has; a socket neither read nor written is left
    /// out of the `poll` (a hung-up peer would otherwise make it return at once, forever).
    fn run(&mut self) -> Result<(), RelayError> {
        let shared = self.up.shared.clone();
        let opts = &self.up.proxy.opts;
        let mut keepalive = KeepAlive { every: opts.keepalive_interval, timeout: opts.keepalive_timeout, ping_sent: None };
        let tick = (keepalive.every.min(keepalive.timeout) / 2).max(Duration::from_millis(10));
        let mut next_tick = Instant::now() + tick;
        let mut stopping = false;
        loop {
            if shared.kill.load(Ordering::Acquire) {
                return Ok(());
            }
            if !stopping && shared.stop.load(Ordering::Acquire) {
                stopping = true;
                self.goaway(b"crisp: shutting down");
            }
            if self.blocked {
                self.blocked = self.down.frames(&mut self.rbuf, &mut self.client, self.now)?;
            }
            // crisp's own frames, never inside a header block the runtime is still sending.
            if self.down.pending.is_none() {
                shared.take_ctl(&mut self.mine);
                self.client.write(&self.mine)?;
                self.mine.clear();
            }
            if self.drained() {
                self.client.shutdown_write();
                return Ok(());
            }
            let read_client = !self.runtime.as_ref().is_some_and(Sock::has_queued);
            let read_runtime = !self.client.has_queued() && !self.blocked;
            let mut fds = [
                pollfd(self.client.fd(), read_client, self.client.has_queued()),
                pollfd(shared.wake.fd(), true, false),
                match &self.runtime {
                    Some(r) => pollfd(r.fd(), read_runtime, r.has_queued()),
                    None => pollfd(-1, false, false),
                },
            ];
            // From the clock read after the last poll: a tick is at least 10 ms, the work since
            // then a few µs, and the clock is read once per wakeup.
            sock::poll(&mut fds, next_tick.saturating_duration_since(self.now))?;
            self.now = Instant::now();
            let [c, w, r] = fds.map(|p| p.revents);
            if w != 0 {
                shared.wake.drain();
            }
            if !self.ready(c, read_client, r, read_runtime)? {
                return Ok(());
            }
            if self.now >= next_tick {
                next_tick = self.now + tick;
                self.tick(&mut keepalive)?;
            }
        }
    }

    /// Handles what `poll` found on the client's (`c`) and the runtime's (`r`) socket; false
    /// when the client has gone.
    fn ready(&mut self, c: i16, read_client: bool, r: i16, read_runtime: bool) -> Result<bool, RelayError> {
        const GONE: i16 = libc::POLLHUP | libc::POLLERR;
        if c & libc::POLLOUT != 0 || (c & GONE != 0 && self.client.has_queued()) {
            self.client.flush()?;
        }
        if r & (libc::POLLOUT | GONE) != 0 && self.runtime.as_ref().is_some_and(Sock::has_queued) {
            if let Err(e) = self.runtime.as_mut().expect("checked").flush() {
                self.runtime_failed(&e.to_string(), true)?;
            }
        }
        if c & (libc::POLLIN | GONE) != 0 && read_client {
            match self.client.recv(&mut self.cbuf) {
                Ok(0) => return Ok(false),
                Ok(_) => self.handle_client_read()?,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
        if r & (libc::POLLIN | GONE) != 0 && read_runtime && self.runtime.is_some() {
            match self.runtime.as_mut().expect("checked").recv(&mut self.rbuf) {
                Ok(0) => self.runtime_failed("connection closed", false)?,
                Ok(_) => {
                    self.blocked = self.down.frames(&mut self.rbuf, &mut self.client, self.now)?;
                    if self.rbuf.capacity() > 1 << 20 && self.rbuf.is_empty() {
                        self.rbuf = BytesMut::with_capacity(64 << 10);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => self.runtime_failed(&e.to_string(), false)?,
            }
        }
        Ok(true)
    }

    /// The periodic work: crisp's keep-alive PING to an idle client (and the end of a client
    /// that stopped answering), and moving a degraded client back to a relay.
    fn tick(&mut self, ka: &mut KeepAlive) -> Result<(), RelayError> {
        let last = self.up.shared.lock().last_client_frame;
        if let Some(t) = ka.ping_sent {
            if last >= t {
                ka.ping_sent = None;
            } else if t.elapsed() >= ka.timeout {
                return Err(RelayError::KeepAlive);
            }
        }
        self.maybe_move_client();
        if ka.ping_sent.is_none() && last.elapsed() >= ka.every && self.down.pending.is_none() {
            Ping::new(KEEPALIVE).encode(&mut self.mine);
            ka.ping_sent = Some(Instant::now());
        }
        Ok(())
    }

    /// Handles what was just read from the client and writes what goes on to the runtime.
    fn handle_client_read(&mut self) -> Result<(), RelayError> {
        // Settings the runtime sent apply to the blocks crisp writes from now on.
        if let Some(size) = self.down.table_size.take() {
            self.up.indexer.peer_table_size(size);
        }
        if let Err(e) = self.up.frames(&mut self.cbuf, &mut self.out, &mut self.mine, self.now) {
            // A GOAWAY crisp wrote for the client's error goes out if it can.
            let _ = self.client.write(&self.mine);
            return Err(e);
        }
        if !self.out.is_empty() {
            if let Some(rt) = self.runtime.as_mut() {
                if let Err(e) = rt.write(&self.out) {
                    self.runtime_failed(&e.to_string(), true)?;
                }
            }
            self.out.clear();
        }
        if self.cbuf.capacity() > 1 << 20 && self.cbuf.is_empty() {
            self.cbuf = BytesMut::with_capacity(64 << 10);
        }
        Ok(())
    }

    /// The runtime connection failed (or closed): calls on it end with UNAVAILABLE and new
    /// streams are diverted, until the client moves to a new connection.
    fn runtime_failed(&mut self, why: &str, writing: bool) -> Result<(), RelayError> {
        let proxy = &self.up.proxy;
        let path = proxy.upstream.path().display();
        let degraded = self.up.shared.lock().degraded;
        if writing && degraded {
            // The runtime sent GOAWAY or closed: frames crossing its close fail.
            tracing::debug!(upstream = %path, error = %why, "writing to a closing upstream connection failed");
        } else if writing {
            tracing::warn!(upstream = %path, error = %why, "writing to the upstream connection failed");
        } else if why == "connection closed" {
            tracing::info!(upstream = %path, "upstream connection closed");
        } else {
            tracing::warn!(upstream = %path, error = %why, "upstream connection failed");
        }
        let msg = if writing { format!("crisp: upstream unix://{path} failed: {why}") } else { format!("crisp: upstream unix://{path} failed mid-response: {why}") };
        self.runtime = None;
        self.up.upstream = false;
        // What the runtime sent and crisp had not relayed belongs to calls that end now.
        self.rbuf.clear();
        self.blocked = false;
        if self.down.pending.take().is_some() {
            // The client holds part of a header block that will never end: its connection is
            // unusable.
            return Err(RelayError::Protocol("runtime connection failed inside a header block"));
        }
        upstream_gone(proxy, &self.up.shared, &msg, None);
        Ok(())
    }

    /// Sends the client GOAWAY (once): it finishes what it started and opens a new connection.
    fn goaway(&mut self, why: &[u8]) {
        let mut st = self.up.shared.lock();
        if st.goaway.is_none() {
            let m = st.max_stream;
            st.goaway = Some(m);
            drop(st);
            GoAway::new(m, Reason::NO_ERROR, why).encode(&mut self.mine);
        }
    }

    /// A degraded connection (its runtime connection is gone) is served by the observed path,
    /// which is slower. Once the runtime accepts connections again and the client is idle, the
    /// client is sent GOAWAY so that its next connection is relayed again. gRPC clients move to
    /// a new connection transparently (a stream that crosses the GOAWAY is refused, unprocessed,
    /// and retried); waiting for an idle moment spares clients that do not retry.
    fn maybe_move_client(&mut self) {
        const IDLE: Duration = Duration::from_millis(200);
        {
            let st = self.up.shared.lock();
            let idle = st.relayed.is_empty() && st.diverted.is_empty() && st.last_stream_at.elapsed() >= IDLE;
            if !st.degraded || st.goaway.is_some() || !idle {
                return;
            }
        }
        // A unix socket's connect does not wait for the runtime: it is accepted or refused.
        if std::os::unix::net::UnixStream::connect(self.up.proxy.upstream.path()).is_err() {
            return;
        }
        if self.up.shared.lock().last_stream_at.elapsed() >= IDLE {
            tracing::info!("runtime reachable again: moving a client connection back to the relay");
            self.goaway(b"crisp: reconnect");
        }
    }

    /// After crisp's GOAWAY, with nothing left in flight or unwritten: the connection can close.
    fn drained(&self) -> bool {
        let st = self.up.shared.lock();
        st.goaway.is_some()
            && st.relayed.is_empty()
            && st.diverted.is_empty()
            && self.mine.is_empty()
            && !self.client.has_queued()
            && self.down.pending.is_none()
            && self.up.shared.ctl.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }
}

/// crisp's keep-alive of one client connection.
struct KeepAlive {
    /// PING a client idle this long.
    every: Duration,
    /// Close a client that has not answered a PING for this long.
    timeout: Duration,
    ping_sent: Option<Instant>,
}

fn pollfd(fd: std::os::fd::RawFd, read: bool, write: bool) -> libc::pollfd {
    let events = if read { libc::POLLIN } else { 0 } | if write { libc::POLLOUT } else { 0 };
    // A negative descriptor is skipped by poll(2).
    libc::pollfd { fd: if events == 0 { -1 } else { fd }, events, revents: 0 }
}

/// Runtime → client.
struct UpstreamToClient {
    proxy: Arc<Proxy>,
    shared: Arc<Shared>,
    dec: super::h2::hpack::Decoder,
    /// A response header block spanning several frames (relayed as they come, decoded at the
    /// end): crisp's own frames must not be written in between.
    pending: Option<PendingBlock>,
    /// SETTINGS_HEADER_TABLE_SIZE from the runtime, for the other direction's [`Indexer`].
    table_size: Option<u32>,
    /// Relayed calls that ended in the frames being relayed, and their gRPC status.
    ended: Vec<(Option<Call>, Option<i32>)>,
}

impl UpstreamToClient {
    /// Relays the complete frames at the start of `buf`, written to the client straight from it:
    /// the runtime's frames pass through unchanged, so they are never copied in user space
    /// (unless the client's socket is full). Returns true when it stopped at a DATA frame the
    /// client has no window for: that frame stays at the start of `buf`, for the next call once
    /// the client's credit came.
    fn frames(&mut self, buf: &mut BytesMut, cw: &mut Sock, now: Instant) -> Result<bool, RelayError> {
        let r = self.relay_frames(buf, cw);
        // Calls that ended are reported once their last bytes went out: the metrics and the tap
        // are not on the answer's way to the client.
        for (call, code) in self.ended.drain(..) {
            complete(&self.proxy, call, code, None, now);
        }
        r
    }

    fn relay_frames(&mut self, buf: &mut BytesMut, cw: &mut Sock) -> Result<bool, RelayError> {
        // buf[..pos]: frames checked and due to the client, not yet written.
        let mut pos = 0;
        // Room still missing for a frame that has only partly arrived.
        let mut missing = 0;
        while let Some(head) = h2::complete_at(buf, pos, &mut missing) {
            let len = h2::HEADER_LEN + head.len;
            let payload = pos + h2::HEADER_LEN..pos + len;
            match head.kind {
                Kind::Data => {
                    self.shared.pings.runtime_wrote();
                    let n = head.len as i64;
                    if n > 0 && !self.take_window(n) {
                        // Not within what the client has left: send what is before it and
                        // wait for the client's credit.
                        Self::flush(buf, &mut pos, cw)?;
                        return Ok(true);
                    }
                    if head.has(Flags::END_STREAM) {
                        self.end_relayed(head.stream, None);
                    }
                }
                Kind::Headers => {
                    self.shared.pings.runtime_wrote();
                    let p = &buf[payload];
                    let r = h2::header_fragment(&head, p).ok_or(RelayError::Protocol("malformed HEADERS from the runtime"))?;
                    let end_stream = head.has(Flags::END_STREAM);
                    if head.has(Flags::END_HEADERS) {
                        self.response_block(head.stream, end_stream, &p[r]);
                    } else {
                        self.pending = Some(PendingBlock { stream: head.stream, end_stream, block: p[r].to_vec() });
                    }
                }
                Kind::Continuation => {
                    if let Some(mut p) = self.pending.take() {
                        p.block.extend_from_slice(&buf[payload]);
                        if head.has(Flags::END_HEADERS) {
                            self.response_block(p.stream, p.end_stream, &p.block);
                        } else {
                            self.pending = Some(p);
                        }
                    }
                }
                Kind::RstStream => self.end_relayed(head.stream, Some(code::CANCELLED)),
                Kind::Ping if head.has(Flags::ACK) => self.shared.pings.acked(),
                // The client's oldest unacknowledged SETTINGS now apply on its side too: the ACK
                // is written (below, with the frames before it) before any DATA of crisp's own
                // that counts on them (crisp's frames go out after this batch).
                Kind::Settings if head.has(Flags::ACK) => self.settings_acked(),
                // The runtime's own settings go on to the client unchanged; its header table
                // size is also the bound of crisp's table on this connection ([`Indexer`]).
                Kind::Settings => {
                    if let Some(size) = Settings::load(&head, &buf[payload.clone()]).ok().and_then(|s| s.header_table_size) {
                        self.table_size = Some(size);
                    }
                }
                // Shorter (malformed) GOAWAYs go on to the client, as any frame crisp does not read.
                Kind::GoAway if head.len >= 8 => {
                    // Frames before it go first. The GOAWAY itself is not relayed: the client's
                    // connection is crisp's, and stays up (see `Pump::maybe_move_client`).
                    Self::flush(buf, &mut pos, cw)?;
                    let goaway = buf.split_to(len);
                    self.goaway(GoAway::load(&goaway[h2::HEADER_LEN..]).expect("8 bytes or more"));
                    continue;
                }
                _ => {}
            }
            pos += len;
        }
        Self::flush(buf, &mut pos, cw)?;
        // After the flush, so that the bytes already written are not carried into a new buffer.
        buf.reserve(missing);
        Ok(false)
    }

    fn settings_acked(&self) {
        let mut st = self.shared.lock();
        if let Some(Some(v)) = st.unacked_windows.pop_front() {
            // A smaller window still waiting for its ACK caps it.
            let v = st.unacked_windows.iter().flatten().fold(v, |m, &w| m.min(w));
            if v != st.client_initial_window {
                set_client_window(&mut st, v);
                drop(st);
                self.shared.window.notify_waiters();
            }
        }
    }

    /// The runtime's GOAWAY (payload): calls it will not process end (refused), new streams are
    /// diverted until the client moves to a new connection.
    fn goaway(&self, g: GoAway<'_>) {
        let (last, err) = (g.last_stream, g.reason);
        let debug_data = String::from_utf8_lossy(g.debug_data);
        let upstream = self.proxy.upstream.path().display();
        if err == Reason::ENHANCE_YOUR_CALM {
            tracing::warn!(%upstream, last_stream = last, error_code = err.0, debug_data = %debug_data, "runtime sent GOAWAY ENHANCE_YOUR_CALM (it judged this connection's PINGs too frequent); moving this client to a new connection");
        } else {
            tracing::info!(%upstream, last_stream = last, error_code = err.0, debug_data = %debug_data, "runtime sent GOAWAY; moving this client to a new connection");
        }
        let msg = format!("crisp: upstream unix://{upstream} closed the connection (GOAWAY)");
        upstream_gone(&self.proxy, &self.shared, &msg, Some(last));
    }

    /// Writes `buf[..pos]` to the client and drops it from `buf`.
    fn flush(buf: &mut BytesMut, pos: &mut usize, cw: &mut Sock) -> Result<(), RelayError> {
        if *pos > 0 {
            cw.write(&buf[..*pos])?;
            buf.advance(*pos);
            *pos = 0;
        }
        Ok(())
    }

    fn take_window(&self, n: i64) -> bool {
        let mut st = self.shared.lock();
        if st.client_window >= n {
            st.client_window -= n;
            true
        } else {
            false
        }
    }

    fn response_block(&mut self, stream: u32, end_stream: bool, block: &[u8]) {
        let mut status = None;
        let decoded = self.dec.decode(block, |n, v| {
            if n == b"grpc-status" {
                status = std::str::from_utf8(v).ok().and_then(|s| s.parse::<i32>().ok());
            }
        });
        if let Err(e) = decoded {
            // The client will fail the same way on these bytes; crisp only loses the code.
            tracing::warn!(error = %e, "runtime sent a header block crisp cannot decode");
        }
        if end_stream {
            self.end_relayed(stream, status.or(Some(code::UNKNOWN)));
        } else if let Some(r) = self.shared.lock().relayed.get_mut(&stream) {
            r.answered = true;
        }
    }

    /// Ends a relayed call, to be reported by [`Self::frames`]. No grpc-message is decoded for
    /// it: a relayed call is one no interceptor asked to see in detail.
    fn end_relayed(&mut self, stream: u32, code: Option<i32>) {
        let r = self.shared.lock().relayed.remove(&stream);
        if let Some(r) = r {
            self.ended.push((r.call, code));
        }
    }
}

/// A header block's fields as decoded, kept until the relay knows where the block goes: to the
/// runtime (through its [`Indexer`]) or, rebuilt statelessly, to the observed path.
#[derive(Default)]
struct FieldList {
    bytes: Vec<u8>,
    /// Each field's name and value lengths, in order, their bytes one after the other in `bytes`.
    lens: Vec<(usize, usize)>,
}

impl FieldList {
    fn clear(&mut self) {
        self.bytes.clear();
        self.lens.clear();
    }

    fn push(&mut self, name: &[u8], value: &[u8]) {
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self.lens.push((name.len(), value.len()));
    }

    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut at = 0;
        self.lens.iter().map(move |&(n, v)| {
            let field = (&self.bytes[at..at + n], &self.bytes[at + n..at + n + v]);
            at += n + v;
            field
        })
    }

    /// The block, encoded statelessly ([`h2::encode_field`]): self-contained, whatever the
    /// runtime's table holds.
    fn stateless(&self, block: &mut Vec<u8>) {
        block.clear();
        for (n, v) in self.iter() {
            h2::encode_field(block, n, v);
        }
    }
}

/// The paths one client connection used, with their routes. A kubelet uses a few dozen; a
/// client that sends ever new paths only makes the cache start over.
#[derive(Default)]
struct PathCache(HashMap<Box<[u8]>, (Route, http::uri::PathAndQuery), BuildHasherDefault<IdHasher>>);

impl PathCache {
    const MAX: usize = 128;

    /// The route and path of a request's `:path` value.
    fn get(&mut self, raw: &[u8]) -> (Route, http::uri::PathAndQuery) {
        if let Some(hit) = self.0.get(raw) {
            return hit.clone();
        }
        let route = Route::from_path(std::str::from_utf8(raw).unwrap_or("/"));
        let path = http::uri::PathAndQuery::from_maybe_shared(Bytes::copy_from_slice(raw)).unwrap_or_else(|_| http::uri::PathAndQuery::from_static("/"));
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(raw.into(), (route, path.clone()));
        (route, path)
    }
}
