#![no_main]
//! Seeds: `tests/fixtures/h200-oom/*.log` and `tests/fixtures/logs/*.log`, each prefixed by a
//! byte that picks the parser (0 PyTorch, 1 XLA BFC, 2 ggml, 3 vLLM, other: all). The same
//! body runs over those fixtures in `cargo test -p vramhook-analyzer --test logs`.
libfuzzer_sys::fuzz_target!(|data: &[u8]| vramhook_analyzer::logs::fuzz_target(data));
