//! Holds as they happen: each held call is kept on its pod (`crisp pods` reads it) and reported
//! to the [`HoldSink`](crate::hold_events::HoldSink) (the tap) when it starts, while it waits and
//! when it ends — so a stuck pod is visible before its call returns (DESIGN.md §6).
//!
//! Nothing here runs for a call that is not held or refused. Events are built only while the
//! sink wants them, and updates are rate-bounded ([`update_due`]): a hold probed every 50 ms
//! sends an update when what it waits for changes (at most once per [`UPDATE_MIN`]) and at
//! least every [`UPDATE_EVERY`] otherwise.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant, SystemTime};

use super::refusal::{HeldFor, Refusal, WaitingFor};
use super::{now, Engine, Pod};
use crate::hold_events::{HoldEvent, HoldOutcome, HoldPhase};
use crate::intercept::Call;
use crate::metrics::GaugeGuard;

/// Never two update events of one hold closer than this.
const UPDATE_MIN: Duration = Duration::from_secs(1);
/// An update at least this often while a hold lasts, even when nothing changed.
const UPDATE_EVERY: Duration = Duration::from_secs(5);
/// Longest probe spec or probe result in an event or in `crisp pods` (an exec spec may be 4 KiB).
const MAX_FIELD: usize = 256;

/// What a held call waits for now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Waiting {
    /// A sidecar's name, `apps`, or `runtime`.
    pub(crate) on: String,
    /// `not created`, `not running`, `not ready`, `apps running: a, b`, or the runtime's trouble.
    pub(crate) reason: String,
    /// The readiness probe of the sidecar waited on.
    pub(crate) probe: String,
    /// Its last result: `ok`, or why not (bounded; an exec probe's exit code, never its output).
    pub(crate) probe_result: String,
    /// When that result was found.
    pub(crate) probe_at: Option<SystemTime>,
}

impl Waiting {
    /// Waiting on sidecar `name` of `pod` for `reason`, with its probe and last result.
    pub(crate) fn sidecar(pod: &Pod, name: &str, reason: &str) -> Waiting {
        let probe = pod
            .policy
            .find_sidecar(name)
            .map(|s| bounded(s.ready.to_string()))
            .unwrap_or_default();
        let last = pod.last_probe(name);
        Waiting {
            on: name.to_string(),
            reason: reason.to_string(),
            probe,
            probe_result: last
                .as_ref()
                .map(|last| bounded(probe_text(&last.result)))
                .unwrap_or_default(),
            probe_at: last.map(|last| last.at),
        }
    }

    /// What the start check waits for: a sidecar, with its probe, or the runtime's trouble.
    pub(crate) fn from_check(pod: &Pod, who: &WaitingFor) -> Waiting {
        match who {
            WaitingFor::Sidecar(name) => Waiting::sidecar(pod, name, "not ready"),
            WaitingFor::Runtime(why) => Waiting {
                on: "runtime".into(),
                reason: bounded(why.clone()),
                ..Default::default()
            },
        }
    }

    /// What a refused call waited for, from the refusal itself.
    pub(crate) fn from_refusal(pod: &Pod, refusal: &Refusal) -> Waiting {
        let kind = match refusal {
            Refusal::NotCreated { .. } => "not created",
            Refusal::NotRunning { .. } => "not running",
            Refusal::Unprobeable { .. } => "cannot be probed",
            Refusal::TimedOut { .. } | Refusal::HeldLong { .. } => "not ready",
        };
        match refusal.sidecar() {
            Some(name) => Waiting::sidecar(pod, name, kind),
            None => Waiting {
                on: "runtime".into(),
                reason: bounded(refusal.to_string()),
                ..Default::default()
            },
        }
    }

    /// `not ready: connect 10.1.2.3:15021: Connection refused` — the reason with the probe's
    /// last error, when it has one.
    pub(crate) fn describe(&self) -> String {
        match self.probe_result.as_str() {
            "" | "ok" => self.reason.clone(),
            result => format!("{}: {result}", self.reason),
        }
    }
}

fn probe_text(result: &crate::readiness::ProbeResult) -> String {
    match result {
        Ok(()) => "ok".into(),
        Err(e) => e.clone(),
    }
}

/// Cut and escaped: a probe spec and result carry the pod's text.
fn bounded(s: String) -> String {
    crate::tenant::cut(&s, MAX_FIELD)
}

/// Whether a hold's update is due: what it waits for changed (and [`UPDATE_MIN`] passed since
/// the last event), or [`UPDATE_EVERY`] passed.
fn update_due(last: Option<&(Instant, Waiting)>, now: Instant, waiting: &Waiting) -> bool {
    let Some((at, sent)) = last else { return true };
    let since = now.saturating_duration_since(*at);
    // The probe's time changes every round; only what it found counts as a change.
    let changed = (&sent.on, &sent.reason, &sent.probe_result)
        != (&waiting.on, &waiting.reason, &waiting.probe_result);
    (changed && since >= UPDATE_MIN) || since >= UPDATE_EVERY
}

/// The message of a long hold ended as a refusal (`[ordering] refuse_held_after`): what the
/// container waits for, for how long, and the "network is not ready" tail that makes kubelet
/// retry within 1–1.5 s (KUBELET-CRI §1.3). Bounded: at most [`crate::status::MAX_SEEN_MESSAGE`].
/// `who` says what it waits for; `waiting`, rendered from it, adds the probe's last error.
pub(crate) fn held_refusal(
    pod: &str,
    container: &str,
    who: &WaitingFor,
    waiting: &Waiting,
    held: Duration,
    timeout: Duration,
) -> String {
    let waiting = match who {
        WaitingFor::Runtime(_) => HeldFor::Runtime(waiting.reason.clone()),
        WaitingFor::Sidecar(name) => HeldFor::Sidecar {
            name: name.clone(),
            why: waiting.describe(),
        },
    };
    // Cut (to refusal::MAX_REFUSAL_REASON) and escaped by `Refusal::message`.
    Refusal::HeldLong {
        pod: pod.to_string(),
        waiting,
        held,
        timeout,
    }
    .message(container)
}

/// One call held now, as `crisp pods` shows it.
#[derive(Debug, Clone)]
pub(crate) struct HeldCall {
    pub(crate) call_id: u64,
    pub(crate) method: String,
    pub(crate) container: String,
    pub(crate) since: SystemTime,
    /// Counted from the container's first hold (a refused hold's retry carries on).
    pub(crate) held_from: Instant,
    pub(crate) waiting: Waiting,
    /// When the hold ends by the timeout (engine clock).
    pub(crate) ends: Instant,
    /// `proceed` or `fail` (CreateContainer); empty for stops.
    pub(crate) policy: String,
}

impl HeldCall {
    pub(crate) fn time_left(&self) -> Duration {
        self.ends.saturating_duration_since(now())
    }
}

/// A hold in progress: registered on the pod while it lasts, reported to the sink, counted in
/// `crisp_holds_in_flight`. Dropped without [`Hold::end`] — kubelet cancelled the call or its
/// deadline passed — it reports "kubelet gave up".
pub(crate) struct Hold<'a> {
    engine: &'a Engine,
    pod: &'a Pod,
    call: &'a Call,
    container_id: String,
    /// When this call's hold started (engine clock).
    pub(crate) since: Instant,
    info: HeldCall,
    last_sent: Option<(Instant, Waiting)>,
    /// What the call waited for, in order (at most [`MAX_WAITED`]), for its span; kept only
    /// when the call carries kubelet's `traceparent`.
    waited: Vec<String>,
    ended: bool,
    _gauge: GaugeGuard<'a>,
}

/// Most distinct things a hold's span names as waited for.
const MAX_WAITED: usize = 16;

impl<'a> Hold<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        engine: &'a Engine,
        pod: &'a Pod,
        call: &'a Call,
        container: &str,
        container_id: &str,
        held_from: Instant,
        ends: Instant,
        policy: &str,
        waiting: Waiting,
    ) -> Hold<'a> {
        let since = now();
        let info = HeldCall {
            call_id: call.id,
            method: call
                .route
                .rpc
                .map(|rpc| rpc.name())
                .unwrap_or("")
                .to_string(),
            container: container.to_string(),
            since: SystemTime::now(),
            held_from,
            waiting: waiting.clone(),
            ends,
            policy: policy.to_string(),
        };
        pod.holds().insert(call.id, info.clone());
        let mut hold = Hold {
            engine,
            pod,
            call,
            container_id: container_id.to_string(),
            since,
            info,
            last_sent: None,
            waited: Vec::new(),
            ended: false,
            _gauge: GaugeGuard::new(&engine.metrics.holds_in_flight),
        };
        hold.note_waited();
        hold.send(HoldPhase::Start, None, "");
        hold
    }

    /// Adds what the hold waits for now to its span's list (only for a traced call).
    fn note_waited(&mut self) {
        let on = &self.info.waiting.on;
        if self.call.trace.is_some()
            && self.waited.len() < MAX_WAITED
            && !self.waited.iter().any(|w| w == on)
        {
            self.waited.push(on.clone());
        }
    }

    /// The hold's span, when the call carries kubelet's `traceparent` and tracing is on.
    fn span(&self, outcome: HoldOutcome, message: &str) {
        let (Some(parent), Some(spans)) = (self.call.trace.as_ref(), self.engine.hold_spans())
        else {
            return;
        };
        spans.record(
            parent,
            &crate::otel::HoldSpan {
                rpc: &self.info.method,
                call_id: self.call.id,
                pod_namespace: &self.pod.namespace,
                pod_name: &self.pod.name,
                pod_sandbox_id: &self.pod.sandbox_id,
                container: &self.info.container,
                waited_for: &self.waited,
                reason: &self.info.waiting.describe(),
                outcome: outcome.as_str(),
                verdict: outcome.verdict(),
                failed: outcome.failed(),
                message,
                policy: &self.info.policy,
                start: self.info.since,
                end: SystemTime::now(),
            },
        );
    }

    /// What the hold waits for now: kept for `crisp pods`; an event when one is due.
    pub(crate) fn update(&mut self, waiting: Waiting) {
        if waiting == self.info.waiting
            && self
                .last_sent
                .as_ref()
                .is_some_and(|(at, _)| now().saturating_duration_since(*at) < UPDATE_EVERY)
        {
            return;
        }
        if let Some(held) = self.pod.holds().get_mut(&self.call.id) {
            held.waiting = waiting.clone();
        }
        self.info.waiting = waiting;
        self.note_waited();
        if update_due(self.last_sent.as_ref(), now(), &self.info.waiting) {
            self.send(HoldPhase::Update, None, "");
        }
    }

    pub(crate) fn waiting(&self) -> &Waiting {
        &self.info.waiting
    }

    /// The hold is over: how, with the message of a refusal.
    pub(crate) fn end(mut self, outcome: HoldOutcome, message: &str) {
        self.ended = true;
        self.span(outcome, message);
        self.send(HoldPhase::End, Some(outcome), message);
    }

    fn send(&mut self, phase: HoldPhase, outcome: Option<HoldOutcome>, message: &str) {
        let at = now();
        if phase != HoldPhase::End {
            self.last_sent = Some((at, self.info.waiting.clone()));
        }
        let Some(sink) = self.engine.hold_sink() else {
            return;
        };
        if !sink.wanted() {
            return;
        }
        sink.publish(HoldEvent {
            container_id: self.container_id.clone(),
            held: at.saturating_duration_since(self.info.held_from),
            time_left: self.info.ends.saturating_duration_since(at),
            policy: self.info.policy.clone(),
            outcome,
            ..event(
                self.call,
                self.pod,
                &self.info.container,
                phase,
                &self.info.waiting,
                message,
            )
        });
    }
}

/// The event of `call` for `pod`'s `container` in `phase`, waiting as `waiting` says, with
/// `message`; what only a hold knows (the container's id, its times, policy and outcome) is
/// left empty.
fn event(
    call: &Call,
    pod: &Pod,
    container: &str,
    phase: HoldPhase,
    waiting: &Waiting,
    message: &str,
) -> HoldEvent {
    HoldEvent {
        call_id: call.id,
        route: call.route,
        path: call.path.path().to_string(),
        phase,
        at: SystemTime::now(),
        pod_namespace: pod.namespace.clone(),
        pod_name: pod.name.clone(),
        pod_sandbox_id: pod.sandbox_id.clone(),
        container_name: container.to_string(),
        container_id: String::new(),
        waiting_on: waiting.on.clone(),
        reason: waiting.reason.clone(),
        probe: waiting.probe.clone(),
        probe_result: waiting.probe_result.clone(),
        held: Duration::ZERO,
        time_left: Duration::ZERO,
        policy: String::new(),
        outcome: None,
        message: message.to_string(),
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.pod.holds().remove(&self.call.id);
        if !self.ended {
            tracing::info!(
                container_name = %self.info.container,
                "kubelet gave up on a held call (cancelled, or its deadline passed)"
            );
            self.span(HoldOutcome::KubeletGaveUp, "");
            self.send(HoldPhase::End, Some(HoldOutcome::KubeletGaveUp), "");
        }
    }
}

impl Engine {
    /// A call refused: counted on the pod and reported to the sink. One refused without a hold
    /// (a sidecar not created or not running; `held` false) also gets its span here — as long
    /// as crisp took to refuse it, when the call carries kubelet's `traceparent` — where a hold
    /// ends with a span of its own.
    pub(super) fn note_refusal(
        &self,
        pod: &Pod,
        call: &Call,
        container: &str,
        waiting: &Waiting,
        message: &str,
        held: bool,
    ) {
        if let (false, Some(parent), Some(spans)) = (held, call.trace.as_ref(), self.hold_spans()) {
            let end = SystemTime::now();
            let took = Instant::now().saturating_duration_since(call.received);
            spans.record(
                parent,
                &crate::otel::HoldSpan {
                    rpc: call.route.rpc.map(|rpc| rpc.name()).unwrap_or(""),
                    call_id: call.id,
                    pod_namespace: &pod.namespace,
                    pod_name: &pod.name,
                    pod_sandbox_id: &pod.sandbox_id,
                    container,
                    waited_for: std::slice::from_ref(&waiting.on),
                    reason: &waiting.describe(),
                    outcome: HoldOutcome::Refused.as_str(),
                    verdict: HoldOutcome::Refused.verdict(),
                    failed: true,
                    message,
                    policy: "",
                    start: end.checked_sub(took).unwrap_or(end),
                    end,
                },
            );
        }
        pod.refusals.fetch_add(1, Relaxed);
        let Some(sink) = self.hold_sink() else { return };
        if !sink.wanted() {
            return;
        }
        sink.publish(event(
            call,
            pod,
            container,
            HoldPhase::Refused,
            waiting,
            message,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(reason: &str, result: &str) -> Waiting {
        Waiting {
            on: "proxy".into(),
            reason: reason.into(),
            probe: "tcp://:9".into(),
            probe_result: result.into(),
            probe_at: None,
        }
    }

    #[test]
    fn updates_are_rate_bounded() {
        let t0 = Instant::now();
        let a = w("not ready", "connect 10.0.0.1:9: refused");
        let b = w("not ready", "connect 10.0.0.1:9: no answer within 1s");
        assert!(update_due(None, t0, &a), "the first event is always due");
        let last = (t0, a.clone());
        // The same state, probed every 50 ms: nothing until UPDATE_EVERY.
        for ms in (50..5000).step_by(50) {
            assert!(
                !update_due(Some(&last), t0 + Duration::from_millis(ms), &a),
                "{ms} ms"
            );
        }
        assert!(update_due(Some(&last), t0 + UPDATE_EVERY, &a));
        // A change: not before UPDATE_MIN, then at once.
        assert!(!update_due(
            Some(&last),
            t0 + Duration::from_millis(999),
            &b
        ));
        assert!(update_due(Some(&last), t0 + UPDATE_MIN, &b));
        // A changing probe time alone is no change.
        let mut a2 = a.clone();
        a2.probe_at = Some(SystemTime::now());
        assert!(!update_due(Some(&last), t0 + Duration::from_secs(2), &a2));
    }

    #[test]
    fn held_refusal_is_informative_and_bounded() {
        let msg = held_refusal(
            "default/web",
            "app",
            &WaitingFor::Sidecar("proxy".into()),
            &w("not ready", "connect 10.1.2.3:15021: Connection refused"),
            Duration::from_millis(30_400),
            Duration::from_secs(90),
        );
        assert_eq!(
            msg,
            "crisp: waiting for sidecar proxy of default/web: not ready: connect 10.1.2.3:15021: Connection refused; held 30 s of 90 s; kubelet will retry \"app\" (network is not ready until the pod's sidecars run)"
        );
        let huge = w("not ready", &"x".repeat(10_000));
        let msg = held_refusal(
            &"n".repeat(300),
            &"c".repeat(300),
            &WaitingFor::Sidecar("proxy".into()),
            &huge,
            Duration::from_secs(1),
            Duration::from_secs(90),
        );
        assert!(
            msg.len() <= crate::status::MAX_SEEN_MESSAGE,
            "{}",
            msg.len()
        );
        assert!(
            msg.contains("network is not ready"),
            "kubelet's fast retry needs the tail: {msg}"
        );
    }
}
