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
