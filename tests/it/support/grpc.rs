//! gRPC and protobuf helpers, independent of crisp's own code so they cannot share its bugs.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};

/// Frames `msg` as one uncompressed gRPC message.
pub fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

/// The message inside a body holding exactly one gRPC message.
pub fn grpc_unframe(body: &[u8]) -> &[u8] {
    assert!(
        body.len() >= 5,
        "body shorter than a gRPC prefix: {} bytes",
        body.len()
    );
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    assert_eq!(body.len(), 5 + len, "body is not exactly one gRPC message");
    &body[5..]
}

fn pb_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Appends a length-delimited protobuf field.
pub fn pb_bytes(buf: &mut Vec<u8>, field: u32, value: &[u8]) {
    pb_varint(buf, ((field as u64) << 3) | 2);
    pb_varint(buf, value.len() as u64);
    buf.extend_from_slice(value);
}

/// Appends a varint protobuf field.
pub fn pb_uint(buf: &mut Vec<u8>, field: u32, value: u64) {
    pb_varint(buf, (field as u64) << 3);
    pb_varint(buf, value);
}

/// A valid protobuf message that no CRI message fully describes: field 1 string, field 2
/// varint, a nested message, and field 999 (not in any CRI proto).
pub fn arbitrary_message(tag: &str) -> Vec<u8> {
    let mut m = Vec::new();
    pb_bytes(&mut m, 1, format!("id-{tag}").as_bytes());
    pb_uint(&mut m, 2, 42);
    let mut nested = Vec::new();
    pb_bytes(&mut nested, 1, b"nested-name");
    pb_bytes(&mut nested, 999, b"nested unknown field");
    pb_bytes(&mut m, 3, &nested);
    pb_bytes(&mut m, 999, b"\x00\xffunknown field 999 \xe2\x9c\x93");
    m
}

/// Every method of runtime.v1 and runtime.v1alpha2 RuntimeService and ImageService (v1.36 set for
/// v1, k8s-cri's proto for v1alpha2), as gRPC paths.
pub fn all_cri_paths() -> Vec<String> {
    // v1 has every v1alpha2 method, in the same order, and then its own.
    const V1ALPHA2_RUNTIME: &[&str] = &[
        "Version",
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "PodSandboxStatus",
        "ListPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
        "ListContainers",
        "ContainerStatus",
        "UpdateContainerResources",
        "ReopenContainerLog",
        "ExecSync",
        "Exec",
        "Attach",
        "PortForward",
        "ContainerStats",
        "ListContainerStats",
        "PodSandboxStats",
        "ListPodSandboxStats",
        "UpdateRuntimeConfig",
        "Status",
    ];
    const V1_ONLY_RUNTIME: &[&str] = &[
        "CheckpointContainer",
        "GetContainerEvents",
        "ListMetricDescriptors",
        "ListPodSandboxMetrics",
        "RuntimeConfig",
        "UpdatePodSandboxResources",
        "StreamPodSandboxes",
        "StreamContainers",
        "StreamContainerStats",
        "StreamPodSandboxStats",
        "StreamPodSandboxMetrics",
    ];
    const V1ALPHA2_IMAGE: &[&str] = &[
        "ListImages",
        "ImageStatus",
        "PullImage",
        "RemoveImage",
        "ImageFsInfo",
    ];
    const V1_ONLY_IMAGE: &[&str] = &["StreamImages"];
    let mut out = Vec::new();
    for (svc, list) in [
        (
            "runtime.v1.RuntimeService",
            V1ALPHA2_RUNTIME
                .iter()
                .chain(V1_ONLY_RUNTIME)
                .collect::<Vec<_>>(),
        ),
        (
            "runtime.v1.ImageService",
            V1ALPHA2_IMAGE.iter().chain(V1_ONLY_IMAGE).collect(),
        ),
        (
            "runtime.v1alpha2.RuntimeService",
            V1ALPHA2_RUNTIME.iter().collect(),
        ),
        (
            "runtime.v1alpha2.ImageService",
            V1ALPHA2_IMAGE.iter().collect(),
        ),
    ] {
        for m in list {
            out.push(format!("/{svc}/{m}"));
        }
    }
    out
}

/// Headers as an ordered list of (name, value) pairs, for exact comparison.
pub fn pairs(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    h.iter()
        .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
        .collect()
}

pub fn header_map(list: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in list {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_bytes(v).unwrap(),
        );
    }
    h
}

/// Response headers of a successful gRPC call.
pub fn grpc_headers() -> HeaderMap {
    header_map(&[("content-type", b"application/grpc")])
}

/// Trailers `grpc-status: 0`.
pub fn ok_trailers() -> HeaderMap {
    header_map(&[("grpc-status", b"0")])
}
