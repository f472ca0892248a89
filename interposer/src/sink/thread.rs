//! Each thread's state (one line of static TLS), and the lane each thread owns.

use super::fork::FORK_GENERATION;
use super::RING;
use std::sync::atomic::{AtomicU32, Ordering};
use vramhook_ring::{OwnedLane, ReservedSlot, RingWriter, MAX_LANES};

pub(super) use tls::state;

/// Lane states in `ThreadState::lane_mode`.
pub(super) const LANE_NONE: u8 = 0;
/// `lane` is this thread's alone (see `claim_lane`).
pub(super) const LANE_OWNED: u8 = 1;
/// Lane 0, shared by every thread without a lane of its own (compare-and-swap).
pub(super) const LANE_SHARED: u8 = 2;
/// The process forked while this thread was inside a hook (a signal handler forked): the
/// call belongs to the parent, which records it; the child records nothing more of it.
/// The next hook brings the state up to date (`refresh`).
pub(super) const LANE_FORKED: u8 = 3;

/// Everything a hook needs of its thread, in one cache line, zero when the thread starts.
#[repr(C, align(64))]
pub struct ThreadState {
    pub(super) in_hook: bool,
    /// `device` holds the device of this thread's current context.
    pub(super) device_known: bool,
    pub(super) lane_mode: u8,
    lane: u8,
    pub(super) device: i16,
    _pad: u16,
    /// `RING.epoch` when this state was last brought up to date.
    pub(super) epoch: u32,
    /// `FORK_GENERATION` when `tid` and the lane were taken.
    pub(super) generation: u32,
    pub(super) tid: u32,
    /// Allocations since this thread started (sampling and device checks every `TICK_EVERY`th).
    pub(super) allocs: u32,
    /// This thread's own lane, while `lane_mode` is `LANE_OWNED`.
    pub(super) owned: OwnedLane,
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
mod tls {
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
mod tls {
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

/// Brings a thread's state up to date after `RING.epoch` moved.
#[cold]
#[inline(never)]
pub(super) fn refresh(s: &mut ThreadState) {
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
pub(super) static LANE_OWNERS: [AtomicU32; MAX_LANES as usize] = [const { AtomicU32::new(0) }; MAX_LANES as usize];

/// The first push of a thread: takes a lane of its own if one is free (or held by a
/// thread that is gone), else the thread writes to the shared lane 0 from now on.
#[cold]
#[inline(never)]
pub(super) fn claim_lane(s: &mut ThreadState, w: &RingWriter) {
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
pub(super) fn reserve_shared(w: &RingWriter) -> Option<ReservedSlot> {
    w.reserve_in_lane(0)
}
