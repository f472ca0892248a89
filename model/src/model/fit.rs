//! The fit of the next large request (issue 30): per live process and device, its
//! **demand** (the largest request it made within `ModelConfig::fit_window_ns`: allocations
//! it gave back or that failed, a framework lens's OOM records, and the largest request a
//! lens reports: PyTorch's largest request given back that its snapshots show, JAX's
//! `largest_alloc_size`), its
//! **supply** (what it could get for such a request now, by its allocator's own rules) and
//! their ratio. Demand is kept per event at amortised O(1) (a monotonic max-queue);
//! supply and the ratio are computed only in snapshots.

use super::*;
use crate::verdict::DRIVER_RESERVE;
use std::collections::VecDeque;

/// Entries kept per window at most: a window's requests in strictly decreasing size past
/// this (rare: a max-queue keeps only the requests no later one is at least as large as)
/// lose their second oldest, so the window's maximum after the oldest expires may read low.
const DEMAND_ENTRIES: usize = 256;

/// The requests of one process on one device that may still be a window's largest:
/// (time, size, source), sizes strictly decreasing from the front.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct DemandWindow {
    device: i16,
    queue: VecDeque<(u64, u64, DemandSource)>,
}

impl DemandWindow {
    #[inline]
    fn push(&mut self, ts: u64, size: u64, source: DemandSource, window: u64) {
        while self.queue.front().is_some_and(|f| f.0.saturating_add(window) < ts) {
            self.queue.pop_front();
        }
        while self.queue.back().is_some_and(|b| b.1 <= size) {
            self.queue.pop_back();
        }
        if self.queue.len() >= DEMAND_ENTRIES {
            self.queue.remove(1);
        }
        self.queue.push_back((ts, size, source));
    }

    /// The largest request within `window` before `now`: (time, size, source).
    fn largest(&self, now: u64, window: u64) -> Option<(u64, u64, DemandSource)> {
        self.queue.iter().find(|e| e.0.saturating_add(window) >= now).copied()
    }
}

impl Model {
    /// Counts a request in its process's demand window: an allocation call that failed out
    /// of memory, a framework's own failed request, and the largest allocation its lens
    /// reports. A successful allocation counts when it is given back ([`Self::note_given_back`]).
    #[inline]
    pub(super) fn note_demand(&mut self, slot: usize, ev: &Event, kind: EventKind, ts: u64) {
        let (size, source) = match kind {
            EventKind::FrameworkOom => (ev.framework_request(), DemandSource::LensOom),
            // The framework's own largest request given back, seen again at each sample:
            // requests the driver never sees (served from the cache) count too.
            EventKind::FrameworkStats => match ev.framework_largest_allocation() {
                Some(b) => (b, DemandSource::LensLargestAllocation),
                None => return,
            },
            _ if !ev.is_oom() => return,
            _ => match ev.api().and_then(|a| a.mem_class()) {
                Some(c) if is_demand_class(c) => (ev.size, DemandSource::Driver),
                _ => return,
            },
        };
        self.push_demand(slot, ev.device, size, source, ts);
    }

    /// Counts an allocation its process gave back (freed, or a VMM handle released) as a
    /// request it makes: one still held since it was made (weights, a preallocated KV cache,
    /// a ballast) is state, not a request it will make again, and would read as the next
    /// one for a whole window (the H200 run of `scripts/gpu/fit/run.sh` showed a 125 GiB
    /// block held from the start read so).
    #[inline]
    pub(super) fn note_given_back(&mut self, slot: usize, device: i16, size: u64, class: Class) {
        if is_demand_class(class) {
            let ts = self.procs[slot].last_ts;
            self.push_demand(slot, device, size, DemandSource::Driver, ts);
        }
    }

    #[inline]
    fn push_demand(&mut self, slot: usize, device: i16, size: u64, source: DemandSource, ts: u64) {
        if size == 0 || device < 0 {
            return;
        }
        let window = self.config.fit_window_ns;
        let windows = &mut self.procs[slot].demand;
        let w = match windows.iter().position(|w| w.device == device) {
            Some(i) => &mut windows[i],
            None => {
                windows.push(DemandWindow { device, queue: VecDeque::new() });
                windows.last_mut().expect("just pushed")
            }
        };
        w.push(ts, size, source, window);
    }

    /// Forgets the demand of the process at `slot` (it exited).
    pub(super) fn forget_demand(&mut self, slot: usize) {
        if let Some(p) = self.procs.get_mut(slot) {
            p.demand = Vec::new();
        }
    }

    /// The device's free bytes a new allocation could have now: the latest sample's free
    /// bytes less what the driver keeps back, rounded down to the granularity.
    fn device_room(&self, device: i16) -> Option<u64> {
        let g = self.config.granularity.max(1);
        self.devices.get(&device).map(|d| {
            let f = d.free.saturating_sub(DRIVER_RESERVE);
            f - f % g
        })
    }

    /// Per device with a demand in the window and a device sample, the fit of the process
    /// at `slot` (a live one) now.
    pub(super) fn fit_of(&self, slot: usize) -> Vec<ProcessFit> {
        let Some(windows) = self.procs.get(slot).map(|p| &p.demand) else { return Vec::new() };
        let window = self.config.fit_window_ns;
        let mut out: Vec<ProcessFit> = windows
            .iter()
            .filter_map(|w| {
                let (ts, demand, source) = w.largest(self.now, window)?;
                let room = self.device_room(w.device)?;
                let (supply, rule, own) = self.supply_for(slot, w.device, room);
                let limited_by = (supply < demand).then(|| self.limited_by(slot, w.device, demand, room, rule, own));
                Some(ProcessFit {
                    device: w.device,
                    demand_bytes: demand,
                    demand_source: source,
                    demand_ts_ns: ts,
                    supply_bytes: supply,
                    supply_rule: rule,
                    fit_ratio: supply as f64 / demand as f64,
                    limited_by,
                })
            })
            .collect();
        out.sort_by_key(|f| f.device);
        out
    }

    /// Why a request of `demand` would not fit (see [`FitLimit`]), from what `supply_for`
    /// saw of the process's own memory.
    fn limited_by(
        &self,
        slot: usize,
        device: i16,
        demand: u64,
        room: u64,
        rule: SupplyRule,
        own: OwnBytes,
    ) -> FitLimit {
        if rule == SupplyRule::FrameworkCache {
            if own.capped && room.saturating_add(own.releasable) >= demand {
                return FitLimit::FrameworkLimit;
            }
            if room.saturating_add(own.cache_free) >= demand {
                return FitLimit::FrameworkFragmentation;
            }
        }
        // The device's bytes this process does not hold: other processes' (traced or not),
        // contexts and libraries.
        let held = self.held_by(slot, device, self.now).held;
        let others = self.devices.get(&device).map_or(0, |d| d.total.saturating_sub(d.free).saturating_sub(held));
        if room.saturating_add(others) >= demand {
            FitLimit::OtherProcesses
        } else {
            FitLimit::Capacity
        }
    }

    /// What the process at `slot` could get for one request on `device` now, given the
    /// device's `room`, by its allocator's rules; and what it saw of the process's own bytes.
    fn supply_for(&self, slot: usize, device: i16, room: u64) -> (u64, SupplyRule, OwnBytes) {
        let p = &self.procs[slot];
        let pid = p.pid;
        let g = self.config.granularity.max(1);
        let now = self.now;
        // A caching framework: its segments (a snapshot), or its lens's latest sample.
        let mut segments = false;
        let (mut seg_reserved, mut seg_largest) = (0u64, 0u64);
        for (_, s) in self.segments.range((pid, 0)..=(pid, u64::MAX)).filter(|(_, s)| s.device == device) {
            segments = true;
            seg_reserved = seg_reserved.saturating_add(s.size);
            seg_largest = seg_largest.max(s.gaps.largest());
        }
        let lens = p.fresh_lens(device, now);
        if segments || lens.is_some() {
            // The lens's numbers are the framework's own, and newer than a snapshot's segments.
            let (reserved, largest) = match lens {
                Some(c) => (c.reserved_bytes, c.largest_free_block.unwrap_or(if segments { seg_largest } else { 0 })),
                None => (seg_reserved, seg_largest),
            };
            // What it gives back before it raises: whole free segments, or the lens's
            // `reserved − allocated − stranded` (and a pool's idle reserve).
            let releasable = self.held_by(slot, device, now).releasable;
            // A new segment comes from the device's free bytes plus what it released, under
            // its limit (counted against what it still reserves).
            let mut fresh = room.saturating_add(releasable - releasable % g);
            let mut capped = false;
            if let Some(limit) = self.limit_of(slot, device) {
                let under = limit.saturating_sub(reserved.saturating_sub(releasable));
                capped = under - under % g < fresh;
                fresh = fresh.min(under - under % g);
            }
            let cache_free = match lens {
                Some(c) => c.cached_free(),
                None => self
                    .segments
                    .range((pid, 0)..=(pid, u64::MAX))
                    .filter(|(_, s)| s.device == device)
                    .fold(0u64, |a, (_, s)| a.saturating_add(s.size - s.allocated)),
            };
            let own = OwnBytes { releasable, cache_free, capped };
            return (largest.max(fresh), SupplyRule::FrameworkCache, own);
        }
        let pool_idle = self
            .pools
            .range((pid, false, 0)..=(pid, true, u64::MAX))
            .filter(|(_, pl)| pl.device == device)
            .fold(None, |acc: Option<u64>, (_, pl)| Some(acc.unwrap_or(0).saturating_add(pl.idle(g))));
        if let Some(idle) = pool_idle {
            return (idle.saturating_add(room), SupplyRule::Pool, OwnBytes::default());
        }
        (room, SupplyRule::Driver, OwnBytes::default())
    }
}

/// Device memory a process asks the device for: not another process's (IPC, imports), not
/// managed memory (the driver pages it in; it fails no request for room).
#[inline]
fn is_demand_class(c: Class) -> bool {
    matches!(c, Class::Plain | Class::Pitch | Class::Pool | Class::Vmm | Class::Array)
}

/// A caching framework's own bytes as the supply saw them.
#[derive(Clone, Copy, Default)]
struct OwnBytes {
    /// What it gives back before it raises.
    releasable: u64,
    /// Free in its cache (`reserved − allocated`), in one piece or not.
    cache_free: u64,
    /// Its own limit cut the new segment it could make.
    capped: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_its_largest_and_forgets_the_expired() {
        let mut w = DemandWindow::default();
        w.push(0, 100, DemandSource::Driver, 10);
        w.push(1, 50, DemandSource::Driver, 10);
        w.push(2, 70, DemandSource::LensOom, 10);
        assert_eq!(w.largest(5, 10), Some((0, 100, DemandSource::Driver)));
        assert_eq!(w.largest(11, 10), Some((2, 70, DemandSource::LensOom)));
        assert_eq!(w.queue.len(), 2, "50 can never be the largest again");
        w.push(30, 10, DemandSource::Driver, 10);
        assert_eq!(w.queue.len(), 1, "expired entries go on push");
        assert_eq!(w.largest(41, 10), None);
    }

    #[test]
    fn a_window_stays_bounded() {
        let mut w = DemandWindow::default();
        for k in 0..10_000u64 {
            w.push(k, 1_000_000 - k, DemandSource::Driver, u64::MAX / 2);
        }
        assert!(w.queue.len() <= DEMAND_ENTRIES);
        assert_eq!(w.largest(10_000, u64::MAX / 2).map(|e| e.1), Some(1_000_000));
    }
}
