//! Hostile input files for the analyzer: small captures and pickles that used to cost far
//! more than their size (memory, time, stack), written straight to disk a piece at a time
//! (so that the process that makes them stays small: a child forked from it starts with
//! its memory, and the peak memory measured for the child would include it). Shared by
//! `tests/hostile_files.rs` (bounds in counts and peak memory) and the `hostile` benchmark
//! (times, never asserted).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::{Command, Output};
use vramhook_protocol::capture::{CaptureHeader, CaptureWriter, ProcessEnd, ProcessInfo};
use vramhook_protocol::record::{Api, Event, CUDA_ERROR_OUT_OF_MEMORY};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

fn header() -> CaptureHeader {
    CaptureHeader {
        version: 1,
        mono_anchor_ns: 1_000,
        wall_anchor_ns: 1_700_000_000_000_000_000,
        flags: 0,
        host: "hostile".into(),
    }
}

/// A sealed capture of `events` (frames of at most 4,096 events, then the end frame).
pub fn capture_of(events: &[Event]) -> Vec<u8> {
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("header");
    w.write_events(events).expect("events");
    w.finish().expect("finish")
}

/// Writes a sealed capture of `n` events made by `event(i)` to `path`, 4,096 at a time.
/// Returns its size.
pub fn write_capture(path: &Path, n: u64, event: impl Fn(u64) -> Event) -> u64 {
    let mut w = CaptureWriter::new(BufWriter::new(File::create(path).expect("create")), &header()).expect("header");
    let mut chunk = Vec::with_capacity(4096);
    for i in 0..n {
        chunk.push(event(i));
        if chunk.len() == 4096 {
            w.write_events(&chunk).expect("events");
            chunk.clear();
        }
    }
    w.write_events(&chunk).expect("events");
    let size = w.bytes_written();
    w.finish().expect("finish").flush().expect("flush");
    size + 32
}

/// `e` made by `pid`'s main thread at `ts` (also its sequence number) on `device`.
pub fn made(e: Event, pid: u32, ts: u64, device: i16) -> Event {
    e.by(pid, pid).at(ts).with_seq(ts).on_device(device)
}

pub fn alloc(pid: u32, ts: u64, device: i16, addr: u64, size: u64) -> Event {
    made(Event::alloc(Api::cuMemAlloc_v2, addr, size), pid, ts, device)
}

pub fn oom(pid: u32, ts: u64, device: i16, size: u64) -> Event {
    made(Event::alloc(Api::cuMemAlloc_v2, 0, size).with_result(CUDA_ERROR_OUT_OF_MEMORY), pid, ts, device)
}

pub fn meminfo(pid: u32, ts: u64, device: i16, free: u64, total: u64) -> Event {
    made(Event::mem_info(free, total), pid, ts, device)
}

/// `n` OOM failures of one process, each followed by the device sample the interposer
/// takes, 3 s apart (so each is its own incident): 2 × 64 bytes per OOM.
pub fn many_ooms(path: &Path, n: u64) -> u64 {
    write_capture(path, 2 * n, |i| {
        let ts = 1_000_000 + (i / 2) * 3_000_000_000;
        if i % 2 == 0 {
            oom(100, ts, 0, 200 * GIB)
        } else {
            meminfo(100, ts + 1, 0, 10 * GIB, 16 * GIB)
        }
    })
}

/// `n` processes, one allocation each: 64 bytes per process.
pub fn many_processes(path: &Path, n: u64) -> u64 {
    write_capture(path, n, |i| alloc(1000 + i as u32, 1_000 + i * 1_000, 0, 0x7000_0000_0000 + i * 4096, 4096))
}

/// `n` processes, each allocating once and exiting: 128 bytes per process.
pub fn many_processes_exiting(path: &Path, n: u64) -> u64 {
    write_capture(path, 2 * n, |i| {
        let (pid, ts) = (1000 + (i / 2) as u32, 1_000 + i * 1_000);
        if i % 2 == 0 {
            alloc(pid, ts, 0, 0x7000_0000_0000 + i * 4096, 4096)
        } else {
            made(Event::process_exit(), pid, ts, 0)
        }
    })
}

/// `n` processes as `vramhook run` records them: a process frame, one allocation, a
/// process-end frame each (about 240 bytes per process).
pub fn many_process_ends(path: &Path, n: u64) -> u64 {
    let mut w = CaptureWriter::new(BufWriter::new(File::create(path).expect("create")), &header()).expect("header");
    for i in 0..n {
        let pid = 1000 + i as u32;
        let info = ProcessInfo { pid, exe: "/bin/worker".into(), cmdline: vec!["worker".into()], ..Default::default() };
        w.write_process(&info).expect("process");
        w.write_events(&[alloc(pid, 1_000 + i * 1_000, 0, 0x7000_0000_0000 + i * 4096, 4096)]).expect("events");
        let end =
            ProcessEnd { pid, exit_status: Some(0), ts_ns: 1_500 + i * 1_000, delivered: 1, ..Default::default() };
        w.write_process_end(&end).expect("end");
    }
    let size = w.bytes_written();
    w.finish().expect("finish").flush().expect("flush");
    size + 32
}

/// `n` processes, each failing one allocation with out-of-memory: 64 bytes per process.
pub fn many_processes_with_an_oom(path: &Path, n: u64) -> u64 {
    write_capture(path, n, |i| oom(1000 + i as u32, 1_000 + i * 1_000, 0, 200 * GIB))
}

/// `n` processes that each hold 1 MiB on device 0 and then fail once: 128 bytes per process.
pub fn holders_each_failing(path: &Path, n: u64) -> u64 {
    write_capture(path, 2 * n, |i| {
        let (pid, ts) = (1000 + (i / 2) as u32, 1_000 + i * 1_000);
        if i % 2 == 0 {
            alloc(pid, ts, 0, 0x7000_0000_0000 + i * MIB, MIB)
        } else {
            oom(pid, ts, 0, 200 * GIB)
        }
    })
}

/// One process with `arenas` mapped VMM reservations of 2 MiB, then `ooms` failures, each
/// of its own size (not retries): 64 bytes per event.
pub fn arenas_and_ooms(f: &Path, arenas: u64, ooms: u64) -> u64 {
    write_capture(f, 3 * arenas + ooms, |i| {
        let ts = 1_000 + i;
        if i < 3 * arenas {
            let (k, addr) = (i / 3, 0x7000_0000_0000 + (i / 3) * 4 * MIB);
            let e = match i % 3 {
                0 => Event::vmm_reserve(addr, 2 * MIB, 0, 0),
                1 => Event::vmm_create(Api::cuMemCreate, 0x100 + k, 2 * MIB),
                _ => Event::vmm_map(addr, 2 * MIB, 0x100 + k, 0),
            };
            made(e, 7, ts, 0)
        } else {
            oom(7, ts, 0, 64 * GIB + i * 4096) // each its own request: not a retry
        }
    })
}

/// One process allocating 4 KiB on each of `n` distinct device numbers: 64 bytes per device.
pub fn many_devices(path: &Path, n: u64) -> u64 {
    write_capture(path, n, |i| {
        // 0, 1, … 32,767, then -2, -3, … (-1 means "unknown device").
        let device = if i < 32_768 { i as i16 } else { (-(i as i64 - 32_768) - 2) as i16 };
        alloc(100, 1_000 + i * 1_000, device, 0x7000_0000_0000 + i * 4096, 4096)
    })
}

/// A hand-written pickle (protocol 2 opcodes, as `pickle.dumps` makes them), written to a
/// file a megabyte at a time.
pub struct Pickler {
    out: Vec<u8>,
    file: BufWriter<File>,
    written: u64,
    memo: u32,
}

impl Pickler {
    pub fn new(path: &Path) -> Pickler {
        Pickler { out: vec![0x80, 2], file: BufWriter::new(File::create(path).expect("create")), written: 0, memo: 0 }
    }
    /// Bytes so far.
    pub fn len(&self) -> u64 {
        self.written + self.out.len() as u64
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn spill(&mut self) {
        if self.out.len() >= 1 << 20 {
            self.file.write_all(&self.out).expect("write");
            self.written += self.out.len() as u64;
            self.out.clear();
        }
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
        self
    }
    pub fn int(&mut self, v: u64) -> &mut Self {
        if v < 256 {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else {
            self.out.extend_from_slice(&[0x8a, 8]);
            self.out.extend_from_slice(&v.to_le_bytes());
        }
        self
    }
    /// Memoizes the top of the stack; returns its memo index.
    pub fn put(&mut self) -> u32 {
        let i = self.memo;
        self.memo += 1;
        self.out.push(b'r');
        self.out.extend_from_slice(&i.to_le_bytes());
        i
    }
    pub fn get(&mut self, i: u32) -> &mut Self {
        self.out.push(b'j');
        self.out.extend_from_slice(&i.to_le_bytes());
        self
    }
    pub fn op(&mut self, ops: &[u8]) -> &mut Self {
        self.out.extend_from_slice(ops);
        self.spill();
        self
    }
    /// Ends the pickle; returns its size.
    pub fn finish(mut self) -> u64 {
        self.out.push(b'.');
        self.file.write_all(&self.out).expect("write");
        self.file.flush().expect("flush");
        self.written + self.out.len() as u64
    }
}

/// A snapshot with `segments` segments and `ooms` trace entries that are all one memoized
/// `oom` dict (5 bytes each): every OOM used to hand every segment to the model again.
pub fn segments_and_shared_ooms(path: &Path, segments: u64, ooms: u64) -> u64 {
    let mut p = Pickler::new(path);
    p.op(b"}(");
    p.str("segments");
    p.op(b"](");
    let keys: Vec<u32> = ["device", "address", "total_size"]
        .iter()
        .map(|k| {
            p.str(k);
            let i = p.put();
            p.op(b"0");
            i
        })
        .collect();
    for i in 0..segments {
        p.op(b"}(");
        p.get(keys[0]).int(0);
        p.get(keys[1]).int(0x7F00_0000_0000 + i * 2 * MIB);
        p.get(keys[2]).int(2 * MIB);
        p.op(b"u");
        if i % 1000 == 999 {
            p.op(b"e(");
        }
    }
    p.op(b"e");
    p.str("device_traces");
    p.op(b"](](");
    p.op(b"}(");
    p.str("action").str("oom");
    p.str("size").int(64 * GIB);
    p.str("device_free").int(MIB);
    p.str("time_us").int(1_000_000);
    p.op(b"u");
    let e = p.put();
    p.op(b"0");
    for i in 0..ooms {
        p.get(e);
        if i % 1000 == 999 {
            p.op(b"e(");
        }
    }
    p.op(b"ee");
    p.op(b"u");
    p.finish()
}

/// About `bytes` of pickle: a snapshot whose one device trace is a memoized entry
/// referenced over and over (5 bytes a reference, in batches of 1,000 as `pickle` writes).
pub fn big_snapshot(path: &Path, bytes: u64) -> u64 {
    let mut p = Pickler::new(path);
    p.op(b"}(");
    p.str("segments");
    p.op(b"]");
    p.str("device_traces");
    p.op(b"](](");
    p.op(b"}(");
    p.str("action").str("alloc");
    p.str("addr").int(0x7F00_0000_0000);
    p.str("size").int(MIB);
    p.str("time_us").int(1_000_000);
    p.op(b"u");
    let e = p.put();
    p.op(b"0");
    let mut i = 0u64;
    while p.len() < bytes {
        p.get(e);
        i += 1;
        if i.is_multiple_of(1000) {
            p.op(b"e(");
        }
    }
    p.op(b"ee");
    p.op(b"u");
    p.finish()
}

/// A pickle of `depth` nested one-element tuples (one byte per level).
pub fn nested_tuples(path: &Path, depth: usize) -> u64 {
    let mut p = vec![0x80, 2, b')'];
    p.extend(std::iter::repeat_n(0x85u8, depth));
    p.push(b'.');
    std::fs::write(path, &p).expect("write");
    p.len() as u64
}

/// A `Dropped` marker as the agent writes them: `size` events lost, `aux` of them slots
/// (lost in flight, or skipped by a restarted reader).
pub fn dropped(pid: u32, ts: u64, size: u64, aux: u64) -> Event {
    made(Event::dropped(size, aux), pid, ts, -1)
}

/// A process-end frame payload helper: a capture of one process that restarted its reader.
pub fn with_process(events: &[Event], info: &ProcessInfo, end: Option<&ProcessEnd>) -> Vec<u8> {
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("header");
    w.write_process(info).expect("process");
    w.write_events(events).expect("events");
    if let Some(end) = end {
        w.write_process_end(end).expect("end");
    }
    w.finish().expect("finish")
}

/// What a child run cost: its output and its peak resident memory (`ru_maxrss`, KiB).
pub struct Measured {
    pub output: Output,
    pub max_rss_kib: u64,
    pub wall: std::time::Duration,
}

/// The `peak_rss` helper of this crate (built with its integration tests), when built.
pub fn peak_rss_bin() -> Option<std::path::PathBuf> {
    let p = crate::profile_dir().join("peak_rss");
    p.is_file().then_some(p)
}

/// Runs `cmd` and measures its peak memory: through the small `peak_rss` helper when it is
/// built (a child forked straight from a large test process would start from that process's
/// memory), else with `wait4` here.
pub fn run_measured(cmd: &mut Command) -> Measured {
    use std::process::Stdio;
    let start = std::time::Instant::now();
    if let Some(helper) = peak_rss_bin() {
        let out = tempfile::NamedTempFile::new().expect("temp file");
        let mut wrapped = Command::new(helper);
        wrapped.arg(out.path()).arg(cmd.get_program()).args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        let output = wrapped.stdin(Stdio::null()).output().expect("run peak_rss");
        let wall = start.elapsed();
        let max_rss_kib =
            std::fs::read_to_string(out.path()).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(u64::MAX);
        return Measured { output, max_rss_kib, wall };
    }
    run_measured_here(cmd, start)
}

fn run_measured_here(cmd: &mut Command, start: std::time::Instant) -> Measured {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let mut stdout = Vec::new();
    let _ = out.read_to_end(&mut stdout);
    let stderr = t.join().unwrap_or_default();
    let mut status = 0;
    // SAFETY: a zeroed rusage filled by wait4 for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(rc, pid, "wait4");
    let wall = start.elapsed();
    // Reaped by wait4: nothing left for Child to wait for.
    std::mem::forget(child);
    Measured {
        output: Output { status: std::process::ExitStatus::from_raw(status), stdout, stderr },
        max_rss_kib: ru.ru_maxrss as u64,
        wall,
    }
}

/// `vramhook analyze --json FILE` (plus `extra`), measured.
pub fn analyze_json(bin: &Path, file: &Path, extra: &[&str]) -> (Measured, Option<serde_json::Value>) {
    let m = run_measured(Command::new(bin).arg("analyze").arg("--json").args(extra).arg(file));
    let json = serde_json::from_slice(&m.output.stdout).ok();
    (m, json)
}
