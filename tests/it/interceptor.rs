//! The interceptor seam: a call held by an interceptor (as the ordering engine holds an app's
//! CreateContainer) reaches the runtime only when released, with the client's exact bytes; a
//! call whose client gave up while held never reaches it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::support::*;
use crisp::cri::{views, Rpc};
use crisp::intercept::{BoxFuture, Call, Interceptor, Interest, Verdict};
use crisp::proxy::ProxyOptions;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, CreateContainerResponse, ImageSpec,
    KeyValue, PodSandboxConfig, PodSandboxMetadata, VersionRequest,
};

const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";

/// Holds every CreateContainer until the test adds a permit. Reports each held call (a decoded
/// copy of the request) and each hold abandoned before release.
struct Gate {
    seen: mpsc::UnboundedSender<views::CreateContainerRequest>,
    release: Semaphore,
    abandoned: watch::Sender<usize>,
}

struct HoldGuard<'a> {
    gate: &'a Gate,
    released: bool,
}

impl Drop for HoldGuard<'_> {
    fn drop(&mut self) {
        if !self.released {
            self.gate.abandoned.send_modify(|n| *n += 1);
        }
    }
}

impl Interceptor for Gate {
    fn interest(&self, call: &Call) -> Interest {
        match call.route.rpc {
            Some(Rpc::CreateContainer) => Interest {
                request: true,
                ..Interest::NONE
            },
            _ => Interest::NONE,
        }
    }

    fn on_request<'a>(&'a self, _call: &'a Call, msg: &'a [u8]) -> BoxFuture<'a, Verdict> {
        let view = views::decode::<views::CreateContainerRequest>(msg)
            .expect("CreateContainerRequest view");
        Box::pin(async move {
            let mut guard = HoldGuard {
                gate: self,
                released: false,
            };
            self.seen.send(view).unwrap();
            self.release.acquire().await.unwrap().forget();
            guard.released = true;
            Verdict::Forward
        })
    }
}

/// The `n`th abandoned hold is dropped; a release arriving after it forwards nothing, and the
/// runtime (after a round trip through crisp) has seen no CreateContainer: `what` never reached
/// it.
async fn dropped_and_never_forwarded(
    fake: &Fake,
    crisp: &Crisp,
    gate: &Gate,
    abandoned: &mut watch::Receiver<usize>,
    n: usize,
    what: &str,
) {
    let dropped = abandoned.wait_for(|dropped| *dropped == n);
    within(PATIENCE, "the hold to be dropped", dropped)
        .await
        .unwrap();
    gate.release.add_permits(1);
    round_trip(crisp).await;
    assert_eq!(fake.started(CREATE), 0, "the runtime saw {what}");
}

fn gate() -> (
    Arc<Gate>,
    mpsc::UnboundedReceiver<views::CreateContainerRequest>,
    watch::Receiver<usize>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (abandoned, abandoned_rx) = watch::channel(0);
    (
        Arc::new(Gate {
            seen: tx,
            release: Semaphore::new(0),
            abandoned,
        }),
        rx,
        abandoned_rx,
    )
}

fn create_request() -> CreateContainerRequest {
    CreateContainerRequest {
        pod_sandbox_id: "sb-0123456789abcdef".into(),
        config: Some(ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 2,
            }),
            image: Some(ImageSpec {
                image: "docker.io/library/busybox:1.36".into(),
                ..Default::default()
            }),
            command: vec!["sh".into(), "-c".into(), "sleep 3600".into()],
            envs: vec![KeyValue {
                key: "TOKEN".into(),
                value: "s3cr3t".into(),
            }],
            labels: HashMap::from([("io.kubernetes.container.name".into(), "app".into())]),
            annotations: HashMap::from([(
                "io.kubernetes.container.restartCount".into(),
                "2".into(),
            )]),
            ..Default::default()
        }),
        sandbox_config: Some(PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "web-0".into(),
                uid: "uid-1".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            annotations: HashMap::from([("crisp.dev/sidecars".into(), "proxy".into())]),
            ..Default::default()
        }),
    }
}

/// Proves crisp has processed everything sent before: a call through crisp on another
/// connection makes the round trip to the runtime.
async fn round_trip(crisp: &Crisp) {
    let mut c = runtime_client(&crisp.path).await;
    within(
        PATIENCE,
        "a Version round trip",
        c.version(VersionRequest {
            version: "x".into(),
        }),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_create_container_reaches_upstream_only_when_released_with_identical_bytes() {
    let fake = Fake::start().await;
    let answer = CreateContainerResponse {
        container_id: "ctr-created".into(),
    };
    let a = answer.encode_to_vec();
    fake.script(CREATE, move |_| Reply::unary(&a));
    let (gate, mut seen, _) = gate();
    let crisp = Crisp::start_with(fake.path(), vec![gate.clone()], ProxyOptions::default()).await;

    // A kubelet-like client.
    let req = create_request();
    let mut client = runtime_client(&crisp.path).await;
    let r = req.clone();
    let call = tokio::spawn(async move { client.create_container(r).await });
    let view = within(PATIENCE, "the interceptor to hold the call", seen.recv())
        .await
        .unwrap();
    assert_eq!(view.pod_sandbox_id, req.pod_sandbox_id);
    assert_eq!(
        view.config
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()
            .name,
        "app"
    );
    assert_eq!(
        view.sandbox_config.as_ref().unwrap().annotations["crisp.dev/sidecars"],
        "proxy"
    );

    round_trip(&crisp).await;
    assert_eq!(fake.started(CREATE), 0, "the runtime saw a held call");
    assert!(!call.is_finished(), "the held call returned");

    gate.release.add_permits(1);
    let got = within(PATIENCE, "the released call", call)
        .await
        .unwrap()
        .expect("released call failed");
    assert_eq!(got.into_inner(), answer);
    let upstream = fake.last(CREATE);
    assert_eq!(
        upstream.body,
        grpc_frame(&req.encode_to_vec()),
        "bytes upstream differ from the client's"
    );

    // The same client talking to the runtime directly sends the same headers and bytes.
    let mut direct = runtime_client(fake.path()).await;
    direct.create_container(req.clone()).await.unwrap();
    let up_direct = fake.last(CREATE);
    assert_eq!(up_direct.body, upstream.body);
    assert_eq!(pairs(&up_direct.headers), pairs(&upstream.headers));

    // Raw bytes with a field the CRI protos don't have (999): the view drops it, the runtime
    // still gets it.
    let mut msg = req.encode_to_vec();
    pb_bytes(&mut msg, 999, b"from a future CRI");
    let raw_req = RawRequest::grpc(CREATE, &msg);
    let mut raw = Raw::connect(&crisp.path).await;
    let pending = raw.start(&raw_req).await.unwrap();
    let pending = tokio::spawn(read_response(pending));
    within(
        PATIENCE,
        "the interceptor to hold the raw call",
        seen.recv(),
    )
    .await
    .unwrap();
    round_trip(&crisp).await;
    assert_eq!(
        fake.calls_to(CREATE).len(),
        2,
        "the runtime saw a held call"
    );
    gate.release.add_permits(1);
    let resp = within(PATIENCE, "the released raw call", pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.grpc_status(), Some("0"));
    assert_eq!(
        fake.last(CREATE).body,
        raw_req.body,
        "unknown field lost on the way upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_whose_deadline_passes_never_reaches_the_runtime_and_gets_deadline_exceeded() {
    let fake = Fake::start().await;
    let (gate, mut seen, mut abandoned) = gate();
    let crisp = Crisp::start_with(fake.path(), vec![gate.clone()], ProxyOptions::default()).await;

    let mut req = RawRequest::grpc(CREATE, &create_request().encode_to_vec());
    req.headers.insert("grpc-timeout", "300m".parse().unwrap());
    let mut raw = Raw::connect(&crisp.path).await;
    let pending = raw.start(&req).await.unwrap();
    within(PATIENCE, "the interceptor to hold the call", seen.recv())
        .await
        .unwrap();
    let resp = within(
        Duration::from_secs(5),
        "crisp to answer at the deadline",
        read_response(pending),
    )
    .await
    .unwrap();
    assert_eq!(
        resp.grpc_status(),
        Some("4"),
        "expected DEADLINE_EXCEEDED, got {resp:?}"
    );
    // The hold was abandoned, not released; even a release arriving now forwards nothing.
    let past_deadline = "a call whose deadline had passed";
    dropped_and_never_forwarded(&fake, &crisp, &gate, &mut abandoned, 1, past_deadline).await;

    // A kubelet-like client with a deadline: it gives up (tonic enforces the deadline itself and
    // reports its own error, racing crisp's DEADLINE_EXCEEDED) and the call is never forwarded.
    let mut client = runtime_client(&crisp.path).await;
    let mut r = tonic::Request::new(create_request());
    r.set_timeout(Duration::from_millis(300));
    gate.release.forget_permits(1);
    let status = within(
        PATIENCE,
        "tonic call past its deadline",
        client.create_container(r),
    )
    .await
    .unwrap_err();
    assert!(
        status.code() == tonic::Code::DeadlineExceeded
            || (status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired"),
        "{status:?}"
    );
    dropped_and_never_forwarded(&fake, &crisp, &gate, &mut abandoned, 2, past_deadline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_call_the_client_cancels_never_reaches_the_runtime() {
    let fake = Fake::start().await;
    let (gate, mut seen, mut abandoned) = gate();
    let crisp = Crisp::start_with(fake.path(), vec![gate.clone()], ProxyOptions::default()).await;

    let mut client = runtime_client(&crisp.path).await;
    let call = tokio::spawn(async move { client.create_container(create_request()).await });
    within(PATIENCE, "the interceptor to hold the call", seen.recv())
        .await
        .unwrap();
    call.abort();
    let cancelled = "a call its client had cancelled";
    dropped_and_never_forwarded(&fake, &crisp, &gate, &mut abandoned, 1, cancelled).await;
}
