//! PINGs: the gate that keeps strikes from the runtime, and crisp's keep-alive.

use super::*;

#[test]
fn client_pings_reach_the_runtime_only_when_they_cannot_be_strikes() {
    let mut c = Conn::relayed();
    c.client(&[&ping(b"bdp-0001")]).unwrap();
    assert!(
        c.at_runtime().is_empty(),
        "the runtime has written nothing: a strike"
    );
    assert_eq!(c.at_client(), parse(&pong(b"bdp-0001")), "crisp answers");
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    c.at_runtime();
    c.runtime_all(&[&response(1, &[(":status", "200")], false)]);
    c.at_client();
    c.client(&[&ping(b"bdp-0002")]).unwrap();
    assert_eq!(
        c.at_runtime(),
        parse(&ping(b"bdp-0002")),
        "the runtime wrote since: no strike"
    );
    c.runtime_all(&[&data(1, 10, false)]);
    c.client(&[&ping(b"bdp-0003")]).unwrap();
    assert!(c.at_runtime().is_empty(), "one outstanding at a time");
    c.at_client();
    c.runtime_all(&[&pong(b"bdp-0002")]);
    assert_eq!(
        c.at_client(),
        parse(&pong(b"bdp-0002")),
        "its ACK goes to the client"
    );
    c.client(&[&ping(b"bdp-0004")]).unwrap();
    assert!(c.at_runtime().is_empty(), "nothing written after that ACK");
}

#[test]
fn the_runtimes_pings_are_answered_by_the_client_and_crisps_own_acks_end_at_crisp() {
    let mut c = Conn::relayed();
    c.runtime_all(&[&ping(b"runtime1")]);
    assert_eq!(c.at_client(), parse(&ping(b"runtime1")));
    c.client(&[&pong(b"runtime1"), &pong(&KEEPALIVE)]).unwrap();
    assert_eq!(c.at_runtime(), parse(&pong(b"runtime1")));
}

#[test]
fn keep_alive_pings_an_idle_client_and_closes_one_that_does_not_answer() {
    let mut c = Conn::relayed();
    let t0 = c.now;
    let mut reachable = || panic!("not degraded: nothing to probe");
    c.timers(t0 + Duration::from_secs(9), &mut reachable)
        .unwrap();
    assert!(c.at_client().is_empty());
    c.timers(t0 + Duration::from_secs(10), &mut reachable)
        .unwrap();
    assert_eq!(c.at_client(), parse(&ping(&KEEPALIVE)));
    // Any frame answers it.
    c.now = t0 + Duration::from_secs(12);
    c.client(&[&wu(0, 1)]).unwrap();
    c.timers(t0 + Duration::from_secs(16), &mut reachable)
        .unwrap();
    c.timers(t0 + Duration::from_secs(22), &mut reachable)
        .unwrap();
    assert_eq!(c.at_client(), parse(&ping(&KEEPALIVE)));
    let err = c
        .timers(t0 + Duration::from_secs(27), &mut reachable)
        .unwrap_err();
    assert!(matches!(err, RelayError::KeepAlive));
}

#[test]
fn no_ping_of_crisps_own_inside_a_header_block_of_the_runtime() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    let mut head = response(1, &[(":status", "200")], false);
    head[4] = 0; // no END_HEADERS: a CONTINUATION follows
    c.runtime_all(&[&head]);
    assert!(c.core.in_runtime_block());
    c.timers(c.now + Duration::from_secs(10), &mut || false)
        .unwrap();
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::Headers, 1)],
        "crisp's frames wait for the block's end"
    );
    let mut cont = Vec::new();
    Head::new(Kind::Continuation, Flags::END_HEADERS, S1, 0).encode(&mut cont);
    c.runtime_all(&[&cont]);
    assert!(!c.core.in_runtime_block());
    assert_eq!(kinds(&c.at_client()), [(Kind::Continuation, 1)]);
}
