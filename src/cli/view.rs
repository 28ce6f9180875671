//! How `crisp tap` shows a tap event: the readable one-line view ([`human`]) and the JSON
//! object of `--json` and `--output` ([`json_line`], printed by [`json_text`]), which
//! `crisp timeline` reads back. Both escape tenant text with `crate::tenant`'s one escape.

use serde_json::{json, Value};

use crate::admin_api::{self as pb, tap_event::Event};

/// One event as a JSON object (the `--json` and `--output` format).
pub fn json_line(event: &Event) -> Value {
    let ev = match event {
        Event::Dropped(d) => return json!({ "dropped": d.count, "dropped_total": d.total }),
        Event::Hold(h) => return hold_json(h),
        Event::Message(m) => return message_json(m),
        Event::Call(c) => c,
    };
    let mut v = json!({
        "time": rfc3339(ev.start_unix_nanos),
        "call_id": ev.call_id,
        "cri_version": ev.cri_version,
        "method": ev.method,
        "path": ev.path,
        "kind": ev.kind,
        "pod_namespace": ev.pod_namespace,
        "pod_name": ev.pod_name,
        "pod_sandbox_id": ev.pod_sandbox_id,
        "container_name": ev.container_name,
        "container_id": ev.container_id,
        "image": ev.image,
        "duration_ms": ev.duration_micros as f64 / 1e3,
        "held_ms": ev.held_micros as f64 / 1e3,
        "code": ev.code,
        "code_name": ev.code_name,
        "message": ev.message,
        "request_bytes": ev.request_bytes,
        "response_bytes": ev.response_bytes,
        "redacted": ev.redacted,
    });
    if let Some(n) = ev.messages {
        v["messages"] = json!(n);
    }
    // crisp's own call at the tap's start (issue #46): `crisp replay --as-runtime` answers a
    // handshake with it, and the readers of calls skip it.
    if ev.snapshot {
        v["snapshot"] = json!(true);
    }
    for (key, text) in [
        ("request", &ev.request_json),
        ("response", &ev.response_json),
    ] {
        if !text.is_empty() {
            // crisp sends valid JSON; keep it as text rather than lose it if it ever is not.
            v[key] = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone()));
        }
    }
    v
}

/// One event as the line `--json` prints and `--output` records: [`json_line`] with every
/// character a terminal would obey escaped as `\uXXXX` (`crate::tenant::json`).
pub fn json_text(event: &Event) -> String {
    crate::tenant::json(&json_line(event))
}

/// The readable view: `12:00:01.234 v1 CreateContainer default/web app 5.2ms held=3.1s OK`.
pub fn human(event: &Event) -> String {
    let ev = match event {
        Event::Dropped(d) => {
            return format!(
                "--- {} events dropped: this client read too slowly ({} missed since attaching) ---",
                d.count,
                d.total
            );
        }
        Event::Hold(h) => return hold_line(h),
        Event::Message(m) => return message_line(m),
        Event::Call(c) => c,
    };
    let mut parts: Vec<String> = vec![local_time(ev.start_unix_nanos)];
    if ev.snapshot {
        parts.push("snapshot".into());
    }
    parts.push(if ev.cri_version.is_empty() {
        "-".into()
    } else {
        ev.cri_version.clone()
    });
    parts.push(if ev.cri_version.is_empty() {
        name(&ev.path).to_string()
    } else {
        name(&ev.method).to_string()
    });
    if !ev.pod_name.is_empty() {
        parts.push(format!(
            "{}/{}",
            name(&ev.pod_namespace),
            name(&ev.pod_name)
        ));
    } else if !ev.pod_sandbox_id.is_empty() && ev.container_id.is_empty() {
        parts.push(format!("sandbox={}", short(&ev.pod_sandbox_id)));
    }
    if !ev.container_name.is_empty() {
        parts.push(name(&ev.container_name).to_string());
    } else if !ev.container_id.is_empty() {
        parts.push(format!("id={}", short(&ev.container_id)));
    }
    if !ev.image.is_empty() {
        parts.push(name(&short_digest(&ev.image)).to_string());
    }
    parts.push(duration(ev.duration_micros));
    // Every observed call spends a few µs "held" in the interceptors; only real holds matter.
    if ev.held_micros >= 1_000 {
        parts.push(format!("held={}", duration(ev.held_micros)));
    }
    let mut status = ev.code_name.clone();
    if !ev.message.is_empty() {
        status.push_str(": ");
        status.push_str(&crate::tenant::cut(&ev.message, crate::tenant::MAX_MESSAGE));
    }
    parts.push(status);
    if let Some(n) = ev.messages {
        parts.push(format!("({n} messages, {})", size(ev.response_bytes)));
    }
    let mut line = parts.join(" ");
    for (arrow, text) in [
        ("request", &ev.request_json),
        ("response", &ev.response_json),
    ] {
        if text.is_empty() {
            continue;
        }
        // The decoded message holds the pod's text (annotation values, workingDir, probe
        // paths): pretty JSON with the one escape, or, were it ever not JSON, escaped text.
        let pretty = match serde_json::from_str::<Value>(text) {
            Ok(v) => crate::tenant::json_pretty(&v),
            Err(_) => crate::tenant::cut(text, UNPARSED_SHOWN),
        };
        line.push_str(&format!("\n  {arrow}: {}", pretty.replace('\n', "\n  ")));
    }
    line
}

/// A message of a streamed response as a JSON object: `"event": "message"` (which `crisp
/// timeline` and `crisp replay` do not take for a call) and its place in the stream under
/// `"stream_message"`; with `--full` the decoded message under `"response"`, as a unary call's.
fn message_json(m: &pb::MessageEvent) -> Value {
    let mut v = json!({
        "event": "message",
        "stream_message": m.index,
        "time": rfc3339(m.unix_nanos),
        "call_id": m.call_id,
        "cri_version": m.cri_version,
        "method": m.method,
        "path": m.path,
        "kind": m.kind,
        "since_start_ms": m.since_start_micros as f64 / 1e3,
        "bytes": m.bytes,
        "redacted": m.redacted,
    });
    if let Some(n) = m.items {
        v["items"] = json!(n);
    }
    if m.compressed {
        v["compressed"] = json!(true);
    }
    if !m.json.is_empty() {
        v["response"] =
            serde_json::from_str(&m.json).unwrap_or_else(|_| Value::String(m.json.clone()));
    }
    v
}

/// The readable view of a message of a streamed response (one line, then with `--full` the
/// decoded message): `12:00:01.240 v1 StreamContainers message #3 96.0KiB 100 items +12ms`.
fn message_line(m: &pb::MessageEvent) -> String {
    let mut parts: Vec<String> = vec![local_time(m.unix_nanos)];
    parts.push(if m.cri_version.is_empty() {
        "-".into()
    } else {
        m.cri_version.clone()
    });
    parts.push(if m.cri_version.is_empty() {
        name(&m.path).to_string()
    } else {
        name(&m.method).to_string()
    });
    parts.push(format!("message #{}", m.index));
    parts.push(size(m.bytes));
    if let Some(n) = m.items {
        parts.push(format!("{n} {}", if n == 1 { "item" } else { "items" }));
    }
    if m.compressed {
        parts.push("compressed".into());
    }
    parts.push(format!("+{}", duration(m.since_start_micros)));
    let mut line = parts.join(" ");
    if !m.json.is_empty() {
        let pretty = match serde_json::from_str::<Value>(&m.json) {
            Ok(v) => crate::tenant::json_pretty(&v),
            Err(_) => crate::tenant::cut(&m.json, UNPARSED_SHOWN),
        };
        line.push_str(&format!("\n  message: {}", pretty.replace('\n', "\n  ")));
    }
    line
}

/// A size on the wire: `812B`, `96.0KiB`, `14.6MiB`.
fn size(bytes: u64) -> String {
    match bytes {
        0..=1023 => format!("{bytes}B"),
        1024..=1_048_575 => format!("{:.1}KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1}MiB", bytes as f64 / 1_048_576.0),
    }
}

/// A hold as a JSON object, for both views of one: the tap's `HoldEvent` and a pod's `HeldCall`
/// (`crisp pods --json`) carry the wait under the same field names, printed under the same keys
/// between their own `{ head }` and `{ tail }` keys.
macro_rules! hold_object {
    ($h:expr, { $($head:tt)* }, { $($tail:tt)* }) => {
        serde_json::json!({
            $($head)*
            "waiting_on": $h.waiting_on,
            "reason": $h.reason,
            "probe": $h.probe,
            "probe_result": $h.probe_result,
            "held_ms": $h.held_ms,
            "time_left_ms": $h.time_left_ms,
            "policy": $h.policy,
            $($tail)*
        })
    };
}
pub(super) use hold_object;

/// A hold event as a JSON object: `"hold"` names its phase (call events have no such key).
fn hold_json(h: &pb::HoldEvent) -> Value {
    hold_object!(h, {
        "hold": h.phase,
        "time": rfc3339(h.unix_nanos),
        "call_id": h.call_id,
        "cri_version": h.cri_version,
        "method": h.method,
        "pod_namespace": h.pod_namespace,
        "pod_name": h.pod_name,
        "pod_sandbox_id": h.pod_sandbox_id,
        "container_name": h.container_name,
        "container_id": h.container_id,
    }, {
        "outcome": h.outcome,
        "message": h.message,
    })
}

/// The readable view of a hold, for example (one line):
///
/// ```text
/// 12:00:01.234 v1 CreateContainer default/web app HOLD waiting for proxy:
///   not ready (tcp://:9: connect …: refused) held=2.0s left=88.0s proceed
/// ```
fn hold_line(h: &pb::HoldEvent) -> String {
    let mut parts: Vec<String> = vec![
        local_time(h.unix_nanos),
        if h.cri_version.is_empty() {
            "-".into()
        } else {
            h.cri_version.clone()
        },
        h.method.clone(),
    ];
    if !h.pod_name.is_empty() {
        parts.push(format!("{}/{}", name(&h.pod_namespace), name(&h.pod_name)));
    }
    if !h.container_name.is_empty() {
        parts.push(name(&h.container_name).to_string());
    }
    parts.push(match h.phase.as_str() {
        "start" => "HOLD".into(),
        "update" => "HOLDING".into(),
        "end" => format!("HOLD END {}", h.outcome),
        "refused" => "REFUSED".into(),
        other => other.to_uppercase(),
    });
    if !h.waiting_on.is_empty() {
        let mut why = format!("waiting for {}: {}", name(&h.waiting_on), name(&h.reason));
        if !h.probe.is_empty() {
            let result = if h.probe_result.is_empty() {
                "not probed yet"
            } else {
                &h.probe_result
            };
            why.push_str(&format!(" ({} → {})", name(&h.probe), name(result)));
        }
        parts.push(why);
    }
    if h.phase != "refused" {
        parts.push(format!("held={}", duration(h.held_ms * 1000)));
        if h.phase != "end" {
            parts.push(format!("left={}", duration(h.time_left_ms * 1000)));
        }
    }
    if !h.policy.is_empty() && h.phase != "end" {
        parts.push(format!("policy={}", h.policy));
    }
    parts.join(" ")
}

/// Most bytes of a decoded message shown when it is not JSON (crisp sends JSON; never seen).
const UNPARSED_SHOWN: usize = 64 << 10;

/// A pod's text in a one-line view: cut and escaped (`crate::tenant`).
fn name(s: &str) -> crate::tenant::Text<'_> {
    crate::tenant::text(s, crate::tenant::MAX_FIELD)
}

/// `sha256:` + 64 hex digits (an image id) shortened to 12 digits, like `crictl images`.
fn short_digest(image: &str) -> String {
    match image.split_once("sha256:") {
        Some((name, hex)) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            format!("{name}sha256:{}", &hex[..12])
        }
        _ => image.to_string(),
    }
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

fn duration(micros: u64) -> String {
    let ms = micros as f64 / 1e3;
    match micros {
        0..=999 => format!("{ms:.2}ms"),
        1_000..=9_999 => format!("{ms:.1}ms"),
        10_000..=999_999 => format!("{ms:.0}ms"),
        _ => format!("{:.2}s", ms / 1e3),
    }
}

/// `HH:MM:SS.mmm` in the node's local time zone: `TZ`, else /etc/localtime, as localtime(3)
/// reads them.
fn local_time(nanos: i64) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let millis = nanos.rem_euclid(1_000_000_000) / 1_000_000;
    let (h, m, s) = match jiff::Timestamp::from_second(secs) {
        Ok(t) => {
            let local = t.to_zoned(jiff::tz::TimeZone::system()).time();
            (
                i64::from(local.hour()),
                i64::from(local.minute()),
                i64::from(local.second()),
            )
        }
        // Beyond jiff's range (years -9999 to 9999), which no tap event reaches: UTC.
        Err(_) => {
            let d = secs.rem_euclid(86_400);
            (d / 3600, d / 60 % 60, d % 60)
        }
    };
    format!("{h:02}:{m:02}:{s:02}.{millis:03}")
}

/// RFC 3339 UTC with microseconds, from Unix nanoseconds (times before 1970, which no tap
/// event has, show as the epoch).
pub(crate) fn rfc3339(nanos: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(nanos.max(0) as u64);
    humantime::format_rfc3339_micros(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> pb::CallEvent {
        pb::CallEvent {
            call_id: 7,
            start_unix_nanos: 1_700_000_000_123_456_789,
            method: "CreateContainer".into(),
            path: "/runtime.v1.RuntimeService/CreateContainer".into(),
            cri_version: "v1".into(),
            kind: "mutating".into(),
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            pod_sandbox_id: "0123456789abcdef".into(),
            container_name: "app".into(),
            container_id: "fedcba9876543210".into(),
            duration_micros: 5_200,
            held_micros: 3_100_000,
            code: Some(0),
            code_name: "OK".into(),
            request_json: "{\"pod_sandbox_id\":\"0123456789abcdef\"}".into(),
            redacted: true,
            ..Default::default()
        }
    }

    #[test]
    fn readable_line() {
        let mut c = call();
        c.request_json.clear();
        let line = human(&Event::Call(c));
        // The time is local; the rest is fixed.
        assert!(
            line.ends_with(" v1 CreateContainer default/web app 5.2ms held=3.10s OK"),
            "{line}"
        );
        assert_eq!(line.as_bytes()[2], b':');
        let mut c = call();
        c.request_json.clear();
        (
            c.pod_name,
            c.container_name,
            c.held_micros,
            c.code,
            c.code_name,
        ) = (String::new(), String::new(), 0, Some(5), "NotFound".into());
        let line = human(&Event::Call(c));
        assert!(
            line.ends_with(" v1 CreateContainer id=fedcba987654 5.2ms NotFound"),
            "{line}"
        );
        let line = human(&Event::Dropped(pb::Dropped {
            count: 3,
            total: 10,
        }));
        assert!(
            line.contains("3 events dropped") && line.contains("10 missed"),
            "{line}"
        );
        // --full: the decoded messages follow, indented.
        let line = human(&Event::Call(call()));
        assert!(
            line.contains("\n  request: {\n    \"pod_sandbox_id\""),
            "{line}"
        );
    }

    #[test]
    fn json_lines() {
        let v = json_line(&Event::Call(call()));
        assert_eq!(v["time"], "2023-11-14T22:13:20.123456Z");
        assert_eq!(v["method"], "CreateContainer");
        assert_eq!(v["duration_ms"], 5.2);
        assert_eq!(v["code"], 0);
        assert_eq!(v["request"]["pod_sandbox_id"], "0123456789abcdef");
        assert!(v.get("response").is_none());
        let mut c = call();
        c.code = None;
        assert_eq!(json_line(&Event::Call(c))["code"], Value::Null);
        assert_eq!(
            json_line(&Event::Dropped(pb::Dropped { count: 2, total: 5 })),
            json!({"dropped": 2, "dropped_total": 5})
        );
    }

    /// Issue #46: a snapshot event's line says so (what `crisp replay` keeps apart:
    /// `replay/tests.rs`), and so does its readable line; a live call's line has no such key.
    #[test]
    fn snapshot_lines_say_so() {
        let mut version = call();
        version.snapshot = true;
        version.method = "Version".into();
        assert_eq!(
            json_line(&Event::Call(version.clone()))["snapshot"],
            json!(true)
        );
        assert!(json_line(&Event::Call(call())).get("snapshot").is_none());
        let line = human(&Event::Call(version));
        assert!(line.contains(" snapshot v1 Version "), "{line}");
        assert!(!human(&Event::Call(call())).contains("snapshot"));
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
        assert_eq!(
            rfc3339(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(rfc3339(-1_000), "1970-01-01T00:00:00.000000Z");
        assert_eq!(duration(420), "0.42ms");
        assert_eq!(duration(123_400), "123ms");
        assert_eq!(duration(61_000_000), "61.00s");
        let id = format!("sha256:{}", "ab".repeat(32));
        assert_eq!(short_digest(&id), "sha256:abababababab");
        assert_eq!(
            short_digest(&format!("nginx@{id}")),
            "nginx@sha256:abababababab"
        );
        assert_eq!(short_digest("nginx:1.25"), "nginx:1.25");
    }

    #[test]
    fn hold_lines() {
        let h = pb::HoldEvent {
            call_id: 7,
            phase: "start".into(),
            unix_nanos: 1_700_000_000_123_456_789,
            method: "CreateContainer".into(),
            cri_version: "v1".into(),
            pod_namespace: "default".into(),
            pod_name: "web".into(),
            container_name: "app".into(),
            waiting_on: "istio-proxy".into(),
            reason: "not ready".into(),
            probe: "http://:15021/healthz/ready".into(),
            probe_result: "connect 10.1.2.3:15021: Connection refused".into(),
            held_ms: 3,
            time_left_ms: 87_000,
            policy: "proceed".into(),
            ..Default::default()
        };
        let line = human(&Event::Hold(h.clone()));
        assert!(
            line.ends_with(
                " v1 CreateContainer default/web app HOLD waiting for istio-proxy: not ready (http://:15021/healthz/ready → connect 10.1.2.3:15021: Connection refused) held=3.0ms left=87.00s policy=proceed"
            ),
            "{line}"
        );
        let end = pb::HoldEvent {
            phase: "end".into(),
            outcome: "timed out (proceed)".into(),
            held_ms: 90_000,
            ..h.clone()
        };
        assert!(human(&Event::Hold(end))
            .contains(" HOLD END timed out (proceed) waiting for istio-proxy"));
        let v = json_line(&Event::Hold(h));
        assert_eq!(v["hold"], "start");
        assert_eq!(v["time"], "2023-11-14T22:13:20.123456Z");
        assert_eq!(v["time_left_ms"], 87_000);
        assert_eq!(
            v["probe_result"],
            "connect 10.1.2.3:15021: Connection refused"
        );
        assert!(
            json_line(&Event::Call(call())).get("hold").is_none(),
            "call lines have no hold key"
        );
    }

    /// Issue #45: a message of a streamed response is one line (its index, size, items and time
    /// since the call began), the decoded message under it with --full; its JSON has `"event":
    /// "message"` and no key a call line is told by (`code_name`, `response_bytes`).
    #[test]
    fn message_lines() {
        let m = pb::MessageEvent {
            call_id: 7,
            index: 3,
            unix_nanos: 1_700_000_000_123_456_789,
            since_start_micros: 12_300,
            method: "StreamContainers".into(),
            path: "/runtime.v1.RuntimeService/StreamContainers".into(),
            cri_version: "v1".into(),
            kind: "streaming".into(),
            bytes: 98_304,
            items: Some(100),
            redacted: true,
            ..Default::default()
        };
        let line = human(&Event::Message(m.clone()));
        assert!(
            line.ends_with(" v1 StreamContainers message #3 96.0KiB 100 items +12ms"),
            "{line}"
        );
        let v = json_line(&Event::Message(m.clone()));
        assert_eq!(v["event"], "message");
        assert_eq!(v["stream_message"], 3);
        assert_eq!(
            (v["bytes"].as_u64(), v["items"].as_u64()),
            (Some(98_304), Some(100))
        );
        assert_eq!(v["since_start_ms"], 12.3);
        assert!(v.get("code_name").is_none() && v.get("response_bytes").is_none());
        assert!(v.get("response").is_none());
        let unknown = pb::MessageEvent {
            method: "StreamFutureThings".into(),
            kind: "unknown".into(),
            items: None,
            bytes: 812,
            json: String::new(),
            ..m.clone()
        };
        let line = human(&Event::Message(unknown));
        assert!(
            line.ends_with(" v1 StreamFutureThings message #3 812B +12ms"),
            "{line}"
        );
        let full = pb::MessageEvent {
            json: r#"{"containers":[{"id":"c1"}]}"#.into(),
            ..m
        };
        assert!(human(&Event::Message(full.clone())).contains("\n  message: {\n    \"containers\""));
        assert_eq!(
            json_line(&Event::Message(full))["response"]["containers"][0]["id"],
            "c1"
        );
        // The call's line says how many messages it had.
        let mut c = call();
        c.request_json.clear();
        (c.messages, c.response_bytes) = (Some(150), 16_085_550);
        assert!(human(&Event::Call(c.clone())).ends_with(" OK (150 messages, 15.3MiB)"));
        assert_eq!(json_line(&Event::Call(c))["messages"], 150);
        assert!(json_line(&Event::Call(call())).get("messages").is_none());
    }

    /// Issue #26: pod and container names with escape sequences, newlines or bidi overrides
    /// stay one escaped line in the readable view.
    #[test]
    fn hostile_names_stay_one_escaped_line() {
        let hostile = format!(
            "x\u{1b}[2J\u{1b}]0;owned\u{7}\n\u{202e}{}",
            "y".repeat(10_000)
        );
        let mut c = call();
        (c.pod_name, c.container_name, c.message, c.request_json) = (
            hostile.clone(),
            hostile.clone(),
            hostile.clone(),
            String::new(),
        );
        let h = pb::HoldEvent {
            pod_name: hostile.clone(),
            container_name: hostile.clone(),
            waiting_on: hostile.clone(),
            reason: hostile.clone(),
            probe: hostile.clone(),
            ..Default::default()
        };
        for line in [human(&Event::Call(c)), human(&Event::Hold(h))] {
            assert!(
                !line.chars().any(|c| c.is_control() || c == '\u{202e}'),
                "{line}"
            );
            assert!(
                line.contains(r"x\u{1b}[2J\u{1b}]0;owned\u{7}\n\u{202e}yy"),
                "{line}"
            );
            assert!(
                line.len() <= 8 * crate::tenant::MAX_FIELD,
                "{} bytes",
                line.len()
            );
        }
    }

    /// Every character a terminal obeys that `crate::tenant::escaped` names, as a pod author can
    /// put it in an annotation value, a workingDir or a readiness path.
    pub(crate) const OBEYED: &[char] = &[
        '\u{1b}', '\n', '\u{7f}', '\u{85}', '\u{9b}', '\u{9d}', '\u{2028}', '\u{2029}', '\u{61c}',
        '\u{200e}', '\u{200f}', '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}',
        '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
    ];

    fn obeyed_text() -> String {
        OBEYED.iter().map(|c| format!("{c}x")).collect()
    }

    fn raw(out: &str) -> Vec<char> {
        out.chars()
            .filter(|c| *c != '\n' && OBEYED.contains(c))
            .collect()
    }

    /// Issue #33: `--json` and `--output` escape C1 (U+009B is CSI), DEL, U+2028/U+2029 and the
    /// bidi controls as `\uXXXX`, in call and hold events alike, and the line parses back to
    /// the same value.
    #[test]
    fn json_lines_escape_every_character_a_terminal_obeys() {
        let hostile = obeyed_text();
        let mut c = call();
        c.pod_name = hostile.clone();
        c.message = hostile.clone();
        c.request_json = json!({
            "config": {
                "working_dir": hostile,
                "annotations": { "crisp.dev/ready.proxy": hostile },
            }
        })
        .to_string();
        let h = pb::HoldEvent {
            pod_name: hostile.clone(),
            probe: hostile.clone(),
            probe_result: hostile.clone(),
            ..Default::default()
        };
        for event in [Event::Call(c), Event::Hold(h)] {
            let line = json_text(&event);
            assert_eq!(raw(&line), Vec::<char>::new(), "{line}");
            assert!(!line.contains('\n'), "{line}");
            assert!(
                line.contains(r"\u009b") && line.contains(r"\u202e"),
                "{line}"
            );
            let back: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(back, json_line(&event));
        }
    }

    /// Issue #33: `tap --full`'s readable view prints the decoded messages (workingDir,
    /// `crisp.dev/*` values) with the same escape, and the image name is cut and escaped.
    #[test]
    fn the_full_view_escapes_decoded_messages_and_the_image() {
        let hostile = obeyed_text();
        let mut c = call();
        c.image = format!("{hostile}{}", "i".repeat(10_000));
        c.request_json = json!({
            "config": {
                "working_dir": hostile,
                "annotations": { "crisp.dev/ready.proxy": hostile },
            }
        })
        .to_string();
        let line = human(&Event::Call(c));
        assert_eq!(raw(&line), Vec::<char>::new(), "{line}");
        assert!(
            line.contains(r"\u009b") && line.contains(r"\u{9b}"),
            "{line}"
        );
        assert!(line.len() < 4 * 1024, "{} bytes", line.len());
    }
}
