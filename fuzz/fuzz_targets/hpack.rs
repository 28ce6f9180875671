//! The relay's HPACK decoder on hostile header blocks (what any client on crisp's socket may
//! send): a sequence of blocks decoded with one table must never panic, and whatever crisp
//! re-encodes from a decoded block (stateless) must decode, with a fresh table, to the same
//! fields.
#![no_main]

use crisp::proxy::frames::encode_field;
use crisp::proxy::hpack::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|blocks: Vec<Vec<u8>>| {
    let mut dec = Decoder::default();
    for block in &blocks {
        let mut fields = Vec::new();
        let mut reencoded = Vec::new();
        let ok = dec
            .decode(block, |n, v| {
                fields.push((n.to_vec(), v.to_vec()));
                encode_field(&mut reencoded, n, v);
            })
            .is_ok();
        if ok {
            let mut again = Vec::new();
            Decoder::default().decode(&reencoded, |n, v| again.push((n.to_vec(), v.to_vec()))).expect("crisp's own encoding must decode");
            assert_eq!(again, fields, "re-encoding changed the fields");
        }
    }
});
