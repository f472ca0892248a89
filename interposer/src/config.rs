//! Settings read once from the environment by the constructor, kept in atomics and a
//! fixed buffer (the constructor must not allocate or do anything observable).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// `VRAMHOOK_QUIET=1`: never print the one-line warning when the ring cannot be made.
pub static QUIET: AtomicBool = AtomicBool::new(false);
/// `VRAMHOOK_RING_SLOTS`: ring capacity in 64-byte slots (power of two).
pub static RING_SLOTS: AtomicU64 = AtomicU64::new(vramhook_ring::DEFAULT_CAPACITY);
/// `VRAMHOOK_RING_LANES`: lanes per ring (0 = one per CPU, up to 16).
pub static RING_LANES: AtomicU64 = AtomicU64::new(0);
/// `VRAMHOOK_RUN_ID`: set by `vramhook run` so that it drains exactly its descendants.
pub static RUN_ID: AtomicU64 = AtomicU64::new(0);
/// `VRAMHOOK_MEMINFO_MS`: least interval between periodic `cuMemGetInfo` samples.
pub static MEMINFO_INTERVAL_MS: AtomicU64 = AtomicU64::new(1000);
/// `VRAMHOOK_DEBUG=1`: name on stderr each driver entry point that could not be wrapped.
pub static DEBUG: AtomicBool = AtomicBool::new(false);
/// `VRAMHOOK_CLOCK=monotonic`: stamp events with CLOCK_MONOTONIC instead of the TSC.
pub static FORCE_MONOTONIC: AtomicBool = AtomicBool::new(false);

/// `VRAMHOOK_BENCH_SKIP` (builds with the `bench-parts` feature only): the parts of a hook
/// to leave out, to time each on a real driver: `SKIP_CLOCK`, `SKIP_WRITE`, `SKIP_DEVICE`
/// (and experiments: `SKIP_CHECK`, `PREFETCH_BEFORE`, `FLOOR`, `SKIP_TICK`, `PAGE_AHEAD`,
/// `STAMP_COUNTER`, `STAMP_COARSE`, `ALLOC_STAMP_BEFORE`).
#[cfg(feature = "bench-parts")]
static BENCH_SKIP: AtomicU64 = AtomicU64::new(0);
pub const SKIP_CLOCK: u64 = 1;
pub const SKIP_WRITE: u64 = 2;
pub const SKIP_DEVICE: u64 = 4;
/// Not a part left out: the look at the slot's stamp skipped (the benchmark's ring cannot fill).
pub const SKIP_CHECK: u64 = 8;
/// Not a part left out: the next slot's line asked for before the driver is called.
pub const PREFETCH_BEFORE: u64 = 16;
/// Not a part left out: the physical floor #15 names instead of the record, a time stamp
/// and one 64-byte store (to a line of the thread's own, not the ring).
pub const FLOOR: u64 = 32;
/// The work of every `TICK_EVERY`th allocation of a thread (the device check against the driver and
/// the look at the clock for a periodic sample) left out.
pub const SKIP_TICK: u64 = 64;
/// Not a part left out: the ring writer's page-ahead prefetch, once per page, as before.
#[cfg(feature = "bench-parts")]
pub const PAGE_AHEAD: u64 = 128;
/// Not a part left out: what another stamp would cost in the TSC's place. Neither keeps the
/// ring's order (the reader would merge lanes wrongly); they are timed, not used. A process-
/// wide counter (one locked add per event, its line shared by every thread) ...
pub const STAMP_COUNTER: u64 = 256;
/// ... and the kernel's coarse clock (`CLOCK_MONOTONIC_COARSE`: the vDSO reads memory, no
/// TSC; it moves once per tick, 1 to 4 ms).
pub const STAMP_COARSE: u64 = 512;
/// Not a part left out: the allocations stamped before their driver call, as the releases
/// are, with the lane's marker set through the call (timed only: the model does not yet
/// order an allocation stamped before a concurrent free of the address it gets).
pub const ALLOC_STAMP_BEFORE: u64 = 1024;

/// Whether the benchmark build was told to leave `part` out (always false otherwise).
#[inline(always)]
pub fn bench_skips(part: u64) -> bool {
    #[cfg(feature = "bench-parts")]
    {
        BENCH_SKIP.load(Ordering::Relaxed) & part != 0
    }
    #[cfg(not(feature = "bench-parts"))]
    {
        let _ = part;
        false
    }
}

/// `VRAMHOOK_KEEP_PERCENT`: undrained rings of gone processes may take this share of the
/// ring directory's file system before the oldest are removed.
pub static KEEP_PERCENT: AtomicU64 = AtomicU64::new(vramhook_ring::dir::DEFAULT_KEEP_PERCENT);
/// `VRAMHOOK_KEEP_HOURS`: undrained rings of gone processes older than this are removed.
pub static KEEP_HOURS: AtomicU64 = AtomicU64::new(vramhook_ring::dir::DEFAULT_KEEP_HOURS);
/// `VRAMHOOK_DIR` was set to a path of `DIR_CAPACITY` bytes or more: refused (the process
/// runs untraced with one line), never silently replaced by the default directory.
pub static DIR_TOO_LONG: AtomicBool = AtomicBool::new(false);

/// `VRAMHOOK_DIR`: ring directory; empty means `/dev/shm/vramhook/<uid>`.
pub const DIR_CAPACITY: usize = 512;
static DIR_LEN: AtomicUsize = AtomicUsize::new(0);
static mut DIR_BUF: [u8; DIR_CAPACITY] = [0; DIR_CAPACITY];

fn env(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv returns a NUL-terminated string owned by the environment, or null.
    unsafe {
        let p = libc::getenv(name.as_ptr());
        if p.is_null() {
            None
        } else {
            Some(core::ffi::CStr::from_ptr(p).to_bytes())
        }
    }
}

fn parse_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |acc, b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

fn truthy(v: &[u8]) -> bool {
    !v.is_empty() && v != b"0" && !v.eq_ignore_ascii_case(b"false") && !v.eq_ignore_ascii_case(b"no")
}

pub fn load_from_env() {
    if let Some(v) = env(c"VRAMHOOK_DISABLE") {
        // Kept in the line every hook reads (sink::RING).
        crate::sink::set_disabled(truthy(v));
    }
    if let Some(v) = env(c"VRAMHOOK_QUIET") {
        QUIET.store(truthy(v), Ordering::Relaxed);
    }
    if let Some(v) = env(c"VRAMHOOK_DEBUG") {
        DEBUG.store(truthy(v), Ordering::Relaxed);
    }
    if let Some(n) = env(c"VRAMHOOK_RING_SLOTS").and_then(parse_u64) {
        use vramhook_ring::{MAX_CAPACITY, MIN_CAPACITY};
        let n = n.clamp(MIN_CAPACITY, MAX_CAPACITY).next_power_of_two().min(MAX_CAPACITY);
        RING_SLOTS.store(n, Ordering::Relaxed);
    }
    if let Some(n) = env(c"VRAMHOOK_RING_LANES").and_then(parse_u64) {
        RING_LANES.store(n.min(u64::from(vramhook_ring::MAX_LANES)), Ordering::Relaxed);
    }
    if let Some(n) = env(c"VRAMHOOK_RUN_ID").and_then(parse_u64) {
        RUN_ID.store(n, Ordering::Relaxed);
    }
    if let Some(n) = env(c"VRAMHOOK_MEMINFO_MS").and_then(parse_u64) {
        MEMINFO_INTERVAL_MS.store(n, Ordering::Relaxed);
    }
    if let Some(v) = env(c"VRAMHOOK_CLOCK") {
        FORCE_MONOTONIC.store(v == b"monotonic", Ordering::Relaxed);
    }
    #[cfg(feature = "bench-parts")]
    if let Some(n) = env(c"VRAMHOOK_BENCH_SKIP").and_then(parse_u64) {
        BENCH_SKIP.store(n, Ordering::Relaxed);
        vramhook_ring::bench::PAGE_AHEAD.store(n & PAGE_AHEAD != 0, Ordering::Relaxed);
    }
    if let Some(n) = env(c"VRAMHOOK_KEEP_PERCENT").and_then(vramhook_ring::dir::parse_setting) {
        KEEP_PERCENT.store(n.min(100), Ordering::Relaxed);
    }
    if let Some(n) = env(c"VRAMHOOK_KEEP_HOURS").and_then(vramhook_ring::dir::parse_setting) {
        KEEP_HOURS.store(n, Ordering::Relaxed);
    }
    if let Some(dir) = env(c"VRAMHOOK_DIR") {
        if dir.len() >= DIR_CAPACITY {
            DIR_TOO_LONG.store(true, Ordering::Relaxed);
        } else if !dir.is_empty() {
            // SAFETY: the constructor runs once, before any other thread of ours exists.
            unsafe {
                let buf = &mut *core::ptr::addr_of_mut!(DIR_BUF);
                buf[..dir.len()].copy_from_slice(dir);
            }
            DIR_LEN.store(dir.len(), Ordering::Release);
        }
    }
}

/// The ring directory the user asked for, if any.
pub fn ring_dir() -> Option<&'static [u8]> {
    let len = DIR_LEN.load(Ordering::Acquire);
    if len == 0 {
        return None;
    }
    // SAFETY: written once by the constructor before DIR_LEN was published.
    unsafe {
        let buf: &'static [u8; DIR_CAPACITY] = &*core::ptr::addr_of!(DIR_BUF);
        Some(&buf[..len])
    }
}

/// `VRAMHOOK_DISABLE=1`: pass every call through untouched and record nothing.
#[inline(always)]
pub fn disabled() -> bool {
    crate::sink::disabled()
}
