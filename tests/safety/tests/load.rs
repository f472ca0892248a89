//! Load: 64 processes × 16 threads traced under `vramhook run` and under the agent, and an
//! agent SIGKILLed and restarted under load. Every process's accounting is exact against
//! the simulated driver's ground truth: each call it made is delivered once or counted as
//! dropped (how many are dropped depends on the machine; that none is lost uncounted does
//! not). Sized for a 2-core machine running two copies of the suite at once.

use std::process::Command;
use std::time::Duration;
use vramhook_safety_tests::load_kit;
use vramhook_safety_tests::ring_kit::Agent;
use vramhook_safety_tests::{interposer, vramhook_bin};

const PROCS: usize = 64;
const THREADS: usize = 16;
const ITERS: usize = 100;
/// Rings of 1,024 slots for ~3,200 calls per process: whether the reader keeps up or not,
/// the drop path is exercised along with the delivery path.
const SLOTS: &str = "1024";

/// Stops the agent with SIGTERM (it must exit 0), then checks every process of the ground
/// truth in `truth` against the capture files in `captures`: (issued, delivered, dropped).
fn stop_and_check(
    agent: &mut Agent,
    truth: &std::path::Path,
    captures: &std::path::Path,
    procs: usize,
    what: &str,
) -> (u64, u64, u64) {
    let exit = agent.terminate(Duration::from_secs(120)).expect("the agent stops on SIGTERM");
    assert_eq!(exit.code(), Some(0), "SIGTERM: a clean stop\n{}", agent.log());
    let truth = load_kit::truth_calls(truth);
    assert_eq!(truth.len(), procs);
    let got = load_kit::captured(&load_kit::capture_files(captures));
    load_kit::assert_exact(&truth, &got, what)
}

#[test]
fn sixty_four_processes_of_sixteen_threads_under_run_account_exactly() {
    let rings = load_kit::ring_dir("run64");
    let out = tempfile::tempdir().expect("dir");
    let truth = out.path().join("truth");
    std::fs::create_dir(&truth).expect("truth dir");
    let capture = out.path().join("run.vhc");
    let status = Command::new(vramhook_bin())
        .args(["run", "--quiet", "--ring-dir"])
        .arg(rings.path())
        .arg("--record")
        .arg(&capture)
        .args(["--", "sh", "-c", &load_kit::many_threads16(PROCS, THREADS, ITERS)])
        .env("VRAMHOOK_LIB", interposer())
        .env("VRAMHOOK_SIM_LOG_DIR", &truth)
        .env("VRAMHOOK_RING_SLOTS", SLOTS)
        .status()
        .expect("vramhook run");
    assert!(status.success(), "vramhook run: {status}");
    let truth = load_kit::truth_calls(&truth);
    assert_eq!(truth.len(), PROCS, "every process left its ground truth");
    let got = load_kit::captured(&[capture]);
    let (issued, delivered, dropped) = load_kit::assert_exact(&truth, &got, "vramhook run");
    eprintln!("run: {PROCS} processes x {THREADS} threads: {issued} calls, {delivered} delivered, {dropped} dropped");
    assert!(std::fs::read_dir(rings.path()).expect("ring dir").next().is_none(), "every ring removed");
}

#[test]
fn sixty_four_processes_of_sixteen_threads_under_the_agent_account_exactly() {
    let rings = load_kit::ring_dir("agent64");
    let out = tempfile::tempdir().expect("dir");
    let truth = out.path().join("truth");
    let captures = out.path().join("captures");
    std::fs::create_dir(&truth).expect("truth dir");
    let mut agent = Agent::start(rings.path(), &["--capture-dir", captures.to_str().unwrap(), "--no-recover"]);
    let status = Command::new("sh")
        .args(["-c", &load_kit::many_threads16(PROCS, THREADS, ITERS)])
        .env("LD_PRELOAD", interposer())
        .env("VRAMHOOK_DIR", rings.path())
        .env("VRAMHOOK_SIM_LOG_DIR", &truth)
        .env("VRAMHOOK_RING_SLOTS", SLOTS)
        .env_remove("VRAMHOOK_RUN_ID")
        .status()
        .expect("load");
    assert!(status.success());
    agent.wait_state(Duration::from_secs(300), "every ring drained and closed", |s| {
        s["agent"]["rings_open"] == 0 && s["agent"]["rings_closed"].as_u64().unwrap_or(0) >= PROCS as u64
    });
    let (issued, delivered, dropped) = stop_and_check(&mut agent, &truth, &captures, PROCS, "agent");
    eprintln!("agent: {PROCS} processes x {THREADS} threads: {issued} calls, {delivered} delivered, {dropped} dropped");
}

/// The agent is SIGKILLed twice while 32 processes × 8 threads write, and restarted each
/// time: every call is in the captures exactly once. What a killed agent had read but not
/// yet committed (its capture had not flushed it) was still in the rings, and what it had
/// flushed but not committed was skipped by the next one as a duplicate. Only the writers'
/// own drops may be counted (none took a slot: no marker's `aux`).
#[test]
fn agent_sigkill_and_restart_under_load_loses_nothing() {
    let (procs, threads, iters) = (32, 8, 400);
    let rings = load_kit::ring_dir("restart");
    let out = tempfile::tempdir().expect("dir");
    let truth = out.path().join("truth");
    let captures = out.path().join("captures");
    std::fs::create_dir(&truth).expect("truth dir");
    let args = ["--capture-dir", captures.to_str().unwrap(), "--checkpoint-interval", "0.2"];
    let mut first = Agent::start(rings.path(), &args);
    let mut load = Command::new("sh")
        .args(["-c", &load_kit::many_threads16(procs, threads, iters)])
        .env("LD_PRELOAD", interposer())
        .env("VRAMHOOK_DIR", rings.path())
        .env("VRAMHOOK_SIM_LOG_DIR", &truth)
        .env_remove("VRAMHOOK_RUN_ID")
        .spawn()
        .expect("load");
    // Mid-stream: a quarter of the ~205,000 calls in, then a few thousand more (default
    // rings hold every process's calls, so these are reached whatever the speed).
    let quarter = (procs * threads * iters * 2 / 4) as u64;
    first.wait_state(Duration::from_secs(300), "a quarter of the calls ingested", |s| {
        s["agent"]["events_ingested"].as_u64().unwrap_or(0) > quarter
    });
    first.kill();
    let mut middle = Agent::start(rings.path(), &args);
    middle.wait_state(Duration::from_secs(300), "more calls ingested", |s| {
        s["agent"]["events_ingested"].as_u64().unwrap_or(0) > 5_000
    });
    middle.kill();
    let mut second = Agent::start(rings.path(), &args);
    assert!(load.wait().expect("load").success());
    second.wait_state(Duration::from_secs(300), "every ring drained and closed", |s| {
        s["agent"]["rings_open"] == 0
            && std::fs::read_dir(rings.path()).map(|mut d| d.next().is_none()).unwrap_or(false)
    });
    let stats = second.state()["agent"].clone();
    eprintln!("last agent's stats before stopping: {stats}");
    let (issued, delivered, dropped) =
        stop_and_check(&mut second, &truth, &captures, procs, "agent killed and restarted");
    for (pid, c) in &load_kit::captured(&load_kit::capture_files(&captures)) {
        let slots_lost: u64 = c.markers.iter().map(|(_, aux)| aux).sum();
        assert_eq!(slots_lost, 0, "pid {pid}: events that reached its ring were lost to a restart: {:?}", c.markers);
    }
    eprintln!(
        "restart: {procs} processes x {threads} threads: {issued} calls, {delivered} delivered, {dropped} dropped; \
         last agent skipped {} duplicates",
        stats["duplicates_skipped"]
    );
}
