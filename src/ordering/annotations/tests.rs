use super::*;
use crate::ordering::sidecar::tenant_may_aim;
use crate::readiness::Cidr;

fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn full_contract() {
    let (p, w) = PodPolicy::parse(
        &ann(&[
            (SIDECARS, "istio-proxy, log-agent"),
            ("crisp.dev/ready.istio-proxy", "http://:15021/healthz/ready"),
            ("crisp.dev/ready.log-agent", "tcp://:24224"),
            (START_TIMEOUT, "30s"),
            (JOB, "true"),
            (RESTART_POLICY, "OnFailure"),
            ("unrelated", "x"),
        ]),
        &[],
    );
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.source, Source::Annotation);
    assert_eq!(p.sidecars.len(), 2);
    assert_eq!(p.sidecars[0].name, "istio-proxy");
    assert_eq!(
        p.sidecars[1].ready,
        Readiness::Tcp {
            host: None,
            port: 24224
        }
    );
    assert_eq!(p.start_timeout, Some(Duration::from_secs(30)));
    assert_eq!(p.job, Some(true));
    assert_eq!(p.restart_policy, Some(RestartPolicy::OnFailure));
    assert_eq!(p.sidecar_index("log-agent"), Some(1));
}

#[test]
fn no_annotations_no_rules_means_no_sidecars() {
    let (p, w) = PodPolicy::parse(&ann(&[("kubernetes.io/config.seen", "x")]), &[]);
    assert!(w.is_empty());
    assert!(!p.has_sidecars());
}

#[test]
fn node_rules_apply_without_annotation_and_annotation_wins() {
    let rules = vec![SidecarRule {
        name: "istio-proxy".into(),
        ready: "tcp://:15021".into(),
    }];
    let (p, _) = PodPolicy::parse(&ann(&[]), &rules);
    assert_eq!(p.source, Source::NodeRules);
    assert_eq!(
        p.sidecars[0].ready,
        Readiness::Tcp {
            host: None,
            port: 15021
        }
    );
    let (p, _) = PodPolicy::parse(&ann(&[(SIDECARS, "envoy")]), &rules);
    assert_eq!(p.source, Source::Annotation);
    assert_eq!(p.sidecars.len(), 1);
    assert_eq!(p.sidecars[0].name, "envoy");
    // A rule's readiness is used for a listed sidecar that has no ready annotation.
    let (p, _) = PodPolicy::parse(&ann(&[(SIDECARS, "istio-proxy")]), &rules);
    assert_eq!(
        p.sidecars[0].ready,
        Readiness::Tcp {
            host: None,
            port: 15021
        }
    );
}

#[test]
fn malformed_values_warn_and_act_as_absent() {
    let (p, w) = PodPolicy::parse(
        &ann(&[
            (SIDECARS, "Bad_Name, ok"),
            (START_TIMEOUT, "forever"),
            (JOB, "yes"),
            (TIMEOUT_POLICY, "explode"),
            (RESTART_POLICY, "Sometimes"),
        ]),
        &[],
    );
    assert!(!p.has_sidecars());
    assert_eq!(p.start_timeout, None);
    assert_eq!(p.job, None);
    assert_eq!(p.timeout_policy, None);
    assert_eq!(p.restart_policy, None);
    let keys: Vec<_> = w.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        vec![JOB, RESTART_POLICY, SIDECARS, START_TIMEOUT, TIMEOUT_POLICY]
    );
    assert!(w.iter().all(|w| !w.reason.is_empty()));
}

#[test]
fn bad_readiness_falls_back_to_running_with_a_warning() {
    let (p, w) = PodPolicy::parse(
        &ann(&[(SIDECARS, "proxy"), ("crisp.dev/ready.proxy", "htp://:1")]),
        &[],
    );
    assert_eq!(p.sidecars[0].ready, Readiness::Running);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key, "crisp.dev/ready.proxy");
}

#[test]
fn absurd_values_are_bounded() {
    let (_, w) = PodPolicy::parse(&ann(&[(START_TIMEOUT, "10m")]), &[]);
    assert_eq!(w.len(), 1);
    let many: Vec<String> = (0..100).map(|i| format!("s{i}")).collect();
    let (p, w) = PodPolicy::parse(&ann(&[(SIDECARS, &many.join(","))]), &[]);
    assert!(!p.has_sidecars());
    assert!(w[0].reason.contains("more than"));
    let (_, w) = PodPolicy::parse(&ann(&[(SIDECARS, "a,a")]), &[]);
    assert!(w[0].reason.contains("twice"));
    let (_, w) = PodPolicy::parse(&ann(&[(SIDECARS, " , ")]), &[]);
    assert_eq!(w.len(), 1);
    // A huge value is truncated in the warning text.
    let huge = "x".repeat(100_000);
    let (_, w) = PodPolicy::parse(&ann(&[(JOB, &huge)]), &[]);
    assert!(w[0].to_string().len() < 400);
}

/// Issue #35: a `crisp.dev/ready.<name>` for a container no sidecar list names declares a
/// native sidecar (kubelet 1.29+), waited for once it exists, never stop-ordered.
#[test]
fn ready_annotation_for_an_unlisted_container_names_a_native_sidecar() {
    let (p, w) = PodPolicy::parse(
        &ann(&[(SIDECARS, "a"), ("crisp.dev/ready.b", "tcp://:80")]),
        &[],
    );
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.sidecars.len(), 1, "b is not a legacy sidecar");
    assert_eq!(p.native.len(), 1);
    let b = &p.native[0];
    assert_eq!((b.name.as_str(), b.required), ("b", false));
    assert_eq!(b.ready, Readiness::parse("tcp://:80").unwrap());
    assert!(p.is_native("b") && !p.is_native("a"));
    let gated: Vec<&str> = p.gated().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(gated, ["b", "a"], "native sidecars come first");
    // Alone: no legacy sidecar at all, and no warning.
    let (p, w) = PodPolicy::parse(&ann(&[("crisp.dev/ready.proxy", "running")]), &[]);
    assert!(w.is_empty() && !p.has_sidecars(), "{w:?}");
    assert_eq!(p.native.len(), 1);
}

#[test]
fn a_native_sidecar_with_a_bad_readiness_or_name_is_absent() {
    let (p, w) = PodPolicy::parse(
        &ann(&[
            ("crisp.dev/ready.b", "carrier-pigeon://"),
            ("crisp.dev/ready.Not_A_Name", "running"),
        ]),
        &[],
    );
    assert!(p.native.is_empty(), "{:?}", p.native);
    assert_eq!(w.total(), 2, "{w:?}");
}

#[test]
fn an_opted_out_pod_has_no_native_sidecars_and_is_told() {
    let (p, w) = PodPolicy::parse(
        &ann(&[(SIDECARS, ""), ("crisp.dev/ready.b", "running")]),
        &[],
    );
    assert!(p.native.is_empty() && p.gated().is_empty());
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key, "crisp.dev/ready.b");
}

#[test]
fn native_sidecars_are_bounded_like_sidecars() {
    let keys: Vec<(String, String)> = (0..200)
        .map(|i| (format!("crisp.dev/ready.s{i:03}"), "running".to_string()))
        .collect();
    let a: HashMap<String, String> = keys.into_iter().collect();
    let (p, w) = PodPolicy::parse(&a, &[]);
    assert_eq!(p.native.len(), MAX_SIDECARS);
    assert_eq!(w.total(), 200 - MAX_SIDECARS);
}

/// A named native sidecar's readiness aimed at another's address is checked like a listed
/// sidecar's, falling back to `running`.
#[test]
fn a_native_sidecars_readiness_is_tenant_checked() {
    let (p, _) = PodPolicy::parse(&ann(&[("crisp.dev/ready.b", "tcp://10.9.9.9:80")]), &[]);
    let t = p.native[0]
        .tenant
        .as_ref()
        .expect("checked before the first probe");
    assert_eq!(t.fallback, Readiness::Running);
}

// Issue #19: a pod annotation may name only the pod's own addresses.

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

#[test]
fn an_annotation_may_aim_only_at_the_pod_or_what_the_operator_allowed() {
    let pod = [ip("10.1.2.3"), ip("fd00::3")];
    let allow = [Cidr::parse("192.168.0.0/16").unwrap()];
    let ok = |spec: &str| tenant_may_aim(&Readiness::parse(spec).unwrap(), &pod, &allow);
    for spec in [
        "tcp://:80",
        "http://127.0.0.1:15021/ready",
        "http://localhost:80/",
        "tcp://127.9.9.9:1",
        "tcp://[::1]:80",
        "tcp://0.0.0.0:80",
        "tcp://10.1.2.3:80",
        "tcp://[fd00::3]:80",
        "tcp://[::ffff:10.1.2.3]:80",
        "tcp://[::ffff:127.0.0.1]:80",
        "tcp://192.168.7.7:80",
        "running",
        r#"exec:["true"]"#,
    ] {
        assert_eq!(ok(spec), Ok(()), "{spec}");
    }
    for spec in [
        "http://169.254.169.254:80/latest/meta-data",
        "tcp://10.1.2.4:80",
        "tcp://[fd00::4]:80",
        "tcp://[::ffff:169.254.169.254]:80",
        "tcp://172.17.0.1:10250",
    ] {
        let e = ok(spec).unwrap_err();
        assert!(
            e.contains("not one of the pod's own addresses"),
            "{spec}: {e}"
        );
    }
    // No pod IP known, nothing allowed: only local hosts pass.
    assert!(tenant_may_aim(&Readiness::parse("tcp://10.1.2.3:80").unwrap(), &[], &[]).is_err());
}

#[test]
fn annotated_hosts_are_checked_at_probe_time_with_the_fallback_they_would_have_had() {
    let rules = vec![SidecarRule {
        name: "proxy".into(),
        ready: "tcp://:15000".into(),
    }];
    let (p, w) = PodPolicy::parse(
        &ann(&[
            (SIDECARS, "proxy, agent"),
            ("crisp.dev/ready.proxy", "http://10.9.9.9:80/"),
            ("crisp.dev/ready.agent", "tcp://127.0.0.1:9"),
        ]),
        &rules,
    );
    assert!(w.is_empty(), "{w:?}");
    let t = p.sidecars[0].tenant.as_deref().expect("a host to check");
    assert_eq!(
        (t.key.as_str(), t.value.as_str()),
        ("crisp.dev/ready.proxy", "http://10.9.9.9:80/")
    );
    assert_eq!(
        t.fallback,
        Readiness::Tcp {
            host: None,
            port: 15000
        },
        "the node rule's readiness, as if the key were absent"
    );
    assert_eq!(
        p.sidecars[1].tenant, None,
        "loopback is always the pod's own"
    );
    let w = t
        .warning("host 10.9.9.9 is not one of the pod's own addresses".into())
        .to_string();
    assert!(
        w.contains("crisp.dev/ready.proxy")
            && w.contains("10.9.9.9")
            && w.contains("using `tcp://:15000`"),
        "{w}"
    );
    // Node rules are the operator's: never checked.
    let rules = vec![SidecarRule {
        name: "proxy".into(),
        ready: "tcp://10.9.9.9:80".into(),
    }];
    let (p, _) = PodPolicy::parse(&ann(&[]), &rules);
    assert_eq!(p.sidecars[0].tenant, None);
}

#[test]
fn an_injected_sidecars_override_falls_back_to_the_injector_table() {
    let istio = [
        (
            "sidecar.istio.io/status",
            r#"{"containers":["istio-proxy"]}"#,
        ),
        ("crisp.dev/ready.istio-proxy", "tcp://10.9.9.9:15021"),
    ];
    let (p, w) = PodPolicy::parse_with(&ann(&istio), &[], &crate::config::injectors::builtin());
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.source, Source::Injector);
    let t = p.sidecars[0]
        .tenant
        .as_deref()
        .expect("the override names a host");
    assert_eq!(
        t.fallback,
        Readiness::Http {
            host: None,
            port: 15021,
            path: "/healthz/ready".into()
        }
    );
}

// Issue #26: one rule for every value, one warning line per pod.

#[test]
fn every_value_past_the_cap_is_refused_before_it_is_parsed() {
    let huge = format!("{}proxy", " ".repeat(crate::tenant::MAX_VALUE));
    // Keys whose value is one of a few names are compared, not parsed: the same cost whatever
    // the length, and the warning says what was expected.
    let choices = [TIMEOUT_POLICY, JOB, RESTART_POLICY];
    for key in [
        SIDECARS,
        INIT_CONTAINERS,
        START_TIMEOUT,
        TIMEOUT_POLICY,
        JOB,
        RESTART_POLICY,
    ] {
        let (p, w) = PodPolicy::parse(&ann(&[(key, &huge)]), &[]);
        assert_eq!(w.total(), 1, "{key}");
        let reason = &w[0].reason;
        if choices.contains(&key) {
            assert!(reason.starts_with("expected "), "{key}: {reason}");
        } else {
            assert!(
                reason.ends_with("bytes, more than the 16384 crisp reads"),
                "{key}: {reason}"
            );
        }
        assert!(
            !p.has_sidecars() && !p.init_complete && p.job.is_none() && p.start_timeout.is_none(),
            "{key}"
        );
    }
}

#[test]
fn thousands_of_bad_keys_are_all_counted_and_few_kept() {
    let mut pairs: Vec<(String, String)> = (0..5_000)
        .map(|i| (format!("{READY_PREFIX}x{i:05}"), "running".to_string()))
        .collect();
    pairs.push((SIDECARS.into(), "proxy".into()));
    let a: HashMap<String, String> = pairs.into_iter().collect();
    let (p, w) = PodPolicy::parse(&a, &[]);
    assert_eq!(p.sidecars.len(), 1);
    // Unlisted names are native sidecars (issue #35): the first 63 by name fill the pod's 64.
    let native = MAX_SIDECARS - 1;
    assert_eq!(p.native.len(), native);
    assert_eq!(w.total(), 5_000 - native);
    assert_eq!(w.len(), MAX_WARNINGS_KEPT);
    // The same ones whatever the map's order: the smallest keys, sorted.
    let keys: Vec<&str> = w.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        (native..native + MAX_WARNINGS_KEPT)
            .map(|i| format!("{READY_PREFIX}x{i:05}"))
            .collect::<Vec<_>>()
    );
    let line = w.summary();
    assert!(
        line.starts_with(&format!("{} malformed annotations ignored", 5_000 - native)),
        "{line}"
    );
    assert!(
        line.ends_with(&format!("; and {} more", 5_000 - native - 3)),
        "{line}"
    );
    assert!(
        line.len() <= crate::tenant::MAX_LOG_LINE && !line.contains('\n'),
        "{line}"
    );
}

#[test]
fn a_warning_line_is_escaped_and_bounded_whatever_the_key_and_value() {
    let key = format!(
        "{READY_PREFIX}\u{1b}[2J\u{202e}\u{1b}]0;owned\u{7}{}",
        "k".repeat(100_000)
    );
    let value = format!("\u{1b}[31m\n{}", "v".repeat(100_000));
    let (_, w) = PodPolicy::parse(
        &ann(&[
            (SIDECARS, "proxy"),
            (&key, &value),
            (JOB, &"\u{202e}".repeat(50_000)),
        ]),
        &[],
    );
    assert_eq!(w.total(), 2);
    let line = w.summary();
    assert!(
        !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
        "{line}"
    );
    assert!(line.len() <= crate::tenant::MAX_LOG_LINE, "{}", line.len());
    assert!(line.contains(r"\u{1b}[2J"), "{line}");
}

#[test]
fn ready_keys_of_a_rejected_sidecar_list_declare_no_native_sidecar() {
    // The huge pod of e2e reliability_huge: a list over the limit, readiness for its names.
    let list: Vec<String> = (0..100).map(|i| format!("side-{i:03}")).collect();
    let ready_key = format!("{READY_PREFIX}side-001");
    let (p, w) = PodPolicy::parse(
        &ann(&[
            (SIDECARS, &list.join(",")),
            (&ready_key, "not a readiness spec"),
        ]),
        &[],
    );
    assert!(p.native.is_empty(), "{:?}", p.native);
    assert_eq!(
        w.total(),
        1,
        "only the list itself is warned about: {}",
        w.summary()
    );
    assert!(
        w.summary().contains("crisp.dev/sidecars"),
        "{}",
        w.summary()
    );
}
