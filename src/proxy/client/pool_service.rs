//! The runtime pool as the tower service tonic's client calls ([`PoolService`]), and what it
//! hands back to crisp under tonic's statuses ([`Failure`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::intercept::BoxFuture;
use crate::proxy::body::ProxyBody;
use crate::proxy::runtime_pool::RuntimePoolError;
use crate::proxy::RuntimePool;
use crate::status::{code_of, message_of, Status};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where crisp's own calls go: the runtime pool, or a fake one in the tests.
pub(super) trait Runtime: Clone + Send + Sync + 'static {
    type Body: Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static;

    fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> impl Future<Output = Result<Response<Self::Body>, RuntimePoolError>> + Send;
}

impl Runtime for Arc<RuntimePool> {
    type Body = hyper::body::Incoming;

    fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> impl Future<Output = Result<Response<Self::Body>, RuntimePoolError>> + Send {
        RuntimePool::send(self, req)
    }
}

/// What went wrong under a tonic status, kept typed for [`super::client_error`] to read back
/// (tonic keeps a service's or a body's error as its status's source).
#[derive(Debug)]
pub(super) enum Failure {
    /// The pool could not carry the call; taken out once by the reader.
    Pool(parking_lot::Mutex<Option<RuntimePoolError>>),
    /// The runtime answered with a non-OK `grpc-status`, its message read as crisp reads every
    /// grpc-message ([`crate::status::message_of`]: percent-decoded, bounded).
    Answered(Status),
    /// The answer's body failed mid-way.
    Body(BoxError),
    /// tonic's request body could not be read (it holds one encoded message).
    Request(tonic::Status),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Pool(slot) => match &*slot.lock() {
                Some(e) => write!(f, "{e}"),
                None => f.write_str("the runtime pool failed the call"),
            },
            Failure::Answered(status) => write!(f, "the runtime answered {status}"),
            Failure::Body(e) => write!(f, "{e}"),
            Failure::Request(status) => write!(f, "the request: {}", status.message()),
        }
    }
}

impl std::error::Error for Failure {}

/// A header tonic would read and crisp never does: its `Status::from_header_map` panics on a
/// value that is not base64 (tonic 0.14.9), so the runtime's is dropped before tonic sees it.
const STATUS_DETAILS: &str = "grpc-status-details-bin";

/// The runtime's non-OK status in `h` (headers of a trailers-only answer, or trailers).
fn answered(h: &HeaderMap) -> Option<Failure> {
    match code_of(h) {
        Some(code) if code != crate::status::code::OK => Some(Failure::Answered(Status::new(
            code,
            message_of(h).unwrap_or_default(),
        ))),
        _ => None,
    }
}

/// [`Runtime::send`] as a tower service for tonic's [`tonic::client::Grpc`].
#[derive(Clone)]
pub(super) struct PoolService<R> {
    runtime: R,
}

impl<R> PoolService<R> {
    pub(super) fn new(runtime: R) -> Self {
        PoolService { runtime }
    }
}

impl<R: Runtime> tower_service::Service<Request<tonic::body::Body>> for PoolService<R> {
    type Response = Response<Answer<R::Body>>;
    type Error = Failure;
    type Future = BoxFuture<'static, Result<Self::Response, Failure>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failure>> {
        // The pool takes every call; it dials when it must, within the call.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        let runtime = self.runtime.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            // One encoded message, there at once: sent buffered, the pool sends it again when
            // the runtime refused the stream unprocessed.
            let data = body.collect().await.map_err(Failure::Request)?.to_bytes();
            let req = Request::from_parts(parts, ProxyBody::buffered(data, None));
            let resp = runtime
                .send(req)
                .await
                .map_err(|e| Failure::Pool(parking_lot::Mutex::new(Some(e))))?;
            let (mut parts, body) = resp.into_parts();
            parts.headers.remove(STATUS_DETAILS);
            if let Some(failure) = answered(&parts.headers) {
                return Err(failure);
            }
            Ok(Response::from_parts(parts, Answer { body }))
        })
    }
}

/// The runtime's answer body as tonic reads it: a non-OK status in its trailers becomes a
/// [`Failure::Answered`], and a body error a [`Failure::Body`].
pub(super) struct Answer<B> {
    body: B,
}

impl<B> Body for Answer<B>
where
    B: Body<Data = Bytes, Error: Into<BoxError>> + Unpin,
{
    type Data = Bytes;
    type Error = Failure;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        let frame = match std::task::ready!(Pin::new(&mut self.body).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(Failure::Body(e.into())))),
            Some(Ok(frame)) => frame,
        };
        Poll::Ready(Some(match frame.into_trailers() {
            Ok(mut trailers) => {
                trailers.remove(STATUS_DETAILS);
                match answered(&trailers) {
                    Some(failure) => Err(failure),
                    None => Ok(Frame::trailers(trailers)),
                }
            }
            Err(frame) => Ok(frame),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
