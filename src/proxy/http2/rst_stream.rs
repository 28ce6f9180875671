//! RST_STREAM (RFC 9113 §6.4).

#[cfg(test)]
use super::FrameError;
use super::{Flags, Head, Kind, Reason, StreamId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RstStream {
    pub(crate) stream: StreamId,
    pub(crate) reason: Reason,
}

impl RstStream {
    pub(crate) fn new(stream: StreamId, reason: Reason) -> RstStream {
        RstStream { stream, reason }
    }

    #[cfg(test)]
    pub(crate) fn load(head: &Head, payload: &[u8]) -> Result<RstStream, FrameError> {
        let [a, b, c, d] = *payload else {
            return Err(FrameError::BadLength {
                kind: Kind::RstStream,
                len: payload.len(),
            });
        };
        Ok(RstStream {
            stream: head.stream,
            reason: Reason(u32::from_be_bytes([a, b, c, d])),
        })
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        Head::new(Kind::RstStream, Flags::NONE, self.stream, 4).encode(out);
        out.extend_from_slice(&self.reason.0.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::super::HEADER_LEN;
    use super::*;

    #[test]
    fn resets_round_trip() {
        let mut b = Vec::new();
        RstStream::new(StreamId::new(9), Reason::REFUSED_STREAM).encode(&mut b);
        let head = Head::parse(&b).unwrap();
        assert_eq!(
            RstStream::load(&head, &b[HEADER_LEN..]),
            Ok(RstStream::new(StreamId::new(9), Reason::REFUSED_STREAM))
        );
        assert_eq!(
            RstStream::load(&head, &[0; 3]),
            Err(FrameError::BadLength {
                kind: Kind::RstStream,
                len: 3
            })
        );
    }
}
