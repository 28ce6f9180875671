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
        Decoder { table: VecDeque::new(), size: 0, max_size: 4096, allowed: 1 << 20, scratch_name: Vec::new(), scratch_value: Vec::new() }
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
fn string<'a>(b: &'a [u8], pos: &mut usize, scratch: &'a mut Vec<u8>) -> Result<&'a [u8], HpackError> {
    let huffman = *b.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = int(b, pos, 7)?;
    let end = pos.checked_add(len).filter(|&e| e <= b.len()).ok_or(HpackError::Truncated)?;
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
            i if i > 61 => self.table.get(i - 62).map(|(n, v)| (&n[..], &v[..])).ok_or(HpackError::BadIndex(i)),
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
    pub fn decode(&mut self, block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<(), HpackError> {
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
                        let (name, value) = (name.to_vec(), value.to_vec());
                        self.insert(&name, &value);
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
        dec.decode(block, |n, v| out.push((n.to_vec(), v.to_vec()))).unwrap();
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
                    (b":path".to_vec(), format!("/runtime.v1.RuntimeService/M{}", i % 7).into_bytes(), 0x4 | 0x2 | 0x10),
                    (b"grpc-timeout".to_vec(), format!("{}u", 1_999_000 + i).into_bytes(), 0x4 | 0x1),
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
                enc.encode((n.clone(), v.clone(), *flags), &mut block).unwrap();
            }
            let got = fields(&mut dec, &block);
            let want: Vec<(Vec<u8>, Vec<u8>)> = req.iter().map(|(n, v, _)| (n.clone(), v.clone())).collect();
            assert_eq!(got, want, "block {i}");
        }
    }

    #[test]
    fn hostile_blocks_are_errors_not_panics() {
        let mut dec = Decoder::default();
        assert_eq!(dec.decode(&[0x80 | 62], |_, _| {}), Err(HpackError::BadIndex(62)));
        assert_eq!(dec.decode(&[0x80], |_, _| {}), Err(HpackError::BadIndex(0)));
        assert_eq!(dec.decode(&[0x40, 0x05, b'a'], |_, _| {}), Err(HpackError::Truncated));
        assert_eq!(dec.decode(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff], |_, _| {}), Err(HpackError::Overflow));
        assert_eq!(dec.decode(&[0x00, 0x81, 0xff, 0x00], |_, _| {}), Err(HpackError::Huffman));
        // '0' (00000) padded with zeros: RFC 7541 §5.2 wants EOS's leading bits (ones).
        assert_eq!(dec.decode(&[0x00, 0x81, 0x00, 0x00], |_, _| {}), Err(HpackError::Huffman));
        assert_eq!(dec.decode(&[0x3f, 0xe1, 0xff, 0xff, 0x07], |_, _| {}), Err(HpackError::TableSize(16_777_216, 1 << 20)));
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
        let third = [0x40, 4, b'c', b'c', b'c', b'c', 10, b'w', b'w', b'w', b'w', b'w', b'w', b'w', b'w', b'w', b'w'];
        fields(&mut dec, &third);
        assert_eq!(fields(&mut dec, &[0x80 | 62])[0].0, b"cccc");
        assert_eq!(fields(&mut dec, &[0x80 | 63])[0].0, b"bbbb");
        assert_eq!(dec.decode(&[0x80 | 64], |_, _| {}), Err(HpackError::BadIndex(64)));
    }
}
