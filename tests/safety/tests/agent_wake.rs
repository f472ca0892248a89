//! An idle agent finds a new ring at once (issue 9, item 7): a process that bursts right
//! after it starts loses nothing to a ring found only at the agent's 1 s rescan.
//!
//! The burst (160,002 events from `bench_calls`, one thread) is larger than the ring
//! (131,072 slots, one lane): an agent that finds the ring late finds it full and the rest
//! dropped; one that finds it when it appears drains it while the burst runs. Nothing here
//! is timed: the test waits (with a generous deadline) for the process to be closed and
//! then counts what was dropped.

use std::process::Stdio;
use std::time::Duration;
use vramhook_safety_tests::ring_kit::{process, stat, Agent};
use vramhook_safety_tests::{require_root, traced_workload};

#[test]
fn a_burst_right_after_start_loses_nothing_while_the_agent_idles() {
    if !require_root("a_burst_right_after_start_loses_nothing_while_the_agent_idles") {
        return;
    }
    // A private ring directory owned by us (root), like /dev/shm/vramhook/0.
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let rings = tempfile::Builder::new().prefix("vramhook-wake-").tempdir_in(base).expect("ring dir");
    let mut agent = Agent::start(rings.path(), &[]);
    // Idle: the agent has backed off to its longest sleep before the process starts.
    agent.wait_state(Duration::from_secs(60), "the agent to idle", |s| stat(s, "snapshots") >= 4);

    let mut cmd = traced_workload("bench_calls", rings.path());
    cmd.args(["--threads", "1", "--iters", "80000"])
        .env("VRAMHOOK_SIM_FAST", "1")
        .env("VRAMHOOK_RING_LANES", "1")
        .env("VRAMHOOK_RING_SLOTS", "131072")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("start bench_calls");
    let pid = child.id();
    assert!(child.wait().expect("bench_calls").success(), "bench_calls failed");
    let s = agent.wait_state(Duration::from_secs(120), "the burst's process to be closed", |s| {
        process(s, pid).is_some_and(|p| p["alive"] == false)
    });
    let p = process(&s, pid).expect("the process");
    eprintln!(
        "burst: {} allocations, {} dropped (agent: {} ingested, {} writer-dropped)",
        p["allocations"],
        p["dropped_events"],
        stat(&s, "events_ingested"),
        stat(&s, "writer_dropped")
    );
    assert_eq!(p["dropped_events"], 0, "events of the burst dropped: {p}");
    assert_eq!(stat(&s, "writer_dropped"), 0, "{}", s["agent"]);
    assert!(p["allocations"].as_u64().unwrap_or(0) >= 80_000, "every allocation arrived: {p}");
}
