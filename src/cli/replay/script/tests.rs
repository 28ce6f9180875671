//! The matcher, call by call: no socket, no clock but the `now` each call is given.

use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::cli::replay::{Answer, Plan, Step, StreamMessage};

const V1: &str = "/runtime.v1.RuntimeService/";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A recorded call: `offset_ms` after the first, answered with `code` after 10 ms.
fn step(offset_ms: u64, rpc: Rpc, code: i32, request: Value, response: Value) -> Step {
    let polling = rpc.kind() == RpcKind::Polling;
    Step {
        method: rpc.name().to_string(),
        path: format!("{V1}{}", rpc.name()),
        rpc: Some(rpc),
        polling,
        offset: ms(offset_ms),
        recorded: Answer {
            code: Some(code),
            message: if code == 0 {
                String::new()
            } else {
                "sidecar proxy is not ready".into()
            },
            duration: ms(10),
            ..Answer::default()
        },
        request: Some(request),
        response: (code == 0).then_some(response),
        ..Step::default()
    }
}

fn plan(mut steps: Vec<Step>) -> Plan {
    for (i, s) in steps.iter_mut().enumerate() {
        s.index = i;
    }
    Plan {
        steps,
        scope: "every call".into(),
        ..Plan::default()
    }
}

fn state(id: &str, state: &str) -> Value {
    json!({"status": {"id": id, "state": state}})
}

/// The demo pod's incident, as recorded: the app's CreateContainer refused, its retry made it.
fn incident() -> Plan {
    let run = json!({"config": {"metadata": {"name": "web", "namespace": "demo", "uid": "u1"}}});
    let create = json!({"pod_sandbox_id": "sb1", "config": {"metadata": {"name": "app"}}});
    plan(vec![
        step(
            0,
            Rpc::Version,
            0,
            json!({}),
            json!({"runtime_name": "containerd"}),
        ),
        step(
            5,
            Rpc::RunPodSandbox,
            0,
            run,
            json!({"pod_sandbox_id": "sb1"}),
        ),
        step(30, Rpc::CreateContainer, 9, create.clone(), json!({})),
        step(
            40,
            Rpc::ContainerStatus,
            0,
            json!({"container_id": "ct1"}),
            state("ct1", "CONTAINER_CREATED"),
        ),
        step(
            50,
            Rpc::CreateContainer,
            0,
            create,
            json!({"container_id": "ct1"}),
        ),
        step(
            60,
            Rpc::StartContainer,
            0,
            json!({"container_id": "ct1"}),
            json!({}),
        ),
        step(
            70,
            Rpc::ContainerStatus,
            0,
            json!({"container_id": "ct1"}),
            state("ct1", "CONTAINER_RUNNING"),
        ),
        step(
            900,
            Rpc::ContainerStatus,
            0,
            json!({"container_id": "ct1"}),
            state("ct1", "CONTAINER_EXITED"),
        ),
        step(
            1000,
            Rpc::StopContainer,
            0,
            json!({"container_id": "ct1"}),
            json!({}),
        ),
    ])
}

fn call(s: &mut Script, rpc: Rpc, request: Value, at_ms: u64) -> Reply {
    s.answer(&format!("{V1}{}", rpc.name()), &request, ms(at_ms))
}

/// [`call`] with a request that names only a container.
fn on_container(s: &mut Script, rpc: Rpc, container_id: &str, at_ms: u64) -> Reply {
    call(s, rpc, json!({ "container_id": container_id }), at_ms)
}

/// A peer running the same pod gets the refusal first, then the container, with the recorded
/// ids (a new pod uid does not matter), and the report has every call answered in order.
#[test]
fn the_same_pod_gets_the_recorded_refusal_then_the_recorded_ids() {
    let mut s = Script::new(incident(), None);
    let run = json!({"config": {"metadata": {"name": "web", "namespace": "demo", "uid": "fresh"}}});
    let r = call(&mut s, Rpc::RunPodSandbox, run, 0);
    assert_eq!((r.code, r.step), (0, Some(1)));
    assert_eq!(r.response, Some(json!({"pod_sandbox_id": "sb1"})));
    let create = json!({"pod_sandbox_id": "sb1", "config": {"metadata": {"name": "app"}}});
    let refused = call(&mut s, Rpc::CreateContainer, create.clone(), 1);
    assert_eq!(refused.code, 9, "the recorded FailedPrecondition");
    assert_eq!(refused.message, "sidecar proxy is not ready");
    assert_eq!(refused.response, None);
    let made = call(&mut s, Rpc::CreateContainer, create, 2);
    assert_eq!(made.response, Some(json!({"container_id": "ct1"})));
    assert_eq!(
        on_container(&mut s, Rpc::StartContainer, "ct1", 3).step,
        Some(5)
    );
    assert_eq!(
        on_container(&mut s, Rpc::StopContainer, "ct1", 4).step,
        Some(8)
    );
    let report = s.report();
    assert_eq!(report.answered, vec![1, 2, 4, 5, 8]);
    assert!(report.not_asked.is_empty() && report.order.is_empty());
    assert!(!report.differs(), "{}", report.text());
}

/// A call the recording does not have is answered Unimplemented, named, and reported; so is a
/// recorded call never made, and an answer given out of recorded order.
#[test]
fn what_the_recording_lacks_is_refused_and_reported() {
    let mut s = Script::new(incident(), None);
    let r = on_container(&mut s, Rpc::StartContainer, "other", 0);
    assert_eq!(r.code, 12);
    assert!(
        r.message.contains("StartContainer") && r.message.contains("other"),
        "{}",
        r.message
    );
    on_container(&mut s, Rpc::StartContainer, "other", 1);
    // A status of a container the recording never asked about is not another container's.
    let status = on_container(&mut s, Rpc::ContainerStatus, "other", 1);
    assert_eq!((status.code, status.response), (12, None));
    // The start before the create: an order difference.
    on_container(&mut s, Rpc::StartContainer, "ct1", 2);
    let create = json!({"pod_sandbox_id": "sb1", "config": {"metadata": {"name": "app"}}});
    call(&mut s, Rpc::CreateContainer, create, 3);
    let report = s.report();
    // Sorted by method: ContainerStatus, then StartContainer.
    assert_eq!(report.unmatched.len(), 2);
    assert_eq!(report.unmatched[1].1, 2, "counted twice");
    assert_eq!(report.order, vec![(5, 2)]);
    assert_eq!(report.not_asked, vec![1, 4, 8]);
    assert!(report.differs());
    let text = report.text();
    assert!(
        text.contains("2× StartContainer (container other)"),
        "{text}"
    );
    let j = report.json();
    assert_eq!(j["summary"]["unmatched"], 3);
    assert_eq!(j["summary"]["order_differences"], 1);
}

/// Polling calls get the latest recorded answer before the next mutating call not yet
/// answered: CREATED before the start, EXITED after it (answered at once, nothing in between
/// holds time back); the same answer however often asked.
#[test]
fn a_poller_gets_the_latest_answer_at_the_point_reached() {
    let mut s = Script::new(incident(), None);
    let status = |s: &mut Script, at| {
        let r = call(s, Rpc::ContainerStatus, json!({"container_id": "ct1"}), at);
        r.response.unwrap()["status"]["state"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // Before anything: the first recorded answer.
    assert_eq!(status(&mut s, 0), "CONTAINER_CREATED");
    let run = json!({"config": {"metadata": {"name": "web", "namespace": "demo"}}});
    call(&mut s, Rpc::RunPodSandbox, run, 1);
    let create = json!({"pod_sandbox_id": "sb1", "config": {"metadata": {"name": "app"}}});
    call(&mut s, Rpc::CreateContainer, create.clone(), 2);
    assert_eq!(status(&mut s, 3), "CONTAINER_CREATED");
    call(&mut s, Rpc::CreateContainer, create, 4);
    on_container(&mut s, Rpc::StartContainer, "ct1", 5);
    assert_eq!(status(&mut s, 6), "CONTAINER_EXITED");
    assert_eq!(status(&mut s, 7), "CONTAINER_EXITED");
    // Version is not tied to a container: the one recorded, however often.
    for at in 8..11 {
        assert_eq!(call(&mut s, Rpc::Version, json!({}), at).step, Some(0));
    }
    let report = s.report();
    assert_eq!(report.polling["ContainerStatus"], (4, 3));
    assert_eq!(report.polling["Version"], (3, 1));
}

/// With a speed, answers wait their recorded duration ÷ speed, and a poller sees the recorded
/// time pass: RUNNING right after the start, EXITED once the recorded 830 ms have gone by
/// (at 2x: 415 ms).
#[test]
fn with_a_speed_the_recorded_time_passes_for_pollers() {
    let mut s = Script::new(incident(), Some(2.0));
    let run = json!({"config": {"metadata": {"name": "web", "namespace": "demo"}}});
    let r = call(&mut s, Rpc::RunPodSandbox, run, 0);
    assert_eq!(r.delay, ms(5), "10 ms recorded, at 2x");
    let create = json!({"pod_sandbox_id": "sb1", "config": {"metadata": {"name": "app"}}});
    call(&mut s, Rpc::CreateContainer, create.clone(), 10);
    call(&mut s, Rpc::CreateContainer, create, 20);
    on_container(&mut s, Rpc::StartContainer, "ct1", 30);
    let state = |s: &mut Script, at| {
        let r = call(s, Rpc::ContainerStatus, json!({"container_id": "ct1"}), at);
        r.response.unwrap()["status"]["state"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(state(&mut s, 40), "CONTAINER_RUNNING");
    assert_eq!(state(&mut s, 400), "CONTAINER_RUNNING");
    assert_eq!(state(&mut s, 30 + 420), "CONTAINER_EXITED");
}

/// A mutating call made more often than recorded gets the last recorded answer again, and the
/// report says how often; a recorded call with no answer (the client gave up) is answered
/// DeadlineExceeded after its recorded time.
#[test]
fn calls_beyond_the_recording_and_calls_never_answered() {
    let mut steps = incident().steps;
    steps[8].recorded.code = None;
    let mut s = Script::new(plan(steps), Some(1.0));
    for at in 0..3 {
        call(
            &mut s,
            Rpc::StartContainer,
            json!({"container_id": "ct1"}),
            at,
        );
    }
    let stop = on_container(&mut s, Rpc::StopContainer, "ct1", 4);
    assert_eq!((stop.code, stop.delay), (4, ms(10)));
    assert_eq!(s.report().again, vec![(5, 2)]);
}

/// Recorded answers keep what the tap redacted: the placeholder is answered, and listed.
#[test]
fn redacted_answers_stay_redacted_and_are_listed() {
    let mut steps = incident().steps;
    steps[3].response =
        Some(json!({"status": {"id": "ct1"}, "info": {"info": "<redacted: 2048 bytes>"}}));
    let mut s = Script::new(plan(steps), None);
    let r = on_container(&mut s, Rpc::ContainerStatus, "ct1", 0);
    assert_eq!(
        r.response.unwrap()["info"]["info"],
        "<redacted: 2048 bytes>"
    );
    assert_eq!(s.report().redacted, vec![3]);
}

/// A recording without the request (crisp refused the call before the tap read it, and no
/// retry lent one) is matched by the ids on the tap's line.
#[test]
fn a_call_without_a_recorded_request_matches_by_the_ids_of_its_line() {
    let mut steps = incident().steps;
    steps[5].request = None;
    steps[5].container_id = "ct1".into();
    let mut s = Script::new(plan(steps), None);
    assert_eq!(
        on_container(&mut s, Rpc::StartContainer, "ct1", 0).step,
        Some(5)
    );
    assert_eq!(on_container(&mut s, Rpc::StartContainer, "ct2", 1).code, 12);
}

/// A peer that made the pod under a new uid finds it in the answers: the recorded uid is
/// answered as the peer's, in labels and metadata, once its RunPodSandbox matched.
#[test]
fn a_pod_made_anew_finds_its_uid_in_the_answers() {
    let labels = json!({"io.kubernetes.pod.uid": "u1"});
    let run = json!({"config": {"metadata": {"name": "web", "namespace": "demo", "uid": "u1"}}});
    let listed = json!({"items": [{"id": "sb1", "labels": labels,
        "metadata": {"name": "web", "namespace": "demo", "uid": "u1"}}]});
    let mut s = Script::new(
        plan(vec![
            step(
                0,
                Rpc::RunPodSandbox,
                0,
                run,
                json!({"pod_sandbox_id": "sb1"}),
            ),
            step(10, Rpc::ListPodSandbox, 0, json!({}), listed),
        ]),
        None,
    );
    let fresh = json!({"config": {"metadata": {"name": "web", "namespace": "demo", "uid": "u2"}}});
    call(&mut s, Rpc::RunPodSandbox, fresh, 0);
    let r = call(&mut s, Rpc::ListPodSandbox, json!({}), 1)
        .response
        .unwrap();
    assert_eq!(r["items"][0]["labels"]["io.kubernetes.pod.uid"], "u2");
    assert_eq!(r["items"][0]["metadata"]["uid"], "u2");
    assert_eq!(r["items"][0]["id"], "sb1", "ids stay the recorded ones");
    assert_eq!(s.report().uids, vec![("u1".to_string(), "u2".to_string())]);
}

/// Calls that started together in the recording (kubelet stops a pod's containers in
/// parallel) may come in either order; a filter's id is a sandbox's in ListPodSandbox.
#[test]
fn calls_recorded_together_have_no_order_and_filters_name_the_right_id() {
    let mut s = Script::new(
        plan(vec![
            step(
                0,
                Rpc::StopContainer,
                0,
                json!({"container_id": "a"}),
                json!({}),
            ),
            step(
                1,
                Rpc::StopContainer,
                0,
                json!({"container_id": "b"}),
                json!({}),
            ),
            step(
                2,
                Rpc::ListPodSandbox,
                0,
                json!({"filter": {"id": "sb1"}}),
                json!({"items": []}),
            ),
            step(
                3,
                Rpc::ListPodSandbox,
                0,
                json!({"filter": {"id": "sb2"}}),
                json!({}),
            ),
        ]),
        None,
    );
    on_container(&mut s, Rpc::StopContainer, "b", 0);
    on_container(&mut s, Rpc::StopContainer, "a", 1);
    assert!(s.report().order.is_empty());
    let listed = call(
        &mut s,
        Rpc::ListPodSandbox,
        json!({"filter": {"id": "sb1"}}),
        2,
    );
    assert_eq!(listed.step, Some(2));
    assert_eq!(
        Identity::of_request(Some(Rpc::ListPodSandbox), &json!({"filter": {"id": "x"}}))
            .sandbox
            .as_deref(),
        Some("x")
    );
    assert_eq!(
        Identity::of_request(Some(Rpc::ListContainers), &json!({"filter": {"id": "x"}}))
            .container
            .as_deref(),
        Some("x")
    );
}

/// A recorded stream (issue #46): each message whose view the recording has is sent at its
/// offset ÷ speed (at once without), then the recorded status; a message without its view, one
/// the tap cut and one the tap dropped are not sent, and the report says which and why.
#[test]
fn a_stream_is_answered_with_its_recorded_messages() {
    let event = |id: &str| json!({"container_id": id, "container_event_type": 1});
    let message = |index: u64, offset_ms: u64, response: Option<Value>| StreamMessage {
        index,
        offset: ms(offset_ms),
        bytes: 50,
        response,
    };
    let mut events = step(0, Rpc::GetContainerEvents, 1, json!({}), json!({}));
    events.recorded.duration = ms(900);
    events.messages = Some(5);
    events.stream = vec![
        message(0, 100, Some(event("ct1"))),
        message(1, 200, None),
        message(
            2,
            300,
            Some(json!({"container_id": "ct1", "_truncated": {}})),
        ),
        message(3, 400, Some(event("ct2"))),
    ];
    let recorded = plan(vec![events]);

    let mut at_once = Script::new(plan(recorded.steps.clone()), None);
    let r = call(&mut at_once, Rpc::GetContainerEvents, json!({}), 0);
    let sent: Vec<(u64, Duration)> = r.stream.iter().flatten().map(|m| (m.index, m.at)).collect();
    assert_eq!(
        sent,
        vec![(0, ms(0)), (3, ms(0))],
        "at once, without --speed"
    );
    assert_eq!((r.code, r.delay), (1, ms(0)), "then the recorded status");

    let mut paced = Script::new(recorded, Some(2.0));
    let r = call(&mut paced, Rpc::GetContainerEvents, json!({}), 0);
    let messages = r.stream.clone().expect("a streamed answer");
    assert_eq!(
        messages.iter().map(|m| (m.index, m.at)).collect::<Vec<_>>(),
        vec![(0, ms(50)), (3, ms(200))],
        "each at its offset ÷ speed"
    );
    assert_eq!(messages[1].response, event("ct2"), "as recorded");
    assert_eq!(
        r.delay,
        ms(450),
        "the status after the recorded duration ÷ speed"
    );
    let index = r.step.expect("a recorded call");
    for _ in &messages {
        paced.message_sent(index);
    }
    let report = paced.report();
    let (_, served) = &report.streams[0];
    assert_eq!((served.answers, served.sent, served.dropped), (1, 2, 1));
    assert_eq!(
        served.unsent,
        vec![(1, Unsent::NotRecorded), (2, Unsent::Cut)]
    );
    let text = report.text();
    assert!(
        text.contains("#1 GetContainerEvents: 2 sent of 5 recorded (1 answer)"),
        "{text}"
    );
    assert!(
        text.contains("1 not sent: its view is not recorded"),
        "{text}"
    );
    assert!(text.contains("1 not sent: its view was cut"), "{text}");
    assert!(text.contains("1 not sent: its line was dropped"), "{text}");
    let json = report.json();
    assert_eq!(json["streams"][0]["sent"], 2);
    assert_eq!(json["summary"]["stream_messages_sent"], 2);

    // A unary answer has no stream.
    let mut unary = Script::new(incident(), None);
    assert_eq!(call(&mut unary, Rpc::Version, json!({}), 0).stream, None);
}

/// A stream still open when the recording ended stays open after its messages, with no
/// status: the serving shell holds it until the peer goes.
#[test]
fn a_stream_open_at_the_recordings_end_stays_open() {
    let mut events = step(0, Rpc::GetContainerEvents, 0, json!({}), json!({}));
    events.recorded.code = None;
    events.open_at_end = true;
    events.stream = vec![StreamMessage {
        index: 0,
        offset: ms(10),
        bytes: 9,
        response: Some(json!({"container_id": "ct1"})),
    }];
    let mut s = Script::new(plan(vec![events]), None);
    let r = call(&mut s, Rpc::GetContainerEvents, json!({}), 0);
    assert!(r.open);
    assert_eq!(r.stream.map(|m| m.len()), Some(1));
}

/// Issue #46: a recording begun after kubelet connected has none of kubelet's handshake
/// (Version, then ImageFsInfo); crisp's snapshot at its start answers it, and a recorded answer
/// reached later wins over the snapshot's, as any later answer does.
#[test]
fn the_snapshot_answers_a_handshake_the_recording_lacks() {
    let fs = json!({"image_filesystems": [{"fs_id": {"mountpoint": "/var/lib/containerd"}}]});
    let mut recorded = incident();
    let mut without = Script::new(plan(recorded.steps.clone()), None);
    assert_eq!(
        call(&mut without, Rpc::ImageFsInfo, json!({}), 0).code,
        UNIMPLEMENTED,
        "without the snapshot the handshake is refused"
    );
    recorded.snapshot = vec![
        step(
            0,
            Rpc::Version,
            0,
            json!({}),
            json!({"runtime_name": "at-start"}),
        ),
        step(0, Rpc::ImageFsInfo, 0, json!({}), fs.clone()),
    ];
    let mut s = Script::new(recorded, None);
    let r = call(&mut s, Rpc::ImageFsInfo, json!({}), 0);
    assert_eq!((r.code, r.response), (0, Some(fs)));
    let r = call(&mut s, Rpc::Version, json!({}), 1);
    assert_eq!(
        r.response,
        Some(json!({"runtime_name": "containerd"})),
        "the recorded Version, reached already, is the latest answer"
    );
    assert!(s.report().unmatched.is_empty());
}
