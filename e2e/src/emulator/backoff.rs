//! `flowcontrol.Backoff` as kubelet uses it for crash loops and image pulls (KUBELET-CRI §5):
//! per-key exponential back-off, no jitter, reset after 2 × max of quiet.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

#[derive(Clone, Copy, Debug)]
struct Entry {
    backoff: Duration,
    last_update: SystemTime,
}

/// Per-key exponential back-off. Times are wall-clock because the event time compared against it
/// is the runtime's `finished_at`.
#[derive(Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

// === impl Backoff ===

impl Backoff {
    /// `flowcontrol.NewBackOff(initial, max)`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    fn has_expired(&self, event_time: SystemTime, last_update: SystemTime) -> bool {
        // "consider stable if it's ok for twice the maxDuration"
        event_time
            .duration_since(last_update)
            .map(|d| d > self.max * 2)
            .unwrap_or(false)
    }

    /// `Next(id, eventTime)`: first call (or after expiry) sets `initial`, later ones double up to `max`.
    pub fn next(&mut self, id: &str, event_time: SystemTime) {
        let now = SystemTime::now();
        let backoff = match self.entries.get(id) {
            Some(e) if !self.has_expired(event_time, e.last_update) => {
                (e.backoff * 2).min(self.max)
            }
            _ => self.initial,
        };
        self.entries.insert(
            id.to_string(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// The current back-off of `id` (0 if none).
    pub fn get(&self, id: &str) -> Duration {
        self.entries.get(id).map(|e| e.backoff).unwrap_or_default()
    }

    /// `IsInBackOffSince(id, eventTime)`: `now - eventTime < backoff`.
    pub fn is_in_backoff_since(&self, id: &str, event_time: SystemTime) -> bool {
        let Some(e) = self.entries.get(id) else {
            return false;
        };
        if self.has_expired(event_time, e.last_update) {
            return false;
        }
        SystemTime::now()
            .duration_since(event_time)
            .map(|d| d < e.backoff)
            .unwrap_or(true)
    }

    /// `IsInBackOffSinceUpdate(id, eventTime)`: `eventTime - lastUpdate < backoff`.
    pub fn is_in_backoff_since_update(&self, id: &str, event_time: SystemTime) -> bool {
        let Some(e) = self.entries.get(id) else {
            return false;
        };
        if self.has_expired(event_time, e.last_update) {
            return false;
        }
        event_time
            .duration_since(e.last_update)
            .map(|d| d < e.backoff)
            .unwrap_or(true)
    }
}

/// ns since the epoch → `SystemTime`.
pub fn from_unix_nanos(ns: i64) -> SystemTime {
    if ns <= 0 {
        return SystemTime::UNIX_EPOCH;
    }
    SystemTime::UNIX_EPOCH + Duration::from_nanos(ns as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_restart_is_free_then_doubles() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        let finished = SystemTime::now();
        assert!(
            !b.is_in_backoff_since("k", finished),
            "no entry: restart at once"
        );
        b.next("k", finished);
        assert_eq!(b.get("k"), Duration::from_secs(10));
        assert!(b.is_in_backoff_since("k", SystemTime::now()));
        b.next("k", SystemTime::now());
        assert_eq!(b.get("k"), Duration::from_secs(20));
        let old = SystemTime::now() - Duration::from_secs(30);
        assert!(
            !b.is_in_backoff_since("k", old),
            "30 s since finish > 20 s back-off"
        );
    }

    #[test]
    fn capped_at_max() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        for _ in 0..10 {
            b.next("k", SystemTime::now());
        }
        assert_eq!(b.get("k"), Duration::from_secs(300));
    }
}
