//! DATA (RFC 9113 §6.1).

use super::{Flags, FrameError, Head, Kind, StreamId, MAX_FRAME};

/// DATA frames for `data`, at most [`MAX_FRAME`] each; `end` sets END_STREAM on the last one.
pub fn data(out: &mut Vec<u8>, stream: StreamId, data: &[u8], end: bool) {
    let mut chunks = data.chunks(MAX_FRAME).peekable();
    if chunks.peek().is_none() {
        Head::new(Kind::Data, Flags::END_STREAM.when(end), stream, 0).encode(out);
        return;
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        Head::new(
            Kind::Data,
            Flags::END_STREAM.when(end && last),
            stream,
            c.len(),
        )
        .encode(out);
        out.extend_from_slice(c);
    }
}

/// The data of a DATA frame without its padding; an error if the padding does not fit.
pub fn data_payload(head: &Head, payload: &[u8]) -> Result<std::ops::Range<usize>, FrameError> {
    if !head.has(Flags::PADDED) {
        return Ok(0..payload.len());
    }
    let bad = FrameError::BadPadding { kind: Kind::Data };
    let pad = *payload.first().ok_or(bad)? as usize;
    let end = payload.len().checked_sub(pad).ok_or(bad)?;
    if 1 <= end {
        Ok(1..end)
    } else {
        Err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_is_stripped() {
        let d = Head::new(Kind::Data, Flags::PADDED, StreamId::new(1), 4);
        assert_eq!(data_payload(&d, &[1, 5, 6, 0]).ok(), Some(1..3));
        assert_eq!(data_payload(&d, &[4, 5, 6, 0]).ok(), None);
        assert_eq!(
            data_payload(
                &Head::new(Kind::Data, Flags::NONE, StreamId::new(1), 2),
                &[5, 6]
            )
            .ok(),
            Some(0..2)
        );
    }

    #[test]
    fn big_data_is_split_and_ends_once() {
        let mut out = Vec::new();
        data(&mut out, StreamId::new(3), &vec![1u8; MAX_FRAME + 1], true);
        let h1 = Head::parse(&out).unwrap();
        assert_eq!(
            (h1.kind, h1.len, h1.flags),
            (Kind::Data, MAX_FRAME, Flags::NONE)
        );
        let h2 = Head::parse(&out[9 + MAX_FRAME..]).unwrap();
        assert_eq!(
            (h2.len, h2.flags, h2.stream),
            (1, Flags::END_STREAM, StreamId::new(3))
        );
        let mut empty = Vec::new();
        data(&mut empty, StreamId::new(3), &[], true);
        assert_eq!(
            Head::parse(&empty),
            Some(Head::new(
                Kind::Data,
                Flags::END_STREAM,
                StreamId::new(3),
                0
            ))
        );
    }
}
