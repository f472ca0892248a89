//! The per-process ring: created at the first CUDA memory call, written by every hook.
//!
//! This module is the hooks' side (`Hook`, the process-wide `RING`); the rest by what it
//! holds: `thread` (each thread's state, its TLS and its lane), `time` (the stamps and the
//! coarse clock), `create` (making the ring at the first call, and the events lost while
//! another thread makes it), `fork` (the child forgets the parent's ring).

mod create;
mod fork;
mod thread;
mod time;

use crate::config;
use core::cell::UnsafeCell;
use core::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use thread::{claim_lane, refresh, reserve_shared, ThreadState, LANE_NONE, LANE_OWNED, LANE_SHARED};
use time::{coarse_ms, now, stamp, stamp_at};
use vramhook_protocol::clock;
use vramhook_protocol::record::Event;
use vramhook_ring::RingWriter;

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

/// A thread's allocations from one that asks the driver for its device and looks at the
/// clock for a periodic sample to the next. On the H200 that work cost a cudaMallocAsync
/// about 90 ns more than the others when done every 64th allocation (in the call's p99),
/// and 260 ns every 256th, whose lines are colder (past the p99.6): README, "The hook's
/// cost per call". A context switched where we cannot see it is found within as many.
pub const TICK_EVERY: u32 = 256;

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

/// The ring, creating it on first use. `None` when recording is impossible.
#[inline(always)]
fn ring() -> Option<&'static RingWriter> {
    if RING.state.load(Ordering::Acquire) == READY {
        // SAFETY: READY is published after the writer was initialised.
        return Some(unsafe { (*RING.writer.get()).assume_init_ref() });
    }
    create::ring_slow()
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
