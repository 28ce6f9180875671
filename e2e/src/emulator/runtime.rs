//! kubelet's `kuberuntime` manager: `SyncPod`, `computePodActions`, `startContainer`,
//! `killContainer`, `killPodWithSyncResult` and `GetPodStatus`, issuing the CRI calls in kubelet's
//! order (KUBELET-CRI §1, §3, §4).

use std::collections::HashMap;
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
            if let Err((err, msg)) = self
                .start(pod, c, &sandbox_id, &sandbox_config, status, &pod_ips)
                .await
            {
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

    /// The `start` helper of SyncPod: the crash back-off check, then `startContainer` (§1.1 a–f).
    async fn start(
        &self,
        pod: &PodCtx,
        c: &ContainerSpec,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        status: &RuntimePodStatus,
        pod_ips: &[String],
    ) -> Result<(), (&'static str, String)> {
        if let Some(msg) = self.do_backoff(&pod.spec, c, status) {
            return Err((ERR_CRASH_LOOP_BACK_OFF, msg));
        }
        let spec = &pod.spec;
        let meta = pod.meta().with_container(&c.name);

        // a. Ensure the image exists.
        let image_ref = self
            .ensure_image_exists(spec, c, sandbox_config, &meta)
            .await?;

        // b. Restart count: the newest instance's + 1, else from the log directory (§5).
        let restart_count = match status.find(&c.name) {
            Some(s) => s.restart_count + 1,
            None => calc_restart_count_by_log_dir(&self.pod_log_dir(spec).join(&c.name)),
        };

        // c. Container config (second ImageStatus, log dir).
        let config = self
            .generate_container_config(spec, c, &image_ref, restart_count, pod_ips, &meta)
            .await
            .map_err(|m| (ERR_CREATE_CONTAINER_CONFIG, m))?;

        // d. CreateContainer with the regenerated sandbox config.
        let id = self
            .cri
            .create_container(sandbox_id, config, sandbox_config.clone(), meta.clone())
            .await
            .map_err(|s| (ERR_CREATE_CONTAINER, s.message().to_string()))?;

        // e. StartContainer. On failure the CREATED container is left behind (§1.3).
        self.cri
            .start_container(&id, meta.clone())
            .await
            .map_err(|s| (ERR_RUN_CONTAINER, s.message().to_string()))?;

        // f. postStart blocks the start loop; failure kills the container (§1.1f).
        if let Some(hook) = c.post_start_hook() {
            if let Err(msg) = run_exec_hook(&self.cri, spec, c, &id, hook, meta.clone()).await {
                let kill = self
                    .kill_container(
                        pod,
                        &id,
                        &c.name,
                        "FailedPostStartHook",
                        KillReason::FailedPostStartHook,
                        None,
                    )
                    .await;
                if let Err(e) = kill {
                    tracing::warn!(pod = %spec, container = %c.name, "failed to kill container after postStart failure: {e}");
                }
                return Err((ERR_POST_START_HOOK, msg));
            }
        }
        Ok(())
    }

    /// `EnsureImageExists`: ImageStatus, then PullImage only if the policy needs it (§1.1a).
    async fn ensure_image_exists(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        sandbox_config: &cri::PodSandboxConfig,
        meta: &CallMeta,
    ) -> Result<String, (&'static str, String)> {
        let image = apply_default_image_tag(&c.image);
        let spec = cri::ImageSpec {
            image,
            annotations: pod
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            ..Default::default()
        };
        let resp = self
            .cri
            .image_status(spec.clone(), meta.clone())
            .await
            .map_err(|s| {
                (
                    ERR_IMAGE_INSPECT,
                    format!("Failed to inspect image {:?}: {}", c.image, go_error(&s)),
                )
            })?;
        // GetImageRef: the first repo digest, else the ID; empty = absent.
        let image_ref = resp
            .image
            .map(|i| i.repo_digests.first().cloned().unwrap_or(i.id))
            .unwrap_or_default();
        let present = !image_ref.is_empty();
        let should_pull = match c.image_pull_policy {
            PullPolicy::Never => false,
            PullPolicy::Always => true,
            PullPolicy::IfNotPresent => !present,
        };
        if !should_pull {
            if present {
                return Ok(image_ref);
            }
            return Err((
                ERR_IMAGE_NEVER_PULL,
                format!(
                    "Container image {:?} is not present with pull policy of Never",
                    c.image
                ),
            ));
        }
        let key = format!("{}_{}", pod.uid, c.image);
        if lock(&self.image_backoff).is_in_backoff_since_update(&key, SystemTime::now()) {
            return Err((
                ERR_IMAGE_PULL_BACK_OFF,
                format!("Back-off pulling image {:?}", c.image),
            ));
        }
        let pulled = {
            let _serial = self.pull_lock.lock().await;
            self.cri
                .pull_image(spec, Some(sandbox_config.clone()), meta.clone())
                .await
        };
        match pulled {
            Ok(r) => Ok(r),
            Err(s) => {
                lock(&self.image_backoff).next(&key, SystemTime::now());
                Err((ERR_IMAGE_PULL, go_error(&s)))
            }
        }
    }

    /// `createPodSandbox`: config, log directory, RunPodSandbox.
    async fn create_pod_sandbox(&self, pod: &PodCtx, attempt: u32) -> Result<String, String> {
        let spec = &pod.spec;
        let config = self.generate_pod_sandbox_config(spec, attempt);
        std::fs::create_dir_all(&config.log_directory).map_err(|e| {
            format!(
                "Failed to create log directory for pod {:?}: {e}",
                spec.format()
            )
        })?;
        self.cri
            .run_pod_sandbox(config, spec.runtime_class_name.clone(), pod.meta())
            .await
            .map_err(|s| {
                format!(
                    "Failed to create sandbox for pod {:?}: {}",
                    spec.format(),
                    go_error(&s)
                )
            })
    }

    /// `generatePodSandboxConfig` (KUBELET-CRI §2.1).
    pub fn generate_pod_sandbox_config(
        &self,
        pod: &PodSpec,
        attempt: u32,
    ) -> cri::PodSandboxConfig {
        let mut labels: HashMap<String, String> = pod
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(LABEL_POD_NAME.into(), pod.name.clone());
        labels.insert(LABEL_POD_NAMESPACE.into(), pod.namespace.clone());
        labels.insert(LABEL_POD_UID.into(), pod.uid.clone());
        let mut security = cri::LinuxSandboxSecurityContext {
            namespace_options: Some(namespaces_for_pod(pod)),
            privileged: false,
            ..Default::default()
        };
        // The sandbox always runs with the runtime's default seccomp profile (kubernetes#84623).
        if self.cfg.version >= KubeletVersion::V1_26 {
            security.seccomp = Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                localhost_ref: String::new(),
            });
        } else {
            #[allow(deprecated)]
            {
                security.seccomp_profile_path = "runtime/default".into();
            }
        }
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                attempt,
            }),
            // Host-network pods get no hostname: they keep the node's.
            hostname: if pod.host_network {
                String::new()
            } else {
                pod.name.chars().take(63).collect()
            },
            log_directory: self.pod_log_dir(pod).display().to_string(),
            dns_config: Some(host_dns_config()),
            port_mappings: Vec::new(),
            labels,
            annotations: pod
                .annotations
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: String::new(),
                security_context: Some(security),
                sysctls: HashMap::new(),
                ..Default::default()
            }),
            windows: None,
        }
    }

    /// `generateContainerConfig` (KUBELET-CRI §2.2).
    async fn generate_container_config(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        image_ref: &str,
        restart_count: u32,
        pod_ips: &[String],
        meta: &CallMeta,
    ) -> Result<cri::ContainerConfig, String> {
        // getImageUser: the second ImageStatus, with the image as written in the spec (§1.1c).
        let spec = cri::ImageSpec {
            image: c.image.clone(),
            ..Default::default()
        };
        self.cri
            .image_status(spec, meta.clone())
            .await
            .map_err(|s| s.message().to_string())?;

        let log_dir = self.pod_log_dir(pod).join(&c.name);
        std::fs::create_dir_all(&log_dir).map_err(|e| {
            format!(
                "create container log directory for container {} failed: {e}",
                c.name
            )
        })?;

        let mut labels = HashMap::new();
        labels.insert(LABEL_POD_NAME.to_string(), pod.name.clone());
        labels.insert(LABEL_POD_NAMESPACE.to_string(), pod.namespace.clone());
        labels.insert(LABEL_POD_UID.to_string(), pod.uid.clone());
        labels.insert(LABEL_CONTAINER_NAME.to_string(), c.name.clone());

        let mut annotations = HashMap::new();
        annotations.insert("io.kubernetes.container.hash".to_string(), c.hash());
        annotations.insert(
            "io.kubernetes.container.restartCount".to_string(),
            restart_count.to_string(),
        );
        annotations.insert(
            "io.kubernetes.container.terminationMessagePath".to_string(),
            c.termination_message_path.clone(),
        );
        annotations.insert(
            "io.kubernetes.container.terminationMessagePolicy".to_string(),
            c.termination_message_policy.clone(),
        );
        annotations.insert(
            "io.kubernetes.pod.terminationGracePeriod".to_string(),
            pod.termination_grace_period_seconds.to_string(),
        );
        if let Some(h) = c.pre_stop_hook() {
            let json =
                serde_json::to_string(h).map_err(|e| format!("encoding preStop handler: {e}"))?;
            annotations.insert("io.kubernetes.container.preStopHandler".to_string(), json);
        }

        let mounts = self.make_mounts(pod, c, pod_ips)?;
        let ns = namespaces_for_pod(pod);
        Ok(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: c.name.clone(),
                attempt: restart_count,
            }),
            image: Some(cri::ImageSpec {
                image: image_ref.to_string(),
                ..Default::default()
            }),
            command: c.command.iter().map(|a| expand_env(a, &c.env)).collect(),
            args: c.args.iter().map(|a| expand_env(a, &c.env)).collect(),
            working_dir: c.working_dir.clone().unwrap_or_default(),
            envs: c
                .env
                .iter()
                .map(|e| cri::KeyValue {
                    key: e.name.clone(),
                    value: e.value.clone(),
                })
                .collect(),
            mounts,
            labels,
            annotations,
            log_path: format!("{}/{}.log", c.name, restart_count),
            linux: Some(cri::LinuxContainerConfig {
                // A BestEffort container: minimum CPU shares, CFS period, OOM score 1000.
                resources: Some(cri::LinuxContainerResources {
                    cpu_period: 100_000,
                    cpu_quota: 0,
                    cpu_shares: 2,
                    oom_score_adj: 1000,
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(ns),
                    masked_paths: DEFAULT_MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
                    readonly_paths: DEFAULT_READONLY_PATHS
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        })
    }

    /// kubelet's termination-log and `/etc/hosts` mounts (only with `root_dir` configured).
    fn make_mounts(
        &self,
        pod: &PodSpec,
        c: &ContainerSpec,
        pod_ips: &[String],
    ) -> Result<Vec<cri::Mount>, String> {
        let Some(root) = &self.cfg.root_dir else {
            return Ok(Vec::new());
        };
        let pod_dir = root.join("pods").join(&pod.uid);
        let mut mounts = Vec::new();
        // /etc/hosts: a managed file for pods with an IP, a copy of the node's for host network.
        if pod.host_network || !pod_ips.is_empty() {
            let hosts = pod_dir.join("etc-hosts");
            let content = if pod.host_network {
                let host = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
                format!("# Kubernetes-managed hosts file (host network).\n{host}")
            } else {
                let mut s = String::from(
                    "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
                );
                for ip in pod_ips {
                    s.push_str(&format!("{ip}\t{}\n", pod.name));
                }
                s
            };
            std::fs::create_dir_all(&pod_dir).map_err(|e| format!("create pod dir: {e}"))?;
            std::fs::write(&hosts, content)
                .map_err(|e| format!("write {}: {e}", hosts.display()))?;
            mounts.push(cri::Mount {
                container_path: "/etc/hosts".into(),
                host_path: hosts.display().to_string(),
                ..Default::default()
            });
        }
        if !c.termination_message_path.is_empty() {
            let dir = pod_dir.join("containers").join(&c.name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
            let file = dir.join(super::rand::hex8());
            std::fs::write(&file, b"").map_err(|e| format!("create {}: {e}", file.display()))?;
            set_mode_0666(&file);
            mounts.push(cri::Mount {
                container_path: c.termination_message_path.clone(),
                host_path: file.display().to_string(),
                ..Default::default()
            });
        }
        Ok(mounts)
    }

    // --- killing ---

    /// `killContainer` (KUBELET-CRI §3.1, §3.2): preStop (if grace > 0, waited at most grace
    /// seconds), grace reduced by the hook's whole seconds, minimum 2, replaced by the override if
    /// any; then StopContainer. NotFound counts as success.
    pub async fn kill_container(
        &self,
        pod: &PodCtx,
        id: &str,
        name: &str,
        message: &str,
        reason: KillReason,
        grace_override: Option<i64>,
    ) -> Result<(), String> {
        let spec = &pod.spec;
        let Some(c) = spec.container(name) else {
            return Err(format!("failed to get containerSpec {name:?} (id={id:?}) in pod {:?} when killing container for reason {message:?}", spec.format()));
        };
        tracing::debug!(pod = %spec, container = name, ?reason, "killing container");
        let meta = pod.meta().with_container(name);
        let mut grace = pod
            .deletion_grace
            .unwrap_or(spec.termination_grace_period_seconds);
        if let Some(hook) = c.pre_stop_hook() {
            if grace > 0 {
                grace -=
                    execute_pre_stop_hook(&self.cri, spec, c, id, hook, grace, meta.clone()).await;
            }
        }
        if grace < MINIMUM_GRACE_PERIOD {
            grace = MINIMUM_GRACE_PERIOD;
        }
        if let Some(o) = grace_override {
            grace = o;
        }
        match self.cri.stop_container(id, grace, meta).await {
            Ok(()) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(go_error(&s)),
        }
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

    /// `removeContainer`: ContainerStatus (legacy log symlink), then RemoveContainer.
    pub async fn remove_container(&self, id: &str, meta: CallMeta) -> Result<(), Status> {
        match self.cri.container_status(id, meta.clone()).await {
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => return Err(s),
        }
        self.cri.remove_container(id, meta).await
    }

    /// `purgeInitContainers`: when the sandbox is re-created, every init container goes.
    async fn purge_init_containers(&self, pod: &PodCtx, status: &RuntimePodStatus) {
        for c in &pod.spec.init_containers {
            for s in status.containers.iter().filter(|s| s.name == c.name) {
                if let Err(e) = self
                    .remove_container(&s.id, pod.meta().with_container(&c.name))
                    .await
                {
                    tracing::warn!(pod = %pod.spec, container = %c.name, "failed to remove init container: {e}");
                }
            }
        }
    }

    /// `pruneInitContainersBeforeStart`: keep only the newest EXITED instance of each init container.
    async fn prune_init_containers_before_start(&self, pod: &PodCtx, status: &RuntimePodStatus) {
        for c in &pod.spec.init_containers {
            let mut count = 0;
            for s in status.containers.iter().filter(|s| s.name == c.name) {
                if s.state != CriState::Exited && s.state != CriState::Unknown {
                    continue;
                }
                count += 1;
                if count == 1 && s.state == CriState::Exited {
                    continue;
                }
                if let Err(e) = self
                    .remove_container(&s.id, pod.meta().with_container(&c.name))
                    .await
                {
                    tracing::warn!(pod = %pod.spec, container = %c.name, "failed to remove init container: {e}");
                }
            }
        }
    }

    // --- status ---

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

fn is_init_container_failed(s: &RuntimeContainerStatus) -> bool {
    s.reason == "OOMKilled"
        || (s.state == CriState::Exited && s.exit_code != 0)
        || s.state == CriState::Unknown
}

/// `findNextInitContainerToRun`: (last failed status, next index, done).
fn find_next_init_container_to_run<'a>(
    pod: &PodSpec,
    status: &'a RuntimePodStatus,
) -> (Option<&'a RuntimeContainerStatus>, Option<usize>, bool) {
    if pod.init_containers.is_empty() {
        return (None, None, true);
    }
    // A running regular container means initialization happened in the past.
    if pod.containers.iter().any(|c| {
        status
            .find(&c.name)
            .is_some_and(|s| s.state == CriState::Running)
    }) {
        return (None, None, true);
    }
    for (i, c) in pod.init_containers.iter().enumerate().rev() {
        if let Some(s) = status.find(&c.name) {
            if is_init_container_failed(s) {
                return (Some(s), Some(i), false);
            }
        }
    }
    for (i, c) in pod.init_containers.iter().enumerate().rev() {
        let Some(s) = status.find(&c.name) else {
            continue;
        };
        if s.state == CriState::Running {
            return (None, None, false);
        }
        if s.state == CriState::Exited {
            if i == pod.init_containers.len() - 1 {
                return (None, None, true);
            }
            return (None, Some(i + 1), false);
        }
    }
    (None, Some(0), false)
}

/// Namespace options: network NODE for host network else POD, PID per container, IPC per pod.
fn namespaces_for_pod(pod: &PodSpec) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: network_mode(pod.host_network),
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

fn sandbox_ips(st: &cri::PodSandboxStatus) -> Vec<String> {
    let Some(n) = &st.network else {
        return Vec::new();
    };
    let mut ips = Vec::new();
    if !n.ip.is_empty() {
        ips.push(n.ip.clone());
    }
    ips.extend(n.additional_ips.iter().map(|i| i.ip.clone()));
    ips
}

/// kubelet's `verifySandboxStatus` (KUBELET-CRI §4.1).
fn verify_sandbox_status(s: &cri::PodSandboxStatus) -> Result<(), String> {
    if s.id.is_empty() {
        return Err("status.Id is not set".into());
    }
    let Some(m) = &s.metadata else {
        return Err("status.Metadata is not set".into());
    };
    if m.name.is_empty() || m.namespace.is_empty() || m.uid.is_empty() {
        return Err(format!(
            "metadata.Name, metadata.Namespace or metadata.Uid is not in metadata {m:?}"
        ));
    }
    if s.created_at == 0 {
        return Err("status.CreatedAt is not set".into());
    }
    Ok(())
}

/// kubelet's `verifyContainerStatus` (KUBELET-CRI §4.1).
fn verify_container_status(s: &cri::ContainerStatus) -> Result<(), String> {
    if s.id.is_empty() {
        return Err("status.Id is not set".into());
    }
    let Some(m) = &s.metadata else {
        return Err("status.Metadata is not set".into());
    };
    if m.name.is_empty() {
        return Err(format!("metadata.Name is not in metadata {m:?}"));
    }
    if s.created_at == 0 {
        return Err("status.CreatedAt is not set".into());
    }
    if s.image.as_ref().is_none_or(|i| i.image.is_empty()) {
        return Err("status.Image is not set".into());
    }
    if s.image_ref.is_empty() {
        return Err("status.ImageRef is not set".into());
    }
    Ok(())
}

/// `applyDefaultImageTag`: no tag and no digest → `:latest`.
fn apply_default_image_tag(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last.contains(':') {
        image.to_string()
    } else {
        format!("{image}:latest")
    }
}

/// `calcRestartCountByLogDir`: highest `N.log` + 1 in the container's log dir, 0 if none.
fn calc_restart_count_by_log_dir(dir: &Path) -> u32 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut count = 0;
    for e in entries.flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(true) {
            continue;
        }
        let name = e.file_name().to_string_lossy().to_string();
        let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() || !name[digits.len()..].starts_with(".log") {
            continue;
        }
        if let Ok(n) = digits.parse::<u32>() {
            count = count.max(n + 1);
        }
    }
    count
}

/// kubelet's "Default" DNS policy (what ClusterFirst falls back to without cluster DNS): the
/// node's resolv.conf.
fn host_dns_config() -> cri::DnsConfig {
    let mut cfg = cri::DnsConfig::default();
    let Ok(text) = std::fs::read_to_string("/etc/resolv.conf") else {
        return cfg;
    };
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => cfg.servers.extend(f.next().map(str::to_string)),
            Some("search") => cfg.searches = f.map(str::to_string).collect(),
            Some("options") => cfg.options = f.map(str::to_string).collect(),
            _ => {}
        }
    }
    cfg
}

fn set_mode_0666(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666));
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

/// An exec hook: ExecSync with timeout 0 and no deadline (KUBELET-CRI §6). A non-zero exit is a
/// failure. Returns kubelet's message on failure.
async fn run_exec_hook(
    cri: &CriClient,
    pod: &PodSpec,
    c: &ContainerSpec,
    id: &str,
    hook: &Handler,
    meta: CallMeta,
) -> Result<(), String> {
    let cmd = hook.exec.command.clone();
    let meta = meta.with_detail(format!("hook {:?}", cmd.join(" ")));
    let (err, output) = match cri.exec_sync(id, cmd.clone(), 0, meta).await {
        Ok(r) if r.exit_code == 0 => return Ok(()),
        Ok(r) => {
            let stderr = String::from_utf8_lossy(&r.stderr).to_string();
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            (
                format!(
                    "command '{}' exited with {}: {}",
                    cmd.join(" "),
                    r.exit_code,
                    stderr
                ),
                String::from_utf8_lossy(&out).to_string(),
            )
        }
        Err(s) => (go_error(&s), String::new()),
    };
    Err(format!("Exec lifecycle hook ({:?}) for Container {:?} in Pod {:?} failed - error: {}, message: {:?}", cmd, c.name, pod.format(), err, output))
}

/// `executePreStopHook`: runs the hook in its own task (not cancelled at the deadline) and waits
/// at most `grace` seconds. Returns the whole seconds elapsed.
async fn execute_pre_stop_hook(
    cri: &CriClient,
    pod: &PodSpec,
    c: &ContainerSpec,
    id: &str,
    hook: &Handler,
    grace: i64,
    meta: CallMeta,
) -> i64 {
    let start = Instant::now();
    let (cri, pod, c, id, hook) = (
        cri.clone(),
        pod.clone(),
        c.clone(),
        id.to_string(),
        hook.clone(),
    );
    let (pod_key, name) = (pod.key(), c.name.clone());
    let task = tokio::spawn(async move {
        if let Err(msg) = run_exec_hook(&cri, &pod, &c, &id, &hook, meta).await {
            tracing::warn!(pod = %pod, container = %c.name, "PreStop hook failed: {msg}");
        }
    });
    let limit = Duration::from_secs(grace.max(0) as u64);
    if tokio::time::timeout(limit, task).await.is_err() {
        tracing::info!(pod = %pod_key, container = %name, grace, "PreStop hook not completed in grace period");
    }
    start.elapsed().as_secs() as i64
}

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

/// kubelet's `expandContainerCommandAndArgs`: `$(NAME)` in a container's command and args is
/// replaced by the value of its env var NAME (Secret-backed ones included), `$$` is a literal
/// `$`, and a reference to an undefined name stays as written.
pub fn expand_env(s: &str, env: &[super::pod::EnvVar]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after.strip_prefix('(').and_then(|t| t.split_once(')')) {
            match env.iter().find(|e| e.name == name) {
                Some(e) => out.push_str(&e.value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod expand_env_tests {
    use super::super::pod::EnvVar;
    use super::expand_env;

    #[test]
    fn expands_as_kubelet_does() {
        let env = vec![EnvVar {
            name: "TOKEN".into(),
            value: "s3cr3t".into(),
        }];
        assert_eq!(expand_env("--token=$(TOKEN)", &env), "--token=s3cr3t");
        assert_eq!(
            expand_env("$$(TOKEN) $(NOPE) $x $", &env),
            "$(TOKEN) $(NOPE) $x $"
        );
    }
}
