//! The tokio side of a relayed connection: diverted streams, served by the observed path on
//! crisp's runtime, and the queue through which their frames reach the relay thread.

use super::LOG;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{mpsc, Notify};

use super::core::Calls;
use super::flow::Windows;
use crate::intercept::{Call, CatchUnwind, Outcome};
use crate::proxy::body::{BodyPart, BoxError, ChannelBody, ProxyBody};
use crate::proxy::http2::{self, IdMap, Reason, RstStream, StreamId, WindowUpdate};
use crate::proxy::sock::Wake;
use crate::proxy::runtime_pool::{Fields, RawFields};

/// A diverted call's response body, as the observed path gives it.
pub(crate) type DivertedBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// What the relay needs of the rest of crisp: the route decision ([`Calls`]), where ended calls
/// are reported, and the observed path that serves diverted streams.
pub(crate) trait Service: Calls {
    fn completed(&self, call: &Call, outcome: &Outcome);
    /// Serves a diverted stream's request, the call the relay numbered for it.
    fn divert(
        self: Arc<Self>,
        call: Call,
        req: Request<ProxyBody>,
    ) -> Pin<Box<dyn Future<Output = Response<DivertedBody>> + Send>>;
}

/// Frames for the client that do not come from the runtime, from other threads (diverted
/// streams' tasks); the relay thread writes them between the runtime's frames.
pub(crate) struct Outbox {
    ctl: Mutex<Vec<u8>>,
    /// Wakes the relay thread: `ctl` has frames, or `stop` / `kill` was set.
    pub(crate) wake: Wake,
    /// crisp is shutting down: GOAWAY, then finish what is in flight.
    pub(crate) stop: AtomicBool,
    /// The connection's task was dropped (the shutdown grace ended): close now.
    pub(crate) kill: AtomicBool,
}

impl Outbox {
    pub(crate) fn new(wake: Wake) -> Outbox {
        Outbox {
            ctl: Mutex::new(Vec::new()),
            wake,
            stop: AtomicBool::new(false),
            kill: AtomicBool::new(false),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Vec<u8>> {
        self.ctl.lock()
    }

    pub(crate) fn send(&self, frame: &[u8]) {
        let was_empty = {
            let mut q = self.queue();
            let was_empty = q.is_empty();
            q.extend_from_slice(frame);
            was_empty
        };
        if was_empty {
            self.wake.notify();
        }
    }

    /// Moves the frames other threads queued for the client into `into`.
    pub(crate) fn take(&self, into: &mut Vec<u8>) {
        let mut q = self.queue();
        if !q.is_empty() {
            into.extend_from_slice(&q);
            q.clear();
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue().is_empty()
    }
}

/// Diverted streams of one connection: their tasks (aborted when the client resets the stream
/// or goes away) and their request bodies' senders.
pub(crate) struct Diverted {
    service: Arc<dyn Service>,
    windows: Arc<Windows>,
    /// Notified by `windows` when the client's window grew.
    changed: Arc<Notify>,
    outbox: Arc<Outbox>,
    tasks: Arc<Mutex<IdMap<tokio::task::AbortHandle>>>,
    bodies: IdMap<mpsc::UnboundedSender<BodyPart>>,
}

impl Diverted {
    /// `changed`: what `windows` notifies when the client's window grew.
    pub(crate) fn new(
        service: Arc<dyn Service>,
        windows: Arc<Windows>,
        changed: Arc<Notify>,
        outbox: Arc<Outbox>,
    ) -> Diverted {
        Diverted {
            service,
            windows,
            changed,
            outbox,
            tasks: Default::default(),
            bodies: IdMap::default(),
        }
    }

    /// Hands a stream to the observed path (on crisp's runtime: the caller has entered it).
    pub(crate) fn start(
        &mut self,
        stream: StreamId,
        call: Call,
        fields: Vec<(Bytes, Bytes)>,
        end_stream: bool,
    ) {
        let req = request_from_fields(fields);
        let body = if end_stream {
            ProxyBody::empty()
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            self.bodies.insert(stream, tx);
            let outbox = self.outbox.clone();
            // Consumed: the client may send that much more on this stream.
            let consumed = move |n: usize| {
                let mut w = Vec::with_capacity(13);
                WindowUpdate::new(stream, n as u32).encode(&mut w);
                outbox.send(&w);
            };
            ProxyBody::Channel(ChannelBody::new(rx, Box::new(consumed)))
        };
        let req = req.map(|()| body);
        let (service, windows, changed, outbox, tasks) = (
            self.service.clone(),
            self.windows.clone(),
            self.changed.clone(),
            self.outbox.clone(),
            self.tasks.clone(),
        );
        let mut map = self.tasks.lock();
        let h = tokio::spawn(async move {
            // A panic while serving this call ends this call only: it is answered INTERNAL and
            // its stream closed below, so the connection can still drain or move on.
            let answered = AtomicBool::new(false);
            let served = CatchUnwind(Box::pin(respond(
                service,
                (&windows, &changed),
                &outbox,
                stream,
                call,
                req,
                &answered,
            )))
            .await;
            if served.is_err() {
                answer_after_panic(&outbox, stream, answered.load(Ordering::Relaxed));
            }
            tasks.lock().remove(&stream);
            windows.lock().close_diverted(stream);
            windows.notify();
        });
        map.insert(stream, h.abort_handle());
    }

    pub(crate) fn body(&mut self, stream: StreamId, data: Bytes) {
        if let Some(tx) = self.bodies.get(&stream) {
            let _ = tx.send(BodyPart::Data(data));
        }
    }

    pub(crate) fn body_end(&mut self, stream: StreamId) {
        self.bodies.remove(&stream);
    }

    pub(crate) fn trailers(&mut self, stream: StreamId, fields: Vec<(Bytes, Bytes)>) {
        let Some(tx) = self.bodies.remove(&stream) else {
            return;
        };
        match trailers_from_fields(fields) {
            Ok(t) => {
                let _ = tx.send(BodyPart::Trailers(t));
            }
            Err(why) => {
                tracing::warn!(
                    target: LOG,
                    stream = stream.get(),
                    %why,
                    "client sent request trailers crisp cannot forward; dropped"
                )
            }
        }
    }

    /// The client reset the stream.
    pub(crate) fn abort(&mut self, stream: StreamId) {
        self.bodies.remove(&stream);
        if let Some(h) = self.tasks.lock().remove(&stream) {
            h.abort();
        }
    }

    /// The client is gone (or was closed): nothing may stay behind.
    pub(crate) fn abort_all(&mut self) {
        self.bodies.clear();
        for (_, h) in self.tasks.lock().drain() {
            h.abort();
        }
    }
}

/// A request from a header block's fields as the relay decoded them. The fields go to the
/// runtime in the client's order ([`RawFields`]; `:authority` as docs/ARCHITECTURE.md says); the
/// `http::Request` around them is what crisp itself reads (the path, `grpc-timeout`).
fn request_from_fields(fields: Vec<(Bytes, Bytes)>) -> Request<()> {
    let mut req = Request::new(());
    *req.version_mut() = http::Version::HTTP_2;
    for (n, v) in &fields {
        match n.as_ref() {
            b":method" => {
                if let Ok(m) = http::Method::from_bytes(v) {
                    *req.method_mut() = m;
                }
            }
            b":path" => {
                if let Ok(u) = http::Uri::from_maybe_shared(v.clone()) {
                    *req.uri_mut() = u;
                }
            }
            n if n.starts_with(b":") => {}
            n => {
                // A field http cannot represent still reaches the runtime (RawFields); crisp
                // only does not look at it.
                if let (Ok(name), Ok(value)) = (
                    http::HeaderName::from_bytes(n),
                    http::HeaderValue::from_maybe_shared(v.clone()),
                ) {
                    req.headers_mut().append(name, value);
                }
            }
        }
    }
    req.extensions_mut().insert(RawFields(Fields(fields)));
    req
}

/// Why request trailers cannot be forwarded.
#[derive(Debug, thiserror::Error)]
enum TrailerError {
    #[error("header name")]
    Name,
    #[error("header value")]
    Value,
}

/// Request trailers (pseudo-fields dropped).
fn trailers_from_fields(fields: Vec<(Bytes, Bytes)>) -> Result<http::HeaderMap, TrailerError> {
    let mut headers = http::HeaderMap::with_capacity(fields.len());
    for (n, v) in fields {
        if n.starts_with(b":") {
            continue;
        }
        let name = http::HeaderName::from_bytes(&n).map_err(|_| TrailerError::Name)?;
        let value = http::HeaderValue::from_maybe_shared(v).map_err(|_| TrailerError::Value)?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// What a diverted call gets when serving it panicked (a bug in crisp): INTERNAL, as trailers
/// after the response headers if those went out (`answered`), else as a trailers-only answer.
/// Whether the call reached the runtime is unknown, and the message says so.
fn answer_after_panic(outbox: &Outbox, stream: StreamId, answered: bool) {
    tracing::error!(
        target: LOG,
        stream = stream.get(),
        "serving a call panicked (a bug: please report it with the panic message above); the \
         call is answered INTERNAL, the connection's other calls go on"
    );
    let status = crate::status::Status::panicked();
    let mut block = Vec::with_capacity(192);
    if !answered {
        http2::encode_field(&mut block, b":status", b"200");
    }
    for (n, v) in &status.to_header_map() {
        if answered && n == http::header::CONTENT_TYPE {
            continue;
        }
        http2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
    }
    let mut out = Vec::with_capacity(block.len() + 16);
    http2::headers(&mut out, stream, &block, true);
    outbox.send(&out);
}

/// Serves a diverted stream through the observed path and writes its response to the client;
/// `answered` is set once its response headers are queued.
async fn respond(
    service: Arc<dyn Service>,
    windows: (&Windows, &Notify),
    outbox: &Outbox,
    stream: StreamId,
    call: Call,
    req: Request<ProxyBody>,
    answered: &AtomicBool,
) {
    let resp = service.divert(call, req).await;
    let (parts, mut body) = resp.into_parts();
    let mut block = Vec::with_capacity(256);
    http2::encode_field(&mut block, b":status", parts.status.as_str().as_bytes());
    for (n, v) in &parts.headers {
        http2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
    }
    let end = body.is_end_stream();
    let mut out = Vec::with_capacity(block.len() + 16);
    http2::headers(&mut out, stream, &block, end);
    answered.store(true, Ordering::Relaxed);
    if end {
        // The call's completion is reported when its body drops: before the client can see
        // the end of the call (and, say, read the metrics).
        drop(body);
        outbox.send(&out);
        return;
    }
    outbox.send(&out);
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => send_data(windows, outbox, stream, d).await,
                Err(frame) => {
                    let mut block = Vec::with_capacity(128);
                    if let Ok(t) = frame.into_trailers() {
                        for (n, v) in &t {
                            http2::encode_field(&mut block, n.as_str().as_bytes(), v.as_bytes());
                        }
                    }
                    let mut out = Vec::with_capacity(block.len() + 16);
                    http2::headers(&mut out, stream, &block, true);
                    drop(body);
                    outbox.send(&out);
                    return;
                }
            },
            Some(Err(e)) => {
                tracing::warn!(
                    target: LOG,
                    stream = stream.get(),
                    error = %e,
                    "response body failed; resetting the stream"
                );
                let mut out = Vec::new();
                RstStream::new(stream, Reason::CANCEL).encode(&mut out);
                outbox.send(&out);
                return;
            }
            None => {
                let mut out = Vec::new();
                http2::data(&mut out, stream, &[], true);
                drop(body);
                outbox.send(&out);
                return;
            }
        }
    }
}

/// Sends a diverted stream's response data within the client's windows.
async fn send_data(
    (windows, changed): (&Windows, &Notify),
    outbox: &Outbox,
    stream: StreamId,
    mut data: Bytes,
) {
    while !data.is_empty() {
        let notified = changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let n = match windows.lock().take_for_diverted(stream, data.len()) {
            None => return,
            Some(n) => n,
        };
        if n == 0 {
            notified.await;
            continue;
        }
        let chunk = data.split_to(n);
        let mut out = Vec::with_capacity(http2::HEADER_LEN + chunk.len());
        http2::data(&mut out, stream, &chunk, false);
        outbox.send(&out);
    }
}
