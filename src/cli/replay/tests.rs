//! The plan read from a recording, and the report's differences (status, message class,
//! duration, order), without a runtime.

use std::time::Duration;

use serde_json::json;

use super::prepare::NotSent;
use super::report::{differences, message_class, order_changes, Difference, Outcome};
use super::*;

/// A call line as `crisp tap --full -o` records it.
fn line(id: u64, at_ms: u64, method: &str, kind: &str, code: i64, extra: Value) -> String {
    let mut v = json!({
        "call_id": id, "time": format!("2026-11-28T23:29:{:02}.{:03}000Z", at_ms / 1000, at_ms % 1000),
        "cri_version": "v1", "method": method, "path": format!("/runtime.v1.RuntimeService/{method}"),
        "kind": kind, "pod_namespace": "", "pod_name": "", "pod_sandbox_id": "", "container_name": "",
        "container_id": "", "image": "", "duration_ms": 5.0, "held_ms": 0.0, "code": code,
        "code_name": crate::metrics::code_name(Some(code as i32)), "message": "", "request_bytes": 10,
        "response_bytes": 10, "redacted": true,
    });
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v.to_string()
}

fn recording() -> String {
    [
        line(1, 0, "Version", "polling", 0, json!({"request_bytes": 0, "request": {}})),
        line(
            2,
            100,
            "RunPodSandbox",
            "mutating",
            0,
            json!({"pod_namespace": "demo", "pod_name": "web", "pod_sandbox_id": "sb1",
                   "request": {"config": {"metadata": {"name": "web", "namespace": "demo", "uid": "u"}}},
                   "response": {"pod_sandbox_id": "sb1"}}),
        ),
        line(
            4,
            400,
            "StartContainer",
            "mutating",
            0,
            json!({"pod_namespace": "demo", "pod_name": "web", "container_name": "app",
                   "pod_sandbox_id": "sb1", "container_id": "c1",
                   "request": {"container_id": "c1"}}),
        ),
        line(
            3,
            300,
            "CreateContainer",
            "mutating",
            0,
            json!({"pod_namespace": "demo", "pod_name": "web", "container_name": "app",
                   "pod_sandbox_id": "sb1", "container_id": "c1",
                   "request": {"pod_sandbox_id": "sb1", "config": {"metadata": {"name": "app"}}},
                   "response": {"container_id": "c1"}}),
        ),
        line(
            5,
            500,
            "RunPodSandbox",
            "mutating",
            0,
            json!({"pod_namespace": "demo", "pod_name": "db", "pod_sandbox_id": "sb2"}),
        ),
        "{not json".to_string(),
        json!({"hold": "start", "call_id": 3, "time": "2026-11-28T23:29:00.300000Z"}).to_string(),
    ]
    .join("\n")
}

/// One pod's calls, in start order (the tap writes them as they end), offsets from the first;
/// polling calls only with --all; what each made.
#[test]
fn a_pods_calls_are_planned_in_start_order() {
    let plan = plan(recording().as_bytes(), Some("demo/web"), false).expect("plan");
    let methods: Vec<&str> = plan.steps.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(
        methods,
        ["RunPodSandbox", "CreateContainer", "StartContainer"]
    );
    assert_eq!(plan.scope, "demo/web");
    assert_eq!(plan.malformed, 1);
    assert_eq!(plan.steps[0].offset, Duration::ZERO);
    assert_eq!(plan.steps[2].offset, Duration::from_millis(300));
    assert_eq!(plan.steps[0].recorded_product().as_deref(), Some("sb1"));
    assert_eq!(plan.steps[1].recorded_product().as_deref(), Some("c1"));
    assert_eq!(plan.steps[1].target, "app");
    assert_eq!(plan.sandboxes(), 1);

    let all = plan_all(true);
    assert_eq!(all.steps.len(), 5, "every call, Version too");
    assert_eq!(
        all.without_request(),
        1,
        "db's RunPodSandbox: recorded without --full"
    );
    assert_eq!(plan_all(false).polling_left_out, 1);
    assert!(matches!(
        super::plan(recording().as_bytes(), Some("nope"), false),
        Err(PlanError::Pod(_))
    ));
}

fn plan_all(all: bool) -> Plan {
    plan(recording().as_bytes(), None, all).expect("plan")
}

fn sent(code: i32, message: &str, ms: u64, sent_at_ms: u64) -> Outcome {
    Outcome::Sent {
        now: Answer {
            code: Some(code),
            message: message.into(),
            duration: Duration::from_millis(ms),
            held: Duration::ZERO,
        },
        sent_at: Duration::from_millis(sent_at_ms),
        redacted: Vec::new(),
        rewritten: Vec::new(),
        note: None,
        stream: None,
    }
}

fn recorded(code: i32, message: &str, ms: u64, held_ms: u64) -> Step {
    Step {
        method: "CreateContainer".into(),
        target: "app".into(),
        recorded: Answer {
            code: Some(code),
            message: message.into(),
            duration: Duration::from_millis(ms),
            held: Duration::from_millis(held_ms),
        },
        ..Step::default()
    }
}

/// The recorded refusal (crisp's FailedPrecondition) answered OK now is a status difference;
/// the same failure with other ids is not; another kind of message is.
#[test]
fn statuses_and_message_classes_are_compared() {
    let tol = Duration::from_millis(500);
    let refused = recorded(9, "crisp: sidecar proxy of demo/web is not ready", 6, 5);
    assert_eq!(
        differences(&refused, &sent(0, "", 20, 0), tol),
        vec![Difference::Status {
            recorded: Some(9),
            now: Some(0)
        }]
    );
    let reserved = recorded(
        2,
        "failed to reserve container name \"app_web_demo_u_0\": name is reserved for \"a218fd9c606a0011\"",
        3,
        0,
    );
    let again = sent(
        2,
        "failed to reserve container name \"app_web_demo_u_0\": name is reserved for \"7b11fd9c606a0ff2\"",
        3,
        0,
    );
    assert!(differences(&reserved, &again, tol).is_empty());
    assert!(matches!(
        differences(&reserved, &sent(2, "no space left on device", 3, 0), tol)[..],
        [Difference::Message { .. }]
    ));
    assert_eq!(
        message_class("took 1.5s for id 0123456789abcdef"),
        "took # for id #"
    );
}

/// A hold that is gone (2.6 s recorded, 15 ms now) is a duration difference; within the
/// tolerance it is not.
#[test]
fn durations_beyond_the_tolerance_differ() {
    let tol = Duration::from_millis(500);
    let held = recorded(0, "", 2620, 2601);
    assert_eq!(
        differences(&held, &sent(0, "", 15, 0), tol),
        vec![Difference::Duration {
            recorded: Duration::from_millis(2620),
            held: Duration::from_millis(2601),
            now: Duration::from_millis(15)
        }]
    );
    assert!(differences(&held, &sent(0, "", 2300, 0), tol).is_empty());
    assert_eq!(
        differences(&held, &Outcome::NotSent(NotSent::NotRecorded), tol).len(),
        1
    );
}

/// A answered before B in the recording and after it now; calls answered within the slack of
/// each other, and polling calls, are no order change.
#[test]
fn order_changes_are_found_both_ways_round() {
    let at = |offset_ms: u64, ms: u64, polling: bool| Step {
        offset: Duration::from_millis(offset_ms),
        polling,
        recorded: Answer {
            code: Some(0),
            duration: Duration::from_millis(ms),
            ..Answer::default()
        },
        ..Step::default()
    };
    // Recorded: 0 ends at 100, 1 at 3000 (held). Now: 1 ends at 200, 0 at 1000 (slow).
    let steps = vec![at(0, 100, false), at(50, 2950, false), at(60, 10, true)];
    let outcomes = vec![
        sent(0, "", 1000, 0),
        sent(0, "", 150, 50),
        sent(0, "", 5000, 60),
    ];
    assert_eq!(order_changes(&steps, &outcomes), vec![(0, 1)]);
    let same = vec![
        sent(0, "", 100, 0),
        sent(0, "", 2950, 50),
        sent(0, "", 5, 60),
    ];
    assert!(order_changes(&steps, &same).is_empty());
    let close = vec![
        sent(0, "", 160, 0),
        sent(0, "", 100, 50),
        sent(0, "", 5, 60),
    ];
    assert!(order_changes(&steps, &close).is_empty(), "within 20 ms");
}

/// The report names each difference, the ids rewritten and the redacted fields, and its JSON
/// has the same.
#[test]
fn reports_say_what_differs_and_what_was_redacted() {
    let plan = plan(recording().as_bytes(), Some("demo/web"), false).expect("plan");
    let outcomes = vec![
        Outcome::Sent {
            now: Answer {
                code: Some(0),
                duration: Duration::from_millis(5),
                ..Answer::default()
            },
            sent_at: Duration::ZERO,
            redacted: vec![prepare::Redacted::AnnotationValues(2)],
            rewritten: vec![("u".into(), "u-replay-1".into())],
            note: None,
            stream: None,
        },
        sent(9, "crisp: not ready", 5, 200),
        Outcome::NotSent(NotSent::Unmapped(vec!["c1".into()])),
    ];
    let opts = Options {
        pace: Pace::Recorded(2.0),
        timeout: Duration::from_secs(5),
        keep: false,
        tolerance: Duration::from_millis(500),
    };
    let cleanup = vec![report::Cleanup {
        sandbox: "0123456789abcdef0123456789abcdef".into(),
        result: "stopped and removed".into(),
    }];
    let r = Report::new(&plan, outcomes, cleanup, false, &opts);
    assert!(r.differs());
    let text = r.text();
    eprintln!("{text}");
    assert!(
        text.contains("#2 CreateContainer app: status OK → FailedPrecondition (crisp: not ready)"),
        "{text}"
    );
    assert!(
        text.contains("#3 StartContainer app: not sent: names ids no replayed call made (c1)"),
        "{text}"
    );
    assert!(text.contains("u → u-replay-1"), "{text}");
    assert!(
        text.contains("#1 RunPodSandbox pod: 2 annotation values"),
        "{text}"
    );
    assert!(
        text.contains("sandbox 0123456789ab: stopped and removed"),
        "{text}"
    );
    assert!(
        text.contains("3 calls: 2 replayed, 1 not sent, 2 differ"),
        "{text}"
    );
    let v = r.json();
    assert_eq!(v["summary"]["differ"], 2);
    assert_eq!(v["calls"][1]["differences"][0]["kind"], "status");
    assert_eq!(
        v["calls"][2]["not_sent"].as_str().map(|s| s.contains("c1")),
        Some(true)
    );
    assert_eq!(v["ids"][0]["now"], "u-replay-1");
}

/// crisp refused the app's first CreateContainer before the tap read its request: the
/// recording has its status only. kubelet's retry (same sandbox, same container) stands in for
/// it, and the report says so; without a retry it is not sent.
#[test]
fn a_refused_calls_request_comes_from_kubelets_retry() {
    let who = json!({"pod_namespace": "demo", "pod_name": "web", "container_name": "app",
                     "pod_sandbox_id": "sb1"});
    let mut refused = who.clone();
    refused["request_bytes"] = json!(0);
    refused["response_bytes"] = json!(0);
    let mut retry = who.clone();
    retry["request"] = json!({"pod_sandbox_id": "sb1", "config": {"metadata": {"name": "app"}}});
    let text = [
        line(1, 0, "CreateContainer", "mutating", 9, refused),
        line(2, 900, "CreateContainer", "mutating", 0, retry),
    ]
    .join("\n");
    let plan = plan(text.as_bytes(), None, false).expect("plan");
    let first = &plan.steps[0];
    assert!(first.request_missing);
    assert_eq!(first.borrowed, Some(1));
    assert_eq!(first.request, plan.steps[1].request);
    assert_eq!(plan.without_request(), 0);

    let alone = line(1, 0, "CreateContainer", "mutating", 9, who.clone());
    let plan = super::plan(alone.as_bytes(), None, false).expect("plan");
    assert_eq!(plan.without_request(), 1, "no retry: not sent");
    let mut ids = idmap::IdMap::default();
    assert_eq!(
        prepare::prepare(&plan.steps[0], &mut ids, "r").unwrap_err(),
        NotSent::NotRecorded
    );
}

/// Issue #45: a recording with a streamed call's message lines plans as before: each message is
/// a line of its own that is no call (never a step), and the call's step carries the count the
/// report gives when it says why the call is not sent.
#[test]
fn a_streamed_calls_messages_are_no_steps_and_are_counted() {
    let message = |i: u64| {
        json!({"event": "message", "stream_message": i, "call_id": 9,
               "time": "2026-11-28T23:29:00.700000Z", "cri_version": "v1",
               "method": "StreamContainers", "path": "/runtime.v1.RuntimeService/StreamContainers",
               "kind": "streaming", "since_start_ms": 1.0, "bytes": 100, "items": 3,
               "redacted": true, "response": {"containers": []}})
        .to_string()
    };
    let mut lines: Vec<String> = (0..3).map(message).collect();
    lines.push(line(
        9,
        700,
        "StreamContainers",
        "streaming",
        0,
        json!({"messages": 3, "response_bytes": 300, "request": {}}),
    ));
    let text = format!("{}\n{}", recording(), lines.join("\n"));
    let plan = plan(text.as_bytes(), None, true).expect("plan");
    assert_eq!(plan.steps.len(), 6, "five calls and the stream");
    assert_eq!(plan.malformed, 1, "message lines are not malformed");
    let stream = plan.steps.last().expect("the stream");
    assert_eq!(
        (stream.method.as_str(), stream.messages),
        ("StreamContainers", Some(3))
    );
    assert!(super::prepare::prepare(stream, &mut Default::default(), "r").is_ok());
}

/// Issue #46: each message line goes with its call (by the tap's call id), in stream order,
/// with its offset, size and decoded view; a line without the view has none.
#[test]
fn a_streamed_calls_message_lines_go_with_its_step() {
    let message = |i: u64, ms: f64, view: Option<Value>| {
        let mut v = json!({"event": "message", "stream_message": i, "call_id": 9,
               "method": "GetContainerEvents",
               "path": "/runtime.v1.RuntimeService/GetContainerEvents",
               "kind": "streaming", "since_start_ms": ms, "bytes": 40 + i});
        if let Some(view) = view {
            v["response"] = view;
        }
        v.to_string()
    };
    let event = |id: &str| json!({"container_id": id, "container_event_type": 0});
    let lines = [
        message(1, 30.0, None),
        message(0, 12.5, Some(event("ct1"))),
        line(
            9,
            700,
            "GetContainerEvents",
            "streaming",
            1,
            json!({"messages": 2}),
        ),
    ];
    let plan = plan(lines.join("\n").as_bytes(), None, true).expect("plan");
    let step = &plan.steps[0];
    assert_eq!(step.stream.len(), 2);
    assert_eq!(
        step.stream[0],
        StreamMessage {
            index: 0,
            offset: Duration::from_micros(12_500),
            bytes: 40,
            response: Some(event("ct1")),
        }
    );
    assert_eq!(
        (step.stream[1].index, step.stream[1].response.clone()),
        (1, None)
    );
}

/// Issue #46: a stream still open when the recording ended has message lines and no call
/// line; it is planned all the same, from its first message (start: that message's time less
/// its offset), with no status, its last message's offset as its duration, and its messages.
/// A GetContainerEvents' request is known (it has no fields); another stream's is not.
#[test]
fn a_stream_open_at_the_recordings_end_is_planned() {
    let message = |id: u64, i: u64, ms: f64, method: &str| {
        json!({"event": "message", "stream_message": i, "call_id": id,
               "time": format!("2026-11-28T23:29:01.{:03}000Z", 500 + ms as u64),
               "cri_version": "v1", "method": method,
               "path": format!("/runtime.v1.RuntimeService/{method}"),
               "kind": "streaming", "since_start_ms": ms, "bytes": 40})
        .to_string()
    };
    let lines = [
        line(1, 0, "Version", "polling", 0, json!({"request": {}})),
        message(7, 0, 100.0, "GetContainerEvents"),
        message(7, 1, 250.0, "GetContainerEvents"),
        message(8, 0, 10.0, "StreamContainers"),
    ];
    let plan = plan(lines.join("\n").as_bytes(), None, true).expect("plan");
    assert_eq!(plan.steps.len(), 3);
    let events = plan
        .steps
        .iter()
        .find(|s| s.method == "GetContainerEvents")
        .expect("the open stream");
    assert!(events.open_at_end && events.streamed());
    assert_eq!(events.recorded.code, None, "no status: it had not ended");
    assert_eq!(events.recorded.duration, Duration::from_millis(250));
    assert_eq!(
        events.offset,
        Duration::from_millis(1_500),
        "started 100 ms before its first message"
    );
    assert_eq!((events.stream.len(), events.recorded_messages()), (2, 2));
    assert_eq!(events.request, Some(json!({})));
    assert!(super::prepare::prepare(events, &mut Default::default(), "r").is_ok());
    let list = plan
        .steps
        .iter()
        .find(|s| s.method == "StreamContainers")
        .expect("the other");
    assert_eq!(
        super::prepare::prepare(list, &mut Default::default(), "r").unwrap_err(),
        NotSent::NotRecorded,
        "its request (a filter) is not in the recording"
    );
}

/// Issue #46, the kubelet side: a stream read whole is compared by status and message count;
/// one the replay cancelled (open at the recording's end, or cancelled by its client) only by
/// its count, and the report says it was cancelled and after how long.
#[test]
fn a_streams_message_count_and_its_cancelling_are_reported() {
    let stream = |code: Option<i32>, open: bool| Step {
        method: "GetContainerEvents".into(),
        rpc: Some(Rpc::GetContainerEvents),
        recorded: Answer {
            code,
            duration: Duration::from_secs(4),
            ..Answer::default()
        },
        messages: Some(5),
        open_at_end: open,
        ..Step::default()
    };
    let read = |code: i32, ms: u64, messages: u64, cancelled: Option<u64>| Outcome::Sent {
        now: Answer {
            code: Some(code),
            duration: Duration::from_millis(ms),
            ..Answer::default()
        },
        sent_at: Duration::ZERO,
        redacted: Vec::new(),
        rewritten: Vec::new(),
        note: None,
        stream: Some(report::StreamRead {
            messages,
            cancelled_after: cancelled.map(Duration::from_millis),
        }),
    };
    let tolerance = Duration::from_millis(500);
    let ended = stream(Some(0), false);
    assert_eq!(
        differences(&ended, &read(0, 4_100, 5, None), tolerance),
        vec![]
    );
    assert_eq!(
        differences(&ended, &read(0, 4_100, 3, None), tolerance),
        vec![Difference::Messages {
            recorded: 5,
            now: 3
        }]
    );
    // Open at the end: read for 4 s ÷ 2, then cancelled; the status and duration are ours.
    let open = stream(None, false);
    let open = Step {
        open_at_end: true,
        ..open
    };
    assert_eq!(
        player::stream_window(&open, Pace::Recorded(2.0)),
        Some(Duration::from_secs(2))
    );
    assert_eq!(player::stream_window(&ended, Pace::Recorded(2.0)), None);
    let cancelled = stream(Some(1), false);
    assert_eq!(
        player::stream_window(&cancelled, Pace::AsFastAsPossible),
        Some(Duration::from_secs(4)),
        "a stream its client cancelled: its recorded duration"
    );
    assert_eq!(
        differences(&open, &read(1, 2_000, 5, Some(2_000)), tolerance),
        vec![]
    );
    assert_eq!(
        differences(&open, &read(1, 2_000, 4, Some(2_000)), tolerance),
        vec![Difference::Messages {
            recorded: 5,
            now: 4
        }]
    );
    let plan = Plan {
        steps: vec![open],
        scope: "every call".into(),
        ..Plan::default()
    };
    let opts = Options {
        pace: Pace::Recorded(2.0),
        timeout: Duration::from_secs(5),
        keep: false,
        tolerance,
    };
    let report = Report::new(
        &plan,
        vec![read(1, 2_000, 4, Some(2_000))],
        Vec::new(),
        false,
        &opts,
    );
    assert!(report.differs());
    let text = report.text();
    assert!(text.contains("5 messages streamed → 4"), "{text}");
    assert!(
        text.contains("a stream: 5 messages recorded, 4 now; still open when the recording ended: read for 2.00s"),
        "{text}"
    );
    let json = report.json();
    let call = &json["calls"][0];
    assert_eq!(call["messages"], json!({"recorded": 5, "now": 4}));
    assert_eq!(call["cancelled_after_ms"], 2000.0);
    assert_eq!(call["differences"][0]["kind"], "messages");
}

/// Issue #46: lines marked `"snapshot": true` (crisp's own calls at the recording's start) are
/// no calls of kubelet's: not replayed, not in a timeline, kept apart for `--as-runtime`.
#[test]
fn snapshot_lines_are_kept_apart() {
    let mut version = serde_json::from_str::<Value>(&line(
        0,
        0,
        "Version",
        "polling",
        0,
        json!({"request": {}, "response": {"runtime_name": "containerd"}}),
    ))
    .expect("json");
    version["snapshot"] = json!(true);
    assert!(crate::cli::timeline::call_of(&version).is_none());
    let text = format!("{version}\n{}", recording());
    let with = plan(text.as_bytes(), None, true).expect("plan");
    let without = plan(recording().as_bytes(), None, true).expect("plan");
    assert_eq!(with.steps.len(), without.steps.len(), "never replayed");
    assert_eq!(with.snapshot.len(), 1);
    let s = &with.snapshot[0];
    assert_eq!((s.method.as_str(), s.polling), ("Version", true));
    assert_eq!(s.response, Some(json!({"runtime_name": "containerd"})));
}

/// Issue #46, the writing side: the line `crisp tap -o` writes for a snapshot event
/// (`cli::view`) is what the plan keeps apart as the snapshot, response and all; a live call's
/// line beside it is replayed.
#[test]
fn the_tap_writes_snapshot_lines_the_plan_reads() {
    use crate::admin_api::{tap_event::Event, CallEvent};
    use crate::cli::view::json_text;
    let version = CallEvent {
        method: "Version".into(),
        path: "/runtime.v1.RuntimeService/Version".into(),
        cri_version: "v1".into(),
        kind: "polling".into(),
        code: Some(0),
        code_name: "OK".into(),
        request_json: r#"{"version":"v1"}"#.into(),
        response_json: r#"{"runtime_name":"containerd","runtime_api_version":"v1"}"#.into(),
        redacted: true,
        snapshot: true,
        ..Default::default()
    };
    let live = CallEvent {
        call_id: 7,
        snapshot: false,
        method: "RemovePodSandbox".into(),
        path: "/runtime.v1.RuntimeService/RemovePodSandbox".into(),
        kind: "mutating".into(),
        ..version.clone()
    };
    let text = format!(
        "{}\n{}\n",
        json_text(&Event::Call(version)),
        json_text(&Event::Call(live))
    );
    let plan = plan(text.as_bytes(), None, true).expect("plan");
    assert_eq!(plan.steps.len(), 1, "only the live call is replayed");
    assert_eq!(plan.steps[0].method, "RemovePodSandbox");
    assert_eq!(plan.snapshot.len(), 1);
    let s = &plan.snapshot[0];
    assert_eq!((s.method.as_str(), s.polling), ("Version", true));
    assert_eq!(s.path, "/runtime.v1.RuntimeService/Version");
    assert_eq!(s.recorded.code, Some(0));
    assert_eq!(
        s.response,
        Some(json!({"runtime_name": "containerd", "runtime_api_version": "v1"}))
    );
}
