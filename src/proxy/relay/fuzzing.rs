//! A driver for [`Core`] on arbitrary input: both peers' bytes (frames over the frame size
//! included), the diverted streams' tasks' commands ([`Command`]: response headers, DATA within
//! the budget the core's credit gives back, as the bridge sends it, trailers, resets, request
//! credit, their ends), the runtime's failure and its return (the answer to
//! [`Event::ProbeRuntime`]), crisp's GOAWAY and time steps, decoded from a byte string
//! (`fuzz/fuzz_targets/core.rs`, issue #36). The timers fire as in the pump: when
//! [`Core::poll_timeout`] is due. After every step it checks the core's invariants:
//!
//! - the client's connection window as crisp counts it is never negative;
//! - no timer is still due after `handle_timeout` (the pump would spin); crisp's own frames
//!   are handed out only when it may write them;
//! - what goes to the runtime is whole frames; its header blocks decode in order with one
//!   decoder (the runtime's HPACK table stays in step); new streams reach it in the order of
//!   their ids; no DATA of a stream reaches it before the stream's HEADERS, and no frame at
//!   all of a stream that was diverted (finished and forgotten by the core or not);
//! - a stream is diverted at most once and never also relayed; a reset is reported only for a
//!   diverted stream, and once; every call ends at most once, and when the client goes, every
//!   relayed or undecided call has ended (exactly once);
//! - a diverted stream's answer ends (END_STREAM or RST_STREAM) at most once, nothing of it
//!   follows its end, and the DATA the core keeps waiting for the client's window stays within
//!   [`ANSWER_BUDGET`] per stream.
//!
//! Public with the `test-util` feature only (as `crisp::proxy::relay_fuzzing`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::answers::Command;
use super::core::{Calls, Config, Core, Event};
use super::flow::ANSWER_BUDGET;
use super::ping::{GOAWAY_PING, KEEPALIVE};
use crate::intercept::{Call, Interest};
use crate::proxy::http2::{self, hpack, Flags, GoAway, Head, Kind, Ping, Reason, RstStream};
use crate::proxy::http2::{Settings, StreamId, WindowUpdate};

const STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";
const PATHS: [&str; 4] = [
    STATUS,
    "/runtime.v1.RuntimeService/Version",
    "/s/Divert",
    "/x",
];

/// The rest of crisp: diverts `/s/Divert`, keeps ContainerStatus undecided and wants it for the request
/// `marked` only, hears of every end.
struct Stub(AtomicU64);

impl Calls for Stub {
    fn next_id(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
    fn interest(&self, call: &Call) -> Interest {
        let p = call.path.as_str();
        Interest {
            request: p == STATUS || p.ends_with("/Divert"),
            complete: true,
            ..Interest::NONE
        }
    }
    fn conditional(&self, call: &Call) -> bool {
        call.path.as_str() == STATUS
    }
    fn wants(&self, _: &Call, req: &[u8]) -> bool {
        req == b"marked"
    }
}

/// Reads the input a few bytes at a time; zeros once it is used up.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.u8()) << 8 | u16::from(self.u8())
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn stream(&mut self) -> StreamId {
        // Mostly client (odd) ids, small enough to collide; sometimes 0 or even.
        StreamId::new(match self.u8() {
            b @ 0..=239 => 1 + 2 * u32::from(b % 24),
            b => u32::from(b % 4) * 2,
        })
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b
    }
}

/// One connection's core and what both peers saw of it.
struct Harness {
    core: Core,
    now: Instant,
    cbuf: BytesMut,
    /// The client's view of the connection: it has the server preface (a SETTINGS first), a
    /// header block of the runtime's is under way; `closing`: the core failed, and what it
    /// still gives is its last words (a GOAWAY may come before the preface).
    preface_seen: bool,
    in_block: bool,
    closing: bool,
    /// The runtime's side: its decoder, the streams it saw opened, and bytes of a partial frame.
    runtime_dec: hpack::Decoder,
    runtime_block: Option<Vec<u8>>,
    opened: HashSet<StreamId>,
    max_opened: StreamId,
    diverted: HashSet<StreamId>,
    /// Diverted streams the client reset (their task is aborted once).
    reset: HashSet<StreamId>,
    ended: HashSet<u64>,
    /// Diverted streams: the DATA their task may still send (the bridge's budget).
    room: HashMap<StreamId, usize>,
    /// Diverted streams whose answer ended on the wire.
    answered: HashSet<StreamId>,
    /// Events taken from the core and not yet checked.
    events: Vec<Event>,
    closed: bool,
}

impl Harness {
    fn new(runtime: bool) -> Harness {
        let now = Instant::now();
        let cfg = Config {
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            runtime: "/run/containerd.sock".into(),
        };
        let calls = Arc::new(Stub(AtomicU64::new(1)));
        Harness {
            core: Core::new(&cfg, calls, runtime, now),
            now,
            cbuf: BytesMut::new(),
            preface_seen: false,
            in_block: false,
            closing: false,
            runtime_dec: hpack::Decoder::default(),
            runtime_block: None,
            opened: HashSet::new(),
            max_opened: StreamId::CONNECTION,
            diverted: HashSet::new(),
            reset: HashSet::new(),
            ended: HashSet::new(),
            room: HashMap::new(),
            answered: HashSet::new(),
            events: Vec::new(),
            closed: false,
        }
    }

    fn client(&mut self, bytes: &[u8]) {
        self.cbuf.extend_from_slice(bytes);
        if self
            .core
            .handle_client_bytes(&mut self.cbuf, self.now)
            .is_err()
        {
            // The pump closes the connection.
            self.client_gone();
        }
    }

    fn runtime(&mut self, bytes: &[u8]) {
        if !self.core.runtime.connected() {
            return;
        }
        self.core.runtime_buffer().extend_from_slice(bytes);
        if self.core.handle_runtime_bytes(self.now).is_err() {
            self.client_gone();
        }
    }

    /// What the pump does after each wakeup: if [`Core::poll_timeout`] is due, the timers'
    /// work, and each [`Event::ProbeRuntime`] answered with `reachable`. After it no timer may
    /// be due still (the pump would spin).
    fn timers(&mut self, reachable: bool) {
        if self.core.poll_timeout().is_none_or(|at| self.now < at) {
            return;
        }
        if self.core.handle_timeout(self.now).is_err() {
            self.client_gone();
            return;
        }
        while let Some(ev) = self.core.poll_event() {
            match ev {
                Event::ProbeRuntime => self.core.handle_runtime_probe(self.now, reachable),
                ev => self.events.push(ev),
            }
        }
        let next = self.core.poll_timeout();
        assert!(
            next.is_none_or(|at| at > self.now),
            "a timer still due after handle_timeout: the pump would spin"
        );
    }

    fn client_gone(&mut self) {
        self.closing = true;
        self.core.handle_client_gone(self.now);
        self.check();
        assert!(self.core.relayed.is_empty(), "a relayed call never ended");
        assert!(
            self.core.undecided_id().is_none(),
            "an undecided call never ended"
        );
        self.closed = true;
    }

    /// The invariants, on everything the core produced since the last check.
    fn check(&mut self) {
        let (window, _, _) = self.core.flow.windows(StreamId::CONNECTION);
        assert!(
            window >= 0,
            "the client's connection window is negative: {window}"
        );
        let to_runtime = self
            .core
            .poll_transmit_runtime()
            .unwrap_or_default()
            .to_vec();
        self.core.advance_runtime(to_runtime.len());
        self.runtime_saw(&to_runtime);
        let mut events = std::mem::take(&mut self.events);
        events.extend(std::iter::from_fn(|| self.core.poll_event()));
        for ev in events {
            match ev {
                Event::Divert { stream, .. } => {
                    assert!(
                        self.diverted.insert(stream),
                        "stream {stream} diverted twice"
                    );
                    self.room.insert(stream, ANSWER_BUDGET);
                    assert!(
                        !self.opened.contains(&stream),
                        "stream {stream} diverted and relayed"
                    );
                }
                Event::Ended { call, .. } => {
                    assert!(self.ended.insert(call.id), "call {} ended twice", call.id);
                }
                Event::Credit { stream, n } => {
                    let room = self
                        .room
                        .get_mut(&stream)
                        .expect("credit of a diverted stream");
                    *room += n;
                    assert!(
                        *room <= ANSWER_BUDGET,
                        "stream {stream}: more credit than sent"
                    );
                }
                Event::Reset { stream } => {
                    assert!(
                        self.diverted.contains(&stream),
                        "reset of a stream never diverted"
                    );
                    assert!(
                        self.reset.insert(stream),
                        "diverted stream {stream} reset twice"
                    );
                }
                _ => {}
            }
        }
        // The client's bytes, in the order the core gives them (as the pump writes them).
        while let Some(bytes) = self.core.poll_transmit_client() {
            let bytes = bytes.to_vec();
            let own = self.core.out.front_is_own();
            self.core.advance_client(bytes.len(), self.now);
            self.client_saw(&bytes, own);
        }
        for &s in &self.diverted {
            let queued = self.core.flow.queued(s);
            assert!(queued <= ANSWER_BUDGET, "stream {s}: {queued} bytes kept");
        }
    }

    /// What the client reads (`own`: crisp's own frames, else the runtime's): whole frames;
    /// none of crisp's before the server preface (a SETTINGS) or inside a header block of the
    /// runtime's, unless the connection is closing; on diverted streams an answer that ends
    /// once, with nothing after it.
    fn client_saw(&mut self, mut b: &[u8], own: bool) {
        while !b.is_empty() {
            let head = Head::parse(b).expect("a whole frame header");
            let end = http2::HEADER_LEN + head.len;
            assert!(b.len() >= end, "a partial frame to the client");
            b = &b[end..];
            let preface = head.kind == Kind::Settings && !head.has(Flags::ACK);
            if own && !self.closing {
                assert!(
                    self.preface_seen || preface,
                    "crisp's {:?} before the client's server preface",
                    head.kind
                );
                assert!(
                    !self.in_block,
                    "crisp's {:?} inside a header block",
                    head.kind
                );
            }
            self.preface_seen |= preface;
            if !own {
                // As the core reads the runtime's blocks: a CONTINUATION counts only inside one.
                match head.kind {
                    Kind::Headers => self.in_block = !head.has(Flags::END_HEADERS),
                    Kind::Continuation if self.in_block => {
                        self.in_block = !head.has(Flags::END_HEADERS)
                    }
                    _ => {}
                }
                continue;
            }
            let s = head.stream;
            if !self.diverted.contains(&s) || head.kind == Kind::WindowUpdate {
                continue;
            }
            assert!(
                !self.answered.contains(&s),
                "stream {s}: a frame after its end"
            );
            if head.kind == Kind::RstStream || head.has(Flags::END_STREAM) {
                self.answered.insert(s);
            }
        }
    }

    /// What the runtime reads: whole frames, blocks it can decode, streams in order.
    fn runtime_saw(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let head = Head::parse(b).expect("a whole frame header");
            let end = http2::HEADER_LEN + head.len;
            assert!(b.len() >= end, "a partial frame to the runtime");
            let payload = &b[http2::HEADER_LEN..end];
            let s = head.stream;
            match head.kind {
                Kind::Headers => {
                    if s > self.max_opened {
                        self.max_opened = s;
                        self.opened.insert(s);
                        assert!(
                            !self.diverted.contains(&s),
                            "stream {s} relayed after its divert"
                        );
                    } else {
                        // Trailers, or a client's HEADERS on a stream it skipped (its protocol
                        // error, the runtime's to judge); never a request crisp opened late.
                        assert!(
                            self.opened.contains(&s) || !self.core.relayed.contains_key(&s),
                            "stream {s} opened out of order"
                        );
                    }
                    let frag = http2::header_fragment(&head, payload).expect("crisp's own frame");
                    self.block(payload[frag].to_vec(), head.has(Flags::END_HEADERS));
                }
                Kind::Continuation => {
                    let mut block = self.runtime_block.take().expect("a block in progress");
                    block.extend_from_slice(payload);
                    self.block(block, head.has(Flags::END_HEADERS));
                }
                Kind::Data => {
                    assert!(
                        s <= self.max_opened,
                        "DATA of stream {s} before its HEADERS"
                    );
                    assert!(!self.diverted.contains(&s), "DATA of diverted stream {s}");
                }
                Kind::RstStream | Kind::WindowUpdate => {
                    assert!(
                        !self.diverted.contains(&s),
                        "{:?} of diverted stream {s}",
                        head.kind
                    );
                }
                _ => {}
            }
            b = &b[end..];
        }
    }

    fn block(&mut self, block: Vec<u8>, end: bool) {
        if end {
            self.runtime_dec
                .decode(&block, |_, _| {})
                .expect("the runtime decodes crisp's blocks in order");
        } else {
            self.runtime_block = Some(block);
        }
    }
}

fn request(stream: StreamId, path: &str, end: bool) -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        ("content-type", "application/grpc"),
    ] {
        http2::encode_field(&mut block, n.as_bytes(), v.as_bytes());
    }
    let mut out = Vec::new();
    http2::headers(&mut out, stream, &block, end);
    out
}

fn grpc(stream: StreamId, msg: &[u8], end: bool) -> Vec<u8> {
    let mut body = vec![0u8];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(msg);
    let mut out = Vec::new();
    http2::data(&mut out, stream, &body, end);
    out
}

fn frame(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

/// Runs one connection on `data`, checking the invariants after every step (panics on a
/// violation).
pub fn run(data: &[u8]) {
    let mut input = Input(data);
    let mut h = Harness::new(input.u8() % 8 != 0);
    if input.bool() && h.core.runtime.connected() {
        // The runtime's server preface, usually first.
        h.runtime(&frame(|o| Settings::default().encode(o)));
    }
    while !input.0.is_empty() && !h.closed {
        let s = input.stream();
        match input.u8() % 16 {
            0 | 1 => {
                let path = PATHS[usize::from(input.u8()) % PATHS.len()];
                let end = input.u8() % 4 == 0;
                h.client(&request(s, path, end));
            }
            2 | 3 => {
                let msg: &[u8] = match input.u8() % 3 {
                    0 => b"marked",
                    1 => b"another",
                    _ => &[0xff; 3],
                };
                let end = input.u8() % 4 != 0;
                h.client(&grpc(s, msg, end));
            }
            4 => {
                // Within the frame size, or (one in eight) a single frame over it.
                let n = usize::from(input.u16()) % 9_000;
                let end = input.bool();
                if input.u8() % 8 == 0 {
                    let n = http2::MAX_FRAME + n;
                    let mut f = Vec::new();
                    Head::new(Kind::Data, Flags::END_STREAM.when(end), s, n).encode(&mut f);
                    f.resize(f.len() + n, 7);
                    h.client(&f);
                } else {
                    h.client(&frame(|o| http2::data(o, s, &vec![7; n], end)));
                }
            }
            5 => {
                // Raw bytes: partial frames, padding, unknown kinds, protocol errors.
                let n = usize::from(input.u8());
                let raw = input.bytes(n).to_vec();
                h.client(&raw);
            }
            6 => {
                let inc = u32::from(input.u16()) + 1;
                let stream = if input.bool() {
                    StreamId::CONNECTION
                } else {
                    s
                };
                h.client(&frame(|o| WindowUpdate::new(stream, inc).encode(o)));
            }
            7 => h.client(&frame(|o| RstStream::new(s, Reason::CANCEL).encode(o))),
            8 => {
                let f = match input.u8() % 5 {
                    0 => frame(|o| {
                        Settings {
                            initial_window_size: Some(u32::from(input.u16())),
                            ..Default::default()
                        }
                        .encode(o)
                    }),
                    1 => frame(|o| Ping::new(*b"client01").encode(o)),
                    2 => frame(|o| Ping::new(GOAWAY_PING).pong().encode(o)),
                    3 => frame(|o| Ping::new(KEEPALIVE).pong().encode(o)),
                    _ => frame(Settings::encode_ack),
                };
                h.client(&f);
            }
            9 => {
                let mut block = Vec::new();
                http2::encode_field(&mut block, b":status", b"200");
                let end = input.bool();
                if end {
                    http2::encode_field(&mut block, b"grpc-status", b"0");
                }
                h.runtime(&frame(|o| http2::headers(o, s, &block, end)));
            }
            10 => {
                let n = usize::from(input.u16()) % 20_000;
                let end = input.bool();
                h.runtime(&frame(|o| http2::data(o, s, &vec![1; n], end)));
            }
            11 => {
                let f = match input.u8() % 5 {
                    0 => frame(|o| Settings::default().encode(o)),
                    1 => frame(Settings::encode_ack),
                    2 => frame(|o| GoAway::new(s, Reason::NO_ERROR, b"bye").encode(o)),
                    3 => frame(|o| RstStream::new(s, Reason::CANCEL).encode(o)),
                    _ => {
                        let n = usize::from(input.u8());
                        input.bytes(n).to_vec()
                    }
                };
                h.runtime(&f);
            }
            12 => {
                // Time passes (a few ms, or to the core's next timer): the pump's timers.
                match input.u8() {
                    255 => h.now = h.core.poll_timeout().unwrap_or(h.now).max(h.now),
                    ms => h.now += Duration::from_millis(u64::from(ms)),
                }
                let reachable = input.bool();
                h.timers(reachable);
            }
            13 => {
                // A diverted stream's task sends a command: response headers, DATA within its
                // budget, trailers, a reset, request credit; or it ends.
                let n = usize::from(input.u16());
                let cmd = match input.u8() % 6 {
                    0 => Command::Headers {
                        stream: s,
                        status: http::StatusCode::OK,
                        fields: http::HeaderMap::new(),
                        end: input.u8() % 4 == 0,
                    },
                    1 => {
                        // What the task may send: its room (none for a stream never diverted).
                        let n = n.min(h.room.get(&s).copied().unwrap_or(0));
                        if let Some(r) = h.room.get_mut(&s) {
                            *r -= n;
                        }
                        Command::Data {
                            stream: s,
                            bytes: vec![3; n].into(),
                            end: input.u8() % 4 == 0,
                        }
                    }
                    2 => {
                        let mut fields = http::HeaderMap::new();
                        fields.insert("grpc-status", http::HeaderValue::from_static("0"));
                        Command::Trailers { stream: s, fields }
                    }
                    3 => Command::Reset {
                        stream: s,
                        reason: Reason::CANCEL,
                    },
                    4 => Command::Consumed { stream: s, n },
                    _ => Command::Finished { stream: s },
                };
                h.core.handle_command(cmd, h.now);
            }
            14 => {
                if h.core.handle_runtime_failed("crisp: gone").is_err() {
                    h.client_gone();
                }
            }
            _ => h.core.handle_goaway(b"crisp: shutting down"),
        }
        if !h.closed {
            h.check();
        }
    }
    if !h.closed {
        h.client_gone();
    }
}

#[cfg(test)]
mod tests {
    /// A few thousand inputs from a fixed generator: the fuzz target's checks on every
    /// `cargo test` (the target itself runs for minutes: `hack/fuzz.sh 300 core`).
    #[test]
    fn the_core_keeps_its_invariants_on_generated_input() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..3_000usize {
            let input: Vec<u8> = (0..len % 400)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            super::run(&input);
        }
    }
}
