//! Why crisp refuses a CreateContainer ([`Refusal`]), decided once by the start check
//! (`decide.rs`) and the engine, and the words every view renders from it: the gRPC message
//! kubelet shows and retries on ([`Refusal::message`]), the reason in logs (`Display`), what
//! the refused call waited for in the tap and `crisp pods` (`holds::Waiting::from_refusal`).
//! What a hold waits for is typed the same way ([`WaitingFor`]). No view reads another's text
//! back.

use std::time::Duration;

use crate::cri::views::state;
use crate::tenant;

/// Longest reason in a refusal's message, in bytes; kubelet's retry tail comes after it, so the
/// whole message stays within [`tenant::MAX_MESSAGE`].
pub(crate) const MAX_REFUSAL_REASON: usize = 600;
/// Why crisp refuses a CreateContainer, decided once (by `decide::check_start` and the engine) and rendered by
/// every view from this value, never from another view's text: the gRPC message kubelet shows
/// ([`Refusal::message`]), the reason in logs ([`Refusal`]'s `Display`), and what the refused
/// call waited for in the tap, `crisp pods` and its span (`holds::Waiting::from_refusal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A required sidecar is not created (§3.3). `behind_refused`: crisp refuses its creation
    /// too, for it waits for an earlier sidecar.
    NotCreated {
        pod: String,
        sidecar: String,
        behind_refused: bool,
    },
    /// A required sidecar is created but not running: `state` as the runtime lists it.
    NotRunning {
        pod: String,
        sidecar: String,
        state: i32,
    },
    /// A running sidecar's readiness can never be probed (an isolated pod's loopback) and the
    /// pod's policy is `fail`: `why` is the one sentence `isolation::unreachable_reason` says.
    Unprobeable { sidecar: String, why: String },
    /// The start timeout passed under policy `fail`, the hold still waiting for a sidecar or
    /// the runtime.
    TimedOut {
        pod: String,
        waiting: WaitingFor,
        timeout: Duration,
    },
    /// A hold lasted `[ordering] refuse_held_after`: what it waits for, for how long.
    HeldLong {
        pod: String,
        waiting: HeldFor,
        held: Duration,
        timeout: Duration,
    },
}

/// What the start check holds an app's CreateContainer for (`decide::Check::Waiting`), decided
/// once and rendered by every view: the refusal's message, the log's `waiting_for`, the tap's
/// and `crisp pods`' `waiting_on` (`holds::Waiting::from_check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitingFor {
    /// This running sidecar, not ready yet.
    Sidecar(String),
    /// The runtime, for this reason: it failed the start check's read, or gave no answer.
    Runtime(String),
}

/// The log's `waiting_for`: the sidecar's name (cut and escaped), or `the runtime (why)`.
impl std::fmt::Display for WaitingFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitingFor::Sidecar(sidecar) => write!(f, "{}", name(sidecar)),
            WaitingFor::Runtime(why) => write!(f, "the runtime ({why})"),
        }
    }
}

/// What a hold ended by [`Refusal::HeldLong`] was waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeldFor {
    /// The runtime, for this reason (it did not answer, or failed).
    Runtime(String),
    /// A sidecar, with why it is not ready yet (the probe's last error, when it has one).
    Sidecar { name: String, why: String },
}

impl Refusal {
    /// The sidecar the refused call waits for, if it waits for one.
    pub(crate) fn sidecar(&self) -> Option<&str> {
        match self {
            Refusal::NotCreated { sidecar, .. }
            | Refusal::NotRunning { sidecar, .. }
            | Refusal::Unprobeable { sidecar, .. }
            | Refusal::TimedOut {
                waiting: WaitingFor::Sidecar(sidecar),
                ..
            } => Some(sidecar),
            Refusal::TimedOut { .. } => None,
            Refusal::HeldLong {
                waiting: HeldFor::Sidecar { name, .. },
                ..
            } => Some(name),
            Refusal::HeldLong { .. } => None,
        }
    }

    /// The grpc-message of the refused CreateContainer of `container` ([`refusal`]).
    pub(crate) fn message(&self, container: &str) -> String {
        refusal(&self.to_string(), container)
    }
}

/// The reason, as logs and the refusal's message say it. Names are cut and escaped.
impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotCreated {
                pod,
                sidecar,
                behind_refused: true,
            } => write!(
                f,
                "sidecar \"{}\" of pod {pod} is not created yet (it waits for an earlier sidecar)",
                name(sidecar)
            ),
            Refusal::NotCreated { pod, sidecar, .. } => write!(
                f,
                "sidecar \"{}\" of pod {pod} is not created yet (is it listed after this container?)",
                name(sidecar)
            ),
            Refusal::NotRunning {
                pod,
                sidecar,
                state,
            } => write!(
                f,
                "sidecar \"{}\" of pod {pod} is {}, not running",
                name(sidecar),
                state_name(*state)
            ),
            Refusal::Unprobeable { why, .. } => f.write_str(why),
            Refusal::TimedOut {
                pod,
                waiting: WaitingFor::Sidecar(sidecar),
                timeout,
            } => write!(
                f,
                "sidecar \"{}\" of pod {pod} not ready within {timeout:?}",
                name(sidecar)
            ),
            Refusal::TimedOut {
                pod,
                waiting: WaitingFor::Runtime(why),
                timeout,
            } => write!(
                f,
                "the start check of pod {pod} still waits for the runtime after {timeout:?} ({why})"
            ),
            Refusal::HeldLong {
                pod,
                waiting,
                held,
                timeout,
            } => {
                match waiting {
                    HeldFor::Runtime(why) => write!(f, "waiting for the runtime ({why})")?,
                    HeldFor::Sidecar { name, why } => {
                        write!(f, "waiting for sidecar {name} of {pod}: {why}")?
                    }
                }
                write!(f, "; held {} s of {} s", held.as_secs(), timeout.as_secs())
            }
        }
    }
}

/// A container's name in a message: cut and escaped ([`tenant::text`]); a DNS-1123 label
/// shows as it is.
fn name(n: &str) -> tenant::Text<'_> {
    tenant::text(n, tenant::MAX_NAME + 1)
}

/// The message of a refused CreateContainer. "network is not ready" makes kubelet requeue the
/// pod after ~1 s instead of 10–15 s (KUBELET-CRI §1.3): the retry comes as soon as it can
/// succeed. kubelet copies it into the pod's status and an Event, and under `timeout-policy:
/// fail` sends it about once a second: the reason is cut to [`MAX_REFUSAL_REASON`] and every
/// part escaped, so it is at most [`tenant::MAX_MESSAGE`] bytes on one line.
pub(crate) fn refusal(reason: &str, container: &str) -> String {
    let reason = tenant::text(reason, MAX_REFUSAL_REASON);
    format!(
        "crisp: {reason}; kubelet will retry \"{}\" (network is not ready until the pod's sidecars run)",
        name(container)
    )
}

/// The message of a CreateContainer failed at the start timeout under policy `fail`.
pub(crate) fn timed_out(
    pod: &str,
    waiting: &WaitingFor,
    timeout: Duration,
    container: &str,
) -> String {
    Refusal::TimedOut {
        pod: pod.to_string(),
        waiting: waiting.clone(),
        timeout,
    }
    .message(container)
}

fn state_name(s: i32) -> &'static str {
    match s {
        state::CREATED => "created but not started",
        state::RUNNING => "running",
        state::EXITED => "exited",
        _ => "in an unknown state",
    }
}
