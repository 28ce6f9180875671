//! The relay's connection core (`crisp::proxy::relay_fuzzing`, issue #36) driven by arbitrary
//! interleavings of both peers' bytes, the diverted streams' sends, the runtime's failure,
//! crisp's GOAWAY and time steps. Beyond "no panic", after every step: the client's connection
//! window is never negative; the runtime gets whole frames, header blocks it decodes in order,
//! new streams in id order, no DATA ahead of its stream's HEADERS or for a diverted stream; a
//! stream is diverted at most once and never also relayed; every call ends at most once, and all
//! relayed and held calls have ended when the client goes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| crisp::proxy::relay_fuzzing::run(data));
