//! gRPC framing helpers: the 5-byte length prefix of each message.

use bytes::{BufMut, Bytes, BytesMut};

/// Length of the gRPC message prefix: 1 byte compressed flag + 4 bytes big-endian length.
pub const PREFIX_LEN: usize = 5;

/// One gRPC message extracted from a buffered body.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// An uncompressed message.
    Message(&'a [u8]),
    /// Compressed with a codec crisp does not decode; forwarded, never observed.
    Compressed,
}

/// Splits a buffer holding exactly one gRPC message (the unary case). `None` when the buffer is
/// not one well-formed message (empty, truncated, or several messages).
pub fn single_message(buf: &[u8]) -> Option<Frame<'_>> {
    let (frame, rest) = next_message(buf)?;
    rest.is_empty().then_some(frame)
}

/// Splits the first message off `buf`, returning it and the remainder.
pub fn next_message(buf: &[u8]) -> Option<(Frame<'_>, &[u8])> {
    if buf.len() < PREFIX_LEN {
        return None;
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    let end = PREFIX_LEN.checked_add(len)?;
    if buf.len() < end {
        return None;
    }
    let frame = match buf[0] {
        0 => Frame::Message(&buf[PREFIX_LEN..end]),
        _ => Frame::Compressed,
    };
    Some((frame, &buf[end..]))
}

/// Frames `msg` as one uncompressed gRPC message.
pub fn frame(msg: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(PREFIX_LEN + msg.len());
    out.put_u8(0);
    out.put_u32(msg.len() as u32);
    out.put_slice(msg);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let framed = frame(b"hello");
        assert_eq!(single_message(&framed), Some(Frame::Message(b"hello")));
        assert_eq!(single_message(&framed[..7]), None);
        let mut two = framed.to_vec();
        two.extend_from_slice(&framed);
        assert_eq!(single_message(&two), None);
        let (first, rest) = next_message(&two).unwrap();
        assert_eq!(first, Frame::Message(b"hello"));
        assert_eq!(rest, &framed[..]);
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        assert_eq!(single_message(&compressed), Some(Frame::Compressed));
        assert_eq!(single_message(&[]), None);
        // A length that overflows the buffer is rejected, not panicked on.
        assert_eq!(single_message(&[0, 0xff, 0xff, 0xff, 0xff, 1]), None);
    }
}
