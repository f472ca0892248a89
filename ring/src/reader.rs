//! The reader side of the ring: one reader at a time, trusting nothing in the file.

use super::*;
use std::sync::atomic::Ordering;
use vramhook_protocol::clock::{ClockSource, TscClock};
use vramhook_protocol::record::{Event, EventKind, RawRecord};
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
    /// Events an earlier reader had already handed on (they were in its record, see
    /// [`RingReader::skip_recorded`]): consumed again without being delivered twice.
    pub duplicates: u64,
    /// Events read but held back for a later poll, so that no event comes out after a
    /// later one of another lane (a lane that reached its share of `max`, or a release in
    /// flight).
    pub held: u64,
    /// Lanes whose thread was inside a releasing driver call when the poll began.
    pub release_holds: u64,
}

/// An event taken from a lane in this poll, not yet delivered.
#[derive(Clone, Copy)]
struct Candidate {
    ts: u64,
    lane: u32,
    pos: u64,
    raw: RawRecord,
}

/// What bounds one poll's scan of each lane.
struct LaneScan {
    shift: u32,
    /// Events stamped later wait for a later poll.
    watermark: u64,
    /// Events taken per lane at most.
    per_lane: usize,
    /// Slots looked at per lane at most.
    max_scan: u64,
    writer_gone: bool,
}

/// A validated view of a ring file, owned by the one reader that holds its lock.
pub struct RingReader {
    base: *mut u8,
    len: usize,
    capacity: u64,
    lanes: u32,
    info: RingInfo,
    /// Per lane: every slot below it is consumed (delivered, or restamped free).
    pos: [u64; MAX_LANES as usize],
    /// Per lane: positions delivered but not yet committed (still stamped as published,
    /// so that the writer cannot reuse them), sorted, each with the generation of the poll
    /// that delivered it. See [`RingReader::commit`].
    uncommitted: Vec<Vec<(u64, u64)>>,
    /// Generation of the current poll (see [`RingReader::set_generation`]).
    generation: u64,
    /// Commit at the end of every poll (the default): delivered is consumed.
    pub auto_commit: bool,
    /// Events an earlier reader handed on that may still be published in the ring.
    recorded: vramhook_protocol::seqset::SeqSet,
    clock: Option<TscClock>,
    tsc_source: bool,
    candidates: Vec<Candidate>,
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
        Ok(RingReader {
            base,
            len,
            capacity,
            lanes,
            info,
            pos,
            uncommitted: vec![Vec::new(); lanes as usize],
            generation: 0,
            auto_commit: true,
            recorded: vramhook_protocol::seqset::SeqSet::new(),
            clock,
            tsc_source,
            candidates: Vec::new(),
        })
    }

    pub fn info(&self) -> &RingInfo {
        &self.info
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The writer's pid namespace (inode of its `/proc/self/ns/pid`; 0: unknown).
    pub fn pid_ns(&self) -> u64 {
        self.header().pid_ns.load(Ordering::Acquire)
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
    ///
    /// A reader killed between freeing slots and saving its cursor leaves the cursor
    /// behind slots it freed, which the writer may already have reused: a write cursor up
    /// to a lap past that is honest when every slot in between reads as consumed, and the
    /// reader moves over them before judging.
    pub fn check_claims(&mut self, max_events: u64) -> Result<(), String> {
        let shift = self.capacity.trailing_zeros();
        for lane in 0..self.lanes {
            let write = self.write_pos(lane);
            let mut read = self.pos[lane as usize];
            if write < read {
                return Err(format!("lane {lane}: write cursor {write} is behind the read cursor {read}"));
            }
            if write - read > self.capacity && write - read <= self.capacity.saturating_mul(2) {
                self.advance(lane, write - self.capacity, shift);
                read = self.pos[lane as usize];
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
        let committed = (0..self.lanes)
            // SAFETY: lane < lanes.
            .map(|l| unsafe { lane_read_pos(self.base, l) }.load(Ordering::Acquire))
            .fold(0u64, u64::saturating_add);
        self.header().recorded.store(committed, Ordering::Release);
    }

    /// Writer drops already reported as `Dropped` events (by this reader or earlier ones).
    pub fn drops_reported(&self) -> u64 {
        self.header().dropped_reported.load(Ordering::Acquire)
    }

    /// Events reserved but not yet read.
    pub fn pending(&self) -> u64 {
        (0..self.lanes)
            .map(|l| {
                let pos = self.pos[l as usize];
                let ahead = self.uncommitted[l as usize].iter().filter(|(p, _)| *p >= pos).count() as u64;
                self.write_pos(l).saturating_sub(pos).saturating_sub(ahead)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Events read so far over all lanes (the position of the next event with one lane).
    pub fn position(&self) -> u64 {
        self.pos[..self.lanes as usize].iter().fold(0u64, |a, p| a.saturating_add(*p))
    }

    /// Events delivered but not yet committed.
    pub fn uncommitted(&self) -> u64 {
        self.uncommitted.iter().map(|u| u.len() as u64).sum()
    }

    /// Sequence numbers of the events delivered but not committed, and of those an earlier
    /// reader recorded that this one has not met yet: what a restarted reader must not
    /// deliver again if what this one delivered is in its record.
    pub fn unconfirmed_seqs(&self) -> vramhook_protocol::seqset::SeqSet {
        let mut set = self.recorded.clone();
        for (lane, entries) in self.uncommitted.iter().enumerate() {
            for (pos, _) in entries {
                set.insert(self.seq_of(lane as u32, *pos));
            }
        }
        set
    }

    /// Tells the reader which events an earlier reader already handed on (their `seq`s):
    /// found still published in the ring (that reader died before committing them), they
    /// are consumed without being delivered again, and counted as duplicates.
    pub fn skip_recorded(&mut self, seqs: vramhook_protocol::seqset::SeqSet) {
        self.recorded = seqs;
    }

    /// Sets the generation that the next polls tag their deliveries with (a caller that
    /// commits several readers at once numbers its polls itself).
    pub fn set_generation(&mut self, generation: u64) {
        self.generation = generation;
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn seq_of(&self, lane: u32, pos: u64) -> u64 {
        pos.wrapping_mul(u64::from(self.lanes)).wrapping_add(u64::from(lane))
    }

    /// Frees the slots of the events delivered by polls of generation `upto` or earlier,
    /// for the writer to reuse, and moves the shared cursors past them: call it once those
    /// events are kept for good (written to a capture). Until then a reader that dies
    /// leaves them in the ring, and the next one reads them again.
    pub fn commit(&mut self, upto: u64) {
        let shift = self.capacity.trailing_zeros();
        for lane in 0..self.lanes {
            let mut entries = std::mem::take(&mut self.uncommitted[lane as usize]);
            entries.retain(|&(pos, generation)| {
                if generation > upto {
                    return true;
                }
                let lap = pos >> shift;
                let stamp = self.stamp(lane, pos);
                // Only a slot still holding what was delivered (a hostile writer may have
                // scribbled over it meanwhile).
                let _ = stamp.compare_exchange(
                    lap.wrapping_mul(2).wrapping_add(1),
                    lap.wrapping_mul(2).wrapping_add(2),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                );
                false
            });
            self.uncommitted[lane as usize] = entries;
            self.store_cursor(lane);
        }
    }

    /// Commits everything delivered so far.
    pub fn commit_all(&mut self) {
        self.commit(u64::MAX);
    }

    /// The shared cursor of `lane`: where a restarted reader starts. Below it every slot
    /// is committed.
    fn store_cursor(&self, lane: u32) {
        let pos = self.pos[lane as usize];
        let first_uncommitted = self.uncommitted[lane as usize].first().map_or(pos, |(p, _)| *p);
        // SAFETY: lane < lanes.
        unsafe { lane_read_pos(self.base, lane) }.store(pos.min(first_uncommitted), Ordering::Release);
    }

    /// The slot's stamp (its first 8 bytes).
    fn stamp(&self, lane: u32, pos: u64) -> &AtomicU64 {
        // SAFETY: slots are 8-byte aligned inside the validated mapping; the stamp is only
        // accessed atomically.
        unsafe { &*(self.slot(lane, pos) as *const AtomicU64) }
    }

    /// The stamp of the release `lane`'s thread is inside the driver for, unless there is
    /// none or it began more than `RELEASE_HOLD_MAX_NS` ago (`now`: the TSC and monotonic
    /// clocks read together, for a TSC ring).
    fn release_in_flight(&self, lane: u32, now: Option<(u64, u64)>) -> Option<u64> {
        // SAFETY: lane < lanes, validated.
        let since = unsafe { lane_release_since(self.base, lane) }.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let fresh = match (&self.clock, now) {
            (Some(clock), Some((tsc_now, mono_now))) => {
                mono_now.saturating_sub(clock.to_monotonic(since, tsc_now, mono_now)) <= RELEASE_HOLD_MAX_NS
            }
            // TSC ticks at an unknown rate: at 4 GHz or less, this many ticks are at least
            // the limit.
            _ if self.tsc_source => {
                vramhook_protocol::clock::read_tsc().saturating_sub(since) <= RELEASE_HOLD_MAX_NS * 4
            }
            _ => vramhook_protocol::clock::monotonic_ns().saturating_sub(since) <= RELEASE_HOLD_MAX_NS,
        };
        fresh.then_some(since)
    }

    /// The current time in the ring's clock (TSC ticks or monotonic ns).
    fn clock_now(&self) -> u64 {
        if self.tsc_source {
            vramhook_protocol::clock::read_tsc_ordered()
        } else {
            vramhook_protocol::clock::monotonic_ns()
        }
    }

    /// Reads up to `max` published events, merged over lanes in time order without
    /// breaking causality (see the module doc), handing each (with `seq` set and `ts_ns`
    /// on the monotonic clock) to `sink`. With `writer_gone`, everything is read and slots
    /// a dead writer reserved but never published are skipped and counted. A `Dropped`
    /// event is emitted whenever the writer's drop counter has grown.
    ///
    /// Delivered events stay in their slots until they are committed ([`Self::commit`];
    /// at once with `auto_commit`).
    pub fn poll(&mut self, max: usize, writer_gone: bool, mut sink: impl FnMut(Event)) -> PollStats {
        let mut stats = PollStats::default();
        let shift = self.capacity.trailing_zeros();
        // Taken before any lane is read: the causal watermark.
        let watermark = if writer_gone || self.lanes == 1 { u64::MAX } else { self.clock_now() };
        let now = self.clock.as_ref().map(|c| c.now_pair());
        // `max` is shared among the lanes that have something to read: a ring of 16 lanes
        // (any host of 16 CPUs or more) whose one busy thread writes one lane was read a
        // sixteenth of `max` per poll, and the agent kept 3 % of that thread's events.
        let busy = (0..self.lanes).filter(|&lane| self.write_pos(lane) > self.pos[lane as usize]).count();
        let per_lane = (max / busy.max(1)).max(1);
        // Slots looked at per lane: bounded too, not only those delivered, so a ring whose
        // cursors claim a full lap with nothing published costs little per poll.
        let max_scan = (per_lane as u64).saturating_mul(4).max(1024);
        let scan = LaneScan { shift, watermark, per_lane, max_scan, writer_gone };
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.clear();
        // Events of a lane that was cut short (its share taken, or its scan bounded) and
        // not read are stamped, give or take a race between two threads of that lane, no
        // earlier than the last one taken from it: nothing stamped later may come out in
        // this poll, or it would come out before them.
        let mut hold_after = u64::MAX;
        // Releases in flight, read after the watermark and before any lane: nothing stamped
        // after one comes out before it (see the module doc).
        if !writer_gone {
            for lane in 0..self.lanes {
                if let Some(since) = self.release_in_flight(lane, now) {
                    hold_after = hold_after.min(since);
                    stats.release_holds += 1;
                }
            }
        }
        let mut scanned = [0u64; MAX_LANES as usize];
        for lane in 0..self.lanes {
            let (end, hold) = self.scan_lane(lane, &scan, &mut candidates, &mut stats);
            scanned[lane as usize] = end;
            hold_after = hold_after.min(hold);
        }
        // Time order across lanes; within a lane, order of reservation (stable sort).
        if self.lanes > 1 {
            candidates.sort_by_key(|c| c.ts);
        }
        let deliver = candidates.partition_point(|c| c.ts <= hold_after);
        stats.held = (candidates.len() - deliver) as u64;
        let generation = self.generation;
        self.deliver(&candidates[..deliver], now, &mut stats, &mut sink);
        // Keep the buffer, but not the peak of a burst (a reader may hold many rings).
        if candidates.capacity() > 4096 {
            candidates.shrink_to(4096);
        }
        self.candidates = candidates;
        for lane in 0..self.lanes {
            self.advance(lane, scanned[lane as usize], shift);
        }
        if self.auto_commit {
            self.commit(generation);
        } else {
            for lane in 0..self.lanes {
                self.store_cursor(lane);
            }
        }
        self.report_drops(now, &mut stats, &mut sink);
        stats
    }

    /// Scans one lane from its cursor, adding the events this poll may deliver to
    /// `candidates`. Returns where the scan stopped, and the time no later event may pass
    /// because of this lane (`u64::MAX`: none).
    fn scan_lane(&self, lane: u32, s: &LaneScan, candidates: &mut Vec<Candidate>, stats: &mut PollStats) -> (u64, u64) {
        let write_pos = self.write_pos(lane);
        let pos = self.pos[lane as usize];
        if write_pos < pos {
            stats.malformed += 1;
        }
        // A hostile writer may claim anything; never look further than one lap ahead.
        let end = write_pos.min(pos.saturating_add(self.capacity)).min(pos.saturating_add(s.max_scan));
        let uncommitted = &self.uncommitted[lane as usize];
        let mut next_uncommitted = uncommitted.partition_point(|(p, _)| *p < pos);
        let mut taken = 0usize;
        let mut last_ts = None;
        // Past a slot that must wait (stamped after the watermark, or not yet
        // published) the scan goes on and takes what it may.
        let mut scan = pos;
        while scan < end && taken < s.per_lane {
            if uncommitted.get(next_uncommitted).is_some_and(|(p, _)| *p == scan) {
                next_uncommitted += 1; // delivered by an earlier poll
                scan += 1;
                continue;
            }
            let lap = scan >> s.shift;
            let stamp_ref = self.stamp(lane, scan);
            let stamp = stamp_ref.load(Ordering::Acquire);
            let free_next = lap.wrapping_mul(2).wrapping_add(2);
            if stamp == lap.wrapping_mul(2).wrapping_add(1) {
                let mut bytes = [0u8; RECORD_SIZE];
                // SAFETY: the slot is published and ours until it is restamped.
                unsafe { std::ptr::copy_nonoverlapping(self.slot(lane, scan), bytes.as_mut_ptr(), RECORD_SIZE) };
                let raw = RawRecord::read_from_bytes(&bytes).unwrap_or_else(|_| unreachable_record());
                let ts = raw.ts_ns.get();
                let seq = self.seq_of(lane, scan);
                if ts > s.watermark {
                    // Stamped after this poll began: a later poll takes it.
                } else if self.recorded.contains(seq) {
                    // Already in an earlier reader's record: consumed, not delivered.
                    stamp_ref.store(free_next, Ordering::Release);
                    stats.duplicates += 1;
                } else {
                    candidates.push(Candidate { ts, lane, pos: scan, raw });
                    taken += 1;
                    last_ts = Some(ts);
                }
            } else if stamp >= free_next && stamp - free_next < 4 {
                // Already consumed: by an earlier poll, or by an earlier reader that died
                // before saving its cursor (the writer may already have reused the slot
                // for the next lap).
            } else if s.writer_gone {
                if stamp == lap.wrapping_mul(2) {
                    stats.lost_in_flight += 1;
                } else {
                    stats.malformed += 1;
                }
                stamp_ref.store(free_next, Ordering::Release);
            } else if stamp != lap.wrapping_mul(2) {
                stats.malformed += 1;
            }
            // (Reserved but not yet published by a live writer: come back later.)
            scan += 1;
        }
        let cut_short = scan < write_pos.min(pos.saturating_add(self.capacity));
        let hold = match last_ts {
            Some(ts) if cut_short && self.lanes > 1 => ts,
            _ => u64::MAX,
        };
        (scan, hold)
    }

    /// Hands `ready` to `sink` in order, with `seq` set and `ts_ns` on the monotonic clock,
    /// each noted as delivered (uncommitted) in its lane.
    fn deliver(
        &mut self,
        ready: &[Candidate],
        now: Option<(u64, u64)>,
        stats: &mut PollStats,
        sink: &mut impl FnMut(Event),
    ) {
        let generation = self.generation;
        for c in ready {
            let mut raw = c.raw;
            raw.seq = U64::new(self.seq_of(c.lane, c.pos));
            if let (Some(clock), Some((tsc_now, mono_now))) = (&self.clock, now) {
                raw.ts_ns = U64::new(clock.to_monotonic(raw.ts_ns.get(), tsc_now, mono_now));
            }
            let entries = &mut self.uncommitted[c.lane as usize];
            // Mostly in order; an event held back by an earlier poll lands before others.
            match entries.last() {
                Some((last, _)) if *last > c.pos => {
                    let at = entries.partition_point(|(p, _)| *p < c.pos);
                    entries.insert(at, (c.pos, generation));
                }
                _ => entries.push((c.pos, generation)),
            }
            stats.delivered += 1;
            sink(Event::from_raw(&raw));
        }
    }

    /// A `Dropped` event when the writer's drop counter has grown since the last report,
    /// or slots of a dead writer were lost in flight.
    fn report_drops(&mut self, now: Option<(u64, u64)>, stats: &mut PollStats, sink: &mut impl FnMut(Event)) {
        let header = self.header();
        let dropped = header.dropped.load(Ordering::Acquire);
        let reported = header.dropped_reported.load(Ordering::Acquire);
        let lost_total = dropped.saturating_sub(reported) + stats.lost_in_flight;
        if lost_total > 0 {
            header.dropped_reported.store(dropped, Ordering::Release);
            stats.dropped = lost_total;
            sink(Event {
                seq: self.position(),
                ts_ns: now.map(|(_, mono)| mono).unwrap_or_else(vramhook_protocol::clock::monotonic_ns),
                pid: self.info.pid,
                kind: EventKind::Dropped.code(),
                api: vramhook_protocol::record::Api::Interposer.code(),
                device: -1,
                size: lost_total,
                aux: stats.lost_in_flight,
                ..Event::default()
            });
        }
    }

    /// Moves `lane`'s consumed prefix over the slots consumed (delivered, or restamped
    /// free) up to `limit`, and forgets what an earlier reader recorded below it.
    fn advance(&mut self, lane: u32, limit: u64, shift: u32) {
        let mut pos = self.pos[lane as usize];
        let entries = &self.uncommitted[lane as usize];
        let mut next = entries.partition_point(|(p, _)| *p < pos);
        while pos < limit {
            if entries.get(next).is_some_and(|(p, _)| *p == pos) {
                next += 1;
            } else {
                let lap = pos >> shift;
                let free_next = lap.wrapping_mul(2).wrapping_add(2);
                let stamp = self.stamp(lane, pos).load(Ordering::Acquire);
                if !(stamp >= free_next && stamp - free_next < 4) {
                    break;
                }
            }
            pos += 1;
        }
        self.pos[lane as usize] = pos;
        if !self.recorded.is_empty() && self.pos[..self.lanes as usize].iter().all(|p| *p > 0) {
            // Every seq below the smallest lane's `pos * lanes` is behind all cursors.
            let floor = self.pos[..self.lanes as usize].iter().min().copied().unwrap_or(0);
            self.recorded.remove_below(floor.saturating_mul(u64::from(self.lanes)));
        }
    }
}

#[cold]
fn unreachable_record() -> RawRecord {
    // read_from_bytes on a 64-byte array cannot fail; keep a value rather than a panic.
    RawRecord::default()
}
