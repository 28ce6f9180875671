//! Unit tests of `crisp timeline`: parsing, grouping, the text view; the SVG is rendered by a
//! real renderer in `tests/it/timeline.rs`.

use super::*;

pub(super) fn call(
    method: &str,
    container: &str,
    start_ms: i64,
    dur_ms: i64,
    held_ms: i64,
    code: &str,
) -> Call {
    Call {
        start_us: 1_700_000_000_000_000 + start_ms * 1000,
        duration_us: dur_ms * 1000,
        held_us: held_ms * 1000,
        method: method.into(),
        kind: "mutating".into(),
        pod_namespace: "demo".into(),
        pod_name: "web".into(),
        container_name: container.into(),
        code_name: code.into(),
        ..Default::default()
    }
}

#[test]
fn cut_bounds_and_cleans() {
    assert_eq!(fit("abc", 5), "abc");
    assert_eq!(fit("abcdef", 4), "abc…");
    assert_eq!(fit("a\u{1b}[31mb", 10), "a?[31mb");
    assert_eq!(fit(&"é".repeat(1000), 8).chars().count(), 8);
}

#[test]
fn escapes_markup_and_unrepresentable_characters() {
    assert_eq!(
        xml_escape("<a href='x'>&\"\u{0}\u{7}\n"),
        "&lt;a href=&apos;x&apos;&gt;&amp;&quot;?? "
    );
}

#[test]
fn text_rows_show_holds_and_refusals_within_the_width() {
    let pod = Pod {
        namespace: "demo".into(),
        name: "web".into(),
        calls: vec![
            call("RunPodSandbox", "", 0, 300, 0, "OK"),
            call("CreateContainer", "app", 310, 1, 0, "FailedPrecondition"),
            call("CreateContainer", "proxy", 320, 40, 0, "OK"),
            call("CreateContainer", "app", 400, 3000, 2900, "OK"),
            // A refusal that took crisp 11 ms to decide on a slow machine (CI saw this).
            call("CreateContainer", "app", 3400, 12, 11, "FailedPrecondition"),
        ],
        holds: Vec::new(),
    };
    let narrow = text(&pod, 0);
    assert!(narrow.lines().all(|l| l.chars().count() <= 80), "{narrow}");
    let out = text(&pod, TEXT_WIDTH);
    assert!(
        out.lines().all(|l| l.chars().count() <= TEXT_WIDTH),
        "{out}"
    );
    let rows: Vec<&str> = out.lines().skip(3).collect();
    assert_eq!(rows.len(), 5, "{out}");
    assert!(
        rows[0].starts_with("RunPodSandbox     pod ") && rows[0].contains('█'),
        "{out}"
    );
    assert!(
        rows[1].contains('×') && rows[1].ends_with("FailedPrecondition"),
        "{out}"
    );
    assert!(
        rows[3].contains('░') && rows[3].contains('█') && rows[3].ends_with("3.00s held 2.90s"),
        "{out}"
    );
    // The held part comes first, and takes most of that row's bar.
    let bar = rows[3].split('|').nth(1).unwrap_or_default();
    assert!(bar.find('░') < bar.find('█'), "{bar}");
    assert!(
        bar.matches('░').count() > 5 * bar.matches('█').count(),
        "{bar}"
    );
    // The status comes before the held time: a cut row keeps what went wrong.
    assert!(rows[4].contains("12ms FailedPrecondition"), "{out}");
}

#[test]
fn ids_only_calls_and_image_status_find_their_pod() {
    let mut run = call("RunPodSandbox", "", 0, 300, 0, "OK");
    run.pod_sandbox_id = "sb1".into();
    let mut img = call("ImageStatus", "", 305, 1, 0, "OK");
    (img.pod_namespace, img.pod_name, img.kind, img.image) = (
        String::new(),
        String::new(),
        "polling".into(),
        "busybox".into(),
    );
    let mut create = call("CreateContainer", "proxy", 310, 20, 0, "OK");
    (create.container_id, create.image) = ("c1".into(), "busybox".into());
    let mut stop = call("StopContainer", "", 900, 20, 0, "OK");
    (stop.pod_namespace, stop.pod_name, stop.container_id) =
        (String::new(), String::new(), "c1".into());
    let mut remove = call("RemovePodSandbox", "", 1000, 20, 0, "OK");
    (remove.pod_namespace, remove.pod_name, remove.pod_sandbox_id) =
        (String::new(), String::new(), "sb1".into());
    let mut status = call("ContainerStatus", "proxy", 500, 1, 0, "OK");
    status.kind = "polling".into();
    let mut other = call("CreateContainer", "x", 0, 1, 0, "OK");
    other.pod_name = "other".into();
    let pods = group(
        vec![remove, stop, status.clone(), create, img, run, other],
        false,
    );
    assert_eq!(pods.len(), 2);
    let web = select(&pods, "demo/web").expect("web");
    let seen: Vec<(String, String)> = web
        .calls
        .iter()
        .map(|c| (c.method.clone(), c.target()))
        .collect();
    let want = [
        ("RunPodSandbox", "pod"),
        ("ImageStatus", "proxy"),
        ("CreateContainer", "proxy"),
        ("StopContainer", "proxy"),
        ("RemovePodSandbox", "pod"),
    ];
    assert_eq!(seen, want.map(|(a, b)| (a.to_string(), b.to_string())));
    assert!(select(&pods, "web").is_ok());
    assert!(select(&pods, "nope")
        .unwrap_err()
        .contains("demo/web (5 calls)"));
    let with_polling = group(vec![status], true);
    assert_eq!(with_polling[0].calls.len(), 1);
}

#[test]
fn other_event_kinds_and_broken_lines_are_skipped() {
    let good = r#"{"time":"2023-11-14T22:13:20.123456Z","call_id":1,"kind":"mutating","method":"StartContainer","pod_namespace":"a","pod_name":"b","duration_ms":1.5,"held_ms":0.01,"code_name":"OK","response_bytes":0}"#;
    // Events of kinds a newer crisp may add, however much they look like calls.
    let hold = r#"{"time":"2023-11-14T22:13:20.123456Z","kind":"hold","method":"CreateContainer","pod_namespace":"a","pod_name":"b","duration_ms":1.5}"#;
    let hold2 = r#"{"time":"2023-11-14T22:13:20.123456Z","kind":"mutating","method":"CreateContainer","pod_namespace":"a","pod_name":"b","duration_ms":1.5,"held_ms":1.0}"#;
    let hold3 = good.replace("{\"time\"", "{\"event\":\"hold_started\",\"time\"");
    let input = format!(
        "{good}\n{{\"dropped\":3,\"dropped_total\":3}}\n{hold}\n{hold2}\n{hold3}\n\n{{\"time\":\"2023-11-14T22:1"
    );
    let p = parse(input.as_bytes()).expect("parse");
    assert_eq!((p.calls.len(), p.skipped, p.malformed), (1, 4, 1));
    assert_eq!(p.calls[0].duration_us, 1500);
    assert_eq!(p.calls[0].held_us, 10);
    assert_eq!(p.calls[0].start_us, 1_700_000_000_123_456);
}

#[test]
fn ticks_are_round() {
    assert_eq!(tick_step(7_000_000), 1_000_000);
    assert_eq!(tick_step(9_000_000), 2_000_000);
    assert_eq!(tick_step(300), 50);
    assert_eq!(tick_step(1), 1);
}

/// Issue #26: a recorded pod name with escape sequences or bidi overrides is drawn escaped.
#[test]
fn hostile_recorded_names_are_drawn_escaped() {
    let hostile = format!("web\u{1b}[2J\u{202e}\u{2028}{}", "y".repeat(10_000));
    let line = serde_json::json!({
        "kind": "mutating", "method": "CreateContainer", "time": "2023-11-14T22:13:20.000000Z", "duration_ms": 5.0,
        "response_bytes": 0, "code_name": "OK", "pod_namespace": "demo", "pod_name": hostile, "container_name": hostile,
    });
    let c = call_of(&line).expect("a call");
    assert!(
        c.pod_name.starts_with(r"web\u{1b}[2J\u{202e}\u{2028}y"),
        "{}",
        c.pod_name
    );
    let pods = group(vec![c], true);
    let out = text(&pods[0], TEXT_WIDTH);
    assert!(
        !out.chars()
            .any(|c| (c.is_control() && c != '\n') || matches!(c, '\u{202e}' | '\u{2028}')),
        "{out}"
    );
}

/// Issue #45: a streamed call's message lines, as `crisp tap -o` writes them, are no calls: the
/// timeline draws the call once, from its own line.
#[test]
fn a_streamed_calls_message_lines_are_skipped() {
    use crate::admin_api::{tap_event::Event, CallEvent, MessageEvent};
    use crate::cli::view::json_line;
    let message = |i: u64| {
        json_line(&Event::Message(MessageEvent {
            call_id: 4,
            index: i,
            unix_nanos: 1_700_000_000_123_456_789,
            method: "StreamContainers".into(),
            path: "/runtime.v1.RuntimeService/StreamContainers".into(),
            cri_version: "v1".into(),
            kind: "streaming".into(),
            bytes: 100,
            items: Some(2),
            json: r#"{"containers":[]}"#.into(),
            ..Default::default()
        }))
        .to_string()
    };
    let call = json_line(&Event::Call(CallEvent {
        call_id: 4,
        start_unix_nanos: 1_700_000_000_000_000_000,
        method: "StreamContainers".into(),
        kind: "streaming".into(),
        duration_micros: 2_000,
        code: Some(0),
        code_name: "OK".into(),
        messages: Some(3),
        ..Default::default()
    }));
    let input = format!("{}\n{}\n{}\n{call}\n", message(0), message(1), message(2));
    let p = parse(input.as_bytes()).expect("parse");
    assert_eq!((p.calls.len(), p.skipped, p.malformed), (1, 3, 0));
    assert_eq!(p.calls[0].method, "StreamContainers");
}
