#![no_main]
//! Seeds: `fuzz/seeds/model_checkpoint_*`, made by `vramhook_analyzer::fuzzing::model_checkpoint_seed`
//! from the capture seeds (the model after half of a capture's events, then the rest).
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::fuzzing::model_checkpoint(data));
