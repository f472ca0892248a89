//! Loading the BPF programs and attaching them to libcuda (aya 0.14).
//!
//! One uprobe (`vh_entry`) and one uretprobe (`vh_return`) are attached to each probed
//! function of each distinct libcuda file, for all processes (the cookie says which
//! function); the programs themselves keep only the processes wanted (`targets`, or all
//! with `trace_all`). Dropping [`Probes`] closes every link and program: nothing stays in
//! the kernel after the agent stops, however it stops.

use crate::decode::{PROBED, WIRE_SIZE};
use crate::targets::{FileId, Library};
use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::UProbe;
use aya::{Ebpf, EbpfLoader};
use std::collections::BTreeMap;
use std::io;

/// The BPF object built by build.rs from bpf/vramhook.bpf.c.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/vramhook.bpf.o"));

/// Why eBPF mode cannot run, in one line naming what is missing.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "eBPF mode needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN, or root); this process has {have} \
         (run as root, or grant them: setcap cap_bpf,cap_perfmon+ep vramhook)"
    )]
    Capability { have: String },
    #[error("eBPF mode needs a kernel with uprobe perf events (CONFIG_UPROBE_EVENTS, Linux 4.17+): {0}")]
    NoUprobePmu(String),
    #[error("eBPF mode needs the bpf() system call (CONFIG_BPF_SYSCALL): {0}")]
    NoBpf(String),
    #[error("eBPF mode needs BPF ring buffers (Linux 5.8+): creating the `events` ring buffer failed: {0}")]
    NoRingBuf(String),
    #[error(
        "eBPF mode: the kernel refused the BPF programs ({0}); it needs CONFIG_BPF_EVENTS and, for uprobe \
         attach cookies, Linux 5.15+"
    )]
    Load(String),
    #[error("eBPF mode: loading the BPF programs was not permitted ({0}): needs CAP_BPF and CAP_PERFMON, or root")]
    Permission(String),
    #[error("eBPF mode: cannot attach to {path}: {reason}")]
    Attach { path: String, reason: String },
}

/// The errno somewhere in an error's chain, if any.
fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            if let Some(code) = io.raw_os_error() {
                return Some(code);
            }
        }
        cur = err.source();
    }
    None
}

/// An error and its causes, each said once: a cause whose text the message already carries
/// (`cannot listen on ADDR: {source}`) is not repeated after it. `vramhook agent` says its
/// errors so too (`vramhook_agent::error_chain`).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let t = err.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = err.source();
    }
    s
}

/// The full chain of an error as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    // Verifier logs can be long: one line.
    error_chain(e).lines().next().unwrap_or("").chars().take(300).collect()
}

/// Effective capabilities of this process (`CapEff` in /proc/self/status).
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Checks what can be checked before loading: capabilities and the uprobe PMU.
pub fn preflight() -> Result<(), ProbeError> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        let mut have: Vec<&str> = Vec::new();
        if has(CAP_BPF) {
            have.push("CAP_BPF");
        }
        if has(CAP_PERFMON) {
            have.push("CAP_PERFMON");
        }
        let have = if have.is_empty() { "neither".to_string() } else { format!("only {}", have.join(" and ")) };
        return Err(ProbeError::Capability { have });
    }
    let pmu = "/sys/bus/event_source/devices/uprobe/type";
    if let Err(e) = std::fs::read_to_string(pmu) {
        return Err(ProbeError::NoUprobePmu(format!("{pmu}: {e}")));
    }
    Ok(())
}

/// Counters the BPF programs keep (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BpfCounters {
    /// Events lost because the ring buffer was full.
    pub ringbuf_full: u64,
    /// Returns whose entry was not found (attached mid-call, or evicted).
    pub unmatched_returns: u64,
    /// Memory calls made inside another memory call (not recorded, as in the interposer).
    pub nested: u64,
}

/// The loaded programs, their links, and the maps the agent reads and writes.
pub struct Probes {
    // Field order matters for drop: links and programs go with `bpf`.
    events: RingBuf<MapData>,
    targets: HashMap<MapData, u32, u32>,
    lost: HashMap<MapData, u32, u64>,
    counters: PerCpuArray<MapData, u64>,
    /// Library files probed, with the monotonic ns when their probes were in place.
    attached: BTreeMap<FileId, u64>,
    /// Functions a library lacked (older drivers): `(file, name)`.
    pub missing: Vec<(FileId, &'static str)>,
    links: usize,
    bpf: Ebpf,
}

impl Probes {
    /// Loads the programs (`trace_all`: every process that maps a probed library;
    /// otherwise only the tgids added with [`Probes::add_target`]).
    pub fn load(trace_all: bool) -> Result<Probes, ProbeError> {
        preflight()?;
        raise_memlock();
        let flag: u32 = u32::from(trace_all);
        let mut bpf = EbpfLoader::new().override_global("trace_all", &flag, true).load(OBJECT).map_err(|e| {
            let line = chain(&e);
            match errno_of(&e) {
                Some(libc::EPERM) | Some(libc::EACCES) => ProbeError::Permission(line),
                Some(libc::ENOSYS) => ProbeError::NoBpf(line),
                Some(libc::EINVAL) if line.contains("events") => ProbeError::NoRingBuf(line),
                _ => ProbeError::Load(line),
            }
        })?;
        for (name, ret) in [("vh_entry", false), ("vh_return", true)] {
            let prog: &mut UProbe = bpf
                .program_mut(name)
                .ok_or_else(|| ProbeError::Load(format!("program {name} missing from the object")))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| ProbeError::Load(chain(&e)))?;
            prog.load().map_err(|e| {
                let line = chain(&e);
                match errno_of(&e) {
                    Some(libc::EPERM) | Some(libc::EACCES) => ProbeError::Permission(line),
                    _ => ProbeError::Load(format!("{} {name}: {line}", if ret { "uretprobe" } else { "uprobe" })),
                }
            })?;
        }
        let take = |bpf: &mut Ebpf, name: &str| {
            bpf.take_map(name).ok_or_else(|| ProbeError::Load(format!("map {name} missing from the object")))
        };
        let events = RingBuf::try_from(take(&mut bpf, "events")?).map_err(|e| ProbeError::NoRingBuf(chain(&e)))?;
        let targets = HashMap::try_from(take(&mut bpf, "targets")?).map_err(|e| ProbeError::Load(chain(&e)))?;
        let lost = HashMap::try_from(take(&mut bpf, "lost")?).map_err(|e| ProbeError::Load(chain(&e)))?;
        let counters = PerCpuArray::try_from(take(&mut bpf, "counters")?).map_err(|e| ProbeError::Load(chain(&e)))?;
        Ok(Probes { events, targets, lost, counters, attached: BTreeMap::new(), missing: Vec::new(), links: 0, bpf })
    }

    /// Whether this library file is probed already, and since when (monotonic ns).
    pub fn attached_since(&self, file: FileId) -> Option<u64> {
        self.attached.get(&file).copied()
    }

    /// Probe links in place (two per probed function and library).
    pub fn links(&self) -> usize {
        self.links
    }

    /// Kernel ids of these probes' programs (to check, after they are dropped, that
    /// nothing of theirs stayed loaded).
    pub fn program_ids(&self) -> std::collections::BTreeSet<u32> {
        self.bpf.programs().filter_map(|(_, p)| p.info().ok()).map(|i| i.id()).collect()
    }

    /// Attaches the probes to every probed function `lib` exports. Functions an older
    /// driver lacks are listed in `missing`; a library with none of them is an error.
    /// Returns the monotonic ns when its probes were all in place.
    pub fn attach_library(&mut self, lib: &Library) -> Result<u64, ProbeError> {
        if let Some(t) = self.attached.get(&lib.file) {
            return Ok(*t);
        }
        let mut attached_fns = 0usize;
        let mut first_error: Option<String> = None;
        for api in PROBED {
            let mut ok = true;
            for name in ["vh_entry", "vh_return"] {
                let Some(prog) = self.bpf.program_mut(name) else { continue };
                let Ok(prog) = <&mut UProbe>::try_from(prog) else { continue };
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::Symbol(api.name()),
                    cookie: Some(u64::from(api.code())),
                };
                match prog.attach(point, &lib.path, UProbeScope::AllProcesses) {
                    Ok(_) => self.links += 1,
                    Err(e) => {
                        ok = false;
                        let line = chain(&e);
                        if matches!(errno_of(&e), Some(libc::EPERM) | Some(libc::EACCES)) {
                            return Err(ProbeError::Attach {
                                path: lib.path.display().to_string(),
                                reason: format!("{line} (needs CAP_PERFMON, or root)"),
                            });
                        }
                        first_error.get_or_insert(line);
                        break;
                    }
                }
            }
            if ok {
                attached_fns += 1;
            } else {
                self.missing.push((lib.file, api.name()));
            }
        }
        if attached_fns == 0 {
            return Err(ProbeError::Attach {
                path: lib.path.display().to_string(),
                reason: first_error.unwrap_or_else(|| "no probed function found".into()),
            });
        }
        let now = crate::targets::clock_ns(libc::CLOCK_MONOTONIC);
        self.attached.insert(lib.file, now);
        Ok(now)
    }

    /// Traces process `tgid` (when not tracing all).
    pub fn add_target(&mut self, tgid: u32) -> Result<(), ProbeError> {
        self.targets
            .insert(tgid, 1, 0)
            .map_err(|e| ProbeError::Attach { path: format!("process {tgid}"), reason: chain(&e) })
    }

    /// Stops tracing `tgid` and forgets its lost count (its process is gone).
    pub fn forget(&mut self, tgid: u32) {
        let _ = self.targets.remove(&tgid);
        let _ = self.lost.remove(&tgid);
    }

    /// Events of `tgid` lost because the ring buffer was full, so far.
    pub fn lost(&self, tgid: u32) -> u64 {
        self.lost.get(&tgid, 0).unwrap_or(0)
    }

    pub fn counters(&self) -> BpfCounters {
        let sum =
            |i: u32| self.counters.get(&i, 0).map(|v| v.iter().copied().fold(0u64, u64::wrapping_add)).unwrap_or(0);
        BpfCounters { ringbuf_full: sum(0), unmatched_returns: sum(1), nested: sum(2) }
    }

    /// Hands up to `max` ring-buffer records to `f` (each exactly as the kernel holds it;
    /// the callee validates). Returns how many were read.
    pub fn drain(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.events.next() else { break };
            f(&item[..item.len().min(WIRE_SIZE * 2)]);
            n += 1;
        }
        n
    }
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK: lift it (best effort).
fn raise_memlock() {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit with a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// Names of the BPF programs this crate loads (to check that none is left after stop).
pub const PROGRAM_NAMES: [&str; 2] = ["vh_entry", "vh_return"];

/// How many programs with our names are loaded in the kernel now (any process's).
pub fn loaded_program_count() -> usize {
    aya::programs::loaded_programs()
        .flatten()
        .filter(|p| p.name_as_str().is_some_and(|n| PROGRAM_NAMES.contains(&n)))
        .count()
}

/// Ids of the BPF programs process `pid` holds open (from `/proc/<pid>/fdinfo`), so that a
/// check for programs left behind looks at one process's, not at others' loaded meanwhile.
pub fn program_ids_held_by(pid: u32) -> std::collections::BTreeSet<u32> {
    let mut ids = std::collections::BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return ids };
    for entry in entries.flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else { continue };
        ids.extend(
            info.lines().filter_map(|l| l.strip_prefix("prog_id:")).filter_map(|v| v.trim().parse::<u32>().ok()),
        );
    }
    ids
}

/// Of `ids`, how many programs are still loaded in the kernel.
pub fn still_loaded(ids: &std::collections::BTreeSet<u32>) -> usize {
    aya::programs::loaded_programs().flatten().filter(|p| ids.contains(&p.id())).count()
}
