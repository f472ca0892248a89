#![no_main]
//! Seeds: `fuzz/seeds/join_*`, made by `vramhook_analyzer::fuzzing::joined_inputs_seed`
//! (a PyTorch snapshot with a capture of the process that holds its segments; a log with
//! the capture of the same run). The same body runs over the seeds in
//! `cargo test -p vramhook-analyzer --test corruption`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::fuzzing::joined_inputs(data));
