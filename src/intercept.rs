//! The seam where features (the ordering engine, the tap, metrics) plug into the forwarder.
//!
//! An [`Interceptor`] is asked, for every call, what it wants to see ([`Interest`]). A call nobody
//! is interested in takes the fast path: its bodies are spliced through without being buffered
//! or parsed. When someone is interested, the proxy buffers the (unary) request, hands the raw
//! message bytes to [`Interceptor::on_request`] — which may decode a copy, delay the call, or reject
//! it — and then forwards the *original* bytes. Response interest works the same way, and
//! [`Interceptor::on_response`] may return a replacement message (job mode's exit-code patch); it is
//! the only way forwarded bytes ever change.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;

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
}

/// Which parts of a call an interceptor wants to see.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Interest {
    /// Buffer the request and call `on_request` before forwarding.
    pub request: bool,
    /// Buffer the (unary) response and call `on_response` before returning it.
    pub response: bool,
    /// Call `on_complete` when the call ends.
    pub complete: bool,
}

impl Interest {
    pub const NONE: Interest = Interest { request: false, response: false, complete: false };

    pub fn is_none(&self) -> bool {
        *self == Interest::NONE
    }

    pub fn union(self, other: Interest) -> Interest {
        Interest { request: self.request || other.request, response: self.response || other.response, complete: self.complete || other.complete }
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
    Reject(Status),
}

/// How a call ended, for metrics and the tap.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// gRPC status code; `None` when the call ended without one (client went away mid-call).
    pub code: Option<i32>,
    pub duration: Duration,
    /// Time the call spent held in `on_request`.
    pub held: Duration,
    /// Request/response messages when they were buffered for someone.
    pub request: Option<Bytes>,
    pub response: Option<Bytes>,
    /// The call's grpc-message (decoded, at most [`crate::status::MAX_MESSAGE`] bytes), when it
    /// ended with one (gRPC servers send it with errors only) and crisp observed the call, or
    /// crisp ended it itself. A relayed call — one no interceptor asked to see — reports `None`.
    pub message: Option<String>,
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

    /// Sees the response. `msg` is `None` for a status-only answer. Returning `Some` replaces the
    /// message that goes back to the client.
    fn on_response(&self, _call: &Call, _req: &[u8], _msg: Option<&[u8]>, _code: i32) -> Option<Bytes> {
        None
    }

    fn on_complete(&self, _call: &Call, _outcome: &Outcome) {}
}

/// The set of interceptors a proxy runs, in order.
#[derive(Default, Clone)]
pub struct Interceptors {
    list: Vec<std::sync::Arc<dyn Interceptor>>,
}

impl Interceptors {
    pub fn new(list: Vec<std::sync::Arc<dyn Interceptor>>) -> Self {
        Interceptors { list }
    }

    pub fn interest(&self, call: &Call) -> Interest {
        self.list.iter().fold(Interest::NONE, |acc, i| acc.union(i.interest(call)))
    }

    pub async fn on_request(&self, call: &Call, msg: &[u8]) -> Verdict {
        let mut patched: Option<Bytes> = None;
        for i in &self.list {
            if i.interest(call).request {
                let current = patched.as_deref().unwrap_or(msg);
                match i.on_request(call, current).await {
                    Verdict::Forward => {}
                    Verdict::ForwardPatched(b) => patched = Some(b),
                    Verdict::Reject(s) => return Verdict::Reject(s),
                }
            }
        }
        match patched {
            Some(b) => Verdict::ForwardPatched(b),
            None => Verdict::Forward,
        }
    }

    pub fn on_response(&self, call: &Call, req: &[u8], msg: Option<&[u8]>, code: i32) -> Option<Bytes> {
        let mut replaced: Option<Bytes> = None;
        for i in &self.list {
            if i.interest(call).response {
                let current = replaced.as_deref().or(msg);
                if let Some(new) = i.on_response(call, req, current, code) {
                    replaced = Some(new);
                }
            }
        }
        replaced
    }

    pub fn on_complete(&self, call: &Call, outcome: &Outcome) {
        for i in &self.list {
            if i.interest(call).complete {
                i.on_complete(call, outcome);
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
    fn names(&self, sandbox_id: Option<&str>, container_id: Option<&str>) -> (Option<(String, String)>, Option<(String, String)>);
}
