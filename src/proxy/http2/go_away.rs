//! GOAWAY (RFC 9113 §6.8).

use super::{Flags, FrameError, Head, Kind, Reason, StreamId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoAway<'a> {
    /// The highest stream the sender may have processed.
    pub(crate) last_stream: StreamId,
    pub(crate) reason: Reason,
    /// Free text for diagnostics (the peer's, so hostile: print it lossily and cut).
    pub(crate) debug_data: &'a [u8],
}

impl<'a> GoAway<'a> {
    pub fn new(last_stream: StreamId, reason: Reason, debug_data: &'a [u8]) -> GoAway<'a> {
        GoAway {
            last_stream,
            reason,
            debug_data,
        }
    }

    pub(crate) fn load(payload: &'a [u8]) -> Result<GoAway<'a>, FrameError> {
        let Some((fixed, debug_data)) = payload.split_first_chunk::<8>() else {
            return Err(FrameError::BadLength {
                kind: Kind::GoAway,
                len: payload.len(),
            });
        };
        let last_stream =
            StreamId::new(u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]));
        let reason = Reason(u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]));
        Ok(GoAway {
            last_stream,
            reason,
            debug_data,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        Head::new(
            Kind::GoAway,
            Flags::NONE,
            StreamId::CONNECTION,
            8 + self.debug_data.len(),
        )
        .encode(out);
        out.extend_from_slice(&self.last_stream.get().to_be_bytes());
        out.extend_from_slice(&self.reason.0.to_be_bytes());
        out.extend_from_slice(self.debug_data);
    }
}

#[cfg(test)]
mod tests {
    use super::super::HEADER_LEN;
    use super::*;

    #[test]
    fn goaways_round_trip() {
        let mut b = Vec::new();
        GoAway::new(
            StreamId::new(7),
            Reason::ENHANCE_YOUR_CALM,
            b"too_many_pings",
        )
        .encode(&mut b);
        let head = Head::parse(&b).unwrap();
        assert_eq!(
            (head.kind, head.stream, head.len),
            (Kind::GoAway, StreamId::new(0), 22)
        );
        assert_eq!(
            GoAway::load(&b[HEADER_LEN..]),
            Ok(GoAway::new(
                StreamId::new(7),
                Reason::ENHANCE_YOUR_CALM,
                b"too_many_pings"
            ))
        );
        assert_eq!(
            GoAway::load(&[0x80, 0, 0, 1, 0, 0, 0, 0]),
            Ok(GoAway::new(StreamId::new(1), Reason::NO_ERROR, b""))
        );
    }

    #[test]
    fn a_goaway_shorter_than_eight_bytes_is_an_error() {
        assert_eq!(
            GoAway::load(&[0; 7]),
            Err(FrameError::BadLength {
                kind: Kind::GoAway,
                len: 7
            })
        );
    }
}
