//! `PodPolicy::parse` on arbitrary pod annotations and node rules (DESIGN.md §2: a malformed
//! annotation never blocks a pod). Checks, beyond "no panic":
//! - an annotation-declared sidecar list is at most MAX_SIDECARS valid, distinct DNS-1123 names,
//!   all of them written in `crisp.dev/sidecars`;
//! - a start timeout that is accepted is in (0, MAX_START_TIMEOUT];
//! - every warning names a key the pod really has, warnings come sorted by key, and each one
//!   renders as ONE bounded log line whatever the size of the annotation (huge annotations must
//!   not turn into megabyte log lines).
#![no_main]

use std::collections::HashMap;

use arbitrary::Arbitrary;
use crisp::config::{SidecarRule, MAX_START_TIMEOUT};
use crisp::ordering::annotations::{PodPolicy, Source, MAX_SIDECARS, READY_PREFIX, SIDECARS};
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
    Other(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<(Key, String)>,
    rules: Vec<(String, String)>,
    /// Repeats the value of the first entry this many times (cheap huge values).
    blow_up: u16,
}

const NAMES: [&str; 4] = ["proxy", "log-agent", "istio-proxy", "s1"];

/// One log line: what the engine prints for a warning must stay bounded whatever the input
/// (key ≤ 256 chars, value ≤ 120, reason ≤ 512, each char at most a 10-byte escape).
const MAX_WARNING_LINE: usize = 16 << 10;

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
            Key::Other(s) => s,
        };
        let v = if i == 0 && input.blow_up > 0 { v.repeat(input.blow_up as usize % 2048 + 1) } else { v };
        ann.insert(key, v);
    }
    let rules: Vec<SidecarRule> = input.rules.into_iter().map(|(name, ready)| SidecarRule { name, ready }).collect();

    let (policy, warnings) = PodPolicy::parse(&ann, &rules);

    if policy.source == Source::Annotation {
        let listed = ann.get(SIDECARS).expect("annotation source without the annotation");
        assert!(policy.sidecars.len() <= MAX_SIDECARS, "{} sidecars", policy.sidecars.len());
        assert!(!policy.sidecars.is_empty());
        let mut seen = std::collections::HashSet::new();
        for s in &policy.sidecars {
            let n = s.name.as_str();
            assert!(!n.is_empty() && n.len() <= 63, "bad name {n:?}");
            assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'), "bad name {n:?}");
            assert!(!n.starts_with('-') && !n.ends_with('-'), "bad name {n:?}");
            assert!(seen.insert(n), "duplicate sidecar {n:?}");
            assert!(listed.contains(n), "{n:?} not in the annotation");
            assert_eq!(policy.sidecar_index(n), policy.sidecars.iter().position(|x| x.name == n));
        }
    } else if policy.source == Source::OptOut {
        // `crisp.dev/sidecars: ""`: the pod opted out, whatever the node's rules say.
        assert!(policy.sidecars.is_empty(), "an opted-out pod has sidecars");
    } else {
        assert_eq!(policy.sidecars.len(), rules.len());
    }
    if let Some(d) = policy.start_timeout {
        assert!(!d.is_zero() && d <= MAX_START_TIMEOUT, "accepted start timeout {d:?}");
    }
    for w in warnings.windows(2) {
        assert!(w[0].key <= w[1].key, "warnings not sorted");
    }
    for w in &warnings {
        assert!(ann.contains_key(&w.key), "warning for a key the pod does not have: {:?}", w.key);
        let line = w.to_string();
        assert!(!line.contains('\n') && !line.contains('\r'), "multi-line warning");
        assert!(line.len() <= MAX_WARNING_LINE, "a {}-byte warning line (key {} bytes, value {} bytes)", line.len(), w.key.len(), w.value.len());
    }
});
