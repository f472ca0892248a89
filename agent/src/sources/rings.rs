//! The ring source: finds the rings of traced processes, drains them, notices when a
//! process is gone and closes its stream.
//!
//! A ring is named `<pid>-<start time>-<image>.ring` (the image number grows with each
//! `exec` of the same process). Everything inside a ring is untrusted input.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use vramhook_protocol::capture::{ProcessEnd, ProcessInfo};
use vramhook_protocol::clock::TscClock;
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_protocol::seqset::SeqSet;
use vramhook_ring::{MappedRing, RingError, DEFAULT_MAX_RING_BYTES};

use crate::stats::RecordedByRun;

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
type RingKey = (u32, u64, u64);

/// A ring left to a `vramhook run` session (see `RingSource::skip_run_rings`): listed while
/// its process lives and its file is there, never drained.
struct RunRing {
    listed: RecordedByRun,
    /// The file's identity (device, inode): the key of its lock in /proc/locks.
    ident: (u64, u64),
    /// A writer in another pid namespace cannot be looked up in this /proc: it is listed
    /// until its file goes.
    other_ns: bool,
    /// When it was first listed (the session's pid is looked for up to `RUN_PID_PATIENCE`).
    since: std::time::Instant,
    /// Whether it was handed on by [`RingSource::take_new_run_rings`] (once per ring).
    announced: bool,
}

/// Most rings of `vramhook run` sessions listed at once (each holds at most about 2 KiB):
/// a user churning ring files cannot grow the reader's memory without bound.
const MAX_RUN_RINGS: usize = 1024;
/// How long the holder of a run ring's lock is looked for (the session opens the ring
/// soon after its process makes it); a ring is announced once it is found or this passed.
const RUN_PID_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);
/// Least time between two reads of /proc/locks.
const LOCKS_GAP: std::time::Duration = std::time::Duration::from_millis(200);

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
            own_pid_ns: vramhook_ring::dir::own_pid_ns(),
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
    pub fn run_rings(&self) -> Vec<RecordedByRun> {
        self.run_rings.values().map(|r| r.listed.clone()).collect()
    }

    /// Rings of `vramhook run` sessions listed since the last call, each once: once the
    /// session holding it is known, or after [`RUN_PID_PATIENCE`] without it.
    pub fn take_new_run_rings(&mut self) -> Vec<RecordedByRun> {
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
        self.new_refusals.push(Refusal { path: path.clone(), reason: reason.clone(), hostile: true });
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

    fn discover(&mut self) -> usize {
        self.waiting = 0;
        if self.dir_fd.is_none() {
            let Ok(fd) = open_dir_fd(&self.dir) else { return 0 };
            // SAFETY: fstat on our fd into a zeroed struct.
            self.dir_uid = unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                    return 0;
                }
                st.st_uid
            };
            self.dir_fd = Some(fd);
        }
        let Some(dir) = &self.dir_fd else { return 0 };
        let Ok(names) = list_dir(dir) else { return 0 };
        // Remember refusals only for files still there: a user who churns names cannot
        // grow the reader's memory.
        if !self.refused.is_empty() || !self.ignored.is_empty() {
            let present: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
            let here = |p: &PathBuf| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| present.contains(n));
            self.refused.retain(|p, _| here(p));
            self.ignored.retain(|p, _| here(p));
            // A run session removes its ring once drained; a process gone is no longer
            // recorded (its ring, if left, stays ignored).
            self.run_rings.retain(|p, r| here(p) && (r.other_ns || process_alive(r.listed.pid, r.listed.start_time)));
        }
        let mut found: Vec<(RingKey, PathBuf)> = names
            .iter()
            .filter(|name| !self.open_names.contains(name.as_str()))
            .filter_map(|name| parse_ring_name(name).map(|k| (k, self.dir.join(name))))
            .filter(|(_, p)| !self.refused.contains_key(p) && !self.ignored.contains_key(p))
            .collect();
        found.sort();
        let now = std::time::Instant::now();
        self.not_ready_since.retain(|k, _| found.iter().any(|(f, _)| f == k));
        let mut opened = 0;
        for (key, path) in found {
            // A ring of a process that is gone is not opened while a ring of another
            // process with the same pid is open (pid reuse): the model knows a process by
            // its pid, and the dead one's events must never land on the live one.
            // (It is looked at again at the next scan.)
            if self.rings.keys().any(|k| k.0 == key.0 && k.1 != key.1) {
                continue;
            }
            match self.open(&path, key) {
                Ok(Some(tracked)) => {
                    // Keyed by the writer's pid as this reader sees it.
                    let key = (tracked.end.pid, key.1, key.2);
                    if self.rings.contains_key(&key) {
                        continue; // (a second file naming the same process: left alone)
                    }
                    if self.opened_log.len() >= 4096 {
                        self.opened_log.remove(0); // a caller that never takes them
                    }
                    self.open_names.insert(tracked.name.clone());
                    if tracked.writer_pid != key.0 {
                        self.names.insert(key, tracked.name.clone());
                    }
                    self.opened_log.push(OpenedRing {
                        pid: key.0,
                        start_time: key.1,
                        image: key.2,
                        position: tracked.ring.reader.position(),
                        drops_reported: drops_reported(&tracked.ring),
                    });
                    self.rings.insert(key, tracked);
                    opened += 1;
                }
                Ok(None) => {}
                Err(OpenError::NotReady) => {
                    // Header not yet published.
                    let since = *self.not_ready_since.entry(key).or_insert(now);
                    if now.duration_since(since) < NOT_READY_RETRY {
                        self.waiting += 1;
                    }
                }
                Err(OpenError::Ignore) => {
                    self.ignored.insert(path, ());
                }
                Err(OpenError::RunRing(run)) => {
                    if self.run_rings.len() < MAX_RUN_RINGS {
                        self.run_rings.insert(path.clone(), *run);
                    }
                    self.ignored.insert(path, ());
                }
                Err(OpenError::Refuse(reason)) => {
                    self.new_refusals.push(Refusal { path: path.clone(), reason: reason.clone(), hostile: false });
                    self.refused.insert(path, reason);
                }
            }
        }
        self.find_run_sessions(now);
        opened
    }

    /// Fills in the session (the holder of the ring's lock) of run rings listed without
    /// one, for up to twice [`RUN_PID_PATIENCE`] each, reading /proc/locks at most every
    /// [`LOCKS_GAP`] (a user churning ring files cannot make the reader read it more).
    fn find_run_sessions(&mut self, now: std::time::Instant) {
        let wanted: Vec<(u64, u64)> = self
            .run_rings
            .values()
            .filter(|r| r.listed.run_pid.is_none() && now.duration_since(r.since) < RUN_PID_PATIENCE * 2)
            .map(|r| r.ident)
            .collect();
        if wanted.is_empty() {
            return;
        }
        if self.locks_read.is_some_and(|at| now.duration_since(at) < LOCKS_GAP) {
            return;
        }
        self.locks_read = Some(now);
        let holders = lock_holders(&wanted);
        for r in self.run_rings.values_mut() {
            if r.listed.run_pid.is_none() {
                r.listed.run_pid = holders.get(&r.ident).copied();
            }
        }
    }

    fn open(&self, _path: &Path, key: RingKey) -> Result<Option<Tracked>, OpenError> {
        let (file, meta) = self.open_file(key)?;
        let ident = (meta.dev(), meta.ino());
        if self.skip_run_rings {
            self.leave_run_ring(&file, key, ident)?;
        }
        let ring = self.map_file(file, &meta, key)?;
        let info = ring.reader.info().clone();
        if let Some(run_id) = self.filter.run_id {
            if info.run_id != run_id {
                return Err(OpenError::Ignore);
            }
        }
        let owner = ring.file().metadata().map(|m| m.uid()).map_err(|e| OpenError::Refuse(e.to_string()))?;
        if self.euid != 0 && owner != self.euid {
            return Err(OpenError::Refuse(format!("ring owned by uid {owner}, not ours")));
        }
        if owner != info.uid {
            return Err(OpenError::Refuse(format!(
                "ring file owner {owner} does not match its header's uid {}",
                info.uid
            )));
        }
        if info.pid != key.0 || info.start_time != key.1 {
            return Err(OpenError::Refuse("ring header does not match its file name".into()));
        }
        let (pid, other_ns) = self.writer_here(&ring, key, owner)?;
        let host_pid = pid.unwrap_or(key.0);
        let host_ppid = match pid {
            Some(p) if other_ns => proc_ppid(p).unwrap_or(0),
            _ => info.ppid,
        };
        let process = ProcessInfo {
            pid: host_pid,
            ppid: host_ppid,
            uid: info.uid,
            start_time: info.start_time,
            run_id: info.run_id,
            exe: info.exe.clone(),
            cmdline: info.cmdline.clone(),
        };
        Ok(Some(Tracked {
            ring,
            end: ProcessEnd { pid: host_pid, start_time: info.start_time, ..ProcessEnd::default() },
            info: process,
            image: key.2,
            announced: false,
            checked: None,
            accounted: 0,
            lost_reported: 0,
            ident,
            name: ring_name(key),
            writer_pid: info.pid,
            host_ppid,
        }))
    }

    /// Opens the ring's file: a regular file owned by whoever may write rings here.
    fn open_file(&self, key: RingKey) -> Result<(std::fs::File, std::fs::Metadata), OpenError> {
        let Some(dir) = &self.dir_fd else { return Err(OpenError::NotReady) };
        let file = match open_ring_file(dir, &ring_name(key)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::Ignore),
            Err(e) => return Err(OpenError::Refuse(format!("cannot open: {e}"))),
        };
        let meta = file.metadata().map_err(|e| OpenError::Refuse(e.to_string()))?;
        if !meta.file_type().is_file() {
            return Err(OpenError::Refuse("not a regular file".into()));
        }
        // Who may write rings here: ourselves, or for root the owner of the directory.
        let expected = if self.euid != 0 { self.euid } else { self.dir_uid };
        if meta.uid() != expected {
            return Err(OpenError::Refuse(format!(
                "ring owned by uid {}, not by uid {expected} (the {})",
                meta.uid(),
                if self.euid != 0 { "reader" } else { "directory's owner" }
            )));
        }
        Ok((file, meta))
    }

    /// With `skip_run_rings`: a ring that a `vramhook run` session records is left alone
    /// (listed, an error carrying it), and so is one not ready to tell.
    fn leave_run_ring(&self, file: &std::fs::File, key: RingKey, ident: (u64, u64)) -> Result<(), OpenError> {
        match peek_header(file) {
            Peek::NotReady => Err(OpenError::NotReady),
            Peek::Plain => Ok(()),
            // Listed only when the header names the process its file name does (the
            // file's owner was checked above); either way it is left alone.
            Peek::Run { pid, start_time, pid_ns, exe, cmdline } if (pid, start_time) == (key.0, key.1) => {
                let command = if cmdline.is_empty() { exe.clone() } else { cmdline.join(" ") };
                let other_ns = pid_ns != 0 && self.own_pid_ns != 0 && pid_ns != self.own_pid_ns;
                Err(OpenError::RunRing(Box::new(RunRing {
                    listed: RecordedByRun {
                        pid,
                        start_time,
                        exe: printable(&exe, 1024),
                        command: printable(&command, 1024),
                        run_pid: None,
                    },
                    ident,
                    other_ns,
                    since: std::time::Instant::now(),
                    announced: false,
                })))
            }
            Peek::Run { .. } => Err(OpenError::Ignore),
        }
    }

    /// Maps the ring, or says why not (yet).
    fn map_file(&self, file: std::fs::File, meta: &std::fs::Metadata, key: RingKey) -> Result<MappedRing, OpenError> {
        match MappedRing::from_file(file, self.tsc, self.max_ring_bytes) {
            Ok(Some(ring)) => Ok(ring),
            // Another reader holds it (a `vramhook run`, or a gc about to remove it): look again
            // later rather than never, in case it lets go without removing it.
            Ok(None) => Err(OpenError::NotReady),
            Err(RingError::NotReady) => Err(OpenError::NotReady),
            Err(RingError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => Err(OpenError::Ignore),
            // The writer creates the file, then sizes it: a scan may see it empty. Wait
            // while the process it names lives; what it left unsized when gone is refused.
            Err(RingError::TooSmall(_)) if process_alive(key.0, key.1) => Err(OpenError::NotReady),
            // Never silently: counted per owner (the agent's state, `/metrics`, `top`) and
            // refused with the setting that takes it.
            Err(RingError::TooLarge { len, max }) => {
                crate::stats::note_too_large(meta.uid(), len, max);
                Err(OpenError::Refuse(format!(
                    "ring file is {len} bytes, more than the {max} bytes this reader takes: its process is not \
                     traced (--max-ring-mib {} takes it)",
                    crate::stats::max_ring_mib_for(len)
                )))
            }
            Err(e) => Err(OpenError::Refuse(e.to_string())),
        }
    }

    /// The ring's writer as this reader sees it: its pid here (`None`: not found in its
    /// namespace) and whether it is in another pid namespace; refused where a live process
    /// of that pid is not the one the ring names.
    fn writer_here(&self, ring: &MappedRing, key: RingKey, owner: u32) -> Result<(Option<u32>, bool), OpenError> {
        // A writer in another pid namespace (a container) names itself by its pid there:
        // find it here, by its namespace, that pid and its start time. Not found, it is
        // gone (or out of this reader's sight): drained as a process that is gone, under the
        // pid it gave itself, and not checked against an unrelated process of that pid here.
        let writer_ns = ring.reader.pid_ns();
        let other_ns = writer_ns != 0 && self.own_pid_ns != 0 && writer_ns != self.own_pid_ns;
        let pid = if other_ns { pid_in_this_namespace(writer_ns, key.0, key.1) } else { Some(key.0) };
        // The ring must belong to the process it names: a pid held now (running or a
        // zombie) must have started at the time the ring names, and /proc/PID must be
        // owned by the ring's owner. (A process already gone cannot be checked: its ring is drained as a
        // process of its own, keyed by pid and start time, and closed. One that made itself
        // non-dumpable, whose /proc entry root owns, is refused.)
        if let Some(started) = pid.and_then(proc_start_time) {
            let pid = pid.unwrap_or(key.0);
            if started != key.1 {
                return Err(OpenError::Refuse(format!(
                    "ring names process {pid} started at {}, but process {pid} running now started at {started}",
                    key.1
                )));
            }
            match std::fs::metadata(format!("/proc/{pid}")) {
                Ok(meta) if meta.uid() == owner => {}
                Ok(meta) => {
                    return Err(OpenError::Refuse(format!(
                        "ring owned by uid {owner} names process {pid}, which runs as uid {}",
                        meta.uid()
                    )))
                }
                Err(_) => {} // gone since: drained as a process that is gone
            }
        }
        Ok((pid, other_ns))
    }

    /// Image number (exec count) of an open ring, for diagnostics.
    pub fn image_of(&self, pid: u32) -> Option<u64> {
        self.rings.values().find(|t| t.info.pid == pid).map(|t| t.image)
    }
}

/// How long a ring found not yet ready is looked at again at every tick.
pub const NOT_READY_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

enum OpenError {
    NotReady,
    Ignore,
    /// A `vramhook run` session's ring: left alone, and listed.
    RunRing(Box<RunRing>),
    Refuse(String),
}

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

/// Opens the ring directory: the one place it is opened by path, once, with the ring
/// directory rules checked on the descriptor (`ringdir::open_ring_dir`: no symlink, the
/// shared parent 1777 and sticky, the user's directory 0700 and its owner's). See
/// `ringdir::expected_owner` for whose directory a root agent drains.
fn open_dir_fd(path: &Path) -> std::io::Result<OwnedFd> {
    // SAFETY: geteuid has no preconditions.
    let owner = vramhook_ring::dir::expected_owner(path, unsafe { libc::geteuid() });
    vramhook_ring::dir::open_ring_dir(path, owner).map_err(std::io::Error::other)
}

/// The names in a directory, read through its descriptor (a duplicate, rewound).
fn list_dir(dir: &OwnedFd) -> std::io::Result<Vec<String>> {
    // SAFETY: dup of our fd; fdopendir takes ownership of the duplicate, closedir closes
    // it; readdir entries are read before the next call.
    unsafe {
        let dup = libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0);
        if dup < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let d = libc::fdopendir(dup);
        if d.is_null() {
            let e = std::io::Error::last_os_error();
            libc::close(dup);
            return Err(e);
        }
        libc::rewinddir(d); // the duplicate shares its offset with the original
        let mut names = Vec::new();
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            if let Ok(name) = CStr::from_ptr((*e).d_name.as_ptr()).to_str() {
                names.push(name.to_string());
            }
        }
        libc::closedir(d);
        Ok(names)
    }
}

/// Opens a ring file by name inside the ring directory: read-write, never blocking (a
/// FIFO named like a ring opens at once and is then refused by `fstat`), never through a
/// symlink.
fn open_ring_file(dir: &OwnedFd, name: &str) -> std::io::Result<std::fs::File> {
    let c = CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated name relative to our directory fd; the fd returned is ours.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd that nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
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

/// What a look at a ring header tells, read without locking the file.
enum Peek {
    /// The header is not yet published.
    NotReady,
    /// No run id (or too small to say: `open` refuses it): drained as usual.
    Plain,
    /// Stamped with a run id: a `vramhook run` session's ring, with what it says of its
    /// process (untrusted, only listed).
    Run { pid: u32, start_time: u64, pid_ns: u64, exe: String, cmdline: Vec<String> },
}

/// Reads a ring's header page (without blocking: the caller checked that it is a regular
/// file) without locking the file. Only used to leave `vramhook run` sessions' rings alone
/// and list them: everything a drained ring says is validated by `MappedRing::from_file`.
fn peek_header(f: &std::fs::File) -> Peek {
    use vramhook_ring::{RingHeader, HEADER_SIZE, META_OFFSET};
    let mut h = vec![0u8; HEADER_SIZE];
    if f.read_exact_at(&mut h, 0).is_err() {
        return Peek::Plain; // too small: let `open` refuse it
    }
    let u32_at = |at: usize| h.get(at..at + 4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes);
    let u64_at = |at: usize| h.get(at..at + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    if u32_at(std::mem::offset_of!(RingHeader, version)) == 0 {
        return Peek::NotReady;
    }
    if u64_at(std::mem::offset_of!(RingHeader, run_id)) == 0 {
        return Peek::Plain;
    }
    let (exe, cmdline) = vramhook_ring::parse_meta(h.get(META_OFFSET..).unwrap_or_default());
    Peek::Run {
        pid: u32_at(std::mem::offset_of!(RingHeader, pid)),
        start_time: u64_at(std::mem::offset_of!(RingHeader, start_time)),
        pid_ns: u64_at(std::mem::offset_of!(RingHeader, pid_ns)),
        exe,
        cmdline,
    }
}

/// At most `max` characters of untrusted text, control characters (a terminal's escape
/// sequences, newlines in a log line) replaced by `?`.
fn printable(s: &str, max: usize) -> String {
    s.chars().take(max).map(|c| if c.is_control() { '?' } else { c }).collect()
}

/// The pids holding an `flock` on each of the files `idents` (device, inode), from
/// /proc/locks (read up to 4 MiB). A pid the kernel cannot name in this pid namespace
/// reads as 0 there and is left out.
fn lock_holders(idents: &[(u64, u64)]) -> BTreeMap<(u64, u64), u32> {
    use std::io::Read;
    let mut text = Vec::new();
    let Ok(f) = std::fs::File::open("/proc/locks") else { return BTreeMap::new() };
    if f.take(4 << 20).read_to_end(&mut text).is_err() {
        return BTreeMap::new();
    }
    let wanted: std::collections::BTreeSet<(u64, u64)> = idents.iter().copied().collect();
    let mut out = BTreeMap::new();
    for line in String::from_utf8_lossy(&text).lines() {
        // "1: FLOCK  ADVISORY  WRITE 1234 00:1b:5678 0 EOF" (waiters: "1: -> FLOCK ...").
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        let Ok(pid) = f[4].parse::<u32>() else { continue };
        let mut dev = f[5].split(':');
        let (Some(major), Some(minor), Some(ino), None) = (dev.next(), dev.next(), dev.next(), dev.next()) else {
            continue;
        };
        let (Ok(major), Ok(minor), Ok(ino)) =
            (u32::from_str_radix(major, 16), u32::from_str_radix(minor, 16), ino.parse::<u64>())
        else {
            continue;
        };
        let ident = (libc::makedev(major, minor), ino);
        if pid != 0 && wanted.contains(&ident) {
            out.insert(ident, pid);
        }
    }
    out
}

/// `<pid>-<start>-<image>.ring`
pub fn parse_ring_name(name: &str) -> Option<RingKey> {
    let stem = name.strip_suffix(".ring")?;
    let mut parts = stem.split('-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    let image = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some((pid, start, image))
}

/// The start time of the process that holds `pid` now (a zombie too: it still owns its
/// pid and its /proc entry), if there is one.
fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    vramhook_ring::dir::parse_stat_start(&stat).map(|(_, start)| start)
}

/// Field 4 of /proc/PID/stat: the parent's pid, as this reader sees it.
fn proc_ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|b| *b == b')')?;
    let field = stat[close + 1..].split(|b| *b == b' ').filter(|f| !f.is_empty()).nth(1)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// The pid, in this reader's pid namespace, of the process that is `ns_pid` in the pid
/// namespace `ns` (its inode) and started at `start_time`: the one whose `NSpid` line in
/// /proc/PID/status ends with `ns_pid`, whose namespace is `ns`, and whose start matches.
pub fn pid_in_this_namespace(ns: u64, ns_pid: u32, start_time: u64) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if std::fs::metadata(format!("/proc/{pid}/ns/pid")).map(|m| m.ino()).ok() != Some(ns) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let innermost = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|v| v.split_whitespace().last())
            .and_then(|v| v.parse::<u32>().ok());
        if innermost == Some(ns_pid) && proc_start_time(pid) == Some(start_time) {
            return Some(pid);
        }
    }
    None
}

/// Whether `pid` is still the process that started at `start_time` and has not exited
/// (one implementation for the interposer's gc, `vramhook gc` and the agent).
pub use vramhook_ring::dir::process_alive;

/// The default ring directory for this user: `/dev/shm/vramhook/<euid>`.
pub fn default_ring_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/dev/shm/vramhook/{uid}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_names() {
        assert_eq!(parse_ring_name("12-34-0.ring"), Some((12, 34, 0)));
        assert_eq!(parse_ring_name("12-34.ring"), None);
        assert_eq!(parse_ring_name("12-34-0-1.ring"), None);
        assert_eq!(parse_ring_name("x-34-0.ring"), None);
        assert_eq!(parse_ring_name("12-34-0.ring.tmp"), None);
    }

    fn own_start_time() -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", std::process::id())).expect("stat");
        let after = &stat[stat.rfind(')').expect(")") + 2..];
        after.split(' ').nth(19).expect("field").parse().expect("number")
    }

    /// A ring file seen between its creation and its sizing is not refused while its
    /// process lives (it was, and the whole process went missing from the capture).
    #[test]
    fn an_empty_ring_of_a_live_process_is_waited_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let live = dir.path().join(format!("{}-{}-0.ring", std::process::id(), own_start_time()));
        let gone = dir.path().join(format!("{}-1-0.ring", u32::MAX - 1));
        std::fs::write(&live, b"").expect("create");
        std::fs::write(&gone, b"").expect("create");
        let mut source = RingSource::new(dir.path(), RingFilter::default(), None);
        for _ in 0..3 {
            source.poll(&mut |_| {});
        }
        let refused: Vec<PathBuf> = source.take_refusals().into_iter().map(|r| r.path).collect();
        assert_eq!(refused, vec![gone], "only the ring of a process that is gone is refused");
        assert_eq!(source.open_rings(), 0);
    }

    /// A ring made with the protocol's writer, holding `events`, for a process that is gone.
    fn write_ring(dir: &Path, pid: u32, start: u64, events: &[Event]) {
        use vramhook_ring::RingInit;
        // SAFETY: geteuid has no preconditions.
        let init =
            RingInit { capacity: 16, pid, start_time: start, uid: unsafe { libc::geteuid() }, ..RingInit::default() };
        let name = format!("{pid}-{start}-0.ring");
        let (w, map, len) = vramhook_testkit::make_ring_file(dir, &name, &init, 1, b"", |_, _| {});
        for e in events {
            assert!(w.push(&e.to_raw()));
        }
        // SAFETY: the mapping made above; the writer is not used after this.
        unsafe { libc::munmap(map.cast(), len) };
    }

    /// Two rings of processes that are gone with the same pid (pid reuse) are never open
    /// together: the model knows a process by its pid, so the first is drained and closed
    /// before the second is announced, and each event lands on its own process. Events
    /// naming another pid, or another start of this pid, and NVML samples (a reader's
    /// records, never a traced process's) are refused and counted.
    #[test]
    fn rings_of_one_pid_are_drained_one_after_the_other_and_foreign_events_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid = u32::MAX - 7;
        let ev = |pid: u32, size: u64| Event {
            pid,
            kind: EventKind::Alloc.code(),
            api: Api::cuMemAlloc_v2.code(),
            addr: 0x1000,
            size,
            ..Event::default()
        };
        let start_of_other = Event { kind: EventKind::ProcessStart.code(), aux: 2, ..ev(pid, 0) };
        // An NVML sample naming a holder of 1 TiB, written by the traced process itself.
        let nvml = Event::gpu_process(1, 1, 4242, 1 << 40, b"holder").at(1).by(pid, 0).on_device(0);
        write_ring(dir.path(), pid, 1, &[ev(pid, 10), ev(1, 1 << 40), start_of_other, nvml]);
        write_ring(dir.path(), pid, 2, &[ev(pid, 20)]);
        let mut source = RingSource::new(dir.path(), RingFilter::default(), None);
        source.batch_limit = 1; // several polls per ring: time for the two to interleave
        let mut seen = Vec::new();
        let mut foreign = 0;
        for _ in 0..10 {
            let summary = source.poll(&mut |item| match item {
                SourceItem::Process(p) => seen.push(format!("process {}", p.start_time)),
                SourceItem::Events(es) => seen.extend(es.iter().map(|e| format!("event {} {}", e.pid, e.size))),
                SourceItem::End(e) => seen.push(format!("end {} malformed {}", e.start_time, e.malformed)),
            });
            foreign += summary.foreign;
        }
        let expected = [
            "process 1".to_string(),
            format!("event {pid} 10"),
            "end 1 malformed 3".into(),
            "process 2".into(),
            format!("event {pid} 20"),
            "end 2 malformed 0".into(),
        ];
        assert_eq!(seen, expected);
        assert_eq!(foreign, 3);
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "both rings removed");
    }

    /// A `vramhook run` session's ring (stamped with a run id) is left alone and listed:
    /// its process as the header says (control characters replaced), the session as the
    /// holder of its lock, announced once; gone from the list with its file.
    #[test]
    fn a_run_sessions_ring_is_listed_not_drained() {
        use std::os::fd::AsRawFd;
        use vramhook_ring::RingInit;
        let dir = tempfile::tempdir().expect("tempdir");
        let (pid, start) = (std::process::id(), own_start_time());
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        let init = RingInit { capacity: 16, pid, start_time: start, uid, run_id: 7, ..RingInit::default() };
        let name = format!("{pid}-{start}-0.ring");
        let meta = b"/usr/bin/python3\0python3\0train.py\x1b[2J";
        let (w, map, len) = vramhook_testkit::make_ring_file(dir.path(), &name, &init, 1, meta, |_, _| {});
        assert!(w.push(&Event { pid, kind: EventKind::Alloc.code(), size: 10, ..Event::default() }.to_raw()));
        // The session: another open file holding the ring's lock.
        let session = std::fs::File::open(dir.path().join(&name)).expect("open");
        // SAFETY: flock on a descriptor of ours.
        assert_eq!(unsafe { libc::flock(session.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);

        let mut source = RingSource::new(dir.path(), RingFilter::default(), None);
        source.skip_run_rings = true;
        let mut items = 0;
        source.poll(&mut |_| items += 1);
        assert_eq!((source.open_rings(), items), (0, 0), "not drained");
        let listed = RecordedByRun {
            pid,
            start_time: start,
            exe: "/usr/bin/python3".into(),
            command: "python3 train.py?[2J".into(),
            run_pid: Some(pid),
        };
        assert_eq!(source.run_rings(), vec![listed.clone()]);
        assert_eq!(source.take_new_run_rings(), vec![listed.clone()], "announced once its session is known");
        source.poll(&mut |_| items += 1);
        assert!(source.take_new_run_rings().is_empty(), "announced once");
        assert_eq!(source.run_rings(), vec![listed]);
        assert_eq!(items, 0);

        drop(session);
        std::fs::remove_file(dir.path().join(&name)).expect("remove");
        source.poll(&mut |_| {});
        assert!(source.run_rings().is_empty(), "gone with its file");
        // SAFETY: the mapping made above; the writer is not used after this.
        unsafe { libc::munmap(map.cast(), len) };
    }

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let pid = std::process::id();
        let start = own_start_time();
        assert!(process_alive(pid, start));
        assert!(!process_alive(pid, start + 1));
        assert!(!process_alive(u32::MAX - 1, start));
    }
}
