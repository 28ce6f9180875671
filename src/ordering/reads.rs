//! The node-wide bound on crisp's own repeated runtime reads (issue #26): a held call lists its
//! pod's containers again every probe interval for as long as its hold lasts, and a Job
//! watcher reads its pod's containers every `job.poll_interval` for the pod's life. Both are
//! paced by one [`ReadLimiter`] for the whole node: `runtime_reads_per_second` (a
//! [`TokenBucket`] holding a tenth of a second's worth, the probes' rule) and
//! `max_runtime_reads_in_flight`.
//!
//! What it does not pace: kubelet's own calls (List and Status calls are never observed, see
//! `mod.rs`), and the first read of each call crisp orders — one read per kubelet call, so
//! kubelet's own call rate bounds those, and an ordinary pod's start never waits behind
//! another pod's hold. Reservations are served in the order they were made, so every held
//! call and watcher gets its turn: with N of them polling, each reads about every
//! N / `runtime_reads_per_second` seconds.

use parking_lot::Mutex;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::readiness::TokenBucket;

/// No read before the caller's deadline: its hold ends as if the runtime had not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("node-wide runtime read limit: no read possible before the hold's end")]
pub(crate) struct ReadLimited;

pub(crate) struct ReadLimiter {
    in_flight: Semaphore,
    bucket: Mutex<TokenBucket>,
}

impl ReadLimiter {
    pub(crate) fn new(reads_per_second: u32, max_in_flight: usize) -> ReadLimiter {
        let rate = f64::from(reads_per_second.max(1));
        let burst = (rate / 10.0).max(1.0);
        ReadLimiter {
            in_flight: Semaphore::new(max_in_flight.max(1)),
            bucket: Mutex::new(TokenBucket::new(rate, burst, Instant::now())),
        }
    }

    /// Leave for one read, held while it runs. Waited for until `until` at most (`None`: as
    /// long as it takes — a watcher has no deadline). A token is reserved only when it comes
    /// before `until`, so a caller that cannot have one leaves no debt behind.
    pub(crate) async fn read(
        &self,
        until: Option<Instant>,
    ) -> Result<SemaphorePermit<'_>, ReadLimited> {
        let wait = self.bucket.lock().reserve(until).ok_or(ReadLimited)?;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        match until {
            Some(until) => tokio::time::timeout_at(until, self.in_flight.acquire())
                .await
                .map_err(|_| ReadLimited)?
                .map_err(|_| ReadLimited),
            None => self.in_flight.acquire().await.map_err(|_| ReadLimited),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    const S: Duration = Duration::from_secs(1);

    /// 200 pollers, each reading as fast as it may for 10 s: a tenth of a second's worth at
    /// once, then `rate` reads a second, node-wide; and each poller gets its turn.
    #[tokio::test(start_paused = true)]
    async fn pollers_read_at_most_the_rate_and_each_gets_its_turn() {
        let l = Arc::new(ReadLimiter::new(50, 4));
        let t = Instant::now();
        let mut pollers = Vec::new();
        for _ in 0..200 {
            let l = l.clone();
            pollers.push(tokio::spawn(async move {
                let mut reads = 0u32;
                while let Ok(_p) = l.read(Some(t + 10 * S)).await {
                    reads += 1;
                }
                reads
            }));
        }
        let mut total = 0;
        for p in pollers {
            let reads = p.await.unwrap();
            assert!(reads >= 2, "every poller read at least twice: {reads}");
            total += reads;
        }
        assert_eq!(total, 5 + 50 * 10, "the burst, then 50 a second");
        assert_eq!(
            Instant::now(),
            t + 10 * S,
            "gave up at the deadline, with no debt beyond it"
        );
    }

    /// Reads in flight are bounded too, and a read that cannot start before its deadline is
    /// refused then.
    #[tokio::test(start_paused = true)]
    async fn reads_in_flight_are_bounded() {
        let l = ReadLimiter::new(1000, 2);
        let t = Instant::now();
        let _a = l.read(None).await.unwrap();
        let _b = l.read(None).await.unwrap();
        assert_eq!(l.read(Some(t + S)).await.unwrap_err(), ReadLimited);
        assert_eq!(Instant::now(), t + S);
    }
}
