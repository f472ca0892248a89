//! The per-process shared-memory ring.
//!
//! File layout: a 4096-byte header page, then `capacity` 64-byte slots. Each slot is a
//! [`RawRecord`] whose first 8 bytes (`seq`) hold a publication stamp:
//! for ring position `p` with lap `L = p / capacity`, the slot is free for the writer of
//! `p` when the stamp is `2L`, and holds the event of `p` when it is `2L + 1`. The reader
//! frees it for the next lap by storing `2L + 2`. A freshly truncated (zero-filled) file
//! is therefore a valid empty ring, and a writer never waits: if the slot still holds an
//! unread event from the previous lap the ring is full and the event is dropped and
//! counted.
//!
//! Writers are the traced process's threads (the interposer); there is one reader at a
//! time (it holds an `flock` on the file). The reader treats everything in the file as
//! untrusted: the header is validated once and copied, cursors are clamped.
//!
//! Lanes: a ring has 1..=16 lanes, each an independent queue of `capacity` slots with its
//! own write cursor on its own cache line; a thread writes to lane `tid mod lanes`, so
//! threads on different cores do not contend for one cursor. Lane 0 keeps the single-lane
//! layout. An event's `seq` is `position * lanes + lane`: unique and stable across reader
//! restarts (equal to the position with one lane). The reader merges lanes by timestamp
//! without breaking causality: at the start of a poll it reads the clock (`t0`) and takes
//! from each lane only the prefix of events stamped at or before `t0`. A writer stamps an
//! event before reserving its slot and publishes it before the program sees the call's
//! result, so any event that causally precedes one stamped before `t0` was published
//! before `t0`, and is read in the same poll or an earlier one.

use crate::clock::{ClockSource, TscClock};
use crate::record::{Event, EventKind, RawRecord, RECORD_SIZE};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use zerocopy::little_endian::U64;
use zerocopy::FromBytes;

pub const RING_MAGIC: [u8; 8] = *b"VRHKRING";
pub const RING_VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 4096;
/// Lanes 1.. keep their write cursors here, one cache line each (lane 0's is in `RingHeader`).
pub const LANE_CURSORS_OFFSET: usize = 1024;
pub const MAX_LANES: u32 = 16;
/// The reader's cursors for lanes 1.. (lane 0's is `RingHeader::read_pos`).
pub const LANE_READ_OFFSET: usize = LANE_CURSORS_OFFSET + (MAX_LANES as usize - 1) * 64;
/// Offset and size of the process metadata area inside the header page.
pub const META_OFFSET: usize = LANE_READ_OFFSET + MAX_LANES as usize * 8;
pub const META_CAPACITY: usize = HEADER_SIZE - META_OFFSET - 8;
pub const MIN_CAPACITY: u64 = 16;
pub const MAX_CAPACITY: u64 = 1 << 24;
pub const DEFAULT_CAPACITY: u64 = 1 << 16;

/// Writer gives up on a slot after this many contended attempts and drops the event:
/// a corrupted ring must never make the traced program spin.
const MAX_PUSH_ATTEMPTS: u32 = 64;

pub const STATE_LIVE: u32 = 1;
pub const STATE_EXITED: u32 = 2;

/// The header page. Fields the writer sets once come first; the atomics each sit in their
/// own cache line so that the reader's cursor does not bounce with the writers'.
#[repr(C)]
pub struct RingHeader {
    pub magic: [u8; 8],
    pub version: AtomicU32,
    pub header_size: u32,
    pub capacity: u64,
    pub pid: u32,
    pub uid: u32,
    /// Process start time in clock ticks since boot (field 22 of /proc/PID/stat).
    pub start_time: u64,
    pub run_id: u64,
    pub clock_source: u32,
    pub ppid: u32,
    pub tsc_anchor: u64,
    pub mono_anchor_ns: u64,
    pub wall_anchor_ns: u64,
    /// Number of lanes (a power of two up to 16); 0 reads as 1.
    pub lanes: u32,
    _pad0: [u8; 256 - 84],
    pub write_pos: AtomicU64,
    _pad1: [u8; 56],
    pub read_pos: AtomicU64,
    pub dropped_reported: AtomicU64,
    _pad2: [u8; 48],
    pub dropped: AtomicU64,
    /// Entry points handed out by the driver that no wrapper matched.
    pub hook_misses: AtomicU64,
    pub state: AtomicU32,
    _pad3: [u8; 4],
    /// Wall-clock seconds when a gc first found this ring's process gone with events not
    /// drained (0: not yet). The keep-hours budget counts from here, not from the ring's
    /// creation: a job that ran for days is not expired the moment it dies.
    pub gone_since_s: AtomicU64,
    /// Inode of the writer's pid namespace (`/proc/self/ns/pid`; 0: unknown). A gc in
    /// another pid namespace cannot look the writer up in its /proc, so it leaves such a
    /// ring alone unless the writer marked it exited.
    pub pid_ns: AtomicU64,
    /// Slots (summed over lanes) whose events a reader has handed on for good: in its
    /// capture, or counted. Set by a reader that stops cleanly. A ring whose read cursors
    /// are past this was read by a reader that died before recording what it took: its
    /// events may be lost, so it is not "drained" for gc, and the next reader counts them.
    pub recorded: AtomicU64,
    _pad4: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<RingHeader>() == 448);
const _: () = assert!(std::mem::offset_of!(RingHeader, write_pos) == 256);
const _: () = assert!(std::mem::offset_of!(RingHeader, read_pos) == 320);
const _: () = assert!(std::mem::offset_of!(RingHeader, dropped) == 384);
const _: () = assert!(std::mem::offset_of!(RingHeader, gone_since_s) == 408);
const _: () = assert!(std::mem::offset_of!(RingHeader, pid_ns) == 416);
const _: () = assert!(std::mem::offset_of!(RingHeader, recorded) == 424);

/// Bytes a one-lane ring of `capacity` slots occupies.
pub const fn ring_file_size(capacity: u64) -> usize {
    ring_file_size_lanes(capacity, 1)
}

/// Bytes a ring of `lanes` lanes of `capacity` slots each occupies.
pub const fn ring_file_size_lanes(capacity: u64, lanes: u32) -> usize {
    HEADER_SIZE + lanes as usize * capacity as usize * RECORD_SIZE
}

/// Lane count for a process on a machine with `cpus` CPUs: one per CPU, up to 16.
pub fn lanes_for_cpus(cpus: usize) -> u32 {
    (cpus.clamp(1, MAX_LANES as usize) as u32).next_power_of_two().min(MAX_LANES)
}

/// The write cursor of `lane` in a mapped ring.
///
/// # Safety
/// `base` must be a mapped ring header; `lane < MAX_LANES`.
#[inline(always)]
unsafe fn lane_write_pos<'a>(base: *mut u8, lane: u32) -> &'a AtomicU64 {
    if lane == 0 {
        &(*(base as *const RingHeader)).write_pos
    } else {
        &*(base.add(LANE_CURSORS_OFFSET + (lane as usize - 1) * 64) as *const AtomicU64)
    }
}

/// The reader's cursor of `lane`.
///
/// # Safety
/// As for `lane_write_pos`.
unsafe fn lane_read_pos<'a>(base: *mut u8, lane: u32) -> &'a AtomicU64 {
    if lane == 0 {
        &(*(base as *const RingHeader)).read_pos
    } else {
        &*(base.add(LANE_READ_OFFSET + lane as usize * 8) as *const AtomicU64)
    }
}

/// What the writer puts in the header when it creates a ring.
#[derive(Clone, Copy, Debug, Default)]
pub struct RingInit {
    pub capacity: u64,
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    pub start_time: u64,
    pub run_id: u64,
    pub clock_source: u32,
    pub tsc_anchor: u64,
    pub mono_anchor_ns: u64,
    pub wall_anchor_ns: u64,
}

/// Writer side, used inside traced processes: no allocation, no panic, no waiting.
pub struct RingWriter {
    base: *mut u8,
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

    fn header(&self) -> &RingHeader {
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

/// Why a ring file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("ring file is {0} bytes, smaller than its header")]
    TooSmall(usize),
    #[error("not a vramhook ring (bad magic)")]
    BadMagic,
    #[error("ring header not yet published")]
    NotReady,
    #[error("ring format version {0} is newer than this reader understands ({RING_VERSION})")]
    NewerVersion(u32),
    #[error("ring header size {0} is not {HEADER_SIZE}")]
    BadHeaderSize(u32),
    #[error("ring capacity {0} is not a power of two between {MIN_CAPACITY} and {MAX_CAPACITY}")]
    BadCapacity(u64),
    #[error("ring lane count {0} is not a power of two up to {MAX_LANES}")]
    BadLanes(u32),
    #[error("ring file is {actual} bytes, its header says {expected}")]
    SizeMismatch { expected: usize, actual: usize },
    #[error("not a regular file")]
    NotRegular,
    #[error("ring file is {len} bytes, more than the {max} bytes a reader accepts")]
    TooLarge { len: u64, max: u64 },
    #[error("ring file of {len} bytes was cut to {at} bytes while mapped")]
    Shrank { len: usize, at: u64 },
    #[error("too many files mapped at once to guard one more against truncation")]
    Unguarded,
    #[error("i/o on ring file: {0}")]
    Io(#[from] std::io::Error),
}

/// Facts about the traced process, copied out of a validated header.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingInfo {
    pub pid: u32,
    pub ppid: u32,
    pub uid: u32,
    pub start_time: u64,
    pub run_id: u64,
    pub capacity: u64,
    pub clock_source: u32,
    pub mono_anchor_ns: u64,
    pub wall_anchor_ns: u64,
    /// Executable path.
    pub exe: String,
    /// Command line, arguments separated by NUL.
    pub cmdline: Vec<String>,
}

/// Counters a reader can show at any moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingCounters {
    /// Events that got a slot (= delivered + still queued + lost in flight).
    pub reserved: u64,
    /// Events the writer dropped because the ring was full.
    pub dropped: u64,
    pub hook_misses: u64,
    pub exited: bool,
}

/// What one `poll` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollStats {
    pub delivered: u64,
    /// Slots reserved by a writer that died before publishing them.
    pub lost_in_flight: u64,
    /// Slots whose stamp made no sense (a corrupted or hostile ring).
    pub malformed: u64,
    /// New drops reported as a `Dropped` event.
    pub dropped: u64,
}

/// A validated view of a ring file, owned by the one reader that holds its lock.
pub struct RingReader {
    base: *mut u8,
    len: usize,
    capacity: u64,
    lanes: u32,
    info: RingInfo,
    /// Next position to read, per lane.
    pos: [u64; MAX_LANES as usize],
    clock: Option<TscClock>,
    tsc_source: bool,
    merge: Vec<(u64, u64, RawRecord)>,
}

// SAFETY: the mapping is owned by this reader; shared state is accessed via atomics.
unsafe impl Send for RingReader {}

impl RingReader {
    /// Validates a mapping of `len` bytes.
    ///
    /// # Safety
    /// `base` must be a readable and writable shared mapping of `len` bytes that stays
    /// mapped for the reader's lifetime (the reader unmaps nothing; see `MappedRing`).
    pub unsafe fn new(base: *mut u8, len: usize, tsc: Option<TscClock>) -> Result<RingReader, RingError> {
        if len < HEADER_SIZE {
            return Err(RingError::TooSmall(len));
        }
        let header = &*(base as *const RingHeader);
        let version = header.version.load(Ordering::Acquire);
        if version == 0 {
            return Err(RingError::NotReady);
        }
        if std::ptr::read_volatile(&header.magic) != RING_MAGIC {
            return Err(RingError::BadMagic);
        }
        if version > RING_VERSION {
            return Err(RingError::NewerVersion(version));
        }
        let header_size = std::ptr::read_volatile(&header.header_size);
        if header_size as usize != HEADER_SIZE {
            return Err(RingError::BadHeaderSize(header_size));
        }
        let capacity = std::ptr::read_volatile(&header.capacity);
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(RingError::BadCapacity(capacity));
        }
        let lanes = match std::ptr::read_volatile(&header.lanes) {
            0 => 1,
            n if n.is_power_of_two() && n <= MAX_LANES => n,
            n => return Err(RingError::BadLanes(n)),
        };
        let expected = ring_file_size_lanes(capacity, lanes);
        if len != expected {
            return Err(RingError::SizeMismatch { expected, actual: len });
        }
        let meta = std::slice::from_raw_parts(base.add(META_OFFSET), HEADER_SIZE - META_OFFSET);
        let (exe, cmdline) = parse_meta(meta);
        let info = RingInfo {
            pid: std::ptr::read_volatile(&header.pid),
            ppid: std::ptr::read_volatile(&header.ppid),
            uid: std::ptr::read_volatile(&header.uid),
            start_time: std::ptr::read_volatile(&header.start_time),
            run_id: std::ptr::read_volatile(&header.run_id),
            capacity,
            clock_source: std::ptr::read_volatile(&header.clock_source),
            mono_anchor_ns: std::ptr::read_volatile(&header.mono_anchor_ns),
            wall_anchor_ns: std::ptr::read_volatile(&header.wall_anchor_ns),
            exe,
            cmdline,
        };
        let mut pos = [0u64; MAX_LANES as usize];
        for (lane, p) in pos.iter_mut().enumerate().take(lanes as usize) {
            *p = lane_read_pos(base, lane as u32).load(Ordering::Acquire);
        }
        let tsc_source = info.clock_source == ClockSource::Tsc as u32;
        let clock = if tsc_source { tsc } else { None };
        Ok(RingReader { base, len, capacity, lanes, info, pos, clock, tsc_source, merge: Vec::new() })
    }

    pub fn info(&self) -> &RingInfo {
        &self.info
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: validated at construction; the mapping outlives the reader.
        unsafe { &*(self.base as *const RingHeader) }
    }

    fn write_pos(&self, lane: u32) -> u64 {
        // SAFETY: lane < lanes, validated.
        unsafe { lane_write_pos(self.base, lane) }.load(Ordering::Acquire)
    }

    fn slot(&self, lane: u32, pos: u64) -> *mut u8 {
        let slot = pos & (self.capacity - 1);
        // SAFETY: lane < lanes and slot < capacity: inside the validated mapping.
        unsafe { self.base.add(HEADER_SIZE + (lane as usize * self.capacity as usize + slot as usize) * RECORD_SIZE) }
    }

    pub fn counters(&self) -> RingCounters {
        let h = self.header();
        RingCounters {
            reserved: (0..self.lanes).map(|l| self.write_pos(l)).fold(0u64, u64::saturating_add),
            dropped: h.dropped.load(Ordering::Acquire),
            hook_misses: h.hook_misses.load(Ordering::Relaxed),
            exited: h.state.load(Ordering::Acquire) == STATE_EXITED,
        }
    }

    /// Checks what the writer claims in the header against what a writer can do: each
    /// lane's write cursor lies between this reader's position and one lap ahead (a writer
    /// never passes a slot that was not read), and the drop and hook-miss counters are at
    /// most `max_events` (what the process could have issued at all). `Err` says what is
    /// impossible: the ring is hostile or corrupted.
    pub fn check_claims(&self, max_events: u64) -> Result<(), String> {
        for lane in 0..self.lanes {
            let write = self.write_pos(lane);
            let read = self.pos[lane as usize];
            if write < read {
                return Err(format!("lane {lane}: write cursor {write} is behind the read cursor {read}"));
            }
            if write - read > self.capacity {
                return Err(format!(
                    "lane {lane}: write cursor {write} is more than a lap ({}) ahead of the read cursor {read}",
                    self.capacity
                ));
            }
        }
        let h = self.header();
        let dropped = h.dropped.load(Ordering::Acquire);
        if dropped > max_events {
            return Err(format!("claims {dropped} dropped events, more than the {max_events} it could have issued"));
        }
        let misses = h.hook_misses.load(Ordering::Relaxed);
        if misses > max_events {
            return Err(format!("claims {misses} hook misses, more than the {max_events} it could have issued"));
        }
        Ok(())
    }

    /// Marks everything read so far as handed on for good (see [`RingHeader::recorded`]).
    /// A reader calls it when it stops cleanly, once its events are in its capture.
    pub fn mark_recorded(&self) {
        self.header().recorded.store(self.position(), Ordering::Release);
    }

    /// Writer drops already reported as `Dropped` events (by this reader or earlier ones).
    pub fn drops_reported(&self) -> u64 {
        self.header().dropped_reported.load(Ordering::Acquire)
    }

    /// Events reserved but not yet read.
    pub fn pending(&self) -> u64 {
        (0..self.lanes).map(|l| self.write_pos(l).saturating_sub(self.pos[l as usize])).fold(0u64, u64::saturating_add)
    }

    /// Events read so far over all lanes (the position of the next event with one lane).
    pub fn position(&self) -> u64 {
        self.pos[..self.lanes as usize].iter().fold(0u64, |a, p| a.saturating_add(*p))
    }

    /// The current time in the ring's clock (TSC ticks or monotonic ns).
    fn clock_now(&self) -> u64 {
        if self.tsc_source {
            crate::clock::read_tsc()
        } else {
            crate::clock::monotonic_ns()
        }
    }

    /// Reads up to `max` published events, merged over lanes in time order without
    /// breaking causality (see the module doc), handing each (with `seq` set and `ts_ns`
    /// on the monotonic clock) to `sink`. With `writer_gone`, everything is read and slots
    /// a dead writer reserved but never published are skipped and counted. A `Dropped`
    /// event is emitted whenever the writer's drop counter has grown.
    pub fn poll(&mut self, max: usize, writer_gone: bool, mut sink: impl FnMut(Event)) -> PollStats {
        let mut stats = PollStats::default();
        let shift = self.capacity.trailing_zeros();
        // Taken before any lane is read: the causal watermark.
        let watermark = if writer_gone || self.lanes == 1 { u64::MAX } else { self.clock_now() };
        let now = self.clock.as_ref().map(|c| c.now_pair());
        let per_lane = (max / self.lanes as usize).max(1);
        // Slots looked at per lane: bounded too, not only those delivered, so a ring whose
        // cursors claim a full lap with nothing published costs little per poll.
        let max_scan = (per_lane as u64).saturating_mul(4).max(1024);
        let mut merge = std::mem::take(&mut self.merge);
        merge.clear();
        for lane in 0..self.lanes {
            let write_pos = self.write_pos(lane);
            let mut pos = self.pos[lane as usize];
            // A hostile writer may claim anything; never look further than one lap ahead.
            let end = write_pos.min(pos.saturating_add(self.capacity));
            if write_pos < pos {
                stats.malformed += 1;
            }
            let mut taken = 0usize;
            // `pos` only advances over the contiguous prefix of consumed slots; past a slot
            // that must wait (stamped after the watermark, or not yet published) the scan
            // goes on and consumes what it may, restamping those slots so that a later
            // poll, or a restarted reader, skips them as already consumed.
            let mut scan = pos;
            let end = end.min(pos.saturating_add(max_scan));
            let mut prefix = true;
            while scan < end && taken < per_lane {
                let lap = scan >> shift;
                let slot = self.slot(lane, scan);
                // SAFETY: slots are 8-byte aligned; the stamp is only accessed atomically.
                let stamp_ref = unsafe { &*(slot as *const AtomicU64) };
                let stamp = stamp_ref.load(Ordering::Acquire);
                let free_next = lap.wrapping_mul(2).wrapping_add(2);
                let consumed = if stamp == lap.wrapping_mul(2).wrapping_add(1) {
                    let mut bytes = [0u8; RECORD_SIZE];
                    // SAFETY: the slot is published and ours until we restamp it.
                    unsafe { std::ptr::copy_nonoverlapping(slot, bytes.as_mut_ptr(), RECORD_SIZE) };
                    let mut raw = match RawRecord::read_from_bytes(&bytes) {
                        Ok(raw) => raw,
                        Err(_) => unreachable_record(),
                    };
                    let ts = raw.ts_ns.get();
                    if ts > watermark {
                        false // stamped after this poll began: a later poll takes it
                    } else {
                        raw.seq = U64::new(scan.wrapping_mul(u64::from(self.lanes)).wrapping_add(u64::from(lane)));
                        stamp_ref.store(free_next, Ordering::Release);
                        merge.push((ts, raw.seq.get(), raw));
                        taken += 1;
                        true
                    }
                } else if stamp >= free_next && stamp - free_next < 4 {
                    // Already consumed: ahead of the cursor by an earlier poll, or by an
                    // earlier reader that died before saving its cursor (the writer may
                    // already have reused the slot for the next lap).
                    true
                } else if writer_gone {
                    if stamp == lap.wrapping_mul(2) {
                        stats.lost_in_flight += 1;
                    } else {
                        stats.malformed += 1;
                    }
                    stamp_ref.store(free_next, Ordering::Release);
                    true
                } else {
                    if stamp != lap.wrapping_mul(2) {
                        stats.malformed += 1;
                    }
                    // Reserved but not yet published by a live writer: come back later.
                    false
                };
                if prefix && consumed {
                    pos = scan + 1;
                } else {
                    prefix = false;
                }
                scan += 1;
            }
            self.pos[lane as usize] = pos;
            // SAFETY: lane < lanes.
            unsafe { lane_read_pos(self.base, lane) }.store(pos, Ordering::Release);
        }
        // Time order across lanes; within a lane, order of reservation (stable sort).
        if self.lanes > 1 {
            merge.sort_by_key(|(ts, _, _)| *ts);
        }
        for (_, _, mut raw) in merge.drain(..) {
            if let (Some(clock), Some((tsc_now, mono_now))) = (&self.clock, now) {
                raw.ts_ns = U64::new(clock.to_monotonic(raw.ts_ns.get(), tsc_now, mono_now));
            }
            stats.delivered += 1;
            sink(Event::from_raw(&raw));
        }
        // Keep the buffer, but not the peak of a burst (a reader may hold many rings).
        if merge.capacity() > 4096 {
            merge.shrink_to(4096);
        }
        self.merge = merge;
        let header = self.header();
        let dropped = header.dropped.load(Ordering::Acquire);
        let reported = header.dropped_reported.load(Ordering::Acquire);
        let lost_total = dropped.saturating_sub(reported) + stats.lost_in_flight;
        if lost_total > 0 {
            header.dropped_reported.store(dropped, Ordering::Release);
            stats.dropped = lost_total;
            sink(Event {
                seq: self.position(),
                ts_ns: now.map(|(_, mono)| mono).unwrap_or_else(crate::clock::monotonic_ns),
                pid: self.info.pid,
                kind: EventKind::Dropped.code(),
                api: crate::record::Api::Interposer.code(),
                device: -1,
                size: lost_total,
                aux: stats.lost_in_flight,
                ..Event::default()
            });
        }
        stats
    }
}

#[cold]
fn unreachable_record() -> RawRecord {
    // read_from_bytes on a 64-byte array cannot fail; keep a value rather than a panic.
    RawRecord::default()
}

/// Metadata area: u64 length, then `exe \0 arg0 \0 arg1 ...`.
pub fn encode_meta(exe: &[u8], cmdline: &[u8], out: &mut [u8]) -> usize {
    let mut n = 0;
    for part in [exe, b"\0", cmdline] {
        let take = part.len().min(out.len().saturating_sub(n));
        out[n..n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    n
}

fn parse_meta(area: &[u8]) -> (String, Vec<String>) {
    let len = u64::from_le_bytes(area[..8].try_into().unwrap_or([0; 8])) as usize;
    let body = &area[8..8 + len.min(area.len() - 8)];
    let mut parts = body.split(|b| *b == 0);
    let exe = parts.next().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default();
    let cmdline: Vec<String> =
        parts.filter(|p| !p.is_empty()).map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    (exe, cmdline)
}

/// Largest ring file a reader maps by default: 64 MiB of slots (1 Mi events) plus the
/// header page (the interposer's default ring is 4 MiB of slots). Anything bigger is
/// refused before it is mapped.
pub const DEFAULT_MAX_RING_BYTES: u64 = (64 << 20) + HEADER_SIZE as u64;

/// A ring file mapped by a reader, locked so that no second reader drains it.
///
/// The map is guarded against the file's truncation (see [`crate::mapped`]): a writer that
/// cuts its own ring while it is mapped does not kill the reader with `SIGBUS`; the rest of
/// the map then reads as zeros (an empty ring) and [`MappedRing::shrank`] says where.
pub struct MappedRing {
    pub reader: RingReader,
    file: std::fs::File,
    map: *mut libc::c_void,
    len: usize,
    guard: usize,
}

// SAFETY: owned mapping.
unsafe impl Send for MappedRing {}

impl MappedRing {
    /// Opens (never blocking: a FIFO or device named like a ring is refused), locks
    /// (non-blocking) and validates a ring file. Returns `Ok(None)` when another reader
    /// holds it.
    pub fn open(path: &std::path::Path, tsc: Option<TscClock>) -> Result<Option<MappedRing>, RingError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)?;
        Self::from_file(file, tsc, u64::MAX)
    }

    /// Locks, checks and maps a ring file opened read-write by the caller. Refuses what is
    /// not a regular file and files larger than `max_len` bytes, before mapping anything.
    /// Returns `Ok(None)` when another reader holds it.
    pub fn from_file(
        file: std::fs::File,
        tsc: Option<TscClock>,
        max_len: u64,
    ) -> Result<Option<MappedRing>, RingError> {
        use std::os::unix::io::AsRawFd;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(RingError::NotRegular);
        }
        if meta.len() > max_len {
            return Err(RingError::TooLarge { len: meta.len(), max: max_len });
        }
        // SAFETY: valid fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(None);
            }
            return Err(err.into());
        }
        // The size again, now that no other reader can be busy with it.
        let len = file.metadata()?.len();
        if len > max_len {
            return Err(RingError::TooLarge { len, max: max_len });
        }
        let len = len as usize;
        if len < HEADER_SIZE {
            return Err(RingError::TooSmall(len));
        }
        // SAFETY: mapping a file we opened read-write, with its current length.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        let Some(guard) = crate::mapped::guard(map as usize, len, true) else {
            // SAFETY: unmapping what we mapped above.
            unsafe { libc::munmap(map, len) };
            return Err(RingError::Unguarded);
        };
        // SAFETY: the mapping lives as long as MappedRing; a truncation under it reads
        // as zeros (guarded above).
        let reader = unsafe { RingReader::new(map as *mut u8, len, tsc) };
        let cut = crate::mapped::region_cut(guard);
        match (reader, cut) {
            (Ok(reader), None) => Ok(Some(MappedRing { reader, file, map, len, guard })),
            (result, cut) => {
                crate::mapped::unguard(guard);
                // SAFETY: unmapping what we mapped above; nothing borrows it any more.
                unsafe { libc::munmap(map, len) };
                match (result, cut) {
                    (_, Some(at)) => Err(RingError::Shrank { len, at }),
                    (Err(e), None) => Err(e),
                    (Ok(_), None) => Err(RingError::NotReady), // unreachable: matched above
                }
            }
        }
    }

    pub fn file(&self) -> &std::fs::File {
        &self.file
    }

    /// Where the file was cut, if it shrank while mapped (the map reads zeros from there
    /// on). A ring that shrank is finished: its reader must close it.
    pub fn shrank(&self) -> Option<u64> {
        crate::mapped::region_cut(self.guard)
    }

    /// Bytes mapped (the file's size when it was opened).
    pub fn mapped_len(&self) -> usize {
        self.len
    }
}

impl Drop for MappedRing {
    fn drop(&mut self) {
        crate::mapped::unguard(self.guard);
        // SAFETY: unmapping our own mapping; the reader inside is dropped with it.
        unsafe { libc::munmap(self.map, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Api, Event, EventKind};

    struct TestRing {
        mem: Vec<u64>,
    }

    impl TestRing {
        fn new(capacity: u64) -> Self {
            TestRing { mem: vec![0u64; ring_file_size(capacity) / 8] }
        }
        fn base(&mut self) -> *mut u8 {
            self.mem.as_mut_ptr() as *mut u8
        }
    }

    fn ev(i: u64) -> RawRecord {
        Event {
            kind: EventKind::Alloc.code(),
            api: Api::cuMemAlloc_v2.code(),
            addr: 0x1000 + i,
            size: i,
            pid: 7,
            ..Event::default()
        }
        .to_raw()
    }

    fn setup(capacity: u64) -> (TestRing, RingWriter, RingReader) {
        let mut ring = TestRing::new(capacity);
        let base = ring.base();
        let init = RingInit { capacity, pid: 7, ..RingInit::default() };
        let meta_bytes = {
            let mut buf = [0u8; 64];
            let n = encode_meta(b"/bin/prog", b"prog\0--x\0", &mut buf);
            buf[..n].to_vec()
        };
        let writer = unsafe { RingWriter::init(base, &init, &meta_bytes) };
        let len = ring_file_size(capacity);
        let reader = unsafe { RingReader::new(base, len, None) }.expect("valid ring");
        (ring, writer, reader)
    }

    /// A ring with `lanes` lanes and timestamps from `clock_source`.
    fn setup_lanes(capacity: u64, lanes: u32, clock_source: u32) -> (TestRing, RingWriter, RingReader) {
        let mut ring = TestRing { mem: vec![0u64; ring_file_size_lanes(capacity, lanes) / 8] };
        let base = ring.base();
        let init = RingInit { capacity, pid: 7, clock_source, ..RingInit::default() };
        let writer = unsafe { RingWriter::init_lanes(base, &init, lanes, b"") };
        let reader = unsafe { RingReader::new(base, ring_file_size_lanes(capacity, lanes), None) }.expect("valid");
        (ring, writer, reader)
    }

    fn stamped(kind: EventKind, tid: u32, addr: u64) -> RawRecord {
        Event {
            ts_ns: crate::clock::monotonic_ns(),
            kind: kind.code(),
            api: Api::cuMemAlloc_v2.code(),
            pid: 7,
            tid,
            addr,
            size: 1,
            ..Event::default()
        }
        .to_raw()
    }

    #[test]
    fn lanes_deliver_everything_once_with_unique_seqs_in_thread_order() {
        let (_ring, writer, mut reader) = setup_lanes(64, 4, 0);
        assert_eq!(reader.lanes(), 4);
        let mut got = Vec::new();
        for round in 0..20u64 {
            for tid in 0..8u32 {
                assert!(writer.push(&stamped(EventKind::Alloc, tid, round)));
            }
            reader.poll(usize::MAX, round % 3 == 0, |e| got.push(e));
        }
        reader.poll(usize::MAX, true, |e| got.push(e));
        assert_eq!(got.len(), 160);
        let seqs: std::collections::BTreeSet<u64> = got.iter().map(|e| e.seq).collect();
        assert_eq!(seqs.len(), 160, "seq is unique across lanes");
        for tid in 0..8u32 {
            let rounds: Vec<u64> = got.iter().filter(|e| e.tid == tid).map(|e| e.addr).collect();
            assert_eq!(rounds, (0..20).collect::<Vec<_>>(), "thread {tid}'s events stay in order");
        }
    }

    #[test]
    fn lanes_keep_causal_order_across_threads() {
        // Thread A allocates and hands the address to thread B, which frees it: the free
        // must never come out of the reader before the alloc, although they travel in
        // different lanes and the reader runs concurrently.
        let (_ring, writer, mut reader) = setup_lanes(1 << 12, 4, 0);
        let writer = std::sync::Arc::new(writer);
        let n = 20_000u64;
        let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(64);
        let wa = writer.clone();
        let a = std::thread::spawn(move || {
            for x in 1..=n {
                while !wa.push(&stamped(EventKind::Alloc, 1, x)) {
                    std::thread::yield_now();
                }
                if tx.send(x).is_err() {
                    return;
                }
            }
        });
        let wb = writer.clone();
        let b = std::thread::spawn(move || {
            for x in rx {
                while !wb.push(&stamped(EventKind::Free, 2, x)) {
                    std::thread::yield_now();
                }
            }
        });
        let mut seen_alloc = std::collections::HashSet::new();
        let mut violations = 0u64;
        let mut frees = 0u64;
        let mut check = |e: Event| {
            if e.kind == EventKind::Alloc.code() {
                seen_alloc.insert(e.addr);
            } else if e.kind == EventKind::Free.code() {
                frees += 1;
                if !seen_alloc.contains(&e.addr) {
                    violations += 1;
                }
            }
        };
        while !(a.is_finished() && b.is_finished()) {
            reader.poll(usize::MAX, false, &mut check);
        }
        a.join().expect("a");
        b.join().expect("b");
        reader.poll(usize::MAX, true, &mut check);
        assert_eq!(frees, n);
        assert_eq!(violations, 0, "a free came out before its alloc");
    }

    #[test]
    fn round_trip_and_wrap() {
        let (_ring, writer, mut reader) = setup(16);
        assert_eq!(reader.info().exe, "/bin/prog");
        assert_eq!(reader.info().cmdline, vec!["prog", "--x"]);
        let mut got = Vec::new();
        for round in 0..5u64 {
            for i in 0..10 {
                assert!(writer.push(&ev(round * 10 + i)));
            }
            reader.poll(usize::MAX, false, |e| got.push(e));
        }
        assert_eq!(got.len(), 50);
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e.seq, i as u64);
            assert_eq!(e.size, i as u64);
        }
    }

    #[test]
    fn full_ring_drops_and_counts_exactly() {
        let (_ring, writer, mut reader) = setup(16);
        let mut accepted = 0;
        for i in 0..100 {
            if writer.push(&ev(i)) {
                accepted += 1;
            }
        }
        assert_eq!(accepted, 16);
        let mut got = Vec::new();
        let stats = reader.poll(usize::MAX, false, |e| got.push(e));
        assert_eq!(stats.delivered, 16);
        assert_eq!(stats.dropped, 84);
        let dropped_event = got.last().expect("a drop marker");
        assert_eq!(dropped_event.kind, EventKind::Dropped.code());
        assert_eq!(dropped_event.size, 84);
        // Reported once only.
        let stats = reader.poll(usize::MAX, false, |_| {});
        assert_eq!(stats.dropped, 0);
    }

    #[test]
    fn dead_writer_mid_write_is_skipped_and_counted() {
        let (_ring, writer, mut reader) = setup(16);
        assert!(writer.push(&ev(0)));
        // Reserve a slot without publishing it, as a writer killed mid-write would.
        let header = writer.header();
        header.write_pos.fetch_add(1, Ordering::Relaxed);
        assert!(writer.push(&ev(2)));
        let mut got = Vec::new();
        let stats = reader.poll(usize::MAX, false, |e| got.push(e));
        assert_eq!(stats.delivered, 2, "reads around the slot still being written");
        assert_eq!(reader.position(), 1, "the saved cursor stays at the unpublished slot");
        // A reader restarted now must not deliver event 2 again.
        let len = ring_file_size(16);
        let mut restarted = unsafe { RingReader::new(writer.base, len, None) }.expect("valid");
        let stats = restarted.poll(usize::MAX, false, |e| got.push(e));
        assert_eq!(stats.delivered, 0);
        let stats = restarted.poll(usize::MAX, true, |e| got.push(e));
        assert_eq!(stats.delivered, 0);
        assert_eq!(stats.lost_in_flight, 1);
        assert_eq!(got.iter().filter(|e| e.kind == EventKind::Alloc.code()).count(), 2);
        assert_eq!(restarted.position(), 3);
    }

    #[test]
    fn restarted_reader_resumes_from_cursor() {
        let (mut ring, writer, mut reader) = setup(16);
        for i in 0..5 {
            writer.push(&ev(i));
        }
        let mut first = Vec::new();
        reader.poll(3, false, |e| first.push(e));
        drop(reader);
        let len = ring_file_size(16);
        let mut reader = unsafe { RingReader::new(ring.base(), len, None) }.expect("valid");
        let mut rest = Vec::new();
        reader.poll(usize::MAX, false, |e| rest.push(e));
        assert_eq!(first.len(), 3);
        assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![3, 4]);
    }

    #[test]
    fn hostile_headers_are_refused() {
        let mut ring = TestRing::new(16);
        let base = ring.base();
        let len = ring_file_size(16);
        assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::NotReady)));
        let init = RingInit { capacity: 16, ..RingInit::default() };
        unsafe { RingWriter::init(base, &init, b"") };
        let header = unsafe { &mut *(base as *mut RingHeader) };
        header.capacity = 1 << 40;
        assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::BadCapacity(_))));
        header.capacity = 32;
        assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::SizeMismatch { .. })));
        header.capacity = 16;
        header.version.store(99, Ordering::Relaxed);
        assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::NewerVersion(99))));
        header.version.store(1, Ordering::Relaxed);
        header.magic = *b"garbage!";
        assert!(matches!(unsafe { RingReader::new(base, len, None) }, Err(RingError::BadMagic)));
    }

    #[test]
    fn garbage_slots_never_panic_or_overrun() {
        let (mut ring, _writer, mut reader) = setup(16);
        let base = ring.base();
        // Scribble over every slot and claim an absurd write cursor.
        unsafe {
            for i in 0..(16 * RECORD_SIZE) {
                *base.add(HEADER_SIZE + i) = (i as u8).wrapping_mul(37);
            }
            (*(base as *const RingHeader)).write_pos.store(u64::MAX, Ordering::Relaxed);
        }
        let mut n = 0;
        let stats = reader.poll(usize::MAX, true, |_| n += 1);
        assert!(stats.delivered + stats.lost_in_flight + stats.malformed <= 16);
    }

    #[test]
    fn concurrent_writers_lose_nothing_without_drops() {
        let capacity = 1 << 12;
        let (_ring, writer, mut reader) = setup(capacity);
        let writer = std::sync::Arc::new(writer);
        let threads = 8;
        let per = 5000u64;
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let w = writer.clone();
                std::thread::spawn(move || {
                    let mut dropped = 0u64;
                    for i in 0..per {
                        let mut r = ev(i);
                        r.tid = zerocopy::little_endian::U32::new(t);
                        if !w.push(&r) {
                            dropped += 1;
                        }
                    }
                    dropped
                })
            })
            .collect();
        let mut got = 0u64;
        let mut reported_drops = 0u64;
        let mut per_thread_last = vec![None::<u64>; threads as usize];
        let reader_done = done.clone();
        let mut check = |e: Event| {
            if e.kind == EventKind::Dropped.code() {
                reported_drops += e.size;
                return;
            }
            got += 1;
            let last = &mut per_thread_last[e.tid as usize];
            if let Some(prev) = *last {
                assert!(e.size > prev, "per-thread order kept");
            }
            *last = Some(e.size);
        };
        let mut writer_drops = 0;
        for h in handles {
            while !h.is_finished() {
                reader.poll(usize::MAX, false, &mut check);
            }
            writer_drops += h.join().expect("writer thread");
        }
        reader_done.store(true, Ordering::Relaxed);
        reader.poll(usize::MAX, false, &mut check);
        assert_eq!(reported_drops, writer_drops);
        assert_eq!(got + writer_drops, threads as u64 * per);
    }
}
