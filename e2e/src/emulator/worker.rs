//! Pod workers (`pod_workers.go`): one task per pod, strictly serial, with the newest pending
//! update parked while a sync runs (KUBELET-CRI §7.1), and kubelet's `syncPod`,
//! `syncTerminatingPod` and `syncTerminatedPod`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::config::KubeletVersion;
use super::kubelet::{Inner, PodEntry, WorkType};
use super::rand::jitter;
use super::runtime::{PodCtx, RunningPod, ERR_CRASH_LOOP_BACK_OFF, ERR_IMAGE_PULL_BACK_OFF};
use super::status::{
    generate_api_pod_status, terminate_pod_status, ApiPodStatus, CriState, RuntimePodStatus,
    StatusInputs,
};

/// `NetworkNotReadyErrorMsg` (KUBELET-CRI §1.3).
pub const NETWORK_NOT_READY: &str = "network is not ready";

/// How a pod-worker run ended.
enum Outcome {
    /// Sync finished; `true` = the pod is terminal (move to terminating).
    Synced(bool),
    /// Terminating finished: all containers stopped.
    Terminating,
    /// Terminated finished: the worker is done.
    Terminated,
}

// === impl Inner (pod workers) ===

impl Inner {
    /// `managePodLoop` / `podWorkerLoop`.
    pub(crate) async fn pod_worker(self: Arc<Self>, entry: Arc<PodEntry>) {
        let mut stop = self.shutdown.subscribe();
        let mut last_sync: Option<Instant> = None;
        loop {
            // Take the newest pending update, or wait for one. The update carries the pod object as
            // it was when the update was made: a deletion arriving later is not seen by this run.
            let (work, ctx) = loop {
                let taken = entry.lock().pending.take();
                if let Some(w) = taken {
                    break (w, self.pod_ctx(&entry));
                }
                tokio::select! {
                    _ = entry.notify.notified() => {}
                    _ = stop.changed() => return,
                }
            };

            // Wait for a PLEG refresh that started after our previous run (KUBELET-CRI §4.1).
            let cached = tokio::select! {
                c = self.cache.get_newer_than(&entry.uid, last_sync) => c,
                _ = stop.changed() => return,
            };

            let outcome = match cached.err {
                Some(e) => Err(format!("error determining status: {e}")),
                None => match work {
                    WorkType::Sync => self
                        .sync_pod(&entry, &ctx, &cached.status)
                        .await
                        .map(Outcome::Synced),
                    WorkType::Terminating => self
                        .sync_terminating_pod(&entry, &ctx, &cached.status)
                        .await
                        .map(|_| Outcome::Terminating),
                    WorkType::Terminated => self
                        .sync_terminated_pod(&entry, &ctx, &cached.status)
                        .await
                        .map(|_| Outcome::Terminated),
                },
            };
            last_sync = Some(Instant::now());

            let (phase_transition, err) = {
                let mut st = entry.lock();
                st.syncs += 1;
                match &outcome {
                    Ok(Outcome::Synced(true)) => {
                        // completeSync: the pod is terminal, terminate it next.
                        st.terminating = true;
                        entry.termination_requested.store(true, Ordering::SeqCst);
                        st.pending = Some(WorkType::Terminating);
                        st.last_error = None;
                        (true, None)
                    }
                    Ok(Outcome::Synced(false)) => {
                        st.last_error = None;
                        (false, None)
                    }
                    Ok(Outcome::Terminating) => {
                        // completeTerminating: only terminated work follows.
                        st.terminated = true;
                        st.pending = Some(WorkType::Terminated);
                        st.last_error = None;
                        (true, None)
                    }
                    Ok(Outcome::Terminated) => {
                        st.finished = true;
                        st.pending = None;
                        st.last_error = None;
                        (false, None)
                    }
                    Err(e) => {
                        st.last_error = Some(e.clone());
                        (false, Some(e.clone()))
                    }
                }
            };
            let pod_key = entry.lock().spec.key();
            if let Some(e) = &err {
                tracing::info!(pod = %pod_key, "error syncing pod, skipping: {e}");
                self.journal
                    .note(Some(pod_key.clone()), format!("sync error: {e}"));
            }
            self.publish(&entry);
            if matches!(outcome, Ok(Outcome::Terminated)) {
                self.journal.note(Some(pod_key), "pod terminated");
                return;
            }
            self.complete_work(&entry.uid, phase_transition, err.as_deref());
        }
    }

    /// `completeWork`: requeue in the work queue (KUBELET-CRI §1.3). The pending update, if any, is
    /// picked up by the worker loop right away.
    fn complete_work(&self, uid: &str, phase_transition: bool, err: Option<&str>) {
        let f = self.cfg.jitter_factor;
        let delay = match err {
            _ if phase_transition => std::time::Duration::ZERO,
            None => jitter(self.cfg.resync_interval, f),
            Some(e) if e.contains(NETWORK_NOT_READY) => {
                jitter(self.cfg.network_not_ready_backoff, f)
            }
            Some(_) => jitter(self.cfg.error_backoff, f),
        };
        let mut q = self.work_queue.lock().unwrap_or_else(|p| p.into_inner());
        q.insert(uid.to_string(), Instant::now() + delay);
    }

    fn pod_ctx(&self, entry: &PodEntry) -> PodCtx {
        let st = entry.lock();
        PodCtx {
            spec: st.spec.clone(),
            deletion_requested: st.deleted,
            deletion_grace: st.deletion_grace,
            termination_requested: entry.termination_requested.clone(),
            restored: st.restored,
        }
    }

    /// `generateAPIPodStatus` + `statusManager.SetPodStatus`.
    fn set_status(
        &self,
        entry: &PodEntry,
        ctx: &PodCtx,
        status: &RuntimePodStatus,
        pod_is_terminal: bool,
    ) -> ApiPodStatus {
        let api = {
            let mut st = entry.lock();
            let api = generate_api_pod_status(
                &StatusInputs {
                    pod: &ctx.spec,
                    deletion_requested: ctx.deletion_requested,
                    old: &st.api_status,
                    reasons: &st.reasons,
                    pod_is_terminal,
                    version: self.cfg.version,
                },
                status,
            );
            if api.phase != st.api_status.phase {
                self.journal
                    .note(Some(st.spec.key()), format!("phase {:?}", api.phase));
            }
            st.api_status = api.clone();
            api
        };
        self.publish(entry);
        api
    }

    /// kubelet's `syncPod`: status, terminal check, network check, then the runtime's SyncPod.
    /// Returns whether the pod is terminal.
    async fn sync_pod(
        &self,
        entry: &PodEntry,
        ctx: &PodCtx,
        status: &RuntimePodStatus,
    ) -> Result<bool, String> {
        let api = self.set_status(entry, ctx, status, false);
        if api.phase.is_terminal() {
            return Ok(true);
        }
        // Non-host-network pods wait for the runtime's NetworkReady (KUBELET-CRI §1.3).
        if !ctx.spec.host_network {
            if let Some(e) = self.network_error() {
                return Err(format!("{NETWORK_NOT_READY}: {e}"));
            }
        }
        let result = self.rt.sync_pod(ctx, status).await;
        {
            // reasonCache.Update: StartContainer results only.
            let mut st = entry.lock();
            for r in result
                .results
                .iter()
                .filter(|r| r.action == super::runtime::SyncAction::StartContainer)
            {
                match r.error {
                    Some(e) => {
                        st.reasons
                            .insert(r.target.clone(), (e.to_string(), r.message.clone()));
                    }
                    None => {
                        st.reasons.remove(&r.target);
                    }
                }
            }
        }
        let Some(err) = result.error() else {
            return Ok(false);
        };
        // "Do not return error if the only failures were pods in backoff" — but the loop runs over
        // *every* result, successful ones included, so in practice any sync that got as far as
        // ConfigPodSandbox returns the back-off error too (kubelet.go: syncPod).
        let only_backoff = result.results.iter().all(|r| {
            matches!(
                r.error,
                Some(ERR_CRASH_LOOP_BACK_OFF) | Some(ERR_IMAGE_PULL_BACK_OFF)
            )
        });
        if only_backoff {
            return Ok(false);
        }
        Err(err)
    }

    /// `syncTerminatingPod` (KUBELET-CRI §3.1): kill from the cached status, then a fresh
    /// `GetPodStatus` must show nothing RUNNING.
    async fn sync_terminating_pod(
        &self,
        entry: &PodEntry,
        ctx: &PodCtx,
        status: &RuntimePodStatus,
    ) -> Result<(), String> {
        self.set_status(entry, ctx, status, false);
        let grace_override = {
            let st = entry.lock();
            // The deletion path always passes an override (KUBELET-CRI §3.2); a pod that turned
            // terminal on its own has none.
            if st.deleted && st.grace > 0 {
                Some(st.grace)
            } else {
                None
            }
        };
        let running = RunningPod::from_status(status);
        let result = self
            .rt
            .kill_pod_with_sync_result(ctx, &running, grace_override)
            .await;
        if let Some(e) = result.error() {
            return Err(e);
        }
        let fresh = self
            .rt
            .get_pod_status(&ctx.spec.uid, &ctx.spec.name, &ctx.spec.namespace)
            .await?;
        let still: Vec<String> = fresh
            .containers
            .iter()
            .filter(|c| c.state == CriState::Running)
            .map(|c| format!("containerd://{}", c.id))
            .collect();
        if !still.is_empty() {
            return Err(format!(
                "detected running containers after a successful KillPod, CRI violation: {still:?}"
            ));
        }
        if self.cfg.version >= KubeletVersion::V1_27 {
            // 1.27: the status after the kill, with podIsTerminal (KUBELET-CRI §4.3).
            self.set_status(entry, ctx, &fresh, true);
        }
        Ok(())
    }

    /// `syncTerminatedPod`: final status, then the status manager's `TerminatePod`.
    async fn sync_terminated_pod(
        &self,
        entry: &PodEntry,
        ctx: &PodCtx,
        status: &RuntimePodStatus,
    ) -> Result<(), String> {
        let terminal = self.cfg.version >= KubeletVersion::V1_27;
        self.set_status(entry, ctx, status, terminal);
        {
            let mut st = entry.lock();
            let old_phase = st.api_status.phase;
            terminate_pod_status(&mut st.api_status, self.cfg.version);
            if st.api_status.phase != old_phase {
                self.journal.note(
                    Some(st.spec.key()),
                    format!("phase {:?}", st.api_status.phase),
                );
            }
        }
        Ok(())
    }
}
