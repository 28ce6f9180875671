//! The tap's subscription hub: who subscribes with which filter, each subscriber's bounded
//! queue, and the interest bitmaps and aggregates the call path reads (a few atomic loads,
//! whatever the number of subscribers) to know whether anyone may want a call. Only the fan-out
//! thread (`fanout.rs`) offers into a queue ([`Sub::offer`]), and never waits: a full queue, or
//! all queues together over the hub's memory bound, drops the event for that subscriber and
//! counts it, and the subscriber learns how many it missed ([`Item::Dropped`]).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::mpsc;

use super::{Filter, RawEvent, RawMessage};
use crate::cri::Rpc;
use crate::hold_events::HoldEvent;
use crate::metrics::CallMetrics;

/// Most bytes of messages queued for one subscriber; beyond it events are dropped (and counted)
/// even if the queue has room: `--full --all` on a node with big List responses must not grow
/// crisp's memory without bound.
pub(crate) const MAX_QUEUED_BYTES: usize = 64 << 20;

// One interest bit per RPC plus bit 63 for unknown paths.
const _: () = assert!(Rpc::ALL.len() < 63);

pub(super) fn bit(rpc: Option<Rpc>) -> u64 {
    match rpc {
        Some(r) => 1u64 << (r as u32),
        None => 1u64 << 63,
    }
}

/// What a subscription yields.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Call(Arc<RawEvent>),
    /// A call held or refused, while it happens.
    Hold(Arc<HoldEvent>),
    /// One message of a streamed response, as it passed.
    Message(Arc<RawMessage>),
    /// `count` events were dropped for this subscriber just before the next one (`total` since
    /// it subscribed).
    Dropped {
        count: u64,
        total: u64,
    },
}

/// One queued event: a finished call, or a hold.
#[derive(Debug, Clone)]
pub(super) enum Ev {
    Call(Arc<RawEvent>),
    Hold(Arc<HoldEvent>),
    Message(Arc<RawMessage>),
}

impl Ev {
    pub(super) fn weight(&self) -> usize {
        match self {
            Ev::Call(e) => e.weight(),
            Ev::Hold(_) => 512,
            Ev::Message(m) => m.weight(),
        }
    }

    fn item(self) -> Item {
        match self {
            Ev::Call(e) => Item::Call(e),
            Ev::Hold(h) => Item::Hold(h),
            Ev::Message(m) => Item::Message(m),
        }
    }
}

struct Queued {
    ev: Ev,
    /// Events dropped for this subscriber just before this one.
    missed: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    dropped: AtomicU64,
    pub(super) queued_bytes: AtomicUsize,
}

/// The hub's side of one subscriber.
pub(super) struct Sub {
    id: u64,
    pub(super) filter: Filter,
    tx: mpsc::Sender<Queued>,
    pub(super) counters: Arc<Counters>,
}

impl Sub {
    /// Never waits: a full queue, or all subscribers' queues together over the hub's memory
    /// bound (`memory`), drops the event for this subscriber only, and counts it.
    pub(super) fn offer(&self, ev: Ev, memory: &Memory, metrics: &CallMetrics) {
        let w = ev.weight();
        let queued = self.counters.queued_bytes.fetch_add(w, Relaxed);
        let total = memory.queued.fetch_add(w, Relaxed);
        let missed = self.counters.dropped.swap(0, Relaxed);
        let fail = |missed: u64, lost: u64| {
            self.counters.queued_bytes.fetch_sub(w, Relaxed);
            memory.queued.fetch_sub(w, Relaxed);
            self.counters.dropped.fetch_add(missed + lost, Relaxed);
            metrics.tap_dropped.inc_by(lost);
        };
        if queued + w > MAX_QUEUED_BYTES || total + w > memory.limit {
            return fail(missed, 1);
        }
        match self.tx.try_send(Queued { ev, missed }) {
            Ok(()) => {
                metrics.tap_events.inc();
            }
            Err(mpsc::error::TrySendError::Full(q)) => fail(q.missed, 1),
            // The subscriber is going away; it is being removed from the hub.
            Err(mpsc::error::TrySendError::Closed(q)) => fail(q.missed, 0),
        }
    }
}

/// The bytes queued for all subscribers together (each event counted once per queue it is in)
/// and their bound; and the bytes of events waiting for the fan-out thread, bounded apart (at a
/// quarter of it) so that full subscriber queues still get their events offered, dropped and
/// reported to them ([`Item::Dropped`]).
pub(super) struct Memory {
    pub(super) queued: AtomicUsize,
    pub(super) limit: usize,
    pub(super) fanout: AtomicUsize,
}

impl Memory {
    /// Most bytes of events waiting for the fan-out thread.
    pub(super) fn fanout_limit(&self) -> usize {
        self.limit / 4
    }
}

/// The set of subscribers, and the interest bitmaps and aggregates derived from their filters.
pub(super) struct Hub {
    subs: RwLock<Arc<Vec<Arc<Sub>>>>,
    pub(super) count: AtomicUsize,
    /// RPCs (bit per `Rpc`, bit 63 unknown paths) some subscriber may want: their requests are
    /// read for ids.
    pub(super) want: AtomicU64,
    /// ... and with `full`: their responses are read too.
    pub(super) want_full: AtomicU64,
    /// RPCs some subscriber may want the messages of (a streamed response): one that does not
    /// filter on the outcome, which a message does not have yet.
    pub(super) want_messages: AtomicU64,
    /// Whether some subscriber wants calls that succeeded (not `errors_only`).
    pub(super) want_ok: AtomicBool,
    /// The smallest `slower_than` of all subscribers, in nanoseconds (`u64::MAX`: nobody).
    pub(super) min_slower_than: AtomicU64,
    pub(super) memory: Memory,
    next_id: AtomicU64,
    pub(super) closed: AtomicBool,
    /// Events dropped before the fan-out thread saw them (its queue full): no filter ran on
    /// them, so each subscriber is told of them as missed, whether or not it would have shown
    /// them ([`Hub::spread_fanout_drops`]).
    pub(super) fanout_dropped: AtomicU64,
}

impl Hub {
    /// A hub whose subscribers' queues hold at most `memory` bytes together.
    pub(super) fn new(memory: usize) -> Hub {
        Hub {
            subs: RwLock::default(),
            count: AtomicUsize::new(0),
            want: AtomicU64::new(0),
            want_full: AtomicU64::new(0),
            want_messages: AtomicU64::new(0),
            want_ok: AtomicBool::new(false),
            min_slower_than: AtomicU64::new(u64::MAX),
            memory: Memory {
                queued: AtomicUsize::new(0),
                limit: memory,
                fanout: AtomicUsize::new(0),
            },
            next_id: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            fanout_dropped: AtomicU64::new(0),
        }
    }

    /// Counts the events the fan-out queue dropped since the last call as missed by every
    /// subscriber: each learns of them with its next event ([`Item::Dropped`]). On the fan-out
    /// thread, before each job.
    pub(super) fn spread_fanout_drops(&self) {
        let lost = self.fanout_dropped.swap(0, Relaxed);
        if lost > 0 {
            for s in self.snapshot().iter() {
                s.counters.dropped.fetch_add(lost, Relaxed);
            }
        }
    }

    /// Whether some subscriber may want a finished call of `rpc` with this outcome: decided
    /// from the aggregates alone, in constant time, on the relay thread. Conservative (it may
    /// say yes to a call no subscriber shows); the fan-out thread applies each filter whole.
    pub(super) fn may_want(&self, rpc: Option<Rpc>, code: Option<i32>, duration: Duration) -> bool {
        self.want.load(Relaxed) & bit(rpc) != 0
            && (code != Some(0) || self.want_ok.load(Relaxed))
            && duration.as_nanos() >= u128::from(self.min_slower_than.load(Relaxed))
    }

    pub(super) fn snapshot(&self) -> Arc<Vec<Arc<Sub>>> {
        self.subs.read().clone()
    }

    fn update(&self, f: impl FnOnce(&mut Vec<Arc<Sub>>)) {
        let mut g = self.subs.write();
        let mut v: Vec<Arc<Sub>> = g.as_ref().clone();
        f(&mut v);
        let (mut want, mut full, mut messages) = (0u64, 0u64, 0u64);
        let want_ok = v.iter().any(|s| !s.filter.errors_only);
        let min_slower_than = v
            .iter()
            .map(|s| u64::try_from(s.filter.slower_than.as_nanos()).unwrap_or(u64::MAX))
            .min()
            .unwrap_or(u64::MAX);
        for s in &v {
            for rpc in Rpc::ALL
                .iter()
                .copied()
                .map(Some)
                .chain(std::iter::once(None))
            {
                if s.filter.may_want_rpc(rpc) {
                    want |= bit(rpc);
                    if s.filter.full {
                        full |= bit(rpc);
                    }
                    if s.filter.wants_messages() {
                        messages |= bit(rpc);
                    }
                }
            }
        }
        self.want.store(want, Relaxed);
        self.want_full.store(full, Relaxed);
        self.want_messages.store(messages, Relaxed);
        self.want_ok.store(want_ok, Relaxed);
        self.min_slower_than.store(min_slower_than, Relaxed);
        self.count.store(v.len(), Relaxed);
        *g = Arc::new(v);
    }

    /// Attaches a subscriber with a queue of `queue` events (none once the hub is closed: its
    /// subscription ends at once).
    pub(super) fn subscribe(
        self: &Arc<Self>,
        filter: Filter,
        queue: usize,
        metrics: &Arc<CallMetrics>,
    ) -> Subscription {
        let (tx, rx) = mpsc::channel(queue.max(1));
        let counters = Arc::new(Counters::default());
        let id = self.next_id.fetch_add(1, Relaxed);
        let sub = Arc::new(Sub {
            id,
            filter,
            tx,
            counters: counters.clone(),
        });
        if !self.closed.load(Relaxed) {
            self.update(|v| v.push(sub));
        }
        metrics.tap_subscribers.set(self.count.load(Relaxed) as i64);
        Subscription {
            id,
            rx,
            counters,
            hub: self.clone(),
            metrics: metrics.clone(),
            pending: None,
            total_dropped: 0,
        }
    }

    /// Ends every subscription (their queued events are still delivered) and refuses new ones.
    pub(super) fn close(&self, metrics: &CallMetrics) {
        self.closed.store(true, Relaxed);
        self.update(Vec::clear);
        metrics.tap_subscribers.set(0);
    }
}

/// A subscriber's end: events in the order calls ended, with drop markers.
pub(crate) struct Subscription {
    id: u64,
    rx: mpsc::Receiver<Queued>,
    counters: Arc<Counters>,
    hub: Arc<Hub>,
    metrics: Arc<CallMetrics>,
    pending: Option<Ev>,
    total_dropped: u64,
}

impl Subscription {
    fn dropped(&mut self, count: u64) -> Item {
        self.total_dropped += count;
        Item::Dropped {
            count,
            total: self.total_dropped,
        }
    }

    fn take(&mut self, q: Queued) -> Item {
        let w = q.ev.weight();
        self.counters.queued_bytes.fetch_sub(w, Relaxed);
        self.hub.memory.queued.fetch_sub(w, Relaxed);
        if q.missed > 0 {
            self.pending = Some(q.ev);
            return self.dropped(q.missed);
        }
        q.ev.item()
    }

    /// The next event; `None` once the tap is closed (crisp shutting down).
    pub(crate) async fn next(&mut self) -> Option<Item> {
        if let Some(ev) = self.pending.take() {
            return Some(ev.item());
        }
        let q = match self.rx.try_recv() {
            Ok(q) => q,
            Err(e) => {
                // Caught up: report drops no later event has carried yet.
                let d = self.counters.dropped.swap(0, Relaxed);
                if d > 0 {
                    return Some(self.dropped(d));
                }
                if e == mpsc::error::TryRecvError::Disconnected {
                    return None;
                }
                self.rx.recv().await?
            }
        };
        Some(self.take(q))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // What is still queued gives its bytes back to the hub's bound: no offer succeeds once
        // the queue is closed, so none is left uncounted.
        self.rx.close();
        while let Ok(q) = self.rx.try_recv() {
            let w = q.ev.weight();
            self.counters.queued_bytes.fetch_sub(w, Relaxed);
            self.hub.memory.queued.fetch_sub(w, Relaxed);
        }
        let id = self.id;
        self.hub.update(|v| v.retain(|s| s.id != id));
        self.metrics
            .tap_subscribers
            .set(self.hub.count.load(Relaxed) as i64);
    }
}
