//! A capture file read through a memory map: frames are lent straight from the page cache,
//! with no `read` copy into a buffer.
//!
//! Memory stays bounded whatever the file's size: pages behind the reader are dropped from
//! this process (`MADV_DONTNEED`; they stay in the page cache) every [`RELEASE_EVERY`] bytes,
//! and pages ahead are populated in batches (`MADV_POPULATE_READ`, else `MADV_WILLNEED`)
//! rather than faulted in one by one.
//!
//! A file truncated by someone else while it is mapped would normally kill the reader with
//! `SIGBUS`. Here a `SIGBUS` handler, installed with the first map, replaces the part of the
//! map past the fault with zero pages: the reader then sees zeros, which no frame matches,
//! so the capture ends as corrupt or truncated there, and [`Mapped::shrank`] says where.
//! A fault outside every live map is handed to whatever handled `SIGBUS` before.

use crate::capture::{take_from, SeekSource, Source};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// Pages behind the reader are released in steps of this many bytes.
pub const RELEASE_EVERY: usize = 32 << 20;
/// Pages ahead of the reader are populated in batches of this many bytes.
const POPULATE_AHEAD: usize = 8 << 20;
/// Maps protected against truncation at once (capture maps and ring maps together); more
/// capture maps still work, unprotected; a ring that cannot be protected is refused.
const REGIONS: usize = 1024;

struct Region {
    start: AtomicUsize,
    len: AtomicUsize,
    /// Offset from which the map reads zeros (`usize::MAX`: none).
    cut: AtomicUsize,
    /// Whether the zero pages put in after a cut are writable too (a ring's reader
    /// restamps slots and stores its cursors).
    writable: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_REGION: Region = Region {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    cut: AtomicUsize::new(usize::MAX),
    writable: AtomicUsize::new(0),
};
static REGION_TABLE: [Region; REGIONS] = [EMPTY_REGION; REGIONS];
static INSTALL: Once = Once::new();
static PREVIOUS: AtomicUsize = AtomicUsize::new(0);
static mut PREVIOUS_ACTION: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();

/// A capture file, memory-mapped read-only.
pub struct Mapped {
    ptr: *mut u8,
    len: usize,
    pos: usize,
    released: usize,
    populated: usize,
    region: Option<usize>,
}

// The map is private to this value and read-only.
unsafe impl Send for Mapped {}

/// Maps the first `len` bytes of `file` shared and read-write: a ring file, which its writer
/// and its reader both map. The caller unmaps it (`munmap`).
pub fn map_shared_rw(file: &File, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh mapping of a file we hold open; checked below.
    let map = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if map == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(map.cast())
}

impl Mapped {
    /// Maps `file` as it is now. Fails for what cannot be mapped (empty files, pipes,
    /// special files): read those with a stream instead.
    pub fn new(file: &File) -> io::Result<Mapped> {
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
        }
        let len = usize::try_from(meta.len()).map_err(|_| io::Error::other("file too large to map"))?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty file"));
        }
        install_handler();
        // SAFETY: a fresh read-only private mapping of a file we hold open; checked below.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: advice on our own mapping; failure only loses readahead.
        unsafe { libc::madvise(ptr, len, libc::MADV_SEQUENTIAL) };
        let region = register(ptr as usize, len, false);
        let mut m = Mapped { ptr: ptr.cast(), len, pos: 0, released: 0, populated: 0, region };
        m.populate();
        Ok(m)
    }

    /// Where the file was cut if it shrank while mapped: the map reads zeros from there.
    pub fn shrank(&self) -> Option<u64> {
        region_cut(self.region?)
    }

    /// Populates page tables ahead of the reader in one call instead of a fault per page.
    fn populate(&mut self) {
        if self.populated >= self.len || self.pos + POPULATE_AHEAD / 2 < self.populated {
            return;
        }
        let from = self.populated.max(self.pos) & !(page_size() - 1);
        let to = (from + POPULATE_AHEAD).min(self.len);
        // SAFETY: a range inside our mapping. POPULATE_READ (Linux 5.14) fails on older
        // kernels: WILLNEED then at least starts the reads.
        unsafe {
            let at = self.ptr.add(from).cast();
            if libc::madvise(at, to - from, MADV_POPULATE_READ) != 0 {
                libc::madvise(at, to - from, libc::MADV_WILLNEED);
            }
        }
        self.populated = to;
    }

    /// Drops the pages behind the reader from this process (they stay in the page cache).
    fn release_behind(&mut self) {
        let upto = self.pos & !(page_size() - 1);
        if upto > self.released {
            // SAFETY: a page-aligned range inside our mapping that nothing borrows: `take`
            // borrows `self` mutably, so the frames it lent before are gone. (Reading the
            // range again would only fault the file's pages back in.)
            unsafe { libc::madvise(self.ptr.add(self.released).cast(), upto - self.released, libc::MADV_DONTNEED) };
            self.released = upto;
        }
    }
}

const MADV_POPULATE_READ: libc::c_int = 22;

impl Source for Mapped {
    #[inline]
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.pos.saturating_add(n) > self.populated {
            self.populate();
        }
        if self.pos >= self.released + RELEASE_EVERY {
            self.release_behind();
        }
        let mut pos = self.pos;
        // SAFETY: `ptr..ptr+len` is our live read-only mapping (after a truncation the
        // SIGBUS handler keeps every byte of it readable, as zeros); the slice borrows `self`.
        let data = unsafe { std::slice::from_raw_parts(self.ptr, self.len) };
        let out = take_from(data, &mut pos, n);
        self.pos = pos;
        Ok(out)
    }

    fn shrank(&self) -> Option<u64> {
        Mapped::shrank(self)
    }
}

impl SeekSource for Mapped {
    fn seek_to(&mut self, pos: u64) -> io::Result<()> {
        self.pos = usize::try_from(pos).unwrap_or(usize::MAX).min(self.len);
        // A seek backwards may land in released pages: they fault back in on reading.
        self.released = self.released.min(self.pos & !(page_size() - 1));
        self.populated = self.populated.min(self.pos);
        Ok(())
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some(i) = self.region {
            unguard(i);
        }
        // SAFETY: our mapping, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped").field("len", &self.len).field("pos", &self.pos).finish()
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

fn register(start: usize, len: usize, writable: bool) -> Option<usize> {
    for (i, r) in REGION_TABLE.iter().enumerate() {
        if r.start.compare_exchange(0, start, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            r.cut.store(usize::MAX, Ordering::SeqCst);
            r.writable.store(usize::from(writable), Ordering::SeqCst);
            r.len.store(len, Ordering::SeqCst);
            return Some(i);
        }
    }
    None
}

/// Protects `len` bytes mapped at `start` against the file's truncation (captures here, and
/// `vramhook-ring`'s ring files): a `SIGBUS` inside
/// them replaces the rest of the map with zero pages (writable when `writable`) instead of
/// killing the process. Returns the guard's slot (for [`unguard`] and [`region_cut`]), or
/// `None` when every slot is taken. Must be undone with [`unguard`] before the map goes.
pub fn guard(start: usize, len: usize, writable: bool) -> Option<usize> {
    install_handler();
    register(start, len, writable)
}

/// Ends a guard (before its map is unmapped).
pub fn unguard(slot: usize) {
    REGION_TABLE[slot].len.store(0, Ordering::SeqCst);
    REGION_TABLE[slot].start.store(0, Ordering::SeqCst);
}

/// Offset from which a guarded map reads zeros after its file was cut, if it was.
pub fn region_cut(slot: usize) -> Option<u64> {
    let cut = REGION_TABLE[slot].cut.load(Ordering::Relaxed);
    (cut != usize::MAX).then_some(cut as u64)
}

fn install_handler() {
    INSTALL.call_once(|| {
        // SAFETY: installs a handler that only uses async-signal-safe calls (mmap,
        // sigaction) and atomics; the previous action is kept for faults not ours.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut act.sa_mask);
            let prev = std::ptr::addr_of_mut!(PREVIOUS_ACTION).cast::<libc::sigaction>();
            if libc::sigaction(libc::SIGBUS, &act, prev) == 0 {
                PREVIOUS.store(1, Ordering::SeqCst);
            }
        }
    });
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for r in REGION_TABLE.iter() {
        let start = r.start.load(Ordering::SeqCst);
        let len = r.len.load(Ordering::SeqCst);
        if start != 0 && addr >= start && addr < start + len {
            let page = addr & !(page_size() - 1);
            let prot = if r.writable.load(Ordering::SeqCst) != 0 {
                libc::PROT_READ | libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            // SAFETY: replaces the rest of our own mapping with zero pages, so the faulting
            // access is retried and sees zeros.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    start + len - page,
                    prot,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                r.cut.fetch_min(page - start, Ordering::SeqCst);
                return;
            }
        }
    }
    // Not ours: put the previous action back; the fault repeats and meets it.
    // SAFETY: restores the action saved at install (or the default one).
    unsafe {
        if PREVIOUS.load(Ordering::SeqCst) == 1 {
            libc::sigaction(libc::SIGBUS, std::ptr::addr_of!(PREVIOUS_ACTION).cast(), std::ptr::null_mut());
        } else {
            libc::signal(libc::SIGBUS, libc::SIG_DFL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{CaptureError, CaptureHeader, CaptureReader, CaptureWriter, Frame};
    use std::io::Write;

    fn capture_file(events: u64) -> tempfile_like::TempPath {
        let path = tempfile_like::TempPath::new();
        let mut w =
            CaptureWriter::new(std::fs::File::create(&path.0).expect("create"), &CaptureHeader::now()).expect("header");
        for c in crate::capture_tests::sample_events(events).chunks(1000) {
            w.write_events(c).expect("events");
        }
        w.finish().expect("finish").flush().expect("flush");
        path
    }

    /// A unique temporary file, removed on drop (the protocol crate has no tempfile dependency).
    mod tempfile_like {
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn new() -> TempPath {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                TempPath(std::env::temp_dir().join(format!("vramhook-mapped-{}-{n}.vhc", std::process::id())))
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    fn count(r: &mut CaptureReader<Mapped>) -> (u64, Option<CaptureError>) {
        let mut n = 0;
        loop {
            match r.next_frame() {
                Ok(Some(Frame::Events(recs))) => n += recs.len() as u64,
                Ok(Some(_)) => {}
                Ok(None) => return (n, None),
                Err(e) => return (n, Some(e)),
            }
        }
    }

    #[test]
    fn reads_what_the_stream_reader_reads() {
        let path = capture_file(100_000);
        let file = std::fs::File::open(&path.0).expect("open");
        let mut r = CaptureReader::from_source(Mapped::new(&file).expect("map")).expect("header");
        assert_eq!(count(&mut r), (100_000, None));
        assert_eq!(r.shrank(), None);
    }

    #[test]
    fn empty_files_and_directories_are_refused() {
        let path = tempfile_like::TempPath::new();
        std::fs::File::create(&path.0).expect("create");
        assert!(Mapped::new(&std::fs::File::open(&path.0).expect("open")).is_err());
        assert!(Mapped::new(&std::fs::File::open(std::env::temp_dir()).expect("open dir")).is_err());
    }

    /// Another process truncates the file under the map: the reader reports the cut
    /// instead of dying of SIGBUS.
    #[test]
    fn truncated_underneath_ends_the_capture_instead_of_the_process() {
        let path = capture_file(200_000); // 12.8 MB
        let file = std::fs::File::open(&path.0).expect("open");
        let mut r = CaptureReader::from_source(Mapped::new(&file).expect("map")).expect("header");
        let mut n = 0u64;
        // Read a little, then cut the file to 1 MB behind the reader's back.
        if let Ok(Some(Frame::Events(recs))) = r.next_frame() {
            n += recs.len() as u64;
        }
        std::fs::OpenOptions::new().write(true).open(&path.0).expect("open rw").set_len(1 << 20).expect("truncate");
        let (more, err) = count(&mut r);
        n += more;
        assert!(err.is_some(), "a shrunken file must not read as complete");
        assert!((1000..200_000).contains(&n), "read {n} events");
        let cut = r.shrank().expect("the reader must say the file shrank");
        assert!((1 << 20..2 << 20).contains(&cut), "cut at {cut}");
    }
}
