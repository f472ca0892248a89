//! Queries: snapshots, arenas, layout, windows, and forgetting exited processes.

use super::*;

impl Model {
    /// The live process `pid` (of `start_time`, or any when 0): its index and its view, as in
    /// [`Model::snapshot`] (histograms included when `full`), at the cost of that process
    /// alone (plus a pass over the live allocations when `full`): a replay keeps each
    /// process's view at its exit, and a snapshot of everything per exit was quadratic.
    pub fn process_view(&self, pid: u32, start_time: u64, full: bool) -> Option<(usize, ProcessView)> {
        let slot = self.procs.iter().rposition(|p| {
            p.pid == pid && p.alive && (start_time == 0 || p.start_time == start_time || p.start_time == 0)
        })?;
        let g = self.config.granularity;
        let p = &self.procs[slot];
        let current = p.alive && self.by_pid.get(&p.pid).is_some_and(|s| self.procs[*s].start_time == p.start_time);
        let (mut pi, mut pr) = (0u64, 0u64);
        let mut si = 0u64;
        if current {
            for (_, pool) in self.pools.range((pid, false, 0)..=(pid, true, u64::MAX)) {
                pi = pi.saturating_add(pool.idle(g));
                pr = pr.saturating_add(pool.reserve(g));
            }
            for (_, seg) in self.segments.range((pid, 0)..=(pid, u64::MAX)) {
                si = si.saturating_add(seg.size - seg.allocated);
            }
        }
        let mut sizes = Histogram::new(&self.config.size_buckets);
        let mut ages = Histogram::new(&self.config.age_buckets_ns);
        if full && current {
            for (owner, _, a) in self.allocs.iter() {
                if owner == pid {
                    sizes.add(a.size);
                    ages.add(self.now.saturating_sub(a.ts));
                }
            }
            for (k, h) in &self.handles {
                if k.0 == pid {
                    sizes.add(h.size);
                    ages.add(self.now.saturating_sub(h.ts));
                }
            }
        }
        if current {
            si = si.saturating_add(self.lens_idle(p, -1));
        }
        let mut view = process_view_of(p, pi.saturating_add(si), (pi, pr), self.config.stream_bytes, sizes, ages);
        if current {
            view.device_memory = self.device_memory_of(slot);
            view.fit = self.fit_of(slot);
        }
        Some((slot, view))
    }

    /// The full state. O(live allocations + arenas).
    pub fn snapshot(&self) -> ModelSnapshot {
        self.snapshot_with(true)
    }

    /// As [`Model::snapshot`] but without what costs a pass over every live allocation or
    /// incident: the size and age histograms and `incidents` are left empty. For sampling
    /// the other numbers often.
    pub fn snapshot_numbers(&self) -> ModelSnapshot {
        self.snapshot_with(false)
    }

    pub(super) fn snapshot_with(&self, full: bool) -> ModelSnapshot {
        let g = self.config.granularity;
        let now = self.now;
        // Histograms: one pass over live allocations and handles.
        let mut sizes: FastMap<u32, Histogram> = FastMap::default();
        let mut ages: FastMap<u32, Histogram> = FastMap::default();
        let mut add = |pid: u32, size: u64, ts: u64| {
            sizes.entry(pid).or_insert_with(|| Histogram::new(&self.config.size_buckets)).add(size);
            ages.entry(pid).or_insert_with(|| Histogram::new(&self.config.age_buckets_ns)).add(now.saturating_sub(ts));
        };
        if full {
            for (pid, _, a) in self.allocs.iter() {
                add(pid, a.size, a.ts);
            }
            for (k, h) in &self.handles {
                add(k.0, h.size, h.ts);
            }
        }
        let mut pool_idle: FastMap<u32, (u64, u64)> = FastMap::default();
        let mut dev_pool_idle: BTreeMap<i16, u64> = BTreeMap::new();
        for ((pid, _, _), p) in &self.pools {
            let e = pool_idle.entry(*pid).or_default();
            e.0 = e.0.saturating_add(p.idle(g));
            e.1 = e.1.saturating_add(p.reserve(g));
            let d = dev_pool_idle.entry(p.device).or_default();
            *d = d.saturating_add(p.idle(g));
        }
        let mut seg_idle: FastMap<u32, u64> = FastMap::default();
        for ((pid, _), s) in &self.segments {
            let e = seg_idle.entry(*pid).or_default();
            *e = e.saturating_add(s.size - s.allocated);
        }
        let mut processes = Vec::with_capacity(self.procs.len());
        let mut dev_resident: BTreeMap<i16, u64> = BTreeMap::new();
        for (slot, p) in self.procs.iter().enumerate() {
            let current = p.alive && self.by_pid.get(&p.pid).is_some_and(|s| self.procs[*s].start_time == p.start_time);
            let (pi, pr) = if current { pool_idle.get(&p.pid).copied().unwrap_or((0, 0)) } else { (0, 0) };
            let si = if current {
                seg_idle.get(&p.pid).copied().unwrap_or(0).saturating_add(self.lens_idle(p, -1))
            } else {
                0
            };
            if p.alive {
                for d in &p.devices {
                    if d.resident > 0 {
                        let e = dev_resident.entry(d.device).or_default();
                        *e = e.saturating_add(d.resident);
                    }
                }
            }
            let size_histogram = if current {
                sizes.get(&p.pid).cloned().unwrap_or_else(|| Histogram::new(&self.config.size_buckets))
            } else {
                Histogram::new(&self.config.size_buckets)
            };
            let age_histogram = if current {
                ages.get(&p.pid).cloned().unwrap_or_else(|| Histogram::new(&self.config.age_buckets_ns))
            } else {
                Histogram::new(&self.config.age_buckets_ns)
            };
            let mut view = process_view_of(
                p,
                pi.saturating_add(si),
                (pi, pr),
                self.config.stream_bytes,
                size_histogram,
                age_histogram,
            );
            if current {
                view.device_memory = self.device_memory_of(slot);
                view.fit = self.fit_of(slot);
            }
            processes.push(view);
        }
        let mut ordinals: Vec<i16> = self.devices.keys().copied().collect();
        ordinals.extend(dev_resident.keys().copied());
        ordinals.extend(dev_pool_idle.iter().filter(|(_, v)| **v > 0).map(|(k, _)| *k));
        ordinals.sort_unstable();
        ordinals.dedup();
        let devices = ordinals
            .into_iter()
            .map(|o| {
                let s = self.devices.get(&o);
                let pool_idle_bytes = dev_pool_idle.get(&o).copied().unwrap_or(0);
                let traced = dev_resident.get(&o).copied().unwrap_or(0).saturating_add(pool_idle_bytes);
                DeviceView {
                    ordinal: o,
                    total: s.map(|s| s.total),
                    free: s.map(|s| s.free),
                    sample_ts_ns: s.map(|s| s.ts),
                    sample_stale: s.is_some_and(|s| now.saturating_sub(s.ts) > self.config.stale_sample_ns),
                    traced_bytes: traced,
                    pool_idle_bytes,
                    untraced_bytes: s.map(|s| s.total.saturating_sub(s.free).saturating_sub(traced)),
                }
            })
            .collect();
        ModelSnapshot {
            now_ns: now,
            events: self.events,
            devices,
            processes,
            arenas: self.arenas(),
            incidents: if full { self.incidents.iter().map(|i| i.view.clone()).collect() } else { Vec::new() },
            anomalies: self.anomaly_totals(),
        }
    }

    pub fn anomaly_totals(&self) -> BTreeMap<String, u64> {
        Anomaly::ALL
            .iter()
            .filter(|a| self.anomalies[**a as usize] > 0)
            .map(|a| (a.name().to_string(), self.anomalies[*a as usize]))
            .collect()
    }

    pub fn incidents(&self) -> Vec<OomIncident> {
        self.incidents.iter().map(|i| i.view.clone()).collect()
    }

    pub(super) fn start_of(&self, pid: u32) -> u64 {
        self.by_pid.get(&pid).map(|s| self.procs[*s].start_time).unwrap_or(0)
    }

    /// Every arena, sorted by (pid, kind, base).
    pub fn arenas(&self) -> Vec<ArenaView> {
        self.arenas_in(0, u32::MAX)
    }

    /// The arenas of processes `lo..=hi` (by pid), sorted by (pid, kind, base): an OOM asks
    /// for one process's arenas without building every other's.
    pub(super) fn arenas_in(&self, lo: u32, hi: u32) -> Vec<ArenaView> {
        let g = self.config.granularity;
        let mut v = Vec::new();
        for ((pid, base), r) in self.reservations.range((lo, 0)..=(hi, u64::MAX)) {
            let u = ArenaUsage {
                device: r.device,
                size: r.size,
                occupied: r.mapped,
                free: r.numbers(),
                live: r.mappings.len() as u64,
            };
            v.push(self.arena_view(*pid, ArenaKind::VmmReservation, *base, u));
        }
        for ((pid, default, h), p) in self.pools.range((lo, false, 0)..=(hi, true, u64::MAX)) {
            let u = ArenaUsage {
                device: p.device,
                size: p.reserve(g),
                occupied: p.live,
                free: p.numbers(g),
                live: p.count,
            };
            v.push(self.arena_view(*pid, ArenaKind::Pool, if *default { 0 } else { *h }, u));
        }
        for ((pid, base), s) in self.segments.range((lo, 0)..=(hi, u64::MAX)) {
            let u =
                ArenaUsage { device: s.device, size: s.size, occupied: s.allocated, free: s.numbers(), live: s.blocks };
            v.push(self.arena_view(*pid, ArenaKind::FrameworkSegment, *base, u));
        }
        v.sort_by_key(|a| (a.pid, a.kind, a.base, a.device));
        v
    }

    fn arena_view(&self, pid: u32, kind: ArenaKind, base: u64, u: ArenaUsage) -> ArenaView {
        let (free, largest) = u.free;
        // A pool's free bytes are idle reserve handed out again as is: no fragmentation.
        let fragmentation = if kind == ArenaKind::Pool { 0.0 } else { fragmentation(largest, free) };
        ArenaView {
            pid,
            start_time: self.start_of(pid),
            device: u.device,
            kind,
            base,
            size: u.size,
            occupied: u.occupied,
            free_in_arena: free,
            largest_free_span: largest,
            fragmentation,
            live_allocations: u.live,
        }
    }

    /// Latest event time seen (monotonic ns).
    pub fn now_ns(&self) -> u64 {
        self.now
    }

    /// Forgets processes that exited before `before_ts`, with their OOM incidents, so that
    /// a long-running agent's memory does not grow with every process that ever ran (an
    /// offline replay keeps everything). Returns how many processes were forgotten.
    pub fn forget_exited(&mut self, before_ts: u64) -> usize {
        let keep: Vec<bool> = self.procs.iter().map(|p| p.alive || p.exit_ts.is_none_or(|t| t >= before_ts)).collect();
        let forgotten = keep.iter().filter(|k| !**k).count();
        if forgotten == 0 {
            return 0;
        }
        let mut slot_map = vec![usize::MAX; self.procs.len()];
        let mut next = 0;
        for (old, kept) in keep.iter().enumerate() {
            if *kept {
                slot_map[old] = next;
                next += 1;
            }
        }
        let kept: Vec<bool> = self.incidents.iter().map(|i| keep.get(i.slot).copied().unwrap_or(false)).collect();
        let incident_map = self.retain_incidents(&kept);
        for inc in &mut self.incidents {
            inc.slot = slot_map[inc.slot];
        }
        let mut procs = Vec::with_capacity(next);
        for (old, mut p) in std::mem::take(&mut self.procs).into_iter().enumerate() {
            if keep[old] {
                p.remap_incidents(&incident_map);
                procs.push(p);
            }
        }
        self.procs = procs;
        // The current process of a pid is its latest one: later slots win.
        self.by_pid.clear();
        for (slot, p) in self.procs.iter().enumerate() {
            self.by_pid.insert(p.pid, slot);
        }
        self.pid_cache = None;
        forgotten
    }

    /// The largest free span of one process over all its arenas: O(log arenas), no scan.
    pub fn largest_free_span(&self, pid: u32) -> u64 {
        self.by_pid.get(&pid).map(|s| self.procs[*s].largest_free_span()).unwrap_or(0)
    }

    /// The largest free span of one VMM reservation: O(log gaps), no scan.
    pub fn reservation_largest_free_span(&self, pid: u32, base: u64) -> Option<u64> {
        self.reservations.get(&(pid, base)).map(|r| r.gaps.largest())
    }

    /// All live allocations by address (of one process, or all), sorted by (addr, pid):
    /// plain, pitch, managed, pool and IPC allocations, and VMM mappings (with their
    /// reservation and handle). Arrays are left out (their "address" is a handle).
    ///
    /// Virtual gaps between plain allocations are NOT free VRAM: device pointers are virtual
    /// addresses and the GPU pages physical memory, so a gap says nothing about what the next
    /// `cudaMalloc` can get. Only gaps inside arenas (see [`Model::arenas`]) are free space.
    pub fn layout(&self, pid: Option<u32>) -> Vec<LayoutEntry> {
        let mut v = Vec::new();
        for (p, addr, a) in self.allocs.iter() {
            if pid.is_some_and(|x| x != p) || a.class() == Class::Array {
                continue;
            }
            v.push(LayoutEntry {
                addr,
                size: a.size,
                class: a.class(),
                pid: p,
                device: a.device,
                ts_ns: a.ts,
                reservation: None,
                handle: None,
            });
        }
        for ((p, base), r) in &self.reservations {
            if pid.is_some_and(|x| x != *p) {
                continue;
            }
            for (addr, m) in &r.mappings {
                let class = self.handles.get(&(*p, m.handle)).map(|h| Class::from_index(h.class)).unwrap_or(Class::Vmm);
                v.push(LayoutEntry {
                    addr: *addr,
                    size: m.size,
                    class,
                    pid: *p,
                    device: r.device,
                    ts_ns: m.ts,
                    reservation: Some(*base),
                    handle: Some(m.handle),
                });
            }
        }
        v.sort_by_key(|e| (e.addr, e.pid));
        v
    }
}

/// What every kind of arena reports from its own bookkeeping (see [`Model::arenas_in`]).
struct ArenaUsage {
    device: i16,
    size: u64,
    occupied: u64,
    /// Free bytes and the largest free span.
    free: (u64, u64),
    live: u64,
}
