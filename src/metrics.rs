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
