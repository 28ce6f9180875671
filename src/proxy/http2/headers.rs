//! HEADERS and CONTINUATION (RFC 9113 §6.2, §6.10).

use super::{Flags, FrameError, Head, Kind, StreamId, MAX_FRAME};

/// A HEADERS frame (and CONTINUATIONs, if the block is larger than [`MAX_FRAME`]) carrying
/// `block`.
pub fn headers(out: &mut Vec<u8>, stream: StreamId, block: &[u8], end_stream: bool) {
    let es = Flags::END_STREAM.when(end_stream);
    let mut chunks = block.chunks(MAX_FRAME).peekable();
    let first = chunks.next().unwrap_or(&[]);
    let eh = Flags::END_HEADERS.when(chunks.peek().is_none());
    Head::new(Kind::Headers, es | eh, stream, first.len()).encode(out);
    out.extend_from_slice(first);
    while let Some(c) = chunks.next() {
        let eh = Flags::END_HEADERS.when(chunks.peek().is_none());
        Head::new(Kind::Continuation, eh, stream, c.len()).encode(out);
        out.extend_from_slice(c);
    }
}

/// The payload of a HEADERS frame without its padding and priority fields: the header block
/// fragment; an error if its padding and priority fields do not fit in it.
pub fn header_fragment(head: &Head, payload: &[u8]) -> Result<std::ops::Range<usize>, FrameError> {
    let bad = FrameError::BadPadding { kind: head.kind };
    let mut start = 0;
    let mut end = payload.len();
    if head.has(Flags::PADDED) {
        let pad = *payload.first().ok_or(bad)? as usize;
        start += 1;
        end = end.checked_sub(pad).ok_or(bad)?;
    }
    if head.kind == Kind::Headers && head.has(Flags::PRIORITY) {
        start += 5;
    }
    if start <= end {
        Ok(start..end)
    } else {
        Err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_blocks_are_split_into_continuations() {
        let block = vec![7u8; MAX_FRAME * 2 + 5];
        let mut out = Vec::new();
        headers(&mut out, StreamId::new(3), &block, true);
        let h1 = Head::parse(&out).unwrap();
        assert_eq!(
            (h1.kind, h1.len, h1.flags),
            (Kind::Headers, MAX_FRAME, Flags::END_STREAM)
        );
        let h2 = Head::parse(&out[9 + MAX_FRAME..]).unwrap();
        assert_eq!(
            (h2.kind, h2.len, h2.flags),
            (Kind::Continuation, MAX_FRAME, Flags::NONE)
        );
        let h3 = Head::parse(&out[18 + 2 * MAX_FRAME..]).unwrap();
        assert_eq!(
            (h3.kind, h3.len, h3.flags, h3.stream),
            (Kind::Continuation, 5, Flags::END_HEADERS, StreamId::new(3))
        );
        assert_eq!(out.len(), 27 + block.len());
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        let head = Head::new(
            Kind::Headers,
            Flags::PADDED | Flags::PRIORITY | Flags::END_HEADERS,
            StreamId::new(1),
            10,
        );
        let payload = [2u8, 0, 0, 0, 0, 9, 0xaa, 0xbb, 0, 0];
        assert_eq!(header_fragment(&head, &payload).ok(), Some(6..8));
        let bad = Head::new(Kind::Headers, Flags::PADDED, StreamId::new(1), 1);
        assert_eq!(header_fragment(&bad, &[9]).ok(), None);
        assert_eq!(
            header_fragment(&bad, &[9]),
            Err(FrameError::BadPadding {
                kind: Kind::Headers
            })
        );
    }
}
