//! Issue #8, runtime faults: containerd SIGKILLed (its shims and containers keep running, as
//! after a crash) and restarted twice in one wave — once while crisp holds apps'
//! CreateContainer, once while it holds sidecars' StopContainer.
//!
//! - crisp keeps serving: while containerd is down, a call through crisp fails fast with
//!   UNAVAILABLE naming the runtime socket, kubelet's own calls get UNAVAILABLE (journal), and
//!   crisp's admin socket answers;
//! - it recovers by itself (no restart, no reconnect from the test): every pod ends where
//!   kubelet wants it — Running with exactly one running instance per container, or Succeeded
//!   for Jobs, then terminated after deletion;
//! - the ordering still holds (containerd's timestamps; a start the kill cut off is restamped by
//!   containerd's recovery and counts from kubelet's StartContainer instead), no held call is
//!   stuck, no call outlived kubelet's deadline, crisp tracks nothing once the pods are removed.

use std::time::{Duration, Instant};

use crate::reliability_support::*;
use anyhow::{ensure, Context, Result};
use crisp_e2e::stack::Stack;
use k8s_cri::v1 as cri;

const UP: Duration = Duration::from_secs(120);
/// How long containerd stays down each time.
const OUTAGE: Duration = Duration::from_millis(2000);

/// Polls (20 ms) until crisp holds at least one call, or gives up after `limit`.
async fn wait_holding(admin: &std::path::Path, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    while gauge(admin, "crisp_holds_in_flight").await? < 1.0 {
        ensure!(
            Instant::now() < deadline,
            "crisp never held a call within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Kills containerd, checks crisp serves UNAVAILABLE meanwhile, restarts containerd. Returns
/// how many kubelet calls got UNAVAILABLE and when containerd was down (wall clock, ns).
async fn runtime_outage(
    st: &mut Stack,
    admin: &std::path::Path,
    what: &str,
) -> Result<(usize, (i64, i64))> {
    let killed_at = Instant::now();
    let killed_wall = wall_ns(std::time::SystemTime::now()).context("clock")?;
    tokio::task::block_in_place(|| st.containerd.kill_hard()).context("kill containerd")?;
    eprintln!("{what}: containerd SIGKILLed");

    // A client of crisp: answered at once, UNAVAILABLE, naming the runtime's socket.
    let mut c = st.via_crisp().await?;
    let t = Instant::now();
    let e = c
        .version(cri::VersionRequest {
            version: "0.1.0".into(),
        })
        .await
        .expect_err("Version with the runtime down");
    ensure!(e.code() == tonic::Code::Unavailable, "{what}: {e:?}");
    ensure!(
        e.message()
            .contains(&st.containerd.socket().display().to_string()),
        "{what}: UNAVAILABLE does not name the runtime socket: {}",
        e.message()
    );
    ensure!(
        t.elapsed() < Duration::from_secs(2),
        "{what}: the failing call took {:?}",
        t.elapsed()
    );
    // kubelet's own calls see UNAVAILABLE too.
    let j = st.kubelet.journal();
    j.wait_for(Duration::from_secs(10), |r| {
        r.sent >= killed_at && r.done.is_some() && r.code == tonic::Code::Unavailable
    })
    .await
    .context("no kubelet call failed UNAVAILABLE while containerd was down")?;
    // The admin socket is crisp's own: still served.
    let text = metrics(admin).await?;
    ensure!(
        sample(&text, "crisp_tracked_pods").is_some(),
        "{what}: metrics while down"
    );
    // A bounded outage window: held calls keep probing and kubelet keeps retrying against a
    // dead runtime for a while, as they would during a real containerd restart.
    tokio::time::sleep(OUTAGE).await;

    tokio::task::block_in_place(|| st.containerd.restart()).context("restart containerd")?;
    let back_wall = wall_ns(std::time::SystemTime::now()).context("clock")?;
    let unavailable = count(j, |r| {
        r.sent >= killed_at && r.code == tonic::Code::Unavailable && r.done.is_some()
    });
    eprintln!("{what}: containerd back after {:.1} s; {unavailable} kubelet calls got UNAVAILABLE meanwhile", killed_at.elapsed().as_secs_f64());
    Ok((unavailable, (killed_wall, back_wall)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_killed_and_restarted_during_a_wave() -> Result<()> {
    let mut rng = Rng::from_env("faults");
    let mut st = Stack::start(false, "", |_| {}).await?;
    let admin = admin_socket(&st);
    let crisp_pid = st.crisp.pid();
    let mut pods = Vec::new();
    for i in 0..env_usize("CRISP_FAULT_PODS", 8) {
        let p = plan(i, &mut rng, false, "not-checked-here");
        pods.push((st.kubelet.add_pod(p.spec.clone())?, p));
    }

    // 1. During the start: while crisp holds apps' CreateContainer.
    wait_holding(&admin, UP).await?;
    let (u1, outage) = runtime_outage(&mut st, &admin, "start").await?;
    if let Err(e) = wait_up(&st.kubelet, &pods, UP).await {
        dump_all(&st, &pods);
        return Err(e);
    }
    let mut violations = Vec::new();
    for (uid, p) in &pods {
        let allow = Allow {
            restamped: Some(Restamped {
                outage,
                kubelet: &st.kubelet,
            }),
            ..Default::default()
        };
        violations.extend(start_violations(st.containerd.socket(), uid, p, allow).await?);
        violations.extend(duplicate_running(st.containerd.socket(), uid, p).await?);
    }
    if !violations.is_empty() {
        dump_all(&st, &pods);
    }
    ensure!(
        violations.is_empty(),
        "after the runtime outage at start:\n{}",
        violations.join("\n")
    );

    // 2. During the stop: as soon as a sidecar's StopContainer is sent (crisp holds it while
    // the app, which takes 0.5 s to exit, still runs).
    let deleting = Instant::now();
    for (uid, _) in &pods {
        st.kubelet.delete_pod(uid, Some(10))?;
    }
    st.kubelet
        .journal()
        .wait_for(UP, |r| {
            r.sent >= deleting
                && r.method == "StopContainer"
                && r.meta
                    .container
                    .as_deref()
                    .is_some_and(|c| c.starts_with("side"))
        })
        .await?;
    let (u2, _) = runtime_outage(&mut st, &admin, "stop").await?;
    if let Err(e) = wait_terminated(&st.kubelet, &pods, UP).await {
        dump_all(&st, &pods);
        return Err(e);
    }
    ensure_stop_order(&st, &pods, "after the runtime outage at stop").await?;
    let text = remove_and_settle(&st, &admin, &pods).await?;
    ensure!(
        sample(&text, "crisp_tracked_pods") == Some(0.0)
            && sample(&text, "crisp_tracked_containers") == Some(0.0),
        "crisp still tracks pods/containers"
    );
    let j = st.kubelet.journal();
    ensure_calls_ended(j)?;
    ensure!(
        crisp_pid.and_then(rss_kib).is_some(),
        "crisp's process is gone"
    );
    eprintln!(
        "faults: {} pods, 2 containerd kills, {u1} + {u2} UNAVAILABLE answers, 0 violations",
        pods.len()
    );
    Ok(())
}
