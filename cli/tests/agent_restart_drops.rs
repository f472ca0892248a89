//! Issue 27: a restart once left `Dropped` markers in the capture that `vramhook analyze`
//! did not count (the processes were reported complete). Here the agent is SIGKILLed at
//! every step of its restart and checkpoint sequence, each reached through a pause point
//! (`VRAMHOOK_AGENT_PAUSE_AT`), not by timing: once in a first agent, once in the agent
//! that recovers from it, and a third finishes. Its capture queue is made small, so that
//! the batches it drains are dropped from the capture and marked (as a restart's backlog
//! overflowed it in the issue). Then, for every process: what the capture holds (events
//! once each, plus what its markers count) equals what was issued, and `analyze --json`
//! counts exactly the markers' drops and marks the process incomplete.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vramhook_agent::capture::QUEUE_BYTES_ENV;
use vramhook_agent::{PAUSE_AT_ENV, PAUSE_FILE_ENV};
use vramhook_protocol::capture::{CaptureHeader, CaptureReader, CaptureWriter, Frame, ProcessEnd, ProcessInfo};
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_ring::RingWriter;
use vramhook_testkit::{shm_dir as ring_dir, vramhook_bin};

/// Every pause point of the agent (see [`PAUSE_AT_ENV`]).
const STEPS: [&str; 13] = [
    "recovered",
    "rotated",
    "checkpoint-written",
    "first-checkpoint",
    "discovered",
    "announced",
    "polled",
    "capture-dropped",
    "ring-ended",
    "marked",
    "flushed",
    "ring-removed",
    "checkpoint-sent",
];

/// Small enough that a batch of more than 2,048 events is dropped from the capture (and
/// marked), large enough for the small checkpoints here.
const QUEUE_BYTES: &str = "131072";
const SLOTS: u64 = 1 << 15;

/// A process that owns a ring the test writes (its events name it), as the interposer
/// would; `sleep` holds the pid.
struct Writer {
    holder: Child,
    pid: u32,
    ring: RingWriter,
    map: (*mut u8, usize),
    next: u64,
    /// Events pushed and drops counted in the ring header.
    issued: u64,
}

impl Writer {
    fn new(dir: &Path) -> Writer {
        let holder = Command::new("sleep").arg("120").spawn().expect("sleep");
        let pid = holder.id();
        let (ring, base, len) = vramhook_testkit::ring_file(dir, pid, SLOTS, b"/bin/sleep\x00sleep\x00120");
        Writer { holder, pid, ring, map: (base, len), next: 0, issued: 0 }
    }

    /// `n` events (allocations and their frees) and `dropped` drops the writer counted.
    fn write(&mut self, n: u64, dropped: u64) {
        for _ in 0..n {
            let addr = 0x7f00_0000_0000 + (self.next / 2) * 0x10_0000;
            let e = if self.next.is_multiple_of(2) {
                Event::alloc(Api::cuMemAlloc_v2, addr, 1 << 20)
            } else {
                Event::free(Api::cuMemFree_v2, addr)
            };
            let e = e.by(self.pid, self.pid).at(vramhook_protocol::clock::monotonic_ns()).on_device(0);
            assert!(self.ring.push(&e.to_raw()), "ring full");
            self.next += 1;
        }
        self.ring.count_dropped(dropped);
        self.issued += n + dropped;
    }

    /// The writer is gone (reaped: a zombie still counts as running).
    fn end(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.end();
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.map.0.cast(), self.map.1) };
    }
}

/// An agent process, SIGKILLed if the test fails while it runs (one paused never exits).
struct AgentProc(Child, Option<vramhook_testkit::StderrLog>);

impl AgentProc {
    /// SIGTERM (the capture is flushed and sealed); panics unless it exits 0.
    fn stop(mut self, what: &str) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let status = self.0.wait().expect("wait for the agent");
        let log = self.1.as_ref().map(|l| l.text()).unwrap_or_default();
        assert!(status.success(), "{what}: the agent stopped with {status}\n{log}");
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn agent_command(rings: &Path, captures: &Path, envs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(vramhook_bin());
    cmd.args(["agent", "--no-http", "--checkpoint-interval", "0.1", "--ring-dir"])
        .arg(rings)
        .arg("--capture-dir")
        .arg(captures)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd
}

/// An agent that may pause anywhere (its start is not waited for).
fn agent(rings: &Path, captures: &Path, envs: &[(&str, &str)]) -> AgentProc {
    AgentProc(agent_command(rings, captures, envs).spawn().expect("start the agent"), None)
}

/// An agent past its start: its signal handlers are in place (a SIGTERM before then ends it
/// at once), and it drains the rings.
fn running_agent(rings: &Path, captures: &Path) -> AgentProc {
    let mut cmd = agent_command(rings, captures, &[]);
    let (child, log, _) =
        vramhook_testkit::spawn_until(&mut cmd, "vramhook agent: draining rings in ", Duration::from_secs(30));
    AgentProc(child, Some(log))
}

/// Runs an agent until it pauses at `step`, then SIGKILLs it there.
fn kill_at(step: &str, rings: &Path, captures: &Path, ready: &Path) {
    let _ = std::fs::remove_file(ready);
    let ready_s = ready.to_str().expect("utf-8 path");
    let mut a =
        agent(rings, captures, &[(PAUSE_AT_ENV, step), (PAUSE_FILE_ENV, ready_s), (QUEUE_BYTES_ENV, QUEUE_BYTES)]);
    let start = Instant::now();
    while !ready.exists() {
        if let Ok(Some(status)) = a.0.try_wait() {
            panic!("the agent exited ({status}) before reaching step {step}");
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the agent never reached step {step}");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(a); // SIGKILL, paused at `step`
}

fn ring_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .expect("ring dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".ring"))
        .count()
}

/// The capture files, oldest first. Each has its header, wherever its agent was killed.
fn capture_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("capture dir")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "vrhk"))
        .collect();
    files.sort();
    for f in &files {
        let header = std::fs::File::open(f).map(|f| CaptureReader::new(std::io::BufReader::new(f)).map(|_| ()));
        assert!(matches!(header, Ok(Ok(()))), "{}: no capture header ({header:?})", f.display());
    }
    files
}

#[derive(Default)]
struct Captured {
    seqs: BTreeSet<u64>,
    events: u64,
    /// Events the `Dropped` markers count.
    dropped: u64,
    markers: u64,
}

fn captured(files: &[PathBuf]) -> BTreeMap<u32, Captured> {
    let mut out: BTreeMap<u32, Captured> = BTreeMap::new();
    for file in files {
        let mut r = CaptureReader::new(std::io::BufReader::new(std::fs::File::open(file).expect("open")))
            .expect("capture header");
        // A killed agent's last file ends cut short: what is before the cut counts.
        while let Ok(Some(frame)) = r.next_frame() {
            if let Frame::Events(records) = frame {
                for raw in records {
                    let e = Event::from_raw(raw);
                    let c = out.entry(e.pid).or_default();
                    if e.kind() == Some(EventKind::Dropped) {
                        c.dropped += e.dropped_count();
                        c.markers += 1;
                    } else {
                        assert!(c.seqs.insert(e.seq), "pid {}: event {} in the capture twice", e.pid, e.seq);
                        c.events += 1;
                    }
                }
            }
        }
    }
    out
}

/// One scenario: kills at `step` in a first agent and in the agent that recovers from it,
/// a third finishes; checks the capture against what was issued and `analyze` against the
/// capture.
fn scenario(step: &str) {
    let rings = ring_dir("drops");
    let captures = tempfile::tempdir().expect("capture dir");
    let ready = captures.path().join("ready");
    let caps = captures.path().join("c");
    // Writers already gone when the first agent starts (drained to their end in one poll,
    // as a restart's backlog was), one gone between the first and second agent, one alive
    // until the third. Each counted some drops of its own.
    let mut gone: Vec<Writer> = (0..3).map(|_| Writer::new(rings.path())).collect();
    for w in &mut gone {
        w.write(5000, 7);
        w.end();
    }
    let mut second = Writer::new(rings.path());
    second.write(5000, 3);
    let mut third = Writer::new(rings.path());
    third.write(5000, 5);

    kill_at(step, rings.path(), &caps, &ready);
    second.write(3000, 2);
    second.end();
    third.write(2500, 1);
    kill_at(step, rings.path(), &caps, &ready);
    third.write(3000, 4);
    third.end();

    let last = running_agent(rings.path(), &caps);
    let start = Instant::now();
    while ring_files(rings.path()) > 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "step {step}: the last agent never drained every ring");
        std::thread::sleep(Duration::from_millis(10));
    }
    last.stop(&format!("step {step}: the last agent"));

    let files = capture_files(&caps);
    let leftovers: Vec<_> = std::fs::read_dir(&caps)
        .expect("capture dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
        .collect();
    assert!(leftovers.is_empty(), "step {step}: files a killed agent was making remain: {leftovers:?}");
    let got = captured(&files);
    let out = Command::new(vramhook_bin()).args(["analyze", "--json"]).args(&files).output().expect("analyze");
    assert!(out.status.success(), "step {step}: analyze: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("analyze JSON");
    let writers = gone.iter().chain([&second, &third]);
    for w in writers {
        let c = got.get(&w.pid).unwrap_or_else(|| panic!("step {step}: pid {} not in the capture", w.pid));
        assert_eq!(
            c.events + c.dropped,
            w.issued,
            "step {step}: pid {}: every event issued is in the capture once or counted by a marker \
             ({} events, {} markers counting {})",
            w.pid,
            c.events,
            c.markers,
            c.dropped
        );
        let p = report["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == w.pid))
            .unwrap_or_else(|| panic!("step {step}: pid {} not in the report", w.pid));
        assert_eq!(
            p["dropped_events"].as_u64(),
            Some(c.dropped),
            "step {step}: pid {}: analyze counts the capture's {} markers ({} events)",
            w.pid,
            c.markers,
            c.dropped
        );
        assert_eq!(p["incomplete"], true, "step {step}: pid {} lost events", w.pid);
    }
}

#[test]
fn an_agent_killed_at_any_step_of_its_restart_and_checkpoints_leaves_every_drop_in_the_report() {
    let start = Instant::now();
    for step in STEPS {
        scenario(step);
    }
    eprintln!("{} steps in {:?}", STEPS.len(), start.elapsed());
}

/// Captures that agents before this fix wrote: the marker of what the capture queue dropped
/// after the process's end frame. `analyze` counts it for that process (it discarded it as
/// an event after exit, and reported the process complete).
#[test]
fn a_drop_marker_after_its_process_end_is_counted() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("old-agent.vrhk");
    let (pid, start_time) = (4242, 77);
    let mut w =
        CaptureWriter::new(std::fs::File::create(&path).expect("create"), &CaptureHeader::now()).expect("header");
    let info = ProcessInfo { pid, start_time, cmdline: vec!["train".into()], ..ProcessInfo::default() };
    w.write_process(&info).expect("process");
    let ts = vramhook_protocol::clock::monotonic_ns();
    let alloc = Event::alloc(Api::cuMemAlloc_v2, 0x7f00_0000_0000, 1 << 20).by(pid, pid).at(ts).on_device(0);
    let free = Event::free(Api::cuMemFree_v2, 0x7f00_0000_0000).by(pid, pid).at(ts + 1).on_device(0);
    w.write_events(&[alloc, free]).expect("events");
    w.write_process_end(&ProcessEnd { pid, start_time, ts_ns: ts + 2, delivered: 2, ..ProcessEnd::default() })
        .expect("end");
    let marker = Event {
        pid,
        ts_ns: ts + 3,
        kind: EventKind::Dropped.code(),
        api: Api::Interposer.code(),
        device: -1,
        size: 4096,
        aux: 4096,
        ..Event::default()
    };
    w.write_events(&[marker]).expect("marker");
    w.finish().expect("finish");
    let out = Command::new(vramhook_bin()).args(["analyze", "--json"]).arg(&path).output().expect("analyze");
    assert!(out.status.success(), "analyze: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("analyze JSON");
    let p = report["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"] == pid))
        .unwrap_or_else(|| panic!("pid {pid} not in the report: {report}"));
    assert_eq!(p["dropped_events"], 4096, "{p}");
    assert_eq!(p["incomplete"], true, "{p}");
}

/// A ring, for a process that is gone, of `pid` started at `start_time` (a reused pid: two
/// processes), holding `events` events; its header says the writer dropped `dropped` events
/// and that an earlier reader reported `reported` of them (that reader died before its
/// capture recorded the marker).
fn gone_ring(dir: &Path, pid: u32, start_time: u64, events: u64, dropped: u64, reported: u64) -> (*mut u8, usize) {
    let init = vramhook_ring::RingInit {
        capacity: 1024,
        pid,
        ppid: 1,
        // SAFETY: no preconditions.
        uid: unsafe { libc::geteuid() },
        start_time,
        mono_anchor_ns: vramhook_protocol::clock::monotonic_ns(),
        wall_anchor_ns: vramhook_protocol::clock::wall_ns(),
        ..Default::default()
    };
    let name = format!("{pid}-{start_time}-0.ring");
    let (ring, base, len) = vramhook_testkit::make_ring_file(dir, &name, &init, 1, b"/bin/job\x00job", |_, _| {});
    for i in 0..events {
        let addr = 0x7f00_0000_0000 + (i / 2) * 0x10_0000;
        let e = if i % 2 == 0 {
            Event::alloc(Api::cuMemAlloc_v2, addr, 1 << 20)
        } else {
            Event::free(Api::cuMemFree_v2, addr)
        };
        let e = e.by(pid, pid).at(vramhook_protocol::clock::monotonic_ns()).on_device(0);
        assert!(ring.push(&e.to_raw()), "ring full");
    }
    ring.count_dropped(dropped);
    // SAFETY: the mapping starts with the ring header; its counters are atomics.
    let header = unsafe { &*(base as *const vramhook_ring::RingHeader) };
    header.dropped_reported.store(reported, std::sync::atomic::Ordering::Release);
    (base, len)
}

/// Writer drops an earlier agent reported but never recorded are marked by the agent that
/// announces the ring. With a reused pid, that marker came before the new process's frame:
/// it counted on the previous process of the pid (ended, so the model discarded it, and a
/// replay put it on the wrong process), and the new one was reported complete.
#[test]
fn unrecorded_writer_drops_of_a_reused_pid_count_on_the_new_process() {
    let rings = ring_dir("reuse");
    let captures = tempfile::tempdir().expect("capture dir");
    // A pid no process holds now: both of its rings belong to processes that are gone.
    let mut exited = Command::new("true").spawn().expect("true");
    let pid = exited.id();
    let _ = exited.wait();
    let old = gone_ring(rings.path(), pid, 100, 10, 3, 0);
    let new = gone_ring(rings.path(), pid, 200, 10, 5, 5);
    let a = running_agent(rings.path(), captures.path());
    let start = Instant::now();
    // The second ring is opened once the first is closed (never two processes of a pid).
    while ring_files(rings.path()) > 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "the agent never drained both rings");
        std::thread::sleep(Duration::from_millis(10));
    }
    a.stop("pid reuse");
    for (base, len) in [old, new] {
        // SAFETY: our own mappings.
        unsafe { libc::munmap(base.cast(), len) };
    }
    let files = capture_files(captures.path());
    let out = Command::new(vramhook_bin()).args(["analyze", "--json"]).args(&files).output().expect("analyze");
    assert!(out.status.success(), "analyze: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("analyze JSON");
    let process = |start_time: u64| {
        report["processes"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["pid"] == pid && p["start_time"] == start_time))
            .unwrap_or_else(|| panic!("process {pid} started at {start_time} not in the report: {report}"))
    };
    assert_eq!(process(100)["dropped_events"], 3, "the first process: its own drops only");
    assert_eq!(process(200)["dropped_events"], 5, "the second: the drops its earlier reader reported");
    assert_eq!(process(200)["incomplete"], true);
}
