//! WINDOW_UPDATE (RFC 9113 §6.9).

use super::{Flags, FrameError, Head, Kind, StreamId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowUpdate {
    /// 0: the connection's window.
    pub(crate) stream: StreamId,
    /// 31 bits; 0 is a protocol error the receiver judges (the relay passes it on).
    pub(crate) increment: u32,
}

impl WindowUpdate {
    pub fn new(stream: StreamId, increment: u32) -> WindowUpdate {
        WindowUpdate { stream, increment }
    }

    pub(crate) fn load(head: &Head, payload: &[u8]) -> Result<WindowUpdate, FrameError> {
        let [a, b, c, d] = *payload else {
            return Err(FrameError::BadLength {
                kind: Kind::WindowUpdate,
                len: payload.len(),
            });
        };
        Ok(WindowUpdate {
            stream: head.stream,
            increment: u32::from_be_bytes([a, b, c, d]) & 0x7fff_ffff,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        Head::new(Kind::WindowUpdate, Flags::NONE, self.stream, 4).encode(out);
        out.extend_from_slice(&(self.increment & 0x7fff_ffff).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::super::HEADER_LEN;
    use super::*;

    #[test]
    fn window_updates_round_trip_and_drop_the_reserved_bit() {
        let mut b = Vec::new();
        WindowUpdate::new(StreamId::new(5), 70_000).encode(&mut b);
        let head = Head::parse(&b).unwrap();
        assert_eq!(
            WindowUpdate::load(&head, &b[HEADER_LEN..]),
            Ok(WindowUpdate::new(StreamId::new(5), 70_000))
        );
        assert_eq!(
            WindowUpdate::load(&head, &[0xff, 0xff, 0xff, 0xff]),
            Ok(WindowUpdate::new(StreamId::new(5), 0x7fff_ffff))
        );
        assert_eq!(
            WindowUpdate::load(&head, &[0, 0, 1]),
            Err(FrameError::BadLength {
                kind: Kind::WindowUpdate,
                len: 3
            })
        );
        assert!(WindowUpdate::load(&head, &[0; 5]).is_err());
    }
}
