//! The relay's frame layer on hostile bytes (what any client on crisp's socket, or a confused
//! runtime, may send): walking a byte stream frame by frame as both relay directions do, and the
//! header-block plumbing around it. Beyond "no panic":
//! - the walk accounts for every byte (complete frames + one partial frame or a partial header);
//! - `header_fragment` / `data_payload` give ranges inside the payload, and exactly the padding
//!   and priority fields RFC 9113 §6.1/§6.2 put around them;
//! - a header block spread over HEADERS + CONTINUATIONs by `frames::headers` reassembles to the
//!   same block, with END_HEADERS on the last frame only, END_STREAM on the first only, and no
//!   frame over `MAX_FRAME`; `frames::data` likewise for DATA and END_STREAM;
//! - a block decoded by crisp's HPACK decoder and re-encoded statelessly, then framed and
//!   reassembled, decodes to the same fields (what reaches the runtime is what the client said).
#![no_main]

use arbitrary::Arbitrary;
use crisp::proxy::http2::hpack::Decoder;
use crisp::proxy::http2::{self as f, Flags, Head, Kind, StreamId};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    wire: Vec<u8>,
    stream: u32,
    end_stream: bool,
    /// Repeated to exercise CONTINUATION splitting without huge inputs.
    block: Vec<u8>,
    repeat: u8,
}

/// Walks `buf` as both relay directions do (`complete_at`); returns (frames, bytes consumed),
/// checking the bytes `complete_at` says are missing against the frame header.
fn walk(buf: &[u8]) -> (Vec<(Head, std::ops::Range<usize>)>, usize) {
    let (mut pos, mut missing) = (0, 0);
    let mut frames = Vec::new();
    while let Some(head) = f::complete_at(buf, pos, &mut missing) {
        assert!(head.len < 1 << 24);
        assert_eq!(
            head.stream.get() & 0x8000_0000,
            0,
            "the reserved bit is masked"
        );
        let len = f::HEADER_LEN + head.len;
        assert!(
            buf.len() - pos >= len,
            "complete_at returned an incomplete frame"
        );
        frames.push((head, pos + f::HEADER_LEN..pos + len));
        pos += len;
    }
    match Head::parse(&buf[pos..]) {
        Some(h) => assert_eq!(
            missing,
            f::HEADER_LEN + h.len - (buf.len() - pos),
            "missing bytes miscounted"
        ),
        None => assert_eq!(missing, 0),
    }
    (frames, pos)
}

fuzz_target!(|input: Input| {
    // 1. Arbitrary bytes as a frame stream.
    let (frames, used) = walk(&input.wire);
    assert!(used <= input.wire.len());
    let rest = input.wire.len() - used;
    if let Some(h) = Head::parse(&input.wire[used..]) {
        assert!(
            rest < f::HEADER_LEN + h.len,
            "a complete frame was left unwalked"
        );
    } else {
        assert!(rest < f::HEADER_LEN);
    }
    for (head, r) in &frames {
        let payload = &input.wire[r.clone()];
        // RFC 9113 §6.1/§6.2, computed independently: an optional pad-length byte first, then
        // (HEADERS with PRIORITY) 5 bytes of priority, the fragment, and the padding last.
        let padded = head.has(Flags::PADDED);
        let pad = if padded {
            payload.first().map(|&p| p as usize)
        } else {
            Some(0)
        };
        match head.kind {
            Kind::Headers | Kind::Continuation => {
                let prio = if head.kind == Kind::Headers && head.has(Flags::PRIORITY) {
                    5
                } else {
                    0
                };
                let start = usize::from(padded) + prio;
                let expected = pad
                    .and_then(|p| payload.len().checked_sub(p))
                    .filter(|&end| start <= end)
                    .map(|end| start..end);
                assert_eq!(f::header_fragment(head, payload).ok(), expected);
            }
            Kind::Data => {
                let start = usize::from(padded);
                let expected = pad
                    .and_then(|p| payload.len().checked_sub(p))
                    .filter(|&end| start <= end && (!padded || end >= 1))
                    .map(|end| start..end);
                assert_eq!(f::data_payload(head, payload).ok(), expected);
            }
            _ => {}
        }
    }

    // 2. A header block of any size, framed by crisp, reassembles to itself.
    let mut block = Vec::new();
    for _ in 0..=(input.repeat % 8) {
        block.extend_from_slice(&input.block);
    }
    let stream = StreamId::new(input.stream);
    let mut out = Vec::new();
    f::headers(&mut out, stream, &block, input.end_stream);
    let (frames, used) = walk(&out);
    assert_eq!(used, out.len());
    let mut again = Vec::new();
    for (i, (head, r)) in frames.iter().enumerate() {
        let last = i + 1 == frames.len();
        assert_eq!(
            head.kind,
            if i == 0 {
                Kind::Headers
            } else {
                Kind::Continuation
            }
        );
        assert_eq!(head.stream, stream);
        assert!(head.len <= f::MAX_FRAME);
        assert_eq!(head.has(Flags::END_HEADERS), last);
        assert_eq!(head.has(Flags::END_STREAM), i == 0 && input.end_stream);
        let frag = f::header_fragment(head, &out[r.clone()]).expect("crisp's own frame");
        again.extend_from_slice(&out[r.clone()][frag]);
    }
    assert_eq!(again, block);

    // 3. DATA framing.
    let mut out = Vec::new();
    f::data(&mut out, stream, &block, input.end_stream);
    let (frames, used) = walk(&out);
    assert_eq!(used, out.len());
    let mut again = Vec::new();
    for (i, (head, r)) in frames.iter().enumerate() {
        assert_eq!(head.kind, Kind::Data);
        assert!(head.len <= f::MAX_FRAME);
        assert_eq!(
            head.has(Flags::END_STREAM),
            input.end_stream && i + 1 == frames.len()
        );
        again.extend_from_slice(&out[r.clone()]);
    }
    assert_eq!(again, block);

    // 4. What the relay sends the runtime for a client's block: decode, re-encode statelessly,
    // frame; the runtime (a fresh decoder: the blocks are stateless) reads the same fields.
    let mut fields = Vec::new();
    let mut reencoded = Vec::new();
    if Decoder::default()
        .decode(&block, |n, v| {
            fields.push((n.to_vec(), v.to_vec()));
            f::encode_field(&mut reencoded, n, v);
        })
        .is_ok()
    {
        let mut out = Vec::new();
        f::headers(&mut out, stream, &reencoded, false);
        let (frames, _) = walk(&out);
        let mut joined = Vec::new();
        for (head, r) in &frames {
            let frag = f::header_fragment(head, &out[r.clone()]).expect("crisp's own frame");
            joined.extend_from_slice(&out[r.clone()][frag]);
        }
        let mut seen = Vec::new();
        Decoder::default()
            .decode(&joined, |n, v| seen.push((n.to_vec(), v.to_vec())))
            .expect("crisp's own encoding decodes");
        assert_eq!(seen, fields);
    }
});
