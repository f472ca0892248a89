//! Fault tests of the agent's sources: a writer killed in the middle of its work, and a
//! writer that died between reserving a slot and publishing it.

mod agent_support;

use agent_support::*;
use std::time::Duration;
use vramhook_protocol::record::{Api, Event};

#[test]
fn a_writer_killed_mid_run_is_closed_and_its_ring_removed() {
    let (rings, agent) = Agent::on_new_rings("killed", &[]);
    let mut child = spawn_traced(&workload("threads16"), &["--threads", "8", "--iters", "5000000"], rings.path(), &[]);
    let pid = child.id();
    agent.wait_state(Duration::from_secs(30), "events flowing", |s| {
        process(s, pid).is_some_and(|p| p["allocations"].as_u64().unwrap_or(0) > 10_000)
    });
    let _ = child.kill(); // SIGKILL: threads die between reserve and publish, or mid-call
    let _ = child.wait();
    let s = agent.wait_state(Duration::from_secs(30), "the killed writer's ring to close", |s| {
        s["agent"]["rings_open"] == 0 && process(s, pid).is_some_and(|p| p["alive"] == false)
    });
    assert!(std::fs::read_dir(rings.path()).expect("dir").next().is_none(), "ring removed");
    let p = process(&s, pid).expect("process");
    assert_eq!(p["live_bytes"], 0, "a dead process holds nothing");
    // The agent is still healthy.
    assert!(agent.get("/healthz").contains("ok"));
}

#[test]
fn slots_reserved_by_a_writer_that_died_are_counted_as_lost() {
    let rings = ring_dir("inflight");
    let mut holder = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
    let pid = holder.id();
    let (writer, base, len) = vramhook_testkit::ring_file(rings.path(), pid, 64, &[]);
    for i in 0..10u64 {
        let e = Event::alloc(Api::cuMemAlloc_v2, 0x1000_0000 + i * 0x10_0000, 4096).by(pid, pid).on_device(0);
        assert!(writer.push(&e.to_raw()));
    }
    // Two slots reserved and never published: the writer "died" mid-write.
    // SAFETY: write_pos is the atomic at offset 256 of the header.
    let write_pos = unsafe { &*(base.add(256) as *const std::sync::atomic::AtomicU64) };
    write_pos.fetch_add(2, std::sync::atomic::Ordering::Release);

    let bin = vramhook_bin();
    let agent = Agent::start(&bin, &["--ring-dir", rings.path().to_str().unwrap()], &[]);
    agent.wait_state(Duration::from_secs(20), "the ten published events", |s| {
        process(s, pid).is_some_and(|p| p["live_allocations"] == 10)
    });
    let _ = holder.kill();
    let _ = holder.wait();
    let s = agent.wait_state(Duration::from_secs(20), "the dead writer's ring to close", |s| {
        s["agent"]["rings_open"] == 0
            && s["agent"]["rings_closed"] == 1
            && process(s, pid).is_some_and(|p| p["alive"] == false)
    });
    assert_eq!(s["agent"]["writer_dropped"], 2, "the two unpublished slots are counted: {}", s["agent"]);
    let p = process(&s, pid).expect("process");
    assert_eq!(p["dropped_events"], 2);
    assert_eq!(p["alive"], false);
    let metrics = agent.get("/metrics");
    assert_eq!(prom_value(&metrics, "vramhook_agent_events_dropped_total{kind=\"writer\"}"), Some(2.0));
    // SAFETY: unmapping our own mapping.
    unsafe { libc::munmap(base.cast(), len) };
}
