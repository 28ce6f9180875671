//! Issue #26: held calls re-read the runtime under the node-wide bound (`ordering/reads.rs`),
//! and a call's first read never waits behind them.

use super::*;

/// Issue #26: held calls re-read the runtime under one node-wide bound. 40 CreateContainers
/// held on a never-ready sidecar and 40 sidecar StopContainers held on a running app, probe
/// interval 100 ms: 800 ListContainers a second unbounded; with `runtime_reads_per_second =
/// 20`, each call's first read and then 20 a second, every call still ending within its hold.
#[tokio::test(start_paused = true)]
async fn held_calls_read_the_runtime_within_the_node_wide_bound() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.ordering.runtime_reads_per_second = 20;
    });
    let t0 = now();
    fake.add("proxy", Some(t0));
    fake.set("proxy", |c| c.ready = None);
    fake.add("app", Some(t0));
    let (create, stop_msg) = (create(&fake, "app"), stop(&id_of(&fake, "proxy"), 30));
    let mut held = Vec::new();
    for i in 0..80u64 {
        let (engine, msg) = (
            engine.clone(),
            if i % 2 == 0 {
                create.clone()
            } else {
                stop_msg.clone()
            },
        );
        let call = Call {
            id: i + 1,
            ..call(
                if i % 2 == 0 {
                    "CreateContainer"
                } else {
                    "StopContainer"
                },
                KUBELET_DEADLINE,
            )
        };
        held.push(tokio::spawn(async move { run(&engine, &call, &msg).await }));
    }
    tokio::time::sleep(10 * S).await;
    let lists = fake.script().lists;
    assert!(
        lists <= 80 + 2 + 20 * 10,
        "{lists} ListContainers in 10 s: 80 first reads, the burst and 20 a second at most"
    );
    assert!(
        lists >= 80 + 20 * 9,
        "{lists}: the held calls still read at the bound"
    );
    for h in held {
        let (v, held) = h.await.unwrap();
        assert!(
            held <= 90 * S + 100 * MS,
            "held {held:?}: within the start timeout, before kubelet's deadline"
        );
        assert!(
            matches!(v, Verdict::Forward | Verdict::ForwardPatched(_)),
            "{v:?}"
        );
    }
}

/// A call's first read is not paced: with 40 calls held re-reading at one read a second, a
/// CreateContainer whose sidecar is ready is forwarded at once, not after their turns.
#[tokio::test(start_paused = true)]
async fn a_calls_first_read_never_waits_behind_held_calls() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.ordering.runtime_reads_per_second = 1;
    });
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let msg = create(&fake, "app");
    let mut held = Vec::new();
    for i in 0..40u64 {
        let (engine, msg) = (engine.clone(), msg.clone());
        let call = Call {
            id: i + 1,
            ..call("CreateContainer", KUBELET_DEADLINE)
        };
        held.push(tokio::spawn(async move { run(&engine, &call, &msg).await }));
    }
    tokio::time::sleep(5 * S).await;
    fake.set("proxy", |c| c.ready = Some(now()));
    let (v, waited) = create_container(&engine, &fake, "app").await;
    assert_forwarded_at_once(&v, waited);
    for h in held {
        h.abort();
    }
}

/// Issue #47 (noticed in the burst): a held create's re-read takes one of the node's reads in
/// flight (`max_runtime_reads_in_flight`) for its ListContainers, not for the probe after it. With
/// one read in flight and one exec probe a second node-wide, a held create whose probes wait
/// for their exec turns kept that read for each wait, and every other read of the node (`crisp
/// pods`, Job watchers, other holds) waited behind it: five reads took seconds. Reads are paced
/// by the read limiter alone now.
#[tokio::test(start_paused = true)]
async fn a_probe_waiting_for_its_exec_turn_holds_no_read_in_flight() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.ordering.max_runtime_reads_in_flight = 1;
        c.ordering.exec_probes_per_second = 1;
        c.ordering.probe_timeout = 2 * S;
    });
    fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let msg = create(&fake, "app");
    let held = {
        let engine = engine.clone();
        let call = call("CreateContainer", KUBELET_DEADLINE);
        tokio::spawn(async move { run(&engine, &call, &msg).await })
    };
    // The hold is in its rounds: a re-read, then a probe that waits for the next exec turn
    // (turns at whole seconds), then 100 ms until the next round. Half-way between two turns
    // the probe is waiting for its turn.
    tokio::time::sleep(3 * S + 500 * MS).await;
    let (p, _) = engine.lookup(Some(SANDBOX), None);
    let p = p.unwrap();
    let t0 = tokio::time::Instant::now();
    for _ in 0..5 {
        engine
            .list_pod_containers(&p, tokio::time::Instant::now() + 60 * S)
            .await
            .unwrap();
    }
    let took = t0.elapsed();
    assert!(
        took < 100 * MS,
        "five reads took {took:?}: a probe waiting for its exec turn kept the read in flight"
    );
    held.abort();
}
