//! `crisp tap --full`: CRI messages decoded to JSON with k8s-cri's generated types (serde), then
//! redacted ([`super::redact`]). v1alpha2 is decoded with the v1 types: the two are
//! wire-identical (KUBELET-CRI.md §8.2).
//!
//! prost drops fields its types do not know, so a typed decode alone would hide exactly what a
//! debugger most needs to see (a newer kubelet's fields). Unknown fields are found with the wire
//! walker ([`crate::cri::patch::fields`]) and listed under `"_unknown_fields"`, at any depth:
//! for each field number seen at a path, a tiny probe message holding just that field at that
//! path is decoded with the same type and re-encoded — a field the type knows survives the round
//! trip, an unknown one vanishes (and a wire-type clash can only come from a known field). A
//! second probe tells messages (walked into) from strings and bytes (not walked).

use std::collections::HashMap;

use prost::Message;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::redact::{self, Dir};
use crate::cri::patch::{fields, Field};
use crate::cri::skim::Skim;
use crate::cri::Rpc;

/// Deepest nesting walked for unknown fields (CRI messages nest about 6 deep).
const MAX_DEPTH: usize = 32;
/// Longest unknown-field value shown (unredacted only).
const MAX_VALUE_BYTES: usize = 4096;

macro_rules! cri_types {
    ($($rpc:ident => $req:ident, $resp:ident;)*) => {
        /// Decodes with the k8s-cri v1 type of `rpc`'s request or response; `None` when k8s-cri
        /// has no type for the method (methods newer than the crate: Stream*,
        /// UpdatePodSandboxResources).
        fn typed(rpc: Rpc, dir: Dir, msg: &[u8], redact: bool) -> Option<Value> {
            use k8s_cri::v1 as c;
            Some(match (rpc, dir) {
                $(
                    (Rpc::$rpc, Dir::Request) => with_type::<c::$req>(rpc, dir, msg, redact),
                    (Rpc::$rpc, Dir::Response) => with_type::<c::$resp>(rpc, dir, msg, redact),
                )*
                _ => return None,
            })
        }
    };
}

cri_types! {
    Version => VersionRequest, VersionResponse;
    RunPodSandbox => RunPodSandboxRequest, RunPodSandboxResponse;
    StopPodSandbox => StopPodSandboxRequest, StopPodSandboxResponse;
    RemovePodSandbox => RemovePodSandboxRequest, RemovePodSandboxResponse;
    PodSandboxStatus => PodSandboxStatusRequest, PodSandboxStatusResponse;
    ListPodSandbox => ListPodSandboxRequest, ListPodSandboxResponse;
    CreateContainer => CreateContainerRequest, CreateContainerResponse;
    StartContainer => StartContainerRequest, StartContainerResponse;
    StopContainer => StopContainerRequest, StopContainerResponse;
    RemoveContainer => RemoveContainerRequest, RemoveContainerResponse;
    ListContainers => ListContainersRequest, ListContainersResponse;
    ContainerStatus => ContainerStatusRequest, ContainerStatusResponse;
    UpdateContainerResources => UpdateContainerResourcesRequest, UpdateContainerResourcesResponse;
    ReopenContainerLog => ReopenContainerLogRequest, ReopenContainerLogResponse;
    ExecSync => ExecSyncRequest, ExecSyncResponse;
    Exec => ExecRequest, ExecResponse;
    Attach => AttachRequest, AttachResponse;
    PortForward => PortForwardRequest, PortForwardResponse;
    ContainerStats => ContainerStatsRequest, ContainerStatsResponse;
    ListContainerStats => ListContainerStatsRequest, ListContainerStatsResponse;
    PodSandboxStats => PodSandboxStatsRequest, PodSandboxStatsResponse;
    ListPodSandboxStats => ListPodSandboxStatsRequest, ListPodSandboxStatsResponse;
    UpdateRuntimeConfig => UpdateRuntimeConfigRequest, UpdateRuntimeConfigResponse;
    Status => StatusRequest, StatusResponse;
    CheckpointContainer => CheckpointContainerRequest, CheckpointContainerResponse;
    GetContainerEvents => GetEventsRequest, ContainerEventResponse;
    ListMetricDescriptors => ListMetricDescriptorsRequest, ListMetricDescriptorsResponse;
    ListPodSandboxMetrics => ListPodSandboxMetricsRequest, ListPodSandboxMetricsResponse;
    RuntimeConfig => RuntimeConfigRequest, RuntimeConfigResponse;
    ListImages => ListImagesRequest, ListImagesResponse;
    ImageStatus => ImageStatusRequest, ImageStatusResponse;
    PullImage => PullImageRequest, PullImageResponse;
    RemoveImage => RemoveImageRequest, RemoveImageResponse;
    ImageFsInfo => ImageFsInfoRequest, ImageFsInfoResponse;
}

/// Decodes one message to JSON, redacted unless `redact` is false. Never fails: what cannot be
/// decoded is shown as its wire structure (sizes only when redacting).
pub(crate) fn decode(rpc: Option<Rpc>, dir: Dir, msg: &[u8], redact: bool) -> Value {
    match rpc.and_then(|r| typed(r, dir, msg, redact)) {
        Some(v) => v,
        None => {
            let mut v = wire_dump(msg, redact);
            v.insert(
                "_note".into(),
                Value::String("no CRI type known for this method: wire structure only".into()),
            );
            Value::Object(v)
        }
    }
}

/// Decodes the view of a message ([`Skim`]): its kept fields as [`decode`] does, and what was
/// cut shown by its size from the wire — under its name where a redaction rule names the field
/// (ExecSync's `"stdout": "<16777216 bytes>"`), else listed under `"_truncated"` with what
/// the view holds of the message.
pub(crate) fn decode_skim(rpc: Option<Rpc>, dir: Dir, skim: &Skim, redact: bool) -> Value {
    let mut v = decode(rpc, dir, &skim.kept, redact);
    let mut unnamed = Vec::new();
    for c in &skim.cut {
        match rpc.and_then(|r| redact::cut_field(r, dir, c.number, c.len)) {
            Some((name, shown)) => {
                if let Value::Object(m) = &mut v {
                    m.insert(name.into(), shown);
                }
            }
            None => unnamed.push(json!({
                "field": c.number,
                "wire_type": wire_type_name(c.wire_type),
                "bytes": c.len,
            })),
        }
    }
    let more = skim.cut_more > 0;
    if !unnamed.is_empty() || more || skim.stopped.is_some() || skim.compressed {
        let mut t = Map::new();
        t.insert("message_bytes".into(), json!(skim.len));
        t.insert("shown_bytes".into(), json!(skim.kept.len()));
        if !unnamed.is_empty() {
            t.insert("fields".into(), Value::Array(unnamed));
        }
        if more {
            t.insert("more_fields".into(), json!(skim.cut_more));
            t.insert("more_bytes".into(), json!(skim.cut_more_bytes));
        }
        if let Some(why) = skim.stopped {
            t.insert("stopped".into(), json!(why));
        }
        if skim.compressed {
            t.insert("compressed".into(), json!(true));
        }
        if let Value::Object(m) = &mut v {
            m.insert("_truncated".into(), Value::Object(t));
        }
    }
    v
}

fn with_type<T: Message + Default + Serialize>(
    rpc: Rpc,
    dir: Dir,
    msg: &[u8],
    redact: bool,
) -> Value {
    let t = match T::decode(msg) {
        Ok(t) => t,
        Err(e) => {
            let mut v = wire_dump(msg, redact);
            v.insert("_undecodable".into(), Value::String(e.to_string()));
            return Value::Object(v);
        }
    };
    let mut v = match serde_json::to_value(&t) {
        Ok(v) => v,
        Err(e) => json!({ "_unserializable": e.to_string() }),
    };
    redact::apply(rpc, dir, &mut v, redact);
    let skip: Vec<&[u32]> = if redact {
        redact::redacted_wire_paths(rpc, dir).collect()
    } else {
        Vec::new()
    };
    let unknown = unknown_fields::<T>(msg, &skip, redact);
    if !unknown.is_empty() {
        if let Value::Object(m) = &mut v {
            m.insert("_unknown_fields".into(), Value::Array(unknown));
        }
    }
    v
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Unknown,
    /// Known, and not a message (or not one worth walking: a string, bytes, a packed list).
    Scalar,
    Message,
}

/// Every field of `msg` (at any depth) that `T` does not know, as JSON.
fn unknown_fields<T: Message + Default>(
    msg: &[u8],
    skip: &[&[u32]],
    with_values: bool,
) -> Vec<Value> {
    let mut cache: HashMap<Vec<u32>, HashMap<(u32, u8), Class>> = HashMap::new();
    let mut out = Vec::new();
    let mut path = Vec::new();
    walk::<T>(msg, &mut path, skip, with_values, &mut cache, &mut out);
    out
}

fn walk<T: Message + Default>(
    buf: &[u8],
    path: &mut Vec<u32>,
    skip: &[&[u32]],
    redact: bool,
    cache: &mut HashMap<Vec<u32>, HashMap<(u32, u8), Class>>,
    out: &mut Vec<Value>,
) {
    for f in fields(buf) {
        // The typed decode succeeded, so the structure is valid at every level it knows; a
        // failure here is a group (wire types 3/4) crisp's walker does not follow.
        let Ok(f) = f else {
            out.push(json!({ "at": path_string(path), "_unwalkable": "wire structure not followed further (groups?)" }));
            return;
        };
        let class = match cache
            .get(path.as_slice())
            .and_then(|m| m.get(&(f.number, f.wire_type)))
        {
            Some(c) => *c,
            None => {
                let c = classify::<T>(path, f.number, f.wire_type);
                cache
                    .entry(path.clone())
                    .or_default()
                    .insert((f.number, f.wire_type), c);
                c
            }
        };
        match class {
            Class::Unknown => out.push(describe(buf, &f, path, redact)),
            Class::Scalar => {}
            Class::Message => {
                path.push(f.number);
                if path.len() <= MAX_DEPTH && !skip.contains(&path.as_slice()) {
                    walk::<T>(
                        &buf[f.payload.0..f.payload.1],
                        path,
                        skip,
                        redact,
                        cache,
                        out,
                    );
                }
                path.pop();
            }
        }
    }
}

fn classify<T: Message + Default>(path: &[u32], number: u32, wire_type: u8) -> Class {
    let mut leaf = Vec::new();
    put_varint(&mut leaf, u64::from(number) << 3 | u64::from(wire_type));
    match wire_type {
        0 => leaf.push(1),
        1 => leaf.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]),
        5 => leaf.extend_from_slice(&[1, 0, 0, 0]),
        // Field 1 = varint 1: a non-empty value for a string, bytes, a packed list or a message.
        _ => leaf.extend_from_slice(&[2, 0x08, 0x01]),
    }
    // A clash between the probe and the type (wrong wire type, invalid UTF-8) means the type
    // declares this number: prost skips unknown fields without looking at them.
    let known = match T::decode(wrap(path, leaf).as_slice()) {
        Ok(t) => present_at(&t.encode_to_vec(), path, number),
        Err(_) => true,
    };
    if !known {
        return Class::Unknown;
    }
    if wire_type != 2 {
        return Class::Scalar;
    }
    // Payload 0x07 (field 0, wire type 7) is valid as a string, bytes or packed varints but
    // never as a message: only a message field fails to decode it.
    let mut leaf = Vec::new();
    put_varint(&mut leaf, u64::from(number) << 3 | 2);
    leaf.extend_from_slice(&[1, 0x07]);
    match T::decode(wrap(path, leaf).as_slice()) {
        Ok(_) => Class::Scalar,
        Err(_) => Class::Message,
    }
}

/// A message with `leaf` nested at `path` (one length-delimited field per level).
fn wrap(path: &[u32], leaf: Vec<u8>) -> Vec<u8> {
    path.iter().rev().fold(leaf, |inner, n| {
        let mut o = Vec::with_capacity(inner.len() + 8);
        put_varint(&mut o, u64::from(*n) << 3 | 2);
        put_varint(&mut o, inner.len() as u64);
        o.extend_from_slice(&inner);
        o
    })
}

/// Whether field `number` exists at `path` in an encoded message.
fn present_at(buf: &[u8], path: &[u32], number: u32) -> bool {
    let mut cur = buf;
    for p in path {
        let next = fields(cur)
            .filter_map(Result::ok)
            .find(|f| f.number == *p && f.wire_type == 2);
        match next {
            Some(f) => cur = &cur[f.payload.0..f.payload.1],
            None => return false,
        }
    }
    fields(cur)
        .filter_map(Result::ok)
        .any(|f| f.number == number)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn path_string(path: &[u32]) -> String {
    path.iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(".")
}

fn wire_type_name(t: u8) -> &'static str {
    match t {
        0 => "varint",
        1 => "fixed64",
        2 => "len",
        5 => "fixed32",
        _ => "group",
    }
}

/// One field as `{at, field, wire_type, bytes}` — plus its value only when not redacting.
fn describe(buf: &[u8], f: &Field, path: &[u32], redact: bool) -> Value {
    let payload = &buf[f.payload.0..f.payload.1];
    let mut m = Map::new();
    if !path.is_empty() {
        m.insert("at".into(), Value::String(path_string(path)));
    }
    m.insert("field".into(), json!(f.number));
    m.insert("wire_type".into(), json!(wire_type_name(f.wire_type)));
    m.insert("bytes".into(), json!(payload.len()));
    if !redact {
        m.insert("value".into(), raw_value(f.wire_type, payload));
    }
    Value::Object(m)
}

fn raw_value(wire_type: u8, payload: &[u8]) -> Value {
    match wire_type {
        0 => {
            let v = payload
                .iter()
                .rev()
                .fold(0u64, |acc, b| acc << 7 | u64::from(b & 0x7f));
            json!(v)
        }
        2 => match std::str::from_utf8(payload) {
            Ok(s) if s.len() <= MAX_VALUE_BYTES => json!(s),
            _ => json!(format!(
                "0x{}",
                hex(&payload[..payload.len().min(MAX_VALUE_BYTES)])
            )),
        },
        _ => json!(format!("0x{}", hex(payload))),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The top-level wire structure of a message no type describes.
fn wire_dump(msg: &[u8], redact: bool) -> Map<String, Value> {
    let mut list = Vec::new();
    let mut err = None;
    for f in fields(msg) {
        match f {
            Ok(f) => list.push(describe(msg, &f, &[], redact)),
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    let mut m = Map::new();
    m.insert("_fields".into(), Value::Array(list));
    if let Some(e) = err {
        m.insert("_wire_error".into(), Value::String(e));
    }
    m
}

/// A message as one redacted JSON line for a log, cut at `max` bytes: the only way crisp puts a
/// message in its log (DESIGN.md §6: never Debug-print a CRI message).
pub(crate) fn for_log(
    rpc: Option<Rpc>,
    dir: Dir,
    msg: &crate::cri::skim::Skim,
    max: usize,
) -> String {
    let v = decode_skim(rpc, dir, msg, true);
    let mut s = v.to_string();
    crate::status::truncate_text(&mut s, max);
    s
}

#[cfg(test)]
mod tests {
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
        let v = decode(Some(Rpc::StreamContainers), Dir::Request, &bad, false);
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
                prost::Message::encode_to_vec(&c::ListPodSandboxStatsResponse {
                    stats: vec![stats],
                }),
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
        };
        let view = crate::cri::skim::Skim::of_framed(spec, &crate::cri::wire::frame(&msg)).unwrap();
        let s = for_log(Some(Rpc::Version), Dir::Request, &view, 15);
        assert!(s.ends_with('…'), "{s}");
        assert!(s.len() <= 15 + '…'.len_utf8());
    }
}
