//! Live holds through the engine (DESIGN.md §6): the tap's hold events, `crisp pods`, and
//! `refuse_held_after`.

use super::*;

#[derive(Default)]
struct Recorder(Mutex<Vec<crate::hold_events::HoldEvent>>);

impl HoldSink for Recorder {
    fn wanted(&self) -> bool {
        true
    }
    fn publish(&self, ev: crate::hold_events::HoldEvent) {
        self.0.lock().unwrap().push(ev);
    }
}

impl Recorder {
    fn phases(&self) -> Vec<crate::hold_events::HoldPhase> {
        self.0.lock().unwrap().iter().map(|e| e.phase).collect()
    }
}

fn recorded(engine: &Engine) -> Arc<Recorder> {
    let r = Arc::new(Recorder::default());
    engine.set_hold_sink(r.clone());
    r
}

#[tokio::test(start_paused = true)]
async fn a_hold_is_reported_live_with_its_reason_at_a_bounded_rate() {
    use crate::hold_events::HoldPhase::*;
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let rec = recorded(&engine);
    fake.add_ready_after("proxy", 12 * S);
    let eng = engine.clone();
    let held = tokio::spawn(async move {
        run(
            &eng,
            &call("CreateContainer", KUBELET_DEADLINE),
            &create(&Fake(Arc::clone(&fake.0)), "app"),
        )
        .await
    });
    // While it is held: the start event says what it waits for, and `crisp pods` sees it.
    tokio::time::sleep(3 * S).await;
    {
        let evs = rec.0.lock().unwrap();
        let start = &evs[0];
        assert_eq!(start.phase, Start);
        assert_eq!(
            (
                start.waiting_on.as_str(),
                start.reason.as_str(),
                start.probe.as_str()
            ),
            ("proxy", "not ready", r#"exec:["true"]"#)
        );
        assert_eq!(
            start.probe_result, "exec exited 1",
            "the probe's last result"
        );
        assert_eq!(
            (
                start.pod_namespace.as_str(),
                start.pod_name.as_str(),
                start.container_name.as_str()
            ),
            ("ns", "pod", "app")
        );
        assert_eq!(start.policy, "proceed");
        assert!(
            start.time_left > 89 * S && start.time_left <= 90 * S,
            "{:?}",
            start.time_left
        );
    }
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    let now_held = p.expect("pod").held_calls();
    assert_eq!(now_held.len(), 1);
    assert_eq!(now_held[0].waiting.on, "proxy");
    assert!(
        now_held[0].time_left() <= 87 * S && now_held[0].time_left() > 86 * S,
        "{:?}",
        now_held[0].time_left()
    );
    let (v, held_for) = held.await.unwrap();
    assert_forward(&v);
    assert_held(held_for, 12 * S, 100 * MS);
    // ~120 probe rounds, nothing changed but time: an update every 5 s, no more.
    assert_eq!(rec.phases(), vec![Start, Update, Update, End]);
    let end = rec.0.lock().unwrap().last().cloned().unwrap();
    assert_eq!(end.outcome_str(), "forwarded");
    assert!(end.held >= 12 * S);
    assert!(
        engine
            .lookup(Some(SANDBOX), None)
            .0
            .unwrap()
            .held_calls()
            .is_empty(),
        "no longer held"
    );
}

#[tokio::test(start_paused = true)]
async fn a_changing_reason_is_reported_at_most_once_a_second() {
    use crate::hold_events::HoldPhase::*;
    let (fake, engine) = fake_pod(&["first", "second"], &[]);
    let rec = recorded(&engine);
    let t0 = now();
    fake.add("first", Some(t0));
    fake.add("second", Some(t0));
    // `first` turns ready at 2.5 s: the app then waits on `second` until 4 s.
    fake.set("first", |c| c.ready = Some(at(t0, 2500 * MS)));
    fake.set("second", |c| c.ready = Some(at(t0, 4 * S)));
    let (v, _) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    let evs = rec.0.lock().unwrap();
    assert_eq!(
        evs.iter().map(|e| e.phase).collect::<Vec<_>>(),
        vec![Start, Update, End]
    );
    assert_eq!(
        (evs[0].waiting_on.as_str(), evs[1].waiting_on.as_str()),
        ("first", "second")
    );
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_reported_and_counted() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let rec = recorded(&engine);
    let (v, _) = create_container(&engine, &fake, "app").await;
    let msg = refusal(&v).to_string();
    let evs = rec.0.lock().unwrap();
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].phase, crate::hold_events::HoldPhase::Refused);
    assert_eq!(
        (evs[0].waiting_on.as_str(), evs[0].reason.as_str()),
        ("proxy", "not created")
    );
    assert_eq!(evs[0].message, msg);
    assert_eq!(pod_refusals(&engine), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_hold_reports_that_kubelet_gave_up() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    let rec = recorded(&engine);
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let c = call("CreateContainer", KUBELET_DEADLINE);
    let msg = create(&fake, "app");
    // kubelet cancels after 2 s: the proxy drops the held future.
    let _ = tokio::time::timeout(2 * S, engine.on_request(&c, &msg)).await;
    let evs = rec.0.lock().unwrap();
    assert_eq!(
        evs.last().map(|e| (e.phase, e.outcome_str())),
        Some((crate::hold_events::HoldPhase::End, "kubelet gave up"))
    );
    assert!(engine
        .lookup(Some(SANDBOX), None)
        .0
        .unwrap()
        .held_calls()
        .is_empty());
    assert_eq!(engine.metrics.holds_in_flight.get(), 0);
}

#[test]
fn refuse_held_after_is_on_by_default_and_bounded() {
    assert_eq!(
        Config::default().ordering.refuse_held_after,
        crate::config::DEFAULT_REFUSE_HELD_AFTER
    );
    let mut cfg = Config::default();
    cfg.ordering.refuse_held_after = 500 * MS;
    assert!(cfg
        .validate("test")
        .unwrap_err()
        .to_string()
        .contains("ordering.refuse_held_after"));
    cfg.ordering.refuse_held_after = Duration::ZERO;
    assert!(cfg.validate("test").is_ok(), "0s turns it off");
}

#[tokio::test(start_paused = true)]
async fn a_long_hold_ends_as_an_informative_refusal_and_the_timeout_still_counts_from_the_first() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = 30 * S
    });
    let rec = recorded(&engine);
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.set("proxy", |c| c.ready = None);
    // kubelet: each refusal comes back 1.2 s later ("network is not ready", KUBELET-CRI §1.3).
    let mut refusals = Vec::new();
    let forwarded_at = loop {
        let (v, _) = create_container(&engine, &fake, "app").await;
        match v {
            Verdict::Forward => break now() - t0,
            v => refusals.push((now() - t0, refusal(&v).to_string())),
        }
        assert!(refusals.len() < 10, "never let through: {refusals:?}");
        tokio::time::sleep(1200 * MS).await;
    };
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert_held(refusals[0].0, 30 * S, 100 * MS);
    assert_held(refusals[1].0, 61200 * MS, 200 * MS);
    assert_eq!(
        refusals[0].1,
        r#"crisp: waiting for sidecar proxy of ns/pod: not ready: exec exited 1; held 30 s of 90 s; kubelet will retry "app" (network is not ready until the pod's sidecars run)"#
    );
    assert!(
        refusals[1].1.contains("held 61 s of 90 s"),
        "{}",
        refusals[1].1
    );
    // Policy proceed at the start timeout, counted from the first hold, not from the retry.
    assert_held(forwarded_at, 90 * S, 200 * MS);
    let outcomes: Vec<&str> = rec
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.phase == crate::hold_events::HoldPhase::End)
        .map(|e| e.outcome_str())
        .collect();
    assert_eq!(
        outcomes,
        vec![
            "refused (still waiting)",
            "refused (still waiting)",
            "timed out (proceed)"
        ]
    );
    assert_eq!(pod_refusals(&engine), 2);
}

/// A long hold on a runtime that fails the start check's read says so once, and the tap's event
/// carries the runtime's own words as the reason.
#[tokio::test(start_paused = true)]
async fn a_long_hold_on_the_runtime_names_the_runtime_once() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = 30 * S
    });
    let rec = recorded(&engine);
    fake.add("proxy", Some(now()));
    fake.script().list_fails = true;
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_held(held, 30 * S, 100 * MS);
    assert_eq!(
        refusal(&v),
        r#"crisp: waiting for the runtime (ListContainers: no answer within 5s); held 30 s of 90 s; kubelet will retry "app" (network is not ready until the pod's sidecars run)"#
    );
    let evs = rec.0.lock().unwrap();
    assert_eq!(
        (evs[0].waiting_on.as_str(), evs[0].reason.as_str()),
        ("runtime", "ListContainers: no answer within 5s")
    );
}

/// A sidecar may be named `runtime`: a long hold on it is a hold on a sidecar.
#[tokio::test(start_paused = true)]
async fn a_long_hold_on_a_sidecar_named_runtime_names_the_sidecar() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["runtime"], &[], |c| {
        c.ordering.refuse_held_after = 30 * S
    });
    fake.add("runtime", Some(now()));
    fake.set("runtime", |c| c.ready = None);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_held(held, 30 * S, 100 * MS);
    assert_eq!(
        refusal(&v),
        r#"crisp: waiting for sidecar runtime of ns/pod: not ready: exec exited 1; held 30 s of 90 s; kubelet will retry "app" (network is not ready until the pod's sidecars run)"#
    );
}

#[tokio::test(start_paused = true)]
async fn a_short_hold_is_never_refused() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = 30 * S
    });
    fake.add_ready_after("proxy", 29 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, 29 * S, 100 * MS);
}
