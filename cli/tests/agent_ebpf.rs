//! `vramhook agent --ebpf` end to end, as root, on the simulated libcuda: a process that
//! was running before the agent is traced without a restart, its numbers say "attached
//! late", the device samples show its earlier bytes as untraced; a process that also has a
//! ring is counted once (the ring wins); SIGTERM removes every probe; without privileges
//! the agent stops with one line naming the capabilities. Where BPF cannot load here,
//! each test says `not run: <reason>` (a failure under CI=true).

mod agent_support;

use agent_support::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use vramhook_safety_tests::not_run;

/// One test at a time: the first checks that no program of ours is left in the kernel.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Kills a workload when a test ends, passed or failed.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// This test's turn (the `SERIAL` lock), or `None` where eBPF mode cannot work here (then
/// reported not run).
fn ebpf_turn(test: &str) -> Option<std::sync::MutexGuard<'static, ()>> {
    let turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    match vramhook_ebpf::probe::preflight() {
        Ok(()) => Some(turn),
        Err(e) => {
            not_run(test, &e.to_string());
            None
        }
    }
}

fn process(state: &Value, pid: u32) -> Option<Value> {
    state["snapshot"]["processes"].as_array()?.iter().find(|p| p["pid"] == pid && p["alive"] == true).cloned()
}

/// Reads lines until one starts with `prefix`.
fn line_starting(out: &mut impl BufRead, prefix: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 || line.starts_with(prefix) {
            return line;
        }
    }
}

fn number_after(line: &str, key: &str) -> u64 {
    line.split_whitespace().find_map(|w| w.strip_prefix(key)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The acceptance scenario on the simulated driver.
#[test]
fn a_process_running_before_the_agent_is_traced_without_restart() {
    let test = "agent_ebpf::a_process_running_before_the_agent_is_traced_without_restart";
    let Some(_serial) = ebpf_turn(test) else { return };
    let rings = ring_dir("ebpf");
    let mut w = Reap(
        Command::new(workload("wait_alloc"))
            .args(["--before", "4", "--after", "10", "--hold"])
            .env_remove("LD_PRELOAD")
            .stdout(Stdio::piped())
            .spawn()
            .expect("start wait_alloc"),
    );
    let pid = w.0.id();
    let mut out = BufReader::new(w.0.stdout.take().expect("stdout"));
    assert!(line_starting(&mut out, "ready").starts_with("ready"));

    let pid_arg = pid.to_string();
    let mut agent = Agent::start(
        &vramhook_bin(),
        &["--ring-dir", rings.path().to_str().expect("utf8"), "--no-recover", "--snapshot-ms", "50", "--pid", &pid_arg],
        &[],
    );
    // Announced at attach, before any call: attached late, nothing known yet.
    let s = agent.wait_state(Duration::from_secs(10), "the process announced", |s| process(s, pid).is_some());
    let p = process(&s, pid).expect("process");
    assert!(p["traced_since_ns"].as_u64().is_some(), "attach note: {p}");
    assert_eq!(p["live_bytes"], 0);

    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let after = line_starting(&mut out, "after");
    let live = number_after(&after, "live=");
    assert!(live > 0, "workload said {after:?}");
    let s = agent.wait_state(Duration::from_secs(10), "the calls after attach", |s| {
        process(s, pid).is_some_and(|p| p["live_bytes"].as_u64() == Some(live) && p["oom_count"] == 1)
    });
    // Its streams too: one made and destroyed, one kept.
    let p = process(&s, pid).expect("process");
    assert_eq!((p["streams"].as_u64(), p["streams_peak"].as_u64()), (Some(1), Some(1)), "{p}");
    // The before-attach bytes (1+2+3+4 MiB requested) are untraced on the device sample.
    let devices = s["snapshot"]["devices"].as_array().expect("devices").clone();
    let untraced: u64 = devices.iter().filter_map(|d| d["untraced_bytes"].as_u64()).sum();
    assert!(untraced >= 10 << 20, "untraced {untraced} in {devices:?}");
    assert!(s["agent"]["ebpf_links"].as_u64().unwrap_or(0) >= 40, "links: {}", s["agent"]);

    let held = vramhook_ebpf::probe::program_ids_held_by(agent.child.id());
    assert!(!held.is_empty(), "the agent holds its probes' programs");
    agent.terminate();
    assert!(agent.child.try_wait().ok().flatten().is_some_and(|st| st.success()), "agent exit");
    assert!(agent.log().contains("eBPF probes detached"), "log: {}", agent.log());
    // The agent's own programs (other tests may load the same ones meanwhile).
    assert_eq!(vramhook_ebpf::probe::still_loaded(&held), 0, "probes left after SIGTERM");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(w.0.wait().expect("wait").success(), "the traced process ran on after the probes went");
}

#[test]
fn a_process_with_a_ring_is_counted_once() {
    let test = "agent_ebpf::a_process_with_a_ring_is_counted_once";
    let Some(_serial) = ebpf_turn(test) else { return };
    let rings = ring_dir("ebpf-ring");
    let go = rings.path().join("go-file");
    std::fs::write(&go, b"").expect("go file");
    // The sim's libcuda probed from the start, so the workload's first call is seen both ways.
    let wl = workload("wait_alloc");
    let libcuda = wl.parent().and_then(|p| p.parent()).expect("build dir").join("libcuda.so.1");
    let mut agent = Agent::start(
        &vramhook_bin(),
        &[
            "--ring-dir",
            rings.path().to_str().expect("utf8"),
            "--no-recover",
            "--snapshot-ms",
            "50",
            "--ebpf",
            "--ebpf-libcuda",
            libcuda.to_str().expect("utf8"),
        ],
        &[],
    );
    let mut w = Reap(spawn_traced(
        &workload("wait_alloc"),
        &["--before", "2", "--after", "4", "--hold", "--go-file", go.to_str().expect("utf8")],
        rings.path(),
        &[],
    ));
    let pid = w.0.id();
    let mut out = BufReader::new(w.0.stdout.take().expect("stdout"));
    let after = line_starting(&mut out, "after");
    // Everything through the ring: 1 + 2 MiB before the go, plus what the workload keeps.
    let live = number_after(&after, "live=") + (3 << 20);
    let s = agent.wait_state(Duration::from_secs(10), "the ring's numbers", |s| {
        process(s, pid).is_some_and(|p| p["live_bytes"].as_u64() == Some(live))
    });
    let p = process(&s, pid).expect("process");
    assert!(p["traced_since_ns"].is_null(), "a ring-traced process has no attach gap: {p}");
    // Give the probes' copies time to arrive, then check nothing was added twice.
    std::thread::sleep(Duration::from_millis(500));
    let s = agent.state();
    assert_eq!(process(&s, pid).expect("process")["live_bytes"].as_u64(), Some(live), "counted twice?");
    assert!(s["agent"]["ebpf_ring_won"].as_u64().unwrap_or(0) > 0, "ring_won: {}", s["agent"]);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = w.0.wait();
    agent.terminate();
}

#[test]
fn without_privileges_one_line_names_the_capabilities() {
    let test = "agent_ebpf::without_privileges_one_line_names_the_capabilities";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        not_run(test, "needs root (to drop to an unprivileged uid)");
        return;
    }
    let dir = tempfile::Builder::new().prefix("vramhook-ebpf-nopriv-").tempdir_in("/tmp").expect("dir");
    let ring = dir.path().join("rings");
    // SAFETY: chown/chmod of our own temporary directory.
    unsafe {
        let c = std::ffi::CString::new(dir.path().to_str().expect("utf8")).expect("path");
        libc::chmod(c.as_ptr(), 0o1777);
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(vramhook_bin())
        .args(["agent", "--ebpf", "--no-http", "--no-recover", "--ring-dir"])
        .arg(&ring)
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "agent ran without privileges: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("eBPF")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("CAP_BPF") && lines[0].contains("CAP_PERFMON"), "{err}");
}
