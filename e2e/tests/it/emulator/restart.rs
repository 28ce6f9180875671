//! Restarts and completion (KUBELET-CRI §1.4, §4.3, §5): a crashing container is re-created as a
//! new instance with attempt 1; a Never pod whose containers exit 0 ends Succeeded and is torn down.

use std::time::Instant;

use anyhow::Result;
use crisp_e2e::emulator::testing::{Env, STEP};
use crisp_e2e::emulator::{ContainerSpec, CriState, PodPhase, PodSpec, RestartPolicy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_under_always_is_recreated_with_attempt_1() -> Result<()> {
    // No dead-container clean-up, so both instances stay visible in containerd.
    let env = Env::start(|c| c.container_deletor = false).await?;
    let k = &env.kubelet;
    let t0 = Instant::now();
    let mut pod = PodSpec::new(
        "crash",
        vec![ContainerSpec::sh("crasher", "sleep 0.2; exit 3")],
    );
    pod.host_network = true;
    let uid = k.add_pod(pod)?;
    let view = env.dump_if_failed(
        &uid,
        k.wait_for(&uid, STEP, |v| {
            v.container("crasher").is_some_and(|c| c.restart_count >= 1)
        })
        .await,
    )?;
    eprintln!("restarted after {:?}", t0.elapsed());

    let j = k.journal();
    let creates = j.container_calls("CreateContainer", "crasher");
    assert!(creates.len() >= 2);
    assert_eq!(creates[0].meta.detail.as_deref(), Some("attempt=0"));
    assert_eq!(creates[1].meta.detail.as_deref(), Some("attempt=1"));
    // A new instance: a different container ID; the old one was not removed first (§5).
    assert_ne!(creates[0].meta.container_id, creates[1].meta.container_id);
    assert!(j.container_calls("RemoveContainer", "crasher").is_empty());
    assert_eq!(j.method("RunPodSandbox").len(), 1, "same sandbox");

    // containerd's view: the old instance exited 3, the new one carries attempt 1 and the annotation.
    let statuses = env.containerd_statuses(&uid).await?;
    let old = statuses
        .iter()
        .find(|s| Some(&s.id) == creates[0].meta.container_id.as_ref())
        .expect("old instance");
    assert_eq!(CriState::from_cri(old.state), CriState::Exited);
    assert_eq!(old.exit_code, 3);
    let new = statuses
        .iter()
        .find(|s| Some(&s.id) == creates[1].meta.container_id.as_ref())
        .expect("new instance");
    assert_eq!(new.metadata.as_ref().map(|m| m.attempt), Some(1));
    assert_eq!(
        new.annotations
            .get("io.kubernetes.container.restartCount")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(new.log_path.rsplit('/').next(), Some("1.log"));
    let c = view.container("crasher").expect("status");
    assert!(
        c.last_state.as_ref().and_then(|s| s.exit_code()) == Some(3)
            || c.state.exit_code() == Some(3),
        "{c:?}"
    );
    assert_eq!(view.phase(), PodPhase::Running);

    k.delete_and_wait(&uid, Some(2), STEP).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_pod_exiting_zero_succeeds_and_is_torn_down() -> Result<()> {
    let env = Env::start(|_| {}).await?;
    let k = &env.kubelet;
    let t0 = Instant::now();
    let mut pod = PodSpec::new(
        "job",
        vec![
            ContainerSpec::sh("a", "sleep 0.2"),
            ContainerSpec::sh("b", "sleep 0.5"),
        ],
    );
    pod.host_network = true;
    pod.restart_policy = RestartPolicy::Never;
    let uid = k.add_pod(pod)?;
    let view = env.dump_if_failed(&uid, k.wait_terminated(&uid, STEP).await)?;
    eprintln!("completed and torn down after {:?}", t0.elapsed());
    assert_eq!(view.phase(), PodPhase::Succeeded);
    for c in &view.status.container_statuses {
        assert_eq!(c.state.exit_code(), Some(0), "{c:?}");
        assert_eq!(c.restart_count, 0);
    }
    let j = k.journal();
    // Never restarted, and KillPod stopped the sandbox without any StopContainer.
    assert_eq!(j.method("CreateContainer").len(), 2);
    assert!(j.method("StopContainer").is_empty());
    assert!(!j.method("StopPodSandbox").is_empty());
    Ok(())
}
