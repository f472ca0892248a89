//! After fork: the child forgets the parent's ring, and its threads their lanes.

use super::thread::{self, LANE_FORKED, LANE_OWNERS};
use super::{READY, RING, UNINIT};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Bumped in the child after fork, so cached thread ids and lanes are taken anew.
pub(super) static FORK_GENERATION: AtomicU32 = AtomicU32::new(1);
pub(super) static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);

/// In the child after fork: forget the parent's ring (never write into it); the child
/// makes its own at its first CUDA call.
///
/// A fork can also happen inside a hook: a signal handler that forks while its thread is in
/// a driver call, and the child goes on from there. The call is the parent's (it records
/// it), so the hook the child returns to records nothing more (`LANE_FORKED`; before, it
/// wrote at the parent's lane cursor into the child's new ring, which then read as lost
/// events). The parent's mapping stays in that child: a push the signal interrupted may
/// still hold its addresses, and its stores repeat the parent's own.
pub(super) extern "C" fn after_fork_in_child() {
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
