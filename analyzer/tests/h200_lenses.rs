//! Real captures from the H200 (`tests/fixtures/h200-lenses/`): CuPy's and JAX's lenses and a
//! stream-ordered pool's sampled reserve, judged by the same code as live.

use std::path::{Path, PathBuf};
use vramhook_analyzer::{analyze, Options, Report};
use vramhook_model::Verdict;
use vramhook_protocol::record::FrameworkId;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/h200-lenses").join(name)
}

fn run(name: &str) -> Report {
    analyze(&[fixture(name)], &Options::default()).expect("analyze")
}

#[test]
fn cupys_fragmented_pool_is_framework_fragmentation_with_its_own_numbers() {
    let r = run("cupy_fragmented.vhc");
    let fatal = r
        .ooms
        .iter()
        .map(|o| &o.incident)
        .find(|o| o.requested_bytes == 2 << 30)
        .expect("the 2 GiB request's incident");
    assert_eq!(fatal.verdict.name(), "framework_fragmentation", "{}", fatal.explanation);
    assert_eq!(fatal.framework, Some(FrameworkId::CuPy));
    // The pool's own numbers, as its lens sampled them (total_bytes - used_bytes).
    assert!(
        fatal.explanation.contains("61,798,875,136 bytes) reserved by CuPy but unallocated"),
        "{}",
        fatal.explanation
    );
    // The fill's first failure: the cache held the bytes, and how full it was is not known.
    assert!(r
        .ooms
        .iter()
        .any(|o| o.incident.requested_bytes == 1 << 30 && o.incident.verdict == Verdict::FrameworkCache));
}

#[test]
fn jaxs_pool_growth_failures_are_framework_fragmentation_with_its_largest_free_block() {
    let r = run("jax_fragmented.vhc");
    let last = &r.ooms.last().expect("incidents").incident;
    assert_eq!(last.verdict.name(), "framework_fragmentation", "{}", last.explanation);
    assert_eq!(last.framework, Some(FrameworkId::Jax));
    assert!(last.explanation.contains("the largest free block was"), "{}", last.explanation);
    assert!(r.ooms.iter().all(|o| o.incident.verdict != Verdict::Capacity), "the cache held the bytes every time");
}

#[test]
fn a_stream_ordered_pool_holds_its_sampled_reserve_not_only_its_live_allocations() {
    let async_mode = run("torch_async_pool.vhc");
    let p = &async_mode.processes[0];
    assert_eq!(p.final_live_bytes, 807_403_520, "the live allocations");
    assert_eq!(p.final_live_bytes + p.idle_bytes, 1_543_503_872, "live + the pool's idle reserve = memory_reserved()");
    let default_mode = run("torch_default_pool.vhc");
    assert_eq!(default_mode.processes[0].final_live_bytes, 1_564_475_392, "memory_reserved() in default mode");
}
