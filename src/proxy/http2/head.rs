//! The frame header (RFC 9113 §4.1): length, type, flags, stream.

use super::{FrameError, StreamId};

/// The client connection preface (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADER_LEN: usize = 9;
/// The frame size every HTTP/2 peer must accept (the initial SETTINGS_MAX_FRAME_SIZE); crisp's
/// own frames never exceed it.
pub const MAX_FRAME: usize = 16_384;
/// The largest SETTINGS_MAX_FRAME_SIZE a peer may advertise (RFC 9113 §6.5.2).
pub const MAX_FRAME_LIMIT: u32 = (1 << 24) - 1;
/// The initial flow-control window of a connection and of a stream (RFC 9113 §6.9.2).
pub const DEFAULT_WINDOW: i64 = 65_535;

/// A frame's type (RFC 9113 §6); extension types the relay does not know are kept as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Data,
    Headers,
    Priority,
    RstStream,
    Settings,
    PushPromise,
    Ping,
    GoAway,
    WindowUpdate,
    Continuation,
    Unknown(u8),
}

impl From<u8> for Kind {
    fn from(b: u8) -> Kind {
        match b {
            0x0 => Kind::Data,
            0x1 => Kind::Headers,
            0x2 => Kind::Priority,
            0x3 => Kind::RstStream,
            0x4 => Kind::Settings,
            0x5 => Kind::PushPromise,
            0x6 => Kind::Ping,
            0x7 => Kind::GoAway,
            0x8 => Kind::WindowUpdate,
            0x9 => Kind::Continuation,
            other => Kind::Unknown(other),
        }
    }
}

impl From<Kind> for u8 {
    fn from(k: Kind) -> u8 {
        match k {
            Kind::Data => 0x0,
            Kind::Headers => 0x1,
            Kind::Priority => 0x2,
            Kind::RstStream => 0x3,
            Kind::Settings => 0x4,
            Kind::PushPromise => 0x5,
            Kind::Ping => 0x6,
            Kind::GoAway => 0x7,
            Kind::WindowUpdate => 0x8,
            Kind::Continuation => 0x9,
            Kind::Unknown(b) => b,
        }
    }
}

/// A frame's flags. Their meaning depends on the frame's type: ACK and END_STREAM share a bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags(pub u8);

impl Flags {
    pub const NONE: Flags = Flags(0);
    /// DATA, HEADERS.
    pub const END_STREAM: Flags = Flags(0x1);
    /// SETTINGS, PING.
    pub const ACK: Flags = Flags(0x1);
    /// HEADERS, CONTINUATION.
    pub const END_HEADERS: Flags = Flags(0x4);
    /// DATA, HEADERS.
    pub const PADDED: Flags = Flags(0x8);
    /// HEADERS.
    pub const PRIORITY: Flags = Flags(0x20);

    /// `self` if `on`, else no flag.
    pub(crate) const fn when(self, on: bool) -> Flags {
        if on {
            self
        } else {
            Flags::NONE
        }
    }
}

impl std::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: Kind,
    pub(crate) flags: Flags,
    pub stream: StreamId,
}

impl Head {
    pub fn new(kind: Kind, flags: Flags, stream: StreamId, len: usize) -> Head {
        Head {
            len,
            kind,
            flags,
            stream,
        }
    }

    pub fn parse(b: &[u8]) -> Option<Head> {
        if b.len() < HEADER_LEN {
            return None;
        }
        Some(Head {
            len: (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize,
            kind: Kind::from(b[3]),
            flags: Flags(b[4]),
            stream: StreamId::new(u32::from_be_bytes([b[5], b[6], b[7], b[8]])),
        })
    }

    /// Whether the frame fits the SETTINGS_MAX_FRAME_SIZE its receiver advertised, `max`
    /// (RFC 9113 §4.2: a longer frame is a FRAME_SIZE_ERROR).
    pub fn within(&self, max: u32) -> Result<(), FrameError> {
        if self.len > max as usize {
            return Err(FrameError::TooLarge {
                kind: self.kind,
                len: self.len,
                max,
            });
        }
        Ok(())
    }

    pub fn has(&self, flag: Flags) -> bool {
        self.flags.0 & flag.0 != 0
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let len = self.len;
        debug_assert!(len < 1 << 24);
        out.extend_from_slice(&[
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            self.kind.into(),
            self.flags.0,
        ]);
        out.extend_from_slice(&self.stream.get().to_be_bytes());
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

#[cfg(test)]
mod tests {
    use super::super::{data, Ping};
    use super::*;

    #[test]
    fn complete_at_says_how_much_of_a_frame_is_missing() {
        let mut b = vec![0xff; 3];
        Ping::new(*b"12345678").encode(&mut b);
        data(&mut b, StreamId::new(1), b"abc", true);
        let mut missing = 9;
        assert_eq!(
            complete_at(&b, 3, &mut missing).map(|h| (h.kind, h.len, missing)),
            Some((Kind::Ping, 8, 0))
        );
        assert_eq!(
            complete_at(&b, 20, &mut missing).map(|h| (h.kind, h.stream, h.len)),
            Some((Kind::Data, StreamId::new(1), 3))
        );
        assert!(complete_at(&b[..b.len() - 2], 20, &mut missing).is_none());
        assert_eq!(missing, 2);
        assert!(complete_at(&b[..25], 20, &mut missing).is_none());
        assert_eq!(missing, 0);
        assert!(complete_at(&b, b.len(), &mut missing).is_none());
        assert_eq!(missing, 0);
    }

    #[test]
    fn heads_round_trip_and_keep_unknown_kinds() {
        for kind in 0..=255u8 {
            let head = Head::new(
                Kind::from(kind),
                Flags(0x25),
                StreamId::new(0x7fff_fffe),
                0x12_3456,
            );
            assert_eq!(u8::from(head.kind), kind);
            let mut b = Vec::new();
            head.encode(&mut b);
            assert_eq!(b.len(), HEADER_LEN);
            assert_eq!(Head::parse(&b), Some(head));
        }
        assert!(matches!(Kind::from(0xa), Kind::Unknown(0xa)));
        // The reserved bit is not part of the stream id.
        let h = Head::parse(&[0, 0, 0, 0, 0, 0x80, 0, 0, 3]).unwrap();
        assert_eq!(h.stream, StreamId::new(3));
        assert!(Head::parse(&[0; 8]).is_none());
    }

    #[test]
    fn a_frame_over_the_advertised_max_frame_size_is_a_frame_size_error() {
        let h = Head::new(Kind::Data, Flags::NONE, StreamId::new(1), MAX_FRAME);
        assert_eq!(h.within(MAX_FRAME as u32), Ok(()), "exactly the bound fits");
        let over = Head::new(Kind::Headers, Flags::NONE, StreamId::new(1), MAX_FRAME + 1);
        let err = over.within(MAX_FRAME as u32).unwrap_err();
        assert_eq!(
            err,
            FrameError::TooLarge {
                kind: Kind::Headers,
                len: MAX_FRAME + 1,
                max: MAX_FRAME as u32
            }
        );
        assert_eq!(err.reason(), super::super::Reason::FRAME_SIZE_ERROR);
        assert_eq!(over.within(MAX_FRAME_LIMIT), Ok(()));
    }

    #[test]
    fn flags_share_bits_as_rfc_9113_says() {
        assert_eq!(Flags::ACK, Flags::END_STREAM);
        let h = Head::new(
            Kind::Headers,
            Flags::END_STREAM | Flags::END_HEADERS,
            StreamId::new(1),
            0,
        );
        assert!(h.has(Flags::END_HEADERS) && h.has(Flags::END_STREAM) && !h.has(Flags::PADDED));
        assert_eq!(Flags::PADDED.when(false), Flags::NONE);
    }
}
