//! "Is it me, or is it them?": other processes' memory at a failure (issue #26), and the
//! framework's own limit and a full cache (issue #29, items 4 and 5). One device of 139.80
//! GiB; the asker (pid 900) wants 60 GiB with 38.77 GiB free, as in the H200 run.

use vramhook_model::*;
use vramhook_protocol::{Api, Event, FrameworkId};
use vramhook_testkit::events::Stream as Proc;

const TOTAL: u64 = 150_110_011_392; // 139.80 GiB
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const FREE: u64 = 41_630_000_000; // 38.77 GiB

/// Applies the streams in time order (as the agent and a capture deliver them).
fn model_of(streams: &[&Proc]) -> Model {
    let mut all: Vec<Event> = streams.iter().flat_map(|p| p.out.iter().copied()).collect();
    all.sort_by_key(|e| e.ts_ns);
    let mut m = Model::default();
    for e in &all {
        m.apply(e);
    }
    m
}

/// Process `pid`, its clock from `start_ts`, with PyTorch loaded (the frameworks event).
fn pytorch_proc(pid: u32, start_ts: u64) -> Proc {
    let mut p = Proc::new(pid, start_ts);
    p.push(Event::frameworks(FrameworkId::PyTorch.bit()));
    p
}

/// A PyTorch process (pid 901) that reserved `gib` 1 GiB segments and freed every tensor in
/// them: `memory_reserved()` = `gib` GiB, `memory_allocated()` 0.
fn idle_holder(gib: u64, lens: bool) -> Proc {
    let mut h = pytorch_proc(901, 0);
    h.allocs_a_gib_apart(gib, GIB);
    if lens {
        h.push(Event::framework_sample(FrameworkId::PyTorch, gib * GIB, 0, GIB, gib).on_device(0));
        h.push(Event::framework_stats(FrameworkId::PyTorch, 0, u64::MAX, 0).on_device(0));
    }
    h
}

/// The asker: starts after the holder, fails a 60 GiB request.
fn asker(request: u64) -> Proc {
    let mut a = pytorch_proc(900, 500_000_000);
    a.meminfo(FREE, TOTAL).oom(Api::cuMemAlloc_v2, request).meminfo(FREE, TOTAL);
    a
}

/// Asserts that the incident's explanation says each of `phrases`.
fn assert_explains(inc: &OomIncident, phrases: &[&str]) {
    for phrase in phrases {
        assert!(inc.explanation.contains(phrase), "no {phrase:?} in {}", inc.explanation);
    }
}

fn incident(m: &Model) -> OomIncident {
    let s = m.snapshot();
    assert_eq!(s.incidents.len(), 1, "{:?}", s.incidents);
    s.incidents[0].clone()
}

#[test]
fn another_process_idle_cache_seen_through_its_lens_is_other_process_to_the_byte() {
    let m = model_of(&[&idle_holder(100, true), &asker(60 * GIB)]);
    let inc = incident(&m);
    assert_eq!(inc.verdict, Verdict::OtherProcess, "{}", inc.explanation);
    let h = &inc.holders[0];
    assert_eq!((h.pid, h.sight), (901, HolderSight::Lens));
    assert_eq!(h.releasable_bytes, 100 * GIB, "reserved − allocated − stranded");
    assert_eq!((h.stranded_bytes, h.live_bytes), (0, 0));
    assert_explains(&inc, &["with their releasable bytes given back", "torch.cuda.empty_cache()"]);
    assert!(inc.fix.starts_with("Have pid 901 give back its idle memory (torch.cuda.empty_cache()"), "{}", inc.fix);
}

#[test]
fn a_lens_sample_splits_releasable_from_stranded() {
    let mut h = pytorch_proc(901, 0);
    h.allocs_a_gib_apart(100, GIB);
    // 100 GiB reserved, 30 GiB allocated, 50 GiB free in split blocks.
    h.push(Event::framework_sample(FrameworkId::PyTorch, 100 * GIB, 30 * GIB, 200 * MIB, 100).on_device(0));
    h.push(Event::framework_stats(FrameworkId::PyTorch, 50 * GIB, u64::MAX, 0).on_device(0));
    let m = model_of(&[&h, &asker(60 * GIB)]);
    let inc = incident(&m);
    let holder = &inc.holders[0];
    assert_eq!((holder.releasable_bytes, holder.stranded_bytes, holder.live_bytes), (20 * GIB, 50 * GIB, 30 * GIB));
    assert_eq!(inc.verdict, Verdict::OtherProcess, "{}", inc.explanation);
    assert_explains(&inc, &["stranded bytes given back too"]);
    // The process's own figures per device, for /metrics and top.
    let pv = m.snapshot().processes.into_iter().find(|p| p.pid == 901).expect("holder");
    assert_eq!(
        pv.device_memory,
        vec![ProcessDeviceMemory {
            device: 0,
            held_bytes: 100 * GIB,
            releasable_bytes: 20 * GIB,
            stranded_bytes: 50 * GIB,
            not_visible_bytes: 0
        }]
    );
}

#[test]
fn a_stale_lens_sample_does_not_count() {
    let mut h = idle_holder(100, true);
    h.ts += 2 * LENS_SAMPLE_FRESH_NS; // the holder's last sample is 10 s older than the failure
    let mut a = asker(60 * GIB);
    for e in &mut a.out {
        e.ts_ns += 2 * LENS_SAMPLE_FRESH_NS;
    }
    let inc = incident(&model_of(&[&h, &a]));
    // Too old to say what the cache holds now: as if no lens ran.
    assert_eq!(inc.holders[0].sight, HolderSight::CacheNotVisible);
    assert_eq!((inc.holders[0].releasable_bytes, inc.holders[0].not_visible_bytes), (0, 100 * GIB));
}

#[test]
fn another_process_cache_without_a_lens_is_other_process_not_visible() {
    let inc = incident(&model_of(&[&idle_holder(100, false), &asker(60 * GIB)]));
    assert_eq!(inc.verdict, Verdict::OtherProcess, "{}", inc.explanation);
    let h = &inc.holders[0];
    assert_eq!((h.pid, h.sight, h.not_visible_bytes), (901, HolderSight::CacheNotVisible, 100 * GIB));
    assert_explains(&inc, &["cache not visible"]);
}

#[test]
fn another_process_live_bytes_are_other_process_named_as_live() {
    let mut h = Proc::new(902, 0);
    h.allocs_a_gib_apart(100, GIB); // no caching framework: plain allocations in use
    let inc = incident(&model_of(&[&h, &asker(60 * GIB)]));
    assert_eq!(inc.verdict, Verdict::OtherProcess, "{}", inc.explanation);
    let holder = &inc.holders[0];
    assert_eq!((holder.pid, holder.sight, holder.live_bytes), (902, HolderSight::Driver, 100 * GIB));
    assert_explains(&inc, &["memory they were using"]);
    assert!(inc.fix.starts_with("Stop pid 902, move it to another GPU"), "{}", inc.fix);
    assert_explains(&inc, &["stop it, move it to another GPU"]);
}

#[test]
fn a_request_larger_than_the_device_is_capacity() {
    let inc = incident(&model_of(&[&idle_holder(100, true), &asker(200 * GIB)]));
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
    assert_explains(&inc, &["with the device to itself"]);
}

fn nvml_sample(seq: u64, ts: u64, entries: &[(u32, u64, &str)]) -> Vec<Event> {
    if entries.is_empty() {
        return vec![Event::gpu_process(seq, 0, 0, 0, b"").at(ts).on_device(0)];
    }
    let n = entries.len() as u32;
    entries
        .iter()
        .map(|(pid, bytes, name)| Event::gpu_process(seq, n, *pid, *bytes, name.as_bytes()).at(ts).on_device(0))
        .collect()
}

#[test]
fn an_untraced_holder_named_by_nvml_is_other_process() {
    let mut m = Model::default();
    let a = asker(60 * GIB);
    let fail_ts = a.out.iter().find(|e| e.failed()).map(|e| e.ts_ns).expect("failure");
    // Before NVML speaks, the device's untraced bytes are stated but counted for no one.
    for e in &a.out {
        m.apply(e);
    }
    let before = incident(&m);
    assert_eq!(before.verdict, Verdict::Capacity, "{}", before.explanation);
    assert_eq!(before.holders[0].sight, HolderSight::UntracedUnnamed);
    assert_explains(&before, &["NVML was not read"]);
    // NVML, read right after the failure, names the holder: the incident is judged again.
    for e in nvml_sample(7, fail_ts + 20_000_000, &[(4242, 100 * GIB, "llama-server"), (900, 600 * MIB, "python3")]) {
        m.apply(&e);
    }
    let after = incident(&m);
    assert_eq!(after.verdict, Verdict::OtherProcess, "{}", after.explanation);
    let h = &after.holders[0];
    assert_eq!((h.pid, h.command.as_str(), h.sight), (4242, "llama-server", HolderSight::Untraced));
    assert_eq!((h.held_bytes, h.nvml_bytes), (100 * GIB, Some(100 * GIB)));
    assert_eq!(after.holders.len(), 1, "the asker's own NVML entry is its own, not a holder");
    assert_explains(&after, &["untraced; NVML's figure, its context included"]);
    // A checkpoint keeps the sample.
    let restored = Model::restore(&m.checkpoint()).expect("restore");
    assert_eq!(incident(&restored).holders, after.holders);
}

#[test]
fn an_empty_nvml_sample_replaces_the_last_one() {
    let mut m = Model::default();
    for e in nvml_sample(1, 100, &[(4242, 100 * GIB, "llama-server")]).iter().chain(&nvml_sample(2, 200, &[])) {
        m.apply(e);
    }
    for e in &asker(60 * GIB).out {
        m.apply(e);
    }
    let inc = incident(&m);
    assert!(inc.holders.iter().all(|h| h.pid != 4242), "{:?}", inc.holders);
    assert_eq!(m.process_count(), 1, "NVML entries are no traced processes");
}

#[test]
fn a_framework_limit_below_the_request_is_capacity_of_the_limit() {
    // PyTorch under set_per_process_memory_fraction: 4.19 GiB allowed, 3.84 GiB allocated,
    // 96 MiB cached; a 648 MiB request cannot fit even with the cache given back.
    let mut p = pytorch_proc(910, 0);
    p.allocs_a_gib_apart(4, 1000 * MIB);
    let limit = 4_499_000_000;
    p.push(Event::framework_sample(FrameworkId::PyTorch, 3936 * MIB, 3840 * MIB, 96 * MIB, 4).on_device(0));
    p.push(Event::framework_stats(FrameworkId::PyTorch, 96 * MIB, limit, 0).on_device(0));
    p.push(Event::framework_oom(FrameworkId::PyTorch, 648 * MIB, 3936 * MIB, 3840 * MIB, 96 * MIB).on_device(0));
    let inc = incident(&model_of(&[&p]));
    assert_eq!(inc.framework_limit, Some(limit));
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
    assert_explains(&inc, &["capacity (of the framework's limit)", "set_per_process_memory_fraction"]);
    assert!(inc.fix.contains("Raise the framework's limit of 4.19 GiB"), "{}", inc.fix);
}

#[test]
fn a_full_cache_with_the_driver_reserve_left_is_capacity() {
    // PyTorch's small pool filled: the last 2 MiB cudaMalloc fails with 3.12 MiB free, the
    // lens's sample says every cached byte is allocated.
    let mut p = pytorch_proc(911, 0);
    p.allocs_a_gib_apart(4, 2 * MIB);
    p.push(Event::framework_sample(FrameworkId::PyTorch, 8 * MIB, 8 * MIB, 0, 4).on_device(0));
    p.meminfo(3_271_557, TOTAL).oom(Api::cuMemAlloc_v2, 2 * MIB).meminfo(3_271_557, TOTAL);
    let inc = incident(&model_of(&[&p]));
    assert_eq!(inc.verdict, Verdict::Capacity, "{}", inc.explanation);
    assert_explains(&inc, &["fully allocated"]);
    // Without the lens the same numbers are not explained.
    let mut q = Proc::new(911, 0);
    q.allocs_a_gib_apart(4, 2 * MIB);
    q.meminfo(3_271_557, TOTAL).oom(Api::cuMemAlloc_v2, 2 * MIB).meminfo(3_271_557, TOTAL);
    assert_eq!(incident(&model_of(&[&q])).verdict, Verdict::Unknown);
}

#[test]
fn a_lens_sample_of_pytorchs_async_backend_keeps_the_pools_reserve_live() {
    // backend:cudaMallocAsync: 20 allocations from the default pool, every other one freed;
    // PyTorch's memory_reserved() is the pool's reserve (1,543,503,872 on the H200), which
    // the interposer's sparse pool samples had not caught up with.
    let mut p = pytorch_proc(920, 0);
    for i in 0..20u64 {
        p.alloc(Api::cuMemAllocAsync, 0x1000_0000_0000 + i * 64 * MIB, 40 * MIB);
    }
    for i in (0..20u64).step_by(2) {
        p.free(Api::cuMemFreeAsync, 0x1000_0000_0000 + i * 64 * MIB);
    }
    let held = |p: &Proc| model_of(&[p]).snapshot().processes[0].held_bytes;
    let before = held(&p);
    assert_eq!(before, 800 * MIB, "the reserve as the high-water mark estimates it");
    // A sample whose allocated bytes are not the pool's live bytes says nothing of the pool.
    p.push(Event::framework_sample(FrameworkId::PyTorch, 1_543_503_872, 300 * MIB, u64::MAX, 0).on_device(0));
    assert_eq!(held(&p), before);
    p.push(Event::framework_sample(FrameworkId::PyTorch, 1_543_503_872, 400 * MIB, u64::MAX, 0).on_device(0));
    assert_eq!(held(&p), 1_543_503_872, "held = memory_reserved()");
}
