//! `crisp pods`' views of the admin API's ListPods: what the ordering engine knows and holds
//! now — the answer to "why is this pod not starting?" — readable ([`human`]) or as JSON
//! ([`pod_json`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::view::{hold_object, rfc3339};
use crate::admin_api as pb;
use crate::tenant::{self, MAX_FIELD};

/// The output of `crisp pods` for `pods`: one JSON object (`{"pods": [...]}`) with `json`, else
/// the readable view of each pod, or a line saying there are none.
pub fn view(pods: &[pb::Pod], json: bool, now: SystemTime) -> String {
    if json {
        return tenant::json(&json!({ "pods": pods.iter().map(pod_json).collect::<Vec<_>>() }));
    }
    if pods.is_empty() {
        return "crisp tracks no pods.".into();
    }
    pods.iter()
        .map(|p| human(p, now))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `p` is the pod `want` names (`namespace/name`, or `name` in any namespace); every
/// pod when `want` is `None`.
pub fn selected(want: Option<&str>, p: &pb::Pod) -> bool {
    pb::pod_named(want, &p.namespace, &p.name)
}

fn ms(d: u64) -> String {
    format!("{:.1}s", d as f64 / 1e3)
}

fn ago(nanos: i64, now: SystemTime) -> String {
    let t = UNIX_EPOCH + Duration::from_nanos(nanos.max(0) as u64);
    match now.duration_since(t) {
        Ok(d) => format!("{} ago", ms(d.as_millis() as u64)),
        Err(_) => "just now".into(),
    }
}

/// A field of the view: pod text, cut and escaped (one line each, whatever the pod named).
fn t(s: &str) -> tenant::Text<'_> {
    tenant::text(s, MAX_FIELD)
}

/// The readable view of one pod: the "why is it not starting" line first.
pub(crate) fn human(p: &pb::Pod, now: SystemTime) -> String {
    let mut out = Vec::new();
    let short = t(p.pod_sandbox_id.get(..12).unwrap_or(&p.pod_sandbox_id));
    let mut head = format!(
        "{}/{}  sandbox {short}  sidecars from {}",
        t(&p.namespace),
        t(&p.name),
        t(&p.policy_source)
    );
    head.push_str(&format!(
        "  start timeout {} ({})",
        ms(p.effective_start_timeout_ms),
        p.effective_timeout_policy
    ));
    if p.refusals > 0 {
        head.push_str(&format!("  refusals {}", p.refusals));
    }
    out.push(head);
    if p.isolation.starts_with("isolated") {
        out.push(format!(
            "  {}: probed at the pod IP from crisp's namespace or by exec, never at its loopback",
            t(&p.isolation)
        ));
    }
    for h in &p.held {
        let mut why = format!(
            "  HELD {} {}: waiting for {}: {}",
            t(&h.method),
            t(if h.container_name.is_empty() {
                "(sandbox)"
            } else {
                &h.container_name
            }),
            t(&h.waiting_on),
            t(&h.reason)
        );
        if !h.probe_result.is_empty() && h.probe_result != "ok" {
            why.push_str(&format!(" ({})", t(&h.probe_result)));
        }
        why.push_str(&format!(
            " — held {}, {} left",
            ms(h.held_ms),
            ms(h.time_left_ms)
        ));
        if !h.policy.is_empty() {
            why.push_str(&format!(", then {}", t(&h.policy)));
        }
        out.push(why);
    }
    if !p.runtime_error.is_empty() {
        out.push(format!(
            "  (sidecar states unknown: the runtime did not list the pod's containers: {})",
            t(&p.runtime_error)
        ));
    }
    if p.sidecars.is_empty() {
        out.push("  no sidecars: crisp does not order this pod".into());
    }
    for (i, s) in p.sidecars.iter().enumerate() {
        let mut line = format!(
            "  {}. {}  ready: {}  state: {}",
            i + 1,
            t(&s.name),
            t(&s.ready),
            t(if s.state.is_empty() { "?" } else { &s.state })
        );
        if !s.required {
            line.push_str(" (optional)");
        }
        if s.last_probe_unix_nanos > 0 {
            line.push_str(&format!(
                "  last probe {}: {}",
                ago(s.last_probe_unix_nanos, now),
                t(&s.last_probe_result)
            ));
        }
        out.push(line);
    }
    if let Some(j) = &p.job_state {
        if j.is_job {
            let mut line = format!(
                "  job: {}",
                if j.watched {
                    "crisp watches the apps"
                } else {
                    "not watched (job mode off?)"
                }
            );
            if !j.terminated.is_empty() {
                line.push_str(&format!(
                    "; sidecars terminated: {}",
                    j.terminated
                        .iter()
                        .map(|n| t(n).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            out.push(line);
        }
    }
    out.join("\n")
}

/// One pod as `crisp pods --json` prints it: fixed keys, times in RFC 3339. Every string is cut
/// and escaped as in the readable view (`tenant::cut`, [`MAX_FIELD`] bytes each: the pod's
/// names, its readiness specs, probe results and the runtime's errors are the pod author's
/// text); [`view`] prints it with the one JSON escape (`tenant::json`).
fn pod_json(p: &pb::Pod) -> Value {
    let time = |n: i64| {
        if n > 0 {
            Value::String(rfc3339(n))
        } else {
            Value::Null
        }
    };
    let c = |s: &str| tenant::cut(s, MAX_FIELD);
    let held = |h: &pb::HeldCall| pb::HeldCall {
        method: c(&h.method),
        container_name: c(&h.container_name),
        waiting_on: c(&h.waiting_on),
        reason: c(&h.reason),
        probe: c(&h.probe),
        probe_result: c(&h.probe_result),
        policy: c(&h.policy),
        ..h.clone()
    };
    json!({
        "namespace": c(&p.namespace),
        "name": c(&p.name),
        "uid": c(&p.uid),
        "pod_sandbox_id": c(&p.pod_sandbox_id),
        "host_network": p.host_network,
        "policy_source": c(&p.policy_source),
        "start_timeout_ms": p.effective_start_timeout_ms,
        "timeout_policy": c(&p.effective_timeout_policy),
        "refusals": p.refusals,
        "isolation": c(&p.isolation),
        "sidecars": p.sidecars.iter().map(|s| json!({
            "name": c(&s.name),
            "ready": c(&s.ready),
            "required": s.required,
            "state": c(&s.state),
            "container_id": c(&s.container_id),
            "last_probe_result": c(&s.last_probe_result),
            "last_probe_time": time(s.last_probe_unix_nanos),
        })).collect::<Vec<_>>(),
        "held": p.held.iter().map(held).map(|h| hold_object!(h, {
            "call_id": h.call_id,
            "method": h.method,
            "container_name": h.container_name,
            "since": time(h.since_unix_nanos),
        }, {})).collect::<Vec<_>>(),
        "job": p.job_state.as_ref().map(|j| json!({
            "is_job": j.is_job,
            "watched": j.watched,
            "terminated": j.terminated.iter().map(|n| c(n)).collect::<Vec<_>>(),
        })),
        "containers": p.containers.iter()
            .map(|k| json!({ "id": c(&k.id), "name": c(&k.name) }))
            .collect::<Vec<_>>(),
        "runtime_error": c(&p.runtime_error),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> pb::Pod {
        pb::Pod {
            pod_sandbox_id: "0123456789abcdef".into(),
            namespace: "default".into(),
            name: "web".into(),
            policy_source: "annotation".into(),
            effective_start_timeout_ms: 90_000,
            effective_timeout_policy: "proceed".into(),
            refusals: 2,
            sidecars: vec![pb::Sidecar {
                name: "proxy".into(),
                ready: "tcp://:9999".into(),
                required: true,
                state: "running".into(),
                last_probe_result: "connect 10.0.0.5:9999: Connection refused (os error 111)"
                    .into(),
                last_probe_unix_nanos: 1_700_000_000_000_000_000,
                ..Default::default()
            }],
            held: vec![pb::HeldCall {
                call_id: 9,
                method: "CreateContainer".into(),
                container_name: "app".into(),
                waiting_on: "proxy".into(),
                reason: "not ready".into(),
                probe: "tcp://:9999".into(),
                probe_result: "connect 10.0.0.5:9999: Connection refused (os error 111)".into(),
                held_ms: 12_300,
                time_left_ms: 77_700,
                policy: "proceed".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn readable_view_says_why() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_002_500);
        let text = human(&pod(), now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "default/web  sandbox 0123456789ab  sidecars from annotation  start timeout 90.0s (proceed)  refusals 2"
        );
        assert_eq!(
            lines[1],
            "  HELD CreateContainer app: waiting for proxy: not ready (connect 10.0.0.5:9999: Connection refused (os error 111)) — held 12.3s, 77.7s left, then proceed"
        );
        assert_eq!(
            lines[2],
            "  1. proxy  ready: tcp://:9999  state: running  last probe 2.5s ago: connect 10.0.0.5:9999: Connection refused (os error 111)"
        );
    }

    /// Issue #35: an isolated pod says so under its first line (and in the JSON); a
    /// shared-kernel pod's view is unchanged.
    #[test]
    fn an_isolated_pod_says_how_it_is_probed() {
        let now = UNIX_EPOCH + Duration::from_millis(1_700_000_002_500);
        let mut p = pod();
        p.isolation = "isolated (handler kata\u{1b}[2J)".into();
        let text = human(&p, now);
        let line = text.lines().nth(1).unwrap();
        assert_eq!(
            line,
            "  isolated (handler kata\\u{1b}[2J): probed at the pod IP from crisp's namespace or by exec, never at its loopback"
        );
        assert_eq!(
            pod_json(&p)["isolation"],
            "isolated (handler kata\\u{1b}[2J)",
            "cut and escaped like every tenant string"
        );
        p.isolation = "shared kernel (handler runc)".into();
        assert_eq!(human(&p, now), human(&pod(), now));
        assert_eq!(pod_json(&p)["isolation"], "shared kernel (handler runc)");
    }

    #[test]
    fn json_has_stable_keys() {
        let v = pod_json(&pod());
        assert_eq!(v["held"][0]["time_left_ms"], 77_700);
        assert_eq!(v["held"][0]["since"], Value::Null);
        assert_eq!(
            v["sidecars"][0]["last_probe_time"],
            "2023-11-14T22:13:20.000000Z"
        );
        assert_eq!(v["start_timeout_ms"], 90_000);
        assert_eq!(v["refusals"], 2);
    }

    /// Issue #26: names with escape sequences, newlines or bidi overrides cannot forge lines or
    /// repaint the terminal; each field is cut.
    #[test]
    fn hostile_names_are_escaped_and_cut() {
        let mut p = pod();
        let hostile = format!(
            "x\u{1b}[2J\u{1b}]0;owned\u{7}\n  1. fake  ready: running\u{202e}{}",
            "y".repeat(10_000)
        );
        p.name = hostile.clone();
        p.sidecars[0].name = hostile.clone();
        p.sidecars[0].last_probe_result = hostile.clone();
        p.held[0].container_name = hostile.clone();
        p.held[0].reason = hostile.clone();
        let text = human(&p, UNIX_EPOCH + Duration::from_millis(1_700_000_002_500));
        assert_eq!(
            text.lines().count(),
            human(&pod(), SystemTime::now()).lines().count(),
            "no forged line: {text}"
        );
        assert!(
            !text
                .chars()
                .any(|c| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{text}"
        );
        assert!(
            text.contains(r"x\u{1b}[2J\u{1b}]0;owned\u{7}\n  1. fake"),
            "{text}"
        );
        assert!(text.lines().all(|l| l.len() <= 8 * MAX_FIELD), "{text}");
    }

    #[test]
    fn selects_by_name_or_namespace_and_name() {
        let p = pod();
        assert!(selected(None, &p));
        assert!(selected(Some("web"), &p));
        assert!(selected(Some("default/web"), &p));
        assert!(!selected(Some("other/web"), &p));
        assert!(!selected(Some("api"), &p));
    }

    /// Issue #33: `crisp pods --json` cuts every string of the pod's text like the readable
    /// view (256 bytes) and escapes every character a terminal obeys as `\uXXXX`.
    #[test]
    fn json_cuts_and_escapes_every_tenant_string() {
        let hostile = format!(
            "x\u{9b}31m\u{7f}\u{2028}\u{202e}\u{2066}\u{200f}\u{61c}{}",
            "y".repeat(10_000)
        );
        let mut p = pod();
        p.name = hostile.clone();
        p.uid = hostile.clone();
        p.runtime_error = hostile.clone();
        p.sidecars[0].ready = hostile.clone();
        p.sidecars[0].last_probe_result = hostile.clone();
        p.held[0].probe = hostile.clone();
        p.held[0].probe_result = hostile.clone();
        p.held[0].reason = hostile.clone();
        p.containers = vec![pb::Container {
            id: "c1".into(),
            name: hostile.clone(),
        }];
        let out = view(&[p], true, SystemTime::now());
        assert!(
            !out.chars().any(|c| c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{202e}' | '\u{2066}' | '\u{200f}' | '\u{61c}'
                )),
            "{}",
            out.chars().take(400).collect::<String>()
        );
        assert!(out.len() < 16 * 1024, "{} bytes", out.len());
        let v: Value = serde_json::from_str(&out).unwrap();
        fn strings(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::String(s) => out.push(s.clone()),
                Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
                Value::Object(o) => o.values().for_each(|v| strings(v, out)),
                _ => {}
            }
        }
        let mut all = Vec::new();
        strings(&v, &mut all);
        assert!(
            all.iter().all(|s| s.len() <= MAX_FIELD),
            "{:?}",
            all.iter().map(|s| s.len()).collect::<Vec<_>>()
        );
        assert!(
            all.iter().filter(|s| s.starts_with(r"x\u{9b}31m")).count() >= 9,
            "{all:?}"
        );
    }
}
