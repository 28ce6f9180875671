//! crisp's HPACK Huffman decoder (`crisp::proxy::http2::huffman`, what the relay runs on every Huffman
//! literal a client sends) against httlib-huffman on the same bytes: never a panic; both accept
//! with the same output or both reject, except for padding that contains a 0 bit, which crisp
//! rejects (RFC 7541 §5.2) and httlib-huffman accepts; and the input read as text round-trips
//! through httlib-huffman's encoder and crisp's decoder.
#![no_main]

use crisp::proxy::http2::huffman::{decode, HuffmanError};
use httlib_huffman::DecoderSpeed;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut ours = Vec::new();
    let ours = decode(data, &mut ours).map(|()| ours);
    let mut theirs = Vec::new();
    let theirs = httlib_huffman::decode(data, &mut theirs, DecoderSpeed::FourBits).map(|()| theirs);
    match (ours, theirs) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the decoders disagree on the output"),
        (Err(_), Err(_)) => {}
        (Err(HuffmanError::Padding), Ok(text)) => {
            // Only the padding (under 8 bits, so in the last byte) may differ from the canonical
            // encoding of `text`, which pads with ones: `data` has a 0 where it has a 1.
            let mut canonical = Vec::new();
            httlib_huffman::encode(&text, &mut canonical).expect("every byte has a code");
            let (Some((&last, body)), Some((&want_last, want_body))) =
                (data.split_last(), canonical.split_last())
            else {
                panic!("httlib-huffman accepted an empty string crisp rejects");
            };
            assert_eq!(body, want_body, "crisp rejected more than bad padding");
            assert!(
                last != want_last && last | want_last == want_last,
                "crisp rejected more than bad padding"
            );
        }
        (ours, theirs) => panic!("crisp {ours:?} vs httlib-huffman {theirs:?}"),
    }

    let mut coded = Vec::new();
    httlib_huffman::encode(data, &mut coded).expect("every byte has a code");
    let mut text = Vec::new();
    decode(&coded, &mut text).expect("an encoder's output must decode");
    assert_eq!(text, data);
});
