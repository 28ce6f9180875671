//! The relay's HPACK decoder on hostile header blocks (what any client on crisp's socket may
//! send): a sequence of blocks decoded with one table must never panic; whatever crisp
//! re-encodes from a decoded block statelessly must decode, with a fresh table, to the same
//! fields; and the blocks crisp's [`Indexer`] writes for them, one after the other on one
//! table (the runtime connection), must decode to the same fields too, whatever table size the
//! runtime allows (the first input byte) and however it changes (a block's first byte).
#![no_main]

use crisp::proxy::http2::encode_field;
use crisp::proxy::http2::hpack::Decoder;
use crisp::proxy::http2::Indexer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u16, Vec<Vec<u8>>)| {
    let (table, blocks) = input;
    let mut dec = Decoder::default();
    let mut indexer = Indexer::default();
    indexer.peer_table_size(table as u32);
    // The runtime's decoder: crisp's own, checked against RFC 7541's vectors and httlib's.
    let mut runtime = Decoder::default();
    for block in &blocks {
        if block.first().is_some_and(|b| b % 16 == 0) {
            indexer.peer_table_size(u32::from(block.get(1).copied().unwrap_or(0)) * 32);
        }
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
            Decoder::default()
                .decode(&reencoded, |n, v| again.push((n.to_vec(), v.to_vec())))
                .expect("crisp's own encoding must decode");
            assert_eq!(again, fields, "re-encoding changed the fields");
            let mut indexed = Vec::new();
            indexer.begin(&mut indexed);
            for (n, v) in &fields {
                indexer.field(&mut indexed, n, v);
            }
            let mut seen = Vec::new();
            runtime
                .decode(&indexed, |n, v| seen.push((n.to_vec(), v.to_vec())))
                .expect("the runtime must decode crisp's indexed block");
            assert_eq!(seen, fields, "the indexed block decodes to other fields");
        }
    }
});
