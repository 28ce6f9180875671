//! Readiness probes through the engine (DESIGN.md §3.2, §6a): issue #19's rule on where a pod's
//! annotation may aim a probe, the pod's network namespace, and the node-wide pace of exec probes.

use super::*;
use crate::readiness::Readiness;

/// A pod annotation aimed at an address that is not the pod's: one warning and one
/// `crisp_bad_annotations_total` per pod however often it is probed, nothing connected to, and
/// the sidecar judged as if the key were absent (`running`: the app goes at once).
#[tokio::test(start_paused = true)]
async fn an_annotation_aimed_elsewhere_is_bad_once_and_treated_as_absent() {
    let (fake, engine) = fake_pod(&["proxy"], &[]);
    fake.script().annotations.insert(
        "crisp.dev/ready.proxy".into(),
        "http://192.0.2.1:10255/pods".into(),
    );
    fake.script().ip = Some("10.1.2.3".into());
    fake.add("proxy", Some(now()));
    for _ in 0..3 {
        let (v, held) = create_container(&engine, &fake, "app").await;
        assert_forwarded_at_once(&v, held);
    }
    assert_eq!(
        engine.metrics.bad_annotations.get(),
        1,
        "once per pod, not per probe"
    );
    assert_eq!(
        engine.metrics.probe_connects.get(),
        0,
        "nothing connected to"
    );
    assert_eq!(last_probe(&engine), Ok(()));
}

/// The same spec naming the pod's own IP is probed; naming a network the operator allowed, it
/// is probed only from inside the pod's network (`isolated.rs`,
/// `an_allowed_network_is_probed_from_inside_the_pods_namespace`): this runtime reveals no
/// namespace, and from the node's an allowed network would be reached with the node's address
/// (issue #44), so it is a bad annotation here.
#[tokio::test(start_paused = true)]
async fn an_annotation_naming_the_pods_ip_or_an_allowed_network_is_probed() {
    for (ip, allow, probed) in [
        ("192.0.2.1", vec![], true),
        ("10.1.2.3", vec!["192.0.2.0/24"], false),
    ] {
        let fake = Fake::default();
        fake.script().annotations = [
            (annotations::SIDECARS, "proxy"),
            ("crisp.dev/ready.proxy", "tcp://192.0.2.1:1"),
            (annotations::START_TIMEOUT, "1s"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        fake.script().ip = Some(ip.into());
        let mut cfg = Config::default();
        cfg.ordering.probe_allow =
            crate::config::parse_cidrs(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        cfg.ordering.probe_timeout = 10 * MS;
        let engine = Engine::new(
            &cfg,
            fake.clone(),
            Arc::new(OrderingMetrics::default()),
            Arc::new(job::Terminated::open(None)),
        );
        fake.add("proxy", Some(now()));
        let _ = create_container(&engine, &fake, "app").await;
        assert_eq!(
            engine.metrics.bad_annotations.get(),
            u64::from(!probed),
            "{ip} {allow:?}"
        );
        assert_eq!(
            engine.metrics.probe_connects.get() > 0,
            probed,
            "{ip} {allow:?}"
        );
    }
}

/// A CNI pod whose network namespace the runtime does not reveal: a probe of loopback fails
/// with the reason and never reaches the node's loopback (a listener there accepts nothing).
#[tokio::test(start_paused = true)]
async fn loopback_of_a_pod_whose_namespace_is_unknown_is_never_the_nodes() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let port = l.local_addr().unwrap().port();
    let (fake, engine) = fake_pod(&["proxy"], &[(annotations::START_TIMEOUT, "1s")]);
    fake.script().annotations.insert(
        "crisp.dev/ready.proxy".into(),
        format!("tcp://127.0.0.1:{port}"),
    );
    fake.script().ip = Some("10.1.2.3".into());
    fake.add("proxy", Some(now()));
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert_held(held, S, 100 * MS);
    assert_eq!(
        l.accept().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::WouldBlock),
        "crisp connected to the node's loopback"
    );
    let why = last_probe(&engine).unwrap_err();
    assert!(
        why.starts_with("cannot enter the pod's network namespace: "),
        "{why}"
    );
    let m = &engine.metrics;
    assert_eq!(
        (m.probe_netns_failures.get(), m.bad_annotations.get()),
        (1, 0),
        "the namespace not found (and logged) once per pod; loopback is the pod's own address"
    );
}

/// Exec probes are paced by their own budget (issues #26, #33): at one per second node-wide, a sidecar
/// probed every 100 ms gets about one ExecSync a second, and the rounds without a turn are
/// counted as limited.
#[tokio::test(start_paused = true)]
async fn exec_probes_take_the_node_wide_rate() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &["proxy"], &[], |c| {
        c.ordering.refuse_held_after = Duration::ZERO;
        c.ordering.exec_probes_per_second = 1;
        c.ordering.probe_timeout = 10 * MS;
    });
    fake.add_ready_after("proxy", 5 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert!(held >= 5 * S && held <= 7 * S, "held {held:?}");
    // ~50 rounds, ~6 tokens.
    let limited = engine.metrics.probe_limited.get();
    assert!(
        limited >= 35,
        "only {limited} of ~50 exec rounds waited for the rate"
    );
}

/// Issue #33: a sidecar judged ready is not exec'd again for the same hold. `fast` is ready at
/// once, `slow` after 2 s of rounds every 100 ms: `fast` gets one ExecSync, not one a round.
#[tokio::test(start_paused = true)]
async fn a_sidecar_judged_ready_is_not_execd_again_in_the_same_hold() {
    let fake = Fake::default();
    let engine = pod(&fake, &["fast", "slow"], &[]);
    fake.add_ready_after("fast", Duration::ZERO);
    fake.add_ready_after("slow", 2 * S);
    let (v, held) = create_container(&engine, &fake, "app").await;
    assert_forward(&v);
    assert!(held >= 2 * S, "held {held:?}");
    let execs = fake.script().execs.clone();
    assert_eq!(execs.get("fast"), Some(&1), "{execs:?}");
    assert!(execs["slow"] >= 15, "{execs:?}");
}

/// Issue #33: exec probes have a per-pod per-second budget besides the node's. Pod A has 20
/// exec-probed sidecars that never get ready, pod B one; each sidecar is probed again 50 ms
/// after its last probe ended (the default interval) for 10 s, on the node's default budget
/// (50 execs a second, 4 at once, 20 a second for one pod). Counted each second: A runs at
/// most its own 20 (+ its burst of 5 in the first second) and leaves the rest of the node's
/// rate to B, whose probes run every round.
#[tokio::test(start_paused = true)]
async fn one_pod_cannot_spend_the_nodes_exec_rate() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &[], &[], |c| {
        c.ordering.probe_interval = 50 * MS;
    });
    let cfg = &engine.cfg;
    let (interval, node_rate) = (cfg.probe_interval, cfg.exec_probes_per_second);
    let pod_rate = cfg.exec_probes_per_pod_per_second;
    assert_eq!(
        (node_rate, pod_rate),
        (50, 20),
        "the defaults this test is about"
    );
    let stop = tokio::time::Instant::now() + 10 * S;
    let mut probers = Vec::new();
    for (sandbox, sidecars) in [("pod-a", 20), ("pod-b", 1)] {
        let pod = engine.pod_by_id(ApiVersion::V1, sandbox).await.unwrap();
        for i in 0..sidecars {
            let name = format!("{sandbox}-{i}");
            let id = fake.add(&name, Some(now()));
            fake.set(&name, |c| c.ready = None);
            let sidecar = annotations::Sidecar {
                name,
                ready: Readiness::Exec {
                    cmd: vec!["true".into()],
                },
                required: true,
                tenant: None,
            };
            let (engine, pod) = (engine.clone(), pod.clone());
            probers.push(tokio::spawn(async move {
                while tokio::time::Instant::now() < stop {
                    engine.probe(ApiVersion::V1, &pod, &sidecar, &id).await;
                    tokio::time::sleep(interval).await;
                }
            }));
        }
    }
    let execs_of = |fake: &Fake, pod: &str| -> usize {
        let s = fake.script();
        s.execs
            .iter()
            .filter(|(name, _)| name.starts_with(pod))
            .map(|(_, n)| n)
            .sum()
    };
    let (mut a0, mut b0) = (0, 0);
    let mut per_second = Vec::new();
    for second in 0..10 {
        tokio::time::sleep(S).await;
        let (a, b) = (execs_of(&fake, "pod-a"), execs_of(&fake, "pod-b"));
        per_second.push((a - a0, b - b0));
        let burst = if second == 0 {
            pod_rate as usize / 4
        } else {
            0
        };
        assert!(
            a - a0 <= pod_rate as usize + burst,
            "second {second}: pod A ran {} execs (B {}); per second so far {per_second:?}",
            a - a0,
            b - b0
        );
        (a0, b0) = (a, b);
    }
    for p in probers {
        p.await.unwrap();
    }
    // B asks every 50 ms after its probe: about 20 rounds a second, each of which runs.
    for (second, (_, b)) in per_second.iter().enumerate() {
        assert!(
            *b >= 15,
            "second {second}: pod B ran {b} execs: {per_second:?}"
        );
    }
    assert!(
        engine.metrics.exec_probe_pod_limited.get() + engine.metrics.exec_probe_pod_paced.get() > 0,
        "A's waits and refusals are counted"
    );
    println!("execs per second (A, B): {per_second:?}");
}

/// An exec probe refused by the node's exec rate says what that rate counts: execs, which is
/// what `exec_probes_per_second` limits (it said "connects per second", the tcp:// and
/// http:// probes' limit, until issue #36). Read where operators read it: the sidecar's last
/// probe result (`crisp pods`, the tap's hold events).
#[tokio::test(start_paused = true)]
async fn an_exec_probe_over_the_node_rate_names_execs() {
    let fake = Fake::default();
    let engine = pod_with(&fake, &[], &[], |c| {
        c.ordering.exec_probes_per_second = 1;
        c.ordering.probe_timeout = 10 * MS;
    });
    let pod = engine.pod_by_id(ApiVersion::V1, "pod-a").await.unwrap();
    let id = fake.add("proxy", Some(now()));
    fake.set("proxy", |c| c.ready = None);
    let sidecar = annotations::Sidecar {
        name: "proxy".into(),
        ready: Readiness::Exec {
            cmd: vec!["true".into()],
        },
        required: true,
        tenant: None,
    };
    // The first takes the one token a second's rate holds; the second finds none in time.
    engine.probe(ApiVersion::V1, &pod, &sidecar, &id).await;
    engine.probe(ApiVersion::V1, &pod, &sidecar, &id).await;
    assert_eq!(
        pod.last_probe("proxy").map(|l| l.result),
        Some(Err(
            "exec failed: exec node-wide probe limit: 1 execs per second".to_string()
        ))
    );
}
