//! Making the ring at the first CUDA memory call: the wait of the threads that find it
//! being made (and the events they lose meanwhile), the directory and its rules, the
//! ring's size, and its file, made under a temporary name and published whole.

use super::fork::{after_fork_in_child, ATFORK_REGISTERED};
use super::time::{coarse_ms, stamp};
use super::{current_tid, CREATING, FAILED, READY, RING, UNINIT};
use crate::config;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use vramhook_protocol::clock::{self, ClockSource};
use vramhook_protocol::record::Event;
use vramhook_ring::dir as ringdir;
use vramhook_ring::{
    encode_meta, lanes_for_cpus, ring_file_size_lanes, RingInit, RingWriter, META_CAPACITY, MIN_CAPACITY,
};

/// How long threads wait for another thread that is making the ring.
const CREATION_WAIT_MS: u64 = 2000;

#[cold]
pub(super) fn ring_slow() -> Option<&'static RingWriter> {
    match RING.state.compare_exchange(UNINIT, CREATING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            let ok = create_ring();
            RING.state.store(if ok { READY } else { FAILED }, Ordering::Release);
            if ok {
                settle_early_drops();
            }
        }
        Err(_) => {
            // Another thread is creating it (the directory checks, a gc of rings left by
            // gone processes, reserving the pages): a wait bounded in time, once per
            // process, so that a loaded machine does not turn it into lost events.
            let deadline = coarse_ms().saturating_add(CREATION_WAIT_MS);
            let mut spins = 0u32;
            while RING.state.load(Ordering::Acquire) == CREATING && coarse_ms() < deadline {
                spins = spins.saturating_add(1);
                if spins < 1000 {
                    std::thread::yield_now();
                } else {
                    // SAFETY: a plain sleep of 100 µs.
                    unsafe { libc::usleep(100) };
                }
            }
            if RING.state.load(Ordering::Acquire) == CREATING {
                // Still not ready: this event is lost, and counted once the ring exists.
                EARLY_DROPS.fetch_add(1, Ordering::AcqRel);
                if RING.state.load(Ordering::Acquire) == READY {
                    settle_early_drops();
                }
                return None;
            }
        }
    }
    if RING.state.load(Ordering::Acquire) == READY {
        // SAFETY: as above.
        Some(unsafe { (*RING.writer.get()).assume_init_ref() })
    } else {
        None
    }
}

/// Events lost while another thread was still creating the ring.
static EARLY_DROPS: AtomicU64 = AtomicU64::new(0);

/// Moves `EARLY_DROPS` into the ring's drop counter. Both the creator (after publishing
/// READY) and a late counter (after seeing READY) call it, so every count lands once.
fn settle_early_drops() {
    let n = EARLY_DROPS.swap(0, Ordering::AcqRel);
    if n > 0 && RING.state.load(Ordering::Acquire) == READY {
        // SAFETY: READY is published after the writer was initialised.
        unsafe { (*RING.writer.get()).assume_init_ref() }.count_dropped(n);
    }
}

/// A small fixed-capacity string builder on the stack (no allocation in this crate's
/// process-facing paths).
struct StackStr<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> StackStr<N> {
    fn new() -> Self {
        StackStr { buf: [0; N], len: 0 }
    }
    fn push(&mut self, s: &[u8]) -> bool {
        if self.len + s.len() + 1 > N {
            return false;
        }
        self.buf[self.len..self.len + s.len()].copy_from_slice(s);
        self.len += s.len();
        self.buf[self.len] = 0;
        true
    }
    fn push_u64(&mut self, v: u64) -> bool {
        let mut digits = [0u8; 20];
        self.push(ringdir::decimal(v, &mut digits))
    }
}

/// Field 22 of /proc/self/stat: start time in clock ticks since boot (0 when unread).
fn process_start_time() -> u64 {
    let mut buf = [0u8; 1024];
    let n = ringdir::read_small_file(c"/proc/self/stat", &mut buf);
    ringdir::parse_stat_start(&buf[..n]).map_or(0, |(_state, start)| start)
}

fn warn(reason: &[u8], dir: &[u8]) {
    if config::QUIET.load(Ordering::Relaxed) {
        return;
    }
    let mut line = StackStr::<1024>::new();
    line.push(b"vramhook: cannot record GPU memory calls (");
    line.push(reason);
    line.push(b": ");
    line.push(dir);
    line.push(b"); this process runs on untraced. Set VRAMHOOK_DIR, or VRAMHOOK_QUIET=1 to silence this.\n");
    // SAFETY: writing our buffer to stderr; a failed write is ignored.
    unsafe { libc::write(2, line.buf.as_ptr() as *const libc::c_void, line.len) };
}

/// A ring larger than an agent reads by default (`vramhook agent --max-ring-mib`, 64 MiB of
/// slots) is refused by it, and nothing of this process would be recorded: said once, when
/// the ring is made (at the first CUDA call, never before), with the setting that reads it.
/// Not under `vramhook run`, whose reader takes rings as large as it asked for.
fn say_if_an_agent_refuses(len: u64) {
    use vramhook_ring::{DEFAULT_MAX_RING_BYTES, HEADER_SIZE};
    if len <= DEFAULT_MAX_RING_BYTES
        || config::RUN_ID.load(Ordering::Relaxed) != 0
        || config::QUIET.load(Ordering::Relaxed)
    {
        return;
    }
    let mib = (len - HEADER_SIZE as u64).div_ceil(1 << 20);
    let mut line = StackStr::<512>::new();
    line.push(b"vramhook: this process's ring is ");
    line.push_u64(mib);
    line.push(b" MiB (VRAMHOOK_RING_SLOTS), more than an agent reads by default (");
    line.push_u64((DEFAULT_MAX_RING_BYTES - HEADER_SIZE as u64) >> 20);
    line.push(b" MiB): start the agent with --max-ring-mib ");
    line.push_u64(mib);
    line.push(b", or it refuses this ring and records nothing of this process. VRAMHOOK_QUIET=1 silences this.\n");
    // SAFETY: writing our buffer to stderr; a failed write is ignored.
    unsafe { libc::write(2, line.buf.as_ptr() as *const libc::c_void, line.len) };
}

fn errno_name() -> &'static [u8] {
    ringdir::errno_text(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

/// `renameat2(RENAME_NOREPLACE)`: publishes a finished ring under its final name, never
/// over an existing one (EEXIST, so the caller tries the next image number). Where the
/// file system lacks it, `linkat` + `unlinkat` does the same.
fn rename_noreplace(dir: libc::c_int, from: &[u8], to: &[u8]) -> Result<(), i32> {
    const RENAME_NOREPLACE: libc::c_uint = 1;
    let (from, to) = (from.as_ptr() as *const libc::c_char, to.as_ptr() as *const libc::c_char);
    // SAFETY: NUL-terminated names relative to our directory fd.
    unsafe {
        if libc::syscall(libc::SYS_renameat2, dir, from, dir, to, RENAME_NOREPLACE) == 0 {
            return Ok(());
        }
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        if errno != libc::EINVAL && errno != libc::ENOSYS {
            return Err(errno);
        }
        if libc::linkat(dir, from, dir, to, 0) != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        libc::unlinkat(dir, from, 0);
    }
    Ok(())
}

/// Removes what gc rules say in the ring directory (once per process, at ring creation:
/// bounded work, no allocation).
fn collect_garbage(dir: libc::c_int, uid: u32) {
    let policy = ringdir::GcPolicy {
        keep_percent: config::KEEP_PERCENT.load(Ordering::Relaxed),
        keep_secs: config::KEEP_HOURS.load(Ordering::Relaxed).saturating_mul(3600),
        max_entries: 4096,
        max_budget_removals: 16,
        dry_run: false,
    };
    ringdir::gc_dir(dir, uid, &policy, ringdir::now_secs(), false, &mut |_| {});
}

fn create_ring() -> bool {
    // SAFETY: getpid/getppid/getuid have no preconditions.
    let (pid, ppid, uid) = unsafe { (libc::getpid() as u32, libc::getppid() as u32, libc::geteuid()) };
    if config::DIR_TOO_LONG.load(Ordering::Relaxed) {
        warn(b"VRAMHOOK_DIR is 512 bytes or longer", b"refused, not replaced by the default directory");
        return false;
    }
    let dir_path = ring_dir_path(uid);
    let dir = &dir_path.buf[..dir_path.len];
    let Some(dir_fd) = open_ring_dir(&dir_path, uid) else { return false };
    let dfd = dir_fd.as_raw_fd();
    collect_garbage(dfd, uid);

    let start_time = process_start_time();
    let Some((capacity, lanes)) = ring_shape(dfd, dir) else { return false };
    let len = ring_file_size_lanes(capacity, lanes);

    // Made under a hidden temporary name, sized, reserved, mapped and initialised, then
    // renamed to its final name: a reader never finds an unfinished ring there.
    let mut file = NewRingFile { dfd, dir, pid, start_time, tmp_name: [0; 80], final_name: [0; 80], image: 0 };
    let fd = file.create_tmp();
    if fd < 0 {
        warn(errno_name(), dir);
        return false;
    }
    let Some(map) = file.map(fd, len) else { return false };
    let mut meta = [0u8; META_CAPACITY];
    let meta_len = ring_meta(&mut meta);
    let use_tsc = !config::FORCE_MONOTONIC.load(Ordering::Relaxed) && clock::tsc_is_invariant();
    let init = RingInit {
        capacity,
        pid,
        ppid,
        uid,
        start_time,
        run_id: config::RUN_ID.load(Ordering::Relaxed),
        clock_source: if use_tsc { ClockSource::Tsc as u32 } else { ClockSource::Monotonic as u32 },
        tsc_anchor: clock::read_tsc(),
        mono_anchor_ns: clock::monotonic_ns(),
        wall_anchor_ns: clock::wall_ns(),
    };
    let writer = init_writer(map, &init, lanes, &meta[..meta_len]);
    if let Err(e) = file.publish() {
        warn(ringdir::errno_text(e), dir);
        // SAFETY: unmapping our own mapping, never handed out.
        unsafe { libc::munmap(map as *mut libc::c_void, len) };
        file.drop_tmp();
        return false;
    }
    drop(dir_fd);
    say_if_an_agent_refuses(len as u64);
    install_ring(writer, map, len, pid, use_tsc);
    // SAFETY: just written by `install_ring`.
    let writer = unsafe { (*RING.writer.get()).assume_init_ref() };
    // First in the shared lane: before every other event of every thread.
    writer.push_to_lane(0, &stamp(Event::process_start(ppid, start_time), current_tid()));
    // Who holds this process's bytes, read once (its frameworks' libraries are loaded by
    // the time it first calls CUDA).
    let frameworks = crate::lens::loaded_frameworks();
    if frameworks != 0 {
        writer.push_to_lane(0, &stamp(Event::frameworks(frameworks), current_tid()));
    }
    true
}

/// The ring directory: `VRAMHOOK_DIR`, else `/dev/shm/vramhook/<uid>`.
fn ring_dir_path(uid: u32) -> StackStr<600> {
    let mut dir = StackStr::<600>::new();
    match config::ring_dir() {
        Some(d) => {
            dir.push(d);
        }
        None => {
            dir.push(b"/dev/shm/vramhook/");
            dir.push_u64(u64::from(uid));
        }
    }
    dir
}

/// Makes (or checks) the ring directory and opens it; says why not where it cannot.
fn open_ring_dir(dir: &StackStr<600>, uid: u32) -> Option<std::os::fd::OwnedFd> {
    let made = match core::ffi::CStr::from_bytes_with_nul(&dir.buf[..=dir.len]) {
        // The shared parent 1777 with the sticky bit, ours 0700; checked through the fd.
        Ok(path) => ringdir::make_ring_dir_c(path, uid),
        Err(_) => Err(ringdir::RingDirError::BadPath),
    };
    match made {
        Ok(fd) => Some(fd),
        Err(e) => {
            warn(e.reason(), &dir.buf[..dir.len]);
            None
        }
    }
}

/// The lanes and slots per lane of this process's ring, or `None` (said) where not even
/// the smallest ring fits.
fn ring_shape(dfd: libc::c_int, dir: &[u8]) -> Option<(u64, u32)> {
    // One lane per CPU (up to 16) so that threads on different cores do not contend for
    // one write cursor; VRAMHOOK_RING_SLOTS is the total, split evenly.
    let lanes = match config::RING_LANES.load(Ordering::Relaxed) {
        // SAFETY: sysconf has no preconditions.
        0 => lanes_for_cpus(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize),
        n => (n as u32).next_power_of_two(),
    };
    let capacity = (config::RING_SLOTS.load(Ordering::Relaxed) / u64::from(lanes)).max(MIN_CAPACITY);
    // At most 10% of the space free now, and never past RLIMIT_FSIZE (sizing a file
    // beyond it is SIGXFSZ): smaller, down to 1,024 slots, or untraced.
    let Some((capacity, lanes)) = ringdir::fit_ring(capacity, lanes, ringdir::ring_size_limit(dfd)) else {
        let floor = ringdir::ring_bytes(ringdir::MIN_RING_SLOTS / u64::from(lanes.max(1)), lanes.max(1));
        let reason: &[u8] = if ringdir::file_size_rlimit() < floor {
            b"file size limit (ulimit -f) too small for the smallest ring"
        } else {
            b"too little free space: a ring may take 10% of it, and the smallest is 1,024 slots"
        };
        warn(reason, dir);
        return None;
    };
    Some((capacity, lanes))
}

/// The ring's metadata (the executable and the command line) into `meta`; returns its length.
fn ring_meta(meta: &mut [u8; META_CAPACITY]) -> usize {
    let mut exe = [0u8; 512];
    // SAFETY: readlink into our buffer.
    let exe_len =
        unsafe { libc::readlink(c"/proc/self/exe".as_ptr(), exe.as_mut_ptr() as *mut libc::c_char, exe.len()) };
    let exe = &exe[..exe_len.max(0) as usize];
    let mut cmdline = [0u8; META_CAPACITY];
    let cmd_len = ringdir::read_small_file(c"/proc/self/cmdline", &mut cmdline[..META_CAPACITY - exe.len() - 1]);
    encode_meta(exe, &cmdline[..cmd_len], meta)
}

/// Writes the ring's header and lanes into the fresh mapping.
fn init_writer(map: *mut u8, init: &RingInit, lanes: u32, meta: &[u8]) -> RingWriter {
    // SAFETY: a fresh zero-filled shared mapping of the right size, page aligned.
    let writer = unsafe { RingWriter::init_lanes(map, init, lanes, meta) };
    writer.set_pid_ns(ringdir::own_pid_ns());
    writer
}

/// Hands the published ring to every thread (READY is stored by the caller) and makes
/// sure a forked child forgets it.
fn install_ring(writer: RingWriter, map: *mut u8, len: usize, pid: u32, use_tsc: bool) {
    // SAFETY: only the creating thread writes here, before READY is published.
    unsafe { (*RING.writer.get()).write(writer) };
    RING.map.store(map as usize, Ordering::Relaxed);
    RING.map_len.store(len, Ordering::Relaxed);
    RING.pid.store(pid, Ordering::Relaxed);
    RING.tsc.store(use_tsc, Ordering::Relaxed);
    if !ATFORK_REGISTERED.swap(true, Ordering::AcqRel) {
        // SAFETY: registering a plain function.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
}

/// The ring's file while it is made: its directory, and its temporary and final names
/// (NUL-terminated, in fixed buffers).
struct NewRingFile<'a> {
    dfd: libc::c_int,
    /// For warnings.
    dir: &'a [u8],
    pid: u32,
    start_time: u64,
    tmp_name: [u8; 80],
    final_name: [u8; 80],
    /// After exec the pid and start time stay the same: the image number keeps names apart.
    image: u64,
}

impl NewRingFile<'_> {
    /// Creates the temporary file under the first image number whose final name is free;
    /// returns its fd (negative on failure, with errno set).
    fn create_tmp(&mut self) -> libc::c_int {
        let (dfd, pid, start_time) = (self.dfd, self.pid, self.start_time);
        let mut fd = -1;
        while self.image < 64 {
            let final_name = &mut self.final_name;
            let taken = ringdir::format_ring_name(final_name, pid, start_time, self.image, false).is_some_and(|_| {
                // SAFETY: fstatat on our directory fd with a NUL-terminated name.
                unsafe {
                    let mut st: libc::stat = core::mem::zeroed();
                    libc::fstatat(dfd, final_name.as_ptr() as *const libc::c_char, &mut st, libc::AT_SYMLINK_NOFOLLOW)
                        == 0
                }
            });
            if !taken && ringdir::format_ring_name(&mut self.tmp_name, pid, start_time, self.image, true).is_some() {
                // SAFETY: openat on our directory fd with a NUL-terminated name.
                fd = unsafe {
                    libc::openat(
                        dfd,
                        self.tmp_name.as_ptr() as *const libc::c_char,
                        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                        0o600,
                    )
                };
                if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                    break;
                }
            }
            self.image += 1;
        }
        fd
    }

    fn drop_tmp(&self) {
        // SAFETY: unlinkat on our directory fd with a NUL-terminated name.
        unsafe { libc::unlinkat(self.dfd, self.tmp_name.as_ptr() as *const libc::c_char, 0) };
    }

    /// Sizes the file (`fd`, closed here), reserves its pages and maps it; on failure says
    /// why and removes the file.
    fn map(&self, fd: libc::c_int, len: usize) -> Option<*mut u8> {
        // SAFETY: fd is ours; the mapping is checked before use.
        unsafe {
            if libc::ftruncate(fd, len as libc::off_t) != 0 {
                warn(errno_name(), self.dir);
                libc::close(fd);
                self.drop_tmp();
                return None;
            }
            // Reserve every page now: on a full file system a write to an unbacked page of a
            // shared mapping is a SIGBUS in the program. (posix_fallocate returns the error.)
            let err = libc::posix_fallocate(fd, 0, len as libc::off_t);
            if err != 0 {
                warn(ringdir::errno_text(err), self.dir);
                libc::close(fd);
                self.drop_tmp();
                return None;
            }
            // Populated now (once, at the first CUDA call) so that no page fault lands on a hook.
            let map = libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            );
            libc::close(fd);
            if map == libc::MAP_FAILED {
                warn(errno_name(), self.dir);
                self.drop_tmp();
                return None;
            }
            prefault_for_writing(map as *mut u8, len);
            Some(map as *mut u8)
        }
    }

    /// Publishes under the final name; a name taken meanwhile moves to the next image.
    fn publish(&mut self) -> Result<(), libc::c_int> {
        loop {
            match rename_noreplace(self.dfd, &self.tmp_name, &self.final_name) {
                Ok(()) => break Ok(()),
                Err(libc::EEXIST) if self.image < 63 => {
                    self.image += 1;
                    if ringdir::format_ring_name(&mut self.final_name, self.pid, self.start_time, self.image, false)
                        .is_none()
                    {
                        break Err(libc::ENAMETOOLONG);
                    }
                }
                Err(e) => break Err(e),
            }
        }
    }
}

/// Maps every page of a fresh ring writable and dirty now, so that no hook takes a fault.
/// `MAP_POPULATE` is not enough: for a shared mapping it maps pages for reading only, and
/// where the file system tracks dirty pages (ext4 or xfs, for a `VRAMHOOK_DIR` off tmpfs)
/// the first write to each page faults (about 1 µs), one in every 64 events.
/// `MADV_POPULATE_WRITE` (Linux 5.14) write-faults them here; older kernels get a write
/// to each page.
fn prefault_for_writing(map: *mut u8, len: usize) {
    // SAFETY: our own fresh mapping of `len` bytes, which nobody else writes yet.
    unsafe {
        if libc::madvise(map as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) == 0 {
            return;
        }
        let mut offset = 0;
        while offset < len {
            let byte = map.add(offset);
            core::ptr::write_volatile(byte, core::ptr::read_volatile(byte));
            offset += 4096;
        }
    }
}
