//! The writer side of the ring: runs inside traced processes.

use super::*;
use crate::record::RawRecord;
use std::sync::atomic::Ordering;

/// Writer side, used inside traced processes: no allocation, no panic, no waiting.
pub struct RingWriter {
    pub(super) base: *mut u8,
    capacity: u64,
    lanes: u32,
}

// SAFETY: all shared state is reached through atomics or through slots that a writer
// owns exclusively between reserving and publishing them.
unsafe impl Send for RingWriter {}
unsafe impl Sync for RingWriter {}

impl RingWriter {
    /// Initialises a zero-filled mapping of `ring_file_size(init.capacity)` bytes.
    ///
    /// # Safety
    /// `base` must point to such a writable mapping, 64-byte aligned, that nobody else
    /// writes yet.
    pub unsafe fn init(base: *mut u8, init: &RingInit, meta: &[u8]) -> RingWriter {
        Self::init_lanes(base, init, 1, meta)
    }

    /// Like `init`, for a mapping of `ring_file_size_lanes(init.capacity, lanes)` bytes.
    ///
    /// # Safety
    /// As for `init`.
    pub unsafe fn init_lanes(base: *mut u8, init: &RingInit, lanes: u32, meta: &[u8]) -> RingWriter {
        let lanes = lanes.clamp(1, MAX_LANES).next_power_of_two();
        let header = &mut *(base as *mut RingHeader);
        header.lanes = lanes;
        header.header_size = HEADER_SIZE as u32;
        header.capacity = init.capacity;
        header.pid = init.pid;
        header.ppid = init.ppid;
        header.uid = init.uid;
        header.start_time = init.start_time;
        header.run_id = init.run_id;
        header.clock_source = init.clock_source;
        header.tsc_anchor = init.tsc_anchor;
        header.mono_anchor_ns = init.mono_anchor_ns;
        header.wall_anchor_ns = init.wall_anchor_ns;
        let meta_len = meta.len().min(META_CAPACITY);
        std::ptr::copy_nonoverlapping((meta_len as u64).to_le_bytes().as_ptr(), base.add(META_OFFSET), 8);
        std::ptr::copy_nonoverlapping(meta.as_ptr(), base.add(META_OFFSET + 8), meta_len);
        header.state.store(STATE_LIVE, Ordering::Relaxed);
        header.magic = RING_MAGIC;
        // Readers check the version last: publishing it makes the header valid.
        header.version.store(RING_VERSION, Ordering::Release);
        RingWriter { base, capacity: init.capacity, lanes }
    }

    pub(super) fn header(&self) -> &RingHeader {
        // SAFETY: `base` points at an initialised header for the writer's lifetime.
        unsafe { &*(self.base as *const RingHeader) }
    }

    /// First byte of slot `slot` of `lane`.
    #[inline(always)]
    fn slot_ptr(&self, lane: u32, slot: u64) -> *mut u8 {
        // SAFETY: lane < lanes and slot < capacity: inside the mapping, 64-byte aligned.
        unsafe { self.base.add(HEADER_SIZE + (lane as usize * self.capacity as usize + slot as usize) * RECORD_SIZE) }
    }

    #[inline(always)]
    fn stamp(&self, lane: u32, slot: u64) -> &AtomicU64 {
        // SAFETY: see slot_ptr; the stamp is the slot's first 8 bytes.
        unsafe { &*(self.slot_ptr(lane, slot) as *const AtomicU64) }
    }

    /// Appends one record (its `seq` is ignored) to the lane of its thread. Returns false
    /// when that lane was full and the event was dropped (and counted).
    #[inline(always)]
    pub fn push(&self, record: &RawRecord) -> bool {
        let header = self.header();
        let lane = record.tid.get() & (self.lanes - 1);
        // SAFETY: lane < lanes <= MAX_LANES.
        let write_pos = unsafe { lane_write_pos(self.base, lane) };
        let mask = self.capacity - 1;
        let shift = self.capacity.trailing_zeros();
        let mut pos = write_pos.load(Ordering::Relaxed);
        let mut attempts = 0;
        loop {
            attempts += 1;
            if attempts > MAX_PUSH_ATTEMPTS {
                header.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            let lap = pos >> shift;
            let stamp = self.stamp(lane, pos & mask).load(Ordering::Acquire);
            if stamp == lap.wrapping_mul(2) {
                match write_pos.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(current) => pos = current,
                }
            } else if stamp < lap.wrapping_mul(2) {
                // Still holds last lap's unread event: full.
                header.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            } else {
                pos = write_pos.load(Ordering::Relaxed);
            }
        }
        let slot = pos & mask;
        let lap = pos >> shift;
        let dst = self.slot_ptr(lane, slot);
        // SAFETY: we own this slot until we publish it; the stamp (first 8 bytes) is
        // written only through the atomic below. Seven word stores, not a memcpy call.
        unsafe {
            let src = record as *const RawRecord as *const u64;
            let dst = dst as *mut u64;
            for word in 1..RECORD_SIZE / 8 {
                dst.add(word).write(src.add(word).read_unaligned());
            }
        }
        self.stamp(lane, slot).store(lap.wrapping_mul(2) + 1, Ordering::Release);
        // The next event most likely goes to the next slot: bring its line in now, off
        // the next call's critical path.
        #[cfg(target_arch = "x86_64")]
        // SAFETY: prefetch is a hint; the address lies inside the mapping.
        unsafe {
            let next = self.slot_ptr(lane, (slot + 1) & mask);
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(next as *const i8);
        }
        true
    }

    /// Counts `n` events lost before they reached the ring.
    pub fn count_dropped(&self, n: u64) {
        self.header().dropped.fetch_add(n, Ordering::Relaxed);
    }

    pub fn count_hook_miss(&self) {
        self.header().hook_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the writer's pid namespace (see [`RingHeader::pid_ns`]).
    pub fn set_pid_ns(&self, ns: u64) {
        self.header().pid_ns.store(ns, Ordering::Release);
    }

    pub fn mark_exited(&self) {
        self.header().state.store(STATE_EXITED, Ordering::Release);
    }
}
