//! crisp between real grpc-go peers (KUBELET-CRI §11). Every other test client in this crate is
//! Rust (tonic/hyper/h2); kubelet and crictl are grpc-go clients and containerd is a grpc-go
//! server, and they differ on the wire:
//!
//! - `:authority` is the bare socket path (kubelet 1.20–1.27, crictl), the path percent-encoded
//!   (kubelet 1.29) or `localhost`;
//! - grpc-go sends a BDP PING whenever it receives DATA, and its server answers PINGs that come
//!   too often with GOAWAY ENHANCE_YOUR_CALM (`too_many_pings`);
//! - HPACK dynamic-table indexing across requests.
//!
//! The peers are `crisp-grpcgo` (`e2e/go/grpcgo`, grpc-go 1.33 from Debian): its `bridge` puts a
//! kubelet-style grpc-go client in front of crisp (tonic → bridge → grpc-go → crisp) or a grpc-go
//! server in front of a fake runtime; its `call` is a kubelet-style client on its own.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use crisp_e2e::crisp::{Crisp, CrispOpts};
use crisp_e2e::emulator::PodSpec;
use crisp_e2e::fakert::{self, Canned};
use crisp_e2e::grpcgo::{self, percent_encoded_authority, CallOpts, GoBridge, GoBridgeOpts};
use crisp_e2e::harness::{
    container_status, cri_channel, cri_clients, host_network_sandbox, image_ref, remove_the_pod,
    require_root, run_pod_with, shell_container, wait_log_line, Containerd, ContainerdOpts,
    BUSYBOX_IMAGE, TRAPPED_LOOP,
};
use crisp_e2e::stack::{secs, Stack};
use k8s_cri::v1 as cri;
use prost::Message;

type Rt = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

const S: i64 = 1_000_000_000;

/// Lines of crisp's log that show connections being torn down under it: a GOAWAY from either
/// peer (crisp logs `runtime sent GOAWAY`), ENHANCE_YOUR_CALM (code 11), or a write to a closed
/// connection.
///
/// A "Broken pipe" is counted at WARN and above only: a client that closes its socket while
/// crisp writes to it (a `crisp-grpcgo call` process exiting) is logged at DEBUG as the end of
/// that client's connection, which is normal; a failed write towards the runtime is a warning.
fn crisp_teardown_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("GOAWAY")
                || (l.contains("Broken pipe") && !l.contains(" DEBUG ") && !l.contains(" TRACE "))
                || l.contains("error_code=11")
                || l.contains("ENHANCE_YOUR_CALM")
        })
        .collect()
}

fn assert_crisp_log_clean(crisp: &Crisp) {
    let log = crisp.log_text();
    let bad = crisp_teardown_lines(&log);
    assert!(
        bad.is_empty(),
        "crisp's log shows {} connection teardown line(s) under grpc-go peers, e.g.:\n{}",
        bad.len(),
        bad.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// CRI messages

/// A host-network sandbox labelled as kubelet labels a pod.
fn sandbox_config(name: &str, log_dir: &Path) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        labels: [
            ("io.kubernetes.pod.name".to_string(), name.to_string()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                "grpcgo".to_string(),
            ),
            ("io.kubernetes.pod.uid".to_string(), format!("{name}-uid")),
        ]
        .into(),
        ..host_network_sandbox(name, "grpcgo", log_dir)
    }
}

// ---------------------------------------------------------------------------------------------
// The peers themselves (no crisp): what a grpc-go client sends, and the bridge's fidelity.

/// `crisp-grpcgo headers`: prints what a client sends, one JSON line per request / PING.
struct HeaderDump {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl HeaderDump {
    fn start(sock: &Path) -> Result<HeaderDump> {
        let mut child = Command::new(grpcgo::grpcgo_binary()?)
            .arg("headers")
            .arg("--listen")
            .arg(sock)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().context("stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let first = rx.recv_timeout(Duration::from_secs(30))?;
        ensure!(first == "ready", "headers printed {first:?}");
        Ok(HeaderDump { child, lines: rx })
    }

    /// Every line printed so far (waits `settle` for stragglers).
    fn drain(&self, settle: Duration) -> Vec<serde_json::Value> {
        let mut v = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(settle) {
            if let Ok(j) = serde_json::from_str(&l) {
                v.push(j);
            }
        }
        v
    }
}

impl Drop for HeaderDump {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn header<'a>(req: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    req["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0] == name)
        .and_then(|h| h[1].as_str())
}

/// The premise of this file: what grpc-go 1.33 sends, measured on the wire with no crisp in
/// between — through the bridge (the path the e2e kubelet takes) and from `call`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcgo_client_sends_socket_path_authority_and_bdp_pings() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("crisp-grpcgo-").tempdir()?;
    let sock = dir.path().join("dump.sock");
    let dump = HeaderDump::start(&sock)?;
    let version = cri::VersionRequest {
        version: "0.1.0".into(),
    }
    .encode_to_vec();
    let path = "/runtime.v1.RuntimeService/Version";

    for (authority, expect) in [
        (None, sock.display().to_string()),
        (
            Some(percent_encoded_authority(&sock)),
            percent_encoded_authority(&sock),
        ),
        (Some("localhost".to_string()), "localhost".to_string()),
    ] {
        // Through the bridge, from tonic (as the e2e kubelet emulator calls).
        let bridge = GoBridge::start(
            &dir.path().join("bridge.sock"),
            &sock,
            GoBridgeOpts {
                authority: authority.clone(),
                ..Default::default()
            },
        )?;
        let mut rt = Rt::new(cri_channel(bridge.socket()).await?);
        for _ in 0..3 {
            // kubelet sets a deadline on every call: it must reach the far side as grpc-timeout.
            let mut req = tonic::Request::new(cri::VersionRequest {
                version: "0.1.0".into(),
            });
            req.set_timeout(Duration::from_secs(5));
            rt.version(req).await?;
        }
        drop(rt);
        let st = bridge.stats()?;
        drop(bridge);
        // And `call`.
        let out = grpcgo::call(
            &sock,
            path,
            &version,
            CallOpts {
                authority: authority.clone(),
                count: 3,
                ..Default::default()
            },
        )
        .await?;
        assert_eq!(out.summary.failed, 0, "{out:?}");

        let seen = dump.drain(Duration::from_millis(300));
        let reqs: Vec<_> = seen.iter().filter(|j| j.get("headers").is_some()).collect();
        assert_eq!(reqs.len(), 6, "{seen:#?}");
        for r in &reqs {
            assert_eq!(
                header(r, ":authority"),
                Some(expect.as_str()),
                "authority with --authority {authority:?}: {r}"
            );
            assert_eq!(header(r, ":path"), Some(path));
            assert_eq!(header(r, "content-type"), Some("application/grpc"));
            assert!(
                header(r, "user-agent").is_some_and(|u| u.starts_with("grpc-go/1.")),
                "{r}"
            );
            let timeout = header(r, "grpc-timeout")
                .with_context(|| format!("deadline not sent as grpc-timeout: {r}"))?;
            let micros: u64 = timeout
                .strip_suffix('u')
                .and_then(|t| t.parse().ok())
                .with_context(|| format!("grpc-go's grpc-timeout is in µs: {timeout}"))?;
            assert!((4_000_000..=10_000_000).contains(&micros), "{timeout}");
        }
        let bdp = seen.iter().filter(|j| j["bdp"] == true).count();
        eprintln!(
            "authority {expect:?}: {bdp} BDP PINGs for 6 calls; bridge upstream {:?}",
            st.upstream
        );
        assert!(
            bdp > 0,
            "grpc-go sent no BDP PING on receiving DATA: {seen:#?}"
        );
        assert!(st.upstream.bdp_pings_sent > 0, "{st:?}");
    }
    Ok(())
}

/// The bridge itself is transparent (no crisp): status code and message of a runtime error,
/// response bytes, a server stream (headers before the first event, every event), deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_is_transparent() -> Result<()> {
    require_root();
    let ctrd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let dir = tempfile::Builder::new().prefix("crisp-grpcgo-").tempdir()?;
    let bridge = GoBridge::start(
        &dir.path().join("b.sock"),
        ctrd.socket(),
        GoBridgeOpts::default(),
    )?;
    let mut direct = Rt::new(cri_channel(ctrd.socket()).await?);
    let mut via = Rt::new(cri_channel(bridge.socket()).await?);

    let v1 = direct
        .version(cri::VersionRequest {
            version: "0.1.0".into(),
        })
        .await?
        .into_inner();
    let v2 = via
        .version(cri::VersionRequest {
            version: "0.1.0".into(),
        })
        .await?
        .into_inner();
    assert_eq!(v1, v2);
    let missing = cri::ContainerStatusRequest {
        container_id: "does-not-exist".into(),
        verbose: false,
    };
    let e1 = direct
        .container_status(missing.clone())
        .await
        .expect_err("missing container");
    let e2 = via
        .container_status(missing)
        .await
        .expect_err("missing container");
    assert_eq!((e1.code(), e1.message()), (e2.code(), e2.message()));
    assert_eq!(e2.code(), tonic::Code::NotFound);
    let l1 = direct
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await?
        .into_inner();
    let l2 = via
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await?
        .into_inner();
    assert_eq!(l1, l2);

    // containerd 1.6 has no GetContainerEvents: Unimplemented comes back as it is. 1.7 and 2.x
    // stream it, and grpc-go sends the response headers with the first event only: with no
    // container starting, both sides wait alike.
    async fn events(rt: &mut Rt) -> Result<Result<(), tonic::Status>, tokio::time::error::Elapsed> {
        tokio::time::timeout(
            Duration::from_secs(2),
            rt.get_container_events(cri::GetEventsRequest {}),
        )
        .await
        .map(|r| r.map(drop))
    }
    let e1 = events(&mut direct).await;
    let e2 = events(&mut via).await;
    match (&e1, &e2) {
        (Ok(Err(a)), Ok(Err(b))) => assert_eq!((a.code(), a.message()), (b.code(), b.message())),
        (Ok(Ok(())), Ok(Ok(()))) | (Err(_), Err(_)) => {}
        _ => panic!("GetContainerEvents direct {e1:?}, through the bridge {e2:?}"),
    }

    // A deadline travels as grpc-timeout and is enforced on the far side too.
    let mut req = tonic::Request::new(cri::VersionRequest {
        version: "0.1.0".into(),
    });
    req.set_timeout(Duration::from_secs(3));
    via.version(req).await?;

    // A grpc-go server in front of the fake: a stream of 50 events arrives whole, and through a
    // second bridge (a grpc-go client) too; headers come through before the first message.
    let fake = fakert::serve_via_grpcgo(
        &dir.path().join("fake.sock"),
        Arc::new(Canned::new(30, 50)),
        GoBridgeOpts::default(),
    )?;
    let client = GoBridge::start(
        &dir.path().join("c.sock"),
        &fake.socket,
        GoBridgeOpts::default(),
    )?;
    let mut rt = Rt::new(cri_channel(client.socket()).await?);
    let t = Instant::now();
    let mut s = tokio::time::timeout(
        Duration::from_secs(5),
        rt.get_container_events(cri::GetEventsRequest {}),
    )
    .await
    .context("stream headers not forwarded")??
    .into_inner();
    eprintln!(
        "GetContainerEvents open through two bridges after {:?}",
        t.elapsed()
    );
    let mut n = 0;
    while let Some(_ev) = s.message().await? {
        n += 1;
    }
    assert_eq!(n, 50);
    let l = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await?
        .into_inner();
    assert_eq!(l.containers.len(), 30);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// crisp in front of containerd, kubelet's grpc-go client in front of crisp

/// RunPodSandbox → CreateContainer → StartContainer → StopContainer → RemoveContainer →
/// StopPodSandbox → RemovePodSandbox through a kubelet-style grpc-go client → crisp → containerd.
async fn lifecycle_through_grpcgo(authority: impl FnOnce(&Path) -> Option<String>) -> Result<()> {
    require_root();
    let ctrd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let crisp = Crisp::start(ctrd.socket(), CrispOpts::default())?;
    let dir = tempfile::Builder::new().prefix("crisp-grpcgo-").tempdir()?;
    let authority = authority(crisp.socket());
    eprintln!(
        "grpc-go client → crisp with :authority {:?}",
        authority
            .clone()
            .unwrap_or_else(|| crisp.socket().display().to_string())
    );
    let bridge = GoBridge::start(
        &dir.path().join("kubelet.sock"),
        crisp.socket(),
        GoBridgeOpts {
            authority,
            ..Default::default()
        },
    )?;
    let r = lifecycle(&ctrd, bridge.socket()).await;
    if r.is_err() {
        eprintln!(
            "--- crisp log ---\n{}\n--- bridge log ---\n{}",
            crisp.log_text(),
            bridge.log_text()
        );
    }
    r?;
    assert_crisp_log_clean(&crisp);
    let st = bridge.stats()?;
    assert_eq!(
        st.upstream.goaway_recv, 0,
        "crisp sent GOAWAY to the grpc-go client: {:?}",
        st.upstream.goaways
    );
    Ok(())
}

async fn lifecycle(ctrd: &Containerd, via: &Path) -> Result<()> {
    let (mut rt, mut img) = cri_clients(via).await?;
    let v = rt
        .version(cri::VersionRequest {
            version: "0.1.0".into(),
        })
        .await
        .context("Version through grpc-go → crisp")?
        .into_inner();
    assert_eq!(v.version, "0.1.0");
    let image = image_ref(&mut img, BUSYBOX_IMAGE)
        .await
        .context("through grpc-go → crisp")?;
    let log_dir = ctrd.dir().join("pods/grpcgo");
    std::fs::create_dir_all(&log_dir)?;
    let sb = sandbox_config("lifecycle", &log_dir);
    let app = shell_container("app", &image, TRAPPED_LOOP);
    let (pod, id) = run_pod_with(&mut rt, &sb, app)
        .await
        .context("through grpc-go → crisp")?;
    let st = container_status(&mut rt, &id).await?;
    assert_eq!(st.state, cri::ContainerState::ContainerRunning as i32);
    wait_log_line(
        &log_dir.join("app.log"),
        "trap-set",
        Duration::from_secs(10),
    )
    .await?;
    rt.stop_container(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: 5,
    })
    .await
    .context("StopContainer")?;
    let st = container_status(&mut rt, &id).await?;
    assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(st.exit_code, 0);
    remove_the_pod(&mut rt, &id, &pod).await
}

/// kubelet 1.20–1.27 / crictl: `:authority` = the bare socket path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_grpcgo_socket_path_authority() -> Result<()> {
    lifecycle_through_grpcgo(|_| None).await
}

/// kubelet 1.29: `:authority` = the socket path percent-encoded (`%2Frun%2F...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_grpcgo_percent_encoded_authority() -> Result<()> {
    lifecycle_through_grpcgo(|sock| Some(percent_encoded_authority(sock))).await
}

/// Other clients: `:authority: localhost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_grpcgo_localhost_authority() -> Result<()> {
    lifecycle_through_grpcgo(|_| Some("localhost".into())).await
}

/// crisp's main job with kubelet's transport: the kubelet emulator reaches crisp through
/// grpc-go (the `Stack` default); a sidecar listed first gets ready 2 s after it starts; the
/// app's CreateContainer is held until then, and returns OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_app_create_held_through_grpcgo() -> Result<()> {
    let st = Stack::start_with(
        crisp_e2e::stack::StackOpts {
            via_grpcgo: true,
            ..Default::default()
        },
        |_| {},
    )
    .await?;
    assert!(
        !st.bridges.is_empty(),
        "the kubelet must reach crisp through grpc-go"
    );
    let yaml = "name: held\nhostNetwork: true\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: 'exec:[\"test\",\"-f\",\"/tmp/ready\"]'\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 2; touch /tmp/ready; sleep 3600 & wait\"]\n  - name: app\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 0.1; done\"]\n";
    let pod = PodSpec::from_yaml(yaml)?.remove(0);
    let uid = st.kubelet.add_pod(pod)?;
    st.wait_all_running(&uid, Duration::from_secs(60)).await?;
    let gap = st.start_gap(&uid, "proxy", "app").await?;
    eprintln!("app started {:.3} s after the sidecar", secs(gap));
    assert!(
        gap >= 2 * S,
        "app started {:.3} s after the sidecar, before it was ready",
        secs(gap)
    );
    let creates = st
        .kubelet
        .journal()
        .container_calls("CreateContainer", "app");
    let held = creates
        .iter()
        .find(|c| c.is_ok())
        .context("no successful CreateContainer for the app")?;
    let took = held.done.expect("done") - held.sent;
    eprintln!("app CreateContainer took {took:?} through grpc-go → crisp");
    assert!(
        took >= Duration::from_millis(1000),
        "the app's CreateContainer was not held: {took:?} ({creates:?})"
    );
    st.delete_pod(&uid, Some(10), Duration::from_secs(60))
        .await?;
    assert_crisp_log_clean(&st.crisp);
    let stats = st.bridges[0].stats()?;
    assert_eq!(
        stats.upstream.goaway_recv, 0,
        "{:?}",
        stats.upstream.goaways
    );
    Ok(())
}

/// ~2,000 calls from grpc-go clients through crisp to containerd: passthrough calls (Version,
/// ListContainers, PodSandboxStatus) mixed with calls crisp observes (CreateContainer,
/// ContainerStatus, RemoveContainer), concurrently from two grpc-go connections. No call fails,
/// and no connection is torn down: no GOAWAY (in particular not ENHANCE_YOUR_CALM from
/// containerd's PING policing), no broken pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_grpcgo_clients_through_crisp_without_goaway() -> Result<()> {
    require_root();
    let ctrd = Containerd::start_async(ContainerdOpts { cni: false }).await?;
    let crisp = Crisp::start(ctrd.socket(), CrispOpts::default())?;
    let dir = tempfile::Builder::new().prefix("crisp-grpcgo-").tempdir()?;
    let bridge = GoBridge::start(
        &dir.path().join("kubelet.sock"),
        crisp.socket(),
        GoBridgeOpts::default(),
    )?;
    let r = soak(&ctrd, &crisp, &bridge).await;
    if r.is_err() {
        let log = crisp.log_text();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!(
            "--- crisp log (last 80 lines) ---\n{}\n--- bridge log ---\n{}",
            lines[lines.len().saturating_sub(80)..].join("\n"),
            bridge.log_text()
        );
    }
    r
}

async fn soak(ctrd: &Containerd, crisp: &Crisp, bridge: &GoBridge) -> Result<()> {
    let image = image_ref(&mut cri_clients(ctrd.socket()).await?.1, BUSYBOX_IMAGE).await?;
    let log_dir = ctrd.dir().join("pods/soak");
    std::fs::create_dir_all(&log_dir)?;
    let sb = sandbox_config("soak", &log_dir);
    let mut rt = Rt::new(cri_channel(bridge.socket()).await?);
    let (pod, base) = run_pod_with(
        &mut rt,
        &sb,
        shell_container("base", &image, "trap 'exit 0' TERM; sleep 3600 & wait"),
    )
    .await
    .context("through grpc-go → crisp")?;

    // A pure grpc-go client straight to crisp, concurrently: 1,000 Versions.
    let version = cri::VersionRequest {
        version: "0.1.0".into(),
    }
    .encode_to_vec();
    let direct_go = grpcgo::call(
        crisp.socket(),
        "/runtime.v1.RuntimeService/Version",
        &version,
        CallOpts {
            count: 1000,
            concurrency: 4,
            ..Default::default()
        },
    );

    // Through the bridge (one grpc-go connection to crisp): 4 workers, 1,000 calls in all.
    const WORKERS: usize = 4;
    const PER_WORKER: usize = 250;
    let t0 = Instant::now();
    let workers = (0..WORKERS).map(|w| {
        let (mut rt, pod, base, sb, image) = (
            rt.clone(),
            pod.clone(),
            base.clone(),
            sb.clone(),
            image.clone(),
        );
        async move {
            let mut calls = 0usize;
            let mut failures: Vec<String> = Vec::new();
            let mut note = |what: &str, r: std::result::Result<(), tonic::Status>| {
                calls += 1;
                if let Err(e) = r {
                    failures.push(format!("{what}: {:?}: {}", e.code(), e.message()));
                }
            };
            for i in 0..PER_WORKER {
                match i % 10 {
                    0 => {
                        // Observed by crisp: CreateContainer, its status, RemoveContainer.
                        let name = format!("c{w}-{i}");
                        match rt
                            .create_container(cri::CreateContainerRequest {
                                pod_sandbox_id: pod.clone(),
                                config: Some(shell_container(&name, &image, "true")),
                                sandbox_config: Some(sb.clone()),
                            })
                            .await
                        {
                            Ok(r) => {
                                note("CreateContainer", Ok(()));
                                let id = r.into_inner().container_id;
                                let r = rt
                                    .container_status(cri::ContainerStatusRequest {
                                        container_id: id.clone(),
                                        verbose: false,
                                    })
                                    .await;
                                note("ContainerStatus(new)", r.map(drop));
                                let r = rt
                                    .remove_container(cri::RemoveContainerRequest {
                                        container_id: id,
                                    })
                                    .await;
                                note("RemoveContainer", r.map(drop));
                            }
                            Err(e) => note("CreateContainer", Err(e)),
                        }
                    }
                    1 | 4 | 7 => {
                        let r = rt
                            .container_status(cri::ContainerStatusRequest {
                                container_id: base.clone(),
                                verbose: i % 2 == 0,
                            })
                            .await;
                        note("ContainerStatus", r.map(drop));
                    }
                    2 | 5 => {
                        let r = rt
                            .list_containers(cri::ListContainersRequest { filter: None })
                            .await;
                        note("ListContainers", r.map(drop));
                    }
                    3 | 8 => {
                        let r = rt
                            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                                pod_sandbox_id: pod.clone(),
                                verbose: false,
                            })
                            .await;
                        note("PodSandboxStatus", r.map(drop));
                    }
                    _ => {
                        let r = rt
                            .version(cri::VersionRequest {
                                version: "0.1.0".into(),
                            })
                            .await;
                        note("Version", r.map(drop));
                    }
                }
            }
            (calls, failures)
        }
    });
    let (results, go) = tokio::join!(futures_util::future::join_all(workers), direct_go);
    let go = go?;
    let elapsed = t0.elapsed();
    let calls: usize = results.iter().map(|r| r.0).sum();
    let failures: Vec<&String> = results.iter().flat_map(|r| r.1.iter()).collect();
    let stats = bridge.stats()?;
    eprintln!(
        "soak: {calls} calls through the bridge + {} from `call` in {elapsed:?}; {} + {} failed; `call` p50 {:.2} ms p99 {:.2} ms",
        go.summary.ok + go.summary.failed,
        failures.len(),
        go.summary.failed,
        go.summary.p50_ms,
        go.summary.p99_ms
    );
    eprintln!("bridge → crisp wire: {:?}", stats.upstream);
    eprintln!("`call` → crisp wire: {:?}", go.summary.wire);

    ensure!(
        failures.is_empty() && go.summary.failed == 0,
        "{} of {calls} calls through the grpc-go bridge failed (first: {:?}); `call`: {} of 1000 failed (first: {:?}, codes {:?})",
        failures.len(),
        failures.iter().take(5).collect::<Vec<_>>(),
        go.summary.failed,
        go.summary.first_error,
        go.summary.codes
    );
    ensure!(
        calls + (go.summary.ok as usize) >= 2000,
        "only {calls} + {} calls",
        go.summary.ok
    );
    let bad = crisp_teardown_lines(&crisp.log_text())
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>();
    ensure!(
        bad.is_empty(),
        "crisp's log shows {} connection teardown line(s), e.g.:\n{}",
        bad.len(),
        bad.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    ensure!(
        stats.upstream.goaway_recv == 0 && go.summary.wire.goaway_recv == 0,
        "GOAWAY reached a grpc-go client: {:?} {:?}",
        stats.upstream.goaways,
        go.summary.wire.goaways
    );
    // The test exercised grpc-go's PINGs (else it proves nothing about them).
    ensure!(
        stats.upstream.bdp_pings_sent + go.summary.wire.bdp_pings_sent > 0,
        "grpc-go sent no BDP PING"
    );

    rt.stop_container(cri::StopContainerRequest {
        container_id: base.clone(),
        timeout: 5,
    })
    .await?;
    rt.remove_container(cri::RemoveContainerRequest { container_id: base })
        .await?;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: pod.clone(),
    })
    .await?;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod,
    })
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// grpc-go on both sides of crisp: a grpc-go server (PING policing) in front of the fake runtime

/// kubelet-style grpc-go clients → crisp → a grpc-go server (grpc-go's default keep-alive
/// enforcement, as containerd) → the fast fake runtime. Large answers (ListContainers of 3,000
/// containers) make both grpc-go ends send BDP PINGs; a server stream of 200 events flows
/// through; the grpc-go server never has to tell crisp ENHANCE_YOUR_CALM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcgo_on_both_sides_of_crisp() -> Result<()> {
    let dir = tempfile::Builder::new().prefix("crisp-grpcgo-").tempdir()?;
    let runtime = fakert::serve_via_grpcgo(
        &dir.path().join("runtime.sock"),
        Arc::new(Canned::new(3000, 200)),
        GoBridgeOpts::default(),
    )?;
    let crisp = Crisp::start(&runtime.socket, CrispOpts::default())?;
    let kubelet = GoBridge::start(
        &dir.path().join("kubelet.sock"),
        crisp.socket(),
        GoBridgeOpts::default(),
    )?;
    let r = both_sides(&crisp, &kubelet).await;
    let server = runtime.bridge.as_ref().expect("grpc-go server").stats()?;
    eprintln!("grpc-go server ← crisp wire: {:?}", server.downstream);
    if r.is_err() {
        eprintln!(
            "--- crisp log ---\n{}\n--- kubelet-side bridge log ---\n{}\n--- runtime-side bridge log ---\n{}",
            crisp.log_text(),
            kubelet.log_text(),
            runtime.bridge.as_ref().unwrap().log_text()
        );
    }
    r?;
    ensure!(
        server.downstream.goaway_sent == 0,
        "the grpc-go server sent crisp GOAWAY: {:?}",
        server.downstream.goaways
    );
    assert_crisp_log_clean(&crisp);
    Ok(())
}

async fn both_sides(crisp: &Crisp, kubelet: &GoBridge) -> Result<()> {
    let version = cri::VersionRequest {
        version: "0.1.0".into(),
    }
    .encode_to_vec();
    let list = cri::ListContainersRequest { filter: None }.encode_to_vec();
    let (a, b, events) = tokio::join!(
        grpcgo::call(
            crisp.socket(),
            "/runtime.v1.RuntimeService/Version",
            &version,
            CallOpts {
                count: 1500,
                concurrency: 4,
                ..Default::default()
            }
        ),
        grpcgo::call(
            crisp.socket(),
            "/runtime.v1.RuntimeService/ListContainers",
            &list,
            CallOpts {
                count: 100,
                concurrency: 2,
                ..Default::default()
            }
        ),
        async {
            let mut rt = Rt::new(cri_channel(kubelet.socket()).await?);
            let mut total = 0;
            for _ in 0..5 {
                let mut s = rt
                    .get_container_events(cri::GetEventsRequest {})
                    .await?
                    .into_inner();
                while let Some(_ev) = s.message().await? {
                    total += 1;
                }
            }
            anyhow::Ok(total)
        }
    );
    let (a, b) = (a?, b?);
    eprintln!(
        "Version: {} ok {} failed p50 {:.2} ms p99 {:.2} ms; wire {:?}",
        a.summary.ok, a.summary.failed, a.summary.p50_ms, a.summary.p99_ms, a.summary.wire
    );
    eprintln!(
        "ListContainers: {} ok {} failed p50 {:.2} ms p99 {:.2} ms; wire {:?}",
        b.summary.ok, b.summary.failed, b.summary.p50_ms, b.summary.p99_ms, b.summary.wire
    );
    ensure!(
        a.summary.failed == 0,
        "Version through crisp: {:?} {:?}",
        a.summary.first_error,
        a.summary.codes
    );
    ensure!(
        b.summary.failed == 0,
        "ListContainers through crisp: {:?} {:?}",
        b.summary.first_error,
        b.summary.codes
    );
    let events = events.context("GetContainerEvents through grpc-go → crisp → grpc-go")?;
    ensure!(events == 5 * 200, "{events} events of 1000");
    ensure!(
        a.summary.wire.goaway_recv == 0 && b.summary.wire.goaway_recv == 0,
        "{:?} {:?}",
        a.summary.wire.goaways,
        b.summary.wire.goaways
    );
    Ok(())
}
