//! Stream-ordered pools end to end on the simulated driver (issue #10, item 7): the
//! interposer samples each pool's reserve from the driver (`cuMemPoolGetAttribute`), and a
//! process's held bytes are the pool's reserve as the driver reports it, not the live
//! allocations; the idle reserve counts as reclaimable at an OOM.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

const MIB: u64 = 1 << 20;
/// The ten odd tensors of 14..140 MiB that stay live (PyTorch's 770 MiB).
const LIVE: u64 = 807_403_520;

/// `name=N` from the workload's output.
fn printed(stdout: &str, name: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("the workload printed no {name}:\n{stdout}"))
}

fn pool_samples(t: &Traced) -> Vec<&Value> {
    t.events.iter().filter(|e| e["kind"] == "pool_sample").collect()
}

#[test]
fn a_process_holds_its_pools_reserve_as_the_driver_reports_it() {
    // 96 MiB chunks: the reserve (1,536 MiB) is not the high-water mark rounded (1,470 MiB).
    let envs = [("VRAMHOOK_SIM_POOL_CHUNK_BYTES", "100663296"), ("VRAMHOOK_MEMINFO_MS", "50")];
    let t = trace_workload("torch_async", &["--wait-ms", "200"], &envs);
    assert_eq!(t.output.status.code(), Some(0), "{}", t.stderr());
    let stdout = t.stdout();
    let reserved = printed(&stdout, "pool_reserved");
    assert_eq!((reserved, printed(&stdout, "pool_used")), (1536 * MIB, LIVE));
    let pid = t.events[0]["pid"].as_u64().expect("pid") as u32;
    let p = t.process(pid);
    assert_eq!(p["final_live_bytes"], LIVE, "live bytes stay the allocations");
    assert_eq!(p["final_held_bytes"], reserved, "held bytes are the pool's reserve as the driver says");
    // The samples: of the device's current pool, the last one taken at the program's
    // cudaMemGetInfo after its frees, with the driver's numbers.
    let samples = pool_samples(&t);
    let last = samples.last().expect("a pool_sample");
    assert_eq!((last["current"].as_bool(), last["device"].as_i64()), (Some(true), Some(0)), "{last}");
    assert_eq!((last["reserved"].as_u64(), last["used"].as_u64()), (Some(reserved), Some(LIVE)), "{last}");
    assert_eq!(last["api"], "cuMemPoolGetAttribute");
    // The interposer's samples are not calls of the program.
    assert!(p["calls"].get("cuMemPoolGetAttribute").is_none(), "{p}");
    assert_eq!(p["anomalies"], 0, "{p}");
    let text = String::from_utf8_lossy(&t.output.stderr);
    assert!(text.contains("held 1.50 GiB at the end: 770.00 MiB live"), "{text}");
}

#[test]
fn without_pool_calls_nothing_is_sampled_and_held_is_live() {
    let t = trace_workload("leak", &[], &[("VRAMHOOK_MEMINFO_MS", "0")]);
    assert!(pool_samples(&t).is_empty(), "a process with no pool reserve records no pool_sample");
    let pid = t.events[0]["pid"].as_u64().expect("pid") as u32;
    let p = t.process(pid);
    assert_eq!(p["final_held_bytes"], p["final_live_bytes"]);
}

#[test]
fn idle_pool_reserve_is_reclaimable_at_an_oom() {
    // A 2 GiB device; the pool grows by 1 GiB chunks to the whole device (2 GiB reserved,
    // 770 MiB live), then a 1 GiB cudaMalloc fails: the pool's idle 1.25 GiB would have
    // covered it. The high-water estimate (1,470 MiB) would have said capacity.
    let envs = [
        ("VRAMHOOK_SIM_VRAM_BYTES", "2147483648"),
        ("VRAMHOOK_SIM_POOL_CHUNK_BYTES", "1073741824"),
        ("VRAMHOOK_MEMINFO_MS", "50"),
    ];
    let t = trace_workload("torch_async", &["--wait-ms", "200", "--oom-mib", "1024"], &envs);
    let stdout = t.stdout();
    assert_eq!(printed(&stdout, "out_of_memory"), 1, "{stdout}");
    let out = Command::new(vramhook_bin()).arg("analyze").arg("--json").arg(t.capture()).output().expect("analyze");
    assert!(out.status.success(), "analyze: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let ooms = report["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{ooms:#?}");
    let o = &ooms[0];
    assert_eq!(o["verdict"], "reclaimable", "{}", o["explanation"]);
    assert_eq!(o["own_idle_bytes"], 2048 * MIB - LIVE, "{o}");
}

/// The driver keeps device memory for each stream (about half a MiB on an H200: the 70 MiB
/// PyTorch's async mode used beyond its pool), and no memory call shows it: every way of
/// making and destroying a stream is recorded, and the process's streams counted.
#[test]
fn streams_are_counted_through_every_entry_point() {
    let t = trace_workload("streams", &[], &[]);
    assert_eq!(t.output.status.code(), Some(0), "{}", t.stderr());
    let live = printed(&t.stdout(), "streams_live");
    let pid = t.events[0]["pid"].as_u64().expect("pid") as u32;
    let p = t.process(pid);
    assert_eq!((p["final_streams"].as_u64(), p["streams_peak"].as_u64()), (Some(live), Some(10)), "{p}");
    // The driver keeps a destroyed stream's memory for the next (measured on the H200).
    assert_eq!(p["final_stream_bytes"], 10 * vramhook_model::DEFAULT_STREAM_BYTES, "{p}");
    assert_eq!(p["final_live_bytes"], MIB, "streams are not live bytes: {p}");
    let calls = &p["calls"];
    for (api, n) in
        [("cuStreamCreate", 7), ("cuStreamCreateWithPriority", 4), ("cuStreamDestroy_v2", 3), ("cuStreamDestroy", 1)]
    {
        assert_eq!(calls[api], n, "{api} in {calls}");
    }
    assert_eq!(p["failed_calls"], 1, "the create with invalid flags: {p}");
    let creates: Vec<&Value> = t.events.iter().filter(|e| e["kind"] == "stream_create" && e["result"] == 0).collect();
    assert_eq!(creates.len(), 10);
    assert!(creates.iter().all(|e| e["device"] == 0 && e["stream"].as_u64() != Some(0)), "{creates:?}");
    let priorities: Vec<i64> = creates.iter().filter_map(|e| e["priority"].as_i64()).filter(|p| *p != 0).collect();
    assert_eq!(priorities, [-4, -5, -6, -2], "cudart's three and the driver's one");
    assert_eq!(p["anomalies"], 0, "{p}");
    let text = String::from_utf8_lossy(&t.output.stderr);
    assert!(text.contains("6 streams at the end, 10 at most: about 5.47 MiB of driver memory"), "{text}");
    // The same in the analyzer's report of the capture.
    let out = Command::new(vramhook_bin()).arg("analyze").arg(t.capture()).output().expect("vramhook analyze");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("6 streams at exit/end, 10 at most: about 5.47 MiB"), "{report}");
}

/// Another GPU or driver may keep another amount per stream: `VRAMHOOK_STREAM_BYTES` sets it
/// for `run` (and the agent, `top` and `analyze`); a value that is no number is reported and
/// the default kept.
#[test]
fn the_bytes_per_stream_can_be_set() {
    let t = trace_workload("streams", &[], &[("VRAMHOOK_STREAM_BYTES", "1048576")]);
    assert_eq!(t.output.status.code(), Some(0), "{}", t.stderr());
    let pid = t.events[0]["pid"].as_u64().expect("pid") as u32;
    assert_eq!(t.process(pid)["final_stream_bytes"], 10 * MIB, "the most streams at once, 10, at 1 MiB each");
    let out = Command::new(vramhook_bin())
        .arg("analyze")
        .arg(t.capture())
        .env("VRAMHOOK_STREAM_BYTES", "2097152")
        .output()
        .expect("vramhook analyze");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("6 streams at exit/end, 10 at most: about 20.00 MiB"), "{report}");
    let bad = trace_workload("streams", &[], &[("VRAMHOOK_STREAM_BYTES", "half a MiB")]);
    assert!(bad.stderr().contains("VRAMHOOK_STREAM_BYTES=\"half a MiB\" is not a number of bytes"), "{}", bad.stderr());
    let pid = bad.events[0]["pid"].as_u64().expect("pid") as u32;
    assert_eq!(bad.process(pid)["final_stream_bytes"], 10 * vramhook_model::DEFAULT_STREAM_BYTES);
}
