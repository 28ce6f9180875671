//! The relay's connection core (`crisp::proxy::relay_fuzzing`, issue #36) driven by arbitrary
//! interleavings of both peers' bytes (frames over the frame size included), the diverted
//! streams' commands (headers, DATA within the budget the core's credit gives back, trailers,
//! resets, request credit, ends), the runtime's failure and return, crisp's GOAWAY and time
//! steps, the timers fired when `poll_timeout` says. Beyond "no panic", after every step: the
//! client's connection window is never negative; no timer is still due after `handle_timeout`;
//! the runtime gets whole frames, header blocks it decodes in order, new streams in id order, no
//! DATA ahead of its stream's HEADERS and no frame of a diverted stream; a stream is diverted at
//! most once and never also relayed; a diverted stream is reset at most once, its answer ends at
//! most once with nothing after it, and the DATA the core keeps for it stays within the task's
//! budget; every call ends at most once, and all relayed and held calls have ended when the
//! client goes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| crisp::proxy::relay_fuzzing::run(data));
