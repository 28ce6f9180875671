//! Job mode (DESIGN.md §5): when every app container of a Job pod has exited for good, crisp
//! runs each sidecar's exec preStop hook and stops the sidecars in reverse order, then reports
//! them as `exit 0, Completed` so the pod is judged by its apps alone.
//!
//! Cost: one watcher task per *Job pod with sidecars*, polling that sandbox's containers; it runs
//! in the engine's tracker and ends when its apps are done, when the pod is removed, or when
//! the engine shuts down (`Engine::shutdown`). No other pod, and no call, pays anything —
//! except status calls while at least one terminated sidecar exists: they are diverted, and
//! their response collected only if the request names a marked container or its sandbox
//! (DESIGN.md §5.2).
//!
//! The fact "crisp stopped this container" lives in a file per container under
//! `<state_dir>/terminated/`, written durably and pruned at start (DESIGN.md §5.1), so a
//! restarted crisp keeps reporting exit 0.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;

use super::annotations::RestartPolicy;
use super::decide::{self, Snapshot};
use super::{now, Engine, Pod};
use crate::cri::views::state;
use crate::cri::ApiVersion;

pub(crate) const JOB_NAME_LABELS: [&str; 2] = ["batch.kubernetes.io/job-name", "job-name"];
const PRESTOP_ANNOTATION: &str = "io.kubernetes.container.preStopHandler";
const GRACE_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";
const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// The prune at start asks a runtime that does not answer again after this, then twice as late
/// each time, up to [`PRUNE_RETRY_MAX`].
const PRUNE_RETRY_MIN: Duration = Duration::from_secs(1);
const PRUNE_RETRY_MAX: Duration = Duration::from_secs(30);

/// The containers crisp terminated, by sandbox, persisted one file per container id whose
/// content is its sandbox id (`<state_dir>/terminated/<container_id>`).
///
/// A mark is written like kubelet writes its checkpoints: to a temporary file that is fsynced,
/// renamed over the mark, and the directory fsynced, so a mark that was reported to kubelet
/// (the sidecar is stopped right after) survives a power loss. Removal is not fsynced: a mark
/// that comes back after a crash names a container the runtime no longer has, and
/// [`Engine::prune_marks`] drops it at the next start.
pub struct Terminated {
    dir: Option<PathBuf>,
    marks: RwLock<Marks>,
    /// Mirror of "some mark exists", read on the hot path (`interest`) without locking.
    any: AtomicBool,
    /// The marks found on disk at open: the only ones the prune at start may drop (a mark made
    /// since is for a container that existed when it was made).
    loaded: parking_lot::Mutex<Vec<String>>,
}

#[derive(Default)]
struct Marks {
    /// Container id → its sandbox id; empty for a mark written before crisp kept the sandbox,
    /// until the prune at start learns it from the runtime.
    sandbox_of: HashMap<String, String>,
    /// Sandbox id → how many of its containers are marked.
    by_sandbox: HashMap<String, usize>,
    /// Marks whose sandbox is not known (yet): any sandbox may be theirs.
    unknown: usize,
}

impl Marks {
    fn insert(&mut self, id: &str, sandbox: &str) {
        self.remove(id);
        if sandbox.is_empty() {
            self.unknown += 1;
        } else {
            *self.by_sandbox.entry(sandbox.to_string()).or_default() += 1;
        }
        self.sandbox_of.insert(id.to_string(), sandbox.to_string());
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some(sandbox) = self.sandbox_of.remove(id) else {
            return false;
        };
        if sandbox.is_empty() {
            self.unknown -= 1;
        } else if let Some(n) = self.by_sandbox.get_mut(&sandbox) {
            *n -= 1;
            if *n == 0 {
                self.by_sandbox.remove(&sandbox);
            }
        }
        true
    }
}

/// Why a mark could not be written durably.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot sync the directory {path}: {source}")]
    SyncDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writes `content` to `dir/name` durably: a temporary file, fsynced, renamed over `name`, and
/// the directory fsynced (the rename itself is then on disk). Blocking: called off the async
/// workers.
pub(crate) fn write_durably(dir: &Path, name: &str, content: &[u8]) -> Result<(), MarkError> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let path = dir.join(name);
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(content)?;
        file.sync_all()?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(source) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(MarkError::Write { path, source });
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| MarkError::SyncDir {
            path: dir.to_path_buf(),
            source,
        })
}

/// A mark being written; one left by a crash before its rename is removed at open.
const TMP_SUFFIX: &str = ".tmp";
/// A mark file holds a sandbox id: read no more than this of it.
const MAX_MARK_FILE: u64 = 256;

impl Terminated {
    /// Loads the set from `state_dir` (created if missing). A `None` dir keeps it in memory only.
    pub fn open(state_dir: Option<PathBuf>) -> Self {
        let dir = state_dir.map(|state_dir| state_dir.join("terminated"));
        let mut marks = Marks::default();
        let mut loaded = Vec::new();
        if let Some(dir) = &dir {
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(
                    dir = %dir.display(),
                    error = %e,
                    "cannot create the state directory; job-mode exit codes will not survive a crisp restart"
                );
            }
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                        continue;
                    };
                    if name.ends_with(TMP_SUFFIX) {
                        let _ = std::fs::remove_file(entry.path());
                        continue;
                    }
                    if is_container_id(&name) {
                        let sandbox = read_sandbox(&entry.path());
                        marks.insert(&name, &sandbox);
                        loaded.push(name);
                    }
                }
            }
        }
        Terminated {
            dir,
            any: AtomicBool::new(!marks.sandbox_of.is_empty()),
            marks: RwLock::new(marks),
            loaded: parking_lot::Mutex::new(loaded),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        !self.any.load(Relaxed)
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        !self.is_empty() && self.marks.read().sandbox_of.contains_key(id)
    }

    /// Whether a container of `sandbox` may be marked (a mark whose sandbox is not known yet
    /// may be of any).
    pub(crate) fn may_have_sandbox(&self, sandbox: &str) -> bool {
        if self.is_empty() {
            return false;
        }
        let marks = self.marks.read();
        marks.unknown > 0 || marks.by_sandbox.contains_key(sandbox)
    }

    /// Marks container `id` of `sandbox`: at once in memory, then durably on disk (off the async
    /// workers) before this returns.
    pub(crate) async fn insert(&self, id: &str, sandbox: &str) {
        if !is_container_id(id) || !is_container_id(sandbox) {
            return;
        }
        {
            let mut marks = self.marks.write();
            marks.insert(id, sandbox);
            self.any.store(true, Relaxed);
        }
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let (name, content) = (id.to_string(), sandbox.to_string());
        let written =
            tokio::task::spawn_blocking(move || write_durably(&dir, &name, content.as_bytes()))
                .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                container_id = id,
                error = %e,
                "cannot persist the terminated-sidecar mark"
            ),
            Err(e) => tracing::warn!(
                container_id = id,
                error = %e,
                "cannot persist the terminated-sidecar mark"
            ),
        }
    }

    pub(crate) fn remove(&self, id: &str) {
        if self.is_empty() {
            return;
        }
        let removed = {
            let mut marks = self.marks.write();
            let removed = marks.remove(id);
            self.any.store(!marks.sandbox_of.is_empty(), Relaxed);
            removed
        };
        // Outside the lock: relay threads read the marks (`contains`) and must not wait for a
        // file system.
        if removed {
            self.unlink(id);
        }
    }

    /// Drops the marks of `sandbox`'s containers (RemovePodSandbox removes them with it).
    pub(crate) fn remove_sandbox(&self, sandbox: &str) {
        if self.is_empty() {
            return;
        }
        let ids: Vec<String> = {
            let mut marks = self.marks.write();
            if !marks.by_sandbox.contains_key(sandbox) {
                return;
            }
            let ids: Vec<String> = marks
                .sandbox_of
                .iter()
                .filter(|(_, s)| s.as_str() == sandbox)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                marks.remove(id);
            }
            self.any.store(!marks.sandbox_of.is_empty(), Relaxed);
            ids
        };
        // Outside the lock, as in `remove`.
        for id in ids {
            self.unlink(&id);
        }
    }

    fn unlink(&self, id: &str) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_file(dir.join(id));
        }
    }

    /// Whether marks found at open still wait for [`Terminated::prune`].
    pub(crate) fn prune_pending(&self) -> bool {
        !self.loaded.lock().is_empty()
    }

    /// Reconciles the marks found at open with the containers the runtime has now (`sandbox_of`:
    /// a container's sandbox, `None` when the runtime does not have it): drops the marks of
    /// containers it no longer has and learns the sandbox of the others. Returns how many were
    /// dropped. Blocking (file removals and rewrites): called off the async workers.
    pub(crate) fn prune(&self, sandbox_of: impl Fn(&str) -> Option<String>) -> usize {
        let loaded = std::mem::take(&mut *self.loaded.lock());
        let mut pruned = 0;
        for id in loaded {
            let known = self.marks.read().sandbox_of.get(&id).cloned();
            let Some(known) = known else {
                continue; // removed since (RemoveContainer)
            };
            match sandbox_of(&id) {
                None => {
                    let removed = {
                        let mut marks = self.marks.write();
                        let removed = marks.remove(&id);
                        self.any.store(!marks.sandbox_of.is_empty(), Relaxed);
                        removed
                    };
                    if removed {
                        self.unlink(&id);
                        pruned += 1;
                    }
                }
                Some(sandbox) if known.is_empty() && is_container_id(&sandbox) => {
                    self.marks.write().insert(&id, &sandbox);
                    if let Some(dir) = &self.dir {
                        if let Err(e) = write_durably(dir, &id, sandbox.as_bytes()) {
                            tracing::warn!(
                                container_id = %id,
                                error = %e,
                                "cannot persist the terminated-sidecar mark"
                            );
                        }
                    }
                }
                Some(_) => {}
            }
        }
        pruned
    }
}

/// The sandbox id a mark file holds; empty for an empty (older) or unreadable one.
fn read_sandbox(path: &Path) -> String {
    use std::io::Read;
    let mut content = String::new();
    let read = std::fs::File::open(path)
        .and_then(|f| f.take(MAX_MARK_FILE).read_to_string(&mut content));
    match read {
        Ok(_) if is_container_id(content.trim()) => content.trim().to_string(),
        _ => String::new(),
    }
}

/// Container ids are hex in containerd and CRI-O; anything else is not used as a file name.
fn is_container_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl Pod {
    /// A Job pod, by its labels or `crisp.dev/job`.
    pub(crate) fn is_job(&self) -> bool {
        match self.policy.job {
            Some(j) => j,
            None => JOB_NAME_LABELS.iter().any(|l| self.labels.contains_key(*l)),
        }
    }
}

/// The pod's grace period as kubelet stamps it on the container: the pod's
/// `terminationGracePeriodSeconds`, any int64 (30 s when absent or not a number), bounded
/// where it enters like a StopContainer's (`decide::grace_from_secs`).
fn grace_of(annotations: &std::collections::HashMap<String, String>) -> Duration {
    match annotations
        .get(GRACE_ANNOTATION)
        .map(|v| v.trim().parse::<i64>())
    {
        Some(Ok(secs)) => decide::grace_from_secs(secs),
        Some(Err(e)) if *e.kind() == std::num::IntErrorKind::PosOverflow => decide::MAX_GRACE,
        _ => Duration::from_secs(30),
    }
}

/// Parses kubelet's preStop annotation (JSON of the LifecycleHandler); only exec hooks run here.
/// The annotation is the pod author's hook, copied by kubelet: past the tenant value cap it is
/// not parsed at all (no hook is run; the sidecar is still stopped).
pub(crate) fn prestop_command(annotation: &str) -> Option<Vec<String>> {
    let annotation = crate::tenant::value(annotation).ok()?;
    let v: serde_json::Value = serde_json::from_str(annotation).ok()?;
    let cmd = v.get("exec")?.get("command")?.as_array()?;
    let cmd: Vec<String> = cmd
        .iter()
        .filter_map(|c| c.as_str().map(str::to_string))
        .collect();
    (!cmd.is_empty()).then_some(cmd)
}

#[derive(Debug, PartialEq, Eq)]
enum AppsState {
    NotStarted,
    Running,
    /// All exited for good; the pod's sidecars can go.
    Done,
}

impl Engine {
    /// Starts the watcher of a Job pod with sidecars (once per pod).
    pub(super) fn maybe_watch_job(&self, pod: &Arc<Pod>, version: ApiVersion) {
        if !self.job.enabled || !pod.policy.has_sidecars() || !pod.is_job() {
            return;
        }
        if pod.job_watched.swap(true, Relaxed) {
            return;
        }
        let Some(engine) = self.me.upgrade() else {
            return;
        };
        let pod = pod.clone();
        tracing::info!(
            pod_namespace = %pod.namespace,
            pod_name = %pod.name,
            "Job pod with sidecars: watching its app containers"
        );
        self.spawn(async move { engine.watch_job(pod, version).await });
    }

    async fn watch_job(self: Arc<Self>, pod: Arc<Pod>, version: ApiVersion) {
        let mut ticker = tokio::time::interval(self.job.poll_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if !self.pods.contains_key(&pod.sandbox_id) {
                return; // RemovePodSandbox: the pod is gone.
            }
            match self.job_apps_state(version, &pod).await {
                Ok(AppsState::Done) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(
                        pod_name = %pod.name,
                        error = %e,
                        "job watcher: cannot read the pod's containers"
                    )
                }
            }
        }
        self.terminate_sidecars(version, &pod).await;
    }

    /// Every runtime read of a watcher waits for the node-wide bound ([`super::reads`]): a
    /// watcher lives as long as its pod, and a node can run many Job pods.
    async fn job_apps_state(
        &self,
        version: ApiVersion,
        pod: &Pod,
    ) -> Result<AppsState, crate::proxy::client::ClientError> {
        let containers = {
            let _read = self.reads.read(None).await;
            self.runtime
                .list_containers(version, &pod.sandbox_id)
                .await?
        };
        if containers.is_empty() {
            // The sandbox may be gone with no RemovePodSandbox seen (e.g. removed while crisp was
            // down): stop watching.
            let _read = self.reads.read(None).await;
            if let Err(e) = self
                .runtime
                .pod_sandbox_status(version, &pod.sandbox_id)
                .await
            {
                if e.is_not_found() {
                    self.pods.remove(&pod.sandbox_id);
                }
            }
            return Ok(AppsState::NotStarted);
        }
        let snapshot = Snapshot::new(&containers);
        // Init containers are never apps (an exited init container is not a finished Job).
        // Besides those named by annotations or let through as such, a container that finished
        // before the first sidecar was even created is one: kubelet creates regular containers
        // back to back, init containers only once the previous one has exited (KUBELET-CRI §1.1).
        let name_of = |container: &crate::cri::views::Container| {
            container
                .metadata
                .as_ref()
                .map(|metadata| metadata.name.clone())
                .unwrap_or_default()
        };
        let Some(first_sidecar) = containers
            .iter()
            .filter(|container| pod.policy.sidecar_index(&name_of(container)).is_some())
            .map(|container| container.created_at)
            .min()
        else {
            return Ok(AppsState::NotStarted);
        };
        let mut apps = Vec::new();
        for (name, container) in snapshot.iter() {
            // Native sidecars are kubelet's to end (KEP-753), never a Job's apps.
            if pod.policy.sidecar_index(name).is_some()
                || pod.policy.is_native(name)
                || pod.is_init(name)
            {
                continue;
            }
            if container.created_at < first_sidecar && container.state == state::EXITED {
                let _read = self.reads.read(None).await;
                let status = self
                    .runtime
                    .container_status(version, &container.id)
                    .await?
                    .status
                    .unwrap_or_default();
                if status.finished_at <= first_sidecar {
                    pod.note_init(name);
                    continue;
                }
            }
            apps.push(container);
        }
        if apps.is_empty() {
            return Ok(AppsState::NotStarted);
        }
        if apps.iter().any(|app| app.state != state::EXITED) {
            return Ok(AppsState::Running);
        }
        for app in apps {
            let status = {
                let _read = self.reads.read(None).await;
                self.runtime
                    .container_status(version, &app.id)
                    .await?
                    .status
                    .unwrap_or_default()
            };
            if status.exit_code == 0 {
                continue; // Final under Never and OnFailure.
            }
            // Restarted after it *ran*: kubelet also re-creates (restartCount + 1) an instance
            // that never started, whatever the policy (a start cut short, KUBELET-CRI §1.4),
            // which says nothing about OnFailure.
            let restart_count = status
                .annotations
                .get(RESTART_COUNT_ANNOTATION)
                .and_then(|count| count.parse::<u32>().ok())
                .unwrap_or(0);
            let restarted_before = restart_count > 0
                && self
                    .ran_before(version, &containers, app, restart_count)
                    .await;
            let final_ = match pod.policy.restart_policy {
                Some(RestartPolicy::Never) => true,
                Some(_) => false,
                // Inferred: kubelet re-creates a first crash at once under OnFailure; one that has
                // been restarted before is OnFailure, and its back-off may be minutes long.
                None if restarted_before => false,
                None => {
                    let finished = SystemTime::UNIX_EPOCH
                        + Duration::from_nanos(status.finished_at.max(0) as u64);
                    SystemTime::now()
                        .duration_since(finished)
                        .unwrap_or_default()
                        >= self.job.restart_grace
                }
            };
            if !final_ {
                return Ok(AppsState::Running);
            }
        }
        Ok(AppsState::Done)
    }

    /// Whether an older instance of `app`'s container actually ran (was started). Unless all
    /// `restart_count` older instances are still there to look at (kubelet's GC removes dead
    /// ones) and none of them ran, the answer is yes: the conservative one keeps the sidecars.
    async fn ran_before(
        &self,
        version: ApiVersion,
        containers: &[crate::cri::views::Container],
        app: &crate::cri::views::Container,
        restart_count: u32,
    ) -> bool {
        let name = |container: &crate::cri::views::Container| {
            container
                .metadata
                .as_ref()
                .map(|metadata| metadata.name.clone())
                .unwrap_or_default()
        };
        let older: Vec<_> = containers
            .iter()
            .filter(|older| {
                older.id != app.id && older.created_at < app.created_at && name(older) == name(app)
            })
            .collect();
        if older.len() < restart_count as usize {
            return true;
        }
        for instance in older {
            let _read = self.reads.read(None).await;
            match self.runtime.container_status(version, &instance.id).await {
                Ok(answer)
                    if answer
                        .status
                        .as_ref()
                        .is_some_and(|status| status.started_at != 0) =>
                {
                    return true
                }
                Ok(_) => {}
                Err(_) => return true,
            }
        }
        false
    }

    pub(super) async fn terminate_sidecars(&self, version: ApiVersion, pod: &Pod) {
        let Ok(containers) = self.runtime.list_containers(version, &pod.sandbox_id).await else {
            return;
        };
        let snapshot = Snapshot::new(&containers);
        let started = now();
        let mut budget: Option<Duration> = None;
        tracing::info!(
            pod_namespace = %pod.namespace,
            pod_name = %pod.name,
            "the Job's app containers have finished; stopping its sidecars in reverse order"
        );
        for sidecar in pod.policy.sidecars.iter().rev() {
            let Some(container) = snapshot.get(&sidecar.name) else {
                continue;
            };
            if container.state != state::RUNNING {
                continue;
            }
            let status = match self.runtime.container_status(version, &container.id).await {
                Ok(answer) => answer.status.unwrap_or_default(),
                Err(e) => {
                    tracing::warn!(
                        container_name = %sidecar.name,
                        error = %e,
                        "cannot read sidecar status; skipping it"
                    );
                    continue;
                }
            };
            let grace = *budget.get_or_insert_with(|| grace_of(&status.annotations));
            let left = grace.saturating_sub(now().saturating_duration_since(started));
            if let Some(cmd) = status
                .annotations
                .get(PRESTOP_ANNOTATION)
                .and_then(|hook| prestop_command(hook))
            {
                tracing::info!(
                    container_name = %sidecar.name,
                    "running the sidecar's preStop hook"
                );
                match self
                    .runtime
                    .exec_sync(
                        version,
                        &container.id,
                        &cmd,
                        left.max(Duration::from_secs(1)),
                    )
                    .await
                {
                    Ok(code) if code != 0 => {
                        tracing::warn!(
                            container_name = %sidecar.name,
                            exit_code = code,
                            "preStop hook failed; stopping anyway"
                        )
                    }
                    Err(e) => {
                        tracing::warn!(
                            container_name = %sidecar.name,
                            error = %e,
                            "preStop hook could not run; stopping anyway"
                        )
                    }
                    Ok(_) => {}
                }
            }
            let secs = decide::budget_secs(Some(decide::later(started, grace)), now());
            // Mark first (durably: the stop is final): a status read racing the stop must
            // already see `Completed`.
            self.terminated.insert(&container.id, &pod.sandbox_id).await;
            match self
                .runtime
                .stop_container(version, &container.id, secs)
                .await
            {
                Ok(()) => {
                    self.metrics.job_sidecars_stopped.inc();
                    tracing::info!(
                        container_name = %sidecar.name,
                        container_id = %container.id,
                        "stopped Job sidecar; it will report exit 0 (Completed)"
                    );
                }
                Err(e) => {
                    self.terminated.remove(&container.id);
                    tracing::warn!(
                        container_name = %sidecar.name,
                        error = %e,
                        "could not stop Job sidecar"
                    );
                }
            }
        }
    }

    /// Drops the marks whose container the runtime no longer has (removed while crisp was
    /// down: no RemoveContainer came through crisp) and learns the sandbox of marks written
    /// before crisp kept it. One ListContainers of the node, off every call's path; while the
    /// runtime does not answer it is asked again, less and less often (up to every
    /// [`PRUNE_RETRY_MAX`]), and start is never waited on. Ends once done or at shutdown.
    pub(super) async fn prune_marks(&self, version: ApiVersion) {
        let mut wait = PRUNE_RETRY_MIN;
        let mut said = false;
        while self.terminated.prune_pending() {
            let listed = {
                let _read = self.reads.read(None).await;
                self.runtime.list_all_containers(version).await
            };
            let containers = match listed {
                Ok(containers) => containers,
                Err(e) => {
                    if !said {
                        tracing::info!(
                            error = %e,
                            "cannot list the runtime's containers; terminated-sidecar marks will be pruned once it answers"
                        );
                        said = true;
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(PRUNE_RETRY_MAX);
                    continue;
                }
            };
            let present: HashMap<String, String> = containers
                .into_iter()
                .map(|container| (container.id, container.pod_sandbox_id))
                .collect();
            let terminated = self.terminated.clone();
            let pruned = tokio::task::spawn_blocking(move || {
                terminated.prune(|id| present.get(id).cloned())
            })
            .await
            .unwrap_or_default();
            tracing::info!(
                pruned,
                "pruned the terminated-sidecar marks of containers the runtime no longer has"
            );
            return;
        }
    }

    /// Rebuilds Job watchers after a crisp restart: every ready sandbox with sidecars.
    pub async fn recover(&self, version: ApiVersion) {
        if !self.job.enabled {
            return;
        }
        let sandboxes = match self.runtime.list_pod_sandboxes(version).await {
            Ok(sandboxes) => sandboxes,
            Err(e) => {
                tracing::info!(
                    error = %e,
                    "cannot list sandboxes at start; Job pods will be picked up on their next call"
                );
                return;
            }
        };
        let ready = sandboxes.into_iter().filter(|sandbox| sandbox.state == 0);
        for sandbox in ready {
            if let Some(pod) = self.pod_by_id(version, &sandbox.id).await {
                self.maybe_watch_job(&pod, version);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prestop_exec_is_parsed_and_others_ignored() {
        assert_eq!(
            prestop_command(r#"{"exec":{"command":["sh","-c","sleep 1"]}}"#),
            Some(vec!["sh".into(), "-c".into(), "sleep 1".into()])
        );
        assert_eq!(
            prestop_command(r#"{"httpGet":{"path":"/q","port":80}}"#),
            None
        );
        assert_eq!(prestop_command("not json"), None);
        assert_eq!(prestop_command(r#"{"exec":{"command":[]}}"#), None);
    }

    /// Issue #26: the preStop annotation is tenant text like any other: over the value cap it
    /// is refused unread, however well formed.
    #[test]
    fn a_prestop_hook_past_the_value_cap_is_not_parsed() {
        let args = vec!["\"x\""; crate::tenant::MAX_VALUE / 4].join(",");
        let hook = format!(r#"{{"exec":{{"command":["sh",{args}]}}}}"#);
        assert!(hook.len() > crate::tenant::MAX_VALUE);
        assert_eq!(prestop_command(&hook), None);
    }

    #[test]
    fn the_grace_annotation_is_bounded_where_it_enters() {
        let grace = |v: &str| grace_of(&[(GRACE_ANNOTATION.to_string(), v.to_string())].into());
        assert_eq!(grace("45"), Duration::from_secs(45));
        assert_eq!(grace("9223372036854775807"), decide::MAX_GRACE);
        assert_eq!(
            grace("18446744073709551615"),
            decide::MAX_GRACE,
            "beyond int64: as long as crisp allows"
        );
        assert_eq!(grace("-5"), Duration::ZERO);
        assert_eq!(grace("soon"), Duration::from_secs(30));
        assert_eq!(grace_of(&Default::default()), Duration::from_secs(30));
    }

    #[tokio::test]
    async fn terminated_marks_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let t = Terminated::open(Some(dir.path().to_path_buf()));
        assert!(t.is_empty());
        t.insert("abc123", "sb1").await;
        t.insert("../evil", "sb1").await; // not a container id: never becomes a path
        t.insert("def456", "../evil").await; // nor a sandbox id
        assert!(t.contains("abc123"));
        assert!(!t.contains("def456"));
        let t2 = Terminated::open(Some(dir.path().to_path_buf()));
        assert!(t2.contains("abc123"));
        assert!(t2.may_have_sandbox("sb1"), "the sandbox is read back");
        assert!(!t2.may_have_sandbox("sb2"));
        assert!(!t2.contains("../evil"));
        t2.remove("abc123");
        assert!(t2.is_empty());
        assert!(Terminated::open(Some(dir.path().to_path_buf())).is_empty());
    }

    /// Issue #37: a mark is written like kubelet's checkpoints — a temporary file, fsynced,
    /// renamed, the directory fsynced — so no reader ever sees half a mark, and one a crash
    /// left half-written (the temporary file) is neither loaded nor kept.
    #[tokio::test]
    async fn a_mark_is_written_durably_through_a_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let t = Terminated::open(Some(dir.path().to_path_buf()));
        t.insert("abc123", "sb1").await;
        let marks = dir.path().join("terminated");
        assert_eq!(std::fs::read(marks.join("abc123")).unwrap(), b"sb1");
        let names: Vec<String> = std::fs::read_dir(&marks)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["abc123".to_string()], "no temporary file left");

        // A crash between the write and the rename.
        std::fs::write(marks.join(format!("fed987{TMP_SUFFIX}")), b"sb").unwrap();
        let t2 = Terminated::open(Some(dir.path().to_path_buf()));
        assert!(!t2.contains("fed987"));
        assert!(!marks.join(format!("fed987{TMP_SUFFIX}")).exists());

        // A write that fails says where, and leaves nothing behind.
        let gone = dir.path().join("gone");
        let e = write_durably(&gone, "abc123", b"sb1").unwrap_err();
        assert!(matches!(e, MarkError::Write { .. }), "{e}");
        assert!(e.to_string().contains("gone/abc123"), "{e}");
        // The mark still holds in memory when the disk refuses it.
        let other = tempfile::tempdir().unwrap();
        let t3 = Terminated::open(Some(other.path().to_path_buf()));
        std::fs::remove_dir(other.path().join("terminated")).unwrap();
        t3.insert("abc123", "sb1").await;
        assert!(t3.contains("abc123"));
    }

    /// Marks are kept by sandbox: RemovePodSandbox drops them with it; a mark from before crisp
    /// kept sandboxes may be any sandbox's until the prune learns its own.
    #[tokio::test]
    async fn marks_are_kept_by_sandbox() {
        let dir = tempfile::tempdir().unwrap();
        let t = Terminated::open(Some(dir.path().to_path_buf()));
        t.insert("a1", "sba").await;
        t.insert("a2", "sba").await;
        t.insert("b1", "sbb").await;
        t.remove_sandbox("sba");
        assert!(!t.contains("a1") && !t.contains("a2") && t.contains("b1"));
        assert!(!t.may_have_sandbox("sba"));
        assert!(!dir.path().join("terminated/a1").exists());

        std::fs::write(dir.path().join("terminated/old1"), b"").unwrap();
        let t = Terminated::open(Some(dir.path().to_path_buf()));
        assert!(t.may_have_sandbox("any"), "an older mark may be any sandbox's");
        let pruned = t.prune(|id| match id {
            "old1" => Some("sbo".to_string()),
            _ => None,
        });
        assert_eq!(pruned, 1, "b1's container is gone");
        assert!(!t.may_have_sandbox("any"));
        assert!(t.may_have_sandbox("sbo"));
        assert_eq!(
            std::fs::read(dir.path().join("terminated/old1")).unwrap(),
            b"sbo",
            "learnt, and written back"
        );
        assert!(!t.prune_pending(), "pruned once");
    }
}
