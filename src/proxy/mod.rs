//! The HTTP/2 forwarder: accepts kubelet's connections on a unix socket, routes each call by its
//! gRPC path, and forwards headers, messages and trailers to the runtime untouched.
//!
//! Every connection is served by the [`relay`], which gives it a runtime connection of its own.
//! A call takes one of these paths:
//! - **relayed** (nobody is interested): its frames are copied through by the relay thread;
//!   nothing is buffered or parsed but the request's header block (for the route).
//! - **observed** (an interceptor wants to see it): the relay diverts the stream here
//!   ([`Proxy`] as the relay's [`relay::Service`]); the unary request is buffered, shown to the
//!   interceptors (which may hold or reject it), and the same bytes are forwarded through pooled
//!   runtime connections ([`runtime_pool`]); the response may be buffered and shown too.
//! - **degraded**: a connection whose runtime connection is gone (or never came up) has every
//!   new stream diverted; those nobody is interested in are forwarded as they are
//!   (`forward_degraded`) until the client moves back to a relay.
//!
//! Modules, imports pointing one way: [`h2`] (frames and HPACK; imports nothing else of the
//! proxy) ← [`sock`], [`body`], [`runtime_pool`] ← [`relay`] ← this module (which serves diverted
//! calls); [`client`] is crisp's own runtime client, [`listener`] the socket.

pub(crate) mod body;
pub mod client;
pub mod http2;
pub mod listener;
pub(crate) mod relay;
/// The relay core's fuzz driver (`fuzz/fuzz_targets/core.rs`).
#[cfg(feature = "test-util")]
pub use self::relay::fuzzing as relay_fuzzing;
pub mod sock;
pub(crate) mod runtime_pool;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::net::UnixListener;
use tracing::Instrument;

use crate::cri::skim::Skimmer;
use crate::cri::wire::{self, Frame as GrpcFrame};
use crate::cri::RpcKind;
use crate::intercept::{Call, Interceptors, Outcome, Verdict};
use crate::status::{code, code_of, message_of, RuntimeLoss, Status};
use body::ProxyBody;
pub use runtime_pool::{RuntimePool, RuntimePoolOptions};

/// Tunables of the kubelet-facing side.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Largest message crisp buffers for an observed call. Unobserved calls have no limit.
    pub max_observed_message: usize,
    /// HTTP/2 keep-alive towards clients: a client that stops answering pings (or sent half a
    /// frame and went silent) is disconnected after interval + timeout.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// A connection that has not completed the HTTP/2 preface within this time is closed.
    pub handshake_timeout: Duration,
    /// On shutdown, in-flight calls get this long to finish.
    pub shutdown_grace: Duration,
    /// When a relay thread or the async runtime counts as stuck ([`crate::watchdog`]).
    pub watchdog: crate::watchdog::Options,
}

impl Default for ProxyOptions {
    fn default() -> Self {
        ProxyOptions::from(&crate::config::Config::default())
    }
}

impl From<&crate::config::Config> for ProxyOptions {
    fn from(cfg: &crate::config::Config) -> Self {
        ProxyOptions {
            max_observed_message: cfg.proxy.max_observed_message_bytes,
            keepalive_interval: cfg.proxy.keepalive_interval,
            keepalive_timeout: cfg.proxy.keepalive_timeout,
            handshake_timeout: cfg.proxy.handshake_timeout,
            shutdown_grace: cfg.proxy.shutdown_grace,
            watchdog: crate::watchdog::Options {
                relay_stall: cfg.watchdog.relay_stall,
                runtime_stall: cfg.watchdog.runtime_stall,
            },
        }
    }
}

impl From<&crate::config::Config> for RuntimePoolOptions {
    fn from(cfg: &crate::config::Config) -> Self {
        RuntimePoolOptions {
            connect_timeout: cfg.proxy.upstream_connect_timeout,
            connections: cfg.proxy.upstream_connections,
            ..Default::default()
        }
    }
}

/// Everything a connection handler needs; shared by all connections.
pub struct Proxy {
    upstream: Arc<RuntimePool>,
    interceptors: Interceptors,
    opts: ProxyOptions,
    next_id: AtomicU64,
    watchdog: Arc<crate::watchdog::Watchdog>,
}

impl Proxy {
    pub fn new(
        upstream: Arc<RuntimePool>,
        interceptors: Interceptors,
        opts: ProxyOptions,
    ) -> Arc<Self> {
        Arc::new(Proxy {
            upstream,
            interceptors,
            watchdog: crate::watchdog::Watchdog::new(opts.watchdog),
            opts,
            next_id: AtomicU64::new(1),
        })
    }

    /// The watchdog of this proxy's relay threads; [`serve`] runs its supervisor.
    pub fn watchdog(&self) -> &Arc<crate::watchdog::Watchdog> {
        &self.watchdog
    }

    /// Serves a diverted call (the relay numbered it: one id per call, which the tap's in-flight
    /// gauge counts against completions).
    async fn handle(self: Arc<Self>, mut call: Call, req: Request<ProxyBody>) -> Response<ResponseBody> {
        let route = call.route;
        let interest = self.interceptors.interest(&call);
        // kubelet's span, for a hold's own (src/otel.rs): read only here, on a call someone
        // buffers and so may hold; the header itself goes on to the runtime unchanged.
        if interest.request {
            call.trace = crate::otel::parent(req.headers());
        }

        // One span per RPC (docs/ARCHITECTURE.md, Conventions): mutating calls at info, polling
        // calls at debug.
        let span = match route.rpc.map(|r| r.kind()) {
            Some(RpcKind::Polling) => {
                tracing::debug_span!(
                    "rpc",
                    rpc = %route,
                    call = call.id,
                    pod_namespace = tracing::field::Empty,
                    pod_name = tracing::field::Empty,
                    pod_sandbox_id = tracing::field::Empty,
                    container_name = tracing::field::Empty,
                    container_id = tracing::field::Empty
                )
            }
            _ => {
                tracing::info_span!(
                    "rpc",
                    rpc = %route,
                    call = call.id,
                    pod_namespace = tracing::field::Empty,
                    pod_name = tracing::field::Empty,
                    pod_sandbox_id = tracing::field::Empty,
                    container_name = tracing::field::Empty,
                    container_id = tracing::field::Empty
                )
            }
        };
        if route.rpc.is_none() {
            span.in_scope(|| {
                tracing::debug!(
                    path = call.path.as_str(),
                    "forwarding a path crisp does not know"
                )
            });
        }

        let this = self.clone();
        let resp = async move {
            if interest.is_none() {
                return this.forward_degraded(req).await;
            }
            this.forward_observed(req, call, interest).await
        }
        .instrument(span)
        .await;
        resp
    }

    /// A call nobody is interested in reaches this module only from a degraded relay (one without
    /// a runtime connection of its own): forwarded as it is, through the pooled connections.
    async fn forward_degraded(&self, req: Request<ProxyBody>) -> Response<ResponseBody> {
        let (parts, body) = req.into_parts();
        match self.upstream.send(Request::from_parts(parts, body)).await {
            Ok(resp) => resp.map(|b| {
                ResponseBody::new(ProxyBody::RuntimePool(b), None).with_upstream(&self.upstream)
            }),
            Err(e) => self.unavailable(e),
        }
    }

    fn unavailable(&self, e: runtime_pool::UpstreamError) -> Response<ResponseBody> {
        tracing::warn!(error = %e, "call failed: upstream unavailable");
        Status::runtime_unavailable(&e)
            .to_response()
            .map(|b| ResponseBody::new(b, None))
    }

    /// A call some interceptor looks at: its request (unless streaming) is shown to them before it
    /// is forwarded, and its response as they asked; the completion reports the outcome once the
    /// response has gone out.
    async fn forward_observed(
        self: Arc<Self>,
        req: Request<ProxyBody>,
        call: Call,
        interest: crate::intercept::Interest,
    ) -> Response<ResponseBody> {
        let streaming = matches!(
            call.route.rpc.map(|r| r.kind()),
            Some(RpcKind::Streaming) | None
        );
        let (mut parts, body) = req.into_parts();
        let (upstream_body, held, req_bytes) = if interest.request && !streaming {
            match self.observe_request(&call, &mut parts, body).await {
                Ok(Observed { body, held, bytes }) => (body, held, Some(bytes)),
                Err(answered) => return answered,
            }
        } else {
            (body, Duration::ZERO, None)
        };

        let resp = match self
            .upstream
            .send(Request::from_parts(parts, upstream_body))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "call failed: upstream unavailable");
                let s = Status::runtime_unavailable(&e);
                self.complete(
                    &call,
                    Some(s.code),
                    Some(s.message.clone()),
                    held,
                    req_bytes,
                    None,
                );
                return s.to_response().map(|b| ResponseBody::new(b, None));
            }
        };

        // A view of the response (the tap's) is built as it streams on; never from a whole copy.
        let view = (!streaming)
            .then(|| self.interceptors.response_view(&call))
            .flatten();
        let completion = interest.complete.then(|| OutcomeReport {
            proxy: self.clone(),
            call: call.clone(),
            held,
            request: req_bytes.clone(),
            response: view.map(Skimmer::new),
            code: None,
            message: None,
        });
        // The request seen, an interceptor may no longer want the response (job mode: a status
        // call of a pod without a terminated sidecar): it streams through, never collected.
        let wanted = interest.response
            && match req_bytes.as_deref().map(wire::single_message) {
                Some(Some(GrpcFrame::Message(msg))) if !streaming => {
                    self.interceptors.wants_response(&call, msg)
                }
                _ => true,
            };
        if !wanted || streaming {
            return self.pass_response(resp, call, completion, interest.response && wanted);
        }
        self.observe_unary_response(resp, &call, req_bytes.as_deref(), completion)
            .await
    }

    /// Collects a unary request (up to `max_observed_message`), shows it to the interceptors within
    /// the client's deadline and makes it what they decide: forwarded as sent or patched (`Ok`),
    /// or answered by crisp (`Err`, the answer).
    async fn observe_request(
        self: &Arc<Self>,
        call: &Call,
        parts: &mut http::request::Parts,
        body: ProxyBody,
    ) -> Result<Observed, Response<ResponseBody>> {
        let (data, trailers) = match body::collect(body, self.opts.max_observed_message).await {
            Ok(x) => x,
            Err(body::CollectError::TooLarge(n)) => {
                let s = Status::new(
                    code::RESOURCE_EXHAUSTED,
                    format!("crisp: request message larger than {n} bytes"),
                );
                return Err(self.finish_early(call, s, Duration::ZERO));
            }
            // The client went away while sending; nothing to answer.
            Err(body::CollectError::Peer(e)) => {
                let s = Status::new(
                    code::CANCELLED,
                    format!("crisp: client request body failed: {e}"),
                );
                return Err(self.finish_early(call, s, Duration::ZERO));
            }
        };
        let start = Instant::now();
        let verdict = self.verdict(call, &data).await;
        let held = start.elapsed();
        let data = match verdict {
            None | Some(Ok(Verdict::Forward)) => data,
            Some(Ok(Verdict::ForwardPatched(msg))) => wire::frame(&msg),
            Some(Ok(Verdict::Refuse(s))) => return Err(self.finish_early(call, s, held)),
            // KUBELET-CRI §7.3: once kubelet's deadline is gone the call must never reach
            // the runtime, or a stale container would be created.
            Some(Err(_)) => {
                let s = Status::new(
                    code::DEADLINE_EXCEEDED,
                    "crisp: deadline exceeded while the call was held; not forwarded",
                );
                tracing::warn!(
                    held_ms = held.as_millis() as u64,
                    "held call reached the client's deadline; dropped"
                );
                return Err(self.finish_early(call, s, held));
            }
        };
        // A call held for a while reaches the runtime with the time the client has left, as
        // a gRPC proxy must (the client's own grpc-timeout counted from when it sent it).
        if let (Some(d), Some(raw)) = (
            call.deadline,
            parts.extensions.get_mut::<runtime_pool::RawFields>(),
        ) {
            if held >= Duration::from_millis(1) {
                raw.set_timeout(d.saturating_duration_since(Instant::now()));
            }
        }
        Ok(Observed {
            body: ProxyBody::buffered(data.clone(), trailers),
            held,
            bytes: data,
        })
    }

    /// The interceptors' verdict on a collected request; `Err` when the client's deadline passed
    /// first, `None` for a compressed or malformed message (nothing to look at: forwarded as is).
    async fn verdict(
        &self,
        call: &Call,
        data: &[u8],
    ) -> Option<Result<Verdict, tokio::time::error::Elapsed>> {
        let Some(GrpcFrame::Message(msg)) = wire::single_message(data) else {
            return None;
        };
        Some(match call.deadline {
            Some(d) => {
                tokio::time::timeout_at(d.into(), self.interceptors.on_request(call, msg)).await
            }
            None => Ok(self.interceptors.on_request(call, msg).await),
        })
    }

    /// A response nobody waits for (or a stream): forwarded as it arrives, its status noted for
    /// the completion. With `watch`, each message of a server stream is shown to the
    /// interceptors as it completes.
    fn pass_response(
        self: &Arc<Self>,
        resp: Response<Incoming>,
        call: Call,
        completion: Option<OutcomeReport>,
        watch: bool,
    ) -> Response<ResponseBody> {
        let (parts, body) = resp.into_parts();
        let completion = completion.map(|c| c.with_status(&parts.headers));
        let mut rb =
            ResponseBody::new(ProxyBody::RuntimePool(body), completion).with_upstream(&self.upstream);
        if watch && call.route.rpc.is_some() {
            rb.patcher = Some(Box::new(StreamPatcher {
                proxy: self.clone(),
                call,
                buf: bytes::BytesMut::new(),
                pending_trailers: None,
            }));
        }
        Response::from_parts(parts, rb)
    }

    /// A unary response the interceptors look at (the ordering engine: ids it learns, job mode's
    /// patch): collected up to `max_observed_message`, shown to them with the request, and sent
    /// on as they return it. A larger one is not held: what was read and the rest stream on
    /// unchanged, unseen. A trailers-only answer (the usual gRPC error form) carries its status
    /// in the headers and no message.
    async fn observe_unary_response(
        &self,
        resp: Response<Incoming>,
        call: &Call,
        req_bytes: Option<&[u8]>,
        completion: Option<OutcomeReport>,
    ) -> Response<ResponseBody> {
        let (parts, body) = resp.into_parts();
        let req_msg: &[u8] = match req_bytes.and_then(wire::single_message) {
            Some(GrpcFrame::Message(m)) => m,
            _ => &[],
        };
        if let Some(c) = code_of(&parts.headers) {
            self.interceptors.on_response(call, req_msg, None, c);
            let completion = completion.map(|comp| comp.with_status(&parts.headers));
            return Response::from_parts(
                parts,
                ResponseBody::new(ProxyBody::RuntimePool(body), completion),
            );
        }
        let limit = self.opts.max_observed_message.saturating_add(wire::PREFIX_LEN);
        let (data, trailers) = match body::collect_within(ProxyBody::RuntimePool(body), limit).await {
            Ok(body::Collected::Whole(data, trailers)) => (data, trailers),
            Ok(body::Collected::Over { head, rest }) => {
                tracing::debug!(
                    limit = self.opts.max_observed_message,
                    "response larger than max_observed_message: forwarded unobserved"
                );
                let mut rb = ResponseBody::new(rest, completion).with_upstream(&self.upstream);
                rb.head = Some(head);
                return Response::from_parts(parts, rb);
            }
            Err(e) => {
                tracing::warn!(error = %e, "upstream response body failed");
                let path = self.upstream.path().display();
                let s = Status::runtime_lost(Some(&path), RuntimeLoss::FailedMidResponse(&e));
                return Response::from_parts(
                    parts,
                    ResponseBody::new(
                        ProxyBody::buffered(Bytes::new(), Some(s.to_header_map())),
                        completion,
                    ),
                );
            }
        };
        let status = trailers.as_ref().and_then(code_of).unwrap_or(code::UNKNOWN);
        let mut out = data.clone();
        if let Some(GrpcFrame::Message(msg)) = wire::single_message(&data) {
            if let Some(replacement) =
                self.interceptors
                    .on_response(call, req_msg, Some(msg), status)
            {
                out = wire::frame(&replacement);
            }
        }
        Response::from_parts(
            parts,
            ResponseBody::new(ProxyBody::buffered(out, trailers), completion),
        )
    }

    fn finish_early(
        self: &Arc<Self>,
        call: &Call,
        s: Status,
        held: Duration,
    ) -> Response<ResponseBody> {
        self.complete(
            call,
            Some(s.code),
            Some(s.message.clone()),
            held,
            None,
            None,
        );
        s.to_response().map(|b| ResponseBody::new(b, None))
    }

    fn complete(
        &self,
        call: &Call,
        code: Option<i32>,
        message: Option<String>,
        held: Duration,
        request: Option<Bytes>,
        response: Option<crate::cri::skim::Skim>,
    ) {
        tracing::debug!(
            target: relay::CALLS,
            call = call.id,
            rpc = %call.route,
            path = call.path.as_str(),
            code = ?code,
            duration_us = call.received.elapsed().as_micros() as u64,
            held_ms = held.as_millis() as u64,
            "observed call ended"
        );
        let outcome = Outcome {
            code,
            duration: call.received.elapsed(),
            held,
            request,
            response,
            message,
        };
        self.interceptors.on_complete(call, &outcome);
    }
}

/// Reports a call's outcome once its response has fully gone out (or was abandoned).
struct OutcomeReport {
    proxy: Arc<Proxy>,
    call: Call,
    held: Duration,
    request: Option<Bytes>,
    /// Builds the view of the response asked for, from the bytes sent to the client.
    response: Option<Skimmer>,
    code: Option<i32>,
    message: Option<String>,
}

impl OutcomeReport {
    /// With the gRPC status (and message) an answer carries in its headers, if any.
    fn with_status(mut self, headers: &http::HeaderMap) -> OutcomeReport {
        self.code = code_of(headers);
        self.message = message_of(headers);
        self
    }
}

/// A request the interceptors let through: the body to forward, how long they held it, and the
/// bytes as forwarded (for the completion).
struct Observed {
    body: ProxyBody,
    held: Duration,
    bytes: Bytes,
}

impl Drop for OutcomeReport {
    fn drop(&mut self) {
        self.proxy.complete(
            &self.call,
            self.code,
            self.message.take(),
            self.held,
            self.request.take(),
            self.response.take().and_then(Skimmer::finish),
        );
    }
}

/// The response body sent to the client: the forwarded body, plus
/// - conversion of an upstream failure mid-stream into an UNAVAILABLE trailer, so the client sees
///   a clean gRPC error instead of a reset stream;
/// - the completion report, when someone wants it.
pub(crate) struct ResponseBody {
    /// Bytes already read from `inner`, sent first.
    head: Option<Bytes>,
    inner: ProxyBody,
    completion: Option<OutcomeReport>,
    patcher: Option<Box<StreamPatcher>>,
    /// Where a streamed body comes from, to name it when it fails mid-response.
    upstream: Option<Arc<RuntimePool>>,
    done: bool,
}

impl ResponseBody {
    fn new(inner: ProxyBody, completion: Option<OutcomeReport>) -> Self {
        ResponseBody {
            head: None,
            inner,
            completion,
            patcher: None,
            upstream: None,
            done: false,
        }
    }

    fn with_upstream(mut self, upstream: &Arc<RuntimePool>) -> Self {
        self.upstream = Some(upstream.clone());
        self
    }

    /// Shows bytes sent to the client to the view being built, if one is.
    fn view(&mut self, data: &[u8]) {
        if let Some(v) = self.completion.as_mut().and_then(|c| c.response.as_mut()) {
            v.push(data);
        }
    }
}

/// Reassembles the gRPC messages of a server stream so that interceptors can see (and patch)
/// each one. Only used for streams someone asked to watch; the others are spliced.
struct StreamPatcher {
    proxy: Arc<Proxy>,
    call: Call,
    buf: bytes::BytesMut,
    pending_trailers: Option<http::HeaderMap>,
}

impl StreamPatcher {
    /// Adds received bytes; returns the complete messages (patched where asked) to send on.
    fn push(&mut self, data: &[u8]) -> Option<Bytes> {
        self.buf.extend_from_slice(data);
        let mut out = bytes::BytesMut::new();
        while let Some((_, rest)) = wire::next_message(&self.buf) {
            let consumed = self.buf.len() - rest.len();
            let chunk = self.buf.split_to(consumed);
            match wire::single_message(&chunk) {
                Some(GrpcFrame::Message(m)) => {
                    match self
                        .proxy
                        .interceptors
                        .on_response(&self.call, &[], Some(m), code::OK)
                    {
                        Some(new) => out.extend_from_slice(&wire::frame(&new)),
                        None => out.extend_from_slice(&chunk),
                    }
                }
                _ => out.extend_from_slice(&chunk),
            }
        }
        // A message too large to be worth holding: pass what we have through as is.
        if self.buf.len() > self.proxy.opts.max_observed_message {
            out.extend_from_slice(&self.buf.split());
        }
        (!out.is_empty()).then(|| out.freeze())
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = body::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, body::BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(head) = self.head.take() {
            self.view(&head);
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        if let Some(t) = self
            .patcher
            .as_mut()
            .and_then(|p| p.pending_trailers.take())
        {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        let polled = loop {
            let polled = Pin::new(&mut self.inner).poll_frame(cx);
            let Some(p) = self.patcher.as_mut() else {
                break polled;
            };
            match polled {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(d) => match p.push(&d) {
                        Some(out) => break Poll::Ready(Some(Ok(Frame::data(out)))),
                        // Not a whole message yet: read more.
                        None => continue,
                    },
                    Err(frame) => {
                        // Trailers: flush a partial message first (the client will see it as
                        // truncated, exactly as it would have without crisp).
                        if !p.buf.is_empty() {
                            p.pending_trailers = frame.into_trailers().ok();
                            break Poll::Ready(Some(Ok(Frame::data(p.buf.split().freeze()))));
                        }
                        break Poll::Ready(Some(Ok(frame)));
                    }
                },
                // RuntimePool ended without trailers: flush a partial message first, as above.
                Poll::Ready(None) if !p.buf.is_empty() => {
                    break Poll::Ready(Some(Ok(Frame::data(p.buf.split().freeze()))))
                }
                other => break other,
            }
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    self.view(d);
                }
                if let Some(t) = frame.trailers_ref() {
                    if let Some(comp) = self.completion.as_mut() {
                        comp.code = code_of(t);
                        comp.message = message_of(t);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                tracing::warn!(
                    error = %e,
                    "upstream failed mid-response; ending the call with UNAVAILABLE"
                );
                let path = self.upstream.as_ref().map(|u| u.path().display());
                let socket = path.as_ref().map(|p| p as &dyn std::fmt::Display);
                let s = Status::runtime_lost(socket, RuntimeLoss::FailedMidResponse(&e));
                if let Some(comp) = self.completion.as_mut() {
                    comp.code = Some(s.code);
                    comp.message = Some(s.message.clone());
                }
                Poll::Ready(Some(Ok(Frame::trailers(s.to_header_map()))))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        // Trailers or bytes the patcher still holds are not sent yet, even if upstream is done.
        let holding = self
            .patcher
            .as_ref()
            .is_some_and(|p| p.pending_trailers.is_some() || !p.buf.is_empty());
        self.done || (self.head.is_none() && !holding && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Proxy {
    /// What the relay gets to see of crisp.
    fn relay_handle(self: &Arc<Self>) -> relay::Handle {
        let o = &self.opts;
        let options = relay::Options {
            handshake_timeout: o.handshake_timeout,
            keepalive_interval: o.keepalive_interval,
            keepalive_timeout: o.keepalive_timeout,
        };
        relay::Handle {
            options,
            runtime: self.upstream.clone(),
            service: self.clone(),
            watchdog: self.watchdog.clone(),
        }
    }
}

impl relay::Calls for Proxy {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn interest(&self, call: &Call) -> crate::intercept::Interest {
        self.interceptors.interest(call)
    }

    fn conditional(&self, call: &Call) -> bool {
        self.interceptors.conditional(call)
    }

    fn wants(&self, call: &Call, req: &[u8]) -> bool {
        self.interceptors.wants_call(call, req)
    }
}

impl relay::Service for Proxy {
    fn completed(&self, call: &Call, outcome: &Outcome) {
        self.interceptors.on_complete(call, outcome);
    }

    fn divert(
        self: Arc<Self>,
        call: Call,
        req: Request<ProxyBody>,
    ) -> Pin<Box<dyn Future<Output = Response<relay::DivertedBody>> + Send>> {
        Box::pin(async move {
            let resp = self.handle(call, req).await;
            resp.map(http_body_util::BodyExt::boxed_unsync)
        })
    }
}

/// Serves kubelet-facing connections on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight calls finish within `shutdown_grace`. Every connection is relayed
/// ([`relay`]).
pub async fn serve(listener: UnixListener, proxy: Arc<Proxy>, shutdown: impl Future<Output = ()>) {
    // Connection tasks, so that those still busy when the grace ends can be closed.
    let mut conns = tokio::task::JoinSet::new();
    // Tells relayed connections to send GOAWAY and finish.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let handle = proxy.relay_handle();
    // Liveness: the supervisor thread and the async runtime's heartbeat, for as long as crisp
    // serves. Without them crisp still serves; it only cannot notice being stuck.
    let watchdog = proxy.watchdog.clone();
    let supervisor = match watchdog.start() {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the watchdog thread; serving without it");
            None
        }
    };
    tokio::spawn(watchdog.runtime_heartbeat());
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            // Shutdown first: select! otherwise picks a ready branch at random, and a
            // connection still queued when the signal came could be accepted here only to be
            // sent GOAWAY before its first call (a grpc-go client then fails every call it had
            // queued). Left in the queue, it is the next instance's: under socket activation
            // systemd keeps the listening socket across a restart.
            biased;
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        while conns.try_join_next().is_some() {}
        conns.spawn(relay::serve_connection(
            stream,
            handle.clone(),
            stop_rx.clone(),
        ));
    }
    drop(listener);
    let grace = proxy.opts.shutdown_grace;
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: no longer accepting, draining in-flight calls"
    );
    let _ = stop_tx.send(true);
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_err() {
        tracing::warn!("shutdown grace elapsed with calls still in flight; closing them");
        conns.abort_all();
        while conns.join_next().await.is_some() {}
    }
    watchdog.stop();
    if let Some(t) = supervisor {
        t.thread().unpark();
    }
}
