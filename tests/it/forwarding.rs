//! Transparency of the forwarder (DESIGN.md §1): bytes in, same bytes out, for every CRI method
//! and for paths crisp does not know; big messages; server streams; error statuses; deadlines;
//! concurrency. Each test compares crisp against a direct connection to the same fake runtime.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::Frame;
use prost::Message;

use crate::support::*;
use crisp::intercept::{Call, Interceptor, Interest};
use crisp::proxy::ProxyOptions;

const UNKNOWN_PATHS: &[&str] = &[
    "/runtime.v1.RuntimeService/NoSuchMethod",
    "/some.other.Service/Foo",
];

/// What a grpc-go client (kubelet) sends, plus custom text and binary metadata, a repeated key,
/// an empty value, and request trailers.
fn rich_request(path: &str) -> RawRequest {
    RawRequest {
        path: path.to_string(),
        headers: header_map(&[
            ("content-type", b"application/grpc"),
            ("user-agent", b"grpc-go/1.58.3"),
            ("te", b"trailers"),
            ("grpc-accept-encoding", b"identity,deflate,gzip"),
            ("grpc-timeout", b"119999872u"),
            ("x-foo", b"bar"),
            ("x-foo", b"second value"),
            ("x-empty", b""),
            ("x-trace-bin", b"AAECAwT/gA"),
        ]),
        body: grpc_frame(&arbitrary_message(path)),
        trailers: Some(header_map(&[
            ("x-request-trailer", b"rt"),
            ("x-request-trailer-bin", b"3q2+7w"),
        ])),
    }
}

/// A response with repeated and binary metadata, a message split over two DATA frames, and
/// trailers carrying a status message and binary metadata.
fn rich_reply(rec: &Recorded) -> Reply {
    let body = grpc_frame(&arbitrary_message(&format!("response to {}", rec.path())));
    let (a, b) = body.split_at(7);
    Reply::Full {
        headers: header_map(&[
            ("content-type", b"application/grpc"),
            ("x-resp", b"r1"),
            ("x-resp", b"r2"),
            ("x-resp-bin", b"AP8A/w"),
            ("grpc-encoding", b"identity"),
        ]),
        chunks: vec![
            (Duration::ZERO, Bytes::copy_from_slice(a)),
            (Duration::ZERO, Bytes::copy_from_slice(b)),
        ],
        trailers: Some(header_map(&[
            ("grpc-status", b"0"),
            ("grpc-message", b"all%20good"),
            ("x-trailer-bin", b"AQID"),
        ])),
    }
}

/// Sends the same request to the fake directly and through crisp, and asserts that both the
/// fake and the client saw exactly the same thing both ways.
async fn assert_identical_both_ways(fake: &Fake, crisp: &Crisp, paths: &[String]) {
    for p in paths {
        fake.script(p, rich_reply);
    }
    let mut direct = Raw::connect(fake.path()).await;
    let mut via = Raw::connect(&crisp.path).await;
    for path in paths {
        let req = rich_request(path);
        let d = within(PATIENCE, path, direct.call(&req))
            .await
            .unwrap_or_else(|e| panic!("{path} direct: {e}"));
        let up_d = fake.last_with_body(path, &req.body);
        let v = within(PATIENCE, path, via.call(&req))
            .await
            .unwrap_or_else(|e| panic!("{path} through crisp: {e}"));
        let up_v = fake.last_with_body(path, &req.body);
        assert!(
            up_d.seq != up_v.seq,
            "{path}: the call through crisp never reached the fake"
        );

        // What the runtime sees.
        assert_eq!(up_v.method, up_d.method, "{path}: method");
        assert_eq!(up_v.uri, up_d.uri, "{path}: uri (scheme, authority, path)");
        assert_eq!(
            pairs(&up_v.headers),
            pairs(&req.headers),
            "{path}: request headers upstream"
        );
        assert_eq!(
            pairs(&up_d.headers),
            pairs(&req.headers),
            "{path}: request headers sent directly"
        );
        assert_eq!(up_v.body, req.body, "{path}: request body upstream");
        assert_eq!(up_d.body, req.body, "{path}: request body sent directly");
        assert_eq!(
            up_v.trailers.as_ref().map(pairs),
            req.trailers.as_ref().map(pairs),
            "{path}: request trailers upstream"
        );
        assert_eq!(
            up_d.trailers.as_ref().map(pairs),
            req.trailers.as_ref().map(pairs),
            "{path}: request trailers sent directly"
        );

        // What the client sees.
        assert_eq!(v.status, d.status, "{path}: :status");
        assert_eq!(
            pairs(&v.headers),
            pairs(&d.headers),
            "{path}: response headers"
        );
        assert!(
            v.headers.get("date").is_none() && v.headers.get("content-length").is_none(),
            "{path}: crisp added headers: {:?}",
            v.headers
        );
        assert_eq!(v.body, d.body, "{path}: response body");
        assert_eq!(
            v.trailers.as_ref().map(pairs),
            d.trailers.as_ref().map(pairs),
            "{path}: response trailers"
        );
        // And the direct answer is what the fake was told to say (the fake itself is exact).
        let expected = match rich_reply(&up_d) {
            Reply::Full {
                headers,
                chunks,
                trailers,
            } => {
                let body: Vec<u8> = chunks.iter().flat_map(|(_, c)| c.to_vec()).collect();
                (pairs(&headers), body, trailers.as_ref().map(pairs))
            }
            _ => unreachable!(),
        };
        assert_eq!(
            (
                pairs(&d.headers),
                d.body.to_vec(),
                d.trailers.as_ref().map(pairs)
            ),
            expected,
            "{path}: fake answered off-script"
        );
    }
}

/// `req` answered straight by the fake and through crisp: (direct, through crisp).
async fn direct_and_through(
    fake: &Fake,
    crisp: &Crisp,
    req: &RawRequest,
) -> (RawResponse, RawResponse) {
    let mut raw = Raw::connect(fake.path()).await;
    let direct = within(PATIENCE, "direct", raw.call(req)).await.unwrap();
    let mut raw = Raw::connect(&crisp.path).await;
    let through = within(PATIENCE, "through crisp", raw.call(req))
        .await
        .unwrap();
    (direct, through)
}

fn every_path() -> Vec<String> {
    let mut paths = all_cri_paths();
    paths.extend(UNKNOWN_PATHS.iter().map(|s| s.to_string()));
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cri_method_and_unknown_path_is_forwarded_byte_identical() {
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    assert_identical_both_ways(&fake, &crisp, &every_path()).await;
}

/// Wants to see everything (request, response, completion) and changes nothing: the path the
/// ordering engine and the tap will use.
#[derive(Default)]
struct ObserveAll {
    requests: AtomicUsize,
    responses: AtomicUsize,
    completions: AtomicUsize,
}

impl Interceptor for ObserveAll {
    fn interest(&self, _call: &Call) -> Interest {
        Interest::ALL
    }
    fn on_request<'a>(
        &'a self,
        _call: &'a Call,
        _msg: &'a [u8],
    ) -> crisp::intercept::BoxFuture<'a, crisp::intercept::Verdict> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { crisp::intercept::Verdict::Forward })
    }
    fn on_response(
        &self,
        _call: &Call,
        _req: &[u8],
        _msg: Option<&[u8]>,
        _code: i32,
    ) -> Option<Bytes> {
        self.responses.fetch_add(1, Ordering::SeqCst);
        None
    }
    fn on_complete(&self, _call: &Call, _outcome: &crisp::intercept::Outcome) {
        self.completions.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cri_method_and_unknown_path_is_byte_identical_when_observed() {
    let fake = Fake::start().await;
    let observer = Arc::new(ObserveAll::default());
    let crisp =
        Crisp::start_with(fake.path(), vec![observer.clone()], ProxyOptions::default()).await;
    let paths = every_path();
    assert_identical_both_ways(&fake, &crisp, &paths).await;
    // The unary calls really took the buffered (observed) path.
    let unary = paths
        .iter()
        .filter(|p| {
            crisp::cri::Route::from_path(p)
                .rpc
                .is_some_and(|r| r.kind() != crisp::cri::RpcKind::Streaming)
        })
        .count();
    assert!(unary > 50, "only {unary} unary paths");
    assert_eq!(
        observer.requests.load(Ordering::SeqCst),
        unary,
        "on_request calls"
    );
    // (Known server streams show each message to on_response too.)
    assert!(
        observer.responses.load(Ordering::SeqCst) >= unary,
        "on_response calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20_mib_response_message_passes_intact() {
    use k8s_cri::v1::{
        Container, ContainerMetadata, ImageSpec, ListContainersRequest, ListContainersResponse,
    };
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    let path = "/runtime.v1.RuntimeService/ListContainers";
    let containers: Vec<Container> = (0..20_500)
        .map(|i| Container {
            id: format!("{i:064x}"),
            pod_sandbox_id: format!("{:064x}", i / 3),
            metadata: Some(ContainerMetadata {
                name: format!("container-{i}"),
                attempt: i % 5,
            }),
            image: Some(ImageSpec {
                image: format!("registry.example/image-{i}:{}", "v".repeat(800)),
                ..Default::default()
            }),
            image_ref: format!("sha256:{i:064x}"),
            state: 1,
            created_at: i as i64,
            ..Default::default()
        })
        .collect();
    let expected = ListContainersResponse { containers };
    let msg = expected.encode_to_vec();
    assert!(msg.len() > 20 << 20, "response is only {} bytes", msg.len());
    fake.script(path, move |_| Reply::unary(&msg));

    let mut direct = runtime_client(fake.path()).await;
    let mut via = runtime_client(&crisp.path).await;
    let d = within(
        PATIENCE,
        "direct ListContainers",
        direct.list_containers(ListContainersRequest::default()),
    )
    .await
    .unwrap()
    .into_inner();
    let v = within(
        PATIENCE,
        "ListContainers through crisp",
        via.list_containers(ListContainersRequest::default()),
    )
    .await
    .unwrap()
    .into_inner();
    assert!(d == expected, "direct response differs from the script");
    assert!(
        v == expected,
        "response through crisp differs ({} containers instead of {})",
        v.containers.len(),
        expected.containers.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_request_message_passes_intact() {
    use k8s_cri::v1::{ExecSyncRequest, ExecSyncResponse};
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    let path = "/runtime.v1.RuntimeService/ExecSync";
    let answer = ExecSyncResponse {
        stdout: b"ok".to_vec(),
        stderr: vec![],
        exit_code: 0,
    };
    let answer_bytes = answer.encode_to_vec();
    fake.script(path, move |_| Reply::unary(&answer_bytes));

    let req = ExecSyncRequest {
        container_id: "c".repeat(64),
        cmd: vec!["sh".into(), "-c".into(), "x".repeat(64 << 20)],
        timeout: 10,
    };
    let expected_body = grpc_frame(&req.encode_to_vec());
    assert!(expected_body.len() > 64 << 20);

    let mut direct = runtime_client(fake.path()).await;
    let d = within(PATIENCE, "direct ExecSync", direct.exec_sync(req.clone()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d, answer);
    let up_d = fake.last_with_body(path, &expected_body);
    let mut via = runtime_client(&crisp.path).await;
    let v = within(PATIENCE, "ExecSync through crisp", via.exec_sync(req))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v, answer);
    let up_v = fake.last_with_body(path, &expected_body);
    assert!(up_d.seq != up_v.seq);
    assert!(
        up_d.body == expected_body,
        "direct request arrived altered ({} bytes)",
        up_d.body.len()
    );
    assert!(
        up_v.body == expected_body,
        "request through crisp arrived altered ({} bytes instead of {})",
        up_v.body.len(),
        expected_body.len()
    );
    assert_eq!(pairs(&up_v.headers), pairs(&up_d.headers));
}

/// The daemon's chain watches GetContainerEvents (job mode); with no interceptor the stream is
/// spliced. Both must stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_messages_stream_through_one_by_one() {
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    assert_streams_through(&fake, &crisp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_messages_stream_through_one_by_one_when_spliced() {
    let fake = Fake::start().await;
    let crisp = Crisp::start_with(fake.path(), vec![], ProxyOptions::default()).await;
    assert_streams_through(&fake, &crisp).await;
}

async fn assert_streams_through(fake: &Fake, crisp: &Crisp) {
    use k8s_cri::v1::ContainerEventResponse;
    let path = "/runtime.v1.RuntimeService/GetContainerEvents";
    let (_client, mut stream, tx) = open_events(&crisp.path, fake).await;
    for i in 0..5 {
        let ev = ContainerEventResponse {
            container_id: format!("ctr-{i}"),
            container_event_type: i % 4,
            created_at: 1_700_000_000 + i as i64,
            ..Default::default()
        };
        // The next message is sent only after the client got this one: a buffering proxy would
        // never deliver it and the wait below would time out.
        tx.send(Frame::data(grpc_frame(&ev.encode_to_vec())))
            .unwrap();
        let got = within(
            Duration::from_secs(5),
            &format!(
                "event {i} to reach the client before event {} is sent",
                i + 1
            ),
            stream.message(),
        )
        .await
        .unwrap_or_else(|e| panic!("event {i}: {e}"))
        .unwrap_or_else(|| panic!("stream ended before event {i}"));
        assert_eq!(got, ev);
    }
    tx.send(Frame::trailers(ok_trailers())).unwrap();
    drop(tx);
    let end = within(PATIENCE, "clean end of stream", stream.message()).await;
    assert!(
        matches!(end, Ok(None)),
        "expected a clean end (grpc-status 0), got {end:?}"
    );
    assert_eq!(fake.last(path).end(), End::Completed);
}

/// A server stream's bytes, however the runtime cuts them into DATA frames (a message split over
/// three frames, three messages in one frame, a 300 KiB message), arrive unchanged, trailers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_bytes_are_identical_however_they_are_framed() {
    use k8s_cri::v1::ContainerEventResponse;
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    let path = "/runtime.v1.RuntimeService/GetContainerEvents";
    let ev = |i: usize, pad: usize| {
        let e = ContainerEventResponse {
            container_id: format!("{i:064x}{}", "p".repeat(pad)),
            container_event_type: (i % 4) as i32,
            created_at: i as i64,
            ..Default::default()
        };
        let mut m = e.encode_to_vec();
        pb_bytes(&mut m, 999, b"unknown event field");
        grpc_frame(&m)
    };
    let (m0, m1, m2, m3, big) = (ev(0, 0), ev(1, 10), ev(2, 0), ev(3, 100), ev(4, 300 << 10));
    let mut three = m1.to_vec();
    three.extend_from_slice(&m2);
    three.extend_from_slice(&m3);
    let ms = Duration::from_millis(5);
    let chunks = vec![
        (Duration::ZERO, m0.slice(..3)),
        (ms, m0.slice(3..20)),
        (ms, m0.slice(20..)),
        (ms, Bytes::from(three)),
        (ms, big),
    ];
    let trailers = header_map(&[("grpc-status", b"0"), ("x-events-trailer", b"end")]);
    fake.script(path, move |_| Reply::Full {
        headers: grpc_headers(),
        chunks: chunks.clone(),
        trailers: Some(trailers.clone()),
    });

    let req = RawRequest::grpc(path, b"");
    let (d, v) = direct_and_through(&fake, &crisp, &req).await;
    assert_eq!(pairs(&v.headers), pairs(&d.headers));
    assert!(
        v.body == d.body,
        "stream bytes differ: {} bytes through crisp, {} direct",
        v.body.len(),
        d.body.len()
    );
    assert_eq!(
        v.trailers.as_ref().map(pairs),
        d.trailers.as_ref().map(pairs)
    );
}

/// Even a stream the runtime botches (a message cut short, then an error status or no status at
/// all) reaches the client exactly as the runtime sent it: crisp adds nothing, loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_cut_mid_message_arrives_as_sent() {
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    let path = "/runtime.v1.RuntimeService/GetContainerEvents";
    let whole = grpc_frame(&arbitrary_message("event"));
    let mut body = whole.to_vec();
    body.extend_from_slice(&whole[..9]);
    let body = Bytes::from(body);
    let error = header_map(&[
        ("grpc-status", b"13"),
        ("grpc-message", b"event%20encoder%20failed"),
    ]);
    for trailers in [Some(error), None] {
        let what = if trailers.is_some() {
            "with an error status"
        } else {
            "without trailers"
        };
        fake.reply_once(
            path,
            Reply::Full {
                headers: grpc_headers(),
                chunks: vec![(Duration::ZERO, body.clone())],
                trailers: trailers.clone(),
            },
        );
        fake.reply_once(
            path,
            Reply::Full {
                headers: grpc_headers(),
                chunks: vec![(Duration::ZERO, body.clone())],
                trailers,
            },
        );
        let req = RawRequest::grpc(path, b"");
        let (d, v) = direct_and_through(&fake, &crisp, &req).await;
        assert_eq!(d.body, body, "{what}: the fake sent something else");
        assert_eq!(v.body, d.body, "{what}: stream bytes");
        assert_eq!(
            v.trailers.as_ref().map(pairs),
            d.trailers.as_ref().map(pairs),
            "{what}: trailers"
        );
    }
}

/// `grpc-status-details-bin`: a google.rpc.Status {code 5, message, details [Any]} in base64.
fn status_details() -> (Vec<u8>, Vec<u8>) {
    let mut any = Vec::new();
    pb_bytes(&mut any, 1, b"type.googleapis.com/google.rpc.ResourceInfo");
    pb_bytes(&mut any, 2, b"\x0a\x09container\x12\x03abc");
    let mut st = Vec::new();
    pb_uint(&mut st, 1, 5);
    pb_bytes(&mut st, 2, b"container \"abc\" not found");
    pb_bytes(&mut st, 3, &any);
    let b64 = base64_nopad(&st);
    (st, b64)
}

fn base64_nopad(data: &[u8]) -> Vec<u8> {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    for chunk in data.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (*b as u32) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize]);
        }
    }
    out
}

fn error_status_fields() -> Vec<(&'static str, Vec<u8>)> {
    let (_, details) = status_details();
    vec![
        ("grpc-status", b"5".to_vec()),
        (
            "grpc-message",
            b"container%20%22abc%22%20not%20found%3A%20%E2%9C%97".to_vec(),
        ),
        ("grpc-status-details-bin", details),
    ]
}

async fn assert_error_verbatim(fake: &Fake, crisp: &Crisp, path: &str) {
    let req = RawRequest::grpc(path, &arbitrary_message("error"));
    let (d, v) = direct_and_through(fake, crisp, &req).await;
    assert_eq!(v.status, d.status);
    assert_eq!(pairs(&v.headers), pairs(&d.headers), "response headers");
    assert_eq!(v.body, d.body, "response body");
    assert_eq!(
        v.trailers.as_ref().map(pairs),
        d.trailers.as_ref().map(pairs),
        "trailers"
    );
    assert_eq!(v.grpc_status(), Some("5"));

    // And a kubelet-like client decodes the same status both ways.
    let (details, _) = status_details();
    for sock in [fake.path(), crisp.path.as_path()] {
        let mut c = runtime_client(sock).await;
        let e = c
            .container_status(k8s_cri::v1::ContainerStatusRequest {
                container_id: "abc".into(),
                verbose: false,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::NotFound, "{}", sock.display());
        assert_eq!(
            e.message(),
            "container \"abc\" not found: ✗",
            "{}",
            sock.display()
        );
        assert_eq!(e.details(), &details[..], "{}", sock.display());
    }
}

/// The runtime answers ContainerStatus with an error status with details, put into a reply by
/// `reply` (headers or trailers); it must arrive verbatim through crisp. The raw answer crisp gave.
async fn error_with_details_through_crisp(
    reply: impl Fn(HeaderMap) -> Reply + Send + Sync + 'static,
) -> RawResponse {
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    let path = "/runtime.v1.RuntimeService/ContainerStatus";
    fake.script(path, move |_| {
        let mut status = HeaderMap::new();
        for (k, v) in error_status_fields() {
            status.append(k, v.try_into().unwrap());
        }
        reply(status)
    });
    assert_error_verbatim(&fake, &crisp, path).await;
    Raw::connect(&crisp.path)
        .await
        .call(&RawRequest::grpc(path, b""))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_only_error_with_details_arrives_verbatim() {
    let v = error_with_details_through_crisp(|status| {
        let mut h: HeaderMap = grpc_headers();
        for (k, v) in &status {
            h.append(k, v.clone());
        }
        Reply::TrailersOnly(h)
    })
    .await;
    // Still trailers-only through crisp: one HEADERS frame, no body, no trailers.
    assert!(
        v.trailers.is_none() && v.body.is_empty(),
        "trailers-only answer was reshaped: {v:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_status_with_details_in_trailers_after_headers_arrives_verbatim() {
    let v = error_with_details_through_crisp(|status| Reply::Full {
        headers: grpc_headers(),
        chunks: vec![],
        trailers: Some(status),
    })
    .await;
    assert!(
        v.headers.get("grpc-status").is_none() && v.trailers.is_some(),
        "status moved out of the trailers: {v:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_deadline_reaches_upstream_as_sent() {
    use k8s_cri::v1::VersionRequest;
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    let path = "/runtime.v1.RuntimeService/Version";
    let mut timeouts = Vec::new();
    for sock in [fake.path(), crisp.path.as_path()] {
        let mut c = runtime_client(sock).await;
        let msg = VersionRequest {
            version: "0.1.0".into(),
        };
        let body = grpc_frame(&msg.encode_to_vec());
        let mut req = tonic::Request::new(msg);
        req.set_timeout(Duration::from_secs(3));
        within(PATIENCE, "Version", c.version(req)).await.unwrap();
        let rec = fake.last_with_body(path, &body);
        timeouts.push(
            rec.headers
                .get("grpc-timeout")
                .map(|v| v.as_bytes().to_vec()),
        );
    }
    let direct = timeouts[0].clone().expect("tonic sent no grpc-timeout");
    assert_eq!(
        timeouts[1].as_deref(),
        Some(&direct[..]),
        "grpc-timeout upstream differs from what the client sent"
    );
    let parsed = crisp::status::parse_grpc_timeout(&direct).unwrap();
    assert_eq!(parsed, Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_calls_all_succeed_with_their_own_answers() {
    use k8s_cri::v1::{ContainerStatus, ContainerStatusRequest, ContainerStatusResponse};
    const N: usize = 1000;
    let fake = Fake::start().await;
    let crisp = Crisp::start(fake.path()).await;
    let path = "/runtime.v1.RuntimeService/ContainerStatus";
    // The fake answers nobody until all N calls are in flight at once.
    type Waiting = Vec<(tokio::sync::oneshot::Sender<Reply>, Reply)>;
    let waiting: Arc<Mutex<Waiting>> = Arc::default();
    let w = waiting.clone();
    fake.script(path, move |rec| {
        let req = ContainerStatusRequest::decode(rec.message()).unwrap();
        let resp = ContainerStatusResponse {
            status: Some(ContainerStatus {
                id: req.container_id.clone(),
                message: format!("status of {}", req.container_id),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (held, tx) = Reply::after();
        let mut w = w.lock().unwrap();
        w.push((tx, Reply::unary(&resp.encode_to_vec())));
        if w.len() == N {
            for (tx, r) in w.drain(..) {
                let _ = tx.send(r);
            }
        }
        held
    });

    let client = runtime_client(&crisp.path).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let mut c = client.clone();
        tasks.spawn(async move {
            let id = format!("ctr-{i:04}");
            let r = c
                .container_status(ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await;
            (id, r)
        });
    }
    let mut ok = 0;
    within(Duration::from_secs(20), "1000 concurrent calls", async {
        while let Some(res) = tasks.join_next().await {
            let (id, r) = res.unwrap();
            let st = r
                .unwrap_or_else(|e| panic!("{id}: {e}"))
                .into_inner()
                .status
                .unwrap();
            assert_eq!(st.id, id);
            assert_eq!(st.message, format!("status of {id}"));
            ok += 1;
        }
    })
    .await;
    assert_eq!(ok, N);
    assert_eq!(fake.calls_to(path).len(), N);
}

/// Observes ListContainers only: on a relayed connection that call is diverted through crisp's
/// observed path while everything else is relayed frame by frame on the same client connection.
#[derive(Default)]
struct ObserveListContainers {
    completions: AtomicUsize,
}

impl Interceptor for ObserveListContainers {
    fn interest(&self, call: &Call) -> Interest {
        match call.route.rpc {
            Some(crisp::cri::Rpc::ListContainers) => Interest::ALL,
            _ => Interest::NONE,
        }
    }
    fn on_request<'a>(
        &'a self,
        _call: &'a Call,
        _msg: &'a [u8],
    ) -> crisp::intercept::BoxFuture<'a, crisp::intercept::Verdict> {
        Box::pin(async { crisp::intercept::Verdict::Forward })
    }
    fn on_complete(&self, _call: &Call, _outcome: &crisp::intercept::Outcome) {
        self.completions.fetch_add(1, Ordering::SeqCst);
    }
}

/// Both big responses exhaust the client's connection window many times over: crisp's writes
/// on the diverted stream and the runtime's on the relayed one must share it without either
/// overrunning it (the client would fail the connection) or stalling (the test would time out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diverted_and_relayed_big_responses_share_one_client_connection() {
    use k8s_cri::v1::{
        Container, ListContainersRequest, ListContainersResponse, ListPodSandboxRequest,
        ListPodSandboxResponse, PodSandbox, VersionRequest, VersionResponse,
    };
    const VERSION_PATH: &str = "/runtime.v1.RuntimeService/Version";
    let fake = Fake::start().await;
    let observer = Arc::new(ObserveListContainers::default());
    let crisp =
        Crisp::start_with(fake.path(), vec![observer.clone()], ProxyOptions::default()).await;
    let containers = ListContainersResponse {
        containers: (0..40_000)
            .map(|i| Container {
                id: format!("{i:064x}"),
                image_ref: "x".repeat(400),
                ..Default::default()
            })
            .collect(),
    };
    let sandboxes = ListPodSandboxResponse {
        items: (0..40_000)
            .map(|i| PodSandbox {
                id: format!("{i:064x}"),
                runtime_handler: "y".repeat(400),
                ..Default::default()
            })
            .collect(),
    };
    let (c, s) = (containers.encode_to_vec(), sandboxes.encode_to_vec());
    assert!(c.len() > 16 << 20 && s.len() > 16 << 20);
    fake.script("/runtime.v1.RuntimeService/ListContainers", move |_| {
        Reply::unary(&c)
    });
    fake.script("/runtime.v1.RuntimeService/ListPodSandbox", move |_| {
        Reply::unary(&s)
    });
    let answer = VersionResponse {
        version: "0.1.0".into(),
        runtime_name: "fake".into(),
        ..Default::default()
    };
    let a = answer.encode_to_vec();
    fake.script(VERSION_PATH, move |_| Reply::unary(&a));

    let client = runtime_client(&crisp.path).await;
    let (mut c1, mut c2, mut c3) = (client.clone(), client.clone(), client);
    let diverted = async move {
        c1.list_containers(ListContainersRequest::default())
            .await
            .map(|r| r.into_inner())
    };
    let relayed = async move {
        c2.list_pod_sandbox(ListPodSandboxRequest::default())
            .await
            .map(|r| r.into_inner())
    };
    let small = async move {
        for i in 0..200 {
            let v = c3
                .version(VersionRequest {
                    version: "0.1.0".into(),
                })
                .await
                .unwrap_or_else(|e| panic!("Version #{i}: {e}"));
            assert_eq!(v.into_inner().runtime_name, "fake");
        }
    };
    let (d, r, ()) = within(PATIENCE, "two big responses and 200 small calls", async {
        tokio::join!(diverted, relayed, small)
    })
    .await;
    assert!(
        d.unwrap() == containers,
        "the diverted ListContainers response differs"
    );
    assert!(
        r.unwrap() == sandboxes,
        "the relayed ListPodSandbox response differs"
    );
    assert_eq!(
        observer.completions.load(Ordering::SeqCst),
        1,
        "ListContainers was not observed (diverted) exactly once"
    );
}

/// The same with a client whose connection window is the HTTP/2 default (64 KiB) and whose
/// streams' windows are larger: every byte crisp writes on the diverted stream is one the
/// runtime may not, and the client fails the connection (FLOW_CONTROL_ERROR) if the sum ever
/// exceeds what it granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_client_connection_window_is_never_overrun() {
    use k8s_cri::v1::{ListContainersRequest, ListPodSandboxRequest};
    let fake = Fake::start().await;
    let observer = Arc::new(ObserveListContainers::default());
    let crisp =
        Crisp::start_with(fake.path(), vec![observer.clone()], ProxyOptions::default()).await;
    let big = |tag: u8| grpc_frame(&vec![tag; 4 << 20]);
    let (c, s) = (big(b'c'), big(b's'));
    let (c2, s2) = (c.clone(), s.clone());
    fake.script("/runtime.v1.RuntimeService/ListContainers", move |_| {
        Reply::Full {
            headers: grpc_headers(),
            chunks: vec![(Duration::ZERO, c2.clone())],
            trailers: Some(ok_trailers()),
        }
    });
    fake.script("/runtime.v1.RuntimeService/ListPodSandbox", move |_| {
        Reply::Full {
            headers: grpc_headers(),
            chunks: vec![(Duration::ZERO, s2.clone())],
            trailers: Some(ok_trailers()),
        }
    });

    let io = tokio::net::UnixStream::connect(&crisp.path).await.unwrap();
    let mut b = h2::client::Builder::new();
    b.initial_window_size(8 << 20)
        .initial_connection_window_size(65_535);
    let (send, conn) = b.handshake::<_, Bytes>(io).await.unwrap();
    let conn = tokio::spawn(conn);
    let fetch = |path: &str, msg: Vec<u8>| {
        let req = RawRequest::grpc(path, &msg);
        let mut send = send.clone();
        async move {
            let resp = send_raw(&mut send, &req)
                .await
                .map_err(|e| e.to_string())?
                .await
                .map_err(|e| e.to_string())?;
            let mut body = resp.into_body();
            let mut got = Vec::new();
            while let Some(d) = body.data().await {
                let d = d.map_err(|e| e.to_string())?;
                let _ = body.flow_control().release_capacity(d.len());
                got.extend_from_slice(&d);
            }
            Ok::<_, String>(got)
        }
    };
    let d = fetch(
        "/runtime.v1.RuntimeService/ListContainers",
        ListContainersRequest::default().encode_to_vec(),
    );
    let r = fetch(
        "/runtime.v1.RuntimeService/ListPodSandbox",
        ListPodSandboxRequest::default().encode_to_vec(),
    );
    let (d, r) = within(
        PATIENCE,
        "two 4 MiB responses through a 64 KiB connection window",
        async { tokio::join!(d, r) },
    )
    .await;
    assert!(
        d.as_deref() == Ok(&c[..]),
        "diverted response: {:?}",
        d.map(|v| v.len())
    );
    assert!(
        r.as_deref() == Ok(&s[..]),
        "relayed response: {:?}",
        r.map(|v| v.len())
    );
    assert_eq!(
        observer.completions.load(Ordering::SeqCst),
        1,
        "ListContainers was not diverted"
    );
    drop(send);
    conn.abort();
}
