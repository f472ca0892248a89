#![no_main]
//! Seeds: `fuzz/seeds/join_*` (a u32 length, a PyTorch snapshot, then a capture of the
//! process that holds its segments). The same body runs over the seeds in
//! `cargo test -p vramhook-analyzer --test corruption`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::fuzzing::snapshot_join(data));
