//! Undecided streams (`undecided.rs`, DESIGN.md §5.2): a call whose interest is conditional on its
//! request is relayed untouched unless the request is the one wanted; diverted when wanted, too
//! large, too slow, or when something else cannot wait; dropped when reset.

use super::super::undecided::{DECIDE_WITHIN, MAX_UNDECIDED};
use super::*;

/// The request fields as the runtime decodes them.
fn sent_fields(path: &str) -> Vec<(String, String)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
    ]
    .iter()
    .map(|(n, v)| (n.to_string(), v.to_string()))
    .collect()
}

fn window_update(f: &F) -> (u32, u32) {
    (
        f.stream,
        u32::from_be_bytes(f.payload[..4].try_into().unwrap()),
    )
}

#[test]
fn a_status_call_of_another_container_is_relayed_byte_for_byte() {
    let mut c = Conn::relayed();
    let body = grpc(1, b"another", true);
    c.client(&[&request(1, STATUS, false), &body]).unwrap();
    assert!(diverted(&c.events()).is_empty(), "not diverted");
    let up = c.at_runtime();
    assert_eq!(kinds(&up), [(Kind::Headers, 1), (Kind::Data, 1)]);
    let mut dec = httlib_hpack::Decoder::default();
    assert_eq!(runtime_fields(&mut dec, &up[0]), sent_fields(STATUS));
    assert!(!up[0].has(Flags::END_STREAM));
    let mut relayed_data = Vec::new();
    Head::new(Kind::Data, up[1].flags, S1, up[1].payload.len()).encode(&mut relayed_data);
    relayed_data.extend_from_slice(&up[1].payload);
    assert_eq!(relayed_data, body, "the DATA frame as the client sent it");
    // Flow control: the runtime got the bytes and gives the credit; crisp gives none.
    assert!(c.at_client().is_empty(), "no WINDOW_UPDATE of crisp's");
    assert_eq!(c.core.flow.windows(S1), (65_535, 0, None));
    // The call is the runtime's from here: answered and completed as any relayed one.
    c.runtime_all(&[&response(
        1,
        &[(":status", "200"), ("grpc-status", "0")],
        true,
    )]);
    assert_eq!(kinds(&c.at_client()), [(Kind::Headers, 1)]);
    assert_eq!(
        completed(&c.events()),
        [(1, EndStatus::answered(Some(Code(0))))]
    );
}

#[test]
fn only_the_marked_containers_status_call_is_diverted_with_its_request() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, STATUS, false), &grpc(1, b"another", true)])
        .unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Data, 1)]
    );
    assert!(c.events().is_empty());
    let body = grpc(3, MARKED, true);
    c.client(&[&request(3, STATUS, false), &body]).unwrap();
    assert!(c.at_runtime().is_empty(), "the runtime never sees it");
    let ev = c.events();
    assert!(
        matches!(
            &ev[..],
            [
                Event::Divert { stream: S3, end_stream: false, fields, .. },
                Event::Body { stream: S3, data },
                Event::BodyEnd { stream: S3 },
            ] if fields.len() == 5 && data[..] == body[http2::HEADER_LEN..]
        ),
        "{ev:?}"
    );
    // The request's connection credit comes back at once; crisp answers on the client's
    // initial stream window.
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::WindowUpdate, 0)]);
    assert_eq!(
        window_update(&to_client[0]),
        (0, (body.len() - http2::HEADER_LEN) as u32)
    );
    assert_eq!(c.core.flow.windows(S3), (65_535, 0, Some(65_535)));
    // No message to read: the observed path judges it, as before.
    c.client(&[&request(5, STATUS, true)]).unwrap();
    let ev = c.events();
    assert!(
        matches!(
            &ev[..],
            [Event::Divert {
                stream: S5,
                end_stream: true,
                ..
            }]
        ),
        "{ev:?}"
    );
    assert_eq!(c.core.undecided_due(), None);
}

#[test]
fn a_request_that_ends_in_a_later_read_within_the_bound_is_still_relayed() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, STATUS, false)]).unwrap();
    assert!(c.at_runtime().is_empty(), "undecided");
    assert_eq!(c.core.undecided_due(), Some(c.now + DECIDE_WITHIN));
    c.now += DECIDE_WITHIN / 2;
    c.core.handle_timeout(c.now).unwrap();
    c.client(&[&grpc(1, b"another", true)]).unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Data, 1)]
    );
    assert!(diverted(&c.events()).is_empty());
    assert_eq!(c.core.undecided_due(), None);
}

#[test]
fn a_request_not_ended_in_time_is_diverted_with_what_it_sent() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, STATUS, false), &data(1, 10, false)])
        .unwrap();
    c.now += DECIDE_WITHIN - Duration::from_micros(1);
    c.core.handle_timeout(c.now).unwrap();
    assert!(diverted(&c.events()).is_empty(), "not yet");
    c.now += Duration::from_micros(1);
    c.core.handle_timeout(c.now).unwrap();
    let ev = c.events();
    assert!(
        matches!(
            &ev[..],
            [Event::Divert { stream: S1, end_stream: false, .. }, Event::Body { stream: S1, data }]
                if data.len() == 10
        ),
        "{ev:?}"
    );
    let to_client = c.at_client();
    assert_eq!(window_update(&to_client[0]), (0, 10));
    // The rest of the body follows the stream to the observed path.
    c.client(&[&data(1, 5, true)]).unwrap();
    let ev = c.events();
    assert!(matches!(
        &ev[..],
        [Event::Body { stream: S1, data }, Event::BodyEnd { stream: S1 }] if data.len() == 5
    ));
    assert_eq!(window_update(&c.at_client()[0]), (0, 5));
    assert!(c.at_runtime().is_empty());
}

#[test]
fn a_request_larger_than_the_bound_is_diverted_and_not_copied_twice() {
    let mut c = Conn::relayed();
    // Up to the bound, undecided, then relayed.
    let within = MAX_UNDECIDED - http2::HEADER_LEN - 5;
    c.client(&[
        &request(1, STATUS, false),
        &grpc(1, &vec![1u8; within], true),
    ])
    .unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Data, 1)]
    );
    assert!(c.events().is_empty());
    let half = MAX_UNDECIDED / 2;
    c.client(&[
        &request(3, STATUS, false),
        &data(3, half, false),
        &data(3, half, true),
    ])
    .unwrap();
    assert!(c.at_runtime().is_empty());
    let ev = c.events();
    assert!(
        matches!(
            &ev[..],
            [
                Event::Divert { stream: S3, .. },
                Event::Body { stream: S3, data: a },
                Event::Body { stream: S3, data: b },
                Event::BodyEnd { stream: S3 },
            ] if a.len() == half && b.len() == half
        ),
        "{ev:?}"
    );
    // Both frames' connection credit back to the client: the undecided one's, then the other's.
    let credit: u32 = c
        .at_client()
        .iter()
        .map(|f| {
            assert_eq!(f.kind, Kind::WindowUpdate);
            window_update(f).1
        })
        .sum();
    assert_eq!(credit, 2 * half as u32);
    assert_eq!(c.core.flow.windows(S3).2, Some(65_535));
}

#[test]
fn an_undecided_stream_reset_before_its_request_ended_never_reaches_anyone() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, STATUS, false), &data(1, 7, false)])
        .unwrap();
    c.client(&[&rst(1, Reason::CANCEL)]).unwrap();
    assert!(
        c.at_runtime().is_empty(),
        "no RST_STREAM for a stream the runtime never saw"
    );
    let ev = c.events();
    assert!(diverted(&ev).is_empty());
    assert_eq!(completed(&ev), [(1, EndStatus::cancelled())]);
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::WindowUpdate, 0)]);
    assert_eq!(
        window_update(&to_client[0]),
        (0, 7),
        "the client's window is whole again"
    );
    assert_eq!(c.core.undecided_due(), None);
    assert!(c.core.report(c.now).streams.is_empty());
    // Late frames of the stream are credited and dropped.
    c.client(&[&data(1, 3, true)]).unwrap();
    assert!(c.at_runtime().is_empty());
    assert_eq!(window_update(&c.at_client()[0]), (0, 3));
}

#[test]
fn a_new_stream_diverts_the_undecided_one_so_streams_reach_the_runtime_in_order() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, STATUS, false),
        &request(3, STATUS, false),
        &grpc(3, b"another", true),
        &grpc(1, b"another", true),
    ])
    .unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 3), (Kind::Data, 3)]
    );
    let ev = c.events();
    assert_eq!(diverted(&ev), [1]);
    assert!(
        matches!(ev.last(), Some(Event::BodyEnd { stream: S1 })),
        "{ev:?}"
    );
}

#[test]
fn undecided_streams_relayed_between_others_keep_the_runtimes_table_in_step() {
    let mut c = Conn::relayed();
    let mut dec = httlib_hpack::Decoder::default();
    c.client(&[
        &request(1, STATUS, false),
        &grpc(1, b"another", true),
        &request(3, "/s/Relay", true),
        &request(5, STATUS, false),
        &grpc(5, MARKED, true),
        &request(7, STATUS, false),
        &grpc(7, b"third", true),
    ])
    .unwrap();
    let up = c.at_runtime();
    assert_eq!(
        kinds(&up),
        [
            (Kind::Headers, 1),
            (Kind::Data, 1),
            (Kind::Headers, 3),
            (Kind::Headers, 7),
            (Kind::Data, 7)
        ]
    );
    assert_eq!(diverted(&c.events()), [5]);
    for (f, path) in [(&up[0], STATUS), (&up[2], "/s/Relay"), (&up[3], STATUS)] {
        assert_eq!(runtime_fields(&mut dec, f), sent_fields(path));
    }
}

#[test]
fn a_window_update_or_trailers_on_an_undecided_stream_divert_it_first() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, STATUS, false)]).unwrap();
    assert!(c.events().is_empty(), "undecided");
    c.client(&[&wu(1, 1_000)]).unwrap();
    assert_eq!(diverted(&c.events()), [1]);
    assert_eq!(
        c.core.flow.windows(S1).2,
        Some(66_535),
        "the credit is crisp's"
    );
    assert!(c.at_runtime().is_empty());

    let mut c = Conn::relayed();
    c.client(&[&request(1, STATUS, false), &grpc(1, b"another", false)])
        .unwrap();
    assert!(c.events().is_empty(), "undecided");
    c.client(&[&response(1, &[("x-trailer", "1")], true)])
        .unwrap();
    let ev = c.events();
    assert!(
        matches!(
            &ev[..],
            [
                Event::Divert { stream: S1, .. },
                Event::Body { .. },
                Event::Trailers { stream: S1, .. }
            ]
        ),
        "{ev:?}"
    );
    assert!(c.at_runtime().is_empty());
}

#[test]
fn an_undecided_stream_goes_to_the_observed_path_when_the_runtime_goes() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, STATUS, false), &data(1, 4, false)])
        .unwrap();
    assert!(c.events().is_empty(), "undecided");
    c.core.handle_runtime_failed("crisp: gone").unwrap();
    assert_eq!(diverted(&c.events()), [1]);
    assert_eq!(window_update(&c.at_client()[0]), (0, 4));
    assert_eq!(c.core.undecided_due(), None);
    // Degraded, no stream is undecided: every new stream goes to the observed path at once.
    c.client(&[&request(3, STATUS, false)]).unwrap();
    assert_eq!(diverted(&c.events()), [3]);
    assert_eq!(c.core.undecided_due(), None);
}
