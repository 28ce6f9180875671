//! The token bucket that paces crisp's node-wide bounds: the probes' connects and execs (and
//! each pod's own exec pace, [`super::ProbeLimiter`]) and the ordering engine's repeated
//! runtime reads (`ordering::reads`). One rule, so a rate means the same thing everywhere.

use std::time::Duration;

use tokio::time::Instant;

/// `rate` tokens a second, at most `burst` kept; a turn takes one. A turn is promised only when
/// its token comes before the caller's deadline, so a caller that gives up leaves no debt.
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket (`burst` tokens) at `now`, refilled at `rate` a second.
    pub(crate) fn new(rate: f64, burst: f64, now: Instant) -> TokenBucket {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    /// Tokens a second.
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// Refills the bucket to `now` (capped at `burst`).
    fn refill(&mut self, now: Instant) {
        self.tokens = (self.tokens
            + now.saturating_duration_since(self.at).as_secs_f64() * self.rate)
            .min(self.burst);
        self.at = now;
    }

    /// Full at `now`: it carries nothing a new bucket would not.
    pub(crate) fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }

    /// Takes a token that is there, or will be by `deadline` (`None`: however long it takes),
    /// and says how long until it is; `None` (nothing taken) when it would come too late.
    /// Tokens go below zero for the turns already promised, so turns are handed out in the
    /// order they were asked for.
    pub(crate) fn reserve(&mut self, deadline: Option<Instant>) -> Option<Duration> {
        let now = Instant::now();
        self.refill(now);
        let wait = if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / self.rate)
        };
        if deadline.is_some_and(|deadline| now + wait > deadline) {
            return None;
        }
        self.tokens -= 1.0;
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The burst at once, then one turn each 1/rate, in the order asked; a turn past the
    /// deadline is refused and takes nothing; an idle bucket fills up to its burst, no more.
    #[tokio::test(start_paused = true)]
    async fn turns_come_at_the_rate_after_the_burst() {
        let t = Instant::now();
        let mut b = TokenBucket::new(10.0, 2.0, t);
        assert_eq!(b.rate(), 10.0);
        assert!(b.is_full(t));
        assert_eq!(b.reserve(None), Some(Duration::ZERO));
        assert_eq!(b.reserve(None), Some(Duration::ZERO));
        assert!(!b.is_full(t));
        assert_eq!(b.reserve(Some(t + 100 * MS)), Some(100 * MS));
        assert_eq!(
            b.reserve(Some(t + 150 * MS)),
            None,
            "too late: nothing taken"
        );
        assert_eq!(b.reserve(Some(t + 200 * MS)), Some(200 * MS));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(b.is_full(Instant::now()));
        assert_eq!(b.reserve(None), Some(Duration::ZERO));
        assert_eq!(b.reserve(None), Some(Duration::ZERO));
        assert_eq!(
            b.reserve(None),
            Some(100 * MS),
            "no more than the burst kept"
        );
    }
}
