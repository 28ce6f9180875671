//! Native sidecars named in `crisp.dev/ready.<name>` (issue #35): kubelet 1.29+ creates and
//! starts them before any regular container and waits only for "started"; crisp holds the apps'
//! CreateContainer until they are ready, with the same gate, budget and refusals as for legacy
//! sidecars — and never gates, stops or ends them itself.

use super::*;

const NATIVE: (&str, &str) = ("crisp.dev/ready.proxy", r#"exec:["true"]"#);

#[tokio::test(start_paused = true)]
async fn app_is_held_until_a_named_native_sidecar_is_ready() {
    let (fake, engine) = fake_pod(&[], &[NATIVE]);
    // kubelet 1.29: the native sidecar is created and started first, and is not gated.
    let (v, held) = create_container(&engine, &fake, "proxy").await;
    assert_forwarded_at_once(&v, held);
    fake.add_ready_after("proxy", 2 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, 2 * S, 100 * MS);
    assert_eq!(holds(&engine, "start"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_native_sidecar_not_named_is_untouched() {
    let (fake, engine) = fake_pod(&[], &[]);
    fake.add_ready_after("proxy", 2 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
    assert_eq!(fake.script().lists, 0, "not even looked at");
}

/// A name that is never created (not a native sidecar after all, a typo, a kubelet without
/// native sidecars) never holds nor refuses: kubelet would not create it before the app.
#[tokio::test(start_paused = true)]
async fn a_named_native_sidecar_never_created_holds_nothing() {
    let (fake, engine) = fake_pod(&[], &[NATIVE]);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, held);
    assert_eq!(engine.metrics.fail_fast.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_native_sidecar_never_ready_ends_at_the_start_timeout() {
    for (policy, refused) in [("proceed", false), ("fail", true)] {
        let (fake, engine) = fake_pod(
            &[],
            &[
                NATIVE,
                (annotations::START_TIMEOUT, "10s"),
                (annotations::TIMEOUT_POLICY, policy),
            ],
        );
        fake.add("proxy", Some(now()));
        fake.set("proxy", |c| c.ready = None);
        let (v, held) = create_container(&engine, &fake, "app").await;
        assert_eq!(held, 10 * S, "{policy}");
        if refused {
            let msg = refusal(&v);
            assert!(
                msg.contains("sidecar \"proxy\"") && msg.contains("not ready within 10s"),
                "{msg}"
            );
        } else {
            assert_forward(&v);
        }
        assert_eq!(engine.metrics.start_hold_timeouts.get(), 1, "{policy}");
    }
}

/// Exited (kubelet restarts it): refused at once with the same text as a legacy sidecar.
#[tokio::test(start_paused = true)]
async fn app_is_refused_while_a_named_native_sidecar_has_exited() {
    let (fake, engine) = fake_pod(&[], &[NATIVE]);
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.set("proxy", |c| c.exited = Some(t0));
    let (v, held) = create_container(&engine, &fake, "app").await;
    let msg = refusal(&v);
    assert!(
        msg.contains("\"proxy\"") && msg.contains("exited") && msg.contains("network is not ready"),
        "{msg}"
    );
    assert_eq!(held, Duration::ZERO);
}

/// With legacy sidecars too: they wait for the native one (kubelet starts it before every
/// regular container), and the native one waits for nobody.
#[tokio::test(start_paused = true)]
async fn legacy_sidecars_wait_for_named_native_ones() {
    let (fake, engine) = fake_pod(&["mesh"], &[NATIVE]);
    fake.add_ready_after("proxy", 3 * S);
    let (v, held) = create_container(&engine, &fake, "mesh").await;
    assert_forward(&v);
    assert_held(held, 3 * S, 100 * MS);
}

/// Stops stay kubelet's: a native sidecar's StopContainer is forwarded at once, and it is no app
/// a legacy sidecar's stop waits for (kubelet stops native sidecars after every regular one).
#[tokio::test(start_paused = true)]
async fn a_native_sidecars_stop_is_never_held_nor_waited_for() {
    let (fake, engine) = fake_pod(&["mesh"], &[NATIVE]);
    let t0 = now();
    for name in ["proxy", "mesh", "app"] {
        fake.add(name, Some(t0));
    }
    assert_forward(
        &stop_container(&engine, &fake, "app", 30, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 2 * S)));
    // The legacy sidecar waits for the app only, not for the still running native sidecar.
    let (v, held) = stop_container(&engine, &fake, "mesh", 30, KUBELET_DEADLINE).await;
    assert_held(held, 2 * S, 100 * MS);
    assert_eq!(forwarded_timeout(&v, 30), 28, "the pod's one budget");
    let (v, held) = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    assert_forwarded_at_once(&v, held);
    // Alone in its pod, too.
    let (fake, engine) = fake_pod(&[], &[NATIVE]);
    fake.add("proxy", Some(now()));
    fake.add("app", Some(now()));
    let (v, held) = stop_container(&engine, &fake, "proxy", 30, KUBELET_DEADLINE).await;
    assert_forwarded_at_once(&v, held);
}

/// Issue #34's mixed pod: a native sidecar nothing names, beside a legacy one. kubelet stops the
/// native sidecar only once every regular container has stopped, the legacy sidecar included,
/// so a legacy sidecar's stop that waited for it as for an app waited out the pod's budget
/// (the 1.30 and 1.34 lanes: 13.2 s of a 15 s grace). crisp let it through as an init container
/// (kubelet came straight back to it); running at the stop, it is a native sidecar: not waited for.
#[tokio::test(start_paused = true)]
async fn a_legacy_sidecars_stop_does_not_wait_for_an_unnamed_native_sidecar() {
    let (fake, engine) = fake_pod(&["mesh"], &[]);
    // kubelet 1.29+: the native sidecar first, refused once (no sidecar exists yet), then again
    // a second later: an init container.
    refusal(&create_container(&engine, &fake, "proxy").await.0);
    tokio::time::sleep(S).await;
    assert_forward(&create_container(&engine, &fake, "proxy").await.0);
    let t0 = now();
    for name in ["proxy", "mesh", "app"] {
        fake.add(name, Some(t0));
    }
    assert_forward(
        &stop_container(&engine, &fake, "app", 15, KUBELET_DEADLINE)
            .await
            .0,
    );
    fake.set("app", |c| c.exited = Some(at(t0, 2 * S)));
    let (v, held) = stop_container(&engine, &fake, "mesh", 15, KUBELET_DEADLINE).await;
    assert_held(held, 2 * S, 100 * MS);
    assert_eq!(forwarded_timeout(&v, 15), 13, "the pod's one budget");
    // kubelet stops the native sidecar once the legacy one has: forwarded at once.
    fake.set("mesh", |c| c.exited = Some(now()));
    let (v, held) = stop_container(&engine, &fake, "proxy", 13, KUBELET_DEADLINE).await;
    assert_forwarded_at_once(&v, held);
}

/// The views show the hold as waiting on the native sidecar, with its probe.
#[tokio::test(start_paused = true)]
async fn a_hold_on_a_native_sidecar_names_it_in_the_views() {
    let (fake, engine) = fake_pod(&[], &[NATIVE]);
    fake.add_ready_after("proxy", 5 * S);
    let engine2 = engine.clone();
    let fake2 = fake.clone();
    let held = tokio::spawn(async move { create_container(&engine2, &fake2, "app").await });
    tokio::time::sleep(S).await;
    let (pod, _) = engine.lookup(Some(SANDBOX), None);
    let calls = pod.expect("pod cached").held_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].waiting.on, "proxy", "{:?}", calls[0].waiting);
    assert!(
        calls[0].waiting.probe.contains("exec"),
        "{:?}",
        calls[0].waiting
    );
    let (v, _) = held.await.unwrap();
    assert_forward(&v);
}
