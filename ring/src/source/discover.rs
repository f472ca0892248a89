//! Discovery: the ring directory scanned (through its descriptor, never by path), each new
//! ring file checked (owner, name, header, size, the process it names) and opened as its one
//! reader, or refused, or left to the `vramhook run` session that records it and listed.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use vramhook_protocol::capture::{ProcessEnd, ProcessInfo};

use super::{
    drops_reported, max_ring_mib_for, ring_name, OpenedRing, Refusal, RingKey, RingSource, RunRingProcess, TooLarge,
    Tracked, NOT_READY_RETRY,
};
use crate::dir::process_alive;
use crate::{MappedRing, RingError};

/// A ring left to a `vramhook run` session (see `RingSource::skip_run_rings`): listed while
/// its process lives and its file is there, never drained.
pub(super) struct RunRing {
    pub(super) listed: RunRingProcess,
    /// The file's identity (device, inode): the key of its lock in /proc/locks.
    ident: (u64, u64),
    /// A writer in another pid namespace cannot be looked up in this /proc: it is listed
    /// until its file goes.
    other_ns: bool,
    /// When it was first listed (the session's pid is looked for up to `RUN_PID_PATIENCE`).
    pub(super) since: std::time::Instant,
    /// Whether it was handed on by [`RingSource::take_new_run_rings`] (once per ring).
    pub(super) announced: bool,
}

/// Most rings of `vramhook run` sessions listed at once (each holds at most about 2 KiB):
/// a user churning ring files cannot grow the reader's memory without bound.
const MAX_RUN_RINGS: usize = 1024;
/// How long the holder of a run ring's lock is looked for (the session opens the ring
/// soon after its process makes it); a ring is announced once it is found or this passed.
pub(super) const RUN_PID_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);
/// Least time between two reads of /proc/locks.
const LOCKS_GAP: std::time::Duration = std::time::Duration::from_millis(200);

impl RingSource {
    pub(super) fn discover(&mut self) -> usize {
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
                Err(OpenError::Refuse(reason)) => self.refuse(path, reason, None),
                Err(OpenError::TooLarge(t)) => {
                    let reason = format!(
                        "ring file is {} bytes, more than the {} bytes this reader takes: its process is not \
                         traced (--max-ring-mib {} takes it)",
                        t.len,
                        t.max,
                        max_ring_mib_for(t.len)
                    );
                    self.refuse(path, reason, Some(t));
                }
            }
        }
        self.find_run_sessions(now);
        opened
    }

    /// Refuses a ring file for good (not looked at again while it is there), reported once.
    fn refuse(&mut self, path: PathBuf, reason: String, too_large: Option<TooLarge>) {
        self.new_refusals.push(Refusal { path: path.clone(), reason: reason.clone(), hostile: false, too_large });
        self.refused.insert(path, reason);
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
                    listed: RunRingProcess {
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
            Err(RingError::TooLarge { len, max }) => Err(OpenError::TooLarge(TooLarge { uid: meta.uid(), len, max })),
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
}

enum OpenError {
    NotReady,
    Ignore,
    /// A `vramhook run` session's ring: left alone, and listed.
    RunRing(Box<RunRing>),
    Refuse(String),
    /// Larger than this reader takes: refused, and counted by the reader per owner.
    TooLarge(TooLarge),
}

/// Opens the ring directory: the one place it is opened by path, once, with the ring
/// directory rules checked on the descriptor (`ringdir::open_ring_dir`: no symlink, the
/// shared parent 1777 and sticky, the user's directory 0700 and its owner's). See
/// `ringdir::expected_owner` for whose directory a root agent drains.
fn open_dir_fd(path: &Path) -> std::io::Result<OwnedFd> {
    // SAFETY: geteuid has no preconditions.
    let owner = crate::dir::expected_owner(path, unsafe { libc::geteuid() });
    crate::dir::open_ring_dir(path, owner).map_err(std::io::Error::other)
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
    use crate::{RingHeader, HEADER_SIZE, META_OFFSET};
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
    let (exe, cmdline) = crate::parse_meta(h.get(META_OFFSET..).unwrap_or_default());
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
pub(super) fn parse_ring_name(name: &str) -> Option<RingKey> {
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
    crate::dir::parse_stat_start(&stat).map(|(_, start)| start)
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
fn pid_in_this_namespace(ns: u64, ns_pid: u32, start_time: u64) -> Option<u32> {
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
