//! The ring source: finds the rings of traced processes in a ring directory, opens them as
//! their one reader, drains them, notices when a process is gone and closes its stream.
//! The agent, `vramhook run` and `vramhook top` all read rings through it.
//!
//! A ring is named `<pid>-<start time>-<image>.ring` (the image number grows with each
//! `exec` of the same process). Everything inside a ring is untrusted input.
//!
//! This file holds the source and its draining; its module `discover` (`source/discover.rs`)
//! finds, checks and opens rings, and lists those left to `vramhook run` sessions. What a
//! reader does with what the source reports (refusals, rings left to a session) is its own:
//! the agent counts them in its state, `top` in its view, `run` says them on stderr.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use vramhook_protocol::capture::{ProcessEnd, ProcessInfo};
use vramhook_protocol::clock::TscClock;
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_protocol::seqset::SeqSet;

use crate::dir::process_alive;
use crate::{MappedRing, DEFAULT_MAX_RING_BYTES};
use discover::{RunRing, RUN_PID_PATIENCE};

mod discover;
#[cfg(test)]
mod tests;

/// What a poll hands on, in order: a process before its events, its end after them.
#[derive(Debug)]
pub enum SourceItem<'a> {
    Process(&'a ProcessInfo),
    Events(&'a [Event]),
    End(ProcessEnd),
}

/// Which rings a source takes.
#[derive(Clone, Debug, Default)]
pub struct RingFilter {
    /// Only rings stamped with this run id (`vramhook run` draining its own descendants).
    pub run_id: Option<u64>,
}

/// A ring the source refused, and why (reported once per file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub path: PathBuf,
    pub reason: String,
    /// Closed after it was opened, for claims no writer can make or for being cut while
    /// mapped (a hostile or broken writer), rather than refused at the door.
    pub hostile: bool,
    /// Refused for being larger than this reader takes ([`RingSource::max_ring_bytes`]):
    /// its process is not traced. Never silently: the reader counts these per owner (the
    /// agent's state, `/metrics`, `top`).
    pub too_large: Option<TooLarge>,
}

/// A ring file refused for its size (checked with `fstat` before mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// The file's owner (the traced process's effective uid).
    pub uid: u32,
    /// The file's size, in bytes.
    pub len: u64,
    /// The largest ring file this reader takes, in bytes.
    pub max: u64,
}

/// The `--max-ring-mib` that takes a ring file of `len` bytes (its slots, rounded up to a
/// MiB; the header page is allowed for by the setting).
pub fn max_ring_mib_for(len: u64) -> u64 {
    len.saturating_sub(crate::HEADER_SIZE as u64).div_ceil(1 << 20)
}

/// A live process whose ring a `vramhook run` session drains (see
/// [`RingSource::skip_run_rings`]). Read from the ring's header without taking its lock:
/// untrusted, bounded, control characters replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunRingProcess {
    /// The process, as its ring names it.
    pub pid: u32,
    pub start_time: u64,
    /// Its executable and command line (at most 1,024 characters).
    pub exe: String,
    pub command: String,
    /// The `vramhook run` session draining it (the holder of the ring's lock), once seen.
    pub run_pid: Option<u32>,
}

/// What one poll did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollSummary {
    pub delivered: u64,
    pub opened: usize,
    pub closed: usize,
    /// Records found malformed (a corrupted or hostile ring) in this poll.
    pub malformed: u64,
    /// Events the writers reported dropped or lost in flight, in this poll.
    pub dropped: u64,
    /// Slots consumed by an earlier reader that died before saving its cursor (found
    /// after a restart), in this poll; each ring's are handed on as a `Dropped` marker.
    pub skipped: u64,
    /// Events refused in this poll because they named another process than the ring's
    /// verified writer (counted in `malformed` too).
    pub foreign: u64,
    /// Events found again after a restart that the previous reader had recorded (see
    /// [`RingSource::set_recorded`]): consumed, not delivered twice.
    pub duplicates: u64,
}

/// A ring opened by discovery, and where its cursor stood when it was opened (a
/// restarted reader resumes there).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenedRing {
    pub pid: u32,
    pub start_time: u64,
    pub image: u64,
    pub position: u64,
    /// Writer drops already reported (as `Dropped` markers) by earlier readers.
    pub drops_reported: u64,
}

/// What a ring's reader has handed on: slots accounted for (each delivered event one,
/// each `Dropped` marker its `aux`) and writer drops reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingCursor {
    pub key: (u32, u64, u64),
    pub slots: u64,
    pub drops_reported: u64,
    /// Events handed on but not yet committed (or recorded by an earlier reader and not
    /// yet met): a reader restarted from the record skips these if it finds them.
    pub unconfirmed: SeqSet,
}

impl RingCursor {
    /// A ring of which `slots` slots were recorded, nothing else known yet.
    pub fn recorded(key: (u32, u64, u64), slots: u64) -> RingCursor {
        RingCursor { key, slots, drops_reported: 0, unconfirmed: SeqSet::new() }
    }
}

/// The writer drops the ring's readers have reported so far.
fn drops_reported(ring: &MappedRing) -> u64 {
    ring.reader.drops_reported()
}

struct Tracked {
    ring: MappedRing,
    info: ProcessInfo,
    image: u64,
    end: ProcessEnd,
    /// The `Process` item is handed on in the first poll of this ring, after any older
    /// image of the same process (before an `exec`) was closed.
    announced: bool,
    /// Last /proc liveness check, and its answer.
    checked: Option<(std::time::Instant, bool)>,
    /// Slots accounted for: delivered, lost in flight or malformed by this reader, plus
    /// what earlier readers recorded (see [`RingSource::set_recorded`]).
    accounted: u64,
    /// Slots reported lost (taken by an earlier reader, never recorded).
    lost_reported: u64,
    /// The file's identity (device, inode), so that only this file is ever removed.
    ident: (u64, u64),
    /// The file's name: it names the writer by its pid in its own pid namespace, which
    /// differs from the key's (this reader's view) for a process in a container.
    name: String,
    /// The pid the writer puts in its events (its own namespace's view).
    writer_pid: u32,
    /// The writer's parent as this reader sees it (for a process start record).
    host_ppid: u32,
}

/// Key: (pid, start time, image).
pub(crate) type RingKey = (u32, u64, u64);

pub struct RingSource {
    dir: PathBuf,
    /// The ring directory, opened once (never followed through a symlink); every file
    /// in it is reached relative to this descriptor, never by path, so a directory
    /// swapped for a symlink afterwards cannot redirect the source.
    dir_fd: Option<OwnedFd>,
    /// Hold back the removal of closed rings' files for the caller to run once the ring's
    /// events are recorded (the agent: after its capture wrote them). A ring file removed
    /// before its events are recorded would lose them silently if the reader died.
    pub defer_removals: bool,
    removals: Vec<RingRemoval>,
    /// Owner of the ring directory (the uid a root reader expects its rings to have).
    dir_uid: u32,
    /// Rings found but not yet ready at the last scan (header not yet published), and
    /// when each was first seen so.
    waiting: usize,
    not_ready_since: BTreeMap<RingKey, std::time::Instant>,
    filter: RingFilter,
    tsc: Option<TscClock>,
    rings: BTreeMap<RingKey, Tracked>,
    /// Files refused for good (bad or hostile headers), so they are not retried each scan.
    refused: BTreeMap<PathBuf, String>,
    /// Rings of other runs or readers: skipped quietly.
    ignored: BTreeMap<PathBuf, ()>,
    new_refusals: Vec<Refusal>,
    batch: Vec<Event>,
    /// Events drained per ring per poll, so one busy process cannot starve the others.
    pub batch_limit: usize,
    /// Exit statuses known to the caller (its own children), used in `ProcessEnd`.
    exit_statuses: BTreeMap<u32, i32>,
    euid: u32,
    /// Whether `poll` scans the directory itself (the default). A caller that watches the
    /// directory (inotify) turns this off and calls [`RingSource::discover_now`].
    pub auto_discover: bool,
    /// How often a ring's process is looked up in /proc (zero: every poll, the default).
    /// A writer that exits normally marks its ring at once; this only bounds how late a
    /// killed writer is noticed.
    pub liveness_interval: std::time::Duration,
    opened_log: Vec<OpenedRing>,
    /// Leave alone the rings stamped with a run id (they belong to a `vramhook run`
    /// session, which drains its own descendants). Their header is peeked without
    /// locking, so the session never finds its ring locked by us.
    pub skip_run_rings: bool,
    /// Whether a ring marked exited by its writer counts as finished (the default). When
    /// false, a ring is closed only once its process is gone (/proc), so that events a
    /// process still writes after marking its ring (other threads, later destructors) are
    /// not lost.
    pub trust_exit_mark: bool,
    /// Largest ring file accepted (checked with `fstat` before mapping).
    pub max_ring_bytes: u64,
    /// Leave delivered events in their slots until [`RingSource::commit`] (the agent: once
    /// its capture holds them), so that a reader killed meanwhile loses nothing. Off by
    /// default: what is delivered is consumed.
    pub deferred_commit: bool,
    /// Generation of the last poll (deliveries are tagged with it).
    generation: u64,
    /// Names of the files of open rings (a ring is keyed by its writer's pid as this
    /// reader sees it, which the name does not say for a process in a container).
    open_names: std::collections::BTreeSet<String>,
    /// File names of rings of writers in other pid namespaces, by key, until the file goes.
    names: BTreeMap<RingKey, String>,
    /// This reader's pid namespace (0: unknown).
    own_pid_ns: u64,
    /// Rings left to `vramhook run` sessions, by path (with `skip_run_rings`).
    run_rings: BTreeMap<PathBuf, RunRing>,
    /// Last read of /proc/locks (looking for the sessions that hold run rings).
    locks_read: Option<std::time::Instant>,
}

impl RingSource {
    pub fn new(dir: impl Into<PathBuf>, filter: RingFilter, tsc: Option<TscClock>) -> RingSource {
        RingSource {
            dir: dir.into(),
            dir_fd: None,
            defer_removals: false,
            removals: Vec::new(),
            dir_uid: 0,
            waiting: 0,
            not_ready_since: BTreeMap::new(),
            filter,
            tsc,
            rings: BTreeMap::new(),
            refused: BTreeMap::new(),
            ignored: BTreeMap::new(),
            new_refusals: Vec::new(),
            batch: Vec::new(),
            batch_limit: 1 << 16,
            exit_statuses: BTreeMap::new(),
            // SAFETY: geteuid has no preconditions.
            euid: unsafe { libc::geteuid() },
            auto_discover: true,
            liveness_interval: std::time::Duration::ZERO,
            opened_log: Vec::new(),
            skip_run_rings: false,
            trust_exit_mark: true,
            max_ring_bytes: DEFAULT_MAX_RING_BYTES,
            deferred_commit: false,
            generation: 0,
            open_names: Default::default(),
            names: BTreeMap::new(),
            own_pid_ns: crate::dir::own_pid_ns(),
            run_rings: BTreeMap::new(),
            locks_read: None,
        }
    }

    /// Rings found but not yet ready (header not yet published) at the last scan, for at
    /// most [`NOT_READY_RETRY`] each: the caller should scan again soon rather than at its
    /// next periodic rescan. (A file that stays unready longer waits for the rescan, so
    /// that nobody can make the reader scan without pause.)
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Scans the directory now; returns the rings it opened (also those `poll` opened
    /// since the last call), each with its cursor at open.
    pub fn discover_now(&mut self) -> Vec<OpenedRing> {
        self.discover();
        std::mem::take(&mut self.opened_log)
    }

    /// Rings opened since the last call (by `poll` or `discover_now`).
    pub fn take_opened(&mut self) -> Vec<OpenedRing> {
        std::mem::take(&mut self.opened_log)
    }

    /// (pid, start time, image) and read position of every open ring.
    pub fn ring_positions(&self) -> Vec<((u32, u64, u64), u64)> {
        self.rings.iter().map(|(k, t)| (*k, t.ring.reader.position())).collect()
    }

    /// Position and reported writer drops of every open ring.
    /// Marks every open ring's events as recorded (a clean stop, once they are in the
    /// capture): a gc may then remove a ring whose process is gone. Rings of a reader that
    /// dies are not marked, so their unrecorded events are counted by the next reader.
    pub fn mark_recorded(&self) {
        for t in self.rings.values() {
            t.ring.reader.mark_recorded();
        }
    }

    pub fn ring_cursors(&self) -> Vec<RingCursor> {
        self.rings
            .iter()
            .map(|(k, t)| RingCursor {
                key: *k,
                slots: t.accounted + t.lost_reported,
                drops_reported: drops_reported(&t.ring),
                unconfirmed: t.ring.reader.unconfirmed_seqs(),
            })
            .collect()
    }

    /// Tells the source what earlier readers of a just-opened ring handed on and were
    /// recorded: how many slots (events, and `Dropped` markers' aux), and which events
    /// may still be in the ring (they are skipped, not delivered twice). The rest behind
    /// the cursor is reported lost. Without it, everything an earlier reader took is.
    pub fn set_recorded(&mut self, key: (u32, u64, u64), slots: u64, seqs: SeqSet) {
        if let Some(t) = self.rings.get_mut(&key) {
            t.accounted = slots;
            t.ring.reader.skip_recorded(seqs);
        }
    }

    /// Generation of the last poll: pass it to [`RingSource::commit`] once what that poll
    /// delivered is kept for good.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Frees the ring slots of what the polls up to generation `upto` delivered (with
    /// `deferred_commit`; without it, polls commit as they go).
    pub fn commit(&mut self, upto: u64) {
        for t in self.rings.values_mut() {
            t.ring.reader.commit(upto);
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of rings being drained.
    pub fn open_rings(&self) -> usize {
        self.rings.len()
    }

    /// Pids of the processes whose rings are open.
    pub fn open_pids(&self) -> Vec<u32> {
        self.rings.keys().map(|k| k.0).collect()
    }

    /// Tells the source how a process it may hold ended (for `ProcessEnd`).
    pub fn set_exit_status(&mut self, pid: u32, status: i32) {
        self.exit_statuses.insert(pid, status);
    }

    /// The live processes whose rings are left to a `vramhook run` session (with
    /// `skip_run_rings`), as of the last scan.
    pub fn run_rings(&self) -> Vec<RunRingProcess> {
        self.run_rings.values().map(|r| r.listed.clone()).collect()
    }

    /// Rings of `vramhook run` sessions listed since the last call, each once: once the
    /// session holding it is known, or after [`RUN_PID_PATIENCE`] without it.
    pub fn take_new_run_rings(&mut self) -> Vec<RunRingProcess> {
        let now = std::time::Instant::now();
        self.run_rings
            .values_mut()
            .filter(|r| !r.announced && (r.listed.run_pid.is_some() || now.duration_since(r.since) >= RUN_PID_PATIENCE))
            .map(|r| {
                r.announced = true;
                r.listed.clone()
            })
            .collect()
    }

    /// Rings refused since the last call.
    pub fn take_refusals(&mut self) -> Vec<Refusal> {
        std::mem::take(&mut self.new_refusals)
    }

    /// Finds new rings, drains every open one, and closes those whose writer is gone and
    /// whose events are all read.
    pub fn poll(&mut self, sink: &mut dyn FnMut(SourceItem<'_>)) -> PollSummary {
        let mut summary = PollSummary::default();
        self.generation += 1;
        if self.auto_discover {
            summary.opened = self.discover();
        }
        let now = std::time::Instant::now();
        let keys: Vec<RingKey> = self.rings.keys().copied().collect();
        for key in keys {
            self.poll_ring(key, now, sink, &mut summary);
        }
        summary
    }

    /// Announces, checks and drains one open ring, and closes it when its writer is gone
    /// and its events are all read.
    fn poll_ring(
        &mut self,
        key: RingKey,
        now: std::time::Instant,
        sink: &mut dyn FnMut(SourceItem<'_>),
        summary: &mut PollSummary,
    ) {
        let liveness_interval = self.liveness_interval;
        let superseded = self.rings.range((key.0, key.1, key.2 + 1)..=(key.0, key.1, u64::MAX)).next().is_some();
        let Some(t) = self.rings.get_mut(&key) else { return };
        if !t.announced {
            t.announced = true;
            sink(SourceItem::Process(&t.info));
        }
        let counters = t.ring.reader.counters();
        let alive = match t.checked {
            // A ring marked exited is looked up every poll until its process is gone.
            Some((at, alive))
                if !liveness_interval.is_zero() && now.duration_since(at) < liveness_interval && !counters.exited =>
            {
                alive
            }
            _ => {
                let alive = process_alive(key.0, key.1);
                t.checked = Some((now, alive));
                alive
            }
        };
        let writer_gone = superseded || (counters.exited && self.trust_exit_mark) || !alive;
        if let Err(reason) = t.ring.reader.check_claims(max_plausible_events()) {
            // (A file cut under the map reads as zeros, which no writer leaves either.)
            let reason = match t.ring.shrank() {
                Some(at) => cut_reason(at, t.ring.mapped_len()),
                None => reason,
            };
            self.close_hostile(key, writer_gone, reason, sink, summary);
            return;
        }
        // A ring whose writer is gone is drained to its end in this poll (at most one
        // lap, which the claims check bounds), so that its process is closed in the
        // same poll it was last read: a process that is gone never looks alive.
        let max_rounds = t.ring.mapped_len() / vramhook_protocol::record::RECORD_SIZE / self.batch_limit.max(1) + 2;
        let mut rounds = 0;
        loop {
            let Some(pending) = self.drain_round(key, writer_gone, counters.hook_misses, sink, summary) else {
                return;
            };
            rounds += 1;
            if !writer_gone || pending == 0 || rounds >= max_rounds {
                break;
            }
        }
        let Some(t) = self.rings.get_mut(&key) else { return };
        if writer_gone && t.ring.reader.pending() == 0 {
            if let Some(t) = self.take_ring(key) {
                let mut end = t.end;
                end.exit_status = self.exit_statuses.get(&key.0).copied();
                end.ts_ns = vramhook_protocol::clock::monotonic_ns();
                drop(t.ring);
                self.remove_ring_file(&t.name, t.ident);
                sink(SourceItem::End(end));
                summary.closed += 1;
            }
        }
    }

    /// Reads one batch of a ring and hands it on, with the slots it accounts for. Returns
    /// the events still pending in the ring, or `None` where the ring is gone or closed.
    fn drain_round(
        &mut self,
        key: RingKey,
        writer_gone: bool,
        hook_misses: u64,
        sink: &mut dyn FnMut(SourceItem<'_>),
        summary: &mut PollSummary,
    ) -> Option<u64> {
        let (generation, deferred) = (self.generation, self.deferred_commit);
        let t = self.rings.get_mut(&key)?;
        self.batch.clear();
        let batch = &mut self.batch;
        let (pid, start) = (t.writer_pid, key.1);
        let (host_pid, host_ppid) = (key.0, t.host_ppid);
        let mut foreign = 0u64;
        t.ring.reader.auto_commit = !deferred;
        t.ring.reader.set_generation(generation);
        let stats = t.ring.reader.poll(self.batch_limit, writer_gone, |e| {
            // An event is the ring's verified writer's, whatever pid it names: one that
            // names another process (or another start of this pid) is refused, and so
            // is an NVML sample, which only a reader writes (never a traced process).
            let kind = EventKind::from_code(e.kind);
            if e.pid != pid
                || (kind == Some(EventKind::ProcessStart) && e.aux != start)
                || kind == Some(EventKind::GpuProcess)
            {
                foreign += 1;
            } else if host_pid != pid {
                // From the writer's pid namespace into this reader's.
                let mut e = e;
                e.pid = host_pid;
                if kind == Some(EventKind::ProcessStart) {
                    e.addr = u64::from(host_ppid);
                }
                batch.push(e);
            } else {
                batch.push(e);
            }
        });
        if let Some(at) = t.ring.shrank() {
            // Cut while mapped: what was read before the cut is handed on; the rest is
            // gone. The ring is closed; the map now reads zeros, never SIGBUS.
            if !self.batch.is_empty() {
                sink(SourceItem::Events(&self.batch));
            }
            let reason = cut_reason(at, t.ring.mapped_len());
            self.close_hostile(key, writer_gone, reason, sink, summary);
            return None;
        }
        // Slot accounting: every slot behind the cursor was delivered (now or before a
        // restart, as recorded), lost in flight, malformed, or taken by an earlier
        // reader that died before its events were recorded. The reader may consume
        // ahead of its cursor, so `position - accounted` is a lower bound of the last
        // kind, exact whenever the reader has caught up: report its growth as a
        // `Dropped` marker (aux = slots), so nothing is lost silently.
        t.accounted = t
            .accounted
            .saturating_add(stats.delivered)
            .saturating_add(stats.lost_in_flight)
            .saturating_add(stats.malformed);
        let unexplained = t.ring.reader.position().saturating_sub(t.accounted);
        if unexplained > t.lost_reported {
            let skipped = unexplained - t.lost_reported;
            t.lost_reported = unexplained;
            batch.push(Event {
                seq: t.ring.reader.position(),
                ts_ns: vramhook_protocol::clock::monotonic_ns(),
                pid: key.0,
                kind: EventKind::Dropped.code(),
                api: Api::Interposer.code(),
                device: -1,
                size: skipped,
                aux: skipped,
                ..Event::default()
            });
            t.end.lost_in_flight = t.end.lost_in_flight.saturating_add(skipped);
            summary.skipped = summary.skipped.saturating_add(skipped);
        }
        let delivered = stats.delivered.saturating_sub(foreign);
        let malformed = stats.malformed.saturating_add(foreign);
        t.end.delivered = t.end.delivered.saturating_add(delivered);
        t.end.dropped = t.end.dropped.saturating_add(stats.dropped.saturating_sub(stats.lost_in_flight));
        t.end.lost_in_flight = t.end.lost_in_flight.saturating_add(stats.lost_in_flight);
        t.end.malformed = t.end.malformed.saturating_add(malformed);
        t.end.hook_misses = hook_misses;
        summary.delivered = summary.delivered.saturating_add(delivered);
        summary.malformed = summary.malformed.saturating_add(malformed);
        summary.foreign = summary.foreign.saturating_add(foreign);
        summary.duplicates = summary.duplicates.saturating_add(stats.duplicates);
        summary.dropped = summary.dropped.saturating_add(stats.dropped);
        if !self.batch.is_empty() {
            sink(SourceItem::Events(&self.batch));
        }
        Some(t.ring.reader.pending())
    }

    /// Closes an open ring whose writer did something no writer can do (claims beyond
    /// what is possible, a file cut while mapped): its process ends here, the file is
    /// refused for good (removed once its writer is gone), and the refusal is reported.
    fn close_hostile(
        &mut self,
        key: RingKey,
        writer_gone: bool,
        reason: String,
        sink: &mut dyn FnMut(SourceItem<'_>),
        summary: &mut PollSummary,
    ) {
        let Some(t) = self.take_ring(key) else { return };
        let mut end = t.end;
        end.exit_status = self.exit_statuses.get(&key.0).copied();
        end.ts_ns = vramhook_protocol::clock::monotonic_ns();
        drop(t.ring);
        if writer_gone {
            self.remove_ring_file(&t.name, t.ident);
        }
        let path = self.dir.join(&t.name);
        self.new_refusals.push(Refusal { path: path.clone(), reason: reason.clone(), hostile: true, too_large: None });
        self.refused.insert(path, reason);
        sink(SourceItem::End(end));
        summary.closed += 1;
    }

    /// Removes a finished ring's file, or with `defer_removals` hands the removal to the
    /// caller ([`RingSource::take_removals`]).
    fn remove_ring_file(&mut self, file_name: &str, ident: (u64, u64)) {
        let Some(dir) = &self.dir_fd else { return };
        let Ok(name) = CString::new(file_name) else { return };
        // SAFETY: duplicating our own descriptor; the duplicate is owned by the removal.
        let dup = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return;
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let removal = RingRemoval { dir: unsafe { OwnedFd::from_raw_fd(dup) }, name, ident };
        if self.defer_removals {
            // Not to be opened again meanwhile (it would read as an earlier reader's loss);
            // forgotten once the file is gone.
            self.ignored.insert(self.dir.join(file_name), ());
            self.removals.push(removal);
        } else {
            removal.run();
        }
    }

    /// Closes a ring without reading it and removes its file: one whose events a
    /// previous reader recorded in full, and which only its removal had not reached.
    pub fn discard(&mut self, key: RingKey) {
        if let Some(t) = self.take_ring(key) {
            drop(t.ring);
            self.remove_ring_file(&t.name, t.ident);
        }
    }

    /// Stops tracking a ring (its file stays until removed).
    fn take_ring(&mut self, key: RingKey) -> Option<Tracked> {
        let t = self.rings.remove(&key)?;
        self.open_names.remove(&t.name);
        Some(t)
    }

    /// Whether the ring file of `key` is still in the ring directory.
    pub fn ring_file_exists(&mut self, key: RingKey) -> bool {
        let name = self.names.get(&key).cloned().unwrap_or_else(|| ring_name(key));
        let exists = self.file_exists(&name);
        if !exists {
            self.names.remove(&key);
        }
        exists
    }

    fn file_exists(&self, name: &str) -> bool {
        let (Some(dir), Ok(name)) = (&self.dir_fd, CString::new(name)) else { return false };
        // SAFETY: an fstatat on our own directory descriptor into a zeroed stat buffer.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstatat(dir.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0
        }
    }

    /// Removals of closed rings' files held back for the caller (see `defer_removals`).
    pub fn take_removals(&mut self) -> Vec<RingRemoval> {
        std::mem::take(&mut self.removals)
    }

    /// Image number (exec count) of an open ring, for diagnostics.
    pub fn image_of(&self, pid: u32) -> Option<u64> {
        self.rings.values().find(|t| t.info.pid == pid).map(|t| t.image)
    }
}

/// How long a ring found not yet ready is looked at again at every tick.
pub const NOT_READY_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

fn cut_reason(at: u64, len: usize) -> String {
    format!("ring file was cut to {at} bytes while mapped ({len} bytes before)")
}

fn ring_name(key: RingKey) -> String {
    format!("{}-{}-{}.ring", key.0, key.1, key.2)
}

/// A closed ring's file to remove: by name inside the ring directory, and only if the
/// name still is the file that was drained.
pub struct RingRemoval {
    dir: OwnedFd,
    name: CString,
    ident: (u64, u64),
}

impl RingRemoval {
    pub fn run(self) {
        // SAFETY: fstatat into a zeroed struct; a name relative to our directory fd.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstatat(self.dir.as_raw_fd(), self.name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) == 0
                && (st.st_dev, st.st_ino) == self.ident
            {
                libc::unlinkat(self.dir.as_raw_fd(), self.name.as_ptr(), 0);
            }
        }
    }
}

/// Most events a process could have issued (or dropped) by now: four per nanosecond
/// since boot, more than any host's cores can make. A ring claiming more is hostile.
fn max_plausible_events() -> u64 {
    // SAFETY: clock_gettime into a zeroed struct.
    let ns = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts);
        (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
    };
    ns.saturating_mul(4)
}
