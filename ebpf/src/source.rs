//! The eBPF event source: attaches to the libcuda of the processes wanted, drains the
//! ring buffer, and hands on what the agent's model needs, in order: a process before
//! its events, its end after them (the same shape as the ring source's items).
//!
//! - A process is identified by tgid and start time (`/proc/<pid>/stat`), checked when it
//!   is first seen; pid reuse is noticed by the liveness check, which ends the old one.
//! - A process that also has a ring (LD_PRELOAD) is the ring's: its eBPF events are
//!   dropped and counted (`ring_won`). A process that has the interposer loaded but no
//!   ring yet (the ring is made at its first call, just after the driver returned, so the
//!   probe's copy of that call can arrive first) has its events held until its ring
//!   appears (then dropped) or `hold` passes (then delivered).
//! - A process that started before its probes were attached is announced with
//!   [`Item::Attached`]: its calls before then are unknown.

use crate::decode::decode;
use crate::probe::{ProbeError, Probes};
use crate::targets::{self, FileId, Library};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vramhook_protocol::capture::{ProcessEnd, ProcessInfo};
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_ring::dir::process_alive;

/// Which processes to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// Every process that maps libcuda, now or later.
    All,
    /// These processes only.
    Pids(Vec<u32>),
}

#[derive(Clone, Debug)]
pub struct SourceConfig {
    pub targets: Targets,
    /// Also probe these libcuda files from the start (with `All`, processes that load them
    /// later are traced from their first call). Common install paths are tried as well.
    pub libraries: Vec<PathBuf>,
    /// How often `/proc` is scanned for new processes and libraries.
    pub rescan: Duration,
    /// How often tracked processes are checked for exit, and lost counts read.
    pub liveness: Duration,
    /// How long events of a process with the interposer loaded wait for its ring.
    pub hold: Duration,
    /// Ring-buffer records read per poll.
    pub batch: usize,
    /// Device ordinal for events whose device a probe cannot know (plain allocations,
    /// device samples): `Some(0)` on a host with one GPU, else `None` (-1, unknown).
    pub single_device: Option<i16>,
}

impl SourceConfig {
    pub fn new(targets: Targets) -> SourceConfig {
        SourceConfig {
            targets,
            libraries: Vec::new(),
            rescan: Duration::from_secs(1),
            liveness: Duration::from_millis(100),
            hold: Duration::from_secs(2),
            batch: 65_536,
            single_device: (targets::nvidia_gpu_count() == 1).then_some(0),
        }
    }
}

/// Where libcuda is commonly installed (host paths; containers are reached per process).
pub const COMMON_LIBCUDA: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
];

/// What a poll hands on.
#[derive(Debug)]
pub enum Item<'a> {
    Process(&'a ProcessInfo),
    /// The process was running before its probes were attached at `since_ns` (monotonic):
    /// its allocations before then are unknown.
    Attached {
        pid: u32,
        start_time: u64,
        since_ns: u64,
    },
    Events(&'a [Event]),
    End(ProcessEnd),
}

/// The source's own counters (monotonic totals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceStats {
    pub events: u64,
    /// Ring-buffer records refused as malformed.
    pub malformed: u64,
    /// Events of processes that have a ring (LD_PRELOAD): the ring's count wins.
    pub ring_won: u64,
    /// Events lost because the ring buffer was full (also in each process's drops).
    pub lost: u64,
    /// Processes gone before they could be identified (their events are kept, under
    /// start time 0).
    pub unidentified: u64,
    pub processes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Ebpf,
    Ring,
    /// Interposer loaded, no ring yet: events held until the deadline, which starts at
    /// the first event held (a process that makes no call has nothing to decide yet).
    Pending(Option<Instant>),
}

struct Tracked {
    info: ProcessInfo,
    owner: Owner,
    announced: bool,
    /// Monotonic ns from which its calls are seen, when it started before that.
    attached_since: Option<u64>,
    seq: u64,
    delivered: u64,
    lost_reported: u64,
    held: Vec<Event>,
}

/// Held events per process at most (beyond: counted as lost).
const MAX_HELD: usize = 65_536;

pub struct EbpfSource {
    cfg: SourceConfig,
    probes: Probes,
    tracked: BTreeMap<u32, Tracked>,
    /// Pids mode: when each pid became a target (monotonic ns).
    target_since: BTreeMap<u32, u64>,
    /// Libraries that failed to attach (reported once).
    failed: BTreeMap<FileId, String>,
    last_scan: Instant,
    last_liveness: Instant,
    pub stats: SourceStats,
    /// One-line notes for the operator (attach failures, late rings), taken by the caller.
    notes: Vec<String>,
    ticks: u64,
}

impl EbpfSource {
    /// Loads the programs and attaches to what is there now. Fails with one clear line
    /// when eBPF cannot work here, or when a listed pid does not map libcuda.
    pub fn start(cfg: SourceConfig) -> Result<EbpfSource, ProbeError> {
        let probes = Probes::load(cfg.targets == Targets::All)?;
        let mut src = EbpfSource {
            cfg,
            probes,
            tracked: BTreeMap::new(),
            target_since: BTreeMap::new(),
            failed: BTreeMap::new(),
            last_scan: Instant::now(),
            last_liveness: Instant::now(),
            stats: SourceStats::default(),
            notes: Vec::new(),
            ticks: targets::clock_ticks(),
        };
        let mut paths: Vec<PathBuf> = src.cfg.libraries.clone();
        if src.cfg.targets == Targets::All {
            paths.extend(COMMON_LIBCUDA.iter().map(PathBuf::from));
        }
        for path in paths {
            use std::os::unix::fs::MetadataExt;
            let Ok(meta) = std::fs::metadata(&path) else {
                if src.cfg.libraries.contains(&path) {
                    return Err(ProbeError::Attach { path: path.display().to_string(), reason: "no such file".into() });
                }
                continue;
            };
            let lib = Library { path, file: FileId { dev: meta.dev(), ino: meta.ino() } };
            src.probes.attach_library(&lib)?;
        }
        if let Targets::Pids(pids) = &src.cfg.targets {
            let mut found = 0;
            let mut missing = Vec::new();
            for pid in pids.clone() {
                match targets::libcuda_of(pid) {
                    Some(lib) => {
                        src.probes.attach_library(&lib)?;
                        src.add_target(pid)?;
                        found += 1;
                    }
                    None => missing.push(pid),
                }
            }
            if found == 0 {
                let list: Vec<String> = missing.iter().map(|p| p.to_string()).collect();
                return Err(ProbeError::Attach {
                    path: format!("process {}", list.join(", ")),
                    reason: "libcuda not found in /proc/<pid>/maps (not running, or CUDA not loaded yet)".into(),
                });
            }
            for pid in missing {
                src.notes.push(format!(
                    "eBPF: process {pid} does not map libcuda (yet); looking again every {:?}",
                    src.cfg.rescan
                ));
            }
        }
        src.scan();
        Ok(src)
    }

    fn add_target(&mut self, pid: u32) -> Result<(), ProbeError> {
        if !self.target_since.contains_key(&pid) {
            self.probes.add_target(pid)?;
            self.target_since.insert(pid, targets::clock_ns(libc::CLOCK_MONOTONIC));
        }
        Ok(())
    }

    /// Probe links in place.
    pub fn links(&self) -> usize {
        self.probes.links()
    }

    /// Kernel ids of this source's programs.
    pub fn program_ids(&self) -> std::collections::BTreeSet<u32> {
        self.probes.program_ids()
    }

    /// Functions some library lacked (older drivers).
    pub fn missing_functions(&self) -> Vec<&'static str> {
        self.probes.missing.iter().map(|(_, n)| *n).collect()
    }

    pub fn bpf_counters(&self) -> crate::probe::BpfCounters {
        self.probes.counters()
    }

    /// Operator notes since the last call.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Finds processes that map libcuda, attaches to new library files, and registers
    /// the processes wanted (announced at the next poll).
    fn scan(&mut self) {
        self.last_scan = Instant::now();
        let found: Vec<(u32, Library)> = match &self.cfg.targets {
            Targets::All => targets::scan().into_iter().collect(),
            Targets::Pids(pids) => pids
                .iter()
                .filter(|p| !self.tracked.contains_key(p))
                .filter_map(|p| Some((*p, targets::libcuda_of(*p)?)))
                .collect(),
        };
        for (pid, lib) in found {
            if self.tracked.contains_key(&pid) || self.failed.contains_key(&lib.file) {
                continue;
            }
            let since = match self.probes.attach_library(&lib) {
                Ok(t) => t,
                Err(e) => {
                    self.notes.push(e.to_string());
                    self.failed.insert(lib.file, e.to_string());
                    continue;
                }
            };
            let since = if matches!(self.cfg.targets, Targets::Pids(_)) {
                if let Err(e) = self.add_target(pid) {
                    self.notes.push(e.to_string());
                    continue;
                }
                since.max(self.target_since.get(&pid).copied().unwrap_or(0))
            } else {
                since
            };
            self.track(pid, Some(since), &|_| false);
        }
    }

    /// Starts tracking `pid` (identity from /proc); `since`: when its probes were in place.
    fn track(&mut self, pid: u32, since: Option<u64>, ring_pids: &dyn Fn(u32) -> bool) {
        // A process gone before it was identified (a short one, reaped before this poll)
        // keeps its events, under start time 0 and no command; it ends at the next check.
        let facts = targets::proc_facts(pid).unwrap_or_default();
        if facts.start_time == 0 {
            self.stats.unidentified += 1;
        }
        let since = since.or_else(|| {
            let lib = targets::libcuda_of(pid)?;
            let t = self.probes.attached_since(lib.file)?;
            Some(t.max(self.target_since.get(&pid).copied().unwrap_or(0)))
        });
        // Started before the probes were in place? (start times are boot-clock ticks)
        let started_boot_ns = facts.start_time.saturating_mul(1_000_000_000) / self.ticks.max(1);
        let boot_minus_mono =
            targets::clock_ns(libc::CLOCK_BOOTTIME).saturating_sub(targets::clock_ns(libc::CLOCK_MONOTONIC));
        let attached_since =
            since.filter(|s| facts.start_time != 0 && started_boot_ns < s.saturating_add(boot_minus_mono));
        let owner = if ring_pids(pid) {
            Owner::Ring
        } else if targets::has_interposer(pid) {
            Owner::Pending(None)
        } else {
            Owner::Ebpf
        };
        self.stats.processes += 1;
        self.tracked.insert(
            pid,
            Tracked {
                info: ProcessInfo {
                    pid,
                    ppid: facts.ppid,
                    uid: facts.uid,
                    start_time: facts.start_time,
                    run_id: 0,
                    exe: facts.exe,
                    cmdline: facts.cmdline,
                },
                owner,
                announced: false,
                attached_since,
                seq: 0,
                delivered: 0,
                lost_reported: 0,
                held: Vec::new(),
            },
        );
    }

    /// Processes tracked now (any owner).
    pub fn tracked(&self) -> usize {
        self.tracked.len()
    }

    /// Drains the ring buffer and hands on processes, events and ends. `ring_pids` says
    /// whether a pid has a ring the agent drains (then the ring wins).
    pub fn poll(&mut self, ring_pids: &dyn Fn(u32) -> bool, out: &mut dyn FnMut(Item<'_>)) -> u64 {
        if self.last_scan.elapsed() >= self.cfg.rescan {
            self.scan();
        }
        // Owners: rings that appeared, holds that expired.
        let now = Instant::now();
        for t in self.tracked.values_mut() {
            match t.owner {
                Owner::Pending(_) if ring_pids(t.info.pid) => {
                    self.stats.ring_won += t.held.len() as u64;
                    t.held.clear();
                    t.owner = Owner::Ring;
                }
                Owner::Pending(Some(deadline)) if now >= deadline => t.owner = Owner::Ebpf,
                Owner::Ebpf if ring_pids(t.info.pid) => {
                    self.notes.push(format!(
                        "eBPF: process {} has a ring now; its ring is counted from here (events traced both ways \
                         before may be counted twice)",
                        t.info.pid
                    ));
                    t.owner = Owner::Ring;
                }
                _ => {}
            }
        }
        // Announce processes owned by eBPF, with what was held for them.
        let pids: Vec<u32> = self.tracked.keys().copied().collect();
        for pid in &pids {
            self.announce(*pid, out);
        }

        let mut records: Vec<Event> = Vec::new();
        let mut malformed = 0u64;
        self.probes.drain(self.cfg.batch, &mut |bytes| match decode(bytes) {
            Ok(w) => records.push(w.event),
            Err(_) => malformed += 1,
        });
        self.stats.malformed += malformed;
        let mut delivered = 0u64;
        let mut run: Vec<Event> = Vec::new();
        let mut run_pid = 0u32;
        for mut ev in records {
            let pid = ev.pid;
            if !self.tracked.contains_key(&pid) {
                self.track(pid, None, ring_pids);
            }
            let Some(t) = self.tracked.get_mut(&pid) else { continue };
            match t.owner {
                Owner::Ring => {
                    self.stats.ring_won += 1;
                    continue;
                }
                Owner::Pending(deadline) => {
                    if deadline.is_none() {
                        t.owner = Owner::Pending(Some(Instant::now() + self.cfg.hold));
                    }
                    if t.held.len() < MAX_HELD {
                        t.held.push(ev);
                    } else {
                        self.stats.lost += 1;
                    }
                    continue;
                }
                Owner::Ebpf => {}
            }
            if pid != run_pid && !run.is_empty() {
                delivered += run.len() as u64;
                out(Item::Events(&run));
                run.clear();
            }
            if !self.tracked.get(&pid).is_some_and(|t| t.announced) {
                self.announce(pid, out);
            }
            let Some(t) = self.tracked.get_mut(&pid) else { continue };
            run_pid = pid;
            ev.seq = t.seq;
            t.seq += 1;
            t.delivered += 1;
            if ev.device < 0 && matches!(ev.kind(), Some(EventKind::Alloc) | Some(EventKind::MemInfo)) {
                if let Some(d) = self.cfg.single_device {
                    ev.device = d;
                }
            }
            run.push(ev);
        }
        if !run.is_empty() {
            delivered += run.len() as u64;
            out(Item::Events(&run));
        }
        self.stats.events += delivered;
        if self.last_liveness.elapsed() >= self.cfg.liveness {
            self.last_liveness = Instant::now();
            delivered += self.check_lost_and_ended(out);
        }
        delivered
    }

    /// Sends a process's info (and attach note) once, then anything held for it.
    fn announce(&mut self, pid: u32, out: &mut dyn FnMut(Item<'_>)) {
        let Some(t) = self.tracked.get_mut(&pid) else { return };
        if t.owner != Owner::Ebpf {
            return;
        }
        if !t.announced {
            t.announced = true;
            out(Item::Process(&t.info));
            if let Some(since_ns) = t.attached_since {
                out(Item::Attached { pid, start_time: t.info.start_time, since_ns });
            }
        }
        if !t.held.is_empty() {
            let mut held = std::mem::take(&mut t.held);
            for ev in &mut held {
                ev.seq = t.seq;
                t.seq += 1;
                if ev.device < 0 && matches!(ev.kind(), Some(EventKind::Alloc) | Some(EventKind::MemInfo)) {
                    if let Some(d) = self.cfg.single_device {
                        ev.device = d;
                    }
                }
            }
            t.delivered += held.len() as u64;
            self.stats.events += held.len() as u64;
            out(Item::Events(&held));
        }
    }

    /// Reports new ring-buffer losses per process (a `Dropped` marker) and ends the
    /// processes that are gone.
    fn check_lost_and_ended(&mut self, out: &mut dyn FnMut(Item<'_>)) -> u64 {
        let mut delivered = 0;
        let pids: Vec<u32> = self.tracked.keys().copied().collect();
        for pid in pids {
            let lost = self.probes.lost(pid);
            let Some(t) = self.tracked.get_mut(&pid) else { continue };
            if lost > t.lost_reported && t.owner == Owner::Ebpf {
                let n = lost - t.lost_reported;
                t.lost_reported = lost;
                self.stats.lost += n;
                let marker = Event {
                    seq: t.seq,
                    ts_ns: targets::clock_ns(libc::CLOCK_MONOTONIC),
                    pid,
                    kind: EventKind::Dropped.code(),
                    api: Api::Interposer.code(),
                    device: -1,
                    size: n,
                    aux: 0,
                    ..Event::default()
                };
                t.seq += 1;
                if t.announced {
                    out(Item::Events(std::slice::from_ref(&marker)));
                    delivered += 1;
                }
            }
            if !process_alive(pid, t.info.start_time) {
                // Anything still held goes now: no ring came.
                if matches!(t.owner, Owner::Pending(_)) {
                    t.owner = Owner::Ebpf;
                    self.announce(pid, out);
                }
                let Some(t) = self.tracked.remove(&pid) else { continue };
                self.probes.forget(pid);
                self.target_since.remove(&pid);
                if t.announced {
                    out(Item::End(ProcessEnd {
                        pid,
                        exit_status: None,
                        start_time: t.info.start_time,
                        ts_ns: targets::clock_ns(libc::CLOCK_MONOTONIC),
                        delivered: t.delivered,
                        dropped: t.lost_reported,
                        ..ProcessEnd::default()
                    }));
                }
            }
        }
        delivered
    }
}
