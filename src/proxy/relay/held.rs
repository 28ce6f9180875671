//! Held streams: a new stream whose route's interest is conditional on its request (job mode's
//! status calls, DESIGN.md §5.2) is kept from the runtime until its request is read, then
//! relayed as it came or diverted with the bytes already read.
//!
//! - At most one stream is held per connection, and never for long: a new stream (which must
//!   reach the runtime after it: HTTP/2 opens stream ids in order), any frame on the held stream
//!   but DATA, a request over [`MAX_HELD`] bytes, [`HOLD_MAX`] without its end, or the runtime
//!   going away divert it, as every such call was before. The reset of a held stream drops it.
//! - The question, [`Calls::wants`], runs on the relay thread with the request message in place
//!   (no copy, no allocation by the relay; the interceptors' side reads their state without
//!   waiting for I/O).
//! - Flow control: held DATA frames used the runtime's window. Relayed, they reach the runtime as
//!   they are; diverted or dropped, they never do, and the client gets their connection credit
//!   back at once (as for any diverted request body).
//!
//! [`Calls::wants`]: super::core::Calls::wants

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::core::{Core, Event, Relayed};
use super::fields::FieldList;
use super::status::EndStatus;
use crate::cri::Route;
use crate::intercept::Call;
use crate::proxy::http2::{self, Flags, Head, StreamId, WindowUpdate};

/// The most bytes of DATA frames (headers and padding included) a held stream may send before
/// crisp decides: a status request is about 80 bytes.
pub(crate) const MAX_HELD: usize = 4 << 10;
/// The longest a stream is held waiting for the end of its request. A client's unary request
/// comes with its headers, in the same write; one that does not is diverted, as before.
pub(crate) const HOLD_MAX: Duration = Duration::from_millis(10);

/// The held stream, and buffers reused from one to the next.
#[derive(Default)]
pub(super) struct Peek {
    pub(super) stream: Option<HeldStream>,
    /// The held stream's request fields (swapped with the decoder's list: no copy).
    pub(super) fields: FieldList,
    /// Its DATA frames as read: relayed as they are.
    frames: Vec<u8>,
    /// Their payloads, padding removed: the request.
    body: Vec<u8>,
}

/// A new stream kept from the runtime until its request is read.
pub(super) struct HeldStream {
    pub(super) id: StreamId,
    call: Call,
    /// The interceptors want to hear of its end.
    report: bool,
    route: Route,
    opened: Instant,
    /// When it is diverted if its request has not ended.
    until: Instant,
    /// Its HEADERS ended the stream (a request without a body).
    headers_end: bool,
    /// The request ended (END_STREAM seen).
    ended: bool,
    /// The connection window its DATA frames took.
    credit: u32,
}

/// Why a held stream was diverted, for the log.
#[derive(Debug, Clone, Copy)]
pub(super) enum Why {
    Wanted,
    NewStream,
    OtherFrame,
    TooLarge,
    Slow,
    RuntimeGone,
}

impl Core {
    /// Holds new stream `stream`, its fields in `client.fields`; decides at once when its
    /// HEADERS ended it.
    pub(super) fn hold(&mut self, stream: StreamId, call: Call, report: bool, end_stream: bool) {
        let peek = &mut self.client.peek;
        std::mem::swap(&mut self.client.fields, &mut peek.fields);
        peek.frames.clear();
        peek.body.clear();
        peek.stream = Some(HeldStream {
            id: stream,
            route: call.route,
            call,
            report,
            opened: self.now,
            until: self.now + HOLD_MAX,
            headers_end: end_stream,
            ended: end_stream,
            credit: 0,
        });
        if end_stream {
            self.decide();
        }
    }

    /// The id of the held stream, if any.
    pub(super) fn held_id(&self) -> Option<StreamId> {
        self.client.peek.stream.as_ref().map(|h| h.id)
    }

    /// When the held stream is diverted if its request has not ended
    /// ([`Core::poll_timeout`]).
    pub(super) fn held_due(&self) -> Option<Instant> {
        self.client.peek.stream.as_ref().map(|h| h.until)
    }

    /// A DATA frame of the held stream.
    pub(super) fn held_data(&mut self, head: Head, frame: &[u8], credit: &mut u32) {
        if self.client.peek.frames.len() + frame.len() > MAX_HELD {
            // Not a small request: the observed path reads it, this frame included.
            self.divert_held(Why::TooLarge);
            self.client_data(head, frame, credit);
            return;
        }
        let peek = &mut self.client.peek;
        let h = peek.stream.as_mut().expect("called for the held stream");
        h.credit += head.len as u32;
        peek.frames.extend_from_slice(frame);
        let payload = &frame[http2::HEADER_LEN..];
        if let Ok(r) = http2::data_payload(&head, payload) {
            peek.body.extend_from_slice(&payload[r]);
        }
        if head.has(Flags::END_STREAM) {
            h.ended = true;
            self.decide();
        }
    }

    /// The held stream's request has ended: relayed unless an interceptor wants it.
    fn decide(&mut self) {
        let peek = &self.client.peek;
        let h = peek.stream.as_ref().expect("a held stream");
        // One uncompressed message, whole: what the interceptors read. Anything else is the
        // observed path's to judge, as before.
        let wanted = match grpc_message(&peek.body) {
            Some(msg) => self.calls.wants(&h.call, msg),
            None => true,
        };
        if wanted {
            self.divert_held(Why::Wanted);
        } else {
            self.relay_held();
        }
    }

    /// Sends the held stream on to the runtime: its headers through crisp's encoder (now, so
    /// the runtime's HPACK table sees blocks in the order they arrive), its DATA as read.
    fn relay_held(&mut self) {
        let Some(h) = self.client.peek.stream.take() else {
            return;
        };
        self.relayed.insert(
            h.id,
            Relayed {
                call: (h.report || self.record_calls).then_some(h.call),
                report: h.report,
                answered: false,
                route: h.route,
                opened: h.opened,
            },
        );
        let client = &mut self.client;
        client.max_relayed = h.id;
        let mut block = std::mem::take(&mut client.enc);
        block.clear();
        client.indexer.begin(&mut block);
        for (n, v) in client.peek.fields.iter() {
            client.indexer.field(&mut block, n, v);
        }
        http2::headers(&mut self.to_runtime, h.id, &block, h.headers_end);
        self.to_runtime.extend_from_slice(&client.peek.frames);
        if block.capacity() <= 64 << 10 {
            client.enc = block;
        }
        client.peek.frames.clear();
        client.peek.body.clear();
    }

    /// Hands the held stream to the observed path with what it sent so far; the client gets the
    /// connection credit of its DATA back.
    pub(super) fn divert_held(&mut self, why: Why) {
        let Some(h) = self.client.peek.stream.take() else {
            return;
        };
        tracing::trace!(target: super::LOG, stream = h.id.get(), ?why, "held stream diverted");
        self.open_diverted(h.id);
        let peek = &mut self.client.peek;
        self.events.push_back(Event::Divert {
            stream: h.id,
            call: h.call,
            fields: peek.fields.to_owned(),
            end_stream: h.headers_end,
        });
        if !peek.body.is_empty() {
            self.events.push_back(Event::Body {
                stream: h.id,
                data: Bytes::copy_from_slice(&peek.body),
            });
        }
        if h.ended && !h.headers_end {
            self.events.push_back(Event::BodyEnd { stream: h.id });
        } else if !h.ended {
            self.client.bodies.insert(h.id);
        }
        peek.frames.clear();
        peek.body.clear();
        if h.credit > 0 {
            WindowUpdate::new(StreamId::CONNECTION, h.credit).encode(&mut self.to_client);
        }
    }

    /// The client reset the held stream, or is gone: it never reached anyone; the client gets
    /// the connection credit of its DATA back (unless gone).
    pub(super) fn drop_held(&mut self, client_gone: bool) {
        let Some(h) = self.client.peek.stream.take() else {
            return;
        };
        self.client.peek.frames.clear();
        self.client.peek.body.clear();
        if h.credit > 0 && !client_gone {
            WindowUpdate::new(StreamId::CONNECTION, h.credit).encode(&mut self.to_client);
        }
        let r = Relayed {
            call: (h.report || self.record_calls).then_some(h.call),
            report: h.report,
            answered: false,
            route: h.route,
            opened: h.opened,
        };
        self.completed(r, EndStatus::cancelled(), self.now);
    }
}

/// The message of a request body that is exactly one uncompressed gRPC message.
fn grpc_message(body: &[u8]) -> Option<&[u8]> {
    let (prefix, msg) = body.split_at_checked(5)?;
    let len = u32::from_be_bytes(prefix[1..5].try_into().ok()?) as usize;
    (prefix[0] == 0 && len == msg.len()).then_some(msg)
}
