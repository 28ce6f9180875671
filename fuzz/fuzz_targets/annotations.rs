//! `PodPolicy::parse_with` on arbitrary pod annotations, node rules and the built-in known
//! injectors (DESIGN.md §2: a malformed annotation never blocks a pod). Checks, beyond "no
//! panic":
//! - an annotation-declared sidecar list is at most MAX_SIDECARS valid, distinct DNS-1123 names,
//!   all of them written in `crisp.dev/sidecars`;
//! - an injected pod's sidecars are distinct DNS-1123 names, at most MAX_SIDECARS from the
//!   injector's status plus the table's own; a status value over tenant::MAX_VALUE is never
//!   recognised (issue #26);
//! - a start timeout that is accepted is in (0, MAX_START_TIMEOUT];
//! - every warning names a key the pod really has, warnings come sorted by key, and each one
//!   renders as ONE bounded log line whatever the size of the annotation (huge annotations must
//!   not turn into megabyte log lines); the pod's one summary line is at most
//!   tenant::MAX_LOG_LINE bytes, and at most MAX_WARNINGS_KEPT warnings are kept whatever the
//!   number of bad keys (all counted).
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use crisp::config::injectors::builtin;
use crisp::config::{SidecarRule, MAX_START_TIMEOUT};
use crisp::ordering::annotations::{
    PodPolicy, Source, MAX_SIDECARS, MAX_WARNINGS_KEPT, READY_PREFIX, SIDECARS,
};
use crisp::tenant::{is_dns1123_label, MAX_LOG_LINE, MAX_VALUE};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Key {
    Sidecars,
    Ready(String),
    ReadyKnown(u8),
    StartTimeout,
    TimeoutPolicy,
    Job,
    RestartPolicy,
    InitContainers,
    IstioStatus,
    /// An Istio status listing these names (cheap long lists).
    IstioNames(Vec<String>),
    IstioPort,
    LinkerdVersion,
    VaultStatus,
    Other(String),
}

const ISTIO_STATUS: &str = "sidecar.istio.io/status";

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<(Key, String)>,
    rules: Vec<(String, String)>,
    /// Repeats the value of the first entry this many times (cheap huge values).
    blow_up: u16,
}

const NAMES: [&str; 4] = ["proxy", "log-agent", "istio-proxy", "s1"];

/// One warning: key ≤ 256 bytes, value ≤ 128, reason ≤ 512, shown escaped and cut.
const MAX_WARNING_LINE: usize = 1 << 10;

fuzz_target!(|input: Input| {
    let mut ann: HashMap<String, String> = HashMap::new();
    for (i, (k, v)) in input.entries.into_iter().enumerate() {
        let key = match k {
            Key::Sidecars => SIDECARS.to_string(),
            Key::Ready(n) => format!("{READY_PREFIX}{n}"),
            Key::ReadyKnown(i) => format!("{READY_PREFIX}{}", NAMES[i as usize % NAMES.len()]),
            Key::StartTimeout => "crisp.dev/start-timeout".into(),
            Key::TimeoutPolicy => "crisp.dev/timeout-policy".into(),
            Key::Job => "crisp.dev/job".into(),
            Key::RestartPolicy => "crisp.dev/restart-policy".into(),
            Key::InitContainers => "crisp.dev/init-containers".into(),
            Key::IstioStatus => ISTIO_STATUS.into(),
            Key::IstioNames(names) => {
                let list: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
                ann.insert(
                    ISTIO_STATUS.into(),
                    format!(
                        r#"{{"initContainers":["istio-init"],"containers":[{}]}}"#,
                        list.join(",")
                    ),
                );
                continue;
            }
            Key::IstioPort => "status.sidecar.istio.io/port".into(),
            Key::LinkerdVersion => "linkerd.io/proxy-version".into(),
            Key::VaultStatus => "vault.hashicorp.com/agent-inject-status".into(),
            Key::Other(s) => s,
        };
        let v = if i == 0 && input.blow_up > 0 {
            v.repeat(input.blow_up as usize % 2048 + 1)
        } else {
            v
        };
        ann.insert(key, v);
    }
    let rules: Vec<SidecarRule> = input
        .rules
        .into_iter()
        .map(|(name, ready)| SidecarRule { name, ready })
        .collect();

    let table = builtin();
    let (policy, warnings) = PodPolicy::parse_with(&ann, &rules, &table);

    if policy.source == Source::Annotation {
        let listed = ann
            .get(SIDECARS)
            .expect("annotation source without the annotation");
        assert!(
            policy.sidecars.len() <= MAX_SIDECARS,
            "{} sidecars",
            policy.sidecars.len()
        );
        assert!(!policy.sidecars.is_empty());
        let mut seen = std::collections::HashSet::new();
        for s in &policy.sidecars {
            let n = s.name.as_str();
            assert!(!n.is_empty() && n.len() <= 63, "bad name {n:?}");
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "bad name {n:?}"
            );
            assert!(!n.starts_with('-') && !n.ends_with('-'), "bad name {n:?}");
            assert!(seen.insert(n), "duplicate sidecar {n:?}");
            assert!(listed.contains(n), "{n:?} not in the annotation");
            assert_eq!(
                policy.sidecar_index(n),
                policy.sidecars.iter().position(|x| x.name == n)
            );
        }
    } else if policy.source == Source::Injector {
        let table_sidecars: usize = table.iter().map(|r| r.sidecars.len()).sum();
        assert!(
            policy.sidecars.len() <= MAX_SIDECARS + table_sidecars,
            "{} injected sidecars",
            policy.sidecars.len()
        );
        let mut seen = std::collections::HashSet::new();
        for s in &policy.sidecars {
            assert!(is_dns1123_label(&s.name), "bad injected name {:?}", s.name);
            assert!(
                seen.insert(s.name.as_str()),
                "duplicate injected sidecar {:?}",
                s.name
            );
        }
        if ann.get(ISTIO_STATUS).is_some_and(|v| v.len() > MAX_VALUE) {
            assert!(
                !policy.injectors.iter().any(|i| i == "istio"),
                "an oversized status was recognised"
            );
        }
    } else if policy.source == Source::OptOut {
        // `crisp.dev/sidecars: ""`: the pod opted out, whatever the node's rules say.
        assert!(policy.sidecars.is_empty(), "an opted-out pod has sidecars");
    } else {
        assert_eq!(policy.sidecars.len(), rules.len());
    }
    // Native sidecars (`crisp.dev/ready.<name>` naming no sidecar): container names, none
    // listed twice nor also a sidecar, within the pod's 64, none for an opted-out pod.
    let mut natives = std::collections::HashSet::new();
    for s in &policy.native {
        assert!(is_dns1123_label(&s.name), "bad native name {:?}", s.name);
        assert!(
            natives.insert(s.name.as_str()),
            "duplicate native {:?}",
            s.name
        );
        assert!(
            policy.sidecar_index(&s.name).is_none(),
            "{:?} is both",
            s.name
        );
    }
    assert!(
        policy.native.is_empty() || policy.sidecars.len() + policy.native.len() <= MAX_SIDECARS,
        "{} + {} sidecars",
        policy.sidecars.len(),
        policy.native.len()
    );
    assert!(policy.source != Source::OptOut || policy.native.is_empty());
    assert!(
        policy.init_containers.iter().all(|n| n.len() <= 253),
        "an init container name past any bound"
    );
    if let Some(d) = policy.start_timeout {
        assert!(
            !d.is_zero() && d <= MAX_START_TIMEOUT,
            "accepted start timeout {d:?}"
        );
    }
    for w in warnings.windows(2) {
        assert!(w[0].key <= w[1].key, "warnings not sorted");
    }
    assert!(
        warnings.len() <= MAX_WARNINGS_KEPT && warnings.len() <= warnings.total(),
        "{} kept of {}",
        warnings.len(),
        warnings.total()
    );
    let summary = warnings.summary();
    assert!(
        summary.len() <= MAX_LOG_LINE,
        "a {}-byte summary line",
        summary.len()
    );
    assert!(
        !summary.chars().any(char::is_control),
        "control characters in the summary line"
    );
    for w in &warnings {
        assert!(
            ann.contains_key(&w.key),
            "warning for a key the pod does not have: {:?}",
            w.key
        );
        let line = w.to_string();
        assert!(
            !line.chars().any(char::is_control),
            "control characters in a warning"
        );
        assert!(
            line.len() <= MAX_WARNING_LINE,
            "a {}-byte warning line (key {} bytes, value {} bytes)",
            line.len(),
            w.key.len(),
            w.value.len()
        );
    }
});
