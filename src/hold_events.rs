//! The events of a held call, from the ordering engine that holds it to the tap that shows it
//! live: [`HoldEvent`] (with its [`HoldPhase`] and, at its end, its [`HoldOutcome`]) and the
//! [`HoldSink`] the engine publishes them to. The engine and the tap share these types and
//! never import each other (tests/it/layers.rs).

use std::time::Duration;

use crate::cri::Route;

/// Where a hold stands, in a [`HoldEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldPhase {
    /// crisp started holding the call.
    Start,
    /// Still held; what it waits for changed, or a few seconds passed.
    Update,
    /// The hold ended: the call was forwarded, or refused at the timeout (`outcome` says).
    End,
    /// The call was refused without being held (a sidecar not created or not running), or a
    /// long hold ended as an informative refusal (`[ordering] refuse_held_after`).
    Refused,
}

impl HoldPhase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HoldPhase::Start => "start",
            HoldPhase::Update => "update",
            HoldPhase::End => "end",
            HoldPhase::Refused => "refused",
        }
    }
}

/// How a hold ended: what kubelet got (the call forwarded, or refused by crisp) and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldOutcome {
    /// The call went on to the runtime: what it waited for came.
    Forwarded,
    /// The start timeout passed under policy `proceed`: forwarded anyway.
    TimedOutProceed,
    /// The start timeout passed under policy `fail`: refused.
    TimedOutFail,
    /// Refused without a hold (a sidecar not created, not running, or unprobeable).
    Refused,
    /// A long hold ended as an informative refusal (`[ordering] refuse_held_after`); kubelet
    /// retries and crisp goes on waiting.
    RefusedStillWaiting,
    /// kubelet cancelled the call or its deadline passed while crisp held it.
    KubeletGaveUp,
}

impl HoldOutcome {
    /// The words the tap, logs and spans show (`crisp.hold.outcome`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HoldOutcome::Forwarded => "forwarded",
            HoldOutcome::TimedOutProceed => "timed out (proceed)",
            HoldOutcome::TimedOutFail => "timed out (fail)",
            HoldOutcome::Refused => "refused",
            HoldOutcome::RefusedStillWaiting => "refused (still waiting)",
            HoldOutcome::KubeletGaveUp => "kubelet gave up",
        }
    }

    /// The outcome in three words (`crisp.hold.verdict`): `forwarded`, `refused`, `timed out`,
    /// or `cancelled`.
    pub(crate) fn verdict(self) -> &'static str {
        match self {
            HoldOutcome::Forwarded => "forwarded",
            HoldOutcome::TimedOutProceed | HoldOutcome::TimedOutFail => "timed out",
            HoldOutcome::Refused | HoldOutcome::RefusedStillWaiting => "refused",
            HoldOutcome::KubeletGaveUp => "cancelled",
        }
    }

    /// Whether kubelet got an error from crisp (or none at all) rather than the runtime's
    /// answer.
    pub(crate) fn failed(self) -> bool {
        !matches!(self, HoldOutcome::Forwarded | HoldOutcome::TimedOutProceed)
    }
}

/// A held (or refused) call, as the engine reports it while it happens: the tap streams these
/// so a stuck pod is visible before its call ends. Built only while [`HoldSink::wanted`] is true
/// and only for calls the engine holds or refuses; an unheld call never makes one.
#[derive(Debug, Clone)]
pub struct HoldEvent {
    pub(crate) call_id: u64,
    pub(crate) route: Route,
    /// The gRPC path as sent (tap filters match it).
    pub(crate) path: String,
    pub(crate) phase: HoldPhase,
    /// When the event happened.
    pub(crate) at: std::time::SystemTime,
    pub(crate) pod_namespace: String,
    pub(crate) pod_name: String,
    pub(crate) pod_sandbox_id: String,
    /// The held container (CreateContainer, StopContainer); empty for StopPodSandbox.
    pub(crate) container_name: String,
    pub(crate) container_id: String,
    /// What the call waits on: a sidecar's name, `apps` (a stop), or `runtime`.
    pub(crate) waiting_on: String,
    /// Why: `not created`, `not running`, `not ready`, `apps running`, or what went wrong.
    pub(crate) reason: String,
    /// The readiness probe of `waiting_on` (`tcp://:15021`), and its last result (`ok`, or the
    /// error; an exec probe's exit code, never its output).
    pub(crate) probe: String,
    pub(crate) probe_result: String,
    /// Held so far (for `Start`: zero; counted from the container's first hold).
    pub(crate) held: Duration,
    /// Until the hold ends by the timeout policy; zero when unknown.
    pub(crate) time_left: Duration,
    /// `proceed` or `fail` for CreateContainer; empty for stops.
    pub(crate) policy: String,
    /// For `End`: how the hold ended; `None` for the other phases.
    pub(crate) outcome: Option<HoldOutcome>,
    /// For `Refused`: the gRPC message kubelet got.
    pub(crate) message: String,
}

impl HoldEvent {
    /// The outcome's words, empty before the hold ends.
    pub(crate) fn outcome_str(&self) -> &'static str {
        self.outcome.map_or("", HoldOutcome::as_str)
    }
}

/// Receives the engine's hold events (the tap), without the engine depending on the tap.
pub trait HoldSink: Send + Sync {
    /// Whether anyone may want hold events now; must be cheap (an atomic load). The engine
    /// builds no event while it is false.
    fn wanted(&self) -> bool;
    /// Must not wait: called on the held call's path.
    fn publish(&self, ev: HoldEvent);
}

#[cfg(test)]
mod tests {
    #[test]
    fn hold_outcomes_in_words() {
        use super::HoldOutcome::*;
        for (outcome, words, verdict, failed) in [
            (Forwarded, "forwarded", "forwarded", false),
            (TimedOutProceed, "timed out (proceed)", "timed out", false),
            (TimedOutFail, "timed out (fail)", "timed out", true),
            (Refused, "refused", "refused", true),
            (
                RefusedStillWaiting,
                "refused (still waiting)",
                "refused",
                true,
            ),
            (KubeletGaveUp, "kubelet gave up", "cancelled", true),
        ] {
            assert_eq!(outcome.as_str(), words);
            assert_eq!(outcome.verdict(), verdict, "{words}");
            assert_eq!(outcome.failed(), failed, "{words}");
        }
    }
}
