//! The post-mortem of the demo's workload reads cleanly: repeated identical arena lines are
//! folded into one, a lens record's byte counts are never printed as an address, paths are
//! folded (no `dir/../`), and counts of one are singular.

use std::path::Path;
use std::process::Command;
use vramhook_testkit::{sim_dir, vramhook_bin};

fn vramhook(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(vramhook_bin()).current_dir(dir).args(args).output().expect("run vramhook");
    assert!(out.status.success() || args[0] == "run", "vramhook {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn the_demo_report_reads_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Started through a path with `..` in it, as the demo does from target/<profile>.
    let program = sim_dir().join("../build/workloads/torch_fragmented");
    vramhook(dir.path(), &["run", "--record", "f.vhc", "--", program.to_str().unwrap()]);
    let text = vramhook(dir.path(), &["analyze", "f.vhc", "--html", "f.html"]);
    let html = std::fs::read_to_string(dir.path().join("f.html")).expect("HTML");

    // 16 one-block segments: one line, not 16.
    let seg_lines: Vec<&str> = text.lines().filter(|l| l.contains("framework segment")).collect();
    assert_eq!(seg_lines.len(), 1, "{text}");
    assert!(
        seg_lines[0].contains("16 framework segments of 1000.00 MiB") && seg_lines[0].ends_with("one free block each"),
        "{}",
        seg_lines[0]
    );
    assert!(!text.contains("FrameworkSegment"), "no Rust enum name: {text}");

    // A lens sample's words are byte counts: never "at 0x…".
    let lens: Vec<&str> = text.lines().filter(|l| l.contains("framework_sample")).collect();
    assert!(!lens.is_empty(), "{text}");
    for l in lens {
        assert!(!l.contains(" at 0x") && l.contains("allocated of"), "{l}");
    }

    // Paths folded.
    for (what, s) in [("text", &text), ("HTML", &html)] {
        assert!(!s.contains("/../") && !s.contains("/./"), "{what} has an unfolded path");
    }
    assert!(text.contains("/tests/simcuda/build/workloads/torch_fragmented"), "{text}");

    // Singular for one.
    assert!(text.contains("after 2 failures, 1 retry;"), "{text}");
    assert!(html.contains(" · 1 process · 1 OOM incident · 1 leak<"), "the HTML summary's counts");
    for bad in ["1 processes", "1 leaks", "1 retries", "1 OOM incidents"] {
        assert!(!text.contains(bad) && !html.contains(bad), "{bad}");
    }
}
