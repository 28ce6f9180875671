//! The tokio side of a relayed connection: diverted streams, served by the observed path on
//! crisp's runtime, and the queue through which their answers reach the relay thread as
//! commands ([`Command`]). The tasks share no protocol state with the thread: the core encodes
//! their frames and applies the client's windows; a task sends at most [`ANSWER_BUDGET`] bytes
//! of DATA ahead of the credit the core gives back as it writes them.

use super::LOG;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::sync::{mpsc, Semaphore};

use super::answers::Command;
use super::core::Calls;
use super::flow::ANSWER_BUDGET;
use crate::intercept::{Call, CatchUnwind, Outcome};
use crate::proxy::body::{BodyPart, BoxError, ChannelBody, ProxyBody};
use crate::proxy::http2::{IdMap, Reason, StreamId};
use crate::proxy::runtime_pool::{Fields, RawFields};
use crate::proxy::sock::Wake;

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

/// The diverted streams' commands for the relay thread, and the flags by which the rest of
/// crisp reaches it.
pub(crate) struct Outbox {
    commands: Mutex<VecDeque<Command>>,
    /// Wakes the relay thread: `commands` has some, or `stop` / `kill` was set.
    pub(crate) wake: Wake,
    /// crisp is shutting down: GOAWAY, then finish what is in flight.
    pub(crate) stop: AtomicBool,
    /// The connection's task was dropped (the shutdown grace ended): close now.
    pub(crate) kill: AtomicBool,
}

impl Outbox {
    pub(crate) fn new(wake: Wake) -> Outbox {
        Outbox {
            commands: Mutex::new(VecDeque::new()),
            wake,
            stop: AtomicBool::new(false),
            kill: AtomicBool::new(false),
        }
    }

    /// Queues a command for the relay thread (woken if the queue was empty).
    pub(crate) fn send(&self, cmd: Command) {
        let was_empty = {
            let mut q = self.commands.lock();
            let was_empty = q.is_empty();
            q.push_back(cmd);
            was_empty
        };
        if was_empty {
            self.wake.notify();
        }
    }

    /// Moves the queued commands into `into` (empty), oldest first.
    pub(crate) fn take(&self, into: &mut VecDeque<Command>) {
        let mut q = self.commands.lock();
        if !q.is_empty() {
            std::mem::swap(&mut *q, into);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.commands.lock().is_empty()
    }
}

/// A diverted stream's task, as the relay thread keeps it.
struct Task {
    /// Aborted when the client resets the stream or goes away.
    abort: tokio::task::AbortHandle,
    /// How many more bytes of DATA the task may send ([`ANSWER_BUDGET`], given back by the
    /// core's [`super::core::Event::Credit`]).
    room: Arc<Semaphore>,
}

/// Diverted streams of one connection, on the relay thread: their tasks and their request
/// bodies' senders. Nothing here is shared with the tasks but their command queue.
pub(crate) struct Diverted {
    service: Arc<dyn Service>,
    outbox: Arc<Outbox>,
    tasks: IdMap<Task>,
    bodies: IdMap<mpsc::UnboundedSender<BodyPart>>,
}

impl Diverted {
    pub(crate) fn new(service: Arc<dyn Service>, outbox: Arc<Outbox>) -> Diverted {
        Diverted {
            service,
            outbox,
            tasks: IdMap::default(),
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
            let consumed = move |n: usize| outbox.send(Command::Consumed { stream, n });
            ProxyBody::Channel(ChannelBody::new(rx, Box::new(consumed)))
        };
        let req = req.map(|()| body);
        let room = Arc::new(Semaphore::new(ANSWER_BUDGET));
        let (service, outbox, task_room) =
            (self.service.clone(), self.outbox.clone(), room.clone());
        let h = tokio::spawn(async move {
            // A panic while serving this call ends this call only: it is answered INTERNAL and
            // its stream closed below, so the connection can still drain or move on.
            let answered = AtomicBool::new(false);
            let served = CatchUnwind(Box::pin(respond(
                service, &outbox, &task_room, stream, call, req, &answered,
            )))
            .await;
            if served.is_err() {
                answer_after_panic(&outbox, stream, answered.load(Ordering::Relaxed));
            }
            outbox.send(Command::Finished { stream });
        });
        self.tasks.insert(
            stream,
            Task {
                abort: h.abort_handle(),
                room,
            },
        );
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

    /// `n` bytes of the stream's answer were written: its task may send that many more.
    pub(crate) fn credit(&mut self, stream: StreamId, n: usize) {
        if let Some(t) = self.tasks.get(&stream) {
            t.room.add_permits(n);
        }
    }

    /// The stream's task ended ([`Command::Finished`]).
    pub(crate) fn finished(&mut self, stream: StreamId) {
        self.tasks.remove(&stream);
    }

    /// The client reset the stream.
    pub(crate) fn abort(&mut self, stream: StreamId) {
        self.bodies.remove(&stream);
        if let Some(t) = self.tasks.remove(&stream) {
            t.abort.abort();
        }
    }

    /// The client is gone (or was closed): nothing may stay behind.
    pub(crate) fn abort_all(&mut self) {
        self.bodies.clear();
        for (_, t) in self.tasks.drain() {
            t.abort.abort();
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
    let mut fields = crate::status::Status::panicked().to_header_map();
    outbox.send(if answered {
        fields.remove(http::header::CONTENT_TYPE);
        Command::Trailers { stream, fields }
    } else {
        Command::Headers {
            stream,
            status: http::StatusCode::OK,
            fields,
            end: true,
        }
    });
}

/// Serves a diverted stream through the observed path and sends its response to the relay
/// thread; `answered` is set once its response headers are sent.
async fn respond(
    service: Arc<dyn Service>,
    outbox: &Outbox,
    room: &Semaphore,
    stream: StreamId,
    call: Call,
    req: Request<ProxyBody>,
    answered: &AtomicBool,
) {
    let resp = service.divert(call, req).await;
    let (parts, mut body) = resp.into_parts();
    let end = body.is_end_stream();
    let headers = Command::Headers {
        stream,
        status: parts.status,
        fields: parts.headers,
        end,
    };
    if end {
        // The call's completion is reported when its body drops: before the client can see
        // the end of the call (and, say, read the metrics).
        drop(body);
        outbox.send(headers);
        answered.store(true, Ordering::Relaxed);
        return;
    }
    outbox.send(headers);
    answered.store(true, Ordering::Relaxed);
    loop {
        match body.frame().await {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => send_data(outbox, room, stream, d).await,
                Err(frame) => {
                    let fields = frame.into_trailers().unwrap_or_default();
                    drop(body);
                    outbox.send(Command::Trailers { stream, fields });
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
                outbox.send(Command::Reset {
                    stream,
                    reason: Reason::CANCEL,
                });
                return;
            }
            None => {
                drop(body);
                outbox.send(Command::Data {
                    stream,
                    bytes: Bytes::new(),
                    end: true,
                });
                return;
            }
        }
    }
}

/// Sends a diverted stream's response data to the relay thread, a frame at a time, each once
/// the core has room for it (at most [`ANSWER_BUDGET`] bytes ahead of what it wrote).
async fn send_data(outbox: &Outbox, room: &Semaphore, stream: StreamId, mut data: Bytes) {
    const CHUNK: usize = crate::proxy::http2::MAX_FRAME;
    while !data.is_empty() {
        let n = data.len().min(CHUNK);
        match room.acquire_many(n as u32).await {
            Ok(p) => p.forget(),
            // Never closed: the semaphore lives as long as the task.
            Err(_) => return,
        }
        outbox.send(Command::Data {
            stream,
            bytes: data.split_to(n),
            end: false,
        });
    }
}
