//! The state machine: `apply` and the queries.

use crate::addr_map::{AddrMap, Alloc, EXPLICIT_POOL};
use crate::types::*;
use crate::verdict::{decide_verdict, explain, ExplainCtx};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use vramhook_protocol::{Api, Caller, Event, EventKind, ProcessInfo};

/// A fast hasher for integer keys (multiply-rotate, finished with murmur3's mixer so that
/// aligned addresses spread over the table's low bits).
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Serialises events as [`EventRecord`]s (the protocol's `Event` has no serde).
mod events_as_records {
    use crate::types::EventRecord;
    use serde::{Deserialize, Deserializer, Serializer};
    use vramhook_protocol::Event;

    pub fn serialize<S: Serializer>(v: &[Event], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(EventRecord::from))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Event>, D::Error> {
        Ok(Vec::<EventRecord>::deserialize(d)?.iter().map(Event::from).collect())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Handle {
    size: u64,
    ts: u64,
    device: i16,
    class: u8,
    released: bool,
    maps: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Mapping {
    size: u64,
    handle: u64,
    offset: u64,
    ts: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Gaps {
    sizes: BTreeMap<u64, u32>,
    total: u64,
}

impl Gaps {
    fn add(&mut self, s: u64) {
        if s > 0 {
            *self.sizes.entry(s).or_insert(0) += 1;
            self.total += s;
        }
    }
    fn remove(&mut self, s: u64) {
        if s == 0 {
            return;
        }
        if let Some(c) = self.sizes.get_mut(&s) {
            *c -= 1;
            if *c == 0 {
                self.sizes.remove(&s);
            }
            self.total = self.total.saturating_sub(s);
        }
    }
    /// O(log n): the largest key of the multiset.
    pub(crate) fn largest(&self) -> u64 {
        self.sizes.last_key_value().map(|(k, _)| *k).unwrap_or(0)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Reservation {
    size: u64,
    device: i16,
    mappings: BTreeMap<u64, Mapping>,
    mapped: u64,
    gaps: Gaps,
}

impl Reservation {
    fn numbers(&self) -> (u64, u64) {
        (self.gaps.total, self.gaps.largest())
    }

    /// Marks [s, e) free; it must not overlap a mapping.
    fn free_interval(&mut self, base: u64, s: u64, e: u64) {
        let left = self.mappings.range(..s).next_back().map(|(a, m)| a + m.size).unwrap_or(base);
        let right = self.mappings.range(e..).next().map(|(a, _)| *a).unwrap_or(base + self.size);
        if left < s {
            self.gaps.remove(s - left);
        }
        if right > e {
            self.gaps.remove(right - e);
        }
        self.gaps.add(right - left);
    }

    /// Marks [s, e) occupied; it must lie inside one gap (checked by the caller).
    fn occupy_interval(&mut self, base: u64, s: u64, e: u64) {
        let left = self.mappings.range(..s).next_back().map(|(a, m)| a + m.size).unwrap_or(base);
        let right = self.mappings.range(e..).next().map(|(a, _)| *a).unwrap_or(base + self.size);
        self.gaps.remove(right - left);
        self.gaps.add(s - left);
        self.gaps.add(right - e);
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Pool {
    device: i16,
    live: u64,
    count: u64,
    /// High-water live bytes since the last trim (the reserve estimate before rounding).
    hwm: u64,
    destroyed: bool,
}

impl Pool {
    fn reserve(&self, g: u64) -> u64 {
        round_up(self.hwm, g).max(self.live)
    }
    fn numbers(&self, g: u64) -> (u64, u64) {
        let idle = self.reserve(g) - self.live;
        (idle, idle)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Segment {
    size: u64,
    device: i16,
    ts: u64,
    allocated: u64,
    blocks: u64,
    gaps: Gaps,
}

impl Segment {
    fn numbers(&self) -> (u64, u64) {
        (self.gaps.total, self.gaps.largest())
    }
}

/// Pool key: (pid, is_default, handle or device ordinal).
type PoolKey = (u32, bool, u64);

#[derive(Clone, Debug, Serialize, Deserialize)]
struct DevBytes {
    device: i16,
    live: u64,
    resident: u64,
    /// Highest `live` so far (kept after exit).
    peak: u64,
    /// Index in `Model::device_live` (`u32::MAX` until known).
    total: u32,
}

/// All processes' live bytes on one device.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct DeviceLive {
    device: i16,
    live: u64,
    peak: u64,
    extremes: Extremes,
}

/// A total's lowest and highest value since it was last taken (starting from its value
/// then) and the time of the first change: lets a caller plot a total exactly at its own
/// pace (the analyzer's timeline buckets) without following every event. One compare per
/// change: a total that grew can only have a new highest value, one that shrank a new
/// lowest.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Extremes {
    /// `u64::MAX`: no change since the take.
    since: u64,
    min: u64,
    max: u64,
}

impl Extremes {
    const UNCHANGED: Extremes = Extremes { since: u64::MAX, min: 0, max: 0 };

    #[inline]
    fn grew(&mut self, value: u64, ts: u64) {
        self.max = self.max.max(value);
        self.since = self.since.min(ts);
    }

    #[inline]
    fn shrank(&mut self, value: u64, ts: u64) {
        self.min = self.min.min(value);
        self.since = self.since.min(ts);
    }

    fn take(&mut self, value: u64) -> Option<Window> {
        let w = (self.since != u64::MAX).then_some(Window { since_ns: self.since, min: self.min, max: self.max });
        *self = Extremes { since: u64::MAX, min: value, max: value };
        w
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Process {
    pid: u32,
    start_time: u64,
    ppid: u32,
    command: String,
    exe: String,
    alive: bool,
    exit_status: Option<i32>,
    exit_ts: Option<u64>,
    by_class: [u64; 8],
    live_bytes: u64,
    live_allocations: u64,
    peak_bytes: u64,
    peak_ts: u64,
    allocations: u64,
    frees: u64,
    failed_calls: u64,
    oom_count: u64,
    dropped_events: u64,
    anomalies: u64,
    devices: Vec<DevBytes>,
    last_ts: u64,
    /// Latest time seen per thread: time may only go backwards across threads (they
    /// reach the ring concurrently), never within one. The last thread's entry is kept
    /// apart (`cur_tid`), so a run of one thread's events costs no map lookup.
    thread_ts: FastMap<u32, u64>,
    cur_tid: (u32, u64),
    /// The last events, as they came (a plain copy per event); records when serialised.
    #[serde(with = "events_as_records")]
    lead_up: Vec<Event>,
    lead_head: usize,
    freed_total: u64,
    open_incident: Option<usize>,
    awaiting_sample: Option<(usize, u32)>,
    arena_spans: BTreeMap<u64, u32>,
    free_in_arenas: u64,
    /// Of `live_bytes`.
    extremes: Extremes,
    /// eBPF mode: traced only from this time (the probes' attach); earlier allocations
    /// are unknown. Not in checkpoints: a restarted agent attaches again.
    #[serde(skip)]
    traced_since: Option<u64>,
}

impl DevBytes {
    /// Carries a change of this process's bytes here into the device's total.
    #[inline(always)]
    fn count_in_total(&mut self, totals: &mut Vec<DeviceLive>, grew: bool, size: u64, ts: u64) {
        // Indices are only ever set here (and checked on restore).
        let t = match totals.get(self.total as usize) {
            Some(_) => self.total as usize,
            None => {
                let t = device_index(totals, self.device);
                self.total = t as u32;
                t
            }
        };
        let dl = &mut totals[t];
        if grew {
            dl.live = dl.live.saturating_add(size);
            dl.peak = dl.peak.max(dl.live);
            dl.extremes.grew(dl.live, ts);
        } else {
            dl.live = dl.live.saturating_sub(size);
            dl.extremes.shrank(dl.live, ts);
        }
    }
}

impl Process {
    fn new(pid: u32, start_time: u64) -> Process {
        Process {
            traced_since: None,
            pid,
            start_time,
            ppid: 0,
            command: String::new(),
            exe: String::new(),
            alive: true,
            exit_status: None,
            exit_ts: None,
            by_class: [0; 8],
            live_bytes: 0,
            live_allocations: 0,
            peak_bytes: 0,
            peak_ts: 0,
            allocations: 0,
            frees: 0,
            failed_calls: 0,
            oom_count: 0,
            dropped_events: 0,
            anomalies: 0,
            devices: Vec::new(),
            last_ts: 0,
            thread_ts: FastMap::default(),
            cur_tid: (0, 0),
            lead_up: Vec::new(),
            lead_head: 0,
            freed_total: 0,
            open_incident: None,
            awaiting_sample: None,
            arena_spans: BTreeMap::new(),
            free_in_arenas: 0,
            extremes: Extremes::UNCHANGED,
        }
    }

    #[inline]
    fn dev(&mut self, device: i16) -> &mut DevBytes {
        let i = match self.devices.iter().position(|d| d.device == device) {
            Some(i) => i,
            None => {
                self.devices.push(DevBytes { device, live: 0, resident: 0, peak: 0, total: u32::MAX });
                self.devices.len() - 1
            }
        };
        &mut self.devices[i]
    }

    /// Returns the device's entry when live bytes changed.
    #[inline(always)]
    fn add_bytes(&mut self, class: Class, device: i16, size: u64, ts: u64) -> Option<&mut DevBytes> {
        self.by_class[class.index()] = self.by_class[class.index()].saturating_add(size);
        self.live_allocations += 1;
        if !class.owned() {
            return None;
        }
        self.live_bytes = self.live_bytes.saturating_add(size);
        if self.live_bytes > self.peak_bytes {
            self.peak_bytes = self.live_bytes;
            self.peak_ts = ts;
        }
        self.extremes.grew(self.live_bytes, ts);
        let d = self.dev(device);
        d.live = d.live.saturating_add(size);
        if d.live > d.peak {
            d.peak = d.live;
        }
        if class.resident() {
            d.resident = d.resident.saturating_add(size);
        }
        Some(d)
    }

    /// Returns the device's entry when live bytes changed.
    #[inline(always)]
    fn sub_bytes(&mut self, class: Class, device: i16, size: u64, ts: u64) -> Option<&mut DevBytes> {
        self.by_class[class.index()] = self.by_class[class.index()].saturating_sub(size);
        self.live_allocations = self.live_allocations.saturating_sub(1);
        self.frees += 1;
        self.freed_total = self.freed_total.saturating_add(size);
        if !class.owned() {
            return None;
        }
        self.live_bytes = self.live_bytes.saturating_sub(size);
        self.extremes.shrank(self.live_bytes, ts);
        let d = self.dev(device);
        d.live = d.live.saturating_sub(size);
        if class.resident() {
            d.resident = d.resident.saturating_sub(size);
        }
        Some(d)
    }

    fn arena_change(&mut self, old: Option<(u64, u64)>, new: Option<(u64, u64)>) {
        if old == new {
            return;
        }
        if let Some((free, largest)) = old {
            self.free_in_arenas = self.free_in_arenas.saturating_sub(free);
            if let Some(c) = self.arena_spans.get_mut(&largest) {
                *c -= 1;
                if *c == 0 {
                    self.arena_spans.remove(&largest);
                }
            }
        }
        if let Some((free, largest)) = new {
            self.free_in_arenas = self.free_in_arenas.saturating_add(free);
            *self.arena_spans.entry(largest).or_insert(0) += 1;
        }
    }

    fn largest_free_span(&self) -> u64 {
        self.arena_spans.last_key_value().map(|(k, _)| *k).unwrap_or(0)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct DeviceSample {
    total: u64,
    free: u64,
    ts: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct IncidentState {
    view: OomIncident,
    inputs: VerdictInputs,
    slot: usize,
    freed_mark: u64,
    events_since: u32,
}

/// Errors of [`Model::restore`].
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("empty checkpoint")]
    Empty,
    #[error("checkpoint version {0} is not supported (this build reads {CHECKPOINT_VERSION})")]
    Version(u8),
    #[error("corrupt checkpoint: {0}")]
    Corrupt(String),
}

/// Version byte that starts every checkpoint.
pub const CHECKPOINT_VERSION: u8 = 2;

/// The VRAM model. See the crate documentation for what each number means.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Model {
    config: ModelConfig,
    procs: Vec<Process>,
    by_pid: FastMap<u32, usize>,
    allocs: AddrMap,
    /// Pool handle of each live allocation made from an explicit pool
    /// (`cuMemAllocFromPoolAsync*`); the others use their device's default pool.
    alloc_pools: FastMap<(u32, u64), u64>,
    handles: FastMap<(u32, u64), Handle>,
    reservations: BTreeMap<(u32, u64), Reservation>,
    pools: BTreeMap<PoolKey, Pool>,
    segments: BTreeMap<(u32, u64), Segment>,
    devices: BTreeMap<i16, DeviceSample>,
    incidents: Vec<IncidentState>,
    anomalies: Vec<u64>,
    now: u64,
    events: u64,
    #[serde(skip)]
    pid_cache: Option<(u32, usize)>,
    device_live: Vec<DeviceLive>,
}

impl Model {
    pub fn new(config: ModelConfig) -> Model {
        Model {
            config,
            procs: Vec::new(),
            by_pid: FastMap::default(),
            allocs: AddrMap::default(),
            alloc_pools: FastMap::default(),
            handles: FastMap::default(),
            reservations: BTreeMap::new(),
            pools: BTreeMap::new(),
            segments: BTreeMap::new(),
            devices: BTreeMap::new(),
            incidents: Vec::new(),
            anomalies: vec![0; Anomaly::COUNT],
            now: 0,
            events: 0,
            pid_cache: None,
            device_live: Vec::new(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Events applied so far.
    pub fn events(&self) -> u64 {
        self.events
    }

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
                let r = pool.reserve(g);
                pi = pi.saturating_add(r - pool.live);
                pr = pr.saturating_add(r);
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
        Some((slot, process_view_of(p, pi.saturating_add(si), pr, sizes, ages)))
    }

    /// OOM incidents recorded so far.
    pub fn incident_count(&self) -> usize {
        self.incidents.len()
    }

    /// Processes known so far (each image of a process counts once).
    pub fn process_count(&self) -> usize {
        self.procs.len()
    }

    /// Number of live allocations held in the address map (all processes).
    pub fn live_allocation_count(&self) -> usize {
        self.allocs.len()
    }

    fn anomaly(&mut self, slot: Option<usize>, a: Anomaly) {
        self.anomalies[a as usize] += 1;
        if let Some(s) = slot {
            self.procs[s].anomalies += 1;
        }
    }

    /// Device totals agree with the processes' own bytes (a checkpoint is input too).
    fn device_totals_consistent(&self) -> bool {
        let mut sums = vec![0u64; self.device_live.len()];
        for d in self.procs.iter().flat_map(|p| &p.devices) {
            match sums.get_mut(d.total as usize) {
                Some(s) if self.device_live[d.total as usize].device == d.device => *s = s.saturating_add(d.live),
                None if d.total == u32::MAX && d.live == 0 => {}
                _ => return false,
            }
        }
        sums.iter().zip(&self.device_live).all(|(s, d)| *s == d.live && d.peak >= d.live)
    }

    /// Every device's live bytes (all processes) and peak, with how they moved since the
    /// last call; resets those windows. Sampling this at the edges of a timeline's buckets gives the same
    /// buckets as following every event.
    pub fn take_device_windows(&mut self) -> Vec<DeviceWindow> {
        self.device_live
            .iter_mut()
            .map(|d| DeviceWindow { device: d.device, live: d.live, peak: d.peak, window: d.extremes.take(d.live) })
            .collect()
    }

    /// The live bytes of the process at `slot` and how they moved since the last call
    /// (`None` in the window when they did not); resets that window.
    pub fn take_process_window(&mut self, slot: usize) -> Option<(u64, Option<Window>)> {
        let p = self.procs.get_mut(slot)?;
        Some((p.live_bytes, p.extremes.take(p.live_bytes)))
    }

    /// The highest live bytes of the process at `slot` on each device it used.
    pub fn device_peaks_at(&self, slot: usize) -> impl Iterator<Item = (i16, u64)> + '_ {
        self.procs.get(slot).map_or(&[][..], |p| &p.devices[..]).iter().map(|d| (d.device, d.peak))
    }

    fn new_process(&mut self, pid: u32, start_time: u64) -> usize {
        let slot = self.procs.len();
        self.procs.push(Process::new(pid, start_time));
        self.by_pid.insert(pid, slot);
        self.pid_cache = Some((pid, slot));
        slot
    }

    /// Applies one event. Never panics; nonsense is counted in `anomalies` and ignored.
    pub fn apply(&mut self, ev: &Event) {
        self.events += 1;
        let Some(kind) = ev.kind() else {
            self.anomaly(self.by_pid.get(&ev.pid).copied(), Anomaly::UnknownKind);
            return;
        };
        let Some(api) = ev.api() else {
            self.anomaly(self.by_pid.get(&ev.pid).copied(), Anomaly::UnknownApi);
            return;
        };
        if kind == EventKind::ProcessStart {
            self.process_start(ev.pid, ev.aux, ev.addr as u32, ev.ts_ns);
            return;
        }
        let slot = match self.pid_cache {
            Some((p, s)) if p == ev.pid => s,
            _ => {
                let s = match self.by_pid.get(&ev.pid) {
                    Some(&s) => s,
                    None => self.new_process(ev.pid, 0),
                };
                self.pid_cache = Some((ev.pid, s));
                s
            }
        };
        let p = &mut self.procs[slot];
        if !p.alive {
            self.anomaly(Some(slot), Anomaly::EventAfterExit);
            return;
        }
        // Time: an event is applied at its process's latest time if it is older (threads
        // reach the ring concurrently, so small steps back across threads are normal); a
        // step back within one thread is an anomaly.
        let (ts, incident) = {
            let ts = if ev.ts_ns < p.last_ts { p.last_ts } else { ev.ts_ns };
            if p.cur_tid.0 != ev.tid {
                let (tid, last) = p.cur_tid;
                if last != 0 || tid != 0 {
                    p.thread_ts.insert(tid, last);
                }
                p.cur_tid = (ev.tid, p.thread_ts.get(&ev.tid).copied().unwrap_or(0));
            }
            let back = ev.ts_ns < p.cur_tid.1;
            p.cur_tid.1 = p.cur_tid.1.max(ev.ts_ns);
            p.last_ts = ts;
            let incident = p.awaiting_sample.is_some() || p.open_incident.is_some();
            if back {
                self.anomaly(Some(slot), Anomaly::TimeBackwards);
            }
            (ts, incident)
        };
        if ts > self.now {
            self.now = ts;
        }
        if incident {
            // Incident bookkeeping that precedes the event itself.
            self.incident_pre(slot, ev, kind, ts);
        }

        if ev.failed() {
            if kind != EventKind::MemInfo {
                self.procs[slot].failed_calls += 1;
                if ev.is_oom() {
                    self.on_oom(slot, ev, api, ts);
                }
            }
        } else {
            match kind {
                EventKind::Alloc => self.on_alloc(slot, ev, api, ts),
                EventKind::Free => self.on_free(slot, ev),
                EventKind::VmmCreate => self.on_create(slot, ev, api, ts),
                EventKind::VmmRelease => self.on_release(slot, ev),
                EventKind::VmmReserve => self.on_reserve(slot, ev),
                EventKind::VmmAddressFree => self.on_address_free(slot, ev),
                EventKind::VmmMap => self.on_map(slot, ev, ts),
                EventKind::VmmUnmap => self.on_unmap(slot, ev),
                EventKind::PoolCreate => self.on_pool_create(slot, ev),
                EventKind::PoolDestroy => self.on_pool_destroy(slot, ev),
                EventKind::PoolTrim => self.on_pool_trim(slot, ev),
                EventKind::MemInfo => self.on_meminfo(slot, ev, ts),
                EventKind::ProcessExit => {
                    self.close_process(slot, ts);
                    return;
                }
                EventKind::Dropped => {
                    let p = &mut self.procs[slot];
                    p.dropped_events = p.dropped_events.saturating_add(ev.size);
                }
                EventKind::ProcessStart | EventKind::HookMiss => {}
            }
        }
        let p = &mut self.procs[slot];
        if let Some(idx) = p.open_incident {
            if let Some(inc) = self.incidents.get_mut(idx) {
                if inc.view.retries == 0 {
                    inc.view.freed_bytes_between = p.freed_total - inc.freed_mark;
                }
            }
        }
        // The lead-up ring: `lead_head` is where the next event goes (the oldest once the
        // ring is full). A compare, not `%`: integer divisions per event cost a tenth of
        // `apply`'s time.
        let n = self.config.lead_up_events;
        let mut h = p.lead_head;
        let len = p.lead_up.len();
        if h < len {
            p.lead_up[h] = *ev;
        } else if len < n {
            p.lead_up.push(*ev);
        } else if let Some(first) = p.lead_up.first_mut() {
            // A restored checkpoint may carry any head.
            *first = *ev;
            h = 0;
        } else {
            return; // no lead-up kept
        }
        p.lead_head = if h + 1 < n { h + 1 } else { 0 };
    }

    fn process_start(&mut self, pid: u32, start_time: u64, ppid: u32, ts: u64) {
        if ts > self.now {
            self.now = ts;
        }
        let slot = self.attach(pid, start_time, ts, true);
        if let Some(s) = slot {
            if ppid != 0 {
                self.procs[s].ppid = ppid;
            }
        }
    }

    /// Finds or creates the process (pid, start_time); closes an older process of the same
    /// pid (pid reuse). Returns None when it names a process that already exited, unless
    /// `new_image`: an `exec` keeps pid and start time, and its new image starts afresh
    /// (the old image's memory went with its address space).
    fn attach(&mut self, pid: u32, start_time: u64, ts: u64, new_image: bool) -> Option<usize> {
        match self.by_pid.get(&pid).copied() {
            Some(s) => {
                let p = &mut self.procs[s];
                if p.start_time == start_time || start_time == 0 {
                    if !p.alive && new_image && start_time != 0 {
                        return Some(self.new_process(pid, start_time));
                    }
                    if !p.alive {
                        self.anomaly(Some(s), Anomaly::EventAfterExit);
                        return None;
                    }
                    Some(s)
                } else if p.start_time == 0 && p.alive {
                    p.start_time = start_time;
                    Some(s)
                } else {
                    if p.alive {
                        self.close_process(s, ts);
                    }
                    Some(self.new_process(pid, start_time))
                }
            }
            None => Some(self.new_process(pid, start_time)),
        }
    }

    /// Attaches what the reader knows about a process (command line, exe, parent).
    pub fn process_info(&mut self, info: &ProcessInfo) {
        let slot = self
            .procs
            .iter()
            .rposition(|p| p.pid == info.pid && p.start_time == info.start_time && info.start_time != 0)
            .filter(|s| self.procs[*s].alive)
            .or_else(|| self.attach(info.pid, info.start_time, self.now, true));
        if let Some(s) = slot {
            let p = &mut self.procs[s];
            p.command = info.cmdline.join(" ");
            p.exe = info.exe.clone();
            if info.ppid != 0 {
                p.ppid = info.ppid;
            }
        }
    }

    /// eBPF mode: the process was running before the probes were attached at `ts_ns`; its
    /// allocations before then are unknown ("attached at T; earlier allocations unknown").
    pub fn process_traced_since(&mut self, pid: u32, start_time: u64, ts_ns: u64) {
        let slot = self.procs.iter().rposition(|p| p.pid == pid && p.start_time == start_time && p.alive);
        if let Some(s) = slot {
            self.procs[s].traced_since = Some(ts_ns);
        }
    }

    /// The process ended (from the agent's process watcher or the capture's end frame):
    /// releases everything it held. Idempotent; a `start_time` of 0 matches the current
    /// process of that pid.
    pub fn process_exit(&mut self, pid: u32, start_time: u64, exit_status: Option<i32>, ts_ns: u64) {
        let slot = self.procs.iter().rposition(|p| p.pid == pid && (start_time == 0 || p.start_time == start_time));
        let slot = match slot {
            Some(s) => s,
            None => match self.by_pid.get(&pid).copied() {
                Some(s) if self.procs[s].start_time == 0 && self.procs[s].alive => {
                    self.procs[s].start_time = start_time;
                    s
                }
                _ => return,
            },
        };
        if ts_ns > self.now {
            self.now = ts_ns;
        }
        if self.procs[slot].alive {
            self.close_process(slot, ts_ns.max(self.procs[slot].last_ts));
        }
        if exit_status.is_some() {
            self.procs[slot].exit_status = exit_status;
        }
    }

    fn close_process(&mut self, slot: usize, ts: u64) {
        let pid = self.procs[slot].pid;
        self.allocs.retain(|p, _, _| p != pid);
        self.alloc_pools.retain(|k, _| k.0 != pid);
        self.handles.retain(|k, _| k.0 != pid);
        let range = (pid, 0)..=(pid, u64::MAX);
        let keys: Vec<_> = self.reservations.range(range.clone()).map(|(k, _)| *k).collect();
        for k in keys {
            self.reservations.remove(&k);
        }
        let keys: Vec<_> = self.segments.range(range).map(|(k, _)| *k).collect();
        for k in keys {
            self.segments.remove(&k);
        }
        let keys: Vec<_> = self.pools.range((pid, false, 0)..=(pid, true, u64::MAX)).map(|(k, _)| *k).collect();
        for k in keys {
            self.pools.remove(&k);
        }
        let p = &mut self.procs[slot];
        p.alive = false;
        p.exit_ts = Some(ts);
        p.by_class = [0; 8];
        p.live_bytes = 0;
        p.extremes.shrank(0, ts);
        p.live_allocations = 0;
        // What it held leaves the device totals; its entries stay (with their peaks).
        for d in &mut p.devices {
            if let Some(dl) = self.device_live.get_mut(d.total as usize) {
                dl.live = dl.live.saturating_sub(d.live);
                dl.extremes.shrank(dl.live, ts);
            }
            d.live = 0;
            d.resident = 0;
        }
        p.arena_spans.clear();
        p.free_in_arenas = 0;
        p.open_incident = None;
        p.awaiting_sample = None;
    }

    // ---- allocations -------------------------------------------------------------------

    fn pool_key(pid: u32, device: i16, pool: u64) -> PoolKey {
        if pool == 0 {
            (pid, true, device as u16 as u64)
        } else {
            (pid, false, pool)
        }
    }

    fn on_alloc(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        let Some(class) = api.mem_class().map(Class::from) else {
            self.anomaly(Some(slot), Anomaly::AllocUnknownApi);
            return;
        };
        if class == Class::Vmm || class == Class::Import {
            // cuMemCreate / import reported as an alloc: treat as a handle creation.
            self.on_create(slot, ev, api, ts);
            return;
        }
        if ev.addr == 0 {
            self.anomaly(Some(slot), Anomaly::AllocNull);
            return;
        }
        let pid = ev.pid;
        let pool = match api {
            Api::cuMemAllocFromPoolAsync | Api::cuMemAllocFromPoolAsync_ptsz => ev.stream,
            _ => 0,
        };
        let flag = if pool != 0 { EXPLICIT_POOL } else { 0 };
        let a = Alloc { size: ev.size, ts, device: ev.device, class: class as u8 | flag };
        if let Some(old) = self.allocs.insert(pid, ev.addr, a) {
            self.anomaly(Some(slot), Anomaly::AllocOverLive);
            self.remove_alloc(slot, pid, ev.addr, old);
        }
        if pool != 0 {
            self.alloc_pools.insert((pid, ev.addr), pool);
        }
        let p = &mut self.procs[slot];
        p.allocations += 1;
        if let Some(d) = p.add_bytes(class, ev.device, ev.size, ts) {
            d.count_in_total(&mut self.device_live, true, ev.size, ts);
        }
        if class == Class::Pool {
            let g = self.config.granularity;
            let key = Self::pool_key(pid, ev.device, pool);
            let before = self.pools.get(&key).map(|pl| pl.numbers(g));
            let pl = self.pools.entry(key).or_insert(Pool {
                device: ev.device,
                live: 0,
                count: 0,
                hwm: 0,
                destroyed: false,
            });
            pl.live = pl.live.saturating_add(ev.size);
            pl.count += 1;
            pl.hwm = pl.hwm.max(pl.live);
            let after = pl.numbers(g);
            self.procs[slot].arena_change(before, Some(after));
        }
    }

    /// Accounts for an allocation already taken out of `allocs`.
    #[inline(always)]
    fn remove_alloc(&mut self, slot: usize, pid: u32, addr: u64, a: Alloc) {
        let class = a.class();
        let p = &mut self.procs[slot];
        let ts = p.last_ts;
        if let Some(d) = p.sub_bytes(class, a.device, a.size, ts) {
            d.count_in_total(&mut self.device_live, false, a.size, ts);
        }
        if class == Class::Pool {
            let pool =
                if a.class & EXPLICIT_POOL != 0 { self.alloc_pools.remove(&(pid, addr)).unwrap_or(0) } else { 0 };
            let key = Self::pool_key(pid, a.device, pool);
            self.change_pool(slot, key, |pl| {
                pl.live = pl.live.saturating_sub(a.size);
                pl.count = pl.count.saturating_sub(1);
                if pl.destroyed {
                    pl.hwm = pl.live;
                }
            });
        }
        if !self.segments.is_empty() {
            if let Some(seg) = self.segments.remove(&(pid, addr)) {
                self.procs[slot].arena_change(Some(seg.numbers()), None);
            }
        }
    }

    #[inline]
    fn on_free(&mut self, slot: usize, ev: &Event) {
        if ev.addr == 0 {
            return; // cudaFree(NULL) is a no-op.
        }
        match self.allocs.remove(ev.pid, ev.addr) {
            Some(a) => self.remove_alloc(slot, ev.pid, ev.addr, a),
            None => self.anomaly(Some(slot), Anomaly::FreeUnknown),
        }
    }

    // ---- VMM ---------------------------------------------------------------------------

    fn on_create(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        let class = if api == Api::cuMemImportFromShareableHandle { Class::Import } else { Class::Vmm };
        let key = (ev.pid, ev.aux);
        if self.handles.contains_key(&key) {
            self.anomaly(Some(slot), Anomaly::VmmCreateDuplicate);
            return;
        }
        self.handles
            .insert(key, Handle { size: ev.size, ts, device: ev.device, class: class as u8, released: false, maps: 0 });
        let p = &mut self.procs[slot];
        p.allocations += 1;
        if let Some(d) = p.add_bytes(class, ev.device, ev.size, ts) {
            d.count_in_total(&mut self.device_live, true, ev.size, ts);
        }
    }

    fn drop_handle_if_done(&mut self, slot: usize, key: (u32, u64)) {
        if self.handles.get(&key).is_some_and(|h| h.released && h.maps == 0) {
            if let Some(h) = self.handles.remove(&key) {
                let p = &mut self.procs[slot];
                let ts = p.last_ts;
                if let Some(d) = p.sub_bytes(Class::from_index(h.class), h.device, h.size, ts) {
                    d.count_in_total(&mut self.device_live, false, h.size, ts);
                }
            }
        }
    }

    fn on_release(&mut self, slot: usize, ev: &Event) {
        let key = (ev.pid, ev.aux);
        match self.handles.get_mut(&key) {
            None => self.anomaly(Some(slot), Anomaly::ReleaseUnknown),
            Some(h) if h.released => self.anomaly(Some(slot), Anomaly::DoubleRelease),
            Some(h) => {
                h.released = true;
                self.drop_handle_if_done(slot, key);
            }
        }
    }

    fn on_reserve(&mut self, slot: usize, ev: &Event) {
        let pid = ev.pid;
        if ev.size == 0 {
            self.anomaly(Some(slot), Anomaly::ZeroSize);
            return;
        }
        let Some(end) = ev.addr.checked_add(ev.size) else {
            self.anomaly(Some(slot), Anomaly::AddressOverflow);
            return;
        };
        let prev_overlaps =
            self.reservations.range((pid, 0)..=(pid, ev.addr)).next_back().is_some_and(|(k, r)| k.1 + r.size > ev.addr);
        let next_overlaps = self.reservations.range((pid, ev.addr)..(pid, end)).next().is_some();
        if prev_overlaps || next_overlaps {
            self.anomaly(Some(slot), Anomaly::ReserveOverlap);
            return;
        }
        let mut gaps = Gaps::default();
        gaps.add(ev.size);
        let r = Reservation { size: ev.size, device: ev.device, mappings: BTreeMap::new(), mapped: 0, gaps };
        let n = r.numbers();
        self.reservations.insert((pid, ev.addr), r);
        self.procs[slot].arena_change(None, Some(n));
    }

    fn on_address_free(&mut self, slot: usize, ev: &Event) {
        let key = (ev.pid, ev.addr);
        match self.reservations.get(&key) {
            None => self.anomaly(Some(slot), Anomaly::AddressFreeUnknown),
            Some(r) if !r.mappings.is_empty() => self.anomaly(Some(slot), Anomaly::AddressFreeWhileMapped),
            Some(_) => {
                let r = self.reservations.remove(&key).expect("present");
                self.procs[slot].arena_change(Some(r.numbers()), None);
            }
        }
    }

    /// The reservation of `pid` containing `addr`.
    fn reservation_at(&self, pid: u32, addr: u64) -> Option<u64> {
        self.reservations
            .range((pid, 0)..=(pid, addr))
            .next_back()
            .filter(|(k, r)| addr - k.1 < r.size)
            .map(|(k, _)| k.1)
    }

    fn on_map(&mut self, slot: usize, ev: &Event, ts: u64) {
        let pid = ev.pid;
        let (addr, size, hkey) = (ev.addr, ev.size, (ev.pid, ev.aux));
        if size == 0 {
            self.anomaly(Some(slot), Anomaly::ZeroSize);
            return;
        }
        let Some(end) = addr.checked_add(size) else {
            self.anomaly(Some(slot), Anomaly::AddressOverflow);
            return;
        };
        match self.handles.get(&hkey) {
            None => {
                self.anomaly(Some(slot), Anomaly::MapUnknownHandle);
                return;
            }
            Some(h) if h.released => {
                self.anomaly(Some(slot), Anomaly::MapReleasedHandle);
                return;
            }
            Some(_) => {}
        }
        let Some(base) = self.reservation_at(pid, addr) else {
            self.anomaly(Some(slot), Anomaly::MapOutsideReservation);
            return;
        };
        let r = self.reservations.get_mut(&(pid, base)).expect("found");
        if end > base + r.size {
            self.anomaly(Some(slot), Anomaly::MapOutsideReservation);
            return;
        }
        let prev = r.mappings.range(..=addr).next_back().is_some_and(|(a, m)| a + m.size > addr);
        let next = r.mappings.range(addr..end).next().is_some();
        if prev || next {
            self.anomaly(Some(slot), Anomaly::MapOverlap);
            return;
        }
        let before = r.numbers();
        r.occupy_interval(base, addr, end);
        r.mappings.insert(addr, Mapping { size, handle: ev.aux, offset: ev.stream, ts });
        r.mapped += size;
        let after = r.numbers();
        self.procs[slot].arena_change(Some(before), Some(after));
        if let Some(h) = self.handles.get_mut(&hkey) {
            h.maps += 1;
        }
    }

    fn on_unmap(&mut self, slot: usize, ev: &Event) {
        let pid = ev.pid;
        if ev.size == 0 {
            self.anomaly(Some(slot), Anomaly::ZeroSize);
            return;
        }
        let Some(base) = self.reservation_at(pid, ev.addr) else {
            self.anomaly(Some(slot), Anomaly::UnmapNothing);
            return;
        };
        let r = self.reservations.get_mut(&(pid, base)).expect("found");
        let a = ev.addr;
        let e = ev.addr.saturating_add(ev.size).min(base + r.size);
        // Overlapping mappings: the one starting at or before `a` if it reaches past `a`,
        // and every one starting inside (a, e).
        let mut hit: Vec<u64> = Vec::new();
        if let Some((ma, m)) = r.mappings.range(..=a).next_back() {
            if ma + m.size > a {
                hit.push(*ma);
            }
        }
        if a < e {
            hit.extend(r.mappings.range(a.saturating_add(1)..e).map(|(k, _)| *k));
        }
        if hit.is_empty() {
            self.anomaly(Some(slot), Anomaly::UnmapNothing);
            return;
        }
        let before = r.numbers();
        let mut touched: Vec<(u64, i64)> = Vec::new();
        for ms in hit {
            let m = r.mappings.remove(&ms).expect("present");
            let me = ms + m.size;
            let fs = ms.max(a);
            let fe = me.min(e).max(fs);
            let mut delta: i64 = -1;
            if ms < fs {
                r.mappings.insert(ms, Mapping { size: fs - ms, ..m.clone() });
                delta += 1;
            }
            if fe < me {
                r.mappings.insert(fe, Mapping { size: me - fe, offset: m.offset + (fe - ms), ..m.clone() });
                delta += 1;
            }
            r.mapped -= fe - fs;
            if fe > fs {
                r.free_interval(base, fs, fe);
            }
            touched.push((m.handle, delta));
        }
        let after = r.numbers();
        self.procs[slot].arena_change(Some(before), Some(after));
        for (h, delta) in touched {
            let key = (pid, h);
            if let Some(hd) = self.handles.get_mut(&key) {
                hd.maps = (i64::from(hd.maps) + delta).max(0) as u32;
            }
            self.drop_handle_if_done(slot, key);
        }
    }

    // ---- pools -------------------------------------------------------------------------

    fn on_pool_create(&mut self, slot: usize, ev: &Event) {
        let key = (ev.pid, false, ev.stream);
        if ev.stream == 0 || self.pools.contains_key(&key) {
            self.anomaly(Some(slot), Anomaly::PoolDuplicate);
            return;
        }
        let pl = Pool { device: ev.device, live: 0, count: 0, hwm: 0, destroyed: false };
        let n = pl.numbers(self.config.granularity);
        self.pools.insert(key, pl);
        self.procs[slot].arena_change(None, Some(n));
    }

    /// An explicit handle, or — for a handle never seen — the device's default pool (its
    /// handle never appears in allocation events).
    fn resolve_pool(&self, pid: u32, device: i16, handle: u64) -> Option<PoolKey> {
        let k = (pid, false, handle);
        if self.pools.contains_key(&k) {
            return Some(k);
        }
        let d = Self::pool_key(pid, device, 0);
        self.pools.contains_key(&d).then_some(d)
    }

    fn on_pool_destroy(&mut self, slot: usize, ev: &Event) {
        let Some(key) = self.resolve_pool(ev.pid, ev.device, ev.stream) else {
            self.anomaly(Some(slot), Anomaly::PoolUnknown);
            return;
        };
        self.change_pool(slot, key, |pl| {
            pl.destroyed = true;
            pl.hwm = pl.live;
        });
    }

    fn on_pool_trim(&mut self, slot: usize, ev: &Event) {
        let Some(key) = self.resolve_pool(ev.pid, ev.device, ev.stream) else {
            self.anomaly(Some(slot), Anomaly::PoolUnknown);
            return;
        };
        let keep = ev.size;
        self.change_pool(slot, key, |pl| pl.hwm = pl.live.max(pl.hwm.min(keep)));
    }

    /// Changes a pool and keeps its process's arena numbers in step; a destroyed pool goes
    /// when its last allocation does.
    fn change_pool(&mut self, slot: usize, key: PoolKey, change: impl FnOnce(&mut Pool)) {
        let g = self.config.granularity;
        let Some(pl) = self.pools.get_mut(&key) else { return };
        let before = pl.numbers(g);
        change(pl);
        if pl.destroyed && pl.count == 0 {
            self.pools.remove(&key);
            self.procs[slot].arena_change(Some(before), None);
        } else {
            let after = pl.numbers(g);
            self.procs[slot].arena_change(Some(before), Some(after));
        }
    }

    fn on_meminfo(&mut self, slot: usize, ev: &Event, ts: u64) {
        self.devices.insert(ev.device, DeviceSample { total: ev.size, free: ev.addr, ts });
        if let Some((idx, tid)) = self.procs[slot].awaiting_sample {
            if tid == ev.tid && self.incidents[idx].view.device == ev.device {
                self.procs[slot].awaiting_sample = None;
                let inc = &mut self.incidents[idx];
                inc.inputs.device_free = Some(ev.addr);
                inc.inputs.device_total = Some(ev.size);
                inc.view.device_free_bytes = Some(ev.addr);
                inc.view.device_total_bytes = Some(ev.size);
                inc.view.sample_ts_ns = Some(ts);
                inc.view.sample_after_failure = true;
                self.decide(idx);
            }
        }
    }

    // ---- incidents ---------------------------------------------------------------------

    fn incident_pre(&mut self, slot: usize, ev: &Event, kind: EventKind, ts: u64) {
        let p = &mut self.procs[slot];
        if let Some((_, tid)) = p.awaiting_sample {
            if tid == ev.tid && kind != EventKind::MemInfo {
                p.awaiting_sample = None;
            }
        }
        if let Some(idx) = p.open_incident {
            let inc = &mut self.incidents[idx];
            inc.events_since += 1;
            if inc.events_since > self.config.incident_window_events
                || ts.saturating_sub(inc.view.ts_ns) > self.config.incident_window_ns
            {
                p.open_incident = None;
                return;
            }
            let is_retry = matches!(kind, EventKind::Alloc | EventKind::VmmCreate)
                && ev.size == inc.view.requested_bytes
                && ev.api == Api::from_name(&inc.view.api).map(|a| a.code()).unwrap_or(u16::MAX);
            if is_retry {
                inc.view.retries += 1;
                inc.view.freed_bytes_between = p.freed_total - inc.freed_mark;
                if ev.failed() {
                    inc.view.failures += 1;
                    inc.view.outcome = Outcome::FailedAgain;
                } else {
                    inc.view.outcome = Outcome::Recovered;
                    p.open_incident = None;
                }
            } else if kind != EventKind::MemInfo && ev.is_oom() {
                // Another request failing (other size or API) is a new incident, not a
                // retry: the program moved on, and this may be the failure that kills it.
                p.open_incident = None;
            }
        }
    }

    /// Idle bytes (pool reserve − live, framework cache) of process `pid` on `device`
    /// (all devices when `device` is -1).
    fn idle_of(&self, pid: u32, device: i16) -> u64 {
        let g = self.config.granularity;
        let pools: u64 = self
            .pools
            .range((pid, false, 0)..=(pid, true, u64::MAX))
            .filter(|(_, p)| device < 0 || p.device == device)
            .fold(0u64, |acc, (_, p)| acc.saturating_add(p.reserve(g) - p.live));
        let segs: u64 = self
            .segments
            .range((pid, 0)..=(pid, u64::MAX))
            .filter(|(_, s)| device < 0 || s.device == device)
            .fold(0u64, |acc, (_, s)| acc.saturating_add(s.size - s.allocated));
        pools.saturating_add(segs)
    }

    /// This process's arenas on `device` (all devices when -1), sorted by (kind, base, device).
    fn arenas_of(&self, pid: u32, device: i16) -> Vec<ArenaNumbers> {
        let mut v: Vec<(u16, ArenaNumbers)> = self
            .arenas_in(pid, pid)
            .into_iter()
            .filter(|a| a.pid == pid && (device < 0 || a.device == device))
            .map(|a| {
                let n = ArenaNumbers {
                    kind: a.kind,
                    base: a.base,
                    free_in_arena: a.free_in_arena,
                    largest_free_span: a.largest_free_span,
                };
                (a.device as u16, n)
            })
            .collect();
        v.sort_by_key(|(d, a)| (a.kind, a.base, *d));
        v.into_iter().map(|(_, a)| a).collect()
    }

    fn on_oom(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        self.procs[slot].oom_count += 1;
        if self.procs[slot].open_incident.is_some() {
            return; // a failed retry, already counted by incident_pre
        }
        let pid = ev.pid;
        let own_idle = self.idle_of(pid, ev.device);
        // Idle bytes live only in pools and framework segments: summed over those (not over
        // every process, most of which hold neither: a capture of 50,000 processes with an
        // OOM each made this quadratic).
        let g = self.config.granularity;
        let other = |p: u32| p != pid && self.by_pid.get(&p).is_some_and(|s| self.procs[*s].alive);
        let dev = ev.device;
        let pool_idle = self
            .pools
            .iter()
            .filter(|((p, _, _), pool)| (dev < 0 || pool.device == dev) && other(*p))
            .fold(0u64, |acc, (_, pool)| acc.saturating_add(pool.reserve(g) - pool.live));
        let other_idle: u64 = self
            .segments
            .iter()
            .filter(|((p, _), s)| (dev < 0 || s.device == dev) && other(*p))
            .fold(pool_idle, |acc, (_, s)| acc.saturating_add(s.size - s.allocated));
        let arenas = self.arenas_of(pid, ev.device);
        let sample = self.devices.get(&ev.device).cloned();
        let inputs = VerdictInputs {
            requested: ev.size,
            granularity: self.config.granularity,
            device_free: sample.as_ref().map(|s| s.free),
            device_total: sample.as_ref().map(|s| s.total),
            own_idle,
            other_idle,
            arenas,
        };
        let p = &self.procs[slot];
        let arena_free_bytes = inputs.arenas.iter().fold(0u64, |acc, a| acc.saturating_add(a.free_in_arena));
        let arena_largest_free_span = inputs.arenas.iter().map(|a| a.largest_free_span).max().unwrap_or(0);
        let id = self.incidents.len() as u64 + 1;
        let view = OomIncident {
            id,
            pid,
            start_time: p.start_time,
            command: p.command.clone(),
            device: ev.device,
            ts_ns: ts,
            api: api.name().to_string(),
            caller: ev.caller().map(Caller::name).unwrap_or("").to_string(),
            requested_bytes: ev.size,
            device_free_bytes: inputs.device_free,
            device_total_bytes: inputs.device_total,
            sample_ts_ns: sample.as_ref().map(|s| s.ts),
            sample_after_failure: false,
            verdict: Verdict::Unknown,
            unknown_reason: None,
            explanation: String::new(),
            failures: 1,
            retries: 0,
            freed_bytes_between: 0,
            outcome: Outcome::Open,
            lead_up: {
                let h = p.lead_head.min(p.lead_up.len());
                p.lead_up[h..].iter().chain(&p.lead_up[..h]).map(EventRecord::from).collect()
            },
            own_idle_bytes: own_idle,
            other_idle_bytes: other_idle,
            arena_free_bytes,
            arena_largest_free_span,
        };
        let idx = self.incidents.len();
        self.incidents.push(IncidentState { view, inputs, slot, freed_mark: p.freed_total, events_since: 0 });
        self.decide(idx);
        let p = &mut self.procs[slot];
        p.open_incident = Some(idx);
        p.awaiting_sample = Some((idx, ev.tid));
    }

    fn decide(&mut self, idx: usize) {
        let inc = &self.incidents[idx];
        let (verdict, reason) = decide_verdict(&inc.inputs);
        let cmd = &self.procs[inc.slot].command;
        let text = explain(&ExplainCtx {
            pid: inc.view.pid,
            command: if cmd.is_empty() { &inc.view.command } else { cmd },
            api: &inc.view.api,
            device: inc.view.device,
            ts_ns: inc.view.ts_ns,
            sample_ts_ns: inc.view.sample_ts_ns,
            sample_after_failure: inc.view.sample_after_failure,
            inputs: &inc.inputs,
            verdict,
            unknown_reason: reason.as_deref(),
        });
        let inc = &mut self.incidents[idx];
        inc.view.verdict = verdict;
        inc.view.unknown_reason = reason;
        inc.view.explanation = text;
    }

    // ---- framework segments ------------------------------------------------------------

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

    // ---- queries -----------------------------------------------------------------------

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

    fn snapshot_with(&self, full: bool) -> ModelSnapshot {
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
            let r = p.reserve(g);
            e.0 = e.0.saturating_add(r - p.live);
            e.1 = e.1.saturating_add(r);
            let d = dev_pool_idle.entry(p.device).or_default();
            *d = d.saturating_add(r - p.live);
        }
        let mut seg_idle: FastMap<u32, u64> = FastMap::default();
        for ((pid, _), s) in &self.segments {
            let e = seg_idle.entry(*pid).or_default();
            *e = e.saturating_add(s.size - s.allocated);
        }
        let mut processes = Vec::with_capacity(self.procs.len());
        let mut dev_resident: BTreeMap<i16, u64> = BTreeMap::new();
        for p in &self.procs {
            let current = p.alive && self.by_pid.get(&p.pid).is_some_and(|s| self.procs[*s].start_time == p.start_time);
            let (pi, pr) = if current { pool_idle.get(&p.pid).copied().unwrap_or((0, 0)) } else { (0, 0) };
            let si = if current { seg_idle.get(&p.pid).copied().unwrap_or(0) } else { 0 };
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
            processes.push(process_view_of(p, pi.saturating_add(si), pr, size_histogram, age_histogram));
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

    fn start_of(&self, pid: u32) -> u64 {
        self.by_pid.get(&pid).map(|s| self.procs[*s].start_time).unwrap_or(0)
    }

    /// Every arena, sorted by (pid, kind, base).
    pub fn arenas(&self) -> Vec<ArenaView> {
        self.arenas_in(0, u32::MAX)
    }

    /// The arenas of processes `lo..=hi` (by pid), sorted by (pid, kind, base): an OOM asks
    /// for one process's arenas without building every other's.
    fn arenas_in(&self, lo: u32, hi: u32) -> Vec<ArenaView> {
        let g = self.config.granularity;
        let mut v = Vec::new();
        for ((pid, base), r) in self.reservations.range((lo, 0)..=(hi, u64::MAX)) {
            let (f, l) = r.numbers();
            v.push(ArenaView {
                pid: *pid,
                start_time: self.start_of(*pid),
                device: r.device,
                kind: ArenaKind::VmmReservation,
                base: *base,
                size: r.size,
                occupied: r.mapped,
                free_in_arena: f,
                largest_free_span: l,
                fragmentation: fragmentation(l, f),
                live_allocations: r.mappings.len() as u64,
            });
        }
        for ((pid, default, h), p) in self.pools.range((lo, false, 0)..=(hi, true, u64::MAX)) {
            let (f, l) = p.numbers(g);
            v.push(ArenaView {
                pid: *pid,
                start_time: self.start_of(*pid),
                device: p.device,
                kind: ArenaKind::Pool,
                base: if *default { 0 } else { *h },
                size: p.reserve(g),
                occupied: p.live,
                free_in_arena: f,
                largest_free_span: l,
                fragmentation: 0.0,
                live_allocations: p.count,
            });
        }
        for ((pid, base), s) in self.segments.range((lo, 0)..=(hi, u64::MAX)) {
            let (f, l) = s.numbers();
            v.push(ArenaView {
                pid: *pid,
                start_time: self.start_of(*pid),
                device: s.device,
                kind: ArenaKind::FrameworkSegment,
                base: *base,
                size: s.size,
                occupied: s.allocated,
                free_in_arena: f,
                largest_free_span: l,
                fragmentation: fragmentation(l, f),
                live_allocations: s.blocks,
            });
        }
        v.sort_by_key(|a| (a.pid, a.kind, a.base, a.device));
        v
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
        let mut incident_map = vec![usize::MAX; self.incidents.len()];
        let mut incidents = Vec::with_capacity(self.incidents.len());
        for (old, mut inc) in std::mem::take(&mut self.incidents).into_iter().enumerate() {
            if keep.get(inc.slot).copied().unwrap_or(false) {
                inc.slot = slot_map[inc.slot];
                incident_map[old] = incidents.len();
                incidents.push(inc);
            }
        }
        self.incidents = incidents;
        let remap = |i: usize| incident_map.get(i).copied().filter(|n| *n != usize::MAX);
        let mut procs = Vec::with_capacity(next);
        for (old, mut p) in std::mem::take(&mut self.procs).into_iter().enumerate() {
            if keep[old] {
                p.open_incident = p.open_incident.and_then(remap);
                p.awaiting_sample = p.awaiting_sample.and_then(|(i, tid)| remap(i).map(|n| (n, tid)));
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

    /// The full state as bytes: a version byte, then postcard.
    pub fn checkpoint(&self) -> Vec<u8> {
        let out = vec![CHECKPOINT_VERSION];
        match postcard::to_extend(self, out) {
            Ok(v) => v,
            Err(_) => vec![CHECKPOINT_VERSION],
        }
    }

    pub fn restore(bytes: &[u8]) -> Result<Model, ModelError> {
        let (&v, rest) = bytes.split_first().ok_or(ModelError::Empty)?;
        if v != CHECKPOINT_VERSION {
            return Err(ModelError::Version(v));
        }
        let m: Model = postcard::from_bytes(rest).map_err(|e| ModelError::Corrupt(e.to_string()))?;
        if m.anomalies.len() != Anomaly::COUNT
            || !m.device_totals_consistent()
            || m.by_pid.values().any(|s| *s >= m.procs.len())
            || m.incidents.iter().any(|i| i.slot >= m.procs.len())
            || m.procs.iter().any(|p| {
                p.open_incident.is_some_and(|i| i >= m.incidents.len())
                    || p.awaiting_sample.is_some_and(|(i, _)| i >= m.incidents.len())
            })
        {
            return Err(ModelError::Corrupt("inconsistent indices".into()));
        }
        Ok(m)
    }
}

impl Default for Model {
    fn default() -> Self {
        Model::new(ModelConfig::default())
    }
}

/// Index of `device`'s entry in the device totals, created on first use.
fn device_index(totals: &mut Vec<DeviceLive>, device: i16) -> usize {
    match totals.iter().position(|d| d.device == device) {
        Some(i) => i,
        None => {
            totals.push(DeviceLive { device, live: 0, peak: 0, extremes: Extremes::UNCHANGED });
            totals.len() - 1
        }
    }
}

/// A process's view, as `Model::snapshot` and `Model::process_view` both report it, given
/// its idle bytes (pool reserve and framework cache), its pools' reserve and histograms.
fn process_view_of(p: &Process, idle: u64, pool_reserve: u64, sizes: Histogram, ages: Histogram) -> ProcessView {
    let mut devices: Vec<DeviceBytes> =
        p.devices.iter().filter(|d| d.live > 0).map(|d| DeviceBytes { device: d.device, live_bytes: d.live }).collect();
    devices.sort_by_key(|d| d.device);
    let largest = p.largest_free_span();
    ProcessView {
        pid: p.pid,
        start_time: p.start_time,
        ppid: p.ppid,
        command: p.command.clone(),
        exe: p.exe.clone(),
        alive: p.alive,
        exit_status: p.exit_status,
        exit_ts_ns: p.exit_ts,
        incomplete: p.dropped_events > 0,
        live_bytes: p.live_bytes,
        live_by_class: ClassBytes::from_array(&p.by_class),
        live_allocations: p.live_allocations,
        peak_bytes: p.peak_bytes,
        peak_ts_ns: p.peak_ts,
        allocations: p.allocations,
        frees: p.frees,
        failed_calls: p.failed_calls,
        oom_count: p.oom_count,
        dropped_events: p.dropped_events,
        anomalies: p.anomalies,
        idle_bytes: idle,
        pool_reserve_bytes: pool_reserve,
        largest_free_span: largest,
        free_in_arenas: p.free_in_arenas,
        fragmentation: fragmentation(largest, p.free_in_arenas),
        devices,
        size_histogram: sizes,
        age_histogram: ages,
        traced_since_ns: p.traced_since,
    }
}
