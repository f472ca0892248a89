#![no_main]
//! Seeds: `fuzz/seeds/checkpoint_*` (checkpoints that once passed a limit); the tests also
//! make one from each capture seed with `vramhook_analyzer::fuzzing::model_checkpoint_seed`
//! (the model after half of a capture's events, then the rest). The same body runs over
//! them in `cargo test -p vramhook-analyzer --test corruption`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::fuzzing::model_checkpoint(data));
