//! Pod deletion the way kubelet does it (KUBELET-CRI §3.1, §3.2): preStop + StopContainer for
//! every running container in parallel, StopPodSandbox only after all of them returned, then a
//! fresh GetPodStatus.

use std::time::{Duration, Instant};

use anyhow::Result;
use crisp_e2e::emulator::testing::{Env, STEP};
use crisp_e2e::emulator::{ContainerSpec, PodPhase, PodSpec};

/// Exits 0 two seconds after SIGTERM, so StopContainer calls take ≈2 s each: longer than the 1 s
/// preStop hooks, so the stop of the hook-less container is still in flight when the others start.
const SLOW_TERM: &str = "trap 'sleep 2; exit 0' TERM; sleep 3600 & wait";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stops_containers_in_parallel_then_the_sandbox() -> Result<()> {
    // No podContainerDeletor here: once a deleted pod is terminated, a PLEG ContainerDied that
    // arrives late makes kubelet remove *all* its containers, and if the terminated-pod sync then
    // waits for the next relist it sees none, so 1.26 reports them ContainerStatusUnknown/137
    // (real kubelet behaviour, fixed in 1.27 by writing the post-kill status). This test asserts
    // the kill sequence and the exit codes the runtime saw, so it keeps the containers.
    let env = Env::start(|c| c.container_deletor = false).await?;
    let k = &env.kubelet;
    let t0 = Instant::now();
    let mut pod = PodSpec::new(
        "stop",
        vec![
            ContainerSpec::sh("a", SLOW_TERM).pre_stop("sleep 1"),
            ContainerSpec::sh("b", SLOW_TERM).pre_stop("sleep 1"),
            ContainerSpec::sh("c", SLOW_TERM),
        ],
    );
    pod.host_network = true;
    pod.termination_grace_period_seconds = 20;
    let uid = k.add_pod(pod)?;
    if let Err(e) = k.wait_all_running(&uid, STEP).await {
        env.dump(&uid);
        return Err(e);
    }
    let deleted_at = Instant::now();
    k.delete_pod(&uid, Some(7))?;
    let view = k.wait_terminated(&uid, STEP).await;
    if view.is_err() {
        env.dump(&uid);
    }
    let view = view?;
    eprintln!(
        "terminated {:?} after delete; test {:?}",
        deleted_at.elapsed(),
        t0.elapsed()
    );

    let j = k.journal();
    let stops =
        j.filter(|r| r.method == "StopContainer" && r.meta.pod_uid.as_deref() == Some(&uid));
    assert_eq!(stops.len(), 3, "one StopContainer per running container");
    for s in &stops {
        assert!(s.is_ok(), "{}: {}", s.method, s.message);
        // The deletion path passes the grace override as the timeout, not reduced by preStop (§3.2),
        // and the deadline is r.timeout + timeout (§3.3).
        assert_eq!(s.meta.detail.as_deref(), Some("timeout=7"));
        assert_eq!(
            s.deadline,
            Some(k.config().runtime_request_timeout + Duration::from_secs(7))
        );
    }
    // The preStop hooks ran concurrently (both sent before either returned) and each container's
    // StopContainer came after its own hook.
    let hooks = j.filter(|r| r.method == "ExecSync" && r.meta.pod_uid.as_deref() == Some(&uid));
    assert_eq!(hooks.len(), 2);
    let last_hook_sent = hooks.iter().map(|h| h.sent).max().expect("hooks");
    assert!(
        hooks
            .iter()
            .all(|h| h.done.is_some_and(|d| d > last_hook_sent)),
        "preStop hooks overlap"
    );
    for h in &hooks {
        let name = h.meta.container.as_deref().unwrap_or_default();
        let stop = stops
            .iter()
            .find(|s| s.meta.container.as_deref() == Some(name))
            .expect("stop");
        assert!(
            h.done.is_some_and(|d| d <= stop.sent),
            "{name}: StopContainer before its preStop returned"
        );
    }
    // All StopContainer calls were in flight together: each one took ≈2 s (SIGTERM handler).
    let last_stop_sent = stops.iter().map(|s| s.sent).max().expect("stops");
    let first_stop_done = stops
        .iter()
        .filter_map(|s| s.done)
        .min()
        .expect("stops done");
    assert!(
        last_stop_sent < first_stop_done,
        "StopContainer calls overlap"
    );

    // StopPodSandbox only after every StopContainer returned.
    let last_stop_done = stops
        .iter()
        .filter_map(|s| s.done)
        .max()
        .expect("stops done");
    let sandbox_stops =
        j.filter(|r| r.method == "StopPodSandbox" && r.meta.pod_uid.as_deref() == Some(&uid));
    assert!(!sandbox_stops.is_empty());
    assert!(
        sandbox_stops[0].sent >= last_stop_done,
        "StopPodSandbox sent before all StopContainer returned"
    );
    // Then a fresh GetPodStatus (ListPodSandbox filtered by the pod UID) checked nothing runs.
    let sb_done = sandbox_stops[0].done.expect("done");
    assert!(!j
        .filter(|r| r.method == "ListPodSandbox"
            && r.meta.pod_uid.as_deref() == Some(&uid)
            && r.sent >= sb_done)
        .is_empty());

    // The containers exited 0 on SIGTERM: the restart-policy-Always pod stays Running in 1.26.
    for c in &view.status.container_statuses {
        assert_eq!(c.state.exit_code(), Some(0), "{c:?}");
    }
    assert_eq!(view.phase(), PodPhase::Running);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_1_27_gives_deleted_pods_a_terminal_phase() -> Result<()> {
    let env = Env::start(|c| c.version = crisp_e2e::emulator::KubeletVersion::V1_27).await?;
    let k = &env.kubelet;
    let mut pod = PodSpec::new(
        "terminal",
        vec![
            ContainerSpec::sh("app", "trap 'exit 0' TERM; sleep 3600 & wait"),
            // Ignores SIGTERM: SIGKILLed after the grace period → 137.
            ContainerSpec::sh("stubborn", "trap '' TERM; sleep 3600 & wait; sleep 3600"),
        ],
    );
    pod.host_network = true;
    let uid = k.add_pod(pod)?;
    k.wait_all_running(&uid, STEP).await?;
    k.delete_pod(&uid, Some(1))?;
    let view = k.wait_terminated(&uid, STEP).await?;
    // Real exit codes from the post-kill status 1.27 writes, not the synthetic
    // ContainerStatusUnknown (also 137) of a container that vanished.
    let stubborn = view.container("stubborn").expect("stubborn");
    assert_eq!(stubborn.state.exit_code(), Some(137), "{stubborn:?}");
    assert!(stubborn.container_id.is_some(), "{stubborn:?}");
    let app = view.container("app").expect("app");
    assert_eq!(app.state.exit_code(), Some(0), "{app:?}");
    assert_eq!(
        view.phase(),
        PodPhase::Failed,
        "1.27: a deleted Always pod with a 137 ends Failed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_removes_containers_and_sandbox_of_a_deleted_pod() -> Result<()> {
    let env = Env::start(|c| c.gc_period = Some(Duration::from_millis(500))).await?;
    let k = &env.kubelet;
    let mut pod = PodSpec::new(
        "gc",
        vec![ContainerSpec::sh(
            "a",
            "trap 'exit 0' TERM; sleep 3600 & wait",
        )],
    );
    pod.host_network = true;
    let uid = k.add_pod(pod)?;
    k.wait_all_running(&uid, STEP).await?;
    k.delete_and_wait(&uid, Some(2), STEP).await?;
    let j = k.journal();
    let rm = j
        .wait_for(STEP, |r| {
            r.method == "RemovePodSandbox" && r.meta.pod_uid.as_deref() == Some(&uid)
        })
        .await?;
    // Not part of termination (§3.1 step 4): removal comes after StopPodSandbox.
    let stop =
        &j.filter(|r| r.method == "StopPodSandbox" && r.meta.pod_uid.as_deref() == Some(&uid))[0];
    assert!(rm.sent > stop.sent);
    j.wait_for(STEP, |r| r.method == "RemovePodSandbox" && r.is_done())
        .await?;
    assert!(
        env.containerd_statuses(&uid).await?.is_empty(),
        "containers removed"
    );
    Ok(())
}
