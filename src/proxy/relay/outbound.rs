//! Runtime → client: the core's handling of the runtime's frames, written to the client as
//! they are.

use super::LOG;
use std::time::Instant;

use bytes::{Buf, BytesMut};

use super::core::{Core, PendingBlock, Sink};
use super::error::{RelayError, Violation};
use super::status::{Code, EndStatus};
use crate::proxy::http2::{self, Flags, GoAway, Head, Kind, Reason, Settings, StreamId};
use crate::status::{runtime_lost, RuntimeLoss};

impl Core {
    /// Relays the complete frames at the start of `buf` (just read from the runtime), written to
    /// `client` straight from it: the runtime's frames pass through unchanged, so they are never
    /// copied in user space (unless the client's socket is full). Returns true when it stopped
    /// at a DATA frame the client has no window for: that frame stays at the start of `buf`,
    /// for the next call once the client's credit came. `now`: when the bytes were read. Calls
    /// that ended are reported ([`super::core::Event::Ended`]) once their last bytes went
    /// out: the metrics and the tap are not on the answer's way to the client.
    pub(crate) fn runtime_bytes(
        &mut self,
        buf: &mut BytesMut,
        client: &mut impl Sink,
        now: Instant,
    ) -> Result<bool, RelayError> {
        self.now = now;
        // buf[..pos]: frames checked and due to the client, not yet written.
        let mut pos = 0;
        // Room still missing for a frame that has only partly arrived.
        let mut missing = 0;
        while let Some(head) = http2::complete_at(buf, pos, &mut missing) {
            let len = http2::HEADER_LEN + head.len;
            let next = self
                .runtime_frame(head, &buf[pos + http2::HEADER_LEN..pos + len])
                .map_err(|v| self.protocol_error(v))?;
            match next {
                Next::Relay => pos += len,
                Next::WaitForWindow => {
                    // Not within what the client has left: send what is before it and wait for
                    // the client's credit.
                    flush(buf, &mut pos, client)?;
                    return Ok(true);
                }
                Next::GoAway {
                    last,
                    reason,
                    debug,
                } => {
                    // Frames before it go first. The GOAWAY itself is not relayed: the client's
                    // connection is crisp's, and stays up (see `Core::maybe_move_client`).
                    flush(buf, &mut pos, client)?;
                    buf.advance(len);
                    self.runtime_goaway(last, reason, &debug);
                }
            }
        }
        flush(buf, &mut pos, client)?;
        // After the flush, so that the bytes already written are not carried into a new buffer.
        buf.reserve(missing);
        Ok(false)
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
                    self.from_runtime.pending = Some(PendingBlock {
                        stream: head.stream,
                        end_stream,
                        block: payload[r].to_vec(),
                    });
                }
            }
            Kind::Continuation => {
                if let Some(mut p) = self.from_runtime.pending.take() {
                    p.block.extend_from_slice(payload);
                    if head.has(Flags::END_HEADERS) {
                        self.response_block(p.stream, p.end_stream, &p.block);
                    } else {
                        self.from_runtime.pending = Some(p);
                    }
                }
            }
            Kind::RstStream => self.end_relayed(head.stream, EndStatus::cancelled()),
            Kind::Ping if head.has(Flags::ACK) => self.pings.acked(),
            // The client's oldest unacknowledged SETTINGS now apply on its side too: the ACK is
            // written (with the frames before it) before any DATA of crisp's own that counts on
            // them (crisp's frames go out after this batch).
            Kind::Settings if head.has(Flags::ACK) => self.runtime_acked_settings(),
            // The runtime's own settings go on to the client unchanged; its header table size is
            // also the bound of crisp's table on this connection ([`http2::Indexer`]).
            Kind::Settings => {
                // Relayed, it is the client's server preface: crisp's own frames may follow it.
                self.preface_sent = true;
                if let Ok(s) = Settings::load(&head, payload) {
                    if let Some(size) = s.header_table_size {
                        self.from_runtime.table_size = Some(size);
                    }
                    // The client may send frames as large as the runtime says it accepts (an
                    // invalid value is the client's to reject: it changes nothing here).
                    if let Some(max) = s
                        .max_frame_size
                        .filter(|m| (http2::MAX_FRAME as u32..=http2::MAX_FRAME_LIMIT).contains(m))
                    {
                        self.client.max_frame = self.client.max_frame.max(max);
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
        if reason == Reason::ENHANCE_YOUR_CALM {
            tracing::warn!(
                target: LOG,
                upstream = %self.runtime_name,
                last_stream = last.get(),
                error_code = reason.0,
                debug_data = %debug_data,
                "runtime sent GOAWAY ENHANCE_YOUR_CALM (it judged this connection's PINGs too frequent); moving this client to a new connection"
            );
        } else {
            tracing::info!(
                target: LOG,
                upstream = %self.runtime_name,
                last_stream = last.get(),
                error_code = reason.0,
                debug_data = %debug_data,
                "runtime sent GOAWAY; moving this client to a new connection"
            );
        }
        let msg = runtime_lost(Some(&self.runtime_name), RuntimeLoss::Closed);
        self.runtime_gone(&msg, Some(last));
    }

    fn response_block(&mut self, stream: StreamId, end_stream: bool, block: &[u8]) {
        let mut status = None;
        let decoded = self.from_runtime.dec.decode(block, |n, v| {
            if n == b"grpc-status" {
                status = Code::parse(v);
            }
        });
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

/// Writes `buf[..pos]` to the client and drops it from `buf`.
fn flush(buf: &mut BytesMut, pos: &mut usize, client: &mut impl Sink) -> Result<(), RelayError> {
    if *pos > 0 {
        client.write(&buf[..*pos])?;
        buf.advance(*pos);
        *pos = 0;
    }
    Ok(())
}
