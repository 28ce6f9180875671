//! The undecided stream: a new stream whose route's interest is conditional on its request (job
//! mode's status calls, DESIGN.md §5.2) is kept from the runtime until its request is read, then
//! relayed as it came or diverted with the bytes already read.
//!
//! - At most one stream is undecided per connection, and never for long: a new stream (which
//!   must reach the runtime after it: HTTP/2 opens stream ids in order), any frame on the stream
//!   but DATA, a request over [`MAX_UNDECIDED`] bytes, [`DECIDE_WITHIN`] without its end, or the
//!   runtime going away divert it, as every such call was before. Its reset drops it.
//! - The question, [`Calls::wants`], runs on the relay thread with the request message in place
//!   (no copy, no allocation by the relay; the interceptors' side reads their state without
//!   waiting for I/O).
//! - Flow control: its DATA frames used the runtime's window. Relayed, they reach the runtime as
//!   they are; diverted or dropped, they never do, and the client gets their connection credit
//!   back at once (as for any diverted request body).
//!
//! [`Undecided`] is the core's sub-state for it, as [`super::flow::Flow`] is for windows: it
//! keeps the stream and its bytes and says what a frame makes of it ([`Step`]); the core acts
//! on that (`inbound.rs`).
//!
//! [`Calls::wants`]: super::core::Calls::wants

use std::time::{Duration, Instant};

use super::fields::FieldList;
use super::viewing::Asked;
use crate::intercept::Call;
use crate::proxy::http2::{self, Flags, Head, StreamId};

/// The most bytes of DATA frames (headers and padding included) an undecided stream may send
/// before crisp decides: a status request is about 80 bytes.
pub(crate) const MAX_UNDECIDED: usize = 4 << 10;
/// The longest a stream stays undecided waiting for the end of its request. A client's unary
/// request comes with its headers, in the same write; one that does not is diverted, as before.
pub(crate) const DECIDE_WITHIN: Duration = Duration::from_millis(10);

/// The undecided stream, if any, and buffers reused from one to the next.
#[derive(Default)]
pub(super) struct Undecided {
    stream: Option<Stream>,
    /// Its request fields (swapped with the decoder's list: no copy).
    fields: FieldList,
    /// Its DATA frames as read: relayed as they are.
    frames: Vec<u8>,
    /// Their payloads, padding removed: the request.
    body: Vec<u8>,
}

/// A new stream kept from the runtime until its request is read.
struct Stream {
    id: StreamId,
    call: Call,
    /// What the interceptors asked of it, should it be relayed.
    asked: Asked,
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

/// What the undecided stream's DATA frame makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Kept; the request goes on.
    Wait,
    /// Kept, and the request has ended: time to decide ([`Undecided::request`]).
    Decide,
    /// Not kept: the request is larger than [`MAX_UNDECIDED`]. The stream is diverted, and the
    /// frame handled as one of a diverted stream's.
    TooLarge,
}

/// An undecided stream as it leaves the slot, relayed, diverted or dropped; its fields, DATA
/// frames and request body stay readable in the [`Undecided`] until the next stream.
pub(super) struct Decided {
    pub(super) id: StreamId,
    pub(super) call: Call,
    pub(super) asked: Asked,
    pub(super) opened: Instant,
    pub(super) headers_end: bool,
    pub(super) ended: bool,
    /// The connection window its DATA frames took.
    pub(super) credit: u32,
}

/// Why an undecided stream was diverted, for the log.
#[derive(Debug, Clone, Copy)]
pub(super) enum Why {
    Wanted,
    NewStream,
    OtherFrame,
    TooLarge,
    Slow,
    RuntimeGone,
}

impl Undecided {
    /// Keeps new stream `id`, its request fields swapped in from `fields`, from `now`.
    /// `end_stream`: its HEADERS ended it (time to decide at once).
    pub(super) fn open(
        &mut self,
        id: StreamId,
        call: Call,
        asked: Asked,
        fields: &mut FieldList,
        now: Instant,
        end_stream: bool,
    ) {
        std::mem::swap(fields, &mut self.fields);
        self.frames.clear();
        self.body.clear();
        self.stream = Some(Stream {
            id,
            call,
            asked,
            opened: now,
            until: now + DECIDE_WITHIN,
            headers_end: end_stream,
            ended: end_stream,
            credit: 0,
        });
    }

    /// The undecided stream's id, if there is one.
    pub(super) fn id(&self) -> Option<StreamId> {
        self.stream.as_ref().map(|s| s.id)
    }

    /// When the undecided stream is diverted if its request has not ended.
    pub(super) fn due(&self) -> Option<Instant> {
        self.stream.as_ref().map(|s| s.until)
    }

    /// A DATA frame (`frame`, its header included) of the undecided stream.
    pub(super) fn data(&mut self, head: Head, frame: &[u8]) -> Step {
        let Some(s) = self.stream.as_mut() else {
            return Step::TooLarge;
        };
        if self.frames.len() + frame.len() > MAX_UNDECIDED {
            // Not a small request: the observed path reads it, this frame included.
            return Step::TooLarge;
        }
        s.credit += head.len as u32;
        self.frames.extend_from_slice(frame);
        let payload = &frame[http2::HEADER_LEN..];
        if let Ok(r) = http2::data_payload(&head, payload) {
            self.body.extend_from_slice(&payload[r]);
        }
        if head.has(Flags::END_STREAM) {
            s.ended = true;
            return Step::Decide;
        }
        Step::Wait
    }

    /// The undecided call and, when its request is exactly one uncompressed gRPC message, that
    /// message: what the interceptors read ([`Calls::wants`]). Anything else is the observed
    /// path's to judge.
    ///
    /// [`Calls::wants`]: super::core::Calls::wants
    pub(super) fn request(&self) -> Option<(&Call, Option<&[u8]>)> {
        let s = self.stream.as_ref()?;
        Some((&s.call, grpc_message(&self.body)))
    }

    /// Takes the stream out: it is decided.
    pub(super) fn take(&mut self) -> Option<Decided> {
        let s = self.stream.take()?;
        Some(Decided {
            id: s.id,
            call: s.call,
            asked: s.asked,
            opened: s.opened,
            headers_end: s.headers_end,
            ended: s.ended,
            credit: s.credit,
        })
    }

    /// The last stream's request fields.
    pub(super) fn fields(&self) -> &FieldList {
        &self.fields
    }

    /// The last stream's DATA frames, as read.
    pub(super) fn frames(&self) -> &[u8] {
        &self.frames
    }

    /// The last stream's request body, padding removed.
    pub(super) fn body(&self) -> &[u8] {
        &self.body
    }
}

/// The message of a request body that is exactly one uncompressed gRPC message.
fn grpc_message(body: &[u8]) -> Option<&[u8]> {
    let (prefix, msg) = body.split_at_checked(5)?;
    let len = u32::from_be_bytes(prefix[1..5].try_into().ok()?) as usize;
    (prefix[0] == 0 && len == msg.len()).then_some(msg)
}
