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
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::Request;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, Notify};

use super::body::{BoxError, ProxyBody};
use super::frames::{self as f, Head};
use super::sock::{self, Reader, Writer};
use super::upstream::{Fields, RawFields};
use super::Proxy;
use crate::cri::Route;
use crate::intercept::{Call, Outcome};
use crate::status::{code, parse_grpc_timeout};

/// Opaque data of crisp's own keep-alive PINGs; their ACKs are not relayed.
const KEEPALIVE: [u8; 8] = *b"crisp-ka";
/// Largest header block crisp accepts (the runtime's limit is usually far lower).
const MAX_HEADER_BLOCK: usize = 1 << 20;
const COMPRESSION_ERROR: u32 = 0x9;

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
                    f::window_update(&mut w, self.stream, b.len() as u32);
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
    /// Frames for the client that do not come from the runtime.
    ctl: mpsc::UnboundedSender<Vec<u8>>,
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
        let _ = self.ctl.send(frame);
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
                let n = st.client_window.min(sw).min(f::MAX_FRAME as i64).min(data.len() as i64);
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
            let mut out = Vec::with_capacity(f::HEADER_LEN + chunk.len());
            f::data(&mut out, stream, &chunk, false);
            self.send(out);
        }
    }
}

/// Serves one client connection, relaying to a runtime connection of its own when the runtime
/// accepts one.
pub async fn serve_connection(client: UnixStream, proxy: Arc<Proxy>, shutdown: watch::Receiver<bool>) {
    let (mut cr, cw) = match sock::split(client) {
        Ok(halves) => halves,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register a client connection with the reactor; closing it");
            return;
        }
    };
    let mut preface = [0u8; 24];
    match tokio::time::timeout(proxy.opts.handshake_timeout, cr.read_exact(&mut preface)).await {
        Ok(Ok(_)) if &preface == f::PREFACE => {}
        Ok(Ok(_)) => {
            tracing::debug!("client connection closed: not HTTP/2 (no connection preface)");
            return;
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "client connection closed during the HTTP/2 preface");
            return;
        }
        Err(_) => {
            tracing::debug!(timeout_ms = proxy.opts.handshake_timeout.as_millis() as u64, "client connection closed: no HTTP/2 preface in time");
            return;
        }
    }
    let upstream = match proxy.upstream.connect().await {
        Ok(mut s) => match s.write_all(f::PREFACE).await.and_then(|()| sock::split(s)) {
            Ok(halves) => Some(halves),
            Err(e) => {
                tracing::warn!(upstream = %proxy.upstream.path().display(), error = %e, "upstream connection failed at once; serving this client on the observed path");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "serving this client connection on the observed path until the runtime is back");
            None
        }
    };
    let (ctl, ctl_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        st: Mutex::new(State {
            client_window: f::DEFAULT_WINDOW,
            debt: 0,
            client_initial_window: f::DEFAULT_WINDOW,
            unacked_windows: std::collections::VecDeque::new(),
            diverted: IdMap::default(),
            relayed: IdMap::default(),
            max_stream: 0,
            goaway: None,
            degraded: upstream.is_none(),
            last_client_frame: Instant::now(),
            last_stream_at: Instant::now(),
        }),
        window: Notify::new(),
        ctl,
        pings: PingGate::default(),
    });
    let (ur, uw) = match upstream {
        Some((r, w)) => (Some(r), Some(w)),
        None => {
            // crisp is the server now: its own (default) SETTINGS.
            let mut s = Vec::new();
            f::put_head(&mut s, 0, f::SETTINGS, 0, 0);
            shared.send(s);
            (None, None)
        }
    };
    let tasks = Tasks::default();
    let mut up = ClientToUpstream {
        proxy: proxy.clone(),
        shared: shared.clone(),
        tasks: tasks.clone(),
        uw,
        dec: super::hpack::Decoder::default(),
        bodies: IdMap::default(),
        pending: None,
        max_relayed: 0,
        diverted_ids: Default::default(),
        enc: Vec::with_capacity(512),
        paths: PathCache::default(),
        now: Instant::now(),
    };
    let mut down = UpstreamToClient { proxy: proxy.clone(), shared: shared.clone(), ur, cw, dec: super::hpack::Decoder::default(), pending: None };
    // Each direction is polled only when something it waits for woke it: a client request
    // does not poll the runtime side's read, control channel, timer and shutdown futures, nor
    // a runtime answer the client side's read (see `Gated`).
    tokio::select! {
        r = Gated::new(up.run(&mut cr)) => if let Err(e) = r { tracing::debug!(error = %e, "client connection ended") },
        r = Gated::new(down.run(ctl_rx, shutdown)) => if let Err(e) = r { tracing::debug!(error = %e, "client connection closed") },
    }
    // The client is gone (or was closed): nothing may stay behind.
    tasks.abort_all();
    let relayed: Vec<Relayed> = shared.lock().relayed.drain().map(|(_, r)| r).collect();
    let now = Instant::now();
    for r in relayed {
        complete(&proxy, r.call, Some(code::CANCELLED), None, now);
    }
}

/// A future that is polled only after its own waker fired (or on its first poll), so that two
/// of them in one `select!` cost, per wakeup, only the one that was woken. A relayed call wakes
/// the connection's task twice (the request, the answer); without this each wakeup polled both
/// directions — every future either waits on — again.
struct Gated<F> {
    inner: Pin<Box<F>>,
    flag: Arc<GateFlag>,
    waker: std::task::Waker,
}

struct GateFlag {
    woken: std::sync::atomic::AtomicBool,
    /// The task to wake (the connection's; the same on every poll but the first).
    parent: Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for GateFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, std::sync::atomic::Ordering::Release);
        if let Some(w) = self.parent.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            w.wake_by_ref();
        }
    }
}

impl<F: std::future::Future> Gated<F> {
    fn new(inner: F) -> Self {
        let flag = Arc::new(GateFlag { woken: std::sync::atomic::AtomicBool::new(true), parent: Mutex::new(None) });
        Gated { inner: Box::pin(inner), waker: std::task::Waker::from(flag.clone()), flag }
    }
}

impl<F: std::future::Future> std::future::Future for Gated<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Register first: a wake that lands after the check below then wakes this task again.
        {
            let mut parent = self.flag.parent.lock().unwrap_or_else(|e| e.into_inner());
            if !parent.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *parent = Some(cx.waker().clone());
            }
        }
        if !self.flag.woken.swap(false, std::sync::atomic::Ordering::AcqRel) {
            return Poll::Pending;
        }
        let this = &mut *self;
        this.inner.as_mut().poll(&mut Context::from_waker(&this.waker))
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
    uw: Option<Writer>,
    dec: super::hpack::Decoder,
    /// Request bodies of diverted streams, until the client ends them.
    bodies: IdMap<mpsc::UnboundedSender<BodyPart>>,
    pending: Option<PendingBlock>,
    /// Highest stream id sent to the runtime.
    max_relayed: u32,
    /// Streams this connection diverted (see [`Self::is_diverted`]).
    diverted_ids: HashSet<u32, BuildHasherDefault<IdHasher>>,
    /// The re-encoded request header block, reused from call to call.
    enc: Vec<u8>,
    /// Paths this client used, with their routes: no copy or re-validation per call.
    paths: PathCache,
    /// When the frames being handled were read (one clock read per read, not per call).
    now: Instant,
}

impl ClientToUpstream {
    async fn run(&mut self, cr: &mut Reader) -> Result<(), RelayError> {
        let mut buf = BytesMut::with_capacity(64 << 10);
        let mut out: Vec<u8> = Vec::with_capacity(64 << 10);
        loop {
            if cr.read_buf(&mut buf).await? == 0 {
                return Ok(());
            }
            let mut ctl = Vec::new();
            let mut credit = 0u32;
            let mut got_frame = false;
            self.now = Instant::now();
            // Frames are handled where they lie in `buf` (no `Bytes` per frame: its refcount
            // and, for the first split of a buffer, an allocation); the consumed ones are
            // dropped from `buf` at the end.
            let mut pos = 0;
            let mut missing = 0;
            while let Some(head) = Head::parse(&buf[pos..]) {
                let len = f::HEADER_LEN + head.len;
                if buf.len() - pos < len {
                    missing = len - (buf.len() - pos);
                    break;
                }
                got_frame = true;
                self.frame(head, &buf[pos..pos + len], &mut out, &mut ctl, &mut credit)?;
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
                f::window_update(&mut ctl, 0, credit);
            }
            if !ctl.is_empty() {
                self.shared.send(ctl);
            }
            if !out.is_empty() {
                if let Some(uw) = self.uw.as_mut() {
                    if let Err(e) = uw.write_all(&out).await {
                        if self.shared.lock().degraded {
                            // The runtime sent GOAWAY or closed: frames crossing its close fail.
                            tracing::debug!(upstream = %self.proxy.upstream.path().display(), error = %e, "writing to a closing upstream connection failed");
                        } else {
                            tracing::warn!(upstream = %self.proxy.upstream.path().display(), error = %e, "writing to the upstream connection failed");
                        }
                        self.uw = None;
                        let msg = format!("crisp: upstream unix://{} failed: {e}", self.proxy.upstream.path().display());
                        upstream_gone(&self.proxy, &self.shared, &msg, None);
                    }
                }
                out.clear();
            }
            if buf.capacity() > 1 << 20 && buf.is_empty() {
                buf = BytesMut::with_capacity(64 << 10);
            }
        }
    }

    fn frame(&mut self, head: Head, frame: &[u8], out: &mut Vec<u8>, ctl: &mut Vec<u8>, credit: &mut u32) -> Result<(), RelayError> {
        let payload = &frame[f::HEADER_LEN..];
        if let Some(p) = self.pending.as_mut() {
            if head.kind != f::CONTINUATION || head.stream != p.stream {
                return Err(RelayError::Protocol("header block interrupted"));
            }
            p.block.extend_from_slice(payload);
            if p.block.len() > MAX_HEADER_BLOCK {
                return Err(RelayError::Protocol("header block too large"));
            }
            if head.has(f::END_HEADERS) {
                let p = self.pending.take().expect("checked");
                self.header_block(p.stream, p.end_stream, &p.block, out, ctl)?;
            }
            return Ok(());
        }
        let upstream = self.uw.is_some();
        match head.kind {
            f::DATA => {
                if let Some(tx) = self.bodies.get(&head.stream) {
                    // Never reaches the runtime: the client gets its connection credit back now.
                    *credit = credit.saturating_add(head.len as u32);
                    if let Some(r) = f::data_payload(&head, payload) {
                        if !r.is_empty() {
                            // A diverted request's body (a few KiB at most for the calls
                            // crisp diverts): copied out of the read buffer.
                            let _ = tx.send(BodyPart::Data(Bytes::copy_from_slice(&payload[r])));
                        }
                    }
                    if head.has(f::END_STREAM) {
                        self.bodies.remove(&head.stream);
                    }
                } else if upstream && head.stream <= self.max_relayed && !self.is_diverted(head.stream) {
                    out.extend_from_slice(frame);
                } else {
                    *credit = credit.saturating_add(head.len as u32);
                }
            }
            f::HEADERS => {
                let r = f::header_fragment(&head, payload).ok_or(RelayError::Protocol("malformed HEADERS"))?;
                if head.has(f::END_HEADERS) {
                    self.header_block(head.stream, head.has(f::END_STREAM), &payload[r], out, ctl)?;
                } else {
                    self.pending = Some(PendingBlock { stream: head.stream, end_stream: head.has(f::END_STREAM), block: payload[r].to_vec() });
                }
            }
            f::CONTINUATION => return Err(RelayError::Protocol("CONTINUATION without HEADERS")),
            f::RST_STREAM => {
                if self.bodies.remove(&head.stream).is_some() || self.is_diverted(head.stream) {
                    self.tasks.abort(head.stream);
                    self.shared.lock().diverted.remove(&head.stream);
                    self.shared.window.notify_waiters();
                } else {
                    let r = self.shared.lock().relayed.remove(&head.stream);
                    if let Some(r) = r {
                        complete(&self.proxy, r.call, Some(code::CANCELLED), None, self.now);
                    }
                    if upstream {
                        out.extend_from_slice(frame);
                    }
                }
            }
            f::SETTINGS => {
                if !head.has(f::ACK) {
                    self.settings(payload, upstream);
                    if !upstream {
                        f::put_head(ctl, 0, f::SETTINGS, f::ACK, 0);
                    }
                }
                if upstream {
                    out.extend_from_slice(frame);
                }
            }
            f::PING => {
                if head.has(f::ACK) {
                    // Answers to the runtime's PINGs go back to it; crisp's own keep-alive's not.
                    if upstream && payload != KEEPALIVE {
                        out.extend_from_slice(frame);
                    }
                } else if upstream && !self.shared.lock().degraded && self.shared.pings.try_forward() {
                    out.extend_from_slice(frame);
                } else if payload.len() == 8 {
                    // crisp answers: the runtime would count this PING as a strike (see PingGate).
                    f::put_head(ctl, 8, f::PING, f::ACK, 0);
                    ctl.extend_from_slice(payload);
                } else if upstream {
                    // Malformed: the runtime's to judge.
                    out.extend_from_slice(frame);
                }
            }
            f::WINDOW_UPDATE => {
                let inc = if payload.len() == 4 { u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff } else { 0 };
                if head.stream == 0 {
                    let forward = {
                        let mut st = self.shared.lock();
                        st.client_window += inc as i64;
                        let keep = st.debt.min(inc as u64);
                        st.debt -= keep;
                        inc - keep as u32
                    };
                    self.shared.window.notify_waiters();
                    if upstream && forward > 0 {
                        f::window_update(out, 0, forward);
                    }
                } else if self.is_diverted(head.stream) {
                    if let Some(w) = self.shared.lock().diverted.get_mut(&head.stream) {
                        *w += inc as i64;
                    }
                    self.shared.window.notify_waiters();
                } else if upstream {
                    out.extend_from_slice(frame);
                }
            }
            // PRIORITY, GOAWAY, unknown extension frames: the runtime's business.
            _ => {
                if upstream {
                    out.extend_from_slice(frame);
                }
            }
        }
        Ok(())
    }

    /// Without a lock: `diverted_ids` is this direction's own record. A finished diverted
    /// stream may linger in it (pruned in batches): its late frames are dropped, which is right,
    /// as the runtime never saw the stream.
    fn is_diverted(&self, stream: u32) -> bool {
        self.diverted_ids.contains(&stream)
    }

    /// A client SETTINGS frame (not an ACK). `relayed`: it goes on to the runtime, whose ACK
    /// will reach the client through crisp; otherwise crisp acknowledges it itself, at once.
    fn settings(&mut self, payload: &[u8], relayed: bool) {
        let mut window = None;
        for s in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            if id == f::SETTINGS_INITIAL_WINDOW_SIZE {
                window = Some(u32::from_be_bytes([s[2], s[3], s[4], s[5]]) as i64);
            }
        }
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
        let decoded = self.dec.decode(raw, |n, v| {
            match n {
                b":path" => path = Some(paths.get(v)),
                b"grpc-timeout" => timeout = parse_grpc_timeout(v),
                _ => {}
            }
            f::encode_field(block, n, v);
        });
        if let Err(e) = decoded {
            tracing::warn!(error = %e, "client sent a header block crisp cannot decode; closing its connection");
            f::goaway(ctl, self.shared.lock().max_stream, COMPRESSION_ERROR, b"crisp: bad header block");
            self.shared.send(std::mem::take(ctl));
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
            if self.uw.is_some() && stream <= self.max_relayed && !self.is_diverted(stream) && !self.bodies.contains_key(&stream) {
                f::headers(out, stream, block, end_stream);
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
                f::rst_stream(ctl, stream, f::REFUSED_STREAM);
                return Ok(());
            }
            if !(divert || st.degraded) && self.uw.is_some() {
                st.relayed.insert(stream, Relayed { call: interest.complete.then_some(call), answered: false });
                drop(st);
                self.max_relayed = stream;
                f::headers(out, stream, block, end_stream);
                return Ok(());
            }
            let w = st.client_initial_window;
            st.diverted.insert(stream, w);
            self.diverted_ids.insert(stream);
            if self.diverted_ids.len() > 64 {
                self.diverted_ids.retain(|id| st.diverted.contains_key(id));
            }
        }
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
                f::rst_stream(ctl, stream, f::PROTOCOL_ERROR);
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
    super::hpack::Decoder::default().decode(block, |n, v| fields.push((Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))).map_err(|_| "header block")?;
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
    super::hpack::Decoder::default().decode(block, |n, v| fields.push((n.to_vec(), v.to_vec()))).map_err(|_| "header block")?;
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
    f::encode_field(&mut block, b":status", parts.status.as_str().as_bytes());
    for (n, v) in &parts.headers {
        f::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
    }
    let end = body.is_end_stream();
    let mut out = Vec::with_capacity(block.len() + 16);
    f::headers(&mut out, stream, &block, end);
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
                            f::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
                        }
                    }
                    let mut out = Vec::with_capacity(block.len() + 16);
                    f::headers(&mut out, stream, &block, true);
                    drop(body);
                    shared.send(out);
                    return;
                }
            },
            Some(Err(e)) => {
                tracing::warn!(stream, error = %e, "response body failed; resetting the stream");
                let mut out = Vec::new();
                f::rst_stream(&mut out, stream, f::CANCEL);
                shared.send(out);
                return;
            }
            None => {
                let mut out = Vec::new();
                f::data(&mut out, stream, &[], true);
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
            f::rst_stream(&mut out, id, f::REFUSED_STREAM);
            complete(proxy, r.call, Some(code::UNAVAILABLE), Some(format!("{msg} (refused, unprocessed)")), now);
            continue;
        }
        // A clean gRPC error: trailers (or a trailers-only response) with UNAVAILABLE.
        let mut block = Vec::with_capacity(128 + msg.len());
        if !r.answered {
            f::encode_field(&mut block, b":status", b"200");
            f::encode_field(&mut block, b"content-type", b"application/grpc");
        }
        for (n, v) in &crate::status::Status::new(code::UNAVAILABLE, msg).to_header_map() {
            if n != http::header::CONTENT_TYPE {
                f::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
            }
        }
        f::headers(&mut out, id, &block, true);
        complete(proxy, r.call, Some(code::UNAVAILABLE), Some(msg.to_string()), now);
    }
    shared.send(out);
    shared.window.notify_waiters();
}

/// Runtime → client, plus everything crisp itself writes to the client.
struct UpstreamToClient {
    proxy: Arc<Proxy>,
    shared: Arc<Shared>,
    ur: Option<Reader>,
    cw: Writer,
    dec: super::hpack::Decoder,
    /// A response header block spanning several frames (relayed as they come, decoded at the
    /// end): crisp's own frames must not be written in between.
    pending: Option<PendingBlock>,
}

impl UpstreamToClient {
    async fn run(&mut self, mut ctl: mpsc::UnboundedReceiver<Vec<u8>>, mut shutdown: watch::Receiver<bool>) -> Result<(), RelayError> {
        let mut buf = BytesMut::with_capacity(64 << 10);
        let mut out: Vec<u8> = Vec::with_capacity(64 << 10);
        let ka = self.proxy.opts.keepalive_interval;
        let ka_timeout = self.proxy.opts.keepalive_timeout;
        let mut tick = tokio::time::interval((ka.min(ka_timeout) / 2).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ping_sent: Option<Instant> = None;
        let mut shutting_down = *shutdown.borrow();
        // One future for the whole connection, not one per loop turn (each turn would register
        // and unregister a waiter with the watch channel: ~500 instructions per relayed call).
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        tokio::pin!(stop);
        loop {
            if self.drained(&ctl) {
                let _ = self.cw.shutdown().await;
                return Ok(());
            }
            let reading = self.ur.is_some();
            tokio::select! {
                biased;
                r = async { self.ur.as_mut().expect("guarded").read_buf(&mut buf).await }, if reading => {
                    match r {
                        Ok(0) | Err(_) => {
                            if let Err(e) = &r {
                                tracing::warn!(upstream = %self.proxy.upstream.path().display(), error = %e, "upstream connection failed");
                            } else {
                                tracing::info!(upstream = %self.proxy.upstream.path().display(), "upstream connection closed");
                            }
                            self.ur = None;
                            let why = match r { Err(e) => e.to_string(), _ => "connection closed".to_string() };
                            let msg = format!("crisp: upstream unix://{} failed mid-response: {why}", self.proxy.upstream.path().display());
                            upstream_gone(&self.proxy, &self.shared, &msg, None);
                        }
                        Ok(_) => {
                            self.frames(&mut buf, &mut ctl).await?;
                            if buf.capacity() > 1 << 20 && buf.is_empty() {
                                buf = BytesMut::with_capacity(64 << 10);
                            }
                        }
                    }
                }
                Some(frame) = ctl.recv(), if self.pending.is_none() => {
                    out.extend_from_slice(&frame);
                    while let Ok(more) = ctl.try_recv() {
                        out.extend_from_slice(&more);
                    }
                    self.cw.write_all(&out).await?;
                    out.clear();
                }
                _ = tick.tick() => {
                    let last = self.shared.lock().last_client_frame;
                    if let Some(t) = ping_sent {
                        if last >= t {
                            ping_sent = None;
                        } else if t.elapsed() >= ka_timeout {
                            return Err(RelayError::KeepAlive);
                        }
                    }
                    self.maybe_move_client().await;
                    if ping_sent.is_none() && last.elapsed() >= ka && self.pending.is_none() {
                        let mut p = Vec::with_capacity(17);
                        f::ping(&mut p, KEEPALIVE);
                        self.cw.write_all(&p).await?;
                        ping_sent = Some(Instant::now());
                    }
                }
                _ = &mut stop, if !shutting_down => {
                    shutting_down = true;
                    let mut st = self.shared.lock();
                    if st.goaway.is_none() {
                        let m = st.max_stream;
                        st.goaway = Some(m);
                        drop(st);
                        let mut g = Vec::new();
                        f::goaway(&mut g, m, f::NO_ERROR, b"crisp: shutting down");
                        self.shared.send(g);
                    }
                }
            }
        }
    }

    /// A degraded connection (its runtime connection is gone) is served by the observed path,
    /// which is slower. Once the runtime accepts connections again and the client is idle, the
    /// client is sent GOAWAY so that its next connection is relayed again. gRPC clients move to
    /// a new connection transparently (a stream that crosses the GOAWAY is refused, unprocessed,
    /// and retried); waiting for an idle moment spares clients that do not retry.
    async fn maybe_move_client(&mut self) {
        const IDLE: Duration = Duration::from_millis(200);
        {
            let st = self.shared.lock();
            let idle = st.relayed.is_empty() && st.diverted.is_empty() && st.last_stream_at.elapsed() >= IDLE;
            if !st.degraded || st.goaway.is_some() || !idle {
                return;
            }
        }
        if self.proxy.upstream.connect().await.is_err() {
            return;
        }
        let mut st = self.shared.lock();
        if st.goaway.is_none() && st.last_stream_at.elapsed() >= IDLE {
            let m = st.max_stream;
            st.goaway = Some(m);
            drop(st);
            tracing::info!("runtime reachable again: moving a client connection back to the relay");
            let mut g = Vec::new();
            f::goaway(&mut g, m, f::NO_ERROR, b"crisp: reconnect");
            self.shared.send(g);
        }
    }

    /// After crisp's GOAWAY, with nothing left in flight: the connection can close.
    fn drained(&self, ctl: &mpsc::UnboundedReceiver<Vec<u8>>) -> bool {
        let st = self.shared.lock();
        st.goaway.is_some() && st.relayed.is_empty() && st.diverted.is_empty() && ctl.is_empty() && self.pending.is_none()
    }

    /// Relays the complete frames in `buf`, written to the client straight from it: the
    /// runtime's frames pass through unchanged, so they are never copied in user space.
    async fn frames(&mut self, buf: &mut BytesMut, ctl: &mut mpsc::UnboundedReceiver<Vec<u8>>) -> Result<(), RelayError> {
        let now = Instant::now();
        // buf[..pos]: frames checked and due to the client, not yet written.
        let mut pos = 0;
        // Room still missing for a frame that has only partly arrived.
        let mut missing = 0;
        while let Some(head) = Head::parse(&buf[pos..]) {
            let len = f::HEADER_LEN + head.len;
            if buf.len() - pos < len {
                missing = len - (buf.len() - pos);
                break;
            }
            let payload = pos + f::HEADER_LEN..pos + len;
            match head.kind {
                f::DATA => {
                    self.shared.pings.runtime_wrote();
                    let n = head.len as i64;
                    if n > 0 && !self.take_window(n) {
                        // Not within what the client has left: send what we have and wait for
                        // its credit (writing crisp's own frames meanwhile, or it never comes).
                        // The frame now starts at buf[0] (pos is 0): it is counted in below.
                        self.flush(buf, &mut pos).await?;
                        self.wait_window(n, ctl).await?;
                    }
                    if head.has(f::END_STREAM) {
                        self.end_relayed(head.stream, None, now);
                    }
                }
                f::HEADERS => {
                    self.shared.pings.runtime_wrote();
                    let p = &buf[payload];
                    let r = f::header_fragment(&head, p).ok_or(RelayError::Protocol("malformed HEADERS from the runtime"))?;
                    let end_stream = head.has(f::END_STREAM);
                    if head.has(f::END_HEADERS) {
                        self.response_block(head.stream, end_stream, &p[r], now);
                    } else {
                        self.pending = Some(PendingBlock { stream: head.stream, end_stream, block: p[r].to_vec() });
                    }
                }
                f::CONTINUATION => {
                    if let Some(mut p) = self.pending.take() {
                        p.block.extend_from_slice(&buf[payload]);
                        if head.has(f::END_HEADERS) {
                            self.response_block(p.stream, p.end_stream, &p.block, now);
                        } else {
                            self.pending = Some(p);
                        }
                    }
                }
                f::RST_STREAM => self.end_relayed(head.stream, Some(code::CANCELLED), now),
                f::PING if head.has(f::ACK) => self.shared.pings.acked(),
                f::SETTINGS if head.has(f::ACK) => {
                    // The client's oldest unacknowledged SETTINGS now apply on its side too: the
                    // ACK is written (below, with the frames before it) before any DATA of
                    // crisp's own that counts on them (crisp's frames go out after this batch).
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
                f::GOAWAY if head.len >= 8 => {
                    let g = &buf[payload];
                    let last = u32::from_be_bytes([g[0], g[1], g[2], g[3]]) & 0x7fff_ffff;
                    let err = u32::from_be_bytes([g[4], g[5], g[6], g[7]]);
                    let debug_data = String::from_utf8_lossy(&g[8..]);
                    if err == f::ENHANCE_YOUR_CALM {
                        tracing::warn!(upstream = %self.proxy.upstream.path().display(), last_stream = last, error_code = err, debug_data = %debug_data, "runtime sent GOAWAY ENHANCE_YOUR_CALM (it judged this connection's PINGs too frequent); moving this client to a new connection");
                    } else {
                        tracing::info!(upstream = %self.proxy.upstream.path().display(), last_stream = last, error_code = err, debug_data = %debug_data, "runtime sent GOAWAY; moving this client to a new connection");
                    }
                    // Frames before it go first. The GOAWAY itself is not relayed: the client's
                    // connection is crisp's, and stays up (see `maybe_move_client`).
                    self.flush(buf, &mut pos).await?;
                    buf.advance(len);
                    let msg = format!("crisp: upstream unix://{} closed the connection (GOAWAY)", self.proxy.upstream.path().display());
                    upstream_gone(&self.proxy, &self.shared, &msg, Some(last));
                    continue;
                }
                _ => {}
            }
            pos += len;
        }
        self.flush(buf, &mut pos).await?;
        // After the flush, so that the bytes already written are not carried into a new buffer.
        buf.reserve(missing);
        Ok(())
    }

    /// Writes `buf[..pos]` to the client and drops it from `buf`.
    async fn flush(&mut self, buf: &mut BytesMut, pos: &mut usize) -> Result<(), RelayError> {
        if *pos > 0 {
            self.cw.write_all(&buf[..*pos]).await?;
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

    async fn wait_window(&mut self, n: i64, ctl: &mut mpsc::UnboundedReceiver<Vec<u8>>) -> Result<(), RelayError> {
        loop {
            let notified = self.shared.window.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.take_window(n) {
                return Ok(());
            }
            tokio::select! {
                _ = notified => {}
                Some(frame) = ctl.recv() => self.cw.write_all(&frame).await?,
            }
        }
    }

    fn response_block(&mut self, stream: u32, end_stream: bool, block: &[u8], now: Instant) {
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
            self.end_relayed(stream, status.or(Some(code::UNKNOWN)), now);
        } else if let Some(r) = self.shared.lock().relayed.get_mut(&stream) {
            r.answered = true;
        }
    }

    /// Ends a relayed call. No grpc-message is decoded for it: a relayed call is one no
    /// interceptor asked to see in detail.
    fn end_relayed(&self, stream: u32, code: Option<i32>, now: Instant) {
        let r = self.shared.lock().relayed.remove(&stream);
        if let Some(r) = r {
            complete(&self.proxy, r.call, code, None, now);
        }
    }
}

/// Hashes stream ids, and the short byte strings of [`PathCache`], cheaply. SipHash's resistance
/// to chosen keys buys nothing here: stream ids are the client's own and bounded by its
/// concurrency, and the path cache is bounded in size; but it costs on every call.
#[derive(Default, Clone, Copy)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Fold the well-mixed high half into the low bits, which pick the bucket.
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

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
