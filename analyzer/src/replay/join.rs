//! Joining a PyTorch snapshot to the capture's process it was dumped from: the snapshot's
//! segments are `cudaMalloc`s (or, with expandable segments, VMM reservations) of that
//! process, so the same addresses and sizes on the same device appear among the capture's
//! allocations (or the lens's `framework_segment` records). The snapshots in the input are
//! read before the captures; while the captures replay, each successful allocation is looked
//! up among their segments, and each process's distinct matches are counted.

use super::FastMap;
use crate::input::torch::SNAPSHOT_PID_BASE;
use crate::report::{JoinCandidate, SnapshotJoin};
use std::collections::BTreeMap;
use vramhook_protocol::record::{Event, EventKind};

/// (snapshot, pid, segment address) triples remembered: past it, matches are no longer
/// counted (and the join says so).
const MAX_MATCHES: usize = 1_000_000;
/// Processes listed as candidates in a join's report.
const MAX_CANDIDATES: usize = 5;

/// One segment of a snapshot: where, how large, on which device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentKey {
    pub device: i16,
    pub addr: u64,
    pub size: u64,
}

#[derive(Default)]
pub(crate) struct JoinIndex {
    /// Per snapshot: its input name, its distinct segments, and whether it was imported.
    snapshots: Vec<(String, usize, bool)>,
    /// Address → (snapshot, size, device).
    by_addr: FastMap<u64, Vec<(u32, u64, i16)>>,
    /// Distinct matches: (snapshot, pid, address).
    seen: FastMap<(u32, u32, u64), ()>,
    /// Matches per (snapshot, pid).
    counts: BTreeMap<(u32, u32), u64>,
    /// Allocations met while the index could remember no more matches.
    overflowed: bool,
}

impl JoinIndex {
    /// A snapshot to look for: its name and segments (deduplicated by address; the first
    /// `max` of them, as the importer keeps).
    pub(crate) fn expect(&mut self, name: &str, segments: &[SegmentKey], max: usize) {
        let n = self.snapshots.len() as u32;
        let mut distinct = 0;
        for s in segments {
            if distinct >= max {
                break;
            }
            let entries = self.by_addr.entry(s.addr).or_default();
            if !entries.iter().any(|e| e.0 == n) {
                entries.push((n, s.size, s.device));
                distinct += 1;
            }
        }
        self.snapshots.push((name.to_string(), distinct, false));
    }

    /// Whether any snapshot is expected (else no event needs looking up).
    pub(crate) fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    /// Looks up one event of a capture's process.
    pub(crate) fn see(&mut self, ev: &Event) {
        if ev.result != 0 || ev.pid >= SNAPSHOT_PID_BASE {
            return;
        }
        let reservation = if ev.kind == EventKind::Alloc as u8 || ev.kind == EventKind::FrameworkSegment as u8 {
            false
        } else if ev.kind == EventKind::VmmReserve as u8 {
            true
        } else {
            return;
        };
        let Some(entries) = self.by_addr.get(&ev.addr) else { return };
        for &(snap, size, device) in entries {
            // A reservation names no device and holds the segment's mapped bytes; an
            // allocation is the segment itself.
            let fits = if reservation { ev.size >= size } else { ev.size == size && ev.device == device };
            if !fits || self.seen.contains_key(&(snap, ev.pid, ev.addr)) {
                continue;
            }
            if self.seen.len() >= MAX_MATCHES {
                self.overflowed = true;
                continue;
            }
            self.seen.insert((snap, ev.pid, ev.addr), ());
            *self.counts.entry((snap, ev.pid)).or_default() += 1;
        }
    }

    /// The first expected snapshot named `name` not yet imported, marked imported.
    pub(crate) fn take(&mut self, name: &str) -> Option<u32> {
        let k = self.snapshots.iter().position(|s| s.0 == name && !s.2)?;
        self.snapshots[k].2 = true;
        Some(k as u32)
    }

    /// Whether snapshot `snap` joins one process: a strict majority of its segments found,
    /// by address and size on the same device, among one process's allocations, and in no
    /// other process.
    pub(crate) fn decide(&self, snap: u32) -> SnapshotJoin {
        let segments = self.snapshots.get(snap as usize).map_or(0, |s| s.1) as u64;
        let mut candidates: Vec<JoinCandidate> = self
            .counts
            .range((snap, 0)..=(snap, u32::MAX))
            .map(|(&(_, pid), &matched)| JoinCandidate { pid, matched })
            .collect();
        candidates.sort_by_key(|c| (std::cmp::Reverse(c.matched), c.pid));
        let majority: Vec<&JoinCandidate> = candidates.iter().filter(|c| c.matched * 2 > segments).collect();
        let mut join = SnapshotJoin {
            joined: false,
            pid: None,
            segments,
            matched: 0,
            candidates: Vec::new(),
            reason: String::new(),
        };
        join.reason = match (segments, majority.as_slice(), candidates.first()) {
            (0, _, _) => "the snapshot lists no segment to match".into(),
            (_, [one], _) => {
                join.joined = true;
                join.pid = Some(one.pid);
                join.matched = one.matched;
                format!(
                    "{} of its {segments} segments are allocations of pid {} (same address, size and device)",
                    one.matched, one.pid
                )
            }
            (_, [], None) => format!("none of its {segments} segments is an allocation of a process in the captures"),
            (_, [], Some(best)) => {
                join.matched = best.matched;
                format!(
                    "at most {} of its {segments} segments are allocations of one process (pid {}): not a majority",
                    best.matched, best.pid
                )
            }
            (_, many, _) => format!(
                "ambiguous: a majority of its {segments} segments are allocations of each of pids {} (processes \
                 can have the same device addresses)",
                many.iter().map(|c| format!("{} ({})", c.pid, c.matched)).collect::<Vec<_>>().join(", ")
            ),
        };
        if self.overflowed {
            join.reason.push_str(&format!("; more than {MAX_MATCHES} matches: later ones were not counted"));
        }
        candidates.truncate(MAX_CANDIDATES);
        join.candidates = candidates;
        join
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramhook_protocol::record::Api;

    const MIB: u64 = 1 << 20;

    fn index() -> JoinIndex {
        let mut j = JoinIndex::default();
        let segs = [
            SegmentKey { device: 0, addr: 0x1000_0000, size: 20 * MIB },
            SegmentKey { device: 0, addr: 0x2000_0000, size: 2 * MIB },
            SegmentKey { device: 0, addr: 0x2000_0000, size: 2 * MIB }, // the trace's copy
            SegmentKey { device: 0, addr: 0x3000_0000, size: 64 * MIB },
        ];
        j.expect("s.pickle", &segs, 100);
        j
    }

    #[test]
    fn allocations_reservations_and_lens_segments_count_once_each() {
        let mut j = index();
        let k = j.take("s.pickle").expect("expected");
        let alloc =
            |pid, addr, size, dev: i16| Event::alloc(Api::cuMemAlloc_v2, addr, size).by(pid, pid).on_device(dev);
        // Freed and allocated again at the same address: one segment.
        j.see(&alloc(7, 0x1000_0000, 20 * MIB, 0));
        j.see(&alloc(7, 0x1000_0000, 20 * MIB, 0));
        // An expandable segment: the reservation holds more than the mapped bytes, names no device.
        j.see(&Event::vmm_reserve(0x3000_0000, 512 * MIB, 0, 0).by(7, 7).on_device(-1));
        // The lens's record of the last one.
        j.see(&Event::framework_segment(0x2000_0000, 2 * MIB, MIB, MIB, 1).by(7, 7).on_device(0));
        // Not matches: another device, another size, a failed call, a snapshot's own process.
        j.see(&alloc(8, 0x1000_0000, 20 * MIB, 1));
        j.see(&alloc(8, 0x2000_0000, 4 * MIB, 0));
        j.see(&alloc(8, 0x3000_0000, 64 * MIB, 0).with_result(2));
        j.see(&alloc(SNAPSHOT_PID_BASE + 1, 0x1000_0000, 20 * MIB, 0));
        let d = j.decide(k);
        assert_eq!((d.joined, d.pid, d.matched, d.segments), (true, Some(7), 3, 3), "{d:?}");
        assert_eq!(d.candidates.len(), 1, "{d:?}");
        assert!(j.take("s.pickle").is_none(), "taken once");
    }

    #[test]
    fn a_reservation_smaller_than_the_segment_is_not_it() {
        let mut j = index();
        j.see(&Event::vmm_reserve(0x3000_0000, 32 * MIB, 0, 0).by(7, 7));
        let d = j.decide(0);
        assert!(!d.joined && d.candidates.is_empty(), "{d:?}");
        assert!(d.reason.contains("none of its 3 segments"), "{}", d.reason);
    }
}
