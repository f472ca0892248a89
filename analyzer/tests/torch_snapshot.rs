//! PyTorch snapshot import: generated snapshot-shaped pickles (protocols 2, 4, 5; see
//! `fixtures/make_torch_snapshot.py`) and, once committed, the real H200 snapshot.

mod common;
use common::*;
use vramhook_analyzer::{analyze, analyze_bytes, Options};

const KIB: u64 = 1 << 10;

#[test]
fn generated_snapshots_import_with_the_same_numbers_in_every_protocol() {
    for proto in [2, 4, 5] {
        let path = format!("{}/tests/fixtures/torch_snapshot_p{proto}.pickle", env!("CARGO_MANIFEST_DIR"));
        let r = analyze(&[&path], &Options::default()).expect("analyze");
        assert_valid(&r);
        let t = r.inputs[0].pytorch.as_ref().expect("pytorch totals");
        assert_eq!(t.segments, 2);
        assert_eq!(t.blocks, 5);
        assert_eq!(t.trace_entries, 8);
        assert_eq!(t.reserved_bytes, 22 * MIB, "memory_reserved");
        assert_eq!(t.allocated_bytes, 8 * MIB + 512 * KIB, "memory_allocated");
        assert_eq!(t.reserved_unallocated_bytes, 13 * MIB + 512 * KIB, "reserved but unallocated, from the model");
        assert_eq!(r.ooms.len(), 1);
        let o = &r.ooms[0];
        assert_eq!(o.requested_bytes, 10 * MIB);
        assert_eq!(o.device_free_bytes, Some(6 * MIB));
        // A snapshot's `oom` entry is PyTorch giving up: its cache's numbers decide
        // (before the lens work this read as a segment's "arena fragmentation").
        assert_eq!(o.verdict_name, "framework_fragmentation", "{}", o.explanation);
        assert_eq!(o.outcome, vramhook_model::Outcome::Failed);
        assert!(
            o.explanation.contains("13.50 MiB (14,155,776 bytes) reserved by PyTorch but unallocated"),
            "{}",
            o.explanation
        );
        assert_eq!(o.arena_largest_free_span, 8 * MIB);
        let frag = r.fragmentation.iter().find(|a| a.size == 20 * MIB).expect("segment A as an arena");
        assert!((frag.fragmentation.last().map_or(0.0, |p| p.last) - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(r.processes[0].final_live_bytes, 22 * MIB);
    }
}

#[test]
fn malformed_pickles_are_errors_not_panics() {
    let path = format!("{}/tests/fixtures/torch_snapshot_p4.pickle", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(path).expect("fixture");
    for cut in 0..bytes.len() {
        let _ = analyze_bytes("cut.pickle", &bytes[..cut], &Options::default());
    }
    // Not a snapshot at all: a pickled list of ints.
    let r = analyze_bytes("ints.pickle", &[0x80, 2, b']', b'K', 1, b'a', b'.'], &Options::default());
    assert!(r.is_ok() || r.is_err());
    let e = analyze_bytes("int.pickle", &[0x80, 2, b'K', 1, b'.'], &Options::default()).expect_err("not a snapshot");
    assert!(e.to_string().contains("segments"), "{e}");
}

/// Bytes from PyTorch's "770.00 MiB" / "0 bytes" wording just before `marker`.
fn bytes_before(msg: &str, marker: &str) -> Option<f64> {
    let i = msg.find(marker)?;
    let words: Vec<&str> = msg[..i].split_whitespace().collect();
    let n = words.len();
    let (num, unit) = (words.get(n.checked_sub(2)?)?, words.get(n.checked_sub(1)?)?);
    let mul = match unit.trim_end_matches('.') {
        "GiB" => (1u64 << 30) as f64,
        "MiB" => (1u64 << 20) as f64,
        "KiB" => 1024.0,
        _ => 1.0,
    };
    Some(num.parse::<f64>().ok()? * mul)
}

/// PyTorch prints two decimals of GiB/MiB: equal within half a unit of the last digit.
fn close(ours: u64, theirs: f64) -> bool {
    let unit = if theirs >= (1u64 << 30) as f64 { (1u64 << 30) as f64 } else { (1u64 << 20) as f64 };
    (ours as f64 - theirs).abs() <= 0.005 * unit + 1.0
}

/// The real snapshot from the H200 run (`tests/fixtures/torch_snapshot_h200.pickle`), against
/// PyTorch's own numbers for that run (`.txt`: JSON lines; the `"phase": "oom"` line has
/// `reserved`, `allocated` and PyTorch's OOM message).
#[test]
fn real_h200_snapshot_matches_pytorchs_own_numbers() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
    let pickle = format!("{root}/torch_snapshot_h200.pickle");
    let txt = std::fs::read_to_string(format!("{root}/torch_snapshot_h200.txt")).expect("PyTorch's numbers");
    let oom: serde_json::Value = txt
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["phase"] == "oom")
        .expect("an oom line");
    let msg = oom["message"].as_str().expect("message");
    let r = analyze(&[&pickle], &Options::default()).expect("analyze the real snapshot");
    assert_valid(&r);
    let t = r.inputs[0].pytorch.as_ref().expect("pytorch totals");
    // At the snapshot (taken after the OOM), memory_reserved and memory_allocated exactly.
    assert_eq!(Some(t.reserved_bytes), oom["reserved"].as_u64(), "memory_reserved");
    assert_eq!(Some(t.allocated_bytes), oom["allocated"].as_u64(), "memory_allocated");
    // The model's reserved-but-unallocated figure against PyTorch's OOM message.
    let unalloc = bytes_before(msg, "is reserved by PyTorch but unallocated").expect("unallocated figure in message");
    assert!(
        close(t.reserved_unallocated_bytes, unalloc),
        "ours {} vs PyTorch's {unalloc}",
        t.reserved_unallocated_bytes
    );
    let allocated = bytes_before(msg, "is allocated by PyTorch").expect("allocated figure in message");
    assert!(close(t.allocated_bytes, allocated), "allocated {} vs {allocated}", t.allocated_bytes);
    // The OOM itself: the request and the free bytes PyTorch reported.
    assert_eq!(r.ooms.len(), 1);
    let o = &r.ooms[0];
    let tried = bytes_before(msg, ". GPU").expect("Tried to allocate");
    assert!(close(o.requested_bytes, tried), "requested {} vs {tried}", o.requested_bytes);
    let free = bytes_before(msg, "is free").expect("free figure");
    assert!(close(o.device_free_bytes.unwrap_or(0), free), "free {:?} vs {free}", o.device_free_bytes);
    assert_eq!(o.verdict_name, "capacity");
}

#[test]
fn memo_references_cannot_make_the_import_quadratic() {
    // {'segments': L, 'device_traces': [L] * 2000} with L a list of 100,000 ints: a 110 kB
    // file naming 200 million elements. The importer stops with a clear error, quickly.
    let mut p = vec![0x80, 4, b'}', 0x94, b'(', 0x8c, 8];
    p.extend_from_slice(b"segments");
    p.extend_from_slice(&[b']', 0x94, b'(']);
    for _ in 0..100_000 {
        p.extend_from_slice(&[b'K', 0]);
    }
    p.extend_from_slice(&[b'e', 0x8c, 13]);
    p.extend_from_slice(b"device_traces");
    p.extend_from_slice(b"](");
    for _ in 0..2000 {
        p.extend_from_slice(&[b'h', 1]);
    }
    p.extend_from_slice(b"eu.");
    let t = std::time::Instant::now();
    let e = analyze_bytes("bomb.pickle", &p, &Options::default()).expect_err("too large");
    assert!(e.to_string().contains("too large"), "{e}");
    assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
}

/// The real H200 snapshot of issue #10: PyTorch's default allocator, 139 cached 1 GiB
/// segments each keeping a 600 MiB tensor, then 2 GiB asked for. PyTorch's own message
/// (tests/fixtures/h200-oom/torch_default_fragmented.log): "81.45 GiB is allocated by
/// PyTorch, and 57.55 GiB is reserved by PyTorch but unallocated".
#[test]
fn the_h200_fragmented_snapshot_gives_the_fatal_request_its_own_framework_fragmentation_incident() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/h200-oom/torch_fragmented_snapshot.pickle");
    let r = analyze(&[path], &Options::default()).expect("analyze");
    assert_valid(&r);
    let log = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/h200-oom/torch_default_fragmented.log"
    ))
    .expect("PyTorch's own message");
    assert!(log.contains("81.45 GiB is allocated by PyTorch, and 57.55 GiB is reserved by PyTorch but unallocated"));
    assert_eq!(r.ooms.len(), 2, "the 1 GiB failure while filling, and the fatal 2 GiB one");
    let (fill, fatal) = (&r.ooms[0], &r.ooms[1]);
    assert_eq!((fill.requested_bytes, fatal.requested_bytes), (1 << 30, 2 << 30));
    assert_eq!(fill.verdict_name, "capacity", "every segment was in use then: {}", fill.explanation);
    assert_eq!(fatal.verdict_name, "framework_fragmentation", "{}", fatal.explanation);
    assert_eq!(fatal.outcome, vramhook_model::Outcome::Failed);
    for quoted in [
        "81.45 GiB (87,451,238,400 bytes) allocated by PyTorch",
        "57.55 GiB (61,798,875,136 bytes) reserved by PyTorch but unallocated",
        "largest free block was 424.00 MiB",
        "139 pieces over 139 of its 139 segments",
        "expandable_segments:True",
    ] {
        assert!(fatal.explanation.contains(quoted), "{quoted:?} not in {}", fatal.explanation);
    }
    // Cache-wide fragmentation leads; each segment alone holds one free block (0.00).
    assert!(fatal.cache_fragmentation.is_some_and(|f| f > 0.99), "{:?}", fatal.cache_fragmentation);
    let l = fatal.framework_oom.as_ref().expect("PyTorch's numbers at its OOM");
    assert_eq!(l.reserved - l.allocated, 61_798_875_136);
}
