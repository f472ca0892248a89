//! `vramhook agent` end to end on the simulated driver: the HTTP endpoints carry the
//! model's numbers, hostile rings are refused and counted,
//! and an agent SIGKILLed in the middle of a 1-million-event workload loses nothing
//! uncounted and delivers nothing twice.

mod agent_support;

use agent_support::*;
use serde_json::Value;
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;
use vramhook_protocol::capture::{CaptureReader, Frame};
use vramhook_protocol::record::{Event, EventKind};

#[test]
fn endpoints_carry_the_models_numbers() {
    let (rings, agent) = Agent::on_new_rings("http", &[]);
    let mut child = spawn_traced(&workload("leak"), &["--n", "4", "--hold", "4"], rings.path(), &[]);
    let pid = child.id();
    // leak --n 4 leaves 6,295,456 bytes (the simulated driver's ground truth).
    let state = agent.wait_state(Duration::from_secs(20), "the leak to be drained", |s| {
        process(s, pid).is_some_and(|p| p["live_bytes"] == 6_295_456u64)
    });
    let p = process(&state, pid).expect("process");
    let metrics = agent.get("/metrics");
    // The short label is the executable's name; the command line is on the info series only.
    let exe = p["exe"].as_str().unwrap_or("").rsplit('/').next().unwrap_or("").to_string();
    assert!(!exe.is_empty(), "{p}");
    let series = |name: &str, extra: &str| {
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{"))
                    && l.contains(&format!("process_pid=\"{pid}\",process_executable_name=\"{exe}\""))
                    && l.contains(extra)
            })
            .unwrap_or_else(|| panic!("no {name} series for pid {pid} in\n{metrics}"));
        line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("value")
    };
    assert_eq!(
        series("vramhook_process_memory_live_by_kind_bytes", "kind=\"plain\""),
        p["live_by_class"]["plain"].as_f64().unwrap()
    );
    assert_eq!(series("vramhook_process_memory_live_bytes", "device=\"0\""), 6_295_456.0);
    assert_eq!(series("vramhook_process_info", "process_command_line=\""), 1.0);
    assert_eq!(series("vramhook_process_memory_peak_bytes", ""), p["peak_bytes"].as_f64().unwrap());
    assert_eq!(series("vramhook_process_allocations_total", ""), p["allocations"].as_f64().unwrap());
    assert_eq!(series("vramhook_process_allocations_live", ""), p["live_allocations"].as_f64().unwrap());
    let dev = &state["snapshot"]["devices"][0];
    assert_eq!(prom_value(&metrics, "vramhook_device_memory_traced_bytes{device=\"0\"}"), dev["traced_bytes"].as_f64());
    assert_eq!(prom_value(&metrics, "vramhook_device_memory_total_bytes{device=\"0\"}"), dev["total"].as_f64());
    assert!(!metrics.contains("addr"), "no per-address labels");

    let _ = child.wait();
    // The exit is noticed, the ring removed, the process closed in the model.
    agent.wait_state(Duration::from_secs(20), "the ring to close", |s| {
        s["agent"]["rings_open"] == 0
            && s["agent"]["rings_closed"] == 1
            && process(s, pid).is_some_and(|p| p["alive"] == false)
    });
    assert!(std::fs::read_dir(rings.path()).expect("dir").next().is_none(), "ring file removed");
    let after = agent.get("/metrics");
    assert!(!after.contains(&format!("pid=\"{pid}\"")), "an exited process's series end with it");
}

fn header(capacity: u64, pid: u32, uid: u32, start: u64) -> Vec<u8> {
    let mut h = vec![0u8; 4096];
    h[0..8].copy_from_slice(b"VRHKRING");
    h[8..12].copy_from_slice(&1u32.to_le_bytes());
    h[12..16].copy_from_slice(&4096u32.to_le_bytes());
    h[16..24].copy_from_slice(&capacity.to_le_bytes());
    h[24..28].copy_from_slice(&pid.to_le_bytes());
    h[28..32].copy_from_slice(&uid.to_le_bytes());
    h[32..40].copy_from_slice(&start.to_le_bytes());
    h
}

fn write_ring(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write ring");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

#[test]
fn hostile_rings_are_refused_and_counted_never_a_crash() {
    let rings = ring_dir("hostile");
    let dir = rings.path();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    // 1. An absurd capacity (2^40 slots).
    write_ring(dir, "99991-1-0.ring", &header(1 << 40, 99991, euid, 1));
    // 2. A file too small to hold a header.
    write_ring(dir, "99993-1-0.ring", b"VRHKRING");
    // 3. A wrong owner: the header claims one uid, the file belongs to another.
    let wrong = write_ring(dir, "99994-1-0.ring", &{
        let mut b = header(16, 99994, euid, 1);
        b.resize(4096 + 16 * 64, 0);
        b
    });
    if euid == 0 {
        std::os::unix::fs::chown(&wrong, Some(4242), Some(4242)).expect("chown");
    } else {
        let mut b = header(16, 99994, euid + 1, 1);
        b.resize(4096 + 16 * 64, 0);
        std::fs::write(&wrong, b).expect("rewrite");
    }
    // 4. A valid header over garbage records, from a writer that is gone: the reader
    //    must count every slot as malformed (or hand the model nonsense it rejects).
    let mut garbage = header(16, 99992, euid, 1);
    garbage[256..264].copy_from_slice(&16u64.to_le_bytes()); // write_pos: 16 slots claimed
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..16 * 64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        garbage.push((x >> (i % 8)) as u8);
    }
    // Two slots stamped as published (lap 0 → stamp 1) with random contents.
    for slot in [3usize, 9] {
        let off = 4096 + slot * 64;
        garbage[off..off + 8].copy_from_slice(&1u64.to_le_bytes());
    }
    write_ring(dir, "99992-1-0.ring", &garbage);
    // 5. A forged ring naming a live process of another user (pid 1, root's): the file's
    //    owner and its header agree, but the process it names does not run as that uid.
    let init_stat = std::fs::read_to_string("/proc/1/stat").expect("/proc/1/stat");
    let init_start: u64 =
        init_stat[init_stat.rfind(')').expect(")") + 2..].split(' ').nth(19).expect("field").parse().expect("start");
    let forger = if euid == 0 { 4243 } else { euid };
    let forged_name = format!("1-{init_start}-0.ring");
    let forged = write_ring(dir, &forged_name, &{
        let mut b = header(16, 1, forger, init_start);
        b.resize(4096 + 16 * 64, 0);
        b
    });
    if euid == 0 {
        std::os::unix::fs::chown(&forged, Some(forger), Some(forger)).expect("chown");
    }

    let bin = vramhook_bin();
    let agent = Agent::start(&bin, &["--ring-dir", dir.to_str().unwrap()], &[]);
    let s = agent.wait_state(Duration::from_secs(20), "hostile rings to be judged", |s| {
        s["agent"]["rings_refused"] == 4 && s["agent"]["rings_closed"] == 1
    });
    assert!(s["agent"]["records_malformed"].as_u64().unwrap_or(0) >= 1, "garbage counted: {}", s["agent"]);
    let log = agent.log();
    assert!(
        log.contains("99991-1-0.ring")
            && log.contains("99993-1-0.ring")
            && log.contains("99994-1-0.ring")
            && log.contains(&forged_name),
        "each refusal reported:\n{log}"
    );
    let metrics = agent.get("/metrics");
    assert_eq!(prom_value(&metrics, "vramhook_agent_rings_refused_total"), Some(4.0));

    // The agent still traces a real process afterwards.
    let mut child = spawn_traced(&workload("leak"), &["--n", "4"], dir, &[]);
    let pid = child.id();
    let _ = child.wait();
    agent.wait_state(Duration::from_secs(20), "the workload after the hostile rings", |s| {
        s["agent"]["rings_closed"] == 2 && process(s, pid).is_some_and(|p| p["peak_bytes"].as_u64().unwrap_or(0) > 0)
    });
}

/// Hands every event of `pid` in the capture files of `dir` (in file order) to `f`.
fn for_each_event(dir: &Path, pid: u32, mut f: impl FnMut(&Event)) {
    let mut files: Vec<_> =
        std::fs::read_dir(dir).expect("capture dir").filter_map(|e| e.ok()).map(|e| e.path()).collect();
    files.sort();
    for file in files {
        let mut r =
            CaptureReader::new(std::io::BufReader::new(std::fs::File::open(&file).expect("open"))).expect("capture");
        while let Ok(Some(frame)) = r.next_frame() {
            if let Frame::Events(records) = frame {
                for raw in records {
                    let e = Event::from_raw(raw);
                    if e.pid == pid {
                        f(&e);
                    }
                }
            }
        }
    }
}

/// A driver call (not a marker the interposer or reader added).
fn is_call(e: &Event) -> bool {
    !matches!(e.kind(), Some(EventKind::Dropped | EventKind::ProcessStart | EventKind::ProcessExit))
}

fn api_name(e: &Event) -> String {
    e.api().map(|a| a.name().to_string()).unwrap_or_default()
}

/// Calls per API name in the capture files (for a diagnosis when the totals differ).
fn captured_by_api(dir: &Path, pid: u32) -> std::collections::BTreeMap<String, i64> {
    let mut m = std::collections::BTreeMap::new();
    for_each_event(dir, pid, |e| {
        if is_call(e) {
            *m.entry(api_name(e)).or_insert(0) += 1;
        }
    });
    m
}

/// Every event of a traced process in the capture files: (seqs delivered, dropped count,
/// calls).
/// (every event's seq, events counted as dropped, the program's calls, the interposer's own
/// samples and framework records).
fn captured(dir: &Path, pid: u32) -> (Vec<u64>, u64, u64, u64) {
    let mut seqs = Vec::new();
    let mut dropped = 0;
    let mut calls = 0;
    let mut own = 0;
    for_each_event(dir, pid, |e| match e.kind() {
        Some(EventKind::Dropped) => dropped += e.dropped_count(),
        Some(EventKind::ProcessStart | EventKind::ProcessExit) => seqs.push(e.seq),
        // The interposer's own records: no call of the program's.
        Some(EventKind::PoolSample | EventKind::Frameworks) => {
            seqs.push(e.seq);
            own += 1;
        }
        _ => {
            seqs.push(e.seq);
            calls += 1;
        }
    });
    (seqs, dropped, calls, own)
}

#[test]
fn sigkill_and_restart_mid_million_events_loses_nothing() {
    let rings = ring_dir("restart");
    let captures = tempfile::tempdir().expect("capture dir");
    let truth = tempfile::tempdir().expect("truth dir");
    let bin = vramhook_bin();
    let args = [
        "--ring-dir",
        rings.path().to_str().unwrap(),
        "--capture-dir",
        captures.path().to_str().unwrap(),
        "--checkpoint-interval",
        "0.2",
    ];
    let mut first = Agent::start(&bin, &args, &[]);
    let mut child = spawn_traced(
        &workload("threads16"),
        &["--threads", "8", "--iters", "62500"],
        rings.path(),
        &[
            ("VRAMHOOK_RING_SLOTS", "1048576"),
            ("VRAMHOOK_SIM_LOG_DIR", truth.path().to_str().unwrap()),
            // No periodic device samples: a sample's pool record (the default pool's reserve,
            // which cudaMallocAsync grows) is no call the driver logs, and one written while
            // the killed agent left the ring full is dropped, counted in `dropped` with no
            // counterpart in the truth: the sum came out one more than the calls, one per
            // sample dropped (1 run in 4 under load, 3 in 4 with VRAMHOOK_MEMINFO_MS=2).
            // The drops could have held any kind, so only without samples is the sum exact.
            ("VRAMHOOK_MEMINFO_MS", "18446744073709551615"),
        ],
    );
    let pid = child.id();
    first.wait_state(Duration::from_secs(60), "some events ingested", |s| {
        s["agent"]["events_ingested"].as_u64().unwrap_or(0) > 150_000
    });
    first.kill(); // SIGKILL, mid-stream
    std::thread::sleep(Duration::from_millis(300));
    let second = Agent::start(&bin, &args, &[]);
    assert!(second.log().contains("recovered the model"), "restart recovers from the capture:\n{}", second.log());
    let out = child.wait().expect("workload");
    assert!(out.success(), "workload failed");
    let state = second.wait_state(Duration::from_secs(120), "the workload's ring to be drained and closed", |s| {
        s["agent"]["rings_open"] == 0 && s["agent"]["rings_closed"].as_u64().unwrap_or(0) >= 1
    });
    let mut second = second;
    second.terminate(); // SIGTERM: the capture is flushed and sealed
    eprintln!("SECOND LOG:\n{}", second.log());

    // The simulated driver's log of every call: one line each, `{"fn":"NAME",…}`.
    let truth_lines = |prefix: &str| -> u64 {
        let files = std::fs::read_dir(truth.path()).expect("truth").filter_map(|e| e.ok());
        files
            .map(|e| {
                let text = std::fs::read_to_string(e.path()).expect("read truth");
                text.lines().filter(|l| l.starts_with(prefix)).count() as u64
            })
            .sum()
    };
    let truth_calls = truth_lines("{\"fn\"");
    assert!(truth_calls >= 1_000_000, "a million-event workload ({truth_calls} calls)");
    // Every device sample (periodic, or after an out-of-memory failure) asks the driver
    // for `cuMemGetInfo_v2` right after its pool records: none logged, none written.
    let samples_taken = truth_lines("{\"fn\":\"cuMemGetInfo_v2\"");
    assert_eq!(samples_taken, 0, "no device samples (their pool records, dropped, would have no count here)");
    let (seqs, dropped, calls, own) = captured(captures.path(), pid);
    if calls + dropped != truth_calls && calls + dropped != truth_calls + 1 {
        let mut diff = captured_by_api(captures.path(), pid);
        for e in std::fs::read_dir(truth.path()).expect("truth").filter_map(|e| e.ok()) {
            for l in std::fs::read_to_string(e.path()).expect("truth").lines() {
                if let Some(name) = l.strip_prefix("{\"fn\":\"").and_then(|r| r.split('"').next()) {
                    *diff.entry(name.to_string()).or_insert(0) -= 1;
                }
            }
        }
        diff.retain(|_, v| *v != 0);
        eprintln!("captured minus truth, by API: {diff:?}");
    }
    let unique: HashSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "an event was delivered twice");
    // A call a thread made while another thread was creating the ring is counted as
    // dropped by the interposer itself (moved into the ring's drop counter once the ring
    // exists): it is in `dropped` already, and must not be counted again.
    // Ring slots hold the calls, the process's start and exit records and the interposer's
    // own samples (pool reserves, which the driver's log does not list): a dropped slot may
    // have held any kind, so `own` (samples delivered) balances the sum only because no
    // sample is taken here (see VRAMHOOK_MEMINFO_MS above): a dropped one would count in
    // `dropped` and nowhere on the right.
    let records = seqs.len() as u64 - calls;
    assert_eq!(
        calls + records + dropped,
        truth_calls + 2 + own,
        "every call and record delivered once or counted as dropped (delivered {calls} calls and {records} records of which {own} samples, dropped {dropped}); agent {}",
        state["agent"]
    );
    // Nothing the killed agent had read was lost: it left in the ring what its capture had
    // not yet flushed, and the restarted agent skipped what it had.
    assert_eq!(state["agent"]["restart_lost"], 0, "agent {}", state["agent"]);
    // The restarted model says the same: its process counts those drops.
    let p = process(&state, pid).expect("process in the model");
    assert_eq!(p["dropped_events"].as_u64(), Some(dropped), "model's dropped count = capture's");
    eprintln!(
        "restart: {calls} delivered, {dropped} dropped (writer {}), {} duplicates skipped, of {truth_calls}",
        state["agent"]["writer_dropped"], state["agent"]["duplicates_skipped"]
    );
}

#[test]
fn captures_rotate_by_size_each_starting_with_a_checkpoint() {
    let captures = tempfile::tempdir().expect("capture dir");
    let (rings, agent) = Agent::on_new_rings(
        "rotate",
        &["--capture-dir", captures.path().to_str().unwrap(), "--capture-max-mib", "1", "--capture-keep", "1"],
    );
    // A ring that holds all ~200,000 events (one lane of 262,144 slots), so that the bytes
    // captured, and the rotations, do not depend on how fast the agent drains: under a
    // loaded machine it drained 32,770 events, dropped the rest and rotated once.
    let mut child = spawn_traced(
        &workload("threads16"),
        &["--threads", "2", "--iters", "50000"],
        rings.path(),
        &[("VRAMHOOK_RING_SLOTS", "262144"), ("VRAMHOOK_RING_LANES", "1")],
    );
    let pid = child.id();
    let _ = child.wait();
    // How many files the drain spreads over depends on how far the capture thread lags
    // behind it; at least one rotation is certain once 12.8 MB are written to 1 MiB files
    // (the ingest loop rotates when the writer asks, idle or not).
    agent.wait_state(Duration::from_secs(120), "the workload drained and the capture rotated by size", |s| {
        s["agent"]["rings_closed"] == 1
            && process(s, pid).is_some_and(|p| p["alive"] == false)
            && s["agent"]["capture_files"].as_u64().unwrap_or(0) >= 2
    });
    // Stopped before the files are read: an agent that goes on rotating (and removing the
    // oldest) would race the reading below. SIGTERM, not SIGKILL: the capture thread writes
    // what it still holds, each rotation with its pruning, and seals the last file (killed
    // between starting a new file and removing the oldest, it left two).
    let mut agent = agent;
    agent.terminate();
    let files: Vec<_> = {
        let mut v: Vec<_> =
            std::fs::read_dir(captures.path()).expect("dir").filter_map(|e| e.ok()).map(|e| e.path()).collect();
        v.sort();
        v
    };
    assert_eq!(files.len(), 1, "only --capture-keep files are kept: {files:?}");
    // Every file, the one being written included, reads frame by frame and opens with a
    // model checkpoint that restores.
    for f in &files {
        let mut r =
            CaptureReader::new(std::io::BufReader::new(std::fs::File::open(f).expect("open"))).expect("capture header");
        match r.next_frame() {
            Ok(Some(Frame::Checkpoint(bytes))) => {
                vramhook_model::Model::restore(bytes).expect("checkpoint restores");
            }
            other => panic!("{} does not start with a checkpoint: {other:?}", f.display()),
        }
        let out = std::process::Command::new(vramhook_bin()).arg("dump").arg(f).output().expect("dump");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The file being written has no end frame yet: dump reads it all and says so.
        assert!(out.status.success() || stderr.contains("truncated"), "vramhook dump reads {}: {stderr}", f.display());
    }
}

#[test]
fn the_agent_leaves_a_vramhook_run_sessions_rings_to_it() {
    let (rings, agent) = Agent::on_new_rings("coexist", &[]);
    let out_dir = tempfile::tempdir().expect("dir");
    let summary = out_dir.path().join("summary.json");
    for _ in 0..5 {
        let out = std::process::Command::new(vramhook_bin())
            .args(["run", "--quiet", "--ring-dir", rings.path().to_str().unwrap(), "--summary-json"])
            .arg(&summary)
            .arg("--")
            .arg(workload("leak"))
            .args(["--n", "4"])
            .env("VRAMHOOK_LIB", interposer())
            .output()
            .expect("vramhook run");
        assert!(out.status.success(), "run failed: {}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
        assert_eq!(report["processes"][0]["final_live_bytes"], 6_295_456u64, "run traced its own child fully");
    }
    let s = agent.state();
    assert_eq!(s["agent"]["rings_opened"], 0, "the agent took none of the session's rings: {}", s["agent"]);
}

/// `vramhook run --hold SECS` of the leak workload into `rings`, started (not waited for).
fn spawn_run_session(rings: &Path, summary: &Path, hold: &str) -> std::process::Child {
    std::process::Command::new(vramhook_bin())
        .args(["run", "--quiet", "--ring-dir"])
        .arg(rings)
        .arg("--summary-json")
        .arg(summary)
        .arg("--")
        .arg(workload("leak"))
        .args(["--n", "4", "--hold", hold])
        .env("VRAMHOOK_LIB", interposer())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("vramhook run")
}

fn recorded_by_run(s: &Value) -> Vec<Value> {
    s["agent"]["recorded_by_run"].as_array().cloned().unwrap_or_default()
}

/// Issue #28: a process `vramhook run` records is not drained by the agent (the session is
/// its ring's one reader) but listed, as "recorded by vramhook run" with the flag that
/// drains it, in the state, `/metrics`, the log (once) and `top`, until the session ends.
#[test]
fn the_agent_lists_a_vramhook_run_sessions_processes_until_the_session_ends() {
    let (rings, agent) = Agent::on_new_rings("runlisted", &[]);
    let out_dir = tempfile::tempdir().expect("dir");
    let summary = out_dir.path().join("summary.json");
    let mut run = spawn_run_session(rings.path(), &summary, "4");
    let run_pid = run.id();
    let s = agent.wait_state(Duration::from_secs(20), "the run session's process to be listed", |s| {
        recorded_by_run(s).iter().any(|r| r["run_pid"] == run_pid)
    });
    let listed = recorded_by_run(&s);
    assert_eq!(listed.len(), 1, "{listed:?}");
    let r = &listed[0];
    let pid = r["pid"].as_u64().expect("pid") as u32;
    assert_ne!(pid, run_pid, "the session's child is listed, not the session");
    assert!(r["command"].as_str().is_some_and(|c| c.ends_with("leak --n 4 --hold 4")), "{r}");
    assert!(r["exe"].as_str().is_some_and(|e| e.ends_with("/leak")), "{r}");
    assert!(process(&s, pid).is_none(), "not in the model: {}", s["snapshot"]);
    assert_eq!(s["agent"]["rings_opened"], 0, "{}", s["agent"]);

    let metrics = agent.get("/metrics");
    let series: Vec<&str> = metrics.lines().filter(|l| l.starts_with("vramhook_process_recorded_by_run{")).collect();
    assert_eq!(series.len(), 1, "{metrics}");
    assert!(
        series[0].starts_with(&format!(
            "vramhook_process_recorded_by_run{{process_pid=\"{pid}\",process_executable_name=\"leak\",process_command_line=\""
        )) && series[0].ends_with("leak --n 4 --hold 4\"} 1"),
        "{}",
        series[0]
    );

    let expected = format!(
        "vramhook agent: pid {pid} (leak --n 4 --hold 4) is recorded by vramhook run (pid {run_pid}); start the \
         agent with --include-run-rings to watch it here"
    );
    let start = std::time::Instant::now();
    while !agent.log().contains(&expected) {
        assert!(start.elapsed() < Duration::from_secs(10), "no {expected:?} in the log:\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }

    let frame = agent.top_once();
    assert!(
        frame.contains(&format!(
            "pid {pid} (leak --n 4 --hold 4) is recorded by vramhook run (pid {run_pid}): not shown; start the agent \
             with --include-run-rings to watch it here"
        )),
        "{frame}"
    );

    let status = run.wait().expect("wait for the run");
    assert!(status.success(), "run failed: {status}");
    let report: Value = serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    assert_eq!(report["processes"][0]["final_live_bytes"], 6_295_456u64, "run traced its own child fully");
    // The session is over: the listing, its series, go with it.
    let s = agent
        .wait_state(Duration::from_secs(20), "the listing to end with the session", |s| recorded_by_run(s).is_empty());
    assert_eq!(s["agent"]["rings_opened"], 0, "{}", s["agent"]);
    let metrics = agent.get("/metrics");
    assert!(!metrics.lines().any(|l| l.starts_with("vramhook_process_recorded_by_run{")), "{metrics}");
    assert_eq!(agent.log().matches("is recorded by vramhook run").count(), 1, "once per ring:\n{}", agent.log());
}

/// With `--include-run-rings` the agent drains a session's rings as before (whichever of the
/// two readers opens a ring first gets its events) and lists nothing as recorded by run.
#[test]
fn with_include_run_rings_a_run_sessions_rings_are_drained_not_listed() {
    let (rings, agent) = Agent::on_new_rings("runincluded", &["--include-run-rings"]);
    let out_dir = tempfile::tempdir().expect("dir");
    let summary = out_dir.path().join("summary.json");
    let mut run = spawn_run_session(rings.path(), &summary, "2");
    while run.try_wait().expect("try_wait").is_none() {
        let s = agent.state();
        assert!(recorded_by_run(&s).is_empty(), "{}", s["agent"]);
        std::thread::sleep(Duration::from_millis(100));
    }
    let report: Value = serde_json::from_slice(&std::fs::read(&summary).expect("summary")).expect("json");
    let run_got = report["processes"][0]["final_live_bytes"] == 6_295_456u64;
    let s = agent.state();
    let agent_got = s["snapshot"]["processes"]
        .as_array()
        .is_some_and(|ps| ps.iter().any(|p| p["exe"].as_str().is_some_and(|e| e.ends_with("/leak"))));
    assert!(run_got || agent_got, "nobody drained the ring: run {report}, agent {}", s["agent"]);
    assert_eq!(agent_got, s["agent"]["rings_opened"] == 1, "{}", s["agent"]);
    let metrics = agent.get("/metrics");
    assert!(!metrics.lines().any(|l| l.starts_with("vramhook_process_recorded_by_run{")), "{metrics}");
    assert!(!agent.log().contains("recorded by vramhook run"), "{}", agent.log());
}

#[test]
fn exited_processes_are_forgotten_after_the_retention_so_memory_stays_bounded() {
    let (rings, agent) = Agent::on_new_rings("forget", &["--forget-exited-after", "0"]);
    let mut child = spawn_traced(&workload("leak"), &["--n", "4"], rings.path(), &[]);
    let pid = child.id();
    let _ = child.wait();
    // Seen (the ring is drained and closed), then forgotten with no retention.
    let closed = agent
        .wait_state(Duration::from_secs(20), "the leak to be drained and closed", |s| s["agent"]["rings_closed"] == 1);
    // The end is counted as it is drained and the snapshot that shows the process is
    // published after it: only a later snapshot without it says it was forgotten.
    let published = closed["agent"]["snapshots"].as_u64().expect("snapshot count");
    agent.wait_state(Duration::from_secs(20), "the exited process to be forgotten", |s| {
        s["agent"]["snapshots"].as_u64().is_some_and(|n| n > published) && process(s, pid).is_none()
    });
}

/// The OOM counters outlive the process that failed: two processes OOM one after the
/// other and are forgotten at once (retention 0), and /metrics still counts both, by device
/// and verdict and per host. (The model gives the second incident the first one's id once
/// the first process is forgotten; it is counted all the same.)
#[test]
fn oom_counters_outlive_their_processes() {
    let (rings, agent) = Agent::on_new_rings("oomcount", &["--forget-exited-after", "0"]);
    let mut verdicts = Vec::new();
    for round in 1..=2u64 {
        let mut oom = spawn_traced(&workload("torch_caching"), &[], rings.path(), &[("SIM_OOM_GIB", "200")]);
        let pid = oom.id();
        let _ = oom.wait();
        let oom_total = |s: &Value| -> u64 {
            s["agent"]["ooms"].as_array().map_or(0, |v| v.iter().filter_map(|t| t["count"].as_u64()).sum())
        };
        // The ring's end is counted as it is drained, the published snapshot follows: wait
        // for the incident to be counted (it is, at the publish that shows the process), then
        // for a later snapshot without the process and its incidents.
        agent.wait_state(Duration::from_secs(30), "the OOM process to be drained and its incident counted", |s| {
            s["agent"]["rings_closed"] == round && oom_total(s) >= round
        });
        let s = agent.wait_state(Duration::from_secs(30), "the OOM process to be forgotten with its incidents", |s| {
            process(s, pid).is_none() && s["snapshot"]["incidents"].as_array().is_some_and(|v| v.is_empty())
        });
        assert_eq!(oom_total(&s), round, "{}", s["agent"]["ooms"]);
        verdicts = s["agent"]["ooms"].as_array().expect("ooms in the agent's counters").clone();
    }
    let metrics = agent.get("/metrics");
    let mut device_total = 0.0;
    for t in &verdicts {
        let (device, verdict) = (t["device"].as_i64().expect("device"), t["verdict"].as_str().expect("verdict"));
        let v =
            prom_value(&metrics, &format!("vramhook_device_ooms_total{{device=\"{device}\",verdict=\"{verdict}\"}}"))
                .unwrap_or_else(|| panic!("no device OOM counter for {t} in\n{metrics}"));
        assert_eq!(Some(v), t["count"].as_f64());
        device_total += v;
    }
    assert_eq!(device_total, 2.0);
    let host: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("vramhook_host_ooms_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(host, 2.0, "{metrics}");
    assert!(
        metrics.contains("vramhook_device_ooms_total{device=\"0\",verdict=\"granularity\"} 0"),
        "every verdict starts at 0"
    );
}

/// A tiny OTLP/HTTP sink on loopback: answers every request with `status(path)` and
/// remembers (path, status) in order of arrival.
struct Sink {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
}

impl Sink {
    fn start(status: fn(&str) -> u16) -> Sink {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the sink");
        let addr = listener.local_addr().expect("sink addr");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let seen = seen2.clone();
                std::thread::spawn(move || serve_sink_connection(conn, status, &seen));
            }
        });
        Sink { addr, seen }
    }

    fn requests(&self, path: &str) -> usize {
        self.seen.lock().map(|s| s.iter().filter(|(p, _)| p == path).count()).unwrap_or(0)
    }
}

fn serve_sink_connection(
    conn: std::net::TcpStream,
    status: fn(&str) -> u16,
    seen: &std::sync::Mutex<Vec<(String, u16)>>,
) {
    use std::io::{BufRead, Read, Write};
    let Ok(mut out) = conn.try_clone() else { return };
    let mut r = std::io::BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or("").to_string();
        let (mut len, mut chunked) = (0usize, false);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end().to_ascii_lowercase();
            if h.is_empty() {
                break;
            }
            if let Some(v) = h.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if h.starts_with("transfer-encoding:") && h.contains("chunked") {
                chunked = true;
            }
        }
        if chunked {
            loop {
                let mut size = String::new();
                if r.read_line(&mut size).unwrap_or(0) == 0 {
                    return;
                }
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                let mut body = vec![0; n + 2];
                if r.read_exact(&mut body).is_err() {
                    return;
                }
                if n == 0 {
                    break;
                }
            }
        } else {
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_err() {
                return;
            }
        }
        let code = status(&path);
        if let Ok(mut s) = seen.lock() {
            s.push((path, code));
        }
        let reason = if code == 200 { "OK" } else { "Not Found" };
        let reply =
            format!("HTTP/1.1 {code} {reason}\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n");
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// SIGTERM with OTLP on panicked ("there is no reactor running", exit 101) and skipped the
/// final flush. With an export interval of an hour, the only metrics export there can be
/// is the final flush.
#[test]
fn sigterm_with_otlp_on_exits_0_after_a_final_flush() {
    let rings = ring_dir("otlp-term");
    let sink = Sink::start(|_| 200);
    let endpoint = format!("http://{}", sink.addr);
    let bin = vramhook_bin();
    let mut agent = Agent::start(
        &bin,
        &["--ring-dir", rings.path().to_str().unwrap()],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "3600000"),
        ],
    );
    assert!(
        agent.log().contains(&format!("OTLP metrics to {endpoint}/v1/metrics (http/protobuf)")),
        "the endpoint is named at startup:\n{}",
        agent.log()
    );
    let mut child = spawn_traced(&workload("leak"), &["--n", "4"], rings.path(), &[]);
    let pid = child.id();
    let _ = child.wait();
    agent.wait_state(Duration::from_secs(20), "the leak to be drained", |s| process(s, pid).is_some());
    assert_eq!(sink.requests("/v1/metrics"), 0, "no periodic export within the hour");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.child.id() as i32, libc::SIGTERM) };
    let status = agent.child.wait().expect("agent exit");
    let log = agent.log();
    assert_eq!(status.code(), Some(0), "SIGTERM with OTLP on exits 0:\n{log}");
    assert!(!log.contains("panicked"), "no panic:\n{log}");
    assert!(sink.requests("/v1/metrics") >= 1, "the final flush exported the metrics:\n{log}");
}

/// Jaeger's default configuration answers 404 on /v1/logs, and the agent said nothing.
/// Here logs get a 404 and traces a closed port: each failure kind is said once, at once,
/// naming its endpoint; later ones are summarised (at the latest at shutdown).
#[test]
fn otlp_export_failures_are_said_once_per_kind_naming_the_endpoint() {
    let rings = ring_dir("otlp-fail");
    let sink = Sink::start(|path| if path == "/v1/logs" { 404 } else { 200 });
    let endpoint = format!("http://{}", sink.addr);
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    }; // closed again: connections are refused
    let traces = format!("http://127.0.0.1:{closed}/v1/traces");
    let bin = vramhook_bin();
    let mut agent = Agent::start(
        &bin,
        &["--ring-dir", rings.path().to_str().unwrap()],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "3600000"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_BLRP_SCHEDULE_DELAY", "50"),
        ],
    );
    let log = agent.log();
    for line in [
        format!("OTLP metrics to {endpoint}/v1/metrics (http/protobuf)"),
        format!("OTLP traces to {traces} (http/protobuf)"),
        format!("OTLP logs to {endpoint}/v1/logs (http/protobuf)"),
    ] {
        assert!(log.contains(&line), "startup names the endpoint: {line}\n{log}");
    }
    // torch_caching runs out of memory on purpose: its incident is a span and a log record.
    let mut child = spawn_traced(&workload("torch_caching"), &[], rings.path(), &[]);
    let _ = child.wait();
    let logs_failed = format!("OTLP logs export to {endpoint}/v1/logs (http/protobuf) failed: HTTP 404");
    let traces_failed = format!("OTLP traces export to {traces} (http/protobuf) failed: network error");
    let start = std::time::Instant::now();
    while !(agent.log().contains(&logs_failed) && agent.log().contains(&traces_failed)) {
        assert!(start.elapsed() < Duration::from_secs(60), "each failure said at once:\n{}", agent.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(sink.requests("/v1/logs") >= 1, "the logs did reach the sink (and got a 404)");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.child.id() as i32, libc::SIGTERM) };
    let status = agent.child.wait().expect("agent exit");
    let log = agent.log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert_eq!(log.matches(&logs_failed).count(), 1, "said once:\n{log}");
    assert_eq!(log.matches(&traces_failed).count(), 1, "said once:\n{log}");
    // Later failures are summarised (at intervals and at exit), never repeated line by line.
    // Whether a retry of the span batch fell before the SIGTERM depends on timing, so the
    // summary's wording is checked by otlp.rs's unit test; here only that any summary
    // names what failed.
    for summary in log.lines().filter(|l| l.contains("more failed OTLP exports since")) {
        assert!(summary.contains("traces") || summary.contains("logs"), "a summary names the signals:\n{log}");
    }
}

/// `top` showed "dropped 20 (writer 0, restart 0, capture 0)" after a cleanly stopped
/// agent was started again: the drops the earlier instance counted had no part. A ring
/// left by a finished process with a tiny ring holds thousands of writer drops, whatever
/// the timing; the first agent drains it and stops cleanly, the second recovers them.
#[test]
fn the_dropped_parts_add_up_to_the_total_across_a_clean_restart() {
    let rings = ring_dir("drop-parts");
    let captures = tempfile::tempdir().expect("capture dir");
    let mut child = spawn_traced(
        &workload("threads16"),
        &["--threads", "2", "--iters", "2000"],
        rings.path(),
        &[("VRAMHOOK_RING_SLOTS", "64")],
    );
    let pid = child.id();
    assert!(child.wait().expect("workload").success());
    let bin = vramhook_bin();
    let args = ["--ring-dir", rings.path().to_str().unwrap(), "--capture-dir", captures.path().to_str().unwrap()];
    let parts = |s: &Value| {
        let a = &s["agent"];
        ["writer_dropped", "restart_lost", "dropped_recovered", "dropped_in_ring"]
            .map(|k| a[k].as_u64().unwrap_or_else(|| panic!("no {k} in {a}")))
    };
    let per_process = |s: &Value| -> u64 {
        s["snapshot"]["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .map(|p| p["dropped_events"].as_u64().unwrap_or(0))
            .sum()
    };

    let mut first = Agent::start(&bin, &args, &[]);
    // The end is counted as it is drained; the snapshot that shows it is published after.
    let s = first.wait_state(Duration::from_secs(30), "the ring drained", |s| {
        s["agent"]["rings_closed"] == 1 && process(s, pid).is_some_and(|p| p["alive"] == false)
    });
    let dropped = per_process(&s);
    assert!(dropped > 1000, "a 64-slot ring of a finished process dropped most of ~8000 calls: {dropped}");
    assert_eq!(parts(&s).iter().sum::<u64>(), dropped, "first agent: parts add up: {}", s["agent"]);
    first.terminate();

    let second = Agent::start(&bin, &args, &[]);
    assert!(second.log().contains("recovered the model"), "{}", second.log());
    let s = second.wait_state(Duration::from_secs(20), "the recovered model published", |s| process(s, pid).is_some());
    let p = process(&s, pid).expect("the recovered process");
    assert_eq!(p["dropped_events"].as_u64(), Some(dropped), "the recovered model keeps its drops");
    assert_eq!(parts(&s), [0, 0, dropped, 0], "counted by the earlier agent: {}", s["agent"]);
    let metrics = second.get("/metrics");
    assert_eq!(
        prom_value(&metrics, "vramhook_agent_events_dropped_total{kind=\"earlier_agent\"}"),
        Some(dropped as f64)
    );
}
