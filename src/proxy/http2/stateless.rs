//! Stateless HPACK encoding (RFC 7541): every field a literal "without indexing" (or a full
//! static-table match), so a block encoded here never touches the peer's dynamic table. That is
//! what lets crisp write its own header blocks to kubelet — a diverted call's response — and
//! rebuild blocks for the observed path, without keeping a mirror of either side's HPACK state.

/// Static-table indices (RFC 7541 Appendix A) of the names gRPC uses most.
pub(crate) fn static_name(name: &[u8]) -> Option<u8> {
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
pub(crate) fn static_field(name: &[u8], value: &[u8]) -> Option<u8> {
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
pub(crate) fn put_str(out: &mut Vec<u8>, s: &[u8]) {
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
            (
                b":path",
                b"/runtime.v1.RuntimeService/ListContainers".to_vec(),
            ),
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
        let want: Vec<(Vec<u8>, Vec<u8>)> = fields
            .iter()
            .map(|(n, v)| (n.to_vec(), v.clone()))
            .collect();
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
}
