//! The emulator starts a pod the way kubelet does (KUBELET-CRI §1): containers strictly in spec
//! order, each container's postStart returning before the next one's first CRI call.

use std::time::{Duration, Instant};

use anyhow::Result;
use crisp_e2e::emulator::testing::{sleeper_pod, Env, STEP, TERM_EXITS_0};
use crisp_e2e::emulator::{CallRecord, ContainerSpec, PodPhase};

fn done(r: &CallRecord) -> Instant {
    r.done.unwrap_or_else(Instant::now)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_containers_start_in_spec_order() -> Result<()> {
    let env = Env::start(|_| {}).await?;
    let k = &env.kubelet;
    let t0 = Instant::now();
    let uid = k.add_pod(sleeper_pod("order", &["first", "second"]))?;
    let view = env.dump_if_failed(&uid, k.wait_all_running(&uid, STEP).await)?;
    eprintln!("pod running after {:?}", t0.elapsed());
    assert_eq!(view.phase(), PodPhase::Running);

    // The runtime's own clock: first started before second.
    let first = env.containerd_status(&uid, "first").await?;
    let second = env.containerd_status(&uid, "second").await?;
    assert!(
        first.started_at < second.started_at,
        "containerd started_at: first {} second {}",
        first.started_at,
        second.started_at
    );
    assert_eq!(first.metadata.as_ref().map(|m| m.attempt), Some(0));

    // kubelet's call order (§1.1): RunPodSandbox → PodSandboxStatus → per container
    // ImageStatus → ImageStatus → CreateContainer → StartContainer, container by container.
    let j = k.journal();
    let sync_methods = [
        "RunPodSandbox",
        "ImageStatus",
        "PullImage",
        "CreateContainer",
        "StartContainer",
        "ExecSync",
    ];
    let calls: Vec<String> = j
        .pod_calls(&uid)
        .iter()
        .filter(|r| sync_methods.contains(&r.method))
        .map(|r| {
            format!(
                "{}:{}",
                r.method,
                r.meta.container.as_deref().unwrap_or("-")
            )
        })
        .collect();
    let expected = [
        "RunPodSandbox:-",
        "ImageStatus:first",
        "ImageStatus:first",
        "CreateContainer:first",
        "StartContainer:first",
        "ImageStatus:second",
        "ImageStatus:second",
        "CreateContainer:second",
        "StartContainer:second",
    ];
    assert_eq!(calls, expected);
    // The sync's PodSandboxStatus on the new sandbox comes between RunPodSandbox and the first ImageStatus.
    let run = &j.method("RunPodSandbox")[0];
    let first_image = &j.container_calls("ImageStatus", "first")[0];
    let sandbox_id = run.meta.sandbox_id.clone();
    assert!(sandbox_id.is_some());
    assert!(j
        .method("PodSandboxStatus")
        .iter()
        .any(|r| r.meta.sandbox_id == sandbox_id
            && r.sent >= done(run)
            && done(r) <= first_image.sent));

    let start_first = &j.container_calls("StartContainer", "first")[0];
    let create_second = &j.container_calls("CreateContainer", "second")[0];
    assert!(
        done(start_first) <= create_second.sent,
        "second's CreateContainer sent before first's StartContainer returned"
    );
    // CreateContainer carried the regenerated sandbox config and kubelet's deadline.
    assert_eq!(
        create_second.deadline,
        Some(k.config().runtime_request_timeout)
    );
    assert_eq!(run.deadline, Some(k.config().runtime_request_timeout * 2));

    k.delete_and_wait(&uid, Some(5), STEP).await?;
    eprintln!("test took {:?}", t0.elapsed());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_start_returns_before_next_create() -> Result<()> {
    let env = Env::start(|_| {}).await?;
    let k = &env.kubelet;
    let mut pod = sleeper_pod("hooks", &[]);
    pod.containers = vec![
        ContainerSpec::sh("sidecar", TERM_EXITS_0).post_start("sleep 1; touch /tmp/ready"),
        ContainerSpec::sh("app", TERM_EXITS_0),
    ];
    let uid = k.add_pod(pod)?;
    env.dump_if_failed(&uid, k.wait_all_running(&uid, STEP).await)?;

    let j = k.journal();
    let hook = j.filter(|r| r.is("ExecSync", "sidecar"));
    assert_eq!(hook.len(), 1, "one postStart exec");
    let hook = &hook[0];
    // Lifecycle hooks: ExecSync timeout 0 and no gRPC deadline (§3.3, §6).
    assert_eq!(hook.deadline, None);
    assert!(hook.is_ok(), "postStart failed: {}", hook.message);
    assert!(
        hook.elapsed() >= Duration::from_secs(1),
        "hook took {:?}",
        hook.elapsed()
    );
    let start_sidecar = &j.container_calls("StartContainer", "sidecar")[0];
    let first_app_call = j.filter(|r| {
        r.meta.container.as_deref() == Some("app") && r.meta.pod_uid.as_deref() == Some(&uid)
    })[0]
        .clone();
    assert!(
        done(start_sidecar) <= hook.sent,
        "postStart after StartContainer returned"
    );
    assert!(
        done(hook) <= first_app_call.sent,
        "app's first call ({}) sent before postStart returned",
        first_app_call.method
    );
    assert_eq!(first_app_call.method, "ImageStatus");

    // containerd agrees: app started at least the hook's 1 s after the sidecar.
    let sidecar = env.containerd_status(&uid, "sidecar").await?;
    let app = env.containerd_status(&uid, "app").await?;
    assert!(
        app.started_at - sidecar.started_at >= 1_000_000_000,
        "gap {} ns",
        app.started_at - sidecar.started_at
    );

    k.delete_and_wait(&uid, Some(5), STEP).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_one_per_sync_before_regular_containers() -> Result<()> {
    let env = Env::start(|_| {}).await?;
    let k = &env.kubelet;
    let mut pod = sleeper_pod("init", &["app"]);
    pod.init_containers = vec![
        ContainerSpec::sh("init1", "sleep 0.3"),
        ContainerSpec::sh("init2", "true"),
    ];
    let uid = k.add_pod(pod)?;
    let view = env.dump_if_failed(&uid, k.wait_all_running(&uid, STEP).await)?;
    for name in ["init1", "init2"] {
        let c = view
            .status
            .init_container_statuses
            .iter()
            .find(|c| c.name == name)
            .expect("init status");
        assert_eq!(c.state.exit_code(), Some(0), "{c:?}");
    }
    // containerd: each init container finished before the next container started.
    let i1 = env.containerd_status(&uid, "init1").await?;
    let i2 = env.containerd_status(&uid, "init2").await?;
    let app = env.containerd_status(&uid, "app").await?;
    assert!(i1.finished_at <= i2.started_at && i2.finished_at <= app.started_at);
    // kubelet never waits inside a sync (§1.1 step 7): each create is a separate sync, sent after
    // a PLEG relist saw the previous one exit.
    let j = k.journal();
    let create = |n: &str| j.container_calls("CreateContainer", n)[0].clone();
    let wall = |r: &CallRecord| {
        r.sent_wall
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0)
    };
    assert!(wall(&create("init2")) >= i1.finished_at);
    assert!(wall(&create("app")) >= i2.finished_at);
    let relist_between = j.filter(|r| {
        r.method == "ListContainers"
            && r.meta.pod.is_none()
            && r.sent > create("init2").sent
            && r.sent < create("app").sent
    });
    assert!(!relist_between.is_empty(), "a relist between init2 and app");
    k.delete_and_wait(&uid, Some(2), STEP).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_network_pod_gets_ip_hostname_and_hosts_file() -> Result<()> {
    let env = Env::start_with(crisp_e2e::harness::ContainerdOpts { cni: true }, |_| {}).await?;
    let k = &env.kubelet;
    let mut pod = sleeper_pod("netpod", &["app"]);
    pod.host_network = false;
    let uid = k.add_pod(pod)?;
    let view = env.dump_if_failed(&uid, k.wait_all_running(&uid, STEP).await)?;
    let ip = view.status.pod_ips.first().cloned().expect("a pod IP");
    let id = view
        .container("app")
        .and_then(|c| c.container_id.clone())
        .expect("id");
    let meta = crisp_e2e::emulator::CallMeta::default();
    let out = k
        .cri()
        .exec_sync(
            &id,
            vec!["sh".into(), "-c".into(), "hostname; cat /etc/hosts".into()],
            10,
            meta,
        )
        .await?;
    let out = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.starts_with("netpod\n"), "{out}");
    assert!(out.contains(&format!("{ip}\tnetpod")), "{out}");
    k.delete_and_wait(&uid, Some(2), STEP).await?;
    Ok(())
}
