//! The relay: crisp's fast path, a frame-level HTTP/2 relay between one client connection and a
//! runtime connection of its own.
//!
//! - `core.rs`: the connection's rules, without I/O — frames and time in, frames and
//!   [`Event`](core::Event)s out (`inbound.rs`: the client's frames, `outbound.rs`: the
//!   runtime's, `flow.rs`: windows, debt and the diverted answers that wait for them,
//!   `ping.rs`: the PING gate and keep-alive,
//!   `fields.rs`: decoded header blocks and routes).
//! - `pump.rs`: the thread that runs a core, blocked in `poll(2)` on the two sockets.
//! - `bridge.rs`: the tokio side — diverted streams, served by the observed path, and the queue
//!   through which their commands reach the thread ([`answers::Command`]).
//!
//! Every frame is copied through as it is, with three exceptions:
//! - request header blocks are decoded (for the route) and written anew by crisp's own HPACK
//!   encoder for the runtime connection ([`crate::proxy::http2::Indexer`]), so crisp may keep some
//!   streams from the runtime without desynchronising the HPACK tables;
//! - a new stream that an interceptor wants to see (or hold) is **diverted**: it never reaches
//!   this runtime connection; its fields, decoded once, go to the observed path ([`Service`])
//!   and its response is written back into the client connection;
//! - crisp's own keep-alive PINGs, and the flow-control bookkeeping that diverted streams need.
//!
//! Failure. When the runtime connection ends or sends GOAWAY, calls in flight on it end with
//! UNAVAILABLE (or REFUSED_STREAM for those the runtime says it never saw, which gRPC retries
//! transparently), new streams are diverted, and the client is sent GOAWAY so that it reconnects
//! — to a fresh relay once the runtime is back. If the runtime is down when a client connects,
//! the whole connection is served by the observed path (UNAVAILABLE until the runtime returns).

mod answers;
mod blocks;
mod bridge;
pub(crate) mod core;
mod error;
mod fields;
mod flow;
mod from_client;
mod from_runtime;
#[cfg(any(test, feature = "test-util"))]
pub mod fuzzing;
mod inbound;
mod outbound;
mod ping;
mod pump;
mod splice;
mod status;
mod streams;
#[cfg(test)]
mod tests;
mod transmit;
mod undecided;
mod viewing;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::watch;

pub(crate) use self::bridge::{DivertedBody, Service};
pub(crate) use self::core::{Calls, CALLS};
use super::http2;
use super::runtime_pool::RuntimePool;
use super::sock::{Sock, Wake};

/// The target of the relay's log lines, whichever file they are in (log filters name it).
const LOG: &str = "crisp::proxy::relay";

/// Stack of a relay thread: frame handling, the interceptors' `interest`/`on_complete` and
/// logging run on it; none recurses.
const RELAY_STACK: usize = 512 << 10;

pub(crate) use splice::from_env as splice_from_env;

/// The relay's settings.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// A connection that has not sent the HTTP/2 preface within this time is closed.
    pub(crate) handshake_timeout: Duration,
    /// PING a client idle this long; close one that has not answered for `keepalive_timeout`.
    pub(crate) keepalive_interval: Duration,
    pub(crate) keepalive_timeout: Duration,
    /// Splice relayed connections byte for byte, the core left out: a benchmark's floor
    /// (`splice.rs`), never for a node.
    pub(crate) splice: bool,
}

/// What the relay needs of the rest of crisp: its settings, the runtime, and the service that
/// routes calls, hears of their ends and serves diverted ones.
#[derive(Clone)]
pub(crate) struct Handle {
    pub(crate) options: Options,
    pub(crate) runtime: Arc<RuntimePool>,
    pub(crate) service: Arc<dyn Service>,
    /// Where relay threads report their progress ([`crate::watchdog`]).
    pub(crate) watchdog: Arc<crate::watchdog::Watchdog>,
}

/// Serves one client connection, relaying to a runtime connection of its own when the runtime
/// accepts one.
///
/// The handshake (the client's preface, the runtime connection) is async; then the connection
/// moves to a thread of its own that blocks in `poll(2)` on its two sockets (`pump.rs`): a
/// relayed hop costs a wakeup, a `recv` and a `send`, and no async runtime's scheduler,
/// reactor and timers (BENCHMARKS.md: about a third of crisp's instructions per call on tokio).
/// Diverted streams still run on tokio (`bridge.rs`).
pub(crate) async fn serve_connection(
    mut client: UnixStream,
    handle: Handle,
    mut shutdown: watch::Receiver<bool>,
) {
    if !preface(&mut client, &handle.options).await {
        return;
    }
    let runtime = connect_runtime(&handle.runtime).await;
    let parts = client
        .into_std()
        .and_then(Sock::new)
        .and_then(|c| Ok((c, Wake::new()?)));
    let (client, wake) = match parts {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(
                target: LOG,
                error = %e,
                "cannot set up a client connection for relaying; closing it"
            );
            return;
        }
    };
    // The watchdog shuts these copies down if the thread gets stuck (kubelet reconnects).
    let handles: Vec<std::os::unix::net::UnixStream> = std::iter::once(&client)
        .chain(runtime.as_ref())
        .filter_map(|s| s.handle().ok())
        .collect();
    let registered = handle.watchdog.register(handles);
    let (mut pump, outbox) = assemble(&handle, client, wake, runtime, registered.beat.clone());
    registered.beat.set_waker({
        let outbox = outbox.clone();
        Box::new(move || outbox.wake.notify())
    });
    let (done_tx, mut done) = tokio::sync::oneshot::channel::<()>();
    let rt = tokio::runtime::Handle::current();
    let service = handle.service.clone();
    let spawned = std::thread::Builder::new()
        .name("crisp-relay".into())
        .stack_size(RELAY_STACK)
        .spawn(move || {
            // Diverted streams are spawned on crisp's runtime from here.
            let _rt = rt.enter();
            // Unregistered from the watchdog when the thread ends, however it ends.
            let _registered = registered;
            // A bug in here must cost this connection only, and still end its calls below.
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pump.run())) {
                Ok(Ok(())) => tracing::debug!(target: LOG, "client connection closed"),
                Ok(Err(e)) => tracing::debug!(target: LOG, error = %e, "client connection ended"),
                Err(_) => {
                    // Counted with every other panic (`CrispPanics`), on the route of the last
                    // stream the connection opened: repeated, that route is relayed unobserved.
                    service.panicked(
                        pump.core.last_route,
                        0,
                        "relay thread",
                        "its connection was closed: the calls in flight on it failed, and kubelet \
                     reconnects",
                    );
                }
            }
            // The client is gone (or was closed): nothing may stay behind.
            pump.diverted.abort_all();
            pump.core.handle_client_gone(Instant::now());
            pump.dispatch();
            let _ = done_tx.send(());
        });
    if let Err(e) = spawned {
        tracing::warn!(
            target: LOG,
            error = %e,
            "cannot start a relay thread; closing the client connection (it will reconnect)"
        );
        return;
    }
    // Dropped before the thread ends (crisp's shutdown grace ran out): the thread closes the
    // connection at once.
    let _kill = KillOnDrop(outbox.clone());
    let mut watching = true;
    loop {
        if watching && *shutdown.borrow_and_update() {
            outbox.stop.store(true, Ordering::Release);
            outbox.wake.notify();
            watching = false;
        }
        tokio::select! {
            _ = &mut done => return,
            r = shutdown.changed(), if watching => if r.is_err() { watching = false },
        }
    }
}

/// A connection's core, its pump around it and the bridge to tokio, wired together; and the
/// outbox through which the rest of crisp reaches the pump.
fn assemble(
    handle: &Handle,
    client: Sock,
    wake: Wake,
    runtime: Option<Sock>,
    beat: Arc<crate::watchdog::Beat>,
) -> (pump::Pump, Arc<bridge::Outbox>) {
    let outbox = Arc::new(bridge::Outbox::new(wake));
    let opts = &handle.options;
    let cfg = core::Config {
        keepalive_interval: opts.keepalive_interval,
        keepalive_timeout: opts.keepalive_timeout,
        runtime: handle.runtime.path().to_path_buf(),
    };
    let calls: Arc<dyn Calls> = handle.service.clone();
    let core = core::Core::new(&cfg, calls, runtime.is_some(), Instant::now());
    let diverted = bridge::Diverted::new(handle.service.clone(), outbox.clone());
    let pump = pump::Pump::new(
        core,
        handle.service.clone(),
        outbox.clone(),
        diverted,
        pump::Peers {
            client,
            runtime,
            runtime_path: cfg.runtime,
        },
        beat,
        opts.splice,
    );
    (pump, outbox)
}

/// Reads the client's HTTP/2 connection preface (and nothing past it); false if the
/// connection is to be closed.
async fn preface(client: &mut UnixStream, opts: &Options) -> bool {
    let mut preface = [0u8; 24];
    match tokio::time::timeout(opts.handshake_timeout, client.read_exact(&mut preface)).await {
        Ok(Ok(_)) if &preface == http2::PREFACE => true,
        Ok(Ok(_)) => {
            tracing::debug!(
                target: LOG,
                "client connection closed: not HTTP/2 (no connection preface)"
            );
            false
        }
        Ok(Err(e)) => {
            tracing::debug!(
                target: LOG,
                error = %e,
                "client connection closed during the HTTP/2 preface"
            );
            false
        }
        Err(_) => {
            tracing::debug!(
                target: LOG,
                timeout_ms = opts.handshake_timeout.as_millis() as u64,
                "client connection closed: no HTTP/2 preface in time"
            );
            false
        }
    }
}

/// This client connection's own runtime connection, its preface written; None: the client is
/// served on the observed path.
async fn connect_runtime(runtime: &RuntimePool) -> Option<Sock> {
    match runtime.connect().await {
        Ok(mut s) => match s
            .write_all(http2::PREFACE)
            .await
            .and_then(|()| s.into_std())
            .and_then(Sock::new)
        {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(
                    target: LOG,
                    runtime = %runtime.path().display(),
                    error = %e,
                    "runtime connection failed at once; serving this client on the observed path"
                );
                None
            }
        },
        Err(e) => {
            tracing::warn!(
                target: LOG,
                error = %e,
                "serving this client connection on the observed path until the runtime is back"
            );
            None
        }
    }
}

struct KillOnDrop(Arc<bridge::Outbox>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill.store(true, Ordering::Release);
        self.0.wake.notify();
    }
}
