//! The reader side of the ring: one reader at a time, trusting nothing in the file.

use super::*;
use crate::clock::{ClockSource, TscClock};
use crate::record::{Event, EventKind, RawRecord};
use std::sync::atomic::Ordering;
use zerocopy::little_endian::U64;
use zerocopy::FromBytes;

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
