//! Hand-made rings for the hostile-user tests: a ring file written with the protocol's own
//! `RingWriter` (so that it is valid where the test wants it valid), whose header a test
//! can then bend; a private ring directory owned by a second uid; a live process of that
//! uid to name; and `vramhook agent` started on a private port, read over HTTP.

use crate::{as_uid, vramhook_bin, HOSTILE_UID};
use serde_json::Value;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vramhook_protocol::record::{Api, Event};
use vramhook_ring::{RingHeader, RingInit, RingWriter};
use vramhook_testkit::{http_get, make_ring_file, spawn_agent, StderrLog};

/// A ring file mapped read-write by the test, written through the protocol's writer.
pub struct RingFile {
    pub path: PathBuf,
    base: *mut u8,
    len: usize,
    writer: RingWriter,
}

impl RingFile {
    /// Creates `dir/<pid>-<start>-0.ring` of `capacity` slots in one lane for process
    /// (`pid`, `start`) of `uid`, owned by `uid`, mode 0600. The file is sparse: only the
    /// pages written are backed.
    pub fn create(dir: &Path, pid: u32, start: u64, uid: u32, capacity: u64) -> RingFile {
        Self::create_named(dir, &format!("{pid}-{start}-0.ring"), pid, start, uid, capacity)
    }

    pub fn create_named(dir: &Path, name: &str, pid: u32, start: u64, uid: u32, capacity: u64) -> RingFile {
        let init = RingInit {
            capacity,
            pid,
            ppid: 1,
            uid,
            start_time: start,
            // The events below carry CLOCK_MONOTONIC stamps.
            clock_source: vramhook_protocol::clock::ClockSource::Monotonic as u32,
            mono_anchor_ns: vramhook_protocol::clock::monotonic_ns(),
            ..RingInit::default()
        };
        let (writer, base, len) = make_ring_file(dir, name, &init, 1, b"/hostile\0hostile", |file, tmp| {
            std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o600)).expect("chmod ring");
            std::os::unix::fs::fchown(file, Some(uid), Some(uid)).expect("chown ring");
        });
        RingFile { path: dir.join(name), base, len, writer }
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: the mapping starts with an initialised header and lives as long as self.
        unsafe { &*(self.base as *const RingHeader) }
    }

    /// Publishes one event (any pid the test likes: that is the point).
    pub fn push(&self, e: Event) {
        assert!(self.writer.push(&e.to_raw()), "ring full");
    }

    /// Claims `n` events dropped by the writer.
    pub fn set_dropped(&self, n: u64) {
        self.header().dropped.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    /// Sets lane 0's write cursor (slots claimed reserved) without publishing anything.
    pub fn set_write_pos(&self, n: u64) {
        self.header().write_pos.store(n, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn mark_exited(&self) {
        self.writer.mark_exited();
    }
}

impl Drop for RingFile {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// An allocation event of `pid`.
pub fn alloc(pid: u32, addr: u64, size: u64) -> Event {
    Event::alloc(Api::cuMemAlloc_v2, addr, size).by(pid, pid).at(vramhook_protocol::clock::monotonic_ns()).on_device(0)
}

/// A failed allocation (CUDA_ERROR_OUT_OF_MEMORY) of `size` by `pid`.
pub fn oom(pid: u32, size: u64) -> Event {
    alloc(pid, 0, size).with_result(vramhook_protocol::record::CUDA_ERROR_OUT_OF_MEMORY)
}

pub use vramhook_testkit::start_time;

/// A process of the hostile uid that just sleeps (its pid and start time are real), killed
/// when dropped.
pub struct Sleeper {
    pub child: Child,
    pub pid: u32,
    pub start: u64,
}

impl Sleeper {
    pub fn start() -> Sleeper {
        let mut cmd = Command::new("sleep");
        cmd.arg("3600").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        as_uid(&mut cmd, HOSTILE_UID);
        let child = cmd.spawn().expect("start a sleeper as the hostile uid");
        let pid = child.id();
        // Wait for the exec, so that /proc/PID belongs to the new uid.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            if exe.to_string_lossy().contains("sleep") {
                break;
            }
            assert!(Instant::now() < deadline, "sleeper never started");
            std::thread::sleep(Duration::from_millis(10));
        }
        Sleeper { start: start_time(pid), pid, child }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private ring directory of the hostile user: `<base>/user`, 0700 and theirs, under a
/// parent that user may also write (1777, like /dev/shm/vramhook), on /dev/shm where
/// there is one. Removed when dropped.
pub struct UserDir {
    pub parent: tempfile::TempDir,
    pub dir: PathBuf,
}

impl UserDir {
    pub fn new(tag: &str) -> UserDir {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() { base.to_path_buf() } else { std::env::temp_dir() };
        let parent = tempfile::Builder::new().prefix(&format!("vramhook-{tag}-")).tempdir_in(base).expect("parent dir");
        std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod parent");
        // Named by its uid, as under /dev/shm/vramhook: a root agent drains a directory of
        // another user only when its name is the uid that owns it.
        let dir = parent.path().join(HOSTILE_UID.to_string());
        std::fs::create_dir(&dir).expect("user dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod user dir");
        std::os::unix::fs::chown(&dir, Some(HOSTILE_UID), Some(HOSTILE_UID)).expect("chown user dir");
        UserDir { parent, dir }
    }
}

/// `vramhook agent` on a private loopback port, its stderr collected.
pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    log: StderrLog,
}

impl Agent {
    /// Starts the agent on `ring_dir` with `args` and waits until it listens. The binary
    /// is this build's, or `$VRAMHOOK_SAFETY_AGENT_BIN` (to show a test failing on an
    /// older build).
    pub fn start(ring_dir: &Path, args: &[&str]) -> Agent {
        let bin = std::env::var_os("VRAMHOOK_SAFETY_AGENT_BIN").map(PathBuf::from).unwrap_or_else(vramhook_bin);
        let mut cmd = Command::new(bin);
        cmd.arg("agent").arg("--ring-dir").arg(ring_dir).args(args).stdin(Stdio::null());
        let (child, log, addr) = spawn_agent(cmd, Duration::from_secs(60));
        Agent { child, addr, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// GET `path`; `Err` when the agent does not answer.
    pub fn get(&self, path: &str) -> Result<String, String> {
        http_get(self.addr, path)
    }

    pub fn state(&self) -> Value {
        let body = self.get("/api/v1/state").unwrap_or_else(|e| self.died(&format!("GET /api/v1/state: {e}")));
        serde_json::from_str(&body).expect("state JSON")
    }

    pub fn metrics(&self) -> String {
        self.get("/metrics").unwrap_or_else(|e| self.died(&format!("GET /metrics: {e}")))
    }

    pub fn log(&self) -> String {
        self.log.text()
    }

    /// The agent's exit status if it is no longer running.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn died(&self, what: &str) -> ! {
        panic!("{what} (the agent died or hangs?)\nagent log:\n{}", self.log())
    }

    /// Polls the state until `pred` holds; panics after `timeout` (a generous bound, never
    /// a measurement) or as soon as the agent has exited.
    pub fn wait_state(&mut self, timeout: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(status) = self.exited() {
                panic!("the agent exited ({status}) while waiting for {what}\nagent log:\n{}", self.log());
            }
            let s = self.state();
            if pred(&s) {
                return s;
            }
            assert!(
                start.elapsed() < timeout,
                "timed out waiting for {what}; agent={}\nagent log:\n{}",
                s["agent"],
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits up to `timeout` for the agent to exit; its status, or `None`
    /// when it ignored the signal (it is then killed).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The process `pid` in an agent state, if the model knows it.
pub fn process(state: &Value, pid: u32) -> Option<&Value> {
    state["snapshot"]["processes"].as_array()?.iter().find(|p| p["pid"] == pid)
}

/// An agent counter from its state.
pub fn stat(state: &Value, name: &str) -> u64 {
    state["agent"][name].as_u64().unwrap_or(0)
}

/// Numeric value of one series in Prometheus text output.
pub fn prom_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
    })
}

/// CPU time (user + system, in clock ticks) a process has used so far.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = stat.rfind(')') else { return 0 };
    let f: Vec<&str> = stat[close + 2..].split(' ').collect();
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}
