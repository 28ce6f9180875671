//! The response body a diverted call's client gets ([`ResponseBody`]): the runtime's body as it
//! streams, with each message of a watched server stream shown to the interceptors
//! ([`StreamPatcher`]), a runtime failure mid-response turned into an UNAVAILABLE trailer, and
//! the call's [`OutcomeReport`] fed with what went out.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::super::body::{self, ProxyBody};
use super::super::{Proxy, RuntimePool};
use super::OutcomeReport;
use crate::cri::wire::{self, Frame as GrpcFrame};
use crate::intercept::Call;
use crate::status::{code, code_of, message_of, RuntimeLoss, Status};

/// The response body sent to the client: the forwarded body, plus
/// - conversion of a runtime failure mid-stream into an UNAVAILABLE trailer, so the client sees
///   a clean gRPC error instead of a reset stream;
/// - the outcome report, when someone wants it.
pub(crate) struct ResponseBody {
    /// Bytes already read from `inner`, sent first.
    pub(super) head: Option<Bytes>,
    inner: ProxyBody,
    report: Option<OutcomeReport>,
    pub(super) patcher: Option<Box<StreamPatcher>>,
    /// Where a streamed body comes from, to name it when it fails mid-response.
    runtime: Option<Arc<RuntimePool>>,
    done: bool,
}

impl ResponseBody {
    pub(super) fn new(inner: ProxyBody, report: Option<OutcomeReport>) -> Self {
        ResponseBody {
            head: None,
            inner,
            report,
            patcher: None,
            runtime: None,
            done: false,
        }
    }

    pub(super) fn with_runtime(mut self, runtime: &Arc<RuntimePool>) -> Self {
        self.runtime = Some(runtime.clone());
        self
    }

    /// Shows bytes sent to the client to the view being built, if one is.
    fn view(&mut self, data: &[u8]) {
        if let Some(report) = self.report.as_mut() {
            report.view(data);
        }
    }
}

/// Reassembles the gRPC messages of a server stream so that interceptors can see (and patch)
/// each one. Only used for streams someone asked to watch; the others are spliced.
pub(super) struct StreamPatcher {
    pub(super) proxy: Arc<Proxy>,
    pub(super) call: Call,
    pub(super) buf: bytes::BytesMut,
    pub(super) pending_trailers: Option<http::HeaderMap>,
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
                    if let Some(report) = self.report.as_mut() {
                        report.code = code_of(t);
                        report.message = message_of(t);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.done = true;
                tracing::warn!(
                    error = %e,
                    "the runtime failed mid-response; ending the call with UNAVAILABLE"
                );
                let path = self.runtime.as_ref().map(|u| u.path().display());
                let socket = path.as_ref().map(|p| p as &dyn std::fmt::Display);
                let s = Status::runtime_lost(socket, RuntimeLoss::FailedMidResponse(&e));
                if let Some(report) = self.report.as_mut() {
                    report.code = Some(s.code);
                    report.message = Some(s.message.clone());
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
        // Trailers or bytes the patcher still holds are not sent yet, even if the runtime is done.
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
