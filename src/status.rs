//! gRPC status values crisp itself produces, mapped to the wire in exactly one place. A runtime's
//! own status is never rebuilt: it passes through verbatim (DESIGN.md §1).

use http::{HeaderMap, HeaderValue, Response};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

/// gRPC status codes used by crisp.
pub(crate) mod code {
    pub(crate) const OK: i32 = 0;
    pub(crate) const CANCELLED: i32 = 1;
    pub(crate) const UNKNOWN: i32 = 2;
    pub(crate) const DEADLINE_EXCEEDED: i32 = 4;
    pub(crate) const NOT_FOUND: i32 = 5;
    pub(crate) const FAILED_PRECONDITION: i32 = 9;
    pub(crate) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(crate) const INTERNAL: i32 = 13;
    pub(crate) const UNAVAILABLE: i32 = 14;
}

/// A status crisp answers with on its own behalf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl Status {
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
        }
    }

    /// Headers (or trailers) carrying this status.
    pub(crate) fn to_header_map(&self) -> HeaderMap {
        let mut h = HeaderMap::with_capacity(3);
        h.insert("grpc-status", HeaderValue::from(self.code));
        let msg = utf8_percent_encode(&self.message, GRPC_MESSAGE).to_string();
        if let Ok(v) = HeaderValue::from_str(&msg) {
            h.insert("grpc-message", v);
        }
        h
    }

    /// A trailers-only gRPC response (a single HEADERS frame with END_STREAM), the form grpc-go
    /// uses for errors.
    pub(crate) fn to_response<B: Default>(&self) -> Response<B> {
        let mut resp = Response::new(B::default());
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        h.extend(self.to_header_map());
        resp
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "code {}: {}", self.code, self.message)
    }
}

/// How the runtime failed a call that crisp then answers UNAVAILABLE. [`runtime_lost`] writes
/// the message: the one place its words are chosen (DESIGN.md §1). `upstream` in them is the
/// config key that names the runtime's socket, so an operator finds it in their config.
#[derive(Clone, Copy)]
pub(crate) enum RuntimeLoss<'a> {
    /// The connection to the runtime failed while the call was being written.
    Failed(&'a dyn std::fmt::Display),
    /// The connection failed while the runtime was answering.
    FailedMidResponse(&'a dyn std::fmt::Display),
    /// The runtime sent GOAWAY and closed the connection.
    Closed,
}

/// The runtime as crisp's messages name it: `upstream unix:///run/containerd/containerd.sock`,
/// or `upstream` where its socket is not known. The one place these words are written: the
/// runtime pool's errors and [`runtime_lost`] both say them.
#[derive(Clone, Copy)]
pub(crate) struct RuntimeAt<'a>(Option<&'a dyn std::fmt::Display>);

impl<'a> RuntimeAt<'a> {
    /// The runtime listening at `path`.
    pub(crate) fn path(path: &'a dyn std::fmt::Display) -> RuntimeAt<'a> {
        RuntimeAt(Some(path))
    }
}

impl std::fmt::Display for RuntimeAt<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(path) => write!(f, "upstream unix://{path}"),
            None => f.write_str("upstream"),
        }
    }
}

/// The grpc-message of an UNAVAILABLE crisp answers when the runtime at `socket` (a path, or
/// `None` when it is not known here) failed a call the way `how` says.
pub(crate) fn runtime_lost(socket: Option<&dyn std::fmt::Display>, how: RuntimeLoss<'_>) -> String {
    let at = RuntimeAt(socket);
    match how {
        RuntimeLoss::Failed(why) => format!("crisp: {at} failed: {why}"),
        RuntimeLoss::FailedMidResponse(why) => format!("crisp: {at} failed mid-response: {why}"),
        RuntimeLoss::Closed => format!("crisp: {at} closed the connection (GOAWAY)"),
    }
}

impl Status {
    /// UNAVAILABLE for a call crisp could not hand to the runtime at all (connecting, the
    /// handshake, sending): `e` names the socket ([`crate::proxy::runtime_pool`]'s errors do).
    pub(crate) fn runtime_unavailable(e: &dyn std::fmt::Display) -> Status {
        Status::new(code::UNAVAILABLE, format!("crisp: {e}"))
    }

    /// UNAVAILABLE for a call whose runtime failed as `how` says ([`runtime_lost`]).
    pub(crate) fn runtime_lost(
        socket: Option<&dyn std::fmt::Display>,
        how: RuntimeLoss<'_>,
    ) -> Status {
        Status::new(code::UNAVAILABLE, runtime_lost(socket, how))
    }
    /// FAILED_PRECONDITION for a call crisp refuses (an app's CreateContainer before its
    /// sidecars run): kubelet shows `message` and retries. Not DEADLINE_EXCEEDED even when a
    /// hold timed out: that would read as kubelet's own deadline.
    pub(crate) fn refused(message: String) -> Status {
        Status::new(code::FAILED_PRECONDITION, message)
    }

    /// RESOURCE_EXHAUSTED for an observed request larger than `limit` bytes
    /// (`max_observed_message_bytes`): crisp would have to buffer it to look at it.
    pub(crate) fn request_too_large(limit: usize) -> Status {
        Status::new(
            code::RESOURCE_EXHAUSTED,
            format!("crisp: request message larger than {limit} bytes"),
        )
    }

    /// CANCELLED for a call whose client failed while sending its request body (it went away).
    pub(crate) fn request_body_failed(e: &dyn std::fmt::Display) -> Status {
        Status::new(
            code::CANCELLED,
            format!("crisp: client request body failed: {e}"),
        )
    }

    /// DEADLINE_EXCEEDED for a held call whose client's deadline passed while crisp held it:
    /// it is never forwarded (KUBELET-CRI §7.3).
    pub(crate) fn held_past_deadline() -> Status {
        Status::new(
            code::DEADLINE_EXCEEDED,
            "crisp: deadline exceeded while the call was held; not forwarded",
        )
    }

    /// UNAVAILABLE for a relayed call whose runtime connection went before the call ended:
    /// `message` already says how ([`runtime_lost`]'s texts).
    pub(crate) fn runtime_gone(message: &str) -> Status {
        Status::new(code::UNAVAILABLE, message)
    }

    /// INTERNAL for a diverted call whose serving panicked (a bug in crisp): whether it reached
    /// the runtime is unknown, and the message says so.
    pub(crate) fn panicked() -> Status {
        Status::new(
            code::INTERNAL,
            "crisp: internal error while serving this call (a bug, logged by crisp); it may or may \
             not have reached the runtime",
        )
    }

    /// INTERNAL for a new stream the relay panicked on before it routed it (a bug in crisp):
    /// it never reached the runtime. After repeated panics its method is relayed unobserved,
    /// and kubelet's retry goes through.
    pub(crate) fn internal_fault() -> Status {
        Status::new(
            code::INTERNAL,
            "crisp: internal error while routing this call (a bug, logged by crisp); it did not \
             reach the runtime",
        )
    }
}

/// grpc-message is percent-encoded: everything outside printable ASCII, and '%' itself.
const GRPC_MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

/// Reads `grpc-status` from a header or trailer map.
pub(crate) fn code_of(h: &HeaderMap) -> Option<i32> {
    h.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// Longest grpc-message crisp passes to its interceptors (the tap shows it).
pub(crate) const MAX_SEEN_MESSAGE: usize = 1024;

/// Reads `grpc-message` from a header or trailer map (see `decode_message`).
pub(crate) fn message_of(h: &HeaderMap) -> Option<String> {
    h.get("grpc-message").map(|v| decode_message(v.as_bytes()))
}

/// A grpc-message as sent (percent-encoded) to text: invalid UTF-8 replaced, cut to
/// [`MAX_SEEN_MESSAGE`] bytes on a character boundary, then escaped as tenant text is
/// (issue #44: a runtime's message carries what a container wrote — an exec's stderr, an
/// image's name — and goes into log lines, probe results and the tap: newlines and control
/// characters come out as `\n`, `\u{1b}`, never as a forged log line or a terminal escape).
pub(crate) fn decode_message(raw: &[u8]) -> String {
    let mut s = percent_encoding::percent_decode(raw)
        .decode_utf8_lossy()
        .into_owned();
    truncate_text(&mut s, MAX_SEEN_MESSAGE);
    if s.chars().any(crate::tenant::escaped) {
        s = crate::tenant::text(&s, 4 * MAX_SEEN_MESSAGE).to_string();
    }
    s
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut with '…'.
pub(crate) fn truncate_text(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
}

/// A `grpc-timeout` value telling what is left of a call's deadline (a held call forwarded):
/// the finest unit whose count fits in 8 digits, as grpc-go writes it.
pub(crate) fn grpc_timeout(d: std::time::Duration) -> String {
    encode_grpc_timeout(d, 0)
}

/// A `grpc-timeout` value for a deadline crisp sets on its own calls: to the millisecond
/// (`4500m`), in a coarser unit only when 8 digits of milliseconds cannot hold it.
pub(crate) fn grpc_timeout_ms(d: std::time::Duration) -> String {
    encode_grpc_timeout(d, 2)
}

/// The one `grpc-timeout` encoder: `d` in the finest unit, from `UNITS[finest]` on, whose count
/// fits in 8 digits, rounded up (the deadline told is never shorter than the one kept); past
/// them all, minutes (at most 8 digits of them).
fn encode_grpc_timeout(d: std::time::Duration, finest: usize) -> String {
    const MAX: u128 = 99_999_999;
    const UNITS: [(u128, char); 4] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
    ];
    let ns = d.as_nanos().max(1);
    for (div, unit) in &UNITS[finest.min(UNITS.len())..] {
        let v = ns.div_ceil(*div);
        if v <= MAX {
            return format!("{v}{unit}");
        }
    }
    format!("{}M", (ns / 60_000_000_000).clamp(1, MAX))
}

/// Parses a `grpc-timeout` header value: 1–8 ASCII digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(v: &[u8]) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 8 digits: no overflow, no UTF-8 check (run on every relayed call).
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit[0] {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn grpc_timeout_forms() {
        assert_eq!(parse_grpc_timeout(b"120S"), Some(Duration::from_secs(120)));
        assert_eq!(
            parse_grpc_timeout(b"1999999m"),
            Some(Duration::from_millis(1_999_999))
        );
        assert_eq!(parse_grpc_timeout(b"5H"), Some(Duration::from_secs(18000)));
        assert_eq!(parse_grpc_timeout(b"7n"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_grpc_timeout(b"S"), None);
        assert_eq!(parse_grpc_timeout(b""), None);
        assert_eq!(parse_grpc_timeout(b"123456789S"), None);
        assert_eq!(parse_grpc_timeout(b"12x"), None);
        assert_eq!(parse_grpc_timeout(b"-1S"), None);
    }

    /// Both encoders are the one encoder: what crisp tells the runtime of its own calls' deadline
    /// is in milliseconds, what is left of a held call's in the finest unit; both read back as
    /// at least what was meant.
    #[test]
    fn grpc_timeout_encodings() {
        assert_eq!(grpc_timeout_ms(Duration::from_millis(4500)), "4500m");
        assert_eq!(
            grpc_timeout_ms(Duration::from_micros(1)),
            "1m",
            "rounded up"
        );
        assert_eq!(grpc_timeout_ms(Duration::from_secs(200_000)), "200000S");
        assert_eq!(grpc_timeout(Duration::from_millis(4500)), "4500000u");
        for d in [
            Duration::from_nanos(1),
            Duration::from_millis(1999),
            Duration::MAX,
        ] {
            for v in [grpc_timeout(d), grpc_timeout_ms(d)] {
                let back = parse_grpc_timeout(v.as_bytes()).unwrap();
                assert!(
                    back >= d.min(Duration::from_secs(99_999_999 * 60)),
                    "{d:?} -> {v}"
                );
            }
        }
    }

    #[test]
    fn message_is_percent_encoded() {
        let h = Status::new(code::UNAVAILABLE, "100% gone\nnow é").to_header_map();
        assert_eq!(h["grpc-status"], "14");
        assert_eq!(h["grpc-message"], "100%25 gone%0Anow %C3%A9");
        // Read back escaped: one line, whatever the runtime wrote.
        assert_eq!(message_of(&h).as_deref(), Some("100% gone\\nnow é"));
    }

    /// Issue #44: a runtime's message is escaped when read, so no log line, probe result or
    /// tap line carries its newlines or terminal escapes. On bde328c `message_of` returned them
    /// as they were ("exec failed\nlevel=info msg=forged\u{1b}[2J").
    #[test]
    fn a_runtime_message_is_read_escaped() {
        let mut h = HeaderMap::new();
        h.insert(
            "grpc-message",
            "exec failed%0Alevel=info msg=forged%1B[2J%E2%80%AEx"
                .parse()
                .unwrap(),
        );
        let m = message_of(&h).unwrap();
        assert!(!m.chars().any(crate::tenant::escaped), "{m:?}");
        assert_eq!(m, "exec failed\\nlevel=info msg=forged\\u{1b}[2J\\u{202e}x");
    }

    #[test]
    fn messages_are_decoded_leniently_and_cut() {
        assert_eq!(decode_message(b"bad %ZZ and %FF"), "bad %ZZ and \u{FFFD}");
        let long = "é".repeat(MAX_SEEN_MESSAGE);
        let cut = decode_message(long.as_bytes());
        assert!(
            cut.ends_with('…') && cut.len() <= MAX_SEEN_MESSAGE + '…'.len_utf8(),
            "{}",
            cut.len()
        );
        assert_eq!(message_of(&HeaderMap::new()), None);
    }
}
