//! Issue #21 end to end: an operator sees what crisp is doing while it holds a pod — in
//! `crisp tap` (hold events), in `crisp pods`, and where kubectl looks (the container's waiting
//! reason, from a long hold ended as an informative refusal). Real containerd, the kubelet
//! emulator through grpc-go, the real `crisp` binary for the CLI.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crisp_e2e::crisp::crisp_binary;
use crisp_e2e::emulator::{ContainerState, PodSpec};
use crisp_e2e::stack::{secs, Stack};
use crisp_e2e::tapcli::{crisp_pods, TapCli};
use serde_json::Value;

const STEP: Duration = Duration::from_secs(60);
const S: i64 = 1_000_000_000;

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

const APP: &str = "  - name: app\n    command: [sh, -c, \"trap 'exit 0' TERM; while true; do sleep 0.1; done\"]\n";

/// A host-network pod whose sidecar is ready once something listens on 127.0.0.1:`port` — the
/// test itself, when it chooses.
fn tcp_pod(name: &str, port: u16, start_timeout: &str) -> String {
    format!(
        "name: {name}\nhostNetwork: true\nterminationGracePeriodSeconds: 2\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: \"tcp://:{port}\"\n  crisp.dev/start-timeout: {start_timeout}\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n{APP}"
    )
}

/// A port nothing listens on (yet).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn contains(v: &Value, key: &str, text: &str) -> bool {
    v[key].as_str().is_some_and(|s| s.contains(text))
}

/// The "what must be shown": a sidecar that is not ready, a long start timeout; while
/// the app's CreateContainer is held, `crisp tap` has printed the hold with its reason and
/// `crisp pods` shows the last probe error and the time left. Then the sidecar turns ready and
/// the tap prints the hold's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_pod_is_visible_in_tap_and_pods_while_it_is_held() -> Result<()> {
    let st = Stack::start(false, "", |_| {}).await?;
    let port = free_port()?;
    let tap = TapCli::start(&st, &["--json", "--pod", "default/held"])?;
    let uid = st.kubelet.add_pod(pod(&tcp_pod("held", port, "60s")))?;

    // (a) The tap shows the hold while it lasts, with what it waits for and why.
    let refused = format!("127.0.0.1:{port}");
    let hold = tap.wait_for(Duration::from_secs(30), "hold event for the app", |v| {
        v["hold"].is_string()
            && v["container_name"] == "app"
            && v["method"] == "CreateContainer"
            && (v["hold"] == "start" || v["hold"] == "update")
    });
    let hold = match hold {
        Ok(h) => h,
        Err(e) => {
            st.dump(&uid);
            return Err(e);
        }
    };
    eprintln!("tap: {hold}");
    assert_eq!(hold["pod_namespace"], "default");
    assert_eq!(hold["pod_name"], "held");
    assert_eq!(hold["waiting_on"], "proxy");
    assert_eq!(hold["reason"], "not ready");
    assert_eq!(hold["probe"], format!("tcp://:{port}"));
    assert!(
        contains(&hold, "probe_result", &refused) && contains(&hold, "probe_result", "refused"),
        "the probe's last error: {hold}"
    );
    assert_eq!(hold["policy"], "proceed");

    // (b) `crisp pods` shows it held now: the probe error, and the time left before the timeout.
    let pods = crisp_pods(&st, "default/held")?;
    eprintln!("crisp pods: {pods}");
    let p = &pods["pods"][0];
    assert_eq!(p["name"], "held");
    assert_eq!(p["start_timeout_ms"], 60_000);
    let side = &p["sidecars"][0];
    assert_eq!(
        (side["name"].as_str(), side["state"].as_str()),
        (Some("proxy"), Some("running"))
    );
    assert!(contains(side, "last_probe_result", "refused"), "{side}");
    assert!(side["last_probe_time"].is_string(), "{side}");
    let held = &p["held"][0];
    assert_eq!(held["container_name"], "app");
    assert_eq!(held["waiting_on"], "proxy");
    assert!(contains(held, "probe_result", &refused), "{held}");
    let left = held["time_left_ms"].as_u64().context("time_left_ms")?;
    assert!(
        left > 0 && left < 60_000,
        "time left {left} ms, expected within the 60 s start timeout"
    );

    // The sidecar turns ready: the hold ends, forwarded, and the app runs.
    let _listener = TcpListener::bind(("127.0.0.1", port))?;
    let end = tap.wait_for(Duration::from_secs(30), "end of the hold", |v| {
        v["hold"] == "end" && v["container_name"] == "app"
    })?;
    assert_eq!(end["outcome"], "forwarded", "{end}");
    st.wait_all_running(&uid, STEP).await?;
    assert!(
        crisp_pods(&st, "default/held")?["pods"][0]["held"]
            .as_array()
            .is_some_and(|h| h.is_empty()),
        "nothing held any more"
    );
    Ok(())
}

/// `crisp pods` without crisp: the error names the socket and the fix.
#[test]
fn crisp_pods_without_an_admin_socket_says_where_and_what_to_do() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("admin.sock");
    let out = Command::new(crisp_binary()?)
        .arg("pods")
        .arg("--admin-socket")
        .arg(&path)
        .output()?;
    assert_eq!(out.status.code(), Some(69), "EX_UNAVAILABLE");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&path.display().to_string()) && err.contains("is crisp running"),
        "{err}"
    );
    Ok(())
}

/// Item 4: with `refuse_held_after`, a long hold ends as a refusal whose message kubelet keeps
/// as the app's waiting reason (what `kubectl describe` shows); kubelet retries within ~1.5 s
/// ("network is not ready"), and once the sidecar is ready the app starts once, restartCount 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_hold_shows_its_reason_where_kubectl_looks() -> Result<()> {
    let st = Stack::start(false, "[ordering]\nrefuse_held_after = \"2s\"\n", |_| {}).await?;
    let port = free_port()?;
    let uid = st.kubelet.add_pod(pod(&tcp_pod("why", port, "60s")))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        let app = st
            .kubelet
            .container_statuses(&uid)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.name == "app");
        if let Some(ContainerState::Waiting { reason, message }) = app.map(|a| a.state) {
            if reason == "CreateContainerError" {
                break message;
            }
        }
        if Instant::now() > deadline {
            st.dump(&uid);
            bail!("the app never showed crisp's reason");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("kubectl would show: CreateContainerError: {message}");
    assert!(
        message.contains(&format!(
            "crisp: waiting for sidecar proxy of default/why: not ready: connect 127.0.0.1:{port}"
        )),
        "{message}"
    );
    assert!(message.contains("held 2 s of 60 s"), "{message}");

    let _listener = TcpListener::bind(("127.0.0.1", port))?;
    st.wait_all_running(&uid, STEP).await?;
    let creates = st
        .kubelet
        .journal()
        .container_calls("CreateContainer", "app");
    assert!(creates.len() >= 2, "{creates:?}");
    // kubelet came back fast: "network is not ready" in the message (KUBELET-CRI §1.3).
    for w in creates.windows(2) {
        let gap = w[1].sent.duration_since(w[0].done.context("done")?);
        assert!(
            gap < Duration::from_millis(2500),
            "kubelet retried {gap:?} after a refusal"
        );
    }
    assert_eq!(
        st.instances(&uid, "app").await?.len(),
        1,
        "no orphaned app container"
    );
    let view = st.kubelet.pod(&uid).context("pod")?;
    assert_eq!(view.container("app").map(|c| c.restart_count), Some(0));
    Ok(())
}

/// Item 4's cost, measured: the delay between the sidecar turning ready and the app being
/// created, with and without `refuse_held_after` (here 2 s, to land readiness in kubelet's
/// retry pause often), for readiness at offsets spread over the refusal cycle. Prints the
/// numbers docs/CALLS.md quotes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement (about 3 min): run by hand, see docs/CALLS.md"]
async fn measure_refusal_cost() -> Result<()> {
    // Sidecar ready this long (ms) after it starts: across the first refusal (~2 s after the
    // hold began) and kubelet's 1–1.5 s retry pause after it.
    const READY_MS: [i64; 10] = [1500, 2300, 3100, 4100, 4400, 4700, 5000, 5300, 5600, 6500];
    for (label, cfg) in [
        ("hold only (refuse_held_after = 0s)", "0s"),
        ("refusal after 2 s (refuse_held_after = 2s)", "2s"),
    ] {
        let st = Stack::start(
            false,
            &format!("[ordering]\nrefuse_held_after = \"{cfg}\"\n"),
            |_| {},
        )
        .await?;
        let mut delays = Vec::new();
        for (i, ready_ms) in READY_MS.iter().enumerate() {
            let sleep = format!("{}.{:03}", ready_ms / 1000, ready_ms % 1000);
            let yaml = format!(
                "name: cost{i}\nhostNetwork: true\nterminationGracePeriodSeconds: 2\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: 'exec:[\"test\",\"-f\",\"/tmp/ready{i}\"]'\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep {sleep}; touch /tmp/ready{i}; sleep 3600 & wait\"]\n{APP}"
            );
            let uid = st.kubelet.add_pod(pod(&yaml))?;
            st.wait_all_running(&uid, STEP).await?;
            let (proxy, app) = (
                st.status(&uid, "proxy").await?,
                st.status(&uid, "app").await?,
            );
            let ready = proxy.started_at + ready_ms * (S / 1000);
            let delay = app.created_at - ready;
            let creates: Vec<_> = st
                .kubelet
                .journal()
                .pod_calls(&uid)
                .into_iter()
                .filter(|r| r.is("CreateContainer", "app"))
                .collect();
            eprintln!("{label}: sidecar ready after {sleep} s: app created {:.3} s after ({} CreateContainer calls)", secs(delay), creates.len());
            delays.push(secs(delay));
            st.delete_pod(&uid, Some(2), STEP).await?;
        }
        let n = delays.len();
        delays.sort_by(|a, b| a.total_cmp(b));
        let mean = delays.iter().sum::<f64>() / n as f64;
        eprintln!("RESULT {label}: delay after ready: min {:.3} s, median {:.3} s, mean {:.3} s, max {:.3} s ({n} runs)", delays[0], delays[n / 2], mean, delays[n - 1]);
    }
    Ok(())
}
