//! The runtime side of the calls crisp sends itself (diverted calls and crisp's own probes): a
//! few multiplexed HTTP/2 connections to the runtime's unix socket, hyper's HTTP/2 client,
//! re-dialled on demand after the runtime goes away. crisp never exits because the runtime did;
//! calls made while it is down fail fast with UNAVAILABLE naming the socket.
//!
//! What the runtime sees on these connections (relayed calls are different: their frames go
//! through as sent, see [`super::relay`]):
//! - the client's header fields in the client's order, every pseudo-header but `:authority`
//!   included. `:authority` is the client's when it is a valid URI authority, else `localhost`:
//!   grpc-go clients (kubelet 1.20–1.29, crictl) send the socket path there, which no URI can
//!   hold and hyper's h2 refuses (hyperium/h2#487). A runtime cannot rely on it: kubelet 1.30+
//!   itself dials with `localhost`, and containerd and CRI-O ignore it on their unix sockets.
//! - no PING: hyper's keep-alive and adaptive window (BDP pings) stay off, so a grpc-go server
//!   (containerd) never counts a ping strike against crisp's connections;
//! - GOAWAY and REFUSED_STREAM: a call the runtime never processed is sent again on a new
//!   connection (up to `RETRIES` times), as gRPC clients do transparently.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::RwLock;
use tokio::net::UnixStream;

use super::body::ProxyBody;
use crate::status::{grpc_timeout, RuntimeAt};

/// Why the runtime pool could not hand a call to the runtime. Each names the runtime's socket
/// as every message crisp writes about the runtime does ([`RuntimeAt`]).
#[derive(Debug, thiserror::Error)]
pub enum RuntimePoolError {
    #[error("{} unavailable: {source}", RuntimeAt::path(path))]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{} did not accept a connection within {timeout:?}",
        RuntimeAt::path(path)
    )]
    ConnectTimeout { path: String, timeout: Duration },
    #[error("{} HTTP/2 handshake failed: {source}", RuntimeAt::path(path))]
    Handshake { path: String, source: hyper::Error },
    #[error("{} failed the call: {source}", RuntimeAt::path(path))]
    Call { path: String, source: hyper::Error },
    #[error("{}: the request cannot be sent: {why}", RuntimeAt::path(path))]
    Request { path: String, why: String },
}

/// A request's header fields, in order (pseudo-headers first), as its client sent them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields(pub Vec<(Bytes, Bytes)>);

/// Tunables of the runtime-side connections.
#[derive(Debug, Clone)]
pub struct RuntimePoolOptions {
    pub(crate) connect_timeout: Duration,
    /// HTTP/2 connections to the runtime, used round-robin.
    pub(crate) connections: usize,
    pub(crate) stream_window: u32,
    pub(crate) connection_window: u32,
}

impl Default for RuntimePoolOptions {
    fn default() -> Self {
        RuntimePoolOptions {
            connect_timeout: Duration::from_secs(2),
            connections: 2,
            stream_window: 2 << 20,
            connection_window: 16 << 20,
        }
    }
}

/// The header fields of a request exactly as its client sent them (set by the relay on a diverted
/// call). Without it, the fields are built from the `http::Request`.
#[derive(Debug, Clone)]
pub(crate) struct RawFields(pub Fields);

impl RawFields {
    /// Replaces the value of `grpc-timeout` (if the client sent one) with `left`, in the unit
    /// grpc-go uses for it (at most 8 digits).
    pub(crate) fn set_timeout(&mut self, left: Duration) {
        let value = grpc_timeout(left);
        for (n, v) in self.0 .0.iter_mut() {
            if n.as_ref() == b"grpc-timeout" {
                *v = Bytes::from(value.clone());
            }
        }
    }
}

/// How often a call the runtime refused unprocessed (GOAWAY, REFUSED_STREAM) is sent again on a
/// new connection, as gRPC clients do transparently.
const RETRIES: usize = 3;
/// Largest DATA frame crisp lets the runtime send, and largest response header list.
const RECV_MAX_FRAME: u32 = 1 << 20;
const MAX_HEADER_LIST: u32 = 1 << 20;

type Conn = SendRequest<ProxyBody>;

pub struct RuntimePool {
    path: PathBuf,
    display: Arc<str>,
    opts: RuntimePoolOptions,
    /// A few multiplexed connections, used round-robin: one connection is driven by one task.
    slots: Vec<Slot>,
    next: std::sync::atomic::AtomicUsize,
    dials: std::sync::atomic::AtomicU64,
}

struct Slot {
    /// The live connection and its dial number. Read-locked on every call just long enough to
    /// clone it.
    current: RwLock<Option<(u64, Conn)>>,
    /// Serialises re-dials so that a burst of calls after a runtime restart dials once.
    dialing: tokio::sync::Mutex<()>,
}

impl RuntimePool {
    pub fn new(path: impl Into<PathBuf>, opts: RuntimePoolOptions) -> Self {
        let path = path.into();
        let display: Arc<str> = path.display().to_string().into();
        let slots = (0..opts.connections.max(1))
            .map(|_| Slot {
                current: RwLock::new(None),
                dialing: tokio::sync::Mutex::new(()),
            })
            .collect();
        RuntimePool {
            path,
            display,
            opts,
            slots,
            next: std::sync::atomic::AtomicUsize::new(0),
            dials: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many connections the pool has dialed so far (a new one after every runtime restart).
    pub(crate) fn dials(&self) -> u64 {
        self.dials.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn live(slot: &Slot) -> Option<(u64, Conn)> {
        let guard = slot.current.read();
        guard.as_ref().filter(|(_, c)| !c.is_closed()).cloned()
    }

    /// Forgets connection `dial` of slot `idx` (the runtime is going away on it: it sent GOAWAY
    /// or refused a stream), so that the next call there dials anew.
    fn retire(&self, idx: usize, dial: u64) {
        let slot = &self.slots[idx % self.slots.len()];
        let mut guard = slot.current.write();
        if guard.as_ref().is_some_and(|(d, _)| *d == dial) {
            *guard = None;
        }
    }

    async fn conn(&self, idx: usize) -> Result<(u64, Conn), RuntimePoolError> {
        let slot = &self.slots[idx % self.slots.len()];
        if let Some(c) = Self::live(slot) {
            return Ok(c);
        }
        let _dial = slot.dialing.lock().await;
        if let Some(c) = Self::live(slot) {
            return Ok(c);
        }
        let stream = self.connect().await?;
        let (tx, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(self.opts.stream_window)
            .initial_connection_window_size(self.opts.connection_window)
            .max_frame_size(RECV_MAX_FRAME)
            .max_header_list_size(MAX_HEADER_LIST)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|source| RuntimePoolError::Handshake {
                path: self.display.to_string(),
                source,
            })?;
        let name = self.display.clone();
        tokio::spawn(async move {
            match conn.await {
                Ok(()) => tracing::debug!(runtime = %name, "runtime connection closed"),
                Err(e) => {
                    tracing::debug!(runtime = %name, error = %e, "runtime connection failed")
                }
            }
        });
        tracing::debug!(runtime = %self.display, "connected to the runtime");
        let dial = self
            .dials
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *slot.current.write() = Some((dial, tx.clone()));
        Ok((dial, tx))
    }

    /// A new raw connection to the runtime's socket (the relay speaks HTTP/2 on it itself).
    pub(crate) async fn connect(&self) -> Result<UnixStream, RuntimePoolError> {
        let path = || self.display.to_string();
        match tokio::time::timeout(self.opts.connect_timeout, UnixStream::connect(&self.path)).await
        {
            Err(_) => Err(RuntimePoolError::ConnectTimeout {
                path: path(),
                timeout: self.opts.connect_timeout,
            }),
            Ok(Err(source)) => Err(RuntimePoolError::Connect {
                path: path(),
                source,
            }),
            Ok(Ok(s)) => Ok(s),
        }
    }

    /// Sends one request to the runtime. The returned future resolves with the response
    /// headers; the body streams. Dropping the future (client cancelled) resets the runtime's
    /// stream. A call the runtime refused unprocessed is sent again on a new connection when
    /// its request body was complete up front (every unary call crisp diverts).
    pub(crate) async fn send(
        &self,
        req: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, RuntimePoolError> {
        let (mut parts, body) = req.into_parts();
        let head = match parts.extensions.remove::<RawFields>() {
            Some(RawFields(f)) => {
                head_from_fields(&f).map_err(|why| RuntimePoolError::Request {
                    path: self.display.to_string(),
                    why,
                })?
            }
            None => {
                if parts.uri.authority().is_none() {
                    parts.uri = with_authority(&parts.uri, "localhost").map_err(|why| {
                        RuntimePoolError::Request {
                            path: self.display.to_string(),
                            why,
                        }
                    })?;
                }
                parts
            }
        };
        // A unary body complete up front can be sent again after the runtime refused it
        // unprocessed; any body can be sent again when hyper hands the request back unsent.
        let full = match &body {
            ProxyBody::Buffered { data, trailers } => {
                Some((data.clone().unwrap_or_default(), trailers.clone()))
            }
            _ => None,
        };
        let mut req = Request::from_parts(clone_head(&head), body);
        let mut attempt = 0;
        loop {
            let idx = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (dial, mut conn) = self.conn(idx).await?;
            let mut err = match conn.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(e) => e,
            };
            let again = match (err.take_message(), &full) {
                // Never sent (the connection was closing, e.g. after the runtime's GOAWAY).
                (Some(unsent), _) => Some(unsent),
                (None, Some((data, trailers))) if refused_unprocessed(err.error()) => {
                    Some(Request::from_parts(
                        clone_head(&head),
                        ProxyBody::buffered(data.clone(), trailers.clone()),
                    ))
                }
                _ => None,
            };
            match again {
                Some(r) if attempt < RETRIES => {
                    attempt += 1;
                    self.retire(idx, dial);
                    tracing::debug!(
                        runtime = %self.display,
                        error = %err.error(),
                        attempt,
                        "the runtime did not process the call; sending it on a new connection"
                    );
                    req = r;
                }
                _ => return Err(self.call_error(err.into_error())),
            }
        }
    }

    fn call_error(&self, source: hyper::Error) -> RuntimePoolError {
        RuntimePoolError::Call {
            path: self.display.to_string(),
            source,
        }
    }
}

/// Whether the runtime never processed a call that failed with `e`, so that it may be sent
/// again:
/// - hyper cancelled it: it never left crisp (its connection was closing);
/// - the runtime reset it with REFUSED_STREAM;
/// - h2 failed it with the runtime's GOAWAY: h2 gives a stream that error only when its id is
///   above the GOAWAY's last-stream-id (h2 0.4 `Streams::recv_go_away`), or when it was to be
///   opened after the GOAWAY; a stream at or below it that the connection's end cuts off fails
///   with a broken pipe instead, and is not retried (the runtime may have processed it).
fn refused_unprocessed(e: &hyper::Error) -> bool {
    if e.is_canceled() {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2e) = s.downcast_ref::<h2::Error>() {
            return h2e.reason() == Some(h2::Reason::REFUSED_STREAM)
                || (h2e.is_go_away() && h2e.is_remote());
        }
        source = s.source();
    }
    false
}

/// The request head a diverted call is sent with: the client's fields, in order, with
/// `:authority` kept when it is a valid URI authority (see the module doc).
fn head_from_fields(fields: &Fields) -> Result<http::request::Parts, String> {
    let (mut method, mut path, mut authority, mut scheme) = (None, None, None, None);
    let mut headers = http::HeaderMap::with_capacity(fields.0.len());
    for (n, v) in &fields.0 {
        match n.as_ref() {
            b":method" => {
                method = Some(
                    http::Method::from_bytes(v)
                        .map_err(|_| format!("invalid :method {:?}", String::from_utf8_lossy(v)))?,
                )
            }
            b":path" => path = Some(v.clone()),
            b":authority" => authority = http::uri::Authority::from_maybe_shared(v.clone()).ok(),
            b":scheme" => scheme = http::uri::Scheme::try_from(v.as_ref()).ok(),
            n if n.starts_with(b":") => {
                return Err(format!(
                    "unknown pseudo-header {:?}",
                    String::from_utf8_lossy(n)
                ))
            }
            n => {
                let name = HeaderName::from_bytes(n)
                    .map_err(|_| format!("invalid header name {:?}", String::from_utf8_lossy(n)))?;
                let value = HeaderValue::from_maybe_shared(v.clone())
                    .map_err(|_| format!("invalid value of header {name}"))?;
                headers.append(name, value);
            }
        }
    }
    let path = path.ok_or(":path missing")?;
    let uri = http::Uri::builder()
        .scheme(scheme.unwrap_or(http::uri::Scheme::HTTP))
        .authority(authority.unwrap_or_else(|| http::uri::Authority::from_static("localhost")))
        .path_and_query(
            http::uri::PathAndQuery::from_maybe_shared(path)
                .map_err(|e| format!("invalid :path ({e})"))?,
        )
        .build()
        .map_err(|e| e.to_string())?;
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = method.unwrap_or(http::Method::POST);
    parts.uri = uri;
    parts.version = http::Version::HTTP_2;
    parts.headers = headers;
    Ok(parts)
}

fn with_authority(uri: &http::Uri, authority: &'static str) -> Result<http::Uri, String> {
    let mut p = uri.clone().into_parts();
    p.scheme.get_or_insert(http::uri::Scheme::HTTP);
    p.authority = Some(http::uri::Authority::from_static(authority));
    if p.path_and_query.is_none() {
        p.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    http::Uri::from_parts(p).map_err(|e| e.to_string())
}

/// `http::request::Parts` is not `Clone` (extensions); a retry needs the method, URI, version
/// and headers only.
fn clone_head(p: &http::request::Parts) -> http::request::Parts {
    let (mut parts, ()) = Request::new(()).into_parts();
    parts.method = p.method.clone();
    parts.uri = p.uri.clone();
    parts.version = p.version;
    parts.headers = p.headers.clone();
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(authority: &str) -> Fields {
        let f = |n: &'static str, v: &str| {
            (
                Bytes::from_static(n.as_bytes()),
                Bytes::copy_from_slice(v.as_bytes()),
            )
        };
        Fields(vec![
            f(":method", "POST"),
            f(":scheme", "http"),
            f(":path", "/runtime.v1.RuntimeService/CreateContainer"),
            f(":authority", authority),
            f("content-type", "application/grpc"),
            f("user-agent", "grpc-go/1.33.1"),
            f("te", "trailers"),
            f("x-meta", "1"),
            f("x-meta", "2"),
        ])
    }

    #[test]
    fn a_diverted_call_keeps_its_fields_in_order_and_a_valid_authority() {
        let head = head_from_fields(&fields("localhost:10250")).unwrap();
        assert_eq!(head.method, http::Method::POST);
        assert_eq!(
            head.uri,
            "http://localhost:10250/runtime.v1.RuntimeService/CreateContainer"
        );
        let names: Vec<&str> = head.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["content-type", "user-agent", "te", "x-meta", "x-meta"]
        );
        let values: Vec<&[u8]> = head
            .headers
            .get_all("x-meta")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        assert_eq!(values, [b"1", b"2"]);
    }

    #[test]
    fn a_socket_path_authority_becomes_localhost() {
        for authority in ["/run/crisp/crisp.sock", ""] {
            let head = head_from_fields(&fields(authority)).unwrap();
            assert_eq!(
                head.uri.authority().map(|a| a.as_str()),
                Some("localhost"),
                "{authority:?}"
            );
            assert_eq!(
                head.uri.path(),
                "/runtime.v1.RuntimeService/CreateContainer"
            );
        }
    }

    #[test]
    fn fields_http_cannot_carry_are_refused_with_the_reason() {
        let mut f = fields("localhost");
        f.0.push((Bytes::from_static(b"Bad Name"), Bytes::from_static(b"x")));
        assert!(head_from_fields(&f)
            .unwrap_err()
            .contains("invalid header name"));
        let mut f = fields("localhost");
        f.0.retain(|(n, _)| n.as_ref() != b":path");
        assert_eq!(head_from_fields(&f).unwrap_err(), ":path missing");
    }

    #[test]
    fn grpc_timeout_values_round_trip_through_the_parser() {
        for d in [
            Duration::from_nanos(1),
            Duration::from_micros(1500),
            Duration::from_secs(119),
            Duration::from_secs(400_000),
        ] {
            let v = grpc_timeout(d);
            let back = crate::status::parse_grpc_timeout(v.as_bytes()).unwrap();
            assert!(
                back >= d && back <= d + d / 1000 + Duration::from_nanos(1),
                "{d:?} -> {v} -> {back:?}"
            );
        }
        assert_eq!(grpc_timeout(Duration::from_secs(115)), "115000m");
        assert_eq!(grpc_timeout(Duration::from_millis(1999)), "1999000u");
    }
}
