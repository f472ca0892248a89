//! Framework caches as timelines (issue #10, item 4): the lens's `framework_sample` and
//! `framework_oom` records of a capture, and a PyTorch snapshot's trace, become per process,
//! device and framework series of reserved, allocated, largest free block and fragmentation
//! in the JSON, text and HTML reports.

mod common;
use common::*;
use vramhook_analyzer::render::{html, text};
use vramhook_analyzer::{analyze, analyze_bytes, Options, Report};
use vramhook_protocol::kinds::UNKNOWN_BYTES;

fn cache(r: &Report, pid: u32) -> &vramhook_analyzer::FrameworkTimeline {
    r.timelines.frameworks.iter().find(|f| f.pid == pid).expect("a framework timeline")
}

#[test]
fn lens_records_become_timelines_with_the_agents_numbers() {
    let (bytes, truth) = lens_capture(40, 10);
    let r = analyze_bytes("lens.vhc", &bytes, &Options::default()).expect("analyze");
    assert_valid(&r);
    assert_eq!(r.timelines.frameworks.len(), 1, "only pid 100 has a lens");
    let f = cache(&r, 100);
    assert_eq!((f.device, f.framework.as_str(), f.source.as_str()), (1, "pytorch", "lens"));
    assert_eq!(f.command, "python3 train.py");
    assert_eq!(f.samples, 41, "40 samples and the OOM");
    // Few enough points to keep each one: every reading is there, exactly.
    let alloc: Vec<(u64, f64)> = f.allocated_bytes.iter().map(|p| (p.t_ns, p.last)).collect();
    for (ts, _, a, _) in &truth {
        assert!(alloc.contains(&(*ts, *a as f64)), "allocated {a} at {ts} missing");
    }
    assert!(f.reserved_bytes.iter().all(|p| p.min == (4 * GIB) as f64 && p.max == (4 * GIB) as f64));
    // The largest free block and the fragmentation only where measured (every 10th sample
    // and the OOM), with the agent's formula 1 − largest / (reserved − allocated).
    assert_eq!(f.largest_free_block.len(), 5, "{:?}", f.largest_free_block);
    assert_eq!(f.fragmentation.len(), 5);
    for (ts, reserved, allocated, largest) in truth.iter().filter(|t| t.3 != UNKNOWN_BYTES) {
        let p = f.fragmentation.iter().find(|p| p.t_ns == *ts).expect("fragmentation where measured");
        let free = reserved - allocated;
        let want = if free == 0 { 0.0 } else { 1.0 - *largest as f64 / free as f64 };
        assert!((p.last - want).abs() < 1e-12, "{} vs {want}", p.last);
    }
    let at_oom = f.fragmentation.last().expect("the OOM's reading");
    assert!((at_oom.last - 0.5).abs() < 1e-12, "512 MiB of 1 GiB free in one block: {}", at_oom.last);
    assert_eq!(f.largest_free_block.last().map(|p| p.last), Some((512 * MIB) as f64));
    assert_eq!(f.ooms.len(), 1);
    assert_eq!(f.ooms[0].requested_bytes, 2 * GIB);

    let t = text::render(&r);
    let line = t.lines().find(|l| l.contains("pid 100 dev 1 pytorch (lens, 41 readings)")).expect("text line");
    assert!(line.contains("reserved peak 4.00 GiB"), "{line}");
    assert!(line.contains("largest free block 512.00 MiB (last measured), fragmentation 0.50"), "{line}");
    assert!(line.contains("; 1 framework OOM"), "{line}");
    let h = html::render(&r);
    assert!(h.contains("id=plot-fw-bytes") && h.contains("id=plot-fw-frag"));
    assert!(!h.contains("id=no-framework"));
}

/// A long capture: each series stays within its bound and keeps its extremes.
#[test]
fn framework_timelines_are_bounded_and_keep_their_extremes() {
    let (bytes, truth) = lens_capture(20_000, 10);
    let opts = Options { max_points: 50, ..Options::default() };
    let r = analyze_bytes("long.vhc", &bytes, &opts).expect("analyze");
    let f = cache(&r, 100);
    for s in [&f.reserved_bytes, &f.allocated_bytes, &f.largest_free_block, &f.fragmentation] {
        assert!(!s.is_empty() && s.len() <= 50, "{} points", s.len());
    }
    assert_eq!(f.samples, 20_001);
    let max = f.allocated_bytes.iter().map(|p| p.max).fold(0.0, f64::max);
    let min = f.allocated_bytes.iter().map(|p| p.min).fold(f64::MAX, f64::min);
    assert_eq!(max, truth.iter().map(|t| t.2).max().unwrap_or(0) as f64, "the one full sample survives");
    assert_eq!(min, 0.0);
    let frag_max = f.fragmentation.iter().map(|p| p.max).fold(0.0, f64::max);
    assert!((frag_max - 0.5).abs() < 1e-12, "{frag_max}");
}

#[test]
fn without_a_lens_there_is_no_framework_plot() {
    let (bytes, _) = scenario();
    let r = analyze_bytes("scenario.vhc", &bytes, &Options::default()).expect("analyze");
    assert_valid(&r);
    assert!(r.timelines.frameworks.is_empty());
    assert!(!text::render(&r).contains("FRAMEWORK CACHES"));
    let h = html::render(&r);
    assert!(h.contains("id=no-framework"));
    assert!(!h.contains("id=plot-fw-bytes"));
}

/// The generated snapshot (fixtures/make_torch_snapshot.py): 22 MiB reserved in two
/// segments; in the end 8.5 MiB allocated, the largest free block 8 MiB (segment A's first
/// block), so 1 − 8 / 13.5 fragmented; the OOM of 10 MiB marked.
#[test]
fn a_snapshot_gives_its_cache_timeline() {
    let path = format!("{}/tests/fixtures/torch_snapshot_p4.pickle", env!("CARGO_MANIFEST_DIR"));
    let r = analyze(&[&path], &Options::default()).expect("analyze");
    assert_valid(&r);
    let f = r.timelines.frameworks.first().expect("the snapshot's cache");
    assert_eq!((f.source.as_str(), f.framework.as_str(), f.device), ("snapshot", "pytorch", 0));
    assert_eq!(f.reserved_bytes.iter().map(|p| p.max as u64).max(), Some(22 * MIB));
    // Before the OOM: two 8 MiB blocks and 512 KiB allocated, then 8 MiB freed.
    assert_eq!(f.allocated_bytes.iter().map(|p| p.max as u64).max(), Some(16 * MIB + 512 * 1024));
    assert_eq!(f.allocated_bytes.last().map(|p| p.last as u64), Some(8 * MIB + 512 * 1024));
    assert_eq!(
        f.largest_free_block.len(),
        1,
        "measured once, from the final blocks: {:?} {:?}",
        f.largest_free_block,
        f.allocated_bytes
    );
    assert_eq!(f.largest_free_block[0].last as u64, 8 * MIB);
    let want = 1.0 - 8.0 / 13.5;
    assert!((f.fragmentation[0].last - want).abs() < 1e-12, "{:?}", f.fragmentation);
    assert_eq!(f.ooms.len(), 1);
    assert_eq!(f.ooms[0].requested_bytes, 10 * MIB);
}
