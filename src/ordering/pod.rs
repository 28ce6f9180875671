//! What the engine knows about one pod sandbox (DESIGN.md §2): its identity, its parsed
//! policy, and the little state its gates keep on it — the stop budget window (DESIGN.md §4.3),
//! the calls held now, each sidecar's last probe, the init-or-regular guesses (DESIGN.md §3.3).
//! Every field the gates share is behind a `parking_lot` lock held only between two `.await`s
//! (its guard is not `Send`, so the compiler refuses one held across an await in a gate).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::annotations::{self, PodPolicy};
use super::decide;
use super::holds;
use super::init_guess::{annotations_fingerprint, InitGuess};
use super::injectors::InjectorRule;
use super::isolation::Isolation;
use crate::config::SidecarRule;
use crate::cri::views;
use crate::netns::NetNs;
use crate::readiness;

/// What crisp knows about one pod sandbox.
pub struct Pod {
    pub(crate) sandbox_id: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) host_network: bool,
    pub(crate) labels: HashMap<String, String>,
    pub(crate) policy: PodPolicy,
    pub(super) annotations_fp: u64,
    /// The pod's addresses and network namespace, once the runtime told (see `pod_net`).
    pub(super) net: Mutex<Option<Arc<PodNet>>>,
    /// `crisp.dev/ready.*` keys already warned about for naming another's address: once a pod.
    pub(super) tenant_warned: Mutex<HashSet<String>>,
    /// Said that its network namespace cannot be found: once a pod, whoever probes first.
    pub(super) netns_warned: AtomicBool,
    /// Shared-kernel or isolated, by its runtime handler: set at RunPodSandbox, or from the
    /// runtime's PodSandboxStatus when crisp learnt of the pod later (a restart).
    pub(super) isolation: OnceLock<Isolation>,
    /// Said that a sidecar's readiness target cannot be probed in it (isolated): once a pod.
    pub(super) isolation_warned: AtomicBool,
    stop: Mutex<StopWindow>,
    pub(super) job_watched: AtomicBool,
    /// Its Job watcher ended (the sidecars were terminated): a pod restarted in place needs a
    /// new one.
    pub(super) job_done: AtomicBool,
    /// Every container crisp knew in the sandbox was removed (RemoveContainer): kubelet may
    /// run the pod again in the same sandbox (KEP-5532), and its next CreateContainer starts
    /// the pod's state over ([`Pod::start_over`], DESIGN.md §3.6).
    pub(super) emptied: AtomicBool,
    /// Init or regular? For containers no annotation names (see [`InitGuess`]).
    init_guess: Mutex<InitGuess>,
    /// When each app container's refusals began because a sidecar was not created or not
    /// running: refusals are bounded by the start timeout like holds (see `gate_create`). Not
    /// only the first refusal this crisp saw: `Engine::start_refusal_clock` starts it at the
    /// runtime's creation time of what the app waits for, so a restart does not restart it.
    pub(super) refused_since: Mutex<HashMap<String, Instant>>,
    /// The sandbox's creation time (ns since the epoch) as the runtime records it; 0 until
    /// known.
    pub(super) created_at: AtomicI64,
    /// Each probed sidecar's last probe: when, and what it found (`crisp pods`, the tap).
    last_probe: Mutex<HashMap<String, LastProbe>>,
    /// Calls held now, by call id (`crisp pods`). Touched only by held calls.
    holds: Mutex<HashMap<u64, holds::HeldCall>>,
    /// CreateContainer calls refused so far (fail-fast, policy `fail`, long holds).
    pub(crate) refusals: AtomicU64,
    /// When each app container's hold began, for holds ended as refusals
    /// (`ordering.refuse_held_after`): kubelet's retry carries on, so the start timeout still
    /// counts from the first hold.
    pub(super) held_since: Mutex<HashMap<String, Instant>>,
}

/// Where a pod's probes connect from, and the addresses that are its own.
pub(super) struct PodNet {
    /// The pod's IPs (PodSandboxStatus `network.ip` and `additional_ips`).
    pub(super) ips: Vec<IpAddr>,
    pub(super) ns: PodNs,
}

pub(super) enum PodNs {
    /// hostNetwork: the node's namespace is the pod's.
    Host,
    /// The sandbox's own network namespace, held open, where the pod IP lives (issue #44: the
    /// evidence, whatever the runtime handler): probes run inside it.
    Pod(NetNs),
    /// crisp cannot probe from inside the pod's network (`probes.rs`, `Engine::pod_net`): the
    /// runtime names no namespace crisp can open, or the one it names does not hold the pod IP
    /// (a VM or a user-space kernel owns the pod's network), or it is crisp's own. Probes go
    /// from crisp's namespace to the pod's own IPs only (`readiness::outside_target`); its
    /// loopback is out of reach, except where no namespace was found at all (then a loopback
    /// probe fails with why, as before issue #44). Why, for messages.
    Outside(Outside),
}

/// Why crisp probes a pod from outside its network (`Engine::enter`, probes.rs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Outside {
    /// No namespace found or entered; `isolated`: the handler is not one of `[readiness]
    /// shared_kernel_handlers`, the only hint left that its loopback is out of reach.
    #[error("cannot find the sandbox's network namespace: {why}")]
    NoNamespace { why: String, isolated: bool },
    #[error("the runtime names crisp's own network namespace as the sandbox's")]
    CrispsOwn,
    #[error("the sandbox's network namespace does not hold the pod IP: a VM or a user-space kernel owns the pod's network")]
    NotHeld,
}

impl Outside {
    /// The pod's loopback is out of reach: the evidence says its network is elsewhere, or no
    /// namespace was found and its handler is not a shared-kernel one.
    pub(super) fn isolated(&self) -> bool {
        match self {
            Outside::NoNamespace { isolated, .. } => *isolated,
            Outside::CrispsOwn | Outside::NotHeld => true,
        }
    }
}

impl PodNet {
    /// The namespace's path no longer names it (sandbox gone, pid reused): look again.
    pub(super) fn stale(&self) -> bool {
        matches!(&self.ns, PodNs::Pod(ns) if ns.moved())
    }
}

/// A sidecar's last readiness probe, as `crisp pods` and the tap's hold events show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastProbe {
    pub(crate) at: std::time::SystemTime,
    pub(crate) result: readiness::ProbeResult,
}

/// The pod's termination grace budget: one budget per pod, counted from its first StopContainer
/// (DESIGN.md §4.3).
#[derive(Default)]
struct StopWindow {
    first: Option<Instant>,
    grace: Duration,
    apps_stopping: HashSet<String>,
}

impl Pod {
    pub(super) fn new(
        sandbox_id: &str,
        metadata: Option<&views::PodSandboxMetadata>,
        annotations: &HashMap<String, String>,
        labels: HashMap<String, String>,
        host_network: bool,
        rules: &[SidecarRule],
        injectors: &[InjectorRule],
    ) -> (Pod, annotations::Warnings) {
        let (policy, warnings) = PodPolicy::parse_with(annotations, rules, injectors);
        let metadata = metadata.cloned().unwrap_or_default();
        let pod = Pod {
            sandbox_id: sandbox_id.to_string(),
            // Shown in logs, messages, the tap and `crisp pods`: cut and escaped once, here
            // (a name Kubernetes accepts is unchanged).
            namespace: crate::tenant::cut(&metadata.namespace, crate::tenant::MAX_FIELD),
            name: crate::tenant::cut(&metadata.name, crate::tenant::MAX_FIELD),
            uid: metadata.uid,
            host_network,
            labels,
            policy,
            annotations_fp: annotations_fingerprint(annotations),
            net: Mutex::new(None),
            tenant_warned: Mutex::new(HashSet::new()),
            netns_warned: AtomicBool::new(false),
            isolation: OnceLock::new(),
            isolation_warned: AtomicBool::new(false),
            stop: Mutex::new(StopWindow::default()),
            job_watched: AtomicBool::new(false),
            job_done: AtomicBool::new(false),
            emptied: AtomicBool::new(false),
            init_guess: Mutex::new(InitGuess::default()),
            refused_since: Mutex::new(HashMap::new()),
            created_at: AtomicI64::new(0),
            last_probe: Mutex::new(HashMap::new()),
            holds: Mutex::new(HashMap::new()),
            refusals: AtomicU64::new(0),
            held_since: Mutex::new(HashMap::new()),
        };
        (pod, warnings)
    }

    /// Records a StopContainer and returns when the pod's grace budget ends.
    pub(super) fn note_stop(
        &self,
        now: Instant,
        grace: Duration,
        container_id: &str,
        is_app: bool,
    ) -> Instant {
        let mut window = self.stop.lock();
        // A window older than any kill could last (grace + kubelet's 2 min) belongs to an earlier
        // single-container kill, not to this termination.
        let stale = window.first.is_some_and(|first| {
            now.saturating_duration_since(first)
                > window.grace.saturating_add(Duration::from_secs(150))
        });
        if window.first.is_none() || stale {
            *window = StopWindow {
                first: Some(now),
                grace,
                apps_stopping: HashSet::new(),
            };
        }
        if is_app {
            window.apps_stopping.insert(container_id.to_string());
        }
        decide::later(window.first.unwrap_or(now), window.grace)
    }

    /// The pod runs again in its sandbox (restarted in place, KEP-5532): what the gates
    /// remembered of the previous run goes — the stop budget window (a kill of the previous
    /// run must not shorten the next termination's budget), the refusal and hold clocks, the
    /// last probes. What init containers are is the pod's spec, not its run: kept.
    pub(super) fn start_over(&self) {
        *self.stop.lock() = StopWindow::default();
        self.refused_since.lock().clear();
        self.held_since.lock().clear();
        self.last_probe.lock().clear();
    }

    pub(super) fn apps_stopping(&self) -> bool {
        !self.stop.lock().apps_stopping.is_empty()
    }

    /// When the pod's grace budget ends, if a StopContainer started it.
    pub(super) fn budget_end(&self) -> Option<Instant> {
        let window = self.stop.lock();
        window.first.map(|first| decide::later(first, window.grace))
    }

    /// How crisp probes this pod, once it knows the pod's runtime handler: by the evidence once
    /// the pod's network is known (`PodNs`), by the handler (`[readiness]
    /// shared_kernel_handlers`) until then.
    pub(crate) fn isolation(&self) -> Option<Isolation> {
        let expected = self.isolation.get()?;
        let handler = expected.handler().to_string();
        let net = self.net.lock();
        Some(match net.as_deref().map(|n| &n.ns) {
            Some(PodNs::Outside(why)) if why.isolated() => Isolation::Isolated { handler },
            Some(PodNs::Pod(_) | PodNs::Host) => Isolation::SharedKernel { handler },
            Some(PodNs::Outside(_)) | None => expected.clone(),
        })
    }

    /// The last probe of `sidecar`, if crisp probed it.
    pub(crate) fn last_probe(&self, sidecar: &str) -> Option<LastProbe> {
        self.last_probe.lock().get(sidecar).cloned()
    }

    pub(super) fn note_probe(&self, sidecar: &str, result: readiness::ProbeResult) {
        let last = LastProbe {
            at: std::time::SystemTime::now(),
            result,
        };
        self.last_probe.lock().insert(sidecar.to_string(), last);
    }

    pub(super) fn holds(&self) -> MutexGuard<'_, HashMap<u64, holds::HeldCall>> {
        self.holds.lock()
    }

    /// The calls of this pod held now, oldest first.
    pub(crate) fn held_calls(&self) -> Vec<holds::HeldCall> {
        let mut held: Vec<holds::HeldCall> = self.holds().values().cloned().collect();
        held.sort_by_key(|call| (call.since, call.call_id));
        held
    }

    /// `namespace/name` for messages: each cut and escaped (tenant text).
    pub(super) fn display(&self) -> String {
        format!(
            "{}/{}",
            crate::tenant::text(&self.namespace, crate::tenant::MAX_FIELD),
            crate::tenant::text(&self.name, crate::tenant::MAX_FIELD)
        )
    }

    pub(super) fn guess(&self) -> MutexGuard<'_, InitGuess> {
        self.init_guess.lock()
    }

    /// Records a container found to be an init container after the fact (job mode).
    pub(super) fn note_init(&self, container: &str) {
        self.guess().note_init(container);
    }

    /// An init container: named by an annotation, or let through as one.
    pub(crate) fn is_init(&self, container: &str) -> bool {
        self.policy.is_known_init(container) || self.guess().is_init(container)
    }
}

/// A container's name as the caches keep it (logs and views show it): a DNS-1123 label as it is,
/// anything else cut and escaped.
pub(super) fn container_name(name: Option<String>) -> String {
    let name = name.unwrap_or_default();
    if crate::tenant::is_dns1123_label(&name) {
        name
    } else {
        crate::tenant::cut(&name, crate::tenant::MAX_NAME + 1)
    }
}

/// A container's sandbox and name, as the engine caches them by container id.
#[derive(Clone, Debug)]
pub(super) struct ContainerRef {
    pub(super) sandbox_id: String,
    pub(super) name: String,
    /// crisp saw its CreateContainer answered (it went through the create gate); `false`: learnt
    /// from the runtime (a restored pod's container, one created before crisp started).
    pub(super) created_seen: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_recognised_by_its_whole_annotation_set() {
        let a: HashMap<String, String> = [
            (
                "kubernetes.io/config.seen",
                "2026-11-24T10:00:00.123456789Z",
            ),
            ("crisp.dev/sidecars", "proxy"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut pairs: Vec<(&String, &String)> = a.iter().collect();
        pairs.sort();
        pairs.reverse();
        let mut b = HashMap::new();
        for (k, v) in pairs {
            b.insert(k.clone(), v.clone());
        }
        assert_eq!(
            annotations_fingerprint(&a),
            annotations_fingerprint(&b),
            "map order does not matter"
        );
        b.insert(
            "kubernetes.io/config.seen".into(),
            "2026-11-24T10:00:00.123456790Z".into(),
        );
        assert_ne!(
            annotations_fingerprint(&a),
            annotations_fingerprint(&b),
            "another pod, seen 1 ns later"
        );
    }

    #[test]
    fn stop_budget_is_one_window_per_termination() {
        let _ = AtomicBool::new(false);
        let (pod, _) = Pod::new("sb", None, &HashMap::new(), HashMap::new(), false, &[], &[]);
        let t0 = Instant::now();
        let end = pod.note_stop(t0, Duration::from_secs(30), "app", true);
        assert_eq!(end, t0 + Duration::from_secs(30));
        // A later StopContainer of the same termination shares the budget.
        let end2 = pod.note_stop(
            t0 + Duration::from_secs(5),
            Duration::from_secs(30),
            "side",
            false,
        );
        assert_eq!(end2, end);
        assert!(pod.apps_stopping());
        // Long after, a new window starts.
        let t1 = t0 + Duration::from_secs(400);
        assert_eq!(
            pod.note_stop(t1, Duration::from_secs(10), "side", false),
            t1 + Duration::from_secs(10)
        );
        assert!(!pod.apps_stopping());
    }

    /// Issue #26: a grace period near 2^63 (or any duration) never panics the stop budget, and
    /// a later stop of the same pod still shares its window.
    #[test]
    fn an_extreme_grace_period_never_panics_the_stop_budget() {
        for grace in [
            Duration::from_secs(i64::MAX as u64),
            Duration::from_secs(i64::MAX as u64 - 1),
            Duration::MAX,
        ] {
            let (pod, _) = Pod::new("sb", None, &HashMap::new(), HashMap::new(), false, &[], &[]);
            let t0 = Instant::now();
            let end = pod.note_stop(t0, grace, "app", true);
            assert!(
                end > t0 && end <= t0 + Duration::from_secs(86_400 + 120),
                "{grace:?}"
            );
            assert_eq!(
                pod.note_stop(t0 + Duration::from_secs(400), grace, "side", false),
                end,
                "{grace:?}: still one window"
            );
        }
    }
}
