//! The core's one timer ([`Core::poll_timeout`] / [`Core::handle_timeout`]) in every state that
//! sets it, what lets crisp write its own frames (the pump's write interest in the client), when
//! the connection counts as drained (the pump's exit), and the move from degraded back to the
//! relay after the runtime's GOAWAY. The pump's socket interest itself: `pump::tests`.

use super::super::core::MOVE_IDLE;
use super::super::undecided::DECIDE_WITHIN;
use super::*;

/// The test config's keep-alive: PING after 10 s idle, close 5 s after an unanswered PING.
const EVERY: Duration = Duration::from_secs(10);
const TIMEOUT: Duration = Duration::from_secs(5);

/// After `handle_timeout` at `now`, no timer may still be due (the pump would spin).
fn settled(c: &Conn, now: Instant) {
    assert!(
        c.core.poll_timeout().is_none_or(|at| at > now),
        "a timer still due at {:?}",
        c.core
            .poll_timeout()
            .map(|at| at.saturating_duration_since(now))
    );
}

#[test]
fn the_keep_alive_sets_the_timer_only_while_crisp_may_write_its_ping() {
    let mut c = Conn::before_runtime_settings();
    let t0 = c.now;
    assert!(
        !c.core.may_write_own(),
        "before the client's server preface"
    );
    assert_eq!(c.core.poll_timeout(), None, "no PING can go: no timer");
    c.runtime_all(&[&settings(Settings::default())]);
    c.at_client();
    assert!(c.core.may_write_own());
    assert_eq!(c.core.poll_timeout(), Some(t0 + EVERY));
    // Inside a response header block: no PING, no timer.
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    let mut head = response(1, &[(":status", "200")], false);
    head[4] = 0;
    c.runtime_all(&[&head]);
    assert!(!c.core.may_write_own());
    assert_eq!(c.core.poll_timeout(), None);
    let mut cont = Vec::new();
    Head::new(Kind::Continuation, Flags::END_HEADERS, S1, 0).encode(&mut cont);
    c.runtime_all(&[&cont]);
    c.at_client();
    // The client's last frame (the request, at t0) sets when it is idle.
    assert_eq!(c.core.poll_timeout(), Some(t0 + EVERY));
    c.timers(t0 + EVERY, &mut || panic!("not degraded"))
        .unwrap();
    assert_eq!(c.at_client(), parse(&ping(&KEEPALIVE)));
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + EVERY + TIMEOUT),
        "then the deadline of its answer"
    );
    settled(&c, t0 + EVERY);
    // Answered (any frame): the next PING after the next idle period.
    c.now = t0 + EVERY + Duration::from_secs(1);
    c.client(&[&wu(0, 1)]).unwrap();
    c.at_runtime();
    c.timers(t0 + EVERY + TIMEOUT, &mut || panic!("not degraded"))
        .unwrap();
    assert!(c.at_client().is_empty());
    assert_eq!(c.core.poll_timeout(), Some(c.now + EVERY));
}

#[test]
fn the_goaway_wait_and_the_undecided_stream_set_the_earliest_timer() {
    let mut c = Conn::relayed();
    let t0 = c.now;
    c.client(&[&request(1, STATUS, false)]).unwrap();
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + DECIDE_WITHIN),
        "the undecided stream's wait first"
    );
    c.core.handle_goaway(b"crisp: shutting down");
    c.at_client();
    assert_eq!(c.core.poll_timeout(), Some(t0 + DECIDE_WITHIN));
    c.timers(t0 + DECIDE_WITHIN, &mut || panic!("not degraded"))
        .unwrap();
    assert_eq!(diverted(&c.events()), [1], "too slow: diverted");
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + GOAWAY_ACK_WAIT),
        "then the GOAWAY's wait"
    );
    c.timers(t0 + GOAWAY_ACK_WAIT, &mut || panic!("not degraded"))
        .unwrap();
    assert_eq!(kinds(&c.at_client()), [(Kind::GoAway, 0)]);
    settled(&c, t0 + GOAWAY_ACK_WAIT);
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + EVERY),
        "the keep-alive is left"
    );
}

#[test]
fn a_degraded_connection_asks_whether_the_runtime_is_back_once_idle_then_once_a_period() {
    let mut c = Conn::degraded();
    let t0 = c.now;
    c.at_client();
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + MOVE_IDLE),
        "idle since the connection opened"
    );
    let mut asked = 0;
    c.timers(t0 + MOVE_IDLE, &mut || {
        asked += 1;
        false
    })
    .unwrap();
    assert_eq!(asked, 1);
    settled(&c, t0 + MOVE_IDLE);
    // The keep-alive's period (half the shorter of 10 s and 5 s) paces the next question.
    let period = TIMEOUT / 2;
    assert_eq!(c.core.poll_timeout(), Some(t0 + MOVE_IDLE + period));
    // A stream in flight: no question until it ends.
    c.now = t0 + Duration::from_secs(1);
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    assert_eq!(diverted(&c.events()), [1]);
    assert_eq!(
        c.core.poll_timeout(),
        Some(c.now + EVERY),
        "the keep-alive alone"
    );
    c.finished(S1);
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + MOVE_IDLE + period),
        "the period, which ends after MOVE_IDLE since the stream"
    );
    c.now = t0 + MOVE_IDLE + period;
    c.timers(c.now, &mut || {
        asked += 1;
        true
    })
    .unwrap();
    assert_eq!(asked, 2);
    assert_eq!(kinds(&c.at_client()), [(Kind::GoAway, 0), (Kind::Ping, 0)]);
    // Going away: no more questions.
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + MOVE_IDLE + period + GOAWAY_ACK_WAIT)
    );
}

#[test]
fn after_the_runtimes_goaway_the_client_moves_back_to_the_relay_once_its_calls_end() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    c.at_runtime();
    c.runtime_all(&[&goaway(1, Reason::NO_ERROR)]);
    assert!(c.core.report(c.now).degraded, "the runtime is closing");
    assert!(c.at_client().is_empty(), "stream 1 goes on");
    // Stream 1 still runs on the closing runtime connection: no question yet.
    assert_eq!(c.core.poll_timeout(), Some(c.now + EVERY));
    c.client(&[&data(1, 3, true)]).unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Data, 1)],
        "relayed to the closing runtime"
    );
    c.runtime_all(&[&response(
        1,
        &[(":status", "200"), ("grpc-status", "0")],
        true,
    )]);
    c.at_client();
    assert_eq!(completed(&c.events()).len(), 1);
    let due = c.core.poll_timeout().expect("a question is due");
    assert_eq!(due, c.now + MOVE_IDLE);
    let mut asked = 0;
    c.timers(due, &mut || {
        asked += 1;
        true
    })
    .unwrap();
    assert_eq!(asked, 1);
    assert_eq!(kinds(&c.at_client()), [(Kind::GoAway, 0), (Kind::Ping, 0)]);
    c.client(&[&pong(&GOAWAY_PING)]).unwrap();
    assert_eq!(kinds(&c.at_client()), [(Kind::GoAway, 0)]);
    assert!(c.core.drained(), "the pump closes the connection");
}

#[test]
fn drained_waits_for_every_stream_and_every_frame_of_crisps() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, "/s/Relay", true),
        &request(3, "/s/Divert", true),
        &request(5, STATUS, false),
    ])
    .unwrap();
    c.events();
    c.core.handle_goaway(b"crisp: shutting down");
    c.client(&[&pong(&GOAWAY_PING)]).unwrap();
    assert!(!c.core.drained(), "frames unwritten, streams in flight");
    c.at_client();
    assert!(
        !c.core.drained(),
        "a relayed, a diverted and an undecided stream"
    );
    c.runtime_all(&[&response(
        1,
        &[(":status", "200"), ("grpc-status", "0")],
        true,
    )]);
    c.at_client();
    assert!(!c.core.drained(), "a diverted and an undecided stream");
    c.finished(S3);
    assert!(!c.core.drained(), "the undecided stream");
    c.client(&[&rst(5, Reason::CANCEL)]).unwrap();
    assert!(c.core.drained());
}
