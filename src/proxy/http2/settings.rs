//! SETTINGS (RFC 9113 §6.5).

use super::{Flags, FrameError, Head, Kind, StreamId};

/// The parameters one SETTINGS frame carries (the last value wins when one repeats, RFC 9113
/// §6.5.3). Unknown parameters are ignored, as the RFC requires; the relay passes the frame on
/// unchanged anyway, and reads only what crisp's own bookkeeping needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Settings {
    pub(crate) header_table_size: Option<u32>,
    pub(crate) enable_push: Option<u32>,
    pub(crate) max_concurrent_streams: Option<u32>,
    pub(crate) initial_window_size: Option<u32>,
    pub(crate) max_frame_size: Option<u32>,
    pub(crate) max_header_list_size: Option<u32>,
}

impl Settings {
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    pub(crate) const ENABLE_PUSH: u16 = 0x2;
    pub(crate) const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub(crate) const MAX_FRAME_SIZE: u16 = 0x5;
    pub(crate) const MAX_HEADER_LIST_SIZE: u16 = 0x6;

    /// The parameters of a SETTINGS frame that is not an ACK (an ACK carries none; the relay
    /// passes it on unread, and its receiver checks it).
    pub(crate) fn load(head: &Head, payload: &[u8]) -> Result<Settings, FrameError> {
        debug_assert_eq!(head.kind, Kind::Settings);
        if !payload.len().is_multiple_of(6) {
            return Err(FrameError::BadLength {
                kind: Kind::Settings,
                len: payload.len(),
            });
        }
        let mut s = Settings::default();
        for p in payload.chunks_exact(6) {
            let v = u32::from_be_bytes([p[2], p[3], p[4], p[5]]);
            match u16::from_be_bytes([p[0], p[1]]) {
                Self::HEADER_TABLE_SIZE => s.header_table_size = Some(v),
                Self::ENABLE_PUSH => s.enable_push = Some(v),
                Self::MAX_CONCURRENT_STREAMS => s.max_concurrent_streams = Some(v),
                Self::INITIAL_WINDOW_SIZE => s.initial_window_size = Some(v),
                Self::MAX_FRAME_SIZE => s.max_frame_size = Some(v),
                Self::MAX_HEADER_LIST_SIZE => s.max_header_list_size = Some(v),
                _ => {}
            }
        }
        Ok(s)
    }

    fn fields(&self) -> [(u16, Option<u32>); 6] {
        [
            (Self::HEADER_TABLE_SIZE, self.header_table_size),
            (Self::ENABLE_PUSH, self.enable_push),
            (Self::MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (Self::INITIAL_WINDOW_SIZE, self.initial_window_size),
            (Self::MAX_FRAME_SIZE, self.max_frame_size),
            (Self::MAX_HEADER_LIST_SIZE, self.max_header_list_size),
        ]
    }

    /// A SETTINGS frame with the parameters that are set, in their numeric order.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let fields = self.fields();
        let n = fields.iter().filter(|(_, v)| v.is_some()).count();
        Head::new(Kind::Settings, Flags::NONE, StreamId::CONNECTION, 6 * n).encode(out);
        for (id, v) in fields {
            if let Some(v) = v {
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&v.to_be_bytes());
            }
        }
    }

    /// A SETTINGS ACK.
    pub(crate) fn encode_ack(out: &mut Vec<u8>) {
        Head::new(Kind::Settings, Flags::ACK, StreamId::CONNECTION, 0).encode(out);
    }
}

#[cfg(test)]
mod tests {
    use super::super::HEADER_LEN;
    use super::*;

    fn load(b: &[u8]) -> Result<Settings, FrameError> {
        let head = Head::parse(b).unwrap();
        Settings::load(&head, &b[HEADER_LEN..])
    }

    #[test]
    fn settings_round_trip() {
        let s = Settings {
            header_table_size: Some(0),
            initial_window_size: Some(1 << 20),
            max_frame_size: Some(16_384),
            ..Default::default()
        };
        let mut b = Vec::new();
        s.encode(&mut b);
        assert_eq!(b.len(), HEADER_LEN + 18);
        assert_eq!(load(&b), Ok(s));
        let mut empty = Vec::new();
        Settings::default().encode(&mut empty);
        assert_eq!(empty, [0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let mut ack = Vec::new();
        Settings::encode_ack(&mut ack);
        assert_eq!(ack, [0, 0, 0, 4, 1, 0, 0, 0, 0]);
    }

    #[test]
    fn the_last_value_wins_and_unknown_ids_are_ignored() {
        let mut b = Vec::new();
        Head::new(Kind::Settings, Flags::NONE, StreamId::new(0), 18).encode(&mut b);
        for (id, v) in [(4u16, 10u32), (0x99, 7), (4, 20)] {
            b.extend_from_slice(&id.to_be_bytes());
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(
            load(&b),
            Ok(Settings {
                initial_window_size: Some(20),
                ..Default::default()
            })
        );
    }

    #[test]
    fn a_length_not_a_multiple_of_six_is_an_error() {
        let mut b = Vec::new();
        Head::new(Kind::Settings, Flags::NONE, StreamId::new(0), 7).encode(&mut b);
        b.extend_from_slice(&[0, 4, 0, 0, 0, 1, 9]);
        assert_eq!(
            load(&b),
            Err(FrameError::BadLength {
                kind: Kind::Settings,
                len: 7
            })
        );
    }
}
