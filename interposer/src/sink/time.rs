//! The time stamps of events, and the coarse clock of the periodic sample and the wait
//! for the ring.

use super::RING;
use crate::config;
use std::sync::atomic::{AtomicU64, Ordering};
use vramhook_protocol::clock;
use vramhook_protocol::record::{Event, RawRecord};

#[inline(always)]
pub(super) fn now() -> u64 {
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

/// The coarse monotonic clock in ms (a vDSO read).
pub(super) fn coarse_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: CLOCK_MONOTONIC_COARSE into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// The record of `ev` made by thread `tid` of this process, stamped now.
#[inline(always)]
pub(super) fn stamp(ev: Event, tid: u32) -> RawRecord {
    stamp_at(ev, tid, now())
}

#[inline(always)]
pub(super) fn stamp_at(ev: Event, tid: u32, ts: u64) -> RawRecord {
    ev.by(RING.pid.load(Ordering::Relaxed), tid).at(ts).to_raw()
}
