//! The tap's filters select exactly what they say: one scripted sequence of CRI calls (two pods,
//! v1 and v1alpha2, polling and mutating, an error, a slow call, an unknown method) through a
//! running crisp, watched by one admin-API subscriber per filter at the same time.

use std::path::Path;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1alpha2 as alpha;
use prost::Message;

use crate::support::*;
use crisp::admin_api as pb;

const RUN: &str = "/runtime.v1.RuntimeService/RunPodSandbox";
const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
const START: &str = "/runtime.v1.RuntimeService/StartContainer";
const STOP: &str = "/runtime.v1.RuntimeService/StopContainer";
const STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";
const PULL_ALPHA: &str = "/runtime.v1alpha2.ImageService/PullImage";

fn md(ns: &str, name: &str) -> cri::PodSandboxMetadata {
    cri::PodSandboxMetadata {
        name: name.into(),
        namespace: ns.into(),
        uid: format!("uid-{name}"),
        attempt: 0,
    }
}

fn sandbox_config(ns: &str, name: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(md(ns, name)),
        ..Default::default()
    }
}

/// Answers like a runtime: sandbox "sb-<pod>", container "c-<pod>-<name>", a NotFound for one
/// StopContainer and a slow StartContainer for one container.
fn script(fake: &Fake) {
    fake.script(RUN, |rec| {
        let name = sandbox_name(rec);
        Reply::unary(
            &cri::RunPodSandboxResponse {
                pod_sandbox_id: format!("sb-{name}"),
            }
            .encode_to_vec(),
        )
    });
    fake.script(CREATE, |rec| {
        let (pod, name) = container_names(rec);
        Reply::unary(
            &cri::CreateContainerResponse {
                container_id: format!("c-{pod}-{name}"),
            }
            .encode_to_vec(),
        )
    });
    fake.script(START, |rec| {
        let r = cri::StartContainerRequest::decode(rec.message()).unwrap();
        let delay = if r.container_id == "c-dns-coredns" {
            Duration::from_millis(400)
        } else {
            Duration::ZERO
        };
        Reply::Full {
            headers: grpc_headers(),
            chunks: vec![(delay, grpc_frame(&[]))],
            trailers: Some(ok_trailers()),
        }
    });
    fake.script(STOP, |_| {
        Reply::TrailersOnly(header_map(&[
            ("content-type", b"application/grpc"),
            ("grpc-status", b"5"),
            ("grpc-message", b"no such container"),
        ]))
    });
    fake.script(STATUS, |rec| {
        let r = cri::ContainerStatusRequest::decode(rec.message()).unwrap();
        let st = cri::ContainerStatus {
            id: r.container_id,
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        Reply::unary(
            &cri::ContainerStatusResponse {
                status: Some(st),
                info: Default::default(),
            }
            .encode_to_vec(),
        )
    });
    fake.script(PULL_ALPHA, |_| {
        Reply::unary(
            &alpha::PullImageResponse {
                image_ref: "sha256:abc".into(),
            }
            .encode_to_vec(),
        )
    });
}

/// The sequence every subscriber watches. Labels: "<cri version> <method>".
async fn run_sequence(sock: &Path) {
    let mut rt = runtime_client(sock).await;
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(sandbox_config("shop", "web")),
        runtime_handler: String::new(),
    })
    .await
    .unwrap();
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(sandbox_config("kube-system", "dns")),
        runtime_handler: String::new(),
    })
    .await
    .unwrap();
    for (sb, ns, pod, name) in [
        ("sb-web", "shop", "web", "app"),
        ("sb-dns", "kube-system", "dns", "coredns"),
    ] {
        rt.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config(ns, pod)),
        })
        .await
        .unwrap();
    }
    rt.start_container(cri::StartContainerRequest {
        container_id: "c-web-app".into(),
    })
    .await
    .unwrap();
    rt.list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    rt.container_status(cri::ContainerStatusRequest {
        container_id: "c-web-app".into(),
        verbose: false,
    })
    .await
    .unwrap();
    let e = rt
        .stop_container(cri::StopContainerRequest {
            container_id: "c-dns-coredns".into(),
            timeout: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    rt.start_container(cri::StartContainerRequest {
        container_id: "c-dns-coredns".into(),
    })
    .await
    .unwrap();
    let ch = channel(sock).await;
    alpha::runtime_service_client::RuntimeServiceClient::new(ch.clone())
        .version(alpha::VersionRequest {
            version: "0.1.0".into(),
        })
        .await
        .unwrap();
    alpha::image_service_client::ImageServiceClient::new(ch)
        .pull_image(alpha::PullImageRequest {
            image: Some(alpha::ImageSpec {
                image: "busybox:1".into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: Some(alpha::PodSandboxConfig {
                metadata: Some(alpha::PodSandboxMetadata {
                    name: "web".into(),
                    namespace: "shop".into(),
                    uid: "uid-web".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let resp = Raw::connect(sock)
        .await
        .call(&RawRequest::grpc(
            "/runtime.v1.RuntimeService/FutureThing",
            b"",
        ))
        .await
        .unwrap();
    assert_eq!(resp.grpc_status(), Some("0"));
}

const SEQUENCE: &[&str] = &[
    "v1 RunPodSandbox",   // 0  shop/web
    "v1 RunPodSandbox",   // 1  kube-system/dns
    "v1 CreateContainer", // 2  shop/web app
    "v1 CreateContainer", // 3  kube-system/dns coredns
    "v1 StartContainer",  // 4  shop/web app
    "v1 ListContainers",  // 5  polling, no pod
    "v1 ContainerStatus", // 6  polling, shop/web app
    "v1 StopContainer",   // 7  kube-system/dns, NotFound
    "v1 StartContainer",  // 8  kube-system/dns, 400 ms
    "v1alpha2 Version",   // 9  polling
    "v1alpha2 PullImage", // 10 shop/web
    "v1 FutureThing",     // 11 unknown method
];

fn req(f: impl FnOnce(&mut pb::TapRequest)) -> pb::TapRequest {
    let mut r = pb::TapRequest::default();
    f(&mut r);
    r
}

/// The next call event. A method crisp does not know may stream, so its answer shows message by
/// message before its call (docs/TAP.md): the unknown `FutureThing`'s one message is passed
/// over here, and any other message event is a failure.
async fn next_call(s: &mut tonic::Streaming<pb::TapEvent>) -> pb::CallEvent {
    loop {
        match s.message().await.unwrap().and_then(|e| e.event) {
            Some(pb::tap_event::Event::Call(c)) => return c,
            Some(pb::tap_event::Event::Message(m)) if m.method == "FutureThing" => continue,
            Some(pb::tap_event::Event::Dropped(d)) => panic!("unexpected drop marker: {d:?}"),
            Some(pb::tap_event::Event::Hold(h)) => panic!("unexpected hold event: {h:?}"),
            Some(pb::tap_event::Event::Message(m)) => panic!("unexpected message event: {m:?}"),
            None => panic!("tap stream ended"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_select_exactly_what_they_say() {
    let fake = Fake::start().await;
    script(&fake);
    let mut crisp = Daemon::start(fake.path(), |_| {}).await;

    let cases: Vec<(&str, pb::TapRequest, Vec<usize>)> = vec![
        (
            "default: polling hidden",
            req(|_| {}),
            vec![0, 1, 2, 3, 4, 7, 8, 10, 11],
        ),
        (
            "--all",
            req(|r| r.include_polling = true),
            (0..12).collect(),
        ),
        (
            "--method '*Container'",
            req(|r| r.methods = vec!["*Container".into()]),
            vec![2, 3, 4, 7, 8],
        ),
        (
            "--method 'List*' shows a polling call it names",
            req(|r| r.methods = vec!["List*".into()]),
            vec![5],
        ),
        (
            "--method by gRPC path",
            req(|r| r.methods = vec!["/runtime.v1alpha2.*".into()]),
            vec![9, 10],
        ),
        (
            "--method repeated",
            req(|r| r.methods = vec!["Version".into(), "FutureThing".into()]),
            vec![9, 11],
        ),
        (
            "--namespace shop",
            req(|r| r.namespace = "shop".into()),
            vec![0, 2, 4, 10],
        ),
        (
            "--namespace shop --all",
            req(|r| (r.namespace, r.include_polling) = ("shop".into(), true)),
            vec![0, 2, 4, 6, 10],
        ),
        (
            "--pod kube-system/dns",
            req(|r| r.pod = "kube-system/dns".into()),
            vec![1, 3, 7, 8],
        ),
        (
            "--pod web (any namespace)",
            req(|r| r.pod = "web".into()),
            vec![0, 2, 4, 10],
        ),
        ("--errors", req(|r| r.errors_only = true), vec![7]),
        (
            "--errors --namespace shop",
            req(|r| (r.errors_only, r.namespace) = (true, "shop".into())),
            vec![],
        ),
        (
            "--slower-than 300",
            req(|r| r.slower_than_ms = 300),
            vec![8],
        ),
        (
            "--slower-than 300 --all",
            req(|r| (r.slower_than_ms, r.include_polling) = (300, true)),
            vec![8],
        ),
    ];

    let mut streams = Vec::new();
    for (_, r, _) in &cases {
        streams.push(tap_events(&crisp.admin, r.clone()).await);
    }
    run_sequence(&crisp.sock).await;

    for ((name, _, want), stream) in cases.iter().zip(streams.iter_mut()) {
        let mut got = Vec::new();
        for _ in 0..want.len() {
            got.push(within(PATIENCE, &format!("events for {name}"), next_call(stream)).await);
        }
        // Nothing more arrives.
        if let Ok(extra) = tokio::time::timeout(Duration::from_millis(300), stream.message()).await
        {
            panic!("{name}: unexpected extra event {extra:?}");
        }
        // Events come as calls end, which may differ from the order they were sent in by a few
        // microseconds; call ids follow the order crisp received them in.
        got.sort_by_key(|e| e.call_id);
        let labels: Vec<String> = got
            .iter()
            .map(|e| format!("{} {}", e.cri_version, e.method))
            .collect();
        let want_labels: Vec<String> = want.iter().map(|i| SEQUENCE[*i].to_string()).collect();
        assert_eq!(labels, want_labels, "{name}");
    }

    // What the default subscriber saw, in detail: names resolved for every pod call.
    let mut s = tap_events(&crisp.admin, req(|r| r.include_polling = true)).await;
    run_sequence(&crisp.sock).await;
    let mut evs = Vec::new();
    for _ in 0..SEQUENCE.len() {
        evs.push(within(PATIENCE, "second run", next_call(&mut s)).await);
    }
    evs.sort_by_key(|e| e.call_id);
    let who =
        |e: &pb::CallEvent| format!("{}/{} {}", e.pod_namespace, e.pod_name, e.container_name);
    assert_eq!(who(&evs[2]), "shop/web app");
    assert_eq!(evs[2].container_id, "c-web-app");
    assert_eq!(evs[2].pod_sandbox_id, "sb-web");
    assert_eq!(
        who(&evs[4]),
        "shop/web app",
        "StartContainer names come from the engine's cache"
    );
    assert_eq!(who(&evs[6]), "shop/web app");
    assert_eq!(who(&evs[7]), "kube-system/dns coredns");
    assert_eq!(
        (
            evs[7].code,
            evs[7].code_name.as_str(),
            evs[7].message.as_str()
        ),
        (Some(5), "NotFound", "no such container")
    );
    assert!(evs
        .iter()
        .filter(|e| e.code == Some(0))
        .all(|e| e.message.is_empty()));
    assert!(
        evs[8].duration_micros >= 400_000,
        "{}",
        evs[8].duration_micros
    );
    assert_eq!(evs[10].image, "busybox:1");
    assert_eq!(evs[11].kind, "unknown");
    assert_eq!(evs[11].path, "/runtime.v1.RuntimeService/FutureThing");
    for e in &evs {
        assert!(
            e.request_json.is_empty(),
            "not --full, yet {} carried a decoded message",
            e.method
        );
        assert!(e.redacted);
    }
    crisp.stop().await;
}

/// Issue #46: a polling call a tap shows (`--all --full`) stays on the relay's byte path. It
/// reaches the runtime on its client's own runtime connection, as the same call does with no
/// tap attached — not through crisp's own client, as a call diverted to be read before it is
/// forwarded does — and its event still has its ids, both decoded messages and the answer's
/// grpc-message.
#[tokio::test]
async fn a_polling_call_a_tap_shows_stays_on_the_relay() {
    let fake = Fake::start().await;
    script(&fake);
    let mut crisp = Daemon::start(fake.path(), |_| {}).await;
    let mut rt = runtime_client(&crisp.sock).await;
    let status = |id: &str| cri::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    };
    rt.container_status(status("c-untapped")).await.unwrap();
    let mut s = tap_events(
        &crisp.admin,
        req(|r| {
            r.include_polling = true;
            r.full = true;
        }),
    )
    .await;
    rt.container_status(status("c-tapped")).await.unwrap();
    let e = within(PATIENCE, "the tapped call's event", next_call(&mut s)).await;
    assert_eq!(e.method, "ContainerStatus");
    assert_eq!(e.container_id, "c-tapped");
    assert!(e.request_json.contains("c-tapped"), "{}", e.request_json);
    assert!(e.response_json.contains("\"app\""), "{}", e.response_json);
    let calls = fake.calls_to(STATUS);
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1].conn, calls[0].conn,
        "the tapped call came on another runtime connection than the untapped one: diverted"
    );

    // The answer's grpc-message, on the byte path too.
    fake.reply_once(
        STATUS,
        Reply::TrailersOnly(header_map(&[
            ("content-type", b"application/grpc"),
            ("grpc-status", b"5"),
            ("grpc-message", b"no%20such%20container"),
        ])),
    );
    rt.container_status(status("c-gone")).await.unwrap_err();
    let e = within(PATIENCE, "the failed call's event", next_call(&mut s)).await;
    assert_eq!(
        (e.code, e.message.as_str(), e.container_id.as_str()),
        (Some(5), "no such container", "c-gone")
    );
    assert_eq!(fake.calls_to(STATUS)[2].conn, calls[0].conn);
    crisp.stop().await;
}

/// A CreateContainer crisp refuses (its pod's sidecar `mesh` was never created) is recorded with
/// the request kubelet sent, redacted as any other: a replay can send it again instead of
/// borrowing kubelet's retry. On d0e40c6 the refusal's event had no request at all.
#[tokio::test]
async fn a_refused_call_is_tapped_with_its_request() {
    let fake = Fake::start().await;
    fake.script("/runtime.v1.RuntimeService/ListContainers", |_| {
        Reply::unary(&cri::ListContainersResponse::default().encode_to_vec())
    });
    let mut crisp = Daemon::start(fake.path(), |_| {}).await;
    let mut s = tap_events(&crisp.admin, req(|r| r.full = true)).await;
    let create = cri::CreateContainerRequest {
        pod_sandbox_id: "sb-refused".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            envs: vec![cri::KeyValue {
                key: "DB_PASSWORD".into(),
                value: "S3cret-env-value".into(),
            }],
            ..Default::default()
        }),
        sandbox_config: Some(sandbox_config("shop", "web")).map(|mut c| {
            c.annotations = [("crisp.dev/sidecars".to_string(), "mesh".to_string())].into();
            c
        }),
    };
    let mut rt = runtime_client(&crisp.sock).await;
    let refused = rt.create_container(create.clone()).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        fake.calls_to(CREATE).is_empty(),
        "a refused call never reaches the runtime"
    );

    // The hold event of the refusal comes first.
    let call = async {
        loop {
            match s.message().await.unwrap().and_then(|e| e.event) {
                Some(pb::tap_event::Event::Hold(h)) => assert_eq!(h.phase, "refused"),
                Some(pb::tap_event::Event::Call(c)) => return c,
                other => panic!("unexpected event: {other:?}"),
            }
        }
    };
    let e = within(PATIENCE, "the refusal's event", call).await;
    assert_eq!((e.method.as_str(), e.code), ("CreateContainer", Some(9)));
    assert_eq!(e.request_bytes, create.encoded_len() as u64);
    assert!(
        e.request_json.contains("\"sb-refused\"") && e.request_json.contains("DB_PASSWORD"),
        "the request as kubelet sent it: {}",
        e.request_json
    );
    assert!(
        !e.request_json.contains("S3cret-env-value"),
        "redacted as any request: {}",
        e.request_json
    );
    crisp.stop().await;
}
