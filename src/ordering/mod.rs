//! The sidecar ordering engine (DESIGN.md §2–§5): holds an app container's CreateContainer until
//! the pod's sidecars are ready, and a sidecar's StopContainer until the pod's apps have exited.
//!
//! State: the runtime is the source of truth. Every gate decision lists the sandbox's containers
//! from the runtime, so a crisp that restarts mid-start or mid-stop decides exactly as before.
//! The only in-memory state is caches (pod policy by sandbox, sandbox+name by container id) that
//! are refilled from the runtime on a miss, and each pod's stop budget window. What the runtime
//! cannot tell is on disk: Job mode's marks (`job/marks.rs`) and the calls crisp holds for
//! kubelet (`intents.rs`), both written by `durable.rs`, and reconciled with the runtime at start
//! (`reconcile.rs`: a held stop is carried out by the restarted crisp).
//!
//! Only CreateContainer, StopContainer, StopPodSandbox and the StartContainer of a container
//! crisp saw no create of (a restored pod, `create.rs`) are ever held. List and Status calls
//! are never observed here, so they can never be slowed (a held List stalls kubelet's PLEG for
//! the whole node, KUBELET-CRI §4.1).
//!
//! Shape: [`decide`] holds the rules as pure functions (policy + snapshot + call + instant →
//! forward, hold until, refuse, patch). This module is the [`Engine`] — its caches, its lookups,
//! its own tasks; `dispatch.rs` makes it an [`Interceptor`](crate::intercept::Interceptor)
//! that only dispatches by route to one file per gate:
//!
//! | file | calls | rule |
//! |---|---|---|
//! | `create.rs` | CreateContainer, StartContainer | sidecars first, readiness wait (DESIGN.md §3) |
//! | `stop.rs` | StopContainer | sidecars last, one grace budget (DESIGN.md §4) |
//! | `stop_sandbox.rs` | StopPodSandbox | the order on kubelet's error path (DESIGN.md §4.2) |
//! | `status.rs` | ContainerStatus, PodSandboxStatus, events | Job mode's exit 0 (DESIGN.md §5) |
//! | `init_guess.rs` | ImageStatus, PullImage | init or regular? (DESIGN.md §3.3) |
//! | `probes.rs` | — | readiness probes from the pod's namespace (DESIGN.md §3.2) |
//! | `job.rs` | — | Job mode's watchers (DESIGN.md §5) |
//! | `refusal.rs` | — | why a create is refused, and every text of it (DESIGN.md §3.3) |
//! | `intents.rs`, `reconcile.rs` | — | held calls kept across crisp's death (DESIGN.md §4.6) |
//!
//! Those gates gather their inputs through the [`runtime::Runtime`] seam. Their clock is
//! tokio's, so `engine_tests/` runs the whole engine on paused time against a scripted runtime.
//!
//! Tasks: the engine's own (a watcher per Job pod, the recovery after a restart) run in its
//! [`TaskTracker`] until they end or [`Engine::shutdown`] cancels them; none outlives it.

pub mod annotations;
mod containers;
mod create;
pub mod decide;
mod dispatch;
pub(crate) mod durable;
#[cfg(test)]
pub(crate) mod engine_tests;
pub(crate) mod holds;
mod init_guess;
pub(crate) mod injectors;
pub mod intents;
mod isolation;
pub mod job;
mod names;
mod pod;
mod probes;
pub(crate) mod reads;
mod reconcile;
mod refusal;
pub mod runtime;
mod sidecar;
mod status;
mod stop;
mod stop_sandbox;
mod warnings;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, JobConfig, OrderingConfig, SidecarRule, TimeoutPolicy};
use crate::cri::views;
use crate::cri::ApiVersion;
use crate::hold_events::HoldSink;
use crate::intercept::Call;
use crate::metrics::OrderingMetrics;
use crate::readiness::ProbeLimiter;
use injectors::InjectorRule;
pub use pod::Pod;
use pod::{container_name, ContainerRef};
use runtime::Runtime;

/// The engine's clock: tokio's, so unit tests can run the rules on paused time. Outside a
/// paused test it is `Instant::now()`.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The ordering engine: the caches its gates share, the node-wide bounds on probing and on its
/// own runtime reads, and its own tasks. One per daemon, behind an `Arc` (its Job watchers hold
/// one until [`Engine::shutdown`]).
pub struct Engine {
    cfg: OrderingConfig,
    job: JobConfig,
    terminated: Arc<job::Terminated>,
    /// Held calls kept durably (`intents.rs`): what a restarted crisp carries on.
    intents: Arc<intents::Intents>,
    /// The StopContainer calls in flight whose intent is kept: call id → (key, owner token);
    /// the intent goes when the call ends (`on_complete`).
    stop_calls: DashMap<u64, (String, u64)>,
    /// Cancelled once the intents found at start are reconciled with the runtime.
    reconciled: CancellationToken,
    /// Lets `&self` methods spawn tasks that outlive the call (job watchers).
    me: Weak<Engine>,
    rules: Vec<SidecarRule>,
    injectors: Vec<InjectorRule>,
    runtime: Box<dyn Runtime>,
    /// Pods with a container refused while no sidecar existed, by annotation fingerprint: the
    /// ImageStatus and PullImage calls that judge it (see `init_guess.rs`) are watched only
    /// while this is not empty.
    guessing: DashMap<u64, String>,
    pods: DashMap<String, Arc<Pod>>,
    containers: containers::Containers,
    /// The node-wide bounds on probing (in flight, connects per second).
    limiter: ProbeLimiter,
    /// The bounds on exec probes (in flight and per second, node-wide and per pod): their own.
    exec_limiter: ProbeLimiter,
    /// The node-wide bound on crisp's repeated runtime reads (held calls, Job watchers).
    reads: reads::ReadLimiter,
    pub metrics: Arc<OrderingMetrics>,
    /// Where hold events go (the tap), once the daemon has wired it.
    hold_sink: OnceLock<Arc<dyn HoldSink>>,
    /// Where held calls' spans go (`[tracing]`), once the daemon has wired it.
    hold_spans: OnceLock<Arc<crate::otel::HoldSpans>>,
    /// The engine's own tasks (Job watchers, recovery): [`Engine::shutdown`] waits for them.
    tasks: TaskTracker,
    /// Cancelled by [`Engine::shutdown`]: every task in `tasks` ends at its next `.await`.
    shutdown: CancellationToken,
    /// When this engine (this crisp) started, by the wall clock the runtime dates things with.
    started_wall: std::time::SystemTime,
    /// `[readiness] shared_kernel_handlers`: the runtime handlers whose pods are not isolated.
    shared_kernel: Vec<String>,
    /// `[readiness] outside_allow`: link-local or metadata networks a pod probed from outside
    /// its network may still be probed at (`readiness::outside_target`).
    outside_allow: Vec<crate::readiness::Cidr>,
    /// Tests only: which addresses count as the node's (a host address stands in for a pod's).
    #[cfg(test)]
    test_node_address: OnceLock<fn(std::net::IpAddr) -> bool>,
}

impl Engine {
    /// An engine whose held calls are kept in memory only (tests; the daemon uses
    /// [`Engine::with_intents`]).
    #[cfg(any(test, feature = "test-util"))]
    pub fn new(
        cfg: &Config,
        runtime: impl Runtime + 'static,
        metrics: Arc<OrderingMetrics>,
        terminated: Arc<job::Terminated>,
    ) -> Arc<Self> {
        Self::with_intents(
            cfg,
            runtime,
            metrics,
            terminated,
            Arc::new(intents::Intents::open(None)),
        )
    }

    /// [`Engine::new`] with the held calls' intents kept in `intents` (the daemon's are on
    /// disk, under the state directory).
    pub fn with_intents(
        cfg: &Config,
        runtime: impl Runtime + 'static,
        metrics: Arc<OrderingMetrics>,
        terminated: Arc<job::Terminated>,
        intents: Arc<intents::Intents>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Engine {
            cfg: cfg.ordering.clone(),
            job: cfg.job.clone(),
            terminated,
            intents,
            stop_calls: DashMap::new(),
            reconciled: CancellationToken::new(),
            me: me.clone(),
            rules: cfg.sidecars.clone(),
            injectors: cfg.injector_table(),
            runtime: Box::new(runtime),
            guessing: DashMap::new(),
            pods: DashMap::new(),
            containers: containers::Containers::default(),
            limiter: ProbeLimiter::new(
                cfg.ordering.max_probes_in_flight,
                cfg.ordering.probe_connects_per_second,
            ),
            exec_limiter: ProbeLimiter::new(
                cfg.ordering.max_exec_probes_in_flight,
                cfg.ordering.exec_probes_per_second,
            )
            .for_execs()
            .per_pod_rate(cfg.ordering.exec_probes_per_pod_per_second),
            reads: reads::ReadLimiter::new(
                cfg.ordering.runtime_reads_per_second,
                cfg.ordering.max_runtime_reads_in_flight,
            ),
            metrics,
            hold_sink: OnceLock::new(),
            hold_spans: OnceLock::new(),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            started_wall: std::time::SystemTime::now(),
            shared_kernel: cfg.readiness.shared_kernel_handlers.clone(),
            outside_allow: cfg.readiness.outside_allow.clone(),
            #[cfg(test)]
            test_node_address: OnceLock::new(),
        })
    }

    /// Whether `ip` is one of the node's own addresses (`sys::net::is_node_address`).
    fn is_node_address(&self, ip: std::net::IpAddr) -> bool {
        #[cfg(test)]
        if let Some(f) = self.test_node_address.get() {
            return f(ip);
        }
        crate::sys::net::is_node_address(ip)
    }

    /// Runs `task` in the engine's tracker until it ends or the engine shuts down. A task
    /// spawned after [`Engine::shutdown`] ends at once.
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            shutdown.run_until_cancelled(task).await;
        });
    }

    /// After a crisp restart, in the background: rebuilds Job watchers ([`Engine::recover`])
    /// and prunes the Job-mode marks of containers removed meanwhile ([`Engine::prune_marks`]).
    pub fn recover_in_background(&self, version: ApiVersion) {
        let Some(engine) = self.me.upgrade() else {
            return;
        };
        {
            let engine = engine.clone();
            self.spawn(async move { engine.reconcile_intents(version).await });
        }
        if self.terminated.prune_pending() {
            let engine = engine.clone();
            self.spawn(async move { engine.prune_marks(version).await });
        }
        self.spawn(async move { engine.recover(version).await });
    }

    /// Ends the engine's own tasks and waits until they have: a Job watcher or the recovery
    /// stops at its next `.await` (as when the runtime that ran it is dropped) and releases the
    /// engine. The daemon calls it once the proxy has drained; calls still held then are not
    /// tasks of the engine but the proxy's, and have ended with it.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// The engine's tasks still running (a watcher per Job pod, the recovery).
    #[cfg(test)]
    pub(crate) fn tasks_running(&self) -> usize {
        self.tasks.len()
    }

    /// Sends hold events to `sink` from now on (set once; the tap is built after the engine).
    pub fn set_hold_sink(&self, sink: Arc<dyn HoldSink>) {
        let _ = self.hold_sink.set(sink);
    }

    fn hold_sink(&self) -> Option<&Arc<dyn HoldSink>> {
        self.hold_sink.get()
    }

    /// Records a span for each hold (and refusal) of a call that carries kubelet's
    /// `traceparent`, from now on (set once; `[tracing]`, src/otel.rs).
    pub fn set_hold_spans(&self, spans: Arc<crate::otel::HoldSpans>) {
        let _ = self.hold_spans.set(spans);
    }

    fn hold_spans(&self) -> Option<&Arc<crate::otel::HoldSpans>> {
        self.hold_spans.get()
    }

    /// The effective start timeout and policy of a pod (its annotations, else the node's).
    pub(crate) fn start_policy(&self, pod: &Pod) -> (Duration, TimeoutPolicy) {
        (
            pod.policy.start_timeout.unwrap_or(self.cfg.start_timeout),
            pod.policy.timeout_policy.unwrap_or(self.cfg.timeout_policy),
        )
    }

    /// The containers of a pod as the runtime lists them now (`crisp pods`; never on a CRI
    /// call's path).
    /// `crisp pods`' read of one pod's containers: through the same node-wide runtime-read
    /// limit as crisp's own repeated reads (issue #44: a client asking for every pod, over and
    /// over, paces with them), waited for until `until` at most.
    pub(crate) async fn list_pod_containers(
        &self,
        pod: &Pod,
        until: tokio::time::Instant,
    ) -> Result<Vec<views::Container>, String> {
        let _read = self.reads.read(Some(until)).await.map_err(|_| {
            "not listed: the node-wide runtime-read limit ([ordering] runtime_reads_per_second) \
             leaves no turn within the request's time"
                .to_string()
        })?;
        self.runtime
            .list_containers(ApiVersion::V1, &pod.sandbox_id)
            .await
            .map_err(|e| e.to_string())
    }

    /// Job mode's state of a pod: whether it is a Job pod, whether crisp watches its apps.
    pub(crate) fn job_state(&self, pod: &Pod) -> (bool, bool) {
        (
            pod.is_job(),
            pod.job_watched.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Whether crisp terminated this container in job mode.
    pub(crate) fn terminated(&self, container_id: &str) -> bool {
        self.terminated.contains(container_id)
    }

    /// Number of pods and containers tracked (for the admin API and leak tests).
    pub fn tracked(&self) -> (usize, usize) {
        (self.pods.len(), self.containers.len())
    }

    /// Names from the caches, for the tap and the admin API: a container id gives its sandbox
    /// and name, a sandbox id its pod. Never asks the runtime and never waits (the tap calls it
    /// as each call ends); what crisp has not seen yet is simply `None`.
    pub(crate) fn lookup(
        &self,
        sandbox_id: Option<&str>,
        container_id: Option<&str>,
    ) -> (Option<Arc<Pod>>, Option<(String, String)>) {
        let container = container_id.and_then(|id| {
            self.containers
                .get(id)
                .map(|container| (container.sandbox_id, container.name))
        });
        let sandbox = sandbox_id.or(container.as_ref().map(|(sandbox, _)| sandbox.as_str()));
        let pod = sandbox.and_then(|id| self.pods.get(id).map(|pod| pod.clone()));
        (pod, container)
    }

    /// Every pod in the cache with the containers crisp has seen in it (id → name).
    pub(crate) fn pods(&self) -> Vec<(Arc<Pod>, HashMap<String, String>)> {
        let mut by_sandbox = self.containers.names_by_sandbox();
        let pods: Vec<Arc<Pod>> = self.pods.iter().map(|pod| pod.value().clone()).collect();
        pods.into_iter()
            .map(|pod| {
                let containers = by_sandbox.remove(&pod.sandbox_id).unwrap_or_default();
                (pod, containers)
            })
            .collect()
    }

    fn insert_pod(
        &self,
        version: ApiVersion,
        pod: Pod,
        warnings: annotations::Warnings,
    ) -> Arc<Pod> {
        // One line per pod however many keys are bad (each is counted).
        if warnings.total() > 0 {
            tracing::warn!(
                pod_namespace = %pod.namespace,
                pod_name = %pod.name,
                "{}",
                warnings.summary()
            );
        }
        self.metrics.bad_annotations.inc_by(warnings.total() as u64);
        let pod = Arc::new(pod);
        // Another call may have raced us; keep the first so warnings and budgets stay single.
        let pod = self
            .pods
            .entry(pod.sandbox_id.clone())
            .or_insert(pod)
            .clone();
        self.maybe_watch_job(&pod, version);
        pod
    }

    fn pod_from_config(
        &self,
        version: ApiVersion,
        sandbox_id: &str,
        cfg: &views::PodSandboxConfig,
    ) -> Arc<Pod> {
        if let Some(pod) = self.pods.get(sandbox_id) {
            return pod.clone();
        }
        let (pod, warnings) = Pod::new(
            sandbox_id,
            cfg.metadata.as_ref(),
            &cfg.annotations,
            cfg.labels.clone(),
            cfg.host_network(),
            &self.rules,
            &self.injectors,
        );
        self.insert_pod(version, pod, warnings)
    }

    /// The pod of a sandbox, from the cache or else from the runtime (after a crisp restart).
    pub(crate) async fn pod_by_id(
        &self,
        version: ApiVersion,
        sandbox_id: &str,
    ) -> Option<Arc<Pod>> {
        if let Some(pod) = self.pods.get(sandbox_id) {
            return Some(pod.clone());
        }
        match self.runtime.pod_sandbox_status(version, sandbox_id).await {
            Ok(resp) => {
                let status = resp.status?;
                let (pod, warnings) = Pod::new(
                    sandbox_id,
                    status.metadata.as_ref(),
                    &status.annotations,
                    status.labels.clone(),
                    status.host_network(),
                    &self.rules,
                    &self.injectors,
                );
                pod.created_at
                    .store(status.created_at, std::sync::atomic::Ordering::Relaxed);
                let pod = self.insert_pod(version, pod, warnings);
                self.classify(&pod, &status.runtime_handler);
                Some(pod)
            }
            // A sandbox the runtime does not know (already removed; critest stops one on
            // purpose): nothing to order, and the runtime answers the call itself.
            Err(e) if e.is_not_found() => {
                tracing::debug!(
                    pod_sandbox_id = sandbox_id,
                    error = %e,
                    "sandbox unknown to the runtime; not ordering this call"
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    pod_sandbox_id = sandbox_id,
                    error = %e,
                    "cannot read sandbox status; not ordering this call"
                );
                None
            }
        }
    }

    /// The sandbox and name of a container, from the cache or else from the runtime.
    async fn container_ref(&self, version: ApiVersion, id: &str) -> Option<ContainerRef> {
        if let Some(container) = self.containers.get(id) {
            return Some(container);
        }
        match self.runtime.container(version, id).await {
            Ok(Some(container)) => {
                let found = ContainerRef {
                    sandbox_id: container.pod_sandbox_id,
                    name: container_name(container.metadata.map(|metadata| metadata.name)),
                    created_seen: false,
                };
                self.containers.insert(id.to_string(), found.clone());
                Some(found)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(
                    container_id = id,
                    error = %e,
                    "cannot look the container up; not ordering this call"
                );
                None
            }
        }
    }

    /// Leave for a held call's repeated runtime read (`again`: waited for until the hold's
    /// end), under the node-wide bound ([`reads`]); `None`: the call's first read, at once.
    async fn read_again(
        &self,
        again: Option<Instant>,
    ) -> Result<Option<tokio::sync::SemaphorePermit<'_>>, reads::ReadLimited> {
        match again {
            Some(until) => self.reads.read(Some(until.into())).await.map(Some),
            None => Ok(None),
        }
    }

    /// A RunPodSandbox answered: the pod's policy is parsed once per sandbox, here, on this
    /// worker — a bounded amount per annotation key (`annotations.rs` says why).
    fn remember_sandbox(&self, call: &Call, req: &[u8], msg: &[u8]) {
        let (Ok(request), Ok(response)) = (
            views::decode::<views::RunPodSandboxRequest>(req),
            views::decode::<views::RunPodSandboxResponse>(msg),
        ) else {
            return;
        };
        if let Some(config) = request.config.as_ref() {
            let pod = self.pod_from_config(
                call.route.version.unwrap_or(ApiVersion::V1),
                &response.pod_sandbox_id,
                config,
            );
            self.classify(&pod, &request.runtime_handler);
        }
    }

    /// Classifies `pod` by its runtime `handler` (`isolation.rs`), unless it already is: the
    /// first answer stands (the handler of a sandbox never changes). What it says until the
    /// pod's network is known; where probes run is then decided by evidence (`probes.rs`).
    fn classify(&self, pod: &Pod, handler: &str) {
        let isolation = isolation::Isolation::classify(handler, &self.shared_kernel);
        let _ = pod.isolation.set(isolation);
    }

    /// RemovePodSandbox: the pod and its containers leave the caches.
    fn forget_sandbox(&self, msg: &[u8]) {
        if let Ok(req) = views::decode::<views::PodSandboxIdRequest>(msg) {
            if let Some((_, pod)) = self.pods.remove(&req.pod_sandbox_id) {
                self.guessing.remove(&pod.annotations_fp);
            }
            // The runtime removes the sandbox's containers with it, with no RemoveContainer.
            self.terminated.remove_sandbox(&req.pod_sandbox_id);
            self.intents.forget_sandbox(&req.pod_sandbox_id);
            self.containers.remove_sandbox(&req.pod_sandbox_id);
        }
    }

    /// RemoveContainer: the container leaves the cache, and its Job-mode mark goes. The last
    /// container crisp knew in its sandbox marks the pod emptied: kubelet removes every
    /// container of a pod it restarts in place (KEP-5532), and runs it again in the same
    /// sandbox ([`Engine::start_over`]).
    fn forget_container(&self, msg: &[u8]) {
        if let Ok(req) = views::decode::<views::ContainerIdRequest>(msg) {
            self.terminated.remove(&req.container_id);
            let Some((gone, emptied)) = self.containers.remove(&req.container_id) else {
                return;
            };
            if !emptied {
                return;
            }
            if let Some(pod) = self.pods.get(&gone.sandbox_id) {
                pod.emptied
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// A container is created in a sandbox whose containers were all removed: the pod runs
    /// again in it (restarted in place, KEP-5532), and is ordered exactly like its first run —
    /// what the gates remembered of the previous run goes ([`Pod::start_over`]), so do the
    /// Job-mode marks and kept intents of its removed containers, and a Job pod whose
    /// sidecars crisp terminated is watched again (DESIGN.md §3.6).
    fn start_over(&self, version: ApiVersion, pod: &Arc<Pod>) {
        use std::sync::atomic::Ordering::Relaxed;
        if !pod.emptied.swap(false, Relaxed) {
            return;
        }
        tracing::info!(
            pod_namespace = %pod.namespace,
            pod_name = %pod.name,
            "the pod's containers were all removed and it starts again in its sandbox: ordering it as a new pod"
        );
        pod.start_over();
        self.terminated.remove_sandbox(&pod.sandbox_id);
        self.intents.forget_sandbox(&pod.sandbox_id);
        if pod.job_done.swap(false, Relaxed) {
            pod.job_watched.store(false, Relaxed);
            self.maybe_watch_job(pod, version);
        }
    }
}

/// The RPC span's pod and container fields, once the gate knows them.
fn record_span(pod: &Pod, container: &str, container_id: Option<&str>) {
    let span = tracing::Span::current();
    span.record("pod_namespace", pod.namespace.as_str());
    span.record("pod_name", pod.name.as_str());
    span.record("pod_sandbox_id", pod.sandbox_id.as_str());
    span.record("container_name", container);
    if let Some(id) = container_id {
        span.record("container_id", id);
    }
}
