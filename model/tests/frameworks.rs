//! Framework verdicts: attribution from loaded libraries, the PyTorch lens's records, and
//! the verdict each scenario must get (issue #10). Streams follow PyTorch's real sequence
//! at an OOM: the driver refuses, PyTorch gives back its whole free segments and retries,
//! then raises, calling its out-of-memory observers (where the lens writes).

use vramhook_model::*;
use vramhook_protocol::{Api, Event, FrameworkId};
use vramhook_testkit::events::Stream as Proc;

const TOTAL: u64 = 150_110_011_392; // 139.80 GiB
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn model_of(p: &Proc) -> Model {
    let mut m = Model::default();
    for e in &p.out {
        m.apply(e);
    }
    m
}

/// A PyTorch process with a cache of `segments` 1 GiB segments (one cudaMalloc each), then a
/// failing `request` with `free` bytes left on the device.
fn torch_cache(segments: u64, free: u64, request: u64) -> Proc {
    let mut p = Proc::new(700, 0);
    p.push(Event::frameworks(FrameworkId::PyTorch.bit()));
    p.allocs_a_gib_apart(segments, GIB);
    p.meminfo(free, TOTAL).oom(Api::cuMemAlloc_v2, request).meminfo(free, TOTAL);
    p
}

/// The lens at the OOM: PyTorch's numbers, then one record per segment (each holding
/// `allocated_per_segment` in use and the rest as one free block).
fn lens_oom(p: &mut Proc, segments: u64, request: u64, allocated_per_segment: u64) {
    let reserved = segments * GIB;
    let allocated = segments * allocated_per_segment;
    let largest = GIB - allocated_per_segment;
    p.push(Event::framework_oom(FrameworkId::PyTorch, request, reserved, allocated, largest));
    for i in 0..segments {
        p.push(Event::framework_segment(0x7f00_0000_0000 + i * GIB, GIB, allocated_per_segment, largest, 1));
    }
}

#[test]
fn a_fragmented_pytorch_cache_seen_by_the_lens_is_framework_fragmentation_with_pytorchs_numbers() {
    // 139 segments of 1 GiB, 600 MiB in use in each: 57.55 GiB reserved but unallocated in
    // 139 pieces of 424 MiB, and a 2 GiB request (the H200 case of issue #10).
    let mut p = torch_cache(139, 293 * MIB, 2 * GIB);
    p.oom(Api::cuMemAlloc_v2, 2 * GIB); // PyTorch's retry after giving back its free segments
    lens_oom(&mut p, 139, 2 * GIB, 600 * MIB);
    let m = model_of(&p);
    let s = m.snapshot();
    assert_eq!(s.incidents.len(), 1, "the retry and the lens belong to the one request");
    let inc = &s.incidents[0];
    assert_eq!(inc.verdict, Verdict::FrameworkFragmentation, "{}", inc.explanation);
    assert_eq!(inc.outcome, Outcome::Failed, "the framework gave up");
    let l = inc.framework_oom.as_ref().expect("the lens's numbers");
    assert_eq!((l.requested, l.reserved, l.allocated), (2 * GIB, 139 * GIB, 139 * 600 * MIB));
    assert_eq!((l.segments_listed, l.free_pieces, l.segments_with_free), (139, 139, 139));
    let stranded = 139 * 424 * MIB;
    assert_eq!(l.cached_free(), stranded);
    // PyTorch's own wording, to the byte, and what PyTorch does not say.
    for text in [
        "57.55 GiB (61,798,875,136 bytes) reserved by PyTorch but unallocated".to_string(),
        "81.45 GiB (87,451,238,400 bytes) allocated by PyTorch".to_string(),
        "largest free block was 424.00 MiB".to_string(),
        "in 139 pieces over 139 of its 139 segments (cache-wide".to_string(),
        "expandable_segments:True".to_string(),
    ] {
        assert!(inc.explanation.contains(&text), "{text:?} not in: {}", inc.explanation);
    }
    assert!(inc.cache_fragmentation.is_some_and(|f| f > 0.99), "{:?}", inc.cache_fragmentation);
    assert!(inc.explanation.contains("at +0."), "times since the first event: {}", inc.explanation);
    // The live numbers follow the lens.
    let pv = s.processes.iter().find(|p| p.pid == 700).expect("the process");
    assert_eq!(pv.frameworks, vec![FrameworkId::PyTorch]);
    let c = &pv.framework_caches[0];
    assert_eq!(
        (c.reserved_bytes, c.allocated_bytes, c.largest_free_block),
        (139 * GIB, 139 * 600 * MIB, Some(424 * MIB))
    );
    assert!(c.fragmentation.is_some_and(|f| f > 0.99));
    assert_eq!(pv.idle_bytes, stranded, "the cache's free bytes are the process's idle bytes");
}

#[test]
fn the_same_capture_without_a_lens_is_framework_cache_not_capacity() {
    let p = torch_cache(139, 293 * MIB, 2 * GIB);
    let inc = &model_of(&p).snapshot().incidents[0];
    assert_eq!(inc.verdict, Verdict::FrameworkCache, "{}", inc.explanation);
    assert!(inc.explanation.contains("PyTorch held 139.00 GiB"), "{}", inc.explanation);
    assert!(inc.explanation.contains("not visible from the driver"), "{}", inc.explanation);
    // Without the frameworks record (an unattributed process) the driver's view stays.
    let mut q = Proc::new(701, 0);
    q.allocs_a_gib_apart(139, GIB).meminfo(293 * MIB, TOTAL).oom(Api::cuMemAlloc_v2, 2 * GIB);
    assert_eq!(model_of(&q).snapshot().incidents[0].verdict, Verdict::Capacity);
}

#[test]
fn a_true_shortage_stays_capacity_with_or_without_the_lens() {
    // 139 GiB in use, a 200 GiB request: larger than anything held.
    let mut p = torch_cache(139, 293 * MIB, 200 * GIB);
    let m = model_of(&p);
    assert_eq!(m.snapshot().incidents[0].verdict, Verdict::Capacity);
    lens_oom(&mut p, 139, 200 * GIB, GIB); // every segment fully in use
    let inc = &model_of(&p).snapshot().incidents[0];
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
    assert_eq!(inc.outcome, Outcome::Failed);
}

#[test]
fn expandable_segments_name_the_frameworks_request_not_the_chunk() {
    let mut p = Proc::new(702, 0);
    p.push(Event::frameworks(FrameworkId::PyTorch.bit()));
    p.reserve(0x7e00_0000_0000, 256 * GIB).create(1, 20 * MIB).map(0x7e00_0000_0000, 20 * MIB, 1);
    p.meminfo(10 * MIB, TOTAL).create_oom(20 * MIB).meminfo(10 * MIB, TOTAL);
    p.push(Event::framework_oom(FrameworkId::PyTorch, GIB, 20 * MIB, 20 * MIB, 0));
    let inc = &model_of(&p).snapshot().incidents[0];
    assert_eq!(inc.requested_bytes, 20 * MIB, "the driver call is kept as it was");
    assert_eq!(inc.framework_oom.as_ref().map(|l| l.requested), Some(GIB));
    assert!(inc.explanation.contains("asked PyTorch for 1.00 GiB"), "{}", inc.explanation);
    assert!(inc.explanation.contains("the driver call that failed was 20.00 MiB (cuMemCreate)"), "{}", inc.explanation);
    assert_eq!(inc.outcome, Outcome::Failed, "not 'recovered'");
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
}

#[test]
fn a_framework_limit_with_no_driver_failure_is_an_incident_of_its_own() {
    // set_per_process_memory_fraction: PyTorch refuses without asking the driver.
    let mut p = Proc::new(703, 0);
    p.push(Event::frameworks(FrameworkId::PyTorch.bit()));
    p.allocs_a_gib_apart(4, GIB).meminfo(100 * GIB, TOTAL);
    p.push(Event::framework_oom(FrameworkId::PyTorch, 3 * GIB, 4 * GIB, 2 * GIB, GIB));
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 1);
    let inc = &s.incidents[0];
    assert_eq!((inc.api, inc.requested_bytes, inc.outcome), (Api::Lens, 3 * GIB, Outcome::Failed));
    assert_eq!(inc.verdict, Verdict::FrameworkFragmentation, "2 GiB stranded + 100 GiB free: {}", inc.explanation);
    assert_eq!(s.processes[0].oom_count, 1);
}

#[test]
fn two_failing_requests_are_two_incidents_each_with_its_lens() {
    let mut p = torch_cache(8, 100 * MIB, GIB);
    lens_oom(&mut p, 8, GIB, 600 * MIB);
    p.meminfo(100 * MIB, TOTAL).oom(Api::cuMemAlloc_v2, 2 * GIB).meminfo(100 * MIB, TOTAL);
    lens_oom(&mut p, 8, 2 * GIB, 600 * MIB);
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 2, "{:#?}", s.incidents.iter().map(|i| i.requested_bytes).collect::<Vec<_>>());
    assert_eq!(s.incidents[0].framework_oom.as_ref().map(|l| l.requested), Some(GIB));
    assert_eq!(s.incidents[1].framework_oom.as_ref().map(|l| l.requested), Some(2 * GIB));
    assert_eq!(s.incidents[1].verdict, Verdict::FrameworkFragmentation);
    // The segments of the second OOM replaced those of the first: counted once.
    assert_eq!(s.incidents[1].framework_oom.as_ref().map(|l| l.segments_listed), Some(8));
    assert_eq!(s.processes[0].idle_bytes, 8 * 424 * MIB);
}

#[test]
fn lens_records_that_make_no_sense_are_anomalies_not_state() {
    let mut p = Proc::new(704, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000, GIB);
    // A segment with no OOM before it, a sample claiming more allocated than reserved, a
    // segment larger than its free bytes allow.
    p.push(Event::framework_segment(0x1000, GIB, 0, GIB, 1));
    p.push(Event::framework_sample(FrameworkId::PyTorch, GIB, 2 * GIB, 0, 1));
    p.push(Event::framework_oom(FrameworkId::PyTorch, GIB, GIB, 0, GIB));
    p.push(Event::framework_segment(0x1000, GIB, GIB / 2, GIB, 1));
    let s = model_of(&p).snapshot();
    assert_eq!(s.anomalies.get("bad_segment").copied(), Some(3), "{:?}", s.anomalies);
    assert_eq!(s.processes[0].idle_bytes, GIB, "only the lens OOM's own numbers count");
}

#[test]
fn sampled_numbers_keep_the_last_largest_block_measured() {
    let mut p = Proc::new(705, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000, GIB);
    p.push(Event::framework_sample(FrameworkId::PyTorch, GIB, GIB / 2, GIB / 4, 1));
    p.push(Event::framework_sample(FrameworkId::PyTorch, GIB, GIB / 4, vramhook_protocol::kinds::UNKNOWN_BYTES, 1));
    let s = model_of(&p).snapshot();
    let c = &s.processes[0].framework_caches[0];
    assert_eq!((c.allocated_bytes, c.largest_free_block), (GIB / 4, Some(GIB / 4)));
    assert_eq!(c.fragmentation, Some(fragmentation(GIB / 4, 3 * GIB / 4)));
}

/// CuPy at its OOM: the driver refuses, CuPy frees every cached block (70 on the H200, more
/// than the incident window's 64 events) and its retry of the same size succeeds: recovered.
#[test]
fn a_retry_after_the_framework_freed_seventy_blocks_is_recovered() {
    let mut p = Proc::new(706, 0);
    p.push(Event::frameworks(FrameworkId::CuPy.bit()));
    for i in 0..140u64 {
        p.alloc(Api::cuMemAlloc_v2, 0x7f00_0000_0000 + i * GIB, GIB);
    }
    p.meminfo(GIB / 2, TOTAL).oom(Api::cuMemAlloc_v2, 3 * GIB).meminfo(GIB / 2, TOTAL);
    for i in (0..140u64).step_by(2) {
        p.free(Api::cuMemFree_v2, 0x7f00_0000_0000 + i * GIB);
    }
    p.alloc(Api::cuMemAlloc_v2, 0x7e00_0000_0000, 3 * GIB);
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 1);
    let inc = &s.incidents[0];
    assert_eq!((inc.outcome, inc.retries), (Outcome::Recovered, 1), "{inc:#?}");
    assert_eq!(inc.freed_bytes_between, 70 * GIB);
}

/// No retry, no lens: the incident is open while the process runs, and ends `Failed` when it
/// exits (by the exit event or the agent's watcher); a recovered one stays recovered.
#[test]
fn an_incident_never_stays_open_past_the_process_exit() {
    for by_event in [true, false] {
        let mut p = torch_cache(4, 100 * MIB, 2 * GIB);
        let m = model_of(&p);
        assert_eq!(m.snapshot().incidents[0].outcome, Outcome::Open, "the process still runs");
        p.alloc(Api::cuMemAlloc_v2, 0x7e00_0000_0000, 3 * GIB).oom(Api::cuMemAlloc_v2, 4 * GIB);
        p.alloc(Api::cuMemAlloc_v2, 0x7d00_0000_0000, 4 * GIB); // the second one's retry
        let mut m = model_of(&p);
        if by_event {
            m.apply(&vramhook_testkit::events::made(Event::process_exit(), 700, p.ts + 1, 0));
        } else {
            m.process_exit(700, 0, Some(1), p.ts + 1);
        }
        let s = m.snapshot();
        let outcomes: Vec<_> = s.incidents.iter().map(|i| i.outcome).collect();
        assert_eq!(outcomes, vec![Outcome::Failed, Outcome::Recovered], "by event: {by_event}");
    }
}

/// The program moved on without the bytes: its retry window closed with no retry (a
/// same-size allocation 3 s later is a new request, not the retry), or another request
/// failed: the incident ends `Failed`, never `Open` past that.
#[test]
fn an_incident_ends_failed_when_the_program_moves_on_without_the_bytes() {
    let mut p = torch_cache(4, 100 * MIB, 2 * GIB);
    p.ts += 3_000_000_000;
    p.alloc(Api::cuMemAlloc_v2, 0x7e00_0000_0000, 2 * GIB);
    let s = model_of(&p).snapshot();
    assert_eq!((s.incidents[0].outcome, s.incidents[0].retries), (Outcome::Failed, 0));
    let mut p = torch_cache(4, 100 * MIB, 2 * GIB);
    p.oom(Api::cuMemAlloc_v2, GIB);
    let s = model_of(&p).snapshot();
    let outcomes: Vec<_> = s.incidents.iter().map(|i| i.outcome).collect();
    assert_eq!(outcomes, vec![Outcome::Failed, Outcome::Open]);
}

/// PyTorch with its memory history on: the lens's record is late (its snapshot took
/// seconds, in the old lens) with nothing of the program between: it still joins the
/// driver's failure by the order of events, and the segments listed after it join it too
/// and refine its verdict (the OOM record's largest block was unknown).
#[test]
fn a_late_lens_record_and_its_later_segments_join_the_drivers_failure() {
    let mut p = torch_cache(8, 100 * MIB, GIB);
    p.oom(Api::cuMemAlloc_v2, GIB);
    p.ts += 6_600_000_000;
    let unknown = vramhook_protocol::kinds::UNKNOWN_BYTES;
    p.push(Event::framework_oom(FrameworkId::PyTorch, GIB, 8 * GIB, 8 * 600 * MIB, unknown));
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 1, "one failure, one incident");
    let inc = &s.incidents[0];
    assert_eq!((inc.outcome, inc.verdict), (Outcome::Failed, Verdict::FrameworkFragmentation), "{}", inc.explanation);
    assert_eq!(inc.framework_oom.as_ref().and_then(|l| l.largest_free_block), None);
    p.ts += 3_000_000_000; // the snapshot's seconds
    for i in 0..8 {
        p.push(Event::framework_segment(0x7f00_0000_0000 + i * GIB, GIB, 600 * MIB, 424 * MIB, 1));
    }
    let m = model_of(&p);
    let s = m.snapshot();
    assert!(s.anomalies.is_empty(), "{:?}", s.anomalies);
    let inc = &s.incidents[0];
    let l = inc.framework_oom.as_ref().expect("lens");
    assert_eq!((l.segments_listed, l.largest_free_block), (8, Some(424 * MIB)));
    assert!(inc.explanation.contains("largest free block was 424.00 MiB"), "{}", inc.explanation);
}

/// The lens joins by the request and the order of events, not by a time window alone: a
/// framework failure for more than the driver's open failure asked (no VMM chunk) is its own
/// incident; an old unsettled failure the program moved on from is not joined.
#[test]
fn a_lens_record_joins_only_a_failure_that_can_be_its_request() {
    let mut p = torch_cache(8, 100 * MIB, 100 * MIB);
    p.push(Event::framework_oom(FrameworkId::Jax, 2 * GIB, 8 * GIB, 4 * GIB, GIB));
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 2, "{:#?}", s.incidents);
    assert_eq!((s.incidents[1].api, s.incidents[1].requested_bytes), (Api::Lens, 2 * GIB));
    assert!(s.incidents[0].framework_oom.is_none());

    // A driver failure whose device the interposer could not name: still this request's.
    let mut p = Proc::new(709, 0);
    p.push(Event::frameworks(FrameworkId::CuPy.bit()));
    p.device = -1;
    p.oom(Api::cuMemAlloc_v2, GIB);
    p.device = 0;
    p.push(Event::framework_oom(FrameworkId::CuPy, GIB, 4 * GIB, 4 * GIB, vramhook_protocol::kinds::UNKNOWN_BYTES));
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 1, "{:#?}", s.incidents);
    assert!(s.incidents[0].framework_oom.is_some());

    // Moved on: more than the window's events of the program, within 2 s.
    let mut p = torch_cache(8, 100 * MIB, 2 * GIB);
    for i in 0..70u64 {
        p.alloc(Api::cuMemAlloc_v2, 0x7c00_0000_0000 + i * MIB, MIB);
    }
    p.push(Event::framework_oom(FrameworkId::PyTorch, 2 * GIB, 8 * GIB, 4 * GIB, GIB));
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 2, "{:#?}", s.incidents);
}

/// JAX with its default preallocation: XLA fails inside its own pool, no driver call fails;
/// the lens's record (memory_stats at the raise) is the incident, judged on XLA's numbers.
#[test]
fn a_jax_oom_inside_its_preallocated_pool_is_an_incident_with_xlas_numbers() {
    let mut p = Proc::new(707, 0);
    p.push(Event::frameworks(FrameworkId::Jax.bit()));
    p.create(1, 100 * GIB).meminfo(30 * GIB, TOTAL);
    p.push(Event::framework_oom(FrameworkId::Jax, 2 * GIB, 100 * GIB, 50 * GIB, GIB));
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 1);
    let inc = &s.incidents[0];
    assert_eq!((inc.api, inc.outcome), (Api::Lens, Outcome::Failed));
    assert_eq!(inc.verdict, Verdict::FrameworkFragmentation, "{}", inc.explanation);
    assert_eq!(inc.framework, Some(FrameworkId::Jax));
    assert!(
        inc.explanation.contains("The largest free block was 1.00 GiB, for a request of 2.00 GiB"),
        "{}",
        inc.explanation
    );
}

/// TensorFlow says only the bytes in use: its reserved bytes come unknown, and the bytes
/// the process holds from the driver on the device (its BFC pool) stand for them.
#[test]
fn tensorflows_unknown_reserved_bytes_are_the_process_held_bytes() {
    let mut p = Proc::new(708, 0);
    p.push(Event::frameworks(FrameworkId::TensorFlow.bit()));
    p.allocs_a_gib_apart(10, GIB).meminfo(100 * MIB, TOTAL).oom(Api::cuMemAlloc_v2, 3 * GIB);
    let unknown = vramhook_protocol::kinds::UNKNOWN_BYTES;
    p.push(Event::framework_oom(FrameworkId::TensorFlow, 3 * GIB, unknown, 6 * GIB, unknown));
    let s = model_of(&p).snapshot();
    assert_eq!(s.incidents.len(), 1);
    let inc = &s.incidents[0];
    let l = inc.framework_oom.as_ref().expect("lens");
    assert_eq!((l.reserved, l.allocated, l.largest_free_block), (10 * GIB, 6 * GIB, None));
    assert_eq!((inc.verdict, inc.outcome), (Verdict::FrameworkFragmentation, Outcome::Failed), "{}", inc.explanation);
}
