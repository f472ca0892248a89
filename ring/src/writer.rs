//! The writer side of the ring: runs inside traced processes.

use super::*;
use std::sync::atomic::{AtomicU64, Ordering};
use vramhook_protocol::record::RawRecord;

/// Writer side, used inside traced processes: no allocation, no panic, no waiting.
pub struct RingWriter {
    pub(super) base: *mut u8,
    capacity: u64,
    lanes: u32,
    /// log2(capacity): a position's lap is `pos >> shift`, its slot `pos & (capacity - 1)`.
    shift: u32,
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
        RingWriter { base, capacity: init.capacity, lanes, shift: init.capacity.trailing_zeros() }
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

    /// Number of lanes (a power of two).
    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    /// The write cursor of `lane` as the ring holds it (where a writer taking the lane
    /// over goes on from).
    pub fn write_cursor(&self, lane: u32) -> u64 {
        // SAFETY: lane is clamped below lanes <= MAX_LANES.
        unsafe { lane_write_pos(self.base, lane & (self.lanes - 1)) }.load(Ordering::Acquire)
    }

    /// Appends one record (its `seq` is ignored) to the lane of its thread. Returns false
    /// when that lane was full and the event was dropped (and counted).
    #[inline(always)]
    pub fn push(&self, record: &RawRecord) -> bool {
        self.push_to_lane(record.tid.get() & (self.lanes - 1), record)
    }

    /// Appends one record to `lane`, which other threads may be writing at the same time:
    /// the slot is reserved with a compare-and-swap on the lane's cursor.
    #[inline(always)]
    pub fn push_to_lane(&self, lane: u32, record: &RawRecord) -> bool {
        match self.reserve_in_lane(lane) {
            Some(slot) => {
                // SAFETY: reserved just now, by this thread.
                unsafe { self.publish_reserved(slot, record) };
                true
            }
            None => false,
        }
    }

    /// The reserving half of [`Self::push_to_lane`]: a slot of `lane` this thread owns
    /// until it publishes it with [`Self::publish_reserved`], or `None` when the lane was
    /// full and the event was dropped (and counted). Split so that a caller can reserve
    /// out of line and still build the record in registers, where it is published.
    #[inline(always)]
    pub fn reserve_in_lane(&self, lane: u32) -> Option<ReservedSlot> {
        let header = self.header();
        let lane = lane & (self.lanes - 1);
        // SAFETY: lane < lanes <= MAX_LANES.
        let write_pos = unsafe { lane_write_pos(self.base, lane) };
        let mut pos = write_pos.load(Ordering::Relaxed);
        let mut attempts = 0;
        loop {
            attempts += 1;
            if attempts > MAX_PUSH_ATTEMPTS {
                header.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let lap = pos >> self.shift;
            let stamp = self.stamp(lane, pos & (self.capacity - 1)).load(Ordering::Acquire);
            if stamp == lap.wrapping_mul(2) {
                match write_pos.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Some(ReservedSlot { lane, pos }),
                    Err(current) => pos = current,
                }
            } else if stamp < lap.wrapping_mul(2) {
                // Still holds last lap's unread event: full.
                header.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            } else {
                pos = write_pos.load(Ordering::Relaxed);
            }
        }
    }

    /// Writes `record` into a slot [`Self::reserve_in_lane`] gave, and publishes it.
    ///
    /// # Safety
    /// `slot` came from `reserve_in_lane` of this writer and is published once.
    #[inline(always)]
    pub unsafe fn publish_reserved(&self, slot: ReservedSlot, record: &RawRecord) {
        self.fill_and_publish(slot.lane, slot.pos, record);
    }

    /// Takes `lane` over for one writer: what `push_exclusive` needs of it, with the
    /// cursor where the ring holds it.
    pub fn own_lane(&self, lane: u32) -> OwnedLane {
        let lane = lane & (self.lanes - 1);
        OwnedLane {
            slots: self.slot_ptr(lane, 0),
            // SAFETY: lane < lanes <= MAX_LANES.
            write_pos: unsafe { lane_write_pos(self.base, lane) },
            next: self.write_cursor(lane),
        }
    }

    /// Appends one record to `lane` as its only writer: no atomic read-modify-write (a
    /// locked instruction waits for every store before it, the driver's included, to
    /// drain), and the lane's cursor is only stored to, from the writer's own copy.
    ///
    /// # Safety
    /// `lane` came from `own_lane` of this writer, and no other thread (or signal
    /// handler) pushes to that lane from then on except through this `OwnedLane`, one
    /// push at a time.
    #[inline(always)]
    pub unsafe fn push_exclusive(&self, lane: &mut OwnedLane, record: &RawRecord) -> bool {
        // SAFETY: as this function's.
        match unsafe { self.reserve_exclusive(lane) } {
            Some(slot) => {
                // SAFETY: reserved just now, in this lane.
                unsafe { self.publish_exclusive(lane, slot, record) };
                true
            }
            None => false,
        }
    }

    /// The reserving half of [`Self::push_exclusive`]: the lane's next free slot, or `None`
    /// when the lane was full and the event was dropped (and counted). Split so that a
    /// caller can look at the slot (a load that may miss the cache after a driver call)
    /// before it reads the clock, whose cost the load's latency then hides behind.
    ///
    /// # Safety
    /// As for `push_exclusive`; the slot is published with [`Self::publish_exclusive`]
    /// before anything else is pushed to the lane.
    #[inline(always)]
    pub unsafe fn reserve_exclusive(&self, lane: &mut OwnedLane) -> Option<ExclusiveSlot> {
        // SAFETY: as this function's.
        unsafe { self.reserve_exclusive_checked::<true>(lane) }
    }

    /// `reserve_exclusive`, where `CHECK` false skips the look at the slot's stamp: only for
    /// timing that look on a ring that cannot fill (the interposer's `bench-parts` build).
    ///
    /// # Safety
    /// As for `reserve_exclusive`; with `CHECK` false, the lane must have room.
    #[doc(hidden)]
    #[inline(always)]
    pub unsafe fn reserve_exclusive_checked<const CHECK: bool>(&self, lane: &mut OwnedLane) -> Option<ExclusiveSlot> {
        let mut pos = lane.next;
        // Computed once, before the stamp's acquire load (after it, whatever the address
        // is made of would be loaded again).
        let mut slot = lane.slot(pos, self.capacity);
        // SAFETY: a slot's stamp is its first 8 bytes, 8-aligned, inside the lane.
        let free = !CHECK
            || unsafe { &*(slot as *const AtomicU64) }.load(Ordering::Acquire) == (pos >> self.shift).wrapping_mul(2);
        if !free {
            // SAFETY: as this function's.
            pos = unsafe { self.next_free_slot(lane) }?;
            slot = lane.slot(pos, self.capacity);
        }
        Some(ExclusiveSlot { slot, pos })
    }

    /// Writes `record` into a slot [`Self::reserve_exclusive`] gave, publishes it, and
    /// moves the lane's cursor past it.
    ///
    /// # Safety
    /// `slot` came from `reserve_exclusive` on this `lane`, and nothing was pushed to the
    /// lane since.
    #[inline(always)]
    pub unsafe fn publish_exclusive(&self, lane: &mut OwnedLane, slot: ExclusiveSlot, record: &RawRecord) {
        let ExclusiveSlot { slot, pos } = slot;
        // One place takes the record, after the slow path has joined again: the record
        // then goes from registers into the slot.
        // SAFETY: the slot is free and the lane ours.
        unsafe { fill_and_publish(slot, (pos >> self.shift).wrapping_mul(2) + 1, record) };
        let next = pos.wrapping_add(1);
        lane.next = next;
        // SAFETY: the lane's cursor, a word of the mapped header.
        unsafe { &*lane.write_pos }.store(next, Ordering::Release);
        // SAFETY: the lane's slots.
        unsafe { prefetch_next_slot(lane.slots, next, self.capacity - 1) };
    }

    /// Asks for the line of the lane's next slot, owned (a hint, for the `bench-parts` build).
    #[doc(hidden)]
    #[inline(always)]
    pub fn prefetch_next(&self, lane: &OwnedLane) {
        // SAFETY: the lane's slots.
        unsafe { prefetch_next_slot(lane.slots, lane.next, self.capacity - 1) };
    }

    /// The next slot of an owned lane is not free: the ring is full (it still holds last
    /// lap's unread event: drop, counted), or someone else wrote into it (a slot already
    /// used at a later lap: skip it, a bounded number of times, then drop). Never spins.
    /// Returns the position to write at.
    #[cold]
    #[inline(never)]
    unsafe fn next_free_slot(&self, lane: &mut OwnedLane) -> Option<u64> {
        let mut pos = lane.next;
        for _ in 0..MAX_PUSH_ATTEMPTS {
            // SAFETY: as in push_exclusive.
            let stamp = unsafe { &*(lane.slot(pos, self.capacity) as *const AtomicU64) }.load(Ordering::Acquire);
            let lap2 = (pos >> self.shift).wrapping_mul(2);
            if stamp == lap2 {
                return Some(pos);
            }
            if stamp < lap2 {
                break;
            }
            pos = pos.wrapping_add(1);
        }
        lane.next = pos;
        self.header().dropped.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Writes `record` into the slot of `pos`, which the caller owns, and publishes it.
    #[inline(always)]
    fn fill_and_publish(&self, lane: u32, pos: u64, record: &RawRecord) {
        let mask = self.capacity - 1;
        let slot = pos & mask;
        let lap = pos >> self.shift;
        // SAFETY: the caller reserved this slot.
        unsafe { fill_and_publish(self.slot_ptr(lane, slot), lap.wrapping_mul(2) + 1, record) };
        // SAFETY: the lane's slots.
        unsafe { prefetch_next_slot(self.slot_ptr(lane, 0), pos.wrapping_add(1), mask) };
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

/// A slot of a shared lane, reserved and not yet published (see
/// [`RingWriter::reserve_in_lane`]). One never published holds its lane's reader back.
#[derive(Debug)]
#[must_use = "a reserved slot must be published"]
pub struct ReservedSlot {
    lane: u32,
    pos: u64,
}

/// A slot of an owned lane, reserved and not yet published (see
/// [`RingWriter::reserve_exclusive`]).
#[derive(Debug)]
#[must_use = "a reserved slot must be published"]
pub struct ExclusiveSlot {
    slot: *mut u8,
    pos: u64,
}

/// A lane one thread writes alone: where its slots start, its cursor in the header, and
/// the writer's own copy of that cursor (see [`RingWriter::push_exclusive`]).
#[derive(Clone, Copy, Debug)]
pub struct OwnedLane {
    slots: *mut u8,
    write_pos: *const AtomicU64,
    next: u64,
}

impl OwnedLane {
    /// First byte of the slot of position `pos` in a lane of `capacity` slots.
    #[inline(always)]
    fn slot(&self, pos: u64, capacity: u64) -> *mut u8 {
        // SAFETY: the slot index is below capacity: inside the lane.
        unsafe { self.slots.add((pos & (capacity - 1)) as usize * RECORD_SIZE) }
    }
}

impl OwnedLane {
    /// Marks the lane as inside a releasing driver call stamped `stamp` (see the module
    /// doc): stored before the call, so that a reader that sees the address handed on to
    /// another thread sees the marker too.
    ///
    /// # Safety
    /// The lane is the caller's (as for `RingWriter::push_exclusive`).
    #[inline(always)]
    pub unsafe fn begin_release(&self, stamp: u64) {
        // SAFETY: as this function's.
        unsafe { self.release_marker() }.store(stamp.max(1), Ordering::Release);
    }

    /// Clears the marker, once the release's event is published.
    ///
    /// # Safety
    /// As for `begin_release`.
    #[inline(always)]
    pub unsafe fn end_release(&self) {
        // SAFETY: as this function's.
        unsafe { self.release_marker() }.store(0, Ordering::Release);
    }

    /// The lane's release marker: the word after its cursor, on the same line.
    ///
    /// # Safety
    /// The lane came from `own_lane` (not `UNSET`).
    #[inline(always)]
    unsafe fn release_marker(&self) -> &AtomicU64 {
        // SAFETY: as this function's: `write_pos` points into the mapped header.
        unsafe { &*self.write_pos.add(1) }
    }
}

impl OwnedLane {
    /// A lane that is no lane: only for zero-initialised thread state, never pushed to.
    pub const UNSET: OwnedLane = OwnedLane { slots: core::ptr::null_mut(), write_pos: core::ptr::null(), next: 0 };
}

/// Asks for the line of the lane's next slot, owned: the next push's stores then need no
/// request for ownership (the reader's core last wrote it, freeing the slot).
///
/// Once per page the slot a page further was asked for too, so that its page-table walk
/// would happen 64 events before it was needed (a lane moves to a new 4 KiB page every 64
/// events). On the development VM (AMD EPYC, nested paging) that prefetch was itself the
/// cost: bench_pair's positions showed +80..+280 ns at every new page in 6 of 10 processes
/// with it and in none of 10 without it, and the hooked allocation's p99 went from +195 to
/// +25 ns (README, "The hook's cost per call"). The `bench-parts` build keeps it behind
/// `VRAMHOOK_BENCH_SKIP=128`, to compare on other machines.
///
/// # Safety
/// `slots` is the first slot of a lane of `mask + 1` slots.
#[inline(always)]
unsafe fn prefetch_next_slot(slots: *mut u8, next: u64, mask: u64) {
    // CPUs before Broadwell execute PREFETCHW as a no-op.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetches are hints that never fault; the addresses lie inside the lane.
    unsafe {
        core::arch::asm!(
            "prefetchw [{a}]",
            a = in(reg) slots.add((next & mask) as usize * RECORD_SIZE),
            options(nostack, preserves_flags, readonly),
        );
        #[cfg(feature = "bench-parts")]
        if next.is_multiple_of(64) && bench::PAGE_AHEAD.load(Ordering::Relaxed) {
            core::arch::asm!(
                "prefetchw [{b}]",
                b = in(reg) slots.add((next.wrapping_add(64) & mask) as usize * RECORD_SIZE),
                options(nostack, preserves_flags, readonly),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slots, next, mask);
}

/// The writer's experiments, for the interposer's `bench-parts` build only.
#[cfg(feature = "bench-parts")]
#[doc(hidden)]
pub mod bench {
    use std::sync::atomic::AtomicBool;

    /// Also prefetch the slot a page ahead, once per page (what the writer did before).
    pub static PAGE_AHEAD: AtomicBool = AtomicBool::new(false);
}

/// Writes `record` but its first word into `slot`, then `stamp` into that word (release):
/// seven word stores and one publication, not a memcpy call. The words are made from the
/// record's fields in registers ([`RawRecord::to_words`]): reading them back from a record
/// laid out in memory by narrower stores stalls the load until those stores retire (a
/// failed store-to-load forward, several ns on every hooked call).
///
/// # Safety
/// `slot` is a 64-byte slot of a mapped ring that the caller owns until it is published.
#[inline(always)]
unsafe fn fill_and_publish(slot: *mut u8, stamp: u64, record: &RawRecord) {
    let words = record.to_words();
    // SAFETY: per this function's contract; the stamp is written only through the atomic.
    unsafe {
        let dst = slot as *mut u64;
        for (word, value) in words.iter().enumerate().skip(1) {
            dst.add(word).write(value.to_le());
        }
        (*(slot as *const AtomicU64)).store(stamp, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ring_file_size_lanes, RingInit, RingReader, RingWriter};
    use std::sync::atomic::{AtomicU64, Ordering};
    use vramhook_protocol::record::{Api, Event, EventKind, RawRecord};

    /// A zeroed, 64-byte-aligned ring of `lanes` lanes of `capacity` slots.
    fn ring(capacity: u64, lanes: u32) -> (Vec<u64>, RingWriter, RingReader) {
        let mut mem = vec![0u64; ring_file_size_lanes(capacity, lanes) / 8 + 8];
        let offset = mem.as_ptr().align_offset(64);
        // SAFETY: inside `mem`, which the caller keeps alive with the ring.
        let base = unsafe { (mem.as_mut_ptr() as *mut u8).add(offset * 8) };
        let init = RingInit { capacity, pid: 7, ..RingInit::default() };
        // SAFETY: a zeroed, aligned area of the right size.
        let writer = unsafe { RingWriter::init_lanes(base, &init, lanes, b"") };
        // SAFETY: as above.
        let reader = unsafe { RingReader::new(base, ring_file_size_lanes(capacity, lanes), None) }.expect("valid");
        (mem, writer, reader)
    }

    fn record(tid: u32, n: u64) -> RawRecord {
        Event {
            ts_ns: vramhook_protocol::clock::monotonic_ns(),
            kind: EventKind::Alloc.code(),
            api: Api::cuMemAlloc_v2.code(),
            pid: 7,
            tid,
            addr: n,
            size: 1,
            ..Event::default()
        }
        .to_raw()
    }

    #[test]
    fn owned_lanes_and_the_shared_lane_deliver_everything_once_in_thread_order() {
        let (_mem, writer, mut reader) = ring(1 << 10, 4);
        let writer = std::sync::Arc::new(writer);
        let per_thread = 5_000u64;
        // Threads 1..=3 each own a lane; threads 10 and 11 share lane 0.
        let mut threads = Vec::new();
        for tid in [1u32, 2, 3, 10, 11] {
            let w = writer.clone();
            threads.push(std::thread::spawn(move || {
                let mut lane = (tid < 10).then(|| w.own_lane(tid));
                let mut n = 0;
                while n < per_thread {
                    let r = record(tid, n);
                    // SAFETY: lane `tid` is this thread's alone.
                    let ok = match lane.as_mut() {
                        Some(lane) => unsafe { w.push_exclusive(lane, &r) },
                        None => w.push_to_lane(0, &r),
                    };
                    if ok {
                        n += 1;
                    } else {
                        std::thread::yield_now();
                    }
                }
            }));
        }
        let mut got = Vec::new();
        while threads.iter().any(|t| !t.is_finished()) {
            reader.poll(usize::MAX, false, |e| got.push(e));
        }
        for t in threads {
            t.join().expect("writer thread");
        }
        reader.poll(usize::MAX, true, |e| got.push(e));
        let got: Vec<_> = got.into_iter().filter(|e| e.kind == EventKind::Alloc.code()).collect();
        assert_eq!(got.len() as u64, 5 * per_thread, "every pushed event is read once");
        let seqs: std::collections::BTreeSet<u64> = got.iter().map(|e| e.seq).collect();
        assert_eq!(seqs.len(), got.len(), "seq is unique");
        for tid in [1u32, 2, 3, 10, 11] {
            let mine: Vec<u64> = got.iter().filter(|e| e.tid == tid).map(|e| e.addr).collect();
            assert_eq!(mine, (0..per_thread).collect::<Vec<_>>(), "thread {tid}'s events in order");
        }
    }

    #[test]
    fn an_owned_lane_drops_when_full_and_goes_on_after_the_reader_frees_slots() {
        let (_mem, writer, mut reader) = ring(16, 2);
        let mut lane = writer.own_lane(1);
        for n in 0..16 {
            // SAFETY: lane 1 is this test's alone.
            assert!(unsafe { writer.push_exclusive(&mut lane, &record(1, n)) });
        }
        // SAFETY: as above.
        assert!(!unsafe { writer.push_exclusive(&mut lane, &record(1, 16)) }, "a full lane drops");
        assert_eq!(reader.counters().dropped, 1, "and counts the drop");
        let mut got = Vec::new();
        reader.poll(usize::MAX, false, |e| got.push(e));
        // Two more laps through the freed slots.
        for n in 17..49 {
            // SAFETY: as above.
            assert!(unsafe { writer.push_exclusive(&mut lane, &record(1, n)) }, "event {n}");
            if n % 8 == 0 {
                reader.poll(usize::MAX, false, |e| got.push(e));
            }
        }
        reader.poll(usize::MAX, false, |e| got.push(e));
        let expected: Vec<u64> = (0..16).chain(17..49).collect();
        let alloc = EventKind::Alloc.code();
        assert_eq!(got.iter().filter(|e| e.kind == alloc).map(|e| e.addr).collect::<Vec<_>>(), expected);
        assert_eq!(got.iter().filter(|e| e.kind == EventKind::Dropped.code()).count(), 1, "one drop reported");
    }

    #[test]
    fn taking_a_lane_over_goes_on_from_its_cursor() {
        let (_mem, writer, mut reader) = ring(64, 2);
        for n in 0..5 {
            assert!(writer.push_to_lane(1, &record(1, n)));
        }
        let mut lane = writer.own_lane(1);
        for n in 5..10 {
            // SAFETY: nobody else pushes to lane 1 from now on.
            assert!(unsafe { writer.push_exclusive(&mut lane, &record(1, n)) });
        }
        assert_eq!(writer.write_cursor(1), 10);
        let mut got = Vec::new();
        reader.poll(usize::MAX, false, |e| got.push(e.addr));
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn an_owned_lane_in_a_corrupted_ring_skips_or_drops_and_never_spins() {
        let (mem, writer, _reader) = ring(16, 2);
        let mut lane = writer.own_lane(1);
        // Someone stamps lane 1's first three slots as used at a later lap.
        let slots = mem.as_ptr().align_offset(64) * 8 + super::HEADER_SIZE + 16 * 64;
        let stamp = |slot: usize| {
            // SAFETY: a slot's first word inside `mem`.
            unsafe { &*((mem.as_ptr() as *const u8).add(slots + slot * 64) as *const AtomicU64) }
        };
        for slot in 0..3 {
            stamp(slot).store(99, Ordering::Relaxed);
        }
        // SAFETY: lane 1 is this test's alone.
        assert!(unsafe { writer.push_exclusive(&mut lane, &record(1, 0)) });
        assert_eq!(stamp(3).load(Ordering::Relaxed), 1, "written past the three it may not use");
        assert_eq!(writer.write_cursor(1), 4);
        for slot in 0..16 {
            stamp(slot).store(99, Ordering::Relaxed);
        }
        // SAFETY: as above.
        assert!(!unsafe { writer.push_exclusive(&mut lane, &record(1, 1)) }, "no free slot: dropped");
    }
}
