//! Framework lenses: what an in-process lens (the PyTorch lens) says about the framework's
//! own cache, which the driver cannot see into. A lens writes three kinds of record into
//! the process's ring: periodic samples, the moment the framework gave up on a request, and
//! the cache's segments at that moment.

use super::*;
use vramhook_protocol::kinds::UNKNOWN_BYTES;

/// Segments after which a lens OOM's explanation is refreshed only every 1,024th segment
/// (the numbers themselves are always kept exact).
const EXPLAIN_EVERY_SEGMENT_UP_TO: u64 = 10_000;

impl Model {
    /// A lens's cached free bytes of process `p` on `device` (all when -1), on the devices
    /// where none of its framework segments is known (where they are, the segments' free
    /// bytes count instead).
    pub(super) fn lens_idle(&self, p: &Process, device: i16) -> u64 {
        let g = self.config.granularity;
        p.lens
            .iter()
            .filter(|c| device < 0 || c.device == device)
            .filter(|c| {
                let mut segs = self.segments.range((p.pid, 0)..=(p.pid, u64::MAX));
                !segs.any(|(_, s)| s.device == c.device)
            })
            .map(|c| {
                // A framework whose cache is a stream-ordered pool (PyTorch's
                // `backend:cudaMallocAsync`) reports the pool's idle reserve as its own
                // reserved-but-unallocated bytes: counted once, with the pool's.
                let pool_idle = self
                    .pools
                    .range((p.pid, false, 0)..=(p.pid, true, u64::MAX))
                    .filter(|(_, pl)| pl.device == c.device)
                    .fold(0u64, |acc, (_, pl)| acc.saturating_add(pl.idle(g)));
                c.cached_free().saturating_sub(pool_idle)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Keeps a lens's numbers for the process at `slot` (one entry per device and framework).
    /// A sample without a largest free block keeps the last one measured.
    fn set_lens(&mut self, slot: usize, mut cache: FrameworkCache) {
        let p = &mut self.procs[slot];
        p.frameworks |= cache.framework.bit();
        match p.lens.iter_mut().find(|c| c.device == cache.device && c.framework == cache.framework) {
            Some(old) => {
                if cache.largest_free_block.is_none() {
                    cache.largest_free_block = old.largest_free_block;
                }
                if cache.segments == 0 {
                    cache.segments = old.segments;
                }
                // Its `framework_stats` follows the sample: until then, the last ones known.
                cache.stranded_bytes = cache.stranded_bytes.or(old.stranded_bytes);
                cache.limit_bytes = cache.limit_bytes.or(old.limit_bytes);
                cache.fragmentation = cache_fragmentation(&cache);
                *old = cache;
            }
            None => {
                cache.fragmentation = cache_fragmentation(&cache);
                p.lens.push(cache);
                p.lens.sort_by_key(|c| (c.device, c.framework));
            }
        }
    }

    pub(super) fn on_framework_sample(&mut self, slot: usize, ev: &Event, ts: u64) {
        if ev.framework_allocated() > ev.framework_reserved() {
            self.anomaly(Some(slot), Anomaly::BadSegment);
            return;
        }
        self.set_lens(
            slot,
            FrameworkCache {
                framework: ev.framework(),
                device: ev.device,
                reserved_bytes: ev.framework_reserved(),
                allocated_bytes: ev.framework_allocated(),
                largest_free_block: ev.largest_free_block(),
                segments: ev.framework_segments(),
                fragmentation: None,
                ts_ns: ts,
                stranded_bytes: None,
                limit_bytes: None,
            },
        );
        self.pool_reserve_from_lens(slot, ev);
    }

    /// PyTorch's `backend:cudaMallocAsync` keeps its cache in the device's default pool, and
    /// its `memory_reserved()` is that pool's reserve: a lens sample whose allocated bytes are
    /// exactly the pool's live bytes (and no segment says otherwise) updates the pool's
    /// reserve, so held bytes follow the pool within a lens interval even when the program
    /// stops calling (the interposer samples pools only every 256th allocation and at an OOM).
    fn pool_reserve_from_lens(&mut self, slot: usize, ev: &Event) {
        let (pid, device) = (self.procs[slot].pid, ev.device);
        if ev.framework() != FrameworkId::PyTorch || device < 0 {
            return;
        }
        if self.segments.range((pid, 0)..=(pid, u64::MAX)).any(|(_, s)| s.device == device) {
            return;
        }
        let key = Self::pool_key(pid, device, 0);
        let (reserved, allocated) = (ev.framework_reserved(), ev.framework_allocated());
        let matches = self.pools.get(&key).is_some_and(|pl| pl.live == allocated && !pl.destroyed);
        if matches && reserved <= MAX_POOL_SAMPLE {
            self.change_pool(slot, key, |pl| pl.sampled = Some(reserved));
        }
    }

    /// The framework gave up on a request. The incident it belongs to is found by the
    /// process's order of events and the request (`lens_incident`): the driver's failure that
    /// led to it, else a new one (the framework stopped inside its own pool or at a limit of
    /// its own, with no driver failure: JAX's preallocated pool). A lens that cannot read its
    /// framework's reserved bytes (TensorFlow) sends them unknown: the bytes the process
    /// holds from the driver on the device stand for them (its allocator's pool).
    pub(super) fn on_framework_oom(&mut self, slot: usize, ev: &Event, ts: u64) {
        let allocated = ev.framework_allocated();
        let reserved = match ev.framework_reserved() {
            UNKNOWN_BYTES => self.procs[slot].resident_on(ev.device).max(allocated),
            r => r,
        };
        if allocated > reserved {
            self.anomaly(Some(slot), Anomaly::BadSegment);
            return;
        }
        let framework = ev.framework();
        let device = ev.device;
        let lens = LensOom {
            framework,
            requested: ev.framework_request(),
            reserved,
            allocated,
            largest_free_block: ev.largest_free_block(),
            ..LensOom::default()
        };
        self.set_lens(
            slot,
            FrameworkCache {
                framework,
                device,
                reserved_bytes: reserved,
                allocated_bytes: allocated,
                largest_free_block: lens.largest_free_block,
                segments: 0,
                fragmentation: None,
                ts_ns: ts,
                stranded_bytes: None,
                limit_bytes: None,
            },
        );
        let idx = match self.lens_incident(slot, device, lens.requested) {
            Some(idx) => idx,
            None => {
                self.procs[slot].oom_count += 1;
                self.open_incident(slot, device, lens.requested, Api::Lens, "", ts)
            }
        };
        let pid = self.procs[slot].pid;
        let own_idle = self.idle_of(pid, device);
        let limit = self.limit_of(slot, device);
        let inc = &mut self.incidents[idx];
        inc.inputs.framework = framework.caches().then_some(framework).or(inc.inputs.framework);
        inc.inputs.own_idle = own_idle;
        inc.inputs.lens = Some(lens.clone());
        inc.view.own_idle_bytes = own_idle;
        inc.inputs.framework_limit = limit;
        inc.view.framework_limit = limit;
        inc.view.framework = inc.inputs.framework;
        inc.view.framework_oom = Some(lens);
        inc.view.outcome = Outcome::Failed;
        let p = &mut self.procs[slot];
        p.open_incident = None; // the framework gave up: the program moved on
        p.lens_segments_for = Some((idx, device, false));
        self.decide(idx);
    }

    /// The incident a framework's failure of `requested` bytes on `device` joins (see
    /// `on_framework_oom`), if any: by the process's order of events, the driver's failure
    /// still open (no other failure and no successful retry since, and at most the incident
    /// window's events or time of the program: a lens record never closes the window, however
    /// late it comes, as after a slow snapshot), when no lens spoke for it yet, on the same
    /// device (or one the driver's call did not name), and for a driver request that can be
    /// this one's (at least its bytes, or a VMM chunk of it: PyTorch's expandable segments and
    /// XLA's growth map a request chunk by chunk). Not by time alone: a failure the program
    /// moved on from is not joined.
    fn lens_incident(&self, slot: usize, device: i16, requested: u64) -> Option<usize> {
        let idx = self.procs[slot].open_incident?;
        let i = self.incidents.get(idx)?;
        let fits = i.slot == slot
            && i.inputs.lens.is_none()
            && (i.view.device == device || i.view.device < 0)
            && matches!(i.view.outcome, Outcome::Open | Outcome::FailedAgain)
            && (i.view.requested_bytes >= requested || i.view.api == Api::cuMemCreate);
        fits.then_some(idx)
    }

    /// Whether applying `ev`, a framework's failure, would open a new incident rather than
    /// join one (a reader that bounds its incidents folds it past the bound instead).
    pub fn framework_oom_opens_incident(&self, ev: &Event) -> bool {
        match self.by_pid.get(&ev.pid) {
            Some(&slot) => {
                let p = &self.procs[slot];
                p.alive && self.lens_incident(slot, ev.device, ev.framework_request()).is_none()
            }
            None => true,
        }
    }

    /// One segment of the cache, listed by the lens right after its `framework_oom`.
    pub(super) fn on_framework_segment(&mut self, slot: usize, ev: &Event, ts: u64) {
        let Some((idx, device, cleared)) = self.procs[slot].lens_segments_for else {
            self.anomaly(Some(slot), Anomaly::BadSegment);
            return;
        };
        // Segments follow their OOM record (the lens writes the numbers first and lists the
        // segments after, however long its snapshot takes): they belong to that record.
        if self.incidents.get(idx).is_none() {
            self.procs[slot].lens_segments_for = None;
            self.anomaly(Some(slot), Anomaly::BadSegment);
            return;
        }
        let (base, size, allocated) = (ev.addr, ev.size, ev.framework_allocated());
        let free = size.saturating_sub(allocated);
        let largest = ev.largest_free_block().unwrap_or(free);
        if size == 0 || allocated > size || largest > free || base.checked_add(size).is_none() || ev.device != device {
            self.anomaly(Some(slot), Anomaly::BadSegment);
            return;
        }
        let pieces = if free == 0 { 0 } else { ev.free_pieces().max(1) };
        let mut gaps = Gaps::default();
        gaps.add(largest);
        // The lens gives the largest piece and the count: the rest is spread evenly over the
        // other pieces (total, largest and count exact; the other sizes are not known).
        let rest = free - largest;
        if rest > 0 {
            let others = pieces.saturating_sub(1).max(1);
            for k in 0..others {
                gaps.add(rest / others + u64::from(k < rest % others));
            }
        }
        let pid = self.procs[slot].pid;
        if !cleared {
            // The first segment the lens lists: they replace what was known of the cache.
            self.clear_segments(slot, pid, device);
            self.procs[slot].lens_segments_for = Some((idx, device, true));
            let inc = &mut self.incidents[idx];
            inc.inputs.cache_free = 0;
            inc.inputs.cache_largest_free = 0;
            inc.inputs.cache_segments = 0;
            inc.inputs.cache_reserved = 0;
            inc.inputs.cache_pieces = 0;
            inc.inputs.cache_with_free = 0;
        }
        let seg = Segment { size, device: ev.device, ts, allocated, blocks: 0, gaps };
        let n = seg.numbers();
        if let Some(old) = self.segments.insert((pid, base), seg) {
            self.procs[slot].arena_change(Some(old.numbers()), None);
        }
        self.procs[slot].arena_change(None, Some(n));
        let inc = &mut self.incidents[idx];
        inc.inputs.cache_free = inc.inputs.cache_free.saturating_add(free);
        inc.inputs.cache_largest_free = inc.inputs.cache_largest_free.max(largest);
        inc.inputs.cache_segments += 1;
        inc.inputs.cache_reserved = inc.inputs.cache_reserved.saturating_add(size);
        inc.inputs.cache_pieces = inc.inputs.cache_pieces.saturating_add(pieces);
        inc.inputs.cache_with_free += u64::from(free > 0);
        inc.view.cache_fragmentation = Some(fragmentation(inc.inputs.cache_largest_free, inc.inputs.cache_free));
        let listed = match inc.inputs.lens.as_mut() {
            Some(l) => {
                l.segments_listed += 1;
                // The OOM record came before the snapshot (its largest block unknown then):
                // the listed segments say it.
                l.largest_free_block = Some(inc.inputs.cache_largest_free);
                l.free_pieces = l.free_pieces.saturating_add(pieces);
                l.segments_with_free += u64::from(free > 0);
                inc.view.framework_oom = Some(l.clone());
                l.segments_listed
            }
            None => 0,
        };
        if let Some(c) = self.procs[slot].lens.iter_mut().find(|c| c.device == ev.device) {
            c.segments = c.segments.max(listed);
        }
        if listed <= EXPLAIN_EVERY_SEGMENT_UP_TO || listed.is_multiple_of(1024) {
            self.decide(idx);
        }
    }
}

impl Model {
    /// Forgets the framework segments of process `pid` on `device` (all when -1).
    fn clear_segments(&mut self, slot: usize, pid: u32, device: i16) {
        let stale: Vec<u64> = self
            .segments
            .range((pid, 0)..=(pid, u64::MAX))
            .filter(|(_, s)| device < 0 || s.device == device)
            .map(|((_, base), _)| *base)
            .collect();
        for base in stale {
            if let Some(old) = self.segments.remove(&(pid, base)) {
                self.procs[slot].arena_change(Some(old.numbers()), None);
            }
        }
    }
}

/// `1 − largest free block / (reserved − allocated)`, when the largest block is known.
fn cache_fragmentation(c: &FrameworkCache) -> Option<f64> {
    c.largest_free_block.map(|b| fragmentation(b, c.cached_free()))
}
