//! `vramhook run` operations: what it records about how its processes ended.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;

/// A run's `process_end` had `exit_status: null` once in 13 runs while `run` reported 0:
/// the ring was closed (the process marked it exited, or was a zombie) before `run` had
/// reaped it. An end of our own child now waits for its status. 40 runs would have caught
/// a 1-in-13 race with probability 1 - (12/13)^40 = 96%; the check itself has no timing.
#[test]
fn every_process_end_of_a_run_carries_the_exit_status_run_reported() {
    let bin = vramhook_bin();
    let lib = interposer();
    let dir = tempfile::tempdir().expect("dir");
    let rings = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().expect("ring dir"));
    for i in 0..40 {
        let cap = dir.path().join(format!("{i}.vhc"));
        let out = Command::new(&bin)
            .args(["run", "--quiet", "--ring-dir"])
            .arg(rings.path())
            .arg("--record")
            .arg(&cap)
            .arg("--")
            .arg(workload("leak"))
            .args(["--n", "4", "--exit", "3"])
            .env("VRAMHOOK_LIB", &lib)
            .output()
            .expect("vramhook run");
        assert_eq!(out.status.code(), Some(3), "run {i}: {}", String::from_utf8_lossy(&out.stderr));
        let dump = Command::new(&bin).args(["dump", "--frames"]).arg(&cap).output().expect("dump");
        assert!(dump.status.success(), "dump {i}");
        let ends: Vec<Value> = String::from_utf8_lossy(&dump.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["frame"] == "process_end")
            .collect();
        assert_eq!(ends.len(), 1, "run {i}: one process, one end: {ends:?}");
        assert_eq!(ends[0]["exit_status"], 3, "run {i}: the capture's end carries the status run reported: {ends:?}");
    }
}
