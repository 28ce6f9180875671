//! Issue #35, item 3: crisp's holds in kubelet's trace. A kubelet-style grpc-go client
//! (`crisp-grpcgo call --md traceparent=…`, as kubelet's OpenTelemetry gRPC instrumentation
//! sends it) makes CreateContainer through crisp; crisp's ordering engine holds it until the
//! pod's sidecar answers its readiness probe, and exports the hold as a span over OTLP/gRPC to an
//! in-process receiver built from the collector's own service definition (`opentelemetry-proto`,
//! `TraceService`, `tests/it/support/otlp.rs`). The span must be a child of kubelet's (its trace
//! id, kubelet's span as parent), last as long as the hold, and say why and how it ended; the
//! runtime must get kubelet's `traceparent`/`tracestate` unchanged. A relayed call, a call crisp observes but does
//! not hold, and a held call kubelet did not sample give no span.
//!
//! The engine reads the pod from a scripted runtime (`probe_burst::Burst`: one running sidecar
//! `proxy`, pod IP 127.0.0.1 in this process's network namespace); the calls themselves go to the
//! recording fake runtime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as cri;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::sync::mpsc;

use crate::newer_kubelets::{grpcgo, header_str};
use crate::probe_burst::Burst;
use crate::support::*;
use crisp::config::Config;
use crisp::metrics::OrderingMetrics;
use crisp::ordering::job::Terminated;
use crisp::ordering::Engine;
use crisp::otel::HoldSpans;
use crisp::proxy::ProxyOptions;

const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
const VERSION: &str = "/runtime.v1.RuntimeService/Version";

/// kubelet's span for one CRI call: `traceparent` as kubelet sends it.
fn traceparent(trace: &str, span: &str, sampled: bool) -> String {
    format!("00-{trace}-{span}-{}", if sampled { "01" } else { "00" })
}

// ---------------------------------------------------------------------------------------------
// The OTLP receiver

/// An OTLP/gRPC receiver on 127.0.0.1 (`tests/it/support/otlp.rs`): its endpoint and the spans it
/// receives, every one of them from crisp (`service.name`).
async fn receiver() -> (String, mpsc::UnboundedReceiver<Span>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", l.local_addr().unwrap());
    let mut all = otlp_receiver(l);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(e) = all.recv().await {
            assert_eq!(e.service, "crisp", "a span from another service: {e:?}");
            let _ = tx.send(e.span);
        }
    });
    (endpoint, rx)
}

fn attr(span: &Span, key: &str) -> Option<Value> {
    span_attr(span, key)
}

fn attr_str(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(Value::StringValue(s)) => s,
        other => panic!("span attribute {key}: {other:?} in {span:?}"),
    }
}

fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

// ---------------------------------------------------------------------------------------------
// The sidecar's readiness endpoint

/// An HTTP readiness endpoint: 503 until `ready` is set, then 200; each probe is announced.
async fn readiness(ready: Arc<AtomicBool>) -> (u16, mpsc::UnboundedReceiver<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = tx.send(());
            let ok = ready.load(Ordering::SeqCst);
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                let answer: &[u8] = if ok {
                    b"HTTP/1.0 200 OK\r\n\r\n"
                } else {
                    b"HTTP/1.0 503 No\r\n\r\n"
                };
                let _ = s.write_all(answer).await;
            });
        }
    });
    (port, rx)
}

/// CreateContainer of `app` in pod `namespace/name`: with a sidecar `proxy` probed at
/// `http://:PORT/` when `port` is given, else with no sidecar at all.
fn create(sandbox: &str, namespace: &str, name: &str, port: Option<u16>) -> Vec<u8> {
    create_with(sandbox, namespace, name, "proxy", port)
}

/// [`create`] with the sidecar named `sidecar` (the scripted runtime only runs `proxy`).
fn create_with(
    sandbox: &str,
    namespace: &str,
    name: &str,
    sidecar: &str,
    port: Option<u16>,
) -> Vec<u8> {
    let mut annotations = HashMap::new();
    if let Some(port) = port {
        annotations.insert("crisp.dev/sidecars".to_string(), sidecar.to_string());
        annotations.insert(
            format!("crisp.dev/ready.{sidecar}"),
            format!("http://:{port}/"),
        );
        annotations.insert("crisp.dev/start-timeout".to_string(), "30s".to_string());
    }
    cri::CreateContainerRequest {
        pod_sandbox_id: sandbox.into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                namespace: namespace.into(),
                uid: sandbox.into(),
                attempt: 0,
            }),
            annotations,
            // On the node's network, as the scripted runtime says (`probe_burst::Burst`).
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

// ---------------------------------------------------------------------------------------------
// crisp with its ordering engine and tracing on

struct Traced {
    fake: Fake,
    crisp: Crisp,
    spans: Arc<HoldSpans>,
    received: mpsc::UnboundedReceiver<Span>,
}

impl Traced {
    async fn start() -> Traced {
        let (endpoint, received) = receiver().await;
        let cfg = Config::from_toml(
            &format!(
                "[tracing]\notlp_endpoint = \"{endpoint}\"\nexport_delay = \"50ms\"\n\
                 [ordering]\nknown_injectors = false\nprobe_interval = \"50ms\"\n"
            ),
            "hold_spans",
        )
        .unwrap();
        let engine = Engine::new(
            &cfg,
            Burst,
            Arc::new(OrderingMetrics::default()),
            Arc::new(Terminated::open(None)),
        );
        let spans = Arc::new(
            HoldSpans::from_config(&cfg.tracing)
                .unwrap()
                .expect("an endpoint is configured"),
        );
        engine.set_hold_spans(spans.clone());
        let fake = Fake::start().await;
        let answer = cri::CreateContainerResponse {
            container_id: "ctr-app".into(),
        }
        .encode_to_vec();
        fake.script(CREATE, move |_| Reply::unary(&answer));
        let crisp = Crisp::start_with(fake.path(), vec![engine], ProxyOptions::default()).await;
        Traced {
            fake,
            crisp,
            spans,
            received,
        }
    }

    /// Sends every span queued so far to the receiver and waits for the export to end.
    async fn flush(&self) {
        let spans = self.spans.clone();
        within(PATIENCE, "the span exporter to flush", async {
            tokio::task::spawn_blocking(move || spans.flush())
                .await
                .unwrap()
        })
        .await;
    }

    async fn next_span(&mut self) -> Span {
        within(
            PATIENCE,
            "crisp's hold span at the OTLP receiver",
            self.received.recv(),
        )
        .await
        .expect("the receiver stopped")
    }
}

/// A held CreateContainer carrying kubelet's trace context becomes one span in kubelet's trace:
/// kubelet's trace id, kubelet's span as parent, as long as the hold (within what the client
/// saw, at least the time the sidecar was kept unready), with the pod (escaped), the sidecar
/// waited for, why, and the verdict. The runtime gets kubelet's trace headers unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_create_is_a_child_span_of_kubelets() {
    let mut t = Traced::start().await;
    let ready = Arc::new(AtomicBool::new(false));
    let (port, mut probes) = readiness(ready.clone()).await;
    // A hostile pod name: an escape sequence must not reach the trace backend as is.
    let req = create("sb-held", "team-a", "web\u{1b}[2Jx", Some(port));
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let kubelet_span = "00f067aa0ba902b7";
    let tp = traceparent(trace, kubelet_span, true);
    let ts = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";

    // The sidecar stays unready for `unready` after the hold's first probe.
    let unready = Duration::from_millis(800);
    let flip = tokio::spawn(async move {
        within(PATIENCE, "crisp's first readiness probe", probes.recv())
            .await
            .unwrap();
        let at = Instant::now();
        tokio::time::sleep(unready).await;
        ready.store(true, Ordering::SeqCst);
        at
    });
    let before = SystemTime::now();
    let got = grpcgo(
        &t.crisp.path,
        CREATE,
        &req,
        false,
        &[("traceparent", &tp), ("tracestate", ts)],
    )
    .await;
    let after = SystemTime::now();
    assert_eq!(got.code, "OK", "{got:?}");
    let first_probe = flip.await.unwrap();
    assert!(first_probe.elapsed() >= unready);

    // kubelet's trace context reached the runtime unchanged.
    let arrived = t.fake.calls_to(CREATE);
    assert_eq!(arrived.len(), 1);
    assert_eq!(
        header_str(&arrived[0].headers, "traceparent"),
        vec![tp.clone()]
    );
    assert_eq!(
        header_str(&arrived[0].headers, "tracestate"),
        vec![ts.to_string()]
    );

    let span = t.next_span().await;
    assert_eq!(hex(&span.trace_id), trace, "{span:?}");
    assert_eq!(hex(&span.parent_span_id), kubelet_span, "{span:?}");
    assert_ne!(hex(&span.span_id), kubelet_span);
    assert_eq!(span.name, "crisp hold CreateContainer");
    // W3C tracestate travels with the parent into the child.
    assert_eq!(span.trace_state, ts);
    let (start, end) = (span.start_time_unix_nano, span.end_time_unix_nano);
    assert!(
        start >= unix_nanos(before) && end <= unix_nanos(after),
        "the hold lies within the call: {before:?}..{after:?}, span {start}..{end}"
    );
    let held = Duration::from_nanos(end - start);
    let call = after.duration_since(before).unwrap();
    eprintln!(
        "hold span {held:?}; sidecar unready {unready:?} after the first probe; call {call:?}"
    );
    assert!(
        held >= unready,
        "the span lasts the hold ({held:?}), at least the {unready:?} the sidecar was unready"
    );
    assert_eq!(
        attr(&span, "crisp.hold.ms"),
        Some(Value::IntValue(held.as_millis() as i64))
    );
    assert_eq!(attr_str(&span, "rpc.method"), "CreateContainer");
    assert_eq!(attr_str(&span, "k8s.namespace.name"), "team-a");
    assert_eq!(attr_str(&span, "k8s.pod.name"), "web\\u{1b}[2Jx");
    assert_eq!(attr_str(&span, "k8s.container.name"), "app");
    assert_eq!(attr_str(&span, "crisp.pod_sandbox_id"), "sb-held");
    assert_eq!(attr_str(&span, "crisp.hold.waited_for"), "proxy");
    let reason = attr_str(&span, "crisp.hold.reason");
    assert!(reason.starts_with("not ready"), "{reason}");
    assert_eq!(attr_str(&span, "crisp.hold.verdict"), "forwarded");
    assert_eq!(attr_str(&span, "crisp.hold.outcome"), "forwarded");
    assert_eq!(attr_str(&span, "crisp.hold.policy"), "proceed");

    t.flush().await;
    assert!(t.received.try_recv().is_err(), "one hold, one span");
}

/// Only holds are traced: a relayed call (Version) and a CreateContainer crisp observes but does
/// not hold (a pod without sidecars), both with kubelet's `traceparent`, give no span; nor does
/// a hold kubelet did not sample (flags 00). The held, sampled call sent last does, so the
/// exporter is shown to work: it is the only span the receiver ever gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_sampled_holds_give_spans() {
    let mut t = Traced::start().await;
    let relayed = traceparent("11111111111111111111111111111111", "1111111111111111", true);
    let version = cri::VersionRequest {
        version: "0.1.0".into(),
    }
    .encode_to_vec();
    t.fake.script(VERSION, |_| {
        Reply::unary(
            &cri::VersionResponse {
                version: "0.1.0".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
    });
    let got = grpcgo(
        &t.crisp.path,
        VERSION,
        &version,
        false,
        &[("traceparent", &relayed)],
    )
    .await;
    assert_eq!(got.code, "OK", "{got:?}");
    assert_eq!(
        header_str(&t.fake.calls_to(VERSION)[0].headers, "traceparent"),
        vec![relayed]
    );

    let unheld = traceparent("22222222222222222222222222222222", "2222222222222222", true);
    let req = create("sb-plain", "team-a", "plain", None);
    let got = grpcgo(
        &t.crisp.path,
        CREATE,
        &req,
        false,
        &[("traceparent", &unheld)],
    )
    .await;
    assert_eq!(got.code, "OK", "{got:?}");

    // Held, but not sampled by kubelet; then held and sampled. Each sidecar turns ready once
    // crisp has probed it.
    let mut last = String::new();
    for (i, sampled) in [(3, false), (4, true)] {
        let ready = Arc::new(AtomicBool::new(false));
        let (port, mut probes) = readiness(ready.clone()).await;
        tokio::spawn(async move {
            if probes.recv().await.is_some() {
                ready.store(true, Ordering::SeqCst);
            }
        });
        let id = format!("{i}").repeat(32);
        let tp = traceparent(&id, &format!("{i}").repeat(16), sampled);
        let req = create(&format!("sb-held-{i}"), "team-a", "web", Some(port));
        let got = grpcgo(&t.crisp.path, CREATE, &req, false, &[("traceparent", &tp)]).await;
        assert_eq!(got.code, "OK", "{got:?}");
        last = id;
    }
    let span = t.next_span().await;
    assert_eq!(hex(&span.trace_id), last, "{span:?}");
    t.flush().await;
    if let Ok(extra) = t.received.try_recv() {
        panic!("a call crisp did not hold (or kubelet did not sample) has a span: {extra:?}");
    }
}

/// A CreateContainer refused at once (its sidecar `mesh` was never created) is a span too: the
/// verdict `refused`, the sidecar it needed, and an Error status with the message kubelet got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_create_is_an_error_span_with_kubelets_message() {
    let mut t = Traced::start().await;
    let trace = "5bf92f3577b34da6a3ce929d0e0e4736";
    let tp = traceparent(trace, "10f067aa0ba902b7", true);
    let req = create_with("sb-refused", "team-a", "web", "mesh", Some(9));
    let got = grpcgo(&t.crisp.path, CREATE, &req, false, &[("traceparent", &tp)]).await;
    assert_eq!(got.code, "FailedPrecondition", "{got:?}");
    assert!(
        t.fake.calls_to(CREATE).is_empty(),
        "a refused call never reaches the runtime"
    );

    let span = t.next_span().await;
    assert_eq!(hex(&span.trace_id), trace);
    assert_eq!(hex(&span.parent_span_id), "10f067aa0ba902b7");
    assert_eq!(attr_str(&span, "crisp.hold.verdict"), "refused");
    assert_eq!(attr_str(&span, "crisp.hold.waited_for"), "mesh");
    assert_eq!(attr_str(&span, "crisp.hold.reason"), "not created");
    let status = span.status.clone().expect("a status");
    assert_eq!(status.code, 2, "Error: {status:?}");
    assert_eq!(status.message, got.message, "the message kubelet got");
}

/// The daemon wires `[tracing]` into its engine: crisp as it runs on a node (tap + ordering
/// engine, its own runtime client) with `otlp_endpoint` set exports the span of a
/// CreateContainer it refuses (the runtime lists no sidecar `mesh`), in kubelet's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_exports_spans_when_an_endpoint_is_configured() {
    let (endpoint, mut received) = receiver().await;
    let fake = Fake::start().await;
    fake.script("/runtime.v1.RuntimeService/ListContainers", |_| {
        Reply::unary(&cri::ListContainersResponse::default().encode_to_vec())
    });
    let mut daemon = Daemon::start(fake.path(), |cfg| {
        cfg.tracing.otlp_endpoint = Some(endpoint.clone());
        cfg.tracing.export_delay = Duration::from_millis(50);
    })
    .await;
    let trace = "6bf92f3577b34da6a3ce929d0e0e4736";
    let tp = traceparent(trace, "20f067aa0ba902b7", true);
    let req = create_with("sb-daemon", "team-a", "web", "mesh", Some(9));
    let got = grpcgo(&daemon.sock, CREATE, &req, false, &[("traceparent", &tp)]).await;
    assert_eq!(got.code, "FailedPrecondition", "{got:?}");
    let span = within(
        PATIENCE,
        "the daemon's span at the OTLP receiver",
        received.recv(),
    )
    .await
    .expect("the receiver stopped");
    assert_eq!(hex(&span.trace_id), trace);
    assert_eq!(hex(&span.parent_span_id), "20f067aa0ba902b7");
    assert_eq!(attr_str(&span, "crisp.hold.verdict"), "refused");
    daemon.stop().await;
}
