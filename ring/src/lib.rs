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
//! own write cursor on its own cache line; a thread writes to a lane of its own
//! ([`RingWriter::own_lane`], the interposer) or to lane `tid mod lanes` ([`RingWriter::push`]), so
//! threads on different cores do not contend for one cursor. Lane 0 keeps the single-lane
//! layout. An event's `seq` is `position * lanes + lane`: unique and stable across reader
//! restarts (equal to the position with one lane). The reader merges lanes by timestamp
//! without breaking causality: at the start of a poll it reads the clock (`t0`) and takes
//! from each lane only the prefix of events stamped at or before `t0`. A writer stamps an
//! event before reserving its slot and publishes it before the program sees the call's
//! result, so any event that causally precedes one stamped before `t0` was published
//! before `t0`, and is read in the same poll or an earlier one. A lane cut short in a poll
//! (its share of the batch taken, or its scan bounded) holds back the other lanes' events
//! stamped after the last one taken from it, so that the lanes stay merged across polls.
//!
//! A release (a free, an unmap: a call after which the driver may hand the same address to
//! another thread) is stamped before its driver call, not after: stamped after, a thread
//! that lost the CPU between the driver's return and its stamp would stamp its free later
//! than another thread's allocation of the same address, and the reader would deliver the
//! allocation first. Such an event is published a whole call after its stamp, so the
//! writer of an owned lane says so first: it stores the stamp in the lane's release
//! marker before the call and clears it after publishing. A poll reads every marker right
//! after its watermark, before it reads any lane, and holds back every event stamped after
//! a marker it saw (a marker older than [`RELEASE_HOLD_MAX_NS`] is ignored: a thread stuck
//! in the driver does not stop the ring). Threads that share lane 0 stamp after the call.
//!
//! Read, then commit: a reader may hand events on and free their slots (restamp them, move
//! its shared cursor) only later, once it has kept them for good (the agent: once its
//! capture flushed them). A reader that dies in between leaves them published; the next
//! one reads them again and skips those it is told were recorded, by `seq`.

use std::sync::atomic::{AtomicU32, AtomicU64};
use vramhook_protocol::record::RECORD_SIZE;

pub mod dir;
mod file;
#[doc(hidden)]
pub mod fuzzing;
mod reader;
pub mod source;
mod writer;

pub use file::{MappedRing, DEFAULT_MAX_RING_BYTES};
pub use reader::{PollStats, RingCounters, RingError, RingInfo, RingReader};
#[cfg(feature = "bench-parts")]
#[doc(hidden)]
pub use writer::bench;
pub use writer::{ExclusiveSlot, OwnedLane, ReservedSlot, RingWriter};

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
/// A release marker older than this is ignored by the reader (see the module doc): long
/// enough for a thread that loses its CPU inside a free (a few scheduler ticks), short
/// enough that a synchronous free waiting on the GPU holds its process's other lanes back
/// no longer than a tenth of a second.
pub const RELEASE_HOLD_MAX_NS: u64 = 100_000_000;
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
    /// Lane 0's release marker (see [`lane_release_since`]); lanes 1.. keep theirs beside
    /// their write cursors.
    pub release_since: AtomicU64,
    _pad1: [u8; 48],
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
const _: () = assert!(std::mem::offset_of!(RingHeader, release_since) == 264);
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

/// The release marker of `lane`: the stamp of a release (a free, an unmap) whose thread is
/// inside the driver call, 0 when there is none. The word after the lane's write cursor, on
/// its cache line (a ring written before the marker existed has zeros there).
///
/// # Safety
/// As for `lane_write_pos`.
#[inline(always)]
unsafe fn lane_release_since<'a>(base: *mut u8, lane: u32) -> &'a AtomicU64 {
    &*(lane_write_pos(base, lane) as *const AtomicU64).add(1)
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

/// The executable and arguments of a metadata area (untrusted: the stated length is
/// bounded by the area; an area shorter than its length word reads as empty). Public for
/// readers that peek at a header they do not map ([`source`], for `vramhook run`'s rings).
pub fn parse_meta(area: &[u8]) -> (String, Vec<String>) {
    let Some((len, rest)) = area.split_first_chunk::<8>() else { return (String::new(), Vec::new()) };
    let len = usize::try_from(u64::from_le_bytes(*len)).unwrap_or(usize::MAX);
    let body = &rest[..len.min(rest.len())];
    let mut parts = body.split(|b| *b == 0);
    let exe = parts.next().map(|p| String::from_utf8_lossy(p).into_owned()).unwrap_or_default();
    let cmdline: Vec<String> =
        parts.filter(|p| !p.is_empty()).map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    (exe, cmdline)
}

#[cfg(test)]
mod tests;
