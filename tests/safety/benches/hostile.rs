//! Times and peak memory of `vramhook analyze` on each hostile file of the safety suite
//! (`tests/hostile_files.rs` asserts the bounds; times are only measured here).
//!
//!     cargo build --release -p vramhook && \
//!     cargo build --release -p vramhook-safety-tests --bins && \
//!     cargo bench -p vramhook-safety-tests --bench hostile [-- VRAMHOOK_BIN]
//!
//! (The `peak_rss` helper, built with `--bins`, measures each run apart from this process;
//! `HOSTILE_LIMIT_S` (default 120) stops a run that takes longer.)

use vramhook_safety_tests::files_kit::*;

fn main() {
    let bin = std::env::args()
        .skip(1)
        .find(|a| a != "--bench") // what `cargo bench` passes
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| vramhook_safety_tests::repo_root().join("target/release/vramhook"));
    let limit = std::env::var("HOSTILE_LIMIT_S").unwrap_or_else(|_| "120".into());
    let dir = tempfile::tempdir().expect("tempdir");
    // One file at a time, written straight to disk: this process stays small.
    type Make = Box<dyn Fn(&std::path::Path) -> u64>;
    let files: Vec<(&str, Make)> = vec![
        ("capture with 100k OOM failures", Box::new(|p| many_ooms(p, 100_000))),
        ("capture with 300k processes", Box::new(|p| many_processes(p, 300_000))),
        ("capture with 25k processes with an OOM each", Box::new(|p| many_processes_with_an_oom(p, 25_000))),
        ("capture with 50k processes with an OOM each", Box::new(|p| many_processes_with_an_oom(p, 50_000))),
        ("capture with 100k processes with an OOM each", Box::new(|p| many_processes_with_an_oom(p, 100_000))),
        ("capture with 20k processes that each exit", Box::new(|p| many_processes_exiting(p, 20_000))),
        ("capture with 20k processes with process-end frames", Box::new(|p| many_process_ends(p, 20_000))),
        ("capture with 50k distinct device numbers", Box::new(|p| many_devices(p, 50_000))),
        ("capture with 10k processes holding memory, each failing", Box::new(|p| holders_each_failing(p, 10_000))),
        ("capture with 10k VMM arenas x 10k OOM failures", Box::new(|p| arenas_and_ooms(p, 10_000, 10_000))),
        (
            "pickle with 10k segments x 10k shared OOM entries",
            Box::new(|p| segments_and_shared_ooms(p, 10_000, 10_000)),
        ),
        ("pickle of 40 MB", Box::new(|p| big_snapshot(p, 40 << 20))),
        ("pickle of tuples nested 200,000 deep", Box::new(|p| nested_tuples(p, 200_000))),
    ];
    println!("| hostile file | size | wall | peak RSS | exit |");
    println!("|---|---|---|---|---|");
    for (i, (name, make)) in files.iter().enumerate() {
        let path = dir.path().join(format!("f{i}"));
        let len = make(&path);
        // A wrapper that stops a run after `limit` s (its peak memory counts the analyzer's).
        let mut cmd = std::process::Command::new("timeout");
        cmd.arg(&limit).arg(&bin).arg("analyze").arg("--json").arg(&path);
        let m = run_measured(&mut cmd);
        println!(
            "| {name} | {:.1} MB | {:.2} s | {:.0} MiB | {} |",
            len as f64 / 1e6,
            m.wall.as_secs_f64(),
            m.max_rss_kib as f64 / 1024.0,
            match m.output.status.code() {
                Some(124) => format!("stopped after {limit} s"),
                Some(c) => c.to_string(),
                None => format!("{:?}", m.output.status),
            }
        );
    }
}
