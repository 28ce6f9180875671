//! The seam where features (the ordering engine, the tap, metrics) plug into the forwarder.
//!
//! An [`Interceptor`] is asked, for every call, what it wants to see ([`Interest`]). A call nobody
//! is interested in takes the fast path: its bodies are spliced through without being buffered
//! or parsed. When someone is interested, the proxy buffers the (unary) request, hands the raw
//! message bytes to [`Interceptor::on_request`] — which may decode a copy, delay the call, or
//! refuse it — and then forwards the *original* bytes. Response interest works the same way,
//! and [`Interceptor::on_response`] may return a replacement message (job mode's exit-code
//! patch); it is the only way forwarded bytes ever change.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::cri::skim::{Skim, SkimSpec, StreamedMessage};
use crate::cri::Route;
use crate::status::Status;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the proxy knows about a call before anything is decoded.
#[derive(Debug, Clone)]
pub struct Call {
    pub route: Route,
    /// The gRPC path as sent by the client (`/runtime.v1.RuntimeService/Version`).
    pub path: http::uri::PathAndQuery,
    pub received: Instant,
    /// From the client's `grpc-timeout`. A held call never outlives it.
    pub deadline: Option<Instant>,
    /// Process-unique call number, for correlating log lines and tap events.
    pub id: u64,
    /// kubelet's span, from the call's W3C `traceparent`: read on the observed path only
    /// ([`crate::otel::parent`]), so always `None` for a relayed call. A hold of a call that
    /// has one becomes a child span of it ([`crate::otel`]).
    pub trace: Option<opentelemetry::trace::SpanContext>,
}

/// Most bytes of a relayed request copied for an [`Interest::view`]: what the tap shows of a
/// message (`MAX_SHOWN_PROTOBUF_BYTES`) and its gRPC prefix. The polling calls a view is for
/// send a few hundred bytes.
pub(crate) const MAX_VIEWED_REQUEST: usize = (64 << 10) + crate::cri::wire::PREFIX_LEN;

/// Which parts of a call an interceptor wants to see.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Interest {
    /// Buffer the request and call `on_request` before forwarding.
    pub request: bool,
    /// Buffer the (unary) response and call `on_response` before returning it.
    pub response: bool,
    /// Call `on_complete` when the call ends.
    pub complete: bool,
    /// A bounded copy of a unary request, a view of its response
    /// ([`Interceptor::response_view`]) and its grpc-message, handed to `on_complete` in the
    /// [`Outcome`] — taken as the call passes, without delaying or diverting it: a call only
    /// viewed stays on the relay thread's byte path (docs/TAP.md, "What a tap costs").
    pub view: bool,
}

impl Interest {
    pub const NONE: Interest = Interest {
        request: false,
        response: false,
        complete: false,
        view: false,
    };
    /// Every part of the call: its request, its response and its end.
    #[cfg(any(test, feature = "test-util"))]
    pub const ALL: Interest = Interest {
        request: true,
        response: true,
        complete: true,
        view: true,
    };

    pub(crate) fn is_none(&self) -> bool {
        *self == Interest::NONE
    }

    fn union(self, other: Interest) -> Interest {
        Interest {
            request: self.request || other.request,
            response: self.response || other.response,
            complete: self.complete || other.complete,
            view: self.view || other.view,
        }
    }
}

/// The decision of `on_request`.
#[derive(Debug)]
pub enum Verdict {
    Forward,
    /// Forward this message instead of the client's. Used only to patch one field on the wire
    /// (e.g. StopContainer's timeout, by appending the field: protobuf's last value wins).
    ForwardPatched(Bytes),
    /// Answer the client with this status; the call never reaches the runtime.
    Refuse(Status),
}

/// How a call ended, for metrics and the tap.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// gRPC status code; `None` when the call ended without one (client went away mid-call).
    pub code: Option<i32>,
    pub duration: Duration,
    /// Time the call spent held in `on_request`.
    pub held: Duration,
    /// The request (framed) when it was buffered for someone, or copied as it passed for a
    /// [`Interest::view`] (at most [`MAX_VIEWED_REQUEST`] bytes: a larger one is `None`).
    pub request: Option<Bytes>,
    /// A bounded view of the response, built as it passed, when someone asked for one
    /// ([`Interceptor::response_view`]); never the whole response.
    pub response: Option<Skim>,
    /// The call's grpc-message (decoded, at most [`crate::status::MAX_SEEN_MESSAGE`] bytes), when it
    /// ended with one (gRPC servers send it with errors only) and crisp observed the call, or
    /// crisp ended it itself. A relayed call — one no interceptor asked to see — reports `None`.
    pub message: Option<String>,
    /// For a streamed response seen message by message ([`Interceptor::on_message`]): how many
    /// messages and bytes went out. `None` for a unary call or an unobserved one.
    pub streamed: Option<Streamed>,
}

/// What a server-streamed response held, counted as it passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streamed {
    /// Whole messages (a message cut short by the stream's end counts too).
    pub messages: u64,
    /// Bytes on the wire, the gRPC prefixes included.
    pub bytes: u64,
}

pub trait Interceptor: Send + Sync + 'static {
    /// Called for every call; must be cheap (no allocation, no locking on the common path).
    fn interest(&self, call: &Call) -> Interest;

    /// Sees the raw request message (without the gRPC prefix) before it is forwarded. The future
    /// is dropped if the client cancels or its deadline passes: the call is then never forwarded,
    /// so implementations must clean up in `Drop`, not after an `.await`.
    fn on_request<'a>(&'a self, _call: &'a Call, _msg: &'a [u8]) -> BoxFuture<'a, Verdict> {
        Box::pin(async { Verdict::Forward })
    }

    /// With the request seen (`req`, the message without the gRPC prefix), whether the response
    /// this interceptor asked for ([`Interest::response`]) is still wanted. `false` lets the
    /// response stream through as it arrives, never collected. Asked only for unary calls
    /// whose request was observed (a `request` interest, any interceptor's); must be cheap.
    fn wants_response(&self, _call: &Call, _req: &[u8]) -> bool {
        true
    }

    /// Whether the `request`/`response` interest this interceptor just reported for `call`
    /// holds only for some requests: those for which [`Interceptor::wants_response`] is true.
    /// When every interceptor interested in a unary call says so, the relay reads its (small)
    /// request before routing it, and relays it untouched unless one of them wants it
    /// (DESIGN.md §5.2: job mode's status calls). Asked on the relay thread: must be cheap, and
    /// `wants_response` then must not block or allocate either.
    fn conditional(&self, _call: &Call) -> bool {
        false
    }

    /// Sees the response. `msg` is `None` for a status-only answer. Returning `Some` replaces the
    /// message that goes back to the client.
    fn on_response(
        &self,
        _call: &Call,
        _req: &[u8],
        _msg: Option<&[u8]>,
        _code: i32,
    ) -> Option<Bytes> {
        None
    }

    fn on_complete(&self, _call: &Call, _outcome: &Outcome) {}

    /// Sees each message of a server-streamed response (a Stream* list, GetContainerEvents, a
    /// method crisp does not know) as it goes on to the client, viewed as
    /// [`Interceptor::response_view`] asked: `since_start` counts from the call's arrival.
    /// Called on the task that forwards the stream, for calls some interceptor observes (never
    /// on the relay thread): must not wait.
    fn on_message(&self, _call: &Call, _msg: &StreamedMessage, _since_start: Duration) {}

    /// Asks for a bounded view of a unary response in `on_complete` ([`Outcome::response`]),
    /// built as the response streams on to the client: nothing is held or delayed for it. For a
    /// streamed response, the view of each message, given to [`Interceptor::on_message`].
    fn response_view(&self, _call: &Call) -> Option<SkimSpec> {
        None
    }
}

/// The set of interceptors a proxy runs, in order.
///
/// **A panic in a hook ends that hook's part in that call only** (RELIABILITY.md, "crisp's own
/// faults"): the call goes on as if the interceptor had no interest — `interest` counts as
/// none, `on_request` as [`Verdict::Forward`] (the client's bytes, unpatched: fail open, what
/// kubelet would get without crisp), `on_response` as no replacement — and the connection and
/// its other calls never notice. Each panic is counted and logged with the route; once a route
/// has panicked [`BYPASS_AFTER`] times, every interceptor is skipped for it until crisp
/// restarts, so a request that panics deterministically is relayed unobserved on kubelet's
/// retries instead of panicking on each.
#[derive(Default, Clone)]
pub struct Interceptors {
    list: Vec<std::sync::Arc<dyn Interceptor>>,
    faults: std::sync::Arc<Faults>,
}

/// Panics of a route after which its calls skip the interceptors.
pub const BYPASS_AFTER: u32 = 3;

/// Hook panics, by route (`Rpc as usize`; the last slot: paths crisp does not know).
pub struct Faults {
    panics: [AtomicU32; ROUTE_SLOTS],
    bypassed: [AtomicBool; ROUTE_SLOTS],
    total: AtomicU64,
    /// Of `total`: panics of the relay core itself (`src/proxy/relay`), not of a hook.
    relay: AtomicU64,
}

const ROUTE_SLOTS: usize = 64;
// Every RPC has a slot of its own, and unknown paths the last one.
const _: () = assert!(crate::cri::Rpc::ALL.len() < ROUTE_SLOTS - 1);

impl Default for Faults {
    fn default() -> Self {
        Faults {
            panics: std::array::from_fn(|_| AtomicU32::new(0)),
            bypassed: std::array::from_fn(|_| AtomicBool::new(false)),
            total: AtomicU64::new(0),
            relay: AtomicU64::new(0),
        }
    }
}

impl Faults {
    fn slot(route: Route) -> usize {
        route
            .rpc
            .map_or(ROUTE_SLOTS - 1, |r| (r as usize).min(ROUTE_SLOTS - 2))
    }

    /// Whether the calls of `route` skip the interceptors (and the relay core's observation of
    /// them) after repeated panics.
    #[inline]
    pub(crate) fn bypassed(&self, route: Route) -> bool {
        self.bypassed[Self::slot(route)].load(Relaxed)
    }

    /// Counts a panic on `route`: how many so far, and whether this one bypassed the route.
    fn count(&self, route: Route) -> (u32, bool) {
        let slot = Self::slot(route);
        self.total.fetch_add(1, Relaxed);
        let n = self.panics[slot].fetch_add(1, Relaxed).saturating_add(1);
        let bypassed = n >= BYPASS_AFTER && !self.bypassed[slot].swap(true, Relaxed);
        (n, bypassed)
    }

    /// The relay core panicked on call `call` of `route`, at `place`: counted with the hooks'
    /// panics (the same bound bypasses the route: its calls then take the plain relay path,
    /// which skips the code that observes them), and logged naming the route. `outcome`: what
    /// became of the call and its connection.
    #[cold]
    pub(crate) fn relay_panicked(&self, route: Route, call: u64, place: &str, outcome: &str) {
        self.relay.fetch_add(1, Relaxed);
        let (n, bypassed) = self.count(route);
        if bypassed {
            tracing::error!(
                rpc = %route,
                call,
                place,
                panics = n,
                "crisp panicked {n} times on this route (a bug: please report it with the panic \
                 message above); {outcome}; its calls are relayed unobserved (no ordering, tap \
                 or metrics for them) until crisp restarts"
            );
        } else {
            tracing::error!(
                rpc = %route,
                call,
                place,
                panics = n,
                "crisp panicked on a call (a bug: please report it with the panic message \
                 above); {outcome}"
            );
        }
    }

    /// A hook panicked on a call of `route`.
    #[cold]
    fn panicked(&self, route: Route, call: u64, hook: &str) {
        let (n, bypassed) = self.count(route);
        if n < BYPASS_AFTER {
            tracing::error!(
                rpc = %route,
                call,
                hook,
                "an interceptor panicked (a bug: please report it with the panic message above); \
                 this call goes on as if unobserved"
            );
        } else if bypassed {
            tracing::error!(
                rpc = %route,
                call,
                hook,
                panics = n,
                "interceptors panicked {n} times on this route: its calls are relayed \
                 unobserved (no ordering, tap or metrics for them) until crisp restarts"
            );
        }
    }

    /// Panics so far: the hooks' and the relay core's.
    pub fn panics(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// Of [`Faults::panics`]: the relay core's own.
    pub fn relay_panics(&self) -> u64 {
        self.relay.load(Relaxed)
    }

    /// Routes whose calls skip the interceptors now.
    pub fn bypassed_routes(&self) -> u64 {
        self.bypassed.iter().filter(|b| b.load(Relaxed)).count() as u64
    }
}

/// Runs `f`, catching a panic (the hook's fault, counted by the caller).
#[inline]
fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

/// A future whose panics are caught: `Err(())` when polling it panicked.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let inner = &mut self.0;
        match guarded(|| Pin::new(inner).poll(cx)) {
            Some(std::task::Poll::Ready(v)) => std::task::Poll::Ready(Ok(v)),
            Some(std::task::Poll::Pending) => std::task::Poll::Pending,
            None => std::task::Poll::Ready(Err(())),
        }
    }
}

impl Interceptors {
    pub fn new(list: Vec<std::sync::Arc<dyn Interceptor>>) -> Self {
        Interceptors {
            list,
            faults: Default::default(),
        }
    }

    /// Hook panics and bypassed routes (the admin socket's metrics).
    pub fn faults(&self) -> &std::sync::Arc<Faults> {
        &self.faults
    }

    /// One interceptor's interest, a panic counting as none.
    #[inline]
    fn interest_of(&self, i: &dyn Interceptor, call: &Call) -> Interest {
        guarded(|| i.interest(call)).unwrap_or_else(|| {
            self.faults.panicked(call.route, call.id, "interest");
            Interest::NONE
        })
    }

    pub(crate) fn interest(&self, call: &Call) -> Interest {
        if self.faults.bypassed(call.route) {
            return Interest::NONE;
        }
        self.list.iter().fold(Interest::NONE, |acc, i| {
            acc.union(self.interest_of(i.as_ref(), call))
        })
    }

    pub(crate) async fn on_request(&self, call: &Call, msg: &[u8]) -> Verdict {
        let mut patched: Option<Bytes> = None;
        for i in &self.list {
            if self.interest_of(i.as_ref(), call).request {
                let current = patched.as_deref().unwrap_or(msg);
                let Some(fut) = guarded(|| i.on_request(call, current)) else {
                    self.faults.panicked(call.route, call.id, "on_request");
                    continue;
                };
                match CatchUnwind(fut).await {
                    Ok(Verdict::Forward) => {}
                    Ok(Verdict::ForwardPatched(b)) => patched = Some(b),
                    Ok(Verdict::Refuse(s)) => return Verdict::Refuse(s),
                    Err(()) => self.faults.panicked(call.route, call.id, "on_request"),
                }
            }
        }
        match patched {
            Some(b) => Verdict::ForwardPatched(b),
            None => Verdict::Forward,
        }
    }

    /// Whether the request/response interest in `call` is conditional on its request: some
    /// interceptor wants the request or the response, and each that does says
    /// [`Interceptor::conditional`] (a panic counts as unconditional: the call is observed, as
    /// without the question).
    pub(crate) fn conditional(&self, call: &Call) -> bool {
        if self.faults.bypassed(call.route) {
            return false;
        }
        let mut any = false;
        for i in &self.list {
            let interest = self.interest_of(i.as_ref(), call);
            if !(interest.request || interest.response) {
                continue;
            }
            let conditional = guarded(|| i.conditional(call)).unwrap_or_else(|| {
                self.faults.panicked(call.route, call.id, "conditional");
                false
            });
            if !conditional {
                return false;
            }
            any = true;
        }
        any
    }

    /// For a call whose interest is [`Interceptors::conditional`]: whether an interceptor wants
    /// it, its request message `req` seen (a panic counts as not wanted, as in
    /// [`Interceptors::wants_response`]).
    pub(crate) fn wants_call(&self, call: &Call, req: &[u8]) -> bool {
        self.list.iter().any(|i| {
            let interest = self.interest_of(i.as_ref(), call);
            (interest.request || interest.response)
                && guarded(|| i.wants_response(call, req)).unwrap_or_else(|| {
                    self.faults.panicked(call.route, call.id, "wants_response");
                    false
                })
        })
    }

    /// Whether any interceptor that asked for the response still wants it, the request seen.
    pub(crate) fn wants_response(&self, call: &Call, req: &[u8]) -> bool {
        self.list.iter().any(|i| {
            self.interest_of(i.as_ref(), call).response
                && guarded(|| i.wants_response(call, req)).unwrap_or_else(|| {
                    self.faults.panicked(call.route, call.id, "wants_response");
                    false
                })
        })
    }

    pub(crate) fn on_response(
        &self,
        call: &Call,
        req: &[u8],
        msg: Option<&[u8]>,
        code: i32,
    ) -> Option<Bytes> {
        let mut replaced: Option<Bytes> = None;
        for i in &self.list {
            if self.interest_of(i.as_ref(), call).response {
                let current = replaced.as_deref().or(msg);
                match guarded(|| i.on_response(call, req, current, code)) {
                    Some(Some(new)) => replaced = Some(new),
                    Some(None) => {}
                    None => self.faults.panicked(call.route, call.id, "on_response"),
                }
            }
        }
        replaced
    }

    /// The first view asked for.
    pub(crate) fn response_view(&self, call: &Call) -> Option<SkimSpec> {
        self.list.iter().find_map(|i| {
            guarded(|| i.response_view(call)).unwrap_or_else(|| {
                self.faults.panicked(call.route, call.id, "response_view");
                None
            })
        })
    }

    pub(crate) fn on_message(&self, call: &Call, msg: &StreamedMessage, since_start: Duration) {
        for i in &self.list {
            if guarded(|| i.on_message(call, msg, since_start)).is_none() {
                self.faults.panicked(call.route, call.id, "on_message");
            }
        }
    }

    pub(crate) fn on_complete(&self, call: &Call, outcome: &Outcome) {
        for i in &self.list {
            if self.interest_of(i.as_ref(), call).complete
                && guarded(|| i.on_complete(call, outcome)).is_none()
            {
                self.faults.panicked(call.route, call.id, "on_complete");
            }
        }
    }
}

/// Names for the ids a call carries, from whatever tracks pods (the ordering engine): lets the
/// tap name calls without depending on the engine.
pub trait PodNames: Send + Sync {
    #[allow(clippy::type_complexity)]
    /// `(namespace, name)` of the pod of `sandbox_id` (or of the container's sandbox), and
    /// `(sandbox id, container name)` of `container_id`, where known.
    fn names(
        &self,
        sandbox_id: Option<&str>,
        container_id: Option<&str>,
    ) -> (Option<(String, String)>, Option<(String, String)>);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Wants status calls' requests and responses, for the request `marked` only.
    struct Conditional;

    impl Interceptor for Conditional {
        fn interest(&self, _: &Call) -> Interest {
            Interest {
                request: true,
                response: true,
                complete: false,
                view: false,
            }
        }
        fn conditional(&self, _: &Call) -> bool {
            true
        }
        fn wants_response(&self, _: &Call, req: &[u8]) -> bool {
            req == b"marked"
        }
    }

    /// Wants to see every request (the tap with a subscriber), or only every end (metrics).
    struct Plain(Interest);

    impl Interceptor for Plain {
        fn interest(&self, _: &Call) -> Interest {
            self.0
        }
    }

    struct PanicsWhenAsked;

    impl Interceptor for PanicsWhenAsked {
        fn interest(&self, _: &Call) -> Interest {
            Interest {
                request: true,
                ..Interest::NONE
            }
        }
        fn conditional(&self, _: &Call) -> bool {
            std::panic::resume_unwind(Box::new("a bug (injected)"))
        }
    }

    fn call() -> Call {
        let path = "/runtime.v1.RuntimeService/ContainerStatus";
        Call {
            route: Route::from_path(path),
            path: http::uri::PathAndQuery::from_static(path),
            received: Instant::now(),
            deadline: None,
            id: 1,
            trace: None,
        }
    }

    fn chain(list: Vec<Arc<dyn Interceptor>>) -> Interceptors {
        Interceptors::new(list)
    }

    #[test]
    fn an_interest_is_conditional_only_when_every_interested_interceptor_says_so() {
        let ends = Plain(Interest {
            complete: true,
            ..Interest::NONE
        });
        let c = chain(vec![Arc::new(Conditional), Arc::new(ends)]);
        assert!(
            c.conditional(&call()),
            "an interest in the end alone does not count"
        );
        assert!(c.wants_call(&call(), b"marked"));
        assert!(!c.wants_call(&call(), b"another"));

        let requests = Plain(Interest {
            request: true,
            ..Interest::NONE
        });
        let c = chain(vec![Arc::new(Conditional), Arc::new(requests)]);
        assert!(
            !c.conditional(&call()),
            "the tap watching: every call is observed"
        );
        assert!(
            !chain(vec![]).conditional(&call()),
            "no interest: nothing to hold"
        );
    }

    #[test]
    fn a_panic_asking_whether_an_interest_is_conditional_counts_as_unconditional() {
        let c = chain(vec![Arc::new(PanicsWhenAsked)]);
        assert!(!c.conditional(&call()));
        assert_eq!(c.faults().panics(), 1);
    }
}
