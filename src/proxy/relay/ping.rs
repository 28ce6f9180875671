//! PINGs: which of the client's go on to the runtime, and crisp's own keep-alive.

use std::time::{Duration, Instant};

/// Opaque data of crisp's own keep-alive PINGs; their ACKs are not relayed.
pub(crate) const KEEPALIVE: [u8; 8] = *b"crisp-ka";

/// Opaque data of the PING that follows crisp's first GOAWAY (a graceful shutdown in two
/// steps, RFC 9113 §6.8): its ACK proves the client has read that GOAWAY, so every stream it
/// opened before has arrived. Not relayed.
pub(crate) const GOAWAY_PING: [u8; 8] = *b"crisp-gw";

/// Decides which of the client's PINGs go on to the runtime.
///
/// grpc-go clients (kubelet, crictl) send a PING whenever DATA arrives and none is outstanding
/// (BDP estimation). A grpc-go server (containerd) counts a PING as a "strike" unless it has sent
/// HEADERS or DATA on that connection since the previous PING, and closes the connection with
/// GOAWAY ENHANCE_YOUR_CALM after three strikes (KUBELET-CRI.md §11). Through crisp, DATA the
/// client receives may come from crisp itself (a diverted call's response), so its PINGs would
/// reach a runtime connection that said nothing: strikes. crisp therefore forwards a client PING
/// only when the runtime has written HEADERS or DATA since the ACK of the previous forwarded
/// one (frames on a connection are ordered, so those were written after that PING was counted),
/// and answers the others itself. The runtime never sees a PING it would count; BDP estimation
/// still measures the runtime's round trip whenever the data came from the runtime.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PingGate {
    /// No HEADERS/DATA from the runtime since the last forwarded PING was answered.
    #[default]
    Stale,
    /// The runtime wrote HEADERS or DATA since then: a PING now resets its strikes.
    Fresh,
    /// A forwarded PING awaits its ACK.
    Outstanding,
}

impl PingGate {
    /// The runtime sent HEADERS or DATA (runtime → client direction, in wire order).
    pub(crate) fn runtime_wrote(&mut self) {
        if *self == PingGate::Stale {
            *self = PingGate::Fresh;
        }
    }

    /// The runtime answered a PING.
    pub(crate) fn acked(&mut self) {
        if *self == PingGate::Outstanding {
            *self = PingGate::Stale;
        }
    }

    /// Whether a client PING may go to the runtime now (and if so, it is outstanding).
    pub(crate) fn try_forward(&mut self) -> bool {
        let fresh = *self == PingGate::Fresh;
        if fresh {
            *self = PingGate::Outstanding;
        }
        fresh
    }
}

/// crisp's keep-alive of one client connection.
pub(crate) struct KeepAlive {
    /// PING a client idle this long.
    every: Duration,
    /// Close a client that has not answered a PING for this long.
    timeout: Duration,
    ping_sent: Option<Instant>,
}

/// What the keep-alive wants done now.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeepAliveAction {
    Nothing,
    /// Send the client a PING.
    Ping,
    /// The client did not answer in time: close its connection.
    Dead,
}

impl KeepAlive {
    pub(crate) fn new(every: Duration, timeout: Duration) -> KeepAlive {
        KeepAlive {
            every,
            timeout,
            ping_sent: None,
        }
    }

    /// Half the shorter of the two periods, at least 10 ms: how often a degraded, idle client
    /// asks whether the runtime is back (`Core::poll_timeout`).
    pub(crate) fn tick(&self) -> Duration {
        (self.every.min(self.timeout) / 2).max(Duration::from_millis(10))
    }

    /// When [`KeepAlive::check`] or [`KeepAlive::ping`] next has something to do: the
    /// unanswered PING's deadline, or the moment the client has been idle for the period (only
    /// when crisp `can` write a PING then; otherwise the shell wakes when it can, for other
    /// reasons, and asks again).
    pub(crate) fn next(&self, last_client_frame: Instant, can: bool) -> Option<Instant> {
        match self.ping_sent {
            Some(t) => Some(t + self.timeout),
            None if can => Some(last_client_frame + self.every),
            None => None,
        }
    }

    /// Whether an earlier PING went unanswered: any frame from the client since it was sent
    /// counts as an answer.
    pub(crate) fn check(&mut self, now: Instant, last_client_frame: Instant) -> KeepAliveAction {
        if let Some(t) = self.ping_sent {
            if last_client_frame >= t {
                self.ping_sent = None;
            } else if now.saturating_duration_since(t) >= self.timeout {
                return KeepAliveAction::Dead;
            }
        }
        KeepAliveAction::Nothing
    }

    /// Whether to PING the client now (`can`: crisp may write a frame of its own now); if so,
    /// the PING counts as sent.
    pub(crate) fn ping(
        &mut self,
        now: Instant,
        last_client_frame: Instant,
        can: bool,
    ) -> KeepAliveAction {
        if self.ping_sent.is_none()
            && now.saturating_duration_since(last_client_frame) >= self.every
            && can
        {
            self.ping_sent = Some(now);
            return KeepAliveAction::Ping;
        }
        KeepAliveAction::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_goes_on_only_after_the_runtime_wrote_since_the_last_ack() {
        let mut g = PingGate::default();
        assert!(!g.try_forward(), "nothing written yet: a strike");
        g.runtime_wrote();
        assert!(g.try_forward());
        assert!(!g.try_forward(), "one outstanding at a time");
        g.runtime_wrote();
        assert!(
            !g.try_forward(),
            "written before the ACK: counted with the outstanding one"
        );
        g.acked();
        assert!(!g.try_forward());
        g.runtime_wrote();
        assert!(g.try_forward());
    }

    #[test]
    fn keep_alive_pings_an_idle_client_and_ends_a_silent_one() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut ka = KeepAlive::new(s(10), s(5));
        assert_eq!(ka.tick(), Duration::from_millis(2500));
        assert_eq!(ka.ping(t0 + s(9), t0, true), KeepAliveAction::Nothing);
        assert_eq!(
            ka.ping(t0 + s(10), t0, false),
            KeepAliveAction::Nothing,
            "not inside a header block"
        );
        assert_eq!(ka.ping(t0 + s(10), t0, true), KeepAliveAction::Ping);
        assert_eq!(
            ka.ping(t0 + s(11), t0, true),
            KeepAliveAction::Nothing,
            "one at a time"
        );
        assert_eq!(ka.check(t0 + s(14), t0), KeepAliveAction::Nothing);
        assert_eq!(ka.check(t0 + s(15), t0), KeepAliveAction::Dead);
        // Any frame from the client answers it.
        assert_eq!(ka.check(t0 + s(15), t0 + s(12)), KeepAliveAction::Nothing);
        assert_eq!(
            ka.ping(t0 + s(21), t0 + s(12), true),
            KeepAliveAction::Nothing
        );
        assert_eq!(ka.ping(t0 + s(22), t0 + s(12), true), KeepAliveAction::Ping);
    }
}
