//! KEP-5825's streamed lists (kubelet 1.36, `CRIListStreaming`): a server-streaming call whose
//! answer is the list in chunks. A 10,000-container node lists ~15 MB (issue #45); crisp relays
//! it message by message — each message reaches kubelet before the runtime has sent the next,
//! byte for byte — relayed, through the daemon's ordering chain, and with a `--full` tap
//! attached (streams are never buffered there either), where each message is an event of its
//! own.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::BytesMut;
use crisp::admin_api as pb;
use http_body::Frame;
use prost::Message;

use crate::support::*;

const STREAM: &str = "/runtime.v1.RuntimeService/StreamContainers";
/// Messages of the answer and containers per message: 150 × 100 × ~1 KB ≈ 15 MB.
const MESSAGES: usize = 150;
const PER_MESSAGE: usize = 100;

/// Message `i` of the list: `PER_MESSAGE` containers with ~1 KB of labels each.
fn chunk(i: usize) -> Vec<u8> {
    k8s_cri::v1::ListContainersResponse {
        containers: (0..PER_MESSAGE)
            .map(|j| k8s_cri::v1::Container {
                id: format!("{:064x}", i * PER_MESSAGE + j),
                pod_sandbox_id: format!("{i:064x}"),
                state: (j % 3) as i32,
                labels: [("io.kubernetes.container.name".to_string(), "x".repeat(900))].into(),
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

/// The test's own request (a label selector crisp's own lists never send): the daemon lists
/// containers itself too, and those calls must not take the test's answers.
fn request() -> Vec<u8> {
    k8s_cri::v1::ListContainersRequest {
        filter: Some(k8s_cri::v1::ContainerFilter {
            label_selector: [("test".to_string(), "streamed-lists".to_string())].into(),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

/// Answers the test's StreamContainers with the queued replies, crisp's own with UNIMPLEMENTED
/// (as containerd does).
fn script(fake: &Fake) -> Arc<Mutex<VecDeque<Reply>>> {
    let queue: Arc<Mutex<VecDeque<Reply>>> = Arc::default();
    let q = queue.clone();
    let mine = request();
    fake.script(STREAM, move |rec| {
        match (
            rec.message() == mine.as_slice(),
            q.lock().unwrap().pop_front(),
        ) {
            (true, Some(r)) => r,
            _ => Reply::TrailersOnly(header_map(&[
                ("content-type", b"application/grpc"),
                ("grpc-status", b"12"),
            ])),
        }
    });
    queue
}

#[derive(Debug, Clone, Copy)]
enum Mode {
    Relayed,
    Daemon,
    Tapped,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_15_mb_streamed_list_is_relayed_message_by_message() {
    let msgs: Vec<bytes::Bytes> = (0..MESSAGES).map(|i| grpc_frame(&chunk(i))).collect();
    let total: usize = msgs.iter().map(|m| m.len()).sum();
    assert!(total > 15_000_000, "{total} bytes");
    for mode in [Mode::Relayed, Mode::Daemon, Mode::Tapped] {
        let fake = Fake::start().await;
        let replies = script(&fake);
        let (crisp, daemon) = match mode {
            Mode::Relayed => (Some(Crisp::start(fake.path()).await), None),
            _ => (None, Some(Daemon::start(fake.path(), |_| {}).await)),
        };
        let sock = crisp
            .as_ref()
            .map_or_else(|| daemon.as_ref().unwrap().sock.clone(), |c| c.path.clone());
        let mut tap = match (mode, &daemon) {
            (Mode::Tapped, Some(d)) => {
                let req = pb::TapRequest {
                    include_polling: true,
                    full: true,
                    ..Default::default()
                };
                Some(tap_events(&d.admin, req).await)
            }
            _ => None,
        };

        // 1. Lockstep: the runtime sends message i only once the client has message i - 1
        //    whole, and the client gets exactly message i, no byte more, before the next.
        let (reply, tx) = Reply::channel(grpc_headers());
        replies.lock().unwrap().push_back(reply);
        let mut raw = Raw::connect(&sock).await;
        let fut = raw
            .start(&RawRequest::grpc(STREAM, &request()))
            .await
            .unwrap();
        let what = format!("{mode:?}: the stream's headers");
        let resp = within(PATIENCE, &what, fut).await.unwrap();
        let mut body = resp.into_body();
        let mut got = BytesMut::new();
        let mut want = 0;
        let started = Instant::now();
        for (i, m) in msgs.iter().enumerate() {
            tx.send(Frame::data(m.clone())).unwrap();
            want += m.len();
            while got.len() < want {
                let what = format!("{mode:?}: message {i} of {MESSAGES}");
                let c = within(PATIENCE, &what, body.data()).await.unwrap().unwrap();
                let _ = body.flow_control().release_capacity(c.len());
                got.extend_from_slice(&c);
            }
            assert_eq!(got.len(), want, "{mode:?}: more than message {i} arrived");
        }
        let lockstep = started.elapsed();
        tx.send(Frame::trailers(ok_trailers())).unwrap();
        drop(tx);
        let trailers = within(PATIENCE, "trailers", body.trailers())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(trailers.get("grpc-status").unwrap(), "0", "{mode:?}");
        assert!(got[..] == msgs.concat()[..], "{mode:?}: the bytes differ");

        // 2. Flow control: the runtime pushes the whole list at once while the client reads
        //    nothing; then the client reads it at its pace, and it is complete and exact.
        let (reply, tx) = Reply::channel(grpc_headers());
        replies.lock().unwrap().push_back(reply);
        let fut = raw
            .start(&RawRequest::grpc(STREAM, &request()))
            .await
            .unwrap();
        let resp = within(PATIENCE, "headers", fut).await.unwrap();
        for m in &msgs {
            tx.send(Frame::data(m.clone())).unwrap();
        }
        tx.send(Frame::trailers(ok_trailers())).unwrap();
        drop(tx);
        let started = Instant::now();
        let mut body = resp.into_body();
        let mut got = BytesMut::new();
        while let Some(c) = within(PATIENCE, "bulk data", body.data()).await {
            let c = c.unwrap();
            let _ = body.flow_control().release_capacity(c.len());
            got.extend_from_slice(&c);
        }
        let bulk = started.elapsed();
        assert!(
            got[..] == msgs.concat()[..],
            "{mode:?}: bulk: the bytes differ"
        );
        eprintln!(
            "{mode:?}: {total} bytes in {MESSAGES} messages: lockstep {lockstep:?}, bulk read {bulk:?}"
        );

        if let Some(t) = tap.as_mut() {
            // The tap saw both calls end OK, each after its 150 messages (issue #45): in order,
            // each with its size, its 100 containers and its decoded view.
            let mut seen = 0;
            let mut messages: std::collections::HashMap<u64, u64> = Default::default();
            while seen < 2 {
                let ev = within(PATIENCE, "the tap's event", t.message())
                    .await
                    .unwrap()
                    .unwrap();
                match ev.event {
                    Some(pb::tap_event::Event::Message(m)) if m.path == STREAM => {
                        let n = messages.entry(m.call_id).or_default();
                        assert_eq!(m.index, *n, "messages in order");
                        assert_eq!(m.bytes, msgs[m.index as usize].len() as u64);
                        assert_eq!(m.items, Some(PER_MESSAGE as u64));
                        assert!(m.json.contains("\"containers\""), "--full decodes each");
                        *n += 1;
                    }
                    Some(pb::tap_event::Event::Call(c)) if c.path == STREAM => {
                        assert_eq!(c.code, Some(0), "{c:?}");
                        assert_eq!(c.messages, Some(MESSAGES as u64));
                        assert_eq!(c.response_bytes, total as u64);
                        assert_eq!(messages.get(&c.call_id), Some(&(MESSAGES as u64)));
                        seen += 1;
                    }
                    _ => {}
                }
            }
        }
    }
}
