//! The runtime side of the calls crisp sends itself (diverted calls and crisp's own probes): a
//! few multiplexed HTTP/2 connections ([`super::h2c`]) to the runtime's unix socket, re-dialled on
//! demand after the runtime goes away. crisp never exits because the runtime did; calls made while
//! it is down fail fast with UNAVAILABLE naming the socket.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tokio::net::UnixStream;

use super::body::ProxyBody;
use super::h2c::{self, Conn, Fields, RecvBody, SendBody};

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unix://{path} unavailable: {source}")]
    Connect { path: String, source: std::io::Error },
    #[error("upstream unix://{path} did not accept a connection within {timeout:?}")]
    ConnectTimeout { path: String, timeout: Duration },
    #[error("upstream unix://{path} HTTP/2 handshake failed: {source}")]
    Handshake { path: String, source: std::io::Error },
    #[error("upstream unix://{path} failed the call: {source}")]
    Call { path: String, source: h2c::Error },
}

/// Tunables of the runtime-side connections.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    pub connect_timeout: Duration,
    /// HTTP/2 connections to the runtime, used round-robin.
    pub connections: usize,
    pub stream_window: u32,
    pub connection_window: u32,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        UpstreamOptions { connect_timeout: Duration::from_secs(2), connections: 2, stream_window: 2 << 20, connection_window: 16 << 20 }
    }
}

/// The header fields of a request exactly as its client sent them (set by the relay on a diverted
/// call). Without it, the fields are built from the `http::Request`.
#[derive(Debug, Clone)]
pub struct RawFields(pub Fields);

impl RawFields {
    /// Replaces the value of `grpc-timeout` (if the client sent one) with `left`, in the unit
    /// grpc-go uses for it (at most 8 digits).
    pub fn set_timeout(&mut self, left: Duration) {
        let value = grpc_timeout(left);
        for (n, v) in self.0 .0.iter_mut() {
            if n.as_ref() == b"grpc-timeout" {
                *v = Bytes::from(value.clone());
            }
        }
    }
}

/// A `grpc-timeout` value: the finest unit whose count fits in 8 digits.
pub fn grpc_timeout(d: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let ns = d.as_nanos().max(1);
    for (div, unit) in [(1u128, 'n'), (1_000, 'u'), (1_000_000, 'm'), (1_000_000_000, 'S')] {
        let v = ns.div_ceil(div);
        if v <= MAX {
            return format!("{v}{unit}");
        }
    }
    format!("{}M", (ns / 60_000_000_000).clamp(1, MAX))
}

/// How often a call the runtime refused unprocessed (GOAWAY, REFUSED_STREAM) is sent again on a
/// new connection, as gRPC clients do transparently.
const RETRIES: usize = 3;

pub struct Upstream {
    path: PathBuf,
    display: Arc<str>,
    opts: UpstreamOptions,
    /// A few multiplexed connections, used round-robin: one connection is served by one task.
    slots: Vec<Slot>,
    next: std::sync::atomic::AtomicUsize,
}

struct Slot {
    /// The live connection. Read-locked on every call just long enough to clone it.
    current: RwLock<Option<Conn>>,
    /// Serialises re-dials so that a burst of calls after a runtime restart dials once.
    dialing: tokio::sync::Mutex<()>,
}

impl Upstream {
    pub fn new(path: impl Into<PathBuf>, opts: UpstreamOptions) -> Self {
        let path = path.into();
        let display: Arc<str> = path.display().to_string().into();
        let slots = (0..opts.connections.max(1)).map(|_| Slot { current: RwLock::new(None), dialing: tokio::sync::Mutex::new(()) }).collect();
        Upstream { path, display, opts, slots, next: std::sync::atomic::AtomicUsize::new(0) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn live(slot: &Slot) -> Option<Conn> {
        let guard = slot.current.read().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().filter(|c| c.is_usable()).cloned()
    }

    async fn conn(&self, idx: usize) -> Result<Conn, UpstreamError> {
        let slot = &self.slots[idx % self.slots.len()];
        if let Some(c) = Self::live(slot) {
            return Ok(c);
        }
        let _dial = slot.dialing.lock().await;
        if let Some(c) = Self::live(slot) {
            return Ok(c);
        }
        let stream = self.connect().await?;
        let c = Conn::handshake(stream, h2c::Windows { stream: self.opts.stream_window, connection: self.opts.connection_window }, self.display.clone())
            .await
            .map_err(|source| UpstreamError::Handshake { path: self.display.to_string(), source })?;
        tracing::debug!(upstream = %self.display, "connected to upstream");
        *slot.current.write().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// A new raw connection to the runtime's socket (the relay speaks HTTP/2 on it itself).
    pub async fn connect(&self) -> Result<UnixStream, UpstreamError> {
        let path = || self.display.to_string();
        match tokio::time::timeout(self.opts.connect_timeout, UnixStream::connect(&self.path)).await {
            Err(_) => Err(UpstreamError::ConnectTimeout { path: path(), timeout: self.opts.connect_timeout }),
            Ok(Err(source)) => Err(UpstreamError::Connect { path: path(), source }),
            Ok(Ok(s)) => Ok(s),
        }
    }

    /// Sends one request upstream. The returned future resolves with the response headers; the
    /// body streams. Dropping the future (client cancelled) resets the upstream stream. A call
    /// the runtime refused unprocessed is sent again on a new connection when its request body
    /// was complete up front (every unary call crisp diverts).
    pub async fn send(&self, req: Request<ProxyBody>) -> Result<Response<RecvBody>, UpstreamError> {
        let (mut parts, body) = req.into_parts();
        let fields = match parts.extensions.remove::<RawFields>() {
            Some(RawFields(f)) => f,
            None => Fields::from_request(&Request::from_parts(parts.clone(), ())),
        };
        let full = match body {
            ProxyBody::Buffered { data, trailers } => Some((data.unwrap_or_default(), trailers)),
            other => {
                let idx = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let conn = self.conn(idx).await?;
                return self.respond(parts, conn.send(fields, SendBody::Stream(other)).await);
            }
        };
        let (data, trailers): (Bytes, _) = full.expect("set above");
        let mut attempt = 0;
        loop {
            let idx = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let conn = self.conn(idx).await?;
            let r = conn.send(fields.clone(), SendBody::Full { data: data.clone(), trailers: trailers.clone() }).await;
            match r {
                Err(h2c::Error::Refused(why)) if attempt < RETRIES => {
                    attempt += 1;
                    tracing::debug!(upstream = %self.display, why, attempt, "the runtime refused the call unprocessed; sending it on a new connection");
                }
                r => return self.respond(parts, r),
            }
        }
    }

    fn respond(&self, parts: http::request::Parts, r: Result<(h2c::ResponseHead, RecvBody), h2c::Error>) -> Result<Response<RecvBody>, UpstreamError> {
        let _ = parts;
        let (head, body) = r.map_err(|source| UpstreamError::Call { path: self.display.to_string(), source })?;
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.headers_mut() = head.headers;
        *resp.version_mut() = http::Version::HTTP_2;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_values_round_trip_through_the_parser() {
        for d in [Duration::from_nanos(1), Duration::from_micros(1500), Duration::from_secs(119), Duration::from_secs(400_000)] {
            let v = grpc_timeout(d);
            let back = crate::status::parse_grpc_timeout(v.as_bytes()).unwrap();
            assert!(back >= d && back <= d + d / 1000 + Duration::from_nanos(1), "{d:?} -> {v} -> {back:?}");
        }
        assert_eq!(grpc_timeout(Duration::from_secs(115)), "115000m");
        assert_eq!(grpc_timeout(Duration::from_millis(1999)), "1999000u");
    }
}
