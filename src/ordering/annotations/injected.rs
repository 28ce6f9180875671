//! A pod's policy from the annotations of the injectors that mutated it (`injectors.rs`, the
//! table in `config/injectors.rs`), read through [`PodPolicy::parse_with`] as crisp reads pods.

use super::*;
use crate::config::injectors::{builtin, sidecar, table, validate};
use std::collections::BTreeMap;

fn ann(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn parse(pairs: &[(&str, &str)]) -> (PodPolicy, Warnings) {
    PodPolicy::parse_with(&ann(pairs), &[], &builtin())
}

/// Whether crisp orders a pod with these annotations (it names sidecars).
fn ordered(annotations: &[(&str, &str)]) -> bool {
    parse(annotations).0.has_sidecars()
}

/// An HTTP probe of the pod's own address, as an injector's sidecar is probed.
fn http(port: u16, path: &str) -> Readiness {
    Readiness::Http {
        host: None,
        port,
        path: path.into(),
    }
}

const ISTIO: &str = r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["istio-envoy"],"imagePullSecrets":null,"revision":"default"}"#;

#[test]
fn builtins_are_valid() {
    for r in builtin() {
        validate(&r).unwrap_or_else(|e| panic!("{}: {e:?}", r.name));
    }
}

#[test]
fn istio_status_names_proxy_and_init() {
    let (p, w) = parse(&[("sidecar.istio.io/status", ISTIO)]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.source, Source::Injector);
    assert_eq!(p.injectors, vec!["istio"]);
    assert_eq!(p.sidecars.len(), 1);
    assert_eq!(p.sidecars[0].name, "istio-proxy");
    assert!(
        p.sidecars[0].required,
        "listed after the app, it is still waited for"
    );
    assert_eq!(p.sidecars[0].ready, http(15021, "/healthz/ready"));
    assert!(p.is_known_init("istio-init"));
    assert!(
        !p.init_complete,
        "the user's own init containers are not in Istio's list"
    );
}

#[test]
fn istio_port_annotation_moves_the_probe_and_zero_disables_it() {
    let (p, _) = parse(&[
        ("sidecar.istio.io/status", ISTIO),
        ("status.sidecar.istio.io/port", "15099"),
    ]);
    assert_eq!(p.sidecars[0].ready, http(15099, "/healthz/ready"));
    let (p, _) = parse(&[
        ("sidecar.istio.io/status", ISTIO),
        ("status.sidecar.istio.io/port", "0"),
    ]);
    assert_eq!(p.sidecars[0].ready, Readiness::Running);
    let (p, w) = parse(&[
        ("sidecar.istio.io/status", ISTIO),
        ("status.sidecar.istio.io/port", "high"),
    ]);
    assert_eq!(p.sidecars[0].ready, http(15021, "/healthz/ready"));
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key, "status.sidecar.istio.io/port");
}

#[test]
fn istio_native_sidecar_mode_is_left_to_kubelet() {
    // Native sidecars (kubelet ≥ 1.28): istio-proxy is an init container with restartPolicy
    // Always, and Istio lists it under initContainers.
    let native = r#"{"initContainers":["istio-init","istio-proxy"],"containers":null}"#;
    let (p, w) = parse(&[("sidecar.istio.io/status", native)]);
    assert!(w.is_empty(), "{w:?}");
    assert!(!p.has_sidecars(), "crisp must not order a native sidecar");
    assert!(p.is_known_init("istio-proxy"));
}

#[test]
fn malformed_istio_status_warns_and_is_ignored() {
    let (p, w) = parse(&[("sidecar.istio.io/status", "{not json")]);
    assert!(!p.has_sidecars());
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key, "sidecar.istio.io/status");
    assert!(w[0].to_string().contains("{not json"));
}

#[test]
fn linkerd_by_proxy_version_with_admin_port() {
    let (p, w) = parse(&[
        ("linkerd.io/proxy-version", "stable-2.14.10"),
        ("config.linkerd.io/admin-port", "4999"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.injectors, vec!["linkerd"]);
    assert_eq!(p.sidecars[0].name, "linkerd-proxy");
    assert_eq!(p.sidecars[0].ready, http(4999, "/ready"));
    assert!(p.is_known_init("linkerd-init"));
    // The user's request alone is not an injected pod (the webhook may not have run).
    assert!(!ordered(&[("linkerd.io/inject", "enabled")]));
    // Native sidecar mode: kubelet orders it.
    assert!(!ordered(&[
        ("linkerd.io/proxy-version", "edge-24.5.1"),
        ("config.beta.linkerd.io/proxy-enable-native-sidecar", "true"),
    ]));
}

#[test]
fn vault_agent_is_ordered_once_it_exists() {
    let (p, _) = parse(&[("vault.hashicorp.com/agent-inject-status", "injected")]);
    assert_eq!(p.sidecars[0].name, "vault-agent");
    assert!(!p.sidecars[0].required);
    assert!(p.is_known_init("vault-agent-init"));
    assert!(!ordered(&[
        ("vault.hashicorp.com/agent-inject-status", "injected"),
        ("vault.hashicorp.com/agent-pre-populate-only", "true"),
    ]));
}

#[test]
fn crisp_annotations_win_and_empty_opts_out() {
    let (p, _) = parse(&[
        ("sidecar.istio.io/status", ISTIO),
        ("crisp.dev/ready.istio-proxy", "tcp://:15090"),
    ]);
    assert_eq!(
        p.sidecars[0].ready,
        Readiness::Tcp {
            host: None,
            port: 15090
        }
    );
    let (p, _) = parse(&[("sidecar.istio.io/status", ISTIO), (SIDECARS, "log-agent")]);
    assert_eq!(p.source, Source::Annotation);
    assert_eq!(
        p.sidecars
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        vec!["log-agent"]
    );
    let (p, w) = parse(&[("sidecar.istio.io/status", ISTIO), (SIDECARS, "")]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.source, Source::OptOut);
    assert!(!p.has_sidecars());
}

#[test]
fn two_injectors_order_in_table_order() {
    let (p, _) = parse(&[
        ("vault.hashicorp.com/agent-inject-status", "injected"),
        ("sidecar.istio.io/status", ISTIO),
    ]);
    assert_eq!(
        p.sidecars
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        vec!["istio-proxy", "vault-agent"]
    );
    assert!(p.is_known_init("istio-init") && p.is_known_init("vault-agent-init"));
}

#[test]
fn node_table_extends_replaces_and_opts_out() {
    let consul = InjectorRule {
        name: "consul".into(),
        enabled: true,
        when: vec!["consul.hashicorp.com/connect-inject-status".into()],
        unless: BTreeMap::new(),
        status: None,
        init_containers: vec!["consul-connect-inject-init".into()],
        sidecars: vec![sidecar("consul-dataplane", "running", None, false)],
    };
    let t = table(true, std::slice::from_ref(&consul));
    assert_eq!(
        t.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        vec!["istio", "linkerd", "vault-agent", "consul"]
    );
    let off = InjectorRule {
        enabled: false,
        ..builtin().remove(0)
    };
    assert!(!table(true, &[off]).iter().any(|r| r.name == "istio"));
    assert_eq!(table(false, &[consul]).len(), 1);
    assert!(table(false, &[]).is_empty());
}

#[test]
fn init_containers_annotation_is_the_complete_list() {
    let (p, w) = parse(&[
        (SIDECARS, "proxy"),
        ("crisp.dev/init-containers", "migrate, seed"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert!(p.init_complete);
    assert!(p.is_known_init("migrate") && p.is_known_init("seed"));
    let (p, _) = parse(&[(SIDECARS, "proxy"), ("crisp.dev/init-containers", "")]);
    assert!(
        p.init_complete && p.init_containers.is_empty(),
        "\"\": the pod has none"
    );
    let (p, w) = parse(&[
        (SIDECARS, "proxy"),
        ("crisp.dev/init-containers", "Bad Name"),
    ]);
    assert!(!p.init_complete);
    assert_eq!(w[0].key, "crisp.dev/init-containers");
}

// Issue #26: an injector's annotations are the pod author's, bounded like `crisp.dev/sidecars`.

/// `{"containers":["aaa","aab",...]}` with `n` distinct three-letter names.
fn forged_status(n: usize) -> String {
    let names: Vec<String> = (0..n)
        .map(|i| {
            format!(
                "\"{}{}{}\"",
                (b'a' + (i / 676 % 26) as u8) as char,
                (b'a' + (i / 26 % 26) as u8) as char,
                (b'a' + (i % 26) as u8) as char
            )
        })
        .collect();
    format!(r#"{{"containers":[{}]}}"#, names.join(","))
}

#[test]
fn a_forged_istio_status_of_40000_names_is_refused_before_it_is_decoded() {
    // 240 KB, inside the API server's 256 KiB: before, decoded and deduplicated pairwise, seconds
    // of CPU per sandbox on a tokio worker.
    let status = forged_status(40_000);
    assert!(status.len() > 200_000, "{}", status.len());
    let t0 = std::time::Instant::now();
    let (p, w) = parse(&[("sidecar.istio.io/status", &status)]);
    let took = t0.elapsed();
    assert!(
        !p.has_sidecars() && p.injectors.is_empty(),
        "not injected: {:?}",
        p.injectors
    );
    assert_eq!((w.total(), w.len()), (1, 1), "{w:?}");
    assert_eq!(w[0].key, "sidecar.istio.io/status");
    // Refused by its size, i.e. before any JSON was decoded.
    let size = crate::tenant::Refused::TooLong {
        len: status.len(),
        max: crate::tenant::MAX_VALUE,
    }
    .to_string();
    assert!(w[0].reason.contains(&size), "{}", w[0].reason);
    assert!(w[0].to_string().len() < 1024, "{}", w[0]);
    println!("40,000 names refused in {took:?}");
}

#[test]
fn an_istio_status_within_the_size_cap_lists_at_most_64_distinct_dns_labels() {
    // ~2,700 names in 16 KiB: decoded, then refused at the 65th.
    let status = forged_status(2_700);
    assert!(status.len() <= crate::tenant::MAX_VALUE, "{}", status.len());
    let (p, w) = parse(&[("sidecar.istio.io/status", &status)]);
    assert!(!p.has_sidecars() && p.injectors.is_empty());
    assert!(
        w[0].reason.contains("more than 64 names"),
        "{}",
        w[0].reason
    );
    // 64 is fine.
    let (p, w) = parse(&[("sidecar.istio.io/status", &forged_status(64))]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!((p.injectors.len(), p.sidecars.len()), (1, 64));
    for (status, why) in [
        (
            r#"{"containers":["istio-proxy","istio-proxy"]}"#,
            "listed twice",
        ),
        (
            r#"{"initContainers":["istio-init","istio-init"]}"#,
            "listed twice",
        ),
        (
            r#"{"containers":["Istio_Proxy"]}"#,
            "not a valid container name",
        ),
        (
            r#"{"containers":["x\u001b[2J\u001b[31mowned\n"]}"#,
            "not a valid container name",
        ),
    ] {
        let (p, w) = parse(&[("sidecar.istio.io/status", status)]);
        assert!(!p.has_sidecars() && p.injectors.is_empty(), "{status}");
        assert_eq!(w.total(), 1);
        assert!(w[0].reason.contains(why), "{status}: {}", w[0].reason);
        let line = w[0].to_string();
        assert!(!line.chars().any(char::is_control), "escaped: {line}");
    }
}

#[test]
fn a_port_annotation_past_the_value_cap_is_refused_unread() {
    let port = format!("{}15099", " ".repeat(crate::tenant::MAX_VALUE));
    let (p, w) = parse(&[
        ("sidecar.istio.io/status", ISTIO),
        ("status.sidecar.istio.io/port", &port),
    ]);
    assert_eq!(
        p.sidecars[0].ready,
        http(15021, "/healthz/ready"),
        "the table's port"
    );
    assert_eq!(w.total(), 1);
    assert!(w[0].to_string().len() < 1024);
}
