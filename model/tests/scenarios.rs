//! Hand-built event streams in the patterns of real stacks, one per verdict and per
//! memory mechanism.

use vramhook_model::*;
use vramhook_protocol::{Api, Event, FrameworkId, ProcessInfo};

const TOTAL: u64 = 150_110_011_392; // 139.80 GiB

/// One process's stream with a running clock (1 ms a step) and sequence, on device 0.
use vramhook_testkit::events::Stream as Proc;

fn run(streams: &[&Proc]) -> Model {
    let mut all: Vec<Event> = streams.iter().flat_map(|p| p.out.iter().copied()).collect();
    all.sort_by_key(|e| e.ts_ns);
    let mut m = Model::default();
    for (i, p) in streams.iter().enumerate() {
        m.process_info(&ProcessInfo {
            pid: p.pid,
            ppid: 1,
            uid: 0,
            start_time: 1000 + p.pid as u64,
            run_id: 0,
            exe: "/usr/bin/python3".into(),
            cmdline: vec!["python3".into(), format!("train{i}.py")],
        });
    }
    for e in &all {
        m.apply(e);
    }
    m
}

fn proc_view(m: &Model, pid: u32) -> ProcessView {
    m.snapshot().processes.into_iter().rev().find(|p| p.pid == pid).expect("process")
}

/// PyTorch default allocator: 200 GiB fails, cached segments freed, retry fails again:
/// one incident, capacity, FailedAgain, with the numbers in the explanation.
#[test]
fn pytorch_retry_is_one_capacity_incident() {
    let mut p = Proc::new(4242, 0);
    let mut cached = 0;
    for i in 0..20u64 {
        let size = (7 + i * 7) << 20;
        p.alloc(Api::cuMemAlloc_v2, 0x7f00_0000_0000 + i * (1 << 30), size);
        cached += if i % 2 == 0 { size } else { 0 };
    }
    p.meminfo(TOTAL - (2 << 30), TOTAL);
    p.oom(Api::cuMemAlloc_v2, 200 << 30).meminfo(148_746_798_612, TOTAL); // 138.53 GiB
    for i in (0..20u64).step_by(2) {
        p.free(Api::cuMemFree_v2, 0x7f00_0000_0000 + i * (1 << 30));
    }
    p.oom(Api::cuMemAlloc_v2, 200 << 30).meminfo(148_746_798_612 + cached, TOTAL);
    let m = run(&[&p]);
    let s = m.snapshot();
    assert_eq!(s.incidents.len(), 1, "{:#?}", s.incidents);
    let inc = &s.incidents[0];
    assert_eq!(inc.verdict, Verdict::Capacity);
    assert_eq!(inc.failures, 2);
    assert_eq!(inc.retries, 1);
    assert_eq!(inc.outcome, Outcome::FailedAgain);
    assert_eq!(inc.freed_bytes_between, cached);
    assert_eq!(inc.device_free_bytes, Some(148_746_798_612));
    assert!(inc.sample_after_failure);
    assert_eq!(inc.lead_up.len(), 16);
    assert!(inc.explanation.contains("process 4242 (python3 train0.py) asked for 200.00 GiB"), "{}", inc.explanation);
    assert!(inc.explanation.contains("138.53 GiB free of 139.80 GiB"), "{}", inc.explanation);
    let pv = proc_view(&m, 4242);
    assert_eq!(pv.oom_count, 2);
    assert_eq!(pv.failed_calls, 2);
    assert_eq!(pv.live_allocations, 10);
    assert_eq!(pv.frees, 10);
}

/// Expandable segments: 20 MiB pages created and mapped until the device is full; the next
/// page fails; pages are unmapped and released; the retry succeeds: Recovered.
/// The H200 fragmented-cache run: a 1 GiB request fails (the fill loop's end), then, with
/// that incident still open, a 2 GiB request fails twice. The 2 GiB failure is the one that
/// killed the program: it gets an incident of its own (it was folded into the first).
#[test]
fn a_failure_of_another_request_is_a_new_incident() {
    let mut p = Proc::new(468, 0);
    p.allocs_a_gib_apart(4, 1 << 30);
    p.oom(Api::cuMemAlloc_v2, 1 << 30).meminfo(300 << 20, TOTAL);
    p.oom(Api::cuMemAlloc_v2, 1 << 30);
    p.oom(Api::cuMemAlloc_v2, 2 << 30).meminfo(300 << 20, TOTAL);
    p.oom(Api::cuMemAlloc_v2, 2 << 30);
    let m = run(&[&p]);
    let s = m.snapshot();
    assert_eq!(s.incidents.len(), 2, "{:#?}", s.incidents);
    assert_eq!(s.incidents[0].requested_bytes, 1 << 30);
    assert_eq!(s.incidents[1].requested_bytes, 2 << 30);
    assert_eq!((s.incidents[1].failures, s.incidents[1].retries), (2, 1));
}

#[test]
fn expandable_segments_recover() {
    const PAGE: u64 = 20 << 20;
    let base = 0x7e00_0000_0000;
    let mut p = Proc::new(7, 0);
    p.reserve(base, 1 << 40);
    for i in 0..50u64 {
        p.create(100 + i, PAGE).map(base + i * PAGE, PAGE, 100 + i);
    }
    p.create_oom(PAGE).meminfo(10 << 20, TOTAL);
    for i in 40..50u64 {
        p.unmap(base + i * PAGE, PAGE).release(100 + i);
    }
    p.create(500, PAGE);
    let m = run(&[&p]);
    let s = m.snapshot();
    assert_eq!(s.incidents.len(), 1);
    let inc = &s.incidents[0];
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
    assert_eq!(inc.outcome, Outcome::Recovered);
    assert_eq!(inc.freed_bytes_between, 10 * PAGE);
    let pv = proc_view(&m, 7);
    assert_eq!(pv.live_by_class.vmm, 41 * PAGE);
    let arena = &s.arenas[0];
    assert_eq!(arena.kind, ArenaKind::VmmReservation);
    assert_eq!(arena.occupied, 40 * PAGE);
    assert_eq!(arena.largest_free_span, (1 << 40) - 40 * PAGE);
    assert_eq!(arena.fragmentation, 0.0);
}

/// ggml's VMM pool: reserve 32 GiB, then create + map + release at once; the bytes stay
/// until unmapped.
#[test]
fn ggml_release_after_map() {
    let base = 0x7d00_0000_0000;
    let mut p = Proc::new(11, 0);
    p.reserve(base, 32 << 30);
    for i in 0..8u64 {
        p.create(i + 1, 4 << 20).map(base + i * (4 << 20), 4 << 20, i + 1).release(i + 1);
    }
    let m = run(&[&p]);
    let pv = proc_view(&m, 11);
    assert_eq!(pv.live_by_class.vmm, 32 << 20);
    assert_eq!(pv.live_bytes, 32 << 20);
    assert_eq!(m.layout(Some(11)).len(), 8);
    let mut p2 = Proc { out: vec![], ..p };
    p2.unmap(base, 32 << 20); // one unmap covering all eight mappings
    let mut m = m;
    for e in &p2.out {
        m.apply(e);
    }
    let pv = proc_view(&m, 11);
    assert_eq!(pv.live_bytes, 0);
    assert_eq!(pv.live_allocations, 0);
    assert_eq!(pv.largest_free_span, 32 << 30);
    assert!(m.snapshot().anomalies.is_empty());
    // Reservation is address space, not memory.
    let s = m.snapshot();
    assert_eq!(s.devices.iter().map(|d| d.traced_bytes).sum::<u64>(), 0);
}

/// Async pool keeps its reserve after frees (reclaimable), trim releases it, retry succeeds.
#[test]
fn async_pool_reclaimable_then_trim() {
    let mut p = Proc::new(21, 0);
    p.alloc(Api::cuMemAllocAsync, 0x1000_0000_0000, 4 << 30);
    p.alloc(Api::cuMemAllocAsync, 0x1001_0000_0000, (4 << 30) - 4096);
    p.free(Api::cuMemFreeAsync, 0x1000_0000_0000).free(Api::cuMemFreeAsync, 0x1001_0000_0000);
    let m = run(&[&p]);
    let pv = proc_view(&m, 21);
    assert_eq!(pv.live_bytes, 0);
    assert_eq!(pv.idle_bytes, 8 << 30, "reserve is high-water live rounded up to 2 MiB");
    assert_eq!(pv.pool_reserve_bytes, 8 << 30);
    let s = m.snapshot();
    assert_eq!(s.devices[0].traced_bytes, 8 << 30);
    assert_eq!(s.devices[0].pool_idle_bytes, 8 << 30);

    p.meminfo(1 << 30, TOTAL);
    p.oom(Api::cuMemAlloc_v2, 3 << 30).meminfo(1 << 30, TOTAL);
    p.trim(0xdead, 0); // the default pool's handle never appears in allocs
    p.alloc(Api::cuMemAlloc_v2, 0x2000_0000_0000, 3 << 30);
    let m = run(&[&p]);
    let s = m.snapshot();
    let inc = &s.incidents[0];
    assert_eq!(inc.verdict, Verdict::Reclaimable, "{}", inc.explanation);
    assert_eq!(inc.own_idle_bytes, 8 << 30);
    assert_eq!(inc.outcome, Outcome::Recovered);
    let pv = proc_view(&m, 21);
    assert_eq!(pv.idle_bytes, 0);
    assert!(s.anomalies.is_empty(), "{:?}", s.anomalies);
}

/// Another process's idle pool bytes would have covered it.
#[test]
fn other_process_idle_pool() {
    let mut a = Proc::new(31, 0);
    a.alloc(Api::cuMemAllocAsync, 0x1000_0000_0000, 8 << 30).free(Api::cuMemFreeAsync, 0x1000_0000_0000);
    let mut b = Proc::new(32, 500_000);
    b.ts = 100_000_000;
    b.meminfo(1 << 30, TOTAL).oom(Api::cuMemAlloc_v2, 3 << 30).meminfo(1 << 30, TOTAL);
    let m = run(&[&a, &b]);
    let inc = &m.snapshot().incidents[0];
    assert_eq!(inc.pid, 32);
    assert_eq!(inc.verdict, Verdict::OtherProcess, "{}", inc.explanation);
    assert_eq!(inc.other_idle_bytes, 8 << 30);
    assert_eq!(inc.outcome, Outcome::Open);
}

/// Maps 2 MiB at every other 2 MiB of the 64 MiB reservation at `base` (32 MiB free in 2 MiB
/// pieces), then an 8 MiB cuMemCreate fails with 4 MiB free on the device.
fn map_checkerboard_then_fail(p: &mut Proc, base: u64) {
    for i in 0..16u64 {
        p.create(i + 1, 2 << 20).map(base + i * (4 << 20), 2 << 20, i + 1);
    }
    p.meminfo(4 << 20, TOTAL).create_oom(8 << 20).meminfo(4 << 20, TOTAL);
}

/// A VMM reservation mapped in a checkerboard: free space in pieces.
#[test]
fn vmm_arena_fragmentation() {
    let base = 0x7c00_0000_0000;
    let mut p = Proc::new(41, 0);
    p.reserve(base, 64 << 20);
    map_checkerboard_then_fail(&mut p, base);
    let m = run(&[&p]);
    let s = m.snapshot();
    let a = &s.arenas[0];
    assert_eq!((a.free_in_arena, a.largest_free_span), (32 << 20, 2 << 20));
    assert!((a.fragmentation - 0.9375).abs() < 1e-12);
    // The reservation's free pieces are unmapped addresses, not memory the process holds:
    // cuMemCreate failed for want of physical memory (before, this read "arena
    // fragmentation", a diagnosis that points at the wrong thing).
    let inc = &s.incidents[0];
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
    assert_eq!(m.largest_free_span(41), 2 << 20);
    assert_eq!(m.reservation_largest_free_span(41, base), Some(2 << 20));
}

/// A PyTorch segment (from a snapshot import) with cached blocks in pieces.
#[test]
fn framework_segment_fragmentation_and_reclaimable() {
    let seg = 0x7b00_0000_0000;
    let mut p = Proc::new(51, 0);
    p.alloc(Api::cuMemAlloc_v2, seg, 1 << 30);
    let mut m = run(&[&p]);
    // 1 GiB segment: 64 MiB allocated, 64 MiB cached, alternating.
    let blocks: Vec<Block> =
        (0..16u64).map(|i| Block { addr: seg + i * (64 << 20), size: 64 << 20, allocated: i % 2 == 0 }).collect();
    m.framework_segment(51, 0, seg, 1 << 30, &blocks, 0);
    let pv = proc_view(&m, 51);
    assert_eq!(pv.idle_bytes, 512 << 20);
    assert_eq!(pv.free_in_arenas, 512 << 20);
    assert_eq!(pv.largest_free_span, 64 << 20);
    assert_eq!(pv.live_bytes, 1 << 30, "segment bytes are not counted twice");
    let mut q = Proc { out: vec![], ..p };
    q.meminfo(100 << 20, TOTAL).oom(Api::cuMemAlloc_v2, 200 << 20).meminfo(100 << 20, TOTAL);
    for e in &q.out {
        m.apply(e);
    }
    assert_eq!(m.snapshot().incidents[0].verdict, Verdict::ArenaFragmentation);
    // Half the segment in use, the other half one free block too small for 600 MiB: the
    // bytes are stranded in a segment the framework cannot give back (fragmentation, not
    // "reclaimable": before, a cache-wide check was missing and this read reclaimable).
    let blocks = [Block { addr: seg, size: 512 << 20, allocated: true }];
    m.framework_segment(51, 0, seg, 1 << 30, &blocks, 0);
    let mut half = Proc { out: vec![], ..q };
    half.ts += 10_000_000_000; // outside the incident window
    half.meminfo(100 << 20, TOTAL).oom(Api::cuMemAlloc_v2, 600 << 20).meminfo(100 << 20, TOTAL);
    for e in &half.out {
        m.apply(e);
    }
    let inc = &m.snapshot().incidents[1];
    assert_eq!(inc.verdict, Verdict::FrameworkFragmentation, "{}", inc.explanation);
    assert_eq!(inc.cache_fragmentation, Some(0.0), "one free block: whole, yet too small");
    // The whole segment cached and free: giving it back covers the request (reclaimable).
    m.framework_segment(51, 0, seg, 1 << 30, &[], 0);
    let q = half;
    let mut r = Proc { out: vec![], ..q };
    r.ts += 10_000_000_000; // outside the incident window
    r.meminfo(100 << 20, TOTAL).oom(Api::cuMemAlloc_v2, 600 << 20).meminfo(100 << 20, TOTAL);
    for e in &r.out {
        m.apply(e);
    }
    let s = m.snapshot();
    assert_eq!(s.incidents.len(), 3);
    assert_eq!(s.incidents[2].verdict, Verdict::Reclaimable, "{}", s.incidents[2].explanation);
    // Freeing the segment's cudaMalloc removes the arena.
    let mut f = Proc { out: vec![], ..r };
    f.free(Api::cuMemFree_v2, seg);
    for e in &f.out {
        m.apply(e);
    }
    assert!(m.arenas().is_empty());
}

#[test]
fn granularity_and_unknown() {
    let mut p = Proc::new(61, 0);
    p.meminfo(3 * (1 << 20) + (1 << 19), TOTAL); // 3.5 MiB free
    p.oom(Api::cuMemAlloc_v2, 3 * (1 << 20) + 4096).meminfo(3 * (1 << 20) + (1 << 19), TOTAL);
    let m = run(&[&p]);
    let inc = &m.snapshot().incidents[0];
    assert_eq!(inc.verdict, Verdict::Granularity, "{}", inc.explanation);

    let mut q = Proc::new(62, 0);
    q.oom(Api::cuMemAlloc_v2, 1 << 30);
    let m = run(&[&q]);
    let inc = &m.snapshot().incidents[0];
    assert_eq!(inc.verdict, Verdict::Unknown);
    assert!(inc.unknown_reason.as_deref().unwrap().contains("no device memory sample"));

    let mut r = Proc::new(63, 0);
    r.meminfo(100 << 30, TOTAL).oom(Api::cuMemAlloc_v2, 1 << 30).meminfo(100 << 30, TOTAL);
    let m = run(&[&r]);
    let inc = &m.snapshot().incidents[0];
    assert_eq!(inc.verdict, Verdict::Unknown);
    assert!(inc.unknown_reason.as_deref().unwrap().contains("not explained"));
}

/// The precedence rule on its own.
#[test]
fn verdict_precedence() {
    let base = VerdictInputs {
        requested: 10 << 20,
        granularity: 2 << 20,
        device_free: Some(4 << 20),
        device_total: Some(TOTAL),
        own_idle: 0,
        other_idle: 0,
        arenas: vec![],
        ..VerdictInputs::default()
    };
    let v = |i: &VerdictInputs| decide_verdict(i).0;
    assert_eq!(v(&base), Verdict::Capacity);
    assert_eq!(v(&VerdictInputs { other_idle: 6 << 20, ..base.clone() }), Verdict::OtherProcess);
    // Own idle wins over other processes' idle.
    assert_eq!(v(&VerdictInputs { own_idle: 6 << 20, other_idle: 60 << 20, ..base.clone() }), Verdict::Reclaimable);
    // Fragmentation wins over reclaimable.
    let frag = ArenaNumbers {
        kind: ArenaKind::FrameworkSegment,
        base: 0,
        free_in_arena: 20 << 20,
        largest_free_span: 2 << 20,
    };
    assert_eq!(
        v(&VerdictInputs { own_idle: 20 << 20, arenas: vec![frag.clone()], ..base.clone() }),
        Verdict::ArenaFragmentation
    );
    // Granularity wins over everything once the bytes were there.
    assert_eq!(
        v(&VerdictInputs {
            requested: (10 << 20) + 1,
            device_free: Some(11 << 20),
            arenas: vec![frag],
            ..base.clone()
        }),
        Verdict::Granularity
    );
    assert_eq!(v(&VerdictInputs { device_free: None, own_idle: 1 << 40, ..base.clone() }), Verdict::Unknown);
    assert_eq!(v(&VerdictInputs { device_free: Some(12 << 20), ..base.clone() }), Verdict::Unknown);

    // A caching framework that held enough from the driver, nothing known of inside its
    // cache: framework cache, not capacity; not enough held: still capacity; ggml (no
    // cache of freed blocks) never gets it.
    let torch = VerdictInputs { framework: Some(FrameworkId::PyTorch), framework_held: 6 << 20, ..base.clone() };
    assert_eq!(v(&torch), Verdict::FrameworkCache);
    assert_eq!(v(&VerdictInputs { framework_held: 5 << 20, ..torch.clone() }), Verdict::Capacity);
    assert_eq!(v(&VerdictInputs { framework: Some(FrameworkId::Ggml), ..torch.clone() }), Verdict::Capacity);
    // Reclaimable and other process still come first: they are known idle bytes.
    assert_eq!(v(&VerdictInputs { own_idle: 6 << 20, ..torch.clone() }), Verdict::Reclaimable);
    // Segments known (a snapshot or a lens): cache-wide fragmentation when the free bytes
    // would have covered it but no block was large enough; whole blocks are reclaimable.
    let segs = VerdictInputs {
        cache_free: 8 << 20,
        cache_largest_free: 3 << 20,
        cache_segments: 4,
        own_idle: 8 << 20,
        ..torch.clone()
    };
    assert_eq!(v(&segs), Verdict::FrameworkFragmentation);
    assert_eq!(v(&VerdictInputs { cache_largest_free: 10 << 20, ..segs.clone() }), Verdict::Reclaimable);
    assert_eq!(v(&VerdictInputs { cache_free: 5 << 20, own_idle: 5 << 20, ..segs.clone() }), Verdict::Capacity);
    // A lens that saw the framework give up decides first, on the framework's own request,
    // even with no device sample.
    let lens = LensOom {
        framework: FrameworkId::PyTorch,
        requested: 2 << 30,
        reserved: 139 << 30,
        allocated: 81 << 30,
        largest_free_block: Some(424 << 20),
        ..LensOom::default()
    };
    let with_lens = VerdictInputs { lens: Some(lens.clone()), device_free: None, ..base.clone() };
    assert_eq!(v(&with_lens), Verdict::FrameworkFragmentation);
    let whole = LensOom { largest_free_block: Some(3 << 30), ..lens.clone() };
    assert_eq!(v(&VerdictInputs { lens: Some(whole), ..with_lens.clone() }), Verdict::Unknown);
    let tiny_cache = LensOom { reserved: 82 << 30, ..lens };
    assert_eq!(v(&VerdictInputs { lens: Some(tiny_cache.clone()), ..base.clone() }), Verdict::Capacity);
    assert_eq!(
        v(&VerdictInputs {
            lens: Some(tiny_cache),
            framework: Some(FrameworkId::PyTorch),
            framework_held: 6 << 20,
            ..base
        }),
        Verdict::Capacity,
        "a lens that shows too few stranded bytes: the cache was seen, and it was not the cause"
    );
}

/// A lens's periodic sample (CuPy's, JAX's: no OOM observer) at a driver failure.
#[test]
fn verdict_from_a_lens_sample() {
    let v = |i: &VerdictInputs| decide_verdict(i).0;
    // 10 MiB asked, 4 MiB free on the device; CuPy held 20 MiB, 12 MiB of them free.
    let cupy = LensSample {
        framework: FrameworkId::CuPy,
        reserved: 20 << 20,
        allocated: 8 << 20,
        largest_free_block: None,
        age_ns: 50_000_000,
    };
    let base = VerdictInputs {
        requested: 10 << 20,
        granularity: 2 << 20,
        device_free: Some(4 << 20),
        own_idle: 12 << 20,
        framework: Some(FrameworkId::CuPy),
        framework_held: 20 << 20,
        lens_sample: Some(cupy.clone()),
        ..VerdictInputs::default()
    };
    let (verdict, _) = decide_verdict(&base);
    assert_eq!(verdict, Verdict::FrameworkFragmentation, "went to the driver with the bytes cached: in pieces");
    // The framework's retry got the bytes: what it gave back was whole, so reclaimable.
    assert_eq!(v(&VerdictInputs { recovered: true, ..base.clone() }), Verdict::Reclaimable);
    // JAX reports its largest free block: one that held the request means the sample is stale.
    let jax = LensSample { framework: FrameworkId::Jax, largest_free_block: Some(11 << 20), ..cupy.clone() };
    assert_eq!(v(&VerdictInputs { lens_sample: Some(jax.clone()), ..base.clone() }), Verdict::Reclaimable);
    let jax = LensSample { largest_free_block: Some(3 << 20), ..jax };
    assert_eq!(v(&VerdictInputs { lens_sample: Some(jax), ..base.clone() }), Verdict::FrameworkFragmentation);
    // A sample that shows a full cache: seen, not the cause: capacity, not framework_cache.
    let full = LensSample { allocated: 20 << 20, ..cupy };
    assert_eq!(v(&VerdictInputs { lens_sample: Some(full), own_idle: 0, ..base.clone() }), Verdict::Capacity);
    assert_eq!(v(&VerdictInputs { lens_sample: None, own_idle: 0, ..base }), Verdict::FrameworkCache);
}

#[test]
fn exit_releases_everything_and_pid_reuse() {
    let mut p = Proc::new(71, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000, 1 << 20).alloc(Api::cuMemAllocAsync, 0x200000, 1 << 20);
    p.reserve(0x1_0000_0000, 1 << 30).create(1, 2 << 20).map(0x1_0000_0000, 2 << 20, 1);
    let mut m = run(&[&p]);
    assert_eq!(proc_view(&m, 71).live_bytes, 4 << 20);
    // pid reuse: a ProcessStart with a new start time closes the old process.
    m.apply(&Event::process_start(0, 99_999).by(71, 0).at(p.ts + 1).on_device(0));
    let s = m.snapshot();
    let old: Vec<_> = s.processes.iter().filter(|x| x.pid == 71).collect();
    assert_eq!(old.len(), 2);
    assert!(!old[0].alive && old[0].live_bytes == 0 && old[0].peak_bytes == 4 << 20);
    assert!(old[1].alive && old[1].start_time == 99_999);
    assert!(s.arenas.is_empty());
    assert!(m.layout(None).is_empty());
    m.process_exit(71, 1071, Some(0), p.ts + 2);
    assert_eq!(m.snapshot().processes[0].exit_status, Some(0));
    m.process_exit(71, 99_999, Some(137), p.ts + 3);
    let s = m.snapshot();
    assert_eq!(s.processes[1].exit_status, Some(137));
    assert!(!s.processes[1].alive);
}

#[test]
fn anomalies_are_counted_not_applied() {
    let mut p = Proc::new(81, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000, 4096);
    p.free(Api::cuMemFree_v2, 0x1000).free(Api::cuMemFree_v2, 0x1000); // double free
    p.free(Api::cuMemFree_v2, 0x9999); // unknown
    p.unmap(0x5000, 4096); // nothing mapped
    p.release(77);
    p.out.push(Event { pid: 81, kind: 200, ts_ns: p.ts, ..Event::default() }); // newer format
    p.out.push(Event { pid: 81, kind: 1, api: 4000, ts_ns: p.ts, ..Event::default() });
    let mut m = run(&[&p]);
    // Another thread's event older than the process's latest: threads reach the ring
    // concurrently, so this is normal and not an anomaly.
    m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x3000, 1).by(81, 82).at(6).on_device(0));
    m.apply(&Event::free(Api::cuMemFree_v2, 0x3000).by(81, 82).at(7).on_device(0));
    // Time going backwards within a thread: counted, applied at the latest time.
    m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x2000, 1).by(81, 81).at(5).on_device(0));
    let s = m.snapshot();
    let a = &s.anomalies;
    assert_eq!(a["free_unknown_address"], 2);
    assert_eq!(a["unmap_of_nothing"], 1);
    assert_eq!(a["release_unknown_handle"], 1);
    assert_eq!(a["unknown_kind"], 1);
    assert_eq!(a["unknown_api"], 1);
    assert_eq!(a["time_backwards"], 1);
    let pv = proc_view(&m, 81);
    assert_eq!(pv.anomalies, 7);
    assert_eq!(pv.live_bytes, 1);
}

#[test]
fn device_view_untraced_and_stale() {
    let mut p = Proc::new(91, 0);
    p.meminfo(TOTAL - (10 << 30), TOTAL).alloc(Api::cuMemAlloc_v2, 0x1000, 4 << 30);
    p.alloc(Api::cuMemAllocManaged, 0x10_0000_0000, 1 << 30);
    let m = run(&[&p]);
    let d = &m.snapshot().devices[0];
    assert_eq!(d.traced_bytes, 4 << 30, "managed memory is not counted as resident");
    assert_eq!(d.untraced_bytes, Some(6 << 30));
    assert!(!d.sample_stale);
    let mut q = Proc { out: vec![], ..p };
    q.ts += 60_000_000_000;
    q.free(Api::cuMemFree_v2, 0x1000);
    let mut m = m;
    for e in &q.out {
        m.apply(e);
    }
    let d = &m.snapshot().devices[0];
    assert!(d.sample_stale);
    assert_eq!(d.untraced_bytes, Some(10 << 30));
}

#[test]
fn dropped_events_flag_incomplete() {
    let mut p = Proc::new(95, 0);
    p.push(Event::dropped(12, 0));
    let m = run(&[&p]);
    let pv = proc_view(&m, 95);
    assert_eq!(pv.dropped_events, 12);
    assert!(pv.incomplete);
}

#[test]
fn checkpoint_round_trip_mid_incident() {
    let mut p = Proc::new(4242, 0);
    p.allocs_a_gib_apart(10, 100 << 20);
    p.oom(Api::cuMemAlloc_v2, 200 << 30).meminfo(1 << 30, TOTAL);
    for i in 0..10u64 {
        p.free(Api::cuMemFree_v2, 0x7f00_0000_0000 + i * (1 << 30));
    }
    p.alloc(Api::cuMemAlloc_v2, 0x1, 200 << 30);
    let whole = run(&[&p]);
    for cut in 0..p.out.len() {
        let mut m = Model::default();
        for e in &p.out[..cut] {
            m.apply(e);
        }
        let bytes = m.checkpoint();
        let mut r = Model::restore(&bytes).unwrap();
        for e in &p.out[cut..] {
            r.apply(e);
        }
        let mut w = Model::default();
        for e in &p.out {
            w.apply(e);
        }
        assert_eq!(r.snapshot(), w.snapshot(), "cut at {cut}");
    }
    assert_eq!(whole.snapshot().incidents[0].outcome, Outcome::Recovered);
}

#[test]
fn forgetting_exited_processes_keeps_the_rest_exact() {
    // Process 1 leaks and exits early; process 2 keeps running with an OOM incident.
    let mut gone = Proc::new(1, 0);
    gone.alloc(Api::cuMemAlloc_v2, 0x1000, 4096);
    let mut live = Proc::new(2, 0);
    live.meminfo(1 << 30, TOTAL).alloc(Api::cuMemAlloc_v2, 0x9000, 8192);
    live.oom(Api::cuMemAlloc_v2, 200 << 30);
    let mut m = run(&[&gone, &live]);
    m.process_exit(1, 0, Some(0), 1);
    let before = m.snapshot();
    assert!(before.incidents.iter().any(|i| i.pid == 2), "the kept process has an incident");
    let checkpoint = m.checkpoint();
    assert_eq!(m.forget_exited(u64::MAX), 1);
    assert_eq!(m.forget_exited(u64::MAX), 0, "idempotent");
    let after = m.snapshot();
    assert_eq!(after.processes.len(), 1);
    assert_eq!(after.processes[0], before.processes.iter().find(|p| p.pid == 2).expect("pid 2").clone());
    assert_eq!(after.incidents, before.incidents.iter().filter(|i| i.pid == 2).cloned().collect::<Vec<_>>());
    // The kept process goes on exactly; a new process of the forgotten pid starts afresh.
    m.apply(&Event::free(Api::cuMemFree_v2, 0x9000).by(2, 2).at(u64::MAX / 2).on_device(0));
    m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x2000, 10).by(1, 1).at(u64::MAX / 2).on_device(0));
    let s = m.snapshot();
    assert_eq!(proc_view(&m, 2).live_bytes, 0);
    assert_eq!(proc_view(&m, 1).live_bytes, 10);
    assert_eq!(s.processes.len(), 2);
    // Checkpoints taken before forgetting still restore.
    assert!(Model::restore(&checkpoint).is_ok());
}

/// Windows give each total's extremes since the last take, counting its value then.
#[test]
fn windows_span_what_happened_since_the_last_take() {
    let mut p = Proc::new(7, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000, 4096)
        .alloc(Api::cuMemAlloc_v2, 0x9000, 100)
        .meminfo(1 << 30, TOTAL)
        .free(Api::cuMemFree_v2, 0x1000);
    let mut m = Model::default();
    for e in &p.out {
        m.apply(e);
    }
    let d = m.take_device_windows();
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].device, d[0].live, d[0].peak), (0, 100, 4196));
    let w = d[0].window.expect("changed");
    assert_eq!((w.since_ns, w.min, w.max), (p.out[1].ts_ns, 0, 4196), "from the first change, from 0 up to the peak");
    let (live, w) = m.take_process_window(0).expect("process");
    assert_eq!((live, w.map(|w| (w.min, w.max))), (100, Some((0, 4196))));
    assert_eq!(m.take_device_windows()[0].window, None, "taken");
    assert_eq!(m.take_process_window(0), Some((100, None)), "taken");
    p.push(Event::process_exit());
    m.apply(p.out.last().expect("exit"));
    let w = m.take_device_windows()[0].window.expect("the exit moved it");
    assert_eq!((w.min, w.max), (0, 100), "from its value at the take down to nothing");
}

/// cuMemAddressReserve names no device (the interposer records -1); cuMemCreate does. The
/// reservation takes the device of the memory mapped into it, and an OOM on that device
/// sees its free span.
#[test]
fn a_vmm_reservation_names_the_device_of_its_mappings() {
    let base = 0x7a00_0000_0000;
    let mut p = Proc::new(61, 0);
    p.device = -1;
    p.reserve(base, 64 << 20);
    let before = run(&[&p]);
    assert_eq!(before.snapshot().arenas[0].device, -1, "nothing mapped yet: no device to name");
    p.device = 1;
    map_checkerboard_then_fail(&mut p, base);
    let m = run(&[&p]);
    let s = m.snapshot();
    assert_eq!(s.arenas.len(), 1);
    assert_eq!(s.arenas[0].device, 1, "{:?}", s.arenas[0]);
    assert!(m.layout(Some(61)).iter().all(|e| e.device == 1));
    // The OOM on device 1 sees the reservation (it skipped a device -1 arena): its free
    // span is reported, and unmapped addresses are not taken for memory held.
    let inc = &s.incidents[0];
    assert_eq!(inc.device, 1);
    assert_eq!(inc.arena_largest_free_span, 2 << 20, "{inc:?}");
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
}

/// PyTorch's `backend:cudaMallocAsync` as measured on the H200: 807,403,520 bytes live in
/// the device's current pool, which the driver says reserves 1,543,503,872 (what
/// `memory_reserved()` reported). The process holds the reserve; the rest is idle.
#[test]
fn pool_reserve_is_the_drivers_sample() {
    const LIVE: u64 = 807_403_520;
    const RESERVED: u64 = 1_543_503_872;
    let mut p = Proc::new(41, 0);
    // Ten live tensors of 14, 28, … 140 MiB (the odd ones of torch_modes.py), the even ones freed.
    let mut live = 0;
    for i in 0..20u64 {
        let size = (7 * (i + 1)) << 20;
        p.alloc(Api::cuMemAllocAsync, 0x1000_0000_0000 + i * (1 << 30), size);
    }
    for i in (0..20u64).step_by(2) {
        p.free(Api::cuMemFreeAsync, 0x1000_0000_0000 + i * (1 << 30));
    }
    for i in (1..20u64).step_by(2) {
        live += (7 * (i + 1)) << 20;
    }
    assert_eq!(live, LIVE);
    let estimate = proc_view(&run(&[&p]), 41);
    assert_eq!(estimate.live_bytes, LIVE);
    assert_eq!(estimate.pool_reserve_bytes, 1_541_406_720, "without a sample: the high-water mark, 2 MiB rounded");

    p.pool_sample(0xabc, RESERVED, LIVE, true);
    let m = run(&[&p]);
    let pv = proc_view(&m, 41);
    assert_eq!(pv.live_bytes, LIVE, "live bytes stay the allocations");
    assert_eq!((pv.pool_reserve_bytes, pv.held_bytes), (RESERVED, RESERVED));
    assert_eq!(pv.idle_bytes, RESERVED - LIVE);
    let s = m.snapshot();
    assert_eq!((s.devices[0].traced_bytes, s.devices[0].pool_idle_bytes), (RESERVED, RESERVED - LIVE));
    let pool = s.arenas.iter().find(|a| a.kind == ArenaKind::Pool).expect("the default pool");
    assert_eq!((pool.size, pool.occupied, pool.free_in_arena), (RESERVED, LIVE, RESERVED - LIVE));
    assert!(s.anomalies.is_empty(), "{:?}", s.anomalies);

    // A trim makes the sample stale: the estimate again, until the next sample.
    p.trim(0xabc, 0);
    let pv = proc_view(&run(&[&p]), 41);
    assert_eq!(pv.held_bytes, LIVE);
    p.pool_sample(0xabc, 809_500_672, LIVE, true);
    let pv = proc_view(&run(&[&p]), 41);
    assert_eq!((pv.held_bytes, pv.idle_bytes), (809_500_672, 809_500_672 - LIVE));

    // PyTorch's lens in this mode reports the pool's idle reserve as its own
    // reserved-but-unallocated bytes (seen on the H200): the same bytes, counted once.
    p.pool_sample(0xabc, RESERVED, LIVE, true);
    p.push(Event::framework_sample(FrameworkId::PyTorch, RESERVED, LIVE, vramhook_protocol::kinds::UNKNOWN_BYTES, 0));
    let pv = proc_view(&run(&[&p]), 41);
    assert_eq!((pv.held_bytes, pv.idle_bytes), (RESERVED, RESERVED - LIVE), "not twice");
}

/// The driver's reserve of a pool no allocation named yet (allocations made before the
/// interposer saw them, say) is still the process's; a created pool's sample goes to it.
#[test]
fn pool_samples_of_unseen_and_created_pools() {
    let mut p = Proc::new(42, 0);
    p.pool_sample(0xd0, 0, 0, true); // nothing held: nothing added
    assert_eq!(run(&[&p]).arenas().len(), 0);
    p.pool_sample(0xd0, 64 << 20, 0, true);
    p.push(Event::pool_create(0xe0));
    p.push(Event::pool_alloc(Api::cuMemAllocFromPoolAsync, 0x2000_0000_0000, 10 << 20, 0xe0, 0));
    p.pool_sample(0xe0, 32 << 20, 10 << 20, false);
    let m = run(&[&p]);
    let pv = proc_view(&m, 42);
    assert_eq!(pv.pool_reserve_bytes, (64 << 20) + (32 << 20));
    assert_eq!(pv.held_bytes, (64 << 20) + (32 << 20));
    assert_eq!(pv.idle_bytes, (64 << 20) + (22 << 20));
    // Destroying the pool drops its sample; the pool goes with its last allocation.
    p.push(Event::pool_destroy(0xe0)).free(Api::cuMemFreeAsync, 0x2000_0000_0000);
    let pv = proc_view(&run(&[&p]), 42);
    assert_eq!((pv.held_bytes, pv.live_bytes), (64 << 20, 0));
}

/// At an OOM the interposer samples the pools, then the device. A reserve the estimate
/// cannot see (the pool grew in large chunks) makes the verdict `reclaimable`; without the
/// sample the same failure is `capacity`.
#[test]
fn pool_sample_after_an_oom_judges_it() {
    let mut p = Proc::new(43, 0);
    p.alloc(Api::cuMemAllocAsync, 0x1000_0000_0000, 100 << 20).free(Api::cuMemFreeAsync, 0x1000_0000_0000);
    p.meminfo(1 << 30, TOTAL);
    p.oom(Api::cuMemAlloc_v2, 3 << 30);
    let mut without = Proc::new(43, 0);
    without.out = p.out.clone();
    without.meminfo(1 << 30, TOTAL);
    let m = run(&[&without]);
    let inc = &m.snapshot().incidents[0];
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
    assert_eq!(inc.own_idle_bytes, 100 << 20);

    p.pool_sample(0xd0, 4 << 30, 0, true).meminfo(1 << 30, TOTAL);
    let m = run(&[&p]);
    let s = m.snapshot();
    let inc = &s.incidents[0];
    assert_eq!(inc.verdict, Verdict::Reclaimable, "{}", inc.explanation);
    assert_eq!(inc.own_idle_bytes, 4 << 30);
    assert!(inc.sample_after_failure, "the pool sample did not end the wait for the device sample");
    assert_eq!(s.processes[0].failed_calls, 1);
}

/// A server that fails request after request while it runs: with a cap the model keeps
/// about that many incidents (the oldest forgotten and counted), ids keep growing, and an
/// incident another process is still adding to survives the forgetting.
#[test]
fn a_process_failing_again_and_again_keeps_a_bounded_list_of_incidents() {
    use vramhook_testkit::events::made;
    const MS: u64 = 1_000_000;
    let run_with = |cap: usize| {
        let mut m = Model::default();
        m.set_incident_cap(cap);
        m.apply(&made(Event::alloc(Api::cuMemAlloc_v2, 0, 7 << 30).with_result(2), 100, MS, 0));
        for i in 0..100u64 {
            m.apply(&made(Event::alloc(Api::cuMemAlloc_v2, 0, (i + 1) << 20).with_result(2), 200, 2 * MS + i, 0));
        }
        m.apply(&made(Event::alloc(Api::cuMemAlloc_v2, 0x7f00_0000_0000, 7 << 30), 100, 500 * MS, 0));
        m
    };
    let all = run_with(0).snapshot();
    assert_eq!(all.incidents.len(), 101);
    let m = run_with(10);
    let s = m.snapshot();
    assert!(s.incidents.len() <= 12, "{} kept", s.incidents.len());
    assert_eq!(m.incidents_forgotten(), 101 - s.incidents.len() as u64);
    assert!(s.incidents.windows(2).all(|w| w[0].id < w[1].id), "ids in order, none repeated");
    assert_eq!(s.incidents.last().map(|i| i.id), Some(101));
    let first = s.incidents.iter().find(|i| i.pid == 100).expect("the open incident is kept");
    assert_eq!((first.id, first.retries, first.outcome), (1, 1, Outcome::Recovered));
    assert_eq!(first, &all.incidents[0], "the same incident as without the cap");
}
