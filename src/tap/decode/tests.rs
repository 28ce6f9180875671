use super::*;
use k8s_cri::v1 as c;

fn field_bytes(number: u32, payload: &[u8]) -> Vec<u8> {
    let mut o = Vec::new();
    put_varint(&mut o, u64::from(number) << 3 | 2);
    put_varint(&mut o, payload.len() as u64);
    o.extend_from_slice(payload);
    o
}

fn create_request() -> c::CreateContainerRequest {
    c::CreateContainerRequest {
        pod_sandbox_id: "sb1".into(),
        config: Some(c::ContainerConfig {
            metadata: Some(c::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            image: Some(c::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            envs: vec![c::KeyValue {
                key: "DB_PASSWORD".into(),
                value: "hunter2".into(),
            }],
            labels: [("l".to_string(), "v".to_string())].into(),
            ..Default::default()
        }),
        sandbox_config: None,
    }
}

#[test]
fn known_message_has_no_unknown_fields() {
    let msg = create_request().encode_to_vec();
    let v = decode(Some(Rpc::CreateContainer), Dir::Request, &msg, true);
    assert_eq!(v["pod_sandbox_id"], "sb1");
    assert_eq!(v["config"]["envs"][0]["key"], "DB_PASSWORD");
    assert_eq!(v["config"]["envs"][0]["value"], redact::REDACTED);
    assert!(v.get("_unknown_fields").is_none(), "{v}");
    assert!(!v.to_string().contains("hunter2"));
    let v = decode(Some(Rpc::CreateContainer), Dir::Request, &msg, false);
    assert_eq!(v["config"]["envs"][0]["value"], "hunter2");
}

/// Issue #45 item 5: an env value that is not UTF-8 (`KeyValue.value` is `bytes` since cri-api
/// v0.34.10, kubernetes#139132) left the whole CreateContainer `_undecodable` ("invalid string
/// value: data is not UTF-8 encoded") with cri-api v0.32's `string`. It decodes, and its value
/// is still redacted.
#[test]
fn an_env_value_that_is_not_utf8_decodes_and_stays_redacted() {
    let mut msg = create_request().encode_to_vec();
    // A second `config` (field 2) merges into the first: one more env (6), key 1, value 2.
    let secret = [0xff, 0x00, 0xc3, b's', b'3', b'c', b'r', b'3', b't'];
    let env = [field_bytes(1, b"BINARY"), field_bytes(2, &secret)].concat();
    msg.extend_from_slice(&field_bytes(2, &field_bytes(6, &env)));
    let v = decode(Some(Rpc::CreateContainer), Dir::Request, &msg, true);
    assert!(v.get("_undecodable").is_none(), "{v}");
    assert_eq!(v["config"]["metadata"]["name"], "app", "{v}");
    assert_eq!(
        v["config"]["envs"],
        json!([
            {"key": "DB_PASSWORD", "value": redact::REDACTED},
            {"key": "BINARY", "value": redact::REDACTED},
        ])
    );
    assert!(v.get("_unknown_fields").is_none(), "{v}");
    let text = v.to_string();
    assert!(
        !text.contains("s3cr3t") && !text.contains("hunter2"),
        "{text}"
    );
    // Unredacted (`--unredacted`): text, the bytes that are not UTF-8 escaped.
    let v = decode(Some(Rpc::CreateContainer), Dir::Request, &msg, false);
    assert_eq!(v["config"]["envs"][0]["value"], "hunter2");
    assert_eq!(v["config"]["envs"][1]["value"], "\\xff\\x00\\xc3s3cr3t");
}

/// Issue #45 item 4: the streamed lists' messages (cri-api v0.36) decode with their types; a
/// StreamContainers message is one chunk of the list.
#[test]
fn streamed_list_messages_decode_with_their_types() {
    let chunk = c::ListContainersResponse {
        containers: vec![c::Container {
            id: "c1".into(),
            pod_sandbox_id: "sb1".into(),
            annotations: [("secret.example/x".to_string(), "v".to_string())].into(),
            ..Default::default()
        }],
    }
    .encode_to_vec();
    let v = decode(Some(Rpc::StreamContainers), Dir::Response, &chunk, true);
    assert!(v.get("_note").is_none(), "{v}");
    assert_eq!(v["containers"][0]["id"], "c1", "{v}");
    assert_eq!(
        v["containers"][0]["annotations"]["secret.example/x"],
        "<redacted: 1 bytes>"
    );
    for rpc in [
        Rpc::StreamPodSandboxes,
        Rpc::StreamContainerStats,
        Rpc::StreamPodSandboxStats,
        Rpc::StreamPodSandboxMetrics,
        Rpc::StreamImages,
        Rpc::UpdatePodSandboxResources,
    ] {
        for dir in [Dir::Request, Dir::Response] {
            let v = decode(Some(rpc), dir, &[], true);
            assert!(
                v.is_object() && v.get("_note").is_none(),
                "{rpc:?} {dir:?}: {v}"
            );
        }
    }
}

#[test]
fn unknown_fields_are_found_at_every_depth() {
    let mut msg = create_request().encode_to_vec();
    // Top level: field 999 (len) and field 77 (varint).
    msg.extend_from_slice(&field_bytes(999, b"top-secret-ish"));
    put_varint(&mut msg, 77 << 3);
    put_varint(&mut msg, 5);
    // Inside config.metadata (2.1): field 50.
    let nested = field_bytes(2, &field_bytes(1, &field_bytes(50, b"deep")));
    msg.extend_from_slice(&nested);
    let v = decode(Some(Rpc::CreateContainer), Dir::Request, &msg, true);
    let u = v["_unknown_fields"].as_array().unwrap();
    assert_eq!(u.len(), 3, "{v}");
    assert_eq!(u[0], json!({"field": 999, "wire_type": "len", "bytes": 14}));
    assert_eq!(
        u[1],
        json!({"field": 77, "wire_type": "varint", "bytes": 1})
    );
    assert_eq!(
        u[2],
        json!({"at": "2.1", "field": 50, "wire_type": "len", "bytes": 4})
    );
    // Known fields still decode (the nested merge keeps the name).
    assert_eq!(v["config"]["metadata"]["name"], "app");
    // Redacted: no values. Unredacted: values.
    assert!(!v.to_string().contains("top-secret-ish"));
    let v = decode(Some(Rpc::CreateContainer), Dir::Request, &msg, false);
    let u = v["_unknown_fields"].as_array().unwrap();
    assert_eq!(u[0]["value"], "top-secret-ish");
    assert_eq!(u[1]["value"], 5);
}

#[test]
fn known_fields_with_default_values_are_not_unknown() {
    // state = 0 explicitly encoded (proto3 encoders omit it; a sender may not).
    let mut msg = Vec::new();
    put_varint(&mut msg, 3 << 3);
    put_varint(&mut msg, 0);
    let v = decode(
        Some(Rpc::ContainerStatus),
        Dir::Response,
        &field_bytes(1, &msg),
        true,
    );
    assert!(v.get("_unknown_fields").is_none(), "{v}");
}

#[test]
fn strings_that_look_like_protobuf_are_not_walked() {
    // "\x08\x01" is a valid string and also a valid message (field 1 = 1).
    let req = c::VersionRequest {
        version: "\u{8}\u{1}".into(),
    };
    let v = decode(Some(Rpc::Version), Dir::Request, &req.encode_to_vec(), true);
    assert!(v.get("_unknown_fields").is_none(), "{v}");
}

#[test]
fn redacted_subtrees_report_nothing_not_even_unknowns() {
    let auth = [field_bytes(2, b"pw"), field_bytes(900, b"future-secret")].concat();
    let msg = [
        field_bytes(1, &field_bytes(1, b"img")),
        field_bytes(2, &auth),
    ]
    .concat();
    let v = decode(Some(Rpc::PullImage), Dir::Request, &msg, true);
    assert_eq!(v["auth"], redact::REDACTED);
    assert!(v.get("_unknown_fields").is_none(), "{v}");
    let v = decode(Some(Rpc::PullImage), Dir::Request, &msg, false);
    assert_eq!(
        v["_unknown_fields"][0],
        json!(
            {"at": "2", "field": 900, "wire_type": "len", "bytes": 13, "value": "future-secret"}
        )
    );
}

#[test]
fn undecodable_and_unknown_methods_show_structure_only() {
    // Field 1 of VersionRequest is a string: a varint there cannot decode.
    let mut bad = Vec::new();
    put_varint(&mut bad, 1 << 3);
    put_varint(&mut bad, 7);
    bad.extend_from_slice(&field_bytes(2, b"s3cret"));
    let v = decode(Some(Rpc::Version), Dir::Request, &bad, true);
    assert!(v["_undecodable"].is_string());
    assert_eq!(
        v["_fields"][1],
        json!({"field": 2, "wire_type": "len", "bytes": 6})
    );
    assert!(!v.to_string().contains("s3cret"));
    let v = decode(None, Dir::Request, &bad, true);
    assert!(v["_note"].is_string());
    assert!(!v.to_string().contains("s3cret"));
    let v = decode(None, Dir::Request, &bad, false);
    assert_eq!(v["_fields"][1]["value"], "s3cret");
}

#[test]
fn every_debug_redact_field_is_covered() {
    // Each AuthConfig field the CRI marks debug_redact, set to a marker, never shows.
    for (_, name, number) in redact::DEBUG_REDACT {
        let auth = field_bytes(*number, format!("marker-{name}").as_bytes());
        let msg = [
            field_bytes(1, &field_bytes(1, b"img")),
            field_bytes(2, &auth),
        ]
        .concat();
        let v = decode(Some(Rpc::PullImage), Dir::Request, &msg, true);
        assert!(!v.to_string().contains("marker-"), "{name}: {v}");
        let typed = c::PullImageRequest::decode(msg.as_slice()).unwrap();
        let json = serde_json::to_value(&typed).unwrap();
        assert_eq!(
            json["auth"][name],
            format!("marker-{name}"),
            "field {name} is number {number} in k8s-cri"
        );
    }
}

/// The JSON paths above are k8s-cri's serde names: a typed decode of a real message must put
/// the annotations where the rules look for them.
#[test]
fn manifest_rules_match_the_decoded_messages() {
    use k8s_cri::v1 as c;
    let applied = r#"{"apiVersion":"v1","kind":"Pod","spec":{"env":"S3cret"}}"#;
    let ann: std::collections::HashMap<String, String> = [(
        "kubectl.kubernetes.io/last-applied-configuration".to_string(),
        applied.to_string(),
    )]
    .into();
    let config = c::PodSandboxConfig {
        annotations: ann.clone(),
        ..Default::default()
    };
    let attrs = c::PodSandboxAttributes {
        id: "a".into(),
        annotations: ann.clone(),
        ..Default::default()
    };
    let stats = c::PodSandboxStats {
        attributes: Some(attrs),
        ..Default::default()
    };
    let msgs: Vec<(Rpc, Dir, Vec<u8>)> = vec![
        (
            Rpc::RunPodSandbox,
            Dir::Request,
            prost::Message::encode_to_vec(&c::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }),
        ),
        (
            Rpc::CreateContainer,
            Dir::Request,
            prost::Message::encode_to_vec(&c::CreateContainerRequest {
                sandbox_config: Some(config.clone()),
                ..Default::default()
            }),
        ),
        (
            Rpc::PullImage,
            Dir::Request,
            prost::Message::encode_to_vec(&c::PullImageRequest {
                sandbox_config: Some(config),
                ..Default::default()
            }),
        ),
        (
            Rpc::PodSandboxStatus,
            Dir::Response,
            prost::Message::encode_to_vec(&c::PodSandboxStatusResponse {
                status: Some(c::PodSandboxStatus {
                    annotations: ann.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        ),
        (
            Rpc::ListPodSandbox,
            Dir::Response,
            prost::Message::encode_to_vec(&c::ListPodSandboxResponse {
                items: vec![c::PodSandbox {
                    annotations: ann,
                    ..Default::default()
                }],
            }),
        ),
        (
            Rpc::PodSandboxStats,
            Dir::Response,
            prost::Message::encode_to_vec(&c::PodSandboxStatsResponse {
                stats: Some(stats.clone()),
            }),
        ),
        (
            Rpc::ListPodSandboxStats,
            Dir::Response,
            prost::Message::encode_to_vec(&c::ListPodSandboxStatsResponse { stats: vec![stats] }),
        ),
    ];
    for (rpc, dir, msg) in msgs {
        let shown = decode(Some(rpc), dir, &msg, true).to_string();
        assert!(
            !shown.contains("S3cret") && shown.contains("<redacted: "),
            "{rpc:?}: {shown}"
        );
        let raw = decode(Some(rpc), dir, &msg, false).to_string();
        assert!(raw.contains("S3cret"), "{rpc:?} unredacted: {raw}");
    }
}

/// Every CRI message kubelet or the runtime fills with a pod's annotations, or with a
/// command line, built as kubelet 1.26 sends them (the pod's annotations, among them
/// `kubectl apply`'s copy of the pod with an env value, copied into every ImageSpec; `$(VAR)`
/// expanded in args): the secret shows in none of them, redacted; known keys stay readable;
/// unredacted shows all.
#[test]
fn every_annotation_map_and_command_line_is_redacted_by_name() {
    use k8s_cri::v1 as c;
    const SECRET: &str = "S3cret-from-env";
    let applied = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","spec":{{"containers":[{{"env":[{{"name":"TOKEN","value":"{SECRET}"}}]}}]}}}}"#
    );
    let ann: std::collections::HashMap<String, String> = [
        (
            "kubectl.kubernetes.io/last-applied-configuration",
            applied.as_str(),
        ),
        ("example.com/note", SECRET),
        (
            "io.kubernetes.container.preStopHandler",
            &format!(r#"{{"exec":{{"command":["sh","-c","curl -H {SECRET}"]}}}}"#),
        ),
        ("crisp.dev/sidecars", "proxy"),
        ("io.kubernetes.container.restartCount", "2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let image = || {
        Some(c::ImageSpec {
            image: "registry.example/web:1".into(),
            annotations: ann.clone(),
            ..Default::default()
        })
    };
    let sandbox_config = || {
        Some(c::PodSandboxConfig {
            annotations: ann.clone(),
            ..Default::default()
        })
    };
    let sandbox_status = || c::PodSandboxStatus {
        id: "sb".into(),
        annotations: ann.clone(),
        ..Default::default()
    };
    let container_status = || c::ContainerStatus {
        id: "ctr".into(),
        image: image(),
        annotations: ann.clone(),
        ..Default::default()
    };
    let container_stats = || c::ContainerStats {
        attributes: Some(c::ContainerAttributes {
            id: "ctr".into(),
            annotations: ann.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox_stats = || c::PodSandboxStats {
        attributes: Some(c::PodSandboxAttributes {
            id: "sb".into(),
            annotations: ann.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let config = c::ContainerConfig {
        image: image(),
        annotations: ann.clone(),
        command: vec!["/bin/app".into(), format!("--token={SECRET}")],
        args: vec![format!("--password={SECRET}")],
        ..Default::default()
    };
    let cmd = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!("test {SECRET} = x"),
    ];
    fn e(m: &impl prost::Message) -> Vec<u8> {
        m.encode_to_vec()
    }
    let msgs: Vec<(Rpc, Dir, Vec<u8>)> = vec![
        (
            Rpc::RunPodSandbox,
            Dir::Request,
            e(&c::RunPodSandboxRequest {
                config: sandbox_config(),
                runtime_handler: String::new(),
            }),
        ),
        (
            Rpc::CreateContainer,
            Dir::Request,
            e(&c::CreateContainerRequest {
                pod_sandbox_id: "sb".into(),
                config: Some(config),
                sandbox_config: sandbox_config(),
            }),
        ),
        (
            Rpc::PullImage,
            Dir::Request,
            e(&c::PullImageRequest {
                image: image(),
                auth: None,
                sandbox_config: sandbox_config(),
            }),
        ),
        (
            Rpc::ImageStatus,
            Dir::Request,
            e(&c::ImageStatusRequest {
                image: image(),
                verbose: false,
            }),
        ),
        (
            Rpc::ImageStatus,
            Dir::Response,
            e(&c::ImageStatusResponse {
                image: Some(c::Image {
                    id: "sha256:1".into(),
                    spec: image(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        ),
        (
            Rpc::RemoveImage,
            Dir::Request,
            e(&c::RemoveImageRequest { image: image() }),
        ),
        (
            Rpc::ListImages,
            Dir::Request,
            e(&c::ListImagesRequest {
                filter: Some(c::ImageFilter { image: image() }),
            }),
        ),
        (
            Rpc::ListImages,
            Dir::Response,
            e(&c::ListImagesResponse {
                images: vec![c::Image {
                    id: "sha256:1".into(),
                    spec: image(),
                    ..Default::default()
                }],
            }),
        ),
        (
            Rpc::PodSandboxStatus,
            Dir::Response,
            e(&c::PodSandboxStatusResponse {
                status: Some(sandbox_status()),
                ..Default::default()
            }),
        ),
        (
            Rpc::ListPodSandbox,
            Dir::Response,
            e(&c::ListPodSandboxResponse {
                items: vec![c::PodSandbox {
                    id: "sb".into(),
                    annotations: ann.clone(),
                    ..Default::default()
                }],
            }),
        ),
        (
            Rpc::ContainerStatus,
            Dir::Response,
            e(&c::ContainerStatusResponse {
                status: Some(container_status()),
                ..Default::default()
            }),
        ),
        (
            Rpc::ListContainers,
            Dir::Response,
            e(&c::ListContainersResponse {
                containers: vec![c::Container {
                    id: "ctr".into(),
                    image: image(),
                    annotations: ann.clone(),
                    ..Default::default()
                }],
            }),
        ),
        (
            Rpc::ContainerStats,
            Dir::Response,
            e(&c::ContainerStatsResponse {
                stats: Some(container_stats()),
            }),
        ),
        (
            Rpc::ListContainerStats,
            Dir::Response,
            e(&c::ListContainerStatsResponse {
                stats: vec![container_stats()],
            }),
        ),
        (
            Rpc::PodSandboxStats,
            Dir::Response,
            e(&c::PodSandboxStatsResponse {
                stats: Some(sandbox_stats()),
            }),
        ),
        (
            Rpc::ListPodSandboxStats,
            Dir::Response,
            e(&c::ListPodSandboxStatsResponse {
                stats: vec![sandbox_stats()],
            }),
        ),
        (
            Rpc::GetContainerEvents,
            Dir::Response,
            e(&c::ContainerEventResponse {
                container_id: "ctr".into(),
                pod_sandbox_status: Some(sandbox_status()),
                containers_statuses: vec![container_status()],
                ..Default::default()
            }),
        ),
        (
            Rpc::ExecSync,
            Dir::Request,
            e(&c::ExecSyncRequest {
                container_id: "ctr".into(),
                cmd: cmd.clone(),
                timeout: 1,
            }),
        ),
        (
            Rpc::Exec,
            Dir::Request,
            e(&c::ExecRequest {
                container_id: "ctr".into(),
                cmd,
                stdout: true,
                ..Default::default()
            }),
        ),
    ];
    for (rpc, dir, msg) in msgs {
        let shown = decode(Some(rpc), dir, &msg, true).to_string();
        assert!(!shown.contains(SECRET), "{rpc:?} {dir:?}: {shown}");
        assert!(shown.contains("<redacted: "), "{rpc:?} {dir:?}: {shown}");
        if ![Rpc::ExecSync, Rpc::Exec].contains(&rpc) {
            // Known keys stay readable.
            assert!(
                shown.contains(r#""crisp.dev/sidecars":"proxy""#)
                    && shown.contains(r#""io.kubernetes.container.restartCount":"2""#),
                "{rpc:?} {dir:?}: {shown}"
            );
        }
        let raw = decode(Some(rpc), dir, &msg, false).to_string();
        assert!(raw.contains(SECRET), "{rpc:?} {dir:?} unredacted: {raw}");
    }
}

#[test]
fn log_lines_are_cut_on_a_char_boundary() {
    let msg = prost::Message::encode_to_vec(&k8s_cri::v1::VersionRequest {
        version: "ééééé".into(),
    });
    let spec = crate::cri::skim::SkimSpec {
        budget: 1 << 10,
        size_only: &[],
        items: None,
    };
    let view = crate::cri::skim::Skim::of_framed(spec, &crate::cri::wire::frame(&msg)).unwrap();
    let s = for_log(Some(Rpc::Version), Dir::Request, &view, 15);
    assert!(s.ends_with('…'), "{s}");
    assert!(s.len() <= 15 + '…'.len_utf8());
}
