//! StopContainer: sidecars last (DESIGN.md §4). An app's stop is forwarded at once (§4.1); a
//! sidecar's is held while an app of the pod, or a sidecar declared after it, still runs, so
//! sidecars stop in reverse declared order (§4.2); each is forwarded with what is left of the
//! pod's one grace budget (§4.3). preStop hooks stay kubelet's (§4.4): only the SIGTERM waits.
//! A repeated stop is judged afresh (§4.5).

use std::time::Instant;

use super::decide::{self, Snapshot, StopStep};
use super::holds;
use super::intents::{self, Intent, Kind};
use super::{now, record_span, Engine, Pod};
use crate::cri::patch::append_varint_field;
use crate::cri::tags;
use crate::cri::views;
use crate::cri::ApiVersion;
use crate::hold_events::HoldOutcome;
use crate::intercept::{Call, Verdict};
use crate::tenant;

impl Engine {
    /// The gate of StopContainer: an app's forwarded at once, a sidecar's held (see the
    /// module's rules), then forwarded with what is left of the pod's budget.
    pub(super) async fn gate_stop(&self, call: &Call, msg: &[u8]) -> Verdict {
        let version = call.route.version.unwrap_or(ApiVersion::V1);
        let Ok(req) = views::decode::<views::ContainerIdRequest>(msg) else {
            tracing::warn!("cannot decode a copy of StopContainerRequest; forwarding it unordered");
            return Verdict::Forward;
        };
        let Some(container) = self.container_ref(version, &req.container_id).await else {
            return Verdict::Forward;
        };
        let Some(pod) = self.pod_by_id(version, &container.sandbox_id).await else {
            return Verdict::Forward;
        };
        record_span(&pod, &container.name, Some(&req.container_id));
        if !pod.policy.has_sidecars() {
            return Verdict::Forward;
        }
        let arrived = now();
        // The pod's terminationGracePeriodSeconds: any int64, bounded here where it enters.
        let grace = decide::grace_from_secs(req.timeout);
        let sidecar = pod.policy.sidecar_index(&container.name);
        let is_app = sidecar.is_none() && !pod.policy.is_native(&container.name);
        let budget_end = pod.note_stop(arrived, grace, &req.container_id, is_app);
        let stop = KeptStop {
            name: &container.name,
            container_id: &req.container_id,
            arrived,
            budget_end,
            timeout: req.timeout,
        };
        // An app's stop is forwarded at once (§4.1), and so is a native sidecar's: kubelet
        // stops those after the apps by itself. Kept until answered all the same: a held
        // sidecar stop waits for these apps, and kubelet may never send either again if crisp
        // dies before the answer (`intents.rs`).
        let Some(sidecar) = sidecar else {
            self.keep_stop(call, &pod, &stop, None).await;
            return Verdict::Forward;
        };
        // The hold ends before kubelet's deadline, and never past kubelet's own bound for the
        // pod's termination (KUBELET-CRI §3.2): an app's preStop is waited for at most the grace
        // period, then its StopContainer carries the whole grace again, so no app kubelet stops
        // outlives twice the grace from the first stop. An app still running then is not being
        // stopped by kubelet: holding on would only spend time kubelet never gave, at node
        // shutdown beyond its shutdown manager's shortened period.
        let hold_until = decide::stop_hold_end(arrived, grace, call.deadline)
            .min(decide::later(budget_end, grace));
        // Kept before it is held: a crisp that dies holding it carries it out at its next
        // start, in the same order, by the same end (`intents.rs`).
        self.keep_stop(call, &pod, &stop, Some(hold_until)).await;
        let window = SidecarStop {
            sidecar,
            arrived,
            hold_until,
            single_kill_after: decide::single_kill_after(arrived, grace),
        };
        self.hold_sidecar_stop(
            call,
            version,
            &pod,
            &container.name,
            &req.container_id,
            window,
        )
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
            arrived,
            hold_until,
            ..
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
            let containers = without_native_sidecars(pod, containers);
            let (at, step) = window.step(pod, &containers, pod.apps_stopping());
            match step {
                StopStep::Forward => break,
                StopStep::SingleKill => {
                    tracing::info!(
                        container_name = %name,
                        "no app container of the pod is being stopped: a single-container kill; forwarding"
                    );
                    break;
                }
                StopStep::Deadline { apps, sidecars } => {
                    tracing::warn!(
                        container_name = %name,
                        apps = %tenant::name_list(apps.iter().copied()),
                        sidecars = %tenant::name_list(sidecars.iter().copied()),
                        "still running at kubelet's deadline or twice the grace period; stopping the sidecar anyway"
                    );
                    break;
                }
                StopStep::Hold { apps, sidecars } => {
                    let waiting = holds::Waiting {
                        on: "apps".into(),
                        reason: format!(
                            "running: {}",
                            tenant::name_list(apps.iter().chain(&sidecars).copied())
                        ),
                        ..Default::default()
                    };
                    match held.as_mut() {
                        Some(hold) => hold.update(waiting),
                        None => {
                            tracing::info!(
                                container_name = %name,
                                apps = %tenant::name_list(apps.iter().copied()),
                                sidecars = %tenant::name_list(sidecars.iter().copied()),
                                "holding sidecar StopContainer until these exit"
                            );
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
            tokio::time::sleep_until((at + self.cfg.probe_interval).min(hold_until).into()).await;
        }
        if let Some(hold) = held {
            let held_for = now().saturating_duration_since(hold.since);
            self.metrics.stop_holds.observe(held_for.as_secs_f64());
            tracing::info!(
                container_name = %name,
                held_ms = held_for.as_millis() as u64,
                "forwarding sidecar StopContainer"
            );
            hold.end(HoldOutcome::Forwarded, "");
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
            Ok(Some(Ok(containers))) => Some(containers),
            Ok(Some(Err(e))) => {
                tracing::warn!(
                    error = %e,
                    "cannot list the pod's containers; forwarding StopContainer"
                );
                None
            }
            Ok(None) | Err(_) => {
                tracing::warn!(
                    container_name = %name,
                    "the runtime did not list the pod's containers before kubelet's deadline; forwarding StopContainer"
                );
                None
            }
        }
    }
}

impl Engine {
    /// Keeps a StopContainer of a pod with sidecars as an intent (one durable write) until it
    /// is answered (`on_complete`); `hold_until`: a sidecar's, held until then at most. A stop
    /// that cannot be kept (a state directory that refuses it, the cap) goes on as before, not
    /// surviving a crisp restart: said and counted.
    async fn keep_stop(
        &self,
        call: &Call,
        pod: &Pod,
        stop: &KeptStop<'_>,
        hold_until: Option<Instant>,
    ) {
        let intent = Intent {
            kind: if hold_until.is_some() {
                Kind::HeldStop
            } else {
                Kind::Stop
            },
            sandbox_id: pod.sandbox_id.clone(),
            container_id: stop.container_id.to_string(),
            name: if tenant::is_dns1123_label(stop.name) {
                stop.name.to_string()
            } else {
                String::new()
            },
            sent_ms: intents::wall_of(stop.arrived),
            hold_until_ms: hold_until.map_or(0, intents::wall_of),
            budget_end_ms: intents::wall_of(stop.budget_end),
            timeout: stop.timeout.clamp(0, decide::MAX_GRACE.as_secs() as i64),
        };
        self.keep_call(call, pod, intent).await;
    }

    /// Keeps `call` (a StopContainer or StopPodSandbox of `pod`) as `intent` until it is
    /// answered (`on_complete`). One that cannot be kept goes on as before, not surviving a
    /// crisp restart: said and counted.
    pub(super) async fn keep_call(&self, call: &Call, pod: &Pod, intent: Intent) {
        let key = intent.key();
        let token = self.intents.token();
        let (kind, container_name) = (intent.kind, intent.name.clone());
        // Before the write: a call kubelet drops during it still releases the intent.
        self.stop_calls.insert(call.id, (key, token));
        match self.intents.keep(intent, token).await {
            Ok(()) => {
                self.metrics.intents_kept.inc();
            }
            Err(intents::KeepError::Invalid) => {
                let _ = self.stop_calls.remove(&call.id);
            }
            Err(e) => {
                let _ = self.stop_calls.remove(&call.id);
                self.metrics.intent_write_errors.inc();
                let rpc = if kind == Kind::StopSandbox {
                    "StopPodSandbox"
                } else {
                    "StopContainer"
                };
                tracing::warn!(
                    pod_namespace = %pod.namespace,
                    pod_name = %pod.name,
                    container_name = %container_name,
                    rpc,
                    error = %e,
                    "cannot keep the call as an intent; it will not survive a crisp restart"
                );
            }
        }
    }
}

/// A StopContainer as [`Engine::keep_stop`] keeps it.
struct KeptStop<'a> {
    name: &'a str,
    container_id: &'a str,
    arrived: Instant,
    budget_end: Instant,
    timeout: i64,
}

/// The pod's containers less the native sidecars no annotation names: init containers (named
/// so, or let through as such because kubelet came straight back to them, `init_guess.rs`)
/// still running at a stop. A plain init container has exited before kubelet creates any
/// regular container, so a running one is restartable, and kubelet stops those only after every
/// regular container has stopped — a legacy sidecar's stop that waited for one as for an app
/// would wait out the pod's budget (issue #34's mixed pod: 13.2 s of a 15 s grace). After a
/// crisp restart the judgement is gone and such a sidecar is waited for as before.
pub(super) fn without_native_sidecars(
    pod: &Pod,
    mut containers: Vec<views::Container>,
) -> Vec<views::Container> {
    containers.retain(|c| {
        let name = c.metadata.as_ref().map_or("", |m| m.name.as_str());
        pod.policy.sidecar_index(name).is_some() || !pod.is_init(name)
    });
    containers
}

/// The time a sidecar's StopContainer may be held (see [`Engine::hold_sidecar_stop`]).
pub(super) struct SidecarStop {
    /// The sidecar's place in the pod's list.
    pub(super) sidecar: usize,
    pub(super) arrived: Instant,
    pub(super) hold_until: Instant,
    /// No app is being stopped by then: a single-container kill (liveness), forwarded.
    pub(super) single_kill_after: Instant,
}

impl SidecarStop {
    /// The hold's next step, read now from the pod's `containers` as the runtime listed them
    /// (its native sidecars left out): when it was read, and the step.
    pub(super) fn step<'a>(
        &self,
        pod: &'a Pod,
        containers: &'a [views::Container],
        apps_stopping: bool,
    ) -> (Instant, StopStep<'a>) {
        let snapshot = Snapshot::new(containers);
        let at = now();
        let step = decide::stop_step(
            &pod.policy,
            self.sidecar,
            &snapshot,
            at,
            self.hold_until,
            self.single_kill_after,
            apps_stopping,
        );
        (at, step)
    }
}
