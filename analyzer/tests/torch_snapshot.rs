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
        let o = &r.ooms[0].incident;
        assert_eq!(o.requested_bytes, 10 * MIB);
        assert_eq!(o.device_free_bytes, Some(6 * MIB));
        // A snapshot's `oom` entry is PyTorch giving up: its cache's numbers decide
        // (before the lens work this read as a segment's "arena fragmentation").
        assert_eq!(o.verdict.name(), "framework_fragmentation", "{}", o.explanation);
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
    let o = &r.ooms[0].incident;
    let tried = bytes_before(msg, ". GPU").expect("Tried to allocate");
    assert!(close(o.requested_bytes, tried), "requested {} vs {tried}", o.requested_bytes);
    let free = bytes_before(msg, "is free").expect("free figure");
    assert!(close(o.device_free_bytes.unwrap_or(0), free), "free {:?} vs {free}", o.device_free_bytes);
    assert_eq!(o.verdict.name(), "capacity");
}

#[test]
fn memo_references_cannot_make_the_import_quadratic() {
    // {'segments': L, 'device_traces': [L] * 2000} with L a list of 100,000 ints: a 200 kB
    // file naming 200 million elements. The importer reads 2 elements per byte of the file
    // and says how many it did not read, quickly.
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
    let (r, work) = vramhook_analyzer::analyze_bytes_work("bomb.pickle", &p, &Options::default());
    let r = r.expect("a report of what was read");
    assert!(work.items_expanded <= 2 * p.len() as u64 + 4096, "{work:?}");
    let note = r.notes.iter().find(|n| n.contains("list elements not read")).expect("a note");
    let named = 100_000 + 2000 + 2000 * 100_000;
    assert!(note.starts_with(&format!("bomb.pickle: {} list elements", named - work.items_expanded)), "{note}");
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
    let (fill, fatal) = (&r.ooms[0].incident, &r.ooms[1].incident);
    assert_eq!((fill.requested_bytes, fatal.requested_bytes), (1 << 30, 2 << 30));
    assert_eq!(fill.verdict.name(), "capacity", "every segment was in use then: {}", fill.explanation);
    assert_eq!(fatal.verdict.name(), "framework_fragmentation", "{}", fatal.explanation);
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
    // Recorded with memory history (`stacks="all"`: C++ and Python frames): the live
    // allocations at the fatal OOM are the 139 kept 600 MiB tensors, all made at line 61 of
    // the program, 81.45 GiB as PyTorch said; the request was line 43 (`oom`) called from 65.
    let live = r.ooms[1].live_at_oom.as_ref().expect("the stacks of the live allocations");
    assert_eq!((live.allocations, live.bytes, live.without_stack), (139, 87_451_238_400, 0));
    assert_eq!(live.stacks.len(), 1);
    let s = &live.stacks[0];
    assert_eq!((s.allocations, s.bytes, s.largest_bytes), (139, 87_451_238_400, 600 * MIB));
    let at =
        |f: &vramhook_analyzer::StackFrame| format!("{}:{} {}", f.file.rsplit('/').next().unwrap(), f.line, f.function);
    assert_eq!(s.frames.iter().map(at).collect::<Vec<_>>(), ["torch_oom.py:61 <module>"], "C++ frames left out");
    assert_eq!(
        live.request_frames.iter().map(at).collect::<Vec<_>>(),
        ["torch_oom.py:43 oom", "torch_oom.py:65 <module>"]
    );
    // While filling: every 1 GiB tensor of line 56 was live, and line 56 asked for one more.
    let live = r.ooms[0].live_at_oom.as_ref().expect("stacks at the first OOM");
    assert_eq!((live.allocations, live.bytes), (139, 139 << 30));
    assert_eq!(live.stacks[0].frames.iter().map(at).collect::<Vec<_>>(), ["torch_oom.py:56 <module>"]);
    assert_eq!(live.request_frames.iter().map(at).collect::<Vec<_>>(), ["torch_oom.py:56 <module>"]);
    let text = vramhook_analyzer::render::text::render(&r);
    for line in [
        "live at the OOM (PyTorch snapshot torch_fragmented_snapshot.pickle, memory history): 139 allocation(s), 81.45 GiB; by stack, most bytes first:",
        "  81.45 GiB in 139 allocation(s) (largest 600.00 MiB)",
        "    /work/main/scripts/gpu/oom/torch_oom.py:61 in <module>",
        "the failed request of 2.00 GiB was made at:",
        "    /work/main/scripts/gpu/oom/torch_oom.py:43 in oom",
    ] {
        assert!(text.contains(line), "{line:?} not in {text}");
    }
    let page = vramhook_analyzer::render::html::render(&r);
    assert_eq!(page.matches("<details class=live-stacks open>").count(), 2);
    assert!(page.contains("/work/main/scripts/gpu/oom/torch_oom.py:61 in &lt;module&gt;"));
}

/// The real pair of issue #10: the capture and PyTorch's snapshot of the same H200 process
/// (`h200-oom/torch_default_fragmented.vhc`, `torch_fragmented_snapshot.pickle`). The
/// snapshot joins pid 468 on all 139 segments, in either order on the command line: its
/// incidents, arenas and cache timeline are that process's, and its segments are not counted
/// twice.
#[test]
fn a_snapshot_joins_the_capture_process_it_was_dumped_from() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/h200-oom");
    let cap = format!("{dir}/torch_default_fragmented.vhc");
    let snap = format!("{dir}/torch_fragmented_snapshot.pickle");
    let alone = analyze(&[&cap], &Options::default()).expect("the capture alone");
    for order in [[&cap, &snap], [&snap, &cap]] {
        let r = analyze(&order, &Options::default()).expect("analyze the pair");
        assert_valid(&r);
        let input = r.inputs.iter().find(|i| i.pytorch.is_some()).expect("the snapshot's input");
        let j = input.pytorch.as_ref().and_then(|p| p.join.as_ref()).expect("a join decision");
        assert!(j.joined, "{}", j.reason);
        assert_eq!((j.pid, j.segments, j.matched), (Some(468), 139, 139), "{}", j.reason);
        assert_eq!(
            r.processes.len(),
            1,
            "no synthetic process: {:?}",
            r.processes.iter().map(|p| p.pid).collect::<Vec<_>>()
        );
        assert_eq!(r.processes[0].pid, 468);
        // Its segments are the capture's allocations: not counted twice, and the device's
        // total is the driver's, not free + reserved.
        assert_eq!(r.devices[0].peak_live_bytes, alone.devices[0].peak_live_bytes);
        assert_eq!(r.devices[0].total_bytes, alone.devices[0].total_bytes);
        assert!(r.leaks.iter().all(|l| l.pid == 468));
        // The snapshot's incidents, under pid 468, each naming the capture's one.
        let from_snap: Vec<_> = r.ooms.iter().filter(|o| o.from_snapshot.is_some()).collect();
        assert_eq!(from_snap.len(), 2);
        assert!(from_snap.iter().all(|o| o.incident.pid == 468 && o.incident.command.contains("torch_oom.py")));
        let fatal = from_snap.iter().find(|o| o.incident.requested_bytes == 2 << 30).expect("the 2 GiB failure");
        let (fatal_id, fatal) = (fatal.same_failure_as, &fatal.incident);
        assert_eq!(fatal.verdict.name(), "framework_fragmentation", "{}", fatal.explanation);
        assert!(fatal.explanation.starts_with("process 468 (python3"), "{}", fatal.explanation);
        let same = r.ooms.iter().find(|o| Some(o.incident.id) == fatal_id).expect("the capture's incident");
        assert_eq!(
            (same.incident.pid, same.incident.requested_bytes, same.from_snapshot.as_deref()),
            (468, 2 << 30, None)
        );
        assert_eq!(same.incident.verdict.name(), "capacity", "the driver alone");
        // The capture's incident of the same failure lists the snapshot's stacks; the
        // snapshot's incident points to it.
        let live = same.live_at_oom.as_ref().expect("stacks copied to the capture's incident");
        assert_eq!((live.allocations, live.bytes), (139, 87_451_238_400));
        assert_eq!(live.stacks[0].frames[0].line, 61);
        // Blocks and fragmentation: the snapshot's segments are pid 468's arenas.
        assert_eq!(r.fragmentation.len(), 139);
        assert!(r.fragmentation.iter().all(|a| a.pid == 468));
        let f = r.timelines.frameworks.iter().find(|f| f.source == "snapshot").expect("the cache timeline");
        assert_eq!(f.pid, 468);
        assert!(f.command.contains("torch_oom.py"), "{}", f.command);
        assert_eq!(f.allocated_bytes.last().map(|p| p.last as u64), Some(87_451_238_400));
        let text = vramhook_analyzer::render::text::render(&r);
        assert!(text.contains("joined to pid 468: 139 of its 139 segments are allocations of pid 468"), "{text}");
        assert!(text.contains("the same failure as #"), "{text}");
        assert_eq!(text.matches("/work/main/scripts/gpu/oom/torch_oom.py:61 in <module>").count(), 1, "{text}");
        assert!(text.contains("live allocations and stacks at this OOM: under #"), "{text}");
        let page = vramhook_analyzer::render::html::render(&r);
        assert!(page.contains("<span class=snapshot-join>joined to pid 468: 139 of its 139 segments"));
        assert_eq!(page.matches("<span class=from-snapshot>from the PyTorch snapshot").count(), 2);
    }
    // --pid 468 keeps what the snapshot joined to it.
    let r = analyze(&[&cap, &snap], &Options { pids: vec![468], ..Options::default() }).expect("analyze");
    assert_eq!(r.ooms.iter().filter(|o| o.from_snapshot.is_some()).count(), 2);
    assert_eq!(r.fragmentation.len(), 139);
    assert_eq!(r.timelines.frameworks.len(), 1);
}

/// Captures for the generated snapshot (segment A, 20 MiB at 0x7f0000000000, and B, 2 MiB at
/// 0x7f0002000000, on device 0): `holders` lists, per process, the segments it allocates
/// and on which device.
/// A process, the (address, size) segments it allocates, and its device.
type Holder<'a> = (u32, &'a [(u64, u64)], i16);

fn capture_with(holders: &[Holder<'_>]) -> tempfile::NamedTempFile {
    use vramhook_protocol::capture::CaptureWriter;
    use vramhook_protocol::kinds::UNKNOWN_BYTES;
    use vramhook_protocol::record::{Api, Event, FrameworkId};
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("writer");
    let mut evs = Vec::new();
    for (k, (pid, segs, device)) in holders.iter().enumerate() {
        for (n, (addr, size)) in segs.iter().enumerate() {
            let ts = 1_000_000 + (k * 10 + n) as u64 * 1000;
            evs.push(ev(*pid, ts, Event::alloc(Api::cuMemAlloc_v2, *addr, *size)).on_device(*device));
        }
        // What a lens says of the same cache: reserved, nothing allocated yet.
        let reserved = segs.iter().map(|s| s.1).sum();
        let sample = Event::framework_sample(FrameworkId::PyTorch, reserved, 0, UNKNOWN_BYTES, segs.len() as u64);
        evs.push(ev(*pid, 2_000_000 + k as u64, sample).on_device(*device));
    }
    w.write_events(&evs).expect("events");
    let f = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(f.path(), w.finish().expect("finish")).expect("write capture");
    f
}

const A: (u64, u64) = (0x7F00_0000_0000, 20 * MIB);
const B: (u64, u64) = (0x7F00_0200_0000, 2 * MIB);

fn join_of(holders: &[Holder<'_>]) -> (vramhook_analyzer::Report, vramhook_analyzer::SnapshotJoin) {
    let cap = capture_with(holders);
    let snap = format!("{}/tests/fixtures/torch_snapshot_p4.pickle", env!("CARGO_MANIFEST_DIR"));
    let r = analyze(&[cap.path().to_str().expect("path"), &snap], &Options::default()).expect("analyze");
    assert_valid(&r);
    let j = r.inputs[1].pytorch.as_ref().and_then(|p| p.join.clone()).expect("a join decision");
    (r, j)
}

#[test]
fn one_process_holding_the_segments_gets_the_snapshot() {
    let (r, j) = join_of(&[(100, &[A, B], 0), (200, &[(0x9000_0000, 4 * MIB)], 0)]);
    assert!(j.joined && j.pid == Some(100) && j.matched == 2 && j.segments == 2, "{j:?}");
    assert_eq!(j.candidates.len(), 1);
    assert!(r.processes.iter().all(|p| p.pid == 100 || p.pid == 200), "{:?}", r.processes);
    let o = r.ooms.iter().find(|o| o.from_snapshot.is_some()).expect("the snapshot's OOM");
    assert_eq!((o.incident.pid, o.incident.verdict.name()), (100, "framework_fragmentation"));
    assert_eq!(o.same_failure_as, None, "the capture has no failure of its own");
    assert!(r.fragmentation.iter().all(|a| a.pid == 100));
    // The snapshot's 22 MiB are the capture's allocations: pid 100 holds them once.
    assert_eq!(r.devices[0].peak_live_bytes, 22 * MIB + 4 * MIB);
    // The lens's readings and the snapshot's of pid 100's cache are two timelines.
    let mut sources: Vec<(u32, &str)> = r.timelines.frameworks.iter().map(|f| (f.pid, f.source.as_str())).collect();
    sources.sort_unstable();
    assert_eq!(sources, vec![(100, "lens"), (100, "snapshot"), (200, "lens")]);
}

#[test]
fn no_match_or_an_ambiguous_one_stays_separate_and_says_why() {
    let synthetic = |r: &vramhook_analyzer::Report| r.processes.iter().any(|p| p.pid > 1 << 22);
    // Two processes with the same device addresses (possible: each has its own address space).
    let (r, j) = join_of(&[(100, &[A, B], 0), (101, &[A, B], 0)]);
    assert!(!j.joined && j.pid.is_none(), "{j:?}");
    assert!(j.reason.starts_with("ambiguous") && j.reason.contains("100 (2), 101 (2)"), "{}", j.reason);
    assert_eq!(j.candidates.len(), 2);
    assert!(synthetic(&r));
    assert!(vramhook_analyzer::render::text::render(&r).contains("not joined to a capture's process: ambiguous"));
    // Half the segments is not a majority.
    let (r, j) = join_of(&[(100, &[A], 0)]);
    assert!(!j.joined && j.matched == 1, "{j:?}");
    assert!(j.reason.contains("at most 1 of its 2 segments"), "{}", j.reason);
    assert!(synthetic(&r));
    // The right addresses on another device.
    let (_, j) = join_of(&[(100, &[A, B], 1)]);
    assert!(!j.joined && j.candidates.is_empty(), "{j:?}");
    assert!(j.reason.contains("none of its 2 segments"), "{}", j.reason);
    // Same address, another size.
    let (_, j) = join_of(&[(100, &[(A.0, 8 * MIB), (B.0, MIB)], 0)]);
    assert!(!j.joined && j.candidates.is_empty(), "{j:?}");
    // A snapshot alone has nothing to join.
    let snap = format!("{}/tests/fixtures/torch_snapshot_p4.pickle", env!("CARGO_MANIFEST_DIR"));
    let r = analyze(&[&snap], &Options::default()).expect("analyze");
    assert!(r.inputs[0].pytorch.as_ref().is_some_and(|p| p.join.is_none()));
}

/// A hand-made snapshot with memory history (`fixtures/make_torch_snapshot.py`): the
/// allocations live at its OOM, grouped by stack, with a block older than the trace (its
/// stack from the final blocks), C++ frames left out where Python ones exist, a C++-only
/// stack, a block without frames, a freed block not counted, and more stacks than listed.
#[test]
fn the_allocations_live_at_a_snapshots_oom_are_grouped_by_stack() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let r = analyze(&[&format!("{dir}/torch_snapshot_stacks.pickle")], &Options::default()).expect("analyze");
    assert_valid(&r);
    assert_eq!(r.ooms.len(), 1);
    let live = r.ooms[0].live_at_oom.as_ref().expect("stacks");
    assert_eq!(live.allocations, 17, "the 1 MiB block freed before the OOM is not live");
    assert_eq!(live.bytes, 38 * MIB + 768 * KIB);
    assert_eq!((live.without_stack, live.without_stack_bytes), (1, 2 * MIB));
    let at = |fs: &[vramhook_analyzer::StackFrame]| {
        fs.iter().map(|f| format!("{}:{} {}", f.file, f.line, f.function)).collect::<Vec<_>>().join(" < ")
    };
    let got: Vec<(u64, u64, u64, String)> =
        live.stacks.iter().map(|s| (s.allocations, s.bytes, s.largest_bytes, at(&s.frames))).collect();
    assert_eq!(got.len(), 10, "at most 10 stacks listed");
    assert_eq!(got[0], (2, 16 * MIB, 8 * MIB, "step.py:20 forward < train.py:30 main".into()), "equal frames group");
    assert_eq!(
        got[1],
        (1, 16 * MIB, 16 * MIB, "model.py:10 build < train.py:5 <module>".into()),
        "older than the trace"
    );
    assert_eq!(got[2], (1, 4 * MIB, 4 * MIB, "kernel.cpp:77 launch".into()), "C++ frames naming a line");
    assert!(got[3..].iter().all(|g| g.1 == 64 * KIB && g.3.starts_with("data.py:")), "{got:?}");
    assert_eq!((live.stacks_folded, live.stacks_folded_bytes), (5, 5 * 64 * KIB));
    assert_eq!(at(&live.request_frames), "train.py:31 main");
    let text = vramhook_analyzer::render::text::render(&r);
    for line in [
        "     live at the OOM (PyTorch snapshot torch_snapshot_stacks.pickle, memory history): 17 allocation(s), 38.75 MiB; by stack, most bytes first:\n       16.00 MiB in 2 allocation(s) (largest 8.00 MiB)\n         step.py:20 in forward\n         train.py:30 in main\n",
        "       10 more stack(s), 640.00 KiB\n       2.00 MiB in 1 allocation(s) without a stack (made before memory history was on)\n     the failed request of 32.00 MiB was made at:\n         train.py:31 in main\n",
    ] {
        assert!(text.contains(line), "{line:?} not in {text}");
    }
    // The same snapshot without history: no stacks, nothing said about them.
    let r = analyze(&[&format!("{dir}/torch_snapshot_nohistory.pickle")], &Options::default()).expect("analyze");
    assert_eq!(r.ooms.len(), 1);
    assert!(r.ooms[0].live_at_oom.is_none());
    assert!(!vramhook_analyzer::render::text::render(&r).contains("live at the OOM"));
}
