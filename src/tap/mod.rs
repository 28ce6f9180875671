//! The debug tap (DESIGN.md §6): one event per CRI call — and per message of a streamed
//! response — streamed live to subscribers on the admin socket, with secrets redacted; and the
//! per-method call metrics. This is the daemon's half; what `crisp tap` and the other commands
//! that read it print is `cli/`, and the messages both send is `admin_api`.
//!
//! ```text
//!  Proxy ─ interest() ──▶ Tap: complete always (metrics); request/response only while some
//!                         subscriber may want this RPC (one atomic load of a bitmap)
//!        ─ on_complete ─▶ metrics; then, if some subscriber may want it (the hub's aggregates:
//!                         a few atomic loads, whatever the number of subscribers): ids off the
//!                         wire (ids.rs), names from the engine, one try_send to the fan-out
//!                         thread (fanout.rs) — full: drop, count
//!                         ─────────────── call path ends here: no await, no decode ───────────
//!        ─ on_message ──▶ (a tapped stream, on the observed path's task: never the relay
//!                         thread) each message's size, items and bounded view, one try_send
//!  fanout.rs (one thread): each subscriber's filter (filter.rs), try_send into its bounded
//!            queue (hub.rs) — full, or all queues over admin.tap_memory_bytes: drop, count
//!  admin/service.rs: one task per subscriber ◀─ Subscription::next: events + "dropped N" markers
//!            decode + redact (decode.rs, redact.rs) for --full, then gRPC to `crisp tap`
//!            (its client and its lines: cli/client.rs, cli/view.rs)
//!            ◀─ first, if it asked (`crisp tap -o`): the runtime's snapshot (snapshot.rs),
//!            crisp's own Version/RuntimeConfig/Status/ImageFsInfo, for that subscriber only
//! ```
//!
//! A slow or vanished tap client never slows a CRI call: the call path only ever `try_send`s,
//! each subscriber's queue is bounded in events and bytes, and all of them together in bytes.

pub(crate) mod decode;
mod fanout;
pub(crate) mod filter;
mod hub;
pub(crate) mod ids;
pub(crate) mod redact;
mod snapshot;

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;

use crate::admin_api as pb;
#[cfg(any(test, feature = "test-util"))]
use crate::config::DEFAULT_TAP_MEMORY;
use crate::cri::skim::{Skim, SkimSpec, StreamedMessage};
use crate::cri::wire::{self, Frame};
use crate::cri::{Route, Rpc, RpcKind};
use crate::hold_events::{HoldEvent, HoldSink};
#[cfg(test)]
use crate::hold_events::{HoldOutcome, HoldPhase};
use crate::intercept::PodNames;
use crate::intercept::{BoxFuture, Call, Interceptor, Interest, Outcome, Streamed, Verdict};
use crate::metrics::{code_name, CallMetrics};
use fanout::Job;
pub(crate) use filter::{Filter, Glob};
use hub::Hub;
#[cfg(test)]
use hub::MAX_QUEUED_BYTES;
pub(crate) use hub::{Item, Subscription};
pub(crate) use ids::Ids;
use redact::Dir;

/// Most bytes of a protobuf message the tap (and the trace log) shows: of each message, the
/// top-level fields that fit are decoded and shown, the others by their size on the wire
/// (issue #33). The timeline's bound on text is another: [`crate::cli::timeline::MAX_SHOWN_TEXT_CHARS`].
pub(crate) const MAX_SHOWN_PROTOBUF_BYTES: usize = 64 << 10;

/// What the tap keeps of a response nobody sees whole: enough for the ids at its start.
const IDS_VIEW: usize = 1 << 10;

/// What the tap keeps of a message of `rpc` going `dir`.
fn spec(rpc: Option<Rpc>, dir: Dir) -> SkimSpec {
    SkimSpec {
        budget: MAX_SHOWN_PROTOBUF_BYTES,
        size_only: rpc.map_or(&[], |r| redact::size_only(r, dir)),
        items: None,
    }
}

/// Whether `rpc`'s response is a stream (or may be: a method crisp does not know), shown
/// message by message.
fn streamed(rpc: Option<Rpc>) -> bool {
    !matches!(
        rpc.map(Rpc::kind),
        Some(RpcKind::Mutating | RpcKind::Polling)
    )
}

/// Target of the trace-level log of every call's (redacted) messages.
const MESSAGES_TARGET: &str = "crisp::tap::messages";
/// Longest message JSON put in one log line.
const MAX_LOG_MESSAGE: usize = 16 << 10;

/// One finished call, shared by every subscriber that gets it.
#[derive(Debug)]
pub(crate) struct RawEvent {
    pub(crate) call_id: u64,
    pub(crate) start: SystemTime,
    pub(crate) route: Route,
    pub(crate) path: String,
    pub(crate) duration: Duration,
    pub(crate) held: Duration,
    pub(crate) code: Option<i32>,
    /// grpc-message, when the call ended with one.
    pub(crate) message: Option<String>,
    pub(crate) ids: Ids,
    pub(crate) request_bytes: usize,
    pub(crate) response_bytes: usize,
    /// Bounded views of the messages, kept only when a `full` subscriber gets the event.
    pub(crate) request: Option<Skim>,
    pub(crate) response: Option<Skim>,
    /// The redacted JSON of both messages, decoded once for all redacted subscribers.
    redacted_json: OnceLock<(String, String)>,
    /// A streamed response seen message by message: its messages and bytes.
    pub(crate) streamed: Option<Streamed>,
    /// crisp's own call at the tap's start, not kubelet's (`snapshot.rs`).
    pub(crate) snapshot: bool,
}

impl RawEvent {
    /// Bytes this event pins in memory while queued.
    fn weight(&self) -> usize {
        256 + self.request.as_ref().map_or(0, Skim::weight)
            + self.response.as_ref().map_or(0, Skim::weight)
    }

    pub(crate) fn method(&self) -> &str {
        filter::method_name(&self.route, &self.path)
    }

    fn json(&self, redact: bool) -> (String, String) {
        let one = |dir: Dir, m: &Option<Skim>| {
            m.as_ref()
                .map(|s| decode::decode_skim(self.route.rpc, dir, s, redact).to_string())
                .unwrap_or_default()
        };
        (
            one(Dir::Request, &self.request),
            one(Dir::Response, &self.response),
        )
    }

    /// The event as the admin API sends it. Decoding (`full`) happens here, in the
    /// subscriber's task, never on the call path.
    pub(crate) fn to_proto(&self, full: bool, redact: bool) -> pb::CallEvent {
        let (request_json, response_json) = match (full, redact) {
            (false, _) => (String::new(), String::new()),
            (true, true) => self.redacted_json.get_or_init(|| self.json(true)).clone(),
            (true, false) => self.json(false),
        };
        let kind = match self.route.rpc.map(Rpc::kind) {
            Some(RpcKind::Mutating) => "mutating",
            Some(RpcKind::Polling) => "polling",
            Some(RpcKind::Streaming) => "streaming",
            None => "unknown",
        };
        pb::CallEvent {
            call_id: self.call_id,
            start_unix_nanos: self
                .start
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or(0),
            method: self.method().to_string(),
            path: self.path.clone(),
            cri_version: self
                .route
                .version
                .map(|v| v.as_str())
                .unwrap_or("")
                .to_string(),
            kind: kind.to_string(),
            pod_namespace: self.ids.pod_namespace.clone(),
            pod_name: self.ids.pod_name.clone(),
            pod_sandbox_id: self.ids.pod_sandbox_id.clone(),
            container_name: self.ids.container_name.clone(),
            container_id: self.ids.container_id.clone(),
            image: self.ids.image.clone(),
            duration_micros: self.duration.as_micros() as u64,
            held_micros: self.held.as_micros() as u64,
            code: self.code,
            code_name: code_name(self.code).to_string(),
            message: self.message.clone().unwrap_or_default(),
            request_bytes: self.request_bytes as u64,
            response_bytes: self.response_bytes as u64,
            request_json,
            response_json,
            redacted: redact,
            messages: self.streamed.map(|s| s.messages),
            snapshot: self.snapshot,
        }
    }
}

/// One message of a streamed response, shared by every subscriber that gets it: its size and
/// items from the wire, and with `full` a bounded view of it (never the message).
#[derive(Debug)]
pub(crate) struct RawMessage {
    pub(crate) call_id: u64,
    pub(crate) route: Route,
    pub(crate) path: String,
    pub(crate) index: u64,
    pub(crate) at: SystemTime,
    pub(crate) since_start: Duration,
    pub(crate) bytes: u64,
    pub(crate) items: Option<u64>,
    pub(crate) compressed: bool,
    /// Kept only when a `full` subscriber may get the event, for a method crisp has types for.
    pub(crate) view: Option<Skim>,
    redacted_json: OnceLock<String>,
}

impl RawMessage {
    /// Bytes this event pins in memory while queued.
    fn weight(&self) -> usize {
        192 + self.path.len() + self.view.as_ref().map_or(0, Skim::weight)
    }

    pub(crate) fn method(&self) -> &str {
        filter::method_name(&self.route, &self.path)
    }

    fn json(&self, redact: bool) -> String {
        self.view
            .as_ref()
            .map(|v| decode::decode_skim(self.route.rpc, Dir::Response, v, redact).to_string())
            .unwrap_or_default()
    }

    /// The event as the admin API sends it; decoded (`full`) in the subscriber's task.
    pub(crate) fn to_proto(&self, full: bool, redact: bool) -> pb::MessageEvent {
        let json = match (full, redact) {
            (false, _) => String::new(),
            (true, true) => self.redacted_json.get_or_init(|| self.json(true)).clone(),
            (true, false) => self.json(false),
        };
        pb::MessageEvent {
            call_id: self.call_id,
            index: self.index,
            unix_nanos: self
                .at
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or(0),
            since_start_micros: self.since_start.as_micros() as u64,
            method: self.method().to_string(),
            path: self.path.clone(),
            cri_version: self
                .route
                .version
                .map(|v| v.as_str())
                .unwrap_or("")
                .to_string(),
            kind: if self.route.rpc.is_some() {
                "streaming"
            } else {
                "unknown"
            }
            .to_string(),
            bytes: self.bytes,
            items: self.items,
            compressed: self.compressed,
            json,
            redacted: redact,
        }
    }
}

/// A hold event as the admin API sends it.
pub(crate) fn hold_to_proto(ev: &HoldEvent) -> pb::HoldEvent {
    pb::HoldEvent {
        call_id: ev.call_id,
        phase: ev.phase.as_str().to_string(),
        unix_nanos: ev
            .at
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0),
        method: filter::method_name(&ev.route, &ev.path).to_string(),
        cri_version: ev
            .route
            .version
            .map(|v| v.as_str())
            .unwrap_or("")
            .to_string(),
        pod_namespace: ev.pod_namespace.clone(),
        pod_name: ev.pod_name.clone(),
        pod_sandbox_id: ev.pod_sandbox_id.clone(),
        container_name: ev.container_name.clone(),
        container_id: ev.container_id.clone(),
        waiting_on: ev.waiting_on.clone(),
        reason: ev.reason.clone(),
        probe: ev.probe.clone(),
        probe_result: ev.probe_result.clone(),
        held_ms: ev.held.as_millis() as u64,
        time_left_ms: ev.time_left.as_millis() as u64,
        policy: ev.policy.clone(),
        outcome: ev.outcome_str().to_string(),
        message: ev.message.clone(),
    }
}

/// The tap interceptor. Put it first in the chain: it reads names before the ordering engine
/// forgets a removed sandbox or container.
#[cfg_attr(feature = "test-util", visibility::make(pub))]
pub(crate) struct Tap {
    hub: Arc<Hub>,
    metrics: Arc<CallMetrics>,
    names: Option<Arc<dyn PodNames>>,
    /// Ids and names of calls in flight, read from the request before it is forwarded, by call
    /// id: a call the engine refuses ends without its request reaching `on_complete`, and a
    /// Remove call's names are gone from the engine once it ran. Only filled while somebody taps.
    stash: DashMap<u64, Ids>,
    /// Entries in `stash`, so that the untapped path checks an atomic instead of locking a shard.
    stashed: AtomicUsize,
    /// The fan-out thread's channel, once somebody subscribed (`fanout.rs`).
    fanout: OnceLock<std::sync::mpsc::SyncSender<Job>>,
    /// What a subscriber's snapshot is asked through (`snapshot.rs`): the daemon's client.
    runtime: OnceLock<crate::proxy::client::RuntimeClient>,
}

/// Most stashed entries. A call the client abandons while it is held never completes and leaves
/// its entry behind, so the stash is cleared rather than allowed to grow.
const MAX_STASH: usize = 4096;

impl Tap {
    /// `names`: what names the pods and containers of a call's ids (the ordering engine). Its
    /// subscribers' queues share [`DEFAULT_TAP_MEMORY`].
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(feature = "test-util", visibility::make(pub))]
    pub(crate) fn new(metrics: Arc<CallMetrics>, names: Option<Arc<dyn PodNames>>) -> Arc<Tap> {
        Tap::with_memory(metrics, names, DEFAULT_TAP_MEMORY)
    }

    /// `names`: what names the pods and containers of a call's ids (the ordering engine); its
    /// subscribers' queues hold at most `memory` bytes together (`admin.tap_memory_bytes`).
    #[cfg_attr(feature = "test-util", visibility::make(pub))]
    pub(crate) fn with_memory(
        metrics: Arc<CallMetrics>,
        names: Option<Arc<dyn PodNames>>,
        memory: usize,
    ) -> Arc<Tap> {
        Arc::new(Tap {
            hub: Arc::new(Hub::new(memory)),
            metrics,
            names,
            stash: DashMap::new(),
            stashed: AtomicUsize::new(0),
            fanout: OnceLock::new(),
            runtime: OnceLock::new(),
        })
    }

    #[cfg_attr(feature = "test-util", visibility::make(pub))]
    pub(crate) fn metrics(&self) -> &Arc<CallMetrics> {
        &self.metrics
    }

    pub(crate) fn subscribers(&self) -> usize {
        self.hub.count.load(Relaxed)
    }

    /// Attaches a subscriber with a queue of `queue` events.
    pub(crate) fn subscribe(&self, filter: Filter, queue: usize) -> Subscription {
        self.fanout
            .get_or_init(|| fanout::spawn(self.hub.clone(), self.metrics.clone()));
        self.hub.subscribe(filter, queue, &self.metrics)
    }

    /// Ends every subscription (their queued events are still delivered) and refuses new ones;
    /// the fan-out thread ends with it.
    pub(crate) fn close(&self) {
        self.hub.close(&self.metrics);
        if let Some(tx) = self.fanout.get() {
            // A full channel wakes the thread anyway, and it sees the hub closed.
            let _ = tx.try_send(Job::Wake);
        }
    }

    /// Hands an event to the fan-out thread (none yet: nobody ever subscribed).
    fn fan_out(&self, job: Job) {
        if let Some(tx) = self.fanout.get() {
            fanout::send(tx, job, &self.hub, &self.metrics);
        }
    }

    /// Returns once the fan-out thread has offered every event handed to it so far.
    #[cfg(test)]
    fn flush(&self) {
        if let Some(tx) = self.fanout.get() {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            if tx.send(Job::Flush(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }

    fn unstash(&self, call_id: u64) -> Option<Ids> {
        let (_, ids) = self.stash.remove(&call_id)?;
        // Saturating: a concurrent clear() may have reset the count already.
        let _ = self
            .stashed
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        Some(ids)
    }

    fn messages_logged() -> bool {
        tracing::enabled!(target: MESSAGES_TARGET, tracing::Level::TRACE)
    }

    fn ids_for(&self, call: &Call, req: Option<&[u8]>, resp: Option<&[u8]>) -> Ids {
        let mut ids = ids::from_messages(call.route.rpc, req, resp);
        if let Some(early) = self.unstash(call.id) {
            ids.fill_from(early);
        }
        if let Some(n) = &self.names {
            ids::complete(&mut ids, n.as_ref());
        }
        ids
    }

    fn log_messages(
        &self,
        call: &Call,
        req: Option<&Skim>,
        resp: Option<&Skim>,
        outcome: &Outcome,
    ) {
        let show = |dir, m: Option<&Skim>| {
            m.map(|m| decode::for_log(call.route.rpc, dir, m, MAX_LOG_MESSAGE))
                .unwrap_or_default()
        };
        tracing::trace!(
            target: MESSAGES_TARGET,
            call = call.id,
            rpc = %call.route,
            code = code_name(outcome.code),
            message = outcome.message.as_deref().unwrap_or(""),
            request = %show(Dir::Request, req),
            response = %show(Dir::Response, resp),
            "call messages (redacted)"
        );
    }
}

/// Whether the tap wants to see the messages of `call`, and whether whole (`full`): one
/// atomic load of the subscribers' bitmaps, and whether the message log is on.
impl Tap {
    fn wants(&self, call: &Call) -> (bool, bool) {
        let b = hub::bit(call.route.rpc);
        let logged = Tap::messages_logged();
        let want = self.hub.want.load(Relaxed) & b != 0 || logged;
        let unary = matches!(
            call.route.rpc.map(Rpc::kind),
            Some(RpcKind::Mutating | RpcKind::Polling)
        );
        let full = want && unary && (self.hub.want_full.load(Relaxed) & b != 0 || logged);
        (want, full)
    }

    /// For a streamed call: whether some subscriber may want its messages, and whole (`full`:
    /// decoded, for a method crisp has types for).
    fn wants_messages(&self, call: &Call) -> (bool, bool) {
        let b = hub::bit(call.route.rpc);
        let want = self.hub.want_messages.load(Relaxed) & b != 0;
        let full = want && call.route.rpc.is_some() && self.hub.want_full.load(Relaxed) & b != 0;
        (want, full)
    }
}

impl Interceptor for Tap {
    fn interest(&self, call: &Call) -> Interest {
        self.metrics.highest_call_id.fetch_max(call.id, Relaxed);
        let (want, _) = self.wants(call);
        // The response is never held for the tap: it asks for a view ([`Tap::response_view`]).
        // A polling call — what kubelet repeats every second — is viewed as it passes, so it
        // stays on the relay's byte path. Other calls are read before they are forwarded
        // (`on_request`): the engine diverts the mutating ones anyway and forgets a Remove's
        // names in its own `on_request`, after the tap's; a stream is seen message by
        // message on the observed path.
        let polling = matches!(call.route.rpc.map(Rpc::kind), Some(RpcKind::Polling));
        Interest {
            request: want && !polling,
            response: false,
            complete: true,
            view: want && polling,
        }
    }

    /// `full`: what the tap shows of the response; else just enough to read its ids (the
    /// container id of a CreateContainer answer).
    fn response_view(&self, call: &Call) -> Option<SkimSpec> {
        if streamed(call.route.rpc) {
            // Each message: its size and items, and with `full` what the tap shows of it.
            let (want, full) = self.wants_messages(call);
            return want.then(|| SkimSpec {
                budget: if full { MAX_SHOWN_PROTOBUF_BYTES } else { 0 },
                items: call.route.rpc.and_then(Rpc::listed_items),
                ..spec(call.route.rpc, Dir::Response)
            });
        }
        let (want, full) = self.wants(call);
        let unary = matches!(
            call.route.rpc.map(Rpc::kind),
            Some(RpcKind::Mutating | RpcKind::Polling)
        );
        match (want && unary, full) {
            (_, true) => Some(spec(call.route.rpc, Dir::Response)),
            (true, false) => Some(SkimSpec {
                budget: IDS_VIEW,
                ..spec(call.route.rpc, Dir::Response)
            }),
            (false, _) => None,
        }
    }

    fn on_request<'a>(&'a self, call: &'a Call, msg: &'a [u8]) -> BoxFuture<'a, Verdict> {
        // Runs before the engine (the tap is first in the chain): the engine may refuse the call
        // (its request then never reaches on_complete) or forget the names (Remove*).
        let mut ids = ids::from_messages(call.route.rpc, Some(msg), None);
        if let Some(n) = &self.names {
            ids::complete(&mut ids, n.as_ref());
        }
        if ids != Ids::default() {
            if self.stashed.load(Relaxed) >= MAX_STASH {
                self.stash.clear();
                self.stashed.store(0, Relaxed);
            }
            if self.stash.insert(call.id, ids).is_none() {
                self.stashed.fetch_add(1, Relaxed);
            }
        }
        Box::pin(std::future::ready(Verdict::Forward))
    }

    fn on_complete(&self, call: &Call, outcome: &Outcome) {
        self.metrics
            .observe(call.route.rpc, outcome.code, outcome.duration);
        let logged = Tap::messages_logged();
        if self.hub.count.load(Relaxed) == 0 && !logged {
            // Somebody may have tapped when this call started.
            if self.stashed.load(Relaxed) > 0 {
                self.unstash(call.id);
            }
            return;
        }
        // The request was buffered (bounded by max_observed_message) and its ids are read from
        // it whole; what is shown of it is a view, as of the response: never the whole message.
        let raw_req = match outcome.request.as_deref().and_then(wire::single_message) {
            Some(Frame::Message(m)) => Some(m),
            _ => None,
        };
        let req_view = || {
            let b = outcome.request.as_ref()?;
            Skim::of_framed(spec(call.route.rpc, Dir::Request), b)
        };
        let resp = outcome.response.as_ref();
        if logged {
            self.log_messages(call, req_view().as_ref(), resp, outcome);
        }
        let path = call.path.path();
        // Constant time, whatever the number of subscribers: the fan-out thread applies each
        // subscriber's filter.
        if !self
            .hub
            .may_want(call.route.rpc, outcome.code, outcome.duration)
        {
            self.unstash(call.id);
            return;
        }
        let full = self.hub.want_full.load(Relaxed) & hub::bit(call.route.rpc) != 0;
        let ev = Arc::new(RawEvent {
            call_id: call.id,
            start: SystemTime::now()
                .checked_sub(call.received.elapsed())
                .unwrap_or(UNIX_EPOCH),
            route: call.route,
            path: path.to_string(),
            duration: outcome.duration,
            held: outcome.held,
            code: outcome.code,
            message: outcome.message.clone(),
            ids: self.ids_for(call, raw_req, resp.map(|s| &s.kept[..])),
            request_bytes: raw_req.map_or(0, <[u8]>::len),
            response_bytes: match outcome.streamed {
                Some(s) => s.bytes as usize,
                None => resp.map_or(0, |s| s.len as usize),
            },
            request: if full { req_view() } else { None },
            response: if full { resp.cloned() } else { None },
            redacted_json: OnceLock::new(),
            streamed: outcome.streamed,
            snapshot: false,
        });
        self.fan_out(Job::Call(ev));
    }

    /// A message of a streamed call some subscriber may see: one event, handed to the fan-out
    /// thread as a call's is (bounded, never waiting). Runs on the task forwarding the stream.
    fn on_message(&self, call: &Call, msg: &StreamedMessage, since_start: Duration) {
        let (want, full) = self.wants_messages(call);
        if !want || self.hub.count.load(Relaxed) == 0 {
            return;
        }
        let view = &msg.view;
        let ev = Arc::new(RawMessage {
            call_id: call.id,
            route: call.route,
            path: call.path.path().to_string(),
            index: msg.index,
            at: SystemTime::now(),
            since_start,
            bytes: msg.wire_len,
            items: call
                .route
                .rpc
                .and_then(Rpc::listed_items)
                .map(|_| view.items),
            compressed: view.compressed,
            view: full.then(|| view.clone()),
            redacted_json: OnceLock::new(),
        });
        self.fan_out(Job::Message(ev));
    }
}

/// The ordering engine's hold events reach subscribers through the same fan-out thread and
/// queues as call events (bounded, never waiting): built only while someone subscribes.
impl HoldSink for Tap {
    fn wanted(&self) -> bool {
        self.hub.count.load(Relaxed) > 0
    }

    /// Through the fan-out thread, as call events: each subscriber gets both in order.
    fn publish(&self, ev: HoldEvent) {
        self.fan_out(Job::Hold(Arc::new(ev)));
    }
}

#[cfg(test)]
mod tests;
