//! NVML's per-process usage: who holds memory on each GPU, traced or not.
//!
//! `libnvidia-ml.so.1` is loaded with `dlopen` when a reader starts, so vramhook has no
//! build-time dependency on it; a host without it is told so once, as information. The
//! agent and `vramhook run` read it periodically and right after a failure ([`Sampler`],
//! on a thread of its own: an NVML call costs milliseconds, never spent while draining
//! rings), and write each device's list as `gpu_process` records ([`sample_events`]), which
//! the model uses to name the processes vramhook does not trace at an out-of-memory failure.
//!
//! NVML's figure for a process includes its CUDA context (and its libraries' workspaces),
//! not only its allocations. Device numbers are NVML's indexes (PCI order), which are
//! CUDA's ordinals when `CUDA_DEVICE_ORDER=PCI_BUS_ID` and no `CUDA_VISIBLE_DEVICES` reorders them.

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use vramhook_protocol::record::Event;

/// The library NVML ships as (the driver package's, found through the loader's path).
pub const LIBRARY: &CStr = c"libnvidia-ml.so.1";

type NvmlReturn = c_uint;
const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
/// `usedGpuMemory` when NVML cannot say (Windows WDDM, some containers).
const NVML_VALUE_NOT_AVAILABLE: u64 = u64::MAX;

type InitFn = unsafe extern "C" fn() -> NvmlReturn;
type CountFn = unsafe extern "C" fn(*mut c_uint) -> NvmlReturn;
type HandleFn = unsafe extern "C" fn(c_uint, *mut *mut c_void) -> NvmlReturn;
type ProcessesFn = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut c_void) -> NvmlReturn;

/// Devices read at most (NVML's own limit is far below).
const MAX_DEVICES: u32 = 64;
/// Processes read per device and list at most.
const MAX_PROCESSES: usize = 4096;
/// Entries asked for at first; an NVML_ERROR_INSUFFICIENT_SIZE answer says how many are needed.
const FIRST_CAPACITY: usize = 32;

/// One of the process-listing calls, with the size of its entries: `nvmlProcessInfo_t`
/// (v2, v3: `{pid, usedGpuMemory, gpuInstanceId, computeInstanceId}`, 24 bytes) or
/// `nvmlProcessInfo_v1_t` (`{pid, usedGpuMemory}`, 16 bytes). Both have the pid at offset 0
/// and the bytes at offset 8.
#[derive(Clone, Copy)]
struct ProcessesCall {
    f: ProcessesFn,
    stride: usize,
    name: &'static str,
}

/// A process using a device, as NVML lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// NVML's bytes for it on the device, context included (0 when NVML cannot say).
    pub bytes: u64,
    /// `/proc/PID/comm` (empty when the process is gone or in another pid namespace).
    pub command: String,
}

/// NVML, loaded and initialised.
pub struct Nvml {
    count: CountFn,
    handle: HandleFn,
    compute: ProcessesCall,
    graphics: Option<ProcessesCall>,
    shutdown: Option<InitFn>,
}

/// The address of `name` in the library `lib`, or null.
fn symbol(lib: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: `lib` is a handle dlopen returned (never closed), `name` a C string.
    unsafe { libc::dlsym(lib, name.as_ptr()) }
}

/// The first of `candidates` (name, entry size) the library exports.
fn processes_call(lib: *mut c_void, candidates: &[(&'static CStr, usize)]) -> Option<ProcessesCall> {
    candidates.iter().find_map(|(name, stride)| {
        let p = symbol(lib, name);
        (!p.is_null()).then(|| ProcessesCall {
            // SAFETY: NVML's process calls all have this signature
            // (nvmlDevice_t, unsigned int *infoCount, nvmlProcessInfo*_t *infos); the entry
            // size that goes with each name is passed along.
            f: unsafe { std::mem::transmute::<*mut c_void, ProcessesFn>(p) },
            stride: *stride,
            name: name.to_str().unwrap_or("?"),
        })
    })
}

/// The last `dlerror` text.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a C string valid until the next dl call on this thread.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Nvml {
    /// Loads `libnvidia-ml.so.1` and initialises it.
    pub fn open() -> Result<Nvml, String> {
        Nvml::open_library(LIBRARY)
    }

    /// Loads NVML from `library` (a name the loader looks up, or a path) and initialises it.
    /// The library stays loaded for the life of the process (NVML keeps threads of its own).
    pub fn open_library(library: &CStr) -> Result<Nvml, String> {
        // SAFETY: dlopen of a C string; the handle is kept for the life of the process.
        let lib = unsafe { libc::dlopen(library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(dl_error());
        }
        let need = |name: &CStr| {
            let p = symbol(lib, name);
            if p.is_null() {
                Err(format!("{} has no {}", library.to_string_lossy(), name.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        let (init, count, handle) =
            (need(c"nvmlInit_v2")?, need(c"nvmlDeviceGetCount_v2")?, need(c"nvmlDeviceGetHandleByIndex_v2")?);
        let shutdown = symbol(lib, c"nvmlShutdown");
        const V2: usize = 24;
        const V1: usize = 16;
        let compute = processes_call(
            lib,
            &[
                (c"nvmlDeviceGetComputeRunningProcesses_v3", V2),
                (c"nvmlDeviceGetComputeRunningProcesses_v2", V2),
                (c"nvmlDeviceGetComputeRunningProcesses", V1),
            ],
        )
        .ok_or_else(|| format!("{} has no nvmlDeviceGetComputeRunningProcesses", library.to_string_lossy()))?;
        let graphics = processes_call(
            lib,
            &[
                (c"nvmlDeviceGetGraphicsRunningProcesses_v3", V2),
                (c"nvmlDeviceGetGraphicsRunningProcesses_v2", V2),
                (c"nvmlDeviceGetGraphicsRunningProcesses", V1),
            ],
        );
        // SAFETY: the documented signatures of these NVML entry points: nvmlInit_v2(void),
        // nvmlShutdown(void), nvmlDeviceGetCount_v2(unsigned int *),
        // nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *).
        let nvml = unsafe {
            Nvml {
                count: std::mem::transmute::<*mut c_void, CountFn>(count),
                handle: std::mem::transmute::<*mut c_void, HandleFn>(handle),
                compute,
                graphics,
                shutdown: (!shutdown.is_null()).then(|| std::mem::transmute::<*mut c_void, InitFn>(shutdown)),
            }
        };
        // SAFETY: nvmlInit_v2 takes no argument (signature above).
        let r = unsafe { std::mem::transmute::<*mut c_void, InitFn>(init)() };
        if r != NVML_SUCCESS {
            // No nvmlShutdown for an init that failed (Drop would call it).
            let mut nvml = nvml;
            nvml.shutdown = None;
            return Err(format!("nvmlInit_v2 failed (NVML error {r})"));
        }
        Ok(nvml)
    }

    /// The process call used for compute processes (for the log).
    pub fn compute_call(&self) -> &'static str {
        self.compute.name
    }

    /// Devices NVML sees (`None` when it cannot say).
    pub fn device_count(&self) -> Option<u32> {
        let mut n: c_uint = 0;
        // SAFETY: nvmlDeviceGetCount_v2 writes one unsigned int.
        let r = unsafe { (self.count)(&mut n) };
        (r == NVML_SUCCESS).then_some(n.min(MAX_DEVICES))
    }

    /// Every device's processes, by NVML device index; a device NVML could not list is left
    /// out (nothing is said about it, rather than "nobody").
    pub fn sample(&self) -> Vec<(u32, Vec<GpuProcess>)> {
        let Some(n) = self.device_count() else { return Vec::new() };
        (0..n).filter_map(|i| Some((i, self.device_processes(i)?))).collect()
    }

    /// The processes on device `index`: compute processes, and graphics ones (a desktop, a
    /// game) where NVML lists them. A process in both lists counts once, with its larger
    /// figure (NVML gives its whole usage in each).
    fn device_processes(&self, index: u32) -> Option<Vec<GpuProcess>> {
        let mut device: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one nvmlDevice_t (an opaque pointer) into `device`.
        if unsafe { (self.handle)(index, &mut device) } != NVML_SUCCESS || device.is_null() {
            return None;
        }
        let mut by_pid: BTreeMap<u32, u64> = BTreeMap::new();
        for (pid, bytes) in list(self.compute, device)? {
            let e = by_pid.entry(pid).or_default();
            *e = e.saturating_add(bytes); // one entry per MIG instance it uses
        }
        if let Some(graphics) = self.graphics {
            for (pid, bytes) in list(graphics, device).unwrap_or_default() {
                let e = by_pid.entry(pid).or_default();
                *e = (*e).max(bytes);
            }
        }
        Some(by_pid.into_iter().map(|(pid, bytes)| GpuProcess { pid, bytes, command: command_of(pid) }).collect())
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown {
            // SAFETY: nvmlShutdown takes no argument; one per successful nvmlInit_v2.
            unsafe { shutdown() };
        }
    }
}

/// One call's list of (pid, bytes) on `device`, growing the buffer while NVML answers
/// NVML_ERROR_INSUFFICIENT_SIZE (processes may start between two calls). `None`: NVML
/// could not list them.
fn list(call: ProcessesCall, device: *mut c_void) -> Option<Vec<(u32, u64)>> {
    let mut capacity = FIRST_CAPACITY;
    for _ in 0..4 {
        // u64 words: 8-byte aligned, as both entry layouts need.
        let mut buf = vec![0u64; capacity * call.stride / 8];
        let mut count = capacity as c_uint;
        // SAFETY: `buf` holds `capacity` entries of `call.stride` bytes, the size of the
        // struct this call writes; NVML writes at most `count` entries and sets `count`.
        let r = unsafe { (call.f)(device, &mut count, buf.as_mut_ptr().cast()) };
        match r {
            NVML_SUCCESS => {
                let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
                let n = (count as usize).min(capacity);
                return Some(
                    bytes
                        .chunks_exact(call.stride)
                        .take(n)
                        .map(|e| {
                            let pid = u32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
                            let mut used = [0u8; 8];
                            used.copy_from_slice(&e[8..16]);
                            let used = u64::from_ne_bytes(used);
                            (pid, if used == NVML_VALUE_NOT_AVAILABLE { 0 } else { used })
                        })
                        .filter(|(pid, _)| *pid != 0)
                        .collect(),
                );
            }
            NVML_ERROR_INSUFFICIENT_SIZE if capacity < MAX_PROCESSES => {
                // Room for what NVML said, and for a few that start meanwhile.
                capacity = (count as usize).saturating_add(8).max(capacity * 2).min(MAX_PROCESSES);
            }
            _ => return None,
        }
    }
    None
}

/// The command name of `pid` (`/proc/PID/comm`, at most 16 bytes; empty when unknown).
pub fn command_of(pid: u32) -> String {
    let comm = std::fs::read(format!("/proc/{pid}/comm")).unwrap_or_default();
    let comm = comm.strip_suffix(b"\n").unwrap_or(&comm);
    String::from_utf8_lossy(&comm[..comm.len().min(16)]).into_owned()
}

/// The `gpu_process` records of one sample, numbered `seq`, stamped `ts_ns` (the reader's
/// `CLOCK_MONOTONIC`, the ring events' time base): per device, one record per process (each
/// carrying the device's count), or one record of holder 0 and count 0 when NVML listed none.
pub fn sample_events(seq: u64, ts_ns: u64, devices: &[(u32, Vec<GpuProcess>)]) -> Vec<Event> {
    let mut out = Vec::new();
    for (index, procs) in devices {
        let Ok(device) = i16::try_from(*index) else { continue };
        if procs.is_empty() {
            out.push(Event::gpu_process(seq, 0, 0, 0, b"").at(ts_ns).on_device(device));
            continue;
        }
        let n = procs.len().min(MAX_PROCESSES) as u32;
        for p in procs.iter().take(MAX_PROCESSES) {
            out.push(Event::gpu_process(seq, n, p.pid, p.bytes, p.command.as_bytes()).at(ts_ns).on_device(device));
        }
    }
    out
}

/// Least time between two reads, whatever asks: a process failing call after call cannot
/// keep the reader in NVML.
const MIN_GAP: Duration = Duration::from_millis(100);

/// NVML read on a thread of its own: every `interval`, and at once when asked
/// ([`Sampler::request`], right after a failure). The samples, as `gpu_process` records,
/// wait in a channel for the thread that owns the model ([`Sampler::take`]).
pub struct Sampler {
    requests: mpsc::Sender<()>,
    samples: mpsc::Receiver<Vec<Event>>,
    /// Cleared when the reading thread ends (no NVML): nothing more will come.
    running: Arc<AtomicBool>,
}

impl Sampler {
    /// Starts the reader. `who` begins its lines on stderr (`vramhook agent`); when NVML is
    /// not there it says so once and reads nothing; when it is, it says so only if
    /// `announce`. `None` when `interval` is zero (off).
    pub fn spawn(interval: Duration, who: &'static str, announce: bool) -> Option<Sampler> {
        Sampler::spawn_with(interval, who, announce, LIBRARY)
    }

    /// [`Sampler::spawn`] with NVML loaded from `library`.
    pub fn spawn_with(
        interval: Duration,
        who: &'static str,
        announce: bool,
        library: &'static CStr,
    ) -> Option<Sampler> {
        if interval.is_zero() {
            return None;
        }
        let (requests, requested) = mpsc::channel::<()>();
        let (sent, samples) = mpsc::channel();
        let running = Arc::new(AtomicBool::new(true));
        let flag = running.clone();
        let spawned = std::thread::Builder::new().name("vramhook-nvml".into()).spawn(move || {
            read_loop(interval, who, announce, library, requested, sent);
            flag.store(false, Ordering::Release);
        });
        if let Err(e) = spawned {
            eprintln!("{who}: cannot start the NVML reader: {e}");
            return None;
        }
        Some(Sampler { requests, samples, running })
    }

    /// Whether the reader still reads (false once it found no NVML).
    pub fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Asks for a read now (a failure was just seen); reads are at least 100 ms apart.
    /// False when the reader is gone (no NVML).
    pub fn request(&self) -> bool {
        self.running() && self.requests.send(()).is_ok()
    }

    /// The records of every sample read since the last call (none: nothing new).
    pub fn take(&self) -> Vec<Event> {
        self.samples.try_iter().flatten().collect()
    }

    /// The records of the next sample to come, waiting up to `timeout` (a reader that ends
    /// right after a failure waits for the read it asked for); `None` when none came (or the
    /// reader is gone: no NVML).
    pub fn wait(&self, timeout: Duration) -> Option<Vec<Event>> {
        self.samples.recv_timeout(timeout).ok()
    }
}

/// Longest a reader waits for the read it asked for after a failure before it goes on as if
/// none were coming (the model takes a sample up to 2 s after a failure as describing it).
pub const OWED_WAIT: Duration = Duration::from_secs(1);

/// A [`Sampler`] as a reader uses it: after each poll, a read asked for when the poll
/// delivered an out-of-memory failure, and whatever samples came. Until the read asked for
/// comes (at most [`OWED_WAIT`]), the failure is [`Feed::owed`] its holders: the agent holds
/// its next snapshot back, so that the incident is counted and exported with them, and
/// `vramhook run` waits for it before it ends.
pub struct Feed {
    sampler: Sampler,
    /// When a read was asked for after a failure (`CLOCK_MONOTONIC` ns), and until when it is
    /// waited for.
    owed: Option<(u64, Instant)>,
}

impl Feed {
    /// See [`Sampler::spawn`].
    pub fn spawn(interval: Duration, who: &'static str, announce: bool) -> Option<Feed> {
        Some(Feed { sampler: Sampler::spawn(interval, who, announce)?, owed: None })
    }

    /// After a poll: asks for a read when it delivered a `failure`; returns the records of
    /// the samples read since the last call.
    pub fn poll(&mut self, failure: bool) -> Vec<Event> {
        if failure && self.sampler.request() {
            let now = vramhook_protocol::clock::monotonic_ns();
            self.owed.get_or_insert((now, Instant::now() + OWED_WAIT));
        }
        let events = self.sampler.take();
        self.settle(&events);
        events
    }

    /// Whether a read asked for after a failure is still to come.
    pub fn owed(&mut self) -> bool {
        if self.owed.is_some_and(|(_, until)| Instant::now() >= until || !self.sampler.running()) {
            self.owed = None;
        }
        self.owed.is_some()
    }

    /// Waits for the read owed to a failure (up to [`OWED_WAIT`] after it was asked for);
    /// the records of every sample that came meanwhile.
    pub fn finish(&mut self) -> Vec<Event> {
        let mut out = self.sampler.take();
        self.settle(&out);
        while let Some((_, until)) = self.owed {
            let Some(events) = self.sampler.wait(until.saturating_duration_since(Instant::now())) else { break };
            self.settle(&events);
            out.extend(events);
        }
        self.owed = None;
        out
    }

    /// A sample read since the failure pays what was owed.
    fn settle(&mut self, events: &[Event]) {
        if self.owed.is_some_and(|(since, _)| events.iter().any(|e| e.ts_ns >= since)) {
            self.owed = None;
        }
    }
}

fn read_loop(
    interval: Duration,
    who: &'static str,
    announce: bool,
    library: &'static CStr,
    requested: mpsc::Receiver<()>,
    sent: mpsc::Sender<Vec<Event>>,
) {
    let nvml = match Nvml::open_library(library) {
        Ok(n) => n,
        Err(e) => {
            eprintln!(
                "{who}: NVML not available ({e}); processes vramhook does not trace are not named (the devices' \
                 untraced bytes are still stated)"
            );
            return;
        }
    };
    if announce {
        eprintln!(
            "{who}: NVML: {} device(s), per-process usage read every {:?} and at each out-of-memory failure ({})",
            nvml.device_count().unwrap_or(0),
            interval,
            nvml.compute_call()
        );
    }
    let far = |from: Instant| from.checked_add(interval).unwrap_or(from + Duration::from_secs(86_400));
    let mut next = Instant::now(); // the first read at once
    let mut last: Option<Instant> = None;
    let mut seq = 0u64;
    loop {
        match requested.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok(()) => {
                while requested.try_recv().is_ok() {} // one read answers every request so far
                if let Some(gap) = last.map(|l| l.elapsed()).filter(|e| *e < MIN_GAP) {
                    std::thread::sleep(MIN_GAP - gap);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        let devices = nvml.sample();
        let ts = vramhook_protocol::clock::monotonic_ns();
        // Sample numbers grow across restarts too (a recovered model keeps the last one).
        seq = seq.saturating_add(1).max(ts);
        last = Some(Instant::now());
        next = far(Instant::now());
        if sent.send(sample_events(seq, ts, &devices)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use vramhook_protocol::record::EventKind;

    fn fake(v1: bool) -> CString {
        let dir = vramhook_testkit::sim_dir();
        let path = if v1 { dir.join("nvml-v1/libnvidia-ml.so.1") } else { dir.join("libnvidia-ml.so.1") };
        CString::new(path.to_str().expect("utf-8 path")).expect("path")
    }

    /// The fake NVML reads `VRAMHOOK_SIM_NVML` at every call. The reading runs in a child
    /// process of this test binary with the variables set there (setting them here would
    /// race the other tests' threads).
    #[test]
    fn the_fake_nvml_is_read_with_every_call_version_and_a_growing_buffer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("nvml.txt");
        // 40 processes on device 1 (more than the first buffer holds); on device 0 the child
        // itself as compute and graphics (written by the child: it knows its pid), one whose
        // bytes NVML cannot say; nobody on device 2.
        let mut text = String::from("0 4000000 na # not available\n");
        for pid in 1..=40 {
            text.push_str(&format!("1 {} {}\n", 100_000 + pid, pid * 1_048_576));
        }
        std::fs::write(&file, text).expect("write");
        let _ = vramhook_testkit::sim_dir(); // built before the child needs it
                                             // The child test by its path in this test binary, wherever this module lives.
        let module = module_path!().split_once("::").map_or(module_path!(), |(_, rest)| rest);
        let child = format!("{module}::reads_the_fake_nvml_in_a_child");
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([child.as_str(), "--exact", "--nocapture", "--test-threads", "1"])
            .env("VRAMHOOK_TEST_NVML_CHILD", "1")
            .env("VRAMHOOK_SIM_NVML", &file)
            .env("VRAMHOOK_SIM_DEVICES", "3")
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("1 passed"), "the child ran the test: {stdout}");
        assert!(stdout.contains("checked both builds"), "{stdout}");
    }

    /// The child's half of the test above (does nothing in a plain test run).
    #[test]
    fn reads_the_fake_nvml_in_a_child() {
        if std::env::var_os("VRAMHOOK_TEST_NVML_CHILD").is_none() {
            return;
        }
        let file = std::env::var_os("VRAMHOOK_SIM_NVML").expect("set by the parent");
        let me = std::process::id();
        let mut text = std::fs::read_to_string(&file).expect("read");
        text.push_str(&format!("0 {me} 1000\n0 {me} 1500 g\n"));
        std::fs::write(&file, text).expect("write");
        for (v1, call) in
            [(false, "nvmlDeviceGetComputeRunningProcesses_v3"), (true, "nvmlDeviceGetComputeRunningProcesses")]
        {
            let nvml = Nvml::open_library(&fake(v1)).expect("fake NVML");
            assert_eq!(nvml.compute_call(), call);
            let s = nvml.sample();
            assert_eq!(s.iter().map(|(d, p)| (*d, p.len())).collect::<Vec<_>>(), vec![(0, 2), (1, 40), (2, 0)]);
            let comm = command_of(me);
            assert!(!comm.is_empty());
            assert_eq!(s[0].1[0], GpuProcess { pid: me, bytes: 1500, command: comm.clone() }, "the larger figure");
            assert_eq!((s[0].1[1].pid, s[0].1[1].bytes, s[0].1[1].command.as_str()), (4_000_000, 0, ""));
            assert_eq!(s[1].1[39], GpuProcess { pid: 100_040, bytes: 40 << 20, command: String::new() });
            let events = sample_events(7, 123, &s);
            assert_eq!(events.len(), 2 + 40 + 1);
            let e = &events[0];
            assert_eq!(e.kind(), Some(EventKind::GpuProcess));
            assert_eq!((e.seq, e.ts_ns, e.tid, e.pid, e.device), (7, 123, 2, 0, 0));
            assert_eq!((e.gpu_holder(), e.size, e.gpu_holder_name()), (me, 1500, comm.clone()));
            let none = events.last().expect("device 2");
            assert_eq!((none.device, none.gpu_holder(), none.tid, none.size), (2, 0, 0, 0));
        }
        println!("checked both builds");
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        let err = Nvml::open_library(c"libvramhook-no-such-nvml.so.1").err().expect("no such library");
        assert!(err.contains("libvramhook-no-such-nvml"), "{err}");
        assert!(Sampler::spawn(Duration::ZERO, "test", true).is_none(), "interval 0: off");
        // The reader says once that NVML is absent, and gives nothing.
        let s = Sampler::spawn_with(Duration::from_millis(10), "test", true, c"libvramhook-no-such-nvml.so.1")
            .expect("spawned");
        assert!(s.wait(Duration::from_secs(5)).is_none());
        assert!(s.take().is_empty());
        let start = Instant::now();
        while s.running() {
            assert!(start.elapsed() < Duration::from_secs(5), "the reader ends");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!s.request(), "nobody to ask");
        // A failure owes no read to a reader that is gone (the agent does not hold its snapshot).
        let mut feed = Feed { sampler: s, owed: Some((0, Instant::now() + Duration::from_secs(60))) };
        assert!(!feed.owed());
        assert!(feed.poll(true).is_empty());
        assert!(!feed.owed());
    }
}
