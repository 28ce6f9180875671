//! A viewed call ([`Interest::view`]): relayed, never diverted, and its end carries what passed
//! — the request copied across its DATA frames, a view of the answer, its grpc-message.
//!
//! [`Interest::view`]: crate::intercept::Interest::view

use super::*;
use crate::cri::wire;

/// The `Ended` events' views, by call.
fn viewed(events: &mut [Event]) -> Vec<super::super::viewing::Viewed> {
    events
        .iter_mut()
        .filter_map(|e| match e {
            Event::Ended { viewed, report, .. } => {
                assert!(*report, "a viewed call's end is reported");
                viewed.take()
            }
            _ => None,
        })
        .collect()
}

/// The runtime answers stream `s` with `msg` and a NOT_FOUND status carrying a message.
fn answer(c: &mut Conn, s: u32, msg: &[u8]) {
    c.runtime_all(&[
        &response(
            s,
            &[(":status", "200"), ("content-type", "application/grpc")],
            false,
        ),
        &grpc(s, msg, false),
        &response(
            s,
            &[("grpc-status", "5"), ("grpc-message", "no%20such%20thing")],
            true,
        ),
    ]);
}

/// Issue #46 (the tap's request view on the byte path): a call the tap views is no longer
/// diverted — the runtime gets its frames as the client sent them — and its end carries the
/// whole request (sent in two DATA frames), the answer's view and its grpc-message.
#[test]
fn a_viewed_call_stays_relayed_and_its_end_carries_what_passed() {
    let mut c = Conn::relayed();
    let body = wire::frame(b"\x0a\x02v1");
    let (a, b) = body.split_at(3);
    let mut first = Vec::new();
    http2::data(&mut first, S1, a, false);
    let mut second = Vec::new();
    http2::data(&mut second, S1, b, true);
    c.client(&[&request(1, VERSION, false), &first, &second])
        .unwrap();
    assert!(diverted(&c.events()).is_empty(), "a viewed call is relayed");
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Data, 1), (Kind::Data, 1)]
    );
    answer(&mut c, 1, b"\x0a\x05crisp");
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::Headers, 1), (Kind::Data, 1), (Kind::Headers, 1)]
    );
    let mut events = c.events();
    assert_eq!(
        completed(&events),
        [(1, EndStatus::answered(Some(Code(5))))]
    );
    let seen = viewed(&mut events);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].request.as_deref(), Some(&body[..]));
    let resp = seen[0].response.as_ref().expect("the answer's view");
    assert_eq!(&resp.kept[..], b"\x0a\x05crisp");
    assert_eq!(seen[0].message.as_deref(), Some("no such thing"));
    assert_eq!(c.core.viewing, 0, "nothing viewed is left in flight");
}

/// A call both viewed and conditionally wanted (job mode's status calls with a tap attached):
/// not wanted, it is relayed with the request the undecided stream read, and viewed.
#[test]
fn an_undecided_call_relayed_is_viewed_with_the_request_it_read() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, VIEWED_STATUS, false), &grpc(1, b"other", true)])
        .unwrap();
    assert!(diverted(&c.events()).is_empty(), "not the marked request");
    answer(&mut c, 1, b"\x0a\x01x");
    let mut events = c.events();
    let seen = viewed(&mut events);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].request.as_deref(), Some(&wire::frame(b"other")[..]));
    assert!(seen[0].response.is_some());
}

/// A call not viewed carries no view, and a viewed call the client resets ends with what passed
/// so far; the count of viewed calls in flight (which spares every other DATA frame a lookup)
/// comes back to zero.
#[test]
fn views_are_counted_in_and_out() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, VERSION, false),
        &grpc(1, b"ab", false),
        &request(3, "/s/Relayed", true),
    ])
    .unwrap();
    assert_eq!(c.core.viewing, 1);
    c.client(&[&rst(1, Reason::CANCEL)]).unwrap();
    assert_eq!(c.core.viewing, 0);
    answer(&mut c, 3, b"");
    let mut events = c.events();
    let seen = viewed(&mut events);
    assert_eq!(seen.len(), 1, "only the viewed call has a view");
    assert_eq!(seen[0].request.as_deref(), Some(&wire::frame(b"ab")[..]));
    assert!(seen[0].response.as_ref().is_none_or(|s| s.len == 0));
}
