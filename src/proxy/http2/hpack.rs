//! An HPACK (RFC 7541) decoder for the relay: it keeps one peer's dynamic table in step and hands
//! each field to a callback as borrowed bytes — no allocation for indexed fields, which are most
//! of what gRPC clients send. Huffman strings are decoded by crisp's own table-driven decoder
//! ([`super::huffman`]).

use std::collections::VecDeque;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HpackError {
    #[error("truncated header block")]
    Truncated,
    #[error("integer too large")]
    Overflow,
    #[error("index {0} is not in the table")]
    BadIndex(usize),
    #[error("bad Huffman string")]
    Huffman,
    #[error("dynamic table size update to {0} exceeds the allowed {1}")]
    TableSize(usize, usize),
}

/// RFC 7541 Appendix A.
const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// A dynamic table entry: name, value.
type Entry = (Box<[u8]>, Box<[u8]>);

pub struct Decoder {
    /// Newest first.
    table: VecDeque<Entry>,
    size: usize,
    max_size: usize,
    /// What SETTINGS_HEADER_TABLE_SIZE allows; crisp relays settings end to end and does not
    /// police them, so this is a sanity bound.
    allowed: usize,
    scratch_name: Vec<u8>,
    scratch_value: Vec<u8>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max_size: 4096,
            allowed: 1 << 20,
            scratch_name: Vec::new(),
            scratch_value: Vec::new(),
        }
    }
}

fn int(b: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, HpackError> {
    let max = (1usize << prefix) - 1;
    let first = *b.get(*pos).ok_or(HpackError::Truncated)? as usize & max;
    *pos += 1;
    if first < max {
        return Ok(first);
    }
    let mut v = max;
    let mut shift = 0;
    loop {
        let byte = *b.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        if shift > 28 {
            return Err(HpackError::Overflow);
        }
        v += ((byte & 0x7f) as usize) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
}

/// A string literal at `pos`: its raw bytes, or (Huffman) decoded into `scratch`.
fn string<'a>(
    b: &'a [u8],
    pos: &mut usize,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], HpackError> {
    let huffman = *b.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = int(b, pos, 7)?;
    let end = pos
        .checked_add(len)
        .filter(|&e| e <= b.len())
        .ok_or(HpackError::Truncated)?;
    let raw = &b[*pos..end];
    *pos = end;
    if !huffman {
        return Ok(raw);
    }
    scratch.clear();
    super::huffman::decode(raw, scratch).map_err(|_| HpackError::Huffman)?;
    Ok(scratch)
}

impl Decoder {
    fn get(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            1..=61 => Ok(STATIC[index - 1]),
            i if i > 61 => self
                .table
                .get(i - 62)
                .map(|(n, v)| (&n[..], &v[..]))
                .ok_or(HpackError::BadIndex(i)),
            i => Err(HpackError::BadIndex(i)),
        }
    }

    fn evict(&mut self) {
        while self.size > self.max_size {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= n.len() + v.len() + 32,
                None => break,
            }
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        self.size += name.len() + value.len() + 32;
        self.table.push_front((name.into(), value.into()));
        self.evict();
    }

    /// Decodes one complete header block, calling `field(name, value)` for each field in order.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let mut pos = 0;
        while pos < block.len() {
            let b = block[pos];
            if b & 0x80 != 0 {
                let (n, v) = self.get(int(block, &mut pos, 7)?)?;
                field(n, v);
            } else if b & 0xe0 == 0x20 {
                let size = int(block, &mut pos, 5)?;
                if size > self.allowed {
                    return Err(HpackError::TableSize(size, self.allowed));
                }
                self.max_size = size;
                self.evict();
            } else {
                // Literal: with incremental indexing (01), without (0000) or never indexed (0001).
                let (prefix, index) = if b & 0x40 != 0 { (6, true) } else { (4, false) };
                let name_idx = int(block, &mut pos, prefix)?;
                let mut name_buf = std::mem::take(&mut self.scratch_name);
                let mut value_buf = std::mem::take(&mut self.scratch_value);
                let r = (|| {
                    let name: &[u8] = if name_idx == 0 {
                        string(block, &mut pos, &mut name_buf)?
                    } else {
                        let n = self.get(name_idx)?.0;
                        name_buf.clear();
                        name_buf.extend_from_slice(n);
                        &name_buf
                    };
                    let value = string(block, &mut pos, &mut value_buf)?;
                    field(name, value);
                    if index {
                        // Borrowed from the block or the scratch buffers, not the table.
                        self.insert(name, value);
                    }
                    Ok(())
                })();
                self.scratch_name = name_buf;
                self.scratch_value = value_buf;
                r?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(dec: &mut Decoder, block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        dec.decode(block, |n, v| out.push((n.to_vec(), v.to_vec())))
            .unwrap();
        out
    }

    /// Blocks from an independent encoder (httlib-hpack: Huffman, indexing, never-indexed,
    /// table size updates), decoded block after block with one table.
    #[test]
    fn decodes_what_an_independent_encoder_writes_across_blocks() {
        use httlib_hpack::Encoder;
        let mut enc = Encoder::with_dynamic_size(256);
        let mut dec = Decoder::default();
        #[allow(clippy::type_complexity)]
        let requests: Vec<Vec<(Vec<u8>, Vec<u8>, u8)>> = (0..50)
            .map(|i| {
                vec![
                    (b":method".to_vec(), b"POST".to_vec(), 0x4 | 0x10),
                    (
                        b":path".to_vec(),
                        format!("/runtime.v1.RuntimeService/M{}", i % 7).into_bytes(),
                        0x4 | 0x2 | 0x10,
                    ),
                    (
                        b"grpc-timeout".to_vec(),
                        format!("{}u", 1_999_000 + i).into_bytes(),
                        0x4 | 0x1,
                    ),
                    (b"authorization".to_vec(), b"secret".to_vec(), 0x8 | 0x1),
                    (b"x-plain".to_vec(), vec![b'p'; i], 0x0),
                ]
            })
            .collect();
        for (i, req) in requests.iter().enumerate() {
            let mut block = Vec::new();
            if i == 10 {
                enc.update_max_dynamic_size(128, &mut block).unwrap();
            }
            for (n, v, flags) in req {
                enc.encode((n.clone(), v.clone(), *flags), &mut block)
                    .unwrap();
            }
            let got = fields(&mut dec, &block);
            let want: Vec<(Vec<u8>, Vec<u8>)> =
                req.iter().map(|(n, v, _)| (n.clone(), v.clone())).collect();
            assert_eq!(got, want, "block {i}");
        }
    }

    #[test]
    fn hostile_blocks_are_errors_not_panics() {
        let mut dec = Decoder::default();
        assert_eq!(
            dec.decode(&[0x80 | 62], |_, _| {}),
            Err(HpackError::BadIndex(62))
        );
        assert_eq!(dec.decode(&[0x80], |_, _| {}), Err(HpackError::BadIndex(0)));
        assert_eq!(
            dec.decode(&[0x40, 0x05, b'a'], |_, _| {}),
            Err(HpackError::Truncated)
        );
        assert_eq!(
            dec.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], |_, _| {}),
            Err(HpackError::Overflow)
        );
        assert_eq!(
            dec.decode(&[0x00, 0x81, 0xff, 0x00], |_, _| {}),
            Err(HpackError::Huffman)
        );
        // '0' (00000) padded with zeros: RFC 7541 §5.2 wants EOS's leading bits (ones).
        assert_eq!(
            dec.decode(&[0x00, 0x81, 0x00, 0x00], |_, _| {}),
            Err(HpackError::Huffman)
        );
        assert_eq!(
            dec.decode(&[0x3f, 0xe1, 0xff, 0xff, 0x07], |_, _| {}),
            Err(HpackError::TableSize(16_777_216, 1 << 20))
        );
    }

    #[test]
    fn the_table_evicts_oldest_entries_past_its_size() {
        let mut dec = Decoder::default();
        let mut block = vec![0x3f, 0x41]; // size update to 31 + 65 = 96
        for name in [b"aaaa", b"bbbb"] {
            block.push(0x40);
            block.push(4);
            block.extend_from_slice(name);
            block.push(10);
            block.extend_from_slice(&[b'v'; 10]);
        }
        fields(&mut dec, &block);
        // 46 bytes each: only the newest fits in 96... both fit (92). A third evicts "aaaa".
        let third = [
            0x40, 4, b'c', b'c', b'c', b'c', 10, b'w', b'w', b'w', b'w', b'w', b'w', b'w', b'w',
            b'w', b'w',
        ];
        fields(&mut dec, &third);
        assert_eq!(fields(&mut dec, &[0x80 | 62])[0].0, b"cccc");
        assert_eq!(fields(&mut dec, &[0x80 | 63])[0].0, b"bbbb");
        assert_eq!(
            dec.decode(&[0x80 | 64], |_, _| {}),
            Err(HpackError::BadIndex(64))
        );
    }

    /// RFC 7541 Appendix C: the specification's own examples, independent of any crate. Each
    /// sequence is decoded with one table, as a connection's blocks are.
    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    fn strs(fields: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        fields
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn rfc7541_c2_single_representations() {
        let cases: [(&str, &[(&str, &str)]); 4] = [
            (
                "400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",
                &[("custom-key", "custom-header")],
            ),
            (
                "040c 2f73 616d 706c 652f 7061 7468",
                &[(":path", "/sample/path")],
            ),
            (
                "1008 7061 7373 776f 7264 0673 6563 7265 74",
                &[("password", "secret")],
            ),
            ("82", &[(":method", "GET")]),
        ];
        for (block, want) in cases {
            assert_eq!(
                fields(&mut Decoder::default(), &hex(block)),
                strs(want),
                "{block}"
            );
        }
    }

    const REQ1: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ];
    const REQ2: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ];
    const REQ3: &[(&str, &str)] = &[
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ];

    /// C.3 and C.4: three requests on one decoder, each indexing what the previous added.
    fn requests(blocks: [&str; 3]) {
        let mut dec = Decoder::default();
        for (block, want) in blocks.into_iter().zip([REQ1, REQ2, REQ3]) {
            assert_eq!(fields(&mut dec, &hex(block)), strs(want), "{block}");
        }
    }

    #[test]
    fn rfc7541_c3_requests_without_huffman() {
        requests([
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ]);
    }

    #[test]
    fn rfc7541_c4_requests_with_huffman() {
        requests([
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ]);
    }

    const RESP1: &[(&str, &str)] = &[
        (":status", "302"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("location", "https://www.example.com"),
    ];
    const RESP2: &[(&str, &str)] = &[
        (":status", "307"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("location", "https://www.example.com"),
    ];
    const RESP3: &[(&str, &str)] = &[
        (":status", "200"),
        ("cache-control", "private"),
        ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
        ("location", "https://www.example.com"),
        ("content-encoding", "gzip"),
        (
            "set-cookie",
            "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
        ),
    ];

    /// C.5 and C.6 run with a 256-byte table, so entries are evicted between responses: the
    /// sequence decodes only if eviction is exact, and what the RFC evicts must be gone.
    fn responses(blocks: [&str; 3]) {
        let mut dec = Decoder::default();
        // A dynamic table size update to 256 (RFC 7541 §6.3), then the first response.
        let mut first = hex("3fe1 01");
        first.extend(hex(blocks[0]));
        assert_eq!(fields(&mut dec, &first), strs(RESP1));
        assert_eq!(fields(&mut dec, &hex(blocks[1])), strs(RESP2));
        // After C.5.2/C.6.2 the table holds 4 entries (222 bytes): ":status: 302" was evicted.
        assert_eq!(
            dec.decode(&[0x80 | 66], |_, _| {}),
            Err(HpackError::BadIndex(66))
        );
        assert_eq!(fields(&mut dec, &hex(blocks[2])), strs(RESP3));
        // After C.5.3/C.6.3: 3 entries (215 bytes): set-cookie, content-encoding, date.
        assert_eq!(
            fields(&mut dec, &[0x80 | 63])[0],
            (b"content-encoding".to_vec(), b"gzip".to_vec())
        );
        assert_eq!(fields(&mut dec, &[0x80 | 64])[0].0, b"date");
        assert_eq!(
            dec.decode(&[0x80 | 65], |_, _| {}),
            Err(HpackError::BadIndex(65))
        );
    }

    #[test]
    fn rfc7541_c5_responses_without_huffman() {
        responses([
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "4803 3330 37c1 c0bf",
            "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e 3d31",
        ]);
    }

    #[test]
    fn rfc7541_c6_responses_with_huffman() {
        responses([
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
            "4883 640e ffc1 c0bf",
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        ]);
    }
}
