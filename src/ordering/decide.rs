//! The ordering rules of DESIGN.md §3–§4 as pure functions: of the pod's policy, a snapshot of
//! its containers as the runtime lists them, the call, and the clock. Nothing here does I/O,
//! takes a lock or waits. The engine (`mod.rs`) gathers the inputs through the runtime seam
//! ([`super::runtime::Runtime`]), asks these functions what to do and does it; a hold is "sleep
//! until the instant returned, then ask again". Every rule has a unit test below; `tests.rs`
//! drives the whole engine through a scripted runtime on paused time.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use super::annotations::{PodPolicy, Sidecar};
#[cfg(test)]
use super::refusal::{refusal, timed_out};
use super::refusal::{Refusal, WaitingFor};
use crate::config::TimeoutPolicy;
use crate::cri::views::{self, state};

/// Kept free before kubelet's deadline when a hold ends, so the forwarded call still completes.
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_secs(3);
/// KEP-753's tail: sidecars left when the grace budget is spent get SIGTERM and this long.
pub(crate) const STOP_TAIL: Duration = Duration::from_secs(2);
/// How long a StopPodSandbox waits for apps when kubelet sent no deadline.
const SANDBOX_HOLD_WITHOUT_DEADLINE: Duration = Duration::from_secs(60);
/// Room a held StopPodSandbox leaves for stopping the sidecars before kubelet's deadline.
const SANDBOX_STOP_ROOM: Duration = Duration::from_secs(10);
/// kubelet's own slack over the grace period for a StopContainer (KUBELET-CRI §3.3).
const STOP_SLACK: Duration = Duration::from_secs(120);
/// The longest grace period crisp honours: a StopContainer's `timeout` and Job mode's
/// `io.kubernetes.pod.terminationGracePeriod` are the pod's `terminationGracePeriodSeconds`,
/// any int64 a tenant writes. kubelet's own deadline for the call (grace + 2 min,
/// KUBELET-CRI §3.3) wraps for values near 2^63, so a longer grace buys nothing a hold could
/// use; a day is far beyond any real grace period and far inside what an `Instant` can add.
pub const MAX_GRACE: Duration = Duration::from_secs(24 * 3600);
/// The furthest [`later`] looks ahead: the longest hold crisp can compute (a day's grace plus
/// kubelet's slack).
const MAX_AHEAD: Duration = Duration::from_secs(24 * 3600 + 120);

/// A grace period in seconds as the pod gave it (StopContainer's `timeout`, the grace
/// annotation), bounded where it enters: negative is 0, more than [`MAX_GRACE`] is that.
pub fn grace_from_secs(secs: i64) -> Duration {
    Duration::from_secs(secs.clamp(0, MAX_GRACE.as_secs() as i64) as u64)
}

/// `t + d` that cannot panic: `d` is capped at `MAX_AHEAD`, and an instant that still cannot
/// be represented is `t` (the hold ends now: forwarding is always safe).
pub fn later(t: Instant, d: Duration) -> Instant {
    t.checked_add(d.min(MAX_AHEAD)).unwrap_or(t)
}

/// A pod's containers as one ListContainers showed them: the newest instance of each name
/// (kubelet's view, KUBELET-CRI §1.4).
pub(crate) struct Snapshot<'a> {
    latest: HashMap<&'a str, &'a views::Container>,
}

impl<'a> Snapshot<'a> {
    pub(crate) fn new(containers: &'a [views::Container]) -> Self {
        let mut latest: HashMap<&str, &views::Container> = HashMap::new();
        for c in containers {
            let name = c.metadata.as_ref().map(|m| m.name.as_str()).unwrap_or("");
            match latest.get(name) {
                Some(prev) if prev.created_at >= c.created_at => {}
                _ => {
                    latest.insert(name, c);
                }
            }
        }
        Snapshot { latest }
    }

    pub(crate) fn get(&self, name: &str) -> Option<&'a views::Container> {
        self.latest.get(name).copied()
    }

    /// Each name with its newest instance.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'a str, &'a views::Container)> + '_ {
        self.latest.iter().map(|(n, c)| (*n, *c))
    }

    fn running(&self, name: &str) -> bool {
        self.get(name).is_some_and(|c| c.state == state::RUNNING)
    }

    /// Running containers that are not sidecars of `policy` (native ones included: kubelet stops
    /// those after the apps), by name.
    pub(crate) fn running_apps(&self, policy: &PodPolicy) -> Vec<&'a str> {
        let mut apps: Vec<&str> = self
            .latest
            .iter()
            .filter(|(n, c)| {
                c.state == state::RUNNING
                    && policy.sidecar_index(n).is_none()
                    && !policy.is_native(n)
            })
            .map(|(n, _)| *n)
            .collect();
        apps.sort_unstable();
        apps
    }
}

// ---------------------------------------------------------------------------------------------
// Start order: CreateContainer (§3)

/// What the pod's policy alone says of a CreateContainer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CreatePlan<'p> {
    /// Not gated: the pod has no sidecars, the container is a known init container (they run
    /// before any sidecar can exist, KUBELET-CRI §1.1), a native sidecar (kubelet orders those
    /// among themselves), or nothing is declared before it.
    Forward,
    /// Gated on these sidecars: the native ones and those declared before it (a sidecar), or
    /// all of them (an app).
    Gate(&'p [Sidecar]),
}

pub(crate) fn plan_create<'p>(policy: &'p PodPolicy, container: &str) -> CreatePlan<'p> {
    let gate = policy.gated();
    if gate.is_empty() || policy.is_known_init(container) || policy.is_native(container) {
        return CreatePlan::Forward;
    }
    // Native sidecars come first (kubelet starts them before any regular container), then the
    // pod's own sidecars in declared order.
    let required = match policy.sidecar_index(container) {
        Some(i) => &gate[..policy.native.len() + i],
        None => gate,
    };
    if required.is_empty() {
        CreatePlan::Forward
    } else {
        CreatePlan::Gate(required)
    }
}

/// When a CreateContainer hold ends (§3.4–3.5): the start timeout after the call arrived, and
/// never later than [`DEADLINE_MARGIN`] before kubelet's deadline.
pub fn create_hold_end(received: Instant, timeout: Duration, deadline: Option<Instant>) -> Instant {
    let end = later(received, timeout);
    match deadline {
        Some(d) => end.min(d.checked_sub(DEADLINE_MARGIN).unwrap_or(received)),
        None => end,
    }
}

/// A sidecar that stays exited may never come back (restartPolicy Never, a start aborted by a
/// crash, a long crash back-off): refusing the app for it forever would leave the pod Pending
/// forever. Refusals are bounded by the start timeout like holds, counted from the container's
/// first refusal; past it, under `proceed`, sidecars that do not run are no longer waited for
/// (running ones still are).
pub(crate) fn skip_dead(
    policy: TimeoutPolicy,
    refused_since: Option<Instant>,
    now: Instant,
    timeout: Duration,
) -> bool {
    policy == TimeoutPolicy::Proceed
        && refused_since.is_some_and(|t| now.saturating_duration_since(t) >= timeout)
}

/// What a refused container waits for, as the runtime can date it (see
/// `Engine::start_refusal_clock`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RefusalAnchor<'a> {
    /// The newest instance of the first required sidecar that does not run, created at
    /// `created_at` (ns since the epoch).
    Sidecar { id: &'a str, created_at: i64 },
    /// No such sidecar was created: the sandbox's creation.
    Sandbox,
}

pub(crate) fn refusal_anchor<'a>(required: &[Sidecar], snap: &Snapshot<'a>) -> RefusalAnchor<'a> {
    match required
        .iter()
        .find(|s| !snap.running(&s.name))
        .and_then(|s| snap.get(&s.name))
    {
        Some(c) => RefusalAnchor::Sidecar {
            id: &c.id,
            created_at: c.created_at,
        },
        None => RefusalAnchor::Sandbox,
    }
}

/// The engine's instant of a runtime timestamp (`ns` since the epoch), given the instant and the
/// wall-clock time of now. Only ages up to [`MAX_ANCHOR_AGE`] matter (the longest start
/// timeout), so older ones are that old (an `Instant` cannot go back past the boot); a time in the future is now; none for 0 (unset).
pub(crate) fn instant_of_wall(ns: i64, now: Instant, wall_now: SystemTime) -> Option<Instant> {
    if ns <= 0 {
        return None;
    }
    let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(ns as u64);
    let age = wall_now
        .duration_since(at)
        .unwrap_or_default()
        .min(MAX_ANCHOR_AGE);
    Some(now.checked_sub(age).unwrap_or(now))
}

/// Past the longest start timeout, a refusal clock's start no longer matters.
const MAX_ANCHOR_AGE: Duration = crate::config::MAX_START_TIMEOUT;

/// No sidecar exists at all and no annotation says what the container is: a regular container
/// listed before the sidecars, or an init container. The engine refuses it once and judges by
/// what kubelet does next (`InitGuess`).
pub(crate) fn needs_init_judgement(policy: &PodPolicy, snap: &Snapshot) -> bool {
    let any_sidecar = policy.sidecars.iter().any(|s| snap.get(&s.name).is_some());
    !any_sidecar && policy.any_required() && !policy.init_complete
}

/// One round of the start check.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Check<'p> {
    /// Every required sidecar runs and is ready (§3.1).
    Ready,
    /// Probe this running sidecar's readiness, then check again with the answer.
    Probe {
        sidecar: &'p Sidecar,
        container_id: String,
    },
    /// A sidecar runs but is not ready (or, in the engine, the runtime did not answer): hold
    /// (§3.2).
    Waiting(WaitingFor),
    /// A sidecar is not created, or created but not running: refuse now (§3.3). kubelet can only
    /// fix it in a later sync of this very pod, which waits for this call — holding would
    /// deadlock (KUBELET-CRI §7.1).
    Refuse(Refusal),
}

/// The start check: the required sidecars in declared order, the first that is not ready
/// decides. `probed`: readiness answers of this round, by sidecar name. `refused`: whether
/// crisp is refusing that container's own creation (it waits for an earlier sidecar).
pub(crate) fn check_start<'p>(
    pod: &str,
    required: &'p [Sidecar],
    snap: &Snapshot,
    skip_dead: bool,
    refused: impl Fn(&str) -> bool,
    probed: &HashMap<String, bool>,
) -> Check<'p> {
    for s in required {
        let found = snap.get(&s.name);
        if skip_dead && !snap.running(&s.name) {
            // Not created because crisp is refusing it (it waits for an earlier, dead, sidecar):
            // alive, not dead. It passes on its own timeout, and this container waits for it —
            // otherwise the app could win the race and start first.
            if found.is_none() && refused(&s.name) {
                return Check::Refuse(Refusal::NotCreated {
                    pod: pod.to_string(),
                    sidecar: s.name.clone(),
                    behind_refused: true,
                });
            }
            continue;
        }
        match found {
            None if s.required => {
                return Check::Refuse(Refusal::NotCreated {
                    pod: pod.to_string(),
                    sidecar: s.name.clone(),
                    behind_refused: false,
                })
            }
            // Node rules name sidecars a pod may not have.
            None => continue,
            Some(c) if c.state == state::RUNNING => match probed.get(&s.name) {
                Some(true) => continue,
                Some(false) => return Check::Waiting(WaitingFor::Sidecar(s.name.clone())),
                None => {
                    return Check::Probe {
                        sidecar: s,
                        container_id: c.id.clone(),
                    }
                }
            },
            Some(c) => {
                return Check::Refuse(Refusal::NotRunning {
                    pod: pod.to_string(),
                    sidecar: s.name.clone(),
                    state: c.state,
                })
            }
        }
    }
    Check::Ready
}

/// What a held CreateContainer does after a round that ended in [`Check::Waiting`].
#[derive(Debug, PartialEq, Eq)]
pub enum WaitStep {
    /// Check again at this instant (one probe interval on, never past the hold's end).
    Until(Instant),
    /// The hold's end is reached: the timeout policy decides (§3.4).
    TimedOut(TimeoutPolicy),
}

pub fn after_waiting(
    now: Instant,
    hold_until: Instant,
    probe_interval: Duration,
    policy: TimeoutPolicy,
) -> WaitStep {
    if now >= hold_until {
        WaitStep::TimedOut(policy)
    } else {
        WaitStep::Until(later(now, probe_interval).min(hold_until))
    }
}

// ---------------------------------------------------------------------------------------------
// Stop order: StopContainer and StopPodSandbox (§4)

/// When a sidecar's StopContainer hold ends: early enough before kubelet's deadline for the
/// forwarded stop's tail to complete (§4.3), or grace + kubelet's 2 min without a deadline.
pub fn stop_hold_end(arrived: Instant, grace: Duration, deadline: Option<Instant>) -> Instant {
    match deadline {
        Some(d) => d
            .checked_sub(DEADLINE_MARGIN + STOP_TAIL)
            .unwrap_or(arrived),
        None => later(arrived, grace.saturating_add(STOP_SLACK)),
    }
}

/// Past this instant, with no app of the pod being stopped, a sidecar's StopContainer is a
/// single-container kill (liveness, spec change), not a pod termination: apps' StopContainers
/// come at most one preStop (≤ grace) after the termination starts (KUBELET-CRI §3.1–3.2).
pub fn single_kill_after(arrived: Instant, grace: Duration) -> Instant {
    later(arrived, grace.max(STOP_TAIL))
}

/// One round of a sidecar's StopContainer (§4.2).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StopStep<'a> {
    /// Nothing the sidecar must outlive runs any more.
    Forward,
    /// No app is being stopped and the sidecar's own grace has passed: a single-container kill.
    SingleKill,
    /// Still running at the hold's end: stop the sidecar anyway, before kubelet's deadline.
    Deadline {
        apps: Vec<&'a str>,
        sidecars: Vec<&'a str>,
    },
    /// Hold while these run: the pod's apps, and the sidecars declared after this one.
    Hold {
        apps: Vec<&'a str>,
        sidecars: Vec<&'a str>,
    },
}

pub(crate) fn stop_step<'a>(
    policy: &'a PodPolicy,
    idx: usize,
    snap: &Snapshot<'a>,
    now: Instant,
    hold_until: Instant,
    single_kill_after: Instant,
    apps_stopping: bool,
) -> StopStep<'a> {
    let apps = snap.running_apps(policy);
    let sidecars: Vec<&str> = policy.sidecars[idx + 1..]
        .iter()
        .filter(|s| snap.running(&s.name))
        .map(|s| s.name.as_str())
        .collect();
    if apps.is_empty() && sidecars.is_empty() {
        StopStep::Forward
    } else if sidecars.is_empty() && !apps_stopping && now >= single_kill_after {
        StopStep::SingleKill
    } else if now >= hold_until {
        StopStep::Deadline { apps, sidecars }
    } else {
        StopStep::Hold { apps, sidecars }
    }
}

/// Whole seconds left of the pod's grace budget, rounded up; the KEP's 2 s tail once fewer
/// are left (§4.3). Never more than [`MAX_GRACE`]: the runtime is never asked to wait longer.
pub fn budget_secs(budget_end: Option<Instant>, now: Instant) -> i64 {
    let left = budget_end
        .map(|e| e.saturating_duration_since(now))
        .unwrap_or_default()
        .min(MAX_GRACE);
    if left >= STOP_TAIL {
        left.as_secs_f64().ceil() as i64
    } else {
        STOP_TAIL.as_secs() as i64
    }
}

/// The StopContainer timeout to forward for a sidecar: what is left of the budget when that is
/// less than kubelet asked for (the call is then patched), else `None` (forwarded as sent).
pub fn stop_timeout(budget_end: Instant, now: Instant, requested: i64) -> Option<i64> {
    let secs = budget_secs(Some(budget_end), now);
    (secs < requested).then_some(secs)
}

/// When a held StopPodSandbox stops waiting for apps: room for the sidecars' stops before
/// kubelet's deadline.
pub(crate) fn sandbox_hold_end(arrived: Instant, deadline: Option<Instant>) -> Instant {
    deadline
        .and_then(|d| d.checked_sub(DEADLINE_MARGIN + SANDBOX_STOP_ROOM))
        .unwrap_or(later(arrived, SANDBOX_HOLD_WITHOUT_DEADLINE))
}

/// The apps still running when a held StopPodSandbox is let go: kubelet's own StopContainer
/// for them failed or never reached crisp (its deadline arithmetic wraps for a grace period
/// near 2^63 seconds, KUBELET-CRI §3.3, and the call expires before it is sent). crisp stops
/// them first, with [`STOP_TAIL`], so the sidecars still stop last.
pub(crate) fn sandbox_stop_apps<'a>(
    policy: &'a PodPolicy,
    running: &'a [views::Container],
) -> Vec<(&'a str, &'a str)> {
    running
        .iter()
        .filter(|c| c.state == state::RUNNING)
        .filter_map(|c| {
            c.metadata
                .as_ref()
                .map(|m| (m.name.as_str(), c.id.as_str()))
        })
        .filter(|(name, _)| policy.sidecar_index(name).is_none() && !policy.is_native(name))
        .collect()
}

/// The running sidecars a StopPodSandbox stops first, in reverse declared order (§4.2), with
/// their container ids. StopPodSandbox force-kills whatever still runs (CRI contract).
pub(crate) fn sandbox_stop_order<'a>(
    policy: &'a PodPolicy,
    running: &'a [views::Container],
) -> Vec<(&'a str, &'a str)> {
    policy
        .sidecars
        .iter()
        .rev()
        .filter_map(|s| {
            running
                .iter()
                .find(|c| {
                    c.state == state::RUNNING
                        && c.metadata.as_ref().is_some_and(|m| m.name == s.name)
                })
                .map(|c| (s.name.as_str(), c.id.as_str()))
        })
        .collect()
}

#[cfg(test)]
mod tests;
