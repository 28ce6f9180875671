//! Wires configuration, the listener, the runtime pool and the interceptors into a running proxy.

use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use crate::config::Config;
use crate::intercept::{Interceptor, Interceptors};
use crate::metrics::{CallMetrics, OrderingMetrics};
use crate::ordering::intents::Intents;
use crate::ordering::job::Terminated;
use crate::ordering::Engine;
use crate::proxy::client::RuntimeClient;
use crate::proxy::{self, listener, Proxy, ProxyOptions, RuntimePool, RuntimePoolOptions};
use crate::tap::Tap;

/// How long start waits for the kept intents' reconcile before it serves anyway.
const RECONCILE_WAIT: Duration = Duration::from_secs(2);

/// Why [`run`] could not serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sockets systemd passed (`LISTEN_FDS`) are not usable.
    #[error(transparent)]
    ListenFds(#[from] crate::systemd::ListenFdsError),
    /// The socket systemd passed is not a listening unix socket crisp can serve on.
    #[error("socket activation: cannot use the inherited socket {path}")]
    Inherited {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// `listen` could not be bound.
    #[error(transparent)]
    Bind(#[from] listener::BindError),
}

/// The interceptor chain and the tap in it (the admin socket serves the tap's subscribers).
pub(crate) fn chain(
    cfg: &Config,
    pool: &Arc<RuntimePool>,
) -> (Vec<Arc<dyn Interceptor>>, Arc<Tap>, Arc<Engine>) {
    let client = RuntimeClient::new(pool.clone(), Duration::from_secs(5));
    let runtime = client.clone();
    let terminated = Arc::new(Terminated::open(Some(cfg.state_dir.clone())));
    let intents = Arc::new(Intents::open(Some(cfg.state_dir.clone())));
    let engine = Engine::with_intents(
        cfg,
        client,
        Arc::new(OrderingMetrics::default()),
        terminated,
        intents,
    );
    // Job pods whose sidecars crisp must end are found again after a restart, and so are the
    // held calls kept before it (`ordering/intents.rs`).
    engine.recover_in_background(crate::cri::ApiVersion::V1);
    let tap = Tap::with_memory(
        Arc::new(CallMetrics::default()),
        Some(engine.clone() as Arc<dyn crate::intercept::PodNames>),
        cfg.admin.tap_memory_bytes,
    );
    // Holds are live in the tap: the engine reports them as they happen.
    engine.set_hold_sink(tap.clone());
    // A tap's snapshot of the runtime (`crisp tap -o`) is asked through crisp's own client.
    tap.set_runtime(runtime);
    // The tap goes first: it reads a Remove call's names before the engine forgets them.
    (vec![tap.clone(), engine.clone()], tap, engine)
}

/// Serves until `shutdown` resolves, on the listening socket systemd passed (socket activation,
/// `systemd/crisp.socket`) or else on `cfg.listen`, bound here and removed on return. A socket
/// systemd holds is left in place: connections queue in its backlog while crisp restarts.
/// Tells systemd READY=1 once the socket listens and STOPPING=1 when shutdown starts.
pub async fn run(cfg: Config, shutdown: impl Future<Output = ()>) -> Result<(), Error> {
    let mut listen = cfg.listen.display().to_string();
    let (listener, _guard) = match crate::systemd::take_listener()? {
        Some(inherited) => {
            let path = inherited
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "(unnamed)".into());
            listen = path.clone();
            if inherited.path.as_deref() != Some(cfg.listen.as_path()) {
                tracing::warn!(
                    inherited = %path, listen = %cfg.listen.display(),
                    "the socket systemd passed is not `listen` from the config; kubelet must point at the inherited one"
                );
            }
            tracing::info!(
                listen = %path,
                name = inherited.name.as_deref().unwrap_or(""),
                "serving on the socket inherited from systemd"
            );
            let l = listener::from_fd(inherited.fd).map_err(|source| Error::Inherited {
                path: path.clone(),
                source,
            })?;
            (l, None)
        }
        None => {
            let (l, guard) = listener::bind(&cfg.listen, cfg.listen_mode).await?;
            (l, Some(guard))
        }
    };
    tracing::info!(listen = %listen, upstream = %cfg.upstream.display(), "crisp listening");
    if !cfg.proxy.relay {
        tracing::warn!(
            "config: proxy.relay = false is no longer supported and is ignored; every connection is relayed (crisp's own HTTP/2 server rejected the :authority that kubelet and crictl send)"
        );
    }
    crate::systemd::notify_ready(&format!(
        "serving, forwarding to {}",
        cfg.upstream.display()
    ));
    let shutdown = async move {
        shutdown.await;
        crate::systemd::notify_stopping("draining in-flight calls");
    };
    serve_on(listener, cfg, shutdown).await;
    Ok(())
}

/// Serves on an already-bound listener (tests, socket activation).
#[cfg_attr(feature = "test-util", visibility::make(pub))]
async fn serve_on(
    listener: tokio::net::UnixListener,
    cfg: Config,
    shutdown: impl Future<Output = ()>,
) {
    serve_on_notify(listener, cfg, shutdown, tokio::sync::oneshot::channel().0).await
}

/// [`serve_on`], telling `admin_ready` once the admin socket listens (or will not: disabled, or
/// failed to bind, which crisp logs and survives). CRI calls are served from the start either
/// way; this is for whoever waits to tap (tests, instead of polling connect()).
#[cfg_attr(feature = "test-util", visibility::make(pub))]
async fn serve_on_notify(
    listener: tokio::net::UnixListener,
    cfg: Config,
    shutdown: impl Future<Output = ()>,
    admin_ready: tokio::sync::oneshot::Sender<()>,
) {
    let pool = std::sync::Arc::new(RuntimePool::new(
        cfg.upstream.clone(),
        RuntimePoolOptions::from(&cfg),
    ));
    let (list, tap, engine) = chain(&cfg, &pool);
    let spans = hold_spans(&cfg, &engine);
    let ordering = engine.clone();
    let interceptors = Interceptors::new(list);
    let faults = interceptors.faults().clone();
    let proxy = Proxy::new(pool, interceptors, ProxyOptions::from(&cfg));
    let watchdog = proxy.watchdog().clone();
    // The calls in flight, as the relay threads count them (`crisp_cri_calls_in_flight`).
    let w = watchdog.clone();
    tap.metrics()
        .count_in_flight_with(move || w.calls_in_flight());
    // How the last instance ended (`CrispStalled` sees the stall its restart hid).
    watchdog.persist_in(&cfg.state_dir);
    // The admin socket shows crisp's own faults: stuck threads, hook panics.
    let liveness = crate::admin::Liveness {
        watchdog: proxy.watchdog().clone(),
        faults,
    };
    // The admin socket (tap, metrics) stops with the CRI listener.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Bound in its own task: CRI calls are served at once, whatever the admin socket does.
    let admin_cfg = cfg.clone();
    let admin = tokio::spawn(async move {
        let task =
            crate::admin::start(&admin_cfg, tap, Some(engine), Some(liveness), stopped).await;
        let _ = admin_ready.send(());
        if let Some(t) = task {
            let _ = t.await;
        }
    });
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    // The held calls kept before a restart are reconciled with the runtime before kubelet's
    // calls are served; a runtime that does not answer delays that, never the start. The admin
    // socket is up meanwhile: `crisp pods` and the tap see a restart's reconcile.
    let _ = tokio::time::timeout(RECONCILE_WAIT, ordering.intents_reconciled()).await;
    proxy::serve(listener, proxy, shutdown).await;
    // Drained (or closed) every call: a clean end, not counted as a restart.
    if let Some(p) = watchdog.persisted() {
        p.stopped();
    }
    let _ = admin.await;
    // The engine's own tasks (Job watchers, recovery) end last, once the proxy has drained or
    // closed every call.
    ordering.shutdown().await;
    // The spans still queued go out (the exporter waits at most its timeout, 5 s).
    if let Some(spans) = spans {
        let _ = tokio::task::spawn_blocking(move || spans.shutdown()).await;
    }
}

/// Held calls' spans, when `[tracing]` (or the OTLP environment) names a collector: wired into
/// the engine. A collector crisp cannot export to is logged, and crisp serves without tracing.
fn hold_spans(cfg: &Config, engine: &Engine) -> Option<Arc<crate::otel::HoldSpans>> {
    match crate::otel::HoldSpans::from_config(&cfg.tracing) {
        Ok(Some(spans)) => {
            let spans = Arc::new(spans);
            engine.set_hold_spans(spans.clone());
            Some(spans)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::error!(error = %e, "tracing is off; serving without it");
            None
        }
    }
}
