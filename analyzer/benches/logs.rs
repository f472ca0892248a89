//! Log-reading speed: `cargo bench -p vramhook-analyzer --bench logs [-- MiB]`.
//! Reads MiB (default 512) of log text from memory through every parser — a service's
//! ordinary lines with the real H200 OOM logs of `tests/fixtures/h200-oom/` woven in — and
//! prints MB/s for plain text and for the same text gzipped. Five interleaved rounds; the
//! median is what counts (target: at least 200 MB/s on plain text).

use std::io::Write;
use std::time::Instant;

fn main() {
    let mib: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(512);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/h200-oom");
    let mut real = Vec::new();
    for name in ["torch_default_fragmented.log", "torch_default_other_process.log", "jax_bfc_fragmented.log"] {
        real.extend(std::fs::read(root.join(name)).unwrap_or_default());
    }
    let mut block = Vec::new();
    for i in 0..20_000u32 {
        let _ = writeln!(
            block,
            "Dec 01 05:06:{:02} gpu-host python3[468]: INFO:     127.0.0.1:5{:04} - \"POST /v1/completions HTTP/1.1\" 200 OK",
            i % 60,
            i % 10_000
        );
    }
    block.extend_from_slice(&real);
    let mut text = Vec::with_capacity(mib << 20);
    while text.len() < mib << 20 {
        text.extend_from_slice(&block);
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let _ = gz.write_all(&text);
    let gzipped = gz.finish().unwrap_or_default();
    let (mut plain, mut packed) = (Vec::new(), Vec::new());
    let mut incidents = 0;
    for _ in 0..5 {
        let t = Instant::now();
        if let Ok((r, _)) = vramhook_analyzer::logs::read_log("bench", &text[..], false) {
            incidents = r.incidents;
        }
        plain.push(text.len() as f64 / t.elapsed().as_secs_f64() / 1e6);
        let t = Instant::now();
        let _ = vramhook_analyzer::logs::read_log("bench.gz", &gzipped[..], true);
        packed.push(text.len() as f64 / t.elapsed().as_secs_f64() / 1e6);
    }
    plain.sort_by(f64::total_cmp);
    packed.sort_by(f64::total_cmp);
    println!(
        "logs: {} MB, {} incidents per pass; plain text {:.0} MB/s (median of 5; {:.0}..{:.0}); gzip {:.0} MB/s of text",
        text.len() / 1_000_000,
        incidents,
        plain[2],
        plain[0],
        plain[4],
        packed[2]
    );
}
