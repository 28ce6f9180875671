//! The runtime side: one multiplexed HTTP/2 connection to the runtime's unix socket, re-dialled
//! on demand after the runtime goes away. crisp never exits because the runtime did; calls made
//! while it is down fail fast with UNAVAILABLE naming the socket.

use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::UnixStream;

use super::body::ProxyBody;

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream unix://{path} unavailable: {source}")]
    Connect { path: String, source: std::io::Error },
    #[error("upstream unix://{path} did not accept a connection within {timeout:?}")]
    ConnectTimeout { path: String, timeout: Duration },
    #[error("upstream unix://{path} HTTP/2 handshake failed: {source}")]
    Handshake { path: String, source: hyper::Error },
    #[error("upstream unix://{path} failed the call: {source}")]
    Call { path: String, source: hyper::Error },
}

/// Tunables of the runtime-side connection.
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

pub struct Upstream {
    path: PathBuf,
    display: String,
    opts: UpstreamOptions,
    /// A few multiplexed connections, used round-robin: one HTTP/2 connection is processed by
    /// one task, so with a single one every call of the node funnels through one core.
    slots: Vec<Slot>,
    next: std::sync::atomic::AtomicUsize,
}

struct Slot {
    /// The live connection's sender. Read-locked on every call just long enough to clone it.
    current: RwLock<Option<SendRequest<ProxyBody>>>,
    /// Serialises re-dials so that a burst of calls after a runtime restart dials once.
    dialing: tokio::sync::Mutex<()>,
}

impl Upstream {
    pub fn new(path: impl Into<PathBuf>, opts: UpstreamOptions) -> Self {
        let path = path.into();
        let display = path.display().to_string();
        let slots = (0..opts.connections.max(1)).map(|_| Slot { current: RwLock::new(None), dialing: tokio::sync::Mutex::new(()) }).collect();
        Upstream { path, display, opts, slots, next: std::sync::atomic::AtomicUsize::new(0) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn live(slot: &Slot) -> Option<SendRequest<ProxyBody>> {
        let guard = slot.current.read().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().filter(|s| !s.is_closed()).cloned()
    }

    async fn sender(&self, idx: usize) -> Result<SendRequest<ProxyBody>, UpstreamError> {
        let slot = &self.slots[idx % self.slots.len()];
        if let Some(s) = Self::live(slot) {
            return Ok(s);
        }
        let _dial = slot.dialing.lock().await;
        if let Some(s) = Self::live(slot) {
            return Ok(s);
        }
        let s = self.dial().await?;
        *slot.current.write().unwrap_or_else(|e| e.into_inner()) = Some(s.clone());
        Ok(s)
    }

    /// A new raw connection to the runtime's socket (the relay speaks HTTP/2 on it itself).
    pub async fn connect(&self) -> Result<UnixStream, UpstreamError> {
        let path = || self.display.clone();
        match tokio::time::timeout(self.opts.connect_timeout, UnixStream::connect(&self.path)).await {
            Err(_) => Err(UpstreamError::ConnectTimeout { path: path(), timeout: self.opts.connect_timeout }),
            Ok(Err(source)) => Err(UpstreamError::Connect { path: path(), source }),
            Ok(Ok(s)) => Ok(s),
        }
    }

    async fn dial(&self) -> Result<SendRequest<ProxyBody>, UpstreamError> {
        let path = || self.display.clone();
        let stream = self.connect().await?;
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_stream_window_size(self.opts.stream_window)
            .initial_connection_window_size(self.opts.connection_window)
            .max_frame_size(1 << 20)
            // The runtime is trusted and local; kubelet itself sends up to 16 MiB messages and
            // large metadata is harmless here.
            .max_header_list_size(1 << 20)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|source| UpstreamError::Handshake { path: path(), source })?;
        let upstream_name = self.display.clone();
        tokio::spawn(async move {
            match conn.await {
                Ok(()) => tracing::info!(upstream = %upstream_name, "upstream connection closed"),
                Err(e) => tracing::warn!(upstream = %upstream_name, error = %e, "upstream connection failed"),
            }
        });
        tracing::info!(upstream = %self.display, "connected to upstream");
        Ok(sender)
    }

    /// Sends one request upstream. The returned future resolves with the response headers; the
    /// body streams. Dropping the future (client cancelled) resets the upstream stream.
    pub async fn send(&self, req: Request<ProxyBody>) -> Result<Response<Incoming>, UpstreamError> {
        let idx = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut sender = self.sender(idx).await?;
        let req = match sender.try_send_request(req).await {
            Ok(resp) => return Ok(resp),
            Err(mut e) => match e.take_message() {
                // hyper gives the request back only when it never reached the wire: the
                // connection was closing (the runtime sent GOAWAY, or died) before this call got
                // on it. Nothing reached the runtime, so one attempt on a fresh connection is safe.
                Some(req) => {
                    tracing::debug!(upstream = %self.display, error = %e.error(), "upstream connection closing; retrying the call on a new one");
                    req
                }
                None => return Err(UpstreamError::Call { path: self.display.clone(), source: e.into_error() }),
            },
        };
        // The refused sender reports closed now, so this dials a new connection.
        let mut sender = self.sender(idx).await?;
        sender.send_request(req).await.map_err(|source| UpstreamError::Call { path: self.display.clone(), source })
    }
}
