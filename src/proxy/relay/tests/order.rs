//! The one way out: the runtime's frames and crisp's own reach the client in the order the core
//! chose, and `poll_transmit_client` gives them in that order.

use super::*;

#[test]
fn crisps_frames_and_the_runtimes_reach_the_client_in_the_order_the_core_chose() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, "/s/Divert", true),
        &request(3, "/s/Relay", true),
        // The diverted answer gets no window yet (a smaller window applies at once).
        &settings(window(0)),
    ])
    .unwrap();
    assert_eq!(diverted(&c.events()), [1]);
    c.at_runtime();
    c.command(Command::Headers {
        stream: S1,
        status: http::StatusCode::OK,
        fields: http::HeaderMap::new(),
        end: false,
    });
    c.command(Command::Data {
        stream: S1,
        bytes: vec![3; 100].into(),
        end: false,
    });
    assert_eq!(kinds(&c.at_client()), [(Kind::Headers, 1)]);
    // A larger window counts once the runtime's ACK of it reached the client.
    c.client(&[&settings(window(1 << 20))]).unwrap();
    // A PING crisp answers itself, then the runtime's batch, before the client reads: crisp's
    // frame staged before the batch goes before it; its DATA that the second ACK lets go goes
    // right after that ACK, before the runtime's frames that followed it in the same read.
    c.client(&[&ping(b"client01")]).unwrap();
    c.runtime_all(&[
        &settings_ack(),
        &response(3, &[(":status", "200")], false),
        &settings_ack(),
        &data(3, 10, false),
    ]);
    let at_client = c.at_client();
    assert_eq!(
        kinds(&at_client),
        [
            (Kind::Ping, 0),
            (Kind::Settings, 0),
            (Kind::Headers, 3),
            (Kind::Settings, 0),
            (Kind::Data, 1),
            (Kind::Data, 3),
        ]
    );
    assert!(at_client[0].has(Flags::ACK), "crisp's answer to the PING");
    assert_eq!(
        at_client[4].payload.len(),
        100,
        "crisp's DATA, after the ACK"
    );
    // The diverted stream's reset, then the runtime's trailers: in that order.
    c.command(Command::Reset {
        stream: S1,
        reason: Reason::INTERNAL_ERROR,
    });
    c.runtime_all(&[&response(3, &[("grpc-status", "0")], true)]);
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::RstStream, 1), (Kind::Headers, 3)]
    );
}

#[test]
fn a_partly_written_slice_is_given_again_from_where_the_socket_stopped() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    c.runtime_all(&[
        &response(1, &[(":status", "200")], false),
        &data(1, 50, true),
    ]);
    let whole = c.core.poll_transmit_client().unwrap().to_vec();
    // The socket took 10 bytes: the rest comes next, the runtime's bytes never copied out.
    c.core.advance_client(10, c.now);
    let rest = c.client_bytes();
    assert_eq!(rest[..], whole[10..]);
    assert!(c.core.poll_transmit_client().is_none());
}
