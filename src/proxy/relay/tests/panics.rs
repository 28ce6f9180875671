//! A panic while serving a diverted call (a bug in crisp's observed path) ends that call only.

use super::*;
use crate::proxy::relay::bridge::{Diverted, Outbox};
use crate::proxy::sock::Wake;

#[tokio::test(flavor = "current_thread")]
async fn a_panic_serving_a_diverted_call_answers_it_internal_and_ends_its_stream() {
    let outbox = Arc::new(Outbox::new(Wake::new().unwrap()));
    let mut c = Conn::relayed();
    c.client(&[&request(1, "/s/Divert", true)]).unwrap();
    assert_eq!(diverted(&c.events()), [1]);
    // Serves every diverted call by panicking; unwinds without the panic hook, so the test output
    // stays clean.
    let panics = Answers(Box::new(|| {
        Box::pin(async { std::panic::resume_unwind(Box::new("a bug (injected)")) })
    }));
    let mut diverted = Diverted::new(Arc::new(panics), outbox.clone());
    let call = Call {
        route: crate::cri::Route::from_path("/runtime.v1.RuntimeService/CreateContainer"),
        path: http::uri::PathAndQuery::from_static("/runtime.v1.RuntimeService/CreateContainer"),
        received: Instant::now(),
        deadline: None,
        id: 1,
        trace: None,
    };
    let fields = vec![
        (":method".into(), "POST".into()),
        (
            ":path".into(),
            "/runtime.v1.RuntimeService/CreateContainer".into(),
        ),
    ];
    diverted.start(S1, call, fields, true);
    // The task ends (its last command) once it has answered; the pump hands its commands to
    // the core.
    let mut commands = std::collections::VecDeque::new();
    let mut finished = false;
    while !finished {
        tokio::task::yield_now().await;
        outbox.take(&mut commands);
        for cmd in commands.drain(..) {
            finished |= matches!(cmd, Command::Finished { stream: S1 });
            c.command(cmd);
        }
    }
    assert!(!c.core.flow.is_diverted(S1), "the stream is closed");
    let frames = c.at_client();
    assert_eq!(kinds(&frames), [(Kind::Headers, 1)]);
    assert!(frames[0].has(Flags::END_STREAM), "the stream ends");
    let fields = runtime_fields(&mut httlib_hpack::Decoder::default(), &frames[0]);
    assert_eq!(field(&fields, ":status"), Some("200"), "trailers-only");
    assert_eq!(field(&fields, "grpc-status"), Some("13"), "INTERNAL");
    assert!(field(&fields, "grpc-message").is_some_and(|m| m.contains("internal error")));
}
