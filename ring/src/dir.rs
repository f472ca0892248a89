//! The ring directory: who may own it, what a ring's name says, whether a ring's process is
//! alive and its events drained, how big a new ring may be, and which rings are removed
//! (the gc policy). One implementation for the interposer (at ring creation only), the
//! agent and the cli.
//!
//! Rules (ARCHITECTURE.md, "The shared-memory ring"):
//! - the shared parent `/dev/shm/vramhook` is a real directory (not a symlink), mode 1777
//!   with the sticky bit, owned by root or the current user;
//! - each user's directory is a real directory, mode 0700, owned by that user; a directory
//!   given explicitly (`VRAMHOOK_DIR`, `--ring-dir`) must be a real directory owned by the
//!   user and writable by nobody else unless it has the sticky bit (as /tmp);
//! - a ring whose process is gone and whose events are drained is removed; one not drained
//!   is kept for a later reader within a per-user budget (a share of the file system and
//!   an age), oldest removed first, each such removal counted in [`GC_RECORD_NAME`];
//! - a new ring takes at most its configured size, at most [`FREE_SHARE_PERCENT`] of the
//!   space free at that moment and at most `RLIMIT_FSIZE`, never fewer than
//!   [`MIN_RING_SLOTS`] slots.
//!
//! Everything the interposer calls here works on raw file descriptors and stack buffers:
//! no allocation, no panic.

use crate::{ring_file_size_lanes, RingHeader, HEADER_SIZE, LANE_CURSORS_OFFSET, LANE_READ_OFFSET, MAX_LANES};
use core::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// The shared parent of the per-user ring directories.
pub const DEFAULT_PARENT: &str = "/dev/shm/vramhook";
/// Counts of undrained rings removed by gc: one line, `<rings> <bytes>\n`.
pub const GC_RECORD_NAME: &str = ".gc-removed";
/// A new ring takes at most this share of the space free when it is made.
pub const FREE_SHARE_PERCENT: u64 = 10;
/// Fewer slots than this and the process runs untraced.
pub const MIN_RING_SLOTS: u64 = 1024;
/// Default budget for undrained rings of gone processes: share of the file system.
pub const DEFAULT_KEEP_PERCENT: u64 = 10;
/// Default budget for undrained rings of gone processes: age.
pub const DEFAULT_KEEP_HOURS: u64 = 24;

/// Which directory broke a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirRole {
    /// The shared parent, `/dev/shm/vramhook`.
    Parent,
    /// The user's ring directory.
    UserDir,
}

impl core::fmt::Display for DirRole {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            DirRole::Parent => "shared parent /dev/shm/vramhook",
            DirRole::UserDir => "ring directory",
        })
    }
}

/// Why a ring directory is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingDirError {
    #[error("{0} is a symbolic link")]
    Symlink(DirRole),
    #[error("{0} is not a directory")]
    NotADirectory(DirRole),
    #[error("{role} is owned by uid {found}, expected {expected}")]
    Owner { role: DirRole, found: u32, expected: &'static str },
    #[error("{role} has mode {found:04o}, expected {expected}")]
    Mode { role: DirRole, found: u32, expected: &'static str },
    #[error("{role}: {err}")]
    Io { role: DirRole, err: Errno },
    #[error("path contains a NUL byte or is too long")]
    BadPath,
}

/// An OS error number, displayed as its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i32);

impl core::fmt::Display for Errno {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.0))
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

impl RingDirError {
    /// A short fixed text for the interposer's one warning line (no allocation).
    pub fn reason(&self) -> &'static [u8] {
        use DirRole::*;
        match self {
            RingDirError::Symlink(Parent) => b"/dev/shm/vramhook is a symbolic link",
            RingDirError::Symlink(UserDir) => b"ring directory is a symbolic link",
            RingDirError::NotADirectory(Parent) => b"/dev/shm/vramhook is not a directory",
            RingDirError::NotADirectory(UserDir) => b"ring directory is not a directory",
            RingDirError::Owner { role: Parent, .. } => b"/dev/shm/vramhook is owned by another user",
            RingDirError::Owner { role: UserDir, .. } => b"ring directory owned by another user",
            RingDirError::Mode { role: Parent, .. } => b"/dev/shm/vramhook is not mode 1777 with the sticky bit",
            RingDirError::Mode { role: UserDir, expected: "0700", .. } => b"ring directory mode is not 0700",
            RingDirError::Mode { role: UserDir, .. } => b"ring directory is writable by other users (make it 0700)",
            RingDirError::Io { err, .. } => errno_text(err.0),
            RingDirError::BadPath => b"ring directory path too long",
        }
    }
}

/// A short fixed text for an errno (no allocation).
pub fn errno_text(errno: i32) -> &'static [u8] {
    match errno {
        libc::EACCES => b"permission denied",
        libc::EPERM => b"operation not permitted",
        libc::ENOENT => b"no such directory",
        libc::ENOSPC => b"no space left",
        libc::EDQUOT => b"disk quota exceeded",
        libc::EROFS => b"read-only file system",
        libc::ENOTDIR => b"not a directory",
        libc::EEXIST => b"already exists",
        libc::ENOMEM => b"out of memory",
        libc::EFBIG => b"file size limit (ulimit -f) too small",
        libc::ELOOP => b"symbolic link",
        libc::EMFILE | libc::ENFILE => b"too many open files",
        _ => b"error",
    }
}

/// Checks the shared parent's `lstat`/`fstat`: a real directory, 1777 with the sticky bit,
/// owned by root or `uid`.
pub fn check_parent(st: &libc::stat, uid: u32) -> Result<(), RingDirError> {
    let role = DirRole::Parent;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => {}
        libc::S_IFLNK => return Err(RingDirError::Symlink(role)),
        _ => return Err(RingDirError::NotADirectory(role)),
    }
    if st.st_uid != 0 && st.st_uid != uid {
        return Err(RingDirError::Owner { role, found: st.st_uid, expected: "root or the current user" });
    }
    if st.st_mode & 0o7777 != 0o1777 {
        return Err(RingDirError::Mode { role, found: st.st_mode & 0o7777, expected: "1777 (sticky)" });
    }
    Ok(())
}

/// Checks a ring directory's `fstat`: a real directory owned by `uid`; under the default
/// parent exactly 0700, elsewhere writable by nobody but its owner unless sticky.
pub fn check_user_dir(st: &libc::stat, uid: u32, under_default: bool) -> Result<(), RingDirError> {
    let role = DirRole::UserDir;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => {}
        libc::S_IFLNK => return Err(RingDirError::Symlink(role)),
        _ => return Err(RingDirError::NotADirectory(role)),
    }
    if st.st_uid != uid {
        return Err(RingDirError::Owner { role, found: st.st_uid, expected: "the current user" });
    }
    let mode = st.st_mode & 0o7777;
    if under_default && mode != 0o700 {
        return Err(RingDirError::Mode { role, found: mode, expected: "0700" });
    }
    // An explicit directory others may write to is accepted only with the sticky bit (as
    // /tmp): then nobody else can remove or rename our rings.
    if !under_default && mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(RingDirError::Mode { role, found: mode, expected: "0700 (or sticky, as /tmp)" });
    }
    Ok(())
}

/// Whether `path` names a directory directly under [`DEFAULT_PARENT`].
pub fn is_under_default(path: &[u8]) -> bool {
    let parent = DEFAULT_PARENT.as_bytes();
    path.len() > parent.len() + 1
        && path.starts_with(parent)
        && path[parent.len()] == b'/'
        && !path[parent.len() + 1..].contains(&b'/')
}

fn fstat_fd(fd: RawFd) -> Result<libc::stat, i32> {
    // SAFETY: fstat into a zeroed buffer.
    unsafe {
        let mut st: libc::stat = core::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(last_errno());
        }
        Ok(st)
    }
}

/// Opens and checks the shared parent (no allocation); the user's directory is then
/// opened relative to this fd, so a parent swapped in between cannot redirect it.
fn open_default_parent(uid: u32) -> Result<OwnedFd, RingDirError> {
    // SAFETY: NUL-terminated path; the fd is owned below.
    let fd = unsafe {
        libc::open(
            c"/dev/shm/vramhook".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(open_error(DirRole::Parent, c"/dev/shm/vramhook"));
    }
    // SAFETY: fd is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat_fd(fd.as_raw_fd()).map_err(|e| RingDirError::Io { role: DirRole::Parent, err: Errno(e) })?;
    check_parent(&st, uid)?;
    Ok(fd)
}

/// Classifies a failed `open(O_DIRECTORY|O_NOFOLLOW)`: a symlink gives ELOOP, a file
/// ENOTDIR; an lstat tells them apart for the message.
fn open_error(role: DirRole, path: &CStr) -> RingDirError {
    let errno = last_errno();
    if errno == libc::ELOOP || errno == libc::ENOTDIR {
        // SAFETY: lstat into a zeroed buffer.
        unsafe {
            let mut st: libc::stat = core::mem::zeroed();
            if libc::lstat(path.as_ptr(), &mut st) == 0 {
                if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    return RingDirError::Symlink(role);
                }
                if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return RingDirError::NotADirectory(role);
                }
            }
        }
    }
    RingDirError::Io { role, err: Errno(errno) }
}

/// [`open_ring_dir`] on a NUL-terminated path, without allocation (for the interposer).
pub fn open_ring_dir_c(path: &CStr, owner: u32) -> Result<OwnedFd, RingDirError> {
    const FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let under_default = is_under_default(path.to_bytes());
    let fd = if under_default {
        let parent = open_default_parent(owner)?;
        let leaf = &path.to_bytes_with_nul()[DEFAULT_PARENT.len() + 1..];
        // SAFETY: a NUL-terminated name relative to the checked parent.
        unsafe { libc::openat(parent.as_raw_fd(), leaf.as_ptr() as *const libc::c_char, FLAGS) }
    } else {
        // SAFETY: NUL-terminated path.
        unsafe { libc::open(path.as_ptr(), FLAGS) }
    };
    if fd < 0 {
        return Err(open_error(DirRole::UserDir, path));
    }
    // SAFETY: fd is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat_fd(fd.as_raw_fd()).map_err(|e| RingDirError::Io { role: DirRole::UserDir, err: Errno(e) })?;
    check_user_dir(&st, owner, under_default)?;
    Ok(fd)
}

/// [`make_ring_dir`] on a NUL-terminated path, without allocation (for the interposer).
/// Makes only the last component (and the shared parent when the path is under it).
pub fn make_ring_dir_c(path: &CStr, uid: u32) -> Result<OwnedFd, RingDirError> {
    if is_under_default(path.to_bytes()) {
        // SAFETY: NUL-terminated path. The parent is sticky and world-writable like /tmp;
        // mode bits beyond the umask are set with chmod right after we made it (/dev/shm is
        // sticky, so nobody else can swap it in between).
        unsafe {
            if libc::mkdir(c"/dev/shm/vramhook".as_ptr(), 0o1777) == 0 {
                libc::chmod(c"/dev/shm/vramhook".as_ptr(), 0o1777);
            }
        }
    }
    // SAFETY: NUL-terminated path.
    if unsafe { libc::mkdir(path.as_ptr(), 0o700) } == 0 {
        // A umask may have taken bits away; ours, just made: set exactly 0700.
        // SAFETY: NUL-terminated path.
        unsafe { libc::chmod(path.as_ptr(), 0o700) };
    } else {
        let errno = last_errno();
        if errno != libc::EEXIST {
            return Err(RingDirError::Io { role: DirRole::UserDir, err: Errno(errno) });
        }
    }
    open_ring_dir_c(path, uid)
}

fn c_path(path: &Path) -> Result<std::ffi::CString, RingDirError> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| RingDirError::BadPath)
}

/// Opens a ring directory (O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC) and checks it by `fstat`: a
/// real directory owned by `owner` (0700 under the default parent, which is then checked
/// too: 1777 sticky, owned by root or `owner`; elsewhere writable by nobody else).
/// Whose ring directory `path` must be for a reader running as `euid`. Anyone but root
/// reads only their own. Root reads `<parent>/<uid>` (the default layout's
/// `/dev/shm/vramhook/<uid>`, or the same shape elsewhere) as that uid's, so one root agent
/// per user directory drains that user's rings; any other name is root's own. A directory
/// whose owner is not the one expected is refused by [`open_ring_dir`]: a name that says
/// whose it is cannot be squatted by someone else.
pub fn expected_owner(path: &Path, euid: u32) -> u32 {
    if euid != 0 {
        return euid;
    }
    path.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse::<u32>().ok()).unwrap_or(euid)
}

pub fn open_ring_dir(path: &Path, owner: u32) -> Result<OwnedFd, RingDirError> {
    open_ring_dir_c(&c_path(path)?, owner)
}

/// Makes a ring directory as the rules say (the shared parent 1777 with the sticky bit,
/// the user's directory 0700; missing ancestors of an explicit directory 0755), then opens
/// it as [`open_ring_dir`] does.
///
/// Under the default parent it also repairs the modes of directories that are already
/// the caller's own (a real directory, not a link, owned by `uid`): a parent made 0755 (as
/// earlier agents and a Kubernetes `DirectoryOrCreate` hostPath did) becomes 1777, a user
/// directory made 0755 becomes 0700. Nobody else can make a directory owned by `uid`, so
/// this fixes loose modes without trusting a squatter; anything not ours is refused. The
/// interposer does not repair (it uses [`make_ring_dir_c`] and runs untraced instead).
pub fn make_ring_dir(path: &Path, uid: u32) -> Result<OwnedFd, RingDirError> {
    let c = c_path(path)?;
    if is_under_default(c.to_bytes()) {
        repair_own_mode(c"/dev/shm/vramhook", uid, 0o1777);
        make_ring_dir_c(&c, uid).or_else(|e| match e {
            RingDirError::Mode { role: DirRole::UserDir, .. } => {
                repair_own_mode(&c, uid, 0o700);
                open_ring_dir_c(&c, uid)
            }
            e => Err(e),
        })
    } else {
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                let _ = std::fs::create_dir_all(parent);
            }
        }
        make_ring_dir_c(&c, uid)
    }
}

/// Sets `mode` on `path` if it is a real directory owned by `uid` with another mode.
fn repair_own_mode(path: &CStr, uid: u32, mode: libc::mode_t) {
    // SAFETY: NUL-terminated path; the fd is owned below.
    let fd =
        unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    // SAFETY: fd is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Ok(st) = fstat_fd(fd.as_raw_fd()) {
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR && st.st_uid == uid && st.st_mode & 0o7777 != mode {
            // SAFETY: fchmod on our fd.
            unsafe { libc::fchmod(fd.as_raw_fd(), mode) };
        }
    }
}

/// The default ring directory of `uid`: `/dev/shm/vramhook/<uid>`.
pub fn default_ring_dir_for(uid: u32) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("{DEFAULT_PARENT}/{uid}"))
}

/// The default ring directory for this user: `/dev/shm/vramhook/<euid>`.
pub fn default_ring_dir() -> std::path::PathBuf {
    // SAFETY: geteuid has no preconditions.
    default_ring_dir_for(unsafe { libc::geteuid() })
}

// ---------------------------------------------------------------------------------------
// Names and liveness

fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    s.iter().try_fold(
        0u64,
        |a, b| {
            if b.is_ascii_digit() {
                a.checked_mul(10)?.checked_add(u64::from(b - b'0'))
            } else {
                None
            }
        },
    )
}

/// `<pid>-<start>-<image>.ring` → (pid, start, image).
pub fn parse_ring_name(name: &[u8]) -> Option<(u32, u64, u64)> {
    let stem = name.strip_suffix(b".ring")?;
    let mut parts = stem.split(|b| *b == b'-');
    let pid = u32::try_from(parse_decimal(parts.next()?)?).ok()?;
    let start = parse_decimal(parts.next()?)?;
    let image = parse_decimal(parts.next()?)?;
    parts.next().is_none().then_some((pid, start, image))
}

/// `.<pid>-<start>-<image>.ring.tmp` (a ring being made) → (pid, start, image).
pub fn parse_tmp_name(name: &[u8]) -> Option<(u32, u64, u64)> {
    parse_ring_name(name.strip_prefix(b".")?.strip_suffix(b".tmp")?)
}

/// Writes `<pid>-<start>-<image>.ring` (with a leading `.` and trailing `.tmp` when `tmp`)
/// and a NUL into `out`; returns the length without the NUL, or `None` if it does not fit.
pub fn format_ring_name(out: &mut [u8], pid: u32, start: u64, image: u64, tmp: bool) -> Option<usize> {
    let mut w = ByteWriter { buf: out, len: 0 };
    if tmp {
        w.push(b".")?;
    }
    w.push_u64(u64::from(pid))?;
    w.push(b"-")?;
    w.push_u64(start)?;
    w.push(b"-")?;
    w.push_u64(image)?;
    w.push(b".ring")?;
    if tmp {
        w.push(b".tmp")?;
    }
    let len = w.len;
    *w.buf.get_mut(len)? = 0;
    Some(len)
}

struct ByteWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl ByteWriter<'_> {
    fn push(&mut self, s: &[u8]) -> Option<()> {
        let end = self.len.checked_add(s.len())?;
        self.buf.get_mut(self.len..end)?.copy_from_slice(s);
        self.len = end;
        Some(())
    }
    fn push_u64(&mut self, v: u64) -> Option<()> {
        let mut digits = [0u8; 20];
        self.push(decimal(v, &mut digits))
    }
}

/// `v` in decimal, written into `digits` without allocating (the interposer names files with
/// it inside other people's processes); returns the digits used.
pub fn decimal(mut v: u64, digits: &mut [u8; 20]) -> &[u8] {
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &digits[i..]
}

/// Field 22 (start time) and the state of a `/proc/<pid>/stat` line.
pub fn parse_stat_start(stat: &[u8]) -> Option<(u8, u64)> {
    // The command name (field 2) may contain spaces and parentheses: skip to the last ')'.
    let close = stat.iter().rposition(|b| *b == b')')?;
    let mut fields = stat.get(close + 1..)?.split(|b| *b == b' ').filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    let start = fields.nth(18)?;
    let end = start.iter().position(|b| !b.is_ascii_digit()).unwrap_or(start.len());
    Some((state, parse_decimal(&start[..end])?))
}

/// Reads a small file (a /proc entry) into `out`, as much as fits; returns the bytes read, 0
/// when it cannot be opened. No allocation: the interposer calls it.
pub fn read_small_file(path: &CStr, out: &mut [u8]) -> usize {
    // SAFETY: plain open/read/close on a NUL-terminated path, reading into `out`.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return 0;
        }
        let mut n = 0usize;
        while n < out.len() {
            let r = libc::read(fd, out[n..].as_mut_ptr() as *mut libc::c_void, out.len() - n);
            if r <= 0 {
                break;
            }
            n += r as usize;
        }
        libc::close(fd);
        n
    }
}

/// Whether `pid` is still the process that started at `start_time` (field 22 of
/// `/proc/<pid>/stat`) and has not exited (not a zombie). No allocation.
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    let mut path = [0u8; 40];
    let mut w = ByteWriter { buf: &mut path, len: 0 };
    if w.push(b"/proc/").and_then(|_| w.push_u64(u64::from(pid))).and_then(|_| w.push(b"/stat\0")).is_none() {
        return false;
    }
    let Ok(path) = CStr::from_bytes_until_nul(&path) else { return false };
    let mut buf = [0u8; 1024];
    let n = read_small_file(path, &mut buf);
    match parse_stat_start(&buf[..n]) {
        Some((state, start)) => state != b'Z' && state != b'X' && start == start_time,
        None => false,
    }
}

// ---------------------------------------------------------------------------------------
// Sizing

/// Slots and lanes for a new ring that fits in `limit` bytes: the per-lane capacity is
/// halved (then the lanes) until the file fits, never below [`MIN_RING_SLOTS`] slots in
/// all. `None`: not even the floor fits.
pub fn fit_ring(capacity: u64, lanes: u32, limit: u64) -> Option<(u64, u32)> {
    let (mut capacity, mut lanes) = (capacity.max(1), lanes.clamp(1, MAX_LANES));
    let size = |c: u64, l: u32| {
        (HEADER_SIZE as u64).saturating_add(
            u64::from(l).saturating_mul(c).saturating_mul(vramhook_protocol::record::RECORD_SIZE as u64),
        )
    };
    while size(capacity, lanes) > limit {
        if capacity.saturating_mul(u64::from(lanes)) <= MIN_RING_SLOTS {
            return None;
        }
        if capacity > crate::MIN_CAPACITY {
            capacity /= 2;
        } else if lanes > 1 {
            lanes /= 2;
        } else {
            return None;
        }
    }
    // A ring asked for smaller than the floor keeps its size (the floor is for shrinking).
    Some((capacity, lanes))
}

/// The most bytes a new ring may take in the file system of `dir`: 10% of the space free
/// now, and no more than `RLIMIT_FSIZE` (a bigger file raises SIGXFSZ).
pub fn ring_size_limit(dir: RawFd) -> u64 {
    let mut limit = u64::MAX;
    // SAFETY: fstatvfs/getrlimit into zeroed buffers.
    unsafe {
        let mut vfs: libc::statvfs = core::mem::zeroed();
        if libc::fstatvfs(dir, &mut vfs) == 0 {
            let free = (vfs.f_bavail as u64).saturating_mul(vfs.f_frsize as u64);
            limit = limit.min(free / 100 * FREE_SHARE_PERCENT);
        }
        limit.min(file_size_rlimit())
    }
}

/// `RLIMIT_FSIZE` (soft), `u64::MAX` when unlimited.
pub fn file_size_rlimit() -> u64 {
    // SAFETY: getrlimit into a zeroed buffer.
    unsafe {
        let mut rl: libc::rlimit = core::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_FSIZE, &mut rl) == 0 && rl.rlim_cur != libc::RLIM_INFINITY {
            rl.rlim_cur as u64
        } else {
            u64::MAX
        }
    }
}

/// Bytes a ring of `capacity` slots per lane and `lanes` lanes takes.
pub fn ring_bytes(capacity: u64, lanes: u32) -> u64 {
    ring_file_size_lanes(capacity, lanes) as u64
}

// ---------------------------------------------------------------------------------------
// Ring state read from the file (no mapping)

/// What a ring file's header says about draining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    /// Every lane's read cursor equals its write cursor (or nothing was ever written).
    Drained,
    /// Events are waiting: how many.
    Pending(u64),
}

const STATE_BYTES: usize = LANE_READ_OFFSET + MAX_LANES as usize * 8;

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(s) = b.get(off..off + 8) {
        w.copy_from_slice(s);
    }
    u64::from_le_bytes(w)
}

/// Reads a ring's cursors from its header bytes: events not yet read, plus events read by
/// a reader that did not record them (it died: see `RingHeader::recorded`). A header never
/// published (version 0) or a file too small for one has nothing to drain.
pub fn drain_state(header: &[u8]) -> Drain {
    if header.len() < STATE_BYTES {
        return Drain::Drained;
    }
    let version = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if version == 0 {
        return Drain::Drained;
    }
    let lanes_off = core::mem::offset_of!(RingHeader, lanes);
    let lanes =
        u32::from_le_bytes([header[lanes_off], header[lanes_off + 1], header[lanes_off + 2], header[lanes_off + 3]])
            .clamp(1, MAX_LANES);
    let mut pending = 0u64;
    let mut read = 0u64;
    for lane in 0..lanes as usize {
        let (w, r) = if lane == 0 {
            (
                u64_at(header, core::mem::offset_of!(RingHeader, write_pos)),
                u64_at(header, core::mem::offset_of!(RingHeader, read_pos)),
            )
        } else {
            (u64_at(header, LANE_CURSORS_OFFSET + (lane - 1) * 64), u64_at(header, LANE_READ_OFFSET + lane * 8))
        };
        pending = pending.saturating_add(w.saturating_sub(r));
        read = read.saturating_add(r);
    }
    // Read by a reader that died before recording it: not drained, the next reader counts it.
    let unrecorded = read.saturating_sub(u64_at(header, core::mem::offset_of!(RingHeader, recorded)));
    pending = pending.saturating_add(unrecorded);
    if pending == 0 {
        Drain::Drained
    } else {
        Drain::Pending(pending)
    }
}

/// Reads the drain state of an open ring file.
pub fn drain_state_fd(fd: RawFd) -> Drain {
    ring_state_fd(fd).0
}

const GONE_SINCE_OFFSET: usize = core::mem::offset_of!(RingHeader, gone_since_s);
const PID_NS_OFFSET: usize = core::mem::offset_of!(RingHeader, pid_ns);
const STATE_OFFSET: usize = core::mem::offset_of!(RingHeader, state);

/// The inode of this process's pid namespace (0 when unknown). No allocation.
pub fn own_pid_ns() -> u64 {
    // SAFETY: stat into a zeroed buffer.
    unsafe {
        let mut st: libc::stat = core::mem::zeroed();
        if libc::stat(c"/proc/self/ns/pid".as_ptr(), &mut st) == 0 {
            st.st_ino as u64
        } else {
            0
        }
    }
}

/// What gc reads of a ring's header.
struct RingState {
    drain: Drain,
    gone_since: u64,
    pid_ns: u64,
    exited: bool,
}

/// The drain state and the `gone_since_s` stamp of an open ring file.
fn ring_state_fd(fd: RawFd) -> (Drain, u64) {
    let st = ring_state_full(fd);
    (st.drain, st.gone_since)
}

fn ring_state_full(fd: RawFd) -> RingState {
    let mut buf = [0u8; STATE_BYTES];
    let mut n = 0usize;
    while n < buf.len() {
        // SAFETY: pread into our buffer.
        let r = unsafe { libc::pread(fd, buf[n..].as_mut_ptr() as *mut libc::c_void, buf.len() - n, n as libc::off_t) };
        if r <= 0 {
            break;
        }
        n += r as usize;
    }
    let published = n >= 12 && buf[8..12] != [0, 0, 0, 0];
    let gone_since = if n >= GONE_SINCE_OFFSET + 8 { u64_at(&buf, GONE_SINCE_OFFSET) } else { 0 };
    let pid_ns = if published && n >= PID_NS_OFFSET + 8 { u64_at(&buf, PID_NS_OFFSET) } else { 0 };
    let exited = published
        && n >= STATE_OFFSET + 4
        && u32::from_le_bytes([buf[STATE_OFFSET], buf[STATE_OFFSET + 1], buf[STATE_OFFSET + 2], buf[STATE_OFFSET + 3]])
            == crate::STATE_EXITED;
    RingState { drain: drain_state(&buf[..n]), gone_since, pid_ns, exited }
}

/// Stamps a ring's header with the time its process was first found gone (in place,
/// never growing the file), keeping its modification time (the budget's oldest-first
/// order).
fn stamp_gone_since(fd: RawFd, now_secs: u64, mtime_ns: i128) -> bool {
    let b = now_secs.max(1).to_le_bytes();
    // SAFETY: pwrite of 8 bytes inside the header page; futimens on our fd.
    unsafe {
        let ok = libc::pwrite(fd, b.as_ptr() as *const libc::c_void, 8, GONE_SINCE_OFFSET as libc::off_t) == 8;
        let times = [
            libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            libc::timespec {
                tv_sec: (mtime_ns.div_euclid(1_000_000_000)) as libc::time_t,
                tv_nsec: (mtime_ns.rem_euclid(1_000_000_000)) as libc::c_long,
            },
        ];
        libc::futimens(fd, times.as_ptr());
        ok
    }
}

// ---------------------------------------------------------------------------------------
// The gc policy

/// What gc keeps and how much work one call may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcPolicy {
    /// Undrained rings of gone processes may take this share of the file system, in percent.
    pub keep_percent: u64,
    /// ... and are kept at most this long (seconds since last modified).
    pub keep_secs: u64,
    /// Directory entries looked at per pass (bounds the interposer's work).
    pub max_entries: usize,
    /// Rings removed over budget per call (each is one more pass).
    pub max_budget_removals: usize,
    /// Report, do not remove.
    pub dry_run: bool,
}

impl Default for GcPolicy {
    fn default() -> GcPolicy {
        GcPolicy {
            keep_percent: DEFAULT_KEEP_PERCENT,
            keep_secs: DEFAULT_KEEP_HOURS * 3600,
            max_entries: usize::MAX,
            max_budget_removals: usize::MAX,
            dry_run: false,
        }
    }
}

/// Parses a decimal setting (as `VRAMHOOK_KEEP_PERCENT`, `VRAMHOOK_KEEP_HOURS`).
pub fn parse_setting(v: &[u8]) -> Option<u64> {
    parse_decimal(v.trim_ascii())
}

impl GcPolicy {
    /// The defaults with `VRAMHOOK_KEEP_PERCENT` and `VRAMHOOK_KEEP_HOURS` applied.
    pub fn from_env() -> GcPolicy {
        let mut p = GcPolicy::default();
        let get = |k: &str| std::env::var_os(k).and_then(|v| parse_setting(v.as_encoded_bytes()));
        if let Some(v) = get("VRAMHOOK_KEEP_PERCENT") {
            p.keep_percent = v.min(100);
        }
        if let Some(v) = get("VRAMHOOK_KEEP_HOURS") {
            p.keep_secs = v.saturating_mul(3600);
        }
        p
    }
}

/// Why gc removed or kept an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcReason {
    /// Process gone, every event drained: removed.
    Drained,
    /// A ring still being made when its process died: removed.
    StaleTmp,
    /// Process gone, events not drained, older than the age budget: removed (counted).
    Expired,
    /// Process gone, events not drained, over the space budget (oldest first): removed (counted).
    OverBudget,
    /// Kept: the process lives.
    Live,
    /// Kept: a reader holds it.
    BeingRead,
    /// Kept: process gone, events not drained, within the budget (for a later reader).
    Undrained,
    /// Kept: not a regular file of ours.
    NotOurs,
    /// Kept: written from another pid namespace (a container sharing the directory), not
    /// marked exited: whether its process lives cannot be told from here.
    OtherPidNamespace,
}

impl GcReason {
    pub fn removes(self) -> bool {
        matches!(self, GcReason::Drained | GcReason::StaleTmp | GcReason::Expired | GcReason::OverBudget)
    }
    pub fn text(self) -> &'static str {
        match self {
            GcReason::Drained => "process gone, events drained",
            GcReason::StaleTmp => "unfinished ring of a process that is gone",
            GcReason::Expired => "process gone, events never drained, kept past the keep-hours budget",
            GcReason::OverBudget => "process gone, events never drained, over the keep-percent budget (oldest first)",
            GcReason::Live => "process running",
            GcReason::BeingRead => "a reader holds it",
            GcReason::Undrained => "process gone, events not yet drained: kept for a later agent",
            GcReason::NotOurs => "not a regular file of this user",
            GcReason::OtherPidNamespace => {
                "written from another pid namespace and not marked exited: cannot tell whether its process lives"
            }
        }
    }
}

/// One entry gc acted on or kept; the name is valid for the callback only.
#[derive(Debug)]
pub struct GcEntry<'a> {
    pub name: &'a [u8],
    pub bytes: u64,
    pub pending: u64,
    pub age_secs: u64,
    pub reason: GcReason,
}

/// What one gc call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcSummary {
    pub removed: u64,
    pub removed_bytes: u64,
    /// Of those, undrained rings (events lost): what is counted in [`GC_RECORD_NAME`].
    pub removed_undrained: u64,
    pub removed_undrained_bytes: u64,
    pub kept: u64,
    pub kept_bytes: u64,
    /// Undrained rings of gone processes left, and their bytes.
    pub kept_undrained: u64,
    pub kept_undrained_bytes: u64,
    /// The space budget for undrained rings, bytes.
    pub budget_bytes: u64,
}

/// Calls `f` with each entry name of the directory `dir` (at most `max` of them), without
/// allocation (getdents64 into a stack buffer).
fn for_each_name(dir: RawFd, max: usize, f: &mut dyn FnMut(&[u8])) {
    // SAFETY: rewinding our own directory fd.
    if unsafe { libc::lseek(dir, 0, libc::SEEK_SET) } < 0 {
        return;
    }
    let mut buf = [0u64; 512];
    let mut seen = 0usize;
    loop {
        // SAFETY: getdents64 into our (8-byte aligned) buffer.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, dir, buf.as_mut_ptr(), core::mem::size_of_val(&buf)) };
        if n <= 0 {
            return;
        }
        let bytes =
            // SAFETY: the kernel filled `n` bytes of the buffer.
            unsafe { core::slice::from_raw_parts(buf.as_ptr() as *const u8, (n as usize).min(core::mem::size_of_val(&buf))) };
        let mut off = 0usize;
        while off + 19 < bytes.len() {
            let reclen = u16::from_ne_bytes([bytes[off + 16], bytes[off + 17]]) as usize;
            if reclen < 20 || off + reclen > bytes.len() {
                return;
            }
            let name_area = &bytes[off + 19..off + reclen];
            let name = &name_area[..name_area.iter().position(|b| *b == 0).unwrap_or(name_area.len())];
            off += reclen;
            if name == b"." || name == b".." {
                continue;
            }
            f(name);
            seen += 1;
            if seen >= max {
                return;
            }
        }
    }
}

fn name_cstr<'a>(name: &[u8], buf: &'a mut [u8; 256]) -> Option<&'a CStr> {
    if name.len() >= buf.len() || name.contains(&0) {
        return None;
    }
    buf[..name.len()].copy_from_slice(name);
    buf[name.len()] = 0;
    CStr::from_bytes_with_nul(&buf[..=name.len()]).ok()
}

struct Candidate {
    /// Held open, and so locked, while gc decides.
    fd: OwnedFd,
    /// Header stamp: when a gc first found the process gone (0: not yet).
    gone_since: u64,
    /// The writer's pid namespace (0: unknown) and whether it marked the ring exited.
    pid_ns: u64,
    exited: bool,
    bytes: u64,
    mtime_ns: i128,
    ino: u64,
    drain: Drain,
}

/// Opens a ring entry of a gone process for gc: a regular file owned by `uid`.
/// `Err(reason)` for what is kept.
fn open_candidate(dir: RawFd, name: &CStr, uid: u32) -> Result<Candidate, GcReason> {
    const FLAGS: libc::c_int = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    // Read-write to stamp `gone_since_s`; read-only where the mode forbids writing.
    // SAFETY: openat on our directory fd; never follows a link, never blocks on a FIFO.
    let mut fd = unsafe { libc::openat(dir, name.as_ptr(), libc::O_RDWR | FLAGS) };
    if fd < 0 {
        // SAFETY: as above.
        fd = unsafe { libc::openat(dir, name.as_ptr(), libc::O_RDONLY | FLAGS) };
    }
    if fd < 0 {
        return Err(GcReason::NotOurs);
    }
    // SAFETY: fd is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat_fd(fd.as_raw_fd()).map_err(|_| GcReason::NotOurs)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_uid != uid {
        return Err(GcReason::NotOurs);
    }
    // Not locked here: a reader that found a ring locked by gc would leave it alone for
    // good, so gc locks only what it is about to remove (see `lock_for_removal`).
    let RingState { drain, gone_since, pid_ns, exited } = ring_state_full(fd.as_raw_fd());
    Ok(Candidate {
        pid_ns,
        exited,
        bytes: (st.st_blocks as u64).saturating_mul(512).max(st.st_size as u64),
        mtime_ns: i128::from(st.st_mtime) * 1_000_000_000 + i128::from(st.st_mtime_nsec),
        ino: st.st_ino as u64,
        drain,
        gone_since,
        fd,
    })
}

/// Takes the lock a reader holds while it drains (non-blocking): a ring a reader holds is
/// kept. Held until the candidate is dropped, after its removal.
fn lock_for_removal(c: &Candidate) -> bool {
    // SAFETY: flock on our fd.
    unsafe { libc::flock(c.fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn unlink_at(dir: RawFd, name: &CStr) -> bool {
    // SAFETY: unlinkat on our directory fd.
    unsafe { libc::unlinkat(dir, name.as_ptr(), 0) == 0 }
}

/// Runs the gc policy over the ring directory `dir` (an fd from [`open_ring_dir`]) owned
/// by `uid`, at wall time `now_secs`; calls `report` for each entry removed and, with
/// `report_kept`, for each ring kept (the `kept*` counts of the summary are only filled
/// then). Removals of undrained rings are added to
/// [`GC_RECORD_NAME`] (unless `policy.dry_run`). No allocation, no panic.
pub fn gc_dir(
    dir: RawFd,
    uid: u32,
    policy: &GcPolicy,
    now_secs: u64,
    report_kept: bool,
    report: &mut dyn FnMut(&GcEntry<'_>),
) -> GcSummary {
    let mut gc = Gc { dir, uid, policy, now_secs, own_ns: 0, sum: GcSummary::default(), report };
    gc.sum.budget_bytes = fs_bytes(dir) / 100 * policy.keep_percent.min(100);
    gc.own_ns = own_pid_ns();
    let undrained_bytes = gc.remove_by_rules();
    let cutoff = gc.remove_over_budget(undrained_bytes);
    if report_kept {
        gc.report_kept(cutoff);
    }
    if !policy.dry_run && gc.sum.removed_undrained > 0 {
        add_gc_record(dir, gc.sum.removed_undrained, gc.sum.removed_undrained_bytes);
    }
    gc.sum
}

/// The size of the filesystem holding `dir` (0 when unknown).
fn fs_bytes(dir: RawFd) -> u64 {
    // SAFETY: fstatvfs into a zeroed buffer.
    unsafe {
        let mut vfs: libc::statvfs = core::mem::zeroed();
        if libc::fstatvfs(dir, &mut vfs) == 0 {
            (vfs.f_blocks as u64).saturating_mul(vfs.f_frsize as u64)
        } else {
            0
        }
    }
}

/// The key that orders rings for the budget passes (oldest first): mtime, then inode.
type AgeKey = (i128, u64);

/// One gc run: its settings, its running summary and where removals are reported.
struct Gc<'a> {
    dir: RawFd,
    uid: u32,
    policy: &'a GcPolicy,
    now_secs: u64,
    own_ns: u64,
    sum: GcSummary,
    report: &'a mut dyn FnMut(&GcEntry<'_>),
}

impl Gc<'_> {
    /// The keep-hours budget counts from when a gc first found the process gone (stamped in
    /// the ring's header), not from the ring's creation.
    fn age(&self, c: &Candidate) -> u64 {
        if c.gone_since == 0 {
            0
        } else {
            self.now_secs.saturating_sub(c.gone_since)
        }
    }

    /// A ring from another pid namespace names a pid our /proc cannot check: it counts as
    /// gone only once its writer marked it exited.
    fn foreign(&self, c: &Candidate) -> bool {
        c.pid_ns != 0 && self.own_ns != 0 && c.pid_ns != self.own_ns && !c.exited
    }

    /// Removes `c` (named `cname` in the directory) unless a reader holds it; always "done"
    /// in a dry run.
    fn remove(&self, c: &Candidate, cname: &CStr) -> bool {
        self.policy.dry_run || (lock_for_removal(c) && unlink_at(self.dir, cname))
    }

    /// Pass 1: what the rules remove outright. Returns the bytes left undrained.
    fn remove_by_rules(&mut self) -> u64 {
        let mut name_buf = [0u8; 256];
        let mut undrained_bytes = 0u64;
        let (dir, max) = (self.dir, self.policy.max_entries);
        for_each_name(dir, max, &mut |name| self.rule(name, &mut name_buf, &mut undrained_bytes));
        undrained_bytes
    }

    fn rule(&mut self, name: &[u8], name_buf: &mut [u8; 256], undrained_bytes: &mut u64) {
        let Some(cname) = name_cstr(name, name_buf) else { return };
        if let Some((pid, start, _)) = parse_tmp_name(name) {
            if !process_alive(pid, start) {
                // A tmp file that is not ours is left alone.
                let Ok(c) = open_candidate(self.dir, cname, self.uid) else { return };
                let st_bytes = c.bytes;
                if self.remove(&c, cname) {
                    self.sum.removed += 1;
                    self.sum.removed_bytes += st_bytes;
                    (self.report)(&GcEntry {
                        name,
                        bytes: st_bytes,
                        pending: 0,
                        age_secs: 0,
                        reason: GcReason::StaleTmp,
                    });
                }
            }
            return;
        }
        let Some((pid, start, _)) = parse_ring_name(name) else { return };
        if process_alive(pid, start) {
            return;
        }
        let Ok(c) = open_candidate(self.dir, cname, self.uid) else { return };
        if self.foreign(&c) {
            return;
        }
        let (reason, pending) = match c.drain {
            Drain::Drained => (GcReason::Drained, 0),
            Drain::Pending(n) if self.age(&c) >= self.policy.keep_secs => (GcReason::Expired, n),
            Drain::Pending(_) => {
                if c.gone_since == 0 && !self.policy.dry_run {
                    stamp_gone_since(c.fd.as_raw_fd(), self.now_secs, c.mtime_ns);
                }
                *undrained_bytes = undrained_bytes.saturating_add(c.bytes);
                return;
            }
        };
        if self.remove(&c, cname) {
            self.sum.removed += 1;
            self.sum.removed_bytes += c.bytes;
            if reason == GcReason::Expired {
                self.sum.removed_undrained += 1;
                self.sum.removed_undrained_bytes += c.bytes;
            }
            let age_secs = self.age(&c);
            (self.report)(&GcEntry { name, bytes: c.bytes, pending, age_secs, reason });
        }
    }

    /// Budget passes: while undrained rings of gone processes take more than the budget,
    /// the oldest goes (one pass each, bounded). Returns the key of the last one taken.
    fn remove_over_budget(&mut self, mut undrained_bytes: u64) -> Option<AgeKey> {
        let mut cutoff: Option<AgeKey> = None;
        let mut removals = 0usize;
        while undrained_bytes > self.sum.budget_bytes && removals < self.policy.max_budget_removals {
            let Some((key, nb, len)) = self.oldest_undrained(cutoff) else { break };
            cutoff = Some(key);
            removals += 1;
            let name = &nb[..len];
            let mut cb = [0u8; 256];
            let Some(cname) = name_cstr(name, &mut cb) else { break };
            let Ok(c) = open_candidate(self.dir, cname, self.uid) else { continue };
            undrained_bytes = undrained_bytes.saturating_sub(c.bytes);
            let pending = match c.drain {
                Drain::Pending(n) => n,
                Drain::Drained => 0,
            };
            if self.remove(&c, cname) {
                self.sum.removed += 1;
                self.sum.removed_bytes += c.bytes;
                if pending > 0 {
                    self.sum.removed_undrained += 1;
                    self.sum.removed_undrained_bytes += c.bytes;
                }
                let reason = if pending > 0 { GcReason::OverBudget } else { GcReason::Drained };
                let age_secs = self.age(&c);
                (self.report)(&GcEntry { name, bytes: c.bytes, pending, age_secs, reason });
            }
        }
        cutoff
    }

    /// The oldest undrained ring of a gone process newer than `cutoff` and within its keep
    /// time: its key and its name (in a buffer, with its length).
    fn oldest_undrained(&self, cutoff: Option<AgeKey>) -> Option<(AgeKey, [u8; 256], usize)> {
        let mut oldest: Option<(AgeKey, [u8; 256], usize)> = None;
        for_each_name(self.dir, self.policy.max_entries, &mut |name| {
            let Some((pid, start, _)) = parse_ring_name(name) else { return };
            let mut nb = [0u8; 256];
            let Some(cname) = name_cstr(name, &mut nb) else { return };
            if process_alive(pid, start) {
                return;
            }
            let Ok(c) = open_candidate(self.dir, cname, self.uid) else { return };
            if self.foreign(&c) || !matches!(c.drain, Drain::Pending(_)) || self.age(&c) >= self.policy.keep_secs {
                return;
            }
            let key = (c.mtime_ns, c.ino);
            if cutoff.is_some_and(|k| key <= k) {
                return;
            }
            if oldest.as_ref().is_none_or(|(k, _, _)| key < *k) {
                oldest = Some((key, nb, name.len()));
            }
        });
        oldest
    }

    /// What is kept (for the operator's listing and the summary; the interposer skips it).
    fn report_kept(&mut self, cutoff: Option<AgeKey>) {
        let mut name_buf = [0u8; 256];
        let (dir, max) = (self.dir, self.policy.max_entries);
        for_each_name(dir, max, &mut |name| self.kept(name, &mut name_buf, cutoff));
    }

    fn kept(&mut self, name: &[u8], name_buf: &mut [u8; 256], cutoff: Option<AgeKey>) {
        let Some((pid, start, _)) = parse_ring_name(name) else { return };
        let Some(cname) = name_cstr(name, name_buf) else { return };
        let (reason, bytes, pending, age_secs) = if process_alive(pid, start) {
            let mut st: libc::stat = unsafe { core::mem::zeroed() };
            // SAFETY: fstatat on our directory fd, not following links.
            let bytes = if unsafe { libc::fstatat(self.dir, cname.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0 {
                (st.st_blocks as u64).saturating_mul(512).max(st.st_size as u64)
            } else {
                0
            };
            (GcReason::Live, bytes, 0, 0)
        } else {
            match open_candidate(self.dir, cname, self.uid) {
                Ok(c) if self.foreign(&c) => (GcReason::OtherPidNamespace, c.bytes, 0, 0),
                Ok(c) => match c.drain {
                    // Only in a dry run (or a race with a finishing reader).
                    Drain::Drained => return,
                    Drain::Pending(_) if self.age(&c) >= self.policy.keep_secs => return,
                    Drain::Pending(_) if cutoff.is_some_and(|k| (c.mtime_ns, c.ino) <= k) => return,
                    Drain::Pending(n) => {
                        self.sum.kept_undrained += 1;
                        self.sum.kept_undrained_bytes += c.bytes;
                        (GcReason::Undrained, c.bytes, n, self.age(&c))
                    }
                },
                Err(reason) => (reason, 0, 0, 0),
            }
        };
        self.sum.kept += 1;
        self.sum.kept_bytes += bytes;
        (self.report)(&GcEntry { name, bytes, pending, age_secs, reason });
    }
}

/// The counts in a [`GC_RECORD_NAME`] file: `<rings> <bytes>`.
pub fn parse_gc_record(text: &[u8]) -> (u64, u64) {
    let mut parts = text.split(|b| b.is_ascii_whitespace()).filter(|p| !p.is_empty());
    let rings = parts.next().and_then(parse_decimal).unwrap_or(0);
    let bytes = parts.next().and_then(parse_decimal).unwrap_or(0);
    (rings, bytes)
}

/// Adds to the counts of undrained rings removed, under a lock (no allocation).
pub fn add_gc_record(dir: RawFd, rings: u64, bytes: u64) {
    // A tiny file; still, never grow a file past RLIMIT_FSIZE (that is SIGXFSZ).
    if file_size_rlimit() < 64 {
        return;
    }
    // SAFETY: openat on our directory fd; the fd is closed when dropped.
    let fd = unsafe {
        libc::openat(
            dir,
            c".gc-removed".as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return;
    }
    // SAFETY: fd is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let Ok(st) = fstat_fd(fd.as_raw_fd()) else { return };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return;
    }
    // SAFETY: plain calls on our fd.
    unsafe {
        // Never block (the interposer calls this): a bounded retry, else the count is lost.
        let mut locked = false;
        for _ in 0..1000 {
            if libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 {
                locked = true;
                break;
            }
            libc::sched_yield();
        }
        if !locked {
            return;
        }
        let mut buf = [0u8; 64];
        let n = libc::pread(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0);
        let (r0, b0) = parse_gc_record(&buf[..n.max(0) as usize]);
        let mut out = [0u8; 64];
        let mut w = ByteWriter { buf: &mut out, len: 0 };
        let ok = w
            .push_u64(r0.saturating_add(rings))
            .and_then(|_| w.push(b" "))
            .and_then(|_| w.push_u64(b0.saturating_add(bytes)))
            .and_then(|_| w.push(b"\n"));
        if ok.is_some() {
            let len = w.len;
            if libc::pwrite(fd.as_raw_fd(), out.as_ptr() as *const libc::c_void, len, 0) == len as isize {
                libc::ftruncate(fd.as_raw_fd(), len as libc::off_t);
            }
        }
        libc::flock(fd.as_raw_fd(), libc::LOCK_UN);
    }
}

/// The counts recorded in the directory's [`GC_RECORD_NAME`]: (rings, bytes).
pub fn read_gc_record(dir: RawFd) -> (u64, u64) {
    // SAFETY: openat on our directory fd; closed when dropped.
    let fd = unsafe {
        libc::openat(
            dir,
            c".gc-removed".as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return (0, 0);
    }
    // SAFETY: fd is ours.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut buf = [0u8; 64];
    // SAFETY: pread into our buffer.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
    parse_gc_record(&buf[..n.max(0) as usize])
}

/// Wall-clock seconds now.
pub fn now_secs() -> u64 {
    vramhook_protocol::clock::wall_ns() / 1_000_000_000
}

#[cfg(test)]
mod tests;
