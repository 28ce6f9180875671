//! Job mode through the engine (DESIGN.md §5): the sidecars' stop, the watchers' runtime reads,
//! and the watchers' end at shutdown.

use super::*;

/// Job mode reads the grace period from the sidecar's `io.kubernetes.pod.terminationGracePeriod`:
/// any int64 (or more) stops the sidecar with at most a day's timeout, no panic.
#[tokio::test(start_paused = true)]
async fn a_job_sidecar_with_an_extreme_grace_annotation_is_stopped() {
    for grace in [
        "9223372036854775807",
        "9223372036854775806",
        "18446744073709551615",
    ] {
        let (fake, engine, _) = fake_running_pod(&["proxy"]);
        fake.script().status_annotations = [(
            "io.kubernetes.pod.terminationGracePeriod".to_string(),
            grace.to_string(),
        )]
        .into();
        let pod = engine.pod_by_id(ApiVersion::V1, SANDBOX).await.unwrap();
        engine.terminate_sidecars(ApiVersion::V1, &pod).await;
        let stops = fake.stops();
        assert_eq!(stops, vec![("proxy".to_string(), 86_400)], "{grace}");
    }
}

/// Job watchers too: 40 Job pods whose apps run on, each watched at `job.poll_interval`
/// (100 ms here: 400 reads a second unbounded), read at `runtime_reads_per_second` together.
#[tokio::test(start_paused = true)]
async fn job_watchers_read_the_runtime_within_the_node_wide_bound() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[(annotations::JOB, "true")], |c| {
        c.job.poll_interval = 100 * MS;
        c.ordering.runtime_reads_per_second = 20;
    });
    fake.add("proxy", Some(now()));
    fake.add("app", Some(now()));
    for i in 0..40 {
        assert!(engine
            .pod_by_id(ApiVersion::V1, &format!("sb-{i}"))
            .await
            .is_some());
    }
    assert_eq!(engine.pods().len(), 40);
    tokio::time::sleep(10 * S).await;
    let lists = fake.script().lists;
    assert!(
        (20 * 9..=2 + 20 * 10).contains(&lists),
        "{lists} ListContainers in 10 s by 40 watchers: 20 a second"
    );
}

/// A Job watcher is the engine's own task: it polls while the pod's apps run, and when the
/// engine shuts down it ends — no runtime read after that — and lets the engine go, instead of
/// polling for as long as the process lives.
#[tokio::test(start_paused = true)]
async fn a_job_watcher_ends_when_the_engine_shuts_down() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[(annotations::JOB, "true")], |c| {
        c.job.poll_interval = 100 * MS;
    });
    fake.add("proxy", Some(now()));
    fake.add("app", Some(now()));
    assert!(engine.pod_by_id(ApiVersion::V1, SANDBOX).await.is_some());
    tokio::time::sleep(S).await;
    let polled = fake.script().lists;
    assert!(
        polled >= 5,
        "the watcher polls while the app runs: {polled}"
    );

    tokio::time::timeout(S, engine.shutdown())
        .await
        .expect("shutdown ends the watcher at once");
    let at_shutdown = fake.script().lists;
    tokio::time::sleep(10 * S).await;
    assert_eq!(
        fake.script().lists,
        at_shutdown,
        "no runtime read after shutdown"
    );
    assert_eq!(engine.tasks_running(), 0);
    assert_eq!(
        Arc::strong_count(&engine),
        1,
        "the watcher let the engine go"
    );
}

/// The recovery after a restart is the engine's task too, and so is every watcher it starts.
#[tokio::test(start_paused = true)]
async fn recovery_and_its_watchers_end_when_the_engine_shuts_down() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[(annotations::JOB, "true")], |c| {
        c.job.poll_interval = 100 * MS;
    });
    engine.recover_in_background(ApiVersion::V1);
    engine.shutdown().await;
    assert_eq!(engine.tasks_running(), 0);
    assert_eq!(Arc::strong_count(&engine), 1);
    // A watcher asked for after shutdown ends at once.
    fake.add("proxy", Some(now()));
    fake.add("app", Some(now()));
    assert!(engine.pod_by_id(ApiVersion::V1, SANDBOX).await.is_some());
    tokio::time::sleep(S).await;
    assert_eq!(fake.script().lists, 0, "no watcher polls after shutdown");
}

/// Issue #37: a container removed while crisp was down (no RemoveContainer came through it)
/// leaves no mark for ever: the engine prunes it at start, once the runtime answers — a runtime
/// that is down delays the prune, never the start.
#[tokio::test(start_paused = true)]
async fn the_mark_of_a_container_removed_while_crisp_was_down_is_pruned_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let kept = fake.add("proxy", None);
    {
        let before = job::Terminated::open(Some(dir.path().to_path_buf()));
        before.insert(&kept, SANDBOX).await.unwrap();
        before.insert("removed-meanwhile", SANDBOX).await.unwrap();
    }
    fake.script().down = true;
    let terminated = Arc::new(job::Terminated::open(Some(dir.path().to_path_buf())));
    let engine = Engine::new(
        &Config::default(),
        fake.clone(),
        Arc::new(OrderingMetrics::default()),
        terminated.clone(),
    );
    engine.recover_in_background(ApiVersion::V1);
    tokio::time::sleep(10 * S).await;
    assert!(
        terminated.contains("removed-meanwhile"),
        "nothing is pruned while the runtime does not answer"
    );
    assert!(engine.tasks_running() > 0, "the prune waits for it");

    fake.script().down = false;
    tokio::time::timeout(60 * S, async {
        while engine.tasks_running() > 0 {
            tokio::time::sleep(S).await;
        }
    })
    .await
    .expect("the prune ends once the runtime answers");
    assert!(!terminated.contains("removed-meanwhile"));
    assert!(!dir.path().join("terminated/removed-meanwhile").exists());
    assert!(
        terminated.contains(&kept),
        "a container the runtime has keeps its mark"
    );
    assert!(terminated.may_have_sandbox(SANDBOX));
}

/// Issue #33: a Job pod's marks divert status calls, but only a call about a marked container
/// or its sandbox keeps its response for the patch; any other pod's streams through.
#[tokio::test(start_paused = true)]
async fn only_status_calls_about_a_marked_sidecar_keep_their_response() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    let status = |rpc: &str, id: &str| {
        let call = call(rpc, None);
        let req = views::ContainerIdRequest {
            container_id: id.into(),
            timeout: 0,
        }
        .encode_to_vec();
        (engine.interest(&call), engine.wants_response(&call, &req))
    };
    assert!(
        status("ContainerStatus", "other").0.is_none(),
        "no mark: relayed"
    );
    let proxy = id_of(&fake, "proxy");
    engine.terminated.insert(&proxy, SANDBOX).await.unwrap();
    let kept = Interest {
        request: true,
        response: true,
        ..Interest::NONE
    };
    assert_eq!(status("ContainerStatus", &proxy), (kept, true));
    assert_eq!(status("PodSandboxStatus", SANDBOX), (kept, true));
    assert_eq!(status("ContainerStatus", "other"), (kept, false));
    assert_eq!(status("PodSandboxStatus", "another-pod"), (kept, false));
    assert!(
        engine.wants_response(&call("PodSandboxStatus", None), b"\xff"),
        "a request that shows no id keeps its response"
    );
    engine.terminated.remove(&proxy);
    assert!(status("PodSandboxStatus", SANDBOX).0.is_none());
}
