//! The per-process ring: created at the first CUDA memory call, written by every hook.

use crate::config;
use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use vramhook_protocol::clock::{self, ClockSource};
use vramhook_protocol::record::{Event, RawRecord};
use vramhook_ring::dir as ringdir;
use vramhook_ring::{
    encode_meta, lanes_for_cpus, ring_file_size_lanes, OwnedLane, ReservedSlot, RingInit, RingWriter, MAX_LANES,
    META_CAPACITY, MIN_CAPACITY,
};

const UNINIT: u8 = 0;
const CREATING: u8 = 1;
const READY: u8 = 2;
const FAILED: u8 = 3;

/// Everything a hook reads of the process, in one cache line: the ring's writer, whether
/// it is ready, how to stamp, and the epoch that tells threads their cached state is stale.
#[repr(C, align(64))]
struct Ring {
    writer: UnsafeCell<MaybeUninit<RingWriter>>,
    state: AtomicU8,
    tsc: AtomicBool,
    /// `VRAMHOOK_DISABLE=1`.
    disabled: AtomicBool,
    /// False once a call that changes the current context might go unseen: then every
    /// allocation asks the driver for its device.
    device_cache: AtomicBool,
    pid: AtomicU32,
    /// Bumped when what threads keep of their own may be stale: after fork (tid, lane) and
    /// when a context is destroyed or the device cache turned off (device).
    epoch: AtomicU32,
    map: AtomicUsize,
    map_len: AtomicUsize,
}

const _: () = assert!(core::mem::size_of::<Ring>() == 64);

// SAFETY: `writer` is written only by the thread that moved `state` to CREATING, and
// read only after `state` is READY (release/acquire).
unsafe impl Sync for Ring {}

static RING: Ring = Ring {
    writer: UnsafeCell::new(MaybeUninit::uninit()),
    state: AtomicU8::new(UNINIT),
    tsc: AtomicBool::new(false),
    disabled: AtomicBool::new(false),
    device_cache: AtomicBool::new(true),
    pid: AtomicU32::new(0),
    epoch: AtomicU32::new(1),
    map: AtomicUsize::new(0),
    map_len: AtomicUsize::new(0),
};

/// Bumped in the child after fork, so cached thread ids and lanes are taken anew.
static FORK_GENERATION: AtomicU32 = AtomicU32::new(1);
static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);
/// Coarse-clock ms of the last periodic cuMemGetInfo sample.
static LAST_MEMINFO_MS: AtomicU64 = AtomicU64::new(0);

/// `VRAMHOOK_DISABLE=1`: pass every call through.
#[inline(always)]
pub fn disabled() -> bool {
    RING.disabled.load(Ordering::Relaxed)
}

pub fn set_disabled(on: bool) {
    RING.disabled.store(on, Ordering::Relaxed);
}

/// A thread made a context current (or popped one): its next allocation asks the driver.
#[inline]
pub fn context_changed_on_this_thread() {
    // SAFETY: only this thread touches its own state.
    unsafe { (*thread::state()).device_known = false };
}

/// A context was destroyed or reset: any thread that had it current asks again.
pub fn contexts_changed_everywhere() {
    context_changed_on_this_thread();
    RING.epoch.fetch_add(1, Ordering::AcqRel);
}

/// A context switch may go unseen (a context entry point we could not wrap): from now on
/// every allocation asks the driver for its device.
pub fn turn_off_device_cache() {
    RING.device_cache.store(false, Ordering::Release);
    contexts_changed_everywhere();
}

/// Lane states in `ThreadState::lane_mode`.
const LANE_NONE: u8 = 0;
/// `lane` is this thread's alone (see `claim_lane`).
const LANE_OWNED: u8 = 1;
/// Lane 0, shared by every thread without a lane of its own (compare-and-swap).
const LANE_SHARED: u8 = 2;
/// The process forked while this thread was inside a hook (a signal handler forked): the
/// call belongs to the parent, which records it; the child records nothing more of it.
/// The next hook brings the state up to date (`refresh`).
const LANE_FORKED: u8 = 3;

/// A thread's allocations from one that asks the driver for its device and looks at the
/// clock for a periodic sample to the next. On the H200 that work cost a cudaMallocAsync
/// about 90 ns more than the others when done every 64th allocation (in the call's p99),
/// and 260 ns every 256th, whose lines are colder (past the p99.6): README, "The hook's
/// cost per call". A context switched where we cannot see it is found within as many.
pub const TICK_EVERY: u32 = 256;

/// Everything a hook needs of its thread, in one cache line, zero when the thread starts.
#[repr(C, align(64))]
pub struct ThreadState {
    in_hook: bool,
    /// `device` holds the device of this thread's current context.
    device_known: bool,
    lane_mode: u8,
    lane: u8,
    device: i16,
    _pad: u16,
    /// `RING.epoch` when this state was last brought up to date.
    epoch: u32,
    /// `FORK_GENERATION` when `tid` and the lane were taken.
    generation: u32,
    tid: u32,
    /// Allocations since this thread started (sampling and device checks every `TICK_EVERY`th).
    allocs: u32,
    /// This thread's own lane, while `lane_mode` is `LANE_OWNED`.
    owned: OwnedLane,
}

const _: () = assert!(core::mem::size_of::<ThreadState>() == 64);

/// The calling thread's `ThreadState`.
///
/// A `thread_local!` in a shared library is reached through `__tls_get_addr` (a call and
/// a dozen instructions). On x86-64 Linux the state is instead a symbol of our own in the
/// initial-exec TLS model: two instructions. The library then takes static TLS space,
/// which it has as an `LD_PRELOAD` library; a later `dlopen` of it takes the 64 bytes
/// from glibc's reserve for such libraries.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod thread {
    use super::ThreadState;

    core::arch::global_asm!(
        ".pushsection .tbss.vramhook_thread_state,\"awT\",@nobits",
        ".p2align 6",
        // Global for the other codegen units, hidden so that it binds inside the library.
        ".globl vramhook_thread_state",
        ".hidden vramhook_thread_state",
        ".type vramhook_thread_state, @object",
        ".size vramhook_thread_state, 64",
        "vramhook_thread_state:",
        ".skip 64",
        ".popsection",
    );

    #[inline(always)]
    pub fn state() -> *mut ThreadState {
        let p: usize;
        // SAFETY: the thread pointer (fs:0) plus the GOT's TLS offset of our symbol is its
        // address in this thread's static TLS block; reads nothing that changes.
        unsafe {
            core::arch::asm!(
                "mov {p}, qword ptr fs:[0]",
                "add {p}, qword ptr [rip + vramhook_thread_state@GOTTPOFF]",
                p = out(reg) p,
                options(pure, nomem, nostack),
            );
        }
        p as *mut ThreadState
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod thread {
    use super::ThreadState;
    use core::cell::UnsafeCell;

    thread_local! {
        static STATE: UnsafeCell<ThreadState> = const {
            UnsafeCell::new(ThreadState {
                in_hook: false, device_known: false, lane_mode: 0, lane: 0, device: 0, _pad: 0,
                epoch: 0, generation: 0, tid: 0, allocs: 0, owned: vramhook_ring::OwnedLane::UNSET,
            })
        };
    }

    #[inline(always)]
    pub fn state() -> *mut ThreadState {
        STATE.with(|c| c.get())
    }
}

/// The calling thread inside one of our hooks. Made by `Hook::enter`, which refuses when
/// the thread is already inside one (the driver calling itself, our own sampling, or a
/// signal handler that interrupted a hook): the caller then passes straight through.
/// Leaves the hook when dropped.
pub struct Hook {
    state: *mut ThreadState,
    /// The stamp [`Hook::begin_release`] took (0: none): the release's event carries it.
    release_stamp: core::cell::Cell<u64>,
}

impl Hook {
    #[inline(always)]
    pub fn enter() -> Option<Hook> {
        let state = thread::state();
        // SAFETY: only this thread touches its own state.
        unsafe {
            if (*state).in_hook {
                return None;
            }
            (*state).in_hook = true;
            if (*state).epoch != RING.epoch.load(Ordering::Relaxed) {
                refresh(&mut *state);
            }
        }
        let hook = Hook { state, release_stamp: core::cell::Cell::new(0) };
        if config::bench_skips(config::PREFETCH_BEFORE) {
            hook.prefetch_slot();
        }
        Some(hook)
    }

    /// The benchmark build's experiment: the next slot asked for before the driver runs.
    #[inline(always)]
    fn prefetch_slot(&self) {
        // SAFETY: as in `cached_device`.
        let s = unsafe { &*self.state };
        if s.lane_mode == LANE_OWNED {
            if let Some(w) = ring() {
                w.prefetch_next(&s.owned);
            }
        }
    }

    /// The device of this thread's current context, when a previous allocation asked the
    /// driver and no context change was seen since.
    #[inline(always)]
    pub fn cached_device(&self) -> Option<i16> {
        // SAFETY: `state` is this thread's, alive while the thread runs this hook.
        let s = unsafe { &*self.state };
        s.device_known.then_some(s.device)
    }

    /// Keeps the device the driver just named for this thread's current context. Returns
    /// false when a check found the cache wrong (then it is off for the whole process).
    pub fn remember_device(&self, device: i16, checking: bool) -> bool {
        // SAFETY: as in `cached_device`.
        let s = unsafe { &mut *self.state };
        if checking && s.device_known && s.device != device {
            turn_off_device_cache();
            return false;
        }
        if device >= 0 && RING.device_cache.load(Ordering::Acquire) {
            s.device = device;
            s.device_known = true;
        }
        true
    }

    /// Counts an allocation of this thread; true on every `TICK_EVERY`th (from the first),
    /// when the hook samples the device and checks the cached device against the driver.
    #[inline(always)]
    pub fn alloc_tick(&self) -> bool {
        // SAFETY: as in `cached_device`.
        let s = unsafe { &mut *self.state };
        s.allocs = s.allocs.wrapping_add(1);
        s.allocs % TICK_EVERY == 1 && !config::bench_skips(config::SKIP_TICK)
    }

    /// Records one event (built by one of `Event`'s per-kind constructors) as made by
    /// this thread, now. Never blocks: a full ring drops and counts it.
    #[inline(always)]
    pub fn emit(&self, ev: Event) {
        if config::bench_skips(config::SKIP_WRITE) {
            return;
        }
        if config::bench_skips(config::FLOOR) {
            floor(ev.addr);
            return;
        }
        if let Some(w) = ring() {
            self.push(w, ev);
        }
    }

    /// Before a driver call that releases what another thread could be handed next (a
    /// free, an unmap, a destroy): takes the release's stamp now and marks this thread's
    /// lane as inside the call (`vramhook_ring`'s release marker), so that the
    /// release is stamped before the driver can give its address to anyone, and no reader
    /// delivers what comes after it first. A thread without a lane of its own (it shares
    /// lane 0) stamps after the call, as for any other event.
    #[inline(always)]
    pub fn begin_release(&self) {
        // (The benchmark build's floor and no-write configurations time `emit` alone.)
        if config::bench_skips(config::SKIP_WRITE | config::FLOOR) {
            return;
        }
        let Some(w) = ring() else { return };
        let s = self.with_lane(w);
        if s.lane_mode == LANE_OWNED {
            let t = now().max(1);
            // SAFETY: the lane is this thread's (claim_lane), and this thread is in a hook.
            unsafe { s.owned.begin_release(t) };
            self.release_stamp.set(t);
        }
    }

    /// After the releasing call and its event: clears the lane's marker. Not in a child
    /// forked inside the call (its lane mode is then `LANE_FORKED`): the marker is the
    /// parent's, in the parent's ring.
    #[inline(always)]
    pub fn end_release(&self) {
        // SAFETY: as in `cached_device`.
        let s = unsafe { &*self.state };
        if self.release_stamp.get() != 0 && s.lane_mode == LANE_OWNED {
            // SAFETY: as in `begin_release`.
            unsafe { s.owned.end_release() };
        }
    }

    /// Records a release's event, stamped when [`Hook::begin_release`] ran (now, when it
    /// took no stamp). The release wrappers record with this, other wrappers with `emit`,
    /// whose path stays without the release's test.
    #[inline(always)]
    pub fn emit_release(&self, ev: Event) {
        let stamp = self.release_stamp.get();
        if stamp == 0 {
            return self.emit(ev);
        }
        if let Some(w) = ring() {
            self.push_stamped(w, ev, || stamp);
        }
    }

    /// This thread's state, its lane decided (the thread's first push claims one).
    // The state is reached through a raw pointer to the thread's own, not borrowed from the
    // hook, as in every method here.
    #[allow(clippy::mut_from_ref)]
    #[inline(always)]
    fn with_lane(&self, w: &RingWriter) -> &mut ThreadState {
        // SAFETY: as in `cached_device`.
        let s = unsafe { &mut *self.state };
        if s.lane_mode == LANE_NONE {
            claim_lane(s, w);
        }
        s
    }

    #[inline(always)]
    fn push(&self, w: &RingWriter, ev: Event) {
        self.push_stamped(w, ev, now)
    }

    /// `push`, with the stamp from `clock`, read where the record is built.
    #[inline(always)]
    fn push_stamped(&self, w: &RingWriter, ev: Event, clock: impl Fn() -> u64) {
        let s = self.with_lane(w);
        // Either way the record is built where it is written, from registers: one built
        // before the branch for an out-of-line shared push was laid on the stack on every
        // call, the owned lane's included.
        if s.lane_mode == LANE_OWNED {
            // The slot is looked at before the clock is read: after a driver call that look
            // may wait for the cache, and the clock read (a microcoded instruction, 16 ns on
            // the H200's host) then runs while it does.
            // SAFETY: the lane is this thread's alone (claim_lane), and this thread is in
            // a hook, so no handler of a signal that interrupted it pushes here too.
            let slot = unsafe {
                if config::bench_skips(config::SKIP_CHECK) {
                    w.reserve_exclusive_checked::<false>(&mut s.owned)
                } else {
                    w.reserve_exclusive(&mut s.owned)
                }
            };
            if let Some(slot) = slot {
                let raw = stamp_at(ev, s.tid, clock());
                // SAFETY: reserved just now, in this thread's lane.
                unsafe { w.publish_exclusive(&mut s.owned, slot, &raw) };
            }
        } else if s.lane_mode == LANE_SHARED {
            if let Some(slot) = reserve_shared(w) {
                // SAFETY: reserved just now, by this thread.
                unsafe { w.publish_reserved(slot, &stamp_at(ev, s.tid, clock())) };
            }
        }
    }

    /// As [`Hook::emit`], and says whether this process has a ring to record it in.
    pub fn emit_checked(&self, ev: Event) -> bool {
        match ring() {
            Some(w) => {
                self.push(w, ev);
                true
            }
            None => false,
        }
    }

    /// True at most once every `VRAMHOOK_MEMINFO_MS` across the process. Each thread
    /// looks at the (coarse) clock only every `TICK_EVERY`th allocation, keeping it off
    /// most calls.
    #[inline]
    pub fn periodic_sample_due(&self) -> bool {
        self.alloc_tick() && sample_clock_due()
    }
}

impl Drop for Hook {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: as in `cached_device`.
        unsafe { (*self.state).in_hook = false };
    }
}

/// The benchmark build's floor: a time stamp and one 64-byte store, nothing else.
#[inline(always)]
fn floor(word: u64) {
    #[repr(C, align(64))]
    struct Line([u64; 8]);
    static mut LINE: Line = Line([0; 8]);
    let t = clock::read_tsc();
    // SAFETY: only the one-thread benchmark writes it; volatile so the stores stay.
    unsafe {
        let line = core::ptr::addr_of_mut!(LINE.0) as *mut u64;
        for i in 0..8 {
            core::ptr::write_volatile(line.add(i), if i % 2 == 0 { t } else { word });
        }
    }
}

/// Brings a thread's state up to date after `RING.epoch` moved.
#[cold]
#[inline(never)]
fn refresh(s: &mut ThreadState) {
    let epoch = RING.epoch.load(Ordering::Acquire);
    let generation = FORK_GENERATION.load(Ordering::Acquire);
    if s.generation != generation {
        // SAFETY: gettid has no preconditions.
        s.tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        s.generation = generation;
        s.lane_mode = LANE_NONE;
    }
    s.device_known = false;
    s.epoch = epoch;
}

/// Which thread holds each lane (its tid; 0: free). Lane 0 is never held: it is where
/// threads without a lane of their own write, with a compare-and-swap.
static LANE_OWNERS: [AtomicU32; MAX_LANES as usize] = [const { AtomicU32::new(0) }; MAX_LANES as usize];

/// The first push of a thread: takes a lane of its own if one is free (or held by a
/// thread that is gone), else the thread writes to the shared lane 0 from now on.
#[cold]
#[inline(never)]
fn claim_lane(s: &mut ThreadState, w: &RingWriter) {
    s.lane_mode = LANE_SHARED;
    let own = w.lanes().saturating_sub(1);
    if own == 0 {
        return;
    }
    let start = s.tid % own;
    let lanes = || (0..own).map(|i| 1 + (start + i) % own);
    let mut taken = lanes().find(|&lane| {
        LANE_OWNERS[lane as usize].compare_exchange(0, s.tid, Ordering::AcqRel, Ordering::Acquire).is_ok()
    });
    if taken.is_none() {
        // Every lane is held: one whose thread is gone may be taken over (a holder with
        // our own tid is gone: tids are unique among living threads).
        taken = lanes().find(|&lane| {
            let holder = LANE_OWNERS[lane as usize].load(Ordering::Acquire);
            holder != 0
                && (holder == s.tid || !thread_alive(holder))
                && LANE_OWNERS[lane as usize]
                    .compare_exchange(holder, s.tid, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        });
    }
    if let Some(lane) = taken {
        s.lane = lane as u8;
        s.owned = w.own_lane(lane);
        s.lane_mode = LANE_OWNED;
    }
}

/// Whether thread `tid` of this process still exists (a signal 0 sends nothing).
fn thread_alive(tid: u32) -> bool {
    // SAFETY: tgkill with signal 0 only checks that the thread exists.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid as libc::c_int, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// A thread without a lane of its own: a slot of the shared lane 0 (compare-and-swap).
#[inline(never)]
fn reserve_shared(w: &RingWriter) -> Option<ReservedSlot> {
    w.reserve_in_lane(0)
}

/// Records `ev` from a path outside the wrappers (a hook miss, process exit): in this
/// thread's lane, or, when the thread is inside a hook (this may be a signal handler that
/// interrupted its push), in the shared lane.
fn push_outside_hook(w: &RingWriter, ev: Event) {
    match Hook::enter() {
        Some(hook) => hook.push(w, ev),
        None => {
            w.push_to_lane(0, &stamp(ev, current_tid()));
        }
    }
}

/// This thread's id, by system call (cold paths).
fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions.
    (unsafe { libc::syscall(libc::SYS_gettid) }) as u32
}

#[inline(always)]
fn now() -> u64 {
    if config::bench_skips(config::SKIP_CLOCK) {
        return 0;
    }
    if config::bench_skips(config::STAMP_COUNTER | config::STAMP_COARSE) {
        return other_stamp();
    }
    if RING.tsc.load(Ordering::Relaxed) {
        clock::read_tsc()
    } else {
        clock::monotonic_ns()
    }
}

/// The benchmark build's other stamps, timed in the TSC's place (see `config::STAMP_COUNTER`).
#[inline(always)]
fn other_stamp() -> u64 {
    #[repr(align(64))]
    struct Line(AtomicU64);
    static COUNTER: Line = Line(AtomicU64::new(0));
    if config::bench_skips(config::STAMP_COUNTER) {
        COUNTER.0.fetch_add(1, Ordering::Relaxed)
    } else {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
        (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
    }
}

/// The ring, creating it on first use. `None` when recording is impossible.
#[inline(always)]
fn ring() -> Option<&'static RingWriter> {
    if RING.state.load(Ordering::Acquire) == READY {
        // SAFETY: READY is published after the writer was initialised.
        return Some(unsafe { (*RING.writer.get()).assume_init_ref() });
    }
    ring_slow()
}

/// How long threads wait for another thread that is making the ring.
const CREATION_WAIT_MS: u64 = 2000;

/// The coarse monotonic clock in ms (a vDSO read).
fn coarse_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: CLOCK_MONOTONIC_COARSE into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

#[cold]
fn ring_slow() -> Option<&'static RingWriter> {
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

/// In the child after fork: forget the parent's ring (never write into it); the child
/// makes its own at its first CUDA call.
///
/// A fork can also happen inside a hook: a signal handler that forks while its thread is in
/// a driver call, and the child goes on from there. The call is the parent's (it records
/// it), so the hook the child returns to records nothing more (`LANE_FORKED`; before, it
/// wrote at the parent's lane cursor into the child's new ring, which then read as lost
/// events). The parent's mapping stays in that child: a push the signal interrupted may
/// still hold its addresses, and its stores repeat the parent's own.
extern "C" fn after_fork_in_child() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
    for owner in &LANE_OWNERS {
        owner.store(0, Ordering::Relaxed);
    }
    RING.epoch.fetch_add(1, Ordering::Relaxed);
    let state = thread::state();
    // SAFETY: the child's only thread, its own state; a hook it interrupted reads the
    // lane mode again after this handler returns.
    let forked_inside_a_hook = unsafe {
        let s = &mut *state;
        if s.in_hook {
            s.lane_mode = LANE_FORKED;
            // Stale on purpose: the next hook's `refresh` takes the tid and a lane anew.
            s.epoch = 0;
            s.generation = 0;
        }
        s.in_hook
    };
    if RING.state.load(Ordering::Acquire) == READY {
        let map = RING.map.swap(0, Ordering::Relaxed);
        let len = RING.map_len.load(Ordering::Relaxed);
        if map != 0 && !forked_inside_a_hook {
            // SAFETY: unmapping the inherited mapping of the parent's ring in the child.
            unsafe { libc::munmap(map as *mut libc::c_void, len) };
        }
    }
    RING.state.store(UNINIT, Ordering::Release);
}

/// The record of `ev` made by thread `tid` of this process, stamped now.
#[inline(always)]
fn stamp(ev: Event, tid: u32) -> RawRecord {
    stamp_at(ev, tid, now())
}

#[inline(always)]
fn stamp_at(ev: Event, tid: u32, ts: u64) -> RawRecord {
    ev.by(RING.pid.load(Ordering::Relaxed), tid).at(ts).to_raw()
}

/// Counts an entry point we could not wrap and records its name (init time only).
pub fn hook_miss(name: &[u8], version: i32, flags: u64) {
    let Some(w) = ring() else { return };
    w.count_hook_miss();
    push_outside_hook(w, Event::hook_miss(name, version, flags));
}

#[cold]
pub fn sample_clock_due() -> bool {
    let interval = config::MEMINFO_INTERVAL_MS.load(Ordering::Relaxed);
    let now_ms = coarse_ms() + 1;
    let last = LAST_MEMINFO_MS.load(Ordering::Relaxed);
    now_ms.saturating_sub(last) >= interval
        && LAST_MEMINFO_MS.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// At normal exit (library destructor).
pub fn process_exit() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if RING.state.load(Ordering::Acquire) == READY && RING.pid.load(Ordering::Relaxed) == pid {
        // SAFETY: READY.
        let w = unsafe { (*RING.writer.get()).assume_init_ref() };
        push_outside_hook(w, Event::process_exit());
        w.mark_exited();
    }
}
