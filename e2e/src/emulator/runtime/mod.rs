//! kubelet's `kuberuntime` manager: `SyncPod`, `computePodActions`, `startContainer`,
//! `killContainer`, `killPodWithSyncResult` and `GetPodStatus`, issuing the CRI calls in kubelet's
//! order (KUBELET-CRI §1, §3, §4).
//!
//! Split as kubelet splits `kuberuntime_*.go`: this file is the manager (`SyncPod`,
//! `computePodActions`, `killPodWithSyncResult`, `GetPodStatus`, `GetPods`); `sandbox.rs`,
//! `container.rs` and `image.rs` hold what kubelet's `kuberuntime_sandbox.go`,
//! `kuberuntime_container.go` and `kuberuntime_image.go` do.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use k8s_cri::v1 as cri;
use tonic::{Code, Status};

use super::backoff::{from_unix_nanos, Backoff};
use super::config::{KubeletConfig, KubeletVersion};
use super::cri::{go_error, CriClient};
use super::journal::CallMeta;
use super::pod::{ContainerSpec, Handler, PodSpec, PullPolicy, RestartPolicy};
use super::status::{
    should_container_be_restarted, CriState, RuntimeContainerStatus, RuntimePodStatus,
    LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

mod container;
mod image;
mod sandbox;

use container::*;
#[cfg(test)]
use image::apply_default_image_tag;
use sandbox::*;

/// `minimumGracePeriodInSeconds` (KUBELET-CRI §3.2).
const MINIMUM_GRACE_PERIOD: i64 = 2;

// kubelet's start-failure reasons (`kubecontainer` and `images` error values).
pub(crate) const ERR_CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
pub(crate) const ERR_IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
const ERR_CREATE_CONTAINER_CONFIG: &str = "CreateContainerConfigError";
const ERR_CREATE_CONTAINER: &str = "CreateContainerError";
const ERR_RUN_CONTAINER: &str = "RunContainerError";
const ERR_POST_START_HOOK: &str = "PostStartHookError";
const ERR_KILL_CONTAINER: &str = "KillContainerError";
const ERR_CREATE_POD_SANDBOX: &str = "CreatePodSandboxError";
const ERR_KILL_POD_SANDBOX: &str = "KillPodSandboxError";
const ERR_IMAGE_PULL: &str = "ErrImagePull";
const ERR_IMAGE_INSPECT: &str = "ImageInspectError";
const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";

/// `kubecontainer.SyncAction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncAction {
    /// StartContainer
    StartContainer,
    /// KillContainer
    KillContainer,
    /// CreatePodSandbox
    CreatePodSandbox,
    /// ConfigPodSandbox
    ConfigPodSandbox,
    /// KillPodSandbox
    KillPodSandbox,
}

impl fmt::Display for SyncAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncAction::StartContainer => "StartContainer",
            SyncAction::KillContainer => "KillContainer",
            SyncAction::CreatePodSandbox => "CreatePodSandbox",
            SyncAction::ConfigPodSandbox => "ConfigPodSandbox",
            SyncAction::KillPodSandbox => "KillPodSandbox",
        })
    }
}

/// `kubecontainer.SyncResult`.
#[derive(Clone, Debug)]
pub struct SyncResult {
    /// What was attempted.
    pub action: SyncAction,
    /// Container name, sandbox ID or pod.
    pub target: String,
    /// The error value (a reason such as `RunContainerError`); `None` = success.
    pub error: Option<&'static str>,
    /// The message.
    pub message: String,
}

impl SyncResult {
    fn new(action: SyncAction, target: impl Into<String>) -> SyncResult {
        SyncResult {
            action,
            target: target.into(),
            error: None,
            message: String::new(),
        }
    }
    fn fail(&mut self, error: &'static str, message: impl Into<String>) {
        self.error = Some(error);
        self.message = message.into();
    }
}

/// `kubecontainer.PodSyncResult`.
#[derive(Clone, Debug, Default)]
pub struct PodSyncResult {
    /// Step results, in order.
    pub results: Vec<SyncResult>,
    /// A sync-level error.
    pub sync_error: Option<String>,
}

impl PodSyncResult {
    fn add(&mut self, r: SyncResult) {
        self.results.push(r);
    }
    fn add_pod(&mut self, other: PodSyncResult) {
        self.results.extend(other.results);
        if other.sync_error.is_some() {
            self.sync_error = other.sync_error;
        }
    }

    /// `Error()`: the aggregate of every failure, formatted like kubelet
    /// (`failed to "StartContainer" for "app" with RunContainerError: "…"`), or `None`.
    pub fn error(&self) -> Option<String> {
        let mut errs = Vec::new();
        if let Some(e) = &self.sync_error {
            errs.push(format!("failed to SyncPod: {e}"));
        }
        for r in &self.results {
            if let Some(err) = r.error {
                errs.push(format!(
                    "failed to {:?} for {:?} with {}: {:?}",
                    r.action.to_string(),
                    r.target,
                    err,
                    r.message
                ));
            }
        }
        aggregate(errs)
    }
}

/// `utilerrors.NewAggregate(...).Error()`: one message as is, several deduplicated in brackets.
fn aggregate(errs: Vec<String>) -> Option<String> {
    let mut seen: Vec<String> = Vec::new();
    for e in errs {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    match seen.len() {
        0 => None,
        1 => seen.pop(),
        _ => Some(format!("[{}]", seen.join(", "))),
    }
}

/// Why a container is killed (only affects the grace period for probes in kubelet; recorded here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// Pod termination / KillPod.
    None,
    /// postStart failed.
    FailedPostStartHook,
    /// State UNKNOWN.
    Unknown,
    /// The spec hash changed.
    SpecChanged,
}

/// The pod as a sync sees it.
#[derive(Clone)]
pub(crate) struct PodCtx {
    pub spec: Arc<PodSpec>,
    /// `pod.DeletionTimestamp != nil` when this work started.
    pub deletion_requested: bool,
    /// `pod.DeletionGracePeriodSeconds`.
    pub deletion_grace: Option<i64>,
    /// Live `IsPodTerminationRequested`.
    pub termination_requested: Arc<AtomicBool>,
    /// Restored by RestorePod (KEP-5823): CREATED containers are started as they are.
    pub restored: bool,
}

impl PodCtx {
    fn meta(&self) -> CallMeta {
        CallMeta::pod(&self.spec.namespace, &self.spec.name, &self.spec.uid)
    }
}

/// `kubecontainer.Pod` as `ConvertPodStatusToRunningPod` / `GetPods` build it.
#[derive(Clone, Debug, Default)]
pub struct RunningPod {
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// (id, name, state) of containers.
    pub containers: Vec<(String, String, CriState)>,
    /// (id, ready) of sandboxes.
    pub sandboxes: Vec<(String, bool)>,
}

impl RunningPod {
    /// `ConvertPodStatusToRunningPod`: RUNNING containers only, every sandbox (KUBELET-CRI §3.1).
    pub fn from_status(s: &RuntimePodStatus) -> RunningPod {
        RunningPod {
            uid: s.uid.clone(),
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            containers: s
                .containers
                .iter()
                .filter(|c| c.state == CriState::Running)
                .map(|c| (c.id.clone(), c.name.clone(), c.state))
                .collect(),
            sandboxes: s
                .sandboxes
                .iter()
                .map(|sb| {
                    (
                        sb.id.clone(),
                        sb.state == cri::PodSandboxState::SandboxReady as i32,
                    )
                })
                .collect(),
        }
    }
}

/// `podActions`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PodActions {
    pub kill_pod: bool,
    pub create_sandbox: bool,
    pub sandbox_id: String,
    pub attempt: u32,
    /// Index into `init_containers`.
    pub next_init_container: Option<usize>,
    /// Indices into `containers`, spec order.
    pub containers_to_start: Vec<usize>,
    /// (container id, name, reason, message).
    pub containers_to_kill: Vec<(String, String, KillReason, String)>,
    /// Of `containers_to_start`, those a restored pod has CREATED already (index → container
    /// id): started with StartContainer alone (KEP-5823).
    pub start_created: BTreeMap<usize, String>,
}

/// The runtime manager.
pub(crate) struct Runtime {
    pub cri: CriClient,
    pub cfg: Arc<KubeletConfig>,
    crash_backoff: Mutex<Backoff>,
    image_backoff: Mutex<Backoff>,
    /// `serialImagePuller`: one pull at a time, node-wide (KUBELET-CRI §1.1a).
    pull_lock: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn network_mode(host_network: bool) -> i32 {
    if host_network {
        cri::NamespaceMode::Node as i32
    } else {
        cri::NamespaceMode::Pod as i32
    }
}

// === impl Runtime ===

impl Runtime {
    pub fn new(cri: CriClient, cfg: Arc<KubeletConfig>) -> Runtime {
        let backoff = || Backoff::new(cfg.crash_backoff_base, cfg.crash_backoff_max);
        Runtime {
            crash_backoff: Mutex::new(backoff()),
            image_backoff: Mutex::new(backoff()),
            cri,
            cfg,
            pull_lock: tokio::sync::Mutex::new(()),
        }
    }

    /// `/var/log/pods/<ns>_<name>_<uid>` under the configured root (KUBELET-CRI §2.1).
    pub fn pod_log_dir(&self, pod: &PodSpec) -> PathBuf {
        self.cfg
            .pod_log_root
            .join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid))
    }

    // --- SyncPod ---

    /// `SyncPod` (KUBELET-CRI §1.1): the CRI calls of one sync, in kubelet's order.
    pub async fn sync_pod(&self, pod: &PodCtx, status: &RuntimePodStatus) -> PodSyncResult {
        let mut result = PodSyncResult::default();
        let spec = &pod.spec;
        let changes = compute_pod_actions(pod, status);
        tracing::debug!(pod = %spec, ?changes, "computePodActions");

        // Step 2: kill the pod if the sandbox changed or nothing is left to run.
        if changes.kill_pod {
            let kill = self
                .kill_pod_with_sync_result(pod, &RunningPod::from_status(status), None)
                .await;
            let failed = kill.error().is_some();
            result.add_pod(kill);
            if failed {
                return result;
            }
            if changes.create_sandbox {
                self.purge_init_containers(pod, status).await;
            }
        } else {
            // Step 3: kill containers that are not to be kept.
            for (id, name, reason, message) in &changes.containers_to_kill {
                let mut r = SyncResult::new(SyncAction::KillContainer, name.clone());
                let res = self
                    .kill_container(pod, id, name, message, *reason, None)
                    .await;
                if let Err(e) = res {
                    r.fail(ERR_KILL_CONTAINER, e);
                    result.add(r);
                    return result;
                }
                result.add(r);
            }
        }

        self.prune_init_containers_before_start(pod, status).await;

        let mut pod_ips = status.ips.clone();

        // Step 4: create the sandbox.
        let mut sandbox_id = changes.sandbox_id.clone();
        if changes.create_sandbox {
            let mut r = SyncResult::new(SyncAction::CreatePodSandbox, spec.format());
            match self.create_pod_sandbox(pod, changes.attempt).await {
                Ok(id) => sandbox_id = id,
                Err(msg) => {
                    // A pod deleted while its sandbox was being created is not an error.
                    if pod.termination_requested.load(Ordering::SeqCst) {
                        return result;
                    }
                    r.fail(ERR_CREATE_POD_SANDBOX, msg);
                    result.add(r);
                    return result;
                }
            }
            result.add(r);
            match self.cri.pod_sandbox_status(&sandbox_id, pod.meta()).await {
                Err(s) => {
                    result.sync_error = Some(go_error(&s));
                    return result;
                }
                Ok(resp) => match resp.status {
                    None => {
                        result.sync_error = Some("pod sandbox status is nil".into());
                        return result;
                    }
                    Some(st) => {
                        if !spec.host_network {
                            pod_ips = sandbox_ips(&st);
                        }
                    }
                },
            }
        }

        // Step 5: the sandbox config is generated again and sent with every Create/Pull of this sync.
        result.add(SyncResult::new(
            SyncAction::ConfigPodSandbox,
            sandbox_id.clone(),
        ));
        let sandbox_config = self.generate_pod_sandbox_config(spec, changes.attempt);

        // Step 6: at most one init container per sync; a failure ends the sync.
        if let Some(i) = changes.next_init_container {
            let c = &spec.init_containers[i];
            let mut r = SyncResult::new(SyncAction::StartContainer, c.name.clone());
            let res = self
                .start(pod, c, &sandbox_id, &sandbox_config, status, &pod_ips)
                .await;
            if let Err((err, msg)) = res {
                r.fail(err, msg);
                result.add(r);
                return result;
            }
            result.add(r);
        }

        // Step 7: regular containers, strictly one after another in spec order; a failure does not
        // stop the loop (§1.2, §1.3).
        for &i in &changes.containers_to_start {
            let c = &spec.containers[i];
            let mut r = SyncResult::new(SyncAction::StartContainer, c.name.clone());
            let started = match changes.start_created.get(&i) {
                Some(id) => self
                    .cri
                    .start_container(id, pod.meta().with_container(&c.name))
                    .await
                    .map_err(|s| (ERR_RUN_CONTAINER, s.message().to_string())),
                None => {
                    self.start(pod, c, &sandbox_id, &sandbox_config, status, &pod_ips)
                        .await
                }
            };
            if let Err((err, msg)) = started {
                r.fail(err, msg);
            }
            result.add(r);
        }
        result
    }

    /// `doBackOff`: only the newest EXITED instance counts, measured from its `finished_at` (§5).
    fn do_backoff(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        status: &RuntimePodStatus,
    ) -> Option<String> {
        let exited = status
            .containers
            .iter()
            .find(|s| s.name == c.name && s.state == CriState::Exited)?;
        let ts = from_unix_nanos(exited.finished_at);
        let key = format!(
            "{}_{}_{}_{}_{}",
            pod.name,
            pod.namespace,
            pod.uid,
            c.name,
            c.hash()
        );
        let mut b = lock(&self.crash_backoff);
        if b.is_in_backoff_since(&key, ts) {
            return Some(format!(
                "back-off {} restarting failed container={} pod={}",
                go_duration(b.get(&key)),
                c.name,
                pod.format()
            ));
        }
        b.next(&key, ts);
        None
    }

    /// `killPodWithSyncResult`: all RUNNING containers in parallel, wait for all, then
    /// StopPodSandbox for every sandbox even if a StopContainer failed (KUBELET-CRI §3.1, §7.4).
    pub async fn kill_pod_with_sync_result(
        &self,
        pod: &PodCtx,
        running: &RunningPod,
        grace_override: Option<i64>,
    ) -> PodSyncResult {
        let mut result = PodSyncResult::default();
        let kills = running.containers.iter().map(|(id, name, _)| async move {
            let mut r = SyncResult::new(SyncAction::KillContainer, name.clone());
            if let Err(e) = self
                .kill_container(pod, id, name, "", KillReason::None, grace_override)
                .await
            {
                r.fail(ERR_KILL_CONTAINER, e);
            }
            r
        });
        // Concurrent like kubelet's goroutine-per-container + WaitGroup.
        for r in futures_util::future::join_all(kills).await {
            result.add(r);
        }
        let mut sb = SyncResult::new(SyncAction::KillPodSandbox, running.uid.clone());
        for (id, _) in &running.sandboxes {
            if let Err(s) = self.cri.stop_pod_sandbox(id, pod.meta()).await {
                if s.code() != Code::NotFound {
                    sb.fail(ERR_KILL_POD_SANDBOX, s.message().to_string());
                }
            }
        }
        result.add(sb);
        result
    }

    /// `GetPodStatus` (KUBELET-CRI §4.1 step 3): ListPodSandbox(uid), PodSandboxStatus newest first,
    /// ListContainers(uid), ContainerStatus for each. Errors are kubelet's error strings.
    pub async fn get_pod_status(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
    ) -> Result<RuntimePodStatus, String> {
        let meta = CallMeta::pod(namespace, name, uid);
        let selector: HashMap<String, String> =
            [(LABEL_POD_UID.to_string(), uid.to_string())].into();
        let mut sandboxes = self
            .cri
            .list_pod_sandbox(
                Some(cri::PodSandboxFilter {
                    label_selector: selector.clone(),
                    ..Default::default()
                }),
                meta.clone(),
            )
            .await
            .map_err(|s| go_error(&s))?;
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));

        let mut out = RuntimePodStatus {
            uid: uid.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            ..RuntimePodStatus::default()
        };
        for (idx, sb) in sandboxes.iter().enumerate() {
            let resp = match self.cri.pod_sandbox_status(&sb.id, meta.clone()).await {
                Err(s) if s.code() == Code::NotFound => continue,
                Err(s) => return Err(go_error(&s)),
                Ok(r) => r,
            };
            let st = resp
                .status
                .ok_or_else(|| "pod sandbox status is nil".to_string())?;
            verify_sandbox_status(&st)?;
            if idx == 0 && st.state == cri::PodSandboxState::SandboxReady as i32 {
                out.ips = sandbox_ips(&st);
            }
            out.sandboxes.push(st);
        }

        let containers = self
            .cri
            .list_containers(
                Some(cri::ContainerFilter {
                    label_selector: selector,
                    ..Default::default()
                }),
                meta.clone(),
            )
            .await
            .map_err(|s| go_error(&s))?;
        for c in &containers {
            let cname = c
                .labels
                .get(LABEL_CONTAINER_NAME)
                .cloned()
                .unwrap_or_default();
            let resp = match self
                .cri
                .container_status(&c.id, meta.clone().with_container(&cname))
                .await
            {
                Err(s) if s.code() == Code::NotFound => continue,
                Err(s) => return Err(go_error(&s)),
                Ok(r) => r,
            };
            let st = resp.status.ok_or_else(|| "status is nil".to_string())?;
            verify_container_status(&st)?;
            out.containers.push(RuntimeContainerStatus::from_cri(&st));
        }
        out.containers
            .sort_by_key(|c| std::cmp::Reverse(c.created_at));
        Ok(out)
    }

    /// `GetPods(all=true)` for the PLEG relist: ListPodSandbox(no filter) and ListContainers(empty
    /// filter), grouped by pod UID (KUBELET-CRI §4.1 step 1).
    pub async fn get_pods(&self) -> Result<Vec<RunningPod>, Status> {
        let mut pods: std::collections::BTreeMap<String, RunningPod> =
            std::collections::BTreeMap::new();
        let sandboxes = self.cri.list_pod_sandbox(None, CallMeta::default()).await?;
        for s in sandboxes {
            let Some(md) = &s.metadata else { continue };
            let p = pods.entry(md.uid.clone()).or_insert_with(|| RunningPod {
                uid: md.uid.clone(),
                name: md.name.clone(),
                namespace: md.namespace.clone(),
                ..RunningPod::default()
            });
            p.sandboxes.push((
                s.id.clone(),
                s.state == cri::PodSandboxState::SandboxReady as i32,
            ));
        }
        let containers = self
            .cri
            .list_containers(Some(cri::ContainerFilter::default()), CallMeta::default())
            .await?;
        for c in containers {
            if c.metadata.is_none() {
                continue;
            }
            let uid = c.labels.get(LABEL_POD_UID).cloned().unwrap_or_default();
            let p = pods.entry(uid.clone()).or_insert_with(|| RunningPod {
                uid,
                name: c.labels.get(LABEL_POD_NAME).cloned().unwrap_or_default(),
                namespace: c
                    .labels
                    .get(LABEL_POD_NAMESPACE)
                    .cloned()
                    .unwrap_or_default(),
                ..RunningPod::default()
            });
            let name = c
                .labels
                .get(LABEL_CONTAINER_NAME)
                .cloned()
                .unwrap_or_default();
            p.containers
                .push((c.id.clone(), name, CriState::from_cri(c.state)));
        }
        Ok(pods.into_values().collect())
    }
}

/// `computePodActions` (KUBELET-CRI §1.1, §1.4, §4.3).
pub(crate) fn compute_pod_actions(pod: &PodCtx, status: &RuntimePodStatus) -> PodActions {
    let spec = &pod.spec;
    let (create_sandbox, attempt, sandbox_id) = pod_sandbox_changed(spec, status);
    let mut changes = PodActions {
        kill_pod: create_sandbox,
        create_sandbox,
        sandbox_id,
        attempt,
        ..PodActions::default()
    };

    // If the sandbox is (re-)created, everything is killed and re-created.
    if create_sandbox {
        let restart_on_failure = spec.restart_policy != RestartPolicy::Never;
        if !restart_on_failure && attempt != 0 && !status.containers.is_empty() {
            // Don't create a sandbox for a pod that is already done.
            changes.create_sandbox = false;
            return changes;
        }
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !(spec.restart_policy == RestartPolicy::OnFailure && container_succeeded(c, status))
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() && find_next_init_container_to_run(spec, status).2 {
            changes.create_sandbox = false;
            return changes;
        }
        if !spec.init_containers.is_empty() {
            // The sync that creates the sandbox starts only the first init container (§1.1 step 7).
            changes.next_init_container = Some(0);
            return changes;
        }
        changes.containers_to_start = to_start;
        return changes;
    }

    // Initialization progress.
    let (init_last, next, done) = find_next_init_container_to_run(spec, status);
    if !done {
        if let Some(next) = next {
            let init_failed = init_last.is_some_and(is_init_container_failed);
            if init_failed && spec.restart_policy == RestartPolicy::Never {
                changes.kill_pod = true;
            } else {
                if let Some(last) = init_last.filter(|s| s.state == CriState::Unknown) {
                    changes.containers_to_kill.push((
                        last.id.clone(),
                        spec.init_containers[next].name.clone(),
                        KillReason::Unknown,
                        format!(
                            "Init container is in {:?} state, try killing it before restart",
                            "unknown"
                        ),
                    ));
                }
                changes.next_init_container = Some(next);
            }
        }
        return changes;
    }

    let mut keep_count = 0;
    for (idx, c) in spec.containers.iter().enumerate() {
        let cs = status.find(&c.name);
        if cs.is_none_or(|s| s.state != CriState::Running) {
            if should_container_be_restarted(c, spec, pod.deletion_requested, status) {
                changes.containers_to_start.push(idx);
                // A restored pod's container is back CREATED with its spec: started as it is.
                if let Some(s) = cs
                    .filter(|s| pod.restored && s.state == CriState::Created && s.hash == c.hash())
                {
                    changes.start_created.insert(idx, s.id.clone());
                    continue;
                }
                // Only UNKNOWN containers are killed before the restart (§1.4); CREATED ones are left.
                if let Some(s) = cs.filter(|s| s.state == CriState::Unknown) {
                    changes.containers_to_kill.push((
                        s.id.clone(),
                        s.name.clone(),
                        KillReason::Unknown,
                        format!(
                            "Container is in {:?} state, try killing it before restart",
                            "unknown"
                        ),
                    ));
                }
            }
            continue;
        }
        let Some(s) = cs else { continue };
        if s.hash != c.hash() {
            // Spec changed: restart regardless of the restart policy.
            changes.containers_to_kill.push((
                s.id.clone(),
                s.name.clone(),
                KillReason::SpecChanged,
                format!("Container {} definition changed", c.name),
            ));
            changes.containers_to_start.push(idx);
            continue;
        }
        keep_count += 1;
    }
    if keep_count == 0 && changes.containers_to_start.is_empty() {
        // Nothing runs and nothing is to be started: kill the pod (§4.3).
        changes.kill_pod = true;
    }
    changes
}

/// `PodSandboxChanged` (KUBELET-CRI §1.1 step 1): (create?, attempt, sandbox id).
fn pod_sandbox_changed(pod: &PodSpec, status: &RuntimePodStatus) -> (bool, u32, String) {
    let Some(newest) = status.sandboxes.first() else {
        return (true, 0, String::new());
    };
    let attempt = newest.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
    let ready = |s: &cri::PodSandboxStatus| s.state == cri::PodSandboxState::SandboxReady as i32;
    if status.sandboxes.iter().filter(|s| ready(s)).count() > 1 || !ready(newest) {
        return (true, attempt + 1, newest.id.clone());
    }
    let net = newest
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .map(|o| o.network)
        .unwrap_or(0);
    if net != network_mode(pod.host_network) {
        return (true, attempt + 1, String::new());
    }
    if !pod.host_network && newest.network.as_ref().is_some_and(|n| n.ip.is_empty()) {
        return (true, attempt + 1, newest.id.clone());
    }
    (false, attempt, newest.id.clone())
}

fn container_succeeded(c: &ContainerSpec, status: &RuntimePodStatus) -> bool {
    status
        .find(&c.name)
        .is_some_and(|s| s.state == CriState::Exited && s.exit_code == 0)
}

const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];
const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Go's `time.Duration.String()` for the durations kubelet prints (`10s`, `1m20s`, `500ms`).
pub fn go_duration(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let total = d.as_secs_f64();
    let h = (total / 3600.0).floor() as u64;
    let m = ((total - h as f64 * 3600.0) / 60.0).floor() as u64;
    let s = total - h as f64 * 3600.0 - m as f64 * 60.0;
    let secs = if (s - s.round()).abs() < 1e-9 {
        format!("{}s", s.round() as u64)
    } else {
        format!("{s}s")
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

#[cfg(test)]
mod tests;
