//! The fit of the next large request (issue 30): demand (the largest request in the
//! window, and where it came from), supply (by the allocator's rules) and their ratio.

use vramhook_model::*;
use vramhook_protocol::{Api, Event, FrameworkId};
use vramhook_testkit::events::Stream as Proc;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const TOTAL: u64 = 80 * GIB;
const S: u64 = 1_000_000_000;

fn model(window_ns: u64, p: &Proc) -> Model {
    let mut m = Model::new(ModelConfig { fit_window_ns: window_ns, ..ModelConfig::default() });
    for e in &p.out {
        m.apply(e);
    }
    m
}

fn fit(m: &Model, pid: u32) -> Vec<ProcessFit> {
    m.snapshot().processes.into_iter().find(|p| p.pid == pid).expect("process").fit
}

#[test]
fn plain_driver_allocations_fit_in_the_device_free_bytes_less_the_reserve() {
    let mut p = Proc::new(10, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, 2 * GIB).alloc(Api::cuMemAlloc_v2, 0x2000_0000, 512 * MIB);
    p.free(Api::cuMemFree_v2, 0x1000_0000).free(Api::cuMemFree_v2, 0x2000_0000);
    // 3 GiB + 5 MiB free: less the driver's 8 MiB reserve, rounded down to 2 MiB.
    p.meminfo(3 * GIB + 5 * MIB, TOTAL);
    let f = fit(&model(600 * S, &p), 10);
    assert_eq!(f.len(), 1);
    assert_eq!((f[0].demand_bytes, f[0].demand_source), (2 * GIB, DemandSource::Driver));
    assert_eq!((f[0].supply_bytes, f[0].supply_rule), (3 * GIB - 4 * MIB, SupplyRule::Driver));
    assert!((f[0].fit_ratio - (3 * GIB - 4 * MIB) as f64 / (2 * GIB) as f64).abs() < 1e-12);
    // 1.5 GiB free: the next 2 GiB request would not fit.
    p.meminfo(GIB + GIB / 2, TOTAL);
    let f = fit(&model(600 * S, &p), 10);
    assert!(f[0].fit_ratio < 1.0, "{f:?}");
    // 78.5 GiB of the 80 GiB device in use, 2.5 GiB of it its own: another's bytes.
    assert_eq!(f[0].limited_by, Some(FitLimit::OtherProcesses));
    // On a 4 GiB device nothing but itself: capacity.
    let mut small = Proc::new(10, 0);
    small.alloc(Api::cuMemAlloc_v2, 0x1000_0000, 2 * GIB).free(Api::cuMemFree_v2, 0x1000_0000);
    small.alloc(Api::cuMemAlloc_v2, 0x2000_0000, 2 * GIB + 512 * MIB);
    small.meminfo(GIB + GIB / 2, 4 * GIB);
    assert_eq!(fit(&model(600 * S, &small), 10)[0].limited_by, Some(FitLimit::Capacity));
}

/// Memory held since it was made (weights, a preallocated cache, a ballast) is state, not a
/// request the process will make again: an allocation counts once given back. On the H200 a
/// 125 GiB block held from the start read as the next request when every allocation counted.
#[test]
fn an_allocation_still_held_is_no_demand_until_given_back() {
    let mut p = Proc::new(18, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x10_0000_0000, 100 * GIB);
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, GIB).free(Api::cuMemFree_v2, 0x1000_0000);
    // A VMM handle released while mapped lives on; given back once unmapped.
    p.create(0x77, 8 * GIB).reserve(0x20_0000_0000, 8 * GIB).map(0x20_0000_0000, 8 * GIB, 0x77).release(0x77);
    p.meminfo(20 * GIB, TOTAL);
    let f = fit(&model(600 * S, &p), 18);
    assert_eq!((f[0].demand_bytes, f[0].demand_source), (GIB, DemandSource::Driver), "{f:?}");
    assert!(f[0].fit_ratio > 1.0);
    p.unmap(0x20_0000_0000, 8 * GIB).meminfo(28 * GIB, TOTAL);
    assert_eq!(fit(&model(600 * S, &p), 18)[0].demand_bytes, 8 * GIB);
    p.free(Api::cuMemFree_v2, 0x10_0000_0000).meminfo(128 * GIB, TOTAL);
    assert_eq!(fit(&model(600 * S, &p), 18)[0].demand_bytes, 100 * GIB);
}

#[test]
fn managed_and_another_process_memory_are_no_demand() {
    let mut p = Proc::new(17, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, GIB);
    p.push(Event::alloc_managed(0x9000_0000, 8 * GIB, 1));
    p.push(Event::alloc(Api::cuIpcOpenMemHandle_v2, 0xa000_0000, 16 * GIB));
    p.free(Api::cuMemFree_v2, 0x1000_0000).free(Api::cuMemFree_v2, 0x9000_0000);
    p.free(Api::cuIpcCloseMemHandle, 0xa000_0000);
    p.meminfo(4 * GIB, TOTAL);
    assert_eq!(fit(&model(600 * S, &p), 17)[0].demand_bytes, GIB);
}

#[test]
fn demand_is_the_largest_request_within_the_window_and_expires() {
    let mut p = Proc::new(11, 0);
    p.step_ns = S;
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, 4 * GIB).free(Api::cuMemFree_v2, 0x1000_0000); // given back at 2 s
    p.alloc(Api::cuMemAlloc_v2, 0x2000_0000, GIB).free(Api::cuMemFree_v2, 0x2000_0000); // at 4 s
    p.meminfo(10 * GIB, TOTAL); // at 5 s
    assert_eq!(fit(&model(5 * S, &p), 11)[0].demand_bytes, 4 * GIB);
    p.step_ns = 3 * S;
    p.meminfo(10 * GIB, TOTAL); // at 8 s: the 4 GiB request (2 s) is past a 5 s window
    let f = fit(&model(5 * S, &p), 11);
    assert_eq!((f[0].demand_bytes, f[0].demand_ts_ns), (GIB, 4 * S + 1_000_000)); // after the 1 ms start
                                                                                  // With the default window (10 minutes) it is still the largest.
    assert_eq!(fit(&model(DEFAULT_FIT_WINDOW_NS, &p), 11)[0].demand_bytes, 4 * GIB);
    p.step_ns = 10 * S;
    p.meminfo(10 * GIB, TOTAL); // at 18 s: nothing in the window
    assert!(fit(&model(5 * S, &p), 11).is_empty());
}

#[test]
fn a_failed_request_is_demand_and_a_lens_oom_names_its_source() {
    let mut p = Proc::new(12, 0);
    p.push(Event::frameworks(FrameworkId::PyTorch.bit()));
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, GIB);
    p.oom(Api::cuMemAlloc_v2, 3 * GIB).meminfo(GIB, TOTAL);
    assert_eq!(fit(&model(600 * S, &p), 12)[0].demand_bytes, 3 * GIB);
    p.push(Event::framework_oom(FrameworkId::PyTorch, 5 * GIB, GIB, GIB, 0).on_device(0));
    let f = fit(&model(600 * S, &p), 12);
    assert_eq!((f[0].demand_bytes, f[0].demand_source), (5 * GIB, DemandSource::LensOom));
}

/// A request served from the cache never reaches the driver: the lens's largest request
/// (PyTorch's largest given back that its snapshots show, JAX's `largest_alloc_size`) is
/// demand too, named so.
#[test]
fn a_lens_largest_allocation_is_demand_the_driver_never_saw() {
    let mut p = Proc::new(14, 0);
    p.push(Event::frameworks(FrameworkId::Jax.bit()));
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, GIB).free(Api::cuMemFree_v2, 0x1000_0000);
    p.push(Event::framework_sample(FrameworkId::Jax, GIB, GIB / 2, u64::MAX, 0).on_device(0));
    p.meminfo(GIB, TOTAL);
    assert_eq!(fit(&model(600 * S, &p), 14)[0].demand_source, DemandSource::Driver);
    // Unknown (an older lens's 0, or u64::MAX): no demand.
    for unknown in [0, u64::MAX] {
        p.push(Event::framework_stats(FrameworkId::Jax, u64::MAX, u64::MAX, unknown).on_device(0));
        assert_eq!(fit(&model(600 * S, &p), 14)[0].demand_bytes, GIB);
    }
    p.push(Event::framework_stats(FrameworkId::Jax, u64::MAX, u64::MAX, 3 * GIB).on_device(0));
    let f = fit(&model(600 * S, &p), 14);
    assert_eq!((f[0].demand_bytes, f[0].demand_source), (3 * GIB, DemandSource::LensLargestAllocation));
    assert_eq!(DemandSource::LensLargestAllocation.name(), "lens_largest_allocation");
}

/// A PyTorch process with 10 GiB reserved in 1 GiB segments.
fn torch(reserved_allocated_largest: (u64, u64, u64), stranded: u64, limit: u64, free: u64) -> Proc {
    let (reserved, allocated, largest) = reserved_allocated_largest;
    let mut p = Proc::new(13, 0);
    p.push(Event::frameworks(FrameworkId::PyTorch.bit()));
    p.allocs_a_gib_apart(10, GIB);
    p.push(Event::framework_sample(FrameworkId::PyTorch, reserved, allocated, largest, 10).on_device(0));
    // Its lens: the largest request it gave back, a segment's size.
    p.push(Event::framework_stats(FrameworkId::PyTorch, stranded, limit, GIB).on_device(0));
    p.meminfo(free, TOTAL);
    p
}

#[test]
fn a_fragmented_cache_with_a_full_device_does_not_fit() {
    // 4 GiB free in the cache, all of it in split blocks (stranded), largest 300 MiB; the
    // device has 200 MiB free: a 1 GiB request (the segments' size) would fail.
    let p = torch((10 * GIB, 6 * GIB, 300 * MIB), 4 * GIB, u64::MAX, 200 * MIB);
    let f = fit(&model(600 * S, &p), 13);
    assert_eq!(f[0].supply_rule, SupplyRule::FrameworkCache);
    assert_eq!(f[0].demand_bytes, GIB);
    assert_eq!(f[0].supply_bytes, 300 * MIB, "its largest free block beats the device's 192 MiB");
    assert!(f[0].fit_ratio < 1.0);
    assert_eq!(f[0].limited_by, Some(FitLimit::FrameworkFragmentation), "4 GiB free in its cache, split");
}

#[test]
fn what_the_cache_releases_before_it_raises_counts() {
    // Same cache but the 4 GiB free are whole free segments (nothing stranded): PyTorch
    // frees them and asks again, so 4 GiB + the device's 192 MiB are there.
    let p = torch((10 * GIB, 6 * GIB, 300 * MIB), 0, u64::MAX, 200 * MIB);
    let f = fit(&model(600 * S, &p), 13);
    assert_eq!(f[0].supply_bytes, 4 * GIB + 192 * MIB);
    assert!(f[0].fit_ratio > 1.0);
    assert_eq!(f[0].limited_by, None);
}

#[test]
fn the_framework_limit_caps_a_new_segment() {
    // Plenty free on the device, but a limit of 10.5 GiB with 10 GiB reserved and nothing
    // releasable: only 512 MiB more may be reserved.
    let p = torch((10 * GIB, 6 * GIB, 300 * MIB), 4 * GIB, 10 * GIB + 512 * MIB, 40 * GIB);
    let f = fit(&model(600 * S, &p), 13);
    assert_eq!(f[0].supply_bytes, 512 * MIB);
    assert_eq!(f[0].limited_by, Some(FitLimit::FrameworkLimit));
}

#[test]
fn a_pool_adds_its_idle_reserve_to_the_device_free_bytes() {
    let mut p = Proc::new(14, 0);
    p.push(Event::alloc_async(Api::cuMemAllocAsync, 0x1000_0000, GIB, 0));
    p.push(Event::alloc_async(Api::cuMemAllocAsync, 0x5000_0000, GIB, 0)).free(Api::cuMemFreeAsync, 0x5000_0000);
    p.pool_sample(0, 3 * GIB, GIB, true);
    p.meminfo(GIB + 8 * MIB, TOTAL);
    let f = fit(&model(600 * S, &p), 14);
    assert_eq!(f[0].supply_rule, SupplyRule::Pool);
    assert_eq!(f[0].supply_bytes, 2 * GIB + GIB, "2 GiB idle in the pool + 1 GiB free");
}

#[test]
fn no_device_sample_no_fit_and_an_exited_process_has_none() {
    let mut p = Proc::new(15, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, GIB).free(Api::cuMemFree_v2, 0x1000_0000);
    assert!(fit(&model(600 * S, &p), 15).is_empty());
    p.meminfo(GIB, TOTAL);
    assert_eq!(fit(&model(600 * S, &p), 15).len(), 1);
    p.push(Event::process_exit());
    assert!(fit(&model(600 * S, &p), 15).is_empty());
}

#[test]
fn a_checkpoint_keeps_the_window() {
    let mut p = Proc::new(16, 0);
    p.alloc(Api::cuMemAlloc_v2, 0x1000_0000, GIB).free(Api::cuMemFree_v2, 0x1000_0000).meminfo(GIB / 2, TOTAL);
    let m = model(7 * S, &p);
    let r = Model::restore(&m.checkpoint()).expect("restore");
    assert_eq!(r.config().fit_window_ns, 7 * S);
    assert_eq!(fit(&r, 16), fit(&m, 16));
}
