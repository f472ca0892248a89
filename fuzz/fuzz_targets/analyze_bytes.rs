#![no_main]
//! Seeds: `fuzz/seeds/` (copy them into `fuzz/corpus/analyze_bytes/`). The same body runs over
//! the seeds in `cargo test -p vramhook-analyzer --test corruption`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::fuzzing::analyze_bytes_target(data));
