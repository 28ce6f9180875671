//! The intents a crisp found at start (`intents.rs`), reconciled with the runtime before it
//! serves: a kept stop whose container still runs is carried out — a held sidecar stop after
//! the pod's apps (and the sidecars declared after it) have exited, by the hold's own end, with
//! what is left of the pod's grace; a forwarded stop at once — and a kept stop whose container
//! no longer runs is dropped. A kept StopPodSandbox whose sandbox is still ready is carried out
//! the way the gate would have: after the apps (by the hold's end), the sidecars in reverse,
//! then the sandbox. A create hold's clock needs no action (the gate reads it); one of a
//! sandbox the runtime no longer has is dropped.

use std::collections::HashMap;
use std::time::Duration;

use super::decide::{self, Snapshot, StopStep};
use super::intents::{self, Intent, Kind};
use super::stop::{without_native_sidecars, SidecarStop};
use super::{now, Engine};
use crate::cri::views::{self, state};
use crate::cri::ApiVersion;

/// The reconcile asks a runtime that does not answer again after this, then twice as late,
/// up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// `PodSandboxState.SANDBOX_READY`.
const SANDBOX_READY: i32 = 0;

impl Engine {
    /// Reconciles the intents found at start with the runtime (see the module); ends once
    /// every kept stop is carried out or dropped. [`Engine::intents_reconciled`] resolves once
    /// the runtime has been read and each stop's carrying out has begun.
    pub(super) async fn reconcile_intents(&self, version: ApiVersion) {
        let stops = self.intents.take_loaded();
        let creates = self.intents.create_sandboxes();
        if stops.is_empty() && creates.is_empty() {
            self.reconciled.cancel();
            return;
        }
        let running = if stops.is_empty() {
            HashMap::new()
        } else {
            self.running_containers(version).await
        };
        for sandbox in creates {
            match self.runtime.pod_sandbox_status(version, &sandbox).await {
                Err(e) if e.is_not_found() => self.intents.forget_sandbox(&sandbox),
                _ => {}
            }
        }
        let mut carried = 0;
        for (key, intent, token) in stops {
            if intent.kind == Kind::StopSandbox {
                let Some(engine) = self.me.upgrade() else {
                    break;
                };
                carried += 1;
                self.spawn(async move {
                    engine
                        .carry_out_sandbox_stop(version, key, intent, token)
                        .await
                });
                continue;
            }
            if running.get(&intent.container_id) != Some(&state::RUNNING) {
                // Stopped (by kubelet's answered call, or crisp's before it died) or gone.
                self.intents.done(&key, token);
                continue;
            }
            let Some(engine) = self.me.upgrade() else {
                break;
            };
            carried += 1;
            self.spawn(async move { engine.carry_out_stop(version, key, intent, token).await });
        }
        tracing::info!(
            stops = carried,
            "reconciled the held calls kept before crisp restarted"
        );
        self.reconciled.cancel();
    }

    /// Resolves once the intents found at start are reconciled with the runtime (the daemon
    /// waits for it, bounded, before it serves).
    pub async fn intents_reconciled(&self) {
        self.reconciled.cancelled().await;
    }

    /// Every container of the node by id, with its state; asked again (less and less often)
    /// while the runtime does not answer.
    async fn running_containers(&self, version: ApiVersion) -> HashMap<String, i32> {
        let mut wait = RETRY_MIN;
        loop {
            let listed = {
                let _read = self.reads.read(None).await;
                self.runtime.list_all_containers(version).await
            };
            match listed {
                Ok(containers) => {
                    return containers
                        .into_iter()
                        .map(|container| (container.id, container.state))
                        .collect()
                }
                Err(e) => {
                    tracing::info!(
                        error = %e,
                        "cannot list the runtime's containers; kept stops wait for it"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Carries out one kept stop whose container still runs, then drops its intent — unless
    /// kubelet's retry of the same stop took it over meanwhile (that call is judged and
    /// forwarded as usual, and its end drops the intent).
    async fn carry_out_stop(&self, version: ApiVersion, key: String, intent: Intent, token: u64) {
        if intent.kind == Kind::HeldStop {
            self.wait_for_apps(version, &intent).await;
        }
        if !self.intents.owns(&key, token) {
            return;
        }
        let budget_end = intents::instant_of(intent.budget_end_ms);
        let secs =
            decide::stop_timeout(budget_end, now(), intent.timeout).unwrap_or(intent.timeout);
        match self
            .runtime
            .stop_container(version, &intent.container_id, secs)
            .await
        {
            Ok(()) => {
                self.metrics.intents_replayed.inc();
                tracing::info!(
                    container_id = %intent.container_id,
                    container_name = %intent.name,
                    timeout_secs = secs,
                    "carried out a StopContainer kept from before crisp restarted"
                );
                self.intents.done(&key, token);
            }
            // Kept: the next start tries again (a stop of a stopped container is a no-op).
            Err(e) => tracing::warn!(
                container_id = %intent.container_id,
                error = %e,
                "cannot carry out a StopContainer kept from before crisp restarted"
            ),
        }
    }

    /// Carries out one kept StopPodSandbox whose sandbox is still ready: the hold resumed
    /// (until the pod's apps have exited, or the hold's end), the apps and sidecars still
    /// running stopped in order, then the sandbox — unless kubelet's retry took it over.
    async fn carry_out_sandbox_stop(
        &self,
        version: ApiVersion,
        key: String,
        intent: Intent,
        token: u64,
    ) {
        let status = self
            .runtime
            .pod_sandbox_status(version, &intent.sandbox_id)
            .await;
        let ready = match status {
            Ok(status) => status.status.is_some_and(|s| s.state == SANDBOX_READY),
            Err(e) if e.is_not_found() => false,
            // Not answered: kept, the next start tries again.
            Err(e) => {
                tracing::warn!(
                    pod_sandbox_id = %intent.sandbox_id,
                    error = %e,
                    "cannot read a sandbox whose StopPodSandbox was kept before crisp restarted"
                );
                return;
            }
        };
        if !ready {
            // Stopped (kubelet's answered call, or the runtime finished it) or removed.
            self.intents.done(&key, token);
            return;
        }
        let budget_end =
            (intent.budget_end_ms != 0).then(|| intents::instant_of(intent.budget_end_ms));
        if let Some(pod) = self.pod_by_id(version, &intent.sandbox_id).await {
            let running = self
                .apps_exited_or(version, &pod, intents::instant_of(intent.hold_until_ms))
                .await;
            if !self.intents.owns(&key, token) {
                return;
            }
            self.stop_before_sandbox(version, &running, &pod, budget_end)
                .await;
        }
        if !self.intents.owns(&key, token) {
            return;
        }
        match self
            .runtime
            .stop_pod_sandbox(version, &intent.sandbox_id)
            .await
        {
            Ok(()) => {
                self.metrics.intents_replayed.inc();
                tracing::info!(
                    pod_sandbox_id = %intent.sandbox_id,
                    "carried out a StopPodSandbox kept from before crisp restarted"
                );
                self.intents.done(&key, token);
            }
            Err(e) => tracing::warn!(
                pod_sandbox_id = %intent.sandbox_id,
                error = %e,
                "cannot carry out a StopPodSandbox kept from before crisp restarted"
            ),
        }
    }

    /// The pod's running containers once none of its apps runs, or at `until` (what ran when
    /// last listed; nothing if the runtime never answered).
    async fn apps_exited_or(
        &self,
        version: ApiVersion,
        pod: &super::Pod,
        until: std::time::Instant,
    ) -> Vec<views::Container> {
        let mut last = Vec::new();
        loop {
            let listed = {
                let read = self.reads.read(Some(until.into())).await;
                if read.is_err() {
                    return last;
                }
                tokio::time::timeout_at(
                    until.into(),
                    self.runtime.list_containers(version, &pod.sandbox_id),
                )
                .await
            };
            let Ok(Ok(containers)) = listed else {
                return last;
            };
            last = containers
                .into_iter()
                .filter(|container| container.state == state::RUNNING)
                .collect();
            let at = now();
            if Snapshot::new(&last).running_apps(&pod.policy).is_empty() || at >= until {
                return last;
            }
            tokio::time::sleep_until((at + self.cfg.probe_interval).min(until).into()).await;
        }
    }

    /// A held sidecar stop's hold, resumed: until nothing the sidecar must outlive runs, or
    /// the hold's end. The pod's stop window starts again from the intent, so a retry from
    /// kubelet shares its budget.
    async fn wait_for_apps(&self, version: ApiVersion, intent: &Intent) {
        let Some(pod) = self.pod_by_id(version, &intent.sandbox_id).await else {
            return;
        };
        let Some(sidecar) = pod.policy.sidecar_index(&intent.name) else {
            return;
        };
        let arrived = intents::instant_of(intent.sent_ms);
        let budget_end = intents::instant_of(intent.budget_end_ms);
        let hold_until = intents::instant_of(intent.hold_until_ms);
        let window = SidecarStop {
            sidecar,
            arrived,
            hold_until,
            single_kill_after: hold_until,
        };
        pod.note_stop(
            arrived,
            budget_end.saturating_duration_since(arrived),
            &intent.container_id,
            false,
        );
        loop {
            let listed = {
                let read = self.reads.read(Some(hold_until.into())).await;
                if read.is_err() {
                    return;
                }
                tokio::time::timeout_at(
                    hold_until.into(),
                    self.runtime.list_containers(version, &pod.sandbox_id),
                )
                .await
            };
            let Ok(Ok(containers)) = listed else {
                return; // The runtime does not answer by the hold's end: stop it now.
            };
            let containers = without_native_sidecars(&pod, containers);
            // The pod was being stopped (a held stop is kept only then): no single kill.
            let (at, step) = window.step(&pod, &containers, true);
            if !matches!(step, StopStep::Hold { .. }) {
                return;
            }
            tokio::time::sleep_until((at + self.cfg.probe_interval).min(hold_until).into()).await;
        }
    }
}
