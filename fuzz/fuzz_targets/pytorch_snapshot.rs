#![no_main]
//! Seeds: `fuzz/seeds/` (copy them into `fuzz/corpus/pytorch_snapshot/`). The same body runs over the
//! seeds in `cargo test -p vramhook-analyzer --test corruption`. Fails on a panic, on a report
//! past `max_items`, and on an input that costs more counted work per byte than
//! `vramhook_analyzer::fuzzing::WORK_PER_BYTE` (`devices_share_one_trace.pickle`: 2,000 devices
//! sharing one trace).
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::fuzzing::pytorch_snapshot(data));
