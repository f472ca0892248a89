//! What in-process framework lenses and the ring's creation add beside the driver's calls:
//! which frameworks the process loaded (read once, when the ring is made), and the
//! lens's own records (the PyTorch lens calls `vramhook_lens_emit` through ctypes).
//! Nothing here is on a driver call's path.

use crate::config;
use crate::sink::Hook;
use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use vramhook_protocol::record::{Event, FrameworkId};

/// The frameworks this process's ring has been told of (the scan at its creation, and
/// every `frameworks` record written since).
static KNOWN: AtomicU64 = AtomicU64::new(0);
/// This process's ring exists and its creation scanned `/proc/self/maps` (cleared in a
/// forked child, whose ring is made, and scanned, anew).
static SCANNED: AtomicBool = AtomicBool::new(false);
static ATFORK: AtomicBool = AtomicBool::new(false);
/// `dlpi_adds` (the loader's count of objects ever loaded) at the last look.
static LAST_ADDS: AtomicU64 = AtomicU64::new(u64::MAX);

extern "C" fn forget_in_child() {
    SCANNED.store(false, Ordering::Relaxed);
    KNOWN.store(0, Ordering::Relaxed);
    LAST_ADDS.store(u64::MAX, Ordering::Relaxed);
}

/// `FrameworkId` bits of the libraries mapped into this process, read from
/// `/proc/self/maps` with plain syscalls into a stack buffer: no allocation, no loader
/// lock (`dl_iterate_phdr` takes one, and the first CUDA call may come from a library
/// constructor that runs under it).
pub fn loaded_frameworks() -> u64 {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return 0;
    }
    // A line is matched within the buffer; names cut by a read boundary are matched with
    // the carried tail (longer than any name looked for).
    const CARRY: usize = 64;
    let mut buf = [0u8; 8192];
    let mut kept = 0usize;
    let mut mask = 0u64;
    loop {
        // SAFETY: reading into the free part of our buffer.
        let n = unsafe { libc::read(fd, buf[kept..].as_mut_ptr().cast(), buf.len() - kept) };
        if n <= 0 {
            break;
        }
        let end = kept + n as usize;
        for line in buf[..end].split(|b| *b == b'\n') {
            if let Some(f) = FrameworkId::of_library(line) {
                mask |= f.bit();
            }
        }
        kept = CARRY.min(end);
        buf.copy_within(end - kept..end, 0);
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    // Called once, by the ring's creation: what is in the ring now.
    KNOWN.store(mask, Ordering::Relaxed);
    SCANNED.store(true, Ordering::Release);
    if !ATFORK.swap(true, Ordering::AcqRel) {
        // SAFETY: registering a plain function (the ring's creation registers its own too).
        unsafe { libc::pthread_atfork(None, None, Some(forget_in_child)) };
    }
    mask
}

/// True once this process's ring exists (its creation scanned the loaded libraries).
pub fn ring_scanned() -> bool {
    SCANNED.load(Ordering::Acquire)
}

struct LoadScan {
    first: bool,
    unchanged: bool,
    adds: u64,
    mask: u64,
}

unsafe extern "C" fn scan_object(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> libc::c_int {
    // SAFETY: `data` is the `LoadScan` that `after_load` passed; `info` is the loader's,
    // valid for this call, and `size` says which of its fields exist.
    let (scan, info) = unsafe { (&mut *data.cast::<LoadScan>(), &*info) };
    if scan.first {
        scan.first = false;
        let has_adds = size >= core::mem::offset_of!(libc::dl_phdr_info, dlpi_subs);
        scan.adds = if has_adds { info.dlpi_adds } else { u64::MAX - 1 };
        if has_adds && scan.adds == LAST_ADDS.load(Ordering::Relaxed) {
            scan.unchanged = true;
            return 1; // nothing was loaded since the last look: stop here
        }
    }
    if !info.dlpi_name.is_null() {
        // SAFETY: the loader's NUL-terminated name of this object.
        let name = unsafe { core::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
        if let Some(f) = FrameworkId::of_library(name) {
            scan.mask |= f.bit();
        }
    }
    0
}

/// After the program loaded a library (our `dlopen` and `dlsym` call this): when this
/// process's ring exists and the loader loaded anything since the last look, the names of
/// the loaded objects are matched again, and frameworks not yet in the ring are recorded
/// in a new `frameworks` record (the model ORs the masks). Before the ring exists this does
/// nothing: its creation scans everything loaded by then. No allocation; the loader's list
/// lock is taken (by `dl_iterate_phdr`) only here, never across a `dlopen`, and nothing of
/// ours is held meanwhile. A check with nothing new costs one callback.
pub fn after_load() {
    if !ring_scanned() || config::disabled() {
        return;
    }
    let Some(h) = Hook::enter() else { return };
    let mut scan = LoadScan { first: true, unchanged: false, adds: 0, mask: 0 };
    // SAFETY: our callback and its data, alive for the call.
    unsafe { libc::dl_iterate_phdr(Some(scan_object), (&raw mut scan).cast()) };
    if scan.first || scan.unchanged {
        return;
    }
    LAST_ADDS.store(scan.adds, Ordering::Relaxed);
    let old = KNOWN.fetch_or(scan.mask, Ordering::AcqRel);
    if scan.mask & !old != 0 {
        h.emit(Event::frameworks(old | scan.mask));
    }
}

/// Kinds of [`LensRecord`].
const LENS_SAMPLE: u32 = 1;
const LENS_OOM: u32 = 2;
const LENS_SEGMENT: u32 = 3;
const LENS_STATS: u32 = 4;

/// One framework-lens record as a lens hands it over (a ctypes `Structure` of the same
/// layout in `lens/vramhook_lens/ring.py`).
///
/// - `kind` 1, a sample: `a` reserved, `b` allocated, `c` largest free block
///   (`u64::MAX`: not measured), `d` segments;
/// - `kind` 2, the framework gave up: `a` its request, `b` reserved, `c` allocated, `d`
///   largest free block;
/// - `kind` 3, one of its segments right after: `a` address, `b` bytes, `c` allocated,
///   `d` its largest free block, `pieces` its free pieces;
/// - `kind` 4, after a sample or an OOM: `a` the free bytes inside split blocks (stranded),
///   `b` the framework's own limit for the process (`u64::MAX`: unknown or none).
///
/// `framework` is a `FrameworkId` code, `device` the CUDA ordinal.
#[repr(C)]
pub struct LensRecord {
    pub kind: u32,
    pub framework: u32,
    pub device: i32,
    pub reserved_zero: u32,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub pieces: u64,
}

/// Records `*record` in this process's ring, stamped now by this thread. Returns 0 when
/// recorded, 1 when this process is not traced (disabled, or no ring could be made), 2
/// for a null pointer or an unknown kind or framework.
///
/// # Safety
/// `record` is null or points to a readable `LensRecord`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn vramhook_lens_emit(record: *const LensRecord) -> i32 {
    if record.is_null() {
        return 2;
    }
    // SAFETY: non-null, and readable by the caller's contract.
    let r = unsafe { &*record };
    std::panic::catch_unwind(|| {
        let Some(fw) = u8::try_from(r.framework).ok().and_then(FrameworkId::from_code) else {
            return 2;
        };
        let ev = match r.kind {
            LENS_SAMPLE => Event::framework_sample(fw, r.a, r.b, r.c, r.d),
            LENS_OOM => Event::framework_oom(fw, r.a, r.b, r.c, r.d),
            LENS_SEGMENT => Event::framework_segment(r.a, r.b, r.c, r.d, r.pieces),
            LENS_STATS => Event::framework_stats(fw, r.a, r.b, r.c),
            _ => return 2,
        };
        if config::disabled() {
            return 1;
        }
        let Some(h) = Hook::enter() else { return 1 };
        let device = r.device.clamp(-1, i32::from(i16::MAX)) as i16;
        if h.emit_checked(ev.on_device(device)) {
            0
        } else {
            1
        }
    })
    .unwrap_or(1)
}
