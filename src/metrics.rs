//! crisp's own counters, rendered in the Prometheus text format. Plain atomics: incrementing one
//! costs a few nanoseconds and never blocks a call.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Bucket upper bounds (seconds) for hold durations.
const HOLD_BUCKETS: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 90.0];

#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; HOLD_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in HOLD_BUCKETS.iter().enumerate() {
            if s <= *b {
                self.buckets[i].fetch_add(1, Relaxed);
            }
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in HOLD_BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {}", self.buckets[i].load(Relaxed));
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.count());
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_micros.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count());
    }
}

/// The ordering engine's counters.
#[derive(Default)]
pub struct OrderingMetrics {
    pub start_holds: Histogram,
    pub stop_holds: Histogram,
    pub holds_in_flight: AtomicU64,
    pub start_hold_timeouts: AtomicU64,
    pub fail_fast: AtomicU64,
    pub bad_annotations: AtomicU64,
    pub probe_errors: AtomicU64,
    pub job_sidecars_stopped: AtomicU64,
}

impl OrderingMetrics {
    pub fn render(&self, out: &mut String) {
        let c = |out: &mut String, name: &str, help: &str, v: &AtomicU64, kind: &str| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {}", v.load(Relaxed));
        };
        let _ = writeln!(out, "# HELP crisp_hold_seconds Time calls were held by the ordering engine.\n# TYPE crisp_hold_seconds histogram");
        self.start_holds.render(out, "crisp_hold_seconds", "gate=\"start\"");
        self.stop_holds.render(out, "crisp_hold_seconds", "gate=\"stop\"");
        c(out, "crisp_holds_in_flight", "Calls currently held.", &self.holds_in_flight, "gauge");
        c(out, "crisp_hold_timeouts_total", "Start holds that reached their timeout.", &self.start_hold_timeouts, "counter");
        c(out, "crisp_fail_fast_total", "App creations refused because a declared sidecar was not created or not running.", &self.fail_fast, "counter");
        c(out, "crisp_bad_annotations_total", "Malformed crisp.dev annotations (pods run as if the key were absent).", &self.bad_annotations, "counter");
        c(out, "crisp_probe_errors_total", "Readiness probes that could not be run (runtime errors).", &self.probe_errors, "counter");
        c(out, "crisp_job_sidecars_stopped_total", "Sidecars stopped by crisp because their Job finished.", &self.job_sidecars_stopped, "counter");
    }
}

/// Decrements a gauge when dropped: holds are counted correctly even when kubelet abandons one.
pub struct GaugeGuard<'a>(&'a AtomicU64);

impl<'a> GaugeGuard<'a> {
    pub fn new(g: &'a AtomicU64) -> Self {
        g.fetch_add(1, Relaxed);
        GaugeGuard(g)
    }
}

impl Drop for GaugeGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Bucket upper bounds (seconds) for CRI call latency: sub-millisecond polling calls up to
/// kubelet's 2 min runtime-request-timeout.
pub const CALL_BUCKETS: [f64; 16] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0];

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

/// One method's latency histogram and status counts. Buckets are stored non-cumulative (one
/// increment per call) and summed when rendered.
struct MethodMetrics {
    buckets: [AtomicU64; CALL_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
    codes: [AtomicU64; CODE_SLOTS],
}

impl Default for MethodMetrics {
    fn default() -> Self {
        MethodMetrics { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_micros: AtomicU64::new(0), codes: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

/// Per-method counters of every CRI call crisp forwards, and the tap's own counters. Fed by the
/// tap interceptor's `on_complete`: a handful of relaxed atomic increments per call.
pub struct CallMetrics {
    /// Indexed by `Rpc as usize`.
    methods: Box<[MethodMetrics]>,
    /// Paths crisp does not know.
    unknown: MethodMetrics,
    /// Highest call id seen starting. Call ids are handed out in order as calls arrive, so this
    /// minus `completed` is the number of calls in flight, without a hook at call start.
    pub highest_call_id: AtomicU64,
    pub completed: AtomicU64,
    pub tap_subscribers: AtomicU64,
    pub tap_events: AtomicU64,
    pub tap_dropped: AtomicU64,
}

impl Default for CallMetrics {
    fn default() -> Self {
        CallMetrics {
            methods: crate::cri::Rpc::ALL.iter().map(|_| MethodMetrics::default()).collect(),
            unknown: MethodMetrics::default(),
            highest_call_id: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            tap_subscribers: AtomicU64::new(0),
            tap_events: AtomicU64::new(0),
            tap_dropped: AtomicU64::new(0),
        }
    }
}

impl CallMetrics {
    fn slot(&self, rpc: Option<crate::cri::Rpc>) -> &MethodMetrics {
        // `Rpc as usize` is its position in `Rpc::ALL`, so `get` always finds it; the fallback
        // keeps a future mismatch from panicking on the call path.
        rpc.and_then(|r| self.methods.get(r as usize)).unwrap_or(&self.unknown)
    }

    /// Records one finished call.
    pub fn observe(&self, rpc: Option<crate::cri::Rpc>, code: Option<i32>, d: Duration) {
        let m = self.slot(rpc);
        let s = d.as_secs_f64();
        let b = CALL_BUCKETS.iter().position(|b| s <= *b).unwrap_or(CALL_BUCKETS.len());
        m.buckets[b].fetch_add(1, Relaxed);
        m.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
        let c = match code {
            Some(c) if (0..17).contains(&c) => c as usize,
            // A code outside the spec is counted as Unknown, as gRPC clients treat it.
            Some(_) => 2,
            None => CODE_SLOTS - 1,
        };
        m.codes[c].fetch_add(1, Relaxed);
        self.completed.fetch_add(1, Relaxed);
    }

    /// Calls that have started and not yet ended.
    pub fn in_flight(&self) -> u64 {
        self.highest_call_id.load(Relaxed).saturating_sub(self.completed.load(Relaxed))
    }

    /// Number of calls of `rpc` that ended with `code` (tests and the admin API).
    pub fn count(&self, rpc: Option<crate::cri::Rpc>, code: Option<i32>) -> u64 {
        let m = self.slot(rpc);
        match code {
            Some(c) if (0..17).contains(&c) => m.codes[c as usize].load(Relaxed),
            Some(_) => 0,
            None => m.codes[CODE_SLOTS - 1].load(Relaxed),
        }
    }

    pub fn render(&self, out: &mut String) {
        let names = crate::cri::Rpc::ALL.iter().map(|r| r.name()).chain(std::iter::once("unknown"));
        let _ = writeln!(out, "# HELP crisp_cri_call_duration_seconds Latency of CRI calls through crisp, from request headers to the end of the response (holds included).\n# TYPE crisp_cri_call_duration_seconds histogram");
        let mut calls = String::new();
        for (name, m) in names.zip(self.methods.iter().chain(std::iter::once(&self.unknown))) {
            let total: u64 = m.buckets.iter().map(|b| b.load(Relaxed)).sum();
            if total == 0 {
                continue;
            }
            let mut acc = 0;
            for (i, b) in CALL_BUCKETS.iter().enumerate() {
                acc += m.buckets[i].load(Relaxed);
                let _ = writeln!(out, "crisp_cri_call_duration_seconds_bucket{{method=\"{name}\",le=\"{b}\"}} {acc}");
            }
            let _ = writeln!(out, "crisp_cri_call_duration_seconds_bucket{{method=\"{name}\",le=\"+Inf\"}} {total}");
            let _ = writeln!(out, "crisp_cri_call_duration_seconds_sum{{method=\"{name}\"}} {}", m.sum_micros.load(Relaxed) as f64 / 1e6);
            let _ = writeln!(out, "crisp_cri_call_duration_seconds_count{{method=\"{name}\"}} {total}");
            for (c, n) in m.codes.iter().enumerate() {
                let n = n.load(Relaxed);
                if n > 0 {
                    let code = if c == CODE_SLOTS - 1 { None } else { Some(c as i32) };
                    let _ = writeln!(calls, "crisp_cri_calls_total{{method=\"{name}\",code=\"{}\"}} {n}", code_name(code));
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP crisp_cri_calls_total CRI calls through crisp by method and gRPC status (code \"None\": the client went away first).\n# TYPE crisp_cri_calls_total counter"
        );
        out.push_str(&calls);
        let g = |out: &mut String, name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        g(out, "crisp_cri_calls_in_flight", "CRI calls crisp is forwarding or holding right now.", "gauge", self.in_flight());
        g(out, "crisp_tap_subscribers", "Clients attached to the debug tap.", "gauge", self.tap_subscribers.load(Relaxed));
        g(out, "crisp_tap_events_total", "Tap events queued for tap clients.", "counter", self.tap_events.load(Relaxed));
        g(
            out,
            "crisp_tap_events_dropped_total",
            "Tap events dropped because a tap client's queue was full (CRI calls are never slowed for a tap).",
            "counter",
            self.tap_dropped.load(Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::Rpc;

    #[test]
    fn call_metrics_render_cumulative_buckets_and_codes() {
        let m = CallMetrics::default();
        m.observe(Some(Rpc::CreateContainer), Some(0), Duration::from_micros(300));
        m.observe(Some(Rpc::CreateContainer), Some(0), Duration::from_millis(20));
        m.observe(Some(Rpc::CreateContainer), Some(9), Duration::from_secs(500));
        m.observe(None, None, Duration::from_millis(1));
        m.highest_call_id.store(5, Relaxed);
        assert_eq!(m.in_flight(), 1);
        assert_eq!(m.count(Some(Rpc::CreateContainer), Some(0)), 2);
        let mut out = String::new();
        m.render(&mut out);
        for line in [
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"0.0005\"} 1",
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"0.025\"} 2",
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"120\"} 2",
            "crisp_cri_call_duration_seconds_bucket{method=\"CreateContainer\",le=\"+Inf\"} 3",
            "crisp_cri_call_duration_seconds_count{method=\"CreateContainer\"} 3",
            "crisp_cri_calls_total{method=\"CreateContainer\",code=\"OK\"} 2",
            "crisp_cri_calls_total{method=\"CreateContainer\",code=\"FailedPrecondition\"} 1",
            "crisp_cri_calls_total{method=\"unknown\",code=\"None\"} 1",
            "crisp_cri_calls_in_flight 1",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        // Methods never called are not rendered.
        assert!(!out.contains("method=\"Version\""));
    }
}
