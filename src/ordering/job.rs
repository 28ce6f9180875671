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
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::annotations::RestartPolicy;
use super::decide::{self, Snapshot};
use super::{now, Engine, Pod};
use crate::cri::views::state;
use crate::cri::ApiVersion;

const JOB_NAME_LABELS: [&str; 2] = ["batch.kubernetes.io/job-name", "job-name"];
const PRESTOP_ANNOTATION: &str = "io.kubernetes.container.preStopHandler";
const GRACE_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";
const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// The prune at start asks a runtime that does not answer again after this, then twice as late
/// each time, up to [`PRUNE_RETRY_MAX`].
const PRUNE_RETRY_MIN: Duration = Duration::from_secs(1);
const PRUNE_RETRY_MAX: Duration = Duration::from_secs(30);

mod marks;
pub use marks::Terminated;

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
        // A pod restarted in place runs its apps again: `Engine::start_over` watches it anew.
        pod.job_done.store(true, Relaxed);
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
        // No preStop hook and no stop unless marks can be written (see below).
        if let Err(e) = self.terminated.check_writable().await {
            self.mark_not_written(pod, &e);
            return;
        }
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
            // already see `Completed`. No stop without a mark on disk (issue #43 item 5): a
            // restarted crisp would not know it stopped the sidecar, kubelet would see its
            // 137/143, and the Job would fail. The sidecar keeps running instead; the watcher
            // is rebuilt at crisp's next start and tries again.
            if let Err(e) = self.terminated.insert(&container.id, &pod.sandbox_id).await {
                self.mark_not_written(pod, &e);
                return;
            }
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

    /// A mark could not be written: said, naming the pod, and counted; the Job's sidecars are
    /// left running.
    fn mark_not_written(&self, pod: &Pod, e: &marks::MarkError) {
        self.metrics.mark_write_errors.inc();
        tracing::error!(
            pod_namespace = %pod.namespace,
            pod_name = %pod.name,
            error = %e,
            "cannot write a terminated-sidecar mark to the state directory; not stopping the Job's sidecars (kubelet would see them killed after a crisp restart); see `crisp doctor`"
        );
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
mod tests;
