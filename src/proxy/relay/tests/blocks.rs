//! Header blocks: diverted streams between relayed ones, CONTINUATION, the HPACK table size.

use super::*;

#[test]
fn a_diverted_stream_between_relayed_ones_leaves_the_runtimes_table_in_step() {
    use httlib_hpack::Encoder;
    let mut c = Conn::relayed();
    // The client indexes everything: stream 5's block refers to entries stream 3's added.
    let mut enc = Encoder::default();
    let mut block = |path: &str| {
        let mut b = Vec::new();
        for (n, v) in [
            (":method", "POST"),
            (":path", path),
            (":authority", "node"),
            ("x-token", "t0k"),
        ] {
            enc.encode(
                (n.as_bytes().to_vec(), v.as_bytes().to_vec(), 0x4 | 0x10),
                &mut b,
            )
            .unwrap();
        }
        let mut out = Vec::new();
        http2::headers(&mut out, StreamId::new(0), &b, true);
        out
    };
    let (mut b1, mut b3, mut b5) = (block("/s/Relay"), block("/s/Divert"), block("/s/Relay"));
    for (b, id) in [(&mut b1, 1u8), (&mut b3, 3), (&mut b5, 5)] {
        b[8] = id;
    }
    c.client(&[&b1, &b3, &data(3, 4, true), &b5]).unwrap();
    let up = c.at_runtime();
    assert_eq!(kinds(&up), [(Kind::Headers, 1), (Kind::Headers, 5)]);
    let mut dec = httlib_hpack::Decoder::default();
    let f1 = runtime_fields(&mut dec, &up[0]);
    let f5 = runtime_fields(&mut dec, &up[1]);
    assert_eq!(
        f1, f5,
        "the same request, whatever the client's table held for stream 3"
    );
    assert_eq!(field(&f5, "x-token"), Some("t0k"));
    assert_eq!(diverted(&c.events()), [3]);
}

#[test]
fn a_diverted_call_hands_on_its_fields_decoded_once_in_the_clients_order() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Divert", true)]).unwrap();
    let ev = c.events();
    let Some(Event::Divert {
        stream: S1,
        call,
        fields,
        end_stream: true,
    }) = ev.first()
    else {
        panic!("{ev:?}")
    };
    assert_eq!(call.path.as_str(), "/s/Divert");
    let names: Vec<&[u8]> = fields.iter().map(|(n, _)| n.as_ref()).collect();
    assert_eq!(
        names,
        [
            &b":method"[..],
            b":scheme",
            b":path",
            b":authority",
            b"content-type"
        ]
    );
}

#[test]
fn a_request_block_split_across_continuations_is_relayed_whole() {
    let mut c = Conn::relayed();
    let mut block = Vec::new();
    for (n, v) in [
        (":method", "POST"),
        (":path", "/s/Relay"),
        ("x-big", &"v".repeat(40_000)[..]),
    ] {
        http2::encode_field(&mut block, n.as_bytes(), v.as_bytes());
    }
    let mut frames = Vec::new();
    http2::headers(&mut frames, S1, &block, true);
    assert_eq!(
        kinds(&parse(&frames)),
        [
            (Kind::Headers, 1),
            (Kind::Continuation, 1),
            (Kind::Continuation, 1)
        ]
    );
    // Frame by frame, as separate reads.
    for f in parse(&frames) {
        let mut b = Vec::new();
        Head::new(f.kind, f.flags, StreamId::new(f.stream), f.payload.len()).encode(&mut b);
        b.extend_from_slice(&f.payload);
        c.client(&[&b]).unwrap();
    }
    let up = c.at_runtime();
    let mut dec = httlib_hpack::Decoder::default();
    let whole: Vec<u8> = up.iter().flat_map(|f| f.payload.clone()).collect();
    let fields = runtime_fields(
        &mut dec,
        &F {
            kind: Kind::Headers,
            flags: Flags::NONE,
            stream: 1,
            payload: whole,
        },
    );
    assert_eq!(field(&fields, "x-big").map(str::len), Some(40_000));
    assert!(up.last().unwrap().has(Flags::END_HEADERS));
}

#[test]
fn a_header_block_interrupted_or_never_begun_is_a_protocol_error() {
    let mut c = Conn::relayed();
    let mut head = request(1, "/s/Relay", true);
    head[4] &= !Flags::END_HEADERS.0;
    let err = c.client(&[&head, &ping(b"12345678")]).unwrap_err();
    assert!(matches!(
        err,
        RelayError::Protocol(Violation::InterruptedBlock)
    ));
    let mut c = Conn::relayed();
    let mut cont = Vec::new();
    Head::new(Kind::Continuation, Flags::END_HEADERS, S1, 0).encode(&mut cont);
    assert!(matches!(
        c.client(&[&cont]).unwrap_err(),
        RelayError::Protocol(Violation::StrayContinuation)
    ));
}

#[test]
fn an_undecodable_block_ends_the_connection_with_a_compression_error() {
    let mut c = Conn::relayed();
    let mut bad = Vec::new();
    http2::headers(&mut bad, S1, &[0x80 | 70], true);
    assert!(matches!(
        c.client(&[&bad]).unwrap_err(),
        RelayError::Protocol(Violation::UndecodableBlock)
    ));
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0)]);
    assert_eq!(
        GoAway::load(&to_client[0].payload).unwrap().reason,
        Reason::COMPRESSION_ERROR
    );
}

#[test]
fn the_runtimes_table_size_bounds_crisps_encoder_from_the_next_block() {
    let mut c = Conn::relayed();
    let mut dec = httlib_hpack::Decoder::default();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    let first = c.at_runtime();
    assert_eq!(runtime_fields(&mut dec, &first[0]).len(), 5);
    assert!(
        first[0].payload.len() > 40,
        "literals with indexing the first time"
    );
    // The runtime allows no table at all.
    c.runtime_all(&[&settings(Settings {
        header_table_size: Some(0),
        ..Default::default()
    })]);
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::Settings, 0)],
        "its settings reach the client unchanged"
    );
    c.client(&[&settings_ack(), &request(3, "/s/Relay", true)])
        .unwrap();
    let up = c.at_runtime();
    assert_eq!(kinds(&up), [(Kind::Settings, 0), (Kind::Headers, 3)]);
    assert_eq!(
        up[1].payload[0], 0x20,
        "a table size update to 0 opens the block"
    );
    let mut dec0 = httlib_hpack::Decoder::with_dynamic_size(4096);
    dec0.decode(&mut first[0].payload.clone(), &mut Vec::new())
        .unwrap();
    let fields = runtime_fields(&mut dec0, &up[1]);
    assert_eq!(field(&fields, ":path"), Some("/s/Relay"));
    // Nothing indexed afterwards: the next block is all literals again.
    c.client(&[&request(5, "/s/Relay", true)]).unwrap();
    let next = c.at_runtime();
    assert_ne!(next[0].payload[0], 0x20, "owed once");
    assert_eq!(
        field(&runtime_fields(&mut dec0, &next[0]), ":path"),
        Some("/s/Relay")
    );
}
