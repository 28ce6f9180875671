//! A streamed call in the tap (issue #45, #46): each message of a server-streamed response is an
//! event of its own, with its size, its items and its time since the call began, decoded with
//! `full` as a unary response is; the call's event follows with the count. What the observed
//! path does with a stream's bytes ([`crate::proxy`]'s `OutcomeReport`) is done here by hand:
//! the tap's view spec, a [`StreamSkimmer`] over the body, `on_message` per message, then
//! `on_complete`.

use crate::cri::skim::StreamSkimmer;

use super::*;

const STREAM: &str = "/runtime.v1.RuntimeService/StreamContainers";
const FUTURE: &str = "/runtime.v1.RuntimeService/StreamFutureThings";
const MESSAGES: usize = 150;

/// Message `i` of a StreamContainers answer: `per` containers of ~1 KB each, with a secret in
/// an annotation value.
fn chunk(i: usize, per: usize) -> Vec<u8> {
    k8s_cri::v1::ListContainersResponse {
        containers: (0..per)
            .map(|j| k8s_cri::v1::Container {
                id: format!("{:064x}", i * per + j),
                pod_sandbox_id: format!("{i:064x}"),
                labels: [("io.kubernetes.container.name".to_string(), "x".repeat(900))].into(),
                annotations: [("token".to_string(), "s3cr3t-annotation".to_string())].into(),
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

/// `message` of call `c` through a skimmer that counts items but keeps no view, as the observed
/// path skims a stream nobody asked the tap to show.
fn skim_one(t: &Tap, c: &Call, message: &[u8]) {
    let spec = SkimSpec {
        budget: 0,
        size_only: &[],
        items: Some(1),
    };
    let mut sk = StreamSkimmer::new(spec);
    sk.push(&wire::frame(message), |m| {
        t.on_message(c, &m, Duration::ZERO)
    });
}

/// The observed path's part for a stream: views per the tap's spec, `on_message` for each
/// message, and the call's end. Returns the stream's size on the wire.
fn stream_through(t: &Tap, c: &Call, messages: &[Vec<u8>], piece: usize) -> u64 {
    let Some(spec) = t.response_view(c) else {
        t.on_complete(c, &outcome(0, None));
        return 0;
    };
    let body: Vec<u8> = messages
        .iter()
        .flat_map(|m| wire::frame(m).to_vec())
        .collect();
    let mut s = StreamSkimmer::new(spec);
    let mut streamed = Streamed::default();
    for p in body.chunks(piece) {
        s.push(p, |m| {
            streamed.messages += 1;
            streamed.bytes += m.wire_len;
            t.on_message(c, &m, c.received.elapsed());
        });
    }
    assert!(s.finish().is_none());
    t.on_complete(
        c,
        &Outcome {
            streamed: Some(streamed),
            ..outcome(0, None)
        },
    );
    body.len() as u64
}

async fn drain(s: &mut Subscription) -> Vec<Item> {
    let mut out = Vec::new();
    while let Some(i) = next_now(s).await {
        out.push(i);
    }
    out
}

/// Issue #45: a 150-message StreamContainers shows as 150 message events, in order, each with
/// its size, its 100 containers and its time since the call began, then the call with the
/// count; `full` decodes each message (redacted, bounded), and a plain tap gets sizes only.
#[tokio::test]
async fn a_150_message_stream_is_150_message_events_then_its_call() {
    let t = tap();
    // The streamed lists are polling calls: shown with --all (include_polling).
    let all = Filter {
        include_polling: true,
        ..Default::default()
    };
    let mut plain = t.subscribe(all.clone(), 1024);
    let mut full = t.subscribe(
        Filter {
            full: true,
            ..all.clone()
        },
        1024,
    );
    let messages: Vec<Vec<u8>> = (0..MESSAGES).map(|i| chunk(i, 100)).collect();
    let c = call(7, STREAM);
    let total = stream_through(&t, &c, &messages, 16 << 10);
    t.flush();
    for (sub, decoded) in [(&mut plain, false), (&mut full, true)] {
        let items = drain(sub).await;
        assert_eq!(items.len(), MESSAGES + 1, "decoded {decoded}");
        let mut last = Duration::ZERO;
        for (i, item) in items[..MESSAGES].iter().enumerate() {
            let Item::Message(m) = item else {
                panic!("item {i}: {item:?}");
            };
            let p = m.to_proto(decoded, true);
            assert_eq!((p.call_id, p.index), (7, i as u64));
            assert_eq!(p.method, "StreamContainers");
            assert_eq!(p.kind, "streaming");
            assert_eq!(p.bytes, messages[i].len() as u64 + 5);
            assert_eq!(p.items, Some(100), "message {i}");
            assert!(m.since_start >= last);
            last = m.since_start;
            if decoded {
                let v: serde_json::Value = serde_json::from_str(&p.json).unwrap();
                // What fits the tap's bound is decoded; the rest is counted by size.
                let shown = v["containers"].as_array().unwrap().len();
                assert!((50..100).contains(&shown), "{shown} containers shown");
                assert_eq!(
                    v["_truncated"]["message_bytes"].as_u64(),
                    Some(messages[i].len() as u64)
                );
                assert!(!p.json.contains("s3cr3t-annotation"), "redacted");
                assert!(m.to_proto(true, false).json.contains("s3cr3t-annotation"));
            } else {
                // The event is shared with the `full` subscriber, which keeps its view.
                assert!(p.json.is_empty());
            }
        }
        let Item::Call(e) = &items[MESSAGES] else {
            panic!("{:?}", items[MESSAGES]);
        };
        let p = e.to_proto(decoded, true);
        assert_eq!((p.call_id, p.messages), (7, Some(MESSAGES as u64)));
        assert_eq!(p.response_bytes, total);
    }
}

/// A method crisp does not know may stream: its messages show too (by default: it is no
/// polling call crisp knows), by size and time only (no items, never decoded, even with `full`).
#[tokio::test]
async fn an_unknown_streams_messages_show_by_size_only() {
    let t = tap();
    let mut s = t.subscribe(
        Filter {
            full: true,
            ..Default::default()
        },
        64,
    );
    let messages: Vec<Vec<u8>> = (0..3).map(|i| chunk(i, 2)).collect();
    stream_through(&t, &call(9, FUTURE), &messages, 100);
    t.flush();
    let items = drain(&mut s).await;
    assert_eq!(items.len(), 4);
    for (i, item) in items[..3].iter().enumerate() {
        let Item::Message(m) = item else {
            panic!("{item:?}")
        };
        let p = m.to_proto(true, true);
        assert_eq!((p.index, p.kind.as_str()), (i as u64, "unknown"));
        assert_eq!(p.method, "StreamFutureThings");
        assert_eq!(p.bytes, messages[i].len() as u64 + 5);
        assert_eq!(p.items, None);
        assert!(p.json.is_empty() && m.view.is_none());
    }
    assert!(matches!(&items[3], Item::Call(e) if e.streamed.map(|s| s.messages) == Some(3)));
}

/// Nobody tapping: no view is asked for (the stream is not even observed: its call is
/// relayed), and a message reported anyway builds no event. A subscriber filtering on the
/// outcome gets the call but no message events.
#[tokio::test]
async fn messages_cost_nothing_untapped_and_skip_outcome_filters() {
    let t = tap();
    let c = call(1, STREAM);
    assert!(t.response_view(&c).is_none());
    assert!(!t.interest(&c).request);
    let messages: Vec<Vec<u8>> = (0..3).map(|i| chunk(i, 2)).collect();
    skim_one(&t, &c, &messages[0]);
    assert!(t.fanout.get().is_none(), "nothing was handed over");
    assert_eq!(t.metrics().tap_events.get(), 0);

    let mut errors = t.subscribe(
        Filter {
            errors_only: true,
            include_polling: true,
            ..Default::default()
        },
        64,
    );
    let mut slow = t.subscribe(
        Filter {
            slower_than: Duration::from_nanos(1),
            include_polling: true,
            ..Default::default()
        },
        64,
    );
    assert!(t.response_view(&c).is_none(), "nobody wants the messages");
    let c = call(2, STREAM);
    skim_one(&t, &c, &messages[0]);
    t.on_complete(
        &c,
        &Outcome {
            code: Some(2),
            ..outcome(2, None)
        },
    );
    t.flush();
    assert!(matches!(&drain(&mut errors).await[..], [Item::Call(_)]));
    assert!(matches!(&drain(&mut slow).await[..], [Item::Call(_)]));
}

/// The tap's memory for a stream is bounded by what it shows, never by the stream: a 15 MB
/// answer of 150 messages queues 150 events of at most the tap's view bound each with `full`,
/// a few hundred bytes each without; one view is built at a time.
#[tokio::test]
async fn a_15_mb_stream_queues_bounded_views_not_the_stream() {
    let messages: Vec<Vec<u8>> = (0..MESSAGES).map(|i| chunk(i, 100)).collect();
    for full in [false, true] {
        let t = tap();
        let _s = t.subscribe(
            Filter {
                full,
                include_polling: true,
                ..Default::default()
            },
            1024,
        );
        let total = stream_through(&t, &call(3, STREAM), &messages, 64 << 10);
        assert!(total > 15_000_000, "{total}");
        t.flush();
        let queued = t.hub.snapshot()[0].counters.queued_bytes.load(Relaxed);
        let most = if full {
            MESSAGES * (MAX_SHOWN_PROTOBUF_BYTES + 2048) + 1024
        } else {
            MESSAGES * 512 + 1024
        };
        assert!(queued <= most, "full {full}: {queued} bytes queued");
        if !full {
            assert!((queued as u64) < total / 100, "{queued} bytes queued");
        }
        assert_eq!(t.metrics().tap_dropped.get(), 0);
    }
}
