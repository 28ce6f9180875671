//! crisp between a client and a runtime that behave on the wire as grpc-go does (KUBELET-CRI.md
//! §11), frame by frame, so that each rule can be checked deterministically:
//! - the client sends `:authority` as kubelet 1.2x and crictl do (the socket path), as kubelet 1.29
//!   does (percent-encoded), `localhost`, or empty; its header blocks index fields into the HPACK
//!   dynamic table, so later requests refer to earlier ones; it sends a BDP PING whenever DATA
//!   arrives and none is outstanding; it retries a stream refused with REFUSED_STREAM;
//! - the runtime accepts any authority, answers PINGs, and polices them as grpc-go's server does
//!   with containerd's settings (keepalive `MinTime` 5 min, `PermitWithoutStream` false): a PING is
//!   a strike unless the runtime wrote HEADERS or DATA since the previous one; more than two
//!   strikes and it sends GOAWAY ENHANCE_YOUR_CALM and closes the connection.
//!
//! The real peers (grpc-go built from Debian's packages, containerd) are in the e2e suite; these
//! tests pin the rules down where a real peer's timing would make a failure rare.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, Mutex as AsyncMutex};

use crate::support::{within, Crisp, PATIENCE};
use crisp::intercept::{Call, Interceptor, Interest};
use crisp::proxy::http2::hpack::Decoder;
use crisp::proxy::http2::{
    self as f, Flags, GoAway, Head, Kind, Ping, Reason, Settings, StreamId, WindowUpdate,
};
use crisp::proxy::ProxyOptions;

const VERSION: &str = "/runtime.v1.RuntimeService/Version";
const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
/// grpc-go's BDP estimator's PING payload.
const BDP_PING: [u8; 8] = [2, 4, 16, 16, 9, 14, 7, 7];

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// Diverts CreateContainer (as the ordering engine does) and lets everything else relay.
struct DivertCreate;

impl Interceptor for DivertCreate {
    fn interest(&self, call: &Call) -> Interest {
        let divert = call.path.as_str() == CREATE;
        Interest {
            request: divert,
            response: divert,
            ..Interest::NONE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The runtime

#[derive(Default)]
struct RuntimeLog {
    /// Every request's header fields, in arrival order.
    requests: Mutex<Vec<Fields>>,
    strikes: AtomicUsize,
    too_many_pings: AtomicUsize,
    pings: AtomicUsize,
    connections: AtomicUsize,
    /// Graceful GOAWAYs sent, and requests that arrived after one (never processed).
    goaways: AtomicUsize,
    ignored: AtomicUsize,
    /// Sizes of the request header blocks on the first connection (crisp's relay connection).
    relay_blocks: Mutex<Vec<usize>>,
}

#[derive(Clone, Copy, Default)]
struct RuntimeOpts {
    /// Answer each request this long after it arrived.
    delay: Duration,
    /// On the connection's Nth request (1-based), send GOAWAY whose last-stream-id is the
    /// previous request's, ignore that request and every later one, and close the connection
    /// once the earlier ones are answered.
    goaway_at: Option<usize>,
    /// On the first connection (crisp's relay connection: the observed path's pool connects
    /// later), acknowledge the client's SETTINGS only this long after they arrived.
    settings_ack_delay: Duration,
    /// Answer with a message of this many bytes instead of the request's own.
    response_len: usize,
    /// SETTINGS_HEADER_TABLE_SIZE in the runtime's SETTINGS (HPACK's 4,096 when None).
    header_table_size: Option<u32>,
}

struct Runtime {
    log: Arc<RuntimeLog>,
    _task: tokio::task::JoinHandle<()>,
}

impl Runtime {
    async fn start(path: &Path, opts: RuntimeOpts) -> Runtime {
        let listener = UnixListener::bind(path).unwrap();
        let log = Arc::new(RuntimeLog::default());
        let l = log.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let n = l.connections.fetch_add(1, Ordering::SeqCst);
                let opts = if n == 0 {
                    opts
                } else {
                    RuntimeOpts {
                        settings_ack_delay: Duration::ZERO,
                        ..opts
                    }
                };
                tokio::spawn(serve_runtime_conn(s, l.clone(), opts, n == 0));
            }
        });
        Runtime { log, _task: task }
    }
}

struct RtConn {
    w: AsyncMutex<OwnedWriteHalf>,
    /// grpc-go's `resetPingStrikes`: set whenever the server writes HEADERS or DATA.
    reset_strikes: AtomicBool,
    active: AtomicUsize,
    closing: AtomicBool,
}

impl RtConn {
    async fn write(&self, b: &[u8]) {
        let _ = self.w.lock().await.write_all(b).await;
    }
}

async fn serve_runtime_conn(s: UnixStream, log: Arc<RuntimeLog>, opts: RuntimeOpts, first: bool) {
    let (mut r, w) = s.into_split();
    let conn = Arc::new(RtConn {
        w: AsyncMutex::new(w),
        reset_strikes: AtomicBool::new(false),
        active: AtomicUsize::new(0),
        closing: AtomicBool::new(false),
    });
    let mut preface = [0u8; 24];
    if r.read_exact(&mut preface).await.is_err() {
        return;
    }
    let mut hello = Vec::new();
    match opts.header_table_size {
        Some(size) => {
            Head::new(Kind::Settings, Flags::NONE, StreamId::CONNECTION, 6).encode(&mut hello);
            hello.extend_from_slice(&Settings::HEADER_TABLE_SIZE.to_be_bytes());
            hello.extend_from_slice(&size.to_be_bytes());
        }
        None => Head::new(Kind::Settings, Flags::NONE, StreamId::CONNECTION, 0).encode(&mut hello),
    }
    conn.write(&hello).await;
    let mut dec = Decoder::default();
    let mut buf = BytesMut::new();
    let mut streams: HashMap<StreamId, (Fields, BytesMut)> = HashMap::new();
    let mut block: Option<(StreamId, bool, Vec<u8>)> = None;
    let mut last_ping: Option<Instant> = None;
    let mut strikes = 0usize;
    let mut requests = 0usize;
    let mut goaway_last: Option<StreamId> = None;
    loop {
        if conn.closing.load(Ordering::SeqCst) && conn.active.load(Ordering::SeqCst) == 0 {
            return;
        }
        let n = tokio::select! {
            n = r.read_buf(&mut buf) => n.unwrap_or(0),
            _ = tokio::time::sleep(Duration::from_millis(20)), if goaway_last.is_some() => continue,
        };
        if n == 0 {
            return;
        }
        while let Some(head) = Head::parse(&buf) {
            if buf.len() < f::HEADER_LEN + head.len {
                break;
            }
            let frame = buf.split_to(f::HEADER_LEN + head.len).freeze();
            let payload = frame.slice(f::HEADER_LEN..);
            let mut complete: Option<(StreamId, bool, Vec<u8>)> = None;
            match head.kind {
                Kind::Headers => {
                    let r = f::header_fragment(&head, &payload).unwrap();
                    let b = (
                        head.stream,
                        head.has(Flags::END_STREAM),
                        payload[r].to_vec(),
                    );
                    if head.has(Flags::END_HEADERS) {
                        complete = Some(b);
                    } else {
                        block = Some(b);
                    }
                }
                Kind::Continuation => {
                    let mut b = block.take().expect("CONTINUATION without HEADERS");
                    b.2.extend_from_slice(&payload);
                    if head.has(Flags::END_HEADERS) {
                        complete = Some(b);
                    } else {
                        block = Some(b);
                    }
                }
                Kind::Data => {
                    let mut out = Vec::new();
                    if head.len > 0 {
                        WindowUpdate::new(StreamId::CONNECTION, head.len as u32).encode(&mut out);
                    }
                    if let Some((_, body)) = streams.get_mut(&head.stream) {
                        let r = f::data_payload(&head, &payload).expect("malformed DATA");
                        body.extend_from_slice(&payload[r]);
                    }
                    conn.write(&out).await;
                    if head.has(Flags::END_STREAM) {
                        if let Some((fields, body)) = streams.remove(&head.stream) {
                            respond(
                                &conn,
                                &log,
                                head.stream,
                                fields,
                                body.freeze(),
                                opts,
                                goaway_last,
                            );
                        }
                    }
                }
                Kind::Settings if !head.has(Flags::ACK) => {
                    let mut out = Vec::new();
                    Head::new(Kind::Settings, Flags::ACK, StreamId::CONNECTION, 0).encode(&mut out);
                    if opts.settings_ack_delay.is_zero() {
                        conn.write(&out).await;
                    } else {
                        let (conn, delay) = (conn.clone(), opts.settings_ack_delay);
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            conn.write(&out).await;
                        });
                    }
                }
                Kind::Ping if !head.has(Flags::ACK) => {
                    log.pings.fetch_add(1, Ordering::SeqCst);
                    let mut out = Vec::new();
                    Head::new(Kind::Ping, Flags::ACK, StreamId::CONNECTION, 8).encode(&mut out);
                    out.extend_from_slice(&payload);
                    conn.write(&out).await;
                    // grpc-go's http2Server.handlePing with MinTime 5 min, PermitWithoutStream false.
                    let now = Instant::now();
                    let prev = last_ping.replace(now);
                    if conn.reset_strikes.swap(false, Ordering::SeqCst) {
                        strikes = 0;
                        continue;
                    }
                    let min = if conn.active.load(Ordering::SeqCst) == 0 {
                        Duration::from_secs(7200)
                    } else {
                        Duration::from_secs(300)
                    };
                    if prev.is_some_and(|p| p + min > now) {
                        strikes += 1;
                        log.strikes.fetch_add(1, Ordering::SeqCst);
                    }
                    if strikes > 2 {
                        log.too_many_pings.fetch_add(1, Ordering::SeqCst);
                        let mut g = Vec::new();
                        GoAway::new(StreamId::MAX, Reason::ENHANCE_YOUR_CALM, b"too_many_pings")
                            .encode(&mut g);
                        conn.write(&g).await;
                        return;
                    }
                }
                _ => {}
            }
            if let Some((stream, end, block)) = complete {
                if first {
                    log.relay_blocks.lock().unwrap().push(block.len());
                }
                let mut fields = Vec::new();
                dec.decode(&block, |n, v| fields.push((n.to_vec(), v.to_vec())))
                    .expect("header block");
                if let std::collections::hash_map::Entry::Vacant(e) = streams.entry(stream) {
                    requests += 1;
                    if goaway_last.is_some_and(|l| stream > l) {
                        // After GOAWAY: never processed.
                        log.ignored.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    if opts.goaway_at == Some(requests) {
                        let last = StreamId::new(stream.get().saturating_sub(2));
                        goaway_last = Some(last);
                        log.goaways.fetch_add(1, Ordering::SeqCst);
                        log.ignored.fetch_add(1, Ordering::SeqCst);
                        conn.closing.store(true, Ordering::SeqCst);
                        let mut g = Vec::new();
                        GoAway::new(last, Reason::NO_ERROR, b"graceful").encode(&mut g);
                        conn.write(&g).await;
                        continue;
                    }
                    log.requests.lock().unwrap().push(fields.clone());
                    conn.active.fetch_add(1, Ordering::SeqCst);
                    if end {
                        respond(&conn, &log, stream, fields, Bytes::new(), opts, goaway_last);
                    } else {
                        e.insert((fields, BytesMut::new()));
                    }
                }
            }
        }
    }
}

/// Answers a request with its own message, as a unary gRPC response.
fn respond(
    conn: &Arc<RtConn>,
    _log: &Arc<RuntimeLog>,
    stream: StreamId,
    _fields: Fields,
    body: Bytes,
    opts: RuntimeOpts,
    _goaway: Option<StreamId>,
) {
    let conn = conn.clone();
    tokio::spawn(async move {
        if !opts.delay.is_zero() {
            tokio::time::sleep(opts.delay).await;
        }
        let body = if opts.response_len > 0 {
            framed(&vec![b'r'; opts.response_len])
        } else {
            body
        };
        let mut out = Vec::new();
        let mut h = Vec::new();
        f::encode_field(&mut h, b":status", b"200");
        f::encode_field(&mut h, b"content-type", b"application/grpc");
        f::headers(&mut out, stream, &h, false);
        f::data(&mut out, stream, &body, false);
        let mut t = Vec::new();
        f::encode_field(&mut t, b"grpc-status", b"0");
        f::headers(&mut out, stream, &t, true);
        // Set before the frames go out, as grpc-go's loopy writer does.
        conn.reset_strikes.store(true, Ordering::SeqCst);
        conn.write(&out).await;
        conn.active.fetch_sub(1, Ordering::SeqCst);
    });
}

// ---------------------------------------------------------------------------------------------
// The client

/// A grpc-go-shaped HPACK encoder: fields are added to the dynamic table ("literal with
/// incremental indexing") and referred to by index when they recur; `grpc-timeout` is never
/// indexed.
#[derive(Default)]
struct Encoder {
    /// Newest first.
    table: Vec<(Vec<u8>, Vec<u8>)>,
    size: usize,
}

impl Encoder {
    fn field(&mut self, out: &mut Vec<u8>, n: &[u8], v: &[u8]) {
        if let Some(i) = self.table.iter().position(|(tn, tv)| tn == n && tv == v) {
            f::put_int(out, 0x80, 7, 62 + i);
            return;
        }
        let entry = 32 + n.len() + v.len();
        if n == b"grpc-timeout" || self.size + entry > 4096 {
            f::encode_field(out, n, v);
            return;
        }
        out.push(0x40);
        f::put_int(out, 0, 7, n.len());
        out.extend_from_slice(n);
        f::put_int(out, 0, 7, v.len());
        out.extend_from_slice(v);
        self.table.insert(0, (n.to_vec(), v.to_vec()));
        self.size += entry;
    }
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Ok(Bytes),
    Status(String),
    Reset(u32),
    ConnectionClosed,
}

#[derive(Default)]
struct ClientState {
    waiting: HashMap<StreamId, (oneshot::Sender<Outcome>, BytesMut, bool)>,
    ping_outstanding: bool,
    pings_sent: usize,
    /// The peer acknowledged this client's SETTINGS.
    settings_acked: bool,
    /// Withhold stream WINDOW_UPDATEs until then (so a stream's window is exactly the 65,535
    /// bytes the peer may count on before the ACK), and count each stream's DATA meanwhile.
    strict_until_ack: bool,
    before_ack: HashMap<StreamId, usize>,
}

struct Client {
    w: Arc<AsyncMutex<OwnedWriteHalf>>,
    enc: AsyncMutex<(Encoder, u32)>,
    st: Arc<Mutex<ClientState>>,
    authority: Vec<u8>,
    _reader: tokio::task::JoinHandle<()>,
}

impl Client {
    async fn connect(path: &Path, authority: &[u8]) -> Client {
        Self::connect_with_window(path, authority, None).await
    }

    /// `window`: announce this SETTINGS_INITIAL_WINDOW_SIZE and hold the peer to the default
    /// window until it acknowledges (as h2 does: it grows its receive windows on the ACK).
    async fn connect_with_window(path: &Path, authority: &[u8], window: Option<u32>) -> Client {
        let s = UnixStream::connect(path).await.unwrap();
        let (mut r, w) = s.into_split();
        let w = Arc::new(AsyncMutex::new(w));
        let mut hello = f::PREFACE.to_vec();
        match window {
            Some(v) => {
                Head::new(Kind::Settings, Flags::NONE, StreamId::CONNECTION, 6).encode(&mut hello);
                hello.extend_from_slice(&Settings::INITIAL_WINDOW_SIZE.to_be_bytes());
                hello.extend_from_slice(&v.to_be_bytes());
            }
            None => {
                Head::new(Kind::Settings, Flags::NONE, StreamId::CONNECTION, 0).encode(&mut hello)
            }
        }
        w.lock().await.write_all(&hello).await.unwrap();
        let st = Arc::new(Mutex::new(ClientState {
            strict_until_ack: window.is_some(),
            ..Default::default()
        }));
        let (st2, w2) = (st.clone(), w.clone());
        let reader = tokio::spawn(async move {
            let mut dec = Decoder::default();
            let mut buf = BytesMut::new();
            loop {
                let n = r.read_buf(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    for (_, (tx, _, _)) in st2.lock().unwrap().waiting.drain() {
                        let _ = tx.send(Outcome::ConnectionClosed);
                    }
                    return;
                }
                let mut out = Vec::new();
                while let Some(head) = Head::parse(&buf) {
                    if buf.len() < f::HEADER_LEN + head.len {
                        break;
                    }
                    let frame = buf.split_to(f::HEADER_LEN + head.len).freeze();
                    let payload = frame.slice(f::HEADER_LEN..);
                    let mut st = st2.lock().unwrap();
                    match head.kind {
                        Kind::Data => {
                            if let Some((_, body, _)) = st.waiting.get_mut(&head.stream) {
                                body.extend_from_slice(&payload);
                            }
                            let strict = st.strict_until_ack && !st.settings_acked;
                            if strict {
                                *st.before_ack.entry(head.stream).or_default() += head.len;
                            }
                            if head.len > 0 {
                                WindowUpdate::new(StreamId::CONNECTION, head.len as u32)
                                    .encode(&mut out);
                                if !strict {
                                    WindowUpdate::new(head.stream, head.len as u32)
                                        .encode(&mut out);
                                }
                                // grpc-go's BDP estimator: a PING per DATA while none is out.
                                if !st.ping_outstanding {
                                    st.ping_outstanding = true;
                                    st.pings_sent += 1;
                                    Ping::new(BDP_PING).encode(&mut out);
                                }
                            }
                        }
                        Kind::Headers => {
                            let r = f::header_fragment(&head, &payload).unwrap();
                            assert!(
                                head.has(Flags::END_HEADERS),
                                "the test client handles single-frame blocks only"
                            );
                            let mut fields = Vec::new();
                            dec.decode(&payload[r], |n, v| fields.push((n.to_vec(), v.to_vec())))
                                .expect("response header block");
                            if head.has(Flags::END_STREAM) {
                                if let Some((tx, body, _)) = st.waiting.remove(&head.stream) {
                                    let status = fields
                                        .iter()
                                        .find(|(n, _)| n == b"grpc-status")
                                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
                                    let msg = fields
                                        .iter()
                                        .find(|(n, _)| n == b"grpc-message")
                                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
                                    let _ = tx.send(match status.as_deref() {
                                        Some("0") => Outcome::Ok(body.freeze()),
                                        other => Outcome::Status(format!("{other:?} {msg:?}")),
                                    });
                                }
                            }
                        }
                        Kind::RstStream => {
                            let code = u32::from_be_bytes([
                                payload[0], payload[1], payload[2], payload[3],
                            ]);
                            if let Some((tx, _, _)) = st.waiting.remove(&head.stream) {
                                let _ = tx.send(Outcome::Reset(code));
                            }
                        }
                        Kind::Ping => {
                            if head.has(Flags::ACK) {
                                st.ping_outstanding = false;
                            } else {
                                Head::new(Kind::Ping, Flags::ACK, StreamId::CONNECTION, 8)
                                    .encode(&mut out);
                                out.extend_from_slice(&payload);
                            }
                        }
                        Kind::Settings if !head.has(Flags::ACK) => {
                            Head::new(Kind::Settings, Flags::ACK, StreamId::CONNECTION, 0)
                                .encode(&mut out)
                        }
                        Kind::Settings => st.settings_acked = true,
                        _ => {}
                    }
                }
                if !out.is_empty() {
                    let _ = w2.lock().await.write_all(&out).await;
                }
            }
        });
        Client {
            w,
            enc: AsyncMutex::new((Encoder::default(), 1)),
            st,
            authority: authority.to_vec(),
            _reader: reader,
        }
    }

    /// One unary call, retried once if refused unprocessed (grpc-go's transparent retry).
    async fn call(&self, path: &str, msg: &[u8]) -> Outcome {
        let first = self.call_once(path, msg).await;
        if first == Outcome::Reset(Reason::REFUSED_STREAM.0) {
            return self.call_once(path, msg).await;
        }
        first
    }

    async fn call_once(&self, path: &str, msg: &[u8]) -> Outcome {
        self.call_shaped(path, msg, &[], false).await
    }

    /// A call with `extra` metadata; `odd` frames it the way HTTP/2 allows and grpc-go does not
    /// (but other clients may): HEADERS with PADDED and PRIORITY, the block split over
    /// CONTINUATION frames, and padded DATA.
    async fn call_shaped(
        &self,
        path: &str,
        msg: &[u8],
        extra: &[(&[u8], &[u8])],
        odd: bool,
    ) -> Outcome {
        let (tx, rx) = oneshot::channel();
        {
            let mut enc = self.enc.lock().await;
            let id = StreamId::new(enc.1);
            enc.1 += 2;
            let mut block = Vec::new();
            let e = &mut enc.0;
            e.field(&mut block, b":method", b"POST");
            e.field(&mut block, b":scheme", b"http");
            e.field(&mut block, b":path", path.as_bytes());
            e.field(&mut block, b":authority", &self.authority);
            e.field(&mut block, b"content-type", b"application/grpc");
            e.field(&mut block, b"user-agent", b"grpc-go/1.51.0");
            e.field(&mut block, b"te", b"trailers");
            e.field(&mut block, b"grpc-timeout", b"1999937u");
            for (n, v) in extra {
                f::encode_field(&mut block, n, v);
            }
            let mut out = Vec::new();
            let mut framed = vec![0u8];
            framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
            framed.extend_from_slice(msg);
            if odd {
                // HEADERS: pad length, priority (exclusive bit clear, depends on 0, weight 16),
                // the first 100 bytes of the block, 7 bytes of padding; then CONTINUATIONs.
                let (first, rest) = block.split_at(100.min(block.len()));
                let mut payload = vec![7u8, 0, 0, 0, 0, 15];
                payload.extend_from_slice(first);
                payload.extend_from_slice(&[0; 7]);
                Head::new(
                    Kind::Headers,
                    Flags::PADDED | Flags::PRIORITY,
                    id,
                    payload.len(),
                )
                .encode(&mut out);
                out.extend_from_slice(&payload);
                let mut chunks = rest.chunks(4000).peekable();
                while let Some(c) = chunks.next() {
                    let flags = if chunks.peek().is_none() {
                        Flags::END_HEADERS
                    } else {
                        Flags::NONE
                    };
                    Head::new(Kind::Continuation, flags, id, c.len()).encode(&mut out);
                    out.extend_from_slice(c);
                }
                let mut data = vec![3u8];
                data.extend_from_slice(&framed);
                data.extend_from_slice(&[0; 3]);
                Head::new(
                    Kind::Data,
                    Flags::PADDED | Flags::END_STREAM,
                    id,
                    data.len(),
                )
                .encode(&mut out);
                out.extend_from_slice(&data);
            } else {
                f::headers(&mut out, id, &block, false);
                f::data(&mut out, id, &framed, true);
            }
            self.st
                .lock()
                .unwrap()
                .waiting
                .insert(id, (tx, BytesMut::new(), false));
            // Headers go out in the encoder's order: the runtime's decoder depends on it.
            self.w.lock().await.write_all(&out).await.unwrap();
        }
        rx.await.unwrap_or(Outcome::ConnectionClosed)
    }

    fn pings_sent(&self) -> usize {
        self.st.lock().unwrap().pings_sent
    }
}

fn framed(msg: &[u8]) -> Bytes {
    let mut b = vec![0u8];
    b.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    b.extend_from_slice(msg);
    Bytes::from(b)
}

fn authority_of(fields: &Fields) -> Option<Vec<u8>> {
    fields
        .iter()
        .find(|(n, _)| n == b":authority")
        .map(|(_, v)| v.clone())
}

fn path_of(fields: &Fields) -> String {
    fields
        .iter()
        .find(|(n, _)| n == b":path")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

async fn setup(opts: RuntimeOpts) -> (tempfile::TempDir, Runtime, Crisp) {
    crate::support::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let rt_path = dir.path().join("runtime.sock");
    let runtime = Runtime::start(&rt_path, opts).await;
    let crisp = Crisp::start_with(
        &rt_path,
        vec![Arc::new(DivertCreate)],
        ProxyOptions::default(),
    )
    .await;
    (dir, runtime, crisp)
}

#[tokio::test]
async fn any_authority_a_grpc_client_sends_is_accepted_and_relayed_calls_keep_it() {
    let (_dir, runtime, crisp) = setup(RuntimeOpts::default()).await;
    let socket = crisp.path.to_str().unwrap().as_bytes().to_vec();
    let encoded = socket
        .iter()
        .flat_map(|&b| if b == b'/' { b"%2F".to_vec() } else { vec![b] })
        .collect::<Vec<u8>>();
    for authority in [socket.clone(), encoded, b"localhost".to_vec(), Vec::new()] {
        let shown = String::from_utf8_lossy(&authority).into_owned();
        let client = Client::connect(&crisp.path, &authority).await;
        // Twice each: the second request's header block refers to the first one's table entries.
        for round in 0..2 {
            for path in [VERSION, CREATE] {
                let msg = format!("{path} {shown} {round}");
                let got = within(PATIENCE, "a call", client.call(path, msg.as_bytes())).await;
                assert_eq!(
                    got,
                    Outcome::Ok(framed(msg.as_bytes())),
                    "{path} with :authority {shown:?} (round {round})"
                );
                let reqs = runtime.log.requests.lock().unwrap();
                let last = reqs.last().unwrap();
                assert_eq!(path_of(last), path);
                // Relayed calls go through frame for frame; diverted ones (CreateContainer here)
                // are sent by hyper's client, which keeps a valid URI authority and uses
                // `localhost` for the rest (docs/ARCHITECTURE.md, proxy/runtime_pool.rs).
                let expected =
                    if path == CREATE && http::uri::Authority::try_from(&authority[..]).is_err() {
                        b"localhost".to_vec()
                    } else {
                        authority.clone()
                    };
                assert_eq!(
                    authority_of(last),
                    Some(expected),
                    "{path}: the runtime got another :authority for {shown:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn repeated_relayed_calls_reach_the_runtime_as_table_indices() {
    const LIST: &str = "/runtime.v1.RuntimeService/ListContainers";
    // crisp writes every header block on its runtime connection itself, so it owns that
    // connection's HPACK table: what a client's calls repeat (path, authority, content type,
    // user agent) is sent once and then indexed, as the client itself does. With a runtime that
    // allows a small table, or none, every block must still decode to the client's fields.
    for table in [None, Some(100), Some(0)] {
        let (dir, runtime, crisp) = setup(RuntimeOpts {
            header_table_size: table,
            ..Default::default()
        })
        .await;
        let authority = crisp.path.to_str().unwrap().as_bytes().to_vec();
        let client = Client::connect(&crisp.path, &authority).await;
        for i in 0..30 {
            // CreateContainer is diverted: its blocks never reach this connection, so the
            // runtime's table must stay in step without them.
            let path = [VERSION, CREATE, LIST][i % 3];
            let msg = format!("{path} {i}");
            let got = within(PATIENCE, "a call", client.call(path, msg.as_bytes())).await;
            assert_eq!(
                got,
                Outcome::Ok(framed(msg.as_bytes())),
                "{path} (call {i}, table {table:?})"
            );
            let reqs = runtime.log.requests.lock().unwrap();
            let last = reqs.last().unwrap();
            assert_eq!(path_of(last), path, "call {i}, table {table:?}");
            if path != CREATE {
                assert_eq!(
                    authority_of(last),
                    Some(authority.clone()),
                    "call {i}, table {table:?}"
                );
            }
        }
        let sizes = runtime.log.relay_blocks.lock().unwrap().clone();
        assert_eq!(sizes.len(), 20, "{sizes:?}");
        let (first, later) = (sizes[0], *sizes[2..].iter().max().unwrap());
        if table.is_none() {
            assert!(later * 4 <= first, "table {table:?}: the first relayed block was {first} B, later ones up to {later} B: {sizes:?}");
        }
        drop(dir);
    }
}

#[tokio::test]
async fn a_header_block_that_decodes_to_gigabytes_closes_only_its_connection() {
    let (_dir, runtime, crisp) = setup(RuntimeOpts::default()).await;
    // One 4,000-byte field indexed, then referred to 5,000 times: a 9 KB block that decodes to
    // 20 MB, more than grpc-go's server takes (16 MiB). A 1 MiB block of such references
    // decodes to 4 GB.
    let mut block = vec![0x40, 5];
    block.extend_from_slice(b"x-big");
    f::put_int(&mut block, 0, 7, 4000);
    block.extend_from_slice(&[b'a'; 4000]);
    block.extend_from_slice(&[0xbe; 5000]);
    let mut out = f::PREFACE.to_vec();
    Head::new(Kind::Settings, Flags::NONE, StreamId::CONNECTION, 0).encode(&mut out);
    f::headers(&mut out, StreamId::new(1), &block, true);
    let mut s = UnixStream::connect(&crisp.path).await.unwrap();
    s.write_all(&out).await.unwrap();
    // crisp answers with GOAWAY COMPRESSION_ERROR and closes the connection.
    let mut got = Vec::new();
    within(
        PATIENCE,
        "crisp closing the connection",
        s.read_to_end(&mut got),
    )
    .await
    .unwrap();
    let mut goaway = None;
    let mut pos = 0;
    while let Some(head) = Head::parse(&got[pos..]) {
        let payload = &got[pos + f::HEADER_LEN..pos + f::HEADER_LEN + head.len];
        if head.kind == Kind::GoAway {
            goaway = Some((
                u32::from_be_bytes(payload[4..8].try_into().unwrap()),
                String::from_utf8_lossy(&payload[8..]).into_owned(),
            ));
        }
        pos += f::HEADER_LEN + head.len;
    }
    assert_eq!(
        goaway,
        Some((0x9, "crisp: header list too large".to_string())),
        "{} bytes back",
        got.len()
    );
    assert!(
        runtime.log.requests.lock().unwrap().is_empty(),
        "the oversized request reached the runtime"
    );
    // Other clients are served as before.
    let client = Client::connect(&crisp.path, b"localhost").await;
    let got = within(PATIENCE, "a call", client.call(VERSION, b"after")).await;
    assert_eq!(got, Outcome::Ok(framed(b"after")));
}

#[tokio::test]
async fn client_bdp_pings_never_earn_strikes_at_a_grpc_go_runtime() {
    let (_dir, runtime, crisp) = setup(RuntimeOpts::default()).await;
    // `localhost`: independent of how crisp treats a socket-path authority (the test above).
    let client = Client::connect(&crisp.path, b"localhost").await;
    // Diverted responses are DATA the runtime connection of this client never carried: each one
    // makes the client PING, and forwarding those PINGs earned strikes.
    for i in 0..300 {
        let path = if i % 3 == 0 { VERSION } else { CREATE };
        let msg = format!("call {i}");
        let got = within(PATIENCE, "a call", client.call(path, msg.as_bytes())).await;
        assert_eq!(
            got,
            Outcome::Ok(framed(msg.as_bytes())),
            "call {i} ({path})"
        );
    }
    assert!(
        client.pings_sent() >= 100,
        "the client sent {} PINGs; the test needs many",
        client.pings_sent()
    );
    assert_eq!(
        runtime.log.too_many_pings.load(Ordering::SeqCst),
        0,
        "the runtime sent GOAWAY ENHANCE_YOUR_CALM"
    );
    assert_eq!(
        runtime.log.strikes.load(Ordering::SeqCst),
        0,
        "the runtime counted ping strikes"
    );
    assert!(
        runtime.log.pings.load(Ordering::SeqCst) > 0,
        "no client PING reached the runtime: BDP estimation would see crisp only"
    );
}

#[tokio::test]
async fn crisp_counts_on_a_larger_client_window_only_once_the_runtime_acknowledged_it() {
    // The client announces a 1 MiB stream window; the runtime's ACK (which reaches the client
    // through crisp) comes 300 ms later. A diverted call's 200 KB answer is crisp's own DATA:
    // before that ACK, the client (h2 for one) still holds every stream to 65,535 bytes.
    let opts = RuntimeOpts {
        settings_ack_delay: Duration::from_millis(300),
        response_len: 200_000,
        ..Default::default()
    };
    let (_dir, _runtime, crisp) = setup(opts).await;
    let client = Client::connect_with_window(&crisp.path, b"localhost", Some(1 << 20)).await;
    let got = within(PATIENCE, "a diverted call", client.call(CREATE, b"x")).await;
    assert_eq!(got, Outcome::Ok(framed(&vec![b'r'; 200_000])));
    let st = client.st.lock().unwrap();
    assert!(
        st.settings_acked,
        "the runtime's SETTINGS ACK never reached the client"
    );
    let most = st.before_ack.values().copied().max().unwrap_or(0);
    assert!(most <= f::DEFAULT_WINDOW as usize, "crisp sent {most} bytes on a stream before the client's SETTINGS were acknowledged (window 65,535)");
}

#[tokio::test]
async fn a_runtime_goaway_loses_no_call() {
    // The runtime answers after 200 ms and sends GOAWAY on its 4th request on each connection: the
    // three before it complete there, the 4th and later are retried elsewhere.
    let opts = RuntimeOpts {
        delay: Duration::from_millis(200),
        goaway_at: Some(4),
        ..Default::default()
    };
    let (_dir, runtime, crisp) = setup(opts).await;
    let client = Arc::new(Client::connect(&crisp.path, b"localhost").await);
    let mut calls = Vec::new();
    for i in 0..12 {
        let client = client.clone();
        calls.push(tokio::spawn(async move {
            let path = if i % 2 == 0 { VERSION } else { CREATE };
            let msg = format!("call {i}");
            (
                i,
                path,
                msg.clone(),
                client.call(path, msg.as_bytes()).await,
            )
        }));
        // In order on the wire, but all in flight together.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for c in calls {
        let (i, path, msg, got) = within(PATIENCE, "a call", c).await.unwrap();
        assert_eq!(
            got,
            Outcome::Ok(framed(msg.as_bytes())),
            "call {i} ({path}) was lost to the runtime's GOAWAY"
        );
    }
    let (goaways, ignored) = (
        runtime.log.goaways.load(Ordering::SeqCst),
        runtime.log.ignored.load(Ordering::SeqCst),
    );
    assert!(goaways >= 2 && ignored >= 2, "the runtime sent {goaways} GOAWAYs and left {ignored} requests unprocessed: the test did not exercise them");
    assert_eq!(
        runtime.log.requests.lock().unwrap().len(),
        12,
        "each call processed exactly once"
    );
}

/// Holds CreateContainer for a while, as the ordering engine does while a sidecar gets ready.
struct HoldCreate(Duration);

impl Interceptor for HoldCreate {
    fn interest(&self, call: &Call) -> Interest {
        let divert = call.path.as_str() == CREATE;
        Interest {
            request: divert,
            ..Interest::NONE
        }
    }

    fn on_request<'a>(
        &'a self,
        _call: &'a Call,
        _msg: &'a [u8],
    ) -> crisp::intercept::BoxFuture<'a, crisp::intercept::Verdict> {
        Box::pin(async move {
            tokio::time::sleep(self.0).await;
            crisp::intercept::Verdict::Forward
        })
    }
}

#[tokio::test]
async fn a_held_call_reaches_the_runtime_with_the_time_its_client_has_left() {
    crate::support::init_logging();
    let dir = tempfile::tempdir().unwrap();
    let rt_path = dir.path().join("runtime.sock");
    let runtime = Runtime::start(&rt_path, RuntimeOpts::default()).await;
    let crisp = Crisp::start_with(
        &rt_path,
        vec![Arc::new(HoldCreate(Duration::from_millis(500)))],
        ProxyOptions::default(),
    )
    .await;
    let client = Client::connect(&crisp.path, b"localhost").await;
    // The client sends grpc-timeout 1999937u (≈ 2 s).
    assert_eq!(
        within(PATIENCE, "a held call", client.call(CREATE, b"x")).await,
        Outcome::Ok(framed(b"x"))
    );
    let reqs = runtime.log.requests.lock().unwrap();
    let timeout = reqs[0]
        .iter()
        .find(|(n, _)| n == b"grpc-timeout")
        .map(|(_, v)| v.clone())
        .expect("grpc-timeout forwarded");
    let left = crisp::status::parse_grpc_timeout(&timeout).unwrap();
    assert!(
        left <= Duration::from_millis(1500) && left >= Duration::from_millis(1000),
        "forwarded grpc-timeout {} after a 500 ms hold of a 2 s call",
        String::from_utf8_lossy(&timeout)
    );
}

#[tokio::test]
async fn padded_priority_and_continuation_frames_reach_the_runtime_intact() {
    let (_dir, runtime, crisp) = setup(RuntimeOpts::default()).await;
    let client = Client::connect(&crisp.path, crisp.path.to_str().unwrap().as_bytes()).await;
    // 40 KiB of metadata: the request's header block spans a HEADERS and ten CONTINUATIONs.
    let big = vec![b'x'; 40 << 10];
    for path in [VERSION, CREATE] {
        for odd in [false, true] {
            let msg = format!("{path} {odd}");
            let got = within(
                PATIENCE,
                "a call",
                client.call_shaped(
                    path,
                    msg.as_bytes(),
                    &[(b"x-big", &big), (b"x-trace-bin", b"AAEC")],
                    odd,
                ),
            )
            .await;
            assert_eq!(
                got,
                Outcome::Ok(framed(msg.as_bytes())),
                "{path}, odd framing {odd}"
            );
            let reqs = runtime.log.requests.lock().unwrap();
            let last = reqs.last().unwrap();
            assert_eq!(path_of(last), path);
            let value = |name: &[u8]| last.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
            assert_eq!(
                value(b"x-big").map(|v| v.len()),
                Some(big.len()),
                "{path}: the big header arrived cut or not at all"
            );
            assert_eq!(value(b"x-trace-bin").as_deref(), Some(&b"AAEC"[..]));
        }
    }
}
