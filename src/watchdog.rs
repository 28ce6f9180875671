//! Liveness that means progress: every relay thread and the async runtime report that they turn,
//! a supervisor thread judges them, and systemd hears `WATCHDOG=1` only while the judgement is
//! good (RELIABILITY.md, "crisp's own faults").
//!
//! - **Relay threads** ([`Beat`]): each stores, with one relaxed atomic, when it left `poll(2)`
//!   to work and when it went back to wait. A thread that has been working for longer than
//!   [`Options::relay_stall`] is stuck (an interceptor blocked on it, a bug): the supervisor shuts
//!   its two sockets down, so kubelet sees its connection close at once and reconnects to a new,
//!   healthy thread instead of waiting for its calls' 2-minute deadline. Counted and logged once.
//! - **The async runtime** (tokio): a task ticks every [`TICK`]; how late each tick runs is the
//!   runtime's scheduling latency (kept as a maximum since the last scrape). No tick for
//!   [`Options::runtime_stall`]: the runtime is wedged (every worker blocked).
//! - **Health**: the runtime ticks, and no relay thread stays stuck after its sockets were shut
//!   down (a thread that cannot even notice that is stuck for good: only a restart frees it).
//!   While healthy, the supervisor sends `WATCHDOG=1` at a third of `WATCHDOG_USEC`; once not,
//!   it stops, and systemd (`WatchdogSec=` in crisp.service) kills and restarts crisp. With
//!   `crisp.socket` the listening socket stays open meanwhile: kubelet's new connections wait in
//!   its backlog.
//!
//! The supervisor is a thread of its own, not a tokio task, so that a wedged runtime cannot
//! silence it. The hot path pays two relaxed stores per `poll` wakeup (no clock read of its
//! own: the relay reads the clock after each `poll` anyway); BENCHMARKS.md measures it.

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How often the runtime's heartbeat task ticks.
pub(crate) const TICK: Duration = Duration::from_millis(250);
/// The high bit of [`Beat::state`]: the thread waits in `poll(2)`.
const WAITING: u64 = 1 << 63;

/// The watchdog's bounds (`[watchdog]` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// A relay thread busy this long without returning to `poll(2)` is stuck.
    pub relay_stall: Duration,
    /// The async runtime's heartbeat missing this long: the runtime is wedged.
    pub runtime_stall: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            relay_stall: Duration::from_secs(5),
            runtime_stall: Duration::from_secs(10),
        }
    }
}

/// Nanoseconds since the first time anything here read the clock: what the atomics hold.
fn nanos(t: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    // Saturates at 0 for an instant before the epoch, and never reaches the high bit (292 y).
    t.saturating_duration_since(epoch).as_nanos() as u64 & !WAITING
}

/// What the supervisor knows of one relay thread (one kubelet connection).
pub(crate) struct Beat {
    /// The connection's number, for logs and the dump.
    pub(crate) id: u64,
    opened: Instant,
    /// [`WAITING`] | when it started waiting, or when it started working.
    state: AtomicU64,
    /// The supervisor shut this connection's sockets down.
    closed: AtomicBool,
    /// Copies of the connection's sockets (the same sockets: shutting a copy down ends both).
    sockets: Mutex<Vec<UnixStream>>,
    /// What the thread last said about its connection ([`Beat::report`]).
    report: Mutex<Option<ConnReport>>,
    report_wanted: AtomicBool,
    /// Wakes the thread from `poll(2)` so that it answers [`Beat::report_wanted`].
    waker: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl Beat {
    /// How to wake the thread from `poll(2)` (its connection's eventfd).
    pub(crate) fn set_waker(&self, wake: Box<dyn Fn() + Send + Sync>) {
        *self.waker.lock() = Some(wake);
    }

    /// The thread goes to wait in `poll(2)`; `now`: the clock it read last.
    #[inline]
    pub(crate) fn waiting(&self, now: Instant) {
        self.state.store(nanos(now) | WAITING, Relaxed);
    }

    /// The thread is back from `poll(2)` at `now`, working.
    #[inline]
    pub(crate) fn working(&self, now: Instant) {
        self.state.store(nanos(now), Relaxed);
    }

    /// Someone (the admin socket) asked for a [`ConnReport`]: the thread should write one.
    #[inline]
    pub(crate) fn report_wanted(&self) -> bool {
        self.report_wanted.load(Relaxed)
    }

    /// The thread's answer to [`Beat::report_wanted`].
    pub(crate) fn report(&self, r: ConnReport) {
        *self.report.lock() = Some(r);
        self.report_wanted.store(false, Relaxed);
    }

    /// How long the thread has been working without waiting (zero while it waits).
    fn busy_for(&self, now: Instant) -> Duration {
        let s = self.state.load(Relaxed);
        if s & WAITING != 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(nanos(now).saturating_sub(s))
    }

    /// Since when the thread last changed between waiting and working.
    fn since(&self, now: Instant) -> (bool, Duration) {
        let s = self.state.load(Relaxed);
        (
            s & WAITING != 0,
            Duration::from_nanos(nanos(now).saturating_sub(s & !WAITING)),
        )
    }

    fn shut_down(&self) {
        for s in self.sockets.lock().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A connection's state as its relay thread reports it on request (the admin socket's dump).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnReport {
    /// Streams in flight: id, route, age.
    pub streams: Vec<(u32, String, Duration)>,
    /// Bytes waiting to be written to the client and to the runtime.
    pub queued_to_client: usize,
    pub queued_to_runtime: usize,
    /// The connection is served on the observed path (no runtime connection of its own).
    pub degraded: bool,
    /// crisp sent the client GOAWAY.
    pub going_away: bool,
}

/// One connection in [`Watchdog::connections`].
#[derive(Debug, Clone)]
pub struct ConnState {
    pub id: u64,
    pub age: Duration,
    /// Waiting in `poll(2)` (else working) for `for_`.
    pub waiting: bool,
    pub for_: Duration,
    /// The supervisor shut its sockets down (stuck).
    pub closed: bool,
    /// The thread's own report, when it answered in time.
    pub report: Option<ConnReport>,
}

/// Counters and gauges the admin socket serves as metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Relay threads found stuck (their connections closed).
    pub relay_stalls: AtomicU64,
    /// Times the async runtime missed its heartbeat for `runtime_stall`.
    pub runtime_stalls: AtomicU64,
    /// Highest scheduling latency of the runtime's heartbeat since the last scrape, in µs.
    pub runtime_lag_max_us: AtomicU64,
    /// `WATCHDOG=1` notifications sent.
    pub notifications: AtomicU64,
    /// 1 while every check passes.
    pub healthy: AtomicBool,
}

/// Why crisp is not healthy ([`Watchdog::verdict`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unhealthy {
    #[error("the async runtime has not run its heartbeat for {0:?} (every worker blocked?)")]
    RuntimeStalled(Duration),
    #[error(
        "relay thread of connection {id} has been stuck for {busy:?}, {after:?} after its \
         sockets were shut down"
    )]
    RelayStuck {
        id: u64,
        busy: Duration,
        after: Duration,
    },
}

/// The registry of relay threads, the runtime's heartbeat and the judgement on them.
pub struct Watchdog {
    opts: Options,
    beats: Mutex<Vec<Arc<Beat>>>,
    next_id: AtomicU64,
    /// When the runtime's heartbeat last ran ([`nanos`]); 0: not started.
    runtime_tick: AtomicU64,
    pub counters: Counters,
    /// The last round's verdict, for `/healthz` and `crisp doctor`.
    verdict: Mutex<Result<(), Unhealthy>>,
    stop: AtomicBool,
}

impl Watchdog {
    pub fn new(opts: Options) -> Arc<Watchdog> {
        // The clock's zero is no later than any instant the watchdog is given afterwards.
        nanos(Instant::now());
        Arc::new(Watchdog {
            opts,
            beats: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            runtime_tick: AtomicU64::new(0),
            counters: Counters {
                healthy: AtomicBool::new(true),
                ..Counters::default()
            },
            verdict: Mutex::new(Ok(())),
            stop: AtomicBool::new(false),
        })
    }

    /// The last supervisor round's verdict.
    pub fn verdict(&self) -> Result<(), Unhealthy> {
        self.verdict.lock().clone()
    }

    /// Registers a relay thread; `sockets`: copies of its client and runtime sockets, shut down
    /// if it gets stuck. Unregistered when the returned guard drops.
    pub(crate) fn register(self: &Arc<Self>, sockets: Vec<UnixStream>) -> Registered {
        let now = Instant::now();
        let beat = Arc::new(Beat {
            id: self.next_id.fetch_add(1, Relaxed),
            opened: now,
            state: AtomicU64::new(nanos(now) | WAITING),
            closed: AtomicBool::new(false),
            sockets: Mutex::new(sockets),
            report: Mutex::new(None),
            report_wanted: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        self.beats.lock().push(beat.clone());
        Registered {
            watchdog: self.clone(),
            beat,
        }
    }

    /// The async runtime's heartbeat: runs until [`Watchdog::stop`] (or until the watchdog is
    /// dropped). Spawn it on the runtime.
    pub fn runtime_heartbeat(self: &Arc<Self>) -> impl std::future::Future<Output = ()> {
        let me = Arc::downgrade(self);
        async move {
            let mut every = tokio::time::interval(TICK);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let due = every.tick().await;
                let Some(w) = me.upgrade().filter(|w| !w.stop.load(Relaxed)) else {
                    return;
                };
                let now = Instant::now();
                let lag = now.saturating_duration_since(due.into_std());
                w.counters
                    .runtime_lag_max_us
                    .fetch_max(lag.as_micros() as u64, Relaxed);
                // 0 means "never ran".
                w.runtime_tick.store(nanos(now).max(1), Relaxed);
            }
        }
    }

    /// One round of the supervisor at `now`: stuck relay threads get their sockets shut down;
    /// returns the verdict.
    pub fn check(&self, now: Instant) -> Result<(), Unhealthy> {
        let mut verdict = Ok(());
        let beats: Vec<Arc<Beat>> = self.beats.lock().clone();
        for b in beats {
            let busy = b.busy_for(now);
            if busy < self.opts.relay_stall {
                continue;
            }
            if !b.closed.swap(true, Relaxed) {
                self.counters.relay_stalls.fetch_add(1, Relaxed);
                tracing::error!(
                    connection = b.id,
                    busy_ms = busy.as_millis() as u64,
                    "a relay thread has been stuck for {busy:?} (bound {:?}): its connection is \
                     closed so that kubelet reconnects to a new one; a bug (please report it with \
                     the log above)",
                    self.opts.relay_stall
                );
                b.shut_down();
            } else if busy >= self.opts.relay_stall * 2 && verdict.is_ok() {
                verdict = Err(Unhealthy::RelayStuck {
                    id: b.id,
                    busy,
                    after: busy - self.opts.relay_stall,
                });
            }
        }
        let tick = self.runtime_tick.load(Relaxed);
        if tick != 0 {
            let silent = Duration::from_nanos(nanos(now).saturating_sub(tick));
            if silent >= self.opts.runtime_stall {
                verdict = Err(Unhealthy::RuntimeStalled(silent));
            }
        }
        *self.verdict.lock() = verdict.clone();
        let was = self.counters.healthy.swap(verdict.is_ok(), Relaxed);
        match (&verdict, was) {
            (Err(why), true) => {
                if matches!(why, Unhealthy::RuntimeStalled(_)) {
                    self.counters.runtime_stalls.fetch_add(1, Relaxed);
                }
                tracing::error!(
                    %why,
                    "crisp is not making progress; no more WATCHDOG=1 to systemd (it restarts \
                     crisp after WatchdogSec)"
                )
            }
            (Ok(()), false) => tracing::warn!("crisp is making progress again"),
            _ => {}
        }
        verdict
    }

    /// The supervisor: checks every `every` (a third of systemd's watchdog interval when it set
    /// one, else a second) and notifies systemd while healthy, until [`Watchdog::stop`]. Runs on
    /// a thread of its own.
    pub fn start(self: &Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        // A weak reference: the thread ends with the proxy that owns the watchdog, even when
        // nobody called stop (a test that drops a running crisp).
        let me = Arc::downgrade(self);
        let systemd = crate::systemd::watchdog_interval();
        let every = systemd
            .map(|d| (d / 3).min(Duration::from_secs(1)))
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        if let Some(d) = systemd {
            tracing::info!(
                watchdog_ms = d.as_millis() as u64,
                "systemd watchdog on: WATCHDOG=1 while every relay thread and the runtime make \
                 progress"
            );
        }
        // Checks more often than the stall bound, so a stall is seen within a fraction of it.
        let every = every
            .min(self.opts.relay_stall / 4)
            .max(Duration::from_millis(10));
        std::thread::Builder::new()
            .name("crisp-watchdog".into())
            .spawn(move || {
                while let Some(me) = me.upgrade().filter(|w| !w.stop.load(Relaxed)) {
                    let healthy = me.check(Instant::now()).is_ok();
                    if healthy && systemd.is_some() {
                        crate::systemd::notify_watchdog();
                        me.counters.notifications.fetch_add(1, Relaxed);
                    }
                    drop(me);
                    std::thread::park_timeout(every);
                }
            })
    }

    /// Ends the supervisor and the heartbeat.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    /// Every open connection, with its thread's report where it answered within `wait`.
    pub async fn connections(&self, wait: Duration) -> Vec<ConnState> {
        let beats: Vec<Arc<Beat>> = self.beats.lock().clone();
        for b in &beats {
            *b.report.lock() = None;
            b.report_wanted.store(true, Relaxed);
            if let Some(wake) = b.waker.lock().as_ref() {
                wake();
            }
        }
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline && beats.iter().any(|b| b.report_wanted()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let now = Instant::now();
        beats
            .iter()
            .map(|b| {
                let (waiting, for_) = b.since(now);
                ConnState {
                    id: b.id,
                    age: now.saturating_duration_since(b.opened),
                    waiting,
                    for_,
                    closed: b.closed.load(Relaxed),
                    report: b.report.lock().take(),
                }
            })
            .collect()
    }

    /// The verdict of the last supervisor round.
    pub fn healthy(&self) -> bool {
        self.counters.healthy.load(Relaxed)
    }

    /// The runtime's worst scheduling latency since the last call (the admin socket's scrape).
    pub fn take_runtime_lag(&self) -> Duration {
        Duration::from_micros(self.counters.runtime_lag_max_us.swap(0, Relaxed))
    }
}

/// A relay thread's registration; unregisters on drop.
pub(crate) struct Registered {
    watchdog: Arc<Watchdog>,
    pub(crate) beat: Arc<Beat>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.watchdog
            .beats
            .lock()
            .retain(|b| !Arc::ptr_eq(b, &self.beat));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn a_thread_busy_past_the_bound_has_its_sockets_shut_down_once() {
        let w = Watchdog::new(Options {
            relay_stall: Duration::from_secs(5),
            runtime_stall: Duration::from_secs(10),
        });
        let (ours, peer) = pair();
        let reg = w.register(vec![ours]);
        let t0 = Instant::now();
        reg.beat.working(t0);
        assert_eq!(w.check(t0 + Duration::from_millis(4_999)), Ok(()));
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 0);
        // Waiting in poll is never a stall, however long.
        reg.beat.waiting(t0);
        assert_eq!(w.check(t0 + Duration::from_secs(60)), Ok(()));
        reg.beat.working(t0);
        assert_eq!(
            w.check(t0 + Duration::from_secs(5)),
            Ok(()),
            "closed, not yet unhealthy"
        );
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 1);
        let mut buf = [0u8; 1];
        assert_eq!(
            std::io::Read::read(&mut &peer, &mut buf).unwrap(),
            0,
            "the peer (kubelet) sees its connection end"
        );
        assert_eq!(w.check(t0 + Duration::from_secs(6)), Ok(()));
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 1, "counted once");
        // Still stuck twice the bound: the sockets did not free it; only a restart will.
        assert!(matches!(
            w.check(t0 + Duration::from_secs(10)),
            Err(Unhealthy::RelayStuck { .. })
        ));
        assert!(!w.healthy());
        drop(reg);
        assert_eq!(
            w.check(t0 + Duration::from_secs(11)),
            Ok(()),
            "its thread ended"
        );
        assert!(w.healthy());
    }

    #[test]
    fn a_silent_runtime_heartbeat_is_unhealthy() {
        let w = Watchdog::new(Options::default());
        let t0 = Instant::now();
        assert_eq!(
            w.check(t0 + Duration::from_secs(3600)),
            Ok(()),
            "not started yet"
        );
        w.runtime_tick.store(nanos(t0), Relaxed);
        assert_eq!(w.check(t0 + Duration::from_secs(9)), Ok(()));
        assert_eq!(
            w.check(t0 + Duration::from_secs(10)),
            Err(Unhealthy::RuntimeStalled(Duration::from_secs(10)))
        );
        assert_eq!(w.counters.runtime_stalls.load(Relaxed), 1);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_heartbeat_measures_how_late_the_runtime_runs_it() {
        let w = Watchdog::new(Options::default());
        let hb = tokio::spawn(w.runtime_heartbeat());
        tokio::time::sleep(TICK * 2).await;
        assert_ne!(w.runtime_tick.load(Relaxed), 0);
        w.stop();
        tokio::time::sleep(TICK * 2).await;
        hb.await.unwrap();
    }
}
