//! crisp's metrics registry (GET /metrics): the tap's and the engine's counters, and
//! liveness.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::metrics::{ScrapedCounter, ScrapedGauge};
use crate::ordering::Engine;
use crate::tap::Tap;

use super::*;

/// Everything `GET /metrics` shows: the build, the tap's call metrics and, when the ordering
/// engine runs, its metrics and what its caches hold.
pub fn registry(tap: &Tap, engine: Option<&Arc<Engine>>) -> Registry {
    let mut reg = Registry::default();
    reg.register(
        "crisp_build",
        "crisp's version",
        Info::new([("version", env!("CARGO_PKG_VERSION"))]),
    );
    tap.metrics().register(&mut reg);
    if let Some(e) = engine {
        e.metrics.register(&mut reg);
        // What the engine's caches hold: back to 0 once kubelet removed every pod (leak checks).
        let (pods, containers) = (e.clone(), e.clone());
        reg.register_collector(Box::new(ScrapedGauge::new(
            "crisp_tracked_pods",
            "Pod sandboxes the ordering engine tracks.",
            move || pods.tracked().0 as u64,
        )));
        reg.register_collector(Box::new(ScrapedGauge::new(
            "crisp_tracked_containers",
            "Containers the ordering engine tracks.",
            move || containers.tracked().1 as u64,
        )));
    }
    reg
}

/// The watchdog's and the interceptors' fault metrics (docs/METRICS.md, RELIABILITY.md).
pub(crate) fn register_liveness(reg: &mut Registry, l: &Liveness) {
    use std::sync::atomic::Ordering::Relaxed;
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_relay_stalls",
        "Relay threads found stuck past watchdog.relay_stall; their connections were closed so \
         that kubelet reconnects.",
        move || w.counters.relay_stalls.load(Relaxed),
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_runtime_stalls",
        "Times the async runtime missed its heartbeat for watchdog.runtime_stall.",
        move || w.counters.runtime_stalls.load(Relaxed),
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedGauge::new(
        "crisp_runtime_lag_max_microseconds",
        "Worst scheduling latency of the async runtime's heartbeat since the last scrape.",
        move || w.take_runtime_lag().as_micros() as u64,
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedGauge::new(
        "crisp_healthy",
        "1 while every relay thread and the async runtime make progress (crisp sends systemd \
         WATCHDOG=1 only then).",
        move || u64::from(w.healthy()),
    )));
    let w = l.watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_watchdog_notifications",
        "WATCHDOG=1 notifications sent to systemd.",
        move || w.counters.notifications.load(Relaxed),
    )));
    let f = l.faults.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_interceptor_panics",
        "Panics caught in crisp's call handling: in an interceptor hook (each ended that hook's \
         part in one call only) or in the relay core (crisp_relay_panics_total).",
        move || f.panics(),
    )));
    register_own_faults(reg, &l.watchdog, &l.faults);
    let f = l.faults.clone();
    reg.register_collector(Box::new(ScrapedGauge::new(
        "crisp_routes_bypassed",
        "RPCs whose calls skip every interceptor (relayed unobserved) after repeated panics.",
        move || f.bypassed_routes(),
    )));
}

/// `GET /metrics`, in the Prometheus text format ([`crate::metrics::CONTENT_TYPE`]).
pub fn render_metrics(state: &AdminState) -> String {
    crate::metrics::encode(&state.metrics)
}

/// The metrics of crisp's own faults that the watchdog, the relay and the log writer keep
/// (docs/METRICS.md): relay-core panics, every panic the hook saw, log lines dropped, the
/// supervisor's own pauses, and the restart counters that survive the restart they count.
fn register_own_faults(
    reg: &mut Registry,
    watchdog: &Arc<crate::watchdog::Watchdog>,
    faults: &Arc<crate::intercept::Faults>,
) {
    let f = faults.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_relay_panics",
        "Panics of the relay core: a new stream's answered INTERNAL (its connection went on), \
         or a relay thread's (its connection closed).",
        move || f.relay_panics(),
    )));
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_panics",
        "Panics anywhere in crisp, on any thread, caught or not (the panic hook's count; each \
         logged at ERROR with its thread and location).",
        crate::telemetry::panics,
    )));
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_log_lines_dropped",
        "Log lines dropped because the log writer's queue was full (a stalled journald or \
         stderr): crisp never blocks on its log.",
        crate::telemetry::dropped_lines,
    )));
    let w = watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_watchdog_pauses",
        "Watchdog rounds that ran 100 ms or more late (the whole process was paused or \
         starved); that time was blamed on no thread.",
        move || w.counters.supervisor_pauses.load(Relaxed),
    )));
    let w = watchdog.clone();
    reg.register_collector(Box::new(ScrapedGauge::new(
        "crisp_watchdog_late_max_microseconds",
        "Longest lateness of a watchdog round since the last scrape.",
        move || w.take_supervisor_late().as_micros() as u64,
    )));
    let w = watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_unclean_restarts",
        "Starts of crisp after an instance that did not shut down cleanly (killed, crashed, \
         or stuck), kept in the state directory across restarts.",
        move || w.persisted().map_or(0, |p| p.unclean),
    )));
    let w = watchdog.clone();
    reg.register_collector(Box::new(ScrapedCounter::new(
        "crisp_stall_restarts",
        "Starts of crisp after an instance whose watchdog had judged it stuck (systemd's \
         watchdog restarted it), kept in the state directory across restarts.",
        move || w.persisted().map_or(0, |p| p.stalled),
    )));
}
