//! crisp's own metrics, in prometheus-client's types, served by the admin socket's `GET /metrics`
//! in the Prometheus text format (version 0.0.4, [`CONTENT_TYPE`]).
//!
//! Recording stays cheap on the call path: a counter or gauge is one relaxed atomic, a histogram
//! one uncontended lock. Every forwarded call records its latency and status through handles
//! resolved once per method and status (on first use), not through a labelled `Family` lookup per
//! call (a read lock plus hashing the labels); `benches/hot_path.rs` measures both.
//!
//! The names served are the registered ones with prometheus-client's additions: it appends
//! `_total` to a counter (so counters are registered without it: `crisp_cri_calls` is served as
//! `crisp_cri_calls_total`) and `_info` to an info metric, and ends every HELP text with `.`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`encode`] writes.
pub(crate) use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Bucket upper bounds (seconds) for hold durations.
pub const HOLD_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 90.0];

/// Bucket upper bounds (seconds) for CRI call latency: sub-millisecond polling calls up to
/// kubelet's 2 min runtime-request-timeout.
pub const CALL_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    120.0,
];

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GateLabel {
    gate: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhatLabel {
    what: &'static str,
}

/// The ordering engine's metrics. The histograms are the `gate="start"` and `gate="stop"` series
/// of `crisp_hold_seconds`.
pub struct OrderingMetrics {
    holds: Histograms<GateLabel>,
    pub start_holds: Histogram,
    pub(crate) stop_holds: Histogram,
    pub holds_in_flight: Gauge,
    pub(crate) start_hold_timeouts: Counter,
    pub(crate) fail_fast: Counter,
    pub(crate) bad_annotations: Counter,
    pub(crate) probe_errors: Counter,
    pub(crate) job_sidecars_stopped: Counter,
    /// Readiness probes running now (bounded by `[ordering] max_probes_in_flight`).
    pub(crate) probe_in_flight: Gauge,
    /// TCP connections opened by tcp:// and http:// probes.
    pub(crate) probe_connects: Counter,
    /// Probes not run (reported "not ready" this round) because a node-wide bound was reached.
    pub probe_limited: Counter,
    /// CNI pods whose network namespace could not be found or entered.
    pub(crate) probe_netns_failures: Counter,
    /// Exec probes that waited for a turn of their pod's own exec rate, then ran.
    pub(crate) exec_probe_pod_paced: Counter,
    /// Exec probes not run this round because their pod's own exec rate had no turn before
    /// the probe's end.
    pub(crate) exec_probe_pod_limited: Counter,
    /// Durable writes to the state directory that failed (`what`: `mark`, `intent`).
    state_write_errors: Family<WhatLabel, Counter>,
    /// Job-mode marks that could not be written: the sidecar was not stopped.
    pub(crate) mark_write_errors: Counter,
    /// Held-call intents that could not be written (or were over the cap): the call was held
    /// as before, without surviving a restart.
    pub(crate) intent_write_errors: Counter,
    /// Held calls crisp kept durably (one durable write each).
    pub(crate) intents_kept: Counter,
    /// Kept stops a restarted crisp carried out itself (kubelet's caller had died with crisp).
    pub(crate) intents_replayed: Counter,
}

impl Default for OrderingMetrics {
    fn default() -> Self {
        let holds: Histograms<GateLabel> =
            Family::new_with_constructor(|| Histogram::new(HOLD_BUCKETS));
        let gate = |gate| holds.get_or_create_owned(&GateLabel { gate });
        let state_write_errors: Family<WhatLabel, Counter> = Family::default();
        OrderingMetrics {
            start_holds: gate("start"),
            stop_holds: gate("stop"),
            holds,
            holds_in_flight: Gauge::default(),
            start_hold_timeouts: Counter::default(),
            fail_fast: Counter::default(),
            bad_annotations: Counter::default(),
            probe_errors: Counter::default(),
            job_sidecars_stopped: Counter::default(),
            probe_in_flight: Gauge::default(),
            probe_connects: Counter::default(),
            probe_limited: Counter::default(),
            probe_netns_failures: Counter::default(),
            exec_probe_pod_paced: Counter::default(),
            exec_probe_pod_limited: Counter::default(),
            mark_write_errors: state_write_errors.get_or_create_owned(&WhatLabel { what: "mark" }),
            intent_write_errors: state_write_errors
                .get_or_create_owned(&WhatLabel { what: "intent" }),
            state_write_errors,
            intents_kept: Counter::default(),
            intents_replayed: Counter::default(),
        }
    }
}

impl OrderingMetrics {
    /// Adds these metrics to `reg` (the registry shares their values).
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "crisp_hold_seconds",
            "Time calls were held by the ordering engine",
            self.holds.clone(),
        );
        reg.register(
            "crisp_holds_in_flight",
            "Calls currently held",
            self.holds_in_flight.clone(),
        );
        reg.register(
            "crisp_hold_timeouts",
            "Start holds that reached their timeout",
            self.start_hold_timeouts.clone(),
        );
        reg.register(
            "crisp_fail_fast",
            "App creations refused because a declared sidecar was not created or not running",
            self.fail_fast.clone(),
        );
        reg.register(
            "crisp_bad_annotations",
            "Malformed crisp.dev annotations (pods run as if the key were absent)",
            self.bad_annotations.clone(),
        );
        reg.register(
            "crisp_probe_errors",
            "Readiness probes that could not be run (runtime errors)",
            self.probe_errors.clone(),
        );
        reg.register(
            "crisp_job_sidecars_stopped",
            "Sidecars stopped by crisp because their Job finished",
            self.job_sidecars_stopped.clone(),
        );
        reg.register(
            "crisp_state_write_errors",
            "Durable writes to the state directory that failed (what: mark, a Job sidecar then not stopped; intent, a held call then not kept across a restart)",
            self.state_write_errors.clone(),
        );
        reg.register(
            "crisp_intents_kept",
            "Held CRI calls recorded durably in the state directory (one durable write each)",
            self.intents_kept.clone(),
        );
        reg.register(
            "crisp_intents_replayed",
            "Kept StopContainer calls a restarted crisp carried out itself",
            self.intents_replayed.clone(),
        );
        reg.register(
            "crisp_probe_in_flight",
            "Readiness probes running now (node-wide bound: ordering.max_probes_in_flight)",
            self.probe_in_flight.clone(),
        );
        reg.register(
            "crisp_probe_connects",
            "TCP connections opened by readiness probes",
            self.probe_connects.clone(),
        );
        reg.register(
            "crisp_probe_limited",
            "Readiness probes not run this round because a node-wide probe bound was reached",
            self.probe_limited.clone(),
        );
        reg.register(
            "crisp_probe_netns_failures",
            "CNI pods whose network namespace crisp could not find or enter (probes of their loopback fail)",
            self.probe_netns_failures.clone(),
        );
        reg.register(
            "crisp_exec_probe_pod_paced",
            "Exec readiness probes that waited for a turn of their pod's own rate (ordering.exec_probes_per_pod_per_second)",
            self.exec_probe_pod_paced.clone(),
        );
        reg.register(
            "crisp_exec_probe_pod_limited",
            "Exec readiness probes not run this round because their pod's own rate had no turn before the probe timeout",
            self.exec_probe_pod_limited.clone(),
        );
    }
}

/// Decrements a gauge when dropped: holds are counted correctly even when kubelet abandons one
/// (the call's future, and so the guard, is dropped).
pub struct GaugeGuard<'a>(&'a Gauge);

impl<'a> GaugeGuard<'a> {
    pub fn new(g: &'a Gauge) -> Self {
        g.inc();
        GaugeGuard(g)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// gRPC codes 0..=16, plus one slot for "ended without a status" (the client went away).
const CODE_SLOTS: usize = 18;

/// The canonical name of a gRPC status code (`OK`, `NotFound`, ...), as grpc-go prints it.
pub fn code_name(code: Option<i32>) -> &'static str {
    match code {
        None => "None",
        Some(c) => match c {
            0 => "OK",
            1 => "Canceled",
            2 => "Unknown",
            3 => "InvalidArgument",
            4 => "DeadlineExceeded",
            5 => "NotFound",
            6 => "AlreadyExists",
            7 => "PermissionDenied",
            8 => "ResourceExhausted",
            9 => "FailedPrecondition",
            10 => "Aborted",
            11 => "OutOfRange",
            12 => "Unimplemented",
            13 => "Internal",
            14 => "Unavailable",
            15 => "DataLoss",
            16 => "Unauthenticated",
            _ => "Code(?)",
        },
    }
}

/// The slot a status is counted in. A code outside the spec is counted as Unknown, as gRPC
/// clients treat it.
fn code_slot(code: Option<i32>) -> usize {
    match code {
        Some(c) if (0..17).contains(&c) => c as usize,
        Some(_) => 2,
        None => CODE_SLOTS - 1,
    }
}

fn slot_code(slot: usize) -> Option<i32> {
    (slot < CODE_SLOTS - 1).then_some(slot as i32)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: &'static str,
    code: &'static str,
}

/// One method's series, created on its first call (a method never called, or a status it never
/// returned, is not shown) and kept here so that later calls skip the `Family` lookup.
struct MethodSlot {
    name: &'static str,
    duration: OnceLock<Histogram>,
    codes: [OnceLock<Counter>; CODE_SLOTS],
}

impl MethodSlot {
    fn new(name: &'static str) -> Self {
        MethodSlot {
            name,
            duration: OnceLock::new(),
            codes: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

/// Per-method metrics of every CRI call crisp forwards, and the tap's own. Fed by the tap
/// interceptor's `on_complete`.
pub struct CallMetrics {
    durations: Histograms<MethodLabel>,
    calls: Family<CallLabels, Counter>,
    /// Indexed by `Rpc as usize`.
    methods: Box<[MethodSlot]>,
    /// Paths crisp does not know.
    unknown: MethodSlot,
    /// Highest call id seen starting. Call ids are handed out in order as calls arrive, so this
    /// minus `completed` is the number of calls in flight, without a hook at call start.
    pub(crate) highest_call_id: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) tap_subscribers: Gauge,
    pub(crate) tap_events: Counter,
    pub(crate) tap_dropped: Counter,
    /// Where the calls in flight are counted ([`CallMetrics::count_in_flight_with`]).
    #[allow(clippy::type_complexity)]
    live: OnceLock<Box<dyn Fn() -> u64 + Send + Sync>>,
}

impl Default for CallMetrics {
    fn default() -> Self {
        CallMetrics {
            durations: Family::new_with_constructor(|| Histogram::new(CALL_BUCKETS)),
            calls: Family::default(),
            methods: crate::cri::Rpc::ALL
                .iter()
                .map(|r| MethodSlot::new(r.name()))
                .collect(),
            unknown: MethodSlot::new("unknown"),
            highest_call_id: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            tap_subscribers: Gauge::default(),
            tap_events: Counter::default(),
            tap_dropped: Counter::default(),
            live: OnceLock::new(),
        }
    }
}

impl CallMetrics {
    fn slot(&self, rpc: Option<crate::cri::Rpc>) -> &MethodSlot {
        // `Rpc as usize` is its position in `Rpc::ALL`, so `get` always finds it; the fallback
        // keeps a future mismatch from panicking on the call path.
        rpc.and_then(|r| self.methods.get(r as usize))
            .unwrap_or(&self.unknown)
    }

    /// Records one finished call.
    pub fn observe(&self, rpc: Option<crate::cri::Rpc>, code: Option<i32>, d: Duration) {
        let m = self.slot(rpc);
        let method = m.name;
        m.duration
            .get_or_init(|| self.durations.get_or_create_owned(&MethodLabel { method }))
            .observe(d.as_secs_f64());
        let c = code_slot(code);
        m.codes[c]
            .get_or_init(|| {
                self.calls.get_or_create_owned(&CallLabels {
                    method,
                    code: code_name(slot_code(c)),
                })
            })
            .inc();
        self.completed.fetch_add(1, Relaxed);
    }

    /// Calls that have started and not yet ended: what the relay threads count
    /// ([`CallMetrics::count_in_flight_with`]). Without them (the tap alone, in its tests), the
    /// highest call id seen less the calls completed, which drifts up for good when calls
    /// that take ids are never reported (refused after GOAWAY, relayed unobserved).
    pub fn in_flight(&self) -> u64 {
        match self.live.get() {
            Some(count) => count(),
            None => self
                .highest_call_id
                .load(Relaxed)
                .saturating_sub(self.completed.load(Relaxed)),
        }
    }

    /// Counts the calls in flight with `count` from now on (the proxy's relay threads).
    pub fn count_in_flight_with(&self, count: impl Fn() -> u64 + Send + Sync + 'static) {
        let _ = self.live.set(Box::new(count));
    }

    /// Number of calls of `rpc` that ended with `code` (for tests).
    #[cfg(any(test, feature = "test-util"))]
    pub fn count(&self, rpc: Option<crate::cri::Rpc>, code: Option<i32>) -> u64 {
        if code.is_some_and(|c| !(0..17).contains(&c)) {
            return 0;
        }
        self.slot(rpc).codes[code_slot(code)]
            .get()
            .map_or(0, Counter::get)
    }

    /// Adds these metrics to `reg` (the registry shares their values).
    pub fn register(self: &Arc<Self>, reg: &mut Registry) {
        reg.register(
            "crisp_cri_call_duration_seconds",
            "Latency of CRI calls through crisp, from request headers to the end of the response (holds included)",
            self.durations.clone(),
        );
        reg.register("crisp_cri_calls", "CRI calls through crisp by method and gRPC status (code \"None\": the client went away first)", self.calls.clone());
        let me = self.clone();
        reg.register_collector(Box::new(ScrapedGauge::new(
            "crisp_cri_calls_in_flight",
            "CRI calls crisp is forwarding or holding right now.",
            move || me.in_flight(),
        )));
        reg.register(
            "crisp_tap_subscribers",
            "Clients attached to the debug tap",
            self.tap_subscribers.clone(),
        );
        reg.register(
            "crisp_tap_events",
            "Tap events queued for tap clients",
            self.tap_events.clone(),
        );
        reg.register("crisp_tap_events_dropped", "Tap events dropped because a tap client's queue was full (CRI calls are never slowed for a tap)", self.tap_dropped.clone());
    }
}

/// A gauge whose value is read when scraped, from state crisp keeps anyway (prometheus-client's
/// [`Collector`]): calls in flight, pods tracked. `help` is served as given.
pub struct ScrapedGauge<F> {
    name: &'static str,
    help: &'static str,
    read: F,
}

impl<F: Fn() -> u64 + Send + Sync + 'static> ScrapedGauge<F> {
    pub fn new(name: &'static str, help: &'static str, read: F) -> Self {
        ScrapedGauge { name, help, read }
    }
}

impl<F> std::fmt::Debug for ScrapedGauge<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapedGauge")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<F: Fn() -> u64 + Send + Sync + 'static> Collector for ScrapedGauge<F> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let g = ConstGauge::new((self.read)());
        g.encode(encoder.encode_descriptor(self.name, self.help, None, g.metric_type())?)
    }
}

/// A counter whose value is read when scraped, from an atomic another module keeps (the
/// watchdog's, the interceptors' panics). `name` without `_total`: it is added when served.
pub struct ScrapedCounter<F> {
    name: &'static str,
    help: &'static str,
    read: F,
}

impl<F: Fn() -> u64 + Send + Sync + 'static> ScrapedCounter<F> {
    pub fn new(name: &'static str, help: &'static str, read: F) -> Self {
        ScrapedCounter { name, help, read }
    }
}

impl<F> std::fmt::Debug for ScrapedCounter<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapedCounter")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<F: Fn() -> u64 + Send + Sync + 'static> Collector for ScrapedCounter<F> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = prometheus_client::metrics::counter::ConstCounter::new((self.read)());
        c.encode(encoder.encode_descriptor(self.name, self.help, None, c.metric_type())?)
    }
}

/// Everything in `reg`, in the Prometheus text format ([`CONTENT_TYPE`]).
pub fn encode(reg: &Registry) -> String {
    let mut out = String::with_capacity(16 << 10);
    // Only the writer can fail, and a String never does.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, reg);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::Rpc;

    #[test]
    fn call_metrics_render_cumulative_buckets_and_codes() {
        let m = Arc::new(CallMetrics::default());
        m.observe(
            Some(Rpc::CreateContainer),
            Some(0),
            Duration::from_micros(300),
        );
        m.observe(
            Some(Rpc::CreateContainer),
            Some(0),
            Duration::from_millis(20),
        );
        m.observe(
            Some(Rpc::CreateContainer),
            Some(9),
            Duration::from_secs(500),
        );
        m.observe(Some(Rpc::CreateContainer), Some(99), Duration::from_secs(1));
        m.observe(None, None, Duration::from_millis(1));
        m.highest_call_id.store(6, Relaxed);
        assert_eq!(m.in_flight(), 1);
        assert_eq!(m.count(Some(Rpc::CreateContainer), Some(0)), 2);
        assert_eq!(
            m.count(Some(Rpc::CreateContainer), Some(2)),
            1,
            "a code outside the spec counts as Unknown"
        );
        assert_eq!(m.count(Some(Rpc::CreateContainer), Some(99)), 0);
        assert_eq!(m.count(Some(Rpc::Version), Some(0)), 0);
        let mut reg = Registry::default();
        m.register(&mut reg);
        let out = encode(&reg);
        for line in [
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"0.0005\"} 1",
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"0.025\"} 2",
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"1\"} 3",
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"120\"} 3",
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"+Inf\"} 4",
            "crisp_cri_call_duration_seconds_count{method=\"CreateContainer\"} 4",
            "crisp_cri_call_duration_seconds_sum{method=\"unknown\"} 0.001",
            "crisp_cri_calls_total{method=\"CreateContainer\",code=\"OK\"} 2",
            "crisp_cri_calls_total{method=\"CreateContainer\",code=\"FailedPrecondition\"} 1",
            "crisp_cri_calls_total{method=\"CreateContainer\",code=\"Unknown\"} 1",
            "crisp_cri_calls_total{method=\"unknown\",code=\"None\"} 1",
            "crisp_cri_calls_in_flight 1",
        ] {
            assert!(
                out.contains(&format!("{line}\n")),
                "missing {line:?} in\n{out}"
            );
        }
        // Methods never called are not rendered.
        assert!(!out.contains("method=\"Version\""));
    }

    /// The names, types and HELP texts crisp has always served: dashboards and the e2e tests
    /// read them.
    #[test]
    fn served_names_types_and_help() {
        let calls = Arc::new(CallMetrics::default());
        calls.observe(Some(Rpc::Version), Some(0), Duration::from_millis(1));
        let ordering = OrderingMetrics::default();
        let mut reg = Registry::default();
        calls.register(&mut reg);
        ordering.register(&mut reg);
        let out = encode(&reg);
        for (name, kind, help) in [
            ("crisp_cri_call_duration_seconds", "histogram", "Latency of CRI calls through crisp, from request headers to the end of the response (holds included)."),
            ("crisp_cri_calls_total", "counter", "CRI calls through crisp by method and gRPC status (code \"None\": the client went away first)."),
            ("crisp_cri_calls_in_flight", "gauge", "CRI calls crisp is forwarding or holding right now."),
            ("crisp_tap_subscribers", "gauge", "Clients attached to the debug tap."),
            ("crisp_tap_events_total", "counter", "Tap events queued for tap clients."),
            ("crisp_tap_events_dropped_total", "counter", "Tap events dropped because a tap client's queue was full (CRI calls are never slowed for a tap)."),
            ("crisp_hold_seconds", "histogram", "Time calls were held by the ordering engine."),
            ("crisp_holds_in_flight", "gauge", "Calls currently held."),
            ("crisp_hold_timeouts_total", "counter", "Start holds that reached their timeout."),
            ("crisp_fail_fast_total", "counter", "App creations refused because a declared sidecar was not created or not running."),
            ("crisp_bad_annotations_total", "counter", "Malformed crisp.dev annotations (pods run as if the key were absent)."),
            ("crisp_probe_errors_total", "counter", "Readiness probes that could not be run (runtime errors)."),
            ("crisp_job_sidecars_stopped_total", "counter", "Sidecars stopped by crisp because their Job finished."),
            ("crisp_state_write_errors_total", "counter", "Durable writes to the state directory that failed (what: mark, a Job sidecar then not stopped; intent, a held call then not kept across a restart)."),
            ("crisp_intents_kept_total", "counter", "Held CRI calls recorded durably in the state directory (one durable write each)."),
            ("crisp_intents_replayed_total", "counter", "Kept StopContainer calls a restarted crisp carried out itself."),
            ("crisp_probe_in_flight", "gauge", "Readiness probes running now (node-wide bound: ordering.max_probes_in_flight)."),
            ("crisp_probe_connects_total", "counter", "TCP connections opened by readiness probes."),
            ("crisp_probe_limited_total", "counter", "Readiness probes not run this round because a node-wide probe bound was reached."),
            ("crisp_probe_netns_failures_total", "counter", "CNI pods whose network namespace crisp could not find or enter (probes of their loopback fail)."),
            ("crisp_exec_probe_pod_paced_total", "counter", "Exec readiness probes that waited for a turn of their pod's own rate (ordering.exec_probes_per_pod_per_second)."),
            ("crisp_exec_probe_pod_limited_total", "counter", "Exec readiness probes not run this round because their pod's own rate had no turn before the probe timeout."),
        ] {
            let want = format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
            assert!(out.contains(&want), "missing {want:?} in\n{out}");
        }
        for line in [
            "crisp_hold_seconds_bucket{gate=\"start\",le=\"90\"} 0",
            "crisp_hold_seconds_bucket{gate=\"stop\",le=\"0.05\"} 0",
            "crisp_hold_seconds_count{gate=\"start\"} 0",
            "crisp_hold_seconds_count{gate=\"stop\"} 0",
            "crisp_holds_in_flight 0",
            "crisp_tap_events_dropped_total 0",
            "crisp_state_write_errors_total{what=\"mark\"} 0",
            "crisp_state_write_errors_total{what=\"intent\"} 0",
        ] {
            assert!(
                out.contains(&format!("{line}\n")),
                "missing {line:?} in\n{out}"
            );
        }
    }

    #[test]
    fn gauge_guard_counts_a_hold_until_dropped() {
        let m = OrderingMetrics::default();
        let a = GaugeGuard::new(&m.holds_in_flight);
        let b = GaugeGuard::new(&m.holds_in_flight);
        assert_eq!(m.holds_in_flight.get(), 2);
        drop(a);
        assert_eq!(m.holds_in_flight.get(), 1);
        // An abandoned call: its future is dropped mid-hold, and the guard with it.
        let held = async move {
            let _b = b;
            std::future::pending::<()>().await
        };
        drop(held);
        assert_eq!(m.holds_in_flight.get(), 0);
    }
}
