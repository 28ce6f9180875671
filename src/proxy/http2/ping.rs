//! PING (RFC 9113 §6.7).

use super::{Flags, FrameError, Head, Kind, StreamId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ping {
    pub(crate) ack: bool,
    pub(crate) opaque: [u8; 8],
}

impl Ping {
    pub fn new(opaque: [u8; 8]) -> Ping {
        Ping { ack: false, opaque }
    }

    /// The answer to this PING.
    pub(crate) fn pong(self) -> Ping {
        Ping {
            ack: true,
            opaque: self.opaque,
        }
    }

    pub(crate) fn load(head: &Head, payload: &[u8]) -> Result<Ping, FrameError> {
        let Ok(opaque) = <[u8; 8]>::try_from(payload) else {
            return Err(FrameError::BadLength {
                kind: Kind::Ping,
                len: payload.len(),
            });
        };
        Ok(Ping {
            ack: head.has(Flags::ACK),
            opaque,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        Head::new(
            Kind::Ping,
            Flags::ACK.when(self.ack),
            StreamId::CONNECTION,
            8,
        )
        .encode(out);
        out.extend_from_slice(&self.opaque);
    }
}

#[cfg(test)]
mod tests {
    use super::super::HEADER_LEN;
    use super::*;

    #[test]
    fn pings_and_pongs_round_trip() {
        for p in [Ping::new(*b"12345678"), Ping::new(*b"abcdefgh").pong()] {
            let mut b = Vec::new();
            p.encode(&mut b);
            let head = Head::parse(&b).unwrap();
            assert_eq!(Ping::load(&head, &b[HEADER_LEN..]), Ok(p));
        }
    }

    #[test]
    fn a_ping_of_other_than_eight_bytes_is_an_error() {
        let head = Head::new(Kind::Ping, Flags::NONE, StreamId::new(0), 7);
        assert_eq!(
            Ping::load(&head, &[0; 7]),
            Err(FrameError::BadLength {
                kind: Kind::Ping,
                len: 7
            })
        );
        assert!(Ping::load(&head, &[0; 9]).is_err());
    }
}
