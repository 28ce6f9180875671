//! The emulated kubelet: pod manager, sync loop, PLEG loop, runtime status loop and the public API
//! tests drive it with. Pod workers live in `worker.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::cache::PodCache;
use super::config::KubeletConfig;
use super::cri::{connect_uds, CriClient};
use super::journal::Journal;
use super::pleg::{Pleg, PlegEvent, PlegEventType};
use super::pod::PodSpec;
use super::runtime::Runtime;
use super::status::{ApiPodStatus, ContainerStatusView, PodPhase, ReasonCache, RuntimePodStatus};

/// `baseRuntimeSyncThreshold` (= `maxWaitForContainerRuntime`, 30 s): without a RuntimeReady
/// Status for this long, the sync loop stops dispatching ("container runtime is down").
const RUNTIME_SYNC_THRESHOLD: Duration = Duration::from_secs(30);

/// What tests observe of one pod. Published on every status-manager update and cache refresh.
#[derive(Clone, Debug)]
pub struct PodView {
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The API status as kubelet's status manager last computed it (at the start of each sync, and
    /// during/after termination), KUBELET-CRI §4.3.
    pub status: ApiPodStatus,
    /// The newest PLEG cache entry for the pod.
    pub runtime: Arc<RuntimePodStatus>,
    /// Completed pod-worker runs (syncs, terminating, terminated).
    pub syncs: u64,
    /// The error of the last pod-worker run, if it failed.
    pub last_error: Option<String>,
    /// Deletion requested, or the pod became terminal and is being torn down.
    pub terminating: bool,
    /// `syncTerminatedPod` completed: the pod worker is done with this pod.
    pub terminated: bool,
}

impl PodView {
    /// The phase.
    pub fn phase(&self) -> PodPhase {
        self.status.phase
    }

    /// A container's API status by name.
    pub fn container(&self, name: &str) -> Option<&ContainerStatusView> {
        self.status.container(name)
    }

    /// Every regular container is Running in the API status.
    pub fn all_containers_running(&self) -> bool {
        !self.status.container_statuses.is_empty()
            && self
                .status
                .container_statuses
                .iter()
                .all(|c| c.state.is_running())
    }
}

/// Work for a pod worker (`podWork.WorkType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WorkType {
    Sync,
    Terminating,
    Terminated,
}

/// `podSyncStatus` plus the status manager's and reason cache's entries for the pod.
pub(crate) struct PodState {
    pub spec: Arc<PodSpec>,
    /// The newest undelivered update (`lastUndeliveredWorkUpdate`): parked while the worker is busy.
    pub pending: Option<WorkType>,
    /// The API object has a DeletionTimestamp.
    pub deleted: bool,
    /// `DeletionGracePeriodSeconds`.
    pub deletion_grace: Option<i64>,
    /// `podSyncStatus.gracePeriod` (effective grace for termination; 0 = unset).
    pub grace: i64,
    /// `terminatingAt` set.
    pub terminating: bool,
    /// `terminatedAt` set.
    pub terminated: bool,
    /// The worker finished `syncTerminatedPod`.
    pub finished: bool,
    /// Status manager entry.
    pub api_status: ApiPodStatus,
    /// `reasonCache` entries.
    pub reasons: ReasonCache,
    pub syncs: u64,
    pub last_error: Option<String>,
    /// The pod came back through RestorePod (KEP-5823, kubelet 1.37): its containers are on the
    /// runtime CREATED, and are started as they are.
    pub restored: bool,
}

/// One pod known to the kubelet.
pub(crate) struct PodEntry {
    pub uid: String,
    pub state: Mutex<PodState>,
    /// Wakes the worker when `pending` is set.
    pub notify: Notify,
    pub view: watch::Sender<PodView>,
    /// Live `IsPodTerminationRequested`.
    pub termination_requested: Arc<AtomicBool>,
}

impl PodEntry {
    pub fn lock(&self) -> MutexGuard<'_, PodState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `runtimeState`: what the last Status calls said.
#[derive(Default)]
pub(crate) struct RuntimeState {
    /// `networkError`; starts as "network state unknown".
    pub network_error: Option<String>,
    /// Last time Status reported RuntimeReady.
    pub last_runtime_sync: Option<Instant>,
}

pub(crate) struct Inner {
    pub cfg: Arc<KubeletConfig>,
    pub rt: Runtime,
    pub cache: PodCache,
    pub journal: Journal,
    pub pods: Mutex<HashMap<String, Arc<PodEntry>>>,
    /// The pod work queue: uid → when to sync next.
    pub work_queue: Mutex<HashMap<String, Instant>>,
    pub runtime_state: Mutex<RuntimeState>,
    pub shutdown: watch::Sender<bool>,
    pub pleg_tx: mpsc::UnboundedSender<PlegEvent>,
    pub deletor_tx: mpsc::Sender<(String, super::journal::CallMeta)>,
    pub tasks: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The kubelet emulator. Cheap to clone; background tasks stop when the last clone is dropped
/// or on [`Kubelet::shutdown`].
#[derive(Clone)]
pub struct Kubelet {
    inner: Arc<Inner>,
    _guard: Arc<ShutdownGuard>,
}

struct ShutdownGuard(watch::Sender<bool>);

impl Drop for ShutdownGuard {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

// === impl Kubelet ===

impl Kubelet {
    /// Connects to `cfg.endpoint` (and `cfg.image_endpoint`), performs kubelet's API handshake,
    /// the first runtime Status, and starts the PLEG, sync loop and status loops.
    pub async fn new(cfg: KubeletConfig) -> anyhow::Result<Kubelet> {
        let runtime = connect_uds(&cfg.endpoint).await?;
        let image_path = cfg
            .image_endpoint
            .clone()
            .unwrap_or_else(|| cfg.endpoint.clone());
        let image = connect_uds(&image_path).await?;
        Kubelet::with_channels(cfg, runtime, image).await
    }

    /// Like [`Kubelet::new`] over existing channels (runtime service, image service).
    pub async fn with_channels(
        cfg: KubeletConfig,
        runtime: Channel,
        image: Channel,
    ) -> anyhow::Result<Kubelet> {
        let journal = Journal::new();
        let cri = CriClient::connect(
            runtime,
            image,
            cfg.api(),
            cfg.runtime_request_timeout,
            journal.clone(),
        )
        .await
        .context("CRI handshake")?;
        let cfg = Arc::new(cfg);
        let (shutdown, _) = watch::channel(false);
        let (pleg_tx, pleg_rx) = mpsc::unbounded_channel();
        // podContainerDeletor's channel holds 50 requests (`containerDeletorBufferLimit`).
        let (deletor_tx, deletor_rx) = mpsc::channel(50);
        let inner = Arc::new(Inner {
            rt: Runtime::new(cri, cfg.clone()),
            cfg,
            cache: PodCache::default(),
            journal,
            pods: Mutex::new(HashMap::new()),
            work_queue: Mutex::new(HashMap::new()),
            runtime_state: Mutex::new(RuntimeState {
                network_error: Some("network state unknown".into()),
                last_runtime_sync: None,
            }),
            shutdown: shutdown.clone(),
            pleg_tx,
            deletor_tx,
            tasks: Mutex::new(Vec::new()),
        });
        // kubelet runs updateRuntimeUp before anything syncs.
        inner.update_runtime_up().await;
        let tasks = vec![
            tokio::spawn(inner.clone().runtime_status_loop()),
            tokio::spawn(inner.clone().pleg_loop()),
            tokio::spawn(inner.clone().sync_loop(pleg_rx)),
            tokio::spawn(inner.clone().container_deletor_loop(deletor_rx)),
        ];
        lock(&inner.tasks).extend(tasks);
        if let Some(period) = inner.cfg.gc_period {
            let t = tokio::spawn(inner.clone().gc_loop(period));
            lock(&inner.tasks).push(t);
        }
        Ok(Kubelet {
            inner,
            _guard: Arc::new(ShutdownGuard(shutdown)),
        })
    }

    /// The call journal.
    pub fn journal(&self) -> &Journal {
        &self.inner.journal
    }

    /// The CRI client (same journal, same deadlines) for ad-hoc calls.
    pub fn cri(&self) -> &CriClient {
        &self.inner.rt.cri
    }

    /// The configuration.
    pub fn config(&self) -> &KubeletConfig {
        &self.inner.cfg
    }

    /// Adds a pod, as if the API server had bound it to this node (`HandlePodAdditions`). Validates
    /// it, fills in a UID if empty and (by default) kubelet's config annotations. Returns the UID.
    pub fn add_pod(&self, spec: PodSpec) -> anyhow::Result<String> {
        self.add(spec, false)
    }

    /// A pod restored from a checkpoint (KEP-5823, kubelet 1.37's RestorePod): the runtime
    /// brings back its sandbox and its containers, CREATED, without a CreateContainer passing
    /// kubelet's endpoint — emulated here by creating them on `runtime` (the runtime's own
    /// socket, not crisp's) with the configs kubelet would have sent. kubelet then only starts
    /// them, in spec order, as its sync finds them CREATED. Returns the UID.
    pub async fn restore_pod(
        &self,
        mut spec: PodSpec,
        runtime: &std::path::Path,
    ) -> anyhow::Result<String> {
        spec.validate()?;
        let ch = super::cri::connect_uds(runtime).await?;
        let cri = CriClient::connect(
            ch.clone(),
            ch,
            self.inner.cfg.api(),
            self.inner.cfg.runtime_request_timeout,
            Journal::new(),
        )
        .await
        .context("CRI handshake with the runtime, for the restore")?;
        self.fill_config_annotations(&mut spec);
        Runtime::new(cri, self.inner.cfg.clone())
            .restore_pod(&spec)
            .await
            .map_err(|m| anyhow::anyhow!("restoring {}: {m}", spec.format()))?;
        self.add(spec, true)
    }

    fn fill_config_annotations(&self, spec: &mut PodSpec) {
        if self.inner.cfg.config_annotations {
            spec.annotations
                .entry("kubernetes.io/config.source".into())
                .or_insert_with(|| "api".into());
            spec.annotations
                .entry("kubernetes.io/config.seen".into())
                .or_insert_with(|| rfc3339_nano(SystemTime::now()));
        }
    }

    fn add(&self, mut spec: PodSpec, restored: bool) -> anyhow::Result<String> {
        spec.validate()?;
        self.fill_config_annotations(&mut spec);
        let uid = spec.uid.clone();
        let view = PodView {
            uid: uid.clone(),
            name: spec.name.clone(),
            namespace: spec.namespace.clone(),
            status: ApiPodStatus::pending(),
            runtime: Arc::new(RuntimePodStatus::empty(&uid)),
            syncs: 0,
            last_error: None,
            terminating: false,
            terminated: false,
        };
        let entry = Arc::new(PodEntry {
            uid: uid.clone(),
            state: Mutex::new(PodState {
                spec: Arc::new(spec),
                pending: None,
                deleted: false,
                deletion_grace: None,
                grace: 0,
                terminating: false,
                terminated: false,
                finished: false,
                api_status: ApiPodStatus::pending(),
                reasons: ReasonCache::new(),
                syncs: 0,
                last_error: None,
                restored,
            }),
            notify: Notify::new(),
            view: watch::channel(view).0,
            termination_requested: Arc::new(AtomicBool::new(false)),
        });
        {
            let mut pods = lock(&self.inner.pods);
            if pods.contains_key(&uid) {
                bail!("a pod with UID {uid} already exists");
            }
            pods.insert(uid.clone(), entry.clone());
        }
        self.inner
            .journal
            .note(Some(entry.lock().spec.key()), "pod added");
        let t = tokio::spawn(self.inner.clone().pod_worker(entry));
        lock(&self.inner.tasks).push(t);
        self.inner.update_pod(&uid);
        Ok(uid)
    }

    /// Deletes a pod as the API server would (`kubectl delete [--grace-period=N]`): sets the
    /// DeletionTimestamp and DeletionGracePeriodSeconds (`grace_override` or the pod's
    /// terminationGracePeriodSeconds), and asks the pod worker to terminate it after its current
    /// sync (KUBELET-CRI §3, §7.2). A second call can only shorten the grace period.
    pub fn delete_pod(&self, uid: &str, grace_override: Option<i64>) -> anyhow::Result<()> {
        let entry = self.entry(uid)?;
        {
            let mut st = entry.lock();
            let requested = grace_override
                .unwrap_or(st.spec.termination_grace_period_seconds)
                .max(1);
            let dg = st.deletion_grace.map_or(requested, |g| g.min(requested));
            st.deleted = true;
            st.deletion_grace = Some(dg);
            // calculateEffectiveGracePeriod: only ever decreases, at least 1.
            st.grace = if st.grace == 0 { dg } else { st.grace.min(dg) }.max(1);
            st.terminating = true;
            entry.termination_requested.store(true, Ordering::SeqCst);
            self.inner.journal.note(
                Some(st.spec.key()),
                format!("pod deleted (grace {}s)", st.grace),
            );
        }
        self.inner.publish(&entry);
        self.inner.update_pod(uid);
        Ok(())
    }

    fn entry(&self, uid: &str) -> anyhow::Result<Arc<PodEntry>> {
        lock(&self.inner.pods)
            .get(uid)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no pod with UID {uid}"))
    }

    /// UIDs of all pods added so far.
    pub fn pod_uids(&self) -> Vec<String> {
        lock(&self.inner.pods).keys().cloned().collect()
    }

    /// The current view of a pod.
    pub fn pod(&self, uid: &str) -> Option<PodView> {
        lock(&self.inner.pods)
            .get(uid)
            .map(|e| e.view.borrow().clone())
    }

    /// The pod's phase as kubelet's status manager has it.
    pub fn pod_phase(&self, uid: &str) -> Option<PodPhase> {
        self.pod(uid).map(|v| v.status.phase)
    }

    /// API-like statuses of the regular containers, in spec order.
    pub fn container_statuses(&self, uid: &str) -> Option<Vec<ContainerStatusView>> {
        self.pod(uid).map(|v| v.status.container_statuses)
    }

    /// A watch on the pod's view.
    pub fn watch_pod(&self, uid: &str) -> Option<watch::Receiver<PodView>> {
        lock(&self.inner.pods).get(uid).map(|e| e.view.subscribe())
    }

    /// Waits until `pred` holds for the pod's view, or fails after `timeout` with the last view.
    pub async fn wait_for(
        &self,
        uid: &str,
        timeout: Duration,
        mut pred: impl FnMut(&PodView) -> bool,
    ) -> anyhow::Result<PodView> {
        let mut rx = self
            .watch_pod(uid)
            .ok_or_else(|| anyhow::anyhow!("no pod with UID {uid}"))?;
        let res = tokio::time::timeout(timeout, async {
            loop {
                // Clone out so `pred` runs without the watch's lock (it may query the kubelet).
                let v = rx.borrow_and_update().clone();
                if pred(&v) {
                    return Ok(v);
                }
                if rx.changed().await.is_err() {
                    return Err(anyhow::anyhow!("kubelet shut down"));
                }
            }
        })
        .await;
        match res {
            Ok(r) => r,
            Err(_) => {
                let last = self.pod(uid);
                bail!("pod {uid}: condition not met within {timeout:?}; last view: {last:#?}")
            }
        }
    }

    /// Waits for a phase.
    pub async fn wait_phase(
        &self,
        uid: &str,
        phase: PodPhase,
        timeout: Duration,
    ) -> anyhow::Result<PodView> {
        self.wait_for(uid, timeout, |v| v.status.phase == phase)
            .await
    }

    /// Waits until every regular container is Running in the API status.
    pub async fn wait_all_running(&self, uid: &str, timeout: Duration) -> anyhow::Result<PodView> {
        self.wait_for(uid, timeout, PodView::all_containers_running)
            .await
    }

    /// Waits until the pod worker has finished the pod (`syncTerminatedPod` done).
    pub async fn wait_terminated(&self, uid: &str, timeout: Duration) -> anyhow::Result<PodView> {
        self.wait_for(uid, timeout, |v| v.terminated).await
    }

    /// [`Kubelet::delete_pod`], then [`Kubelet::wait_terminated`].
    pub async fn delete_and_wait(
        &self,
        uid: &str,
        grace_override: Option<i64>,
        timeout: Duration,
    ) -> anyhow::Result<PodView> {
        self.delete_pod(uid, grace_override)?;
        self.wait_terminated(uid, timeout).await
    }

    /// A fresh `GetPodStatus` through the kubelet's client (journaled like kubelet's own).
    pub async fn runtime_status(&self, uid: &str) -> anyhow::Result<RuntimePodStatus> {
        let spec = self.entry(uid)?.lock().spec.clone();
        self.inner
            .rt
            .get_pod_status(uid, &spec.name, &spec.namespace)
            .await
            .map_err(anyhow::Error::msg)
    }

    /// Stops every background task (pods are left as they are in the runtime).
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        let tasks: Vec<_> = lock(&self.inner.tasks).drain(..).collect();
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
    }
}

// === impl Inner ===

impl Inner {
    pub fn entry(&self, uid: &str) -> Option<Arc<PodEntry>> {
        lock(&self.pods).get(uid).cloned()
    }

    /// `podWorkers.UpdatePod`: park the newest work for the pod and wake its worker.
    pub fn update_pod(&self, uid: &str) {
        let Some(entry) = self.entry(uid) else { return };
        {
            let mut st = entry.lock();
            if st.finished {
                return;
            }
            let work = if st.terminated {
                WorkType::Terminated
            } else if st.terminating {
                WorkType::Terminating
            } else {
                WorkType::Sync
            };
            st.pending = Some(work);
        }
        entry.notify.notify_one();
    }

    /// Recomputes and broadcasts the pod's view.
    pub fn publish(&self, entry: &PodEntry) {
        let runtime = self.cache.get(&entry.uid).status;
        let st = entry.lock();
        let view = PodView {
            uid: entry.uid.clone(),
            name: st.spec.name.clone(),
            namespace: st.spec.namespace.clone(),
            status: st.api_status.clone(),
            runtime,
            syncs: st.syncs,
            last_error: st.last_error.clone(),
            terminating: st.terminating,
            terminated: st.finished,
        };
        drop(st);
        entry.view.send_replace(view);
    }

    pub fn network_error(&self) -> Option<String> {
        lock(&self.runtime_state).network_error.clone()
    }

    /// `wait.Until(updateRuntimeUp, 5s)` (KUBELET-CRI §4.1).
    async fn runtime_status_loop(self: Arc<Self>) {
        let mut stop = self.shutdown.subscribe();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.runtime_status_period) => {}
                _ = stop.changed() => return,
            }
            self.update_runtime_up().await;
        }
    }

    /// `updateRuntimeUp`: Status; NetworkReady → network state; RuntimeReady → runtime sync time.
    async fn update_runtime_up(&self) {
        let s = match self.rt.cri.status().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("container runtime sanity check failed: {}", e.message());
                return;
            }
        };
        let conds = s.status.map(|s| s.conditions).unwrap_or_default();
        let find = |t: &str| conds.iter().find(|c| c.r#type == t);
        let mut st = lock(&self.runtime_state);
        st.network_error = match find("NetworkReady") {
            Some(c) if c.status => None,
            Some(c) => Some(format!(
                "container runtime network not ready: NetworkReady=false reason:{} message:{}",
                c.reason, c.message
            )),
            None => Some("container runtime network not ready: <nil>".into()),
        };
        if find("RuntimeReady").is_some_and(|c| c.status) {
            st.last_runtime_sync = Some(Instant::now());
        }
    }

    fn runtime_error(&self) -> Option<&'static str> {
        match lock(&self.runtime_state).last_runtime_sync {
            None => Some("container runtime status check may not have completed yet"),
            Some(t) if t.elapsed() > RUNTIME_SYNC_THRESHOLD => Some("container runtime is down"),
            Some(_) => None,
        }
    }

    /// The sync loop: dispatches PLEG events and due work-queue entries (`syncCh`, every 1 s) to
    /// pod workers; pauses with back-off while the runtime is not ready.
    async fn sync_loop(self: Arc<Self>, mut pleg_rx: mpsc::UnboundedReceiver<PlegEvent>) {
        let mut stop = self.shutdown.subscribe();
        let mut tick = tokio::time::interval(self.cfg.sync_tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let base = Duration::from_millis(100);
        let mut pause = base;
        loop {
            if let Some(err) = self.runtime_error() {
                tracing::warn!("skipping pod synchronization: {err}");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.changed() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(5));
                continue;
            }
            pause = base;
            tokio::select! {
                _ = stop.changed() => return,
                ev = pleg_rx.recv() => {
                    let Some(ev) = ev else { return };
                    self.handle_pleg_event(ev);
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    let due: Vec<String> = {
                        let mut q = lock(&self.work_queue);
                        let due: Vec<String> = q.iter().filter(|(_, t)| **t <= now).map(|(u, _)| u.clone()).collect();
                        for u in &due {
                            q.remove(u);
                        }
                        due
                    };
                    for uid in due {
                        self.update_pod(&uid);
                    }
                }
            }
        }
    }

    /// `syncLoopIteration`'s PLEG branch: Started/Died sync the pod; Died also triggers the
    /// dead-container clean-up.
    fn handle_pleg_event(&self, ev: PlegEvent) {
        if matches!(
            ev.kind,
            PlegEventType::ContainerStarted | PlegEventType::ContainerDied
        ) {
            self.update_pod(&ev.uid);
        }
        if ev.kind == PlegEventType::ContainerDied && self.cfg.container_deletor {
            self.clean_up_containers_in_pod(&ev.uid, &ev.id);
        }
    }

    /// The PLEG relist loop (`wait.Until(relist, 1s)`: the period starts after each relist).
    async fn pleg_loop(self: Arc<Self>) {
        let mut stop = self.shutdown.subscribe();
        let mut pleg = Pleg::default();
        loop {
            self.relist(&mut pleg).await;
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.relist_period) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// `GenericPLEG.Relist` (KUBELET-CRI §4.1).
    async fn relist(&self, pleg: &mut Pleg) {
        let timestamp = Instant::now();
        let pods = match self.rt.get_pods().await {
            Ok(p) => p,
            Err(e) => {
                // No cache timestamp update: pod workers keep waiting.
                tracing::warn!("GenericPLEG: unable to retrieve pods: {}", e.message());
                return;
            }
        };
        let plan = pleg.plan(pods, timestamp);
        for (uid, pod, events) in plan.changed {
            match pod {
                None => self.cache.delete(&uid),
                Some(p) => {
                    let t = Instant::now();
                    let res = self.rt.get_pod_status(&uid, &p.name, &p.namespace).await;
                    let failed = res.is_err();
                    self.cache.set(&uid, res, t);
                    if failed {
                        pleg.inspection_failed(&uid, p);
                        self.publish_uid(&uid);
                        continue;
                    }
                }
            }
            pleg.update(&uid);
            self.publish_uid(&uid);
            for ev in events {
                // ContainerChanged (CREATED/UNKNOWN) only refreshes the cache.
                if ev.kind != PlegEventType::ContainerChanged {
                    let _ = self.pleg_tx.send(ev);
                }
            }
        }
        for (uid, p) in plan.reinspect {
            let t = Instant::now();
            let res = self.rt.get_pod_status(&uid, &p.name, &p.namespace).await;
            let ok = res.is_ok();
            self.cache.set(&uid, res, t);
            if ok {
                pleg.reinspected(&uid);
            }
            self.publish_uid(&uid);
        }
        self.cache.update_time(plan.timestamp);
    }

    fn publish_uid(&self, uid: &str) {
        if let Some(e) = self.entry(uid) {
            self.publish(&e);
        }
    }

    /// `podWorkers.ShouldPodContentBeRemoved`: deleted and terminated; unknown pods too.
    pub fn should_pod_content_be_removed(&self, uid: &str) -> bool {
        match self.entry(uid) {
            None => true,
            Some(e) => {
                let st = e.lock();
                st.deleted && st.terminated
            }
        }
    }
}

/// RFC 3339 with nanoseconds in UTC, trailing zeros trimmed (Go's `time.RFC3339Nano`).
pub fn rfc3339_nano(t: SystemTime) -> String {
    let t = t.max(SystemTime::UNIX_EPOCH);
    let full = humantime::format_rfc3339_nanos(t).to_string();
    // "…:SS.nnnnnnnnnZ": Go drops the fraction's trailing zeros, and the dot with them.
    let body = full
        .trim_end_matches('Z')
        .trim_end_matches('0')
        .trim_end_matches('.');
    format!("{body}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_682_942_400, 120_000_000);
        assert_eq!(rfc3339_nano(t), "2023-05-01T12:00:00.12Z");
        assert_eq!(rfc3339_nano(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }
}
