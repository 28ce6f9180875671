//! CreateContainer: sidecars first (DESIGN.md §3). An app's create is held until the sidecars
//! it waits for run and are ready (§3.2), refused at once while one is missing or not running
//! (§3.3), and released or failed at the start timeout by the pod's policy (§3.4); a hold that
//! lasts `refuse_held_after` ends as a refusal that says why. A held call kubelet gives up on is
//! dropped, never forwarded (§3.5). StartContainer is held only for a container crisp saw no
//! CreateContainer of (a restored pod's, KEP-5823, §3.6): by the same rules and window as its
//! create would have been; a container created through crisp is started as kubelet asks.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::annotations::Sidecar;
use super::decide::{self, Check, CreatePlan, Snapshot, WaitStep};
use super::holds;
use super::init_guess::Judgement;
use super::intents::{self, Intent, Kind};
use super::pod::{container_name, ContainerRef};
use super::probes::Probed;
use super::refusal::{self, Refusal, WaitingFor};
use super::{now, record_span, Engine, Pod};
use crate::config::TimeoutPolicy;
use crate::cri::views;
use crate::cri::ApiVersion;
use crate::hold_events::HoldOutcome;
use crate::intercept::{Call, Verdict};
use crate::status::Status;

impl Engine {
    /// One round of the start check (DESIGN.md §3): list the pod's containers, judge a
    /// container nothing names (see `init_guess.rs`), and ask [`decide::check_start`] — probing
    /// the sidecars it asks for, in declared order, until it has an answer. A sidecar in
    /// `judged_ready` (by name, with its container id) was found ready earlier in the same hold
    /// and is not probed again (issue #33: each round used to exec every ready sidecar again);
    /// a sidecar found ready now joins it.
    #[allow(clippy::too_many_arguments)]
    async fn check_start(
        &self,
        version: ApiVersion,
        pod: &Pod,
        container: &str,
        required: &[Sidecar],
        skip_dead: bool,
        again: Option<Instant>,
        judged_ready: &mut HashMap<String, String>,
    ) -> Check<'static> {
        let read = match self.read_again(again).await {
            Ok(read) => read,
            Err(e) => return Check::Waiting(WaitingFor::Runtime(e.to_string())),
        };
        let listed = self.runtime.list_containers(version, &pod.sandbox_id).await;
        // The read in flight is this list's only: the probes below wait for their own turns
        // (exec, connect) and must not keep the node's other reads waiting meanwhile.
        drop(read);
        let containers = match listed {
            Ok(containers) => containers,
            Err(e) => {
                self.metrics.probe_errors.inc();
                tracing::warn!(error = %e, "cannot list the pod's containers; still holding");
                return Check::Waiting(WaitingFor::Runtime(e.to_string()));
            }
        };
        let snapshot = Snapshot::new(&containers);
        // A sidecar by name needs no judgement (it can wait for a native sidecar before any of
        // the pod's own sidecars exists).
        if pod.policy.sidecar_index(container).is_none()
            && decide::needs_init_judgement(&pod.policy, &snapshot)
        {
            let judgement = pod.guess().judge(container);
            match judgement {
                Judgement::Init => {
                    tracing::info!(
                        container_name = %container,
                        "kubelet came straight back to this container: treating it as an init container"
                    );
                    return Check::Ready;
                }
                Judgement::Unknown => {
                    self.guessing
                        .insert(pod.annotations_fp, pod.sandbox_id.clone());
                }
                Judgement::Regular => {}
            }
            if !pod.guess().judging() {
                self.guessing.remove(&pod.annotations_fp);
            }
        }
        let refused = |name: &str| pod.refused_since.lock().contains_key(name);
        let mut probed = HashMap::new();
        loop {
            match decide::check_start(
                &pod.display(),
                required,
                &snapshot,
                skip_dead,
                refused,
                &probed,
            ) {
                Check::Probe {
                    sidecar,
                    container_id,
                } => {
                    let known = judged_ready.get(&sidecar.name) == Some(&container_id);
                    let probed_now = if known {
                        Probed::Ready
                    } else {
                        self.probe(version, pod, sidecar, &container_id).await
                    };
                    let ready = match probed_now {
                        Probed::Ready => true,
                        Probed::NotReady => false,
                        // Never probeable (an isolated pod's loopback): the pod's timeout
                        // policy now rather than at its start timeout — proceed counts the
                        // running sidecar as ready, fail refuses the create with the reason.
                        Probed::Unreachable(why) => match self.start_policy(pod).1 {
                            TimeoutPolicy::Proceed => true,
                            TimeoutPolicy::Fail => {
                                return Check::Refuse(Refusal::Unprobeable {
                                    sidecar: sidecar.name.clone(),
                                    why,
                                })
                            }
                        },
                    };
                    if ready && !known {
                        judged_ready.insert(sidecar.name.clone(), container_id);
                    }
                    probed.insert(sidecar.name.clone(), ready);
                }
                Check::Ready => return Check::Ready,
                Check::Waiting(who) => return Check::Waiting(who),
                Check::Refuse(why) => {
                    self.start_refusal_clock(version, pod, container, required, &snapshot)
                        .await;
                    return Check::Refuse(why);
                }
            }
        }
    }

    /// Starts the refusal clock of `container` (`Pod::refused_since`), unless it runs already.
    ///
    /// The clock counts from the first refusal, and must not restart with crisp (a crash-looping
    /// crisp would otherwise refuse the app for ever). When what the app waits for went wrong
    /// after this crisp started, this crisp saw every refusal: the clock starts now. When it
    /// went wrong before, an earlier crisp may have been refusing since: the clock starts when
    /// it went wrong, by the runtime's own record — the same for every crisp that asks — of the
    /// first required sidecar that does not run: when its newest instance exited (or was
    /// created, if it never started), or, for a sidecar never created, when the sandbox was.
    /// Its death rather than the sandbox's creation when there is one: the sandbox can be hours
    /// older (image pulls, a long life before a crash), and a sidecar kubelet re-creates moves
    /// the clock to its new instance, as a hold would wait for it (DESIGN.md §3.4).
    async fn start_refusal_clock(
        &self,
        version: ApiVersion,
        pod: &Pod,
        container: &str,
        required: &[Sidecar],
        snapshot: &Snapshot<'_>,
    ) {
        if pod.refused_since.lock().contains_key(container) {
            return;
        }
        let went_wrong = match decide::refusal_anchor(required, snapshot) {
            decide::RefusalAnchor::Sidecar { id, created_at } if self.before_start(created_at) => {
                self.sidecar_stopped_at(version, id).await
            }
            // Created since this crisp started: it saw all of it.
            decide::RefusalAnchor::Sidecar { .. } => None,
            decide::RefusalAnchor::Sandbox => self.sandbox_created_at(version, pod).await,
        };
        let at = now();
        let since = went_wrong
            .filter(|ns| self.before_start(*ns))
            .and_then(|ns| decide::instant_of_wall(ns, at, SystemTime::now()))
            .map_or(at, |went_wrong| went_wrong.min(at));
        pod.refused_since
            .lock()
            .entry(container.to_string())
            .or_insert(since);
    }

    /// Whether the runtime's timestamp `ns` is from before this crisp started.
    fn before_start(&self, ns: i64) -> bool {
        ns > 0 && SystemTime::UNIX_EPOCH + Duration::from_nanos(ns as u64) < self.started_wall
    }

    /// When a sidecar that does not run stopped running, as the runtime records it: its exit,
    /// or its creation if it never started.
    async fn sidecar_stopped_at(&self, version: ApiVersion, id: &str) -> Option<i64> {
        match self.runtime.container_status(version, id).await {
            Ok(answer) => {
                let status = answer.status?;
                Some(if status.finished_at > 0 {
                    status.finished_at
                } else {
                    status.created_at
                })
            }
            Err(e) => {
                tracing::debug!(
                    error = %e,
                    "cannot read when the sidecar stopped; the refusal clock starts now"
                );
                None
            }
        }
    }

    /// The sandbox's creation time as the runtime records it (read once, then kept).
    async fn sandbox_created_at(&self, version: ApiVersion, pod: &Pod) -> Option<i64> {
        let known = pod.created_at.load(Relaxed);
        if known > 0 {
            return Some(known);
        }
        let status = match self
            .runtime
            .pod_sandbox_status(version, &pod.sandbox_id)
            .await
        {
            Ok(answer) => answer.status?,
            Err(e) => {
                tracing::debug!(
                    error = %e,
                    "cannot read the sandbox's creation time; the refusal clock starts now"
                );
                return None;
            }
        };
        (status.created_at > 0).then(|| {
            pod.created_at.store(status.created_at, Relaxed);
            status.created_at
        })
    }

    /// The gate of CreateContainer: forwarded, held, or refused (see the module's rules).
    pub(super) async fn gate_create(&self, call: &Call, msg: &[u8]) -> Verdict {
        let version = call.route.version.unwrap_or(ApiVersion::V1);
        let Some((pod, name)) = self.create_target(version, msg).await else {
            return Verdict::Forward;
        };
        // The first create after all the pod's containers were removed: restarted in place.
        self.start_over(version, &pod);
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

    /// The gate of StartContainer (DESIGN.md §3.6). A container whose CreateContainer crisp saw
    /// answered went through the create gate: started at once. One crisp never saw created — a
    /// restored pod's (KEP-5823: its containers come back CREATED and kubelet only starts
    /// them) — is gated as its create would have been: the same plan, window and rules.
    pub(super) async fn gate_start(&self, call: &Call, msg: &[u8]) -> Verdict {
        let version = call.route.version.unwrap_or(ApiVersion::V1);
        let Ok(req) = views::decode::<views::ContainerIdRequest>(msg) else {
            tracing::warn!(
                "cannot decode a copy of StartContainerRequest; forwarding it unordered"
            );
            return Verdict::Forward;
        };
        if self
            .containers
            .get(&req.container_id)
            .is_some_and(|container| container.created_seen)
        {
            return Verdict::Forward;
        }
        let Some(container) = self.container_ref(version, &req.container_id).await else {
            return Verdict::Forward;
        };
        let Some(pod) = self.pod_by_id(version, &container.sandbox_id).await else {
            return Verdict::Forward;
        };
        let name = container.name;
        let required = match decide::plan_create(&pod.policy, &name) {
            CreatePlan::Forward => return Verdict::Forward,
            CreatePlan::Gate(required) => required,
        };
        record_span(&pod, &name, Some(&req.container_id));
        tracing::info!(
            container_name = %name,
            "StartContainer of a container crisp saw no CreateContainer of (a restored pod): ordering its start as its create"
        );
        let window = self.create_window(call, &pod, &name);
        self.hold_create(call, version, &pod, &name, required, window)
            .await
    }

    /// How long a CreateContainer may be held and whether dead sidecars are still waited for.
    fn create_window(&self, call: &Call, pod: &Pod, name: &str) -> CreateWindow {
        let (timeout, policy) = self.start_policy(pod);
        // A hold ended as a refusal (`refuse_held_after`) carries on in kubelet's retry: the
        // start timeout counts from the first hold, so refusals never extend it.
        // Nor do crisp's restarts (issue #43 item 2): the first hold's clock is kept as an
        // intent, and a restarted crisp carries on from it.
        let kept = || {
            self.intents
                .create_since(&pod.sandbox_id, name)
                .map(|ms| intents::instant_of(ms).min(call.received))
        };
        let held_from = pod
            .held_since
            .lock()
            .get(name)
            .copied()
            .or_else(kept)
            .unwrap_or(call.received);
        let hold_until = decide::create_hold_end(held_from, timeout, call.deadline);
        let refused_since = pod.refused_since.lock().get(name).copied();
        let skip_dead = decide::skip_dead(policy, refused_since, now(), timeout);
        if skip_dead {
            self.metrics.start_hold_timeouts.inc();
            let refused_for = refused_since
                .map(|since| now().saturating_duration_since(since))
                .unwrap_or_default();
            tracing::warn!(
                container_name = %name,
                refused_for_ms = refused_for.as_millis() as u64,
                "sidecars still not running after the start timeout; no longer waiting for them (policy proceed)"
            );
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
        let mut judged_ready = HashMap::new();
        let forget_refusal = || {
            pod.refused_since.lock().remove(name);
            pod.held_since.lock().remove(name);
            self.intents.forget_create(&pod.sandbox_id, name);
        };
        loop {
            // A slow runtime must not stretch the hold past its end (nor the forwarded call past
            // kubelet's deadline): a probe round still running then counts as "not ready".
            let check = match tokio::time::timeout_at(
                hold_until.into(),
                self.check_start(
                    version,
                    pod,
                    name,
                    required,
                    skip_dead,
                    again,
                    &mut judged_ready,
                ),
            )
            .await
            {
                Ok(check) => check,
                Err(_) => Check::Waiting(WaitingFor::Runtime(
                    "no answer before the hold's end".into(),
                )),
            };
            again = Some(hold_until);
            let who = match check {
                Check::Ready => {
                    forget_refusal();
                    break;
                }
                Check::Refuse(refusal) => return self.refuse_fast(pod, call, name, &refusal, held),
                Check::Waiting(who) => who,
                Check::Probe { .. } => unreachable!("check_start answers its own probes"),
            };
            let waiting = holds::Waiting::from_check(pod, &who);
            match held.as_mut() {
                Some(hold) => hold.update(waiting),
                None => {
                    tracing::info!(
                        container_name = %name,
                        waiting_for = %who,
                        timeout_ms = timeout.as_millis() as u64,
                        "holding CreateContainer until sidecars are ready"
                    );
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
                    self.keep_create(pod, name, held_from).await;
                }
            }
            if let Some(v) =
                self.refuse_long_hold(pod, name, &who, &mut held, held_from, hold_until, timeout)
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
        if let Some(hold) = held {
            let held_for = now().saturating_duration_since(hold.since);
            self.metrics.start_holds.observe(held_for.as_secs_f64());
            tracing::info!(
                container_name = %name,
                held_ms = held_for.as_millis() as u64,
                "sidecars ready; forwarding CreateContainer"
            );
            hold.end(HoldOutcome::Forwarded, "");
        }
        Verdict::Forward
    }

    /// Keeps the clock of a create hold as an intent (one durable write per app container,
    /// at its first hold; its retries find it kept), so a restarted crisp counts the start
    /// timeout from `held_from` too. One that cannot be kept is said and counted; the hold
    /// goes on as before.
    async fn keep_create(&self, pod: &Pod, name: &str, held_from: Instant) {
        if self.intents.create_since(&pod.sandbox_id, name).is_some() {
            return;
        }
        let intent = Intent {
            kind: Kind::Create,
            sandbox_id: pod.sandbox_id.clone(),
            container_id: String::new(),
            name: name.to_string(),
            sent_ms: intents::wall_of(held_from),
            hold_until_ms: 0,
            budget_end_ms: 0,
            timeout: 0,
        };
        match self.intents.keep(intent, self.intents.token()).await {
            Ok(()) => {
                self.metrics.intents_kept.inc();
            }
            Err(intents::KeepError::Invalid) => {}
            Err(e) => {
                self.metrics.intent_write_errors.inc();
                tracing::warn!(
                    container_name = %name,
                    error = %e,
                    "cannot keep the hold's clock as an intent; a crisp restart will restart it"
                );
            }
        }
    }

    /// The pod a CreateContainer is for and the container's name; `None`: forward it unordered
    /// (a copy that does not decode, a sandbox the runtime does not know).
    async fn create_target(&self, version: ApiVersion, msg: &[u8]) -> Option<(Arc<Pod>, String)> {
        let req: views::CreateContainerRequest = match views::decode(msg) {
            Ok(req) => req,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "cannot decode a copy of CreateContainerRequest; forwarding it unordered"
                );
                return None;
            }
        };
        let name = req
            .config
            .as_ref()
            .and_then(|config| config.metadata.as_ref())
            .map(|metadata| metadata.name.clone())
            .unwrap_or_default();
        if !crate::tenant::is_dns1123_label(&name) {
            // Not a name Kubernetes gives a container (only another CRI client could send it).
            tracing::debug!(
                container_name = %crate::tenant::text(&name, crate::tenant::MAX_FIELD),
                "container name is not a DNS-1123 label; forwarding it unordered"
            );
            return None;
        }
        let pod = match req.sandbox_config.as_ref() {
            Some(sandbox) => self.pod_from_config(version, &req.pod_sandbox_id, sandbox),
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
        refusal: &Refusal,
        held: Option<holds::Hold<'_>>,
    ) -> Verdict {
        pod.refused_since
            .lock()
            .entry(name.to_string())
            .or_insert(call.received);
        self.metrics.fail_fast.inc();
        tracing::info!(container_name = %name, "refusing CreateContainer for now: {refusal}");
        let message = refusal.message(name);
        let waiting = holds::Waiting::from_refusal(pod, refusal);
        let was_held = held.is_some();
        if let Some(hold) = held {
            hold.end(HoldOutcome::Refused, &message);
        }
        self.note_refusal(pod, call, name, &waiting, &message, was_held);
        Verdict::Refuse(Status::refused(message))
    }

    /// The hold reached the start timeout still waiting for `who`: start the app anyway or
    /// fail the create, as `policy` says (§3.4).
    fn start_timed_out(
        &self,
        pod: &Pod,
        name: &str,
        who: &WaitingFor,
        timeout: Duration,
        policy: TimeoutPolicy,
        held: Option<holds::Hold<'_>>,
    ) -> Verdict {
        self.metrics.start_hold_timeouts.inc();
        if let Some(hold) = &held {
            self.metrics
                .start_holds
                .observe(now().saturating_duration_since(hold.since).as_secs_f64());
        }
        match policy {
            TimeoutPolicy::Proceed => {
                tracing::warn!(
                    container_name = %name,
                    waiting_for = %who,
                    "still waiting at the start timeout; starting the app anyway (policy proceed)"
                );
                if let Some(hold) = held {
                    hold.end(HoldOutcome::TimedOutProceed, "");
                }
                Verdict::Forward
            }
            TimeoutPolicy::Fail => {
                tracing::warn!(
                    container_name = %name,
                    waiting_for = %who,
                    "still waiting at the start timeout; failing CreateContainer (policy fail)"
                );
                pod.refusals.fetch_add(1, Relaxed);
                // Not DEADLINE_EXCEEDED: that would read as kubelet's own deadline.
                let message = refusal::timed_out(&pod.display(), who, timeout, name);
                if let Some(hold) = held {
                    hold.end(HoldOutcome::TimedOutFail, &message);
                }
                Verdict::Refuse(Status::refused(message))
            }
        }
    }

    /// `ordering.refuse_held_after`: a CreateContainer held that long is refused with what it
    /// waits for, so kubelet shows it as the container's waiting reason (CreateContainerError)
    /// and a Warning event; "network is not ready" in the message brings its retry within
    /// 1–1.5 s (KUBELET-CRI §1.3), and the retry's hold carries on from `held_from`.
    #[allow(clippy::too_many_arguments)]
    fn refuse_long_hold(
        &self,
        pod: &Pod,
        name: &str,
        who: &WaitingFor,
        held: &mut Option<holds::Hold<'_>>,
        held_from: Instant,
        hold_until: Instant,
        timeout: Duration,
    ) -> Option<Verdict> {
        let after = self.cfg.refuse_held_after;
        let at = now();
        let hold = held.as_ref()?;
        if after.is_zero() || at.saturating_duration_since(hold.since) < after || at >= hold_until {
            return None;
        }
        let message = holds::held_refusal(
            &pod.display(),
            name,
            who,
            hold.waiting(),
            at.saturating_duration_since(held_from),
            timeout,
        );
        pod.held_since
            .lock()
            .entry(name.to_string())
            .or_insert(held_from);
        pod.refusals.fetch_add(1, Relaxed);
        let held_for = at.saturating_duration_since(hold.since);
        self.metrics.start_holds.observe(held_for.as_secs_f64());
        tracing::info!(
            container_name = %name,
            held_ms = held_for.as_millis() as u64,
            "held long: refusing CreateContainer with the reason, for kubelet to show; it retries within 1.5 s"
        );
        if let Some(hold) = held.take() {
            hold.end(HoldOutcome::RefusedStillWaiting, &message);
        }
        Some(Verdict::Refuse(Status::refused(message)))
    }

    /// A CreateContainer answered: the new container's sandbox and name are cached by its id.
    pub(super) fn remember_created(&self, req: &[u8], msg: &[u8]) {
        let (Ok(request), Ok(response)) = (
            views::decode::<views::CreateContainerRequest>(req),
            views::decode::<views::CreateContainerResponse>(msg),
        ) else {
            return;
        };
        let metadata = request.config.and_then(|config| config.metadata);
        let name = container_name(metadata.map(|metadata| metadata.name));
        self.containers.insert(
            response.container_id,
            ContainerRef {
                sandbox_id: request.pod_sandbox_id,
                name,
                created_seen: true,
            },
        );
    }
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
