//! The admin socket: 0600 by default; `--unredacted` refused to a non-root client (a real
//! `crisp tap` process running as `nobody`) and served to root; Prometheus metrics over the
//! socket and, opt-in, over TCP (which never serves the tap); ListPods and Version.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_cri::v1 as cri;
use prost::Message;

use crate::support::*;
use crisp::admin_api as pb;

const NOBODY: u32 = 65534;

async fn daemon(upstream: &Path, tweak: impl FnOnce(&mut crisp::config::Config)) -> Daemon {
    Daemon::start(upstream, tweak).await
}

/// A plain HTTP/1.1 GET, as curl and Prometheus send it.
fn http_get(mut s: impl Read + Write, path: &str) -> String {
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: crisp\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

async fn pull_with_password(sock: &Path) {
    pull_with_auth(
        sock,
        "busybox:1",
        cri::AuthConfig {
            username: "u".into(),
            password: "Pa55-for-root-only".into(),
            ..Default::default()
        },
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_socket_is_root_only_by_default_and_removed_on_shutdown() {
    let fake = Fake::start().await;
    let mut d = daemon(fake.path(), |_| {}).await;
    assert_eq!(
        d.admin,
        d.sock.with_file_name("admin.sock"),
        "default: next to the CRI socket"
    );
    let mode = std::fs::metadata(&d.admin).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    d.stop().await;
    assert!(!d.admin.exists(), "admin socket left behind");
}

/// Issue #44: `admin.group` gives the admin socket to a monitoring group as it is bound, so
/// `mode = "0660"` lets that group tap without a chgrp after every start; a name is looked up,
/// a number taken as it is. Without the option the socket kept root's group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_socket_is_given_to_admin_group_as_it_is_bound() {
    use std::os::unix::fs::MetadataExt;
    crate::prerequisites::require_root("gives the socket to a group root is not in");
    let daemon_gid = crisp::sys::group_id("daemon")
        .unwrap()
        .expect("a `daemon` group (every Debian/Ubuntu/Fedora base has one)");
    assert_ne!(
        daemon_gid,
        crisp::sys::effective_gid(),
        "must differ to prove anything"
    );
    let fake = Fake::start().await;
    for (group, want) in [
        ("daemon".to_string(), daemon_gid),
        ("4242".to_string(), 4242),
    ] {
        let d = daemon(fake.path(), |c| {
            c.admin.mode = 0o660;
            c.admin.allow_shared_mode = true;
            c.admin.group = Some(group.clone());
        })
        .await;
        let meta = std::fs::metadata(&d.admin).unwrap();
        assert_eq!(
            (meta.gid(), meta.permissions().mode() & 0o777),
            (want, 0o660),
            "admin.group = {group:?}"
        );
        // It serves as any admin socket does.
        let mut client = crisp::cli::client::connect(&d.admin).await.unwrap();
        client.version(pb::VersionRequest {}).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unredacted_is_refused_to_non_root_and_served_to_root() {
    crate::prerequisites::require_root("runs a client as nobody");
    let fake = Fake::start().await;
    // A group-shared socket (an operator's choice): non-root may connect, but never unredacted.
    let d = daemon(fake.path(), |c| {
        c.admin.mode = 0o666;
        c.admin.allow_shared_mode = true;
    })
    .await;
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let tap_as_nobody = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_crisp"));
        cmd.arg("tap")
            .arg("--admin-socket")
            .arg(&d.admin)
            .args(extra)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };

    let out = tap_as_nobody(&["--unredacted", "--count", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(77),
        "nobody's --unredacted tap: {stderr}"
    );
    assert!(
        stderr.contains("only served to root") && stderr.contains(&NOBODY.to_string()),
        "{stderr}"
    );

    // The same client without --unredacted is served, redacted.
    let child = tap_as_nobody(&["--full", "--json", "--count", "1"])
        .spawn()
        .unwrap();
    within(PATIENCE, "nobody's tap to attach", async {
        let mut client = crisp::cli::client::connect(&d.admin).await.unwrap();
        while client
            .version(pb::VersionRequest {})
            .await
            .unwrap()
            .into_inner()
            .tap_subscribers
            < 1
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    pull_with_password(&d.sock).await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["method"], "PullImage");
    assert_eq!(v["request"]["auth"], "<redacted>");
    assert!(!stdout.contains("Pa55-for-root-only"));

    // Root asking explicitly gets the secrets (the control: redaction is what hid them).
    let mut s = tap_events(
        &d.admin,
        pb::TapRequest {
            full: true,
            unredacted: true,
            ..Default::default()
        },
    )
    .await;
    pull_with_password(&d.sock).await;
    let Some(pb::tap_event::Event::Call(c)) = within(PATIENCE, "root's event", s.message())
        .await
        .unwrap()
        .and_then(|e| e.event)
    else {
        panic!("no event")
    };
    assert!(!c.redacted);
    let req: serde_json::Value = serde_json::from_str(&c.request_json).unwrap();
    assert_eq!(req["auth"]["password"], "Pa55-for-root-only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_over_the_socket_and_opt_in_tcp() {
    let fake = Fake::start().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let d = daemon(fake.path(), |c| c.admin.metrics_tcp = Some(addr)).await;
    let mut rt = runtime_client(&d.sock).await;
    for _ in 0..3 {
        rt.version(cri::VersionRequest {
            version: "v1".into(),
        })
        .await
        .unwrap();
    }
    fake.reply_once(
        "/runtime.v1.RuntimeService/StopContainer",
        Reply::TrailersOnly(header_map(&[
            ("content-type", b"application/grpc"),
            ("grpc-status", b"5"),
        ])),
    );
    let _ = rt
        .stop_container(cri::StopContainerRequest {
            container_id: "gone".into(),
            timeout: 1,
        })
        .await;

    // The in-flight gauge is what each relay thread counted when it last went to wait: the
    // thread that wrote StopContainer's answer counts it out a moment after kubelet has it.
    // Scrape until that moment has passed (bounded), then check the whole text.
    let deadline = std::time::Instant::now() + PATIENCE;
    let text = loop {
        let admin = d.admin.clone();
        let text = tokio::task::spawn_blocking(move || {
            http_get(
                std::os::unix::net::UnixStream::connect(admin).unwrap(),
                "/metrics",
            )
        })
        .await
        .unwrap();
        if text.contains("crisp_cri_calls_in_flight 0") || std::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("text/plain; version=0.0.4"), "{text}");
    for needle in [
        "crisp_cri_calls_total{method=\"Version\",code=\"OK\"} 3",
        "crisp_cri_calls_total{method=\"StopContainer\",code=\"NotFound\"} 1",
        "crisp_cri_call_duration_seconds_bucket{method=\"Version\",le=\"+Inf\"} 3",
        "crisp_cri_call_duration_seconds_count{method=\"Version\"} 3",
        "# TYPE crisp_cri_calls_in_flight gauge",
        // Every call above has ended; StopContainer took the observed (diverted) path.
        "crisp_cri_calls_in_flight 0",
        "crisp_tap_events_dropped_total 0",
        "crisp_hold_seconds_count{gate=\"start\"} 0",
        "crisp_hold_timeouts_total 0",
        "crisp_bad_annotations_total 0",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let tcp = tokio::task::spawn_blocking(move || {
        http_get(std::net::TcpStream::connect(addr).unwrap(), "/metrics")
    })
    .await
    .unwrap();
    assert!(
        tcp.starts_with("HTTP/1.1 200")
            && tcp.contains("crisp_cri_calls_total{method=\"Version\",code=\"OK\"} 3"),
        "{tcp}"
    );
    // TCP serves metrics only: the tap is not reachable over the network.
    let mut over_tcp = pb::admin_client::AdminClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let e = over_tcp.tap(pb::TapRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
    let nf = tokio::task::spawn_blocking(move || {
        http_get(std::net::TcpStream::connect(addr).unwrap(), "/")
    })
    .await
    .unwrap();
    assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pods_and_version() {
    let fake = Fake::start().await;
    fake.script("/runtime.v1.RuntimeService/RunPodSandbox", |_| {
        Reply::unary(
            &cri::RunPodSandboxResponse {
                pod_sandbox_id: "sb-mesh".into(),
            }
            .encode_to_vec(),
        )
    });
    fake.script("/runtime.v1.RuntimeService/CreateContainer", |rec| {
        let (_, name) = container_names(rec);
        Reply::unary(
            &cri::CreateContainerResponse {
                container_id: format!("ctr-{name}"),
            }
            .encode_to_vec(),
        )
    });
    let d = daemon(fake.path(), |_| {}).await;
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "mesh".into(),
            namespace: "shop".into(),
            uid: "u-mesh".into(),
            attempt: 0,
        }),
        annotations: [
            ("crisp.dev/sidecars".to_string(), "proxy".to_string()),
            (
                "crisp.dev/ready.proxy".to_string(),
                "tcp://:15000".to_string(),
            ),
            ("crisp.dev/start-timeout".to_string(), "30s".to_string()),
        ]
        .into(),
        ..Default::default()
    };
    let mut rt = runtime_client(&d.sock).await;
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(sandbox.clone()),
        runtime_handler: String::new(),
    })
    .await
    .unwrap();
    // The sidecar itself is never held.
    rt.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: "sb-mesh".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "proxy".into(),
                attempt: 0,
            }),
            ..Default::default()
        }),
        sandbox_config: Some(sandbox),
    })
    .await
    .unwrap();

    let mut client = crisp::cli::client::connect(&d.admin).await.unwrap();
    let pods = client
        .list_pods(pb::ListPodsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .pods;
    assert_eq!(pods.len(), 1, "{pods:?}");
    let p = &pods[0];
    assert_eq!(
        (
            p.namespace.as_str(),
            p.name.as_str(),
            p.pod_sandbox_id.as_str(),
            p.uid.as_str()
        ),
        ("shop", "mesh", "sb-mesh", "u-mesh")
    );
    assert_eq!(p.policy_source, "annotation");
    let sidecars: Vec<(&str, &str, bool)> = p
        .sidecars
        .iter()
        .map(|s| (s.name.as_str(), s.ready.as_str(), s.required))
        .collect();
    assert_eq!(sidecars, vec![("proxy", "tcp://:15000", true)]);
    assert!(p.held.is_empty() && p.refusals == 0, "{p:?}");
    assert_eq!(
        (
            p.effective_start_timeout_ms,
            p.effective_timeout_policy.as_str()
        ),
        (30_000, "proceed")
    );
    assert_eq!(p.start_timeout_ms, 30_000);
    assert_eq!(
        p.containers,
        vec![pb::Container {
            id: "ctr-proxy".into(),
            name: "proxy".into()
        }]
    );

    let v = client
        .version(pb::VersionRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(v.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(v.listen, d.sock.display().to_string());
    assert_eq!(v.upstream, fake.path().display().to_string());
}
