//! Unit tests of the connection core, frame in / frame out: a [`Core`] driven by a small frame
//! DSL, with a stub for the rest of crisp. No socket, no thread, no sleep: time is an `Instant`
//! the test moves.

mod answers;
mod blocks;
mod degraded;
mod flow;
mod frames;
mod goaway;
mod order;
mod panics;
mod ping;
mod timers;
mod undecided;
mod view;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::answers::Command;
use super::core::{Calls, Config, Core, Event, GOAWAY_ACK_WAIT};
use super::error::{RelayError, Violation};
use super::ping::{GOAWAY_PING, KEEPALIVE};
use super::status::{Code, EndStatus};
use super::streams::FORGET_AFTER;
use crate::intercept::{Call, Interest};
use crate::proxy::http2::{
    self, Flags, GoAway, Head, Kind, Ping, Reason, RstStream, Settings, StreamId, WindowUpdate,
};

/// The rest of crisp: diverts calls whose path ends in `/Divert`, views [`VERSION`] calls (the
/// tap's interest in a polling call), wants every call's end; is interested in [`STATUS`]
/// calls only for the request [`MARKED`] (job mode's interest), and in [`VIEWED_STATUS`] calls
/// so too, and views them.
struct Stub(AtomicU64);

/// The ContainerStatus path, a unary route.
const STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";
/// A unary polling call's path, which the stub views.
const VERSION: &str = "/runtime.v1.RuntimeService/Version";
/// A ContainerStatus path (of another CRI package, so that the route is unary) whose calls are
/// viewed as well as conditionally diverted.
const VIEWED_STATUS: &str = "/runtime.v1alpha2.RuntimeService/ContainerStatus";
/// The one ContainerStatus request message the stub wants to see.
const MARKED: &[u8] = b"marked";

impl Calls for Stub {
    fn next_id(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }

    fn interest(&self, call: &Call) -> Interest {
        let path = call.path.as_str();
        Interest {
            request: path.ends_with("/Divert") || path == STATUS || path == VIEWED_STATUS,
            response: false,
            complete: true,
            view: path == VERSION || path == VIEWED_STATUS,
        }
    }

    fn response_view(&self, _: &Call) -> Option<crate::cri::skim::SkimSpec> {
        Some(crate::cri::skim::SkimSpec {
            budget: 1024,
            size_only: &[],
            items: None,
        })
    }

    fn conditional(&self, call: &Call) -> bool {
        matches!(call.path.as_str(), STATUS | VIEWED_STATUS)
    }

    fn wants(&self, _: &Call, req: &[u8]) -> bool {
        req == MARKED
    }
}

/// The client streams the tests open, for the core's own calls and its events.
const S1: StreamId = StreamId::new(1);
const S3: StreamId = StreamId::new(3);
const S5: StreamId = StreamId::new(5);

/// A frame as a peer sees it (its stream id as the number on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
struct F {
    kind: Kind,
    flags: Flags,
    stream: u32,
    payload: Vec<u8>,
}

impl F {
    fn has(&self, f: Flags) -> bool {
        self.flags.0 & f.0 != 0
    }
}

fn parse(mut b: &[u8]) -> Vec<F> {
    let mut out = Vec::new();
    while let Some(h) = Head::parse(b) {
        let end = http2::HEADER_LEN + h.len;
        out.push(F {
            kind: h.kind,
            flags: h.flags,
            stream: h.stream.get(),
            payload: b[http2::HEADER_LEN..end].to_vec(),
        });
        b = &b[end..];
    }
    assert!(b.is_empty(), "a partial frame");
    out
}

// ---- The DSL: frames as bytes, streams by their number on the wire.

/// A request's header block: literals, so each block stands alone.
fn request(stream: u32, path: &str, end_stream: bool) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
    ] {
        http2::encode_field(&mut block, n.as_bytes(), v.as_bytes());
    }
    let mut out = Vec::new();
    http2::headers(&mut out, StreamId::new(stream), &block, end_stream);
    out
}

fn response(stream: u32, fields: &[(&str, &str)], end_stream: bool) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in fields {
        http2::encode_field(&mut block, n.as_bytes(), v.as_bytes());
    }
    let mut out = Vec::new();
    http2::headers(&mut out, StreamId::new(stream), &block, end_stream);
    out
}

/// One gRPC message, framed, in one DATA frame.
fn grpc(stream: u32, msg: &[u8], end: bool) -> Vec<u8> {
    let mut body = vec![0u8];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(msg);
    let mut out = Vec::new();
    http2::data(&mut out, StreamId::new(stream), &body, end);
    out
}

fn data(stream: u32, n: usize, end: bool) -> Vec<u8> {
    let mut out = Vec::new();
    http2::data(&mut out, StreamId::new(stream), &vec![7u8; n], end);
    out
}

fn settings(s: Settings) -> Vec<u8> {
    let mut out = Vec::new();
    s.encode(&mut out);
    out
}

fn settings_ack() -> Vec<u8> {
    let mut out = Vec::new();
    Settings::encode_ack(&mut out);
    out
}

fn window(stream: u32) -> Settings {
    Settings {
        initial_window_size: Some(stream),
        ..Default::default()
    }
}

fn ping(opaque: &[u8; 8]) -> Vec<u8> {
    let mut out = Vec::new();
    Ping::new(*opaque).encode(&mut out);
    out
}

fn pong(opaque: &[u8; 8]) -> Vec<u8> {
    let mut out = Vec::new();
    Ping::new(*opaque).pong().encode(&mut out);
    out
}

fn wu(stream: u32, inc: u32) -> Vec<u8> {
    let mut out = Vec::new();
    WindowUpdate::new(StreamId::new(stream), inc).encode(&mut out);
    out
}

fn rst(stream: u32, reason: Reason) -> Vec<u8> {
    let mut out = Vec::new();
    RstStream::new(StreamId::new(stream), reason).encode(&mut out);
    out
}

fn goaway(last: u32, reason: Reason) -> Vec<u8> {
    let mut out = Vec::new();
    GoAway::new(StreamId::new(last), reason, b"bye").encode(&mut out);
    out
}

/// One connection's core and both peers' views of it, read only through its `poll_*`.
struct Conn {
    core: Core,
    now: Instant,
    /// Events taken from the core ([`Core::poll_event`]) and not yet looked at.
    events: Vec<Event>,
}

impl Conn {
    /// A relayed connection (a runtime connection of its own) whose runtime has sent its
    /// SETTINGS, the client's server preface.
    fn relayed() -> Conn {
        let mut c = Conn::new(true);
        c.runtime_all(&[&settings(Settings::default())]);
        assert_eq!(kinds(&c.at_client()), [(Kind::Settings, 0)]);
        c
    }

    /// A relayed connection whose runtime has not sent anything yet.
    fn before_runtime_settings() -> Conn {
        Conn::new(true)
    }

    /// A connection the runtime refused: served on the observed path.
    fn degraded() -> Conn {
        Conn::new(false)
    }

    fn new(runtime: bool) -> Conn {
        let now = Instant::now();
        let cfg = Config {
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            runtime: "/run/containerd.sock".into(),
        };
        let core = Core::new(&cfg, Arc::new(Stub(AtomicU64::new(1))), runtime, now);
        Conn {
            core,
            now,
            events: Vec::new(),
        }
    }

    /// The client sends `frames` (all at once: one read).
    fn client(&mut self, frames: &[&[u8]]) -> Result<(), RelayError> {
        let mut buf = BytesMut::from(&frames.concat()[..]);
        self.core.handle_client_bytes(&mut buf, self.now)?;
        assert!(buf.is_empty(), "complete frames are consumed");
        Ok(())
    }

    /// The runtime sends `frames` (one read into the core's buffer); true when a DATA frame
    /// waits for the client's window (it and what follows stay unhandled).
    fn runtime(&mut self, frames: &[&[u8]]) -> bool {
        self.core
            .runtime_buffer()
            .extend_from_slice(&frames.concat());
        self.core
            .handle_runtime_bytes(self.now)
            .expect("the runtime's frames are within bounds");
        self.core.runtime_waits()
    }

    fn runtime_all(&mut self, frames: &[&[u8]]) {
        assert!(!self.runtime(frames), "blocked on the client's window");
    }

    /// What the runtime received since the last look.
    fn at_runtime(&mut self) -> Vec<F> {
        let mut b = Vec::new();
        if let Some(bytes) = self.core.poll_transmit_runtime() {
            b.extend_from_slice(bytes);
            self.core.advance_runtime(b.len());
        }
        parse(&b)
    }

    /// The bytes the client received since the last look, in the order the core gives them
    /// (as the pump writes them).
    fn client_bytes(&mut self) -> Vec<u8> {
        let mut b = Vec::new();
        while let Some(bytes) = self.core.poll_transmit_client() {
            b.extend_from_slice(bytes);
            let n = bytes.len();
            self.core.advance_client(n, self.now);
        }
        b
    }

    /// What the client received since the last look, frame by frame.
    fn at_client(&mut self) -> Vec<F> {
        parse(&self.client_bytes())
    }

    /// A diverted stream's task sends `cmd` (through the pump).
    fn command(&mut self, cmd: Command) {
        self.core.handle_command(cmd, self.now);
    }

    /// A diverted stream's task ended (its answer written, or none).
    fn finished(&mut self, stream: StreamId) {
        self.command(Command::Finished { stream });
    }

    /// The events the core left since the last look, oldest first.
    fn events(&mut self) -> Vec<Event> {
        let mut events = std::mem::take(&mut self.events);
        events.extend(std::iter::from_fn(|| self.core.poll_event()));
        events
    }

    /// The pump's timer at `now`: [`Core::handle_timeout`], then the answer to each
    /// [`Event::ProbeRuntime`] it left (`reachable`: the runtime's socket accepts a connection);
    /// the other events stay for [`Conn::events`].
    fn timers(
        &mut self,
        now: Instant,
        reachable: &mut dyn FnMut() -> bool,
    ) -> Result<(), RelayError> {
        self.core.handle_timeout(now)?;
        while let Some(ev) = self.core.poll_event() {
            match ev {
                Event::ProbeRuntime => {
                    let up = reachable();
                    self.core.handle_runtime_probe(now, up);
                }
                ev => self.events.push(ev),
            }
        }
        Ok(())
    }
}

/// A diverted stream S1 whose task has sent its response headers.
fn answering() -> Conn {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Divert", true)]).unwrap();
    assert_eq!(diverted(&c.events()), [1]);
    c.command(Command::Headers {
        stream: S1,
        status: http::StatusCode::OK,
        fields: http::HeaderMap::new(),
        end: false,
    });
    assert_eq!(kinds(&c.at_client()), [(Kind::Headers, 1)]);
    c
}

/// A diverted call's answer, as the observed path would give it.
type Answer = std::pin::Pin<
    Box<dyn std::future::Future<Output = http::Response<super::bridge::DivertedBody>> + Send>,
>;

/// The rest of crisp as the bridge sees it, answering every diverted call with `answer` (the
/// bridge's tests: a panic, a large answer).
struct Answers(Box<dyn Fn() -> Answer + Send + Sync>);

impl Calls for Answers {
    fn next_id(&self) -> u64 {
        1
    }
    fn interest(&self, _: &Call) -> Interest {
        Interest::NONE
    }
}

impl super::bridge::Service for Answers {
    fn completed(&self, _: &Call, _: &crate::intercept::Outcome) {}
    fn divert(self: Arc<Self>, _: Call, _: http::Request<crate::proxy::body::ProxyBody>) -> Answer {
        (self.0)()
    }
}

fn kinds(frames: &[F]) -> Vec<(Kind, u32)> {
    frames.iter().map(|f| (f.kind, f.stream)).collect()
}

fn completed(events: &[Event]) -> Vec<(u64, EndStatus)> {
    events
        .iter()
        .filter_map(|e| {
            if let Event::Ended { call, status, .. } = e {
                Some((call.id, status.clone()))
            } else {
                None
            }
        })
        .collect()
}

/// The credit each [`Event::Credit`] gives back: (stream, bytes).
fn credit(events: &[Event]) -> Vec<(u32, usize)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Credit { stream, n } => Some((stream.get(), *n)),
            _ => None,
        })
        .collect()
}

fn diverted(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| {
            if let Event::Divert { stream, .. } = e {
                Some(stream.get())
            } else {
                None
            }
        })
        .collect()
}

/// Decodes blocks the way the runtime does: one decoder for the connection (httlib-hpack, not
/// crisp's own).
fn runtime_fields(dec: &mut httlib_hpack::Decoder, f: &F) -> Vec<(String, String)> {
    let mut out = Vec::new();
    dec.decode(&mut f.payload.clone(), &mut out)
        .expect("the runtime decodes crisp's block");
    out.into_iter()
        .map(|(n, v, _)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
        .collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}
