//! The admin socket: crisp's own gRPC API (`proto/crisp/admin/v1/admin.proto`: Tap, ListPods,
//! Version) and Prometheus `GET /metrics`, on one unix socket (HTTP/1.1 and HTTP/2 both
//! accepted), plus `/metrics` alone on an opt-in TCP address.
//!
//! The socket is created 0600 by default: a tap shows every pod's CRI traffic. `--unredacted` is
//! additionally refused unless the peer (SO_PEERCRED) is uid 0, so a group given access to the
//! socket still never sees secrets.

use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::Service;

use crate::intercept::Faults;
use crate::metrics::{ScrapedCounter, ScrapedGauge};
use crate::watchdog::Watchdog;
use crate::ordering::annotations::{Sidecar, Source};
use crate::ordering::decide::Snapshot;
use crate::ordering::holds::HeldCall;
use crate::ordering::{Engine, Pod};
use crate::tap::pb::{self, admin_server::AdminServer};
use crate::tap::{Filter, Glob, Item, Tap};

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

/// The peer of an admin connection (SO_PEERCRED), attached to each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) uid: Option<u32>,
    pub(crate) pid: Option<i32>,
}

/// Only root may see secrets: `unredacted` from anyone else, or from a peer whose credentials
/// are unknown, is refused.
pub(crate) fn authorize(req: &pb::TapRequest, peer: Option<Peer>) -> Result<(), tonic::Status> {
    if !req.unredacted {
        return Ok(());
    }
    match peer.and_then(|p| p.uid) {
        Some(0) => Ok(()),
        Some(uid) => Err(tonic::Status::permission_denied(format!(
            "--unredacted is only served to root (uid 0); this client is uid {uid}"
        ))),
        None => Err(tonic::Status::permission_denied(
            "--unredacted is only served to root, and this client's uid is unknown",
        )),
    }
}

/// The subscriber filter a request asks for. `pod` may be `namespace/name`.
pub(crate) fn filter_from(req: &pb::TapRequest) -> Filter {
    let (mut namespace, mut pod) = (none_if_empty(&req.namespace), none_if_empty(&req.pod));
    if let Some((ns, name)) = req.pod.split_once('/') {
        namespace = Some(ns.to_string());
        pod = Some(name.to_string());
    }
    Filter {
        methods: req.methods.iter().map(|m| Glob::new(m)).collect(),
        namespace,
        pod,
        errors_only: req.errors_only,
        slower_than: Duration::from_millis(req.slower_than_ms),
        include_polling: req.include_polling,
        full: req.full,
        unredacted: req.unredacted,
    }
}

fn none_if_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

struct AdminService {
    state: Arc<AdminState>,
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    type TapStream = ReceiverStream<Result<pb::TapEvent, tonic::Status>>;

    async fn tap(
        &self,
        req: tonic::Request<pb::TapRequest>,
    ) -> Result<tonic::Response<Self::TapStream>, tonic::Status> {
        let peer = req.extensions().get::<Peer>().copied();
        let req = req.into_inner();
        if let Err(s) = authorize(&req, peer) {
            tracing::warn!(
                uid = ?peer.and_then(|p| p.uid),
                pid = ?peer.and_then(|p| p.pid),
                "refused an unredacted tap to a non-root client"
            );
            return Err(s);
        }
        let filter = filter_from(&req);
        let (full, redact) = (filter.full, !filter.unredacted);
        let uid = peer.and_then(|p| p.uid);
        if redact {
            tracing::info!(uid = ?uid, full, "tap client attached");
        } else {
            tracing::warn!(
                uid = ?uid,
                full,
                "tap client attached WITHOUT redaction: it sees registry credentials and env values"
            );
        }
        let mut sub = self.state.tap.subscribe(filter, self.state.tap_queue);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    _ = tx.closed() => break,
                    item = sub.next() => item,
                };
                let Some(item) = item else { break };
                let event = match item {
                    // Decoding for `full` happens here, in this subscriber's task.
                    Item::Call(ev) => pb::tap_event::Event::Call(ev.to_proto(full, redact)),
                    Item::Hold(h) => pb::tap_event::Event::Hold(crate::tap::hold_to_proto(&h)),
                    Item::Dropped { count, total } => {
                        pb::tap_event::Event::Dropped(pb::Dropped { count, total })
                    }
                };
                if tx
                    .send(Ok(pb::TapEvent { event: Some(event) }))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            tracing::info!(uid = ?uid, "tap client detached");
        });
        Ok(tonic::Response::new(ReceiverStream::new(rx)))
    }

    async fn list_pods(
        &self,
        _req: tonic::Request<pb::ListPodsRequest>,
    ) -> Result<tonic::Response<pb::ListPodsResponse>, tonic::Status> {
        let Some(engine) = &self.state.engine else {
            return Ok(tonic::Response::new(pb::ListPodsResponse::default()));
        };
        let mut pods = Vec::new();
        for (p, containers) in engine.pods() {
            pods.push(pod_to_proto(engine, &p, containers).await);
        }
        pods.sort_by(|a, b| {
            (&a.namespace, &a.name, &a.pod_sandbox_id).cmp(&(
                &b.namespace,
                &b.name,
                &b.pod_sandbox_id,
            ))
        });
        Ok(tonic::Response::new(pb::ListPodsResponse { pods }))
    }

    async fn version(
        &self,
        _req: tonic::Request<pb::VersionRequest>,
    ) -> Result<tonic::Response<pb::VersionResponse>, tonic::Status> {
        Ok(tonic::Response::new(pb::VersionResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            listen: self.state.listen.display().to_string(),
            upstream: self.state.upstream.display().to_string(),
            uptime_seconds: self.state.started.elapsed().as_secs(),
            tap_subscribers: self.state.tap.subscribers() as u32,
        }))
    }
}

/// How long ListPods waits for the runtime to list one pod's containers.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

fn unix_nanos(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// One pod as ListPods reports it: the engine's caches, its holds now, and its sidecars'
/// states as the runtime lists them (an admin call, never a CRI call's path).
async fn pod_to_proto(
    engine: &Engine,
    p: &Pod,
    containers: std::collections::HashMap<String, String>,
) -> pb::Pod {
    let listed = match tokio::time::timeout(LIST_TIMEOUT, engine.list_pod_containers(p)).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {LIST_TIMEOUT:?}")),
    };
    let snapshot = listed.as_ref().ok().map(|c| Snapshot::new(c));
    let sidecars = p
        .policy
        .gated()
        .iter()
        .map(|s| sidecar_to_proto(p, s, snapshot.as_ref()))
        .collect();
    let held = p.held_calls().iter().map(held_to_proto).collect();
    let (timeout, policy) = engine.start_policy(p);
    let (is_job, watched) = engine.job_state(p);
    let mut terminated: Vec<String> = containers
        .iter()
        .filter(|(id, _)| engine.terminated(id))
        .map(|(_, name)| name.clone())
        .collect();
    terminated.sort();
    pb::Pod {
        pod_sandbox_id: p.sandbox_id.clone(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        host_network: p.host_network,
        policy_source: match p.policy.source {
            Source::Annotation => "annotation",
            Source::NodeRules => "node-rules",
            Source::Injector => "injector",
            Source::OptOut => "opt-out",
        }
        .into(),
        sidecars,
        start_timeout_ms: p
            .policy
            .start_timeout
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        timeout_policy: p
            .policy
            .timeout_policy
            .map(|t| format!("{t:?}").to_lowercase())
            .unwrap_or_default(),
        job: p.policy.job.map(|j| j.to_string()).unwrap_or_default(),
        containers: {
            let mut c: Vec<pb::Container> = containers
                .into_iter()
                .map(|(id, name)| pb::Container { id, name })
                .collect();
            c.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
            c
        },
        held,
        refusals: p.refusals.load(std::sync::atomic::Ordering::Relaxed),
        effective_start_timeout_ms: timeout.as_millis() as u64,
        effective_timeout_policy: format!("{policy:?}").to_lowercase(),
        job_state: Some(pb::JobState {
            is_job,
            watched,
            terminated,
        }),
        runtime_error: listed.err().unwrap_or_default(),
        isolation: p.isolation().map(ToString::to_string).unwrap_or_default(),
    }
}

/// A sidecar of the pod as `crisp pods` shows it: its state in `snapshot` (`None`: the runtime
/// did not answer) and its last probe.
fn sidecar_to_proto(p: &Pod, s: &Sidecar, snapshot: Option<&Snapshot>) -> pb::Sidecar {
    let (state, container_id) = match snapshot.map(|snap| snap.get(&s.name)) {
        None => (String::new(), String::new()),
        Some(None) => ("not created".to_string(), String::new()),
        Some(Some(c)) => (container_state(c.state).to_string(), c.id.clone()),
    };
    let last = p.last_probe(&s.name);
    pb::Sidecar {
        name: s.name.clone(),
        ready: s.ready.to_string(),
        required: s.required,
        state,
        container_id,
        last_probe_result: last
            .as_ref()
            .map(|l| match &l.result {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            })
            .unwrap_or_default(),
        last_probe_unix_nanos: last.map(|l| unix_nanos(l.at)).unwrap_or(0),
    }
}

/// A call held now, with what it waits for.
fn held_to_proto(h: &HeldCall) -> pb::HeldCall {
    pb::HeldCall {
        call_id: h.call_id,
        method: h.method.clone(),
        container_name: h.container.clone(),
        since_unix_nanos: unix_nanos(h.since),
        waiting_on: h.waiting.on.clone(),
        reason: h.waiting.reason.clone(),
        probe: h.waiting.probe.clone(),
        probe_result: h.waiting.probe_result.clone(),
        held_ms: h.held_from.elapsed().as_millis() as u64,
        time_left_ms: h.time_left().as_millis() as u64,
        policy: h.policy.clone(),
    }
}

fn container_state(s: i32) -> &'static str {
    use crate::cri::views::state;
    match s {
        state::CREATED => "created",
        state::RUNNING => "running",
        state::EXITED => "exited",
        _ => "unknown",
    }
}

/// Everything `GET /metrics` shows: the build, the tap's call metrics and, when the ordering
/// engine runs, its metrics and what its caches hold.
pub fn registry(tap: &Tap, engine: Option<&Arc<Engine>>) -> Registry {
    let mut reg = Registry::default();
    reg.register(
        "crisp_build",
        "crisp's version",
        Info::new([("version", env!("CARGO_PKG_VERSION"))]),
    );
    tap.metrics().register(&mut reg);
    if let Some(e) = engine {
        e.metrics.register(&mut reg);
        // What the engine's caches hold: back to 0 once kubelet removed every pod (leak checks).
        let (pods, containers) = (e.clone(), e.clone());
        reg.register_collector(Box::new(ScrapedGauge::new(
            "crisp_tracked_pods",
            "Pod sandboxes the ordering engine tracks.",
            move || pods.tracked().0 as u64,
        )));
        reg.register_collector(Box::new(ScrapedGauge::new(
            "crisp_tracked_containers",
            "Containers the ordering engine tracks.",
            move || containers.tracked().1 as u64,
        )));
    }
    reg
}

/// The watchdog's and the interceptors' fault metrics (docs/METRICS.md, RELIABILITY.md).
pub(crate) fn register_liveness(reg: &mut Registry, l: &Liveness) {
    use std::sync::atomic::Ordering::Relaxed;
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_relay_stalls",
        "Relay threads found stuck past watchdog.relay_stall; their connections were closed so \
         that kubelet reconnects.",
        move || w.counters.relay_stalls.load(Relaxed),
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_runtime_stalls",
        "Times the async runtime missed its heartbeat for watchdog.runtime_stall.",
        move || w.counters.runtime_stalls.load(Relaxed),
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedGauge::new(
        "crisp_runtime_lag_max_microseconds",
        "Worst scheduling latency of the async runtime's heartbeat since the last scrape.",
        move || w.take_runtime_lag().as_micros() as u64,
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedGauge::new(
        "crisp_healthy",
        "1 while every relay thread and the async runtime make progress (crisp sends systemd \
         WATCHDOG=1 only then).",
        move || u64::from(w.healthy()),
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_watchdog_notifications",
        "WATCHDOG=1 notifications sent to systemd.",
        move || w.counters.notifications.load(Relaxed),
    )));
    let f = l.faults.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_interceptor_panics",
        "Panics in an interceptor hook; each ended that hook's part in one call only.",
        move || f.panics(),
    )));
    let f = l.faults.clone();
    reg.register_collector(Box::new(ScrapedGauge::new(
        "crisp_routes_bypassed",
        "RPCs whose calls skip every interceptor (relayed unobserved) after repeated panics.",
        move || f.bypassed_routes(),
    )));
}

/// `GET /healthz`: `ok`, or 503 with why crisp is not making progress.
async fn healthz(state: &AdminState) -> Response<Body> {
    match &state.watchdog {
        None => plain(StatusCode::OK, "ok (no watchdog)\n".into()),
        Some(w) => match w.verdict() {
            Ok(()) => plain(StatusCode::OK, "ok\n".into()),
            Err(why) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
        },
    }
}

/// `GET /debug/connections`: every kubelet connection crisp relays, one line each, then its
/// streams in flight — what its relay thread answered within 200 ms, or that it did not.
async fn connections(state: &AdminState) -> Response<Body> {
    use std::fmt::Write;
    let Some(w) = &state.watchdog else {
        return plain(StatusCode::NOT_FOUND, "no watchdog\n".into());
    };
    let mut out = String::new();
    for c in w.connections(Duration::from_millis(200)).await {
        let _ = write!(
            out,
            "connection {} age {:.3}s {} for {:.3}s{}",
            c.id,
            c.age.as_secs_f64(),
            if c.waiting { "waiting" } else { "working" },
            c.for_.as_secs_f64(),
            if c.closed { " CLOSED-BY-WATCHDOG" } else { "" },
        );
        match c.report {
            None => out.push_str(" (its thread did not answer within 200 ms)\n"),
            Some(r) => {
                let _ = writeln!(
                    out,
                    " streams {} queued-to-client {} B queued-to-runtime {} B{}{}",
                    r.streams.len(),
                    r.queued_to_client,
                    r.queued_to_runtime,
                    if r.degraded { " degraded" } else { "" },
                    if r.going_away { " going-away" } else { "" },
                );
                for (id, route, age) in r.streams {
                    let _ = writeln!(out, "  stream {id} {route} age {:.3}s", age.as_secs_f64());
                }
            }
        }
    }
    if out.is_empty() {
        out.push_str("no connections\n");
    }
    plain(StatusCode::OK, out)
}

/// `GET /metrics`, in the Prometheus text format ([`crate::metrics::CONTENT_TYPE`]).
pub fn render_metrics(state: &AdminState) -> String {
    crate::metrics::encode(&state.metrics)
}

type Body = tonic::body::Body;

fn plain(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Body::new(Full::new(Bytes::from(text))));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn handle(
    mut req: Request<Incoming>,
    state: Arc<AdminState>,
    grpc: Option<AdminServer<AdminService>>,
    peer: Peer,
) -> Result<Response<Body>, Infallible> {
    if req.uri().path() == "/metrics" {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return Ok(plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "use GET /metrics\n".into(),
            ));
        }
        let mut r = plain(StatusCode::OK, render_metrics(&state));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
        );
        return Ok(r);
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => return Ok(healthz(&state).await),
        (&Method::GET, "/debug/connections") if grpc.is_some() => {
            return Ok(connections(&state).await)
        }
        _ => {}
    }
    let is_grpc = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    match grpc {
        Some(mut svc) if is_grpc => {
            req.extensions_mut().insert(peer);
            svc.call(req).await
        }
        // gRPC over the metrics-only TCP listener: a proper gRPC error, not an HTTP one.
        None if is_grpc => {
            let mut r = Response::new(Body::empty());
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert(
                "grpc-status",
                HeaderValue::from(tonic::Code::Unimplemented as i32),
            );
            h.insert(
                "grpc-message",
                HeaderValue::from_static("crisp serves its admin API on the admin socket only"),
            );
            Ok(r)
        }
        _ => Ok(plain(
            StatusCode::NOT_FOUND,
            "crisp admin: GET /metrics, /healthz, /debug/connections, or the gRPC service \
             crisp.admin.v1.Admin\n".into(),
        )),
    }
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
pub(crate) fn shared_mode_warning(admin: &crate::config::AdminConfig) -> Option<String> {
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
        watchdog: liveness.map(|l| l.watchdog),
    });
    let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let path = cfg.admin_socket();
    if let Some(warning) = shared_mode_warning(&cfg.admin) {
        tracing::warn!(admin = %path.display(), "{warning}");
    }
    let unix = match crate::proxy::listener::bind(&path, cfg.admin.mode).await {
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
