#![no_main]
//! Seeds: `fuzz/seeds/` (copy them into `fuzz/corpus/pytorch_snapshot/`). The same body runs over the
//! seeds in `cargo test -p vramhook-analyzer --test corruption`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::fuzzing::pytorch_snapshot(data));
