//! Held calls kept across crisp's death (issue #43, `intents.rs`): an engine dropped mid-hold
//! and a new one made on the same state directory is crisp SIGKILLed and restarted. kubelet's
//! held call dies with the first engine (its future is dropped, no answer, no `on_complete`).

use super::*;
use crate::intercept::Outcome;

/// kubelet got its answer: the call ends (`on_complete`), as the relay reports it.
fn answered(engine: &Engine, call: &Call) {
    engine.on_complete(
        call,
        &Outcome {
            code: Some(0),
            duration: Duration::ZERO,
            held: Duration::ZERO,
            request: None,
            response: None,
            message: None,
            streamed: None,
        },
    );
}

/// The files left in the intents directory.
fn intent_files(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("intents"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Waits (at most 5 s of real time) for the intents directory to empty (`Intents::done`
/// unlinks on a blocking thread), and checks that it did: `why` says why nothing is kept.
async fn unlinked(dir: &std::path::Path, why: &str) {
    unlinked_down_to(dir, 0).await;
    assert!(intent_files(dir).is_empty(), "{why}");
}

/// [`unlinked`], until at most `left` files remain.
async fn unlinked_down_to(dir: &std::path::Path, left: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while intent_files(dir).len() > left && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A pod with a sidecar `proxy` and an app, both running from now, on an engine that keeps its
/// intents under `dir` and refuses a held call at once: the runtime, the engine and when they
/// started.
fn proxy_and_app(dir: &std::path::Path) -> (Fake, Arc<Engine>, Instant) {
    proxy_and_app_with(dir, |c| c.ordering.refuse_held_after = Duration::ZERO)
}

/// [`proxy_and_app`] on an engine configured by `tune`.
fn proxy_and_app_with(
    dir: &std::path::Path,
    tune: impl FnOnce(&mut Config),
) -> (Fake, Arc<Engine>, Instant) {
    let fake = Fake::default();
    let engine = pod_on(&fake, &["proxy"], &[], tune, Some(dir));
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.add("app", Some(t0));
    (fake, engine, t0)
}

/// [`proxy_and_app`], then kubelet stops the app (grace 30 s): forwarded and answered before
/// crisp dies; the app exits 3 s after the pod started.
async fn proxy_and_stopped_app(dir: &std::path::Path) -> (Fake, Arc<Engine>, Instant) {
    let (fake, engine, t0) = proxy_and_app(dir);
    let app_stop = call("StopContainer", KUBELET_DEADLINE);
    assert_forward(
        &engine
            .on_request(&app_stop, &stop(&id_of(&fake, "app"), 30))
            .await,
    );
    answered(&engine, &app_stop);
    fake.set("app", |c| c.exited = Some(at(t0, 3 * S)));
    (fake, engine, t0)
}

/// kubelet's StopContainer of the sidecar (call 2, 30 s grace), given a second: whether crisp
/// still held it then.
async fn sidecar_stop_held(fake: &Fake, engine: &Engine) -> bool {
    let mut sidecar_stop = call("StopContainer", KUBELET_DEADLINE);
    sidecar_stop.id = 2;
    let stop = stop(&id_of(fake, "proxy"), 30);
    tokio::time::timeout(S, engine.on_request(&sidecar_stop, &stop))
        .await
        .is_err()
}

/// A new engine on `dir` (crisp restarted) that has reconciled what it found there.
async fn restarted(fake: &Fake, sidecars: &[&str], dir: &std::path::Path) -> Arc<Engine> {
    let engine = pod_on(
        fake,
        sidecars,
        &[],
        |c| c.ordering.refuse_held_after = Duration::ZERO,
        Some(dir),
    );
    engine.recover_in_background(ApiVersion::V1);
    engine.intents_reconciled().await;
    engine
}

/// Issue #43 item 2: under a crash loop faster than the start timeout (crisp killed every
/// 3 s, each time holding the app's CreateContainer; kubelet retries a second later), an app
/// whose sidecar runs but never gets ready is let through at its start timeout under
/// `proceed`, counted from kubelet's first call — not held for as long as crisp restarts.
#[tokio::test(start_paused = true)]
async fn a_create_holds_clock_survives_a_crash_loop() {
    let dir = tempfile::tempdir().unwrap();
    let extra = [
        (annotations::START_TIMEOUT, "10s"),
        (annotations::TIMEOUT_POLICY, "proceed"),
    ];
    let fake = Fake::default();
    let make = || {
        pod_on(
            &fake,
            &["proxy"],
            &extra,
            |c| c.ordering.refuse_held_after = Duration::ZERO,
            Some(dir.path()),
        )
    };
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let t0 = now();
    let let_through = loop {
        assert!(
            now() - t0 <= 30 * S,
            "app still held 30 s after kubelet's first call"
        );
        let engine = make();
        let call = call("CreateContainer", KUBELET_DEADLINE);
        match tokio::time::timeout(3 * S, engine.on_request(&call, &create(&fake, "app"))).await {
            Ok(v) => {
                assert_forward(&v);
                break now() - t0;
            }
            // crisp killed mid-hold; kubelet sees Unavailable and retries a second later.
            Err(_) => {
                drop(engine);
                tokio::time::sleep(S).await;
            }
        }
    };
    assert!(
        (10 * S..=10 * S + 100 * MS).contains(&let_through),
        "let through {let_through:?} after kubelet's first call, start timeout 10 s"
    );
    unlinked(dir.path(), "the hold is over: its clock goes").await;
}

/// Issue #43 item 1: kubelet stops the pod (app and sidecar at once); crisp holds the sidecar's
/// stop until the app exits and is killed holding it; kubelet never sends that stop again (a
/// removed static pod under kubelet 1.26). The restarted crisp stops the sidecar itself after
/// the app has exited, with what is left of the pod's grace, exactly once — another restart
/// after that does nothing — and a retry from kubelet after all finds it done (forwarded at
/// once; a stop of a stopped container is a no-op in the runtime).
#[tokio::test(start_paused = true)]
async fn a_held_sidecar_stop_is_carried_out_by_the_restarted_crisp_after_the_apps() {
    let dir = tempfile::tempdir().unwrap();
    // The app's stop is forwarded and answered before crisp dies; the app exits at 3 s.
    let (fake, first, t0) = proxy_and_stopped_app(dir.path()).await;
    // The sidecar's stop is held; crisp is killed 1 s into the hold.
    assert!(
        sidecar_stop_held(&fake, &first).await,
        "the sidecar's stop is held while the app runs"
    );
    drop(first);
    assert_eq!(
        intent_files(dir.path()),
        vec![format!("stop-{}", id_of(&fake, "proxy"))]
    );

    // crisp is back 500 ms later; kubelet does not retry.
    tokio::time::sleep(500 * MS).await;
    let second = restarted(&fake, &["proxy"], dir.path()).await;
    tokio::time::sleep(10 * S).await;
    let stops = fake.script().stops.clone();
    assert_eq!(stops.len(), 1, "the sidecar is stopped once: {stops:?}");
    let (name, secs, when) = &stops[0];
    assert_eq!(name, "proxy");
    let after = *when - t0;
    assert!(
        (3 * S..=3 * S + 100 * MS).contains(&after),
        "stopped {after:?} after the pod's first stop; the app exited at 3 s"
    );
    assert_eq!(*secs, 27, "what is left of the pod's 30 s grace");
    assert_eq!(second.metrics.intents_replayed.get(), 1);
    unlinked(dir.path(), "carried out: the intent goes").await;

    // Another restart carries nothing out again.
    drop(second);
    let third = restarted(&fake, &["proxy"], dir.path()).await;
    tokio::time::sleep(5 * S).await;
    assert_eq!(fake.stops().len(), 1);

    // kubelet's retry after all: its apps are gone, forwarded at once with the grace left.
    let mut retry = call("StopContainer", KUBELET_DEADLINE);
    retry.id = 3;
    let (v, held) = run(&third, &retry, &stop(&id_of(&fake, "proxy"), 30)).await;
    assert_eq!(held, Duration::ZERO);
    assert!(
        matches!(v, Verdict::Forward | Verdict::ForwardPatched(_)),
        "{v:?}"
    );
    answered(&third, &retry);
    unlinked(dir.path(), "every intent answered").await;
}

/// A stop crisp forwarded at once (the app's) whose answer crisp's death dropped is kept too:
/// the restarted crisp stops the app at once if it still runs, and the held sidecar stop of
/// the same pod then follows it — the order holds across the restart.
#[tokio::test(start_paused = true)]
async fn a_forwarded_stop_whose_answer_died_with_crisp_is_carried_out_first() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, first, _) = proxy_and_app(dir.path());
    // Forwarded, never answered (crisp dies before the runtime's answer); the app runs on.
    let app_stop = call("StopContainer", KUBELET_DEADLINE);
    assert_forward(
        &first
            .on_request(&app_stop, &stop(&id_of(&fake, "app"), 30))
            .await,
    );
    sidecar_stop_held(&fake, &first).await;
    drop(first);
    tokio::time::sleep(S).await;
    let _second = restarted(&fake, &["proxy"], dir.path()).await;
    tokio::time::sleep(5 * S).await;
    let stops: Vec<String> = fake.stops().into_iter().map(|(name, _)| name).collect();
    assert_eq!(
        stops,
        vec!["app".to_string(), "proxy".to_string()],
        "app first"
    );
    unlinked(dir.path(), "every intent answered").await;
}

/// An intent goes with its answer: a stop answered before crisp dies leaves nothing to carry
/// out, and a stop of a container that no longer runs is dropped at start without action.
#[tokio::test(start_paused = true)]
async fn answered_or_finished_stops_are_not_carried_out() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, first, _) = proxy_and_app_with(dir.path(), |_| {});
    let app_stop = call("StopContainer", KUBELET_DEADLINE);
    assert_forward(
        &first
            .on_request(&app_stop, &stop(&id_of(&fake, "app"), 30))
            .await,
    );
    answered(&first, &app_stop);
    unlinked(dir.path(), "answered: nothing kept").await;
    // A held stop whose sidecar exits by itself while crisp is down.
    sidecar_stop_held(&fake, &first).await;
    drop(first);
    fake.set("proxy", |c| c.exited = Some(now()));
    fake.set("app", |c| c.exited = Some(now()));
    let _second = restarted(&fake, &["proxy"], dir.path()).await;
    tokio::time::sleep(5 * S).await;
    assert!(fake.stops().is_empty(), "{:?}", fake.stops());
    unlinked(dir.path(), "every intent answered").await;
}

/// The storm lane's leftovers (RELIABILITY.md, static-storm run 5): kubelet 1.26 sends
/// StopPodSandbox for a removed static pod once; crisp holds it while the app exits and is
/// killed holding it. The restarted crisp carries it out the way the gate would have: the
/// sidecar after the app, then the sandbox — once, and nothing again at the next start.
#[tokio::test(start_paused = true)]
async fn a_held_stop_pod_sandbox_is_carried_out_by_the_restarted_crisp() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, first, t0) = proxy_and_stopped_app(dir.path()).await;
    let mut sandbox_stop = call("StopPodSandbox", KUBELET_DEADLINE);
    sandbox_stop.id = 2;
    let msg = views::PodSandboxIdRequest {
        pod_sandbox_id: SANDBOX.into(),
    }
    .encode_to_vec();
    let held = tokio::time::timeout(S, first.on_request(&sandbox_stop, &msg)).await;
    assert!(held.is_err(), "StopPodSandbox is held while the app runs");
    drop(first);
    unlinked_down_to(dir.path(), 1).await;
    assert_eq!(intent_files(dir.path()), vec![format!("sandbox-{SANDBOX}")]);

    tokio::time::sleep(500 * MS).await;
    let second = restarted(&fake, &["proxy"], dir.path()).await;
    tokio::time::sleep(10 * S).await;
    let stops = fake.script().stops.clone();
    assert_eq!(stops.len(), 1, "the sidecar is stopped once: {stops:?}");
    assert_eq!(stops[0].0, "proxy");
    let sidecar_after = stops[0].2 - t0;
    assert!(
        (3 * S..=3 * S + 100 * MS).contains(&sidecar_after),
        "the sidecar stopped {sidecar_after:?} after the pod's first stop; the app exited at 3 s"
    );
    assert_eq!(stops[0].1, 27, "what is left of the pod's 30 s grace");
    let sandbox_stops = fake.script().sandbox_stops.clone();
    assert_eq!(sandbox_stops.len(), 1, "{sandbox_stops:?}");
    assert!(
        sandbox_stops[0] >= stops[0].2,
        "the sandbox after its sidecar"
    );
    assert_eq!(second.metrics.intents_replayed.get(), 1);
    unlinked(dir.path(), "carried out: it goes").await;

    drop(second);
    let _third = restarted(&fake, &["proxy"], dir.path()).await;
    tokio::time::sleep(5 * S).await;
    assert_eq!(fake.script().sandbox_stops.len(), 1, "once");
}

/// A kept StopPodSandbox whose sandbox was stopped meanwhile (kubelet's call reached the
/// runtime before crisp died) is dropped at start without action; one kubelet's answer
/// reached leaves nothing on disk.
#[tokio::test(start_paused = true)]
async fn a_stop_pod_sandbox_already_done_is_not_carried_out() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, first, t0) = proxy_and_app_with(dir.path(), |_| {});
    fake.set("app", |c| c.exited = Some(t0));
    let msg = views::PodSandboxIdRequest {
        pod_sandbox_id: SANDBOX.into(),
    }
    .encode_to_vec();
    // Answered: the intent goes with the answer.
    let answered_stop = call("StopPodSandbox", KUBELET_DEADLINE);
    assert_forward(&first.on_request(&answered_stop, &msg).await);
    answered(&first, &answered_stop);
    unlinked(dir.path(), "answered: nothing kept").await;
    // Forwarded, then crisp dies; the runtime finished it all the same.
    let mut lost = call("StopPodSandbox", KUBELET_DEADLINE);
    lost.id = 2;
    assert_forward(&first.on_request(&lost, &msg).await);
    drop(first);
    assert_eq!(intent_files(dir.path()), vec![format!("sandbox-{SANDBOX}")]);
    fake.script().sandbox_stopped = Some(now());
    let before = fake.stops().len();
    let _second = restarted(&fake, &["proxy"], dir.path()).await;
    tokio::time::sleep(5 * S).await;
    assert!(fake.script().sandbox_stops.is_empty());
    assert_eq!(fake.stops().len(), before);
    unlinked(dir.path(), "every intent answered").await;
}

/// Issue #43 item 5: a Job's sidecars are not stopped when their mark cannot be written (a
/// full or read-only state directory): after a restart kubelet would see 137/143 and the Job
/// would fail. Said and counted instead; no preStop hook runs either.
#[tokio::test(start_paused = true)]
async fn no_job_sidecar_is_stopped_without_a_durable_mark() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::default();
    let engine = pod_on(
        &fake,
        &["proxy"],
        &[(annotations::JOB, "true")],
        |_| {},
        Some(dir.path()),
    );
    fake.add("proxy", Some(now()));
    fake.add("app", Some(now()));
    fake.script().status_annotations = [(
        "io.kubernetes.container.preStopHandler".to_string(),
        r#"{"exec":{"command":["drain"]}}"#.to_string(),
    )]
    .into();
    // The marks' directory cannot be written (root ignores modes: a file where it should be).
    let marks = dir.path().join("terminated");
    std::fs::remove_dir(&marks).unwrap();
    std::fs::write(&marks, b"").unwrap();
    let pod = engine.pod_by_id(ApiVersion::V1, SANDBOX).await.unwrap();
    engine.terminate_sidecars(ApiVersion::V1, &pod).await;
    assert_eq!(fake.stops(), vec![], "stopped without a mark");
    assert!(fake.script().execs.is_empty(), "preStop ran without a mark");
    assert_eq!(engine.metrics.mark_write_errors.get(), 1);
    assert!(!engine.terminated("proxy-0"));

    // Writable again (and crisp restarted: the watcher is rebuilt): stopped, with its mark.
    std::fs::remove_file(&marks).unwrap();
    std::fs::create_dir(&marks).unwrap();
    engine.terminate_sidecars(ApiVersion::V1, &pod).await;
    assert_eq!(fake.stops(), vec![("proxy".to_string(), 30)]);
    assert!(marks.join(id_of(&fake, "proxy")).exists());
}
