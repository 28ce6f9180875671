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
    /// Calls in flight on the connection when the thread last went to wait.
    calls: AtomicU64,
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

    /// The thread goes to wait in `poll(2)`, at the clock it read last: when it last started
    /// working (a few µs ago; the clock is not converted again on every wakeup). Only the
    /// thread writes its state.
    #[inline]
    pub(crate) fn waiting(&self) {
        let s = self.state.load(Relaxed);
        self.state.store(s | WAITING, Relaxed);
    }

    /// The connection's calls in flight, as the thread goes to wait.
    #[inline]
    pub(crate) fn calls(&self, n: usize) {
        self.calls.store(n as u64, Relaxed);
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
    /// Supervisor rounds that ran at least [`LATE`] late (the process was paused): the time
    /// was not blamed on any thread.
    pub supervisor_pauses: AtomicU64,
    /// Longest supervisor lateness since the last scrape, in µs.
    pub supervisor_late_max_us: AtomicU64,
    /// 1 while every check passes.
    pub healthy: AtomicBool,
}

/// Why crisp is not healthy ([`Watchdog::verdict_aged`]).
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
    /// The last round's verdict and when it was reached, for `/healthz` and `crisp doctor`.
    verdict: Mutex<(Result<(), Unhealthy>, Instant)>,
    stop: AtomicBool,
    /// When the watchdog was made ([`nanos`]): a heartbeat that never ticked is silent since.
    created: u64,
    /// How often the supervisor means to run a round, in ns ([`Watchdog::interval`]).
    every: AtomicU64,
    /// The supervisor's own rounds: when the last one ran, and when it was not running.
    rounds: Mutex<Rounds>,
    /// Where the verdict is written for the next instance ([`Persisted`]), when crisp has a
    /// state directory.
    persisted: OnceLock<Persisted>,
}

/// A supervisor round later than this past its interval is a pause of the supervisor itself
/// (the whole process stopped, starved or reclaimed): the time is not blamed on anyone.
pub(crate) const LATE: Duration = Duration::from_millis(100);
/// The supervisor's pauses remembered (older ones are folded away; a busy thread is judged on
/// at most this many).
const PAUSES_KEPT: usize = 32;

/// The supervisor's own timeline, for discounting its lateness.
#[derive(Debug, Default)]
struct Rounds {
    /// When the last round ran ([`nanos`]); None before the first.
    last: Option<u64>,
    /// Spans `[from, to)` ([`nanos`]) in which the supervisor should have run and did not.
    pauses: std::collections::VecDeque<(u64, u64)>,
}

impl Rounds {
    /// A round at `now`, `every` after the last one was due: records the lateness past [`LATE`]
    /// as a pause; returns it (zero when on time).
    fn round(&mut self, now: u64, every: u64) -> Duration {
        let late = match self.last {
            Some(last) if now > last => {
                let due = last.saturating_add(every);
                let late = now.saturating_sub(due);
                if late >= LATE.as_nanos() as u64 {
                    if self.pauses.len() == PAUSES_KEPT {
                        self.pauses.pop_front();
                    }
                    self.pauses.push_back((due, now));
                    Duration::from_nanos(late)
                } else {
                    Duration::ZERO
                }
            }
            _ => Duration::ZERO,
        };
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
        late
    }

    /// How much of `[from, to)` the supervisor was paused.
    fn paused_within(&self, from: u64, to: u64) -> Duration {
        let ns = self
            .pauses
            .iter()
            .map(|&(a, b)| b.min(to).saturating_sub(a.max(from)))
            .sum::<u64>();
        Duration::from_nanos(ns)
    }
}

impl Watchdog {
    pub fn new(opts: Options) -> Arc<Watchdog> {
        // The clock's zero is no later than any instant the watchdog is given afterwards.
        let now = Instant::now();
        let created = nanos(now);
        let every = opts
            .relay_stall
            .checked_div(4)
            .unwrap_or_default()
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        Arc::new(Watchdog {
            opts,
            beats: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            runtime_tick: AtomicU64::new(0),
            counters: Counters {
                healthy: AtomicBool::new(true),
                ..Counters::default()
            },
            verdict: Mutex::new((Ok(()), now)),
            stop: AtomicBool::new(false),
            created,
            every: AtomicU64::new(every.as_nanos() as u64),
            rounds: Mutex::new(Rounds::default()),
            persisted: OnceLock::new(),
        })
    }

    /// The last supervisor round's verdict and how old it is at `now`.
    pub fn verdict_aged(&self, now: Instant) -> (Result<(), Unhealthy>, Duration) {
        let v = self.verdict.lock();
        (v.0.clone(), now.saturating_duration_since(v.1))
    }

    /// How often the supervisor runs a round (a third of systemd's interval at most, a
    /// quarter of `relay_stall` at most, one second at most).
    pub fn interval(&self) -> Duration {
        Duration::from_nanos(self.every.load(Relaxed))
    }

    /// A verdict older than this says nothing about now: the supervisor itself is not running.
    pub fn stale_after(&self) -> Duration {
        (self.interval() * 5).max(Duration::from_secs(3))
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
            calls: AtomicU64::new(0),
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

    /// One round of the supervisor at `now`, as the supervisor runs it: stuck relay threads get
    /// their sockets shut down; returns the verdict, then logs what it did (the tests' round).
    #[cfg(any(test, feature = "test-util"))]
    pub fn check(&self, now: Instant) -> Result<(), Unhealthy> {
        let (verdict, notes) = self.judge(now);
        for n in notes {
            n.log(self.opts.relay_stall);
        }
        verdict
    }

    /// One round of the supervisor at `now`: stuck relay threads get their sockets shut down;
    /// returns the verdict and what it did, for the caller to log once it has acted on the
    /// verdict (sent `WATCHDOG=1` or not): a log that blocks cannot hold up either.
    pub(crate) fn judge(&self, now: Instant) -> (Result<(), Unhealthy>, Vec<Note>) {
        let mut notes = Vec::new();
        let t = nanos(now);
        let rounds = {
            let mut r = self.rounds.lock();
            let late = r.round(t, self.every.load(Relaxed));
            if !late.is_zero() {
                self.counters.supervisor_pauses.fetch_add(1, Relaxed);
                self.counters
                    .supervisor_late_max_us
                    .fetch_max(late.as_micros() as u64, Relaxed);
                notes.push(Note::Paused(late));
            }
            // A copy: the checks below run without the lock.
            Rounds {
                last: r.last,
                pauses: r.pauses.clone(),
            }
        };
        let mut verdict = Ok(());
        let beats: Vec<Arc<Beat>> = self.beats.lock().clone();
        for b in beats {
            let raw = b.busy_for(now);
            if raw < self.opts.relay_stall {
                continue;
            }
            // Time the supervisor itself was not running is nobody's fault: the thread ran
            // (or did not) with the whole process.
            let from = t.saturating_sub(raw.as_nanos() as u64);
            let busy = raw.saturating_sub(rounds.paused_within(from, t));
            if busy < self.opts.relay_stall {
                continue;
            }
            if !b.closed.swap(true, Relaxed) {
                b.shut_down();
                self.counters.relay_stalls.fetch_add(1, Relaxed);
                notes.push(Note::Closed { id: b.id, busy });
            } else if busy >= self.opts.relay_stall * 2 && verdict.is_ok() {
                verdict = Err(Unhealthy::RelayStuck {
                    id: b.id,
                    busy,
                    after: busy - self.opts.relay_stall,
                });
            }
        }
        // A heartbeat that never ticked is silent since the watchdog began.
        let tick = match self.runtime_tick.load(Relaxed) {
            0 => self.created,
            t => t,
        };
        let raw = Duration::from_nanos(t.saturating_sub(tick));
        let silent = raw.saturating_sub(rounds.paused_within(tick, t));
        if silent >= self.opts.runtime_stall {
            verdict = Err(Unhealthy::RuntimeStalled(silent));
        }
        *self.verdict.lock() = (verdict.clone(), now);
        let was = self.counters.healthy.swap(verdict.is_ok(), Relaxed);
        match (&verdict, was) {
            (Err(why), true) => {
                if matches!(why, Unhealthy::RuntimeStalled(_)) {
                    self.counters.runtime_stalls.fetch_add(1, Relaxed);
                }
                if let Some(p) = self.persisted.get() {
                    p.set(Last::Unhealthy);
                }
                notes.push(Note::Unhealthy(why.clone()));
            }
            (Ok(()), false) => {
                if let Some(p) = self.persisted.get() {
                    p.set(Last::Running);
                }
                notes.push(Note::Recovered);
            }
            _ => {}
        }
        (verdict, notes)
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
        self.every.store(every.as_nanos() as u64, Relaxed);
        std::thread::Builder::new()
            .name("crisp-watchdog".into())
            .spawn(move || {
                while let Some(me) = me.upgrade().filter(|w| !w.stop.load(Relaxed)) {
                    let (verdict, notes) = me.judge(Instant::now());
                    // Acts first, then logs: a stalled log sink must not hold back WATCHDOG=1.
                    if verdict.is_ok() && systemd.is_some() {
                        crate::systemd::notify_watchdog();
                        me.counters.notifications.fetch_add(1, Relaxed);
                    }
                    for n in notes {
                        n.log(me.opts.relay_stall);
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

    /// CRI calls in flight on every kubelet connection: relayed, diverted or held, as each
    /// relay thread last counted them (it counts each time it goes to wait). A connection's
    /// calls leave the count with it, however they ended: refused, bypassed and panicked calls
    /// never enter it.
    pub fn calls_in_flight(&self) -> u64 {
        self.beats
            .lock()
            .iter()
            .map(|b| b.calls.load(Relaxed))
            .sum()
    }

    /// The verdict of the last supervisor round.
    pub fn healthy(&self) -> bool {
        self.counters.healthy.load(Relaxed)
    }

    /// The supervisor's worst lateness since the last call (the admin socket's scrape).
    pub fn take_supervisor_late(&self) -> Duration {
        Duration::from_micros(self.counters.supervisor_late_max_us.swap(0, Relaxed))
    }

    /// Keeps the verdict in `state_dir` for the next instance, and reads what the last one
    /// left there (counted in [`Persisted`]). Without a usable directory crisp serves without.
    pub fn persist_in(&self, state_dir: &std::path::Path) -> Option<&Persisted> {
        match Persisted::open(state_dir) {
            Ok(p) => {
                let _ = self.persisted.set(p);
            }
            Err(e) => tracing::warn!(
                state_dir = %state_dir.display(),
                error = %e,
                "cannot keep the watchdog's restart counters in the state directory; \
                 CrispStalled will not see restarts"
            ),
        }
        self.persisted.get()
    }

    /// What the last instances left ([`Watchdog::persist_in`]).
    pub fn persisted(&self) -> Option<&Persisted> {
        self.persisted.get()
    }

    /// The runtime's worst scheduling latency since the last call (the admin socket's scrape).
    pub fn take_runtime_lag(&self) -> Duration {
        Duration::from_micros(self.counters.runtime_lag_max_us.swap(0, Relaxed))
    }
}

/// What a supervisor round did, logged after it acted ([`Watchdog::judge`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// The round ran this late: the process (or the supervisor) was paused.
    Paused(Duration),
    /// A relay thread was stuck: its sockets were shut down.
    Closed {
        id: u64,
        busy: Duration,
    },
    Unhealthy(Unhealthy),
    Recovered,
}

impl Note {
    fn log(&self, bound: Duration) {
        match self {
            Note::Paused(late) => tracing::warn!(
                late_ms = late.as_millis() as u64,
                "the watchdog's supervisor ran {late:?} late (the whole process was paused or \
                 starved: memory reclaim, a frozen cgroup); that time is blamed on no thread"
            ),
            Note::Closed { id, busy } => tracing::error!(
                connection = id,
                busy_ms = busy.as_millis() as u64,
                "a relay thread has been stuck for {busy:?} (bound {bound:?}): its connection \
                 is closed so that kubelet reconnects to a new one; a bug (please report it \
                 with the log above)"
            ),
            Note::Unhealthy(why) => tracing::error!(
                %why,
                "crisp is not making progress; no more WATCHDOG=1 to systemd (it restarts \
                 crisp after WatchdogSec)"
            ),
            Note::Recovered => tracing::warn!("crisp is making progress again"),
        }
    }
}

/// How the last instance of crisp ended, as its state file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Last {
    /// Serving and healthy (an instance that ends here ended uncleanly: killed, crashed).
    Running,
    /// Its watchdog had judged it stuck: systemd's watchdog (or someone) ended it so.
    Unhealthy,
    /// It shut down cleanly.
    Stopped,
}

/// The watchdog's file in the state directory: how the last instance ended, and how many
/// instances ended uncleanly or stuck. Counters that survive the restart they cause: the
/// restarted crisp serves them, so `CrispStalled` sees the stall that its restart hid.
///
/// One small file, `watchdog`, replaced whole (written aside, then renamed): the supervisor
/// hands each change to a thread of its own and never waits for the disk.
pub struct Persisted {
    /// Instances that ended without a clean shutdown (stuck ones included), ever.
    pub unclean: u64,
    /// Instances that ended after their watchdog judged them stuck, ever.
    pub stalled: u64,
    /// To the writer thread; full: the change is dropped (the next one rewrites the file).
    tx: std::sync::mpsc::SyncSender<Last>,
    path: std::path::PathBuf,
}

/// The state file's name in the state directory.
pub const STATE_FILE: &str = "watchdog";
/// The longest state file read (anything longer is crisp's own file damaged: counted from 0).
const STATE_MAX: u64 = 4096;

impl Last {
    fn name(self) -> &'static str {
        match self {
            Last::Running => "running",
            Last::Unhealthy => "unhealthy",
            Last::Stopped => "stopped",
        }
    }
}

/// The state file's text: `last=…`, `unclean=N`, `stalled=N`, one a line.
fn render(last: Last, unclean: u64, stalled: u64) -> String {
    format!(
        "last={}\nunclean={unclean}\nstalled={stalled}\n",
        last.name()
    )
}

/// Reads a state file: (how the last instance ended, unclean, stalled). Anything unreadable
/// counts as nothing (a damaged file costs the counts, never the start).
fn parse(text: &str) -> (Option<Last>, u64, u64) {
    let (mut last, mut unclean, mut stalled) = (None, 0, 0);
    for line in text.lines().take(16) {
        match line.split_once('=') {
            Some(("last", "running")) => last = Some(Last::Running),
            Some(("last", "unhealthy")) => last = Some(Last::Unhealthy),
            Some(("last", "stopped")) => last = Some(Last::Stopped),
            Some(("unclean", n)) => unclean = n.parse().unwrap_or(0),
            Some(("stalled", n)) => stalled = n.parse().unwrap_or(0),
            _ => {}
        }
    }
    (last, unclean, stalled)
}

/// What a start makes of the last instance's file: the counters this instance serves.
fn on_start(text: &str) -> (u64, u64) {
    let (last, unclean, stalled) = parse(text);
    match last {
        Some(Last::Running) => (unclean.saturating_add(1), stalled),
        Some(Last::Unhealthy) => (unclean.saturating_add(1), stalled.saturating_add(1)),
        Some(Last::Stopped) | None => (unclean, stalled),
    }
}

impl Persisted {
    fn open(dir: &std::path::Path) -> std::io::Result<Persisted> {
        use std::io::Read;
        std::fs::create_dir_all(dir)?;
        let path = dir.join(STATE_FILE);
        let mut text = String::new();
        match std::fs::File::open(&path) {
            Ok(f) => {
                // Not UTF-8: damaged, counted as nothing.
                let _ = f.take(STATE_MAX).read_to_string(&mut text);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let (unclean, stalled) = on_start(&text);
        write_state(&path, &render(Last::Running, unclean, stalled))?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Last>(4);
        let p = path.clone();
        std::thread::Builder::new()
            .name("crisp-watchdog-state".into())
            .spawn(move || {
                while let Ok(last) = rx.recv() {
                    if let Err(e) = write_state(&p, &render(last, unclean, stalled)) {
                        tracing::warn!(error = %e, "cannot write the watchdog's state file");
                    }
                }
            })?;
        Ok(Persisted {
            unclean,
            stalled,
            tx,
            path,
        })
    }

    /// Hands `last` to the writer thread; never waits.
    fn set(&self, last: Last) {
        let _ = self.tx.try_send(last);
    }

    /// A clean shutdown: written now (the caller is not the supervisor).
    pub fn stopped(&self) {
        if let Err(e) = write_state(
            &self.path,
            &render(Last::Stopped, self.unclean, self.stalled),
        ) {
            tracing::warn!(error = %e, "cannot write the watchdog's state file");
        }
    }
}

/// Replaces `path` with `text`: written aside, synced, renamed over it.
fn write_state(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
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

/// Faults injected on purpose, for the tests that prove the watchdog and the panic containment
/// (`test-util` builds only: the release binary has none of this).
///
/// A fault is armed for the relay of one runtime socket (so tests side by side in one process
/// keep to their own crisp) and one CRI method, and fires when a new stream of that method
/// reaches the relay core. A crisp run as a process of its own (`CARGO_BIN_EXE_crisp`) takes
/// them from files instead: with `CRISP_TEST_FAULTS=DIR` in its environment, a file
/// `DIR/<fault>-<Method>` (`panic-Version`, `stall-Version`, `block-runtime-Version`) arms that
/// fault for as long as it exists.
#[cfg(feature = "test-util")]
pub mod fault {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use parking_lot::Mutex;

    use crate::cri::{Route, Rpc};

    /// What a fault does to the relay thread that meets it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Fault {
        /// The relay core panics while it routes the new stream.
        Panic,
        /// The relay thread stops turning (a deadlock) until the fault is released.
        Stall,
        /// Every worker of the async runtime is blocked until the fault is released.
        BlockRuntime,
    }

    impl Fault {
        fn file_prefix(self) -> &'static str {
            match self {
                Fault::Panic => "panic",
                Fault::Stall => "stall",
                Fault::BlockRuntime => "block-runtime",
            }
        }
    }

    struct Entry {
        runtime: PathBuf,
        rpc: Rpc,
        fault: Fault,
        released: Arc<AtomicBool>,
    }

    /// Whether anything is armed: the one load a relay pays per new stream in test-util builds.
    static ANY: AtomicBool = AtomicBool::new(false);
    static ARMED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

    fn dir() -> Option<&'static Path> {
        static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
        DIR.get_or_init(|| std::env::var_os("CRISP_TEST_FAULTS").map(PathBuf::from))
            .as_deref()
    }

    /// An armed fault; dropping it releases what it holds and disarms it.
    pub struct Armed(Arc<AtomicBool>);

    impl Drop for Armed {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
            ARMED.lock().retain(|e| !Arc::ptr_eq(&e.released, &self.0));
        }
    }

    /// Arms `fault` for new `rpc` streams of the relay in front of `runtime`.
    pub fn arm(runtime: &Path, rpc: Rpc, fault: Fault) -> Armed {
        let released = Arc::new(AtomicBool::new(false));
        ARMED.lock().push(Entry {
            runtime: runtime.to_path_buf(),
            rpc,
            fault,
            released: released.clone(),
        });
        ANY.store(true, SeqCst);
        Armed(released)
    }

    /// Holds the calling thread until `released` says so.
    fn hold(released: impl Fn() -> bool) {
        while !released() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A new stream of `route` reaches the relay core of `runtime`'s relay.
    pub(crate) fn new_stream(runtime: &Path, route: Route) {
        let Some(rpc) = route.rpc else { return };
        if let Some(dir) = dir() {
            for fault in [Fault::Panic, Fault::Stall, Fault::BlockRuntime] {
                let file = dir.join(format!("{}-{}", fault.file_prefix(), rpc.name()));
                if file.exists() {
                    fire(fault, rpc, Arc::new(move || !file.exists()));
                }
            }
        }
        if !ANY.load(SeqCst) {
            return;
        }
        let hit: Vec<(Fault, Arc<AtomicBool>)> = ARMED
            .lock()
            .iter()
            .filter(|e| e.rpc == rpc && e.runtime == runtime)
            .map(|e| (e.fault, e.released.clone()))
            .collect();
        for (fault, released) in hit {
            fire(fault, rpc, Arc::new(move || released.load(SeqCst)));
        }
    }

    fn fire(fault: Fault, rpc: Rpc, released: Arc<dyn Fn() -> bool + Send + Sync>) {
        match fault {
            Fault::Panic => panic!("injected fault: the relay core panics on {}", rpc.name()),
            Fault::Stall => hold(|| released()),
            Fault::BlockRuntime => {
                // The relay thread entered crisp's runtime (`relay/mod.rs`): one task per
                // worker, each blocking its worker until released.
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                for _ in 0..rt.metrics().num_workers().max(1) {
                    let released = released.clone();
                    rt.spawn(async move { hold(|| released()) });
                }
            }
        }
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
        // The heartbeat ticks throughout: only the thread is judged here.
        let tick = |at: Instant| w.runtime_tick.store(nanos(at), Relaxed);
        tick(t0);
        reg.beat.working(t0);
        assert_eq!(w.check(t0 + Duration::from_millis(4_999)), Ok(()));
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 0);
        tick(t0 + Duration::from_secs(5));
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
        for s in 6..10 {
            tick(t0 + Duration::from_secs(s));
            assert_eq!(w.check(t0 + Duration::from_secs(s)), Ok(()));
        }
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 1, "counted once");
        // Still stuck twice the bound: the sockets did not free it; only a restart will.
        tick(t0 + Duration::from_secs(10));
        assert!(matches!(
            w.check(t0 + Duration::from_secs(10)),
            Err(Unhealthy::RelayStuck { .. })
        ));
        assert!(!w.healthy());
        drop(reg);
        tick(t0 + Duration::from_secs(11));
        assert_eq!(
            w.check(t0 + Duration::from_secs(11)),
            Ok(()),
            "its thread ended"
        );
        assert!(w.healthy());
    }

    #[test]
    fn waiting_in_poll_is_never_a_stall() {
        let w = Watchdog::new(Options::default());
        let (ours, _peer) = pair();
        let reg = w.register(vec![ours]);
        let t0 = Instant::now();
        reg.beat.working(t0);
        reg.beat.waiting();
        for s in 1..=60 {
            w.runtime_tick
                .store(nanos(t0 + Duration::from_secs(s)), Relaxed);
            assert_eq!(w.check(t0 + Duration::from_secs(s)), Ok(()));
        }
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 0);
    }

    #[test]
    fn a_silent_runtime_heartbeat_is_unhealthy() {
        let w = Watchdog::new(Options::default());
        let t0 = Instant::now();
        w.runtime_tick.store(nanos(t0), Relaxed);
        for s in 1..10 {
            assert_eq!(w.check(t0 + Duration::from_secs(s)), Ok(()));
        }
        assert_eq!(
            w.check(t0 + Duration::from_secs(10)),
            Err(Unhealthy::RuntimeStalled(Duration::from_secs(10)))
        );
        assert_eq!(w.counters.runtime_stalls.load(Relaxed), 1);
    }

    /// Fails on bde328c: a heartbeat that never ran counted as healthy for ever.
    #[test]
    fn a_heartbeat_that_never_ticked_is_not_healthy() {
        let w = Watchdog::new(Options::default());
        let t0 = Instant::now();
        for s in 0..10 {
            assert_eq!(w.check(t0 + Duration::from_secs(s)), Ok(()), "at {s} s");
        }
        assert!(matches!(
            w.check(t0 + Duration::from_secs(10)),
            Err(Unhealthy::RuntimeStalled(d)) if d >= Duration::from_secs(10)
        ));
        assert!(!w.healthy());
    }

    /// Fails on bde328c: the supervisor, woken 7 s late by a whole-process pause, closed the
    /// connection of a thread that had worked 0.5 s of it.
    #[test]
    fn a_whole_process_pause_is_blamed_on_no_thread() {
        let w = Watchdog::new(Options::default());
        assert_eq!(w.interval(), Duration::from_secs(1));
        let (ours, peer) = pair();
        let reg = w.register(vec![ours]);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        w.runtime_tick.store(nanos(t0), Relaxed);
        assert_eq!(w.check(t0), Ok(()));
        // The thread starts a piece of work; the whole process stops (SIGSTOP, a frozen
        // cgroup) for 12 s, past both bounds; the supervisor is the first to run again.
        reg.beat.working(at(500));
        assert_eq!(w.check(at(13_000)), Ok(()), "the pause is nobody's stall");
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 0);
        assert_eq!(w.counters.runtime_stalls.load(Relaxed), 0);
        assert_eq!(w.counters.supervisor_pauses.load(Relaxed), 1);
        assert_eq!(w.take_supervisor_late(), Duration::from_secs(12));
        peer.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(
            std::io::Read::read(&mut &peer, &mut buf)
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::WouldBlock,
            "the connection stays open"
        );
        // A thread that really stays stuck after the pause is still found: 0.5 s before the
        // pause and 4.5 s after it make the 5 s bound.
        w.runtime_tick.store(nanos(at(13_000)), Relaxed);
        for ms in [14_000, 15_000, 16_000, 17_000] {
            assert_eq!(w.check(at(ms)), Ok(()));
            assert_eq!(w.counters.relay_stalls.load(Relaxed), 0, "at {ms} ms");
        }
        assert_eq!(w.check(at(17_500)), Ok(()));
        assert_eq!(w.counters.relay_stalls.load(Relaxed), 1);
        assert_eq!(w.counters.supervisor_pauses.load(Relaxed), 1);
        drop(reg);
    }

    #[test]
    fn a_round_late_by_less_than_the_bound_is_no_pause() {
        let mut r = Rounds::default();
        let s = |ms: u64| ms * 1_000_000;
        assert_eq!(r.round(s(0), s(1_000)), Duration::ZERO);
        assert_eq!(r.round(s(1_099), s(1_000)), Duration::ZERO);
        assert_eq!(r.round(s(2_199), s(1_000)), Duration::from_millis(100));
        assert_eq!(r.paused_within(s(0), s(10_000)), Duration::from_millis(100));
        assert_eq!(
            r.paused_within(s(2_150), s(10_000)),
            Duration::from_millis(49)
        );
        // A clock that steps back (a test, or rounds out of order) is no pause either.
        assert_eq!(r.round(s(500), s(1_000)), Duration::ZERO);
        for i in 0..100 {
            r.round(s(10_000 * (i + 1)), s(1_000));
        }
        assert_eq!(r.pauses.len(), PAUSES_KEPT, "bounded");
    }

    #[test]
    fn the_verdict_carries_its_age() {
        let w = Watchdog::new(Options::default());
        let t0 = Instant::now();
        w.runtime_tick.store(nanos(t0), Relaxed);
        w.check(t0).unwrap();
        let (v, age) = w.verdict_aged(t0 + Duration::from_millis(2_500));
        assert_eq!(v, Ok(()));
        assert_eq!(age, Duration::from_millis(2_500));
        assert!(age < w.stale_after(), "{:?}", w.stale_after());
        assert!(w.verdict_aged(t0 + w.stale_after()).1 >= w.stale_after());
    }

    #[test]
    fn the_state_file_counts_unclean_and_stuck_ends() {
        assert_eq!(on_start(""), (0, 0), "first start");
        assert_eq!(on_start(&render(Last::Stopped, 3, 1)), (3, 1));
        assert_eq!(on_start(&render(Last::Running, 3, 1)), (4, 1));
        assert_eq!(on_start(&render(Last::Unhealthy, 3, 1)), (4, 2));
        // Damaged: counted from nothing, never a panic.
        assert_eq!(on_start("last=running\nunclean=-1\nstalled=x"), (1, 0));
        assert_eq!(
            on_start(&format!(
                "last=unhealthy\nunclean={}\nstalled={}",
                u64::MAX,
                u64::MAX
            )),
            (u64::MAX, u64::MAX)
        );
        assert_eq!(on_start("\u{0}=\u{0}\n=\n==="), (0, 0));
    }

    /// Fails on bde328c (no state file: the stall counters reset with the restart they cause).
    #[test]
    fn restarts_after_a_stall_are_counted_across_instances() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(STATE_FILE);
        let start = || {
            let w = Watchdog::new(Options::default());
            let p = w.persist_in(dir.path()).expect("a state dir");
            let counts = (p.unclean, p.stalled);
            (w, counts)
        };
        let (w, counts) = start();
        assert_eq!(counts, (0, 0));
        // Killed while healthy: unclean.
        drop(w);
        let (w, counts) = start();
        assert_eq!(counts, (1, 0));
        // Judged stuck (the heartbeat never ticked), then killed by systemd.
        let t0 = Instant::now();
        assert!(w.check(t0 + Duration::from_secs(11)).is_err());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&file)
            .unwrap()
            .contains("last=unhealthy")
        {
            assert!(
                Instant::now() < deadline,
                "the state file was never written"
            );
            std::thread::yield_now();
        }
        drop(w);
        let (w, counts) = start();
        assert_eq!(counts, (2, 1));
        w.persisted().unwrap().stopped();
        drop(w);
        let (_w, counts) = start();
        assert_eq!(counts, (2, 1), "a clean stop counts nothing");
    }

    /// The heartbeat's lag is how late the runtime ran it: a runtime blocked for 600 ms (one
    /// worker, busy in a task that never yields) runs the next 250 ms tick ≥ 350 ms late.
    #[tokio::test(flavor = "current_thread")]
    async fn the_heartbeat_measures_how_late_the_runtime_runs_it() {
        let w = Watchdog::new(Options::default());
        let hb = tokio::spawn(w.runtime_heartbeat());
        while w.runtime_tick.load(Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        let first = w.runtime_tick.load(Relaxed);
        assert!(w.take_runtime_lag() < Duration::from_millis(200));
        // The fault: this task holds the only worker.
        std::thread::sleep(Duration::from_millis(600));
        while w.runtime_tick.load(Relaxed) == first {
            tokio::task::yield_now().await;
        }
        let lag = w.take_runtime_lag();
        assert!(lag >= Duration::from_millis(300), "lag {lag:?}");
        assert!(lag < Duration::from_secs(5), "lag {lag:?}");
        w.stop();
        hb.await.unwrap();
    }
}
