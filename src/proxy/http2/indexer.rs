//! crisp's HPACK encoder for its runtime connection.
//!
//! The relay decodes every request header block (for the route) and writes its own block to the
//! runtime, since streams it diverts never reach the runtime and the client's blocks would refer
//! to table entries the runtime never saw. crisp is the only writer of header blocks on its
//! runtime connection, so it owns that connection's HPACK table: fields that recur from call to
//! call — a method's `:path`, `:authority`, `content-type`, `user-agent`, `te` — are added to the
//! runtime's dynamic table once and sent as one-byte indices afterwards, as the client's own
//! encoder does. The runtime then decodes ~10 bytes per call instead of ~130 bytes of literals
//! (BENCHMARKS.md, issue #20). Everything else, `grpc-timeout` (new on every call) and any field
//! outside that list (tokens, custom metadata) included, is written as a literal that leaves the
//! table alone, exactly as [`super::encode_field`] writes it.
//!
//! Blocks that may be decoded out of step — the stateless ones a diverted stream is rebuilt from
//! — never come from here.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use super::stateless::{encode_field, put_int, put_str, static_field, static_name};
use super::IdHasher;

/// The table size crisp uses at most (HPACK's default; the runtime may allow more or less).
const MAX_TABLE: usize = 4096;
/// A field larger than this share of the table is never indexed: it would evict the rest.
const MAX_ENTRY_SHARE: usize = 4;

/// An entry's size in the table (RFC 7541 §4.1: name, value and 32), from its key: the key is
/// the name's length (4 bytes), the name and the value.
fn entry_size(key: &[u8]) -> usize {
    key.len() - 4 + 32
}

/// Names whose values recur on every call of a gRPC client and carry no secret, each with its
/// slot in [`Indexer::recent`].
fn indexable(name: &[u8]) -> Option<usize> {
    Some(match name {
        b":path" => 0,
        b":authority" => 1,
        b"content-type" => 2,
        b"user-agent" => 3,
        b"te" => 4,
        _ => return None,
    })
}

/// One indexable name's value last written through the table, and that entry's insertion
/// number: a call that repeats it is answered without building its key or hashing it.
#[derive(Default)]
struct Recent {
    value: Vec<u8>,
    inserted: Option<u64>,
}

pub struct Indexer {
    /// The dynamic table's entries as keys (see [`Self::key`]), oldest first.
    entries: VecDeque<Box<[u8]>>,
    /// Each key's newest copy in the table, by insertion number.
    index: HashMap<Box<[u8]>, u64, BuildHasherDefault<IdHasher>>,
    /// Entries inserted so far (the next one's insertion number).
    inserted: u64,
    size: usize,
    max_size: usize,
    /// Table size updates owed to the runtime at the start of the next block: the smallest
    /// size the table had since the last block, then the current one (RFC 7541 §4.2).
    owed: Option<usize>,
    key: Vec<u8>,
    /// Per indexable name (see [`indexable`]): its last value in the table. Four of a gRPC
    /// client's five indexed fields are the same on every call, and `:path` on a poll's.
    recent: [Recent; 5],
}

impl Default for Indexer {
    fn default() -> Self {
        Indexer {
            entries: VecDeque::new(),
            index: HashMap::default(),
            inserted: 0,
            size: 0,
            max_size: MAX_TABLE,
            owed: None,
            key: Vec::with_capacity(128),
            recent: Default::default(),
        }
    }
}

impl Indexer {
    /// The runtime's SETTINGS_HEADER_TABLE_SIZE: crisp's table is at most that (and at most
    /// 4,096 bytes); the change is signalled at the start of the next block.
    pub fn peer_table_size(&mut self, allowed: u32) {
        let new = (allowed as usize).min(MAX_TABLE);
        if new == self.max_size {
            return;
        }
        self.owed = Some(self.owed.map_or(new.min(self.max_size), |m| m.min(new)));
        self.max_size = new;
        self.evict(0);
    }

    /// Starts a header block: writes the table size updates owed.
    pub fn begin(&mut self, out: &mut Vec<u8>) {
        if let Some(min) = self.owed.take() {
            if min < self.max_size {
                put_int(out, 0x20, 5, min);
            }
            put_int(out, 0x20, 5, self.max_size);
        }
    }

    /// Appends one field to the block.
    pub fn field(&mut self, out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        let Some(slot) = indexable(name) else {
            return encode_field(out, name, value);
        };
        // The name's last value, still in the table: its index, with no key and no hash. (A
        // value found here was indexed by the way below, so it is not a static entry.)
        let recent = &self.recent[slot];
        if let Some(n) = recent.inserted.filter(|&n| self.live(n)) {
            if recent.value == value {
                return put_int(out, 0x80, 7, self.index_of(n));
            }
        }
        if static_field(name, value).is_some() {
            return encode_field(out, name, value);
        }
        self.key.clear();
        self.key
            .extend_from_slice(&(name.len() as u32).to_be_bytes());
        self.key.extend_from_slice(name);
        self.key.extend_from_slice(value);
        if let Some(&n) = self.index.get(&self.key[..]) {
            self.remember(slot, value, n);
            return put_int(out, 0x80, 7, self.index_of(n));
        }
        let size = entry_size(&self.key);
        if size > self.max_size / MAX_ENTRY_SHARE {
            return encode_field(out, name, value);
        }
        // A literal with incremental indexing (RFC 7541 §6.2.1).
        out.reserve(name.len() + value.len() + 11);
        match static_name(name) {
            Some(i) => put_int(out, 0x40, 6, i as usize),
            None => {
                out.push(0x40);
                put_str(out, name);
            }
        }
        put_str(out, value);
        self.evict(size);
        let key: Box<[u8]> = self.key[..].into();
        self.index.insert(key.clone(), self.inserted);
        self.entries.push_back(key);
        self.remember(slot, value, self.inserted);
        self.inserted += 1;
        self.size += size;
    }

    /// Whether the entry of insertion number `n` is still in the table.
    fn live(&self, n: u64) -> bool {
        n < self.inserted && self.inserted - n <= self.entries.len() as u64
    }

    /// The index of the entry of insertion number `n`: the newest is 62 (RFC 7541 §2.3.3).
    fn index_of(&self, n: u64) -> usize {
        62 + (self.inserted - 1 - n) as usize
    }

    fn remember(&mut self, slot: usize, value: &[u8], n: u64) {
        let r = &mut self.recent[slot];
        r.value.clear();
        r.value.extend_from_slice(value);
        r.inserted = Some(n);
    }

    /// Drops the oldest entries until `room` more bytes fit, as the runtime's decoder will.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            let Some(key) = self.entries.pop_front() else {
                break;
            };
            let n = self.inserted - 1 - self.entries.len() as u64;
            if self.index.get(&key) == Some(&n) {
                self.index.remove(&key);
            }
            self.size -= entry_size(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    fn call(path: &str, timeout: u32) -> Fields {
        [
            (":method", "POST".to_string()),
            (":scheme", "http".into()),
            (":path", path.into()),
            (":authority", "/var/run/containerd/containerd.sock".into()),
            ("content-type", "application/grpc".into()),
            ("user-agent", "grpc-go/1.33.1".into()),
            ("te", "trailers".into()),
            ("grpc-timeout", format!("{timeout}u")),
        ]
        .into_iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.into_bytes()))
        .collect()
    }

    fn encode(enc: &mut Indexer, fields: &Fields) -> Vec<u8> {
        let mut out = Vec::new();
        enc.begin(&mut out);
        for (n, v) in fields {
            enc.field(&mut out, n, v);
        }
        out
    }

    /// Decoded by an independent decoder (httlib-hpack) that keeps its table from block to
    /// block, as the runtime does.
    fn decode(dec: &mut httlib_hpack::Decoder, block: &[u8]) -> Fields {
        let mut dst = Vec::new();
        dec.decode(&mut block.to_vec(), &mut dst)
            .expect("the runtime must decode crisp's block");
        dst.into_iter().map(|(n, v, _)| (n, v)).collect()
    }

    #[test]
    fn a_repeated_call_is_sent_as_indices_and_decodes_to_the_same_fields() {
        let (mut enc, mut dec) = (Indexer::default(), httlib_hpack::Decoder::default());
        let first = call("/runtime.v1.RuntimeService/Version", 1_999_000);
        let b1 = encode(&mut enc, &first);
        assert_eq!(decode(&mut dec, &b1), first);
        let second = call("/runtime.v1.RuntimeService/Version", 1_998_000);
        let b2 = encode(&mut enc, &second);
        assert_eq!(decode(&mut dec, &b2), second);
        // :method, :scheme and five table indices are one byte each; grpc-timeout a literal.
        let stateless: usize = {
            let mut s = Vec::new();
            second.iter().for_each(|(n, v)| encode_field(&mut s, n, v));
            s.len()
        };
        assert!(
            b2.len() <= 7 + 2 + "grpc-timeout".len() + 1 + "1998000u".len(),
            "{} bytes: {b2:02x?}",
            b2.len()
        );
        assert!(stateless > 100, "{stateless}");
    }

    #[test]
    fn eviction_and_table_size_changes_keep_the_runtime_in_step() {
        let (mut enc, mut dec) = (
            Indexer::default(),
            httlib_hpack::Decoder::with_dynamic_size(4096),
        );
        for i in 0..400u32 {
            // More distinct paths than the table holds: entries are evicted and re-added.
            let fields = call(&format!("/runtime.v1.RuntimeService/Method{}", i % 97), i);
            if i == 150 {
                enc.peer_table_size(200);
            }
            if i == 160 {
                // Down to nothing and back up before the next block: both signalled.
                enc.peer_table_size(0);
                enc.peer_table_size(1000);
            }
            if i == 300 {
                enc.peer_table_size(1 << 16);
            }
            let block = encode(&mut enc, &fields);
            assert_eq!(decode(&mut dec, &block), fields, "call {i}");
            assert!(enc.size <= enc.max_size);
        }
        assert_eq!(enc.max_size, MAX_TABLE);
    }

    #[test]
    fn fields_outside_the_list_never_enter_the_table() {
        let mut enc = Indexer::default();
        let mut out = Vec::new();
        enc.field(&mut out, b"authorization", b"Bearer secret");
        enc.field(&mut out, b"x-request-id", b"42");
        enc.field(&mut out, b":path", &vec![b'a'; 2000]);
        assert_eq!((enc.entries.len(), enc.size), (0, 0));
        let mut dec = httlib_hpack::Decoder::default();
        assert_eq!(decode(&mut dec, &out).len(), 3);
    }
}
