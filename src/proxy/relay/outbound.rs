//! Runtime → client: the core's handling of the runtime's frames, relayed to the client as they
//! are, from the read buffer the core owns.

use super::LOG;
use std::time::Instant;

use super::core::Core;
use super::error::{RelayError, Violation};
use super::status::{Code, EndStatus};
use crate::proxy::http2::{self, Flags, GoAway, Head, Kind, Reason, Settings, StreamId};
use crate::status::{runtime_lost, RuntimeLoss};

impl Core {
    /// Handles the runtime's bytes the shell just read into [`Core::runtime_buffer`] at `now`.
    /// The runtime's frames pass through unchanged: each complete one is checked where it lies
    /// and placed for the client ([`Core::poll_transmit_client`] gives them as slices of the
    /// buffer, so they are never copied in user space, unless the client's socket is full). A
    /// DATA frame the client has no window for stops the handling there: it and what follows
    /// stay in the buffer ([`Core::runtime_waits`]) until the client's credit comes. Calls that
    /// ended are reported ([`super::core::Event::Ended`]); the shell writes the client's bytes
    /// before it acts on the events, so the metrics and the tap are not on the answer's way.
    pub(crate) fn handle_runtime_bytes(&mut self, now: Instant) -> Result<(), RelayError> {
        self.now = now;
        self.runtime_frames()
    }

    /// The complete frames of the read buffer not handled yet, in order. crisp's own frames
    /// staged before them go first; those staged while a frame is handled go after it (the
    /// client's SETTINGS ACK before crisp's DATA that counts on it), and none inside a header
    /// block ([`Core::may_write_own`]).
    pub(super) fn runtime_frames(&mut self) -> Result<(), RelayError> {
        self.from_runtime.set_waits(false);
        let (buf, mut pos) = self.out.take_runtime();
        // Room still missing for a frame that has only partly arrived.
        let mut missing = 0;
        let mut r = Ok(());
        if self.may_write_own() {
            self.out.place_own();
        }
        while let Some(head) = http2::complete_at(&buf, pos, &mut missing) {
            let len = http2::HEADER_LEN + head.len;
            match self.runtime_frame(head, &buf[pos + http2::HEADER_LEN..pos + len]) {
                Ok(Next::Relay) => self.out.relay_runtime(len),
                Ok(Next::WaitForWindow) => {
                    // Not within what the client has left: it waits for the client's credit.
                    self.from_runtime.set_waits(true);
                    break;
                }
                Ok(Next::GoAway {
                    last,
                    reason,
                    debug,
                }) => {
                    // Not relayed: the client's connection is crisp's, and stays up (see
                    // `Core::handle_runtime_probe`). Frames before it go first.
                    self.out.skip_runtime(len);
                    self.runtime_goaway(last, reason, &debug);
                }
                Err(v) => {
                    r = Err(self.protocol_error(v));
                    break;
                }
            }
            pos += len;
            if self.out.staged() && self.may_write_own() {
                self.out.place_own();
            }
        }
        self.out.put_runtime(buf, missing);
        r
    }

    /// One complete frame from the runtime (`payload`: its payload): what the core learns from
    /// it, and what becomes of it.
    fn runtime_frame(&mut self, head: Head, payload: &[u8]) -> Result<Next, Violation> {
        match head.kind {
            Kind::Data => {
                self.pings.runtime_wrote();
                let n = head.len as i64;
                if n > 0 && !self.flow.take_for_runtime(n) {
                    return Ok(Next::WaitForWindow);
                }
                if let Some(v) = self.view_of(head.stream) {
                    if let Ok(r) = http2::data_payload(&head, payload) {
                        v.response(&payload[r]);
                    }
                }
                if head.has(Flags::END_STREAM) {
                    self.end_relayed(head.stream, EndStatus::without_status());
                }
            }
            Kind::Headers => {
                self.pings.runtime_wrote();
                let r = http2::header_fragment(&head, payload).map_err(Violation::RuntimeFrame)?;
                let end_stream = head.has(Flags::END_STREAM);
                if head.has(Flags::END_HEADERS) {
                    self.response_block(head.stream, end_stream, &payload[r]);
                } else {
                    self.from_runtime
                        .begin_block(head.stream, end_stream, &payload[r]);
                }
            }
            Kind::Continuation => {
                if let Some(b) = self.from_runtime.continuation(&head, payload) {
                    self.response_block(b.stream, b.end_stream, &b.block);
                }
            }
            Kind::RstStream => self.end_relayed(head.stream, EndStatus::cancelled()),
            Kind::Ping if head.has(Flags::ACK) => self.pings.acked(),
            // The client's oldest unacknowledged SETTINGS now apply on its side too: crisp's
            // DATA that counts on them is staged now, and so placed after the ACK
            // (`Core::runtime_frames`; tested in `relay/tests/order.rs`).
            Kind::Settings if head.has(Flags::ACK) => self.runtime_acked_settings(),
            // The runtime's own settings go on to the client unchanged; its header table size is
            // also the bound of crisp's table on this connection ([`http2::Indexer`]).
            Kind::Settings => {
                // Relayed, it is the client's server preface: crisp's own frames may follow it.
                self.preface_sent = true;
                if let Ok(s) = Settings::load(&head, payload) {
                    if let Some(size) = s.header_table_size {
                        self.from_runtime.table_size(size);
                    }
                    // The client may send frames as large as the runtime says it accepts (an
                    // invalid value is the client's to reject: it changes nothing here).
                    if let Some(max) = s
                        .max_frame_size
                        .filter(|m| (http2::MAX_FRAME as u32..=http2::MAX_FRAME_LIMIT).contains(m))
                    {
                        self.client.runtime_max_frame(max);
                    }
                }
            }
            // A malformed GOAWAY (shorter than 8 bytes) goes on to the client, as any frame crisp
            // does not read.
            Kind::GoAway => {
                if let Ok(g) = GoAway::load(payload) {
                    return Ok(Next::GoAway {
                        last: g.last_stream,
                        reason: g.reason,
                        debug: String::from_utf8_lossy(g.debug_data).into_owned(),
                    });
                }
            }
            _ => {}
        }
        Ok(Next::Relay)
    }

    fn runtime_acked_settings(&mut self) {
        if self.flow.settings_acked() {
            self.flush_diverted();
        }
    }

    /// The runtime's GOAWAY: calls it will not process end (refused), new streams are diverted
    /// until the client moves to a new connection.
    fn runtime_goaway(&mut self, last: StreamId, reason: Reason, debug_data: &str) {
        // One line, at a level fixed where it is written: a warning when the runtime judged
        // crisp's PINGs too frequent, else news.
        macro_rules! log {
            ($level:ident, $text:literal) => {
                tracing::$level!(
                    target: LOG,
                    runtime = %self.runtime_name,
                    last_stream = last.get(),
                    error_code = reason.0,
                    debug_data = %debug_data,
                    $text
                )
            };
        }
        if reason == Reason::ENHANCE_YOUR_CALM {
            log!(
                warn,
                "runtime sent GOAWAY ENHANCE_YOUR_CALM (it judged this connection's PINGs too frequent); moving this client to a new connection"
            );
        } else {
            log!(
                info,
                "runtime sent GOAWAY; moving this client to a new connection"
            );
        }
        let msg = runtime_lost(Some(&self.runtime_name), RuntimeLoss::Closed);
        self.runtime_gone(&msg, Some(last));
    }

    fn response_block(&mut self, stream: StreamId, end_stream: bool, block: &[u8]) {
        let mut status = None;
        // A viewed call's grpc-message too (copied out: the view is the core's, as is the
        // table that decodes it).
        let viewed = self.view_of(stream).is_some();
        let mut message = None;
        let decoded = self.from_runtime.decode(block, |n, v| {
            if n == b"grpc-status" {
                status = Code::parse(v);
            } else if viewed && n == b"grpc-message" {
                message = Some(v.to_vec());
            }
        });
        if let (Some(m), Some(view)) = (message, self.view_of(stream)) {
            view.message(&m);
        }
        if let Err(e) = decoded {
            // The client will fail the same way on these bytes; crisp only loses the code.
            tracing::warn!(
                target: LOG,
                error = %e,
                "runtime sent a header block crisp cannot decode"
            );
        }
        if end_stream {
            self.end_relayed(stream, EndStatus::answered(status));
        } else if let Some(r) = self.relayed.get_mut(&stream) {
            r.answered = true;
        }
    }

    /// Ends a relayed call.
    fn end_relayed(&mut self, stream: StreamId, status: EndStatus) {
        if let Some(r) = self.relayed.remove(&stream) {
            let at = self.now;
            self.completed(r, status, at);
        }
    }
}

/// What becomes of one of the runtime's frames.
enum Next {
    /// It goes on to the client.
    Relay,
    /// A DATA frame the client has no window for: it waits, and so does what follows it.
    WaitForWindow,
    /// The runtime's GOAWAY: crisp's to act on, not relayed.
    GoAway {
        last: StreamId,
        reason: Reason,
        debug: String,
    },
}
