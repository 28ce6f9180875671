//! A cheap hasher for small keys (stream ids, short byte strings).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

/// Hashes stream ids, and short byte strings (the relay's path cache, the [`super::Indexer`]'s
/// keys), cheaply. SipHash's resistance to chosen keys buys nothing here: stream ids are the
/// client's own and bounded by its concurrency, and the maps of byte strings are bounded in
/// size; but it costs on every call.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Fold the well-mixed high half into the low bits, which pick the bucket.
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by stream id.
pub(crate) type IdMap<V> = HashMap<super::StreamId, V, BuildHasherDefault<IdHasher>>;
