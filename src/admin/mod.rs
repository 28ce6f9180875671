//! The admin socket: crisp's own gRPC API (`proto/crisp/admin/v1/admin.proto`: Tap, ListPods,
//! Version) and Prometheus `GET /metrics`, on one unix socket (HTTP/1.1 and HTTP/2 both
//! accepted), plus `/metrics` alone on an opt-in TCP address.
//!
//! The socket is created 0600 by default: a tap shows every pod's CRI traffic. `--unredacted` is
//! additionally refused unless the peer (SO_PEERCRED) is uid 0, so a group given access to the
//! socket still never sees secrets.
//!
//! `service.rs` is the gRPC service, `list_pods.rs` what ListPods answers, `metrics.rs` the
//! registry, `routes.rs` the HTTP routes and the mux; this file serves the socket.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;

use crate::admin_api::admin_server::AdminServer;
use crate::intercept::Faults;
use crate::ordering::Engine;
use crate::tap::Tap;
use crate::watchdog::Watchdog;

pub(crate) mod list_pods;
mod metrics;
mod routes;
mod service;
mod taps;

use list_pods::*;
pub use metrics::*;
use routes::*;
pub(crate) use service::*;
pub(crate) use taps::*;

/// Events in flight between a subscriber's task and its gRPC stream; the real buffer is the
/// subscription's queue, where overflow is counted.
const STREAM_BUFFER: usize = 16;
/// How long open admin connections get to finish once crisp shuts down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// What the admin API reports on.
pub struct AdminState {
    pub(crate) tap: Arc<Tap>,
    /// The ordering engine, when it runs: ListPods.
    pub(crate) engine: Option<Arc<Engine>>,
    /// What `GET /metrics` shows ([`registry`]).
    pub metrics: Registry,
    pub(crate) listen: PathBuf,
    pub(crate) upstream: PathBuf,
    pub(crate) started: Instant,
    /// Events queued per tap subscriber.
    pub(crate) tap_queue: usize,
    /// The caps on open taps, per peer uid and in total (`taps.rs`).
    pub(crate) taps: Arc<TapSlots>,
    /// The relay threads' and the runtime's progress: `/healthz`, `/debug/connections`.
    pub(crate) watchdog: Option<Arc<Watchdog>>,
}

/// What crisp knows of its own faults, for the admin socket: the watchdog and the interceptors'
/// panics.
#[derive(Clone)]
pub struct Liveness {
    pub watchdog: Arc<Watchdog>,
    pub faults: Arc<Faults>,
}

/// Serves one connection with HTTP/1.1 (curl, Prometheus) or HTTP/2 (gRPC), as the client
/// chooses.
async fn connection<IO>(
    io: IO,
    state: Arc<AdminState>,
    grpc: Option<AdminServer<AdminService>>,
    peer: Peer,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| handle(req, state.clone(), grpc.clone(), peer));
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder.serve_connection(TokioIo::new(io), svc).await {
        tracing::debug!(error = %e, "admin connection closed with an error");
    }
}

/// The next connection `accept` gives, or `None` once `shutdown` resolves. Reaps finished
/// connection tasks while it waits; a failed accept is logged (as `what`'s) and retried after a
/// pause.
async fn next_connection<S, A, F>(
    what: &str,
    tasks: &mut JoinSet<()>,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
    mut accept: impl FnMut() -> F,
) -> Option<S>
where
    F: Future<Output = std::io::Result<(S, A)>>,
{
    loop {
        tokio::select! {
            _ = &mut *shutdown => return None,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = accept() => match accepted {
                Ok((s, _)) => return Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "{what}: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn drain(mut tasks: JoinSet<()>) {
    if tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        tasks.abort_all();
    }
}

/// Serves the admin API on `listener` until `shutdown` resolves; then ends every tap stream.
pub async fn serve(
    listener: tokio::net::UnixListener,
    state: Arc<AdminState>,
    shutdown: impl Future<Output = ()>,
) {
    let grpc = AdminServer::new(AdminService {
        state: state.clone(),
    });
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    while let Some(stream) = next_connection("admin socket", &mut tasks, &mut shutdown, || {
        listener.accept()
    })
    .await
    {
        let peer = match stream.peer_cred() {
            Ok(c) => Peer {
                uid: Some(c.uid()),
                pid: c.pid(),
            },
            Err(_) => Peer {
                uid: None,
                pid: None,
            },
        };
        tasks.spawn(connection(stream, state.clone(), Some(grpc.clone()), peer));
    }
    drop(listener);
    // Ends every tap stream cleanly (clients see the stream end, not a reset).
    state.tap.close();
    drain(tasks).await;
}

/// Serves only `GET /metrics` over TCP (the opt-in `admin.metrics_tcp`): never the tap.
pub async fn serve_metrics_tcp(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    shutdown: impl Future<Output = ()>,
) {
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    while let Some(stream) = next_connection("metrics listener", &mut tasks, &mut shutdown, || {
        listener.accept()
    })
    .await
    {
        tasks.spawn(connection(
            stream,
            state.clone(),
            None,
            Peer {
                uid: None,
                pid: None,
            },
        ));
    }
    drain(tasks).await;
}

/// The warning crisp logs at start for an admin socket its group or everyone may connect to
/// (`admin.allow_shared_mode`); `None` for a root-only one.
fn shared_mode_warning(admin: &crate::config::AdminConfig) -> Option<String> {
    admin.shared().then(|| {
        format!(
            "the admin socket is mode {:04o} (admin.allow_shared_mode): its group{} can connect \
             and see every pod's CRI calls (redacted) and every pod crisp tracks",
            admin.mode,
            if admin.mode & 0o007 != 0 {
                " and every user on the node"
            } else {
                ""
            }
        )
    })
}

/// Binds the admin socket (and the optional metrics TCP address) of `cfg` and serves them until
/// `stop` turns true. Failing to bind is logged, not fatal: CRI traffic matters more than the
/// tap. The returned task ends (and has removed the socket file) once both servers are done.
pub async fn start(
    cfg: &crate::config::Config,
    tap: Arc<Tap>,
    engine: Option<Arc<Engine>>,
    liveness: Option<Liveness>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    if !cfg.admin.enabled {
        return None;
    }
    let mut metrics = registry(&tap, engine.as_ref());
    if let Some(l) = &liveness {
        register_liveness(&mut metrics, l);
    }
    let state = Arc::new(AdminState {
        metrics,
        tap,
        engine,
        listen: cfg.listen.clone(),
        upstream: cfg.upstream.clone(),
        started: Instant::now(),
        tap_queue: cfg.admin.tap_queue,
        taps: TapSlots::new(cfg.admin.max_taps_per_uid, cfg.admin.max_taps),
        watchdog: liveness.map(|l| l.watchdog),
    });
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let path = cfg.admin_socket();
    if let Some(warning) = shared_mode_warning(&cfg.admin) {
        tracing::warn!(admin = %path.display(), "{warning}");
    }
    // Checked when the config was loaded; a group removed since is reported as a bind error.
    let gid = match cfg.admin.group_id() {
        Ok(gid) => gid,
        Err(e) => {
            tracing::error!(
                admin = %path.display(),
                "admin.group: {e}; crisp runs without tap and metrics"
            );
            return None;
        }
    };
    let unix = match crate::proxy::listener::bind_with_group(&path, cfg.admin.mode, gid).await {
        Ok((l, guard)) => {
            tracing::info!(
                admin = %path.display(),
                "admin socket listening (crisp tap, GET /metrics)"
            );
            let state = state.clone();
            let stop = stop.clone();
            Some(tokio::spawn(async move {
                serve(l, state, until_stopped(stop)).await;
                drop(guard);
            }))
        }
        Err(e) => {
            tracing::error!(
                error = %e,
                "cannot listen on the admin socket; crisp runs without tap and metrics"
            );
            None
        }
    };
    let tcp = match cfg.admin.metrics_tcp {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!(metrics = %addr, "serving GET /metrics over TCP");
                Some(tokio::spawn(serve_metrics_tcp(
                    l,
                    state,
                    until_stopped(stop),
                )))
            }
            Err(e) => {
                tracing::error!(error = %e, metrics = %addr, "cannot listen for metrics over TCP");
                None
            }
        },
        None => None,
    };
    Some(tokio::spawn(async move {
        for t in [unix, tcp].into_iter().flatten() {
            let _ = t.await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_api as pb;
    use crate::tap::{Filter, Glob};

    /// Issue #44: a non-root client's N+1st tap is refused RESOURCE_EXHAUSTED, naming the cap;
    /// another uid and root still get theirs, and a closed tap gives its place back. On bde328c
    /// every tap was served (no cap).
    #[tokio::test]
    async fn a_non_root_clients_tap_over_its_cap_is_refused() {
        use pb::admin_server::Admin;
        let tap = Tap::new(Arc::new(crate::metrics::CallMetrics::default()), None);
        let state = Arc::new(AdminState {
            metrics: registry(&tap, None),
            tap,
            engine: None,
            listen: PathBuf::from("/run/crisp/crisp.sock"),
            upstream: PathBuf::from("/run/containerd/containerd.sock"),
            started: Instant::now(),
            tap_queue: 16,
            taps: TapSlots::new(3, 100),
            watchdog: None,
        });
        let svc = AdminService { state };
        let req = |uid: u32| {
            let mut r = tonic::Request::new(pb::TapRequest::default());
            r.extensions_mut().insert(Peer {
                uid: Some(uid),
                pid: Some(4242),
            });
            r
        };
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(svc.tap(req(1000)).await.expect("within the cap"));
        }
        let refused = svc
            .tap(req(1000))
            .await
            .expect_err("the 4th tap of uid 1000");
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert!(
            refused.message().contains("uid 1000")
                && refused.message().contains("max_taps_per_uid"),
            "{}",
            refused.message()
        );
        let _other = svc.tap(req(1001)).await.expect("another uid");
        let _root = svc.tap(req(0)).await.expect("root");
        // Closing one (the client goes away): its place comes back once its task sees it.
        drop(open.pop());
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match svc.tap(req(1000)).await {
                Ok(_again) => break,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
                    tokio::task::yield_now().await;
                }
                Err(e) => panic!("the closed tap's place never came back: {e}"),
            }
        }
    }

    #[test]
    fn only_root_gets_unredacted() {
        let redacted = pb::TapRequest::default();
        let unredacted = pb::TapRequest {
            unredacted: true,
            ..Default::default()
        };
        let root = Some(Peer {
            uid: Some(0),
            pid: Some(1),
        });
        let nobody = Some(Peer {
            uid: Some(65534),
            pid: Some(1),
        });
        assert!(authorize(&redacted, nobody).is_ok());
        assert!(authorize(&redacted, None).is_ok());
        assert!(authorize(&unredacted, root).is_ok());
        let e = authorize(&unredacted, nobody).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("65534"), "{}", e.message());
        assert_eq!(
            authorize(&unredacted, None).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            authorize(
                &unredacted,
                Some(Peer {
                    uid: None,
                    pid: None
                })
            )
            .unwrap_err()
            .code(),
            tonic::Code::PermissionDenied
        );
    }

    #[test]
    fn request_to_filter() {
        let f = filter_from(&pb::TapRequest {
            pod: "shop/web".into(),
            methods: vec!["Create*".into()],
            slower_than_ms: 5,
            ..Default::default()
        });
        assert_eq!(f.namespace.as_deref(), Some("shop"));
        assert_eq!(f.pod.as_deref(), Some("web"));
        assert_eq!(f.slower_than, Duration::from_millis(5));
        assert_eq!(f.methods, vec![Glob::new("Create*")]);
        let f = filter_from(&pb::TapRequest {
            namespace: "a".into(),
            pod: "b".into(),
            ..Default::default()
        });
        assert_eq!(
            (f.namespace.as_deref(), f.pod.as_deref()),
            (Some("a"), Some("b"))
        );
        assert_eq!(filter_from(&pb::TapRequest::default()), Filter::default());
    }

    /// Issue #33: a shared admin socket is warned about at start, a root-only one is not.
    #[test]
    fn a_shared_admin_socket_is_warned_about() {
        let mut admin = crate::config::AdminConfig::default();
        assert_eq!(shared_mode_warning(&admin), None);
        admin.mode = 0o660;
        let w = shared_mode_warning(&admin).unwrap();
        assert!(w.contains("0660") && w.contains("group can connect"), "{w}");
        admin.mode = 0o666;
        let w = shared_mode_warning(&admin).unwrap();
        assert!(w.contains("every user on the node"), "{w}");
    }
}
