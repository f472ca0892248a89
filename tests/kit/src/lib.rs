//! What the tests and benchmarks of every crate share, in one place instead of copies
//! (or `#[path]` includes) per crate:
//! - where the built binaries are and the simulated CUDA driver ([`repo_root`],
//!   [`vramhook_bin`], [`interposer`], [`workload`], [`traced_workload`]);
//! - a child whose stderr is collected while a test waits for one of its lines
//!   ([`spawn_until`], [`spawn_agent`]), and a plain HTTP GET ([`http_get`]);
//! - event streams built through the protocol's typed constructors ([`events`]);
//! - the brute-force reference model the property tests and the model benchmark
//!   compare against ([`reference`]).

pub mod events;
pub mod reference;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use vramhook_ring::{ring_file_size_lanes, RingInit, RingWriter};

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// The profile directory this test binary was built into (target/<profile>).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test>-<hash>, or target/<profile>/examples/<name>
    exe.parent().and_then(Path::parent).expect("profile dir").to_path_buf()
}

fn built(name: &str) -> PathBuf {
    let path = profile_dir().join(name);
    assert!(
        path.is_file(),
        "MISSING {}: these tests need the workspace built in the same profile; run `cargo build --workspace` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// The `vramhook` binary of the same build.
pub fn vramhook_bin() -> PathBuf {
    built("vramhook")
}

/// What `cmd` (a `vramhook` command) printed on stdout; it must succeed.
pub fn vramhook_stdout(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run vramhook");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `libvramhook.so` of the same build.
pub fn interposer() -> PathBuf {
    built("libvramhook.so")
}

/// Builds the simulated CUDA driver (once per test binary; a failure fails loudly) and
/// returns its build directory.
pub fn sim_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = repo_root().join("tests/simcuda");
            let out = Command::new("make")
                .arg("-s")
                .arg("-C")
                .arg(&dir)
                .output()
                .expect("cannot run make (is it installed?)");
            assert!(
                out.status.success(),
                "building the simulated CUDA driver failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            dir.join("build")
        })
        .clone()
}

/// A workload of the simulated driver.
/// Collects what a reader (a child's stdout, a terminal) yields, in a thread.
pub fn collect_output(mut r: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let out = Arc::new(Mutex::new(String::new()));
    let out2 = out.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut o) = out2.lock() {
                o.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    });
    out
}

/// The signal tests' counter (`tests/kit/programs/sigcount.c`), built once per test binary.
pub fn sigcount() -> PathBuf {
    static BUILT: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("dir");
            let src = repo_root().join("tests/kit/programs/sigcount.c");
            let bin = dir.path().join("sigcount");
            let out = Command::new("cc").arg("-O1").arg("-o").arg(&bin).arg(&src).output().expect("cc");
            assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
            (dir, bin)
        })
        .1
        .clone()
}

pub fn workload(name: &str) -> PathBuf {
    sim_dir().join("workloads").join(name)
}

/// A command for a simulated-driver workload, traced with `LD_PRELOAD` into `ring_dir`.
pub fn traced_workload(name: &str, ring_dir: &Path) -> Command {
    let sim = sim_dir();
    let mut cmd = Command::new(workload(name));
    cmd.env("LD_LIBRARY_PATH", &sim)
        .env("LD_PRELOAD", interposer())
        .env("VRAMHOOK_DIR", ring_dir)
        .env_remove("VRAMHOOK_RUN_ID");
    cmd
}

/// Start time (clock ticks since boot, `/proc/<pid>/stat` field 22) of a running process.
pub fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    stat[stat.rfind(')').expect(")") + 2..].split(' ').nth(19).expect("field").parse().expect("start time")
}

/// Makes the ring file `dir/<name>`, `lanes` lanes of `init.capacity` slots, with the
/// protocol's own writer (`meta`: the process's exe and argv): complete under a hidden name,
/// then renamed into place, so that a reader never sees it half made. `prepare` gets the
/// file first (to chmod or chown it). Returns the writer and the mapping (base, length),
/// which stays mapped until the caller unmaps it (or the process exits).
pub fn make_ring_file(
    dir: &Path,
    name: &str,
    init: &RingInit,
    lanes: u32,
    meta: &[u8],
    prepare: impl FnOnce(&std::fs::File, &Path),
) -> (RingWriter, *mut u8, usize) {
    let tmp = dir.join(format!(".{name}.tmp"));
    let len = ring_file_size_lanes(init.capacity, lanes);
    let file = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&tmp).expect("create ring");
    file.set_len(len as u64).expect("size the ring");
    prepare(&file, &tmp);
    let base = vramhook_protocol::mapped::map_shared_rw(&file, len).expect("mmap the ring");
    // SAFETY: a fresh (zero-filled) shared mapping of the size the header asks for.
    let writer = unsafe { RingWriter::init_lanes(base, init, lanes, meta) };
    std::fs::rename(&tmp, dir.join(name)).expect("rename the ring into place");
    (writer, base, len)
}

/// A ring file `dir/<pid>-<start>-0.ring` of `capacity` slots for the live process `pid`,
/// owned by this user, made with [`make_ring_file`] (header anchored now, `meta` as the
/// process's exe and argv). Returns the writer and the mapping, which stays mapped until the
/// caller unmaps it (or the process exits).
pub fn ring_file(dir: &Path, pid: u32, capacity: u64, meta: &[u8]) -> (RingWriter, *mut u8, usize) {
    let start = start_time(pid);
    let init = RingInit {
        capacity,
        pid,
        ppid: std::process::id(),
        // SAFETY: no preconditions.
        uid: unsafe { libc::geteuid() },
        start_time: start,
        run_id: 0,
        clock_source: 0,
        tsc_anchor: 0,
        mono_anchor_ns: vramhook_protocol::clock::monotonic_ns(),
        wall_anchor_ns: vramhook_protocol::clock::wall_ns(),
    };
    make_ring_file(dir, &format!("{pid}-{start}-0.ring"), &init, 1, meta, |_, _| {})
}

/// A fresh directory on tmpfs (or the temp dir where there is no `/dev/shm`).
pub fn shm_dir(tag: &str) -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() { base.to_path_buf() } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix(&format!("vramhook-{tag}-")).tempdir_in(base).expect("shm dir")
}

/// A child's stderr, collected line by line from the moment it starts.
#[derive(Clone, Default)]
pub struct StderrLog(Arc<Mutex<String>>);

impl StderrLog {
    /// Everything the child wrote to stderr so far.
    pub fn text(&self) -> String {
        self.0.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

/// Spawns `cmd` (its stderr piped here and collected) and waits up to `timeout` for a
/// stderr line starting with `prefix`; returns the child, its log, and the rest of that line.
pub fn spawn_until(cmd: &mut Command, prefix: &'static str, timeout: Duration) -> (Child, StderrLog, String) {
    let mut child = cmd.stderr(std::process::Stdio::piped()).spawn().expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let log = StderrLog::default();
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix(prefix) {
                let _ = tx.send(rest.trim().to_string());
            }
            if let Ok(mut l) = sink.0.lock() {
                l.push_str(&line);
                l.push('\n');
            }
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(rest) => (child, log, rest),
        Err(_) => panic!("no line `{prefix}…` within {timeout:?}; stderr so far:\n{}", log.text()),
    }
}

/// Starts `vramhook agent` (`cmd`, with its arguments) on a free loopback port and waits
/// up to `timeout` until it listens.
pub fn spawn_agent(mut cmd: Command, timeout: Duration) -> (Child, StderrLog, SocketAddr) {
    cmd.args(["--listen", "127.0.0.1:0"]).stdout(std::process::Stdio::null());
    let (child, log, addr) = spawn_until(&mut cmd, "vramhook agent: listening on ", timeout);
    (child, log, addr.parse().expect("listen address"))
}

/// GET `path` over plain HTTP/1.1: the body of a 200 answer (chunked or not), else the
/// status line and headers as the error.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no header end")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.to_string());
    }
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return dechunk(body);
    }
    Ok(body.to_string())
}

/// Decodes a chunked HTTP/1.1 body.
fn dechunk(mut body: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").ok_or("bad chunk header")?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).map_err(|e| e.to_string())?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).ok_or("short chunk")?);
        body = rest.get(size + 2..).ok_or("short chunk")?;
    }
}
