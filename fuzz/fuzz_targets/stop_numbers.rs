//! Issue #26: the stop rules of `ordering::decide` on every number a pod or kubelet can put in
//! a StopContainer — its `timeout` (the pod's terminationGracePeriodSeconds, any int64),
//! kubelet's deadline (grpc-timeout, which kubelet's own arithmetic can wrap) and the time the
//! call has been held — and on raw durations up to `Duration::MAX`. No panic; a grace period
//! is at most `decide::MAX_GRACE`; a hold never ends after kubelet's deadline; the runtime is
//! never asked to wait more than a day nor less than the 2 s tail.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use crisp::config::TimeoutPolicy;
use crisp::ordering::decide;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    timeout: i64,
    deadline_ms: Option<u64>,
    elapsed_ms: u64,
    raw_secs: u64,
    raw_nanos: u32,
}

fuzz_target!(|i: Input| {
    let t = Instant::now();
    let grace = decide::grace_from_secs(i.timeout);
    assert!(grace <= decide::MAX_GRACE, "{i:?}");
    let raw = Duration::new(i.raw_secs, i.raw_nanos % 1_000_000_000);
    let deadline = i
        .deadline_ms
        .and_then(|ms| t.checked_add(Duration::from_millis(ms)));
    let now = t
        .checked_add(Duration::from_millis(i.elapsed_ms))
        .unwrap_or(t);
    for g in [grace, raw] {
        let hold = decide::stop_hold_end(t, g, deadline);
        if let Some(d) = deadline {
            assert!(hold <= d, "{i:?}");
        }
        let _ = decide::single_kill_after(t, g);
        let _ = decide::create_hold_end(t, g, deadline);
        let _ = decide::after_waiting(now, hold, g, TimeoutPolicy::Proceed);
        let end = decide::later(t, g);
        let secs = decide::budget_secs(Some(end), now);
        assert!((2..=86_400).contains(&secs), "{i:?}: {secs}");
        if let Some(patched) = decide::stop_timeout(end, now, i.timeout) {
            assert!(patched < i.timeout && patched <= 86_400, "{i:?}: {patched}");
        }
    }
});
