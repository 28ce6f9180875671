//! A panic while serving a diverted call (a bug in crisp's observed path), or while the relay
//! core routes a new stream, ends that call only.

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

/// The rest of crisp, whose interceptors' questions panic on calls whose path ends in `/Boom`
/// (a bug in the relay core's routing of a new stream, as the test-util fault hook injects),
/// and which bypasses a route once told to.
struct Boom {
    ids: AtomicU64,
    panics: std::sync::Mutex<Vec<(crate::cri::Route, u64, String)>>,
    bypass: std::sync::atomic::AtomicBool,
}

impl Calls for Boom {
    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }
    fn interest(&self, call: &Call) -> Interest {
        if call.path.as_str().ends_with("/Boom") {
            std::panic::resume_unwind(Box::new("a bug (injected)"));
        }
        Interest {
            complete: true,
            ..Interest::NONE
        }
    }
    fn bypassed(&self, _: crate::cri::Route) -> bool {
        self.bypass.load(Ordering::Relaxed)
    }
    fn panicked(&self, route: crate::cri::Route, call: u64, place: &str, _: &str) {
        self.panics
            .lock()
            .unwrap()
            .push((route, call, place.to_string()));
    }
}

/// Fails on bde328c (the panic unwound out of `client_bytes`, and the relay thread closed the
/// connection): now the stream is answered INTERNAL, counted, and the connection goes on.
#[test]
fn a_panic_routing_a_new_stream_answers_it_internal_and_the_connection_goes_on() {
    let boom = Arc::new(Boom {
        ids: AtomicU64::new(1),
        panics: Default::default(),
        bypass: Default::default(),
    });
    let cfg = Config {
        keepalive_interval: Duration::from_secs(10),
        keepalive_timeout: Duration::from_secs(5),
        runtime: "/run/containerd.sock".into(),
    };
    let mut c = Conn {
        core: Core::new(&cfg, boom.clone(), true, Instant::now()),
        now: Instant::now(),
        events: Vec::new(),
    };
    c.runtime_all(&[&settings(Settings::default())]);
    assert_eq!(kinds(&c.at_client()), [(Kind::Settings, 0)]);
    // S1 panics with its request body still coming; S3, in the same read, is relayed.
    c.client(&[&request(1, "/s/Boom", false), &request(3, "/s/Fine", true)])
        .expect("the connection goes on");
    assert_eq!(
        kinds(&c.at_runtime()),
        [(Kind::Headers, 3)],
        "the runtime never sees the stream crisp could not route"
    );
    let frames = c.at_client();
    assert_eq!(kinds(&frames), [(Kind::Headers, 1), (Kind::RstStream, 1)]);
    assert!(frames[0].has(Flags::END_STREAM), "trailers only");
    let fields = runtime_fields(&mut httlib_hpack::Decoder::default(), &frames[0]);
    assert_eq!(field(&fields, ":status"), Some("200"));
    assert_eq!(field(&fields, "grpc-status"), Some("13"), "INTERNAL");
    assert!(field(&fields, "grpc-message").is_some_and(|m| m.contains("did not reach")));
    assert_eq!(
        frames[1],
        parse(&rst(1, Reason::NO_ERROR))[0],
        "the client stops sending"
    );
    {
        let p = boom.panics.lock().unwrap();
        assert_eq!(p.len(), 1, "counted once");
        assert_eq!((p[0].1, p[0].2.as_str()), (1, "relay core"));
    }
    // The rest of its request is crisp's to drop, even once later streams are relayed.
    c.client(&[&data(1, 100, true)]).unwrap();
    assert_eq!(c.at_runtime(), []);
    // The runtime answers S3 through crisp as ever (and the client has its connection credit
    // back for the dropped DATA, crisp's frame first: it was staged before the runtime's).
    c.runtime_all(&[&response(3, &[(":status", "200")], true)]);
    assert_eq!(
        kinds(&c.at_client()),
        [(Kind::WindowUpdate, 0), (Kind::Headers, 3)]
    );
    // Once the route is bypassed, its calls are relayed without the questions that panicked.
    boom.bypass.store(true, Ordering::Relaxed);
    c.client(&[&request(5, "/s/Boom", true)]).unwrap();
    assert_eq!(kinds(&c.at_runtime()), [(Kind::Headers, 5)]);
    assert_eq!(boom.panics.lock().unwrap().len(), 1);
    assert_eq!(
        c.core.calls_in_flight(),
        1,
        "S5 relayed (S3 answered); S1 is not in flight"
    );
}
