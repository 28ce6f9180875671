//! The few pieces of HTTP/2 (RFC 9113) and HPACK (RFC 7541) the relay needs: frame headers, the
//! frames crisp writes itself, and a *stateless* header encoder.
//!
//! Stateless means every field is a literal "without indexing" (or a full static-table match):
//! a block encoded here never touches the peer's dynamic table. That is what lets crisp re-encode
//! request headers towards the runtime, and insert its own responses towards kubelet, without
//! ever having to keep a mirror of either side's HPACK state.

pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADER_LEN: usize = 9;
/// The frame size every HTTP/2 peer must accept; crisp's own frames never exceed it.
pub const MAX_FRAME: usize = 16_384;
pub const DEFAULT_WINDOW: i64 = 65_535;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;

pub const NO_ERROR: u32 = 0x0;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    pub fn parse(b: &[u8]) -> Option<Head> {
        if b.len() < HEADER_LEN {
            return None;
        }
        Some(Head {
            len: (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize,
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        })
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

/// The frame at `b[pos..]` if all of it has arrived; else None, with how many more bytes it
/// needs in `missing` (0 when not even its header is complete).
pub fn complete_at(b: &[u8], pos: usize, missing: &mut usize) -> Option<Head> {
    *missing = 0;
    let head = Head::parse(&b[pos..])?;
    *missing = (HEADER_LEN + head.len).saturating_sub(b.len() - pos);
    (*missing == 0).then_some(head)
}

pub fn put_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
}

pub fn window_update(out: &mut Vec<u8>, stream: u32, inc: u32) {
    put_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&(inc & 0x7fff_ffff).to_be_bytes());
}

pub fn rst_stream(out: &mut Vec<u8>, stream: u32, code: u32) {
    put_head(out, 4, RST_STREAM, 0, stream);
    out.extend_from_slice(&code.to_be_bytes());
}

pub fn ping(out: &mut Vec<u8>, opaque: [u8; 8]) {
    put_head(out, 8, PING, 0, 0);
    out.extend_from_slice(&opaque);
}

pub fn goaway(out: &mut Vec<u8>, last_stream: u32, code: u32, debug: &[u8]) {
    put_head(out, 8 + debug.len(), GOAWAY, 0, 0);
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(debug);
}

/// DATA frames for `data`, at most [`MAX_FRAME`] each; `end` sets END_STREAM on the last one.
pub fn data(out: &mut Vec<u8>, stream: u32, data: &[u8], end: bool) {
    let mut chunks = data.chunks(MAX_FRAME).peekable();
    if chunks.peek().is_none() {
        put_head(out, 0, DATA, if end { END_STREAM } else { 0 }, stream);
        return;
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        put_head(out, c.len(), DATA, if end && last { END_STREAM } else { 0 }, stream);
        out.extend_from_slice(c);
    }
}

/// A HEADERS frame (and CONTINUATIONs, if the block is larger than [`MAX_FRAME`]) carrying
/// `block`.
pub fn headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool) {
    let es = if end_stream { END_STREAM } else { 0 };
    let mut chunks = block.chunks(MAX_FRAME).peekable();
    let first = chunks.next().unwrap_or(&[]);
    let eh = if chunks.peek().is_none() { END_HEADERS } else { 0 };
    put_head(out, first.len(), HEADERS, es | eh, stream);
    out.extend_from_slice(first);
    while let Some(c) = chunks.next() {
        let eh = if chunks.peek().is_none() { END_HEADERS } else { 0 };
        put_head(out, c.len(), CONTINUATION, eh, stream);
        out.extend_from_slice(c);
    }
}

/// The payload of a HEADERS frame without its padding and priority fields: the header block
/// fragment. `None` if the frame is malformed.
pub fn header_fragment(head: &Head, payload: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut start = 0;
    let mut end = payload.len();
    if head.has(PADDED) {
        let pad = *payload.first()? as usize;
        start += 1;
        end = end.checked_sub(pad)?;
    }
    if head.kind == HEADERS && head.has(PRIORITY_FLAG) {
        start += 5;
    }
    (start <= end).then_some(start..end)
}

/// The data of a DATA frame without its padding.
pub fn data_payload(head: &Head, payload: &[u8]) -> Option<std::ops::Range<usize>> {
    if !head.has(PADDED) {
        return Some(0..payload.len());
    }
    let pad = *payload.first()? as usize;
    let end = payload.len().checked_sub(pad)?;
    (1 <= end).then_some(1..end)
}

// ---------------------------------------------------------------------------------------------
// Stateless HPACK encoding

/// Static-table indices (RFC 7541 Appendix A) of the names gRPC uses most.
pub(super) fn static_name(name: &[u8]) -> Option<u8> {
    Some(match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"content-type" => 31,
        b"user-agent" => 58,
        _ => return None,
    })
}

/// Full static-table matches (an indexed field, one byte).
pub(super) fn static_field(name: &[u8], value: &[u8]) -> Option<u8> {
    Some(match (name, value) {
        (b":method", b"GET") => 2,
        (b":method", b"POST") => 3,
        (b":path", b"/") => 4,
        (b":scheme", b"http") => 6,
        (b":scheme", b"https") => 7,
        (b":status", b"200") => 8,
        _ => return None,
    })
}

/// An HPACK integer (RFC 7541 §5.1) with `prefix_bits` bits in its first byte, whose other
/// bits are `first`.
#[inline]
pub fn put_int(out: &mut Vec<u8>, first: u8, prefix_bits: u8, mut v: usize) {
    let max = (1usize << prefix_bits) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

#[inline]
pub(super) fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// Appends one field to a header block without touching the decoder's dynamic table.
pub fn encode_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    // One capacity check for the field (two length prefixes of up to 5 bytes and a type byte).
    out.reserve(name.len() + value.len() + 11);
    if let Some(i) = static_field(name, value) {
        put_int(out, 0x80, 7, i as usize);
        return;
    }
    match static_name(name) {
        Some(i) => put_int(out, 0x00, 4, i as usize),
        None => {
            out.push(0x00);
            put_str(out, name);
        }
    }
    put_str(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_at_says_how_much_of_a_frame_is_missing() {
        let mut b = vec![0xff; 3];
        ping(&mut b, *b"12345678");
        data(&mut b, 1, b"abc", true);
        let mut missing = 9;
        assert_eq!(complete_at(&b, 3, &mut missing).map(|h| (h.kind, h.len, missing)), Some((PING, 8, 0)));
        assert_eq!(complete_at(&b, 20, &mut missing).map(|h| (h.kind, h.stream, h.len)), Some((DATA, 1, 3)));
        assert!(complete_at(&b[..b.len() - 2], 20, &mut missing).is_none());
        assert_eq!(missing, 2);
        assert!(complete_at(&b[..25], 20, &mut missing).is_none());
        assert_eq!(missing, 0);
        assert!(complete_at(&b, b.len(), &mut missing).is_none());
        assert_eq!(missing, 0);
    }

    fn decode(block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        decode_with(&mut httlib_hpack::Decoder::default(), block)
    }

    /// Decoded by an independent decoder (httlib-hpack), not crisp's own.
    fn decode_with(dec: &mut httlib_hpack::Decoder, block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        dec.decode(&mut block.to_vec(), &mut out).unwrap();
        out.into_iter().map(|(n, v, _)| (n, v)).collect()
    }

    #[test]
    fn stateless_blocks_decode_to_the_same_fields_and_leave_the_table_alone() {
        let fields: Vec<(&[u8], Vec<u8>)> = vec![
            (b":method", b"POST".to_vec()),
            (b":scheme", b"http".to_vec()),
            (b":path", b"/runtime.v1.RuntimeService/ListContainers".to_vec()),
            (b":authority", b"localhost".to_vec()),
            (b"content-type", b"application/grpc".to_vec()),
            (b"user-agent", b"grpc-go/1.51.0".to_vec()),
            (b"te", b"trailers".to_vec()),
            (b"grpc-timeout", b"1999848u".to_vec()),
            (b"x-long", vec![b'v'; 300]),
            (b"x-empty", vec![]),
        ];
        let mut block = Vec::new();
        for (n, v) in &fields {
            encode_field(&mut block, n, v);
        }
        let mut dec = httlib_hpack::Decoder::default();
        let got = decode_with(&mut dec, &block);
        let want: Vec<(Vec<u8>, Vec<u8>)> = fields.iter().map(|(n, v)| (n.to_vec(), v.clone())).collect();
        assert_eq!(got, want);
        // Nothing was added to the dynamic table: index 62 (its first entry) does not exist.
        assert!(dec.decode(&mut vec![0x80 | 62], &mut Vec::new()).is_err());
    }

    #[test]
    fn integers_past_their_prefix_use_continuation_bytes() {
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        put_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [31, 154, 10]);
        let mut out = Vec::new();
        put_int(&mut out, 0, 4, 15);
        assert_eq!(out, [15, 0]);
        assert_eq!(
            decode(&{
                let mut b = Vec::new();
                encode_field(&mut b, b"a", &[b'x'; 127]);
                b
            })[0]
                .1
                .len(),
            127
        );
    }

    #[test]
    fn big_blocks_are_split_into_continuations() {
        let block = vec![7u8; MAX_FRAME * 2 + 5];
        let mut out = Vec::new();
        headers(&mut out, 3, &block, true);
        let h1 = Head::parse(&out).unwrap();
        assert_eq!((h1.kind, h1.len, h1.flags), (HEADERS, MAX_FRAME, END_STREAM));
        let h2 = Head::parse(&out[9 + MAX_FRAME..]).unwrap();
        assert_eq!((h2.kind, h2.len, h2.flags), (CONTINUATION, MAX_FRAME, 0));
        let h3 = Head::parse(&out[18 + 2 * MAX_FRAME..]).unwrap();
        assert_eq!((h3.kind, h3.len, h3.flags, h3.stream), (CONTINUATION, 5, END_HEADERS, 3));
        assert_eq!(out.len(), 27 + block.len());
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        let head = Head { len: 10, kind: HEADERS, flags: PADDED | PRIORITY_FLAG | END_HEADERS, stream: 1 };
        let payload = [2u8, 0, 0, 0, 0, 9, 0xaa, 0xbb, 0, 0];
        assert_eq!(header_fragment(&head, &payload), Some(6..8));
        let bad = Head { len: 1, kind: HEADERS, flags: PADDED, stream: 1 };
        assert_eq!(header_fragment(&bad, &[9]), None);
        let d = Head { len: 4, kind: DATA, flags: PADDED, stream: 1 };
        assert_eq!(data_payload(&d, &[1, 5, 6, 0]), Some(1..3));
    }
}
