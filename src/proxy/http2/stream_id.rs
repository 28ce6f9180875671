//! Stream identifiers (RFC 9113 §5.1.1).

/// A stream's identifier: 31 bits, the reserved high bit always clear (it is masked off on
/// reading and on building one). 0 is the connection itself; clients open the odd streams.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(u32);

impl StreamId {
    /// Stream 0: frames about the connection as a whole (SETTINGS, PING, GOAWAY, its window).
    pub const CONNECTION: StreamId = StreamId(0);
    /// The largest identifier a stream can have.
    pub const MAX: StreamId = StreamId(0x7fff_ffff);

    /// The identifier `n` with its reserved bit cleared, as a receiver reads it.
    pub const fn new(n: u32) -> StreamId {
        StreamId(n & 0x7fff_ffff)
    }

    /// The identifier as a number (the reserved bit clear).
    pub const fn get(self) -> u32 {
        self.0
    }

    /// Whether this is stream 0, the connection.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Whether a client opened (or may open) it: the odd identifiers.
    pub const fn is_client(self) -> bool {
        self.0 % 2 == 1
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

/// The bare number, as a `u32`'s: messages and test output read as they did before the type.
impl std::fmt::Debug for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_bit_is_cleared_and_parity_says_who_opened_it() {
        assert_eq!(StreamId::new(0x8000_0003).get(), 3);
        assert_eq!(StreamId::new(u32::MAX), StreamId::MAX);
        assert!(StreamId::new(1).is_client());
        assert!(!StreamId::new(2).is_client());
        assert!(StreamId::CONNECTION.is_zero() && !StreamId::CONNECTION.is_client());
        assert!(StreamId::new(0x8000_0000).is_zero());
        assert_eq!(
            format!("{} {:?}", StreamId::new(7), StreamId::new(9)),
            "7 9"
        );
    }
}
