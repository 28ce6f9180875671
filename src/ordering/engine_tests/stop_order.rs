//! StopContainer and StopPodSandbox through the engine (DESIGN.md §4): sidecars last, one grace
//! budget, kubelet's deadline; and issue #26's tenant numbers in a stop.

use super::*;

#[tokio::test(start_paused = true)]
async fn app_stop_is_forwarded_at_once() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    let (v, held) = stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE).await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn sidecar_stop_is_held_until_the_apps_exit_and_gets_what_is_left_of_the_budget() {
    let (fake, engine, t0) = fake_running_pod(&["proxy"]);
    // kubelet kills in parallel: the app's stop, then the sidecar's, same grace.
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 3 * S)));
    let (v, held) = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    assert_held(held, 3 * S, 100 * MS);
    let secs = forwarded_timeout(&v, 30);
    assert_eq!(
        secs, 27,
        "one budget for the pod: 30 s from the first stop, 3 s of it spent"
    );
    assert_eq!(holds(&engine, "stop"), 1);
}

#[tokio::test(start_paused = true)]
async fn sidecar_stop_gets_the_2s_tail_once_the_budget_is_spent() {
    let (fake, engine, t0) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 5, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 9 * S)));
    let (v, held) = stop_container(&engine, &fake, "proxy", 5, Some(5 * S + 120 * S)).await;
    assert_held(held, 9 * S, 100 * MS);
    assert_eq!(forwarded_timeout(&v, 5), 2);
}

/// Graceful node shutdown (KEP-2000): kubelet's shutdown manager shortens the pod's grace (to
/// 15 s here). The app's stop is forwarded and the app never exits (a runtime that failed to
/// kill it). kubelet's deadline for the sidecar's stop is still the grace plus 2 min, but no app
/// kubelet stops outlives twice the grace (a preStop of at most the grace, then the grace
/// again): the sidecar's stop is held 30 s, not the 128 s the deadline would allow, then
/// forwarded with the 2 s tail.
#[tokio::test(start_paused = true)]
async fn a_shortened_grace_bounds_the_sidecar_hold_while_an_app_still_runs() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    let deadline = Some(15 * S + 120 * S);
    assert_forward(&stop_container(&engine, &fake, "app", 15, deadline).await.0);
    let (v, held) = stop_container(&engine, &fake, "proxy", 15, deadline).await;
    assert_held(held, 30 * S, 100 * MS);
    assert_eq!(
        forwarded_timeout(&v, 15),
        2,
        "the budget is spent: the KEP's 2 s tail"
    );
}

#[tokio::test(start_paused = true)]
async fn sidecars_stop_in_reverse_declared_order() {
    let (fake, engine, t0) = fake_running_pod(&["first", "second"]);
    fake.set("app", |c| c.exited = Some(t0));
    fake.set("second", |c| c.exited = Some(at(t0, 2 * S)));
    // "first" outlives "second".
    let (v, held) = stop_container(&engine, &fake, "first", 30, KUBELET_DEADLINE).await;
    assert_held(held, 2 * S, 100 * MS);
    assert_eq!(forwarded_timeout(&v, 30), 28);
}

#[tokio::test(start_paused = true)]
async fn a_single_sidecar_kill_is_forwarded_after_its_grace() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    // Liveness kill of the sidecar alone: no app is being stopped; the app keeps running.
    let (v, held) = stop_container(&engine, &fake, "proxy", 5, KUBELET_DEADLINE).await;
    assert_held(held, 5 * S, 100 * MS);
    assert_eq!(
        forwarded_timeout(&v, 5),
        2,
        "its grace is spent: the KEP's 2 s tail"
    );
}

/// The app's stop is forwarded and the app never exits; kubelet's deadline for the sidecar's
/// 30 s stop is 20 s away and every ListContainers takes `list_delay`: the sidecar's stop is
/// still held only until just before that deadline, with 15 s of its budget left.
async fn assert_sidecar_stop_ends_before_kubelets_deadline(list_delay: Duration) {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.script().list_delay = list_delay;
    let (v, held) = stop_container(&engine, &fake, "proxy", 30, Some(20 * S)).await;
    assert_eq!(
        held,
        20 * S - decide::DEADLINE_MARGIN - decide::STOP_TAIL,
        "list delay {list_delay:?}"
    );
    assert_eq!(
        forwarded_timeout(&v, 30),
        15,
        "15 s of the 30 s budget left"
    );
}

#[tokio::test(start_paused = true)]
async fn sidecar_stop_hold_ends_before_kubelets_deadline() {
    assert_sidecar_stop_ends_before_kubelets_deadline(Duration::ZERO).await;
}

/// The hold ends on time even while the runtime has not answered.
#[tokio::test(start_paused = true)]
async fn a_slow_runtime_never_stretches_a_sidecar_stop_past_kubelets_deadline() {
    assert_sidecar_stop_ends_before_kubelets_deadline(30 * S).await;
}

#[tokio::test(start_paused = true)]
async fn a_repeated_sidecar_stop_shares_the_budget() {
    let (fake, engine, t0) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 4 * S)));
    let first = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    tokio::time::sleep(S).await;
    let again = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    assert_eq!(forwarded_timeout(&first.0, 30), 26);
    assert_eq!(again.1, Duration::ZERO, "nothing left to wait for");
    assert_eq!(
        forwarded_timeout(&again.0, 30),
        25,
        "the same window, one second later"
    );
}

#[tokio::test(start_paused = true)]
async fn stop_pod_sandbox_waits_for_the_apps_then_stops_sidecars_in_reverse() {
    let (fake, engine, t0) = fake_running_pod(&["first", "second"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 2 * S)));
    let msg = views::PodSandboxIdRequest {
        pod_sandbox_id: SANDBOX.into(),
    }
    .encode_to_vec();
    let (v, held) = run(&engine, &call("StopPodSandbox", KUBELET_DEADLINE), &msg).await;
    assert_forward(&v);
    assert_held(held, 2 * S, 100 * MS);
    let stops = fake.stops();
    assert_eq!(
        stops,
        vec![("second".to_string(), 28), ("first".to_string(), 28)],
        "reverse order, with what is left of the budget"
    );
}

/// kubelet's StopContainer for the app never came (its own deadline for a grace period near
/// 2^63 s wraps below zero and the call expires unsent), then StopPodSandbox: when the hold
/// ends, crisp stops the app first, then the sidecars in reverse order.
#[tokio::test(start_paused = true)]
async fn stop_pod_sandbox_stops_an_app_kubelet_never_stopped_before_the_sidecars() {
    let (fake, engine, _) = fake_running_pod(&["first", "second"]);
    let msg = views::PodSandboxIdRequest {
        pod_sandbox_id: SANDBOX.into(),
    }
    .encode_to_vec();
    let (v, _) = run(&engine, &call("StopPodSandbox", KUBELET_DEADLINE), &msg).await;
    assert_forward(&v);
    let stops: Vec<String> = fake
        .script()
        .stops
        .iter()
        .map(|(n, _, _)| n.clone())
        .collect();
    assert_eq!(
        stops,
        ["app", "second", "first"],
        "the app before the sidecars, which stop in reverse"
    );
    assert_eq!(fake.script().stops[0].1, decide::STOP_TAIL.as_secs() as i64);
}

// ---------------------------------------------------------------------------------------------
// Issue #26: tenant numbers

/// A pod's terminationGracePeriodSeconds near 2^63 reaches crisp as StopContainer's `timeout`
/// (kubelet's own deadline wraps to an ordinary one, so the call does arrive): the sidecar's
/// stop is still held only while the app runs, then forwarded with at most a day's budget.
#[tokio::test(start_paused = true)]
async fn a_stop_with_an_extreme_grace_period_completes_in_order() {
    for (grace, deadline) in [
        (i64::MAX, Some(60 * S)),
        (i64::MAX, None),
        (i64::MAX - 1, KUBELET_DEADLINE),
    ] {
        let (fake, engine, t0) = fake_running_pod(&["proxy"]);
        let (v, held) = stop_container(&engine, &fake, "app", grace, deadline).await;
        assert_forwarded_at_once(&v, held);
        fake.set("app", |c| c.exited = Some(at(t0, 3 * S)));
        let (v, held) = stop_container(&engine, &fake, "proxy", grace, deadline).await;
        assert_held(held, 3 * S, 100 * MS);
        assert_eq!(
            forwarded_timeout(&v, grace),
            86_397,
            "{grace} {deadline:?}: a day's budget, 3 s of it spent"
        );
    }
}

/// The same with the app never exiting: the hold ends before kubelet's (wrapped) deadline.
#[tokio::test(start_paused = true)]
async fn a_stop_with_an_extreme_grace_period_still_ends_before_kubelets_deadline() {
    let (fake, engine, _) = fake_running_pod(&["proxy"]);
    assert_forward(
        &stop_container(&engine, &fake, "app", i64::MAX, Some(60 * S))
            .await
            .0,
    );
    let (v, held) = stop_container(&engine, &fake, "proxy", i64::MAX, Some(60 * S)).await;
    assert_eq!(held, 60 * S - decide::DEADLINE_MARGIN - decide::STOP_TAIL);
    assert_eq!(forwarded_timeout(&v, i64::MAX), 86_400 - 55);
    // A negative timeout (no grace at all) panics nothing either.
    let (v, _) = stop_container(&engine, &fake, "proxy", i64::MIN, Some(60 * S)).await;
    assert_forward(&v);
}
