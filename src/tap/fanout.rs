//! The tap's fan-out thread: the one place that evaluates each subscriber's filter and offers
//! an event into its queue. The relay thread only decides, in constant time from the hub's
//! aggregates ([`super::hub::Hub::may_want`]), whether to build an event, and hands it over
//! with one `try_send` into a bounded channel: with 1,024 taps open, a CRI call still costs the
//! relay thread the same few atomic loads, never a loop over the subscribers. Hold events (from
//! the ordering engine's tasks) go through the same channel, so every subscriber sees calls and
//! holds in the order they were handed over (one thread, one channel).
//!
//! A std thread rather than a tokio task: a tap is built (and may be subscribed to) outside any
//! runtime, and the thread's work — filters and `try_send`s — never waits. It starts with the
//! first subscriber and ends when the tap closes ([`super::Tap::close`]) or is dropped.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use super::hub::{Ev, Hub};
use super::{RawEvent, RawMessage};
use crate::hold_events::{HoldEvent, HoldOutcome, HoldPhase};
use crate::metrics::CallMetrics;

/// Events waiting for the fan-out thread; beyond it (or beyond a quarter of the hub's memory
/// bound in bytes) an event is dropped before any subscriber's filter saw it, counted in
/// `crisp_tap_events_dropped_total`, and reported to every subscriber as missed with its next
/// event: which subscribers would have shown it is not known, so a filtered tap may be told of
/// events it would not have shown — never left believing it missed none.
/// One thread that only filters and `try_send`s keeps up with any CRI call rate.
pub(super) const FANOUT_QUEUE: usize = 1024;

pub(super) enum Job {
    Call(Arc<RawEvent>),
    Hold(Arc<HoldEvent>),
    Message(Arc<RawMessage>),
    /// Look at the hub again: it was closed.
    Wake,
    /// Answer once every job before this one is done.
    #[cfg(test)]
    Flush(SyncSender<()>),
}

impl Job {
    fn weight(&self) -> usize {
        match self {
            Job::Call(e) => Ev::Call(e.clone()).weight(),
            Job::Hold(h) => Ev::Hold(h.clone()).weight(),
            Job::Message(m) => Ev::Message(m.clone()).weight(),
            _ => 0,
        }
    }
}

/// Starts the fan-out thread of `hub`; it ends once the returned sender is dropped or the hub
/// is closed. A thread that cannot start is logged, and every event handed to it is counted
/// as dropped.
pub(super) fn spawn(hub: Arc<Hub>, metrics: Arc<CallMetrics>) -> SyncSender<Job> {
    let (tx, rx) = sync_channel(FANOUT_QUEUE);
    let started = std::thread::Builder::new()
        .name("crisp-tap-fanout".into())
        .spawn(move || run(rx, &hub, &metrics));
    if let Err(e) = started {
        tracing::error!(error = %e, "cannot start the tap's fan-out thread; tap events are dropped");
    }
    tx
}

/// Hands `job` to the fan-out thread without waiting: a full channel, or its bytes bound
/// reached, drops it and counts it.
pub(super) fn send(tx: &SyncSender<Job>, job: Job, hub: &Hub, metrics: &CallMetrics) {
    let w = job.weight();
    let queued = hub.memory.fanout.fetch_add(w, Relaxed);
    let sent = if queued + w > hub.memory.fanout_limit() {
        false
    } else {
        match tx.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    };
    if !sent {
        hub.memory.fanout.fetch_sub(w, Relaxed);
        hub.fanout_dropped.fetch_add(1, Relaxed);
        metrics.tap_dropped.inc();
    }
}

fn run(rx: Receiver<Job>, hub: &Hub, metrics: &CallMetrics) {
    while let Ok(job) = rx.recv() {
        hub.memory.fanout.fetch_sub(job.weight(), Relaxed);
        if hub.closed.load(Relaxed) {
            break;
        }
        hub.spread_fanout_drops();
        match job {
            Job::Call(ev) => call(&ev, hub, metrics),
            Job::Hold(ev) => hold(&ev, hub, metrics),
            Job::Message(ev) => message(&ev, hub, metrics),
            Job::Wake => {}
            #[cfg(test)]
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn call(ev: &Arc<RawEvent>, hub: &Hub, metrics: &CallMetrics) {
    for s in hub.snapshot().iter() {
        if s.filter.wants_route(&ev.route, &ev.path)
            && s.filter.wants_outcome(ev.code, ev.duration)
            && s.filter
                .wants_names(&ev.ids.pod_namespace, &ev.ids.pod_name)
        {
            s.offer(Ev::Call(ev.clone()), &hub.memory, metrics);
        }
    }
}

fn message(ev: &Arc<RawMessage>, hub: &Hub, metrics: &CallMetrics) {
    for s in hub.snapshot().iter() {
        // A streamed list names no pod: a pod filter leaves its messages out, as its call.
        if s.filter.wants_route(&ev.route, &ev.path)
            && s.filter.wants_messages()
            && s.filter.wants_names("", "")
        {
            s.offer(Ev::Message(ev.clone()), &hub.memory, metrics);
        }
    }
}

fn hold(ev: &Arc<HoldEvent>, hub: &Hub, metrics: &CallMetrics) {
    let failed = ev.phase == HoldPhase::Refused
        || (ev.phase == HoldPhase::End && ev.outcome != Some(HoldOutcome::Forwarded));
    for s in hub.snapshot().iter() {
        if s.filter.wants_route(&ev.route, &ev.path)
            && (!s.filter.errors_only || failed)
            && s.filter.wants_names(&ev.pod_namespace, &ev.pod_name)
        {
            s.offer(Ev::Hold(ev.clone()), &hub.memory, metrics);
        }
    }
}
