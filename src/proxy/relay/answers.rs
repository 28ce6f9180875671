//! Diverted streams' answers in the core: the [`Command`]s their tasks send through the pump
//! become frames for the client, within the client's windows (`flow.rs`), with credit back to
//! each task as its DATA is written ([`Event::Credit`]).

use std::time::Instant;

use bytes::Bytes;

use super::core::{Core, Event};
use super::flow::{Out, Part};
use crate::proxy::http2::{self, Reason, RstStream, StreamId, WindowUpdate};

/// What a diverted stream's task tells the core (through the pump): its answer, in order, and
/// its end. The core encodes the frames (HPACK literals, as crisp's own blocks), applies the
/// client's windows, and keeps what they do not allow yet ([`super::flow::Flow`]).
#[derive(Debug)]
pub enum Command {
    /// The response headers; `end`: the response has no body (a trailers-only answer).
    Headers {
        stream: StreamId,
        status: http::StatusCode,
        fields: http::HeaderMap,
        end: bool,
    },
    /// Response body bytes; `end`: the last of them (an empty `bytes` may end the stream). At
    /// most [`super::flow::ANSWER_BUDGET`] bytes ahead of the [`Event::Credit`]s come back.
    Data {
        stream: StreamId,
        bytes: Bytes,
        end: bool,
    },
    /// The response trailers; the stream ends.
    Trailers {
        stream: StreamId,
        fields: http::HeaderMap,
    },
    /// The stream is reset (its response failed): what waits of it is dropped.
    Reset { stream: StreamId, reason: Reason },
    /// The observed path read `n` bytes of the request body: the client may send that many
    /// more on the stream.
    Consumed { stream: StreamId, n: usize },
    /// The stream's task ended (after its last command): the stream closes once its answer is
    /// written.
    Finished { stream: StreamId },
}

impl Core {
    /// A diverted stream's task's command at `now` ([`Command`]): its frames are queued after
    /// crisp's own, its DATA within the client's windows.
    pub(crate) fn handle_command(&mut self, cmd: Command, now: Instant) {
        self.now = now;
        match cmd {
            Command::Headers {
                stream,
                status,
                fields,
                end,
            } => {
                let mut block = Vec::with_capacity(256);
                http2::encode_field(&mut block, b":status", status.as_str().as_bytes());
                self.answer_block(stream, Part::Headers, block, &fields, end);
            }
            Command::Trailers { stream, fields } => {
                self.answer_block(stream, Part::Body, Vec::with_capacity(128), &fields, true);
            }
            Command::Data { stream, bytes, end } => {
                self.flow
                    .push(stream, Part::Body, Out::Data(bytes, end), end);
            }
            Command::Reset { stream, reason } => self.reset_answer(stream, reason),
            Command::Consumed { stream, n } => {
                // The client's request body: its stream credit, while crisp still serves it.
                let n = n.min(0x7fff_ffff) as u32;
                if n > 0 && self.flow.is_diverted(stream) {
                    WindowUpdate::new(stream, n).encode(self.out.own());
                }
            }
            Command::Finished { stream } => self.flow.finish(stream),
        }
        self.flush_diverted();
    }

    /// Queues a diverted stream's header block: `block` (its `:status`, if any) and `fields`.
    fn answer_block(
        &mut self,
        stream: StreamId,
        part: Part,
        mut block: Vec<u8>,
        fields: &http::HeaderMap,
        end: bool,
    ) {
        for (n, v) in fields {
            http2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
        }
        let mut out = Vec::with_capacity(block.len() + 16);
        http2::headers(&mut out, stream, &block, end);
        self.flow.push(stream, part, Out::Frames(out), end);
    }

    /// Resets a diverted stream whose answer has not ended: what waits of it is dropped, and
    /// the stream closes (once).
    fn reset_answer(&mut self, stream: StreamId, reason: Reason) {
        if self.flow.answer_open(stream) && self.flow.close_diverted(stream) {
            RstStream::new(stream, reason).encode(self.out.own());
        }
    }

    /// Writes what the diverted streams may send now to crisp's frames for the client; each
    /// stream's task gets the DATA bytes written back as credit ([`Event::Credit`]).
    pub(super) fn flush_diverted(&mut self) {
        let events = &mut self.events;
        self.flow.flush(self.out.own(), |stream, n| {
            events.push_back(Event::Credit { stream, n })
        });
    }
}
