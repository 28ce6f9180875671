//! The HTTP/2 forwarder: accepts kubelet's connections on a unix socket, routes each call by its
//! gRPC path, and forwards headers, messages and trailers to the runtime untouched.
//!
//! Every connection is served by the [`relay`], which gives it a runtime connection of its own.
//! A call takes one of these paths:
//! - **relayed** (nobody is interested): its frames are copied through by the relay thread;
//!   nothing is buffered or parsed but the request's header block (for the route).
//! - **observed** (an interceptor wants to see it): the relay diverts the stream to
//!   `observed.rs` ([`Proxy`] being the relay's [`relay::Service`]); the unary request is
//!   buffered, shown to the interceptors (which may hold or refuse it), and the same bytes are
//!   forwarded through pooled runtime connections ([`runtime_pool`]); the response may be
//!   buffered and shown too.
//! - **degraded**: a connection whose runtime connection is gone (or never came up) has every
//!   new stream diverted; those nobody is interested in are forwarded as they are
//!   (`forward_degraded`) until the client moves back to a relay.
//!
//! Modules, imports pointing one way: [`http2`] (frames and HPACK; imports nothing else of the
//! proxy) ← [`sock`], [`body`], [`runtime_pool`] ← [`relay`] ← `observed` (serves diverted
//! calls: the observed path, its response body in `observed/response.rs`); this module holds
//! the accept loop ([`serve`]) and what the relay sees of crisp. [`client`] is crisp's own
//! runtime client, [`listener`] the socket.

pub(crate) mod body;
pub mod client;
pub mod http2;
pub mod listener;
mod observed;
pub(crate) mod relay;
/// The relay core's fuzz driver (`fuzz/fuzz_targets/core.rs`).
#[cfg(feature = "test-util")]
pub use self::relay::fuzzing as relay_fuzzing;
pub(crate) mod runtime_pool;
pub mod sock;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tokio::net::UnixListener;

use crate::intercept::{Call, Interceptors, Outcome};
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
    runtime: Arc<RuntimePool>,
    interceptors: Interceptors,
    opts: ProxyOptions,
    next_id: AtomicU64,
    watchdog: Arc<crate::watchdog::Watchdog>,
    /// `CRISP_RELAY_SPLICE=1`: a benchmark's floor (`relay/splice.rs`).
    splice: bool,
}

impl Proxy {
    pub fn new(
        runtime: Arc<RuntimePool>,
        interceptors: Interceptors,
        opts: ProxyOptions,
    ) -> Arc<Self> {
        Arc::new(Proxy {
            runtime,
            interceptors,
            watchdog: crate::watchdog::Watchdog::new(opts.watchdog),
            opts,
            next_id: AtomicU64::new(1),
            splice: relay::splice_from_env(),
        })
    }

    /// The watchdog of this proxy's relay threads; [`serve`] runs its supervisor.
    pub fn watchdog(&self) -> &Arc<crate::watchdog::Watchdog> {
        &self.watchdog
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
            splice: self.splice,
        };
        relay::Handle {
            options,
            runtime: self.runtime.clone(),
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

    fn response_view(&self, call: &Call) -> Option<crate::cri::skim::SkimSpec> {
        self.interceptors.response_view(call)
    }

    fn conditional(&self, call: &Call) -> bool {
        self.interceptors.conditional(call)
    }

    fn wants(&self, call: &Call, req: &[u8]) -> bool {
        self.interceptors.wants_call(call, req)
    }

    fn bypassed(&self, route: crate::cri::Route) -> bool {
        self.interceptors.faults().bypassed(route)
    }

    fn panicked(&self, route: crate::cri::Route, call: u64, place: &str, outcome: &str) {
        self.interceptors
            .faults()
            .relay_panicked(route, call, place, outcome);
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
