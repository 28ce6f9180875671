//! The sidecar ordering engine (DESIGN.md §2–§4): holds an app container's CreateContainer until
//! the pod's sidecars are ready, and a sidecar's StopContainer until the pod's apps have exited.
//!
//! State: the runtime is the source of truth. Every gate decision lists the sandbox's containers
//! from the runtime, so a crisp that restarts mid-start or mid-stop decides exactly as before.
//! The only in-memory state is caches (pod policy by sandbox, sandbox+name by container id) that
//! are refilled from the runtime on a miss, and each pod's stop budget window.
//!
//! Only CreateContainer, StopContainer and StopPodSandbox are ever held. List and Status calls
//! are never observed here, so they can never be slowed (a held List stalls kubelet's PLEG for
//! the whole node, KUBELET-CRI §4.1).
//!
//! Shape: [`decide`] holds the rules as pure functions (policy + snapshot + call + instant →
//! forward, hold until, refuse, patch); this module gathers their inputs through the
//! [`runtime::Runtime`] seam, acts on the answers and keeps the caches. Its clock is tokio's, so
//! `engine_tests.rs` runs the whole engine on paused time against a scripted runtime.

pub mod annotations;
pub mod decide;
#[cfg(test)]
mod engine_tests;
pub mod holds;
pub mod injectors;
pub mod job;
mod names;
pub mod reads;
pub mod runtime;

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;

use crate::config::{Config, JobConfig, OrderingConfig, SidecarRule, TimeoutPolicy};
use crate::cri::patch;
use crate::cri::patch::append_varint_field;
use crate::cri::tags;
use crate::cri::views::{self, state};
use crate::cri::{ApiVersion, Rpc};
use crate::intercept::{BoxFuture, Call, HoldSink, Interceptor, Interest, Verdict};
use crate::metrics::{GaugeGuard, OrderingMetrics};
use crate::netns::{self, NetNs};
use crate::readiness::{self, ProbeLimiter, Readiness};
use crate::status::{code, Status};
use annotations::{PodPolicy, Sidecar};
use decide::{Check, CreatePlan, Snapshot, StopStep, WaitStep};
use injectors::InjectorRule;
use runtime::Runtime;

/// The engine's clock: tokio's, so unit tests can run the rules on paused time. Outside a
/// paused test it is `Instant::now()`.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// What crisp knows about one pod sandbox.
pub struct Pod {
    pub sandbox_id: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub host_network: bool,
    pub labels: HashMap<String, String>,
    pub policy: PodPolicy,
    annotations_fp: u64,
    /// The pod's addresses and network namespace, once the runtime told (see `pod_net`).
    net: Mutex<Option<Arc<PodNet>>>,
    /// `crisp.dev/ready.*` keys already warned about for naming another's address: once a pod.
    tenant_warned: Mutex<HashSet<String>>,
    /// Said that its network namespace cannot be found: once a pod, whoever probes first.
    netns_warned: AtomicBool,
    stop: Mutex<StopWindow>,
    job_watched: AtomicBool,
    /// Init or regular? For containers no annotation names (see [`InitGuess`]).
    init_guess: Mutex<InitGuess>,
    /// When each app container was first refused because a sidecar was not created or not
    /// running: refusals are bounded by the start timeout like holds (see `gate_create`).
    refused_since: Mutex<HashMap<String, Instant>>,
    /// Each probed sidecar's last probe: when, and what it found (`crisp pods`, the tap).
    last_probe: Mutex<HashMap<String, LastProbe>>,
    /// Calls held now, by call id (`crisp pods`). Touched only by held calls.
    holds: Mutex<HashMap<u64, holds::HeldCall>>,
    /// CreateContainer calls refused so far (fail-fast, policy `fail`, long holds).
    pub refusals: AtomicU64,
    /// When each app container's hold began, for holds ended as refusals
    /// (`ordering.refuse_held_after`): kubelet's retry carries on, so the start timeout still
    /// counts from the first hold.
    held_since: Mutex<HashMap<String, Instant>>,
}

/// Where a pod's probes connect from, and the addresses that are its own.
struct PodNet {
    /// The pod's IPs (PodSandboxStatus `network.ip` and `additional_ips`).
    ips: Vec<IpAddr>,
    ns: PodNs,
}

enum PodNs {
    /// hostNetwork: the node's namespace is the pod's.
    Host,
    /// The sandbox's own network namespace, held open.
    Pod(NetNs),
    /// A CNI pod whose namespace could not be found: probes of its IP go from the node's
    /// namespace, probes of loopback fail with this reason.
    Unknown(String),
}

impl PodNet {
    /// The namespace's path no longer names it (sandbox gone, pid reused): look again.
    fn stale(&self) -> bool {
        matches!(&self.ns, PodNs::Pod(ns) if ns.moved())
    }
}

/// A sidecar's last readiness probe, as `crisp pods` and the tap's hold events show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastProbe {
    pub at: std::time::SystemTime,
    pub result: readiness::ProbeResult,
}

/// Telling init containers from regular ones when no annotation names them: the CRI does not
/// say (KUBELET-CRI §2.4), kubelet's behaviour after a refusal does. A container refused while
/// no sidecar exists is either
/// - an init container: `SyncPod` returns at once, and kubelet's next call for this pod is the
///   same container again, ≥ 1 s later (§1.1, §1.3); or
/// - a regular container: kubelet goes on to the next container in the same loop (§1.2), whose
///   first call is an ImageStatus carrying the pod's annotations, maybe a PullImage carrying
///   the pod's sandbox config, maybe a CreateContainer — even when that container's creation
///   then fails (image pull error, back-off, CreateContainerConfigError).
///
/// So between a refusal and kubelet's return to the same container: another CreateContainer,
/// or the calls of two container attempts (two annotated ImageStatus, or two PullImage — one
/// attempt makes one of each at most), prove it regular. Anything less: init.
///
/// That ImageStatus names the pod is kubelet's own doing, checked in its source for 1.20–1.29:
/// `EnsureImageExists` (pkg/kubelet/images) builds the image spec with every pod annotation and
/// `GetImageRef` sends it as `ImageStatusRequest.image.annotations`; PullImage carries the
/// sandbox config. The e2e kubelet emulator does the same.
#[derive(Default)]
struct InitGuess {
    /// Refused, not judged yet: what kubelet did for this pod since.
    open: HashMap<String, Since>,
    /// Proven regular.
    regular: HashSet<String>,
    /// Let through as init containers.
    init: HashSet<String>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Since {
    image_status: u32,
    pulls: u32,
}

#[derive(Debug, PartialEq, Eq)]
enum Judgement {
    /// First refusal: the answer comes with kubelet's next call.
    Unknown,
    Regular,
    Init,
}

impl InitGuess {
    fn judge(&mut self, name: &str) -> Judgement {
        if self.regular.contains(name) {
            return Judgement::Regular;
        }
        if self.init.contains(name) {
            return Judgement::Init;
        }
        match self.open.remove(name) {
            Some(s) if s.image_status >= 2 || s.pulls >= 2 => {
                self.regular.insert(name.to_string());
                Judgement::Regular
            }
            Some(_) => {
                self.init.insert(name.to_string());
                Judgement::Init
            }
            None => {
                self.open.insert(name.to_string(), Since::default());
                Judgement::Unknown
            }
        }
    }

    /// kubelet creates `name`: every other refused container is regular.
    fn note_create(&mut self, name: &str) {
        let others: Vec<String> = self.open.keys().filter(|n| *n != name).cloned().collect();
        for n in others {
            self.open.remove(&n);
            self.regular.insert(n);
        }
    }

    fn note_image_call(&mut self, pull: bool) {
        for s in self.open.values_mut() {
            if pull {
                s.pulls += 1;
            } else {
                s.image_status += 1;
            }
        }
    }
}

/// The pod's termination grace budget: one budget per pod, counted from its first StopContainer
/// (DESIGN.md §4.3).
#[derive(Default)]
struct StopWindow {
    first: Option<Instant>,
    grace: Duration,
    apps_stopping: HashSet<String>,
}

impl Pod {
    fn new(
        sandbox_id: &str,
        md: Option<&views::PodSandboxMetadata>,
        annotations: &HashMap<String, String>,
        labels: HashMap<String, String>,
        host_network: bool,
        rules: &[SidecarRule],
        injectors: &[InjectorRule],
    ) -> (Pod, annotations::Warnings) {
        let (policy, warnings) = PodPolicy::parse_with(annotations, rules, injectors);
        let md = md.cloned().unwrap_or_default();
        let pod = Pod {
            sandbox_id: sandbox_id.to_string(),
            // Shown in logs, messages, the tap and `crisp pods`: cut and escaped once, here
            // (a name Kubernetes accepts is unchanged).
            namespace: crate::tenant::cut(&md.namespace, crate::tenant::MAX_FIELD),
            name: crate::tenant::cut(&md.name, crate::tenant::MAX_FIELD),
            uid: md.uid,
            host_network,
            labels,
            policy,
            annotations_fp: annotations_fingerprint(annotations),
            net: Mutex::new(None),
            tenant_warned: Mutex::new(HashSet::new()),
            netns_warned: AtomicBool::new(false),
            stop: Mutex::new(StopWindow::default()),
            job_watched: AtomicBool::new(false),
            init_guess: Mutex::new(InitGuess::default()),
            refused_since: Mutex::new(HashMap::new()),
            last_probe: Mutex::new(HashMap::new()),
            holds: Mutex::new(HashMap::new()),
            refusals: AtomicU64::new(0),
            held_since: Mutex::new(HashMap::new()),
        };
        (pod, warnings)
    }

    /// Records a StopContainer and returns when the pod's grace budget ends.
    fn note_stop(
        &self,
        now: Instant,
        grace: Duration,
        container_id: &str,
        is_app: bool,
    ) -> Instant {
        let mut w = self.stop.lock().unwrap_or_else(|e| e.into_inner());
        // A window older than any kill could last (grace + kubelet's 2 min) belongs to an earlier
        // single-container kill, not to this termination.
        let stale = w.first.is_some_and(|f| {
            now.saturating_duration_since(f) > w.grace.saturating_add(Duration::from_secs(150))
        });
        if w.first.is_none() || stale {
            *w = StopWindow {
                first: Some(now),
                grace,
                apps_stopping: HashSet::new(),
            };
        }
        if is_app {
            w.apps_stopping.insert(container_id.to_string());
        }
        decide::later(w.first.unwrap_or(now), w.grace)
    }

    fn apps_stopping(&self) -> bool {
        !self
            .stop
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .apps_stopping
            .is_empty()
    }

    /// The last probe of `sidecar`, if crisp probed it.
    pub fn last_probe(&self, sidecar: &str) -> Option<LastProbe> {
        self.last_probe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(sidecar)
            .cloned()
    }

    fn note_probe(&self, sidecar: &str, result: readiness::ProbeResult) {
        let last = LastProbe {
            at: std::time::SystemTime::now(),
            result,
        };
        self.last_probe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sidecar.to_string(), last);
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, HashMap<u64, holds::HeldCall>> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calls of this pod held now, oldest first.
    pub fn held_calls(&self) -> Vec<holds::HeldCall> {
        let mut v: Vec<holds::HeldCall> = self.holds().values().cloned().collect();
        v.sort_by_key(|h| (h.since, h.call_id));
        v
    }

    /// `namespace/name` for messages: each cut and escaped (tenant text).
    fn display(&self) -> String {
        format!(
            "{}/{}",
            crate::tenant::text(&self.namespace, crate::tenant::MAX_FIELD),
            crate::tenant::text(&self.name, crate::tenant::MAX_FIELD)
        )
    }

    fn guess(&self) -> std::sync::MutexGuard<'_, InitGuess> {
        self.init_guess.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a container found to be an init container after the fact (job mode).
    fn note_init(&self, container: &str) {
        self.guess().init.insert(container.to_string());
    }

    /// An init container: named by an annotation, or let through as one.
    pub fn is_init(&self, container: &str) -> bool {
        self.policy.is_known_init(container) || self.guess().init.contains(container)
    }
}

/// A pod's identity as ImageStatus and PullImage show it: its full annotation set (which
/// kubelet stamps per pod with `kubernetes.io/config.seen`).
fn annotations_fingerprint(a: &HashMap<String, String>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut pairs: Vec<(&String, &String)> = a.iter().collect();
    pairs.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pairs.hash(&mut h);
    h.finish()
}

/// A container's name as the caches keep it (logs and views show it): a DNS-1123 label as it is,
/// anything else cut and escaped.
fn container_name(name: Option<String>) -> String {
    let name = name.unwrap_or_default();
    if crate::tenant::is_dns1123_label(&name) {
        name
    } else {
        crate::tenant::cut(&name, crate::tenant::MAX_NAME + 1)
    }
}

#[derive(Clone, Debug)]
struct ContainerRef {
    sandbox_id: String,
    name: String,
}

pub struct Engine {
    cfg: OrderingConfig,
    job: JobConfig,
    terminated: Arc<job::Terminated>,
    /// Lets `&self` methods spawn tasks that outlive the call (job watchers).
    me: Weak<Engine>,
    rules: Vec<SidecarRule>,
    injectors: Vec<InjectorRule>,
    runtime: Box<dyn Runtime>,
    /// Pods with a container refused while no sidecar existed, by annotation fingerprint: the
    /// ImageStatus and PullImage calls that judge it (see [`InitGuess`]) are watched only
    /// while this is not empty.
    guessing: DashMap<u64, String>,
    pods: DashMap<String, Arc<Pod>>,
    containers: DashMap<String, ContainerRef>,
    /// The node-wide bounds on probing (in flight, connects per second).
    limiter: ProbeLimiter,
    /// The node-wide bound on crisp's repeated runtime reads (held calls, Job watchers).
    reads: reads::ReadLimiter,
    pub metrics: Arc<OrderingMetrics>,
    /// Where hold events go (the tap), once the daemon has wired it.
    hold_sink: OnceLock<Arc<dyn HoldSink>>,
}

impl Engine {
    pub fn new(
        cfg: &Config,
        runtime: impl Runtime + 'static,
        metrics: Arc<OrderingMetrics>,
        terminated: Arc<job::Terminated>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Engine {
            cfg: cfg.ordering.clone(),
            job: cfg.job.clone(),
            terminated,
            me: me.clone(),
            rules: cfg.sidecars.clone(),
            injectors: cfg.injector_table(),
            runtime: Box::new(runtime),
            guessing: DashMap::new(),
            pods: DashMap::new(),
            containers: DashMap::new(),
            limiter: ProbeLimiter::new(
                cfg.ordering.max_probes_in_flight,
                cfg.ordering.probe_connects_per_second,
            ),
            reads: reads::ReadLimiter::new(
                cfg.ordering.runtime_reads_per_second,
                cfg.ordering.max_runtime_reads_in_flight,
            ),
            metrics,
            hold_sink: OnceLock::new(),
        })
    }

    /// Sends hold events to `sink` from now on (set once; the tap is built after the engine).
    pub fn set_hold_sink(&self, sink: Arc<dyn HoldSink>) {
        let _ = self.hold_sink.set(sink);
    }

    fn hold_sink(&self) -> Option<&Arc<dyn HoldSink>> {
        self.hold_sink.get()
    }

    /// The effective start timeout and policy of a pod (its annotations, else the node's).
    pub fn start_policy(&self, pod: &Pod) -> (Duration, TimeoutPolicy) {
        (
            pod.policy.start_timeout.unwrap_or(self.cfg.start_timeout),
            pod.policy.timeout_policy.unwrap_or(self.cfg.timeout_policy),
        )
    }

    /// The containers of a pod as the runtime lists them now (`crisp pods`; never on a CRI
    /// call's path).
    pub async fn list_pod_containers(&self, pod: &Pod) -> Result<Vec<views::Container>, String> {
        self.runtime
            .list_containers(ApiVersion::V1, &pod.sandbox_id)
            .await
            .map_err(|e| e.to_string())
    }

    /// Job mode's state of a pod: whether it is a Job pod, whether crisp watches its apps.
    pub fn job_state(&self, pod: &Pod) -> (bool, bool) {
        (
            pod.is_job(),
            pod.job_watched.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Whether crisp terminated this container in job mode.
    pub fn terminated(&self, container_id: &str) -> bool {
        self.terminated.contains(container_id)
    }

    /// Number of pods and containers tracked (for the admin API and leak tests).
    pub fn tracked(&self) -> (usize, usize) {
        (self.pods.len(), self.containers.len())
    }

    /// Names from the caches, for the tap and the admin API: a container id gives its sandbox
    /// and name, a sandbox id its pod. Never asks the runtime and never waits (the tap calls it
    /// as each call ends); what crisp has not seen yet is simply `None`.
    pub fn lookup(
        &self,
        sandbox_id: Option<&str>,
        container_id: Option<&str>,
    ) -> (Option<Arc<Pod>>, Option<(String, String)>) {
        let container = container_id.and_then(|id| {
            self.containers
                .get(id)
                .map(|c| (c.sandbox_id.clone(), c.name.clone()))
        });
        let sandbox = sandbox_id.or(container.as_ref().map(|c| c.0.as_str()));
        let pod = sandbox.and_then(|id| self.pods.get(id).map(|p| p.clone()));
        (pod, container)
    }

    /// Every pod in the cache with the containers crisp has seen in it (id → name).
    pub fn pods(&self) -> Vec<(Arc<Pod>, HashMap<String, String>)> {
        let mut by_sandbox: HashMap<String, HashMap<String, String>> = HashMap::new();
        for c in self.containers.iter() {
            by_sandbox
                .entry(c.sandbox_id.clone())
                .or_default()
                .insert(c.key().clone(), c.name.clone());
        }
        let pods: Vec<Arc<Pod>> = self.pods.iter().map(|p| p.value().clone()).collect();
        pods.into_iter()
            .map(|p| {
                let cs = by_sandbox.remove(&p.sandbox_id).unwrap_or_default();
                (p, cs)
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
            tracing::warn!(pod_namespace = %pod.namespace, pod_name = %pod.name, "{}", warnings.summary());
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
        if let Some(p) = self.pods.get(sandbox_id) {
            return p.clone();
        }
        let (pod, w) = Pod::new(
            sandbox_id,
            cfg.metadata.as_ref(),
            &cfg.annotations,
            cfg.labels.clone(),
            cfg.host_network(),
            &self.rules,
            &self.injectors,
        );
        self.insert_pod(version, pod, w)
    }

    /// The pod of a sandbox, from the cache or else from the runtime (after a crisp restart).
    pub async fn pod_by_id(&self, version: ApiVersion, sandbox_id: &str) -> Option<Arc<Pod>> {
        if let Some(p) = self.pods.get(sandbox_id) {
            return Some(p.clone());
        }
        match self.runtime.pod_sandbox_status(version, sandbox_id).await {
            Ok(resp) => {
                let st = resp.status?;
                let (pod, w) = Pod::new(
                    sandbox_id,
                    st.metadata.as_ref(),
                    &st.annotations,
                    st.labels.clone(),
                    st.host_network(),
                    &self.rules,
                    &self.injectors,
                );
                Some(self.insert_pod(version, pod, w))
            }
            // A sandbox the runtime does not know (already removed; critest stops one on
            // purpose): nothing to order, and the runtime answers the call itself.
            Err(e) if e.is_not_found() => {
                tracing::debug!(pod_sandbox_id = sandbox_id, error = %e, "sandbox unknown to the runtime; not ordering this call");
                None
            }
            Err(e) => {
                tracing::warn!(pod_sandbox_id = sandbox_id, error = %e, "cannot read sandbox status; not ordering this call");
                None
            }
        }
    }

    async fn container_ref(&self, version: ApiVersion, id: &str) -> Option<ContainerRef> {
        if let Some(c) = self.containers.get(id) {
            return Some(c.clone());
        }
        match self.runtime.container(version, id).await {
            Ok(Some(c)) => {
                let r = ContainerRef {
                    sandbox_id: c.pod_sandbox_id,
                    name: container_name(c.metadata.map(|m| m.name)),
                };
                self.containers.insert(id.to_string(), r.clone());
                Some(r)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(container_id = id, error = %e, "cannot look the container up; not ordering this call");
                None
            }
        }
    }

    async fn pod_ip(&self, version: ApiVersion, pod: &Pod) -> Option<IpAddr> {
        if pod.host_network {
            return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
        }
        self.pod_net(version, pod).await?.ips.first().copied()
    }

    /// The pod's addresses and network namespace: cached on the pod, read from the runtime's
    /// verbose PodSandboxStatus on a miss (and again when the namespace's path moved).
    async fn pod_net(&self, version: ApiVersion, pod: &Pod) -> Option<Arc<PodNet>> {
        if let Some(n) = pod
            .net
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|n| !n.stale())
        {
            return Some(n.clone());
        }
        let resp = match self
            .runtime
            .pod_sandbox_status_verbose(version, &pod.sandbox_id)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(pod_namespace = %pod.namespace, pod_name = %pod.name, error = %e, "cannot read the sandbox's status for its addresses");
                return None;
            }
        };
        let network = resp.status.and_then(|s| s.network).unwrap_or_default();
        let ips: Vec<IpAddr> = std::iter::once(network.ip.as_str())
            .chain(network.additional_ips.iter().map(|i| i.ip.as_str()))
            .filter_map(|ip| ip.parse().ok())
            .collect();
        if ips.is_empty() && !pod.host_network {
            return None; // Not networked yet: ask again next time.
        }
        let ns = if pod.host_network {
            PodNs::Host
        } else {
            match netns::resolve(resp.info.get("info").map(String::as_str), &pod.sandbox_id) {
                Ok(ns) => {
                    tracing::debug!(pod_namespace = %pod.namespace, pod_name = %pod.name, netns = %ns.path().display(), inode = ns.inode(), "probing from the pod's network namespace");
                    PodNs::Pod(ns)
                }
                Err(why)
                    if !pod
                        .netns_warned
                        .swap(true, std::sync::atomic::Ordering::Relaxed) =>
                {
                    self.metrics.probe_netns_failures.inc();
                    tracing::warn!(pod_namespace = %pod.namespace, pod_name = %pod.name, "cannot find the pod's network namespace ({why}): probes of its IP go from the node's, probes of loopback fail");
                    PodNs::Unknown(why)
                }
                Err(why) => PodNs::Unknown(why),
            }
        };
        let net = Arc::new(PodNet { ips, ns });
        *pod.net.lock().unwrap_or_else(|e| e.into_inner()) = Some(net.clone());
        Some(net)
    }

    /// The readiness to probe for sidecar `s`: its own, unless the pod's annotation named an
    /// address that is not the pod's (then: warned once, counted, and as if the key were absent).
    async fn checked_ready<'s>(
        &self,
        version: ApiVersion,
        pod: &Pod,
        s: &'s annotations::Sidecar,
    ) -> Result<&'s Readiness, String> {
        let Some(t) = &s.tenant else {
            return Ok(&s.ready);
        };
        let net = self
            .pod_net(version, pod)
            .await
            .ok_or("the pod's addresses are not known yet")?;
        match annotations::tenant_may_aim(&s.ready, &net.ips, &self.cfg.probe_allow) {
            Ok(()) => Ok(&s.ready),
            Err(reason) => {
                if pod
                    .tenant_warned
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(t.key.clone())
                {
                    tracing::warn!(pod_namespace = %pod.namespace, pod_name = %pod.name, "{}", t.warning(reason));
                    self.metrics.bad_annotations.inc();
                }
                Ok(&t.fallback)
            }
        }
    }

    /// Probes one sidecar and keeps the result on the pod (why it is not ready, for operators).
    /// Bounded: one probe slot of the node's (waited for within the probe timeout), the probe
    /// itself within what is left of it.
    async fn probe(&self, version: ApiVersion, pod: &Pod, s: &Sidecar, container_id: &str) -> bool {
        let deadline = tokio::time::Instant::now() + self.cfg.probe_timeout;
        let result = async {
            let ready = self.checked_ready(version, pod, s).await?;
            if *ready == Readiness::Running {
                return Ok(());
            }
            let _slot = self
                .limiter
                .slot(&pod.sandbox_id, deadline)
                .await
                .inspect_err(|_| {
                    self.metrics.probe_limited.inc();
                })?;
            let _counted = GaugeGuard::new(&self.metrics.probe_in_flight);
            let env = ProbeTarget {
                engine: self,
                version,
                pod,
                sidecar: &s.name,
                container_id,
                deadline,
            };
            ready
                .probe(
                    &env,
                    deadline.saturating_duration_since(tokio::time::Instant::now()),
                )
                .await
        }
        .await;
        let ready = result.is_ok();
        pod.note_probe(&s.name, result);
        ready
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

    /// One round of the start check (DESIGN.md §3): list the pod's containers, judge a
    /// container nothing names (see [`InitGuess`]), and ask [`decide::check_start`] — probing
    /// the sidecars it asks for, in declared order, until it has an answer.
    async fn check_start(
        &self,
        version: ApiVersion,
        pod: &Pod,
        container: &str,
        required: &[Sidecar],
        skip_dead: bool,
        again: Option<Instant>,
    ) -> Check<'static> {
        let _read = match self.read_again(again).await {
            Ok(r) => r,
            Err(e) => return Check::Waiting(format!("the runtime ({e})")),
        };
        let containers = match self.runtime.list_containers(version, &pod.sandbox_id).await {
            Ok(c) => c,
            Err(e) => {
                self.metrics.probe_errors.inc();
                tracing::warn!(error = %e, "cannot list the pod's containers; still holding");
                return Check::Waiting(format!("the runtime ({e})"));
            }
        };
        let snap = Snapshot::new(&containers);
        if decide::needs_init_judgement(&pod.policy, &snap) {
            match pod.guess().judge(container) {
                Judgement::Init => {
                    tracing::info!(container_name = %container, "kubelet came straight back to this container: treating it as an init container");
                    return Check::Ready;
                }
                Judgement::Unknown => {
                    self.guessing
                        .insert(pod.annotations_fp, pod.sandbox_id.clone());
                }
                Judgement::Regular => {}
            }
            if pod.guess().open.is_empty() {
                self.guessing.remove(&pod.annotations_fp);
            }
        }
        let refused = |name: &str| {
            pod.refused_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains_key(name)
        };
        let mut probed = HashMap::new();
        loop {
            match decide::check_start(&pod.display(), required, &snap, skip_dead, refused, &probed)
            {
                Check::Probe {
                    sidecar,
                    container_id,
                } => {
                    let ready = self.probe(version, pod, sidecar, &container_id).await;
                    probed.insert(sidecar.name.clone(), ready);
                }
                Check::Ready => return Check::Ready,
                Check::Waiting(who) => return Check::Waiting(who),
                Check::FailFast(why) => return Check::FailFast(why),
            }
        }
    }

    async fn gate_create(&self, call: &Call, msg: &[u8]) -> Verdict {
        let version = call.route.version.unwrap_or(ApiVersion::V1);
        let Some((pod, name)) = self.create_target(version, msg).await else {
            return Verdict::Forward;
        };
        record_span(&pod, &name, None);
        if pod.policy.has_sidecars() {
            pod.guess().note_create(&name);
        }
        let required = match decide::plan_create(&pod.policy, &name) {
            CreatePlan::Forward => return Verdict::Forward,
            CreatePlan::Gate(required) => required,
        };
        let window = self.create_window(call, &pod, &name);
        self.hold_create(call, version, &pod, &name, required, window)
            .await
    }

    /// How long a CreateContainer may be held and whether dead sidecars are still waited for.
    fn create_window(&self, call: &Call, pod: &Pod, name: &str) -> CreateWindow {
        let (timeout, policy) = self.start_policy(pod);
        // A hold ended as a refusal (`refuse_held_after`) carries on in kubelet's retry: the
        // start timeout counts from the first hold, so refusals never extend it.
        let held_from = pod
            .held_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied()
            .unwrap_or(call.received);
        let hold_until = decide::create_hold_end(held_from, timeout, call.deadline);
        let refused_since = pod
            .refused_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .copied();
        let skip_dead = decide::skip_dead(policy, refused_since, now(), timeout);
        if skip_dead {
            self.metrics.start_hold_timeouts.inc();
            let refused_for = refused_since
                .map(|t| now().saturating_duration_since(t))
                .unwrap_or_default();
            tracing::warn!(container_name = %name, refused_for_ms = refused_for.as_millis() as u64, "sidecars still not running after the start timeout; no longer waiting for them (policy proceed)");
        }
        CreateWindow {
            timeout,
            policy,
            held_from,
            hold_until,
            skip_dead,
        }
    }

    /// Checks the `required` sidecars until they are ready (forward), one is missing (refuse),
    /// or the window ends (the timeout policy), showing the hold in the tap meanwhile.
    async fn hold_create(
        &self,
        call: &Call,
        version: ApiVersion,
        pod: &Pod,
        name: &str,
        required: &[Sidecar],
        window: CreateWindow,
    ) -> Verdict {
        let CreateWindow {
            timeout,
            policy,
            held_from,
            hold_until,
            skip_dead,
        } = window;
        let policy_name = match policy {
            TimeoutPolicy::Proceed => "proceed",
            TimeoutPolicy::Fail => "fail",
        };
        let mut held: Option<holds::Hold<'_>> = None;
        // The first round reads the runtime at once; the next ones under the node-wide bound.
        let mut again = None;
        let forget_refusal = || {
            pod.refused_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(name);
            pod.held_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(name);
        };
        loop {
            // A slow runtime must not stretch the hold past its end (nor the forwarded call past
            // kubelet's deadline): a probe round still running then counts as "not ready".
            let check = match tokio::time::timeout_at(
                hold_until.into(),
                self.check_start(version, pod, name, required, skip_dead, again),
            )
            .await
            {
                Ok(c) => c,
                Err(_) => Check::Waiting("the runtime (no answer before the hold's end)".into()),
            };
            again = Some(hold_until);
            let who = match check {
                Check::Ready => {
                    forget_refusal();
                    break;
                }
                Check::FailFast(reason) => return self.refuse_fast(pod, call, name, &reason, held),
                Check::Waiting(who) => who,
                Check::Probe { .. } => unreachable!("check_start answers its own probes"),
            };
            let waiting = holds::Waiting::from_check(pod, &who);
            match held.as_mut() {
                Some(h) => h.update(waiting),
                None => {
                    tracing::info!(container_name = %name, waiting_for = %who, timeout_ms = timeout.as_millis() as u64, "holding CreateContainer until sidecars are ready");
                    held = Some(holds::Hold::start(
                        self,
                        pod,
                        call,
                        name,
                        "",
                        held_from,
                        hold_until,
                        policy_name,
                        waiting,
                    ));
                }
            }
            if let Some(v) =
                self.refuse_long_hold(pod, name, &mut held, held_from, hold_until, timeout)
            {
                return v;
            }
            match decide::after_waiting(now(), hold_until, self.cfg.probe_interval, policy) {
                WaitStep::Until(next) => tokio::time::sleep_until(next.into()).await,
                WaitStep::TimedOut(policy) => {
                    forget_refusal();
                    return self.start_timed_out(pod, name, &who, timeout, policy, held);
                }
            }
        }
        if let Some(h) = held {
            let d = now().saturating_duration_since(h.since);
            self.metrics.start_holds.observe(d.as_secs_f64());
            tracing::info!(container_name = %name, held_ms = d.as_millis() as u64, "sidecars ready; forwarding CreateContainer");
            h.end("forwarded", "");
        }
        Verdict::Forward
    }

    /// The pod a CreateContainer is for and the container's name; `None`: forward it unordered
    /// (a copy that does not decode, a sandbox the runtime does not know).
    async fn create_target(&self, version: ApiVersion, msg: &[u8]) -> Option<(Arc<Pod>, String)> {
        let req: views::CreateContainerRequest = match views::decode(msg) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot decode a copy of CreateContainerRequest; forwarding it unordered");
                return None;
            }
        };
        let name = req
            .config
            .as_ref()
            .and_then(|c| c.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        if !crate::tenant::is_dns1123_label(&name) {
            // Not a name Kubernetes gives a container (only another CRI client could send it).
            tracing::debug!(container_name = %crate::tenant::text(&name, crate::tenant::MAX_FIELD), "container name is not a DNS-1123 label; forwarding it unordered");
            return None;
        }
        let pod = match req.sandbox_config.as_ref() {
            Some(sc) => self.pod_from_config(version, &req.pod_sandbox_id, sc),
            None => self.pod_by_id(version, &req.pod_sandbox_id).await?,
        };
        Some((pod, name))
    }

    /// A required sidecar is not there (or not running): refuse the create now, kubelet retries
    /// (§3.3); the start timeout counts from this first refusal.
    fn refuse_fast(
        &self,
        pod: &Pod,
        call: &Call,
        name: &str,
        reason: &str,
        held: Option<holds::Hold<'_>>,
    ) -> Verdict {
        pod.refused_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_insert(call.received);
        self.metrics.fail_fast.inc();
        tracing::info!(container_name = %name, "refusing CreateContainer for now: {reason}");
        let message = decide::refusal(reason, name);
        if let Some(h) = held {
            h.end("refused", &message);
        }
        self.note_refusal(
            pod,
            call,
            name,
            &holds::Waiting::from_refusal(pod, reason),
            &message,
        );
        Verdict::Reject(Status::new(code::FAILED_PRECONDITION, message))
    }

    /// The hold reached the start timeout still waiting for `who`: start the app anyway or
    /// fail the create, as `policy` says (§3.4).
    fn start_timed_out(
        &self,
        pod: &Pod,
        name: &str,
        who: &str,
        timeout: Duration,
        policy: TimeoutPolicy,
        held: Option<holds::Hold<'_>>,
    ) -> Verdict {
        self.metrics.start_hold_timeouts.inc();
        if let Some(h) = &held {
            self.metrics
                .start_holds
                .observe(now().saturating_duration_since(h.since).as_secs_f64());
        }
        match policy {
            TimeoutPolicy::Proceed => {
                tracing::warn!(container_name = %name, waiting_for = %who, "sidecar not ready within the start timeout; starting the app anyway (policy proceed)");
                if let Some(h) = held {
                    h.end("timed out (proceed)", "");
                }
                Verdict::Forward
            }
            TimeoutPolicy::Fail => {
                tracing::warn!(container_name = %name, waiting_for = %who, "sidecar not ready within the start timeout; failing CreateContainer (policy fail)");
                pod.refusals
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // Not DEADLINE_EXCEEDED: that would read as kubelet's own deadline.
                let message = decide::timed_out(&pod.display(), who, timeout, name);
                if let Some(h) = held {
                    h.end("timed out (fail)", &message);
                }
                Verdict::Reject(Status::new(code::FAILED_PRECONDITION, message))
            }
        }
    }

    /// `ordering.refuse_held_after`: a CreateContainer held that long is refused with what it
    /// waits for, so kubelet shows it as the container's waiting reason (CreateContainerError)
    /// and a Warning event; "network is not ready" in the message brings its retry within
    /// 1–1.5 s (KUBELET-CRI §1.3), and the retry's hold carries on from `held_from`.
    fn refuse_long_hold(
        &self,
        pod: &Pod,
        name: &str,
        held: &mut Option<holds::Hold<'_>>,
        held_from: Instant,
        hold_until: Instant,
        timeout: Duration,
    ) -> Option<Verdict> {
        let after = self.cfg.refuse_held_after;
        let t = now();
        let h = held.as_ref()?;
        if after.is_zero() || t.saturating_duration_since(h.since) < after || t >= hold_until {
            return None;
        }
        let message = holds::held_refusal(
            &pod.display(),
            name,
            h.waiting(),
            t.saturating_duration_since(held_from),
            timeout,
        );
        pod.held_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_string())
            .or_insert(held_from);
        pod.refusals
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = t.saturating_duration_since(h.since);
        self.metrics.start_holds.observe(d.as_secs_f64());
        tracing::info!(container_name = %name, held_ms = d.as_millis() as u64, "held long: refusing CreateContainer with the reason, for kubelet to show; it retries within 1.5 s");
        if let Some(h) = held.take() {
            h.end("refused (still waiting)", &message);
        }
        Some(Verdict::Reject(Status::new(
            code::FAILED_PRECONDITION,
            message,
        )))
    }

    async fn gate_stop(&self, call: &Call, msg: &[u8]) -> Verdict {
        let version = call.route.version.unwrap_or(ApiVersion::V1);
        let Ok(req) = views::decode::<views::ContainerIdRequest>(msg) else {
            tracing::warn!("cannot decode a copy of StopContainerRequest; forwarding it unordered");
            return Verdict::Forward;
        };
        let Some(cref) = self.container_ref(version, &req.container_id).await else {
            return Verdict::Forward;
        };
        let Some(pod) = self.pod_by_id(version, &cref.sandbox_id).await else {
            return Verdict::Forward;
        };
        record_span(&pod, &cref.name, Some(&req.container_id));
        if !pod.policy.has_sidecars() {
            return Verdict::Forward;
        }
        let arrived = now();
        // The pod's terminationGracePeriodSeconds: any int64, bounded here where it enters.
        let grace = decide::grace_from_secs(req.timeout);
        let idx = pod.policy.sidecar_index(&cref.name);
        let budget_end = pod.note_stop(arrived, grace, &req.container_id, idx.is_none());
        // An app's stop is forwarded at once (§4.1).
        let Some(idx) = idx else {
            return Verdict::Forward;
        };
        let hold_until = decide::stop_hold_end(arrived, grace, call.deadline);
        let window = SidecarStop {
            sidecar: idx,
            arrived,
            hold_until,
            single_kill_after: decide::single_kill_after(arrived, grace),
        };
        self.hold_sidecar_stop(call, version, &pod, &cref.name, &req.container_id, window)
            .await;
        // Forward with what is left of the pod's budget; the KEP's 2 s tail once it is spent.
        match decide::stop_timeout(budget_end, now(), req.timeout) {
            Some(secs) => Verdict::ForwardPatched(append_varint_field(
                msg,
                tags::stop_container_request::TIMEOUT,
                secs,
            )),
            None => Verdict::Forward,
        }
    }

    /// Holds a sidecar's StopContainer while apps of the pod still run (§4.2), within `window`;
    /// returns when it is to be forwarded.
    async fn hold_sidecar_stop(
        &self,
        call: &Call,
        version: ApiVersion,
        pod: &Pod,
        name: &str,
        container_id: &str,
        window: SidecarStop,
    ) {
        let SidecarStop {
            sidecar: idx,
            arrived,
            hold_until,
            single_kill_after,
        } = window;
        let mut held: Option<holds::Hold<'_>> = None;
        let mut again = false;
        loop {
            // A slow runtime must not stretch the hold past its end (kubelet's deadline less the
            // forwarded stop's tail): an answer not in by then counts as "stop it now".
            let Some(containers) = self
                .list_for_stop(version, pod, name, hold_until, again)
                .await
            else {
                break;
            };
            again = true;
            let snap = Snapshot::new(&containers);
            let t = now();
            match decide::stop_step(
                &pod.policy,
                idx,
                &snap,
                t,
                hold_until,
                single_kill_after,
                pod.apps_stopping(),
            ) {
                StopStep::Forward => break,
                StopStep::SingleKill => {
                    tracing::info!(container_name = %name, "no app container of the pod is being stopped: a single-container kill; forwarding");
                    break;
                }
                StopStep::Deadline { apps, sidecars } => {
                    tracing::warn!(container_name = %name, ?apps, ?sidecars, "still running at kubelet's deadline; stopping the sidecar anyway");
                    break;
                }
                StopStep::Hold { apps, sidecars } => {
                    let waiting = holds::Waiting {
                        on: "apps".into(),
                        reason: format!(
                            "running: {}",
                            apps.iter()
                                .chain(sidecars.iter())
                                .copied()
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        ..Default::default()
                    };
                    match held.as_mut() {
                        Some(h) => h.update(waiting),
                        None => {
                            tracing::info!(container_name = %name, ?apps, ?sidecars, "holding sidecar StopContainer until these exit");
                            held = Some(holds::Hold::start(
                                self,
                                pod,
                                call,
                                name,
                                container_id,
                                arrived,
                                hold_until,
                                "",
                                waiting,
                            ));
                        }
                    }
                }
            }
            tokio::time::sleep_until((t + self.cfg.probe_interval).min(hold_until).into()).await;
        }
        if let Some(h) = held {
            let d = now().saturating_duration_since(h.since);
            self.metrics.stop_holds.observe(d.as_secs_f64());
            tracing::info!(container_name = %name, held_ms = d.as_millis() as u64, "forwarding sidecar StopContainer");
            h.end("forwarded", "");
        }
    }

    /// The pod's containers, for a held stop (`again`: a repeated read, under the node-wide
    /// bound); `None` (forward now) when the runtime fails or does not answer before
    /// `hold_until`.
    async fn list_for_stop(
        &self,
        version: ApiVersion,
        pod: &Pod,
        name: &str,
        hold_until: Instant,
        again: bool,
    ) -> Option<Vec<views::Container>> {
        let list = async {
            match self.read_again(again.then_some(hold_until)).await {
                Ok(_read) => Some(self.runtime.list_containers(version, &pod.sandbox_id).await),
                Err(_) => None,
            }
        };
        match tokio::time::timeout_at(hold_until.into(), list).await {
            Ok(Some(Ok(c))) => Some(c),
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "cannot list the pod's containers; forwarding StopContainer");
                None
            }
            Ok(None) | Err(_) => {
                tracing::warn!(container_name = %name, "the runtime did not list the pod's containers before kubelet's deadline; forwarding StopContainer");
                None
            }
        }
    }

    /// StopPodSandbox force-kills whatever still runs (CRI contract). kubelet sends it after
    /// every StopContainer returned — including ones that *failed*, e.g. because crisp restarted
    /// while holding a sidecar's stop (KUBELET-CRI §7.4). So for pods with sidecars it is held
    /// while an app still runs, and the remaining sidecars are then stopped in reverse order
    /// before it is forwarded: the order survives kubelet's error path.
    async fn gate_stop_sandbox(&self, call: &Call, msg: &[u8]) -> Verdict {
        let version = call.route.version.unwrap_or(ApiVersion::V1);
        let Ok(req) = views::decode::<views::PodSandboxIdRequest>(msg) else {
            return Verdict::Forward;
        };
        // Unknown pods are looked up only if they may matter: a cheap runtime read.
        let Some(pod) = self.pod_by_id(version, &req.pod_sandbox_id).await else {
            return Verdict::Forward;
        };
        if !pod.policy.has_sidecars() {
            return Verdict::Forward;
        }
        record_span(&pod, "", None);
        let arrived = now();
        let hold_until = decide::sandbox_hold_end(arrived, call.deadline);
        let budget_end = {
            let w = pod.stop.lock().unwrap_or_else(|e| e.into_inner());
            w.first.map(|f| decide::later(f, w.grace))
        };
        let mut held: Option<holds::Hold<'_>> = None;
        let mut again = None;
        // The last listing while held: what is stopped when the next one cannot be had before
        // the hold's end (it is at most one probe interval old).
        let mut last = None;
        let running = loop {
            let list = async {
                let _read = self.read_again(again).await.ok()?;
                self.runtime
                    .list_containers(version, &pod.sandbox_id)
                    .await
                    .ok()
            };
            let containers = match tokio::time::timeout_at(hold_until.into(), list).await {
                Ok(Some(c)) => c,
                // Not listed before the hold's end: stop what the last listing saw running;
                // never listed: StopPodSandbox kills what runs.
                _ => match last.take() {
                    Some(running) => break running,
                    None => return Verdict::Forward,
                },
            };
            again = Some(hold_until);
            let running: Vec<views::Container> = containers
                .into_iter()
                .filter(|c| c.state == state::RUNNING)
                .collect();
            let t = now();
            if Snapshot::new(&running).running_apps(&pod.policy).is_empty() || t >= hold_until {
                break running;
            }
            let waiting = holds::Waiting {
                on: "apps".into(),
                reason: format!(
                    "running: {}",
                    Snapshot::new(&running).running_apps(&pod.policy).join(", ")
                ),
                ..Default::default()
            };
            match held.as_mut() {
                Some(h) => h.update(waiting),
                None => {
                    tracing::info!("holding StopPodSandbox until the pod's app containers exit");
                    held = Some(holds::Hold::start(
                        self, &pod, call, "", "", arrived, hold_until, "", waiting,
                    ));
                }
            }
            last = Some(running);
            tokio::time::sleep_until((t + self.cfg.probe_interval).min(hold_until).into()).await;
        };
        if let Some(h) = held {
            self.metrics
                .stop_holds
                .observe(now().saturating_duration_since(h.since).as_secs_f64());
            h.end("forwarded", "");
        }
        for (name, id) in decide::sandbox_stop_apps(&pod.policy, &running) {
            tracing::info!(container_name = %name, "stopping app before the sidecars and StopPodSandbox (kubelet's StopContainer never came)");
            if let Err(e) = self
                .runtime
                .stop_container(version, id, decide::STOP_TAIL.as_secs() as i64)
                .await
            {
                tracing::warn!(container_name = %name, error = %e, "could not stop app; StopPodSandbox will");
            }
        }
        for (name, id) in decide::sandbox_stop_order(&pod.policy, &running) {
            let secs = decide::budget_secs(budget_end, now());
            tracing::info!(container_name = %name, "stopping sidecar before StopPodSandbox (reverse order)");
            if let Err(e) = self.runtime.stop_container(version, id, secs).await {
                tracing::warn!(container_name = %name, error = %e, "could not stop sidecar; StopPodSandbox will");
            }
        }
        Verdict::Forward
    }

    /// An ImageStatus or PullImage of a pod that has a refused container awaiting judgement.
    fn note_image_call(&self, annotations: HashMap<String, String>, pull: bool) {
        if annotations.is_empty() {
            return; // getImageUser's ImageStatus: no pod named.
        }
        let Some(sandbox) = self
            .guessing
            .get(&annotations_fingerprint(&annotations))
            .map(|s| s.clone())
        else {
            return;
        };
        let Some(pod) = self.pods.get(&sandbox).map(|p| p.clone()) else {
            return;
        };
        let mut g = pod.guess();
        g.note_image_call(pull);
        if g.open.is_empty() {
            self.guessing.remove(&pod.annotations_fp);
        }
    }

    fn forget_sandbox(&self, msg: &[u8]) {
        if let Ok(req) = views::decode::<views::PodSandboxIdRequest>(msg) {
            if let Some((_, p)) = self.pods.remove(&req.pod_sandbox_id) {
                self.guessing.remove(&p.annotations_fp);
            }
            self.containers
                .retain(|_, c| c.sandbox_id != req.pod_sandbox_id);
        }
    }
}

/// The time a sidecar's StopContainer may be held (see [`Engine::hold_sidecar_stop`]).
struct SidecarStop {
    /// The sidecar's place in the pod's list.
    sidecar: usize,
    arrived: Instant,
    hold_until: Instant,
    /// No app is being stopped by then: a single-container kill (liveness), forwarded.
    single_kill_after: Instant,
}

/// The time a CreateContainer may be held (see [`Engine::create_window`]).
struct CreateWindow {
    timeout: Duration,
    policy: TimeoutPolicy,
    /// When this container's first hold began (this call, or an earlier one refused).
    held_from: Instant,
    hold_until: Instant,
    /// The start timeout passed while a sidecar was missing: stop waiting for it (proceed).
    skip_dead: bool,
}

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

impl Interceptor for Engine {
    fn interest(&self, call: &Call) -> Interest {
        match call.route.rpc {
            Some(Rpc::CreateContainer) | Some(Rpc::RunPodSandbox) => Interest {
                request: true,
                response: true,
                complete: false,
            },
            Some(Rpc::StopContainer)
            | Some(Rpc::StopPodSandbox)
            | Some(Rpc::RemovePodSandbox)
            | Some(Rpc::RemoveContainer) => Interest {
                request: true,
                response: false,
                complete: false,
            },
            // Job mode's exit-code patch: only while crisp has terminated some sidecar.
            Some(Rpc::ContainerStatus) | Some(Rpc::PodSandboxStatus)
                if !self.terminated.is_empty() =>
            {
                Interest {
                    request: false,
                    response: true,
                    complete: false,
                }
            }
            // Judging a refused container (see `InitGuess`): only while one waits for judgement.
            Some(Rpc::ImageStatus) | Some(Rpc::PullImage) if !self.guessing.is_empty() => {
                Interest {
                    request: true,
                    response: false,
                    complete: false,
                }
            }
            // Events are rare and a stream lives long: watch every message while job mode is on.
            Some(Rpc::GetContainerEvents) if self.job.enabled => Interest {
                request: false,
                response: true,
                complete: false,
            },
            _ => Interest::NONE,
        }
    }

    fn on_request<'a>(&'a self, call: &'a Call, msg: &'a [u8]) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            match call.route.rpc {
                Some(Rpc::CreateContainer) => self.gate_create(call, msg).await,
                Some(Rpc::StopContainer) => self.gate_stop(call, msg).await,
                Some(Rpc::StopPodSandbox) => self.gate_stop_sandbox(call, msg).await,
                Some(Rpc::RemovePodSandbox) => {
                    self.forget_sandbox(msg);
                    Verdict::Forward
                }
                Some(Rpc::ImageStatus) => {
                    if let Ok(r) = views::decode::<views::ImageStatusRequest>(msg) {
                        self.note_image_call(
                            r.image.map(|i| i.annotations).unwrap_or_default(),
                            false,
                        );
                    }
                    Verdict::Forward
                }
                Some(Rpc::PullImage) => {
                    if let Ok(r) = views::decode::<views::PullImageRequest>(msg) {
                        self.note_image_call(
                            r.sandbox_config.map(|c| c.annotations).unwrap_or_default(),
                            true,
                        );
                    }
                    Verdict::Forward
                }
                Some(Rpc::RemoveContainer) => {
                    if let Ok(req) = views::decode::<views::ContainerIdRequest>(msg) {
                        self.containers.remove(&req.container_id);
                        self.terminated.remove(&req.container_id);
                    }
                    Verdict::Forward
                }
                _ => Verdict::Forward,
            }
        })
    }

    fn on_response(&self, call: &Call, req: &[u8], msg: Option<&[u8]>, code: i32) -> Option<Bytes> {
        if code != 0 {
            return None;
        }
        let msg = msg?;
        let patch_statuses = |field: u32| {
            if self.terminated.is_empty() {
                return None;
            }
            match patch::patch_embedded(msg, field, &patch::completed_fragment(), |id| {
                self.terminated.contains(id)
            }) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot walk a status response to patch it; forwarding it unchanged");
                    None
                }
            }
        };
        match call.route.rpc {
            // A sidecar crisp terminated reports exit 0 / Completed (DESIGN.md §5).
            // The embedded status carries its id, so the request need not be read.
            Some(Rpc::ContainerStatus) => {
                return patch_statuses(tags::container_status_response::STATUS)
            }
            Some(Rpc::PodSandboxStatus) => {
                return patch_statuses(tags::pod_sandbox_status_response::CONTAINERS_STATUSES)
            }
            Some(Rpc::GetContainerEvents) => {
                return patch_statuses(tags::container_event_response::CONTAINERS_STATUSES)
            }
            // The pod's policy is parsed once per sandbox, here, on this worker: a bounded amount
            // per annotation key (ordering/annotations.rs says why).
            Some(Rpc::RunPodSandbox) => {
                let (Ok(r), Ok(resp)) = (
                    views::decode::<views::RunPodSandboxRequest>(req),
                    views::decode::<views::RunPodSandboxResponse>(msg),
                ) else {
                    return None;
                };
                if let Some(cfg) = r.config.as_ref() {
                    self.pod_from_config(
                        call.route.version.unwrap_or(ApiVersion::V1),
                        &resp.pod_sandbox_id,
                        cfg,
                    );
                }
            }
            Some(Rpc::CreateContainer) => {
                let (Ok(r), Ok(resp)) = (
                    views::decode::<views::CreateContainerRequest>(req),
                    views::decode::<views::CreateContainerResponse>(msg),
                ) else {
                    return None;
                };
                let name = container_name(r.config.and_then(|c| c.metadata).map(|m| m.name));
                self.containers.insert(
                    resp.container_id,
                    ContainerRef {
                        sandbox_id: r.pod_sandbox_id,
                        name,
                    },
                );
            }
            _ => {}
        }
        None
    }
}

/// What a readiness probe of one sidecar reaches through the engine: the pod's IP (from the
/// runtime, cached) and ExecSync in the sidecar's container.
struct ProbeTarget<'a> {
    engine: &'a Engine,
    version: ApiVersion,
    pod: &'a Pod,
    sidecar: &'a str,
    container_id: &'a str,
    /// The probe's end: waits for the node-wide bounds never go past it.
    deadline: tokio::time::Instant,
}

impl readiness::ProbeEnv for ProbeTarget<'_> {
    async fn pod_ip(&self) -> Option<IpAddr> {
        self.engine.pod_ip(self.version, self.pod).await
    }

    /// From inside the pod's network namespace (hostNetwork pods: the node's, which is theirs).
    /// A CNI pod whose namespace is unknown is probed at its IP from the node's namespace, and
    /// never at loopback: that would be the node's.
    async fn connect(&self, addr: SocketAddr) -> Result<tokio::net::TcpStream, String> {
        let e = self.engine;
        e.limiter.connect(self.deadline).await.inspect_err(|_| {
            e.metrics.probe_limited.inc();
        })?;
        let net = if self.pod.host_network {
            None
        } else {
            e.pod_net(self.version, self.pod).await
        };
        let local = readiness::is_local(addr.ip());
        let socket = match net.as_deref().map(|n| &n.ns) {
            Some(PodNs::Pod(ns)) => Some(ns.socket(addr.is_ipv6()).await.map_err(|err| format!("cannot enter the pod's network namespace: {err}"))?),
            Some(PodNs::Unknown(why)) if local => return Err(format!("cannot enter the pod's network namespace: {why}")),
            None if local && !self.pod.host_network => return Err("cannot enter the pod's network namespace: the runtime has not reported the sandbox's status".into()),
            _ => None,
        };
        e.metrics.probe_connects.inc();
        match socket {
            Some(s) => s
                .connect(addr)
                .await
                .map_err(|err| format!("connect {addr}: {err}")),
            None => readiness::connect_here(addr).await,
        }
    }

    /// Paced as a connect (each ExecSync is a process started in a container), and over by the
    /// probe's end whatever the wait for its turn took.
    async fn exec(&self, cmd: &[String], timeout: Duration) -> Result<i32, String> {
        self.engine
            .limiter
            .connect(self.deadline)
            .await
            .inspect_err(|_| {
                self.engine.metrics.probe_limited.inc();
            })?;
        let timeout = timeout.min(
            self.deadline
                .saturating_duration_since(tokio::time::Instant::now()),
        );
        self.engine.runtime.exec_sync(self.version, self.container_id, cmd, timeout).await.map_err(|e| {
            self.engine.metrics.probe_errors.inc();
            tracing::debug!(container_name = %self.sidecar, error = %e, "exec readiness probe failed to run");
            e.to_string()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guess that has judged `name` once (Unknown: refused), then saw these annotated image
    /// calls (`true`: a PullImage, `false`: an ImageStatus).
    fn guess_after_image_calls(name: &str, calls: &[bool]) -> InitGuess {
        let mut g = InitGuess::default();
        assert_eq!(g.judge(name), Judgement::Unknown);
        for &pull in calls {
            g.note_image_call(pull);
        }
        g
    }

    #[test]
    fn init_guess_init_container_comes_straight_back() {
        // Its own retry: one annotated ImageStatus (and a pull under imagePullPolicy Always).
        let mut g = guess_after_image_calls("init", &[false, true]);
        assert_eq!(g.judge("init"), Judgement::Init);
        assert_eq!(g.judge("init"), Judgement::Init, "sticky");
    }

    #[test]
    fn init_guess_regular_when_kubelet_moved_on_though_the_sidecar_failed() {
        // The sidecar after it: ImageStatus, failed PullImage (ErrImagePull); then the retry's
        // own ImageStatus. Two attempts: a regular container.
        let mut g = guess_after_image_calls("app", &[false, true, false]);
        assert_eq!(g.judge("app"), Judgement::Regular);
        // Later syncs (ImagePullBackOff: no call at all) keep the verdict.
        assert_eq!(g.judge("app"), Judgement::Regular);
    }

    #[test]
    fn init_guess_regular_when_another_container_was_created() {
        let mut g = InitGuess::default();
        assert_eq!(g.judge("app"), Judgement::Unknown);
        g.note_create("proxy");
        g.note_create("app");
        assert_eq!(g.judge("app"), Judgement::Regular);
    }

    #[test]
    fn a_pod_is_recognised_by_its_whole_annotation_set() {
        let a: HashMap<String, String> = [
            (
                "kubernetes.io/config.seen",
                "2026-11-24T10:00:00.123456789Z",
            ),
            ("crisp.dev/sidecars", "proxy"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut pairs: Vec<(&String, &String)> = a.iter().collect();
        pairs.sort();
        pairs.reverse();
        let mut b = HashMap::new();
        for (k, v) in pairs {
            b.insert(k.clone(), v.clone());
        }
        assert_eq!(
            annotations_fingerprint(&a),
            annotations_fingerprint(&b),
            "map order does not matter"
        );
        b.insert(
            "kubernetes.io/config.seen".into(),
            "2026-11-24T10:00:00.123456790Z".into(),
        );
        assert_ne!(
            annotations_fingerprint(&a),
            annotations_fingerprint(&b),
            "another pod, seen 1 ns later"
        );
    }

    #[test]
    fn stop_budget_is_one_window_per_termination() {
        let _ = AtomicBool::new(false);
        let (pod, _) = Pod::new("sb", None, &HashMap::new(), HashMap::new(), false, &[], &[]);
        let t0 = Instant::now();
        let end = pod.note_stop(t0, Duration::from_secs(30), "app", true);
        assert_eq!(end, t0 + Duration::from_secs(30));
        // A later StopContainer of the same termination shares the budget.
        let end2 = pod.note_stop(
            t0 + Duration::from_secs(5),
            Duration::from_secs(30),
            "side",
            false,
        );
        assert_eq!(end2, end);
        assert!(pod.apps_stopping());
        // Long after, a new window starts.
        let t1 = t0 + Duration::from_secs(400);
        assert_eq!(
            pod.note_stop(t1, Duration::from_secs(10), "side", false),
            t1 + Duration::from_secs(10)
        );
        assert!(!pod.apps_stopping());
    }

    /// Issue #26: a grace period near 2^63 (or any duration) never panics the stop budget, and
    /// a later stop of the same pod still shares its window.
    #[test]
    fn an_extreme_grace_period_never_panics_the_stop_budget() {
        for grace in [
            Duration::from_secs(i64::MAX as u64),
            Duration::from_secs(i64::MAX as u64 - 1),
            Duration::MAX,
        ] {
            let (pod, _) = Pod::new("sb", None, &HashMap::new(), HashMap::new(), false, &[], &[]);
            let t0 = Instant::now();
            let end = pod.note_stop(t0, grace, "app", true);
            assert!(
                end > t0 && end <= t0 + Duration::from_secs(86_400 + 120),
                "{grace:?}"
            );
            assert_eq!(
                pod.note_stop(t0 + Duration::from_secs(400), grace, "side", false),
                end,
                "{grace:?}: still one window"
            );
        }
    }
}
