//! gRPC framing (`crisp::cri::wire`) and routing (`crisp::cri::Route::from_path`) on arbitrary
//! bytes: what crisp reads from every request body it observes and every path kubelet sends.
//! Beyond "no panic": `next_message` consumes exactly prefix + length and never more than the
//! buffer; walking a buffer message by message accounts for every byte; `frame` ∘
//! `single_message` is the identity; a buffer of two messages is never taken for one.
#![no_main]

use crisp::cri::wire::{frame, next_message, single_message, Frame, PREFIX_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Walk as a stream (what the server-stream patcher does).
    let mut rest = data;
    let mut consumed = 0usize;
    while let Some((f, r)) = next_message(rest) {
        let used = rest.len() - r.len();
        assert!(used >= PREFIX_LEN && used <= rest.len());
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        assert_eq!(used, PREFIX_LEN + len);
        match f {
            Frame::Message(m) => {
                assert_eq!(rest[0], 0);
                assert_eq!(m, &rest[PREFIX_LEN..used]);
            }
            Frame::Compressed => assert_ne!(rest[0], 0),
        }
        consumed += used;
        rest = r;
    }
    assert_eq!(consumed + rest.len(), data.len());

    if let Some(Frame::Message(m)) = single_message(data) {
        assert_eq!(&frame(m)[..], data);
    }
    let framed = frame(data);
    assert_eq!(single_message(&framed), Some(Frame::Message(data)));
    let mut two = framed.to_vec();
    two.extend_from_slice(&framed);
    assert_eq!(single_message(&two), None);

    if let Ok(path) = std::str::from_utf8(data) {
        let r = crisp::cri::Route::from_path(path);
        let _ = format!("{r}");
    }
});
