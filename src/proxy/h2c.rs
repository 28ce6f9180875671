//! crisp's own HTTP/2 client connection to the runtime, for the calls crisp sends itself: the
//! diverted (observed) calls of the relay and crisp's probes ([`super::client`]).
//!
//! Why not hyper/h2: the h2 crate builds `:authority` from an `http::Uri`, and grpc-go clients —
//! kubelet 1.20–1.27, crictl, critest — send the socket path there (`/run/crisp/crisp.sock`;
//! kubelet 1.29 percent-encodes it), which no URI can hold (KUBELET-CRI.md §11). crisp forwards a
//! call's header fields as the client sent them, so it speaks the small part of HTTP/2 a gRPC
//! client needs with the frame and HPACK code the relay already has ([`super::frames`],
//! [`super::hpack`]).
//!
//! What it does and does not do on the wire, with a grpc-go server (containerd) in mind:
//! - it never sends PING (a grpc-go server counts pings it thinks too frequent as "strikes" and
//!   closes the connection with ENHANCE_YOUR_CALM); it answers the runtime's PINGs;
//! - request header blocks are encoded without indexing (no dynamic table on the runtime's side);
//!   response blocks are decoded in order, whatever stream they belong to, so the decoder's table
//!   stays in step with the runtime's encoder;
//! - flow control both ways: crisp's receive windows are large and returned as bytes are
//!   consumed (connection credit at once, stream credit when the reader takes the data); sends
//!   wait for the runtime's windows;
//! - GOAWAY: streams at or below the runtime's last-stream-id complete; later ones, and any the
//!   runtime refuses (RST_STREAM REFUSED_STREAM), fail with [`Error::Refused`]: the runtime never
//!   processed them, so the caller may send them again on a new connection ([`super::upstream`]).
//!
//! One task per connection owns the socket and every stream's state; callers talk to it over a
//! channel, so nothing here locks.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use super::body::{BoxError, ProxyBody};
use super::frames::{self as f, Head};
use super::sock::{self, Reader, Writer};

const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;
/// Largest response header block crisp accepts.
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Largest DATA frame crisp lets the runtime send.
const RECV_MAX_FRAME: u32 = 1 << 20;

/// Why a call on this connection failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The runtime did not process the call (GOAWAY below its stream, REFUSED_STREAM, or the
    /// connection was closing before the call got on it): safe to send again elsewhere.
    #[error("the runtime refused the call unprocessed ({0})")]
    Refused(&'static str),
    /// The connection ended while the call was in flight.
    #[error("connection closed: {0}")]
    Closed(Arc<str>),
    /// The runtime reset the stream.
    #[error("stream reset by the runtime (HTTP/2 error code {0})")]
    Reset(u32),
    #[error("the runtime sent a malformed response: {0}")]
    Malformed(&'static str),
}

/// A request's header fields, in order (pseudo-headers first), exactly as they go on the wire.
#[derive(Debug, Clone, Default)]
pub struct Fields(pub Vec<(Bytes, Bytes)>);

impl Fields {
    /// Builds the fields of an `http::Request` (crisp's own calls): `:authority` from the URI,
    /// `localhost` if it has none.
    pub fn from_request<B>(req: &http::Request<B>) -> Fields {
        let uri = req.uri();
        let mut v = Vec::with_capacity(5 + req.headers().len());
        v.push((Bytes::from_static(b":method"), Bytes::copy_from_slice(req.method().as_str().as_bytes())));
        v.push((Bytes::from_static(b":scheme"), Bytes::copy_from_slice(uri.scheme_str().unwrap_or("http").as_bytes())));
        v.push((Bytes::from_static(b":path"), Bytes::copy_from_slice(uri.path_and_query().map_or("/", |p| p.as_str()).as_bytes())));
        v.push((Bytes::from_static(b":authority"), Bytes::copy_from_slice(uri.authority().map_or("localhost", |a| a.as_str()).as_bytes())));
        for (n, val) in req.headers() {
            v.push((Bytes::copy_from_slice(n.as_str().as_bytes()), Bytes::copy_from_slice(val.as_bytes())));
        }
        Fields(v)
    }

    fn encode(&self, out: &mut Vec<u8>) {
        for (n, v) in &self.0 {
            f::encode_field(out, n, v);
        }
    }
}

/// What a request sends after its headers.
pub enum SendBody {
    /// All of it, known up front: the call can be sent again if the runtime refuses it.
    Full { data: Bytes, trailers: Option<HeaderMap> },
    /// Streamed as the client sends it.
    Stream(ProxyBody),
}

/// The runtime's answer: status, headers, and the body to come.
pub struct ResponseHead {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// A trailers-only response: the headers were all there is.
    pub end_stream: bool,
}

enum Item {
    Data(Bytes),
    Trailers(HeaderMap),
    Failed(Error),
}

enum Cmd {
    Open(Box<Open>),
    Data {
        key: u64,
        data: Bytes,
        end: bool,
    },
    Trailers {
        key: u64,
        trailers: HeaderMap,
    },
    /// The reader took `n` bytes of a stream's data: the runtime may send that much more.
    Consumed {
        key: u64,
        n: usize,
    },
    /// The caller gave up on the call.
    Reset {
        key: u64,
    },
}

struct Open {
    key: u64,
    fields: Fields,
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    /// The request ends with what `data` and `trailers` carry.
    end: bool,
    head: oneshot::Sender<Result<ResponseHead, Error>>,
    items: mpsc::UnboundedSender<Item>,
}

/// One HTTP/2 connection to the runtime. Cheap to clone.
#[derive(Clone)]
pub struct Conn {
    tx: mpsc::UnboundedSender<Cmd>,
    closing: Arc<AtomicBool>,
}

static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// Receive windows crisp offers the runtime.
#[derive(Debug, Clone, Copy)]
pub struct Windows {
    pub stream: u32,
    pub connection: u32,
}

impl Conn {
    /// Starts HTTP/2 on a connected socket: the preface and crisp's SETTINGS are written before
    /// this returns; the runtime's SETTINGS are handled as they come.
    pub async fn handshake(stream: UnixStream, windows: Windows, name: Arc<str>) -> std::io::Result<Conn> {
        let (reader, mut writer) = sock::split(stream)?;
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(f::PREFACE);
        let settings: [(u16, u32); 4] = [
            (SETTINGS_ENABLE_PUSH, 0),
            (f::SETTINGS_INITIAL_WINDOW_SIZE, windows.stream.min(i32::MAX as u32)),
            (SETTINGS_MAX_FRAME_SIZE, RECV_MAX_FRAME),
            (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK as u32),
        ];
        f::put_head(&mut out, settings.len() * 6, f::SETTINGS, 0, 0);
        for (id, v) in settings {
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(&v.to_be_bytes());
        }
        let conn_window = (windows.connection as i64).clamp(f::DEFAULT_WINDOW, i32::MAX as i64);
        if conn_window > f::DEFAULT_WINDOW {
            f::window_update(&mut out, 0, (conn_window - f::DEFAULT_WINDOW) as u32);
        }
        writer.write_all(&out).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let closing = Arc::new(AtomicBool::new(false));
        let task = Task {
            name,
            writer,
            rx,
            closing: closing.clone(),
            streams: HashMap::new(),
            keys: HashMap::new(),
            queued: VecDeque::new(),
            blocked: VecDeque::new(),
            next_id: 1,
            send_conn_window: f::DEFAULT_WINDOW,
            peer_initial_window: f::DEFAULT_WINDOW,
            peer_max_frame: f::MAX_FRAME,
            peer_max_streams: u32::MAX,
            goaway: None,
            dec: super::hpack::Decoder::default(),
            pending: None,
            out: Vec::with_capacity(64 << 10),
        };
        tokio::spawn(task.run(reader));
        Ok(Conn { tx, closing })
    }

    /// False once the connection is closing (the runtime sent GOAWAY) or gone: new calls need a
    /// new connection.
    pub fn is_usable(&self) -> bool {
        !self.closing.load(Ordering::Acquire) && !self.tx.is_closed()
    }

    /// Sends a request. Resolves with the response head; the body streams. Dropping the future
    /// or the body before the end resets the stream.
    pub async fn send(&self, fields: Fields, body: SendBody) -> Result<(ResponseHead, RecvBody), Error> {
        if !self.is_usable() {
            return Err(Error::Refused("connection closing"));
        }
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        let (head_tx, head_rx) = oneshot::channel();
        let (items_tx, items_rx) = mpsc::unbounded_channel();
        let (data, trailers, end, stream_body) = match body {
            SendBody::Full { data, trailers } => (Some(data), trailers, true, None),
            SendBody::Stream(b) if b.is_end_stream() => (None, None, true, None),
            SendBody::Stream(b) => (None, None, false, Some(b)),
        };
        let open = Open { key, fields, data, trailers, end, head: head_tx, items: items_tx };
        self.tx.send(Cmd::Open(Box::new(open))).map_err(|_| Error::Refused("connection gone"))?;
        let mut guard = ResetGuard { key, tx: self.tx.clone(), pump: None };
        if let Some(body) = stream_body {
            guard.pump = Some(tokio::spawn(pump(key, body, self.tx.clone())).abort_handle());
        }
        let head = match head_rx.await {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                guard.disarm();
                return Err(e);
            }
            Err(_) => {
                guard.disarm();
                return Err(Error::Closed("connection task ended".into()));
            }
        };
        let done = head.end_stream;
        if done {
            guard.disarm();
        }
        Ok((head, RecvBody { rx: items_rx, guard: Some(guard), done }))
    }
}

/// Streams a request body to the connection task.
async fn pump(key: u64, mut body: ProxyBody, tx: mpsc::UnboundedSender<Cmd>) {
    use http_body_util::BodyExt;
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let end = body.is_end_stream();
                    if tx.send(Cmd::Data { key, data, end }).is_err() || end {
                        return;
                    }
                }
                Err(frame) => {
                    let trailers = frame.into_trailers().unwrap_or_default();
                    let _ = tx.send(Cmd::Trailers { key, trailers });
                    return;
                }
            },
            None => {
                let _ = tx.send(Cmd::Data { key, data: Bytes::new(), end: true });
                return;
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "request body failed; resetting the runtime stream");
                let _ = tx.send(Cmd::Reset { key });
                return;
            }
        }
    }
}

/// Resets the stream when the call is abandoned before its end.
struct ResetGuard {
    key: u64,
    tx: mpsc::UnboundedSender<Cmd>,
    pump: Option<tokio::task::AbortHandle>,
}

impl ResetGuard {
    fn disarm(&mut self) {
        self.key = 0;
    }
}

impl Drop for ResetGuard {
    fn drop(&mut self) {
        // The call is over (or abandoned): the rest of its request body is not wanted.
        if let Some(p) = self.pump.take() {
            p.abort();
        }
        if self.key != 0 {
            let _ = self.tx.send(Cmd::Reset { key: self.key });
        }
    }
}

/// A response body from the runtime.
pub struct RecvBody {
    rx: mpsc::UnboundedReceiver<Item>,
    guard: Option<ResetGuard>,
    done: bool,
}

impl std::fmt::Debug for RecvBody {
    fn fmt(&self, fmt: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fmt.debug_struct("RecvBody").field("done", &self.done).finish()
    }
}

impl RecvBody {
    fn finish(&mut self) {
        self.done = true;
        if let Some(mut g) = self.guard.take() {
            g.disarm();
        }
    }
}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Item::Data(d))) => {
                if let Some(g) = &self.guard {
                    if !d.is_empty() {
                        let _ = g.tx.send(Cmd::Consumed { key: g.key, n: d.len() });
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(d))))
            }
            Poll::Ready(Some(Item::Trailers(t))) => {
                self.finish();
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Poll::Ready(Some(Item::Failed(e))) => {
                self.finish();
                Poll::Ready(Some(Err(Box::new(e))))
            }
            // The stream ended without trailers.
            Poll::Ready(None) => {
                self.finish();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

struct Stream {
    id: u32,
    key: u64,
    head: Option<oneshot::Sender<Result<ResponseHead, Error>>>,
    items: mpsc::UnboundedSender<Item>,
    send_window: i64,
    /// Request data not yet sent (waiting for window), and whether the request ends after it.
    pending: VecDeque<Bytes>,
    pending_trailers: Option<HeaderMap>,
    end_after_pending: bool,
    /// crisp sent END_STREAM.
    sent_end: bool,
    /// The runtime sent END_STREAM.
    received_end: bool,
}

struct PendingBlock {
    stream: u32,
    end_stream: bool,
    block: Vec<u8>,
}

struct Task {
    name: Arc<str>,
    writer: Writer,
    rx: mpsc::UnboundedReceiver<Cmd>,
    closing: Arc<AtomicBool>,
    streams: HashMap<u32, Stream>,
    keys: HashMap<u64, u32>,
    /// Opens waiting for the runtime's SETTINGS_MAX_CONCURRENT_STREAMS.
    queued: VecDeque<Box<Open>>,
    /// Streams with request data waiting for window.
    blocked: VecDeque<u32>,
    next_id: u32,
    send_conn_window: i64,
    peer_initial_window: i64,
    peer_max_frame: usize,
    peer_max_streams: u32,
    /// The runtime's GOAWAY: its last-stream-id.
    goaway: Option<u32>,
    dec: super::hpack::Decoder,
    pending: Option<PendingBlock>,
    out: Vec<u8>,
}

enum Stop {
    Eof,
    Io(std::io::Error),
    Protocol(&'static str),
    Done,
}

impl Task {
    async fn run(mut self, mut reader: Reader) {
        let mut buf = BytesMut::with_capacity(64 << 10);
        let stop = loop {
            let stop = tokio::select! {
                biased;
                cmd = self.rx.recv() => match cmd {
                    Some(cmd) => {
                        self.command(cmd);
                        while let Ok(cmd) = self.rx.try_recv() {
                            self.command(cmd);
                        }
                        None
                    }
                    // Nobody can send on this connection any more, and nothing is in flight
                    // (a stream's body holds a sender).
                    None => Some(Stop::Done),
                },
                r = reader.read_buf(&mut buf) => match r {
                    Ok(0) => Some(Stop::Eof),
                    Ok(_) => self.frames(&mut buf).err(),
                    Err(e) => Some(Stop::Io(e)),
                },
            };
            if !self.out.is_empty() {
                if let Err(e) = self.writer.write_all(&self.out).await {
                    break Stop::Io(e);
                }
                self.out.clear();
                if self.out.capacity() > 1 << 20 {
                    self.out = Vec::with_capacity(64 << 10);
                }
            }
            if let Some(s) = stop {
                break s;
            }
            if self.goaway.is_some() && self.streams.is_empty() && self.queued.is_empty() {
                break Stop::Done;
            }
        };
        self.closing.store(true, Ordering::Release);
        let why: Arc<str> = match stop {
            Stop::Done => {
                let _ = self.writer.shutdown().await;
                return;
            }
            Stop::Eof => "the runtime closed the connection".into(),
            Stop::Io(e) => e.to_string().into(),
            Stop::Protocol(p) => {
                tracing::warn!(upstream = %self.name, why = p, "runtime connection: protocol error; closing it");
                let mut g = Vec::new();
                f::goaway(&mut g, 0, f::PROTOCOL_ERROR, p.as_bytes());
                let _ = self.writer.write_all(&g).await;
                format!("protocol error: {p}").into()
            }
        };
        if self.streams.is_empty() && self.queued.is_empty() {
            tracing::debug!(upstream = %self.name, why = %why, "runtime connection closed while idle");
        } else {
            tracing::warn!(upstream = %self.name, why = %why, in_flight = self.streams.len(), "runtime connection ended with calls in flight");
        }
        for (_, s) in self.streams.drain() {
            fail(s, Error::Closed(why.clone()));
        }
        for o in self.queued.drain(..) {
            let _ = o.head.send(Err(Error::Refused("connection ended before the call was sent")));
        }
        // Commands still queued (opens among them) see a closed channel from here on.
        self.rx.close();
        while let Ok(cmd) = self.rx.try_recv() {
            if let Cmd::Open(o) = cmd {
                let _ = o.head.send(Err(Error::Refused("connection ended before the call was sent")));
            }
        }
    }

    fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Open(o) => self.open(o),
            Cmd::Data { key, data, end } => {
                if let Some(s) = self.keys.get(&key).and_then(|id| self.streams.get_mut(id)) {
                    if !data.is_empty() {
                        s.pending.push_back(data);
                    }
                    s.end_after_pending |= end;
                    let id = s.id;
                    self.flush_stream(id);
                } else if let Some(o) = self.queued.iter_mut().find(|o| o.key == key) {
                    // Not on the wire yet: append to what it will send.
                    let mut b = BytesMut::from(o.data.take().unwrap_or_default().as_ref());
                    b.extend_from_slice(&data);
                    o.data = Some(b.freeze());
                    o.end |= end;
                }
            }
            Cmd::Trailers { key, trailers } => {
                if let Some(s) = self.keys.get(&key).and_then(|id| self.streams.get_mut(id)) {
                    s.pending_trailers = Some(trailers);
                    s.end_after_pending = true;
                    let id = s.id;
                    self.flush_stream(id);
                } else if let Some(o) = self.queued.iter_mut().find(|o| o.key == key) {
                    o.trailers = Some(trailers);
                    o.end = true;
                }
            }
            Cmd::Consumed { key, n } => {
                if let Some(&id) = self.keys.get(&key) {
                    if self.streams.get(&id).is_some_and(|s| !s.received_end) {
                        f::window_update(&mut self.out, id, n as u32);
                    }
                }
            }
            Cmd::Reset { key } => {
                self.queued.retain(|o| o.key != key);
                if let Some(id) = self.keys.remove(&key) {
                    if let Some(s) = self.streams.remove(&id) {
                        if !(s.sent_end && s.received_end) {
                            f::rst_stream(&mut self.out, id, f::CANCEL);
                        }
                    }
                }
            }
        }
    }

    fn open(&mut self, o: Box<Open>) {
        if self.goaway.is_some() || self.next_id > i32::MAX as u32 {
            self.closing.store(true, Ordering::Release);
            let _ = o.head.send(Err(Error::Refused("connection closing")));
            return;
        }
        if self.streams.len() as u64 >= self.peer_max_streams as u64 {
            self.queued.push_back(o);
            return;
        }
        let id = self.next_id;
        self.next_id += 2;
        let Open { key, fields, data, trailers, end, head, items } = *o;
        let mut block = Vec::with_capacity(256);
        fields.encode(&mut block);
        let no_body = end && data.as_ref().is_none_or(|d| d.is_empty()) && trailers.is_none();
        f::headers(&mut self.out, id, &block, no_body);
        let mut s = Stream {
            id,
            key,
            head: Some(head),
            items,
            send_window: self.peer_initial_window,
            pending: VecDeque::new(),
            pending_trailers: trailers,
            end_after_pending: end,
            sent_end: no_body,
            received_end: false,
        };
        if let Some(d) = data.filter(|d| !d.is_empty()) {
            s.pending.push_back(d);
        }
        self.streams.insert(id, s);
        self.keys.insert(key, id);
        if !no_body {
            self.flush_stream(id);
        }
    }

    /// Sends what a stream has pending, as far as the windows allow.
    fn flush_stream(&mut self, id: u32) {
        let Some(s) = self.streams.get_mut(&id) else { return };
        if s.sent_end {
            return;
        }
        while let Some(front) = s.pending.front_mut() {
            let n = (front.len() as i64).min(s.send_window).min(self.send_conn_window).min(self.peer_max_frame as i64);
            if n <= 0 {
                if !self.blocked.contains(&id) {
                    self.blocked.push_back(id);
                }
                return;
            }
            let chunk = front.split_to(n as usize);
            if front.is_empty() {
                s.pending.pop_front();
            }
            s.send_window -= n;
            self.send_conn_window -= n;
            let last = s.pending.is_empty() && s.end_after_pending && s.pending_trailers.is_none();
            f::put_head(&mut self.out, chunk.len(), f::DATA, if last { f::END_STREAM } else { 0 }, id);
            self.out.extend_from_slice(&chunk);
            if last {
                s.sent_end = true;
                return;
            }
        }
        if !s.end_after_pending {
            return;
        }
        if let Some(t) = s.pending_trailers.take() {
            let mut block = Vec::with_capacity(128);
            for (n, v) in &t {
                f::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
            }
            f::headers(&mut self.out, id, &block, true);
        } else {
            f::put_head(&mut self.out, 0, f::DATA, f::END_STREAM, id);
        }
        s.sent_end = true;
    }

    fn unblock(&mut self) {
        for _ in 0..self.blocked.len() {
            let Some(id) = self.blocked.pop_front() else { break };
            self.flush_stream(id);
        }
    }

    /// Handles the complete frames in `buf`.
    fn frames(&mut self, buf: &mut BytesMut) -> Result<(), Stop> {
        let mut credit: u64 = 0;
        while let Some(head) = Head::parse(buf) {
            if head.len > RECV_MAX_FRAME as usize {
                return Err(Stop::Protocol("frame larger than crisp's SETTINGS_MAX_FRAME_SIZE"));
            }
            if buf.len() < f::HEADER_LEN + head.len {
                buf.reserve(f::HEADER_LEN + head.len - buf.len());
                break;
            }
            let frame = buf.split_to(f::HEADER_LEN + head.len).freeze();
            let payload = frame.slice(f::HEADER_LEN..);
            if let Some(p) = self.pending.as_mut() {
                if head.kind != f::CONTINUATION || head.stream != p.stream {
                    return Err(Stop::Protocol("header block interrupted"));
                }
                p.block.extend_from_slice(&payload);
                if p.block.len() > MAX_HEADER_BLOCK {
                    return Err(Stop::Protocol("header block too large"));
                }
                if head.has(f::END_HEADERS) {
                    let p = self.pending.take().expect("checked");
                    self.header_block(p.stream, p.end_stream, &p.block)?;
                }
                continue;
            }
            match head.kind {
                f::DATA => {
                    credit += head.len as u64;
                    let r = f::data_payload(&head, &payload).ok_or(Stop::Protocol("malformed DATA"))?;
                    let padding = head.len - r.len();
                    if let Some(s) = self.streams.get_mut(&head.stream) {
                        if s.head.is_some() {
                            return Err(Stop::Protocol("DATA before response headers"));
                        }
                        if !r.is_empty() {
                            let _ = s.items.send(Item::Data(payload.slice(r)));
                        }
                        if padding > 0 && !head.has(f::END_STREAM) {
                            f::window_update(&mut self.out, head.stream, padding as u32);
                        }
                        if head.has(f::END_STREAM) {
                            // No trailers: the body just ends (dropping the sender says so).
                            s.received_end = true;
                            self.finish_if_done(head.stream);
                        }
                    }
                }
                f::HEADERS => {
                    let r = f::header_fragment(&head, &payload).ok_or(Stop::Protocol("malformed HEADERS"))?;
                    if head.has(f::END_HEADERS) {
                        self.header_block(head.stream, head.has(f::END_STREAM), &payload[r])?;
                    } else {
                        self.pending = Some(PendingBlock { stream: head.stream, end_stream: head.has(f::END_STREAM), block: payload[r].to_vec() });
                    }
                }
                f::CONTINUATION => return Err(Stop::Protocol("CONTINUATION without HEADERS")),
                f::RST_STREAM => {
                    let code = if payload.len() >= 4 { u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) } else { 0 };
                    if let Some(s) = self.streams.remove(&head.stream) {
                        self.keys.remove(&s.key);
                        let e = if code == f::REFUSED_STREAM && s.head.is_some() { Error::Refused("REFUSED_STREAM") } else { Error::Reset(code) };
                        fail(s, e);
                        self.open_queued();
                    }
                }
                f::SETTINGS if !head.has(f::ACK) => {
                    self.settings(&payload)?;
                    f::put_head(&mut self.out, 0, f::SETTINGS, f::ACK, 0);
                }
                f::PING if !head.has(f::ACK) && payload.len() == 8 => {
                    f::put_head(&mut self.out, 8, f::PING, f::ACK, 0);
                    self.out.extend_from_slice(&payload);
                }
                f::GOAWAY if payload.len() >= 8 => {
                    let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
                    let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                    let debug_data = String::from_utf8_lossy(&payload[8..]).into_owned();
                    let refused: Vec<u32> = self.streams.keys().copied().filter(|&id| id > last).collect();
                    tracing::info!(upstream = %self.name, last_stream = last, error_code = code, debug_data = %debug_data, in_flight = self.streams.len(), refused = refused.len(), "runtime sent GOAWAY on crisp's own connection; new calls go to a new one");
                    self.goaway = Some(self.goaway.map_or(last, |g| g.min(last)));
                    self.closing.store(true, Ordering::Release);
                    for id in refused {
                        if let Some(s) = self.streams.remove(&id) {
                            self.keys.remove(&s.key);
                            fail(s, Error::Refused("above the runtime's GOAWAY last-stream-id"));
                        }
                    }
                    for o in self.queued.drain(..) {
                        let _ = o.head.send(Err(Error::Refused("connection closing")));
                    }
                }
                f::WINDOW_UPDATE => {
                    let inc = if payload.len() == 4 { (u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff) as i64 } else { 0 };
                    if head.stream == 0 {
                        self.send_conn_window += inc;
                    } else if let Some(s) = self.streams.get_mut(&head.stream) {
                        s.send_window += inc;
                    }
                    self.unblock();
                }
                f::PUSH_PROMISE => return Err(Stop::Protocol("PUSH_PROMISE although crisp disabled push")),
                // PRIORITY and unknown extension frames: nothing to do.
                _ => {}
            }
        }
        if credit > 0 {
            f::window_update(&mut self.out, 0, credit.min(i32::MAX as u64) as u32);
        }
        Ok(())
    }

    fn settings(&mut self, payload: &[u8]) -> Result<(), Stop> {
        if !payload.len().is_multiple_of(6) {
            return Err(Stop::Protocol("malformed SETTINGS"));
        }
        for s in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let v = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match id {
                f::SETTINGS_INITIAL_WINDOW_SIZE => {
                    let delta = v as i64 - self.peer_initial_window;
                    self.peer_initial_window = v as i64;
                    for st in self.streams.values_mut() {
                        st.send_window += delta;
                    }
                }
                SETTINGS_MAX_FRAME_SIZE => self.peer_max_frame = (v as usize).clamp(f::MAX_FRAME, (1 << 24) - 1),
                SETTINGS_MAX_CONCURRENT_STREAMS => self.peer_max_streams = v,
                // crisp's encoder never indexes, so the runtime's table size does not matter.
                SETTINGS_HEADER_TABLE_SIZE => {}
                _ => {}
            }
        }
        self.unblock();
        self.open_queued();
        Ok(())
    }

    fn open_queued(&mut self) {
        while (self.streams.len() as u64) < self.peer_max_streams as u64 {
            let Some(o) = self.queued.pop_front() else { break };
            self.open(o);
        }
    }

    /// A complete response header block. Decoded whatever stream it is on (even one crisp has
    /// reset), so the HPACK table stays in step with the runtime's encoder.
    fn header_block(&mut self, stream: u32, end_stream: bool, block: &[u8]) -> Result<(), Stop> {
        let mut status: Option<StatusCode> = None;
        let mut headers = HeaderMap::new();
        let mut bad: Option<&'static str> = None;
        self.dec
            .decode(block, |n, v| {
                if n == b":status" {
                    status = std::str::from_utf8(v).ok().and_then(|s| s.parse::<u16>().ok()).and_then(|c| StatusCode::from_u16(c).ok());
                } else if n.starts_with(b":") {
                    bad = Some("unexpected pseudo-header in a response");
                } else {
                    match (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
                        (Ok(n), Ok(v)) => {
                            headers.append(n, v);
                        }
                        _ => bad = Some("header field that is not valid HTTP"),
                    }
                }
            })
            .map_err(|_| Stop::Protocol("undecodable response header block"))?;
        let Some(s) = self.streams.get_mut(&stream) else { return Ok(()) };
        if let Some(why) = bad {
            tracing::warn!(upstream = %self.name, stream, why, "runtime sent a response header crisp cannot represent; dropped it");
        }
        if let Some(tx) = s.head.take() {
            let Some(status) = status else {
                let _ = tx.send(Err(Error::Malformed("response without :status")));
                let id = s.id;
                let key = s.key;
                self.streams.remove(&id);
                self.keys.remove(&key);
                f::rst_stream(&mut self.out, id, f::PROTOCOL_ERROR);
                return Ok(());
            };
            let _ = tx.send(Ok(ResponseHead { status, headers, end_stream }));
        } else {
            let _ = s.items.send(Item::Trailers(headers));
        }
        if end_stream {
            s.received_end = true;
            self.finish_if_done(stream);
        }
        Ok(())
    }

    /// Forgets a stream that is closed both ways. A response that ends before the request has
    /// all gone out (the runtime answered early) closes it too: the rest is not wanted.
    fn finish_if_done(&mut self, id: u32) {
        let Some(s) = self.streams.get(&id) else { return };
        if !s.received_end {
            return;
        }
        let s = self.streams.remove(&id).expect("checked");
        self.keys.remove(&s.key);
        if !s.sent_end {
            f::rst_stream(&mut self.out, id, f::NO_ERROR);
        }
        self.open_queued();
    }
}

fn fail(s: Stream, e: Error) {
    match s.head {
        Some(tx) => {
            let _ = tx.send(Err(e));
        }
        None => {
            let _ = s.items.send(Item::Failed(e));
        }
    }
}
