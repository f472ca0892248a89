#![no_main]
//! A ring as a hostile writer may leave it (cursors, counters and slots from the input),
//! drained by a reader that polls, commits and restarts. The same body runs over random
//! rings in `cargo test -p vramhook-ring -- never_panic_the_reader`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_ring::fuzzing::ring_reader(data));
