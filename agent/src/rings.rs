//! The ring source: finds the rings of traced processes, drains them, notices when a
//! process is gone and closes its stream.
//!
//! A ring is named `<pid>-<start time>-<image>.ring` (the image number grows with each
//! `exec` of the same process). Everything inside a ring is untrusted input.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use vramhook_protocol::capture::{ProcessEnd, ProcessInfo};
use vramhook_protocol::clock::TscClock;
use vramhook_protocol::record::{Api, Event, EventKind};
use vramhook_protocol::ring::{MappedRing, RingError};

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingCursor {
    pub key: (u32, u64, u64),
    pub slots: u64,
    pub drops_reported: u64,
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
}

/// Key: (pid, start time, image).
type RingKey = (u32, u64, u64);

pub struct RingSource {
    dir: PathBuf,
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
}

impl RingSource {
    pub fn new(dir: impl Into<PathBuf>, filter: RingFilter, tsc: Option<TscClock>) -> RingSource {
        RingSource {
            dir: dir.into(),
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
        }
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
    pub fn ring_cursors(&self) -> Vec<RingCursor> {
        self.rings
            .iter()
            .map(|(k, t)| RingCursor {
                key: *k,
                slots: t.accounted + t.lost_reported,
                drops_reported: drops_reported(&t.ring),
            })
            .collect()
    }

    /// Tells the source how many slots of a just-opened ring earlier readers handed on
    /// and were recorded (events, and `Dropped` markers' aux): the rest behind the
    /// cursor is reported lost. Without it, everything an earlier reader took is.
    pub fn set_recorded(&mut self, key: (u32, u64, u64), slots: u64) {
        if let Some(t) = self.rings.get_mut(&key) {
            t.accounted = slots;
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

    /// Rings refused since the last call.
    pub fn take_refusals(&mut self) -> Vec<Refusal> {
        std::mem::take(&mut self.new_refusals)
    }

    /// Finds new rings, drains every open one, and closes those whose writer is gone and
    /// whose events are all read.
    pub fn poll(&mut self, sink: &mut dyn FnMut(SourceItem<'_>)) -> PollSummary {
        let mut summary = PollSummary::default();
        if self.auto_discover {
            summary.opened = self.discover();
        }
        let now = std::time::Instant::now();
        let liveness_interval = self.liveness_interval;
        let keys: Vec<RingKey> = self.rings.keys().copied().collect();
        for key in keys {
            let superseded = self.rings.range((key.0, key.1, key.2 + 1)..=(key.0, key.1, u64::MAX)).next().is_some();
            let Some(t) = self.rings.get_mut(&key) else { continue };
            if !t.announced {
                t.announced = true;
                sink(SourceItem::Process(&t.info));
            }
            let counters = t.ring.reader.counters();
            let alive = match t.checked {
                // A ring marked exited is looked up every poll until its process is gone.
                Some((at, alive))
                    if !liveness_interval.is_zero()
                        && now.duration_since(at) < liveness_interval
                        && !counters.exited =>
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
            self.batch.clear();
            let batch = &mut self.batch;
            let stats = t.ring.reader.poll(self.batch_limit, writer_gone, |e| batch.push(e));
            // Slot accounting: every slot behind the cursor was delivered (now or before a
            // restart, as recorded), lost in flight, malformed, or taken by an earlier
            // reader that died before its events were recorded. The reader may consume
            // ahead of its cursor, so `position - accounted` is a lower bound of the last
            // kind, exact whenever the reader has caught up: report its growth as a
            // `Dropped` marker (aux = slots), so nothing is lost silently.
            t.accounted += stats.delivered + stats.lost_in_flight + stats.malformed;
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
                t.end.lost_in_flight += skipped;
                summary.skipped += skipped;
            }
            t.end.delivered += stats.delivered;
            t.end.dropped += stats.dropped.saturating_sub(stats.lost_in_flight);
            t.end.lost_in_flight += stats.lost_in_flight;
            t.end.malformed += stats.malformed;
            t.end.hook_misses = counters.hook_misses;
            summary.delivered += stats.delivered;
            summary.malformed += stats.malformed;
            summary.dropped += stats.dropped;
            if !self.batch.is_empty() {
                sink(SourceItem::Events(&self.batch));
            }
            if writer_gone && t.ring.reader.pending() == 0 {
                if let Some(t) = self.rings.remove(&key) {
                    let mut end = t.end;
                    end.exit_status = self.exit_statuses.get(&key.0).copied();
                    end.ts_ns = vramhook_protocol::clock::monotonic_ns();
                    let path = ring_path(&self.dir, key);
                    drop(t.ring);
                    let _ = std::fs::remove_file(path);
                    sink(SourceItem::End(end));
                    summary.closed += 1;
                }
            }
        }
        summary
    }

    fn discover(&mut self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut found: Vec<(RingKey, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let path = e.path();
                parse_ring_name(path.file_name()?.to_str()?).map(|k| (k, path))
            })
            .filter(|(k, p)| {
                !self.rings.contains_key(k) && !self.refused.contains_key(p) && !self.ignored.contains_key(p)
            })
            .collect();
        found.sort();
        let mut opened = 0;
        for (key, path) in found {
            if self.skip_run_rings {
                match peek_run_id(&path) {
                    None => continue, // header not yet published: next scan
                    Some(0) => {}
                    Some(_) => {
                        self.ignored.insert(path, ());
                        continue;
                    }
                }
            }
            match self.open(&path, key) {
                Ok(Some(tracked)) => {
                    if self.opened_log.len() >= 4096 {
                        self.opened_log.remove(0); // a caller that never takes them
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
                Err(OpenError::NotReady) => {} // header not yet published: next scan
                Err(OpenError::Ignore) => {
                    self.ignored.insert(path, ());
                }
                Err(OpenError::Refuse(reason)) => {
                    self.new_refusals.push(Refusal { path: path.clone(), reason: reason.clone() });
                    self.refused.insert(path, reason);
                }
            }
        }
        opened
    }

    fn open(&self, path: &Path, key: RingKey) -> Result<Option<Tracked>, OpenError> {
        let ring = match MappedRing::open(path, self.tsc) {
            Ok(Some(ring)) => ring,
            Ok(None) => return Err(OpenError::Ignore), // another reader holds it
            Err(RingError::NotReady) => return Err(OpenError::NotReady),
            Err(RingError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Err(OpenError::Ignore),
            // The writer creates the file, then sizes it: a scan may see it empty. Wait
            // while the process it names lives; what it left unsized when gone is refused.
            Err(RingError::TooSmall(_)) if process_alive(key.0, key.1) => return Err(OpenError::NotReady),
            Err(e) => return Err(OpenError::Refuse(e.to_string())),
        };
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
        // The ring must belong to the process it names: /proc/PID is owned by that
        // process's uid. (A process already gone cannot be checked; so is one that made
        // itself non-dumpable, whose /proc entry root owns: such a ring is refused.)
        if process_alive(key.0, key.1) {
            if let Ok(meta) = std::fs::metadata(format!("/proc/{}", key.0)) {
                if meta.uid() != owner {
                    return Err(OpenError::Refuse(format!(
                        "ring owned by uid {owner} names process {}, which runs as uid {}",
                        key.0,
                        meta.uid()
                    )));
                }
            }
        }
        let process = ProcessInfo {
            pid: info.pid,
            ppid: info.ppid,
            uid: info.uid,
            start_time: info.start_time,
            run_id: info.run_id,
            exe: info.exe.clone(),
            cmdline: info.cmdline.clone(),
        };
        Ok(Some(Tracked {
            ring,
            end: ProcessEnd { pid: info.pid, start_time: info.start_time, ..ProcessEnd::default() },
            info: process,
            image: key.2,
            announced: false,
            checked: None,
            accounted: 0,
            lost_reported: 0,
        }))
    }

    /// Image number (exec count) of an open ring, for diagnostics.
    pub fn image_of(&self, pid: u32) -> Option<u64> {
        self.rings.values().find(|t| t.info.pid == pid).map(|t| t.image)
    }
}

enum OpenError {
    NotReady,
    Ignore,
    Refuse(String),
}

fn ring_path(dir: &Path, key: RingKey) -> PathBuf {
    dir.join(format!("{}-{}-{}.ring", key.0, key.1, key.2))
}

/// The run id of a ring header, read without locking the file; `None` while the header
/// is not yet published. Only used to leave other sessions' rings alone: everything else
/// is validated by `MappedRing::open`.
fn peek_run_id(path: &Path) -> Option<u64> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path).ok()?;
    let mut h = [0u8; 48];
    if f.read_exact(&mut h).is_err() {
        return Some(0); // too small: let `open` refuse it
    }
    let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if version == 0 {
        return None;
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&h[40..48]);
    Some(u64::from_le_bytes(id))
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

/// Whether `pid` is still the process that started at `start_time` and has not exited.
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else { return false };
    let Some(close) = stat.iter().rposition(|b| *b == b')') else { return false };
    let fields: Vec<&[u8]> = stat[close + 1..].split(|b| *b == b' ').filter(|f| !f.is_empty()).collect();
    let state = fields.first().and_then(|f| f.first()).copied().unwrap_or(b'X');
    let started = fields.get(19).and_then(|f| std::str::from_utf8(f).ok()).and_then(|s| s.parse::<u64>().ok());
    state != b'Z' && state != b'X' && started == Some(start_time)
}

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

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let pid = std::process::id();
        let start = own_start_time();
        assert!(process_alive(pid, start));
        assert!(!process_alive(pid, start + 1));
        assert!(!process_alive(u32::MAX - 1, start));
    }
}
