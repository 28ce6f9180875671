//! Flow-control windows and debt, and the SETTINGS that move them.

use super::*;

#[test]
fn runtime_data_waits_for_the_window_the_client_really_has() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Headers, 1)]);
    c.runtime_all(&[&response(1, &[(":status", "200")], false)]);
    // 65,535 bytes of window: four frames of 16,384 do not fit.
    let blocked = c.runtime(&[
        &data(1, 16_384, false),
        &data(1, 16_384, false),
        &data(1, 16_384, false),
        &data(1, 16_384, false),
    ]);
    assert!(blocked);
    assert_eq!(
        kinds(&c.at_client()),
        [
            (Kind::Headers, 1),
            (Kind::Data, 1),
            (Kind::Data, 1),
            (Kind::Data, 1)
        ]
    );
    assert!(
        c.runtime(&[]),
        "no credit yet: the fourth frame waits, unwritten"
    );
    assert!(c.at_client().is_empty());
    c.client(&[&wu(0, 16_384)]).unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::WindowUpdate, 0)],
        "no debt: the credit is the runtime's"
    );
    assert!(!c.core.runtime_waits(), "the credit lets it go on");
    assert_eq!(kinds(&c.at_client()), [(Kind::Data, 1)]);
}

#[test]
fn bytes_crisp_sent_on_its_own_are_kept_from_the_runtimes_credit() {
    // The diverted stream's task sends its headers and 1,000 bytes (what the bridge does).
    let mut c = answering();
    c.command(Command::Data {
        stream: S1,
        bytes: vec![3; 1_000].into(),
        end: false,
    });
    assert_eq!(credit(&c.events()), [(1, 1_000)], "written at once");
    assert_eq!(c.core.flow.windows(S1), (64_535, 1_000, Some(64_535)));
    c.client(&[&wu(0, 600)]).unwrap();
    assert!(c.at_runtime().is_empty(), "600 bytes pay crisp's debt");
    c.client(&[&wu(0, 700)]).unwrap();
    let up = c.at_runtime();
    assert_eq!(kinds(&up), [(Kind::WindowUpdate, 0)]);
    assert_eq!(up[0].payload, 300u32.to_be_bytes(), "the rest goes on");
    assert_eq!(c.core.flow.windows(S1), (65_835, 0, Some(64_535)));
    // Stream credit for a diverted stream is crisp's.
    c.client(&[&wu(1, 500)]).unwrap();
    assert!(c.at_runtime().is_empty());
    assert_eq!(c.core.flow.windows(S1).2, Some(65_035));
}

#[test]
fn a_diverted_request_body_is_credited_back_at_once_and_never_relayed() {
    let mut c = Conn::relayed();
    c.client(&[
        &request(1, "/s/Divert", false),
        &data(1, 100, false),
        &data(1, 20, true),
    ])
    .unwrap();
    assert!(c.at_runtime().is_empty());
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::WindowUpdate, 0)]);
    assert_eq!(to_client[0].payload, 120u32.to_be_bytes());
    let ev = c.events();
    assert!(matches!(
        &ev[..],
        [Event::Divert { stream: S1, end_stream: false, .. }, Event::Body { stream: S1, data: a }, Event::Body { stream: S1, data: b }, Event::BodyEnd { stream: S1 }] if a.len() == 100 && b.len() == 20
    ));
}

#[test]
fn a_larger_client_window_counts_only_once_the_runtimes_ack_went_out() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Divert", true)]).unwrap();
    c.client(&[&settings(window(1 << 20))]).unwrap();
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Settings, 0)],
        "relayed, the runtime acknowledges"
    );
    assert_eq!(
        c.core.flow.windows(S1).2,
        Some(65_535),
        "not before the ACK"
    );
    c.runtime_all(&[&settings_ack()]);
    assert_eq!(kinds(&c.at_client()), [(Kind::Settings, 0)]);
    assert_eq!(c.core.flow.windows(S1).2, Some(1 << 20));
}

#[test]
fn a_smaller_client_window_applies_at_once_and_caps_a_larger_one_still_unacked() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Divert", true)]).unwrap();
    c.client(&[&settings(window(1 << 20)), &settings(window(1_000))])
        .unwrap();
    assert_eq!(c.core.flow.windows(S1).2, Some(1_000), "smaller: at once");
    c.runtime_all(&[&settings_ack()]);
    assert_eq!(
        c.core.flow.windows(S1).2,
        Some(1_000),
        "the smaller one, still unacked, caps the first"
    );
    c.runtime_all(&[&settings_ack()]);
    assert_eq!(c.core.flow.windows(S1).2, Some(1_000));
}

#[test]
fn without_a_runtime_crisp_is_the_server_and_acknowledges_settings_itself() {
    let mut c = Conn::degraded();
    let hello = c.at_client();
    assert_eq!(
        hello,
        [F {
            kind: Kind::Settings,
            flags: Flags::NONE,
            stream: 0,
            payload: vec![]
        }]
    );
    c.client(&[&settings(window(1 << 20))]).unwrap();
    let to_client = c.at_client();
    assert_eq!(kinds(&to_client), [(Kind::Settings, 0)]);
    assert!(to_client[0].has(Flags::ACK));
    c.client(&[&request(1, "/s/Relay", true)]).unwrap();
    assert_eq!(
        diverted(&c.events()),
        [1],
        "every stream goes to the observed path"
    );
    assert_eq!(c.core.flow.windows(S1).2, Some(1 << 20));
    assert!(c.at_runtime().is_empty());
}
