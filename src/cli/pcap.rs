//! `crisp tap --pcap FILE` and `crisp pcap` (issue #46): the calls of a tap, live or recorded,
//! as a pcapng capture that Wireshark and tshark open — each call an HTTP/2 stream of gRPC on one
//! synthetic TCP connection from kubelet to crisp, so their HTTP/2 and gRPC dissectors (with the
//! CRI's api.proto on the protobuf search path) decode it as they decode any gRPC.
//!
//! ```text
//!  tap event (JSON, as `crisp tap -o` records it)
//!     call ─▶ HEADERS :path (kubelet → crisp, at the call's start)
//!             DATA    the request, re-encoded from the tap's decoded view (`--full`), else empty
//!             HEADERS :status 200 · DATA the response · HEADERS grpc-status, grpc-message
//!                     (crisp → kubelet, at the call's end); a call kubelet gave up on: RST_STREAM
//!     hold ─▶ kept (per call id, bounded) and written as the call's comment
//!     message of a streamed response (issue #45) ─▶ at the first: the call's request and the
//!             HEADERS :status 200; each: one DATA frame with the message (crisp → kubelet, at
//!             its time); the call's event then ends the stream with its trailers
//! ```
//!
//! What the capture holds is what the tap showed: its redaction applies (a redacted field is
//! re-encoded as the tap printed it — `"<redacted>"`, never the value), and a message the tap did
//! not decode (without `--full`, or one k8s-cri has no type for) is an empty message with a
//! comment saying so. Each packet carries comments (pcapng `opt_comment`) with the pod, the
//! container, crisp's hold and the call's id. The tap records calls when they end, so the
//! packets of overlapping calls are in file order, not time order; their timestamps are the
//! calls' own. One interface, `crisp`, for the one socket the tap watches.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::time::Duration;

use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;
use serde_json::Value;

use crate::cri::Route;
use crate::proxy::http2::{self, encode_field, StreamId, PREFACE};
use crate::tap::decode::encode_json;
use crate::tap::redact::Dir;

/// kubelet's end of the synthetic connection.
pub const KUBELET_ADDR: ([u8; 4], u16) = ([127, 0, 0, 1], 40_000);
/// crisp's end: the port to tell Wireshark to decode as HTTP/2 (`-d tcp.port==50051,http2`).
pub const CRISP_ADDR: ([u8; 4], u16) = ([127, 0, 0, 2], 50_051);
/// Largest TCP payload of one packet (an IPv4 packet is at most 65,535 bytes).
const MAX_SEGMENT: usize = 65_000;
/// Hold descriptions kept for calls not yet ended (a tap shows at most this many at once in any
/// case; older ones are forgotten first).
const MAX_PENDING_HOLDS: usize = 4096;
/// Longest comment, in characters.
const MAX_COMMENT: usize = 1024;
/// Streamed calls whose messages are written and whose end is not yet (older ones are
/// forgotten first: their end then opens a stream of its own).
const MAX_OPEN_STREAMS: usize = 4096;

/// Why a capture could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    #[error("writing the capture: {0}")]
    Write(#[from] pcap_file::PcapError),
}

/// A pcapng capture being written: one synthetic connection, one HTTP/2 stream per call.
pub struct Capture<W: Write> {
    writer: PcapNgWriter<W>,
    /// Next sequence number of each direction (kubelet → crisp, crisp → kubelet).
    seq: [u32; 2],
    next_stream: u32,
    /// The latest hold event of each held call, until the call itself arrives.
    holds: HashMap<u64, String>,
    hold_order: VecDeque<u64>,
    /// Streamed calls whose messages are written, by call id: their stream and messages so far.
    open: HashMap<u64, (StreamId, u64)>,
    open_order: VecDeque<u64>,
    calls: u64,
}

/// Which way a packet goes.
#[derive(Clone, Copy)]
enum Way {
    ToCrisp,
    ToKubelet,
}

impl<W: Write> Capture<W> {
    /// Starts a capture: the section header, the interface, and the connection's preface and
    /// SETTINGS (written at `start`, the first event's time).
    pub fn new(out: W, start: Duration) -> Result<Capture<W>, PcapError> {
        let mut writer = PcapNgWriter::new(out)?;
        writer.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::IPV4,
            snaplen: 0,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Borrowed("crisp")),
                InterfaceDescriptionOption::IfDescription(Cow::Borrowed(
                    "CRI calls through crisp, as its tap saw them (synthetic TCP)",
                )),
                // pcap-file writes timestamps in nanoseconds.
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        })?;
        let mut capture = Capture {
            writer,
            seq: [1, 1],
            next_stream: 1,
            holds: HashMap::new(),
            hold_order: VecDeque::new(),
            open: HashMap::new(),
            open_order: VecDeque::new(),
            calls: 0,
        };
        let mut hello = PREFACE.to_vec();
        http2::Settings::default().encode(&mut hello);
        capture.packet(Way::ToCrisp, start, &hello, "kubelet's connection preface")?;
        let mut settings = Vec::new();
        http2::Settings::default().encode(&mut settings);
        capture.packet(Way::ToKubelet, start, &settings, "crisp's SETTINGS")?;
        Ok(capture)
    }

    /// Calls written so far.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Adds one tap event (a line of `crisp tap --json`): a call becomes an HTTP/2 stream, a
    /// hold is kept for its call's comment; anything else is skipped. Returns whether it wrote
    /// a call.
    pub fn event(&mut self, v: &Value) -> Result<bool, PcapError> {
        if v.get("hold").is_some() {
            self.hold(v);
            return Ok(false);
        }
        if v.get("event").and_then(Value::as_str) == Some("message") {
            self.message(v)?;
            return Ok(false);
        }
        // crisp's own snapshot at a recording's start is no call of kubelet's.
        if v.get("code_name").is_none()
            || v.get("method").is_none()
            || v.get("snapshot").is_some_and(|s| s == true)
        {
            return Ok(false);
        }
        self.call(v)?;
        Ok(true)
    }

    fn hold(&mut self, v: &Value) {
        let Some(id) = v.get("call_id").and_then(Value::as_u64) else {
            return;
        };
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
        let mut s = format!(
            "crisp held this call: {} waiting for {}",
            text("hold"),
            text("waiting_on")
        );
        for k in ["reason", "probe", "probe_result", "outcome"] {
            if !text(k).is_empty() {
                s.push_str(&format!("; {k}: {}", text(k)));
            }
        }
        if self.holds.insert(id, s).is_none() {
            self.hold_order.push_back(id);
            if self.hold_order.len() > MAX_PENDING_HOLDS {
                if let Some(old) = self.hold_order.pop_front() {
                    self.holds.remove(&old);
                }
            }
        }
    }

    /// One message of a streamed response: its own DATA frame on the call's stream, opened (the
    /// request, then the response's HEADERS) with the first.
    fn message(&mut self, v: &Value) -> Result<(), PcapError> {
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
        let Some(id) = v.get("call_id").and_then(Value::as_u64) else {
            return Ok(());
        };
        let at = timestamp(v).unwrap_or_default();
        let path = call_path(v);
        let rpc = Route::from_path(&path).rpc;
        let index = v.get("stream_message").and_then(Value::as_u64).unwrap_or(0);
        let stream = match self.open.get(&id) {
            Some(&(stream, _)) => stream,
            None => {
                let since = v
                    .get("since_start_ms")
                    .and_then(Value::as_f64)
                    .filter(|ms| ms.is_finite() && *ms >= 0.0)
                    .map_or(Duration::ZERO, |ms| {
                        Duration::from_secs_f64(ms.min(1e12) / 1e3)
                    });
                let stream = self.new_stream();
                let who = format!("call {id}");
                let (request, note) = body(rpc, Dir::Request, v.get("request"));
                self.request(
                    stream,
                    at.saturating_sub(since),
                    &path,
                    &request,
                    &format!("{who}; a streamed call; request {note}"),
                )?;
                let mut block = Vec::new();
                encode_field(&mut block, b":status", b"200");
                encode_field(&mut block, b"content-type", b"application/grpc");
                let mut out = Vec::new();
                http2::headers(&mut out, stream, &block, false);
                self.packet(
                    Way::ToKubelet,
                    at,
                    &out,
                    &format!("{who}; its response begins"),
                )?;
                self.open.insert(id, (stream, 0));
                self.open_order.push_back(id);
                if self.open_order.len() > MAX_OPEN_STREAMS {
                    if let Some(old) = self.open_order.pop_front() {
                        self.open.remove(&old);
                    }
                }
                stream
            }
        };
        if let Some(entry) = self.open.get_mut(&id) {
            entry.1 += 1;
        }
        let (msg, note) = body(rpc, Dir::Response, v.get("response"));
        let mut out = Vec::new();
        http2::data(&mut out, stream, &grpc_message(&msg), false);
        let mut comment = format!(
            "call {id}; message {index} of the stream, {} bytes on the wire",
            v.get("bytes").and_then(Value::as_u64).unwrap_or(0)
        );
        if let Some(n) = v.get("items").and_then(Value::as_u64) {
            comment.push_str(&format!(", {n} items"));
        }
        comment.push_str(&format!("; {} {note}", text("method")));
        self.packet(Way::ToKubelet, at, &out, &comment)
    }

    fn new_stream(&mut self) -> StreamId {
        let stream = StreamId::new(self.next_stream);
        self.next_stream = self.next_stream.saturating_add(2);
        stream
    }

    /// A call's request: HEADERS and DATA from kubelet, at `at`.
    fn request(
        &mut self,
        stream: StreamId,
        at: Duration,
        path: &str,
        request: &[u8],
        comment: &str,
    ) -> Result<(), PcapError> {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "crisp"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            encode_field(&mut block, name.as_bytes(), value.as_bytes());
        }
        let mut out = Vec::new();
        http2::headers(&mut out, stream, &block, false);
        http2::data(&mut out, stream, &grpc_message(request), true);
        self.packet(Way::ToCrisp, at, &out, comment)
    }

    fn call(&mut self, v: &Value) -> Result<(), PcapError> {
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("");
        let start = timestamp(v).unwrap_or_default();
        let duration = v
            .get("duration_ms")
            .and_then(Value::as_f64)
            .filter(|ms| ms.is_finite() && *ms >= 0.0)
            .map_or(Duration::ZERO, |ms| {
                Duration::from_secs_f64(ms.min(1e12) / 1e3)
            });
        let path = call_path(v);
        let rpc = Route::from_path(&path).rpc;
        let id = v.get("call_id").and_then(Value::as_u64).unwrap_or(0);
        // A streamed call whose messages are written already: only its end is left.
        let streamed = self.open.remove(&id);
        if streamed.is_some() {
            self.open_order.retain(|o| *o != id);
        }
        let stream = match streamed {
            Some((stream, _)) => stream,
            None => self.new_stream(),
        };
        self.calls += 1;

        let mut who = format!("call {id}");
        for (k, label) in [
            ("pod_namespace", " pod "),
            ("pod_name", "/"),
            ("container_name", " container "),
            ("container_id", " id "),
            ("image", " image "),
        ] {
            if !text(k).is_empty() {
                who.push_str(label);
                who.push_str(text(k));
            }
        }
        if let Some(held) = v
            .get("held_ms")
            .and_then(Value::as_f64)
            .filter(|h| *h > 0.0)
        {
            who.push_str(&format!("; held {held:.1} ms"));
        }
        let hold = self.holds.remove(&id);
        if hold.is_some() {
            self.hold_order.retain(|h| *h != id);
        }

        // The request: HEADERS and DATA from kubelet at the call's start (a streamed call's
        // went with its first message).
        if streamed.is_none() {
            let (request, request_note) = body(rpc, Dir::Request, v.get("request"));
            let mut comment = format!("{who}; request {request_note}");
            if let Some(h) = &hold {
                comment.push_str("; ");
                comment.push_str(h);
            }
            self.request(stream, start, &path, &request, &comment)?;
        }

        // The answer at the call's end: kubelet's reset if it gave up, else headers, the
        // response and the trailers.
        let end = start + duration;
        let mut out = Vec::new();
        let code = v.get("code").and_then(Value::as_i64);
        let Some(code) = code else {
            http2::RstStream::new(stream, http2::Reason::CANCEL).encode(&mut out);
            return self.packet(Way::ToCrisp, end, &out, &format!("{who}; kubelet gave up"));
        };
        let response_note = match streamed {
            Some((_, n)) => format!("streamed: {n} messages, each a DATA frame before this one"),
            None => {
                let mut block = Vec::new();
                encode_field(&mut block, b":status", b"200");
                encode_field(&mut block, b"content-type", b"application/grpc");
                http2::headers(&mut out, stream, &block, false);
                let (response, note) = body(rpc, Dir::Response, v.get("response"));
                if code == 0 {
                    http2::data(&mut out, stream, &grpc_message(&response), false);
                }
                note.to_string()
            }
        };
        let mut trailers = Vec::new();
        encode_field(&mut trailers, b"grpc-status", code.to_string().as_bytes());
        if !text("message").is_empty() {
            encode_field(
                &mut trailers,
                b"grpc-message",
                percent_encode(text("message")).as_bytes(),
            );
        }
        http2::headers(&mut out, stream, &trailers, true);
        let comment = format!(
            "{who}; {} ({code}); response {response_note}",
            text("code_name")
        );
        self.packet(Way::ToKubelet, end, &out, &comment)
    }

    /// Writes `payload` as TCP segments of one direction, the first with `comment`.
    fn packet(
        &mut self,
        way: Way,
        at: Duration,
        payload: &[u8],
        comment: &str,
    ) -> Result<(), PcapError> {
        let comment = crate::tenant::cut(comment, MAX_COMMENT);
        for (i, segment) in payload.chunks(MAX_SEGMENT).enumerate() {
            let (dir, from, to) = match way {
                Way::ToCrisp => (0, KUBELET_ADDR, CRISP_ADDR),
                Way::ToKubelet => (1, CRISP_ADDR, KUBELET_ADDR),
            };
            let (seq, ack) = (self.seq[dir], self.seq[1 - dir]);
            self.seq[dir] = seq.wrapping_add(segment.len() as u32);
            let data = ipv4_tcp(from, to, (seq, ack), segment);
            let options = if i == 0 {
                vec![EnhancedPacketOption::Comment(Cow::Borrowed(
                    comment.as_str(),
                ))]
            } else {
                Vec::new()
            };
            self.writer.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: at,
                original_len: data.len() as u32,
                data: Cow::Owned(data),
                options,
            })?;
        }
        Ok(())
    }

    /// Flushes what is written so far (a live capture stopped by Ctrl-C is then whole up to
    /// its last call).
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.writer.get_mut().flush()
    }

    /// The writer, flushed by the caller.
    pub fn into_inner(self) -> W {
        self.writer.into_inner()
    }
}

/// The gRPC path of a call or message event (older recordings have the method only).
fn call_path(v: &Value) -> String {
    match v.get("path").and_then(Value::as_str).unwrap_or("") {
        "" => format!(
            "/runtime.v1.RuntimeService/{}",
            v.get("method").and_then(Value::as_str).unwrap_or("")
        ),
        p => p.to_string(),
    }
}

/// The time of a tap event, since the Unix epoch.
pub fn timestamp(v: &Value) -> Option<Duration> {
    let time = humantime::parse_rfc3339(v.get("time")?.as_str()?).ok()?;
    time.duration_since(std::time::UNIX_EPOCH).ok()
}

/// The protobuf of a message the tap decoded (the recording's `"request"` or `"response"`
/// object), and what the capture says about it.
fn body(rpc: Option<crate::cri::Rpc>, dir: Dir, json: Option<&Value>) -> (Vec<u8>, &'static str) {
    match json {
        None => (
            Vec::new(),
            "not recorded (record with --full): an empty message stands for it",
        ),
        Some(object @ Value::Object(_)) => match rpc.and_then(|r| encode_json(r, dir, object)) {
            Some(bytes) => (
                bytes,
                "re-encoded from the tap's decoded view (redacted as shown)",
            ),
            None => (
                Vec::new(),
                "not re-encodable (redacted whole, or no CRI type): an empty message",
            ),
        },
        Some(_) => (
            Vec::new(),
            "not decodable by the tap: an empty message stands for it",
        ),
    }
}

/// A gRPC length-prefixed message, uncompressed.
fn grpc_message(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.len() + 5);
    out.push(0);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// grpc-message's percent-encoding: printable ASCII but `%` as is, everything else escaped.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One IPv4 packet with a TCP segment (PSH, ACK) carrying `payload`. The IPv4 checksum is
/// computed; the TCP one is left 0, which Wireshark does not check by default.
fn ipv4_tcp(
    (src, sport): ([u8; 4], u16),
    (dst, dport): ([u8; 4], u16),
    (seq, ack): (u32, u32),
    payload: &[u8],
) -> Vec<u8> {
    let total = 40 + payload.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    let mut sum: u32 = p
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&ack.to_be_bytes());
    p.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    p.extend_from_slice(payload);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 header checksum is the one's complement that makes the header sum to 0xffff.
    #[test]
    fn ip_header_checksums_to_all_ones() {
        let p = ipv4_tcp(KUBELET_ADDR, CRISP_ADDR, (1, 1), &[1, 2, 3]);
        let mut sum: u32 = p[..20]
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, p.len());
    }

    /// A payload larger than one packet is cut into segments whose sequence numbers follow on.
    #[test]
    fn large_payloads_become_consecutive_segments() {
        let mut c = Capture::new(Vec::new(), Duration::from_secs(1)).expect("capture");
        let before = c.seq[0];
        c.packet(
            Way::ToCrisp,
            Duration::from_secs(2),
            &vec![7; 150_000],
            "big",
        )
        .expect("packet");
        assert_eq!(c.seq[0].wrapping_sub(before), 150_000);
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("a b%\nç"), "a b%25%0A%C3%A7");
    }
    /// crisp's own snapshot at a recording's start (issue #46) is no call of kubelet's: no
    /// stream in the capture; the same line unmarked is one.
    #[test]
    fn snapshot_lines_are_no_calls() {
        let mut c = Capture::new(Vec::new(), Duration::from_secs(1)).expect("capture");
        let mut line = serde_json::json!({
            "call_id": 0, "time": "2026-11-28T23:29:00.000000Z", "cri_version": "v1",
            "method": "Version", "path": "/runtime.v1.RuntimeService/Version",
            "kind": "polling", "duration_ms": 1.0, "code": 0, "code_name": "OK",
            "snapshot": true,
        });
        assert!(!c.event(&line).expect("event"));
        assert_eq!(c.calls(), 0);
        line["snapshot"] = serde_json::json!(false);
        assert!(c.event(&line).expect("event"));
    }
}
