//! Framework segments (a PyTorch snapshot's caching-allocator segments).

use super::*;

impl Model {
    /// Sets (replaces) the state of a framework segment — a region a framework sub-allocates
    /// from, e.g. a PyTorch caching-allocator segment from a memory snapshot. `blocks` inside
    /// `[base, base+size)`, non-overlapping; allocated blocks are occupied, everything else
    /// (cached blocks and uncovered bytes) is free and counts as idle, reclaimable bytes.
    /// A `size` of 0 removes the segment. The segment's own bytes are NOT added to live
    /// bytes (the segment is itself a `cudaMalloc` already counted from events).
    pub fn framework_segment(&mut self, pid: u32, device: i16, base: u64, size: u64, blocks: &[Block], ts_ns: u64) {
        let slot = match self.by_pid.get(&pid) {
            Some(&s) => s,
            None => self.new_process(pid, 0),
        };
        if let Some(old) = self.segments.remove(&(pid, base)) {
            self.procs[slot].arena_change(Some(old.numbers()), None);
        }
        if size == 0 || !self.procs[slot].alive {
            return;
        }
        let Some(end) = base.checked_add(size) else {
            self.anomaly(Some(slot), Anomaly::AddressOverflow);
            return;
        };
        let mut allocated: Vec<(u64, u64)> =
            blocks.iter().filter(|b| b.allocated && b.size > 0).map(|b| (b.addr, b.size)).collect();
        allocated.sort_unstable();
        let mut gaps = Gaps::default();
        let mut cursor = base;
        let mut occ = 0u64;
        let mut count = 0u64;
        let mut bad = false;
        for (a, s) in allocated {
            let e = a.saturating_add(s);
            if a < cursor || e > end {
                bad = true;
                continue;
            }
            gaps.add(a - cursor);
            occ += s;
            count += 1;
            cursor = e;
        }
        gaps.add(end - cursor);
        if bad {
            self.anomaly(Some(slot), Anomaly::BadSegment);
        }
        let seg = Segment { size, device, ts: ts_ns, allocated: occ, blocks: count, gaps };
        let n = seg.numbers();
        self.segments.insert((pid, base), seg);
        self.procs[slot].arena_change(None, Some(n));
    }
}
