//! Client → runtime: the core's handling of the client's frames.
//!
//! Every frame is copied through as it is, with these exceptions: request header blocks are
//! decoded (for the route) and written anew through crisp's own [`Indexer`] (so crisp may keep
//! some streams from the runtime without desynchronising the HPACK tables); a new stream that
//! an interceptor wants to see is diverted ([`Event::Divert`]) and never reaches the runtime;
//! PINGs pass the [`super::ping::PingGate`]; connection credit pays crisp's flow-control debt.
//!
//! [`Indexer`]: crate::proxy::http2::Indexer

use super::LOG;
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};

use super::core::{Asked, Core, Event, Relayed};
use super::error::{RelayError, Violation};
use super::from_client::{Request, MAX_HEADER_BLOCK};
use super::ping::{GOAWAY_PING, KEEPALIVE};
use super::status::EndStatus;
use super::streams::Whose;
use super::undecided::{Step, Why};
use super::viewing::Viewing;
use crate::cri::Route;
use crate::intercept::Call;
use crate::proxy::http2::{
    self, Flags, Head, Kind, Ping, Reason, RstStream, Settings, StreamId, WindowUpdate,
};

impl Core {
    /// The complete frames at the start of `buf`: what goes on to the runtime is appended to
    /// `to_runtime`, crisp's own answers to the client are staged for it.
    pub(super) fn client_frames(
        &mut self,
        buf: &mut BytesMut,
        now: Instant,
    ) -> Result<(), RelayError> {
        let mut credit = 0u32;
        let mut got_frame = false;
        self.now = now;
        // Frames are handled where they lie in `buf` (no `Bytes` per frame: its refcount and,
        // for the first split of a buffer, an allocation); the consumed ones are dropped from
        // `buf` at the end.
        let (mut pos, mut missing) = (0, 0);
        let mut r = Ok(());
        while let Some(head) = http2::complete_at(buf, pos, &mut missing) {
            let len = http2::HEADER_LEN + head.len;
            got_frame = true;
            r = head
                .within(self.client.max_frame())
                .map_err(Violation::Frame)
                .and_then(|()| self.client_frame(head, &buf[pos..pos + len], &mut credit));
            if r.is_err() {
                break;
            }
            pos += len;
        }
        if r.is_ok() && missing > 0 {
            // A frame over the bound is refused from its header: nothing of it is buffered.
            if let Some(head) = Head::parse(&buf[pos..]) {
                r = head
                    .within(self.client.max_frame())
                    .map_err(Violation::Frame);
            }
        }
        if let Err(v) = r {
            return Err(self.protocol_error(v));
        }
        buf.advance(pos);
        if missing > 0 {
            buf.reserve(missing);
        }
        if got_frame {
            self.last_client_frame = self.now;
        }
        if credit > 0 {
            WindowUpdate::new(StreamId::CONNECTION, credit).encode(self.out.own());
        }
        Ok(())
    }

    /// One complete frame from the client: relayed, kept, or answered by crisp; `credit`
    /// collects connection credit to give back for bytes kept.
    fn client_frame(
        &mut self,
        head: Head,
        frame: &[u8],
        credit: &mut u32,
    ) -> Result<(), Violation> {
        let payload = &frame[http2::HEADER_LEN..];
        if self.client.in_block() {
            return self.continuation(head, payload);
        }
        match head.kind {
            Kind::Data => self.client_data(head, frame, credit),
            Kind::Headers => {
                let r = http2::header_fragment(&head, payload).map_err(Violation::Frame)?;
                if r.len() > MAX_HEADER_BLOCK {
                    // One HEADERS frame can carry that much when the runtime advertised frames
                    // over 1 MiB: the bound is the block's, however it is framed.
                    return Err(Violation::BlockTooLarge);
                }
                if head.has(Flags::END_HEADERS) {
                    self.header_block(head.stream, head.has(Flags::END_STREAM), &payload[r])?;
                } else {
                    let end_stream = head.has(Flags::END_STREAM);
                    self.client
                        .begin_block(head.stream, end_stream, &payload[r]);
                }
            }
            Kind::Continuation => return Err(Violation::StrayContinuation),
            Kind::RstStream => self.client_reset(head.stream, frame),
            Kind::Settings => {
                if !head.has(Flags::ACK) {
                    self.client_settings(&head, payload);
                    if !self.runtime.connected() {
                        Settings::encode_ack(self.out.own());
                    }
                }
                self.relay(frame);
            }
            Kind::Ping => self.client_ping(head, frame),
            Kind::WindowUpdate => self.client_window_update(head, frame),
            // PRIORITY, GOAWAY, unknown extension frames: the runtime's business.
            _ => self.relay(frame),
        }
        Ok(())
    }

    /// Passes a frame on to the runtime, if there is one.
    fn relay(&mut self, frame: &[u8]) {
        if self.runtime.connected() {
            self.to_runtime.extend_from_slice(frame);
        }
    }

    /// The client's next frame inside a header block it has begun.
    fn continuation(&mut self, head: Head, payload: &[u8]) -> Result<(), Violation> {
        if let Some(b) = self.client.continuation(&head, payload)? {
            self.header_block(b.stream, b.end_stream, &b.block)?;
        }
        Ok(())
    }

    /// RST_STREAM: a diverted stream's task ends; a relayed stream's reset goes on.
    fn client_reset(&mut self, stream: StreamId, frame: &[u8]) {
        if self.undecided_id() == Some(stream) {
            // Never reached the runtime: nothing to relay.
            self.drop_undecided(false);
        } else if matches!(self.whose(stream), Whose::Body | Whose::Diverted) {
            // Its task (or its request body's sender) ends, once: a second reset finds
            // nothing left to end, and never reaches the runtime either.
            let body_open = self.streams.end_body(stream);
            // What waits of its answer is dropped with it.
            let answering = self.flow.close_diverted(stream);
            if body_open || answering {
                self.events.push_back(Event::Reset { stream });
            }
        } else {
            if let Some(r) = self.relayed.remove(&stream) {
                self.completed(r, EndStatus::cancelled(), self.now);
            }
            self.relay(frame);
        }
    }

    /// DATA: relayed on a relayed stream; a diverted stream's request body otherwise.
    pub(super) fn client_data(&mut self, head: Head, frame: &[u8], credit: &mut u32) {
        let payload = &frame[http2::HEADER_LEN..];
        if self.undecided_id() == Some(head.stream) {
            self.undecided_data(head, frame, credit);
            return;
        }
        match self.whose(head.stream) {
            Whose::Body => self.body_data(head, payload, credit),
            Whose::Relayed if self.runtime.connected() => {
                if let Some(v) = self.view_of(head.stream) {
                    if let Ok(r) = http2::data_payload(&head, payload) {
                        v.request(&payload[r]);
                    }
                }
                self.to_runtime.extend_from_slice(frame)
            }
            // Never reaches the runtime: the client gets its connection credit back now.
            _ => *credit = credit.saturating_add(head.len as u32),
        }
    }

    /// DATA of a diverted stream's request body: for its task.
    fn body_data(&mut self, head: Head, payload: &[u8], credit: &mut u32) {
        // Never reaches the runtime: the client gets its connection credit back now.
        *credit = credit.saturating_add(head.len as u32);
        if let Ok(r) = http2::data_payload(&head, payload) {
            if !r.is_empty() {
                // A diverted request's body (a few KiB at most for the calls crisp diverts):
                // copied out of the read buffer.
                self.events.push_back(Event::Body {
                    stream: head.stream,
                    data: Bytes::copy_from_slice(&payload[r]),
                });
            }
        }
        if head.has(Flags::END_STREAM) {
            self.streams.end_body(head.stream);
            self.events.push_back(Event::BodyEnd {
                stream: head.stream,
            });
        }
    }

    /// PING: ACKs of the runtime's PINGs go back to it; the client's own PINGs go on only when
    /// the runtime would not count them as strikes (see [`super::ping::PingGate`]), else crisp
    /// answers.
    fn client_ping(&mut self, head: Head, frame: &[u8]) {
        let payload = &frame[http2::HEADER_LEN..];
        if head.has(Flags::ACK) {
            // crisp's own PINGs' ACKs end here; the one after its first GOAWAY lets the final
            // one go.
            if payload == GOAWAY_PING {
                self.final_goaway();
            } else if payload != KEEPALIVE {
                self.relay(frame);
            }
        } else if !self.runtime.degraded() && self.pings.try_forward() {
            self.to_runtime.extend_from_slice(frame);
        } else if let Ok(ping) = Ping::load(&head, payload) {
            ping.pong().encode(self.out.own());
        } else {
            // Malformed: the runtime's to judge.
            self.relay(frame);
        }
    }

    /// WINDOW_UPDATE: the connection's credit pays crisp's debt first (bytes it sent on
    /// diverted streams), a diverted stream's is crisp's, a relayed stream's the runtime's.
    fn client_window_update(&mut self, head: Head, frame: &[u8]) {
        // Malformed (FRAME_SIZE_ERROR): the runtime's to judge; crisp counts no credit.
        let inc = WindowUpdate::load(&head, &frame[http2::HEADER_LEN..]).map_or(0, |w| w.increment);
        if !head.stream.is_zero() && self.undecided_id() == Some(head.stream) {
            // Credit for a response no one serves yet: the observed path takes the stream.
            self.divert_undecided(Why::OtherFrame);
        }
        if head.stream.is_zero() {
            let forward = self.flow.connection_credit(inc);
            // Diverted streams' answers may wait for it.
            self.flush_diverted();
            if self.runtime.connected() && forward > 0 {
                WindowUpdate::new(StreamId::CONNECTION, forward).encode(&mut self.to_runtime);
            }
        } else if matches!(self.whose(head.stream), Whose::Body | Whose::Diverted) {
            self.flow.stream_credit(head.stream, inc);
            self.flush_diverted();
        } else {
            self.relay(frame);
        }
    }

    /// Whose the frames of `stream`, not a new one, are (`streams.rs`): crisp's for a diverted
    /// stream, in flight or finished (dropped, their connection credit given back).
    pub(super) fn whose(&self, stream: StreamId) -> Whose {
        self.streams
            .whose(stream, || self.relayed.contains_key(&stream))
    }

    /// A client SETTINGS frame (not an ACK). Relayed, the runtime's ACK will reach the client
    /// through crisp; otherwise crisp acknowledges it itself, at once.
    fn client_settings(&mut self, head: &Head, payload: &[u8]) {
        // A malformed frame (FRAME_SIZE_ERROR) changes no window: the runtime (or, degraded,
        // the client's next frames) ends the connection.
        let window = Settings::load(head, payload)
            .ok()
            .and_then(|s| s.initial_window_size)
            .map(i64::from);
        if self.flow.client_settings(window, self.runtime.connected()) {
            self.flush_diverted();
        }
    }

    /// A complete request header block: relay it re-encoded, or divert its stream.
    fn header_block(
        &mut self,
        stream: StreamId,
        end_stream: bool,
        raw: &[u8],
    ) -> Result<(), Violation> {
        self.with_block(|core, block| core.header_block_into(stream, end_stream, raw, block))
    }

    fn header_block_into(
        &mut self,
        stream: StreamId,
        end_stream: bool,
        raw: &[u8],
        block: &mut Vec<u8>,
    ) -> Result<(), Violation> {
        let req = self.client.decode_request(raw)?;
        let new = stream > self.max_stream && stream.is_client();
        if new && self.undecided_id().is_some() {
            // Streams reach the runtime in the order of their ids: the undecided one cannot wait.
            self.divert_undecided(Why::NewStream);
        }
        if !new {
            if self.undecided_id() == Some(stream) {
                self.divert_undecided(Why::OtherFrame);
            }
            self.trailers(stream, end_stream, block);
            return Ok(());
        }
        self.new_stream(stream, end_stream, req, block);
        Ok(())
    }

    /// A new stream's request, its fields in `client.fields`: refused after crisp's GOAWAY,
    /// relayed through crisp's [`Indexer`], or diverted.
    ///
    /// [`Indexer`]: crate::proxy::http2::Indexer
    fn new_stream(
        &mut self,
        stream: StreamId,
        end_stream: bool,
        req: Request,
        block: &mut Vec<u8>,
    ) {
        let now = self.now;
        self.max_stream = stream;
        self.last_stream_at = now;
        let (route, path) = req
            .path
            .unwrap_or_else(|| (Route::UNKNOWN, http::uri::PathAndQuery::from_static("/")));
        self.last_route = route;
        let call = Call {
            route,
            path,
            received: now,
            deadline: req.timeout.map(|d| now + d),
            id: self.calls.next_id(),
            // Never read here: a relayed call pays nothing for tracing (src/otel.rs).
            trace: None,
        };
        let on_relay = !self.runtime.degraded();
        // What crisp makes of the call, the one step of a new stream that runs code beyond the
        // codec (the interceptors' questions). A panic in it costs this stream only: the
        // client's header block is decoded, crisp's HPACK tables are untouched, nothing of the
        // stream reached the runtime; it is answered INTERNAL and the connection goes on.
        let observed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            observe(self.calls.as_ref(), &call, &self.runtime_path, on_relay)
        }));
        let (interest, conditional, view) = match observed {
            Ok(o) => o,
            Err(_) => {
                self.calls.panicked(
                    route,
                    call.id,
                    "relay core",
                    "the call was answered INTERNAL and its connection goes on",
                );
                self.answer_internal(stream, end_stream);
                return;
            }
        };
        let divert = interest.request || interest.response;
        if self.goaway.last().is_some_and(|last| stream > last) {
            // After crisp's GOAWAY: unprocessed, the client retries it elsewhere.
            RstStream::new(stream, Reason::REFUSED_STREAM).encode(self.out.own());
            return;
        }
        let asked = Asked {
            report: interest.complete,
            view,
        };
        if divert && on_relay && conditional {
            // Routed once its request is read (`undecided.rs`).
            self.defer(stream, call, asked, end_stream);
            return;
        }
        if !divert && on_relay {
            let r = Relayed::new(call, asked, self.record_calls, now);
            self.relay_stream(stream, r, end_stream, Kept::No, block);
            return;
        }
        self.open_diverted(stream, !end_stream);
        // One road: the fields as decoded above, handed on (with the call as the relay saw it:
        // one call id, the arrival time of its headers).
        self.events.push_back(Event::Divert {
            stream,
            call,
            fields: self.client.fields().to_owned(),
            end_stream,
        });
    }

    /// A new stream crisp could not route (it panicked): answered INTERNAL, trailers only, and
    /// reset if the client is still sending its request. Its late frames are crisp's to drop,
    /// as a diverted stream's.
    fn answer_internal(&mut self, stream: StreamId, end_stream: bool) {
        let status = crate::status::Status::internal_fault();
        let mut block = Vec::with_capacity(192);
        http2::encode_field(&mut block, b":status", b"200");
        http2::encode_field(&mut block, b"content-type", b"application/grpc");
        for (n, v) in &status.to_header_map() {
            if n != http::header::CONTENT_TYPE {
                http2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
            }
        }
        http2::headers(self.out.own(), stream, &block, true);
        if !end_stream {
            RstStream::new(stream, Reason::NO_ERROR).encode(self.out.own());
        }
        self.streams.answered_here(stream);
    }

    /// crisp serves `stream` itself from now on (the observed path), its request body still
    /// coming (`body_open`) or not.
    pub(super) fn open_diverted(&mut self, stream: StreamId, body_open: bool) {
        let flow = &mut self.flow;
        flow.open_diverted(stream);
        let answering = |id| flow.is_diverted(id);
        self.streams
            .diverted(stream, body_open, self.max_stream, answering);
    }

    /// A header block on a stream that is not new: trailers (gRPC clients send none, but HTTP/2
    /// allows them), or a protocol error for the runtime to judge.
    fn trailers(&mut self, stream: StreamId, end_stream: bool, block: &mut Vec<u8>) {
        if self.streams.end_body(stream) {
            self.events.push_back(Event::Trailers {
                stream,
                fields: self.client.fields().to_owned(),
            });
            return;
        }
        // Relayed streams only.
        if self.runtime.connected() && self.whose(stream) == Whose::Relayed {
            // Literals that leave the runtime's table alone; owed size updates go first.
            self.client.encode_literal(block);
            http2::headers(&mut self.to_runtime, stream, block, end_stream);
        }
    }
}

// === The undecided stream (`undecided.rs`) and the one way a new stream is relayed ===

impl Core {
    /// Reuses the buffer of re-encoded header blocks for `f`, and keeps it for the next call
    /// unless a huge block grew it.
    fn with_block<R>(&mut self, f: impl FnOnce(&mut Core, &mut Vec<u8>) -> R) -> R {
        let mut block = self.client.block_buffer();
        let r = f(self, &mut block);
        self.client.keep_block_buffer(block);
        r
    }

    /// Sends new stream `stream` on to the runtime, recorded as `r`: its headers through crisp's
    /// encoder (now, so the runtime's HPACK table sees blocks in the order they arrive), with
    /// the fields `kept` says, encoded into `block`; a stream that was undecided, its DATA as
    /// read after them.
    fn relay_stream(
        &mut self,
        stream: StreamId,
        r: Relayed,
        end_stream: bool,
        kept: Kept,
        block: &mut Vec<u8>,
    ) {
        if r.view.is_some() {
            self.viewing += 1;
        }
        self.relayed.insert(stream, r);
        self.streams.relayed(stream);
        let fields = match kept {
            Kept::No => None,
            Kept::Undecided => Some(self.undecided.fields()),
        };
        self.client.encode(fields, block);
        http2::headers(&mut self.to_runtime, stream, block, end_stream);
        if kept == Kept::Undecided {
            self.to_runtime.extend_from_slice(self.undecided.frames());
        }
    }

    /// Keeps new stream `stream` from the runtime until its request is read, its fields in
    /// `client.fields`; decides at once when its HEADERS ended it.
    fn defer(&mut self, stream: StreamId, call: Call, asked: Asked, end_stream: bool) {
        let fields = self.client.fields_mut();
        self.undecided
            .open(stream, call, asked, fields, self.now, end_stream);
        if end_stream {
            self.decide();
        }
    }

    /// The id of the undecided stream, if any.
    pub(super) fn undecided_id(&self) -> Option<StreamId> {
        self.undecided.id()
    }

    /// When the undecided stream is diverted if its request has not ended
    /// ([`Core::poll_timeout`]).
    pub(super) fn undecided_due(&self) -> Option<Instant> {
        self.undecided.due()
    }

    /// A DATA frame of the undecided stream.
    fn undecided_data(&mut self, head: Head, frame: &[u8], credit: &mut u32) {
        match self.undecided.data(head, frame) {
            Step::Wait => {}
            Step::Decide => self.decide(),
            Step::TooLarge => {
                // The observed path reads it, this frame included.
                self.divert_undecided(Why::TooLarge);
                self.client_data(head, frame, credit);
            }
        }
    }

    /// The undecided stream's request has ended: relayed unless an interceptor wants it (or
    /// it is not one uncompressed message, the observed path's to judge).
    fn decide(&mut self) {
        let wanted = match self.undecided.request() {
            Some((call, Some(msg))) => self.calls.wants(call, msg),
            Some((_, None)) => true,
            None => return,
        };
        if wanted {
            self.divert_undecided(Why::Wanted);
            return;
        }
        let Some(d) = self.undecided.take() else {
            return;
        };
        let mut asked = d.asked;
        if let Some(v) = &mut asked.view {
            // The request was read before the decision: what the view sees of it.
            v.request(self.undecided.body());
        }
        let r = Relayed::new(d.call, asked, self.record_calls, d.opened);
        self.with_block(|core, block| {
            core.relay_stream(d.id, r, d.headers_end, Kept::Undecided, block)
        });
    }

    /// Hands the undecided stream to the observed path with what it sent so far; the client gets
    /// the connection credit of its DATA back.
    pub(super) fn divert_undecided(&mut self, why: Why) {
        let Some(d) = self.undecided.take() else {
            return;
        };
        tracing::trace!(target: LOG, stream = d.id.get(), ?why, "undecided stream diverted");
        self.open_diverted(d.id, !d.ended);
        let undecided = &self.undecided;
        self.events.push_back(Event::Divert {
            stream: d.id,
            call: d.call,
            fields: undecided.fields().to_owned(),
            end_stream: d.headers_end,
        });
        if !undecided.body().is_empty() {
            self.events.push_back(Event::Body {
                stream: d.id,
                data: Bytes::copy_from_slice(undecided.body()),
            });
        }
        if d.ended && !d.headers_end {
            self.events.push_back(Event::BodyEnd { stream: d.id });
        }
        if d.credit > 0 {
            WindowUpdate::new(StreamId::CONNECTION, d.credit).encode(self.out.own());
        }
    }

    /// The client reset the undecided stream, or is gone: it never reached anyone; the client
    /// gets the connection credit of its DATA back (unless gone).
    pub(super) fn drop_undecided(&mut self, client_gone: bool) {
        let Some(d) = self.undecided.take() else {
            return;
        };
        if d.credit > 0 && !client_gone {
            WindowUpdate::new(StreamId::CONNECTION, d.credit).encode(self.out.own());
        }
        // Never relayed: nothing of it to view.
        let asked = Asked {
            report: d.asked.report,
            view: None,
        };
        let r = Relayed::new(d.call, asked, self.record_calls, d.opened);
        self.completed(r, EndStatus::cancelled(), self.now);
    }
}

/// Whose fields a stream relayed now carries ([`Core::relay_stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Those of the header block just read (`client.fields`).
    No,
    /// Those an undecided stream kept, and its DATA frames after them.
    Undecided,
}

/// What the interceptors want of a new call, whether it stays undecided until its request is
/// read, and the view it is relayed with if they asked for one ([`Interest::view`]: built only
/// when the call may stay relayed)
///
/// [`Interest::view`]: crate::intercept::Interest::view
///
/// (`may_hold`: the connection relays). A route bypassed after repeated panics is asked
/// nothing: its calls take the plain relay path.
fn observe(
    calls: &dyn super::core::Calls,
    call: &Call,
    runtime: &std::path::Path,
    may_hold: bool,
) -> (crate::intercept::Interest, bool, Option<Box<Viewing>>) {
    if calls.bypassed(call.route) {
        return (crate::intercept::Interest::NONE, false, None);
    }
    #[cfg(feature = "test-util")]
    crate::watchdog::fault::new_stream(runtime, call.route);
    #[cfg(not(feature = "test-util"))]
    let _ = runtime;
    let interest = calls.interest(call);
    let divert = interest.request || interest.response;
    let conditional = divert && may_hold && is_unary(call.route) && calls.conditional(call);
    let view = (interest.view && is_unary(call.route) && (!divert || conditional))
        .then(|| Box::new(Viewing::new(calls.response_view(call))));
    (interest, conditional, view)
}

/// A unary call: one request message, whole before the answer (what an undecided stream waits
/// for).
fn is_unary(route: Route) -> bool {
    route
        .rpc
        .is_some_and(|r| r.kind() != crate::cri::RpcKind::Streaming)
}
