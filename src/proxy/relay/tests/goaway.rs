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
            EndStatus::refused(
                "crisp: upstream unix:///run/containerd.sock closed the connection (GOAWAY)"
            )
        )]
    );
    // Stream 1 still completes on the runtime connection.
    c.runtime_all(&[&response(1, &[("grpc-status", "0")], true)]);
    assert_eq!(
        completed(&c.events()),
        [(1, EndStatus::answered(Some(Code(0))))]
    );
    // New streams go to the observed path.
    c.client(&[&request(5, "/s/Relay", true)]).unwrap();
    assert_eq!(diverted(&c.events()), [5]);
    assert!(c.at_runtime().is_empty());
}

#[test]
fn crisps_goaway_comes_in_two_steps_and_refuses_only_streams_after_the_second() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    c.core.handle_goaway(b"crisp: shutting down");
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0), (Kind::Ping, 0)]);
    assert_eq!(
        GoAway::load(&to_client[0].payload).unwrap(),
        GoAway::new(StreamId::MAX, Reason::NO_ERROR, b"crisp: shutting down"),
        "the first refuses nothing"
    );
    assert_eq!(to_client[1].payload, GOAWAY_PING);
    assert!(!to_client[1].has(Flags::ACK));
    // A stream the client opened before it read the GOAWAY is served, not refused: this is
    // what a single GOAWAY naming stream 1 lost.
    c.client(&[&request(3, "/s/Relay", true)]).unwrap();
    assert!(c.at_client().is_empty());
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Headers, 3)]
    );
    assert!(!c.core.drained(), "the final GOAWAY is not out yet");
    // The PING's ACK: the client has read the GOAWAY. The final one names stream 3; the ACK
    // is crisp's, not the runtime's.
    c.client(&[&pong(&GOAWAY_PING)]).unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0)]);
    assert_eq!(
        GoAway::load(&to_client[0].payload).unwrap(),
        GoAway::new(S3, Reason::NO_ERROR, b"crisp: shutting down")
    );
    assert!(c.at_runtime().is_empty());
    c.client(&[&request(5, "/s/Relay", true)]).unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::RstStream, 5)]);
    assert_eq!(to_client[0].payload, Reason::REFUSED_STREAM.0.to_be_bytes());
    assert!(!c.core.drained(), "streams 1 and 3 are in flight");
    for id in [1, 3] {
        c.runtime_all(&[&response(
            id,
            &[(":status", "200"), ("grpc-status", "0")],
            true,
        )]);
    }
    c.at_client();
    assert!(c.core.drained());
    c.core.handle_goaway(b"again");
    assert!(c.at_client().is_empty(), "once");
}

#[test]
fn crisp_writes_no_frame_of_its_own_before_the_clients_server_preface() {
    // SIGTERM right after the accept: the runtime's SETTINGS have not reached the client yet.
    let mut c = Conn::before_runtime_settings();
    c.core.handle_goaway(b"crisp: shutting down");
    assert!(
        c.at_client().is_empty(),
        "a GOAWAY before SETTINGS: grpc-go closes the connection and fails its queued calls"
    );
    assert!(!c.core.drained());
    c.runtime_all(&[&settings(Settings::default())]);
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::Settings, 0), (Kind::GoAway, 0), (Kind::Ping, 0)],
        "the runtime's SETTINGS first, then crisp's frames"
    );
    // A runtime that fails before its SETTINGS: crisp is the server, its own SETTINGS first.
    let mut c = Conn::before_runtime_settings();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    c.core
        .handle_runtime_failed("crisp: upstream closed the connection")
        .unwrap();
    let to_client = c.at_client();
    assert_eq!(to_client[0].kind, Kind::Settings);
    assert!(!to_client[0].has(Flags::ACK));
    assert_eq!(
        kinds(&to_client[1..]),
        [(Kind::Headers, 1)],
        "stream 1 ends UNAVAILABLE after them"
    );
}

#[test]
fn a_client_that_never_acks_gets_the_final_goaway_after_the_wait() {
    let mut c = Conn::relayed();
    let t0 = c.now;
    let mut reachable = || panic!("not degraded: nothing to probe");
    c.core.handle_goaway(b"crisp: shutting down");
    c.at_client();
    assert_eq!(
        c.core.poll_timeout(),
        Some(t0 + GOAWAY_ACK_WAIT),
        "the pump wakes then"
    );
    c.timers(t0, &mut reachable).unwrap();
    c.core
        .handle_timeout(t0 + GOAWAY_ACK_WAIT - Duration::from_millis(1))
        .unwrap();
    assert!(c.at_client().is_empty());
    assert!(!c.core.drained());
    c.core.handle_timeout(t0 + GOAWAY_ACK_WAIT).unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0)]);
    assert_eq!(
        GoAway::load(&to_client[0].payload).unwrap().last_stream,
        StreamId::new(0)
    );
    assert!(c.core.drained(), "nothing was in flight");
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
        .handle_runtime_failed(
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
        c.core.handle_runtime_failed("gone"),
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
    assert_eq!(completed(&ev), [(1, EndStatus::cancelled())]);
    assert!(ev.iter().any(|e| matches!(e, Event::Reset { stream: S3 })));
    assert!(!c.core.flow.is_diverted(S3));
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
    assert_eq!(completed(&c.events()), [(1, EndStatus::cancelled())]);
    // The client's frames on it still go on (the runtime judges them).
    c.client(&[&data(1, 5, true)]).unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Data, 1)]
    );
}

#[test]
fn the_wait_for_the_goaway_ack_starts_when_the_goaway_is_written_not_queued() {
    // SIGTERM right after the accept, and a runtime whose SETTINGS take 2 s: the first GOAWAY
    // waits for them in crisp's queue. Counted from the queueing, the final GOAWAY would be due
    // at once and the client would get SETTINGS, both GOAWAYs and the PING back to back: the
    // one-step shutdown that loses the calls a grpc-go client queued.
    let mut c = Conn::before_runtime_settings();
    let t0 = c.now;
    c.core.handle_goaway(b"crisp: shutting down");
    assert!(c.at_client().is_empty());
    assert_eq!(c.core.poll_timeout(), None, "nothing written: no wait yet");
    c.now = t0 + Duration::from_secs(2);
    c.runtime_all(&[&settings(Settings::default())]);
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::Settings, 0), (Kind::GoAway, 0), (Kind::Ping, 0)]
    );
    assert_eq!(c.core.poll_timeout(), Some(c.now + GOAWAY_ACK_WAIT));
    c.core.handle_timeout(c.now).unwrap();
    assert!(
        c.at_client().is_empty(),
        "the final GOAWAY waits for the ACK of a PING just written"
    );
    c.core
        .handle_timeout(c.now + GOAWAY_ACK_WAIT - Duration::from_millis(1))
        .unwrap();
    assert!(c.at_client().is_empty());
    c.core.handle_timeout(c.now + GOAWAY_ACK_WAIT).unwrap();
    assert_eq!(kinds(&c.at_client()), [(Kind::GoAway, 0)]);
}

#[test]
fn a_diverted_stream_reset_twice_ends_once_and_its_resets_never_reach_the_runtime() {
    // Found by the core fuzz target: the second RST_STREAM reported a second end.
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Divert", false)]).unwrap();
    assert_eq!(diverted(&c.events()), [1]);
    c.client(&[&rst(1, Reason::CANCEL), &rst(1, Reason::CANCEL)])
        .unwrap();
    let resets = c
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::Reset { stream: S1 }))
        .count();
    assert_eq!(resets, 1);
    assert!(c.at_runtime().is_empty());
}

#[test]
fn late_frames_of_a_finished_diverted_stream_never_reach_the_runtime_once_forgotten() {
    // The core forgets finished diverted streams in batches (its record stays bounded on a
    // connection that lives for weeks); their late frames must still never be taken for a
    // relayed stream's: the runtime never saw the stream, and may close the connection for it.
    let mut c = Conn::relayed();
    let n_diverted = FORGET_AFTER as u32 + 6;
    for n in 0..n_diverted {
        let id = 1 + 2 * n;
        c.client(&[&request(id, "/s/Divert", true)]).unwrap();
        // Its task answered and ended.
        c.finished(StreamId::new(id));
    }
    assert_eq!(diverted(&c.events()).len(), n_diverted as usize);
    let relay = 1 + 2 * n_diverted;
    c.client(&[&request(relay, "/s/Relay", false)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Headers, relay)]);
    c.client(&[
        &data(1, 10, true),
        &response(3, &[("x-late", "trailers")], true),
        &wu(5, 100),
        &rst(7, Reason::CANCEL),
    ])
    .unwrap();
    assert_eq!(kinds(&c.at_runtime()), [], "nothing of a diverted stream");
    assert_eq!(c.at_client(), parse(&wu(0, 10)), "its DATA credited back");
    assert!(
        c.events().iter().all(|e| !matches!(e, Event::Reset { .. })),
        "no second end"
    );
    // A relayed stream's frames still go on.
    c.client(&[&data(relay, 5, true)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Data, relay)]);
}

#[test]
fn a_relayed_stream_in_flight_below_the_forgotten_cut_is_still_relayed() {
    // The cut that forgets finished diverted streams takes every stream below it for ended
    // unless it is relayed and in flight: a long upload opened before the cut keeps going.
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Headers, 1)]);
    let n_diverted = FORGET_AFTER as u32 + 6;
    for n in 1..=n_diverted {
        let id = 1 + 2 * n;
        c.client(&[&request(id, "/s/Divert", true)]).unwrap();
        c.finished(StreamId::new(id));
    }
    assert_eq!(diverted(&c.events()).len(), n_diverted as usize);
    c.client(&[&data(1, 10, false), &wu(1, 100), &data(1, 5, true)])
        .unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Data, 1), (Kind::WindowUpdate, 1), (Kind::Data, 1)]
    );
}
