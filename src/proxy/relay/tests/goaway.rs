//! GOAWAY both ways, a failed runtime connection, RST_STREAM from either side.

use super::*;

#[test]
fn a_runtime_goaway_refuses_the_calls_it_never_saw_and_diverts_new_ones() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, "/s/Relay", false),
        &request(3, "/s/Relay", false),
    ])
    .unwrap();
    c.at_runtime();
    c.runtime_all(&[
        &response(1, &[(":status", "200")], false),
        &goaway(1, Reason::NO_ERROR),
    ]);
    let to_client = c.at_client();
    assert_eq!(
        kinds(&to_client),
        [(Kind::Headers, 1), (Kind::RstStream, 3)],
        "the GOAWAY itself is crisp's to give"
    );
    assert_eq!(to_client[1].payload, Reason::REFUSED_STREAM.0.to_be_bytes());
    let ev = c.events();
    assert_eq!(
        completed(&ev),
        [(
            2,
            Ending::refused(
                "crisp: upstream unix:///run/containerd.sock closed the connection (GOAWAY)"
            )
        )]
    );
    // Stream 1 still completes on the runtime connection.
    c.runtime_all(&[&response(1, &[("grpc-status", "0")], true)]);
    assert_eq!(
        completed(&c.events()),
        [(1, Ending::answered(Some(Code(0))))]
    );
    // New streams go to the observed path.
    c.client(&[&request(5, "/s/Relay", true)]).unwrap();
    assert_eq!(diverted(&c.events()), [5]);
    assert!(c.at_runtime().is_empty());
}

#[test]
fn crisps_goaway_refuses_later_streams_and_drains() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    c.core.goaway(b"crisp: shutting down");
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0)]);
    assert_eq!(
        GoAway::load(&to_client[0].payload).unwrap(),
        GoAway::new(1, Reason::NO_ERROR, b"crisp: shutting down")
    );
    c.client(&[&request(3, "/s/Relay", true)]).unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::RstStream, 3)]);
    assert_eq!(to_client[0].payload, Reason::REFUSED_STREAM.0.to_be_bytes());
    assert!(!c.core.drained(), "stream 1 is in flight");
    c.runtime_all(&[&response(
        1,
        &[(":status", "200"), ("grpc-status", "0")],
        true,
    )]);
    c.at_client();
    assert!(c.core.drained());
    c.core.goaway(b"again");
    assert!(c.at_client().is_empty(), "once");
}

#[test]
fn a_failed_runtime_connection_ends_its_calls_with_unavailable() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, "/s/Relay", false),
        &request(3, "/s/Relay", false),
    ])
    .unwrap();
    c.runtime_all(&[&response(3, &[(":status", "200")], false)]);
    c.at_client();
    c.core
        .runtime_failed(
            "crisp: upstream unix:///run/containerd.sock failed mid-response: connection closed",
        )
        .unwrap();
    let mut dec = httlib_hpack::Decoder::default();
    let mut to_client = c.at_client();
    to_client.sort_by_key(|f| f.stream);
    assert_eq!(kinds(&to_client), [(Kind::Headers, 1), (Kind::Headers, 3)]);
    assert!(to_client.iter().all(|f| f.has(Flags::END_STREAM)));
    let unanswered = runtime_fields(&mut dec, &to_client[0]);
    assert_eq!(field(&unanswered, ":status"), Some("200"), "trailers-only");
    assert_eq!(field(&unanswered, "grpc-status"), Some("14"));
    let answered = runtime_fields(&mut dec, &to_client[1]);
    assert_eq!(
        field(&answered, ":status"),
        None,
        "trailers after its headers"
    );
    assert_eq!(field(&answered, "grpc-status"), Some("14"));
    let mut ends = completed(&c.events());
    ends.sort_by_key(|e| e.0);
    assert!(ends.iter().all(|(_, e)| e.code == Some(Code::UNAVAILABLE)));
    // And a failure inside a response header block leaves the client connection unusable.
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    let mut head = response(1, &[(":status", "200")], false);
    head[4] = 0;
    c.runtime_all(&[&head]);
    assert!(matches!(
        c.core.runtime_failed("gone"),
        Err(RelayError::Protocol(Violation::RuntimeGoneInBlock))
    ));
}

#[test]
fn resets_from_the_client_go_on_for_relayed_streams_and_end_diverted_ones() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, "/s/Relay", false),
        &request(3, "/s/Divert", false),
    ])
    .unwrap();
    c.events();
    c.at_runtime();
    c.client(&[&rst(1, Reason::CANCEL), &rst(3, Reason::CANCEL)])
        .unwrap();
    assert_eq!(
        c.at_runtime(),
        parse(&rst(1, Reason::CANCEL)),
        "the diverted stream's reset is crisp's"
    );
    let ev = c.events();
    assert_eq!(completed(&ev), [(1, Ending::cancelled())]);
    assert!(ev.iter().any(|e| matches!(e, Event::Reset { stream: 3 })));
    assert!(!c.windows.lock().is_diverted(3));
    // Late frames of the reset diverted stream are dropped, credited back.
    c.client(&[&data(3, 10, false)]).unwrap();
    assert!(c.at_runtime().is_empty());
    assert_eq!(c.at_client(), parse(&wu(0, 10)));
}

#[test]
fn a_reset_from_the_runtime_reaches_the_client_and_ends_the_call() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    c.runtime_all(&[&rst(1, Reason::INTERNAL_ERROR)]);
    assert_eq!(c.at_client(), parse(&rst(1, Reason::INTERNAL_ERROR)));
    assert_eq!(completed(&c.events()), [(1, Ending::cancelled())]);
    // The client's frames on it still go on (the runtime judges them).
    c.client(&[&data(1, 5, true)]).unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Data, 1)]
    );
}
