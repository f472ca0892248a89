//! eBPF mode on the simulated libcuda, as root: a workload started BEFORE the probes is
//! traced without a restart, and what the probes saw after attach agrees with the
//! simulated driver's ground truth (every logged call after the attach, field by field).
//! Where BPF cannot load, the tests say `not run: <reason>` (failing under CI=true).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vramhook_ebpf::probe;
use vramhook_ebpf::source::{EbpfSource, Item, SourceConfig, Targets};
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_safety_tests::not_run;

/// One test at a time: each loads its own programs, and the first checks that none is
/// left in the kernel after it detached.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn sim() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/simcuda/build")
}

/// The sim's build, or `None` (reported) when it is missing.
fn workload(test: &str) -> Option<PathBuf> {
    let w = sim().join("workloads/wait_alloc");
    if w.exists() {
        Some(w)
    } else {
        not_run(test, "tests/simcuda is not built (make -C tests/simcuda)");
        None
    }
}

/// Starts wait_alloc and waits for its "ready" line (it has made its `before` calls).
fn start_workload(bin: &Path, log_dir: &Path, extra: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(bin)
        .args(extra)
        .env("VRAMHOOK_SIM_LOG_DIR", log_dir)
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start wait_alloc");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("ready line");
    assert!(line.starts_with("ready"), "unexpected first line {line:?}");
    (child, out)
}

fn log_lines(log_dir: &Path, pid: u32) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(log_dir.join(format!("{pid}.jsonl"))).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v.get("fn").is_some())
        .collect()
}

/// Loads the probes, or reports why this machine cannot.
fn start_source(test: &str, cfg: SourceConfig) -> Option<EbpfSource> {
    match EbpfSource::start(cfg) {
        Ok(s) => Some(s),
        Err(e) => {
            not_run(test, &e.to_string());
            None
        }
    }
}

/// A test's turn (the `SERIAL` lock) and its wait_alloc, started with `args` and waiting
/// at its "ready" line, logging to `logs`.
struct Started {
    _turn: std::sync::MutexGuard<'static, ()>,
    logs: tempfile::TempDir,
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    pid: u32,
}

/// Takes the test's turn and starts wait_alloc with `args`, or `None` (reported) where the
/// sim is not built.
fn start(test: &str, args: &[&str]) -> Option<Started> {
    let turn = serial();
    let bin = workload(test)?;
    let logs = tempfile::tempdir().expect("tempdir");
    let (child, out) = start_workload(&bin, logs.path(), args);
    Some(Started { _turn: turn, pid: child.id(), logs, child, out })
}

/// Loads the probes for `child` alone; where they cannot load, the child is stopped and the
/// reason reported.
fn attach(test: &str, child: &mut Child) -> Option<EbpfSource> {
    let src = start_source(test, SourceConfig::new(Targets::Pids(vec![child.id()])));
    if src.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    src
}

/// Lets a waiting wait_alloc make its `after` calls, and waits for it to exit.
fn release(child: &mut Child, out: &mut BufReader<std::process::ChildStdout>) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let mut line = String::new();
    while out.read_line(&mut line).unwrap_or(0) > 0 {}
    let _ = child.wait();
}

#[derive(Default)]
struct Seen {
    processes: Vec<u32>,
    attached: Vec<(u32, u64)>,
    events: Vec<Event>,
    ended: Vec<u32>,
}

fn poll(src: &mut EbpfSource, seen: &mut Seen, ring_pids: &dyn Fn(u32) -> bool) {
    src.poll(ring_pids, &mut |item| match item {
        Item::Process(info) => seen.processes.push(info.pid),
        Item::Attached { pid, since_ns, .. } => seen.attached.push((pid, since_ns)),
        Item::Events(evs) => seen.events.extend_from_slice(evs),
        Item::End(end) => seen.ended.push(end.pid),
    });
}

/// Polls every 20 ms until `done` holds or `timeout` has passed (the callers assert after).
fn poll_until(
    src: &mut EbpfSource,
    seen: &mut Seen,
    ring_pids: &dyn Fn(u32) -> bool,
    timeout: Duration,
    done: impl Fn(&EbpfSource, &Seen) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !done(src, seen) && Instant::now() < deadline {
        poll(src, seen, ring_pids);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `pid`'s events as the probes delivered them and its calls in the driver's log from line
/// `skip` on, each as (fn, result, addr, size).
type Key = (String, u64, u64, u64);
fn got_and_truth(seen: &Seen, log_dir: &Path, pid: u32, skip: usize) -> (Vec<Key>, Vec<Key>) {
    let got = seen.events.iter().filter(|e| e.pid == pid).map(event_key).collect();
    let truth = log_lines(log_dir, pid).get(skip..).unwrap_or_default().iter().map(truth_key).collect();
    (got, truth)
}

/// The probe's record of one ground-truth line, as (fn, result, addr, size).
fn truth_key(v: &serde_json::Value) -> Key {
    let f = v["fn"].as_str().unwrap_or("").to_string();
    let r = v["result"].as_u64().unwrap_or(0);
    let addr = v["addr"].as_u64().unwrap_or(0);
    let size = v["size"].as_u64().unwrap_or(0);
    let aux = v["aux"].as_u64().unwrap_or(0);
    // Map the log's fields to the record's, per function (tests/simcuda/README.md).
    match f.as_str() {
        "cuMemFree_v2" | "cuMemFreeAsync" | "cuMemFreeAsync_ptsz" => (f, r, addr, 0),
        "cuMemCreate" => (f, r, aux, size), // handle in aux; the record keeps it in aux too
        "cuMemGetInfo_v2" => (f, r, size, aux), // free, total
        "cuMemAllocPitch_v2" => (f, r, if r == 0 { addr } else { 0 }, size),
        // The stream in aux, the priority in addr; the record keeps them in stream and addr.
        "cuStreamCreate" | "cuStreamCreateWithPriority" | "cuStreamDestroy" | "cuStreamDestroy_v2" => (f, r, aux, addr),
        _ => (f, r, if r == 0 { addr } else { 0 }, size),
    }
}

fn event_key(e: &Event) -> Key {
    let f = e.api().map(Api::name).unwrap_or("?").to_string();
    match e.kind() {
        Some(EventKind::VmmCreate) => (f, u64::from(e.result), e.aux, e.size),
        Some(EventKind::StreamCreate | EventKind::StreamDestroy) => (f, u64::from(e.result), e.stream, e.addr),
        _ => (f, u64::from(e.result), e.addr, e.size),
    }
}

#[test]
fn a_running_process_is_traced_without_restart() {
    let test = "ebpf::a_running_process_is_traced_without_restart";
    let Some(Started { _turn, logs, mut child, mut out, pid }) = start(test, &["--before", "4", "--after", "10"])
    else {
        return;
    };
    let before = log_lines(logs.path(), pid).len();
    assert!(before >= 4, "the workload logged {before} calls before attach");

    let Some(mut src) = attach(test, &mut child) else { return };
    assert!(src.links() >= 2 * 20, "only {} probe links", src.links());
    let mut seen = Seen::default();
    poll(&mut src, &mut seen, &|_| false);
    // Announced at attach, with the note that its earlier allocations are unknown.
    assert_eq!(seen.processes, vec![pid]);
    assert_eq!(seen.attached.len(), 1, "attach note: {:?}", seen.attached);

    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let mut after = String::new();
    while !after.starts_with("after") {
        after.clear();
        if out.read_line(&mut after).expect("read") == 0 {
            break;
        }
    }
    assert!(after.starts_with("after"), "workload output {after:?}");
    let status = child.wait().expect("wait");
    assert!(status.success());
    poll_until(&mut src, &mut seen, &|_| false, Duration::from_secs(10), |_, seen| !seen.ended.is_empty());
    assert_eq!(seen.ended, vec![pid], "the process's end was seen");

    let (got, truth) = got_and_truth(&seen, logs.path(), pid, before);
    assert!(truth.len() >= 20, "ground truth has {} calls after attach", truth.len());
    assert_eq!(got, truth, "eBPF events versus the simulated driver's log after attach");
    // The failed call keeps its code; thread ids are the callers'.
    assert!(seen.events.iter().any(|e| e.is_oom() && e.kind() == Some(EventKind::Alloc)));
    assert!(seen.events.iter().all(|e| e.tid == pid));
    assert_eq!(src.stats.malformed, 0);
    // Ours only: other tests (and other test runs) load the same programs meanwhile.
    let ours = src.program_ids();
    assert_eq!(ours.len(), 2, "the source's two programs: {ours:?}");
    drop(src);
    assert_eq!(probe::still_loaded(&ours), 0, "programs left in the kernel after detach");
}

#[test]
fn a_process_with_a_ring_is_left_to_its_ring() {
    let test = "ebpf::a_process_with_a_ring_is_left_to_its_ring";
    let Some(Started { _turn, logs, mut child, mut out, pid }) = start(test, &["--before", "1", "--after", "4"]) else {
        return;
    };
    let Some(mut src) = attach(test, &mut child) else { return };
    let mut seen = Seen::default();
    // The agent says this pid has a ring: nothing of it is delivered, everything counted.
    let ring = |p: u32| p == pid;
    poll(&mut src, &mut seen, &ring);
    release(&mut child, &mut out);
    let before = log_lines(logs.path(), pid).len();
    poll_until(&mut src, &mut seen, &ring, Duration::from_secs(5), |src, _| src.tracked() == 0);
    assert!(seen.events.is_empty(), "{} events delivered", seen.events.len());
    assert!(seen.processes.is_empty());
    assert!(src.stats.ring_won >= 10, "ring_won {} of {before} logged calls", src.stats.ring_won);
}

#[test]
fn every_process_mode_sees_a_process_started_later() {
    let _serial = serial();
    let test = "ebpf::every_process_mode_sees_a_process_started_later";
    let Some(bin) = workload(test) else { return };
    let mut cfg = SourceConfig::new(Targets::All);
    cfg.libraries.push(sim().join("libcuda.so.1"));
    let Some(mut src) = start_source(test, cfg) else { return };
    let logs = tempfile::tempdir().expect("tempdir");
    let go = logs.path().join("go");
    std::fs::write(&go, b"").expect("go file");
    // Started after the probes: traced from its first call, no "attached" note.
    let (mut child, mut out) =
        start_workload(&bin, logs.path(), &["--before", "2", "--after", "3", "--go-file", go.to_str().expect("utf8")]);
    let pid = child.id();
    let mut line = String::new();
    while out.read_line(&mut line).unwrap_or(0) > 0 {}
    let _ = child.wait();
    let mut seen = Seen::default();
    poll_until(&mut src, &mut seen, &|_| false, Duration::from_secs(10), |_, seen| seen.ended.contains(&pid));
    let (got, truth) = got_and_truth(&seen, logs.path(), pid, 0);
    assert_eq!(got, truth);
    assert!(!seen.attached.iter().any(|(p, _)| *p == pid), "a process started after attach has no gap");
}

/// A process in another mount namespace (as in a container): its libcuda's path exists only
/// there, and is reached through `/proc/<pid>/root`.
#[test]
fn a_process_in_another_mount_namespace_is_traced() {
    let test = "ebpf::a_process_in_another_mount_namespace_is_traced";
    let _serial = serial();
    let Some(bin) = workload(test) else { return };
    if Command::new("unshare").arg("--version").output().is_err() {
        not_run(test, "unshare(1) is not installed");
        return;
    }
    let logs = tempfile::tempdir().expect("tempdir");
    let hidden = tempfile::tempdir().expect("tempdir");
    let private = hidden.path().join("lib");
    // In a new mount namespace: a tmpfs over `private`, the sim's libcuda copied into it,
    // and the workload loading it from there. The host sees an empty directory.
    let script = format!(
        "mkdir -p {p} && mount -t tmpfs none {p} && cp {lib} {p}/libcuda.so.1 && LD_LIBRARY_PATH={p} exec {bin} --before 1 --after 3",
        p = private.display(),
        lib = sim().join("libcuda.so.1").display(),
        bin = bin.display()
    );
    let mut child = match Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("VRAMHOOK_SIM_LOG_DIR", logs.path())
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            not_run(test, &format!("unshare: {e}"));
            return;
        }
    };
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    if out.read_line(&mut line).unwrap_or(0) == 0 || !line.starts_with("ready") {
        let _ = child.wait();
        not_run(test, "could not make a private mount namespace here (unshare --mount)");
        return;
    }
    let pid = child.id(); // sh exec'd the workload: same pid
    assert!(!private.join("libcuda.so.1").exists(), "the library is visible outside its namespace");
    let before = log_lines(logs.path(), pid).len();
    let Some(mut src) = attach(test, &mut child) else { return };
    let mut seen = Seen::default();
    poll(&mut src, &mut seen, &|_| false);
    release(&mut child, &mut out);
    poll_until(&mut src, &mut seen, &|_| false, Duration::from_secs(10), |_, seen| seen.ended.contains(&pid));
    let (got, truth) = got_and_truth(&seen, logs.path(), pid, before);
    assert!(!truth.is_empty());
    assert_eq!(got, truth, "events of a process whose libcuda only its own namespace sees");
}
