//! Shared helpers for the end-to-end tests: the simulated CUDA driver, the built
//! interposer, running workloads traced, and reading captures and ground truth.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use vramhook_testkit::{interposer, vramhook_bin, vramhook_stdout, workload};

pub struct Traced {
    pub dir: tempfile::TempDir,
    pub output: Output,
    pub events: Vec<Value>,
    pub frames: Vec<Value>,
    pub summary: Value,
    /// Ground truth per pid: the simulated driver's log lines (calls and its summary).
    pub truth: BTreeMap<u32, Vec<Value>>,
}

impl Traced {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
    pub fn capture(&self) -> PathBuf {
        self.dir.path().join("capture.vhc")
    }
    pub fn checksum(&self) -> String {
        checksum_line(&self.stdout())
    }
    pub fn process(&self, pid: u32) -> &Value {
        self.summary["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| p["pid"] == pid)
            .expect("process in summary")
    }
}

pub fn checksum_line(stdout: &str) -> String {
    stdout.lines().rev().find(|l| l.starts_with("checksum=")).unwrap_or("").to_string()
}

/// Runs `vramhook run --record` on a workload of the simulated driver, with its ground
/// truth log enabled, and reads everything back.
pub fn trace_workload(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Traced {
    let dir = tempfile::tempdir().expect("tempdir");
    let logs = dir.path().join("truth");
    std::fs::create_dir(&logs).expect("truth dir");
    let capture = dir.path().join("capture.vhc");
    let summary = dir.path().join("summary.json");
    let mut cmd = Command::new(vramhook_bin());
    cmd.arg("run")
        .arg("--record")
        .arg(&capture)
        .arg("--summary-json")
        .arg(&summary)
        .arg("--ring-dir")
        .arg(dir.path().join("rings"))
        .arg("--")
        .arg(workload(name))
        .args(args)
        .env("VRAMHOOK_LIB", interposer())
        .env("VRAMHOOK_SIM_LOG_DIR", &logs)
        .env_remove("LD_PRELOAD");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let output = cmd.output().expect("run vramhook");
    let events = dump(&capture, false);
    let frames = dump(&capture, true).into_iter().filter(|v| v.get("frame").is_some()).collect();
    let summary: Value = serde_json::from_slice(&std::fs::read(&summary).unwrap_or_default()).unwrap_or(Value::Null);
    let truth = read_truth(&logs);
    Traced { dir, output, events, frames, summary, truth }
}

/// `vramhook dump` of a capture, parsed.
pub fn dump(capture: &Path, frames: bool) -> Vec<Value> {
    let mut cmd = Command::new(vramhook_bin());
    cmd.arg("dump").arg(capture);
    if frames {
        cmd.arg("--frames");
    }
    vramhook_stdout(&mut cmd).lines().map(|l| serde_json::from_str(l).expect("dump line is JSON")).collect()
}

pub fn read_truth(dir: &Path) -> BTreeMap<u32, Vec<Value>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("truth dir") {
        let path = entry.expect("entry").path();
        let pid: u32 = path.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse().ok()).expect("pid.jsonl");
        let text = std::fs::read_to_string(&path).expect("truth file");
        out.insert(pid, text.lines().map(|l| serde_json::from_str(l).expect("truth line is JSON")).collect());
    }
    out
}

/// A call reduced to what both sides know: (function, result, key a, key b).
pub type Call = (String, u64, u64, u64);

/// The calls that allocate on the current device (an IPC open maps another process's memory).
pub const DEVICE_ALLOCS: &[&str] = &[
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocFromPoolAsync_ptsz",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
];
const FREES: &[&str] = &[
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuArrayDestroy",
    "cuMipmappedArrayDestroy",
    "cuIpcCloseMemHandle",
];

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("field {k} missing in {v}"))
}

/// Reduces a call to (function, result, key a, key b), reading fields through `get`.
/// `pool` names the field that holds a pool handle on that side.
fn reduce(f: &str, get: impl Fn(&str) -> u64, pool: &str) -> Option<Call> {
    let key = match f {
        f if DEVICE_ALLOCS.contains(&f) || f == "cuIpcOpenMemHandle_v2" => (get("addr"), get("size")),
        f if FREES.contains(&f) => (get("addr"), 0),
        "cuMemCreate" => (get("size"), get("aux")),
        "cuMemRelease" | "cuMemImportFromShareableHandle" => (get("aux"), 0),
        "cuMemMap" | "cuMemUnmap" | "cuMemAddressReserve" | "cuMemAddressFree" => (get("addr"), get("size")),
        "cuMemPoolTrimTo" => (get("size"), get(pool)),
        "cuMemPoolCreate" | "cuMemPoolDestroy" => (get(pool), 0),
        // The driver keeps streams in `aux`, the record in `stream` (the same field as pools).
        "cuStreamCreate" | "cuStreamCreateWithPriority" | "cuStreamDestroy" | "cuStreamDestroy_v2" => (get(pool), 0),
        _ => return None,
    };
    Some((f.to_string(), get("result"), key.0, key.1))
}

/// Normalises a ground-truth line (the driver keeps pools in `aux`); `None` for lines
/// that are not comparable calls.
pub fn truth_call(v: &Value) -> Option<(u64, Call)> {
    let call = reduce(v["fn"].as_str()?, |k| u(v, k), "aux")?;
    Some((u(v, "tid"), call))
}

/// Normalises a captured event the same way (the record keeps pools in `stream`).
pub fn event_call(v: &Value) -> Option<(u64, Call)> {
    if v["kind"] == "mem_info" {
        return None;
    }
    let call = reduce(v["api"].as_str()?, |k| u(v, k), "stream")?;
    Some((u(v, "tid"), call))
}

/// Per pid and thread, the ordered calls each side saw.
pub type PerThread = BTreeMap<(u32, u64), Vec<Call>>;

pub fn truth_by_thread(t: &Traced) -> PerThread {
    let mut out = PerThread::new();
    for (pid, lines) in &t.truth {
        for line in lines {
            if let Some((tid, call)) = truth_call(line) {
                out.entry((*pid, tid)).or_default().push(call);
            }
        }
    }
    out
}

pub fn captured_by_thread(t: &Traced) -> PerThread {
    let mut out = PerThread::new();
    for e in &t.events {
        if let Some((tid, call)) = event_call(e) {
            out.entry((u(e, "pid") as u32, tid)).or_default().push(call);
        }
    }
    out
}

/// Live bytes the simulated driver says each process still held at exit, per device.
pub fn truth_live_by_device(t: &Traced) -> BTreeMap<u32, BTreeMap<i64, u64>> {
    let mut out = BTreeMap::new();
    for (pid, lines) in &t.truth {
        if let Some(summary) = lines.iter().rev().find(|l| l["summary"] == true) {
            let per: BTreeMap<i64, u64> = summary["devices"]
                .as_array()
                .expect("devices")
                .iter()
                .map(|d| (d["ordinal"].as_i64().expect("ordinal"), u(d, "live_bytes")))
                .filter(|(_, live)| *live > 0)
                .collect();
            out.insert(*pid, per);
        }
    }
    out
}

/// Live bytes the simulated driver says each process still held at exit.
pub fn truth_live_at_exit(t: &Traced) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for (pid, lines) in &t.truth {
        if let Some(summary) = lines.iter().rev().find(|l| l["summary"] == true) {
            let live = summary["devices"].as_array().expect("devices").iter().map(|d| u(d, "live_bytes")).sum();
            out.insert(*pid, live);
        }
    }
    out
}

/// Runs a workload untraced (same environment otherwise).
pub fn run_untraced(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(workload(name));
    cmd.args(args).env_remove("LD_PRELOAD");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run workload")
}
