//! Pod-worker requeues (KUBELET-CRI §1.3): a failed sync is retried after the error back-off, or
//! after the short back-off when the error says "network is not ready".

use std::time::Duration;

use anyhow::Result;
use crisp_e2e::emulator::testing::{sleeper_pod, Env, STEP};
use crisp_e2e::emulator::{PullPolicy, NETWORK_NOT_READY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_not_ready_requeues_fast_and_sends_nothing() -> Result<()> {
    // No CNI: containerd reports NetworkReady=false.
    let env = Env::start(|c| {
        c.error_backoff = Duration::from_secs(30);
        c.network_not_ready_backoff = Duration::from_millis(100);
    })
    .await?;
    let k = &env.kubelet;
    let mut pod = sleeper_pod("nonet", &["app"]);
    pod.host_network = false;
    let uid = k.add_pod(pod)?;
    // With a 30 s error back-off only the fast network back-off can give several attempts.
    let view = k
        .wait_for(&uid, Duration::from_secs(10), |v| v.syncs >= 4)
        .await?;
    let err = view.last_error.clone().unwrap_or_default();
    assert!(err.starts_with(NETWORK_NOT_READY), "{err}");
    assert!(err.contains("NetworkReady=false"), "{err}");
    assert!(
        k.journal().method("RunPodSandbox").is_empty(),
        "kubelet does not even try the sandbox"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_error_is_retried_after_the_error_backoff() -> Result<()> {
    let backoff = Duration::from_secs(1);
    let env = Env::start(|c| {
        c.error_backoff = backoff;
        c.resync_interval = Duration::from_secs(60);
    })
    .await?;
    let k = &env.kubelet;
    let mut pod = sleeper_pod("noimage", &["app"]);
    pod.containers[0].image = "crisp.test/absent:latest".into();
    pod.containers[0].image_pull_policy = PullPolicy::Never;
    let uid = k.add_pod(pod)?;
    let view = k
        .wait_for(&uid, STEP, |v| {
            v.container("app").and_then(|c| c.state.reason()) == Some("ErrImageNeverPull")
        })
        .await?;
    assert!(view
        .last_error
        .as_deref()
        .unwrap_or_default()
        .contains("ErrImageNeverPull"));
    // Attempts: the first sync, one right after the sandbox's PLEG event, then one per back-off.
    let j = k.journal();
    j.wait_for(STEP, |_| j.container_calls("ImageStatus", "app").len() >= 4)
        .await?;
    let calls = j.container_calls("ImageStatus", "app");
    for w in calls[1..].windows(2) {
        let gap = w[1].sent.duration_since(w[0].sent);
        assert!(gap >= backoff, "retry after {gap:?} < back-off {backoff:?}");
        assert!(
            gap < backoff * 3,
            "retry after {gap:?}, expected ≈ back-off (+50% jitter, +tick, +relist)"
        );
    }
    assert!(j.method("CreateContainer").is_empty());
    Ok(())
}
