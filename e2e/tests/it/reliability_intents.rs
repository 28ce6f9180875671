//! Issue #43 item 1 on a real containerd: crisp SIGKILLed while it holds a sidecar's
//! StopContainer, and the caller never sends that stop again (kubelet 1.26 with a removed static
//! pod). The restarted crisp finds the stop it kept (`state_dir/intents/`) and carries it out
//! itself: the sidecar is stopped, after the app, within the pod's grace. Every assertion uses
//! containerd's own `finished_at`.

use std::time::{Duration, SystemTime};

use anyhow::{ensure, Result};
use crisp_e2e::emulator::PodSpec;
use crisp_e2e::stack::{secs, Stack};
use k8s_cri::v1 as cri;

const STEP: Duration = Duration::from_secs(60);
const GRACE: i64 = 10;

/// A pod whose app takes 3 s to exit on SIGTERM and whose sidecar exits at once on it;
/// restartPolicy Never, so nothing re-creates what the test stops.
const POD: &str = "name: kept-stop\nhostNetwork: true\nrestartPolicy: Never\nterminationGracePeriodSeconds: 10\nannotations:\n  crisp.dev/sidecars: proxy\n  crisp.dev/ready.proxy: 'exec:[\"true\"]'\ncontainers:\n  - name: proxy\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n  - name: app\n    command: [sh, -c, \"trap 'sleep 3; exit 0' TERM; while true; do sleep 0.1; done\"]\n";

/// Waits (5 s at most) for crisp's intents directory to empty: an intent is unlinked just
/// after its call ends.
async fn no_intents_left(st: &Stack) -> Result<()> {
    let intents = st.crisp.dir().join("state/intents");
    let left = |dir: &std::path::Path| std::fs::read_dir(dir).map_or(0, |d| d.count());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while left(&intents) > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ensure!(left(&intents) == 0, "intents left in {}", intents.display());
    Ok(())
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_sidecar_stop_survives_a_sigkill_of_crisp_without_a_retry() -> Result<()> {
    let mut st = Stack::start(false, "", |_| {}).await?;
    let uid = st.run_pod(PodSpec::from_yaml(POD)?.remove(0), STEP).await?;
    let app = st.status(&uid, "app").await?.id;
    let proxy = st.status(&uid, "proxy").await?.id;

    // "kubelet" stops the pod: the app's stop and the sidecar's at once, through crisp.
    let first_stop = now_ns();
    let stop = |id: String, mut client: cri::runtime_service_client::RuntimeServiceClient<_>| {
        tokio::spawn(async move {
            client
                .stop_container(cri::StopContainerRequest {
                    container_id: id,
                    timeout: GRACE,
                })
                .await
        })
    };
    let app_stop = stop(app, st.via_crisp().await?);
    let proxy_stop = stop(proxy, st.via_crisp().await?);
    // The app exits 3 s after its SIGTERM; crisp holds the sidecar's stop meanwhile, and is
    // killed 1 s into the hold.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(!proxy_stop.is_finished(), "the sidecar's stop was not held");
    st.crisp.kill()?;
    let answer = proxy_stop.await?;
    ensure!(answer.is_err(), "the held stop was answered: {answer:?}");
    let _ = app_stop.await?;
    // Back 500 ms later. Nobody sends the sidecar's stop again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    st.crisp.restart()?;

    let proxy = st
        .wait_exited(&uid, "proxy", Duration::from_secs(GRACE as u64 + 5))
        .await
        .inspect_err(|_| st.dump(&uid))?;
    let app = st.status(&uid, "app").await?;
    ensure!(
        app.finished_at > 0 && proxy.finished_at >= app.finished_at,
        "the sidecar exited {} s before the app",
        secs(app.finished_at - proxy.finished_at)
    );
    ensure!(
        proxy.finished_at - first_stop <= GRACE * 1_000_000_000,
        "the sidecar exited {} s after the pod's first stop, grace {GRACE} s",
        secs(proxy.finished_at - first_stop)
    );
    ensure!(
        st.crisp
            .log_text()
            .contains("carried out a StopContainer kept"),
        "crisp did not say it carried the stop out"
    );
    // A late retry after all finds it done: answered at once (a no-op in the runtime).
    let retry = st
        .via_crisp()
        .await?
        .stop_container(cri::StopContainerRequest {
            container_id: proxy.id.clone(),
            timeout: GRACE,
        })
        .await;
    ensure!(retry.is_ok(), "the retry failed: {retry:?}");
    // Carried out, the intents go; an answered call leaves none either.
    no_intents_left(&st).await?;
    eprintln!(
        "sidecar exited {:.2} s after the app, {:.2} s after the first stop (app {:.2} s)",
        secs(proxy.finished_at - app.finished_at),
        secs(proxy.finished_at - first_stop),
        secs(app.finished_at - first_stop)
    );
    Ok(())
}

/// The sandbox of `uid`, straight from containerd: (id, state).
async fn sandbox(st: &Stack, uid: &str) -> Result<(String, i32)> {
    let list = st
        .direct()
        .await?
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .items;
    let sb = list
        .into_iter()
        .max_by_key(|s| s.created_at)
        .ok_or_else(|| anyhow::anyhow!("no sandbox for pod {uid}"))?;
    Ok((sb.id, sb.state))
}

/// The static-storm lane's leftover pause containers (RELIABILITY.md, run 5): kubelet sends
/// the pod's StopPodSandbox once, crisp holds it while the app exits, and is SIGKILLed holding
/// it; nobody sends it again. The restarted crisp carries it out as the gate would have: the
/// sidecar after the app (containerd's `finished_at`), then the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_stop_pod_sandbox_survives_a_sigkill_of_crisp_without_a_retry() -> Result<()> {
    let mut st = Stack::start(false, "", |_| {}).await?;
    let uid = st
        .run_pod(
            PodSpec::from_yaml(&POD.replace("kept-stop", "kept-sandbox"))?.remove(0),
            STEP,
        )
        .await?;
    let app = st.status(&uid, "app").await?.id;
    let (sandbox_id, state) = sandbox(&st, &uid).await?;
    ensure!(state == cri::PodSandboxState::SandboxReady as i32);

    // "kubelet" stops the app (3 s to exit), then the sandbox, through crisp.
    let first_stop = now_ns();
    let mut client = st.via_crisp().await?;
    let app_stop = tokio::spawn(async move {
        client
            .stop_container(cri::StopContainerRequest {
                container_id: app,
                timeout: GRACE,
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut client = st.via_crisp().await?;
    let id = sandbox_id.clone();
    let sandbox_stop = tokio::spawn(async move {
        let mut req = tonic::Request::new(cri::StopPodSandboxRequest { pod_sandbox_id: id });
        req.set_timeout(Duration::from_secs(120));
        client.stop_pod_sandbox(req).await
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(!sandbox_stop.is_finished(), "StopPodSandbox was not held");
    st.crisp.kill()?;
    let answer = sandbox_stop.await?;
    ensure!(
        answer.is_err(),
        "the held StopPodSandbox was answered: {answer:?}"
    );
    let _ = app_stop.await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    st.crisp.restart()?;

    let deadline = std::time::Instant::now() + Duration::from_secs(GRACE as u64 + 5);
    loop {
        let (_, state) = sandbox(&st, &uid).await?;
        if state == cri::PodSandboxState::SandboxNotready as i32 {
            break;
        }
        if std::time::Instant::now() > deadline {
            st.dump(&uid);
            anyhow::bail!("the sandbox is still ready {GRACE} s + 5 s after its kept stop");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let app = st.status(&uid, "app").await?;
    let proxy = st.status(&uid, "proxy").await?;
    ensure!(
        app.finished_at > 0 && proxy.finished_at >= app.finished_at,
        "the sidecar exited {} s before the app",
        secs(app.finished_at - proxy.finished_at)
    );
    ensure!(
        st.crisp
            .log_text()
            .contains("carried out a StopPodSandbox kept"),
        "crisp did not say it carried the sandbox's stop out"
    );
    // A late retry finds it done; answered, it leaves no intent behind.
    let retry = st
        .via_crisp()
        .await?
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.clone(),
        })
        .await;
    ensure!(retry.is_ok(), "the retry failed: {retry:?}");
    no_intents_left(&st).await?;
    eprintln!(
        "sandbox stopped; sidecar exited {:.2} s after the app, {:.2} s after the first stop",
        secs(proxy.finished_at - app.finished_at),
        secs(proxy.finished_at - first_stop),
    );
    Ok(())
}
