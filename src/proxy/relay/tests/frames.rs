//! Frame-level bounds (issue #36): the frame size the client was told (RFC 9113 §4.2), the
//! header block bound however the block is framed, and the one mapping from a protocol error
//! to the GOAWAY that closes the connection.

use super::super::from_client::MAX_HEADER_BLOCK;
use super::*;
use crate::proxy::http2::{FrameError, MAX_FRAME};

/// The GOAWAY the client got, if it is the only frame: (last stream, code, debug data).
fn the_goaway(c: &mut Conn) -> (u32, Reason, Vec<u8>) {
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::GoAway, 0)]);
    let g = GoAway::load(&to_client[0].payload).unwrap();
    (g.last_stream.get(), g.reason, g.debug_data.to_vec())
}

#[test]
fn a_frame_over_the_advertised_max_frame_size_is_a_frame_size_error() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    c.at_runtime();
    // The runtime advertised nothing: 16,384 bytes is the bound, and exactly that fits.
    c.client(&[&data(1, MAX_FRAME, false)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Data, 1)]);
    let mut big = Vec::new();
    Head::new(Kind::Data, Flags::NONE, S1, MAX_FRAME + 1).encode(&mut big);
    big.extend_from_slice(&vec![0; MAX_FRAME + 1]);
    let err = c.client(&[&big]).unwrap_err();
    assert!(matches!(
        err,
        RelayError::Protocol(Violation::Frame(FrameError::TooLarge {
            kind: Kind::Data,
            len,
            max: 16_384,
        })) if len == MAX_FRAME + 1
    ));
    assert!(
        c.at_runtime().is_empty(),
        "nothing of it reaches the runtime"
    );
    let (last, reason, debug) = the_goaway(&mut c);
    assert_eq!((last, reason), (1, Reason::FRAME_SIZE_ERROR));
    assert_eq!(debug, b"crisp: frame larger than SETTINGS_MAX_FRAME_SIZE");
}

#[test]
fn an_oversized_frame_is_refused_from_its_header_before_its_payload_arrives() {
    let mut c = Conn::degraded();
    c.at_client();
    // 16 MiB announced, 9 bytes sent: crisp reserves nothing for it.
    let mut head = Vec::new();
    Head::new(Kind::Headers, Flags::END_HEADERS, S1, (1 << 24) - 1).encode(&mut head);
    let mut buf = BytesMut::from(&head[..]);
    let err = c.core.handle_client_bytes(&mut buf, c.now).unwrap_err();
    assert!(matches!(
        err,
        RelayError::Protocol(Violation::Frame(FrameError::TooLarge { .. }))
    ));
    assert!(
        buf.capacity() < 1 << 20,
        "no room reserved for the announced payload"
    );
    assert_eq!(the_goaway(&mut c).1, Reason::FRAME_SIZE_ERROR);
}

#[test]
fn the_runtimes_larger_max_frame_size_is_the_clients_bound() {
    let mut c = Conn::relayed();
    c.runtime_all(&[&settings(Settings {
        max_frame_size: Some(1 << 20),
        ..Default::default()
    })]);
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::Settings, 0)],
        "relayed unchanged"
    );
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    let mut big = Vec::new();
    Head::new(Kind::Data, Flags::END_STREAM, S1, 100_000).encode(&mut big);
    big.extend_from_slice(&vec![0; 100_000]);
    c.client(&[&big]).unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 1), (Kind::Data, 1)]
    );
    // A value RFC 9113 §6.5.2 forbids changes nothing.
    let mut c = Conn::relayed();
    c.runtime_all(&[&settings(Settings {
        max_frame_size: Some(1 << 24),
        ..Default::default()
    })]);
    c.client(&[&request(1, "/s/Relay", false)]).unwrap();
    assert!(c.client(&[&big]).is_err());
}

#[test]
fn one_headers_frame_over_the_header_block_bound_closes_the_connection() {
    // Frames that large only when the runtime advertised them.
    let mut c = Conn::relayed();
    c.runtime_all(&[&settings(Settings {
        max_frame_size: Some(http2::MAX_FRAME_LIMIT),
        ..Default::default()
    })]);
    c.at_client();
    let mut huge = Vec::new();
    Head::new(Kind::Headers, Flags::END_HEADERS, S1, MAX_HEADER_BLOCK + 1).encode(&mut huge);
    huge.extend_from_slice(&vec![0x40; MAX_HEADER_BLOCK + 1]);
    assert!(matches!(
        c.client(&[&huge]).unwrap_err(),
        RelayError::Protocol(Violation::BlockTooLarge)
    ));
    assert!(c.at_runtime().is_empty());
    let (_, reason, debug) = the_goaway(&mut c);
    assert_eq!(reason, Reason::COMPRESSION_ERROR);
    assert_eq!(debug, b"crisp: header block too large");
}

#[test]
fn a_header_block_over_the_bound_in_continuations_closes_with_goaway_too() {
    let mut c = Conn::relayed();
    let mut first = Vec::new();
    Head::new(Kind::Headers, Flags::NONE, S1, MAX_FRAME).encode(&mut first);
    first.extend_from_slice(&vec![0x40; MAX_FRAME]);
    c.client(&[&first]).unwrap();
    let mut cont = Vec::new();
    Head::new(Kind::Continuation, Flags::NONE, S1, MAX_FRAME).encode(&mut cont);
    cont.extend_from_slice(&vec![0x40; MAX_FRAME]);
    let mut r = Ok(());
    for _ in 0..MAX_HEADER_BLOCK / MAX_FRAME {
        r = c.client(&[&cont]);
        if r.is_err() {
            break;
        }
    }
    assert!(matches!(
        r,
        Err(RelayError::Protocol(Violation::BlockTooLarge))
    ));
    let (_, reason, debug) = the_goaway(&mut c);
    assert_eq!(reason, Reason::COMPRESSION_ERROR);
    assert_eq!(debug, b"crisp: header block too large");
}

#[test]
fn every_protocol_error_maps_to_one_code() {
    let frame_too_large = FrameError::TooLarge {
        kind: Kind::Data,
        len: 1,
        max: 0,
    };
    let cases = [
        (Violation::Frame(frame_too_large), Reason::FRAME_SIZE_ERROR),
        (
            Violation::Frame(FrameError::BadLength {
                kind: Kind::Ping,
                len: 7,
            }),
            Reason::FRAME_SIZE_ERROR,
        ),
        (
            Violation::Frame(FrameError::BadPadding {
                kind: Kind::Headers,
            }),
            Reason::PROTOCOL_ERROR,
        ),
        (Violation::StrayContinuation, Reason::PROTOCOL_ERROR),
        (Violation::InterruptedBlock, Reason::PROTOCOL_ERROR),
        (Violation::BlockTooLarge, Reason::COMPRESSION_ERROR),
        (Violation::ListTooLarge, Reason::COMPRESSION_ERROR),
        (Violation::UndecodableBlock, Reason::COMPRESSION_ERROR),
        (
            Violation::RuntimeFrame(FrameError::BadPadding {
                kind: Kind::Headers,
            }),
            Reason::INTERNAL_ERROR,
        ),
        (Violation::RuntimeGoneInBlock, Reason::INTERNAL_ERROR),
    ];
    for (v, reason) in cases {
        assert_eq!(v.reason(), reason, "{v}");
        assert!(v.debug_data().starts_with(b"crisp: "), "{v}");
    }
}

#[test]
fn a_headers_frame_with_padding_longer_than_itself_is_a_protocol_error() {
    let mut c = Conn::relayed();
    let mut bad = Vec::new();
    Head::new(Kind::Headers, Flags::END_HEADERS | Flags::PADDED, S1, 2).encode(&mut bad);
    bad.extend_from_slice(&[9, 0]);
    assert!(matches!(
        c.client(&[&bad]).unwrap_err(),
        RelayError::Protocol(Violation::Frame(FrameError::BadPadding {
            kind: Kind::Headers
        }))
    ));
    assert_eq!(the_goaway(&mut c).1, Reason::PROTOCOL_ERROR);
}

#[test]
fn a_protocol_error_before_the_clients_server_preface_still_leaves_its_goaway() {
    // The pump writes what `poll_transmit_client` gives as it closes the connection
    // (grpc_go_wire's gigabytes test).
    let mut c = Conn::before_runtime_settings();
    let mut bad = Vec::new();
    Head::new(Kind::Continuation, Flags::END_HEADERS, S1, 0).encode(&mut bad);
    assert!(c.client(&[&bad]).is_err());
    let words = c.at_client();
    assert_eq!(kinds(&words), [(Kind::GoAway, 0)]);
    assert_eq!(
        GoAway::load(&words[0].payload).unwrap().reason,
        Reason::PROTOCOL_ERROR
    );
    // Inside a runtime header block nothing may interrupt it: no GOAWAY.
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    let mut head = response(1, &[(":status", "200")], false);
    head[4] = 0;
    c.runtime_all(&[&head]);
    c.at_client();
    assert!(c.client(&[&bad]).is_err());
    assert!(c.at_client().is_empty());
}
