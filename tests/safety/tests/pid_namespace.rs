//! A traced process in its own pid namespace (a container's shape: `unshare --pid --fork
//! --mount-proc`) calls itself pid 1 and names its ring so. The agent, in the host's
//! namespace, must show it under the pid the host knows it by, with its real parent and
//! owner, and close it when that process ends; never as pid 1 (the host's init), and never
//! refuse it for "naming" a process it is not.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vramhook_safety_tests::ring_kit::{process, Agent};
use vramhook_safety_tests::{interposer, not_run, require_root, sim_dir, workload};

/// The children of `pid` (from /proc), waited for up to `timeout`.
fn first_child(pid: u32, timeout: Duration) -> Option<u32> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(child) = children.split_whitespace().next().and_then(|c| c.parse().ok()) {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

#[test]
fn a_process_in_its_own_pid_namespace_is_shown_under_the_hosts_pid() {
    const TEST: &str = "a_process_in_its_own_pid_namespace_is_shown_under_the_hosts_pid";
    if !require_root(TEST) {
        return;
    }
    let probe = Command::new("unshare").args(["--pid", "--fork", "--mount-proc", "true"]).status();
    if !probe.is_ok_and(|s| s.success()) {
        not_run(TEST, "`unshare --pid --fork --mount-proc` does not work here (no unshare, or no CAP_SYS_ADMIN)");
        return;
    }
    let base = if std::path::Path::new("/dev/shm").is_dir() { "/dev/shm".into() } else { std::env::temp_dir() };
    let rings = tempfile::Builder::new().prefix("vramhook-pidns-").tempdir_in(base).expect("ring dir");
    let mut agent = Agent::start(rings.path(), &[]);

    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(workload("leak"))
        .args(["--n", "10", "--hold", "3"])
        .env("LD_LIBRARY_PATH", sim_dir())
        .env("LD_PRELOAD", interposer())
        .env("VRAMHOOK_DIR", rings.path())
        .env_remove("VRAMHOOK_RUN_ID")
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare");
    let host_pid = first_child(unshare.id(), Duration::from_secs(10)).expect("the namespaced process");
    let mut live_line = String::new();
    BufReader::new(unshare.stdout.take().expect("stdout")).read_line(&mut live_line).expect("its output");
    let live: u64 = live_line.trim().strip_prefix("live=").and_then(|v| v.parse().ok()).expect("live=N");

    let s = agent.wait_state(Duration::from_secs(60), "the namespaced process, under its host pid", |s| {
        process(s, host_pid).is_some_and(|p| p["live_bytes"] == live)
    });
    let p = process(&s, host_pid).expect("process");
    assert_eq!(p["ppid"], unshare.id(), "its parent as the host sees it: {p}");
    assert_eq!(p["alive"], true, "{p}");
    assert!(process(&s, 1).is_none(), "nothing shown as pid 1 (the host's init): {}", s["snapshot"]["processes"]);
    assert_eq!(s["agent"]["rings_refused"], 0, "{}", agent.log());

    assert!(unshare.wait().expect("unshare").success());
    let s = agent.wait_state(Duration::from_secs(60), "the process closed when it ends", |s| {
        process(s, host_pid).is_some_and(|p| p["alive"] == false)
    });
    let p = process(&s, host_pid).expect("process");
    assert_eq!(p["dropped_events"], 0, "{p}");
}
