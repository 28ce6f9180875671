//! Issue #19 end to end: readiness probes of CNI pods run inside the pod's network namespace,
//! and a pod annotation may aim them only at the pod's own addresses. Real containerd with the
//! CNI bridge, kubelet's grpc-go transport into crisp. Orders are asserted from containerd's own
//! `started_at`; "crisp connected nowhere else" from accepts counted at a listener on the node.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use crisp_e2e::emulator::PodSpec;
use crisp_e2e::stack::{secs, Stack};

const STEP: Duration = Duration::from_secs(60);
const S: i64 = 1_000_000_000;

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

const APP: &str = "  - name: app\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 0.1; done\"]\n";

/// (a) A sidecar that listens only on 127.0.0.1 *inside its pod*, annotated
/// `http://127.0.0.1:PORT/`: crisp probes the pod's loopback, so the app starts once the sidecar
/// serves (2 s after it starts), well before the 10 s start timeout. Before issue #19 crisp
/// probed the node's loopback, found nothing and released the app only by the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_on_pod_loopback_orders_the_pod() -> Result<()> {
    let st = Stack::start(true, "", |_| {}).await?;
    let yaml = format!(
        "name: loopback\nnamespace: tenant\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"http://127.0.0.1:18081/\"\n  crisp.dev/start-timeout: 10s\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 2; mkdir -p /www; echo ok > /www/index.html; httpd -f -p 127.0.0.1:18081 -h /www & wait\"]\n{APP}"
    );
    let uid = st.run_pod(pod(&yaml), STEP).await?;
    let gap = st.start_gap(&uid, "proxy", "app").await?;
    eprintln!("app started {:.3} s after the sidecar", secs(gap));
    let log = st.crisp.log_text();
    assert!(
        gap >= 2 * S,
        "app started {:.3} s after the sidecar, before it served",
        secs(gap)
    );
    assert!(
        !log.contains("starting the app anyway"),
        "the app was released by the start timeout, not by readiness:\n{log}"
    );
    assert!(
        gap < 6 * S,
        "app started {:.3} s after the sidecar: not released by readiness",
        secs(gap)
    );
    assert!(
        log.contains("probing from the pod's network namespace"),
        "{log}"
    );
    st.delete_pod(&uid, Some(5), STEP).await?;
    Ok(())
}

/// (b) Annotations aimed at the node: one at an address of the node that is not the pod's (the
/// CNI bridge's gateway), one at `127.0.0.1` (the pod's loopback now, the node's before). A
/// listener on the node on that port on every address gets not one connection from crisp; the
/// first annotation is reported once as malformed (naming pod and key) and treated as absent
/// (`running`), the second finds nothing in the pod and the app waits out its start timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_aimed_at_the_node_reach_nothing() -> Result<()> {
    let st = Stack::start(true, "", |_| {}).await?;
    let gateway = cni_gateway(&st)?;
    let (port, accepts, server) = node_listener().await?;
    let yaml = format!(
        "name: aimed\nnamespace: tenant\nannotations:\n  crisp.dev/sidecars: elsewhere, loop\n  crisp.dev/ready.elsewhere: \"tcp://{gateway}:{port}\"\n  crisp.dev/ready.loop: \"http://127.0.0.1:{port}/pods\"\n  crisp.dev/start-timeout: 3s\ncontainers:\n  - name: elsewhere\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n  - name: loop\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n{APP}"
    );
    let uid = st.run_pod(pod(&yaml), STEP).await?;
    let (elsewhere, loop_, app) = (
        st.status(&uid, "elsewhere").await?,
        st.status(&uid, "loop").await?,
        st.status(&uid, "app").await?,
    );
    let log = st.crisp.log_text();
    assert_eq!(
        accepts.load(Ordering::SeqCst),
        0,
        "crisp connected to the node's listener on behalf of the pod:\n{log}"
    );
    // The node really answers at both addresses (the bridge's gateway exists once a pod runs):
    // crisp would have been let in.
    tokio::net::TcpStream::connect((gateway, port))
        .await
        .context("the node's listener at the gateway")?;
    tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .context("the node's listener at loopback")?;
    assert_eq!(wait_accepts(&accepts, 2).await, 2);
    // `elsewhere` counted as `running`: `loop` was created right after it.
    assert!(
        loop_.started_at - elsewhere.started_at < 2 * S,
        "the bad annotation held the pod"
    );
    // `loop` never got ready in its pod: the app waited out the 3 s start timeout.
    let gap = app.started_at - loop_.started_at;
    assert!(
        gap >= 3 * S,
        "app started {:.3} s after `loop`: something answered crisp's probe",
        secs(gap)
    );
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("annotation crisp.dev/ready.elsewhere="))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning per pod, not per probe:\n{log}"
    );
    assert!(
        warnings[0].contains("aimed")
            && warnings[0].contains("tenant")
            && warnings[0].contains("not one of the pod's own addresses"),
        "{}",
        warnings[0]
    );
    assert!(
        !log.contains("annotation crisp.dev/ready.loop="),
        "loopback is the pod's own address:\n{log}"
    );
    st.delete_pod(&uid, Some(5), STEP).await?;
    server.abort();
    Ok(())
}

/// The gateway of the stack's CNI bridge (the pod subnet's first address): an address of the
/// node that is not the pod's.
pub(crate) fn cni_gateway(st: &Stack) -> Result<std::net::Ipv4Addr> {
    let subnet = st.containerd.cni_subnet().context("no CNI subnet")?;
    let net: std::net::Ipv4Addr = subnet
        .split('/')
        .next()
        .unwrap_or_default()
        .parse()
        .context("CNI subnet")?;
    Ok(std::net::Ipv4Addr::from(u32::from(net) + 1))
}

/// A listener on the node, on every address, that counts the connections it accepts and
/// answers like a service would (the kubelet read-only port answers 200): its port, the count,
/// and its task.
pub(crate) async fn node_listener() -> Result<(u16, Arc<AtomicUsize>, tokio::task::JoinHandle<()>)>
{
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
    let port = listener.local_addr()?.port();
    let accepts = Arc::new(AtomicUsize::new(0));
    let counter = accepts.clone();
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            let _ = tokio::io::AsyncWriteExt::write_all(&mut s, b"HTTP/1.0 200 OK\r\n\r\n").await;
        }
    });
    Ok((port, accepts, server))
}

/// Waits until `n` connections were accepted (bounded); returns the count.
async fn wait_accepts(accepts: &AtomicUsize, n: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while accepts.load(Ordering::SeqCst) < n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    accepts.load(Ordering::SeqCst)
}
