//! The move from degraded back to the relay (issue #36): the runtime connection goes, calls on
//! it end UNAVAILABLE, new streams go to the observed path; once the runtime accepts connections
//! again and the client is idle, crisp's GOAWAY moves it to a new connection, relayed again.

use super::super::core::MOVE_IDLE;
use super::*;

/// The pump's question to the runtime's socket, answered by the test; counts the asks.
struct Reachable {
    up: bool,
    asked: u32,
}

impl Reachable {
    fn tick(&mut self, c: &mut Conn) {
        let (up, asked) = (self.up, &mut self.asked);
        c.timers(c.now, &mut || {
            *asked += 1;
            up
        })
        .unwrap();
    }
}

#[test]
fn a_degraded_connection_moves_back_to_the_relay_once_the_runtime_is_back_and_it_is_idle() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Headers, 1)]);

    // The runtime goes: the call on it ends UNAVAILABLE.
    c.core
        .handle_runtime_failed("crisp: upstream gone")
        .unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::Headers, 1)]);
    assert!(to_client[0].has(Flags::END_STREAM));
    let mut dec = httlib_hpack::Decoder::default();
    assert_eq!(
        field(&runtime_fields(&mut dec, &to_client[0]), "grpc-status"),
        Some("14")
    );
    assert_eq!(completed(&c.events())[0].1.code, Some(Code::UNAVAILABLE));
    assert!(c.core.report(c.now).degraded);

    // New streams go to the observed path, and PINGs are crisp's to answer.
    c.client(&[&request(3, "/s/Relay", true), &ping(b"client01")])
        .unwrap();
    assert_eq!(diverted(&c.events()), [3]);
    assert!(c.at_runtime().is_empty());
    assert_eq!(c.at_client(), parse(&pong(b"client01")));

    // Runtime back, but a diverted stream is in flight: the client stays.
    let mut rt = Reachable { up: true, asked: 0 };
    c.now += MOVE_IDLE;
    rt.tick(&mut c);
    assert!(c.at_client().is_empty(), "not while a call is served");
    assert_eq!(rt.asked, 0, "the runtime is not even asked");
    c.finished(S3);

    // Idle, but the runtime still refuses connections: the client stays.
    rt.up = false;
    rt.tick(&mut c);
    assert_eq!(rt.asked, 1);
    assert!(c.at_client().is_empty());

    // A new call: not idle for MOVE_IDLE after it.
    rt.up = true;
    c.client(&[&request(5, "/s/Relay", true)]).unwrap();
    assert_eq!(diverted(&c.events()), [5]);
    c.finished(S5);
    c.now += MOVE_IDLE - Duration::from_millis(1);
    rt.tick(&mut c);
    assert_eq!(rt.asked, 1);
    assert!(c.at_client().is_empty(), "a call {:?} ago", MOVE_IDLE);

    // Idle and the runtime is back: GOAWAY in two steps.
    c.now += Duration::from_millis(1);
    rt.tick(&mut c);
    assert_eq!(rt.asked, 2);
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0), (Kind::Ping, 0)]);
    assert_eq!(
        GoAway::load(&to_client[0].payload).unwrap(),
        GoAway::new(StreamId::MAX, Reason::NO_ERROR, b"crisp: reconnect")
    );
    rt.tick(&mut c);
    assert!(c.at_client().is_empty(), "one GOAWAY");
    c.client(&[&pong(&GOAWAY_PING)]).unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0)]);
    assert_eq!(GoAway::load(&to_client[0].payload).unwrap().last_stream, S5);
    // A stream that crossed it is refused (the client retries it on its new connection).
    c.client(&[&request(7, "/s/Relay", true)]).unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::RstStream, 7)]);
    assert_eq!(to_client[0].payload, Reason::REFUSED_STREAM.0.to_be_bytes());
    assert!(c.core.drained(), "the connection can close");

    // The client's new connection has a runtime connection of its own: relayed again.
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Headers, 1)]);
    assert!(diverted(&c.events()).is_empty());
    assert!(!c.core.report(c.now).degraded);
}
