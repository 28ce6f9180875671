//! Issue #34: the CRI calls kubelets 1.30–1.36 make that crisp's 1.26-era tests never sent, made
//! by a real grpc-go client (`crisp-grpcgo call`, grpc-go 1.33: kubelet's client stack, dialled
//! with `:authority` `localhost` as kubelet 1.30+ dials) through crisp to the recording fake
//! runtime, in each mode crisp can be in:
//!
//! - `relayed`: no interceptor (every call relayed frame for frame);
//! - `daemon`: the daemon's chain (tap + ordering engine), nobody tapping: the engine diverts
//!   CreateContainer/StopContainer, everything else is relayed;
//! - `tapped`: the daemon's chain with a `--full --all` tap subscriber attached: every call is
//!   diverted to the observed path, and the tap shows it;
//! - `held`: an interceptor that holds every unary call 200 ms before forwarding it (the ordering
//!   engine's hold, without needing a pod to wait for).
//!
//! Each test would fail on a crisp that answered these calls itself or dropped them (or any
//! byte, message, header or trailer of them): the fake records what reached it, and what the
//! client got is compared with what the fake was told to answer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::HeaderMap;
use k8s_cri::v1 as cri;
use prost::Message;
use serde::Deserialize;

use crate::support::*;
use crisp::admin_api as pb;
use crisp::intercept::{Call, Interceptor, Interest, Verdict};
use crisp::proxy::ProxyOptions;

const RUNTIME_CONFIG: &str = "/runtime.v1.RuntimeService/RuntimeConfig";
const UPDATE_SANDBOX_RESOURCES: &str = "/runtime.v1.RuntimeService/UpdatePodSandboxResources";
const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
const STATUS: &str = "/runtime.v1.RuntimeService/Status";
const VERSION: &str = "/runtime.v1.RuntimeService/Version";
const PULL: &str = "/runtime.v1.ImageService/PullImage";
/// 1.36's server-streaming list call (crisp knows the name: a `Streaming` route).
const STREAM_SANDBOXES: &str = "/runtime.v1.RuntimeService/StreamPodSandboxes";
/// A server-streaming call no CRI revision has (crisp routes it `unknown`).
const STREAM_FUTURE: &str = "/runtime.v1.RuntimeService/StreamFutureThings";
/// A unary call no CRI revision has.
const UNARY_FUTURE: &str = "/runtime.v1.RuntimeService/FutureThing";

/// containerd 1.6's answer to RuntimeConfig (grpc-go's unknown-method status).
const CONTAINERD_UNIMPLEMENTED: &str =
    "unknown method RuntimeConfig for service runtime.v1.RuntimeService";

/// W3C trace context and baggage as kubelet's OpenTelemetry gRPC instrumentation sends them.
const TRACING: &[(&str, &str)] = &[
    (
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ),
    ("tracestate", "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"),
    ("baggage", "k8s.node=node-1,k8s.pod.uid=0b1c2d3e%2Cx;meta=1"),
];

// ---------------------------------------------------------------------------------------------
// The grpc-go client

fn grpcgo_binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
            let out = std::process::Command::new("bash")
                .arg(repo.join("hack/build-grpcgo.sh"))
                .stdin(std::process::Stdio::null())
                .output()
                .expect("running hack/build-grpcgo.sh");
            assert!(
                out.status.success(),
                "hack/build-grpcgo.sh (needs golang-go and golang-google-grpc-dev): {}",
                String::from_utf8_lossy(&out.stderr)
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        })
        .clone()
}

/// One call as `crisp-grpcgo call` reports it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct GoCall {
    pub(crate) code: String,
    pub(crate) message: String,
    response_hex: String,
    responses_hex: Vec<String>,
    header: HashMap<String, Vec<String>>,
    trailer: HashMap<String, Vec<String>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One call of `method` from a kubelet-style grpc-go client: unary, or (`stream`) server
/// streaming; `md` is sent as request metadata.
pub(crate) async fn grpcgo(
    target: &Path,
    method: &str,
    req: &[u8],
    stream: bool,
    md: &[(&str, &str)],
) -> GoCall {
    let mut cmd = tokio::process::Command::new(grpcgo_binary());
    cmd.arg("call")
        .arg("--target")
        .arg(target)
        .arg("--authority")
        .arg("localhost")
        .args(["--method", method, "--hex", &hex(req), "--timeout", "10s"]);
    if stream {
        cmd.arg("--stream");
    }
    for (k, v) in md {
        cmd.arg("--md").arg(format!("{k}={v}"));
    }
    cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let out = within(
        PATIENCE,
        &format!("crisp-grpcgo call {method}"),
        cmd.output(),
    )
    .await
    .expect("running crisp-grpcgo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| !l.contains("\"summary\""))
        .unwrap_or_else(|| {
            panic!(
                "crisp-grpcgo call {method} printed no call line: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

// ---------------------------------------------------------------------------------------------
// crisp in each mode

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Relayed,
    Daemon,
    Tapped,
    Held,
}

const MODES: &[Mode] = &[Mode::Relayed, Mode::Daemon, Mode::Tapped, Mode::Held];

/// Holds every unary call (request seen in full) 200 ms, then forwards it unchanged.
#[derive(Default)]
struct HoldAll {
    held: AtomicUsize,
}

impl Interceptor for HoldAll {
    fn interest(&self, _call: &Call) -> Interest {
        Interest {
            request: true,
            response: true,
            ..Interest::NONE
        }
    }
    fn on_request<'a>(
        &'a self,
        _call: &'a Call,
        _msg: &'a [u8],
    ) -> crisp::intercept::BoxFuture<'a, Verdict> {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            self.held.fetch_add(1, Ordering::SeqCst);
            Verdict::Forward
        })
    }
}

enum Running {
    Crisp(Crisp),
    Daemon(Daemon),
}

/// crisp in `mode` in front of `fake`, with the tap subscriber of `Tapped`.
struct Under {
    running: Running,
    tap: Option<tonic::Streaming<pb::TapEvent>>,
    hold: Option<Arc<HoldAll>>,
}

impl Under {
    async fn start(fake: &Fake, mode: Mode) -> Under {
        let (running, tap, hold) = match mode {
            Mode::Relayed => (
                Running::Crisp(
                    Crisp::start_with(fake.path(), vec![], ProxyOptions::default()).await,
                ),
                None,
                None,
            ),
            Mode::Held => {
                let h = Arc::new(HoldAll::default());
                let c =
                    Crisp::start_with(fake.path(), vec![h.clone()], ProxyOptions::default()).await;
                (Running::Crisp(c), None, Some(h))
            }
            Mode::Daemon | Mode::Tapped => {
                let d = Daemon::start(fake.path(), |_| {}).await;
                let tap = if mode == Mode::Tapped {
                    let req = pb::TapRequest {
                        include_polling: true,
                        full: true,
                        ..Default::default()
                    };
                    Some(tap_events(&d.admin, req).await)
                } else {
                    None
                };
                (Running::Daemon(d), tap, None)
            }
        };
        Under { running, tap, hold }
    }

    fn sock(&self) -> &Path {
        match &self.running {
            Running::Crisp(c) => &c.path,
            Running::Daemon(d) => &d.sock,
        }
    }

    /// The tap's event for the next call to `path` (`Tapped` only; events of other paths — the
    /// ordering engine's own — are skipped).
    async fn tapped(&mut self, path: &str) -> Option<pb::CallEvent> {
        let s = self.tap.as_mut()?;
        let what = format!("the tap's event for {path}");
        Some(
            within(PATIENCE, &what, async {
                loop {
                    match s.message().await.unwrap().and_then(|e| e.event) {
                        Some(pb::tap_event::Event::Call(c)) if c.path == path => return c,
                        Some(_) => continue,
                        None => panic!("tap stream ended"),
                    }
                }
            })
            .await,
        )
    }
}

/// The calls to `path` that carry `body` (crisp's own calls carry others).
fn received(fake: &Fake, path: &str, body: &[u8]) -> Vec<Arc<Recorded>> {
    fake.calls_to(path)
        .into_iter()
        .filter(|c| c.body == body)
        .collect()
}

pub(crate) fn header_str(h: &HeaderMap, name: &str) -> Vec<String> {
    h.get_all(name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. RuntimeConfig

/// kubelet 1.28+ asks the runtime for its cgroup driver and falls back to its own flag only on
/// Unimplemented: the runtime's answer — a real one, and containerd 1.6's Unimplemented — must
/// reach kubelet unchanged, and crisp must never answer it itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_config_is_always_the_runtimes_answer() {
    let req = cri::RuntimeConfigRequest {}.encode_to_vec();
    // CGROUPFS (1): not the zero value, so a crisp answering with a default message differs.
    let mut answer = cri::RuntimeConfigResponse {
        linux: Some(cri::LinuxRuntimeConfiguration { cgroup_driver: 1 }),
    }
    .encode_to_vec();
    pb_bytes(&mut answer, 99, b"a field of a future CRI");
    for &mode in MODES {
        let fake = Fake::start().await;
        let mut under = Under::start(&fake, mode).await;
        // A runtime that knows RuntimeConfig.
        fake.reply_once(RUNTIME_CONFIG, Reply::unary(&answer));
        let got = grpcgo(under.sock(), RUNTIME_CONFIG, &req, false, &[]).await;
        assert_eq!(got.code, "OK", "{mode:?}: {got:?}");
        assert_eq!(
            got.response_hex,
            hex(&answer),
            "{mode:?}: the answer changed"
        );
        assert_eq!(
            received(&fake, RUNTIME_CONFIG, &grpc_frame(&req)).len(),
            1,
            "{mode:?}: the call did not reach the runtime exactly once"
        );
        if let Some(ev) = under.tapped(RUNTIME_CONFIG).await {
            assert_eq!((ev.code, ev.message.as_str()), (Some(0), ""), "{ev:?}");
            assert_eq!(ev.response_bytes, answer.len() as u64, "{ev:?}");
            assert!(ev.response_json.contains("cgroup_driver"), "{ev:?}");
        }

        // containerd 1.6: grpc-go's unknown-method status, trailers only.
        fake.reply_once(
            RUNTIME_CONFIG,
            Reply::TrailersOnly(header_map(&[
                ("content-type", b"application/grpc"),
                ("grpc-status", b"12"),
                (
                    "grpc-message",
                    CONTAINERD_UNIMPLEMENTED.replace(' ', "%20").as_bytes(),
                ),
            ])),
        );
        let got = grpcgo(under.sock(), RUNTIME_CONFIG, &req, false, &[]).await;
        assert_eq!(
            (got.code.as_str(), got.message.as_str()),
            ("Unimplemented", CONTAINERD_UNIMPLEMENTED),
            "{mode:?}: {got:?}"
        );
        assert_eq!(
            received(&fake, RUNTIME_CONFIG, &grpc_frame(&req)).len(),
            2,
            "{mode:?}: the Unimplemented was not the runtime's (the call never reached it)"
        );
        if let Some(ev) = under.tapped(RUNTIME_CONFIG).await {
            assert_eq!(ev.code, Some(12), "{ev:?}");
            assert_eq!(ev.message, CONTAINERD_UNIMPLEMENTED, "the tap: {ev:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. New calls and fields, byte for byte

/// `UpdatePodSandboxResourcesRequest` (cri-api v0.33, kubelet 1.32+ in-place resize; not in the
/// CRI revision crisp is built with): pod_sandbox_id 1, overhead 2, resources 3 (both
/// LinuxContainerResources), and a field no revision has.
fn update_sandbox_resources() -> Vec<u8> {
    let res = |cpu: i64, mem: i64| {
        cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: cpu,
            cpu_shares: 512,
            memory_limit_in_bytes: mem,
            unified: [("memory.high".to_string(), "400M".to_string())].into(),
            ..Default::default()
        }
        .encode_to_vec()
    };
    let mut m = Vec::new();
    pb_bytes(&mut m, 1, "sb-resize".repeat(7).as_bytes());
    pb_bytes(&mut m, 2, &res(10_000, 64 << 20));
    pb_bytes(&mut m, 3, &res(250_000, 512 << 20));
    pb_bytes(&mut m, 77, b"future field");
    m
}

/// CreateContainer as kubelet 1.33+ sends it: an image volume (`Mount.image`, 1.31+), a
/// recursive read-only mount (1.30+), the container's `stop_signal` (ContainerConfig field 18,
/// 1.33+: not in crisp's CRI revision) and a field of no revision in the mount.
fn create_with_new_fields() -> Vec<u8> {
    let mut mount = cri::Mount {
        container_path: "/models".into(),
        readonly: true,
        recursive_read_only: true,
        image: Some(cri::ImageSpec {
            image: "registry.example/models:v3".into(),
            user_specified_image: "models:v3".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    pb_bytes(&mut mount, 10, b"sub/path"); // image_sub_path (1.33)
    let mut config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "registry.example/app:1".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    pb_bytes(&mut config, 7, &mount);
    pb_uint(&mut config, 18, 15); // stop_signal
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "resize".into(),
            uid: "u-resize".into(),
            namespace: "new".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    let mut m = Vec::new();
    pb_bytes(&mut m, 1, b"sb-resize");
    pb_bytes(&mut m, 2, &config);
    pb_bytes(&mut m, 3, &sandbox.encode_to_vec());
    m
}

/// A StatusResponse as containerd 2.x / CRI-O answer kubelet 1.30+: `runtime_handlers` with
/// their `features`, `features` of the runtime, and a feature flag of a future revision.
fn status_with_handler_features() -> Vec<u8> {
    let mut features = cri::RuntimeHandlerFeatures {
        recursive_read_only_mounts: true,
        user_namespaces: true,
    }
    .encode_to_vec();
    pb_uint(&mut features, 3, 1);
    let mut handler = Vec::new();
    pb_bytes(&mut handler, 1, b"runc");
    pb_bytes(&mut handler, 2, &features);
    let mut m = cri::StatusResponse {
        status: Some(cri::RuntimeStatus {
            conditions: vec![cri::RuntimeCondition {
                r#type: "RuntimeReady".into(),
                status: true,
                ..Default::default()
            }],
        }),
        ..Default::default()
    }
    .encode_to_vec();
    pb_bytes(&mut m, 3, &handler);
    pb_bytes(&mut m, 3, b"\x0a\x04kata");
    pb_bytes(&mut m, 4, b"\x08\x01");
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_calls_and_fields_cross_byte_for_byte() {
    let update = update_sandbox_resources();
    let create = create_with_new_fields();
    let status = status_with_handler_features();
    // UpdatePodSandboxResourcesResponse is empty; a future one may not be.
    let mut update_answer = Vec::new();
    pb_bytes(&mut update_answer, 15, b"future response field");
    let create_answer = cri::CreateContainerResponse {
        container_id: "ctr-app".into(),
    }
    .encode_to_vec();
    for &mode in MODES {
        let fake = Fake::start().await;
        let mut under = Under::start(&fake, mode).await;
        for (path, req, answer) in [
            (
                UPDATE_SANDBOX_RESOURCES,
                update.clone(),
                update_answer.clone(),
            ),
            (CREATE, create.clone(), create_answer.clone()),
            (
                STATUS,
                cri::StatusRequest { verbose: false }.encode_to_vec(),
                status.clone(),
            ),
        ] {
            let a = answer.clone();
            fake.script(path, move |_| Reply::unary(&a));
            let got = grpcgo(under.sock(), path, &req, false, &[]).await;
            assert_eq!(got.code, "OK", "{mode:?} {path}: {got:?}");
            let arrived = received(&fake, path, &grpc_frame(&req));
            assert_eq!(
                arrived.len(),
                1,
                "{mode:?} {path}: the request did not reach the runtime byte for byte"
            );
            assert_eq!(
                got.response_hex,
                hex(&answer),
                "{mode:?} {path}: the answer changed"
            );
            if let Some(ev) = under.tapped(path).await {
                assert_eq!(ev.code, Some(0), "{ev:?}");
                assert_eq!(ev.request_bytes, req.len() as u64, "{ev:?}");
            }
        }
        if let Some(h) = &under.hold {
            assert_eq!(h.held.load(Ordering::SeqCst), 3, "every call was held");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Future RPCs, unary and server-streaming

/// Four messages a few ms apart (the runtime streams them), response metadata, and trailers
/// with metadata of their own; or, `fail`, two messages and an error status.
fn stream_reply(n: usize, fail: bool) -> (Reply, Vec<Vec<u8>>) {
    let msgs: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let mut m = cri::PodSandbox {
                id: format!("{i:064x}"),
                state: (i % 2) as i32,
                created_at: 1_700_000_000 + i as i64,
                ..Default::default()
            }
            .encode_to_vec();
            pb_bytes(
                &mut m,
                42,
                format!("future field of message {i}").as_bytes(),
            );
            m
        })
        .collect();
    let trailers = if fail {
        header_map(&[
            ("grpc-status", b"13"),
            ("grpc-message", b"runtime%20gave%20up"),
            ("x-stream-trailer", b"failed"),
        ])
    } else {
        header_map(&[("grpc-status", b"0"), ("x-stream-trailer", b"done")])
    };
    let reply = Reply::Full {
        headers: header_map(&[
            ("content-type", b"application/grpc"),
            ("x-stream-header", b"h1"),
        ]),
        chunks: msgs
            .iter()
            .map(|m| (Duration::from_millis(15), grpc_frame(m)))
            .collect(),
        trailers: Some(trailers),
    };
    (reply, msgs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_rpcs_relay_every_message_and_the_trailers() {
    let mut req = Vec::new();
    pb_bytes(&mut req, 1, b"\x0a\x02id"); // a filter, as the Stream* calls take
    pb_bytes(&mut req, 63, b"future request field");
    for &mode in MODES {
        let fake = Fake::start().await;
        let mut under = Under::start(&fake, mode).await;
        for (path, stream, n, fail) in [
            (STREAM_SANDBOXES, true, 4, false),
            (STREAM_FUTURE, true, 4, false),
            (STREAM_FUTURE, true, 2, true),
            (UNARY_FUTURE, false, 1, false),
        ] {
            let (reply, msgs) = stream_reply(n, fail);
            fake.reply_once(path, reply);
            let before = received(&fake, path, &grpc_frame(&req)).len();
            let got = grpcgo(under.sock(), path, &req, stream, &[]).await;
            let what = format!("{mode:?} {path} ({n} messages, fail {fail})");
            assert_eq!(
                received(&fake, path, &grpc_frame(&req)).len(),
                before + 1,
                "{what}: the request did not reach the runtime byte for byte"
            );
            if fail {
                assert_eq!(
                    (got.code.as_str(), got.message.as_str()),
                    ("Internal", "runtime gave up"),
                    "{what}: {got:?}"
                );
            } else {
                assert_eq!(got.code, "OK", "{what}: {got:?}");
            }
            if stream {
                let want: Vec<String> = msgs.iter().map(|m| hex(m)).collect();
                assert_eq!(got.responses_hex, want, "{what}: messages");
            } else {
                assert_eq!(got.response_hex, hex(&msgs[0]), "{what}: message");
            }
            assert_eq!(
                got.header.get("x-stream-header"),
                Some(&vec!["h1".to_string()]),
                "{what}: response metadata"
            );
            assert_eq!(
                got.trailer.get("x-stream-trailer"),
                Some(&vec![if fail { "failed" } else { "done" }.to_string()]),
                "{what}: trailers"
            );
            if let Some(ev) = under.tapped(path).await {
                assert_eq!(ev.code, Some(if fail { 13 } else { 0 }), "{what}: {ev:?}");
            }
        }
        if let Some(h) = &under.hold {
            // Streaming calls are never buffered, so never held; nor is a call crisp does not
            // know (FutureThing), which may as well be a stream.
            assert_eq!(h.held.load(Ordering::SeqCst), 0, "{mode:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Tracing metadata

/// kubelet with a `tracing:` block sends W3C `traceparent`/`tracestate` and `baggage` with every
/// CRI call: they reach the runtime unchanged on relayed calls (Version, ListPodSandbox) and on
/// the ones crisp diverts (CreateContainer: the ordering engine's; everything when tapped or
/// held), streams included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_tracing_metadata_reaches_the_runtime_unchanged() {
    let create = create_with_new_fields();
    let create_answer = cri::CreateContainerResponse {
        container_id: "ctr-app".into(),
    }
    .encode_to_vec();
    let version = cri::VersionRequest {
        version: "0.1.0".into(),
    }
    .encode_to_vec();
    let pull = cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: "registry.example/app:1".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec();
    for &mode in MODES {
        let fake = Fake::start().await;
        let under = Under::start(&fake, mode).await;
        let a = create_answer.clone();
        fake.script(CREATE, move |_| Reply::unary(&a));
        for (path, req, stream) in [
            (VERSION, version.clone(), false),
            (CREATE, create.clone(), false),
            (PULL, pull.clone(), false),
            (STREAM_SANDBOXES, b"".to_vec(), true),
        ] {
            let got = grpcgo(under.sock(), path, &req, stream, TRACING).await;
            assert_eq!(got.code, "OK", "{mode:?} {path}: {got:?}");
            let arrived = received(&fake, path, &grpc_frame(&req));
            assert_eq!(
                arrived.len(),
                1,
                "{mode:?} {path}: never reached the runtime"
            );
            for (k, v) in TRACING {
                assert_eq!(
                    header_str(&arrived[0].headers, k),
                    vec![v.to_string()],
                    "{mode:?} {path}: {k} at the runtime"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 5. 1.34's debug_redact credentials

/// PullImage with every AuthConfig field kubelet 1.34's cri-api marks `debug_redact` (password,
/// auth, identity_token, registry_token) through a `--full` tap: the runtime gets them, the tap
/// shows none. (`tap_redaction` checks the same through the `crisp tap --full --json` process,
/// its `--output` file and crisp's trace log.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_image_credentials_of_1_34_never_reach_the_tap() {
    let secrets = [
        "S3cret-password-134",
        "S3cret-auth-134",
        "S3cret-identity-token-134",
        "S3cret-registry-token-134",
    ];
    let req = cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: "registry.example/private:1".into(),
            ..Default::default()
        }),
        auth: Some(cri::AuthConfig {
            username: "robot".into(),
            password: secrets[0].into(),
            auth: secrets[1].into(),
            server_address: "registry.example".into(),
            identity_token: secrets[2].into(),
            registry_token: secrets[3].into(),
        }),
        sandbox_config: None,
    }
    .encode_to_vec();
    let fake = Fake::start().await;
    let mut under = Under::start(&fake, Mode::Tapped).await;
    let got = grpcgo(under.sock(), PULL, &req, false, &[]).await;
    assert_eq!(got.code, "OK", "{got:?}");
    let arrived = received(&fake, PULL, &grpc_frame(&req));
    assert_eq!(
        arrived.len(),
        1,
        "PullImage did not reach the runtime unchanged"
    );
    let ev = under.tapped(PULL).await.unwrap();
    assert!(ev.redacted);
    assert!(
        ev.request_json.contains("registry.example/private:1")
            && ev.request_json.contains("<redacted>"),
        "{}",
        ev.request_json
    );
    let shown = format!("{ev:?}");
    for s in secrets {
        assert!(!shown.contains(s), "the tap shows {s}: {shown}");
    }
}
