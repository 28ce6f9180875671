//! Protobuf varints, the one decoder crisp has (issue #36): the wire walkers of
//! [`super::patch`] and [`super::skim`] and the ExecSync answer's exit-code reader
//! (`proxy::client::exec`) all read through [`Varint`], byte by byte as bytes arrive, or
//! through [`decode`] on a slice that holds the whole varint. The encoder is prost's
//! ([`encode`]).
//!
//! Like protobuf's own decoders, a varint is at most [`MAX_LEN`] bytes; of a 10-byte varint the
//! bits past the 64th are dropped (a negative int32 is sent as 10 bytes and read as its low 32
//! bits by the caller).

pub use prost::encoding::encode_varint as encode;

/// Most bytes of a varint: 64 bits, 7 to a byte.
pub const MAX_LEN: usize = 10;

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VarintError {
    /// The bytes ended inside the varint.
    #[error("the bytes end inside a varint")]
    Truncated,
    /// An 11th byte still had its continuation bit set before it.
    #[error("a varint longer than {MAX_LEN} bytes")]
    TooLong,
}

/// A varint being read one byte at a time: a fixed-size state, whatever the pieces the bytes
/// come in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Varint {
    value: u64,
    /// Bytes read so far.
    len: u8,
}

impl Varint {
    /// Reads the next byte: the value once `byte` is the varint's last.
    #[inline]
    pub fn push(&mut self, byte: u8) -> Result<Option<u64>, VarintError> {
        if usize::from(self.len) == MAX_LEN {
            return Err(VarintError::TooLong);
        }
        // At most 63: the 10th byte's bits past the 64th fall off, as in protobuf's decoders.
        self.value |= u64::from(byte & 0x7f) << (7 * u32::from(self.len));
        self.len += 1;
        Ok((byte & 0x80 == 0).then_some(self.value))
    }

    /// Bytes read so far.
    pub(crate) fn len(&self) -> usize {
        usize::from(self.len)
    }
}

/// The varint at the start of `buf`, and how many bytes it took.
#[inline]
pub fn decode(buf: &[u8]) -> Result<(u64, usize), VarintError> {
    let mut v = Varint::default();
    for &byte in buf {
        if let Some(value) = v.push(byte)? {
            return Ok((value, v.len()));
        }
    }
    Err(if v.len() == MAX_LEN {
        VarintError::TooLong
    } else {
        VarintError::Truncated
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_prost_encodes() {
        for v in [
            0,
            1,
            127,
            128,
            150,
            300,
            u64::from(u32::MAX),
            (-1i64) as u64,
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            encode(v, &mut buf);
            buf.push(0xff); // a byte after the varint is not read
            assert_eq!(decode(&buf), Ok((v, buf.len() - 1)), "{v}");
            assert_eq!(
                prost::encoding::decode_varint(&mut &buf[..]),
                Ok(v),
                "prost agrees on {v}"
            );
        }
    }

    #[test]
    fn byte_at_a_time_is_the_same_value() {
        let mut buf = Vec::new();
        encode(0x1234_5678_9abc, &mut buf);
        let mut v = Varint::default();
        let (last, head) = buf.split_last().unwrap();
        for &b in head {
            assert_eq!(v.push(b), Ok(None));
        }
        assert_eq!(v.len(), head.len());
        assert_eq!(v.push(*last), Ok(Some(0x1234_5678_9abc)));
    }

    #[test]
    fn short_and_long_varints_are_refused() {
        assert_eq!(decode(&[]), Err(VarintError::Truncated));
        assert_eq!(decode(&[0x80, 0x80]), Err(VarintError::Truncated));
        assert_eq!(decode(&[0xff; 10]), Err(VarintError::TooLong));
        assert_eq!(decode(&[0xff; 11]), Err(VarintError::TooLong));
        let mut ten = [0xff; 10];
        ten[9] = 0x01;
        assert_eq!(decode(&ten), Ok((u64::MAX, 10)));
        // The 10th byte's bits past the 64th fall off, as in protobuf's decoders.
        ten[9] = 0x7f;
        assert_eq!(decode(&ten), Ok((u64::MAX, 10)));
    }
}
