//! StopPodSandbox: the stop order survives kubelet's error path (DESIGN.md §4.2). For a pod with
//! sidecars it is held while an app still runs; then crisp stops the apps kubelet never stopped
//! and the sidecars still running, in reverse declared order, within what is left of the pod's
//! grace budget (§4.3), and forwards it. It is kept as an intent until answered (`intents.rs`):
//! a restarted crisp carries out one its death dropped (`reconcile.rs`).

use std::time::Instant;

use super::decide::{self, Snapshot};
use super::holds;
use super::intents::{self, Intent, Kind};
use super::{now, record_span, Engine, Pod};
use crate::cri::views::{self, state};
use crate::cri::ApiVersion;
use crate::hold_events::HoldOutcome;
use crate::intercept::{Call, Verdict};
use crate::tenant;

impl Engine {
    /// StopPodSandbox force-kills whatever still runs (CRI contract). kubelet sends it after
    /// every StopContainer returned — including ones that *failed*, e.g. because crisp restarted
    /// while holding a sidecar's stop (KUBELET-CRI §7.4). So for pods with sidecars it is held
    /// while an app still runs, and the remaining sidecars are then stopped in reverse order
    /// before it is forwarded: the order survives kubelet's error path.
    pub(super) async fn gate_stop_sandbox(&self, call: &Call, msg: &[u8]) -> Verdict {
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
        let budget_end = pod.budget_end();
        // Kept until answered: a crisp that dies holding it (or forwarding it) carries it out
        // at its next start, in the same order (`intents.rs`).
        let intent = Intent {
            kind: Kind::StopSandbox,
            sandbox_id: pod.sandbox_id.clone(),
            container_id: String::new(),
            name: String::new(),
            sent_ms: intents::wall_of(arrived),
            hold_until_ms: intents::wall_of(hold_until),
            budget_end_ms: budget_end.map_or(0, intents::wall_of),
            timeout: 0,
        };
        self.keep_call(call, &pod, intent).await;
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
                Ok(Some(containers)) => containers,
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
                .filter(|container| container.state == state::RUNNING)
                .collect();
            let at = now();
            if Snapshot::new(&running).running_apps(&pod.policy).is_empty() || at >= hold_until {
                break running;
            }
            let waiting = holds::Waiting {
                on: "apps".into(),
                reason: format!(
                    "running: {}",
                    tenant::name_list(Snapshot::new(&running).running_apps(&pod.policy))
                ),
                ..Default::default()
            };
            match held.as_mut() {
                Some(hold) => hold.update(waiting),
                None => {
                    tracing::info!("holding StopPodSandbox until the pod's app containers exit");
                    held = Some(holds::Hold::start(
                        self, &pod, call, "", "", arrived, hold_until, "", waiting,
                    ));
                }
            }
            last = Some(running);
            tokio::time::sleep_until((at + self.cfg.probe_interval).min(hold_until).into()).await;
        };
        if let Some(hold) = held {
            self.metrics
                .stop_holds
                .observe(now().saturating_duration_since(hold.since).as_secs_f64());
            hold.end(HoldOutcome::Forwarded, "");
        }
        self.stop_before_sandbox(version, &running, &pod, budget_end)
            .await;
        Verdict::Forward
    }

    /// What StopPodSandbox must find stopped, stopped in order: the apps kubelet never stopped
    /// (with [`decide::STOP_TAIL`]), then the sidecars in reverse declared order with what is
    /// left of the pod's budget. `running`: the pod's containers as last listed.
    pub(super) async fn stop_before_sandbox(
        &self,
        version: ApiVersion,
        running: &[views::Container],
        pod: &Pod,
        budget_end: Option<Instant>,
    ) {
        for (name, id) in decide::sandbox_stop_apps(&pod.policy, running) {
            tracing::info!(
                container_name = %name,
                "stopping app before the sidecars and StopPodSandbox (kubelet's StopContainer never came)"
            );
            if let Err(e) = self
                .runtime
                .stop_container(version, id, decide::STOP_TAIL.as_secs() as i64)
                .await
            {
                tracing::warn!(
                    container_name = %name,
                    error = %e,
                    "could not stop app; StopPodSandbox will"
                );
            }
        }
        for (name, id) in decide::sandbox_stop_order(&pod.policy, running) {
            let secs = decide::budget_secs(budget_end, now());
            tracing::info!(
                container_name = %name,
                "stopping sidecar before StopPodSandbox (reverse order)"
            );
            if let Err(e) = self.runtime.stop_container(version, id, secs).await {
                tracing::warn!(
                    container_name = %name,
                    error = %e,
                    "could not stop sidecar; StopPodSandbox will"
                );
            }
        }
    }
}
