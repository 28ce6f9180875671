//! Issue #4 end to end: Job pods' sidecars are ended by crisp when the apps finish, and report
//! `exit 0 / Completed` through crisp while containerd keeps their real exit code. Pod phase is
//! the one the kubelet emulator computes the way kubelet 1.26 does (KUBELET-CRI §4.3).

use std::time::Duration;

use anyhow::{Context, Result};
use crisp_e2e::emulator::{PodPhase, PodSpec};
use crisp_e2e::stack::{secs, Stack};
use k8s_cri::v1 as cri;

const STEP: Duration = Duration::from_secs(60);
const S: i64 = 1_000_000_000;
/// Job mode tuned for tests: decide a first non-zero exit final after 2 s.
const CRISP: &str = "[job]\npoll_interval = \"100ms\"\nrestart_grace = \"2s\"\n";

fn pod(yaml: &str) -> PodSpec {
    PodSpec::from_yaml(yaml).expect("test pod YAML").remove(0)
}

/// A sidecar that never ends by itself and exits 143 on SIGTERM (like most proxies).
const SIDECAR: &str =
    "  - name: proxy\n    command: [sh, -c, \"trap 'exit 143' TERM; sleep 3600 & wait\"]\n";

async fn via_crisp_status(st: &Stack, id: &str) -> Result<cri::ContainerStatus> {
    st.via_crisp()
        .await?
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await?
        .into_inner()
        .status
        .context("empty status")
}

/// Starts a stack with job mode on ([`CRISP`]), adds the pod written in `yaml` and waits until it
/// reaches `phase`: the stack and the pod's uid.
async fn run_to_phase(yaml: &str, phase: PodPhase) -> Result<(Stack, String)> {
    let st = Stack::start(false, CRISP, |_| {}).await?;
    let uid = st.kubelet.add_pod(pod(yaml))?;
    if let Err(e) = st.kubelet.wait_phase(&uid, phase, STEP).await {
        st.dump(&uid);
        return Err(e);
    }
    Ok((st, uid))
}

/// A Job's pod (`label`: the Job label kubelet's pod carries) with the [`SIDECAR`] and an app
/// running `app`.
fn job_yaml(name: &str, restart: &str, label: &str, app: &str) -> String {
    format!("name: {name}\nhostNetwork: true\nrestartPolicy: {restart}\nlabels:\n  {label}: {name}\nannotations:\n  crisp.dev/sidecars: proxy\ncontainers:\n{SIDECAR}  - name: app\n    command: [sh, -c, \"{app}\"]\n")
}

/// 1 + 6. restartPolicy Never, the app exits 0 after 2 s, the sidecar ignores it: crisp stops
/// the sidecar within 1 s, the pod Succeeds; through crisp the sidecar says exit 0 / Completed,
/// containerd says 143 — and a restarted crisp still says 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_job_succeeds_and_sidecar_reports_completed() -> Result<()> {
    let (mut st, uid) = run_to_phase(
        &job_yaml("job-ok", "Never", "job-name", "sleep 2; exit 0"),
        PodPhase::Succeeded,
    )
    .await?;
    let app = st.status(&uid, "app").await?;
    let proxy = st.status(&uid, "proxy").await?;
    assert_eq!(app.exit_code, 0);
    let lag = proxy.finished_at - app.finished_at;
    eprintln!("sidecar finished {:.3} s after the app", secs(lag));
    assert!(
        (0..S).contains(&lag),
        "sidecar finished {:.3} s after the app (want < 1 s)",
        secs(lag)
    );
    assert_eq!(proxy.exit_code, 143, "containerd keeps the real exit code");
    let seen = via_crisp_status(&st, &proxy.id).await?;
    assert_eq!((seen.exit_code, seen.reason.as_str()), (0, "Completed"));
    // Everything else in the status is what containerd said.
    let mut expect = proxy.clone();
    expect.exit_code = 0;
    expect.reason = "Completed".into();
    assert_eq!(seen, expect);
    // The app's own status is not touched.
    assert_eq!(via_crisp_status(&st, &app.id).await?, app);

    // 6. crisp restarts: the mark lives in its state dir.
    st.crisp.restart()?;
    let seen = via_crisp_status(&st, &proxy.id).await?;
    assert_eq!((seen.exit_code, seen.reason.as_str()), (0, "Completed"));
    Ok(())
}

/// 2. The same with the app exiting 1 (no restart-policy annotation: inferred after 2 s): the
/// pod fails because of the app, not the sidecar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_job_fails_because_of_the_app() -> Result<()> {
    let (st, uid) = run_to_phase(
        &job_yaml(
            "job-bad",
            "Never",
            "batch.kubernetes.io/job-name",
            "sleep 1; exit 1",
        ),
        PodPhase::Failed,
    )
    .await?;
    let proxy = st.status(&uid, "proxy").await?;
    assert_eq!(proxy.state, cri::ContainerState::ContainerExited as i32);
    assert_eq!(via_crisp_status(&st, &proxy.id).await?.exit_code, 0);
    let app = st.kubelet.pod(&uid).context("pod")?;
    let app = app
        .status
        .container_statuses
        .iter()
        .find(|c| c.name == "app")
        .context("app status")?
        .clone();
    assert!(
        format!("{:?}", app.state).contains("exit_code: 1"),
        "{app:?}"
    );
    Ok(())
}

/// 3. OnFailure: the app fails once, kubelet re-creates it, it succeeds. The sidecar keeps
/// running through the restart and is stopped only after the success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_job_keeps_sidecar_through_the_restart() -> Result<()> {
    // /dev/shm is the sandbox's (IPC namespace POD), so it survives the app's re-creation.
    let yaml = job_yaml(
        "job-retry",
        "OnFailure",
        "job-name",
        "if [ -f /dev/shm/once ]; then sleep 1; exit 0; fi; touch /dev/shm/once; sleep 1; exit 1",
    );
    let (st, uid) = run_to_phase(&yaml, PodPhase::Succeeded).await?;
    let apps = st.instances(&uid, "app").await?;
    assert_eq!(
        apps.iter().map(|a| a.exit_code).collect::<Vec<_>>(),
        vec![1, 0],
        "one failure, then success"
    );
    let proxies = st.instances(&uid, "proxy").await?;
    assert_eq!(proxies.len(), 1, "the sidecar was never restarted");
    let proxy = &proxies[0];
    assert!(
        proxy.finished_at > apps[1].finished_at,
        "sidecar stopped before the retry succeeded"
    );
    assert!(proxy.finished_at - apps[1].finished_at < S);
    assert_eq!(via_crisp_status(&st, &proxy.id).await?.reason, "Completed");
    Ok(())
}

/// 4. Two sidecars are stopped in reverse order, and a sidecar's exec preStop hook runs before
/// its SIGTERM (its TERM trap exits 0 only if the hook's file exists, 42 otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_sidecars_stop_in_reverse_after_their_prestop() -> Result<()> {
    let yaml = "name: job-two\nhostNetwork: true\nrestartPolicy: Never\nterminationGracePeriodSeconds: 10\nlabels:\n  job-name: job-two\nannotations:\n  crisp.dev/sidecars: s1, s2\ncontainers:\n  - name: s1\n    command: [sh, -c, \"trap 'test -f /dev/shm/prestop-s1 && exit 0; exit 42' TERM; sleep 3600 & wait\"]\n    lifecycle:\n      preStop: {exec: {command: [sh, -c, \"touch /dev/shm/prestop-s1\"]}}\n  - name: s2\n    command: [sh, -c, \"trap 'exit 0' TERM; sleep 3600 & wait\"]\n  - name: app\n    command: [sh, -c, \"sleep 1; exit 0\"]\n";
    let (st, uid) = run_to_phase(yaml, PodPhase::Succeeded).await?;
    let (s1, s2, app) = (
        st.status(&uid, "s1").await?,
        st.status(&uid, "s2").await?,
        st.status(&uid, "app").await?,
    );
    assert!(
        app.finished_at < s2.finished_at && s2.finished_at < s1.finished_at,
        "stop order app, s2, s1"
    );
    assert_eq!(
        s1.exit_code, 0,
        "s1's preStop hook ran before its SIGTERM (containerd's own exit code)"
    );
    Ok(())
}

/// 5. A non-Job pod whose app exits: crisp terminates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_job_pod_is_left_alone() -> Result<()> {
    let st = Stack::start(false, CRISP, |_| {}).await?;
    let yaml = format!(
        "name: not-a-job\nhostNetwork: true\nrestartPolicy: Never\nannotations:\n  crisp.dev/sidecars: proxy\ncontainers:\n{SIDECAR}  - name: app\n    command: [sh, -c, \"exit 0\"]\n"
    );
    let uid = st.kubelet.add_pod(pod(&yaml))?;
    st.wait_exited(&uid, "app", STEP).await?;
    // Job mode would have acted within poll_interval (100 ms) of an exit-0: give it 30× that.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let proxy = st.status(&uid, "proxy").await?;
    assert_eq!(
        proxy.state,
        cri::ContainerState::ContainerRunning as i32,
        "the sidecar of a non-Job pod was stopped"
    );
    assert!(!st.crisp.log_text().contains("stopping its sidecars"));
    assert_eq!(st.kubelet.pod_phase(&uid), Some(PodPhase::Running));
    st.kubelet.delete_pod(&uid, Some(2))?;
    st.kubelet.wait_terminated(&uid, STEP).await?;
    Ok(())
}

/// Issue #37: a terminated sidecar's mark names its sandbox, and when its container is removed
/// while crisp is down (no RemoveContainer through crisp: here straight on containerd), the
/// restarted crisp prunes the mark against containerd's ListContainers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_whose_container_was_removed_while_crisp_was_down_is_pruned_at_start() -> Result<()>
{
    let (mut st, uid) = run_to_phase(
        &job_yaml("job-prune", "Never", "job-name", "sleep 1; exit 0"),
        PodPhase::Succeeded,
    )
    .await?;
    let proxy = st.status(&uid, "proxy").await?;
    let sandbox = st
        .direct()
        .await?
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                id: proxy.id.clone(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .containers
        .remove(0)
        .pod_sandbox_id;
    let mark = st.crisp.dir().join("state/terminated").join(&proxy.id);
    assert_eq!(
        std::fs::read_to_string(&mark)?,
        sandbox,
        "the mark names its sandbox"
    );

    st.crisp.stop()?;
    st.direct()
        .await?
        .remove_container(cri::RemoveContainerRequest {
            container_id: proxy.id.clone(),
        })
        .await?;
    st.crisp.restart()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !st
        .crisp
        .log_text()
        .contains("pruned the terminated-sidecar marks")
    {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "no prune within 20 s:\n{}",
            st.crisp.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!mark.exists(), "the mark of the removed sidecar is gone");
    assert!(st.crisp.log_text().contains("pruned=1"));
    Ok(())
}
