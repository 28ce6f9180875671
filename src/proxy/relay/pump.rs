//! The relay thread: a `poll(2)` loop around one connection's [`Core`] and its two sockets.

use crate::status::{runtime_lost, RuntimeLoss};
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::answers::Command;
use super::bridge::{Diverted, Outbox, Service};
use super::core::{Core, Event, CALLS};
use super::error::{RelayError, RuntimeFailure};
use super::LOG;
use crate::intercept::Outcome;
use crate::proxy::sock::{self, Sock};
use crate::watchdog::Beat;

/// What the pump asks `poll` for on its two sockets. Backpressure as in a splice: a peer is
/// not read while the other has bytes of it queued (nor the runtime while its next DATA frame
/// waits for the client's window), and a socket is watched for writing only while bytes wait
/// for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Interest {
    pub(super) read_client: bool,
    pub(super) write_client: bool,
    pub(super) read_runtime: bool,
    pub(super) write_runtime: bool,
}

impl Interest {
    /// From what the pump's state says: bytes queued for the client; the runtime connection
    /// (None: there is none) and whether bytes are queued for it; `waits`: the runtime's next
    /// DATA frame waits for the client's window ([`Core::runtime_waits`]).
    pub(super) fn of(client_queued: bool, runtime: Option<bool>, waits: bool) -> Interest {
        Interest {
            read_client: runtime != Some(true),
            write_client: client_queued,
            read_runtime: runtime.is_some() && !client_queued && !waits,
            write_runtime: runtime == Some(true),
        }
    }
}

/// How long `poll` waits when the core has no timer: a wakeup a day, for nothing.
const NO_TIMER: Duration = Duration::from_secs(24 * 3600);

/// One connection on its relay thread: the core, the sockets and their buffers.
pub(crate) struct Pump {
    pub(super) core: Core,
    service: Arc<dyn Service>,
    outbox: Arc<Outbox>,
    pub(super) diverted: Diverted,
    client: Sock,
    /// None: no runtime connection (never made, or failed); GOAWAY leaves it in place.
    runtime: Option<Sock>,
    /// The runtime's socket, to see whether it accepts connections again.
    runtime_path: std::path::PathBuf,
    /// What the client sent and was not handled yet (a partial frame). The runtime's bytes are
    /// read into the core's own buffer ([`Core::runtime_buffer`]).
    cbuf: BytesMut,
    /// When `poll` last returned: the time of what was read then.
    now: Instant,
    /// The diverted streams' commands, moved from the outbox into the core (reused).
    commands: VecDeque<Command>,
    /// Where this thread tells the watchdog that it turns.
    beat: Arc<Beat>,
    /// Splice the connection, the core left out (`splice.rs`).
    splice: bool,
}

/// A connection's two sockets (the runtime's, when it has one) and the runtime's path.
pub(crate) struct Peers {
    pub(crate) client: Sock,
    pub(crate) runtime: Option<Sock>,
    pub(crate) runtime_path: std::path::PathBuf,
}

impl Pump {
    pub(crate) fn new(
        core: Core,
        service: Arc<dyn Service>,
        outbox: Arc<Outbox>,
        diverted: Diverted,
        peers: Peers,
        beat: Arc<Beat>,
        splice: bool,
    ) -> Pump {
        let Peers {
            client,
            runtime,
            runtime_path,
        } = peers;
        Pump {
            core,
            service,
            outbox,
            diverted,
            client,
            runtime,
            runtime_path,
            cbuf: BytesMut::with_capacity(64 << 10),
            now: Instant::now(),
            commands: VecDeque::new(),
            beat,
            splice,
        }
    }

    /// Relays until the client goes, or until crisp's GOAWAY has drained the connection.
    ///
    /// Backpressure as in a splice: the client is not read while the runtime has bytes of it
    /// queued, nor the runtime while the client has; a socket neither read nor written is left
    /// out of the `poll` (a hung-up peer would otherwise make it return at once, forever).
    pub(crate) fn run(&mut self) -> Result<(), RelayError> {
        if let (true, Some(runtime)) = (self.splice, self.runtime.as_mut()) {
            return Ok(super::splice::run(&mut self.client, runtime, &self.outbox)?);
        }
        let outbox = self.outbox.clone();
        let mut stopping = false;
        loop {
            if outbox.kill.load(Ordering::Acquire) {
                return Ok(());
            }
            if !stopping && outbox.stop.load(Ordering::Acquire) {
                stopping = true;
                self.core.handle_goaway(b"crisp: shutting down");
            }
            self.commands();
            // The core's frames for the client (crisp's own, after a command or the timers).
            self.transmit_client()?;
            if self.core.drained() && !self.client.has_queued() && outbox.is_empty() {
                self.client.shutdown_write();
                return Ok(());
            }
            let want = Interest::of(
                self.client.has_queued(),
                self.runtime.as_ref().map(Sock::has_queued),
                self.core.runtime_waits(),
            );
            let (read_client, read_runtime) = (want.read_client, want.read_runtime);
            let mut fds = [
                sock::poll_entry(Some(self.client.as_fd()), read_client, want.write_client),
                sock::poll_entry(Some(outbox.wake.as_fd()), true, false),
                match &self.runtime {
                    Some(r) => sock::poll_entry(Some(r.as_fd()), read_runtime, want.write_runtime),
                    None => sock::poll_entry(None, false, false),
                },
            ];
            // The core's timer, read once per wakeup and measured from the clock read after the
            // last poll (the work since then is a few µs). A deadline the reads below set is
            // never due at once (the undecided stream's is 10 ms away); one that is due (the
            // keep-alive's, once crisp may write again) makes the next poll return at once.
            let deadline = self.core.poll_timeout();
            let timeout = deadline.map_or(NO_TIMER, |at| at.saturating_duration_since(self.now));
            self.beat.waiting();
            self.beat.calls(self.core.calls_in_flight());
            sock::poll(&mut fds, timeout)?;
            self.now = Instant::now();
            self.beat.working(self.now);
            if self.beat.report_wanted() {
                self.report();
            }
            let [c, w, r] = fds.map(|p| p.revents);
            if w != 0 {
                outbox.wake.drain();
            }
            if !self.ready(c, read_client, r, read_runtime)? {
                return Ok(());
            }
            if deadline.is_some_and(|at| self.now >= at) {
                let r = self.core.handle_timeout(self.now);
                self.closing(r)?;
                self.dispatch();
            }
        }
    }

    /// Writes what the core has for the client, in the order it gives it: the runtime's frames
    /// (slices of the core's read buffer) and crisp's own. The socket takes it all (what the peer
    /// has no room for is queued, `Sock::write`), so nothing waits in the core at `poll`.
    fn transmit_client(&mut self) -> Result<(), RelayError> {
        while let Some(bytes) = self.core.poll_transmit_client() {
            let n = bytes.len();
            self.client.write(bytes)?;
            self.core.advance_client(n, self.now);
        }
        Ok(())
    }

    /// On the core's error (the connection closes): what it still has for the client (the
    /// GOAWAY of a protocol error) goes out if it can.
    fn closing(&mut self, r: Result<(), RelayError>) -> Result<(), RelayError> {
        if r.is_err() {
            let _ = self.transmit_client();
        }
        r
    }

    /// Hands the diverted streams' commands to the core; a finished task leaves the map.
    fn commands(&mut self) {
        self.outbox.take(&mut self.commands);
        if self.commands.is_empty() {
            return;
        }
        while let Some(cmd) = self.commands.pop_front() {
            if let Command::Finished { stream } = cmd {
                self.diverted.finished(stream);
            }
            self.core.handle_command(cmd, self.now);
        }
        self.dispatch();
    }

    /// Answers the admin socket's question about this connection ([`crate::watchdog`]).
    fn report(&self) {
        let mut r = self.core.report(self.now);
        r.queued_to_client = self.client.queued_len();
        r.queued_to_runtime = self.runtime.as_ref().map_or(0, Sock::queued_len);
        self.beat.report(r);
    }

    /// Handles what `poll` found on the client's (`c`) and the runtime's (`r`) socket; false
    /// when the client has gone.
    fn ready(
        &mut self,
        c: i16,
        read_client: bool,
        r: i16,
        read_runtime: bool,
    ) -> Result<bool, RelayError> {
        const GONE: i16 = libc::POLLHUP | libc::POLLERR;
        if c & libc::POLLOUT != 0 || (c & GONE != 0 && self.client.has_queued()) {
            self.client.flush()?;
        }
        if r & (libc::POLLOUT | GONE) != 0 && self.runtime.as_ref().is_some_and(Sock::has_queued) {
            if let Err(e) = self.runtime.as_mut().expect("checked").flush() {
                self.runtime_failed(RuntimeFailure::Write(e))?;
            }
        }
        if c & (libc::POLLIN | GONE) != 0 && read_client {
            match self.client.recv(&mut self.cbuf) {
                Ok(0) => return Ok(false),
                Ok(_) => self.handle_client_read()?,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e.into()),
            }
        }
        if r & (libc::POLLIN | GONE) != 0 && read_runtime && self.runtime.is_some() {
            let runtime = self.runtime.as_mut().expect("checked");
            match runtime.recv(self.core.runtime_buffer()) {
                Ok(0) => self.runtime_failed(RuntimeFailure::Closed)?,
                Ok(_) => {
                    let r = self.core.handle_runtime_bytes(self.now);
                    self.closing(r)?;
                    // The answer's bytes first: the events (the tap, the metrics) are not on
                    // their way to the client.
                    self.transmit_client()?;
                    self.dispatch();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => self.runtime_failed(RuntimeFailure::Read(e))?,
            }
        }
        Ok(true)
    }

    /// Handles what was just read from the client and writes what goes on to the runtime.
    fn handle_client_read(&mut self) -> Result<(), RelayError> {
        let r = self.core.handle_client_bytes(&mut self.cbuf, self.now);
        self.dispatch();
        // A GOAWAY crisp wrote for the client's error goes out if it can.
        self.closing(r)?;
        // The runtime's DATA that waited for the client's credit, with crisp's own frames.
        self.transmit_client()?;
        if let Some(frames) = self.core.poll_transmit_runtime() {
            let n = frames.len();
            let written = match self.runtime.as_mut() {
                Some(rt) => rt.write(frames),
                None => Ok(()),
            };
            self.core.advance_runtime(n);
            if let Err(e) = written {
                self.runtime_failed(RuntimeFailure::Write(e))?;
            }
        }
        if self.cbuf.capacity() > 1 << 20 && self.cbuf.is_empty() {
            self.cbuf = BytesMut::with_capacity(64 << 10);
        }
        Ok(())
    }

    /// Acts on what the core decided: diverted streams start (on crisp's runtime), their bodies
    /// move on, ended calls are reported.
    pub(super) fn dispatch(&mut self) {
        while let Some(ev) = self.core.poll_event() {
            match ev {
                Event::ProbeRuntime => {
                    // Without waiting: a runtime that stopped accepting must not stop the
                    // thread (`sock::accepts_connections`).
                    let reachable = sock::accepts_connections(&self.runtime_path);
                    self.core.handle_runtime_probe(self.now, reachable);
                }
                Event::Divert {
                    stream,
                    call,
                    fields,
                    end_stream,
                } => self.diverted.start(stream, call, fields, end_stream),
                Event::Body { stream, data } => self.diverted.body(stream, data),
                Event::BodyEnd { stream } => self.diverted.body_end(stream),
                Event::Trailers { stream, fields } => self.diverted.trailers(stream, fields),
                Event::Reset { stream } => self.diverted.abort(stream),
                Event::Credit { stream, n } => self.diverted.credit(stream, n),
                Event::Ended {
                    call,
                    status,
                    at,
                    report,
                    viewed,
                } => {
                    let duration = at.saturating_duration_since(call.received);
                    tracing::debug!(
                        target: CALLS,
                        call = call.id,
                        rpc = %call.route,
                        path = call.path.as_str(),
                        code = ?status.code.map(|c| c.0),
                        duration_us = duration.as_micros() as u64,
                        "relayed call ended"
                    );
                    if !report {
                        continue;
                    }
                    let viewed = viewed.unwrap_or_default();
                    let outcome = Outcome {
                        code: status.code.map(|c| c.0),
                        duration,
                        held: Duration::ZERO,
                        request: viewed.request,
                        response: viewed.response,
                        message: status.message.or(viewed.message),
                        streamed: None,
                    };
                    self.service.completed(&call, &outcome);
                }
            }
        }
    }

    /// The runtime connection failed (or closed): calls on it end with UNAVAILABLE and new
    /// streams are diverted, until the client moves to a new connection.
    fn runtime_failed(&mut self, why: RuntimeFailure) -> Result<(), RelayError> {
        let path = self.runtime_path.display();
        let writing = why.writing();
        if writing && self.core.degraded() {
            // The runtime sent GOAWAY or closed: frames crossing its close fail.
            tracing::debug!(
                target: LOG,
                runtime = %path,
                error = %why,
                "writing to a closing runtime connection failed"
            );
        } else if writing {
            tracing::warn!(
                target: LOG,
                runtime = %path,
                error = %why,
                "writing to the runtime connection failed"
            );
        } else if matches!(why, RuntimeFailure::Closed) {
            tracing::info!(target: LOG, runtime = %path, "runtime connection closed");
        } else {
            tracing::warn!(
                target: LOG,
                runtime = %path,
                error = %why,
                "runtime connection failed"
            );
        }
        let how = if writing {
            RuntimeLoss::Failed(&why)
        } else {
            RuntimeLoss::FailedMidResponse(&why)
        };
        let msg = runtime_lost(Some(&path), how);
        self.runtime = None;
        let r = self.core.handle_runtime_failed(&msg);
        self.dispatch();
        self.closing(r)
    }
}

#[cfg(test)]
mod tests {
    use super::Interest;

    /// Every state the poll interest depends on: bytes queued for either peer, a runtime
    /// connection or none, the runtime's DATA waiting for the client's window.
    #[test]
    fn the_poll_interest_follows_backpressure_in_every_state() {
        let i = |rc, wc, rr, wr| Interest {
            read_client: rc,
            write_client: wc,
            read_runtime: rr,
            write_runtime: wr,
        };
        // (client queued, runtime (queued), runtime waits) -> interest
        let cases = [
            ((false, Some(false), false), i(true, false, true, false)),
            // Bytes wait for the client: the runtime is not read.
            ((true, Some(false), false), i(true, true, false, false)),
            // Bytes wait for the runtime: the client is not read.
            ((false, Some(true), false), i(false, false, true, true)),
            ((true, Some(true), false), i(false, true, false, true)),
            // The runtime's DATA waits for the client's window: the runtime is not read, the
            // client is (its WINDOW_UPDATE unblocks it).
            ((false, Some(false), true), i(true, false, false, false)),
            ((true, Some(true), true), i(false, true, false, true)),
            // No runtime connection: the client alone.
            ((false, None, false), i(true, false, false, false)),
            ((true, None, false), i(true, true, false, false)),
            ((false, None, true), i(true, false, false, false)),
        ];
        for ((client_queued, runtime, waits), want) in cases {
            assert_eq!(
                Interest::of(client_queued, runtime, waits),
                want,
                "client queued {client_queued}, runtime {runtime:?}, runtime waits {waits}"
            );
        }
    }
}
