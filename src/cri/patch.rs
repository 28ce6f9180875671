//! In-place patching of protobuf wire bytes, without decoding and re-encoding the message.
//!
//! Job mode reports a sidecar that crisp terminated as `exit_code 0, reason "Completed"`
//! (DESIGN.md §5). The patch walks the top-level fields of a response, finds the embedded
//! ContainerStatus messages whose `id` is in the set, and appends to each one the two fields
//! (protobuf: for a scalar the last occurrence wins, for an embedded message occurrences merge).
//! Every other byte of the message — unknown fields included — is kept as it was; only the
//! length prefixes of the patched embedded messages change.

use bytes::Bytes;

use super::tags::container_status;
use super::varint::{self, VarintError};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("truncated message")]
    Truncated,
    #[error("varint too long")]
    Varint,
    #[error("unsupported wire type {0}")]
    WireType(u8),
}

impl From<VarintError> for WireError {
    fn from(e: VarintError) -> Self {
        match e {
            VarintError::Truncated => WireError::Truncated,
            VarintError::TooLong => WireError::Varint,
        }
    }
}

/// The varint at `pos`, moving `pos` past it.
fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, WireError> {
    let (value, len) = varint::decode(buf.get(*pos..).unwrap_or_default())?;
    *pos += len;
    Ok(value)
}

/// One top-level field: its number, wire type and the byte ranges of the whole field and (for
/// length-delimited fields) of its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub number: u32,
    pub wire_type: u8,
    pub start: usize,
    pub end: usize,
    pub payload: (usize, usize),
}

/// Iterates over the top-level fields of a message.
pub fn fields(buf: &[u8]) -> impl Iterator<Item = Result<Field, WireError>> + '_ {
    let mut pos = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= buf.len() {
            return None;
        }
        let start = pos;
        let r = (|| {
            let key = read_varint(buf, &mut pos)?;
            let wire_type = (key & 7) as u8;
            let number = (key >> 3) as u32;
            let payload = match wire_type {
                0 => {
                    let s = pos;
                    read_varint(buf, &mut pos)?;
                    (s, pos)
                }
                1 | 5 => {
                    let n = if wire_type == 1 { 8 } else { 4 };
                    if buf.len() < pos + n {
                        return Err(WireError::Truncated);
                    }
                    pos += n;
                    (pos - n, pos)
                }
                2 => {
                    let len = read_varint(buf, &mut pos)? as usize;
                    let end = pos
                        .checked_add(len)
                        .filter(|e| *e <= buf.len())
                        .ok_or(WireError::Truncated)?;
                    let s = pos;
                    pos = end;
                    (s, end)
                }
                t => return Err(WireError::WireType(t)),
            };
            Ok(Field {
                number,
                wire_type,
                start,
                end: pos,
                payload,
            })
        })();
        if r.is_err() {
            failed = true;
        }
        Some(r)
    })
}

/// String field `number` of a message, if any (e.g. a ContainerStatus's `id`). Like every
/// protobuf decoder (kubelet's included), the last occurrence wins: the id crisp matches must be
/// the id kubelet sees, or it would patch the status of another container.
pub fn string_field(buf: &[u8], number: u32) -> Option<&str> {
    let mut last = None;
    for f in fields(buf) {
        let f = f.ok()?;
        if f.number == number && f.wire_type == 2 {
            last = Some(std::str::from_utf8(&buf[f.payload.0..f.payload.1]).ok()?);
        }
    }
    last
}

/// ContainerStatus `exit_code` = 0 and `reason` = "Completed".
pub fn completed_fragment() -> Vec<u8> {
    const REASON: &[u8] = b"Completed";
    let mut f = Vec::with_capacity(4 + REASON.len());
    varint::encode(u64::from(container_status::EXIT_CODE << 3), &mut f);
    varint::encode(0, &mut f);
    varint::encode(u64::from(container_status::REASON << 3 | 2), &mut f);
    varint::encode(REASON.len() as u64, &mut f);
    f.extend_from_slice(REASON);
    f
}

/// Rewrites every embedded message in top-level field `field` (a ContainerStatus, or a
/// repeated list of them) whose `id` satisfies `matches`, by appending
/// `fragment` to it. Returns `None` when nothing matched (the caller forwards the original).
pub fn patch_embedded(
    msg: &[u8],
    field: u32,
    fragment: &[u8],
    matches: impl Fn(&str) -> bool,
) -> Result<Option<Bytes>, WireError> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0usize;
    for f in fields(msg) {
        let f = f?;
        if f.number != field || f.wire_type != 2 {
            continue;
        }
        let inner = &msg[f.payload.0..f.payload.1];
        let Some(id) = string_field(inner, container_status::ID) else {
            continue;
        };
        if !matches(id) {
            continue;
        }
        let o = out.get_or_insert_with(|| Vec::with_capacity(msg.len() + 32));
        o.extend_from_slice(&msg[copied..f.start]);
        varint::encode(u64::from(field << 3 | 2), o);
        varint::encode((inner.len() + fragment.len()) as u64, o);
        o.extend_from_slice(inner);
        o.extend_from_slice(fragment);
        copied = f.end;
    }
    Ok(out.map(|mut o| {
        o.extend_from_slice(&msg[copied..]);
        Bytes::from(o)
    }))
}

/// Appends `field = value` (varint) to a message: protobuf's "last value wins" makes this the
/// smallest possible patch of a scalar without re-encoding (used for StopContainer's timeout).
pub(crate) fn append_varint_field(msg: &[u8], field: u32, value: i64) -> Bytes {
    let mut out = Vec::with_capacity(msg.len() + 11);
    out.extend_from_slice(msg);
    prost::encoding::encode_key(field, prost::encoding::WireType::Varint, &mut out);
    varint::encode(value as u64, &mut out);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_field_wins_and_keeps_the_rest() {
        let orig = crate::cri::views::ContainerIdRequest {
            container_id: "abc".into(),
            timeout: 30,
        }
        .encode_to_vec();
        let patched =
            append_varint_field(&orig, crate::cri::tags::stop_container_request::TIMEOUT, 7);
        assert_eq!(
            &patched[..orig.len()],
            &orig[..],
            "original bytes are kept as a prefix"
        );
        let v = crate::cri::views::ContainerIdRequest::decode(&patched[..]).unwrap();
        assert_eq!(v.container_id, "abc");
        assert_eq!(v.timeout, 7);
    }

    #[test]
    fn walks_all_wire_types() {
        // field 1 varint 150, field 2 fixed64, field 3 bytes "hi", field 4 fixed32
        let mut m = vec![0x08, 0x96, 0x01, 0x11];
        m.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        m.extend_from_slice(&[0x1a, 2, b'h', b'i', 0x25, 9, 9, 9, 9]);
        let fs: Vec<_> = fields(&m).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            fs.iter().map(|f| f.number).collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
        assert_eq!(string_field(&m, 3), Some("hi"));
        assert_eq!(
            fields(&m[..m.len() - 1]).last(),
            Some(Err(WireError::Truncated))
        );
        assert_eq!(fields(&[0x0b]).next(), Some(Err(WireError::WireType(3))));
        assert_eq!(
            fields(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])
                .next(),
            Some(Err(WireError::Varint))
        );
        // A length that runs past the end is an error, not a panic.
        assert_eq!(
            fields(&[0x1a, 0xff, 0x7f]).next(),
            Some(Err(WireError::Truncated))
        );
    }

    #[test]
    fn nothing_to_patch_returns_none() {
        let m = vec![0x0a, 3, 0x0a, 1, b'x'];
        assert_eq!(
            patch_embedded(&m, 1, &completed_fragment(), |id| id == "y"),
            Ok(None)
        );
    }

    use k8s_cri::v1 as cri;
    use prost::Message;

    fn status(id: &str, code: i32, reason: &str) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: id.into(),
            metadata: Some(cri::ContainerMetadata {
                name: format!("n-{id}"),
                attempt: 2,
            }),
            state: cri::ContainerState::ContainerExited as i32,
            created_at: 1,
            started_at: 2,
            finished_at: 3,
            exit_code: code,
            reason: reason.into(),
            message: "m".into(),
            labels: [("a".to_string(), "b".to_string())].into(),
            image_ref: "sha256:x".into(),
            ..Default::default()
        }
    }

    #[test]
    fn completed_fragment_is_exit_code_0_and_reason_completed() {
        assert_eq!(completed_fragment(), b"\x38\x00\x52\x09Completed");
        let s = cri::ContainerStatus::decode(&completed_fragment()[..]).unwrap();
        assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    }

    #[test]
    fn patches_container_status_response_and_keeps_unknown_fields() {
        let resp = cri::ContainerStatusResponse {
            status: Some(status("c1", 143, "Error")),
            info: [("k".to_string(), "v".to_string())].into(),
        };
        let mut bytes = resp.encode_to_vec();
        // An unknown top-level field from a future CRI must survive untouched.
        bytes.extend_from_slice(&[0xba, 0x3e, 3, b'n', b'e', b'w']); // field 999, "new"
        let patched = patch_embedded(
            &bytes,
            crate::cri::tags::container_status_response::STATUS,
            &completed_fragment(),
            |id| id == "c1",
        )
        .unwrap()
        .unwrap();
        assert!(patched.ends_with(&[0xba, 0x3e, 3, b'n', b'e', b'w']));
        let got = cri::ContainerStatusResponse::decode(&patched[..]).unwrap();
        let mut want = resp.clone();
        want.status.as_mut().unwrap().exit_code = 0;
        want.status.as_mut().unwrap().reason = "Completed".into();
        assert_eq!(got, want);
    }

    #[test]
    fn patches_only_matching_elements_of_a_repeated_field() {
        let resp = cri::PodSandboxStatusResponse {
            status: Some(cri::PodSandboxStatus {
                id: "sb".into(),
                ..Default::default()
            }),
            containers_statuses: vec![
                status("app", 0, "Completed"),
                status("side", 137, "Error"),
                status("other", 1, "Error"),
            ],
            timestamp: 42,
            ..Default::default()
        };
        let bytes = resp.encode_to_vec();
        let patched = patch_embedded(
            &bytes,
            crate::cri::tags::pod_sandbox_status_response::CONTAINERS_STATUSES,
            &completed_fragment(),
            |id| id == "side",
        )
        .unwrap()
        .unwrap();
        let got = cri::PodSandboxStatusResponse::decode(&patched[..]).unwrap();
        let mut want = resp.clone();
        want.containers_statuses[1].exit_code = 0;
        want.containers_statuses[1].reason = "Completed".into();
        assert_eq!(got, want);
        // The crashed-on-its-own container keeps its real status.
        assert_eq!(got.containers_statuses[2].exit_code, 1);
    }
}
