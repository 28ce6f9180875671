//! The observed path: a diverted call some interceptor looks at, served on tokio. Its unary
//! request is collected (up to `max_observed_message`) and shown to the interceptors, which may
//! hold, patch or refuse it; the same bytes then go to the runtime through the pooled
//! connections ([`super::runtime_pool`]), and the response is shown too when they ask
//! ([`response`]). A call nobody looks at arrives here only from a degraded relay and is
//! forwarded as it is. The outcome is reported once, when the answer has gone out
//! ([`OutcomeReport`]).

mod response;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use tracing::Instrument;

use super::body::{self, ProxyBody};
use super::{relay, runtime_pool, Proxy};
use crate::cri::skim::{SkimSpec, Skimmer, StreamSkimmer};
use crate::cri::wire::{self, Frame as GrpcFrame};
use crate::cri::RpcKind;
use crate::intercept::{Call, Outcome, Streamed, Verdict};
use crate::status::{code, code_of, message_of, RuntimeLoss, Status};
pub(crate) use response::ResponseBody;
use response::StreamPatcher;

impl Proxy {
    /// Serves a diverted call (the relay numbered it: one id per call, which the tap's in-flight
    /// gauge counts against ended calls).
    pub(super) async fn handle(
        self: Arc<Self>,
        mut call: Call,
        req: Request<ProxyBody>,
    ) -> Response<ResponseBody> {
        let route = call.route;
        let interest = self.interceptors.interest(&call);
        // kubelet's span, for a hold's own (src/otel.rs): read only here, on a call someone
        // buffers and so may hold; the header itself goes on to the runtime unchanged.
        if interest.request {
            call.trace = crate::otel::parent(req.headers());
        }

        // One span per diverted call (docs/ARCHITECTURE.md, Conventions): mutating calls at info,
        // polling calls at debug. Relayed calls get none.
        // The same fields at either level (a span's level is fixed where it is written).
        macro_rules! rpc_span {
            ($level_span:ident) => {
                tracing::$level_span!(
                    "rpc",
                    rpc = %route,
                    call = call.id,
                    pod_namespace = tracing::field::Empty,
                    pod_name = tracing::field::Empty,
                    pod_sandbox_id = tracing::field::Empty,
                    container_name = tracing::field::Empty,
                    container_id = tracing::field::Empty
                )
            };
        }
        let span = match route.rpc.map(|r| r.kind()) {
            Some(RpcKind::Polling) => rpc_span!(debug_span),
            _ => rpc_span!(info_span),
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
        match self.runtime.send(Request::from_parts(parts, body)).await {
            Ok(resp) => resp.map(|b| {
                ResponseBody::new(ProxyBody::RuntimePool(b), None).with_runtime(&self.runtime)
            }),
            Err(e) => self.unavailable(e),
        }
    }

    fn unavailable(&self, e: runtime_pool::RuntimePoolError) -> Response<ResponseBody> {
        tracing::warn!(error = %e, "call failed: runtime unavailable");
        Status::runtime_unavailable(&e)
            .to_response()
            .map(|b| ResponseBody::new(b, None))
    }

    /// A call some interceptor looks at: its request (unless streaming) is shown to them before it
    /// is forwarded, and its response as they asked; the report gives the outcome once the
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
        // A view (`Interest::view`) of a call diverted for another interceptor is taken here:
        // its request is buffered too, so that `on_complete` sees it as on the relay.
        let (runtime_body, held, req_bytes) = if (interest.request || interest.view) && !streaming {
            match self.observe_request(&call, &mut parts, body).await {
                Ok(Observed { body, held, bytes }) => (body, held, Some(bytes)),
                Err(answered) => return answered,
            }
        } else {
            (body, Duration::ZERO, None)
        };

        let resp = match self
            .runtime
            .send(Request::from_parts(parts, runtime_body))
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "call failed: runtime unavailable");
                let s = Status::runtime_unavailable(&e);
                self.complete(
                    &call,
                    Some(s.code),
                    Some(s.message.clone()),
                    held,
                    req_bytes,
                    None,
                    None,
                );
                return s.to_response().map(|b| ResponseBody::new(b, None));
            }
        };

        // A view of the response (the tap's) is built as it streams on; never from a whole copy.
        // A stream's is a view of each message, shown to the interceptors as it completes.
        let view = self.interceptors.response_view(&call);
        let report = interest.complete.then(|| OutcomeReport {
            proxy: self.clone(),
            call: call.clone(),
            held,
            request: req_bytes.clone(),
            response: view.map(|spec| View::new(spec, streaming)),
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
            return self.pass_response(resp, call, report, interest.response && wanted);
        }
        self.observe_unary_response(resp, &call, req_bytes.as_deref(), report)
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
                let s = Status::request_too_large(n);
                return Err(self.finish_early(call, s, Duration::ZERO, None));
            }
            // The client went away while sending; nothing to answer.
            Err(body::CollectError::Peer(e)) => {
                let s = Status::request_body_failed(&e);
                return Err(self.finish_early(call, s, Duration::ZERO, None));
            }
        };
        let start = Instant::now();
        let verdict = self.verdict(call, &data).await;
        let held = start.elapsed();
        let data = match verdict {
            None | Some(Ok(Verdict::Forward)) => data,
            Some(Ok(Verdict::ForwardPatched(msg))) => wire::frame(&msg),
            Some(Ok(Verdict::Refuse(s))) => {
                return Err(self.finish_early(call, s, held, Some(data)))
            }
            // KUBELET-CRI §7.3: once kubelet's deadline is gone the call must never reach
            // the runtime, or a stale container would be created.
            Some(Err(_)) => {
                let s = Status::held_past_deadline();
                tracing::warn!(
                    held_ms = held.as_millis() as u64,
                    "held call reached the client's deadline; dropped"
                );
                return Err(self.finish_early(call, s, held, Some(data)));
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
    /// the report. With `watch`, each message of a server stream is shown to the
    /// interceptors as it completes.
    fn pass_response(
        self: &Arc<Self>,
        resp: Response<Incoming>,
        call: Call,
        report: Option<OutcomeReport>,
        watch: bool,
    ) -> Response<ResponseBody> {
        let (parts, body) = resp.into_parts();
        let report = report.map(|c| c.with_status(&parts.headers));
        let mut rb =
            ResponseBody::new(ProxyBody::RuntimePool(body), report).with_runtime(&self.runtime);
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
        report: Option<OutcomeReport>,
    ) -> Response<ResponseBody> {
        let (parts, body) = resp.into_parts();
        let req_msg: &[u8] = match req_bytes.and_then(wire::single_message) {
            Some(GrpcFrame::Message(m)) => m,
            _ => &[],
        };
        if let Some(c) = code_of(&parts.headers) {
            self.interceptors.on_response(call, req_msg, None, c);
            let report = report.map(|report| report.with_status(&parts.headers));
            return Response::from_parts(
                parts,
                ResponseBody::new(ProxyBody::RuntimePool(body), report),
            );
        }
        let limit = self
            .opts
            .max_observed_message
            .saturating_add(wire::PREFIX_LEN);
        let (data, trailers) = match body::collect_within(ProxyBody::RuntimePool(body), limit).await
        {
            Ok(body::Collected::Whole(data, trailers)) => (data, trailers),
            Ok(body::Collected::Over { head, rest }) => {
                tracing::debug!(
                    limit = self.opts.max_observed_message,
                    "response larger than max_observed_message: forwarded unobserved"
                );
                let mut rb = ResponseBody::new(rest, report).with_runtime(&self.runtime);
                rb.head = Some(head);
                return Response::from_parts(parts, rb);
            }
            Err(e) => {
                tracing::warn!(error = %e, "runtime response body failed");
                let path = self.runtime.path().display();
                let s = Status::runtime_lost(Some(&path), RuntimeLoss::FailedMidResponse(&e));
                return Response::from_parts(
                    parts,
                    ResponseBody::new(
                        ProxyBody::buffered(Bytes::new(), Some(s.to_header_map())),
                        report,
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
            ResponseBody::new(ProxyBody::buffered(out, trailers), report),
        )
    }

    /// crisp answers the call itself with `s` (never forwarded): the interceptors are told it
    /// ended, with the `request` as read when crisp read it whole (a refusal, a hold past the
    /// deadline: the tap records what kubelet asked for, and a replay can send it again).
    fn finish_early(
        self: &Arc<Self>,
        call: &Call,
        s: Status,
        held: Duration,
        request: Option<Bytes>,
    ) -> Response<ResponseBody> {
        self.complete(
            call,
            Some(s.code),
            Some(s.message.clone()),
            held,
            request,
            None,
            None,
        );
        s.to_response().map(|b| ResponseBody::new(b, None))
    }

    #[allow(clippy::too_many_arguments)]
    fn complete(
        &self,
        call: &Call,
        code: Option<i32>,
        message: Option<String>,
        held: Duration,
        request: Option<Bytes>,
        response: Option<crate::cri::skim::Skim>,
        streamed: Option<Streamed>,
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
            streamed,
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
    response: Option<View>,
    code: Option<i32>,
    message: Option<String>,
}

/// The view of a response being built: one of a unary message, or one of each message of a
/// stream (with what the stream held so far).
enum View {
    Unary(Skimmer),
    Stream(StreamSkimmer, Streamed),
}

impl View {
    fn new(spec: SkimSpec, streaming: bool) -> View {
        if streaming {
            View::Stream(StreamSkimmer::new(spec), Streamed::default())
        } else {
            View::Unary(Skimmer::new(spec))
        }
    }
}

impl OutcomeReport {
    /// Shows bytes sent to the client to the view being built; each message of a stream, once
    /// whole, goes to the interceptors. Holds one message's view at most, never a message.
    fn view(&mut self, data: &[u8]) {
        let (proxy, call) = (&self.proxy, &self.call);
        match &mut self.response {
            Some(View::Unary(s)) => s.push(data),
            Some(View::Stream(s, streamed)) => s.push(data, |m| {
                streamed.messages += 1;
                streamed.bytes += m.wire_len;
                proxy
                    .interceptors
                    .on_message(call, &m, call.received.elapsed());
            }),
            None => {}
        }
    }

    /// With the gRPC status (and message) an answer carries in its headers, if any.
    fn with_status(mut self, headers: &http::HeaderMap) -> OutcomeReport {
        self.code = code_of(headers);
        self.message = message_of(headers);
        self
    }
}

/// A request the interceptors let through: the body to forward, how long they held it, and the
/// bytes as forwarded (for the report).
struct Observed {
    body: ProxyBody,
    held: Duration,
    bytes: Bytes,
}

impl Drop for OutcomeReport {
    fn drop(&mut self) {
        let (response, streamed) = match self.response.take() {
            Some(View::Unary(s)) => (s.finish(), None),
            Some(View::Stream(s, mut streamed)) => {
                // A message the stream ended inside of: shown as far as it came.
                if let Some(m) = s.finish() {
                    streamed.messages += 1;
                    streamed.bytes += m.wire_len;
                    self.proxy.interceptors.on_message(
                        &self.call,
                        &m,
                        self.call.received.elapsed(),
                    );
                }
                (None, Some(streamed))
            }
            None => (None, None),
        };
        self.proxy.complete(
            &self.call,
            self.code,
            self.message.take(),
            self.held,
            self.request.take(),
            response,
            streamed,
        );
    }
}
