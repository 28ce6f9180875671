//! Issue #35 item 2 end to end: pods of an isolated runtime handler are probed at their pod IP
//! from crisp's own network namespace, never inside the sandbox's host-side one — because that
//! namespace does not hold the pod IP (issue #44: evidence, not the handler's name) — and then
//! at nothing but their own IPs.
//!
//! The isolated handler is `isolated` in hack/containerd.sh: runc behind hack/isolated-runc,
//! which gives each pod's containers a network namespace of their own ("the guest") behind the
//! one CNI set up, reachable only through the pod IP — Kata's tcfilter networking in shape. The
//! pod IP leaves the host-side namespace (whose path containerd keeps reporting), and nothing
//! listens on that namespace's loopback: crisp's old probes of `127.0.0.1:PORT` or of the pod
//! IP from inside it reached nothing, as with Kata or gVisor. gVisor itself was tried first:
//! Debian's runsc (0.0~20221219) behind the runc shim cannot start a networked sandbox on this
//! machine ("cannot run with network enabled in root network namespace", even standalone with
//! `runsc run` and a named network namespace), so the tests use the wrapper. Kubelet's call
//! order comes from the emulator over grpc-go; times from containerd's own records.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use crisp_e2e::emulator::PodSpec;
use crisp_e2e::stack::{secs, Stack};
use crisp_e2e::tapcli::crisp_pods;
use k8s_cri::v1 as cri;

const STEP: Duration = Duration::from_secs(90);
const S: i64 = 1_000_000_000;

/// crisp's probe interval in these tests: long enough that "within one interval" is a bound
/// a loaded machine keeps, far below the 20 s start timeout main waited out.
const INTERVAL_MS: i64 = 500;

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

const APP: &str = "  - name: app\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 0.1; done\"]\n";

async fn stack() -> Result<Stack> {
    Stack::start(
        true,
        &format!("[ordering]\nprobe_interval = \"{INTERVAL_MS}ms\"\n"),
        |_| {},
    )
    .await
}

fn wall_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// The pod IP of pod `uid` and its runtime handler, as containerd reports them, once it has an
/// IP. (The handler is how crisp classifies a pod it learns of after a restart.)
async fn pod_ip(st: &Stack, uid: &str) -> Result<(IpAddr, String)> {
    let mut rt = st.direct().await?;
    let deadline = tokio::time::Instant::now() + STEP;
    while tokio::time::Instant::now() < deadline {
        let filter = cri::PodSandboxFilter {
            label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
            ..Default::default()
        };
        let sandboxes = rt
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await?
            .into_inner()
            .items;
        for sb in sandboxes {
            let status = rt
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: sb.id,
                    verbose: false,
                })
                .await?
                .into_inner()
                .status;
            let handler = status
                .as_ref()
                .map(|s| s.runtime_handler.clone())
                .unwrap_or_default();
            if let Some(ip) = status
                .and_then(|s| s.network)
                .and_then(|n| n.ip.parse().ok())
            {
                return Ok((ip, handler));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("pod {uid} has no IP after {STEP:?}")
}

/// When `addr` first accepts a TCP connection from the node's namespace (wall clock, ns):
/// polled every 5 ms, so at most that late.
async fn first_accept(addr: SocketAddr) -> Result<i64> {
    let deadline = tokio::time::Instant::now() + STEP;
    while tokio::time::Instant::now() < deadline {
        let attempt = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        );
        if let Ok(Ok(_)) = attempt.await {
            return Ok(wall_ns());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    bail!("{addr} never accepted a connection")
}

/// (a) An isolated pod whose sidecar serves on all its addresses 3 s after it starts, annotated
/// `http://:PORT/` (the pod IP): crisp probes the pod IP from the node's namespace, as kubelet
/// does, and creates the app within one probe interval of the sidecar's readiness (seen by this
/// test's own 5 ms probe from the node). On main crisp probed the pod IP from inside the
/// sandbox's host-side namespace, where the wrapper left no address, and the app waited out the
/// whole 20 s start timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_sidecar_is_judged_ready_through_the_pod_ip() -> Result<()> {
    let st = stack().await?;
    let yaml = format!(
        "name: isolated\nnamespace: tenant\nruntimeClassName: isolated\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"http://:18082/\"\n  crisp.dev/start-timeout: 20s\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3; mkdir -p /www; echo ok > /www/index.html; httpd -f -p 18082 -h /www & wait\"]\n{APP}"
    );
    let uid = st.kubelet.add_pod(pod(&yaml))?;
    let (ip, handler) = pod_ip(&st, &uid).await?;
    assert_eq!(handler, "isolated", "the runtime reports the pod's handler");
    let ready_at = first_accept(SocketAddr::new(ip, 18082)).await?;
    st.wait_all_running(&uid, STEP).await?;
    let (proxy, app) = (
        st.status(&uid, "proxy").await?,
        st.status(&uid, "app").await?,
    );
    let log = st.crisp.log_text();
    let after_ready = app.created_at - ready_at;
    eprintln!(
        "pod IP {ip}; app created {:.3} s after the sidecar served ({:.3} s after it started)",
        secs(after_ready),
        secs(app.created_at - proxy.started_at)
    );
    assert!(
        app.created_at - proxy.started_at >= 3 * S,
        "app created {:.3} s after the sidecar started, before it served:\n{log}",
        secs(app.created_at - proxy.started_at)
    );
    assert!(
        !log.contains("starting the app anyway"),
        "the app was released by the start timeout, not by readiness:\n{log}"
    );
    assert!(
        after_ready <= INTERVAL_MS * 1_000_000 + S / 2,
        "app created {:.3} s after the sidecar served: more than one probe interval ({INTERVAL_MS} ms) and 0.5 s of slack:\n{log}",
        secs(after_ready)
    );
    assert!(
        log.contains("the pod's network is out of crisp's reach"),
        "the pod was not found isolated:\n{log}"
    );
    assert!(
        !log.contains("probing from the pod's network namespace"),
        "crisp entered the sandbox's host-side namespace:\n{log}"
    );
    st.delete_pod(&uid, Some(5), STEP).await?;
    Ok(())
}

/// (b) An isolated pod whose sidecar is probed at `127.0.0.1` (its loopback is the guest's, out
/// of any namespace crisp may enter: an Envoy admin port): crisp says so once, naming the pod (log line and
/// `crisp pods`), and falls back to the pod's policy (proceed) at once — the app is created
/// well before the 20 s start timeout main waited out, and never by that timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_loopback_only_sidecar_is_reported_at_once() -> Result<()> {
    let st = stack().await?;
    let yaml = format!(
        "name: isolated-lo\nnamespace: tenant\nruntimeClassName: isolated\nannotations:\n  crisp.dev/sidecars: envoy\n  crisp.dev/ready.envoy: \"http://127.0.0.1:15000/ready\"\n  crisp.dev/start-timeout: 20s\ncontainers:\n  - name: envoy\n    command: [sh, -c, \"trap 'exit 0' TERM; mkdir -p /www; echo ok > /www/ready; httpd -f -p 127.0.0.1:15000 -h /www & wait\"]\n{APP}"
    );
    let uid = st.run_pod(pod(&yaml), STEP).await?;
    let gap = st.start_gap(&uid, "envoy", "app").await?;
    let log = st.crisp.log_text();
    eprintln!("app started {:.3} s after the sidecar", secs(gap));
    assert!(
        gap < 5 * S,
        "app started {:.3} s after the sidecar: the hold waited for a probe that cannot succeed:\n{log}",
        secs(gap)
    );
    assert!(
        !log.contains("starting the app anyway"),
        "released by the start timeout, not at once:\n{log}"
    );
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot be probed in an isolated pod"))
        .collect();
    assert_eq!(said.len(), 1, "said once per pod:\n{log}");
    assert!(
        said[0].contains("isolated-lo")
            && said[0].contains("tenant")
            && said[0].contains("handler isolated"),
        "{}",
        said[0]
    );
    let pods = crisp_pods(&st, "tenant/isolated-lo")?;
    let p = &pods["pods"][0];
    assert_eq!(
        p["isolation"].as_str(),
        Some("isolated (handler isolated)"),
        "{pods}"
    );
    let result = p["sidecars"][0]["last_probe_result"].as_str().unwrap_or("");
    assert!(
        result.contains("cannot be probed in an isolated pod"),
        "{pods}"
    );
    st.delete_pod(&uid, Some(5), STEP).await?;
    Ok(())
}

/// (c) Unchanged for a shared-kernel handler named explicitly (`runc`, in the default list):
/// a sidecar on its pod's loopback is probed inside the pod's network namespace and orders the
/// pod, as before. (A guard against the change, not a test main fails: main did this too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_kernel_pod_is_probed_in_its_namespace_as_before() -> Result<()> {
    let st = stack().await?;
    let yaml = format!(
        "name: runc-lo\nnamespace: tenant\nruntimeClassName: runc\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"http://127.0.0.1:18083/\"\n  crisp.dev/start-timeout: 20s\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 2; mkdir -p /www; echo ok > /www/index.html; httpd -f -p 127.0.0.1:18083 -h /www & wait\"]\n{APP}"
    );
    let uid = st.run_pod(pod(&yaml), STEP).await?;
    let gap = st.start_gap(&uid, "proxy", "app").await?;
    let log = st.crisp.log_text();
    eprintln!("app started {:.3} s after the sidecar", secs(gap));
    assert!(
        gap >= 2 * S,
        "app started before the sidecar served:\n{log}"
    );
    assert!(gap < 8 * S, "not released by readiness:\n{log}");
    assert!(
        log.contains("probing from the pod's network namespace"),
        "{log}"
    );
    assert!(
        !log.contains("the pod's network is out of crisp's reach"),
        "{log}"
    );
    let pods = crisp_pods(&st, "tenant/runc-lo")?;
    assert_eq!(
        pods["pods"][0]["isolation"].as_str(),
        Some("shared kernel (handler runc)"),
        "{pods}"
    );
    st.delete_pod(&uid, Some(5), STEP).await?;
    Ok(())
}

/// Issue #44: `probe_netns::annotations_aimed_at_the_node_reach_nothing` for an isolated pod.
/// The operator allowed every IPv4 address in `probe_allow` (so the CNI bridge's gateway, an
/// address of the node, too); an isolated pod aims `tcp://GATEWAY:PORT` and `http://GATEWAY:PORT/` at a listener on the node.
/// Probed from crisp's own namespace such a probe would carry the node's source address past
/// the pod's NetworkPolicy: the listener gets not one connection, and each annotation is
/// reported once as not one of the pod's own addresses. On bde328c crisp connected to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_pods_aimed_at_the_node_reach_nothing() -> Result<()> {
    // The operator's worst case: every IPv4 address allowed for pods' own annotations.
    let st = Stack::start(
        true,
        &format!(
            "[ordering]\nprobe_interval = \"{INTERVAL_MS}ms\"\nprobe_allow = [\"0.0.0.0/0\"]\n"
        ),
        |_| {},
    )
    .await?;
    let gateway = crate::probe_netns::cni_gateway(&st)?;
    let (port, accepts, server) = crate::probe_netns::node_listener().await?;
    let yaml = format!(
        "name: isolated-aimed\nnamespace: tenant\nruntimeClassName: isolated\nannotations:\n  crisp.dev/sidecars: a, b\n  crisp.dev/ready.a: \"tcp://{gateway}:{port}\"\n  crisp.dev/ready.b: \"http://{gateway}:{port}/pods\"\n  crisp.dev/start-timeout: 3s\ncontainers:\n  - name: a\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n  - name: b\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n{APP}"
    );
    let uid = st.run_pod(pod(&yaml), STEP).await?;
    let log = st.crisp.log_text();
    assert_eq!(
        accepts.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "crisp connected to the node's listener on behalf of an isolated pod:\n{log}"
    );
    // The node answers there (crisp would have been let in).
    tokio::net::TcpStream::connect((gateway, port))
        .await
        .context("the node's listener at the gateway")?;
    for key in ["crisp.dev/ready.a=", "crisp.dev/ready.b="] {
        let said: Vec<&str> = log.lines().filter(|l| l.contains(key)).collect();
        assert_eq!(said.len(), 1, "{key}: once per pod:\n{log}");
        assert!(
            said[0].contains("not one of the pod's own addresses"),
            "{}",
            said[0]
        );
    }
    st.delete_pod(&uid, Some(5), STEP).await?;
    server.abort();
    Ok(())
}
