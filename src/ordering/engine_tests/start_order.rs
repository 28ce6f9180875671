//! CreateContainer through the engine (DESIGN.md §3): sidecars first, refusals, the start
//! timeout, init containers.

use super::*;

#[tokio::test(start_paused = true)]
async fn pod_without_sidecars_is_never_held_nor_looked_up() {
    let (fake, engine) = fake_pod(&[], &[]);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
    assert_eq!(
        fake.script().lists,
        0,
        "no runtime call for a pod without sidecars"
    );
}

#[tokio::test(start_paused = true)]
async fn list_and_status_calls_are_never_observed() {
    let (_fake, engine) = fake_pod(&["proxy"], &[]);
    for rpc in [
        "ListContainers",
        "ListPodSandbox",
        "ContainerStatus",
        "PodSandboxStatus",
        "ListContainerStats",
        "Status",
        "Version",
        "ImageStatus",
        "ListImages",
    ] {
        assert!(
            engine.interest(&call(rpc, None)).is_none(),
            "{rpc} must take the fast path"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn app_is_forwarded_at_once_when_every_sidecar_is_ready() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", Some(now()));
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn app_is_held_until_its_sidecar_is_ready() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add_ready_after("proxy", 4 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, 4 * S, 100 * MS);
    assert_eq!(holds(&engine, "start"), 1);
    assert_eq!(engine.metrics.holds_in_flight.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn sidecars_gate_each_other_in_declared_order() {
    let (fake, engine) = fake_pod(&["first", "second"], &[]);
    fake.add_ready_after("first", 3 * S);
    // The first sidecar waits for nobody.
    let (v, held) = create_container(&engine, &fake, "first").await;
    assert_forwarded_at_once(&v, held);
    // The second waits for the first.
    let (v, held) = create_container(&engine, &fake, "second").await;
    assert_forward(&v);
    assert_held(held, 3 * S, 100 * MS);
}

#[tokio::test(start_paused = true)]
async fn app_listed_before_its_sidecar_is_refused_at_once() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let (v, held) = create_container(&engine, &fake, "app").await;
    let msg = refusal(&v);
    assert!(
        msg.contains("\"proxy\"")
            && msg.contains("not created yet")
            && msg.contains("network is not ready"),
        "{msg}"
    );
    assert_eq!(
        held,
        Duration::ZERO,
        "refused, not held: holding would deadlock kubelet's sync loop"
    );
    assert_eq!(engine.metrics.fail_fast.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn app_is_refused_while_its_sidecar_is_created_but_not_running() {
    for (what, started, exited) in [
        ("created but not started", None, None),
        ("exited", Some(Duration::ZERO), Some(Duration::ZERO)),
    ] {
        let (fake, engine) = fake_pod(&["proxy"], &[]);
        let t0 = now();
        fake.add("proxy", started.map(|d| at(t0, d)));
        fake.set("proxy", |c| c.exited = exited.map(|d| at(t0, d)));
        let (v, held) = create_container(&engine, &fake, "app").await;
        let msg = refusal(&v);
        assert!(msg.contains(what), "{msg}");
        assert_eq!(held, Duration::ZERO);
    }
}

#[tokio::test(start_paused = true)]
async fn hold_ends_at_the_start_timeout_under_proceed() {
    let (fake, engine) = fake_pod(&["proxy"], &[(annotations::START_TIMEOUT, "10s")]);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_eq!(held, 10 * S);
    assert_eq!(engine.metrics.start_hold_timeouts.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn hold_ends_at_the_start_timeout_under_fail() {
    let (fake, engine) = fake_pod(
        &["proxy"],
        &[
            (annotations::START_TIMEOUT, "10s"),
            (annotations::TIMEOUT_POLICY, "fail"),
        ],
    );
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let (v, held) = create_container(&engine, &fake, "app").await;
    let msg = refusal(&v);
    assert!(msg.contains("not ready within 10s"), "{msg}");
    assert_eq!(held, 10 * S);
}

/// A hold that reaches the start timeout because the runtime never answered the start check
/// names the runtime, not a sidecar called "the runtime (…)".
#[tokio::test(start_paused = true)]
async fn start_timeout_waiting_on_the_runtime_names_the_runtime() {
    let (fake, engine) = fake_pod(
        &["proxy"],
        &[
            (annotations::START_TIMEOUT, "10s"),
            (annotations::TIMEOUT_POLICY, "fail"),
        ],
    );
    fake.add("proxy", Some(now()));
    fake.script().list_delay = 60 * S;
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_eq!(
        refusal(&v),
        r#"crisp: the start check of pod ns/pod still waits for the runtime after 10s (no answer before the hold's end); kubelet will retry "app" (network is not ready until the pod's sidecars run)"#
    );
    assert_eq!(held, 10 * S);
}

#[tokio::test(start_paused = true)]
async fn hold_never_outlives_kubelets_deadline() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    // Start timeout 90 s (default); kubelet's deadline 8 s: the hold ends 3 s before it.
    let (v, held) = run(
        &engine,
        &call("CreateContainer", Some(8 * S)),
        &create(&fake, "app"),
    )
    .await;
    assert_forward(&v);
    assert_eq!(held, 8 * S - decide::DEADLINE_MARGIN);
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_hold_forwards_nothing_and_leaves_no_gauge() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    // kubelet gives up after 2 s (the proxy drops the future: drop = cancel).
    let c = call("CreateContainer", KUBELET_DEADLINE);
    let msg = create(&fake, "app");
    let r = tokio::time::timeout(2 * S, engine.on_request(&c, &msg)).await;
    assert!(r.is_err(), "still held when kubelet gave up");
    assert_eq!(
        engine.metrics.holds_in_flight.get(),
        0,
        "the held-calls gauge counts the abandoned hold out"
    );
}

/// A pod whose sidecar `proxy` was created and has exited.
fn dead_proxy_pod(extra: &[(&str, &str)]) -> (Fake, Arc<Engine>) {
    let (fake, engine) = fake_pod(&["proxy"], extra);
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.set("proxy", |c| c.exited = Some(t0));
    (fake, engine)
}

#[tokio::test(start_paused = true)]
async fn refusals_for_a_dead_sidecar_end_at_the_start_timeout_under_proceed() {
    let (fake, engine) = dead_proxy_pod(&[(annotations::START_TIMEOUT, "10s")]);
    refusal(&create_container(&engine, &fake, "app").await.0);
    // kubelet retries every ~1 s; refused until 10 s after the first refusal, then let through.
    tokio::time::sleep(9 * S).await;
    refusal(&create_container(&engine, &fake, "app").await.0);
    tokio::time::sleep(S).await;
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn refusals_for_a_dead_sidecar_go_on_under_fail() {
    let (fake, engine) = dead_proxy_pod(&[
        (annotations::START_TIMEOUT, "10s"),
        (annotations::TIMEOUT_POLICY, "fail"),
    ]);
    refusal(&create_container(&engine, &fake, "app").await.0);
    tokio::time::sleep(20 * S).await;
    refusal(&create_container(&engine, &fake, "app").await.0);
}

#[tokio::test(start_paused = true)]
async fn known_init_container_is_never_held() {
    let (fake, engine) = fake_pod(&["proxy"], &[(annotations::INIT_CONTAINERS, "setup")]);
    let (v, held) = create_container(&engine, &fake, "setup").await;
    assert_forwarded_at_once(&v, held);
}

#[tokio::test(start_paused = true)]
async fn unnamed_init_container_is_let_through_when_kubelet_comes_straight_back() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    // No sidecar exists and nothing names "setup": refused once...
    refusal(&create_container(&engine, &fake, "setup").await.0);
    // ...and kubelet's next call for the pod is the same container again, ~1 s later: init.
    tokio::time::sleep(S).await;
    let (v, _) = create_container(&engine, &fake, "setup").await;
    assert_forward(&v);
}

#[tokio::test(start_paused = true)]
async fn unnamed_regular_container_stays_refused_when_kubelet_moves_on() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    refusal(&create_container(&engine, &fake, "app").await.0);
    // kubelet goes on to the next container in the same loop: the sidecar's CreateContainer.
    let (v, _) = create_container(&engine, &fake, "proxy").await;
    assert_forward(&v);
    // Its creation failed (nothing in the runtime); the app's retry is refused again.
    tokio::time::sleep(S).await;
    refusal(&create_container(&engine, &fake, "app").await.0);
}

/// kubelet retrying the app's CreateContainer every second until crisp forwards it.
async fn retry_until_forwarded(engine: &Engine, fake: &Fake) {
    loop {
        let (v, _) = create_container(engine, fake, "app").await;
        if matches!(v, Verdict::Forward) {
            break;
        }
        tokio::time::sleep(S).await;
    }
}

/// The runtime's clock moves on by `d`: every container it has was created `d` earlier. (The
/// engine reads wall time only through the runtime's records; its own clock is tokio's.)
fn age(fake: &Fake, d: Duration) {
    for c in fake.script().containers.iter_mut() {
        c.created -= d.as_nanos() as i64;
    }
}

/// Issue #37: the refusal clock is the runtime's record, not the process's memory. crisp in a
/// crash loop (a new engine every 3 s, the same runtime) still lets the app of a dead sidecar
/// go at the start timeout under `proceed`, instead of refusing it for as long as it restarts.
#[tokio::test(start_paused = true)]
async fn the_refusal_clock_survives_restarts_of_crisp() {
    let timeout = [(annotations::START_TIMEOUT, "10s")];
    let (fake, mut engine) = dead_proxy_pod(&timeout);
    let t0 = now();
    let let_through = loop {
        let since = now() - t0;
        assert!(since <= 30 * S, "still refused 30 s in");
        let (v, held) = create_container(&engine, &fake, "app").await;
        if matches!(v, Verdict::Forward) {
            assert_eq!(held, Duration::ZERO);
            break since;
        }
        refusal(&v);
        // kubelet retries a second later; crisp restarts every 3 s.
        tokio::time::sleep(S).await;
        age(&fake, S);
        if (now() - t0).as_secs().is_multiple_of(3) {
            engine = pod(&fake, &["proxy"], &timeout);
        }
    };
    assert!(
        (10 * S..=11 * S).contains(&let_through),
        "let through {let_through:?} after the first refusal"
    );
}

/// A restarted crisp does not end the refusals early either: the sidecar died 4 s ago, so the
/// app is still refused for 6 s more.
#[tokio::test(start_paused = true)]
async fn a_restarted_crisp_refuses_until_the_sidecars_clock_runs_out() {
    let timeout = [(annotations::START_TIMEOUT, "10s")];
    let (fake, _before) = dead_proxy_pod(&timeout);
    age(&fake, 4 * S);
    let engine = pod(&fake, &["proxy"], &timeout);
    let t0 = now();
    retry_until_forwarded(&engine, &fake).await;
    assert_eq!(now() - t0, 6 * S);
}

/// The clock counts from the sidecar's death, not its creation: a sidecar that ran for 97 s
/// and died 3 s ago keeps its app refused for 7 s more after a restart.
#[tokio::test(start_paused = true)]
async fn a_restarted_crisp_counts_from_the_sidecars_death_not_its_creation() {
    let timeout = [(annotations::START_TIMEOUT, "10s")];
    let (fake, _before) = fake_pod(&["proxy"], &timeout);
    fake.add("proxy", Some(now()));
    tokio::time::sleep(97 * S).await;
    fake.set("proxy", |c| c.exited = Some(now()));
    age(&fake, 100 * S);
    let engine = pod(&fake, &["proxy"], &timeout);
    let t0 = now();
    retry_until_forwarded(&engine, &fake).await;
    assert_eq!(now() - t0, 7 * S);
}
