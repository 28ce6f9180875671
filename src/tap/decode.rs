//! `crisp tap --full`: CRI messages decoded to JSON with the CRI's generated types
//! ([`crate::cri::api`], serde), then redacted ([`super::redact`]). v1alpha2 is decoded with the v1 types: the two are
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
        /// Decodes with the v1 type of `rpc`'s request or response ([`crate::cri::api`]): every
        /// method crisp routes has one. A streamed call's response is one of its messages.
        fn typed(rpc: Rpc, dir: Dir, msg: &[u8], redact: bool) -> Value {
            use crate::cri::api as c;
            match (rpc, dir) {
                $(
                    (Rpc::$rpc, Dir::Request) => with_type::<c::$req>(rpc, dir, msg, redact),
                    (Rpc::$rpc, Dir::Response) => with_type::<c::$resp>(rpc, dir, msg, redact),
                )*
            }
        }

        /// Encodes a decoded message (the JSON [`decode`] shows, redacted or not) back to
        /// protobuf with the same type, for a capture file (`crate::cli::pcap`); `None` when the
        /// JSON is not that type's (redaction replaces some values by their size).
        pub(crate) fn encode_json(rpc: Rpc, dir: Dir, json: &Value) -> Option<Vec<u8>> {
            use crate::cri::api as c;
            fn encode<T: Message + serde::de::DeserializeOwned>(json: &Value) -> Option<Vec<u8>> {
                serde_json::from_value::<T>(json.clone()).ok().map(|m| m.encode_to_vec())
            }
            match (rpc, dir) {
                $(
                    (Rpc::$rpc, Dir::Request) => encode::<c::$req>(json),
                    (Rpc::$rpc, Dir::Response) => encode::<c::$resp>(json),
                )*
            }
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
    UpdatePodSandboxResources => UpdatePodSandboxResourcesRequest, UpdatePodSandboxResourcesResponse;
    StreamPodSandboxes => StreamPodSandboxesRequest, StreamPodSandboxesResponse;
    StreamContainers => StreamContainersRequest, StreamContainersResponse;
    StreamContainerStats => StreamContainerStatsRequest, StreamContainerStatsResponse;
    StreamPodSandboxStats => StreamPodSandboxStatsRequest, StreamPodSandboxStatsResponse;
    StreamPodSandboxMetrics => StreamPodSandboxMetricsRequest, StreamPodSandboxMetricsResponse;
    StreamImages => StreamImagesRequest, StreamImagesResponse;
    ListImages => ListImagesRequest, ListImagesResponse;
    ImageStatus => ImageStatusRequest, ImageStatusResponse;
    PullImage => PullImageRequest, PullImageResponse;
    RemoveImage => RemoveImageRequest, RemoveImageResponse;
    ImageFsInfo => ImageFsInfoRequest, ImageFsInfoResponse;
}

/// Decodes one message to JSON, redacted unless `redact` is false. Never fails: what cannot be
/// decoded is shown as its wire structure (sizes only when redacting).
pub(crate) fn decode(rpc: Option<Rpc>, dir: Dir, msg: &[u8], redact: bool) -> Value {
    match rpc {
        Some(r) => typed(r, dir, msg, redact),
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

fn put_varint(out: &mut Vec<u8>, v: u64) {
    prost::encoding::encode_varint(v, out);
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
mod tests;
