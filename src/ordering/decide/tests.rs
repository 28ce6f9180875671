//! Each rule of `decide.rs` on hand-built snapshots: no runtime, no clock but the instants given.

use super::*;
use crate::config::SidecarRule;
use crate::ordering::annotations::{self, Source};
use crate::readiness::Readiness;

const S: Duration = Duration::from_secs(1);

fn policy(sidecars: &[&str], extra: &[(&str, &str)]) -> PodPolicy {
    let mut a: HashMap<String, String> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    a.insert(annotations::SIDECARS.into(), sidecars.join(","));
    let (p, w) = PodPolicy::parse(&a, &[]);
    assert!(w.is_empty(), "{w:?}");
    p
}

fn c(name: &str, created: i64, st: i32) -> views::Container {
    views::Container {
        id: format!("{name}-{created}"),
        metadata: Some(views::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        created_at: created,
        state: st,
        ..Default::default()
    }
}

fn nobody(_: &str) -> bool {
    false
}

#[test]
fn snapshot_keeps_the_newest_instance_of_each_name() {
    let list = vec![
        c("app", 1, state::EXITED),
        c("app", 3, state::RUNNING),
        c("app", 2, state::CREATED),
        c("side", 1, state::RUNNING),
    ];
    let snap = Snapshot::new(&list);
    assert_eq!(snap.get("app").unwrap().id, "app-3");
    assert_eq!(snap.get("side").unwrap().id, "side-1");
    assert!(snap.get("other").is_none());
}

#[test]
fn running_apps_are_the_running_containers_that_are_not_sidecars() {
    let p = policy(&["proxy"], &[]);
    let list = vec![
        c("proxy", 1, state::RUNNING),
        c("b", 2, state::RUNNING),
        c("a", 3, state::RUNNING),
        c("done", 4, state::EXITED),
    ];
    assert_eq!(Snapshot::new(&list).running_apps(&p), vec!["a", "b"]);
}

#[test]
fn plan_create_gates_apps_on_every_sidecar_and_sidecars_on_earlier_ones() {
    let p = policy(&["a", "b"], &[(annotations::INIT_CONTAINERS, "setup")]);
    assert_eq!(
        plan_create(&p, "a"),
        CreatePlan::Forward,
        "the first sidecar waits for nobody"
    );
    assert_eq!(plan_create(&p, "b"), CreatePlan::Gate(&p.sidecars[..1]));
    assert_eq!(plan_create(&p, "app"), CreatePlan::Gate(&p.sidecars[..]));
    assert_eq!(
        plan_create(&p, "setup"),
        CreatePlan::Forward,
        "known init containers run before any sidecar exists"
    );
    let (none, _) = PodPolicy::parse(&HashMap::new(), &[]);
    assert_eq!(plan_create(&none, "app"), CreatePlan::Forward);
    let (opt_out, _) = PodPolicy::parse(
        &[(annotations::SIDECARS.to_string(), String::new())].into(),
        &[SidecarRule {
            name: "proxy".into(),
            ready: "running".into(),
        }],
    );
    assert_eq!(opt_out.source, Source::OptOut);
    assert_eq!(
        plan_create(&opt_out, "app"),
        CreatePlan::Forward,
        "crisp.dev/sidecars: \"\" opts the pod out of node rules"
    );
}

#[test]
fn create_hold_ends_at_the_timeout_or_before_kubelets_deadline() {
    let t = Instant::now();
    assert_eq!(create_hold_end(t, 90 * S, None), t + 90 * S);
    assert_eq!(create_hold_end(t, 90 * S, Some(t + 120 * S)), t + 90 * S);
    assert_eq!(create_hold_end(t, 90 * S, Some(t + 60 * S)), t + 57 * S);
    assert!(
        create_hold_end(t, 90 * S, Some(t + S)) <= t,
        "a deadline closer than the margin: the hold ends at once"
    );
}

#[test]
fn dead_sidecars_are_skipped_only_under_proceed_after_the_timeout() {
    let t = Instant::now();
    assert!(
        !skip_dead(TimeoutPolicy::Proceed, None, t + 100 * S, 10 * S),
        "never refused"
    );
    assert!(!skip_dead(
        TimeoutPolicy::Proceed,
        Some(t),
        t + 9 * S,
        10 * S
    ));
    assert!(skip_dead(
        TimeoutPolicy::Proceed,
        Some(t),
        t + 10 * S,
        10 * S
    ));
    assert!(!skip_dead(
        TimeoutPolicy::Fail,
        Some(t),
        t + 100 * S,
        10 * S
    ));
}

#[test]
fn init_judgement_only_while_no_sidecar_exists_and_nothing_names_the_containers() {
    let p = policy(&["proxy"], &[]);
    assert!(needs_init_judgement(&p, &Snapshot::new(&[])));
    assert!(
        !needs_init_judgement(&p, &Snapshot::new(&[c("proxy", 1, state::EXITED)])),
        "a sidecar exists: init containers are done"
    );
    let complete = policy(&["proxy"], &[(annotations::INIT_CONTAINERS, "setup")]);
    assert!(
        !needs_init_judgement(&complete, &Snapshot::new(&[])),
        "crisp.dev/init-containers is the complete list"
    );
}

#[test]
fn start_check_walks_the_sidecars_in_order_and_asks_for_probes() {
    let p = policy(&["a", "b"], &[]);
    let list = vec![c("a", 1, state::RUNNING), c("b", 2, state::RUNNING)];
    let snap = Snapshot::new(&list);
    let mut probed = HashMap::new();
    let check = |probed: &HashMap<String, bool>| {
        check_start("ns/pod", &p.sidecars, &snap, false, nobody, probed)
    };
    let probe = |i: usize, container_id: &str| Check::Probe {
        sidecar: &p.sidecars[i],
        container_id: container_id.into(),
    };
    assert_eq!(check(&probed), probe(0, "a-1"));
    probed.insert("a".to_string(), false);
    assert_eq!(
        check(&probed),
        Check::Waiting(WaitingFor::Sidecar("a".into())),
        "b is not probed while a is not ready"
    );
    probed.insert("a".to_string(), true);
    assert_eq!(check(&probed), probe(1, "b-2"));
    probed.insert("b".to_string(), true);
    assert_eq!(check(&probed), Check::Ready);
}

#[test]
fn start_check_fails_fast_for_a_sidecar_not_created_or_not_running() {
    let p = policy(&["proxy"], &[]);
    let none = HashMap::new();
    // Why the create is refused with the sidecar's containers `list`.
    let refusal = |list: &[views::Container]| match check_start(
        "ns/pod",
        &p.sidecars,
        &Snapshot::new(list),
        false,
        nobody,
        &none,
    ) {
        Check::Refuse(why) => why.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refusal(&[]),
        "sidecar \"proxy\" of pod ns/pod is not created yet (is it listed after this container?)"
    );
    for (st, words) in [
        (state::CREATED, "created but not started"),
        (state::EXITED, "exited"),
        (state::UNKNOWN, "in an unknown state"),
    ] {
        assert_eq!(
            refusal(&[c("proxy", 1, st)]),
            format!("sidecar \"proxy\" of pod ns/pod is {words}, not running")
        );
    }
}

#[test]
fn start_check_skips_sidecars_node_rules_name_but_the_pod_lacks() {
    let rules = [SidecarRule {
        name: "logger".into(),
        ready: "running".into(),
    }];
    let (p, _) = PodPolicy::parse(&HashMap::new(), &rules);
    assert_eq!(p.source, Source::NodeRules);
    assert_eq!(
        check_start(
            "ns/pod",
            &p.sidecars,
            &Snapshot::new(&[]),
            false,
            nobody,
            &HashMap::new()
        ),
        Check::Ready
    );
}

#[test]
fn start_check_past_the_timeout_skips_dead_sidecars_but_not_refused_ones_nor_running_ones() {
    let p = policy(&["a", "b", "c"], &[]);
    // a exited, b never created because crisp refuses it, c running but not ready.
    let list = [c("a", 1, state::EXITED), c("c", 2, state::RUNNING)];
    let snap = Snapshot::new(&list);
    let probed = HashMap::from([("c".to_string(), false)]);
    let Check::Refuse(why) = check_start("ns/pod", &p.sidecars, &snap, true, |n| n == "b", &probed)
    else {
        panic!()
    };
    let why = why.to_string();
    assert!(
        why.contains("\"b\"") && why.contains("waits for an earlier sidecar"),
        "{why}"
    );
    assert_eq!(
        check_start("ns/pod", &p.sidecars, &snap, true, nobody, &probed),
        Check::Waiting(WaitingFor::Sidecar("c".into())),
        "a running sidecar is still waited for"
    );
    assert_eq!(
        check_start("ns/pod", &p.sidecars[..2], &snap, true, nobody, &probed),
        Check::Ready
    );
}

#[test]
fn a_waiting_hold_probes_again_or_times_out_by_policy() {
    let t = Instant::now();
    let iv = Duration::from_millis(500);
    assert_eq!(
        after_waiting(t, t + 10 * S, iv, TimeoutPolicy::Proceed),
        WaitStep::Until(t + iv)
    );
    assert_eq!(
        after_waiting(t, t + iv / 2, iv, TimeoutPolicy::Proceed),
        WaitStep::Until(t + iv / 2),
        "never past the hold's end"
    );
    assert_eq!(
        after_waiting(t + 10 * S, t + 10 * S, iv, TimeoutPolicy::Fail),
        WaitStep::TimedOut(TimeoutPolicy::Fail)
    );
}

#[test]
fn refusal_messages_make_kubelet_retry_soon() {
    let m = refusal(
        "sidecar \"proxy\" of pod ns/pod is exited, not running",
        "app",
    );
    assert_eq!(
        m,
        "crisp: sidecar \"proxy\" of pod ns/pod is exited, not running; kubelet will retry \"app\" (network is not ready until the pod's sidecars run)"
    );
    assert!(timed_out(
        "ns/pod",
        &WaitingFor::Sidecar("proxy".into()),
        90 * S,
        "app"
    )
    .contains("sidecar \"proxy\" of pod ns/pod not ready within 90s"));
}

#[test]
fn stop_hold_ends_before_kubelets_deadline_with_room_for_the_tail() {
    let t = Instant::now();
    assert_eq!(stop_hold_end(t, 30 * S, Some(t + 150 * S)), t + 145 * S);
    assert_eq!(stop_hold_end(t, 30 * S, None), t + 150 * S);
    assert!(
        stop_hold_end(t, 30 * S, Some(t + S)) <= t,
        "a deadline already too close: no hold"
    );
    assert_eq!(single_kill_after(t, 30 * S), t + 30 * S);
    assert_eq!(single_kill_after(t, Duration::ZERO), t + STOP_TAIL);
}

#[test]
fn stop_step_holds_a_sidecar_while_apps_or_later_sidecars_run() {
    let p = policy(&["a", "b"], &[]);
    let t = Instant::now();
    let (end, single) = (t + 100 * S, t + 30 * S);
    let all = [
        c("a", 1, state::RUNNING),
        c("b", 2, state::RUNNING),
        c("app", 3, state::RUNNING),
    ];
    assert_eq!(
        stop_step(&p, 0, &Snapshot::new(&all), t, end, single, true),
        StopStep::Hold {
            apps: vec!["app"],
            sidecars: vec!["b"]
        }
    );
    assert_eq!(
        stop_step(&p, 1, &Snapshot::new(&all), t, end, single, true),
        StopStep::Hold {
            apps: vec!["app"],
            sidecars: vec![]
        }
    );
    let no_app = [
        c("a", 1, state::RUNNING),
        c("b", 2, state::RUNNING),
        c("app", 3, state::EXITED),
    ];
    assert_eq!(
        stop_step(&p, 1, &Snapshot::new(&no_app), t, end, single, true),
        StopStep::Forward
    );
    assert_eq!(
        stop_step(&p, 0, &Snapshot::new(&no_app), t, end, single, true),
        StopStep::Hold {
            apps: vec![],
            sidecars: vec!["b"]
        }
    );
    assert_eq!(
        stop_step(&p, 1, &Snapshot::new(&all), end, end, single, true),
        StopStep::Deadline {
            apps: vec!["app"],
            sidecars: vec![]
        }
    );
}

#[test]
fn stop_step_tells_a_single_container_kill_from_a_termination() {
    let p = policy(&["a"], &[]);
    let t = Instant::now();
    let list = [c("a", 1, state::RUNNING), c("app", 2, state::RUNNING)];
    let snap = Snapshot::new(&list);
    assert!(
        matches!(
            stop_step(&p, 0, &snap, t, t + 100 * S, t + 30 * S, false),
            StopStep::Hold { .. }
        ),
        "within the grace an app's stop may still come"
    );
    assert_eq!(
        stop_step(&p, 0, &snap, t + 30 * S, t + 100 * S, t + 30 * S, false),
        StopStep::SingleKill
    );
    assert!(
        matches!(
            stop_step(&p, 0, &snap, t + 30 * S, t + 100 * S, t + 30 * S, true),
            StopStep::Hold { .. }
        ),
        "apps are being stopped: a termination"
    );
}

#[test]
fn budget_left_is_rounded_up_with_the_2s_tail() {
    let t = Instant::now();
    assert_eq!(budget_secs(Some(t + 27 * S), t), 27);
    assert_eq!(budget_secs(Some(t + Duration::from_millis(2_100)), t), 3);
    assert_eq!(budget_secs(Some(t + S), t), 2);
    assert_eq!(budget_secs(Some(t), t + 5 * S), 2);
    assert_eq!(budget_secs(None, t), 2);
    assert_eq!(stop_timeout(t + 27 * S, t, 30), Some(27));
    assert_eq!(
        stop_timeout(t + 30 * S, t, 30),
        None,
        "as kubelet sent it: not patched"
    );
}

#[test]
fn sandbox_stops_running_sidecars_in_reverse_declared_order() {
    let p = policy(&["a", "b", "c"], &[]);
    let running = [
        c("a", 1, state::RUNNING),
        c("c", 3, state::RUNNING),
        c("app", 4, state::RUNNING),
        c("b", 2, state::EXITED),
    ];
    assert_eq!(
        sandbox_stop_order(&p, &running),
        vec![("c", "c-3"), ("a", "a-1")]
    );
    let t = Instant::now();
    assert_eq!(sandbox_hold_end(t, Some(t + 120 * S)), t + 107 * S);
    assert_eq!(sandbox_hold_end(t, None), t + 60 * S);
}

#[test]
fn readiness_kinds_are_data_to_the_rules() {
    // The rules never look inside a readiness spec: any kind is "probe it".
    let mut p = policy(&["a"], &[]);
    p.sidecars[0].ready = Readiness::Tcp {
        host: None,
        port: 1,
    };
    let list = [c("a", 1, state::RUNNING)];
    assert!(matches!(
        check_start(
            "ns/pod",
            &p.sidecars,
            &Snapshot::new(&list),
            false,
            nobody,
            &HashMap::new()
        ),
        Check::Probe { .. }
    ));
}

// ---------------------------------------------------------------------------------------------
// Tenant numbers (issue #26): a grace period is `terminationGracePeriodSeconds`, any int64.

/// Grace periods a pod can make crisp compute with: near 2^63 (what `timeout.max(0) as u64`
/// made of an int64), and the largest durations there are.
const EXTREME: [Duration; 4] = [
    Duration::from_secs(i64::MAX as u64),
    Duration::from_secs(i64::MAX as u64 - 1),
    Duration::from_secs(u64::MAX),
    Duration::MAX,
];

#[test]
fn extreme_grace_periods_never_panic_and_hold_at_most_a_day() {
    let t = Instant::now();
    let day_and_slack = Duration::from_secs(86_400 + 120);
    for g in EXTREME {
        let end = stop_hold_end(t, g, None);
        assert!(
            end > t && end <= t + day_and_slack,
            "{g:?}: hold until {:?}",
            end - t
        );
        // kubelet's own deadline wraps to an ordinary one for such values; it still bounds the
        // hold.
        assert_eq!(stop_hold_end(t, g, Some(t + 60 * S)), t + 55 * S, "{g:?}");
        let kill = single_kill_after(t, g);
        assert!(kill > t && kill <= t + day_and_slack, "{g:?}");
        let create = create_hold_end(t, g, None);
        assert!(create > t && create <= t + day_and_slack, "{g:?}");
        assert_eq!(
            after_waiting(t, t + S, g, TimeoutPolicy::Proceed),
            WaitStep::Until(t + S),
            "{g:?}"
        );
    }
    // A budget far away asks the runtime to wait a day at most.
    assert_eq!(budget_secs(Some(t + 10 * 86_400 * S), t), 86_400);
    assert_eq!(stop_timeout(t + 10 * 86_400 * S, t, i64::MAX), Some(86_400));
}

#[test]
fn grace_periods_are_clamped_where_they_enter() {
    for (secs, want) in [
        (i64::MAX, MAX_GRACE),
        (i64::MAX - 1, MAX_GRACE),
        (86_401, MAX_GRACE),
        (86_400, MAX_GRACE),
        (30, 30 * S),
        (0, Duration::ZERO),
        (-1, Duration::ZERO),
        (i64::MIN, Duration::ZERO),
    ] {
        assert_eq!(grace_from_secs(secs), want, "{secs}");
    }
    let t = Instant::now();
    let end = later(t, grace_from_secs(i64::MAX));
    assert_eq!(end, t + MAX_GRACE);
    assert_eq!(budget_secs(Some(end), t), 86_400);
    assert_eq!(
        later(t, Duration::MAX),
        t + Duration::from_secs(86_400 + 120),
        "capped, not wrapped"
    );
}

/// Issue #26: a refusal reaches kubelet's log, the pod's status and an Event, about once a
/// second under `timeout-policy: fail`; whatever the names, it is one escaped line within the
/// message cap, the retry tail kept.
#[test]
fn refusals_are_one_escaped_line_within_the_message_cap() {
    let container = format!("app\u{1b}[2J\n{}", "c".repeat(10_000));
    let pod = format!("ns/\u{1b}]0;owned\u{7}\u{202e}{}", "p".repeat(10_000));
    let messages = [
        refusal(
            &format!("sidecar \"proxy\" of pod {pod} is exited, not running"),
            &container,
        ),
        timed_out(
            &pod,
            &WaitingFor::Sidecar(container.clone()),
            90 * S,
            &container,
        ),
        refusal(&"\u{1b}".repeat(100_000), &"\u{1b}".repeat(100_000)),
    ];
    for m in messages {
        assert!(
            m.len() <= crate::tenant::MAX_MESSAGE,
            "{} bytes: {m}",
            m.len()
        );
        assert!(!m.chars().any(|c| c.is_control() || c == '\u{202e}'), "{m}");
        assert!(
            m.ends_with("\" (network is not ready until the pod's sidecars run)"),
            "{m}"
        );
    }
    let m = timed_out(
        &pod,
        &WaitingFor::Sidecar("proxy".into()),
        90 * S,
        &container,
    );
    assert!(
        m.contains(r#"sidecar "proxy" of pod ns/\u{1b}]0;owned\u{7}\u{202e}ppp"#),
        "{m}"
    );
    assert!(m.contains(r#"kubelet will retry "app\u{1b}[2J\ncc"#), "{m}");
}

/// A runtime's timestamp becomes an instant of the engine's clock without panicking, whatever
/// it is: unset is none, the future is now, the far past is as old as the longest timeout.
#[test]
fn runtime_timestamps_become_bounded_instants() {
    let t = Instant::now();
    let wall = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let ns = |secs: u64| (secs * 1_000_000_000) as i64;
    assert_eq!(instant_of_wall(0, t, wall), None);
    assert_eq!(instant_of_wall(-5, t, wall), None);
    assert_eq!(
        instant_of_wall(ns(1_800_000_000 - 4), t, wall),
        Some(t - 4 * S)
    );
    assert_eq!(
        instant_of_wall(i64::MAX, t, wall),
        Some(t),
        "the future is now"
    );
    assert_eq!(
        instant_of_wall(1, t, wall),
        Some(t - crate::config::MAX_START_TIMEOUT),
        "1970 is as old as the longest timeout"
    );
}
