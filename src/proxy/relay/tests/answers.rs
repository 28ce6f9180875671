//! Diverted streams' answers as commands: the core applies the client's windows to them, keeps
//! what does not fit, gives the written DATA back as credit, and ends each stream once.

use bytes::Bytes;

use super::*;
use crate::proxy::relay::bridge::{Diverted, Outbox};
use crate::proxy::relay::flow::ANSWER_BUDGET;
use crate::proxy::sock::Wake;

fn body(n: usize, end: bool) -> Command {
    Command::Data {
        stream: S1,
        bytes: vec![5; n].into(),
        end,
    }
}

fn data_len(frames: &[F]) -> usize {
    frames
        .iter()
        .filter(|f| f.kind == Kind::Data)
        .map(|f| f.payload.len())
        .sum()
}

#[test]
fn an_answer_larger_than_the_clients_window_waits_and_resumes_on_its_credit() {
    let mut c = answering();
    // 65,535 bytes of window, 70,000 sent (more than the bridge's budget: the core keeps what
    // it is given).
    c.command(body(70_000, true));
    let first = c.at_client();
    assert_eq!(
        data_len(&first),
        65_535,
        "the client's window, not a byte more"
    );
    assert!(first.iter().all(|f| !f.has(Flags::END_STREAM)));
    assert_eq!(
        credit(&c.events()),
        [(1, 65_535)],
        "the task hears of what was written"
    );
    assert_eq!(c.core.flow.queued(S1), 4_465);
    // Connection credit alone is not enough: the stream's window is used up too.
    c.client(&[&wu(0, 10_000)]).unwrap();
    assert!(c.at_client().is_empty());
    assert!(credit(&c.events()).is_empty());
    c.client(&[&wu(1, 10_000)]).unwrap();
    let rest = c.at_client();
    assert_eq!(kinds(&rest), [(Kind::Data, 1)]);
    assert_eq!(rest[0].payload.len(), 4_465);
    assert!(
        rest[0].has(Flags::END_STREAM),
        "the end goes with the last bytes"
    );
    assert_eq!(credit(&c.events()), [(1, 4_465)]);
    assert_eq!(c.core.flow.queued(S1), 0);
    // crisp's own bytes are its debt: the runtime's credit waits for them.
    assert!(c
        .at_runtime()
        .iter()
        .all(|f| f.kind != Kind::WindowUpdate || f.stream != 0));
    c.finished(S1);
    assert!(!c.core.flow.is_diverted(S1), "written and finished: closed");
}

#[test]
fn a_finished_stream_stays_open_until_its_kept_answer_is_written() {
    let mut c = answering();
    c.command(body(70_000, true));
    c.at_client();
    c.finished(S1);
    assert!(c.core.flow.is_diverted(S1), "4,465 bytes still to write");
    c.client(&[&wu(0, 5_000), &wu(1, 5_000)]).unwrap();
    assert_eq!(data_len(&c.at_client()), 4_465);
    assert!(!c.core.flow.is_diverted(S1));
}

#[test]
fn settings_that_move_the_initial_window_apply_to_a_kept_answer() {
    let mut c = answering();
    // Smaller: at once, and what is kept waits for the smaller window.
    c.client(&[&settings(window(1_000))]).unwrap();
    c.command(body(3_000, false));
    assert_eq!(data_len(&c.at_client()), 1_000);
    assert_eq!(c.core.flow.queued(S1), 2_000);
    // Larger: once the runtime's ACK of it went out, the kept bytes go.
    c.client(&[&settings(window(2_500))]).unwrap();
    assert!(c.at_client().is_empty(), "not before the ACK");
    c.runtime_all(&[&settings_ack(), &settings_ack()]);
    let after = c.at_client();
    assert_eq!(
        kinds(&after)[..2],
        [(Kind::Settings, 0), (Kind::Settings, 0)]
    );
    assert_eq!(data_len(&after), 1_500, "the window grew by 1,500");
    assert_eq!(c.core.flow.queued(S1), 500);
}

#[test]
fn a_reset_command_drops_the_kept_answer_and_ends_the_stream_once() {
    let mut c = answering();
    c.command(body(70_000, false));
    c.at_client();
    c.events();
    c.command(Command::Reset {
        stream: S1,
        reason: Reason::CANCEL,
    });
    assert_eq!(c.at_client(), parse(&rst(1, Reason::CANCEL)));
    assert!(!c.core.flow.is_diverted(S1));
    // Nothing more of it: neither a second reset nor what the task still sent.
    c.command(Command::Reset {
        stream: S1,
        reason: Reason::CANCEL,
    });
    c.command(body(10, true));
    c.finished(S1);
    c.client(&[&wu(0, 100_000), &wu(1, 100_000)]).unwrap();
    assert!(c.at_client().is_empty());
    assert!(credit(&c.events()).is_empty());
}

#[test]
fn the_clients_reset_drops_the_kept_answer_and_ends_the_stream_once() {
    let mut c = answering();
    c.command(body(70_000, false));
    c.at_client();
    c.events();
    c.client(&[&rst(1, Reason::CANCEL)]).unwrap();
    let ev = c.events();
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(e, Event::Reset { stream: S1 }))
            .count(),
        1,
        "its task is aborted"
    );
    assert_eq!(c.core.flow.queued(S1), 0);
    // The task's last commands, sent before it was aborted, are dropped; crisp sends no
    // RST_STREAM of its own after the client's.
    c.command(body(10, true));
    c.command(Command::Reset {
        stream: S1,
        reason: Reason::CANCEL,
    });
    c.client(&[&wu(0, 100_000), &rst(1, Reason::CANCEL)])
        .unwrap();
    assert!(c.at_client().is_empty());
    assert!(c
        .events()
        .iter()
        .all(|e| !matches!(e, Event::Reset { .. } | Event::Credit { .. })));
}

#[test]
fn nothing_of_an_answer_is_taken_out_of_order_or_after_its_end() {
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Divert", true)]).unwrap();
    c.events();
    c.command(body(10, false));
    assert!(c.at_client().is_empty(), "DATA before the headers");
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    c.command(Command::Headers {
        stream: S1,
        status: http::StatusCode::OK,
        fields: http::HeaderMap::new(),
        end: false,
    });
    c.command(Command::Trailers {
        stream: S1,
        fields: trailers.clone(),
    });
    let frames = c.at_client();
    assert_eq!(kinds(&frames), [(Kind::Headers, 1), (Kind::Headers, 1)]);
    assert!(frames[1].has(Flags::END_STREAM));
    c.command(Command::Trailers {
        stream: S1,
        fields: trailers,
    });
    c.command(body(10, true));
    c.command(Command::Reset {
        stream: S1,
        reason: Reason::CANCEL,
    });
    assert!(c.at_client().is_empty(), "the stream ended once");
}

/// The commands queued so far, once the task has nothing more to send until it gets credit.
async fn settle(outbox: &Outbox) -> Vec<Command> {
    let mut q = std::collections::VecDeque::new();
    // The task runs on this (current-thread) runtime: a few turns let it reach its wait.
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    outbox.take(&mut q);
    q.into_iter().collect()
}

fn sent(cmds: &[Command]) -> usize {
    cmds.iter()
        .map(|c| match c {
            Command::Data { bytes, .. } => bytes.len(),
            _ => 0,
        })
        .sum()
}

#[tokio::test(flavor = "current_thread")]
async fn a_diverted_task_sends_no_more_than_its_budget_ahead_of_the_cores_credit() {
    let outbox = Arc::new(Outbox::new(Wake::new().unwrap()));
    // Answers every diverted call with one large message.
    let large = Answers(Box::new(|| {
        use http_body_util::BodyExt;
        let body = http_body_util::Full::new(Bytes::from(vec![9u8; 200_000]))
            .map_err(|e| match e {})
            .boxed_unsync();
        Box::pin(async move { http::Response::new(body) })
    }));
    let mut diverted = Diverted::new(Arc::new(large), outbox.clone());
    let call = Call {
        route: crate::cri::Route::from_path("/runtime.v1.RuntimeService/ExecSync"),
        path: http::uri::PathAndQuery::from_static("/runtime.v1.RuntimeService/ExecSync"),
        received: Instant::now(),
        deadline: None,
        id: 1,
        trace: None,
    };
    diverted.start(S1, call, vec![(":path".into(), "/x".into())], true);
    let first = settle(&outbox).await;
    assert!(matches!(
        first[0],
        Command::Headers {
            stream: S1,
            end: false,
            ..
        }
    ));
    assert_eq!(sent(&first), ANSWER_BUDGET, "the budget, then it waits");
    assert_eq!(sent(&settle(&outbox).await), 0, "no credit, no more");
    // The core wrote 20,000 bytes: the task may send as many more.
    diverted.credit(S1, 20_000);
    let more = settle(&outbox).await;
    assert_eq!(sent(&more), 16_384, "a frame's worth fits in 20,000");
    diverted.credit(S1, 200_000);
    let rest = settle(&outbox).await;
    assert_eq!(ANSWER_BUDGET + 16_384 + sent(&rest), 200_000);
    assert!(matches!(
        rest.last(),
        Some(Command::Finished { stream: S1 })
    ));
}
