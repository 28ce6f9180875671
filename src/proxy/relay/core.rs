//! The relay's connection core, without I/O: bytes and time in, bytes and events out.
//!
//! One [`Core`] per client connection holds the connection's rules — the stream table, the route of
//! each new stream, flow-control windows and debt and the diverted streams' answers (`flow.rs`),
//! the PING gate and keep-alive (`ping.rs`), SETTINGS ACK ordering, GOAWAY both ways. Its shell
//! (`pump.rs`) is driven through three kinds of calls, as quinn-proto's `Connection`:
//!
//! - input, every one a `handle_*`: the client's bytes ([`Core::handle_client_bytes`]), the
//!   runtime's, read into the buffer the core owns ([`Core::runtime_buffer`],
//!   [`Core::handle_runtime_bytes`]), the runtime's loss ([`Core::handle_runtime_failed`]), the
//!   client's ([`Core::handle_client_gone`]), crisp's shutdown ([`Core::handle_goaway`]), the
//!   timer ([`Core::handle_timeout`]), the answer to a question the core asked
//!   ([`Core::handle_runtime_probe`]) and the diverted streams' commands
//!   ([`Core::handle_command`]);
//! - output, every one a `poll_*`: bytes for the client, the runtime's frames and crisp's own in
//!   the one order the core chose ([`Core::poll_transmit_client`], acknowledged by
//!   [`Core::advance_client`]: no copy, the runtime's frames are slices of the read buffer),
//!   bytes for the runtime ([`Core::poll_transmit_runtime`], [`Core::advance_runtime`]), the
//!   timer ([`Core::poll_timeout`]) and [`Event`]s — a stream to divert, credit for a diverted
//!   answer, a call that ended ([`Core::poll_event`]);
//! - queries the shell's `poll(2)` interest reads ([`Core::runtime_waits`]).
//!
//! It has no socket, no clock and nothing of tokio or libc: tests drive it frame by frame
//! (`tests/`).

use super::LOG;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::error::{RelayError, Violation};
use super::flow::Flow;
use super::from_client::FromClient;
use super::from_runtime::FromRuntime;
use super::ping::{KeepAlive, KeepAliveAction, PingGate, GOAWAY_PING, KEEPALIVE};
use super::status::EndStatus;
use super::streams::Streams;
use super::transmit::ToClient;
use super::undecided::{Undecided, Why};
pub(super) use super::viewing::Asked;
use super::viewing::{Viewed, Viewing};
use crate::cri::skim::SkimSpec;
use crate::intercept::{Call, Interest};
use crate::proxy::http2::{self, GoAway, IdMap, Ping, Reason, RstStream, Settings, StreamId};

/// A degraded client idle this long is moved back to a relay (see [`Core::handle_runtime_probe`]).
pub(super) const MOVE_IDLE: Duration = Duration::from_millis(200);
/// How long crisp waits for the ACK of the PING after its first GOAWAY before it sends the
/// final one anyway (a client that stopped reading).
pub(crate) const GOAWAY_ACK_WAIT: Duration = Duration::from_secs(1);

/// What the core needs of the rest of crisp to route a new stream.
pub trait Calls: Send + Sync {
    /// A new call's id (one per call: the tap's in-flight gauge counts ids against completions).
    fn next_id(&self) -> u64;
    /// What the interceptors want of a call: any interest in its request or response diverts it
    /// (unless [`Calls::conditional`]).
    fn interest(&self, call: &Call) -> Interest;
    /// For a call whose interest is a [`Interest::view`]: how its answer is viewed
    /// ([`crate::intercept::Interceptor::response_view`]; `None`: its request alone).
    fn response_view(&self, _call: &Call) -> Option<SkimSpec> {
        None
    }
    /// Whether the request/response interest just reported for a unary call holds only for
    /// some requests ([`crate::intercept::Interceptor::conditional`]): the stream stays
    /// undecided until its request is read, and [`Calls::wants`] decides (`undecided.rs`).
    fn conditional(&self, _call: &Call) -> bool {
        false
    }
    /// For an undecided stream's call: whether it is diverted, its request message `req` seen. Runs on the
    /// relay thread: no blocking, no I/O.
    fn wants(&self, _call: &Call, _req: &[u8]) -> bool {
        true
    }
    /// Whether the calls of `route` are relayed unobserved after repeated panics
    /// ([`crate::intercept::Faults`]).
    fn bypassed(&self, _route: crate::cri::Route) -> bool {
        false
    }
    /// The relay panicked on call `call` of `route` at `place`; `outcome`: what became of the
    /// call. Counted and logged with the interceptors' panics.
    fn panicked(&self, _route: crate::cri::Route, _call: u64, _place: &str, _outcome: &str) {}
}

/// What the core leaves for its shell.
#[derive(Debug)]
pub enum Event {
    /// A new stream goes to the observed path: its request's fields, decoded once, in the
    /// client's order. `end_stream`: the request has no body.
    Divert {
        stream: StreamId,
        call: Call,
        fields: Vec<(Bytes, Bytes)>,
        end_stream: bool,
    },
    /// Request body bytes (padding removed) of a diverted stream.
    Body { stream: StreamId, data: Bytes },
    /// Request trailers of a diverted stream; its body ends.
    Trailers {
        stream: StreamId,
        fields: Vec<(Bytes, Bytes)>,
    },
    /// The client ended a diverted stream's request body.
    BodyEnd { stream: StreamId },
    /// `n` more bytes of a diverted stream's answer were written to the client: its task may
    /// send that many more ([`Command::Data`](super::answers::Command::Data)).
    Credit { stream: StreamId, n: usize },
    /// The client reset a diverted stream: its task ends.
    Reset { stream: StreamId },
    /// Time to ask whether the runtime accepts connections again (a degraded client, idle):
    /// the shell tries to connect to the runtime's socket and answers with
    /// [`Core::handle_runtime_probe`]. A unix socket's connect does not wait for the runtime:
    /// it is accepted or refused.
    ProbeRuntime,
    /// A relayed call ended; `at`: when its last frame was read. `report`: the interceptors
    /// asked to hear of it (else it is only logged, [`CALLS`]); `viewed`: what they asked to
    /// see of it ([`Interest::view`]), taken as it passed.
    Ended {
        call: Call,
        status: EndStatus,
        at: Instant,
        report: bool,
        viewed: Option<Viewed>,
    },
}

/// The core's settings.
pub(crate) struct Config {
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_timeout: Duration,
    /// The runtime's socket, as logs and crisp's own error messages name it.
    pub(crate) runtime: std::path::PathBuf,
}

/// A stream relayed to the runtime.
pub(super) struct Relayed {
    /// Kept when the interceptors asked to hear of the call's end (`report`), or when every
    /// call's end is logged (`crisp::calls=debug`, [`Core::record_calls`]).
    pub(super) call: Option<Call>,
    pub(super) report: bool,
    /// What the interceptors see of it as it passes ([`Interest::view`], `viewing.rs`).
    pub(super) view: Option<Box<Viewing>>,
    /// The runtime has sent the response headers.
    pub(super) answered: bool,
    /// Its route and when its headers were read: the admin socket's connection dump.
    pub(super) route: crate::cri::Route,
    pub(super) opened: Instant,
}

impl Relayed {
    /// Call `call`, its headers read at `opened`; `asked`: what the interceptors asked of it;
    /// `record`: every call's end is logged ([`Core::record_calls`]).
    pub(super) fn new(call: Call, asked: Asked, record: bool, opened: Instant) -> Relayed {
        let report = asked.report || asked.view.is_some();
        Relayed {
            route: call.route,
            call: (report || record).then_some(call),
            report,
            view: asked.view,
            answered: false,
            opened,
        }
    }
}

/// One client connection's rules.
pub(crate) struct Core {
    pub(super) calls: Arc<dyn Calls>,
    /// The runtime's socket (the test-util fault hooks are armed by it).
    pub(super) runtime_path: std::path::PathBuf,
    /// The route of the last stream the client opened: what a panic of the relay thread is
    /// counted on.
    pub(crate) last_route: crate::cri::Route,
    /// The runtime's socket path, for logs and messages.
    pub(super) runtime_name: String,
    /// The client's windows as crisp counts on them, and the diverted streams' answers.
    pub(crate) flow: Flow,
    /// The runtime connection: relayed to, closing, or gone.
    pub(super) runtime: RuntimeState,
    /// The client's header blocks, read and written anew for the runtime.
    pub(super) client: FromClient,
    /// Whose each of the client's streams is: relayed, diverted, its body open.
    pub(super) streams: Streams,
    /// A new stream kept from the runtime until its request is read (`undecided.rs`).
    pub(super) undecided: Undecided,
    /// What the core keeps to read the runtime's frames.
    pub(super) from_runtime: FromRuntime,
    pub(super) relayed: IdMap<Relayed>,
    /// Relayed calls in flight with a [`Relayed::view`]: while none, a DATA frame costs no
    /// lookup for one.
    pub(super) viewing: usize,
    /// Highest stream id the client opened.
    pub(super) max_stream: StreamId,
    /// crisp's own GOAWAY to the client: not sent, half-way, or final.
    pub(super) goaway: GoAwayState,
    /// The client has its server preface, the SETTINGS frame that must come first (RFC 9113
    /// §3.4): the runtime's, relayed, or crisp's own when crisp is the server. Until then crisp
    /// writes no frame of its own: grpc-go closes a connection whose first frame is anything
    /// else, and fails the calls it queued on it (a GOAWAY at shutdown did that).
    pub(super) preface_sent: bool,
    pub(super) last_client_frame: Instant,
    /// When the client last opened a stream.
    pub(super) last_stream_at: Instant,
    pub(super) pings: PingGate,
    keepalive: KeepAlive,
    /// When the core last asked its shell whether the runtime accepts connections again
    /// ([`Event::ProbeRuntime`]).
    last_probe: Option<Instant>,
    /// When the frames being handled were read (one clock read per read, not per call).
    pub(super) now: Instant,
    /// The client's frames for the runtime.
    pub(super) to_runtime: Vec<u8>,
    /// Everything for the client, the runtime's frames and crisp's own, in one order.
    pub(super) out: ToClient,
    pub(super) events: VecDeque<Event>,
    /// Every relayed call's end is logged at debug (target [`CALLS`]): when that log level was
    /// on as the connection opened.
    pub(super) record_calls: bool,
}

/// The log target of the one debug line each call leaves when it ends: "did crisp see this
/// call, and how did it end?" (RELIABILITY.md).
pub(crate) const CALLS: &str = "crisp::calls";

/// The connection's runtime side, one state at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuntimeState {
    /// A runtime connection of its own, open: new streams are relayed (or diverted, when an
    /// interceptor wants them).
    Relaying,
    /// The runtime sent GOAWAY: the streams it kept finish on its connection, which stays open;
    /// new streams are diverted.
    Closing,
    /// No runtime connection (never made, or failed): crisp is the client's server, and every
    /// stream is diverted. Left only by moving the client to a new connection
    /// ([`Core::handle_runtime_probe`]).
    Gone,
}

impl RuntimeState {
    /// The runtime connection is open: the client's frames may go on to it.
    pub(crate) fn connected(self) -> bool {
        self != RuntimeState::Gone
    }

    /// New streams are diverted: the runtime connection is gone or closing.
    pub(crate) fn degraded(self) -> bool {
        self != RuntimeState::Relaying
    }
}

/// crisp's GOAWAY to the client ([`Core::goaway`]), one state at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GoAwayState {
    /// None sent: the client may open streams.
    Open,
    /// Between crisp's two GOAWAYs: the first is queued or out, the final one waits for the
    /// ACK of the PING that followed it.
    Draining {
        /// The debug data of both GOAWAYs.
        why: Vec<u8>,
        /// When the final GOAWAY goes without the ACK: [`GOAWAY_ACK_WAIT`] after the first one
        /// was written ([`Core::advance_client`]); None until then (it may wait for the
        /// client's server preface), so a slow runtime SETTINGS never makes the two steps one.
        until: Option<Instant>,
        /// The first GOAWAY (and its PING) are written once this many bytes of crisp's own
        /// frames are.
        written_by: u64,
    },
    /// The final GOAWAY is out: streams above `last` are refused.
    Sent { last: StreamId },
}

impl GoAwayState {
    /// Either GOAWAY is queued or out.
    pub(crate) fn going_away(&self) -> bool {
        *self != GoAwayState::Open
    }

    /// The last stream crisp processes, once its final GOAWAY said so.
    pub(crate) fn last(&self) -> Option<StreamId> {
        match self {
            GoAwayState::Sent { last } => Some(*last),
            _ => None,
        }
    }
}

impl Core {
    /// A connection whose client has sent its preface; `runtime`: it has a runtime connection
    /// of its own (its preface sent), else crisp serves it on the observed path and is the
    /// client's server itself.
    pub(crate) fn new(cfg: &Config, calls: Arc<dyn Calls>, runtime: bool, now: Instant) -> Core {
        let mut out = ToClient::default();
        if !runtime {
            // crisp is the server now: its own (default) SETTINGS.
            Settings::default().encode(out.own());
        }
        Core {
            calls,
            runtime_name: cfg.runtime.display().to_string(),
            runtime_path: cfg.runtime.clone(),
            last_route: crate::cri::Route::UNKNOWN,
            flow: Flow::default(),
            runtime: if runtime {
                RuntimeState::Relaying
            } else {
                RuntimeState::Gone
            },
            client: FromClient::default(),
            streams: Streams::default(),
            undecided: Undecided::default(),
            from_runtime: FromRuntime::default(),
            relayed: IdMap::default(),
            viewing: 0,
            max_stream: StreamId::CONNECTION,
            goaway: GoAwayState::Open,
            preface_sent: !runtime,
            last_client_frame: now,
            last_stream_at: now,
            pings: PingGate::default(),
            keepalive: KeepAlive::new(cfg.keepalive_interval, cfg.keepalive_timeout),
            last_probe: None,
            now,
            to_runtime: Vec::with_capacity(64 << 10),
            out,
            events: VecDeque::new(),
            record_calls: tracing::enabled!(target: CALLS, tracing::Level::DEBUG),
        }
    }

    /// Calls in flight on this connection: relayed, diverted (still answered) and undecided.
    #[inline]
    pub(crate) fn calls_in_flight(&self) -> usize {
        self.relayed.len() + self.flow.diverted_len() + usize::from(self.undecided_id().is_some())
    }

    /// What the admin socket's connection dump shows of this connection at `now`: the streams
    /// in flight (relayed ones with their route and age; diverted ones by id).
    pub(crate) fn report(&self, now: Instant) -> crate::watchdog::ConnReport {
        let mut streams: Vec<(u32, String, Duration)> = self
            .relayed
            .iter()
            .map(|(&id, r)| {
                (
                    id.get(),
                    r.route.to_string(),
                    now.saturating_duration_since(r.opened),
                )
            })
            .collect();
        streams.extend(
            self.streams
                .diverted_ids()
                .filter(|&id| self.flow.is_diverted(id))
                .map(|id| (id.get(), "(diverted)".to_string(), Duration::ZERO)),
        );
        if let Some(id) = self.undecided_id() {
            streams.push((id.get(), "(undecided)".to_string(), Duration::ZERO));
        }
        streams.sort_by_key(|s| s.0);
        crate::watchdog::ConnReport {
            streams,
            queued_to_client: 0,
            queued_to_runtime: 0,
            degraded: self.runtime.degraded(),
            going_away: self.goaway.going_away(),
        }
    }

    /// The next event left for the shell, oldest first.
    pub(crate) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The runtime is in the middle of a header block: crisp's own frames must wait.
    pub(crate) fn in_runtime_block(&self) -> bool {
        self.from_runtime.in_block()
    }

    /// Whether crisp may write its own frames to the client now: after the server preface, and
    /// never inside a header block the runtime is still sending.
    pub(crate) fn may_write_own(&self) -> bool {
        self.preface_sent && !self.in_runtime_block()
    }

    /// The connection is degraded: its runtime connection is gone or closing, and new streams
    /// go to the observed path.
    pub(crate) fn degraded(&self) -> bool {
        self.runtime.degraded()
    }

    /// When the core next wants [`Core::handle_timeout`]: the earliest of the keep-alive's PING
    /// (only while crisp may write it) and its deadline, the final GOAWAY's wait, the undecided
    /// stream's wait, and the next question whether the runtime is back. None: no timer.
    ///
    /// Every deadline it returns is cleared or moved on by `handle_timeout` at that time, so a
    /// shell that sleeps until it never spins.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        // Run on every wakeup of the pump: plain comparisons, the usual case first (a relaying
        // connection has the keep-alive's timer alone).
        let mut at = self
            .keepalive
            .next(self.last_client_frame, self.may_write_own());
        let mut earlier = |t: Option<Instant>| {
            if let Some(t) = t {
                at = Some(at.map_or(t, |a| a.min(t)));
            }
        };
        if let GoAwayState::Draining { until, .. } = &self.goaway {
            earlier(*until);
        }
        earlier(self.undecided_due());
        if self.runtime.degraded() {
            earlier(self.next_probe());
        }
        at
    }

    /// The timers' work at `now`: the keep-alive (a PING to an idle client, the end of one
    /// that stopped answering), the final GOAWAY if its wait is over, the undecided stream if
    /// its wait is, and, for a degraded client idle long enough, the question whether the runtime
    /// accepts connections again ([`Event::ProbeRuntime`], answered by
    /// [`Core::handle_runtime_probe`]).
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Result<(), RelayError> {
        if self.keepalive.check(now, self.last_client_frame) == KeepAliveAction::Dead {
            return Err(RelayError::KeepAlive);
        }
        if matches!(self.goaway, GoAwayState::Draining { until: Some(u), .. } if now >= u) {
            self.final_goaway();
        }
        if self.undecided_due().is_some_and(|until| now >= until) {
            // An undecided stream whose request did not end in time goes to the observed path.
            self.divert_undecided(Why::Slow);
        }
        if self.may_move_client(now) {
            self.last_probe = Some(now);
            self.events.push_back(Event::ProbeRuntime);
        }
        if self
            .keepalive
            .ping(now, self.last_client_frame, self.may_write_own())
            == KeepAliveAction::Ping
        {
            Ping::new(KEEPALIVE).encode(self.out.own());
        }
        Ok(())
    }

    /// When a degraded client next asks whether the runtime is back: once it has been idle for
    /// [`MOVE_IDLE`], then a keep-alive period after the last question (or sooner, when another
    /// timer brings the pump to [`Core::handle_timeout`] while the client is idle).
    fn next_probe(&self) -> Option<Instant> {
        if !self.may_move_client_at_all() {
            return None;
        }
        let idle = self.last_stream_at + MOVE_IDLE;
        Some(match self.last_probe {
            Some(at) => idle.max(at + self.keepalive.tick()),
            None => idle,
        })
    }

    /// A degraded client with nothing in flight.
    fn may_move_client_at_all(&self) -> bool {
        self.runtime.degraded()
            && !self.goaway.going_away()
            && self.relayed.is_empty()
            && self.undecided_id().is_none()
            && !self.flow.any_diverted()
    }

    /// A degraded client idle for [`MOVE_IDLE`] at `now`.
    fn may_move_client(&self, now: Instant) -> bool {
        self.may_move_client_at_all()
            && now.saturating_duration_since(self.last_stream_at) >= MOVE_IDLE
    }

    /// The shell's answer to [`Event::ProbeRuntime`]: whether the runtime accepted a connection
    /// at `now`.
    ///
    /// A degraded connection (its runtime connection is gone) is served by the observed path,
    /// which is slower. Once the runtime accepts connections again and the client is idle, the
    /// client is sent GOAWAY so that its next connection is relayed again. gRPC clients move to
    /// a new connection transparently (a stream that crosses the GOAWAY is refused, unprocessed,
    /// and retried); waiting for an idle moment spares clients that do not retry.
    pub(crate) fn handle_runtime_probe(&mut self, now: Instant, reachable: bool) {
        if reachable && self.may_move_client(now) {
            tracing::info!(
                target: LOG,
                "runtime reachable again: moving a client connection back to the relay"
            );
            self.start_goaway(b"crisp: reconnect");
        }
    }

    /// The connection ends for `v`: the one place where a protocol error becomes the GOAWAY
    /// that closes the client's connection (its code from [`Violation::reason`]). The GOAWAY is
    /// placed for the client at once, behind what crisp staged before it, even before the
    /// client's server preface ([`Core::poll_transmit_client`] gives it as the shell closes the
    /// connection), unless the runtime is inside a header block, which no other frame may
    /// interrupt: then the connection just closes.
    pub(super) fn protocol_error(&mut self, v: Violation) -> RelayError {
        tracing::warn!(
            target: LOG,
            error = %v,
            code = ?v.reason(),
            "protocol error: closing the client's connection"
        );
        if !self.in_runtime_block() {
            GoAway::new(self.max_stream, v.reason(), v.debug_data()).encode(self.out.own());
            self.out.place_own();
        }
        v.into()
    }

    /// crisp shuts down: the client is sent GOAWAY ([`Core::start_goaway`]).
    pub(crate) fn handle_goaway(&mut self, why: &[u8]) {
        self.start_goaway(why);
    }

    /// Sends the client GOAWAY (once): it finishes what it started and opens a new connection.
    ///
    /// In two steps, as RFC 9113 §6.8 advises for a graceful shutdown: first a GOAWAY that
    /// refuses no stream and a PING; once the client ACKs that PING (or [`GOAWAY_ACK_WAIT`]
    /// passed), the final GOAWAY names the last stream the client opened. A single GOAWAY naming
    /// the last stream loses the calls a client starts as it arrives: with nothing in flight the
    /// connection closes at once, and grpc-go fails the calls it had just queued on it ("connection
    /// closed") instead of retrying them (`tests/it/node_systemd.rs`).
    pub(super) fn start_goaway(&mut self, why: &[u8]) {
        if self.goaway == GoAwayState::Open {
            GoAway::new(StreamId::MAX, Reason::NO_ERROR, why).encode(self.out.own());
            Ping::new(GOAWAY_PING).encode(self.out.own());
            self.goaway = GoAwayState::Draining {
                why: why.to_vec(),
                until: None,
                written_by: self.out.own_mark(),
            };
        }
    }

    /// The next bytes for the client, in the order the core chose: the runtime's frames, straight
    /// from the read buffer (never copied), or crisp's own. crisp's own frames are placed when
    /// it may write them ([`Core::may_write_own`]); one staged while a frame of the runtime's
    /// was handled goes after that frame. The shell writes the slice and calls
    /// [`Core::advance_client`] with how much went, then asks again until None.
    pub(crate) fn poll_transmit_client(&mut self) -> Option<&[u8]> {
        if self.may_write_own() {
            self.out.place_own();
        }
        self.out.front()
    }

    /// The shell wrote `n` bytes of what [`Core::poll_transmit_client`] gave to the client at
    /// `now`: if crisp's first GOAWAY was in them, the wait for its PING's ACK starts now.
    pub(crate) fn advance_client(&mut self, n: usize, now: Instant) {
        self.out.advance(n);
        if let GoAwayState::Draining {
            until, written_by, ..
        } = &mut self.goaway
        {
            if until.is_none() && self.out.own_written() >= *written_by {
                *until = Some(now + GOAWAY_ACK_WAIT);
            }
        }
    }

    /// What goes on to the runtime, in order; the shell writes it and calls
    /// [`Core::advance_runtime`].
    pub(crate) fn poll_transmit_runtime(&self) -> Option<&[u8]> {
        (!self.to_runtime.is_empty()).then_some(&self.to_runtime[..])
    }

    /// The shell wrote (or, the runtime connection gone, dropped) `n` bytes of what
    /// [`Core::poll_transmit_runtime`] gave.
    pub(crate) fn advance_runtime(&mut self, n: usize) {
        if n >= self.to_runtime.len() {
            self.to_runtime.clear();
        } else {
            self.to_runtime.drain(..n);
        }
    }

    /// Where the shell reads the runtime's bytes to, for [`Core::handle_runtime_bytes`]: the
    /// core's own buffer, whose frames reach the client from where they lie.
    pub(crate) fn runtime_buffer(&mut self) -> &mut BytesMut {
        self.out.read_buf()
    }

    /// The runtime's next DATA frame waits for the client's window: the shell does not read the
    /// runtime (backpressure) until the client's credit comes, which the core applies as it
    /// handles the client's bytes.
    pub(crate) fn runtime_waits(&self) -> bool {
        self.from_runtime.waits()
    }

    /// The second step of [`Core::start_goaway`]: the client has seen the first (its PING's ACK).
    pub(super) fn final_goaway(&mut self) {
        if let GoAwayState::Draining { why, .. } = &self.goaway {
            GoAway::new(self.max_stream, Reason::NO_ERROR, why).encode(self.out.own());
            self.goaway = GoAwayState::Sent {
                last: self.max_stream,
            };
        }
    }

    /// After crisp's GOAWAY, with nothing left in flight or unwritten by the core: the
    /// connection can close once its shell has written the rest.
    pub(crate) fn drained(&self) -> bool {
        self.goaway.last().is_some()
            && self.relayed.is_empty()
            && self.undecided_id().is_none()
            && !self.flow.any_diverted()
            && self.out.is_empty()
            && !self.from_runtime.in_block()
    }

    /// The runtime connection failed (or closed; `msg` says so to the calls on it): they end
    /// with UNAVAILABLE and new streams are diverted, until the client moves to a new
    /// connection. What the runtime sent and crisp had not handled belongs to calls that end
    /// now: it is dropped.
    pub(crate) fn handle_runtime_failed(&mut self, msg: &str) -> Result<(), RelayError> {
        self.runtime = RuntimeState::Gone;
        self.out.drop_unhandled();
        self.from_runtime.set_waits(false);
        if self.from_runtime.in_block() {
            // The client holds part of a header block that will never end: its connection is
            // unusable (and no GOAWAY can be written inside the block).
            let e = self.protocol_error(Violation::RuntimeGoneInBlock);
            self.from_runtime.abandon_block();
            return Err(e);
        }
        self.runtime_gone(msg, None);
        Ok(())
    }

    /// The runtime connection is gone or going: calls on it end (UNAVAILABLE, or REFUSED_STREAM
    /// for those above `last`, which the runtime says it never processed) and new streams are
    /// diverted. The client keeps its connection; see [`Core::handle_runtime_probe`].
    pub(super) fn runtime_gone(&mut self, msg: &str, last: Option<StreamId>) {
        if self.runtime == RuntimeState::Relaying {
            self.runtime = RuntimeState::Closing;
        }
        if !self.preface_sent {
            // The runtime went before its SETTINGS reached the client: crisp is the server now,
            // and its own SETTINGS go first.
            let mut first = Vec::new();
            Settings::default().encode(&mut first);
            self.out.stage_first(&first);
            self.preface_sent = true;
        }
        // The runtime never saw it: the observed path serves it, as every new stream now.
        self.divert_undecided(Why::RuntimeGone);
        let ids: Vec<StreamId> = self
            .relayed
            .keys()
            .copied()
            .filter(|&id| last.is_none_or(|l| id > l))
            .collect();
        let at = self.now;
        for id in ids {
            let r = self.relayed.remove(&id).expect("listed");
            if last.is_some() {
                RstStream::new(id, Reason::REFUSED_STREAM).encode(self.out.own());
                self.completed(r, EndStatus::refused(msg), at);
                continue;
            }
            // A clean gRPC error: trailers (or a trailers-only response) with UNAVAILABLE.
            let mut block = Vec::with_capacity(128 + msg.len());
            if !r.answered {
                http2::encode_field(&mut block, b":status", b"200");
                http2::encode_field(&mut block, b"content-type", b"application/grpc");
            }
            for (n, v) in &crate::status::Status::runtime_gone(msg).to_header_map() {
                if n != http::header::CONTENT_TYPE {
                    http2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
                }
            }
            http2::headers(self.out.own(), id, &block, true);
            self.completed(r, EndStatus::runtime_gone(msg), at);
        }
    }

    /// The client's connection ended: relayed calls still in flight are cancelled.
    pub(crate) fn handle_client_gone(&mut self, at: Instant) {
        self.now = at;
        self.drop_undecided(true);
        let relayed: Vec<Relayed> = self.relayed.drain().map(|(_, r)| r).collect();
        for r in relayed {
            self.completed(r, EndStatus::cancelled(), at);
        }
    }

    pub(super) fn completed(&mut self, r: Relayed, status: EndStatus, at: Instant) {
        if r.view.is_some() {
            self.viewing -= 1;
        }
        if let Some(call) = r.call {
            self.events.push_back(Event::Ended {
                call,
                status,
                at,
                report: r.report,
                viewed: r.view.map(|v| v.finish()),
            });
        }
    }

    /// The view of relayed stream `stream`, if it has one.
    pub(super) fn view_of(&mut self, stream: StreamId) -> Option<&mut Viewing> {
        if self.viewing == 0 {
            return None;
        }
        self.relayed.get_mut(&stream)?.view.as_deref_mut()
    }

    /// Handles the complete frames at the start of `buf` (just read from the client, at
    /// `now`); consumed bytes are dropped from it. The client's credit may let the runtime's
    /// DATA that waited for it go on ([`Core::runtime_waits`]).
    pub(crate) fn handle_client_bytes(
        &mut self,
        buf: &mut BytesMut,
        now: Instant,
    ) -> Result<(), RelayError> {
        // Settings the runtime sent apply to the blocks crisp writes from now on.
        if let Some(size) = self.from_runtime.take_table_size() {
            self.client.runtime_table_size(size);
        }
        self.client_frames(buf, now)?;
        if self.from_runtime.waits() {
            self.runtime_frames()?;
        }
        Ok(())
    }
}
