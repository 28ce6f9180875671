//! `crisp pcap` (issue #46): a tap recording becomes a pcapng capture that a tool no one here
//! wrote — Wireshark's tshark, with its HTTP/2, gRPC and protobuf dissectors and the CRI's
//! api.proto on the protobuf search path — decodes call by call: each call's method, status and
//! the request fields the recording shows (redacted values as the recording shows them), with
//! the pod and crisp's hold as packet comments; a streamed call's messages each as a DATA frame
//! of its stream (issue #45).

use std::path::{Path, PathBuf};
use std::process::Command;

use crisp::admin_api::{tap_event::Event, CallEvent, HoldEvent, MessageEvent};
use crisp::cli::view::json_line;

use crate::prerequisites::require_tool;

const T0: i64 = 1_764_000_000_000_000_000;

/// A call event as `crisp tap --full -o` records it.
fn call(id: u64, method: &str, at_ms: i64, code: Option<i32>, request_json: String) -> String {
    let code_name = match code {
        Some(0) => "OK",
        Some(9) => "FailedPrecondition",
        Some(_) => "Unknown",
        None => "",
    };
    json_line(&Event::Call(CallEvent {
        call_id: id,
        start_unix_nanos: T0 + at_ms * 1_000_000,
        method: method.into(),
        path: format!("/runtime.v1.RuntimeService/{method}"),
        cri_version: "v1".into(),
        kind: "mutating".into(),
        pod_namespace: "shop".into(),
        pod_name: "web".into(),
        container_name: "app".into(),
        duration_micros: 2_000,
        held_micros: if id == 2 { 1_500 } else { 0 },
        code,
        code_name: code_name.into(),
        message: if code == Some(9) {
            "crisp: istio-proxy not ready\nretry".into()
        } else {
            String::new()
        },
        request_json,
        response_json: if code == Some(0) {
            "{}".into()
        } else {
            String::new()
        },
        redacted: true,
        ..Default::default()
    }))
    .to_string()
}

/// Where tshark finds the CRI's api.proto (`package runtime.v1`): the copy crisp is pinned to
/// (proto/README.md), the one the tap decodes with.
fn cri_proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/k8s/cri-api/v1")
}

/// Runs `crisp pcap input -o capture`.
fn crisp_pcap(input: &Path, capture: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_crisp"))
        .args(["pcap", input.to_str().expect("utf-8"), "-o"])
        .arg(capture)
        .output()
        .expect("run crisp pcap")
}

/// Writes `recording` into `dir`, turns it into a capture with `crisp pcap`, checks that it
/// wrote `calls` calls, and returns the capture's path.
fn capture_of(dir: &Path, recording: &str, calls: usize) -> PathBuf {
    let input = dir.join("calls.jsonl");
    std::fs::write(&input, recording).expect("write");
    let capture = dir.join("calls.pcapng");
    let out = crisp_pcap(&input, &capture);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "crisp pcap failed: {stderr}");
    assert!(
        stderr.contains(&format!("{calls} calls written")),
        "{stderr}"
    );
    capture
}

fn tshark(capture: &Path, fields: &[&str]) -> String {
    let mut cmd = Command::new("tshark");
    cmd.args(["-r", capture.to_str().expect("utf-8")])
        .args(["-d", "tcp.port==50051,http2"])
        .arg("-o")
        .arg(format!(
            "uat:protobuf_search_paths:\"{}\",\"TRUE\"",
            cri_proto_dir().display()
        ))
        .args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn tshark_decodes_every_call_method_status_and_shown_fields() {
    require_tool("tshark", "-v");
    let dir = tempfile::tempdir().expect("tempdir");
    let start = serde_json::to_string(&k8s_cri::v1::StartContainerRequest {
        container_id: "c0ffee".into(),
    })
    .expect("json");
    // CreateContainer's env values as the tap shows them: redacted (k8s-cri's types serialise
    // as crisp's do, field for field).
    let create = k8s_cri::v1::CreateContainerRequest {
        pod_sandbox_id: "sandbox-1".into(),
        config: Some(k8s_cri::v1::ContainerConfig {
            envs: vec![k8s_cri::v1::KeyValue {
                key: "DB_PASSWORD".into(),
                value: "<redacted>".into(),
            }],
            ..Default::default()
        }),
        sandbox_config: None,
    };
    let hold = json_line(&Event::Hold(HoldEvent {
        call_id: 2,
        phase: "start".into(),
        unix_nanos: T0 + 10_000_000,
        waiting_on: "istio-proxy".into(),
        reason: "not ready".into(),
        ..Default::default()
    }));
    let recording = [
        call(1, "StartContainer", 0, Some(0), start),
        hold.to_string(),
        call(
            2,
            "CreateContainer",
            10,
            Some(9),
            serde_json::to_string(&create).expect("json"),
        ),
        call(3, "StopContainer", 20, None, String::new()),
        "{\"dropped\":1,\"dropped_total\":1}".into(),
    ]
    .join("\n");
    let capture = capture_of(dir.path(), &recording, 3);

    let paths = tshark(&capture, &["http2.header.value"]);
    for method in ["StartContainer", "CreateContainer", "StopContainer"] {
        assert!(
            paths.contains(&format!("/runtime.v1.RuntimeService/{method}")),
            "{method} not decoded:\n{paths}"
        );
    }
    // The statuses, from the trailers: OK and FailedPrecondition with its message; the call
    // kubelet gave up on ends in a reset.
    let statuses = tshark(&capture, &["http2.header.name", "http2.header.value"]);
    assert!(statuses.contains("grpc-status"), "{statuses}");
    assert!(
        statuses.contains(",0") && statuses.contains(",9,crisp: istio-proxy not ready%0Aretry"),
        "{statuses}"
    );
    let resets = tshark(&capture, &["http2.rst_stream.error"]);
    assert_eq!(
        resets.lines().filter(|l| l.trim() == "8").count(),
        1,
        "{resets}"
    );
    // The request fields the recording shows, decoded by tshark's protobuf dissector with the
    // CRI's own message types.
    let fields = tshark(
        &capture,
        &[
            "protobuf.message.name",
            "protobuf.field.name",
            "protobuf.field.value.string",
        ],
    );
    eprintln!("{fields}");
    assert!(
        fields.contains("runtime.v1.StartContainerRequest"),
        "{fields}"
    );
    assert!(fields.contains("c0ffee"), "{fields}");
    assert!(
        fields.contains("runtime.v1.CreateContainerRequest"),
        "{fields}"
    );
    assert!(
        fields.contains("sandbox-1") && fields.contains("DB_PASSWORD"),
        "{fields}"
    );
    // The env value is bytes since cri-api v0.34.10, so tshark shows it as bytes: the capture
    // holds the recording's "<redacted>", nothing else.
    let bytes = std::fs::read(&capture).expect("capture");
    assert!(bytes.windows(10).any(|w| w == b"<redacted>"));
    // The pod, the container and crisp's hold, as packet comments.
    let comments = tshark(&capture, &["frame.comment"]);
    assert!(
        comments.contains("call 2 pod shop/web container app; held 1.5 ms")
            && comments
                .contains("crisp held this call: start waiting for istio-proxy; reason: not ready"),
        "{comments}"
    );
}

/// The capture is written as --output's files are: an existing file is never overwritten.
#[test]
fn an_existing_capture_is_never_overwritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("calls.jsonl");
    std::fs::write(&input, call(1, "StartContainer", 0, Some(0), String::new())).expect("write");
    let capture = dir.path().join("old.pcapng");
    std::fs::write(&capture, "keep me").expect("write");
    let out = crisp_pcap(&input, &capture);
    assert_eq!(out.status.code(), Some(73), "{out:?}");
    assert_eq!(std::fs::read_to_string(&capture).expect("read"), "keep me");
}

/// Issue #45: a streamed call recorded message by message becomes one HTTP/2 stream whose
/// response is one DATA frame per message, in order, which tshark's gRPC dissector counts and
/// whose protobuf (re-encoded from the recording's decoded view) it decodes with the CRI's types;
/// the call's end closes the stream with its trailers.
#[test]
fn tshark_sees_each_message_of_a_streamed_call() {
    require_tool("tshark", "-v");
    const MESSAGES: u64 = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = "/runtime.v1.RuntimeService/StreamContainers";
    let mut lines = Vec::new();
    for i in 0..MESSAGES {
        let list = k8s_cri::v1::ListContainersResponse {
            containers: (0..=i)
                .map(|j| k8s_cri::v1::Container {
                    id: format!("container-{i}-{j}"),
                    ..Default::default()
                })
                .collect(),
        };
        lines.push(
            json_line(&Event::Message(MessageEvent {
                call_id: 5,
                index: i,
                unix_nanos: T0 + (i as i64 + 1) * 1_000_000,
                since_start_micros: (i + 1) * 1000,
                method: "StreamContainers".into(),
                path: path.into(),
                cri_version: "v1".into(),
                kind: "streaming".into(),
                bytes: 100,
                items: Some(i + 1),
                json: serde_json::to_string(&list).expect("json"),
                redacted: true,
                ..Default::default()
            }))
            .to_string(),
        );
    }
    lines.push(
        json_line(&Event::Call(CallEvent {
            call_id: 5,
            start_unix_nanos: T0,
            method: "StreamContainers".into(),
            path: path.into(),
            cri_version: "v1".into(),
            kind: "streaming".into(),
            duration_micros: 6_000,
            code: Some(0),
            code_name: "OK".into(),
            messages: Some(MESSAGES),
            redacted: true,
            ..Default::default()
        }))
        .to_string(),
    );
    let capture = capture_of(dir.path(), &lines.join("\n"), 1);

    // The response's gRPC messages, as tshark's gRPC dissector sees them: the request's (empty)
    // and one per recorded message, on one stream.
    let grpc = tshark(&capture, &["http2.streamid", "grpc.message_length"]);
    let lengths: Vec<&str> = grpc
        .lines()
        .filter_map(|l| l.split_once('|'))
        .filter(|(_, len)| !len.is_empty())
        .map(|(_, len)| len)
        .collect();
    assert_eq!(lengths.len() as u64, 1 + MESSAGES, "{grpc}");
    // One stream (1), beside the connection's own frames (0).
    assert!(
        grpc.lines()
            .filter_map(|l| l.split('|').next())
            .flat_map(|ids| ids.split(','))
            .all(|id| id == "0" || id == "1" || id.is_empty()),
        "one stream: {grpc}"
    );
    let fields = tshark(
        &capture,
        &["protobuf.message.name", "protobuf.field.value.string"],
    );
    let responses = fields
        .lines()
        .filter(|l| l.contains("runtime.v1.StreamContainersResponse"))
        .count() as u64;
    assert_eq!(responses, MESSAGES, "{fields}");
    for i in 0..MESSAGES {
        assert!(fields.contains(&format!("container-{i}-{i}")), "{fields}");
    }
    // Each message's packet says what it was, and the stream ends with the call's status.
    let comments = tshark(&capture, &["frame.comment"]);
    assert!(
        comments.contains("call 5; message 3 of the stream, 100 bytes on the wire, 4 items"),
        "{comments}"
    );
    assert!(comments.contains("streamed: 4 messages"), "{comments}");
    let statuses = tshark(&capture, &["http2.header.name", "http2.header.value"]);
    assert!(statuses.contains("grpc-status"), "{statuses}");
}
