//! A brute-force reference model: flat vectors, every number recomputed by scanning at query
//! time. Obviously correct, hopelessly slow. Shares only the verdict rule (`decide_verdict`)
//! and the public view types with the real model.
#![allow(dead_code, clippy::type_complexity)]

use std::collections::{BTreeMap, BTreeSet};
use vramhook_model::*;
use vramhook_protocol::{Api, Caller, Event, EventKind, FrameworkId, ProcessInfo};

#[derive(Clone, Debug, Default)]
struct P {
    pid: u32,
    st: u64,
    ppid: u32,
    command: String,
    exe: String,
    alive: bool,
    exit_status: Option<i32>,
    exit_ts: Option<u64>,
    peak: u64,
    peak_ts: u64,
    allocations: u64,
    frees: u64,
    failed: u64,
    oom: u64,
    dropped: u64,
    anomalies: u64,
    last_ts: u64,
    thread_ts: Vec<(u32, u64)>,
    lead_up: Vec<EventRecord>,
    freed_total: u64,
    open: Option<usize>,
    awaiting: Option<(usize, u32)>,
    frameworks: u64,
}

#[derive(Clone, Debug)]
struct A {
    pid: u32,
    addr: u64,
    size: u64,
    ts: u64,
    pool: u64,
    device: i16,
    class: Class,
}

#[derive(Clone, Debug)]
struct H {
    pid: u32,
    h: u64,
    size: u64,
    ts: u64,
    device: i16,
    class: Class,
    released: bool,
}

#[derive(Clone, Debug)]
struct R {
    pid: u32,
    base: u64,
    size: u64,
    device: i16,
}

#[derive(Clone, Debug)]
struct M {
    pid: u32,
    addr: u64,
    size: u64,
    h: u64,
    offset: u64,
    ts: u64,
}

#[derive(Clone, Debug)]
struct Pl {
    pid: u32,
    default: bool,
    id: u64,
    device: i16,
    hwm: u64,
    destroyed: bool,
    /// The driver's reserve from the latest `pool_sample`, until a trim or destroy.
    sampled: Option<u64>,
}

#[derive(Clone, Debug)]
struct S {
    pid: u32,
    base: u64,
    size: u64,
    device: i16,
    allocated: Vec<(u64, u64)>,
}

#[derive(Clone, Debug)]
struct I {
    view: OomIncident,
    inputs: VerdictInputs,
    freed_mark: u64,
    events_since: u32,
}

pub struct Reference {
    cfg: ModelConfig,
    procs: Vec<P>,
    allocs: Vec<A>,
    handles: Vec<H>,
    res: Vec<R>,
    maps: Vec<M>,
    pools: Vec<Pl>,
    /// Live streams: (pid, handle).
    streams: Vec<(u32, u64)>,
    /// The most live streams each process had at once.
    stream_peaks: BTreeMap<u32, u64>,
    segs: Vec<S>,
    samples: Vec<(i16, u64, u64, u64)>,
    incidents: Vec<I>,
    anomalies: BTreeMap<String, u64>,
    now: u64,
    events: u64,
}

fn newp(pid: u32, st: u64) -> P {
    P { pid, st, alive: true, ..P::default() }
}

impl Reference {
    pub fn new(cfg: ModelConfig) -> Reference {
        Reference {
            cfg,
            procs: vec![],
            allocs: vec![],
            handles: vec![],
            res: vec![],
            maps: vec![],
            pools: vec![],
            streams: vec![],
            stream_peaks: BTreeMap::new(),
            segs: vec![],
            samples: vec![],
            incidents: vec![],
            anomalies: BTreeMap::new(),
            now: 0,
            events: 0,
        }
    }

    /// The current process of a pid: the last one created with that pid.
    fn cur(&self, pid: u32) -> Option<usize> {
        self.procs.iter().rposition(|p| p.pid == pid)
    }

    fn anom(&mut self, slot: Option<usize>, a: Anomaly) {
        *self.anomalies.entry(a.name().to_string()).or_default() += 1;
        if let Some(s) = slot {
            self.procs[s].anomalies += 1;
        }
    }

    fn newproc(&mut self, pid: u32, st: u64) -> usize {
        self.procs.push(newp(pid, st));
        self.procs.len() - 1
    }

    fn live_of(&self, pid: u32) -> u64 {
        let a: u64 = self.allocs.iter().filter(|a| a.pid == pid && a.class.owned()).map(|a| a.size).sum();
        let h: u64 = self.handles.iter().filter(|h| h.pid == pid && h.class.owned()).map(|h| h.size).sum();
        a + h
    }

    fn pool_live(&self, p: &Pl) -> (u64, u64) {
        let mut live = 0;
        let mut n = 0;
        for a in &self.allocs {
            if a.pid == p.pid && a.class == Class::Pool {
                let matches = if p.default { a.pool == 0 && a.device as u16 as u64 == p.id } else { a.pool == p.id };
                if matches {
                    live += a.size;
                    n += 1;
                }
            }
        }
        (live, n)
    }

    fn pool_reserve(&self, p: &Pl) -> u64 {
        let live = self.pool_live(p).0;
        match p.sampled {
            Some(r) => r.max(live),
            None => round_up(p.hwm, self.cfg.granularity).max(live),
        }
    }

    /// The arena numbers of process `pid` on `device` as an incident's inputs hold them.
    fn incident_arenas(&self, pid: u32, device: i16) -> Vec<ArenaNumbers> {
        let mut raw: Vec<_> = self.arenas_raw(Some(pid)).into_iter().filter(|a| device < 0 || a.3 == device).collect();
        raw.sort_by_key(|a| (a.1, a.2, a.3 as u16));
        raw.into_iter()
            .map(|a| ArenaNumbers { kind: a.1, base: a.2, free_in_arena: a.6, largest_free_span: a.7 })
            .collect()
    }

    fn res_gaps(&self, r: &R) -> Vec<u64> {
        let mut ms: Vec<(u64, u64)> = self
            .maps
            .iter()
            .filter(|m| m.pid == r.pid && m.addr >= r.base && m.addr < r.base + r.size)
            .map(|m| (m.addr, m.size))
            .collect();
        ms.sort();
        let mut gaps = vec![];
        let mut c = r.base;
        for (a, s) in ms {
            if a > c {
                gaps.push(a - c);
            }
            c = a + s;
        }
        if r.base + r.size > c {
            gaps.push(r.base + r.size - c);
        }
        gaps
    }

    fn seg_gaps(s: &S) -> Vec<u64> {
        let mut gaps = vec![];
        let mut c = s.base;
        for (a, sz) in &s.allocated {
            if *a > c {
                gaps.push(a - c);
            }
            c = a + sz;
        }
        if s.base + s.size > c {
            gaps.push(s.base + s.size - c);
        }
        gaps
    }

    /// (kind, base, device, size, occupied, free, largest, count) for every arena of `pid`.
    fn arenas_raw(&self, pid: Option<u32>) -> Vec<(u32, ArenaKind, u64, i16, u64, u64, u64, u64, u64)> {
        let mut v = vec![];
        for r in self.res.iter().filter(|r| pid.is_none_or(|p| p == r.pid)) {
            let g = self.res_gaps(r);
            let free: u64 = g.iter().sum();
            let n = self.maps.iter().filter(|m| m.pid == r.pid && m.addr >= r.base && m.addr < r.base + r.size).count();
            v.push((
                r.pid,
                ArenaKind::VmmReservation,
                r.base,
                r.device,
                r.size,
                r.size - free,
                free,
                g.iter().copied().max().unwrap_or(0),
                n as u64,
            ));
        }
        for p in self.pools.iter().filter(|p| pid.is_none_or(|x| x == p.pid)) {
            let (live, n) = self.pool_live(p);
            let res = self.pool_reserve(p);
            let base = if p.default { 0 } else { p.id };
            v.push((p.pid, ArenaKind::Pool, base, p.device, res, live, res - live, res - live, n));
        }
        for s in self.segs.iter().filter(|s| pid.is_none_or(|x| x == s.pid)) {
            let g = Self::seg_gaps(s);
            let free: u64 = g.iter().sum();
            v.push((
                s.pid,
                ArenaKind::FrameworkSegment,
                s.base,
                s.device,
                s.size,
                s.size - free,
                free,
                g.iter().copied().max().unwrap_or(0),
                s.allocated.len() as u64,
            ));
        }
        v
    }

    /// What `pid` holds on `device`: (held, releasable, stranded, not visible), by the rule
    /// of `Holder`: pools' idle reserve and wholly free segments are releasable, free bytes
    /// of split segments stranded, a caching framework's bytes with no segments not visible.
    fn held_on(&self, pid: u32, device: i16) -> (u64, u64, u64, u64) {
        let resident: u64 = self
            .allocs
            .iter()
            .filter(|a| a.pid == pid && a.device == device && a.class.resident())
            .map(|a| a.size)
            .chain(
                self.handles
                    .iter()
                    .filter(|h| h.pid == pid && h.device == device && h.class.resident())
                    .map(|h| h.size),
            )
            .fold(0u64, u64::saturating_add);
        let raw = self.arenas_raw(Some(pid));
        let pool_idle: u64 =
            raw.iter().filter(|a| a.1 == ArenaKind::Pool && a.3 == device).map(|a| a.6).fold(0, u64::saturating_add);
        let segs: Vec<_> = raw.iter().filter(|a| a.1 == ArenaKind::FrameworkSegment && a.3 == device).collect();
        let whole: u64 = segs.iter().filter(|a| a.6 == a.4).map(|a| a.4).sum();
        let split: u64 = segs.iter().filter(|a| a.6 != a.4).map(|a| a.6).sum();
        let held = resident.saturating_add(pool_idle);
        let caches = FrameworkId::in_mask(self.cur(pid).map_or(0, |s| self.procs[s].frameworks)).any(|f| f.caches());
        let not_visible = if segs.is_empty() && caches { held - pool_idle } else { 0 };
        let releasable = pool_idle + whole;
        (held.max(releasable + split + not_visible), releasable, split, not_visible)
    }

    /// Other processes' memory on `device` at a failure of `me` (no NVML in these streams).
    fn holders(&self, me: u32, device: i16) -> Vec<Holder> {
        if device < 0 {
            return vec![];
        }
        let mut v = vec![];
        let (mut all, mut count) = (0u64, 1u64);
        for (i, p) in self.procs.iter().enumerate() {
            if !p.alive || self.cur(p.pid) != Some(i) {
                continue;
            }
            let (held, releasable, stranded, not_visible) = self.held_on(p.pid, device);
            all += held;
            if p.pid == me || held == 0 {
                continue;
            }
            count += 1;
            let framework = FrameworkId::in_mask(p.frameworks).find(|f| f.caches());
            v.push(Holder {
                pid: p.pid,
                command: p.command.clone(),
                sight: if segs_on(self, p.pid, device) {
                    HolderSight::Lens
                } else if framework.is_some() {
                    HolderSight::CacheNotVisible
                } else {
                    HolderSight::Driver
                },
                held_bytes: held,
                releasable_bytes: releasable,
                stranded_bytes: stranded,
                not_visible_bytes: not_visible,
                live_bytes: held - releasable - stranded - not_visible,
                framework,
                nvml_bytes: None,
            });
        }
        if let Some(s) = self.samples.iter().find(|s| s.0 == device) {
            let rest = s.1.saturating_sub(s.2).saturating_sub(all).saturating_sub(CONTEXT_ALLOWANCE * count);
            if rest > 0 {
                let unnamed = Holder {
                    held_bytes: rest,
                    live_bytes: rest,
                    sight: HolderSight::UntracedUnnamed,
                    ..Default::default()
                };
                v.push(unnamed);
            }
        }
        v.sort_by_key(|h| (std::cmp::Reverse(h.held_bytes), h.pid));
        v
    }

    fn device_memory(&self, pid: u32) -> Vec<ProcessDeviceMemory> {
        // Every device the process has anything on, in order, once.
        let devices: BTreeSet<i16> = self
            .allocs
            .iter()
            .filter(|a| a.pid == pid)
            .map(|a| a.device)
            .chain(self.handles.iter().filter(|h| h.pid == pid).map(|h| h.device))
            .chain(self.pools.iter().filter(|p| p.pid == pid).map(|p| p.device))
            .chain(self.segs.iter().filter(|s| s.pid == pid).map(|s| s.device))
            .filter(|d| *d >= 0)
            .collect();
        devices
            .into_iter()
            .map(|device| (device, self.held_on(pid, device)))
            .filter(|(_, h)| h.0 > 0)
            .map(|(device, (held, releasable, stranded, not_visible))| ProcessDeviceMemory {
                device,
                held_bytes: held,
                releasable_bytes: releasable,
                stranded_bytes: stranded,
                not_visible_bytes: not_visible,
            })
            .collect()
    }

    fn idle_of(&self, pid: u32, device: i16) -> u64 {
        self.arenas_raw(Some(pid))
            .into_iter()
            .filter(|a| a.1 != ArenaKind::VmmReservation && (device < 0 || a.3 == device))
            .map(|a| a.6)
            .fold(0u64, u64::saturating_add)
    }

    pub fn apply(&mut self, ev: &Event) {
        self.events += 1;
        let Some(kind) = ev.kind() else {
            self.anom(self.cur(ev.pid), Anomaly::UnknownKind);
            return;
        };
        let Some(api) = ev.api() else {
            self.anom(self.cur(ev.pid), Anomaly::UnknownApi);
            return;
        };
        if kind == EventKind::ProcessStart {
            self.now = self.now.max(ev.ts_ns);
            if let Some(s) = self.attach(ev.pid, ev.start_time(), ev.ts_ns, true) {
                if ev.ppid() != 0 {
                    self.procs[s].ppid = ev.ppid();
                }
            }
            return;
        }
        let slot = match self.cur(ev.pid) {
            Some(s) => s,
            None => self.newproc(ev.pid, 0),
        };
        if !self.procs[slot].alive {
            self.anom(Some(slot), Anomaly::EventAfterExit);
            return;
        }
        let p = &mut self.procs[slot];
        let i = match p.thread_ts.iter().position(|(t, _)| *t == ev.tid) {
            Some(i) => i,
            None => {
                p.thread_ts.push((ev.tid, 0));
                p.thread_ts.len() - 1
            }
        };
        let back = ev.ts_ns < p.thread_ts[i].1;
        p.thread_ts[i].1 = p.thread_ts[i].1.max(ev.ts_ns);
        let ts = ev.ts_ns.max(self.procs[slot].last_ts);
        self.procs[slot].last_ts = ts;
        if back {
            self.anom(Some(slot), Anomaly::TimeBackwards);
        }
        self.now = self.now.max(ts);
        self.pre(slot, ev, kind, ts);
        if ev.failed() {
            // A failed sample is no failed call of the program's.
            let sample = matches!(kind, EventKind::MemInfo | EventKind::PoolSample);
            self.procs[slot].failed += u64::from(!sample);
            if !sample && ev.is_oom() {
                self.oom(slot, ev, api, ts);
            }
        } else {
            match kind {
                EventKind::Alloc => self.alloc(slot, ev, api, ts),
                EventKind::Free => self.free(slot, ev),
                EventKind::VmmCreate => self.create(slot, ev, api, ts),
                EventKind::VmmRelease => self.release(slot, ev),
                EventKind::VmmReserve => self.reserve(slot, ev),
                EventKind::VmmAddressFree => self.address_free(slot, ev),
                EventKind::VmmMap => self.map(slot, ev, ts),
                EventKind::VmmUnmap => self.unmap(slot, ev),
                EventKind::PoolCreate => self.pool_create(slot, ev),
                EventKind::PoolDestroy | EventKind::PoolTrim => self.pool_destroy_or_trim(slot, ev, kind),
                EventKind::PoolSample => self.pool_sample(slot, ev),
                EventKind::MemInfo => self.meminfo(slot, ev, ts),
                EventKind::StreamCreate => self.stream_create(ev),
                EventKind::StreamDestroy => self.streams.retain(|s| *s != (ev.pid, ev.stream)),
                EventKind::ProcessExit => {
                    self.close(slot, ts);
                    return;
                }
                EventKind::Dropped => {
                    self.procs[slot].dropped = self.procs[slot].dropped.saturating_add(ev.dropped_count())
                }
                EventKind::Frameworks => self.procs[slot].frameworks |= ev.framework_mask(),
                // Lens records are checked by the model's scenario tests, not generated here.
                EventKind::FrameworkSample | EventKind::FrameworkOom | EventKind::FrameworkSegment => {}
                EventKind::ProcessStart | EventKind::HookMiss => {}
                // NVML samples and lens statistics are checked by the model's scenario tests.
                EventKind::FrameworkStats | EventKind::GpuProcess => {}
            }
        }
        self.settle(slot, ts);
        if let Some(idx) = self.procs[slot].open {
            if self.incidents[idx].view.retries == 0 {
                self.incidents[idx].view.freed_bytes_between =
                    self.procs[slot].freed_total - self.incidents[idx].freed_mark;
            }
        }
        let n = self.cfg.lead_up_events;
        if n > 0 {
            let l = &mut self.procs[slot].lead_up;
            if l.len() >= n {
                l.remove(0);
            }
            l.push(EventRecord::from(ev));
        }
    }

    /// A free: the allocation at its address goes.
    fn free(&mut self, slot: usize, ev: &Event) {
        if ev.addr != 0 {
            match self.allocs.iter().position(|a| a.pid == ev.pid && a.addr == ev.addr) {
                Some(i) => self.remove_alloc(slot, i),
                None => self.anom(Some(slot), Anomaly::FreeUnknown),
            }
        }
    }

    /// A VMM handle released (and gone once unmapped).
    fn release(&mut self, slot: usize, ev: &Event) {
        match self.handles.iter().position(|h| h.pid == ev.pid && h.h == ev.handle()) {
            None => self.anom(Some(slot), Anomaly::ReleaseUnknown),
            Some(i) if self.handles[i].released => self.anom(Some(slot), Anomaly::DoubleRelease),
            Some(i) => {
                self.handles[i].released = true;
                self.gc_handles(slot);
            }
        }
    }

    /// An address range reserved.
    fn reserve(&mut self, slot: usize, ev: &Event) {
        if ev.size == 0 {
            self.anom(Some(slot), Anomaly::ZeroSize)
        } else if ev.addr.checked_add(ev.size).is_none() {
            self.anom(Some(slot), Anomaly::AddressOverflow)
        } else if self.res.iter().any(|r| r.pid == ev.pid && r.base < ev.addr + ev.size && r.base + r.size > ev.addr) {
            self.anom(Some(slot), Anomaly::ReserveOverlap)
        } else {
            self.res.push(R { pid: ev.pid, base: ev.addr, size: ev.size, device: ev.device });
        }
    }

    /// A reserved range given back (not while mapped).
    fn address_free(&mut self, slot: usize, ev: &Event) {
        match self.res.iter().position(|r| r.pid == ev.pid && r.base == ev.addr) {
            None => self.anom(Some(slot), Anomaly::AddressFreeUnknown),
            Some(i) => {
                let r = self.res[i].clone();
                if self.maps.iter().any(|m| m.pid == r.pid && m.addr >= r.base && m.addr < r.base + r.size) {
                    self.anom(Some(slot), Anomaly::AddressFreeWhileMapped)
                } else {
                    self.res.remove(i);
                }
            }
        }
    }

    fn pool_create(&mut self, slot: usize, ev: &Event) {
        if ev.pool() == 0 || self.pools.iter().any(|p| p.pid == ev.pid && !p.default && p.id == ev.pool()) {
            self.anom(Some(slot), Anomaly::PoolDuplicate)
        } else {
            self.pools.push(Pl {
                pid: ev.pid,
                default: false,
                id: ev.pool(),
                device: ev.device,
                hwm: 0,
                destroyed: false,
                sampled: None,
            })
        }
    }

    fn pool_destroy_or_trim(&mut self, slot: usize, ev: &Event, kind: EventKind) {
        match self.resolve_pool(ev) {
            None => self.anom(Some(slot), Anomaly::PoolUnknown),
            Some(i) => {
                let live = self.pool_live(&self.pools[i]).0;
                let p = &mut self.pools[i];
                p.sampled = None;
                if kind == EventKind::PoolDestroy {
                    p.destroyed = true;
                } else {
                    p.hwm = live.max(p.hwm.min(ev.keep_bytes()));
                }
            }
        }
    }

    /// A device sample; the one an open incident awaits completes it.
    fn meminfo(&mut self, slot: usize, ev: &Event, ts: u64) {
        self.samples.retain(|s| s.0 != ev.device);
        self.samples.push((ev.device, ev.total_bytes(), ev.free_bytes(), ts));
        if let Some((idx, tid)) = self.procs[slot].awaiting {
            if tid == ev.tid && self.incidents[idx].view.device == ev.device {
                self.procs[slot].awaiting = None;
                let inc = &mut self.incidents[idx];
                inc.inputs.device_free = Some(ev.free_bytes());
                inc.inputs.device_total = Some(ev.total_bytes());
                inc.view.device_free_bytes = Some(ev.free_bytes());
                inc.view.device_total_bytes = Some(ev.total_bytes());
                inc.view.sample_ts_ns = Some(ts);
                inc.view.sample_after_failure = true;
                let (v, r) = decide_verdict(&inc.inputs);
                inc.view.verdict = v;
                inc.view.unknown_reason = r;
            }
        }
    }

    fn stream_create(&mut self, ev: &Event) {
        if ev.stream != 0 && !self.streams.contains(&(ev.pid, ev.stream)) {
            self.streams.push((ev.pid, ev.stream));
            let live = self.streams.iter().filter(|s| s.0 == ev.pid).count() as u64;
            let peak = self.stream_peaks.entry(ev.pid).or_default();
            *peak = (*peak).max(live);
        }
    }

    /// After every event: pool high-water marks, destroyed pools, peak.
    fn settle(&mut self, slot: usize, ts: u64) {
        for i in 0..self.pools.len() {
            let (live, _) = self.pool_live(&self.pools[i]);
            let p = &mut self.pools[i];
            if p.destroyed {
                p.hwm = live;
            } else {
                p.hwm = p.hwm.max(live);
            }
        }
        let keep: Vec<bool> = self.pools.iter().map(|p| !(p.destroyed && self.pool_live(p).1 == 0)).collect();
        let mut it = keep.into_iter();
        self.pools.retain(|_| it.next().unwrap());
        let live = self.live_of(self.procs[slot].pid);
        let p = &mut self.procs[slot];
        if live > p.peak {
            p.peak = live;
            p.peak_ts = ts;
        }
    }

    /// A pool sample: the current pool's goes to the device's default pool if there is one,
    /// else to an explicit pool of that handle; one for no known pool adds one when it holds
    /// bytes. While the same thread's OOM awaits its device sample, the incident's idle
    /// bytes and arenas are taken again.
    /// The index of pool (`pid`, `default`, `id`), added empty when it is not known yet.
    fn pool_or_new(&mut self, pid: u32, default: bool, id: u64, device: i16) -> usize {
        if let Some(i) = self.pools.iter().position(|p| p.pid == pid && p.default == default && p.id == id) {
            return i;
        }
        self.pools.push(Pl { pid, default, id, device, hwm: 0, destroyed: false, sampled: None });
        self.pools.len() - 1
    }

    fn pool_sample(&mut self, slot: usize, ev: &Event) {
        if ev.pool_reserved() > 1 << 50 {
            return self.anom(Some(slot), Anomaly::PoolSampleImplausible);
        }
        let dev_id = ev.device as u16 as u64;
        let find = |default: bool, id: u64| {
            self.pools.iter().position(|p| p.pid == ev.pid && p.default == default && p.id == id)
        };
        let (default_pool, explicit_pool) = (find(true, dev_id), find(false, ev.pool()).filter(|_| ev.pool() != 0));
        let i = if let (true, Some(i)) = (ev.pool_is_current(), default_pool) {
            Some(i)
        } else if explicit_pool.is_some() {
            explicit_pool
        } else if ev.pool_reserved() == 0 {
            None
        } else {
            let (default, id) =
                if ev.pool_is_current() || ev.pool() == 0 { (true, dev_id) } else { (false, ev.pool()) };
            Some(self.pool_or_new(ev.pid, default, id, ev.device))
        };
        let Some(i) = i else { return };
        self.pools[i].sampled = Some(ev.pool_reserved());
        if let Some((idx, tid)) = self.procs[slot].awaiting {
            if tid == ev.tid && self.incidents[idx].view.device == ev.device {
                let own = self.idle_of(ev.pid, ev.device);
                let arenas = self.incident_arenas(ev.pid, ev.device);
                let inc = &mut self.incidents[idx];
                inc.view.own_idle_bytes = own;
                inc.view.arena_free_bytes = arenas.iter().map(|a| a.free_in_arena).fold(0u64, u64::saturating_add);
                inc.view.arena_largest_free_span = arenas.iter().map(|a| a.largest_free_span).max().unwrap_or(0);
                inc.inputs.own_idle = own;
                inc.inputs.arenas = arenas;
                let (v, r) = decide_verdict(&inc.inputs);
                inc.view.verdict = v;
                inc.view.unknown_reason = r;
            }
        }
    }

    fn resolve_pool(&self, ev: &Event) -> Option<usize> {
        self.pools
            .iter()
            .position(|p| p.pid == ev.pid && !p.default && p.id == ev.pool())
            .or_else(|| self.pools.iter().position(|p| p.pid == ev.pid && p.default && p.id == ev.device as u16 as u64))
    }

    /// `new_image`: a new image after exec (same pid and start time) starts afresh.
    fn attach(&mut self, pid: u32, st: u64, ts: u64, new_image: bool) -> Option<usize> {
        match self.cur(pid) {
            None => Some(self.newproc(pid, st)),
            Some(s) => {
                let p = &self.procs[s];
                if p.st == st || st == 0 {
                    if !p.alive && new_image && st != 0 {
                        return Some(self.newproc(pid, st));
                    }
                    if !p.alive {
                        self.anom(Some(s), Anomaly::EventAfterExit);
                        return None;
                    }
                    Some(s)
                } else if p.st == 0 && p.alive {
                    self.procs[s].st = st;
                    Some(s)
                } else {
                    if p.alive {
                        self.close(s, ts);
                    }
                    Some(self.newproc(pid, st))
                }
            }
        }
    }

    pub fn process_info(&mut self, info: &ProcessInfo) {
        // The newest process of that pid and start time, if it is alive; else attach one.
        let mut found = None;
        if info.start_time != 0 {
            for s in (0..self.procs.len()).rev() {
                if self.procs[s].pid == info.pid && self.procs[s].st == info.start_time {
                    found = Some(s).filter(|s| self.procs[*s].alive);
                    break;
                }
            }
        }
        let Some(s) = found.or_else(|| self.attach(info.pid, info.start_time, self.now, true)) else { return };
        let words: Vec<&str> = info.cmdline.iter().map(String::as_str).collect();
        self.procs[s].command = words.join(" ");
        self.procs[s].exe = info.exe.clone();
        if info.ppid > 0 {
            self.procs[s].ppid = info.ppid;
        }
    }

    pub fn process_exit(&mut self, pid: u32, st: u64, status: Option<i32>, ts: u64) {
        let slot = match self.procs.iter().rposition(|p| p.pid == pid && (st == 0 || p.st == st)) {
            Some(s) => s,
            None => match self.cur(pid) {
                Some(s) if self.procs[s].st == 0 && self.procs[s].alive => {
                    self.procs[s].st = st;
                    s
                }
                _ => return,
            },
        };
        self.now = self.now.max(ts);
        if self.procs[slot].alive {
            let t = ts.max(self.procs[slot].last_ts);
            self.close(slot, t);
        }
        if status.is_some() {
            self.procs[slot].exit_status = status;
        }
    }

    fn close(&mut self, slot: usize, ts: u64) {
        let pid = self.procs[slot].pid;
        // Incidents still open at exit: the request was never served.
        for inc in self.incidents.iter_mut().filter(|i| i.view.pid == pid && i.view.outcome == Outcome::Open) {
            inc.view.outcome = Outcome::Failed;
        }
        self.allocs.retain(|a| a.pid != pid);
        self.handles.retain(|a| a.pid != pid);
        self.res.retain(|a| a.pid != pid);
        self.maps.retain(|a| a.pid != pid);
        self.pools.retain(|a| a.pid != pid);
        self.streams.retain(|s| s.0 != pid);
        self.stream_peaks.remove(&pid);
        self.segs.retain(|a| a.pid != pid);
        let p = &mut self.procs[slot];
        p.alive = false;
        p.exit_ts = Some(ts);
        p.open = None;
        p.awaiting = None;
    }

    fn alloc(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        let Some(class) = api.mem_class() else {
            return self.anom(Some(slot), Anomaly::AllocUnknownApi);
        };
        if class == Class::Vmm || class == Class::Import {
            return self.create(slot, ev, api, ts);
        }
        if ev.addr == 0 {
            return self.anom(Some(slot), Anomaly::AllocNull);
        }
        if let Some(i) = self.allocs.iter().position(|a| a.pid == ev.pid && a.addr == ev.addr) {
            self.anom(Some(slot), Anomaly::AllocOverLive);
            self.remove_alloc(slot, i);
        }
        let pool = ev.pool();
        if class == Class::Pool {
            let (default, id) = if pool == 0 { (true, ev.device as u16 as u64) } else { (false, pool) };
            self.pool_or_new(ev.pid, default, id, ev.device);
        }
        self.allocs.push(A { pid: ev.pid, addr: ev.addr, size: ev.size, ts, pool, device: ev.device, class });
        self.procs[slot].allocations += 1;
        // hwm for the pool is updated in settle(); a pool's hwm is a max over time, so a
        // per-event update equals the model's per-alloc update.
    }

    fn remove_alloc(&mut self, slot: usize, i: usize) {
        let a = self.allocs.remove(i);
        self.procs[slot].frees += 1;
        self.procs[slot].freed_total += a.size;
        if a.class == Class::Pool {
            // a destroyed pool's hwm follows live; emulate the model's per-free update
            let (default, id) = if a.pool == 0 { (true, a.device as u16 as u64) } else { (false, a.pool) };
            if let Some(pi) = self.pools.iter().position(|p| p.pid == a.pid && p.default == default && p.id == id) {
                let (live, n) = self.pool_live(&self.pools[pi]);
                if self.pools[pi].destroyed {
                    self.pools[pi].hwm = live;
                    if n == 0 {
                        self.pools.remove(pi);
                    }
                }
            }
        }
        if let Some(si) = self.segs.iter().position(|s| s.pid == a.pid && s.base == a.addr) {
            self.segs.remove(si);
        }
    }

    fn create(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        let class = if api == Api::cuMemImportFromShareableHandle { Class::Import } else { Class::Vmm };
        if self.handles.iter().any(|h| h.pid == ev.pid && h.h == ev.handle()) {
            return self.anom(Some(slot), Anomaly::VmmCreateDuplicate);
        }
        self.handles.push(H {
            pid: ev.pid,
            h: ev.handle(),
            size: ev.size,
            ts,
            device: ev.device,
            class,
            released: false,
        });
        self.procs[slot].allocations += 1;
    }

    fn gc_handles(&mut self, slot: usize) {
        let mut i = 0;
        while i < self.handles.len() {
            let h = &self.handles[i];
            if h.released && !self.maps.iter().any(|m| m.pid == h.pid && m.h == h.h) {
                let h = self.handles.remove(i);
                self.procs[slot].frees += 1;
                self.procs[slot].freed_total += h.size;
            } else {
                i += 1;
            }
        }
    }

    fn res_at(&self, pid: u32, addr: u64) -> Option<R> {
        self.res.iter().find(|r| r.pid == pid && r.base <= addr && addr < r.base + r.size).cloned()
    }

    fn map(&mut self, slot: usize, ev: &Event, ts: u64) {
        if ev.size == 0 {
            return self.anom(Some(slot), Anomaly::ZeroSize);
        }
        let Some(end) = ev.addr.checked_add(ev.size) else {
            return self.anom(Some(slot), Anomaly::AddressOverflow);
        };
        let handle_device = match self.handles.iter().find(|h| h.pid == ev.pid && h.h == ev.handle()) {
            None => return self.anom(Some(slot), Anomaly::MapUnknownHandle),
            Some(h) if h.released => return self.anom(Some(slot), Anomaly::MapReleasedHandle),
            Some(h) => h.device,
        };
        let Some(r) = self.res_at(ev.pid, ev.addr) else {
            return self.anom(Some(slot), Anomaly::MapOutsideReservation);
        };
        if end > r.base + r.size {
            return self.anom(Some(slot), Anomaly::MapOutsideReservation);
        }
        if self.maps.iter().any(|m| m.pid == ev.pid && m.addr < end && m.addr + m.size > ev.addr) {
            return self.anom(Some(slot), Anomaly::MapOverlap);
        }
        self.maps.push(M { pid: ev.pid, addr: ev.addr, size: ev.size, h: ev.handle(), offset: ev.map_offset(), ts });
        // A reservation with no device takes that of the first handle mapped into it.
        if let Some(res) = self.res.iter_mut().find(|x| x.pid == r.pid && x.base == r.base) {
            if res.device < 0 && handle_device >= 0 {
                res.device = handle_device;
            }
        }
    }

    fn unmap(&mut self, slot: usize, ev: &Event) {
        if ev.size == 0 {
            return self.anom(Some(slot), Anomaly::ZeroSize);
        }
        let Some(r) = self.res_at(ev.pid, ev.addr) else {
            return self.anom(Some(slot), Anomaly::UnmapNothing);
        };
        let a = ev.addr;
        let e = ev.addr.saturating_add(ev.size).min(r.base + r.size);
        let hit: Vec<usize> = (0..self.maps.len())
            .filter(|i| {
                let m = &self.maps[*i];
                m.pid == ev.pid && m.addr < e && m.addr + m.size > a
            })
            .collect();
        if hit.is_empty() {
            return self.anom(Some(slot), Anomaly::UnmapNothing);
        }
        let mut new = vec![];
        for i in hit.iter().rev() {
            let m = self.maps.remove(*i);
            let me = m.addr + m.size;
            if m.addr < a {
                new.push(M { size: a - m.addr, ..m.clone() });
            }
            if e < me {
                new.push(M { addr: e, size: me - e, offset: m.offset + (e - m.addr), ..m.clone() });
            }
        }
        self.maps.extend(new);
        self.gc_handles(slot);
    }

    pub fn framework_segment(&mut self, pid: u32, device: i16, base: u64, size: u64, blocks: &[Block], _ts: u64) {
        let slot = match self.cur(pid) {
            Some(s) => s,
            None => self.newproc(pid, 0),
        };
        self.segs.retain(|s| !(s.pid == pid && s.base == base));
        if size == 0 || !self.procs[slot].alive {
            return;
        }
        let Some(end) = base.checked_add(size) else {
            return self.anom(Some(slot), Anomaly::AddressOverflow);
        };
        let mut al: Vec<(u64, u64)> =
            blocks.iter().filter(|b| b.allocated && b.size > 0).map(|b| (b.addr, b.size)).collect();
        al.sort();
        // In address order, a block is kept when it starts at or past the end of the last one
        // kept and ends inside the segment; any other makes the segment bad.
        let mut kept: Vec<(u64, u64)> = vec![];
        for &(a, s) in &al {
            let free_from = kept.last().map_or(base, |&(ka, ks)| ka + ks);
            if a >= free_from && a.saturating_add(s) <= end {
                kept.push((a, s));
            }
        }
        if kept.len() < al.len() {
            self.anom(Some(slot), Anomaly::BadSegment);
        }
        self.segs.push(S { pid, base, size, device, allocated: kept });
    }

    // ---- incidents (same rules, brute-force inputs) ----

    fn pre(&mut self, slot: usize, ev: &Event, kind: EventKind, ts: u64) {
        if kind == EventKind::PoolSample {
            return; // the interposer's sample, not a call of the program
        }
        if let Some((_, tid)) = self.procs[slot].awaiting {
            if tid == ev.tid && kind != EventKind::MemInfo {
                self.procs[slot].awaiting = None;
            }
        }
        if let Some(idx) = self.procs[slot].open {
            let freed = self.procs[slot].freed_total;
            if matches!(kind, EventKind::FrameworkOom | EventKind::FrameworkSegment | EventKind::FrameworkSample) {
                return; // a lens's record: the framework's account, not the program moving on
            }
            let inc = &mut self.incidents[idx];
            const GIVE_BACK: [EventKind; 6] = [
                EventKind::Free,
                EventKind::VmmRelease,
                EventKind::VmmUnmap,
                EventKind::VmmAddressFree,
                EventKind::PoolTrim,
                EventKind::PoolDestroy,
            ];
            let gives_back = GIVE_BACK.contains(&kind) && !ev.failed();
            if !gives_back {
                inc.events_since += 1; // memory given back before a retry is part of it
            }
            if inc.events_since > self.cfg.incident_window_events
                || ts.saturating_sub(inc.view.ts_ns) > self.cfg.incident_window_ns
            {
                if inc.view.outcome == Outcome::Open {
                    inc.view.outcome = Outcome::Failed; // moved on without the bytes
                }
                self.procs[slot].open = None;
                return;
            }
            if matches!(kind, EventKind::Alloc | EventKind::VmmCreate)
                && ev.size == inc.view.requested_bytes
                && ev.api == inc.view.api.code()
            {
                inc.view.retries += 1;
                inc.view.freed_bytes_between = freed - inc.freed_mark;
                if ev.failed() {
                    inc.view.failures += 1;
                    inc.view.outcome = Outcome::FailedAgain;
                } else {
                    inc.view.outcome = Outcome::Recovered;
                    self.procs[slot].open = None;
                }
            } else if kind != EventKind::MemInfo && ev.is_oom() {
                if inc.view.outcome == Outcome::Open {
                    inc.view.outcome = Outcome::Failed;
                }
                self.procs[slot].open = None; // another request failed: a new incident
            }
        }
    }

    fn oom(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        self.procs[slot].oom += 1;
        if self.procs[slot].open.is_some() {
            return;
        }
        let pid = ev.pid;
        let own = self.idle_of(pid, ev.device);
        let others: Vec<u32> = self.procs.iter().filter(|p| p.alive && p.pid != pid).map(|p| p.pid).collect();
        let other: u64 = others.iter().map(|p| self.idle_of(*p, ev.device)).fold(0u64, u64::saturating_add);
        let arenas = self.incident_arenas(pid, ev.device);
        let sample = self.samples.iter().find(|s| s.0 == ev.device).copied();
        let on_dev = |d: i16| ev.device < 0 || d == ev.device;
        let framework_held: u64 = self
            .allocs
            .iter()
            .filter(|a| a.pid == pid && on_dev(a.device) && a.class.resident())
            .map(|a| a.size)
            .chain(
                self.handles.iter().filter(|h| h.pid == pid && on_dev(h.device) && h.class.resident()).map(|h| h.size),
            )
            .sum();
        let segs: Vec<_> = self
            .arenas_raw(Some(pid))
            .into_iter()
            .filter(|a| a.1 == ArenaKind::FrameworkSegment && on_dev(a.3))
            .collect();
        let inputs = VerdictInputs {
            requested: ev.size,
            granularity: self.cfg.granularity,
            device_free: sample.map(|s| s.2),
            device_total: sample.map(|s| s.1),
            own_idle: own,
            other_idle: other,
            arenas,
            framework: FrameworkId::in_mask(self.procs[slot].frameworks).find(|f| f.caches()),
            framework_held,
            cache_free: segs.iter().map(|a| a.6).sum(),
            cache_largest_free: segs.iter().map(|a| a.7).max().unwrap_or(0),
            cache_segments: segs.len() as u64,
            cache_reserved: segs.iter().map(|a| a.4).sum(),
            cache_pieces: self
                .segs
                .iter()
                .filter(|s| s.pid == pid && on_dev(s.device))
                .map(|s| Self::seg_gaps(s).iter().filter(|g| **g > 0).count() as u64)
                .sum(),
            cache_with_free: segs.iter().filter(|a| a.6 > 0).count() as u64,
            lens: None,
            lens_sample: None,
            recovered: false,
            holders: self.holders(pid, ev.device),
            framework_limit: None,
            unjudged: false,
        };
        let (verdict, reason) = decide_verdict(&inputs);
        let p = &self.procs[slot];
        let view = OomIncident {
            id: self.incidents.len() as u64 + 1,
            pid,
            start_time: p.st,
            command: p.command.clone(),
            device: ev.device,
            ts_ns: ts,
            api,
            caller: ev.caller().map(Caller::name).unwrap_or("").into(),
            requested_bytes: ev.size,
            device_free_bytes: inputs.device_free,
            device_total_bytes: inputs.device_total,
            sample_ts_ns: sample.map(|s| s.3),
            sample_after_failure: false,
            verdict,
            unknown_reason: reason,
            fix: String::new(),
            explanation: String::new(),
            failures: 1,
            retries: 0,
            freed_bytes_between: 0,
            outcome: Outcome::Open,
            lead_up: p.lead_up.clone(),
            own_idle_bytes: own,
            other_idle_bytes: other,
            arena_free_bytes: inputs.arenas.iter().map(|a| a.free_in_arena).fold(0u64, u64::saturating_add),
            arena_largest_free_span: inputs.arenas.iter().map(|a| a.largest_free_span).max().unwrap_or(0),
            framework: inputs.framework,
            framework_oom: None,
            cache_fragmentation: (inputs.cache_segments > 0)
                .then(|| fragmentation(inputs.cache_largest_free, inputs.cache_free)),
            holders: inputs.holders.clone(),
            framework_limit: None,
        };
        self.incidents.push(I { view, inputs, freed_mark: p.freed_total, events_since: 0 });
        let idx = self.incidents.len() - 1;
        self.procs[slot].open = Some(idx);
        self.procs[slot].awaiting = Some((idx, ev.tid));
    }

    // ---- queries ----

    pub fn snapshot(&self) -> ModelSnapshot {
        let g = self.cfg.granularity;
        let processes = self.procs.iter().enumerate().map(|(i, p)| self.process_view(i, p)).collect();
        let devices = self.device_views();
        let arenas = self.arena_views();
        let _ = g;
        ModelSnapshot {
            now_ns: self.now,
            events: self.events,
            devices,
            processes,
            arenas,
            incidents: self.incidents.iter().map(|i| i.view.clone()).collect(),
            anomalies: self.anomalies.clone(),
        }
    }

    /// One process as the model shows it (an exited one keeps only its counts).
    fn process_view(&self, i: usize, p: &P) -> ProcessView {
        let current = p.alive && self.cur(p.pid) == Some(i);
        let mine_a: Vec<&A> = if p.alive { self.allocs.iter().filter(|a| a.pid == p.pid).collect() } else { vec![] };
        let mine_h: Vec<&H> = if p.alive { self.handles.iter().filter(|h| h.pid == p.pid).collect() } else { vec![] };
        let mut by = [0u64; 8];
        for a in &mine_a {
            by[a.class.index()] += a.size;
        }
        for h in &mine_h {
            by[h.class.index()] += h.size;
        }
        let live: u64 = Class::ALL.iter().filter(|c| c.owned()).map(|c| by[c.index()]).sum();
        let mut devs: BTreeMap<i16, u64> = BTreeMap::new();
        for a in mine_a.iter().filter(|a| a.class.owned()) {
            *devs.entry(a.device).or_default() += a.size;
        }
        for h in mine_h.iter().filter(|h| h.class.owned()) {
            *devs.entry(h.device).or_default() += h.size;
        }
        let arenas = if p.alive { self.arenas_raw(Some(p.pid)) } else { vec![] };
        let free: u64 = arenas.iter().map(|a| a.6).fold(0u64, u64::saturating_add);
        let largest = arenas.iter().map(|a| a.7).max().unwrap_or(0);
        let pool_res: u64 = self
            .pools
            .iter()
            .filter(|x| current && x.pid == p.pid)
            .map(|x| self.pool_reserve(x))
            .fold(0u64, u64::saturating_add);
        let pool_idle: u64 = self
            .pools
            .iter()
            .filter(|x| current && x.pid == p.pid)
            .map(|x| self.pool_reserve(x) - self.pool_live(x).0)
            .fold(0u64, u64::saturating_add);
        let idle: u64 = if current { self.idle_of(p.pid, -1) } else { 0 };
        let mut sh = Histogram::new(&self.cfg.size_buckets);
        let mut ah = Histogram::new(&self.cfg.age_buckets_ns);
        if current {
            for (s, t) in mine_a.iter().map(|a| (a.size, a.ts)).chain(mine_h.iter().map(|h| (h.size, h.ts))) {
                sh.add(s);
                ah.add(self.now.saturating_sub(t));
            }
        }
        ProcessView {
            pid: p.pid,
            start_time: p.st,
            ppid: p.ppid,
            command: p.command.clone(),
            exe: p.exe.clone(),
            alive: p.alive,
            exit_status: p.exit_status,
            exit_ts_ns: p.exit_ts,
            incomplete: p.dropped > 0,
            live_bytes: live,
            live_by_class: ClassBytes::from_array(&by),
            live_allocations: (mine_a.len() + mine_h.len()) as u64,
            peak_bytes: p.peak,
            peak_ts_ns: p.peak_ts,
            allocations: p.allocations,
            frees: p.frees,
            failed_calls: p.failed,
            oom_count: p.oom,
            dropped_events: p.dropped,
            anomalies: p.anomalies,
            idle_bytes: idle,
            pool_reserve_bytes: pool_res,
            held_bytes: live.saturating_add(pool_idle),
            streams: self.streams.iter().filter(|s| current && s.0 == p.pid).count() as u64,
            streams_peak: if current { self.stream_peaks.get(&p.pid).copied().unwrap_or(0) } else { 0 },
            stream_bytes: if current { self.stream_peaks.get(&p.pid).copied().unwrap_or(0) } else { 0 }
                * self.cfg.stream_bytes,
            largest_free_span: largest,
            free_in_arenas: free,
            fragmentation: fragmentation(largest, free),
            devices: devs
                .into_iter()
                .filter(|d| d.1 > 0)
                .map(|(device, live_bytes)| DeviceBytes { device, live_bytes })
                .collect(),
            size_histogram: sh,
            age_histogram: ah,
            traced_since_ns: None,
            frameworks: FrameworkId::in_mask(p.frameworks).collect(),
            framework_caches: Vec::new(),
            device_memory: if current { self.device_memory(p.pid) } else { vec![] },
            // The fit (issue 30) is left out of the comparison: see `blank` in model/tests/prop.rs.
            fit: vec![],
        }
    }

    /// Every device sampled or holding traced bytes.
    fn device_views(&self) -> Vec<DeviceView> {
        let mut resident: BTreeMap<i16, u64> = BTreeMap::new();
        for a in self.allocs.iter().filter(|a| a.class.resident()) {
            *resident.entry(a.device).or_default() += a.size;
        }
        for h in self.handles.iter().filter(|h| h.class.resident()) {
            *resident.entry(h.device).or_default() += h.size;
        }
        let mut pidle: BTreeMap<i16, u64> = BTreeMap::new();
        for p in &self.pools {
            let e = pidle.entry(p.device).or_default();
            *e = e.saturating_add(self.pool_reserve(p) - self.pool_live(p).0);
        }
        let mut ords: Vec<i16> = self.samples.iter().map(|s| s.0).collect();
        ords.extend(resident.iter().filter(|x| *x.1 > 0).map(|x| *x.0));
        ords.extend(pidle.iter().filter(|x| *x.1 > 0).map(|x| *x.0));
        ords.sort();
        ords.dedup();
        ords.into_iter()
            .map(|o| {
                let s = self.samples.iter().find(|s| s.0 == o);
                let pi = pidle.get(&o).copied().unwrap_or(0);
                let traced = resident.get(&o).copied().unwrap_or(0).saturating_add(pi);
                DeviceView {
                    ordinal: o,
                    total: s.map(|s| s.1),
                    free: s.map(|s| s.2),
                    sample_ts_ns: s.map(|s| s.3),
                    sample_stale: s.is_some_and(|s| self.now.saturating_sub(s.3) > self.cfg.stale_sample_ns),
                    traced_bytes: traced,
                    pool_idle_bytes: pi,
                    untraced_bytes: s.map(|s| s.1.saturating_sub(s.2).saturating_sub(traced)),
                }
            })
            .collect()
    }

    fn arena_views(&self) -> Vec<ArenaView> {
        let mut arenas: Vec<ArenaView> = self
            .arenas_raw(None)
            .into_iter()
            .map(|a| ArenaView {
                pid: a.0,
                start_time: self.cur(a.0).map(|s| self.procs[s].st).unwrap_or(0),
                device: a.3,
                kind: a.1,
                base: a.2,
                size: a.4,
                occupied: a.5,
                free_in_arena: a.6,
                largest_free_span: a.7,
                fragmentation: if a.1 == ArenaKind::Pool { 0.0 } else { fragmentation(a.7, a.6) },
                live_allocations: a.8,
            })
            .collect();
        arenas.sort_by_key(|a| (a.pid, a.kind, a.base, a.device));
        arenas
    }

    pub fn layout(&self, pid: Option<u32>) -> Vec<LayoutEntry> {
        let mut v: Vec<LayoutEntry> = self
            .allocs
            .iter()
            .filter(|a| pid.is_none_or(|p| p == a.pid) && a.class != Class::Array)
            .map(|a| LayoutEntry {
                addr: a.addr,
                size: a.size,
                class: a.class,
                pid: a.pid,
                device: a.device,
                ts_ns: a.ts,
                reservation: None,
                handle: None,
            })
            .collect();
        for m in self.maps.iter().filter(|m| pid.is_none_or(|p| p == m.pid)) {
            let r = self.res_at(m.pid, m.addr).expect("mapping inside a reservation");
            let class =
                self.handles.iter().find(|h| h.pid == m.pid && h.h == m.h).map(|h| h.class).unwrap_or(Class::Vmm);
            v.push(LayoutEntry {
                addr: m.addr,
                size: m.size,
                class,
                pid: m.pid,
                device: r.device,
                ts_ns: m.ts,
                reservation: Some(r.base),
                handle: Some(m.h),
            });
        }
        v.sort_by_key(|e| (e.addr, e.pid));
        v
    }

    /// Brute-force largest span of one process: scan every gap of every arena.
    pub fn largest_free_span(&self, pid: u32) -> u64 {
        self.arenas_raw(Some(pid)).iter().map(|a| a.7).max().unwrap_or(0)
    }
}

fn segs_on(r: &Reference, pid: u32, device: i16) -> bool {
    r.segs.iter().any(|s| s.pid == pid && s.device == device)
}
