//! The unary calls through tonic against a fake runtime pool: what must not change from the
//! hand-built client they replaced (issue #36).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use prost::Message;

use super::pool_service::Runtime;
use super::*;
use crate::cri::wire;
use crate::proxy::body::ProxyBody;
use crate::proxy::runtime_pool::RuntimePoolError;

/// An answer body: its frames, in order.
struct Frames(VecDeque<Frame<Bytes>>);

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// What the fake runtime answers.
#[derive(Clone)]
enum Reply {
    /// Response headers, then data frames, then trailers if any.
    Answer(Box<(HeaderMap, Vec<Bytes>, Option<HeaderMap>)>),
    /// The pool's error for the call.
    ConnectTimeout,
    /// Nothing, ever.
    Hold,
}

/// A request as the fake runtime got it: its head, and whether its body was buffered.
struct Seen {
    parts: http::request::Parts,
    buffered: Option<Bytes>,
}

#[derive(Clone)]
struct Fake {
    reply: Reply,
    /// Replies by method (the path's last segment, or the whole path), before `reply`.
    by_method: Vec<(&'static str, Reply)>,
    seen: Arc<parking_lot::Mutex<Vec<Seen>>>,
}

impl Fake {
    fn new(reply: Reply) -> Fake {
        Fake {
            reply,
            by_method: Vec::new(),
            seen: Arc::default(),
        }
    }

    /// The paths of the requests the fake got, in order.
    fn paths(&self) -> Vec<String> {
        self.seen
            .lock()
            .iter()
            .map(|s| s.parts.uri.path().to_string())
            .collect()
    }

    /// The one request the fake got.
    fn request(&self) -> Seen {
        let mut seen = self.seen.lock();
        assert_eq!(seen.len(), 1, "one request");
        seen.remove(0)
    }
}

impl Runtime for Fake {
    type Body = Frames;

    async fn send(&self, req: Request<ProxyBody>) -> Result<Response<Frames>, RuntimePoolError> {
        let (parts, body) = req.into_parts();
        let buffered = match body {
            ProxyBody::Buffered { data, .. } => Some(data.unwrap_or_default()),
            _ => None,
        };
        let path = parts.uri.path().to_string();
        let method = path.rsplit('/').next().unwrap_or("").to_string();
        self.seen.lock().push(Seen { parts, buffered });
        let reply = self
            .by_method
            .iter()
            .find(|(m, _)| *m == method || *m == path)
            .map_or(&self.reply, |(_, r)| r);
        match reply.clone() {
            Reply::Answer(answer) => {
                let (headers, data, trailers) = *answer;
                let mut frames: VecDeque<_> = data.into_iter().map(Frame::data).collect();
                frames.extend(trailers.map(Frame::trailers));
                let mut resp = Response::new(Frames(frames));
                *resp.headers_mut() = headers;
                Ok(resp)
            }
            Reply::ConnectTimeout => Err(RuntimePoolError::ConnectTimeout {
                path: "/run/containerd/containerd.sock".into(),
                timeout: Duration::from_secs(3),
            }),
            Reply::Hold => std::future::pending().await,
        }
    }
}

fn grpc_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", HeaderValue::from_static("application/grpc"));
    h
}

fn status(code: &'static str, message: &'static str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from_static(code));
    if !message.is_empty() {
        h.insert("grpc-message", HeaderValue::from_static(message));
    }
    h
}

/// An answer: its headers, data frames and trailers.
fn answer(headers: HeaderMap, data: Vec<Bytes>, trailers: Option<HeaderMap>) -> Reply {
    Reply::Answer(Box::new((headers, data, trailers)))
}

/// An answer of `messages` (each framed) and an OK status.
fn ok(messages: &[&[u8]]) -> Reply {
    answer(
        grpc_headers(),
        messages.iter().map(|m| wire::frame(m)).collect(),
        Some(status("0", "")),
    )
}

async fn version(fake: &Fake, timeout: Duration) -> Result<VersionResponse, ClientError> {
    let req = VersionRequest {
        version: "v1".into(),
    };
    unary(
        fake.clone(),
        OwnCall::new(ApiVersion::V1, "Version", req, timeout),
    )
    .await
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn an_ok_answer_without_a_message_is_the_default_message() {
    // No data frame at all, the OK status in the trailers (tonic's `unary` would answer
    // "Missing response message").
    let fake = Fake::new(ok(&[]));
    assert_eq!(
        version(&fake, SECOND).await.unwrap(),
        VersionResponse::default()
    );
    // An empty message, framed: the same.
    let fake = Fake::new(ok(&[b""]));
    assert_eq!(
        version(&fake, SECOND).await.unwrap(),
        VersionResponse::default()
    );
    // A message is decoded.
    let v = VersionResponse {
        runtime_name: "containerd".into(),
        ..Default::default()
    };
    let fake = Fake::new(ok(&[&v.encode_to_vec()]));
    assert_eq!(version(&fake, SECOND).await.unwrap(), v);
    // Two are refused.
    let fake = Fake::new(ok(&[&v.encode_to_vec(), &v.encode_to_vec()]));
    let r = version(&fake, SECOND).await;
    assert!(matches!(r, Err(ClientError::Malformed { .. })), "{r:?}");
}

#[tokio::test]
async fn a_pool_error_stays_typed() {
    let fake = Fake::new(Reply::ConnectTimeout);
    let r = version(&fake, SECOND).await;
    assert!(
        matches!(
            &r,
            Err(ClientError::RuntimePool(RuntimePoolError::ConnectTimeout { timeout, .. }))
                if *timeout == Duration::from_secs(3)
        ),
        "{r:?}"
    );
}

#[tokio::test]
async fn answers_up_to_64_mib_decode() {
    // 5 MiB: over tonic's default 4 MiB, a node's ListContainers can be that large.
    let big = k8s_cri::v1::ListContainersResponse {
        containers: vec![k8s_cri::v1::Container {
            id: "c1".into(),
            labels: [("big".to_string(), "x".repeat(5 << 20))].into(),
            ..Default::default()
        }],
    }
    .encode_to_vec();
    let fake = Fake::new(ok(&[&big]));
    let req = views::ListContainersRequest { filter: None };
    let resp: views::ListContainersResponse = unary(
        fake,
        OwnCall::new(ApiVersion::V1, "ListContainers", req, SECOND),
    )
    .await
    .unwrap();
    assert_eq!(resp.containers.len(), 1);
    assert_eq!(resp.containers[0].id, "c1");
    // A message announced past 64 MiB is refused from its prefix, before its bytes are held.
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&(u32::try_from(MAX_ANSWER).unwrap() + 1).to_be_bytes());
    let fake = Fake::new(answer(
        grpc_headers(),
        vec![Bytes::from(prefix), Bytes::from_static(&[0; 64])],
        Some(status("0", "")),
    ));
    let r = version(&fake, SECOND).await;
    assert!(matches!(r, Err(ClientError::Malformed { .. })), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn the_runtime_is_told_the_deadline_and_crisp_keeps_it() {
    let fake = Fake::new(Reply::Hold);
    let r = version(&fake, Duration::from_millis(1500)).await;
    assert!(
        matches!(
            r,
            Err(ClientError::Timeout {
                method: "Version",
                timeout
            }) if timeout == Duration::from_millis(1500)
        ),
        "{r:?}"
    );
    let seen = fake.request();
    let h = &seen.parts.headers;
    assert_eq!(h["grpc-timeout"], "1500m");
    assert_eq!(h["user-agent"], USER_AGENT);
    assert!(USER_AGENT.starts_with("crisp/"));
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["te"], "trailers");
    assert_eq!(
        seen.parts.uri,
        "http://localhost/runtime.v1.RuntimeService/Version"
    );
    // The request is one framed message, buffered: the pool may send it again after the
    // runtime refused the stream unprocessed.
    let want = VersionRequest {
        version: "v1".into(),
    };
    assert_eq!(
        seen.buffered,
        Some(wire::frame(&want.encode_to_vec())),
        "request body"
    );
    // v1alpha2's path.
    let fake = Fake::new(ok(&[]));
    let req = VersionRequest::default();
    let _: VersionResponse = unary(
        fake.clone(),
        OwnCall::new(ApiVersion::V1alpha2, "Version", req, SECOND),
    )
    .await
    .unwrap();
    assert_eq!(
        fake.request().parts.uri.path(),
        "/runtime.v1alpha2.RuntimeService/Version"
    );
}

#[tokio::test]
async fn a_non_ok_status_is_the_runtimes_code_and_message() {
    // In the trailers, after the headers.
    let fake = Fake::new(answer(
        grpc_headers(),
        vec![],
        Some(status("5", "container%20%22c1%22 not found")),
    ));
    let r = version(&fake, SECOND).await;
    match &r {
        Err(e @ ClientError::Status { method, status }) => {
            assert_eq!(*method, "Version");
            assert_eq!(status.code, 5);
            assert_eq!(status.message, "container \"c1\" not found");
            assert!(e.is_not_found());
        }
        r => panic!("{r:?}"),
    }
    // Trailers-only: the status in the headers.
    let mut headers = grpc_headers();
    headers.extend(status("14", "runtime%20busy"));
    let fake = Fake::new(answer(headers, vec![], None));
    let r = version(&fake, SECOND).await;
    assert!(
        matches!(&r, Err(ClientError::Status { status, .. }) if status.code == 14 && status.message == "runtime busy"),
        "{r:?}"
    );
    // The message is bounded as every grpc-message crisp reads.
    let long: &'static str = Box::leak("x".repeat(5000).into_boxed_str());
    let fake = Fake::new(answer(grpc_headers(), vec![], Some(status("13", long))));
    let r = version(&fake, SECOND).await;
    assert!(
        matches!(&r, Err(ClientError::Status { status, .. })
            if status.message.len() <= crate::status::MAX_SEEN_MESSAGE + '…'.len_utf8()),
        "{r:?}"
    );
    // A status details header that is not base64 (tonic 0.14.9 panics reading one) is dropped.
    let mut trailers = status("9", "no");
    trailers.insert("grpc-status-details-bin", HeaderValue::from_static("%%%"));
    let fake = Fake::new(answer(grpc_headers(), vec![], Some(trailers)));
    let r = version(&fake, SECOND).await;
    assert!(
        matches!(&r, Err(ClientError::Status { status, .. }) if status.code == 9),
        "{r:?}"
    );
    let mut trailers = status("0", "");
    trailers.insert("grpc-status-details-bin", HeaderValue::from_static("%%%"));
    let fake = Fake::new(answer(grpc_headers(), vec![], Some(trailers)));
    assert_eq!(
        version(&fake, SECOND).await.unwrap(),
        VersionResponse::default()
    );
    // No grpc-status at all: malformed, not an answer.
    let fake = Fake::new(answer(grpc_headers(), vec![wire::frame(b"")], None));
    let r = version(&fake, SECOND).await;
    assert!(matches!(r, Err(ClientError::Malformed { .. })), "{r:?}");
}

fn containers(ids: &[&str]) -> Vec<u8> {
    k8s_cri::v1::ListContainersResponse {
        containers: ids
            .iter()
            .map(|id| k8s_cri::v1::Container {
                id: id.to_string(),
                pod_sandbox_id: "sb".into(),
                ..Default::default()
            })
            .collect(),
    }
    .encode_to_vec()
}

async fn list(fake: &Fake, dials: u64, streams: &Streams, version: ApiVersion) -> Vec<String> {
    let filter = views::ContainerFilter {
        pod_sandbox_id: "sb".into(),
        ..Default::default()
    };
    list_containers(
        fake.clone(),
        dials,
        streams,
        version,
        Some(filter),
        Duration::from_secs(5),
    )
    .await
    .unwrap()
    .into_iter()
    .map(|c| c.id)
    .collect()
}

/// Issue #45 item 4: where the runtime serves StreamContainers (KEP-5825), crisp's own list is
/// its chunks, in order, in one call; ListContainers is not called.
#[tokio::test]
async fn containers_are_listed_with_the_stream_where_the_runtime_has_it() {
    let (a, b, c) = (
        containers(&["c1", "c2"]),
        containers(&[]),
        containers(&["c3"]),
    );
    let mut fake = Fake::new(ok(&[]));
    fake.by_method = vec![("StreamContainers", ok(&[&a, &b, &c]))];
    let streams = Streams::default();
    assert_eq!(
        list(&fake, 1, &streams, ApiVersion::V1).await,
        ["c1", "c2", "c3"]
    );
    assert_eq!(
        fake.paths(),
        ["/runtime.v1.RuntimeService/StreamContainers"]
    );
    // The filter went with it: StreamContainersRequest has ListContainersRequest's shape.
    let req = fake.seen.lock()[0].buffered.clone().unwrap();
    let Some(wire::Frame::Message(m)) = wire::single_message(&req) else {
        panic!("one message")
    };
    let sent = views::ListContainersRequest::decode(m).unwrap();
    assert_eq!(sent.filter.unwrap().pod_sandbox_id, "sb");
    // Again: the stream again.
    list(&fake, 1, &streams, ApiVersion::V1).await;
    assert_eq!(fake.paths().len(), 2);
    assert!(fake
        .paths()
        .iter()
        .all(|p| p.ends_with("/StreamContainers")));
}

/// A runtime without the stream (containerd 1.6/1.7/2.x today) answers UNIMPLEMENTED: crisp
/// lists with ListContainers, and keeps to it until the pool dials the runtime again.
#[tokio::test]
async fn without_the_stream_crisp_falls_back_and_remembers_until_the_next_dial() {
    let listed = containers(&["c9"]);
    let mut fake = Fake::new(ok(&[&listed]));
    fake.by_method = vec![(
        "StreamContainers",
        answer(
            grpc_headers(),
            vec![],
            Some(status("12", "unknown method StreamContainers")),
        ),
    )];
    let streams = Streams::default();
    let v1 = |m: &str| format!("/runtime.v1.RuntimeService/{m}");
    assert_eq!(list(&fake, 1, &streams, ApiVersion::V1).await, ["c9"]);
    assert_eq!(fake.paths(), [v1("StreamContainers"), v1("ListContainers")]);
    // Remembered: ListContainers only.
    assert_eq!(list(&fake, 1, &streams, ApiVersion::V1).await, ["c9"]);
    assert_eq!(fake.paths().len(), 3);
    assert_eq!(fake.paths()[2], v1("ListContainers"));
    // The pool dialed again (a restarted runtime): the stream is tried once more.
    assert_eq!(list(&fake, 2, &streams, ApiVersion::V1).await, ["c9"]);
    assert_eq!(
        fake.paths()[3..],
        [v1("StreamContainers"), v1("ListContainers")]
    );
    // v1alpha2 has no streams: ListContainers straight away.
    let fake = Fake::new(ok(&[&listed]));
    let streams = Streams::default();
    assert_eq!(list(&fake, 1, &streams, ApiVersion::V1alpha2).await, ["c9"]);
    assert_eq!(
        fake.paths(),
        ["/runtime.v1alpha2.RuntimeService/ListContainers"]
    );
}

/// Any other error of the stream is the list's error: no fallback that would hide it.
#[tokio::test]
async fn a_failed_stream_is_an_error_not_a_fallback() {
    let mut fake = Fake::new(ok(&[&containers(&["c9"])]));
    let part = containers(&["c1"]);
    fake.by_method = vec![(
        "StreamContainers",
        answer(
            grpc_headers(),
            vec![wire::frame(&part)],
            Some(status("14", "runtime going away")),
        ),
    )];
    let streams = Streams::default();
    let err = list_containers(
        fake.clone(),
        1,
        &streams,
        ApiVersion::V1,
        None,
        Duration::from_secs(5),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ClientError::Status { method: "StreamContainers", status } if status.code == 14),
        "{err}"
    );
    assert_eq!(fake.paths().len(), 1);
}

/// Issue #46: the tap's snapshot asks what kubelet's handshake asks — ImageFsInfo of the
/// ImageService — and keeps each answer as it came, a field crisp's types do not know included;
/// a call that fails is in the list with its error, the others still asked.
#[tokio::test]
async fn the_snapshot_asks_the_handshake_and_keeps_the_answers_whole() {
    let mut version = VersionResponse {
        runtime_name: "containerd".into(),
        runtime_api_version: "v1".into(),
        ..Default::default()
    }
    .encode_to_vec();
    // Field 99, a string: no CRI revision crisp knows has it.
    version.extend_from_slice(&[0x9a, 0x06, 0x03, b'n', b'e', b'w']);
    let fs = k8s_cri::v1::ImageFsInfoResponse {
        image_filesystems: vec![k8s_cri::v1::FilesystemUsage {
            timestamp: 7,
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec();
    let mut fake = Fake::new(ok(&[b""]));
    fake.by_method = vec![
        ("Version", ok(&[&version])),
        (
            "RuntimeConfig",
            answer(grpc_headers(), vec![], Some(status("12", "unknown method"))),
        ),
        ("ImageFsInfo", ok(&[&fs])),
    ];
    let calls = raw::snapshot(fake.clone(), SECOND).await;
    let paths: Vec<&str> = calls.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/runtime.v1.RuntimeService/Version",
            "/runtime.v1.RuntimeService/RuntimeConfig",
            "/runtime.v1.RuntimeService/Status",
            "/runtime.v1.ImageService/ImageFsInfo",
        ]
    );
    let mut asked = fake.paths();
    asked.sort();
    let mut want: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
    want.sort();
    assert_eq!(asked, want, "what the runtime was asked");
    assert_eq!(calls[0].answer.as_deref().ok(), Some(&version[..]));
    let want_request = VersionRequest {
        version: "v1".into(),
    };
    assert_eq!(calls[0].request, want_request.encode_to_vec());
    assert!(
        matches!(&calls[1].answer, Err(e) if e.is_unimplemented()),
        "{:?}",
        calls[1].answer
    );
    assert_eq!(calls[1].answer.as_ref().unwrap_err().status().code, 12);
    assert_eq!(calls[2].answer.as_deref().ok(), Some(&b""[..]));
    assert_eq!(calls[3].answer.as_deref().ok(), Some(&fs[..]));
}

/// A runtime without runtime.v1 (the one kubelet would negotiate down to): the snapshot is
/// asked in v1alpha2, and holds v1alpha2's Version, not v1's refusal.
#[tokio::test]
async fn the_snapshot_negotiates_v1alpha2_as_kubelet_does() {
    let unimplemented = answer(grpc_headers(), vec![], Some(status("12", "")));
    let mut fake = Fake::new(unimplemented.clone());
    let old = VersionResponse {
        runtime_api_version: "v1alpha2".into(),
        ..Default::default()
    }
    .encode_to_vec();
    fake.by_method = vec![
        ("/runtime.v1alpha2.RuntimeService/Version", ok(&[&old])),
        ("/runtime.v1alpha2.RuntimeService/Status", ok(&[b""])),
        ("/runtime.v1alpha2.ImageService/ImageFsInfo", ok(&[b""])),
    ];
    let calls = raw::snapshot(fake, SECOND).await;
    let paths: Vec<&str> = calls.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/runtime.v1alpha2.RuntimeService/Version",
            "/runtime.v1alpha2.RuntimeService/RuntimeConfig",
            "/runtime.v1alpha2.RuntimeService/Status",
            "/runtime.v1alpha2.ImageService/ImageFsInfo",
        ]
    );
    assert_eq!(calls[0].answer.as_deref().ok(), Some(&old[..]));
    assert!(calls[1].answer.is_err(), "v1alpha2 has no RuntimeConfig");
    assert!(calls[2].answer.is_ok() && calls[3].answer.is_ok());
}

/// A runtime that never answers: each call gives up at the client's timeout, and the snapshot
/// takes two timeouts in all (Version, then the other three together), never more.
#[tokio::test(start_paused = true)]
async fn a_silent_runtime_bounds_the_snapshot() {
    let fake = Fake::new(Reply::Hold);
    let started = tokio::time::Instant::now();
    let calls = raw::snapshot(fake, SECOND).await;
    assert_eq!(started.elapsed(), 2 * SECOND);
    assert_eq!(calls.len(), 4);
    for c in &calls {
        let status = c.answer.as_ref().unwrap_err().status();
        assert_eq!(
            status.code,
            crate::status::code::DEADLINE_EXCEEDED,
            "{}",
            c.path
        );
        assert!(
            status.message.contains("no answer within"),
            "{}",
            status.message
        );
    }
    // Down altogether: UNAVAILABLE, with the pool's words.
    let calls = raw::snapshot(Fake::new(Reply::ConnectTimeout), SECOND).await;
    let status = calls[0].answer.as_ref().unwrap_err().status();
    assert_eq!(status.code, crate::status::code::UNAVAILABLE);
    assert!(
        status.message.contains("containerd.sock"),
        "{}",
        status.message
    );
}
