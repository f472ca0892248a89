//! Never silently untraced: a ring larger than a default agent reads (`VRAMHOOK_RING_SLOTS`
//! takes up to 2^24 slots, a default agent reads 64 MiB of them) is refused visibly: the
//! process says so once on stderr when it makes the ring, and the agent in its log, its
//! state (`top`) and `/metrics`, each with the setting that reads it; that setting does.
//! `vramhook run` reads such rings by itself.

#[allow(unused_imports)]
mod agent_support;

use agent_support::*;
use serde_json::Value;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

/// 2^21 slots: 128 MiB of slots, twice what a default agent reads.
const SLOTS: &str = "2097152";
const WARNING: &str = "more than an agent reads by default (64 MiB)";

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// A leak workload with a 2^21-slot ring into `rings`, held alive `hold` seconds.
fn big_ring_workload(rings: &std::path::Path, hold: &str) -> std::process::Child {
    spawn_traced(&workload("leak"), &["--n", "4", "--hold", hold], rings, &[("VRAMHOOK_RING_SLOTS", SLOTS)])
}

fn stderr_of(child: &mut std::process::Child) -> String {
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    err
}

#[test]
fn a_ring_too_large_for_a_default_agent_is_refused_visibly() {
    let (rings, agent) = Agent::on_new_rings("toolarge", &[]);
    let mut leak = big_ring_workload(rings.path(), "30");
    let pid = leak.id();
    let state = agent.wait_state(Duration::from_secs(30), "the ring refused for its size", |s| {
        s["agent"]["rings_too_large"].as_array().is_some_and(|a| !a.is_empty())
    });
    let refused = &state["agent"]["rings_too_large"][0];
    assert_eq!(refused["uid"], euid(), "{refused}");
    assert_eq!(refused["rings"], 1, "{refused}");
    assert_eq!(refused["max_ring_mib"], 128, "the setting that reads it: {refused}");
    assert!(process(&state, pid).is_none(), "the process is not traced (and says so): {state}");

    // The agent's log: one line naming the ring and the setting.
    let log = agent.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("refusing ring")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(lines[0].contains(&format!("{pid}-")) && lines[0].contains("--max-ring-mib 128 takes it"), "{log}");

    // /metrics, per owner.
    let metrics = agent.get("/metrics");
    let owner = format!("{{process_user_id=\"{}\"}}", euid());
    assert_eq!(prom_value(&metrics, &format!("vramhook_agent_rings_too_large_total{owner}")), Some(1.0), "{metrics}");
    assert_eq!(prom_value(&metrics, &format!("vramhook_agent_rings_too_large_max_ring_mib{owner}")), Some(128.0));

    // `top`, from the agent.
    let frame = agent.top_once();
    assert!(
        frame.contains(&format!("NOT TRACED: 1 ring(s) of uid {} larger than the reader takes", euid()))
            && frame.contains("--max-ring-mib 128"),
        "{frame}"
    );

    // The process itself said so once, at ring creation.
    let _ = leak.kill();
    let _ = leak.wait();
    let err = stderr_of(&mut leak);
    assert_eq!(err.matches(WARNING).count(), 1, "one line: {err:?}");
    assert!(err.contains("start the agent with --max-ring-mib 128"), "{err:?}");
}

#[test]
fn the_setting_named_reads_the_ring() {
    let (rings, agent) = Agent::on_new_rings("toolarge-read", &["--max-ring-mib", "128"]);
    let mut leak = big_ring_workload(rings.path(), "30");
    let pid = leak.id();
    let state = agent.wait_state(Duration::from_secs(30), "the process traced", |s| {
        process(s, pid).is_some_and(|p| p["live_bytes"].as_u64().is_some_and(|b| b > 0))
    });
    assert!(state["agent"]["rings_too_large"].as_array().is_none_or(|a| a.is_empty()), "{}", state["agent"]);
    let _ = leak.kill();
    let _ = leak.wait();
}

/// A process that never touches CUDA makes no ring and says nothing, whatever its ring size.
#[test]
fn a_process_without_cuda_stays_silent() {
    let rings = ring_dir("toolarge-silent");
    let out = Command::new("/bin/sh")
        .args(["-c", "echo hello"])
        .env("LD_PRELOAD", interposer())
        .env("VRAMHOOK_DIR", rings.path())
        .env("VRAMHOOK_RING_SLOTS", SLOTS)
        .output()
        .expect("sh");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "silent");
    assert_eq!(std::fs::read_dir(rings.path()).map(|d| d.count()).unwrap_or(0), 0, "no ring");
}

/// `vramhook run` raises its own reader's limit: asked with --ring-slots, or inherited
/// through VRAMHOOK_RING_SLOTS. Its processes say nothing (their reader takes the ring).
#[test]
fn vramhook_run_reads_its_large_rings() {
    for (flag, env) in [(true, false), (false, true)] {
        let dir = tempfile::tempdir().expect("dir");
        let summary = dir.path().join("summary.json");
        let mut cmd = Command::new(vramhook_bin());
        cmd.args(["run", "--quiet", "--ring-dir"]).arg(dir.path().join("rings")).arg("--summary-json").arg(&summary);
        if flag {
            cmd.args(["--ring-slots", SLOTS]);
        }
        if env {
            cmd.env("VRAMHOOK_RING_SLOTS", SLOTS);
        }
        let out = cmd
            .arg("--")
            .arg(workload("leak"))
            .args(["--n", "4"])
            .env("VRAMHOOK_LIB", interposer())
            .env_remove("LD_PRELOAD")
            .stdout(Stdio::null())
            .output()
            .expect("vramhook run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(!err.contains(WARNING) && !err.contains("ignoring ring"), "flag {flag}, env {env}: {err}");
        let summary: Value = serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("JSON");
        let procs = summary["processes"].as_array().expect("processes");
        assert_eq!(procs.len(), 1, "flag {flag}, env {env}: the process traced: {summary}");
    }
}
