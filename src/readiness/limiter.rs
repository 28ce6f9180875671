//! The probes' node-wide bounds: slots in flight shared fairly between pods, connects (and
//! execs) per second, and each pod's own exec pace.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::bucket::TokenBucket;

/// The node-wide bounds on probing: at most `max_in_flight` probes at once, and TCP connects
/// (tcp:// and http:// probes) at `connects_per_second` (a token bucket holding a tenth of a
/// second's worth, so a burst of pods cannot open more than that at once). A probe that cannot
/// get its slot or its connect before its own deadline is simply "not ready" this round: it is
/// never queued beyond it, so the wait is bounded and no debt piles up.
///
/// Slots are shared fairly between pods (issue #26): one pod holds at most
/// `per_pod` of them (all but a quarter, at least one), and a freed slot goes to the
/// pods waiting in turn, each pod's own probes first come first served. So a pod whose
/// sidecars never get ready, however many probes it queues, cannot keep another pod's probe
/// waiting: that one takes a slot left free for others, or the next one freed. Connects need
/// no queue of their own: a probe connects only while it holds its slot.
///
/// The exec probes' limiter also paces each pod on its own ([`ProbeLimiter::per_pod_rate`],
/// issue #33): a pod takes at most that many turns a second (a quarter of a second's worth at
/// once), waited for before its probe asks for a slot, so one pod with many exec-probed
/// sidecars cannot spend the node's whole per-second budget and keeps no slot idle meanwhile.
pub(crate) struct ProbeLimiter {
    max_in_flight: usize,
    per_pod: usize,
    slots: Mutex<Slots>,
    bucket: Mutex<TokenBucket>,
    /// Each pod's own rate and burst; `None`: pods are paced only by the node's rate.
    pod_rate: Option<(f64, f64)>,
    pod_buckets: Mutex<PodBuckets>,
    /// What a turn of the node's rate starts, as the rate's limit says it: `connects`, or
    /// `execs` for the exec probes' limiter ([`ProbeLimiter::for_execs`]).
    turns: &'static str,
}

/// The pods' own token buckets. A full bucket carries nothing a new one would not (it starts
/// full), so full ones are dropped when the map grows: its size is bounded by the pods that
/// probed within the last quarter of a second or so, not by every pod the node ever ran.
pub(super) struct PodBuckets {
    by_pod: HashMap<String, TokenBucket>,
    /// The map is swept of full buckets when it reaches this size (then twice what is left, at
    /// least [`POD_BUCKETS_SWEEP`]), so the sweeps cost O(1) a probe amortised.
    sweep_at: usize,
}

/// Fewest pods' buckets kept before the full ones are swept.
pub(super) const POD_BUCKETS_SWEEP: usize = 256;

/// Who holds and who waits for the probe slots.
#[derive(Default)]
pub(super) struct Slots {
    in_flight: usize,
    /// Slots held, by pod.
    held: HashMap<String, usize>,
    /// Probes waiting, by pod, oldest first.
    queues: HashMap<String, VecDeque<Arc<Waiter>>>,
    /// Pods with a probe waiting, in the order they are served: least recently served first.
    turn: VecDeque<String>,
    /// When each pod last took a slot (a count of slots taken, node-wide); a pod not in it
    /// has not taken one for [`SERVED_MEMORY`] slots, and goes before every pod that has.
    served: HashMap<String, u64>,
    /// Slots taken so far.
    seq: u64,
}

/// How many slots back [`Slots::served`] remembers who took them (its size is bounded by it).
pub(super) const SERVED_MEMORY: u64 = 4096;

/// One probe waiting for a slot: `granted` is set (under the [`Slots`] lock) when a slot is
/// handed to it.
#[derive(Default)]
pub(super) struct Waiter {
    granted: AtomicBool,
    notify: Notify,
}

impl Slots {
    fn may_take(&self, pod: &str, max: usize, per_pod: usize) -> bool {
        self.in_flight < max && self.held.get(pod).copied().unwrap_or(0) < per_pod
    }

    fn take(&mut self, pod: &str) {
        self.in_flight += 1;
        *self.held.entry(pod.to_string()).or_default() += 1;
        self.seq += 1;
        self.served.insert(pod.to_string(), self.seq);
        if self.served.len() as u64 > 2 * SERVED_MEMORY {
            let oldest = self.seq.saturating_sub(SERVED_MEMORY);
            self.served.retain(|_, at| *at > oldest);
        }
    }

    /// A pod's first waiting probe takes its place in the turn: behind the pods served less
    /// recently than it, before the others. A pod that has not probed for a while (a newly
    /// held pod, whose sidecar may well be ready) goes first; pods that probe again and again
    /// (never-ready sidecars) take turns behind it.
    fn join_turn(&mut self, pod: &str) {
        let at = |p: &str| self.served.get(p).copied().unwrap_or(0);
        let mine = at(pod);
        let place = self
            .turn
            .iter()
            .position(|p| at(p) > mine)
            .unwrap_or(self.turn.len());
        self.turn.insert(place, pod.to_string());
    }

    fn give_back(&mut self, pod: &str) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(n) = self.held.get_mut(pod) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(pod);
            }
        }
    }

    /// Hands free slots to waiting probes, one pod after the other.
    fn dispatch(&mut self, max: usize, per_pod: usize) {
        let mut passes = self.turn.len();
        while self.in_flight < max && passes > 0 {
            let Some(pod) = self.turn.pop_front() else {
                break;
            };
            if !self.may_take(&pod, max, per_pod) {
                self.turn.push_back(pod);
                passes -= 1;
                continue;
            }
            let queue = self.queues.get_mut(&pod);
            let (waiter, more) = match queue {
                Some(q) => (q.pop_front(), !q.is_empty()),
                None => (None, false),
            };
            if more {
                self.turn.push_back(pod.clone());
            } else {
                self.queues.remove(&pod);
            }
            if let Some(w) = waiter {
                self.take(&pod);
                w.granted.store(true, Ordering::Relaxed);
                w.notify.notify_one();
            }
            passes = self.turn.len();
        }
    }

    /// A waiter gives up: out of its pod's queue.
    fn forget(&mut self, pod: &str, waiter: &Arc<Waiter>) {
        if let Some(q) = self.queues.get_mut(pod) {
            q.retain(|w| !Arc::ptr_eq(w, waiter));
            if q.is_empty() {
                self.queues.remove(pod);
                self.turn.retain(|p| p != pod);
            }
        }
    }
}

/// A probe slot, given back when dropped.
pub(crate) struct ProbeSlot<'a> {
    limiter: &'a ProbeLimiter,
    pod: String,
}

impl std::fmt::Debug for ProbeSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeSlot").field("pod", &self.pod).finish()
    }
}

impl Drop for ProbeSlot<'_> {
    fn drop(&mut self) {
        self.limiter.release(&self.pod);
    }
}

/// A probe's place in its pod's queue while it waits: leaves the queue when the wait ends,
/// and gives back a slot handed to it just as it gave up.
pub(super) struct Queued<'a> {
    limiter: &'a ProbeLimiter,
    pod: &'a str,
    waiter: Arc<Waiter>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let l = self.limiter;
        let mut s = l.lock_slots();
        if self.waiter.granted.swap(false, Ordering::Relaxed) {
            s.give_back(self.pod);
            s.dispatch(l.max_in_flight, l.per_pod);
        } else {
            s.forget(self.pod, &self.waiter);
        }
    }
}

impl ProbeLimiter {
    pub(crate) fn new(max_in_flight: usize, connects_per_second: u32) -> ProbeLimiter {
        let rate = f64::from(connects_per_second.max(1));
        let burst = (rate / 10.0).max(1.0);
        let max_in_flight = max_in_flight.max(1);
        ProbeLimiter {
            max_in_flight,
            per_pod: (max_in_flight - max_in_flight / 4).max(1),
            slots: Mutex::new(Slots::default()),
            bucket: Mutex::new(TokenBucket::new(rate, burst, Instant::now())),
            pod_rate: None,
            pod_buckets: Mutex::new(PodBuckets {
                by_pod: HashMap::new(),
                sweep_at: POD_BUCKETS_SWEEP,
            }),
            turns: "connects",
        }
    }

    /// The exec probes' limiter: a turn of its node-wide rate starts an ExecSync, not a
    /// connect, and its limit says so (`exec node-wide probe limit: 50 execs per second`).
    pub(crate) fn for_execs(mut self) -> ProbeLimiter {
        self.turns = "execs";
        self
    }

    /// Paces each pod to `per_second` turns (see [`ProbeLimiter::pod_turn`]), a quarter of a
    /// second's worth at once (kubelet creating a pod's few app containers one after the other
    /// probes its sidecars once per CreateContainer: five at the default rate wait for
    /// nothing). A pod's rate at or above the node's would add nothing: it is
    /// not kept, and pods are paced by the node's rate alone.
    pub(crate) fn per_pod_rate(mut self, per_second: u32) -> ProbeLimiter {
        let rate = f64::from(per_second.max(1));
        let node_rate = self.bucket.get_mut().rate();
        self.pod_rate = (rate < node_rate).then_some((rate, (rate / 4.0).max(1.0)));
        self
    }

    /// A turn of `pod`'s own rate, waited for until `deadline` at most: `Ok` with how long it
    /// waited (zero for a pod within its burst), or why not, at once, when the turn would come
    /// after the deadline (nothing is taken then, so a probe that gives up leaves no debt). A
    /// limiter without a per-pod rate always answers `Ok(0)`.
    pub(crate) async fn pod_turn(&self, pod: &str, deadline: Instant) -> Result<Duration, String> {
        let Some((rate, burst)) = self.pod_rate else {
            return Ok(Duration::ZERO);
        };
        let wait = {
            let mut buckets = self.pod_buckets.lock();
            let now = Instant::now();
            if !buckets.by_pod.contains_key(pod) && buckets.by_pod.len() >= buckets.sweep_at {
                buckets.by_pod.retain(|_, b| !b.is_full(now));
                buckets.sweep_at = (2 * buckets.by_pod.len()).max(POD_BUCKETS_SWEEP);
            }
            let bucket = buckets
                .by_pod
                .entry(pod.to_string())
                .or_insert_with(|| TokenBucket::new(rate, burst, now));
            bucket
                .reserve(Some(deadline))
                .ok_or_else(|| format!("per-pod probe limit: {rate} a second"))?
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(wait)
    }

    /// Pods with a bucket kept (full ones are swept as the map grows).
    #[cfg(test)]
    pub(crate) fn pod_buckets(&self) -> usize {
        self.pod_buckets.lock().by_pod.len()
    }

    fn lock_slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock()
    }

    /// A probe slot for a probe of `pod` (its sandbox id), waited for until `deadline` at most.
    pub(crate) async fn slot(&self, pod: &str, deadline: Instant) -> Result<ProbeSlot<'_>, String> {
        let waiter = {
            let mut s = self.lock_slots();
            // Nobody of this pod is queued before it, and any other pod's queued probe waits
            // for its own pod's share: taking a free slot passes nobody.
            if !s.queues.contains_key(pod) && s.may_take(pod, self.max_in_flight, self.per_pod) {
                s.take(pod);
                return Ok(ProbeSlot {
                    limiter: self,
                    pod: pod.to_string(),
                });
            }
            let w = Arc::new(Waiter::default());
            if !s.queues.contains_key(pod) {
                s.join_turn(pod);
            }
            s.queues
                .entry(pod.to_string())
                .or_default()
                .push_back(w.clone());
            w
        };
        let queued = Queued {
            limiter: self,
            pod,
            waiter,
        };
        let _ = tokio::time::timeout_at(deadline, async {
            while !queued.waiter.granted.load(Ordering::Relaxed) {
                queued.waiter.notify.notified().await;
            }
        })
        .await;
        // Handed a slot (maybe just as the deadline passed): it is this probe's now, and the
        // queue guard must not give it back. Not handed one: the guard leaves the queue.
        let won = {
            let _s = self.lock_slots();
            queued.waiter.granted.swap(false, Ordering::Relaxed)
        };
        drop(queued);
        if won {
            Ok(ProbeSlot {
                limiter: self,
                pod: pod.to_string(),
            })
        } else {
            Err(format!(
                "node-wide probe limit: {} probes in flight",
                self.max_in_flight
            ))
        }
    }

    fn release(&self, pod: &str) {
        let mut s = self.lock_slots();
        s.give_back(pod);
        s.dispatch(self.max_in_flight, self.per_pod);
    }

    /// Probes running now.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.lock_slots().in_flight
    }

    /// One turn of the node-wide rate: leave to open one connection (to start one ExecSync,
    /// for the exec probes' limiter), waited for until `deadline` at most. A token is taken
    /// only when it will be there in time, so a probe that gives up leaves no debt behind.
    pub(crate) async fn rate_turn(&self, deadline: Instant) -> Result<(), String> {
        let wait = {
            let mut bucket = self.bucket.lock();
            bucket.reserve(Some(deadline)).ok_or_else(|| {
                format!(
                    "node-wide probe limit: {} {} per second",
                    bucket.rate(),
                    self.turns
                )
            })
        }?;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(())
    }
}
