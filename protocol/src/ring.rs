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

use crate::clock::{ClockSource, TscClock};
use crate::record::{Event, EventKind, RawRecord, RECORD_SIZE};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use zerocopy::little_endian::U64;
use zerocopy::FromBytes;

pub const RING_MAGIC: [u8; 8] = *b"VRHKRING";
pub const RING_VERSION: u32 = 1;
pub const HEADER_SIZE: usize = 4096;
/// Offset and size of the process metadata area inside the header page.
pub const META_OFFSET: usize = 1024;
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
    _pad0: [u8; 256 - 80],
    pub write_pos: AtomicU64,
    _pad1: [u8; 56],
    pub read_pos: AtomicU64,
    pub dropped_reported: AtomicU64,
    _pad2: [u8; 48],
    pub dropped: AtomicU64,
    /// Entry points handed out by the driver that no wrapper matched.
    pub hook_misses: AtomicU64,
    pub state: AtomicU32,
    _pad3: [u8; 44],
}

const _: () = assert!(std::mem::size_of::<RingHeader>() == 448);
const _: () = assert!(std::mem::offset_of!(RingHeader, write_pos) == 256);
const _: () = assert!(std::mem::offset_of!(RingHeader, read_pos) == 320);
const _: () = assert!(std::mem::offset_of!(RingHeader, dropped) == 384);

/// Bytes a ring of `capacity` slots occupies.
pub const fn ring_file_size(capacity: u64) -> usize {
    HEADER_SIZE + capacity as usize * RECORD_SIZE
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
        let header = &mut *(base as *mut RingHeader);
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
        RingWriter { base, capacity: init.capacity }
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: `base` points at an initialised header for the writer's lifetime.
        unsafe { &*(self.base as *const RingHeader) }
    }

    fn stamp(&self, slot: u64) -> &AtomicU64 {
        // SAFETY: slot < capacity; slots are 64-byte aligned inside the mapping.
        unsafe { &*(self.base.add(HEADER_SIZE + slot as usize * RECORD_SIZE) as *const AtomicU64) }
    }

    /// Appends one record (its `seq` is ignored). Returns false when the ring was full
    /// and the event was dropped (and counted).
    #[inline]
    pub fn push(&self, record: &RawRecord) -> bool {
        let header = self.header();
        let mask = self.capacity - 1;
        let shift = self.capacity.trailing_zeros();
        let mut pos = header.write_pos.load(Ordering::Relaxed);
        let mut attempts = 0;
        loop {
            attempts += 1;
            if attempts > MAX_PUSH_ATTEMPTS {
                header.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            let lap = pos >> shift;
            let stamp = self.stamp(pos & mask).load(Ordering::Acquire);
            if stamp == lap.wrapping_mul(2) {
                match header.write_pos.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(current) => pos = current,
                }
            } else if stamp < lap.wrapping_mul(2) {
                // Still holds last lap's unread event: full.
                header.dropped.fetch_add(1, Ordering::Relaxed);
                return false;
            } else {
                pos = header.write_pos.load(Ordering::Relaxed);
            }
        }
        let slot = pos & mask;
        let lap = pos >> shift;
        // SAFETY: we own this slot until we publish it; the stamp (first 8 bytes) is
        // written only through the atomic below.
        unsafe {
            let dst = self.base.add(HEADER_SIZE + slot as usize * RECORD_SIZE);
            let src = record as *const RawRecord as *const u8;
            std::ptr::copy_nonoverlapping(src.add(8), dst.add(8), RECORD_SIZE - 8);
        }
        self.stamp(slot).store(lap.wrapping_mul(2) + 1, Ordering::Release);
        true
    }

    pub fn count_hook_miss(&self) {
        self.header().hook_misses.fetch_add(1, Ordering::Relaxed);
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
    #[error("ring file is {actual} bytes, its header says {expected}")]
    SizeMismatch { expected: usize, actual: usize },
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
    info: RingInfo,
    pos: u64,
    clock: Option<TscClock>,
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
        let expected = ring_file_size(capacity);
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
        let pos = header.read_pos.load(Ordering::Acquire);
        let clock = if info.clock_source == ClockSource::Tsc as u32 { tsc } else { None };
        Ok(RingReader { base, len, capacity, info, pos, clock })
    }

    pub fn info(&self) -> &RingInfo {
        &self.info
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.pending() == 0
    }

    fn header(&self) -> &RingHeader {
        // SAFETY: validated at construction; the mapping outlives the reader.
        unsafe { &*(self.base as *const RingHeader) }
    }

    fn slot(&self, pos: u64) -> *mut u8 {
        let slot = pos & (self.capacity - 1);
        // SAFETY: slot < capacity and the mapping holds `capacity` slots.
        unsafe { self.base.add(HEADER_SIZE + slot as usize * RECORD_SIZE) }
    }

    pub fn counters(&self) -> RingCounters {
        let h = self.header();
        RingCounters {
            reserved: h.write_pos.load(Ordering::Acquire),
            dropped: h.dropped.load(Ordering::Acquire),
            hook_misses: h.hook_misses.load(Ordering::Relaxed),
            exited: h.state.load(Ordering::Acquire) == STATE_EXITED,
        }
    }

    /// Events reserved but not yet read.
    pub fn pending(&self) -> u64 {
        self.header().write_pos.load(Ordering::Acquire).saturating_sub(self.pos)
    }

    /// Position of the next event to read.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Reads up to `max` published events in order, handing each (with `seq` set to its
    /// position and `ts_ns` on the monotonic clock) to `sink`. With `writer_gone`, slots
    /// a dead writer reserved but never published are skipped and counted. A `Dropped`
    /// event is emitted whenever the writer's drop counter has grown.
    pub fn poll(&mut self, max: usize, writer_gone: bool, mut sink: impl FnMut(Event)) -> PollStats {
        let mut stats = PollStats::default();
        let shift = self.capacity.trailing_zeros();
        let write_pos = self.header().write_pos.load(Ordering::Acquire);
        // A hostile writer may claim anything; never look further than one lap ahead.
        let end = write_pos.min(self.pos.saturating_add(self.capacity));
        if write_pos < self.pos {
            stats.malformed += 1;
        }
        let now = self.clock.as_ref().map(|c| c.now_pair());
        while self.pos < end && (stats.delivered as usize) < max {
            let lap = self.pos >> shift;
            let slot = self.slot(self.pos);
            // SAFETY: slots are 8-byte aligned; the stamp is only accessed atomically.
            let stamp_ref = unsafe { &*(slot as *const AtomicU64) };
            let stamp = stamp_ref.load(Ordering::Acquire);
            let free_next = lap.wrapping_mul(2).wrapping_add(2);
            if stamp == lap.wrapping_mul(2).wrapping_add(1) {
                let mut bytes = [0u8; RECORD_SIZE];
                // SAFETY: the slot is published and ours until we restamp it.
                unsafe { std::ptr::copy_nonoverlapping(slot, bytes.as_mut_ptr(), RECORD_SIZE) };
                let mut raw = match RawRecord::read_from_bytes(&bytes) {
                    Ok(raw) => raw,
                    Err(_) => unreachable_record(),
                };
                raw.seq = U64::new(self.pos);
                if let (Some(clock), Some((tsc_now, mono_now))) = (&self.clock, now) {
                    raw.ts_ns = U64::new(clock.to_monotonic(raw.ts_ns.get(), tsc_now, mono_now));
                }
                stamp_ref.store(free_next, Ordering::Release);
                self.pos += 1;
                stats.delivered += 1;
                sink(Event::from_raw(&raw));
            } else if stamp >= free_next && stamp - free_next < 4 {
                // Consumed by an earlier reader that died before saving its cursor (the
                // writer may already have reused the slot for the next lap).
                self.pos += 1;
            } else if writer_gone {
                if stamp == lap.wrapping_mul(2) {
                    stats.lost_in_flight += 1;
                } else {
                    stats.malformed += 1;
                }
                stamp_ref.store(free_next, Ordering::Release);
                self.pos += 1;
            } else {
                if stamp != lap.wrapping_mul(2) {
                    stats.malformed += 1;
                }
                // Reserved but not yet published by a live writer: come back later.
                break;
            }
        }
        let header = self.header();
        header.read_pos.store(self.pos, Ordering::Release);
        let dropped = header.dropped.load(Ordering::Acquire);
        let reported = header.dropped_reported.load(Ordering::Acquire);
        let lost_total = dropped.saturating_sub(reported) + stats.lost_in_flight;
        if lost_total > 0 {
            header.dropped_reported.store(dropped, Ordering::Release);
            stats.dropped = lost_total;
            sink(Event {
                seq: self.pos,
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

/// A ring file mapped by a reader, locked so that no second reader drains it.
pub struct MappedRing {
    pub reader: RingReader,
    file: std::fs::File,
    map: *mut libc::c_void,
    len: usize,
}

// SAFETY: owned mapping.
unsafe impl Send for MappedRing {}

impl MappedRing {
    /// Opens, locks (non-blocking) and validates a ring file. Returns `Ok(None)` when
    /// another reader holds it.
    pub fn open(path: &std::path::Path, tsc: Option<TscClock>) -> Result<Option<MappedRing>, RingError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::io::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        // SAFETY: valid fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(None);
            }
            return Err(err.into());
        }
        let len = file.metadata()?.len() as usize;
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
        // SAFETY: the mapping lives as long as MappedRing.
        match unsafe { RingReader::new(map as *mut u8, len, tsc) } {
            Ok(reader) => Ok(Some(MappedRing { reader, file, map, len })),
            Err(e) => {
                // SAFETY: unmapping what we mapped above.
                unsafe { libc::munmap(map, len) };
                Err(e)
            }
        }
    }

    pub fn file(&self) -> &std::fs::File {
        &self.file
    }
}

impl Drop for MappedRing {
    fn drop(&mut self) {
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
        assert_eq!(stats.delivered, 1, "stops at the unpublished slot while the writer lives");
        let stats = reader.poll(usize::MAX, true, |e| got.push(e));
        assert_eq!(stats.delivered, 1);
        assert_eq!(stats.lost_in_flight, 1);
        assert_eq!(got.iter().filter(|e| e.kind == EventKind::Alloc.code()).count(), 2);
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
