//! The state machine: `apply`, which hands each event to its kind's module (`process`,
//! `allocs`, `vmm`, `pools`, `incidents`, `segments`), over the state defined here; the
//! queries and checkpoints are in `queries` and `checkpoint`.

use crate::addr_map::{AddrMap, Alloc, EXPLICIT_POOL};
use crate::types::*;
use crate::verdict::{decide_verdict, explain, fix_for, ExplainCtx};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use vramhook_protocol::{Api, Caller, Event, EventKind, FrameworkId, ProcessInfo};

/// A hash map with a fast, fixed-seed hasher for the model's integer keys (the address
/// table itself is `AddrMap`). Fixed seed: the same stream gives the same state.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

mod allocs;
mod checkpoint;
mod fit;
mod holders;
mod incidents;
mod lens;
mod pools;
mod process;
mod queries;
mod segments;
mod streams;
mod vmm;

use process::*;

// ---- state: what the model keeps (serialised whole in checkpoints) -----------------

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
struct Gaps {
    sizes: BTreeMap<u64, u32>,
    total: u64,
}

impl Gaps {
    #[inline]
    fn add(&mut self, s: u64) {
        if s > 0 {
            *self.sizes.entry(s).or_insert(0) += 1;
            self.total += s;
        }
    }
    #[inline]
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

    /// (free bytes, largest free span) of the arena these gaps are in.
    #[inline]
    fn numbers(&self) -> (u64, u64) {
        (self.total, self.largest())
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
    #[inline]
    fn numbers(&self) -> (u64, u64) {
        self.gaps.numbers()
    }

    /// Marks [s, e) free; it must not overlap a mapping.
    #[inline]
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
    #[inline]
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
    /// The reserve as the driver last reported it (`pool_sample`), until a trim or destroy
    /// changes it in a way only the next sample tells.
    sampled: Option<u64>,
}

impl Pool {
    fn new(device: i16) -> Pool {
        Pool { device, live: 0, count: 0, hwm: 0, destroyed: false, sampled: None }
    }

    /// The bytes the pool holds from the device: the driver's last sample, else the
    /// high-water mark rounded up to the granularity; never less than what is live.
    #[inline]
    fn reserve(&self, g: u64) -> u64 {
        match self.sampled {
            Some(r) => r.max(self.live),
            None => round_up(self.hwm, g).max(self.live),
        }
    }

    /// Reserve not handed out: what a trim would give back.
    #[inline]
    fn idle(&self, g: u64) -> u64 {
        self.reserve(g) - self.live
    }
    #[inline]
    fn numbers(&self, g: u64) -> (u64, u64) {
        let idle = self.idle(g);
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
    #[inline]
    fn numbers(&self) -> (u64, u64) {
        self.gaps.numbers()
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

    #[inline]
    fn take(&mut self, value: u64) -> Option<Window> {
        let w = (self.since != u64::MAX).then_some(Window { since_ns: self.since, min: self.min, max: self.max });
        *self = Extremes { since: u64::MAX, min: value, max: value };
        w
    }
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
    /// `FrameworkId` bits of the libraries it loaded.
    #[serde(default)]
    frameworks: u64,
    /// A framework lens's latest numbers, per device.
    #[serde(default)]
    lens: Vec<FrameworkCache>,
    /// The incident (and device) whose lens segments are arriving, and whether the first
    /// has come (it replaces the segments known before): `framework_segment` records count
    /// only right after their `framework_oom`.
    #[serde(default)]
    lens_segments_for: Option<(usize, i16, bool)>,
    /// Streams it made and has not destroyed (the keys of `Model::streams` with its pid).
    #[serde(default)]
    streams: u64,
    /// The most it had at once: the driver keeps a destroyed stream's memory for the next.
    #[serde(default)]
    streams_peak: u64,
    /// Its largest requests per device within the fit window (`fit`).
    #[serde(default)]
    demand: Vec<fit::DemandWindow>,
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
pub const CHECKPOINT_VERSION: u8 = 7;

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
    /// Each live stream a process made: (pid, handle).
    #[serde(default)]
    streams: BTreeSet<(u32, u64)>,
    segments: BTreeMap<(u32, u64), Segment>,
    devices: BTreeMap<i16, DeviceSample>,
    incidents: Vec<IncidentState>,
    anomalies: Vec<u64>,
    now: u64,
    events: u64,
    #[serde(skip)]
    pid_cache: Option<(u32, usize)>,
    device_live: Vec<DeviceLive>,
    /// The earliest event time seen: explanations give times since it.
    #[serde(default = "no_origin")]
    origin: u64,
    /// Incidents kept (0: all). A process that fails again and again while it runs (a
    /// server that answers each request's OOM and goes on) would otherwise grow the list,
    /// and every snapshot's copy of it, for as long as the agent runs.
    #[serde(skip)]
    incident_cap: usize,
    /// The last incident id given (0: none yet, or a restored model: the last kept one's).
    #[serde(skip)]
    last_incident_id: u64,
    /// Incidents forgotten under `incident_cap`.
    #[serde(skip)]
    incidents_forgotten: u64,
    /// NVML's latest per-process usage, per device.
    gpu_samples: BTreeMap<i16, holders::GpuSample>,
    /// Processes, pools, segments and arenas looked at to judge incidents: bounded by
    /// [`incidents::JUDGE_WORK_BASE`] plus [`incidents::JUDGE_WORK_PER_EVENT`] per event, so
    /// that a capture's work grows with its length, not with processes × failures. A
    /// restored model starts a new allowance.
    #[serde(skip)]
    judge_visits: u64,
    /// Incidents not judged because that allowance was spent.
    #[serde(skip)]
    incidents_unjudged: u64,
}

fn no_origin() -> u64 {
    u64::MAX
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
            streams: BTreeSet::new(),
            segments: BTreeMap::new(),
            devices: BTreeMap::new(),
            incidents: Vec::new(),
            anomalies: vec![0; Anomaly::COUNT],
            now: 0,
            events: 0,
            pid_cache: None,
            device_live: Vec::new(),
            origin: u64::MAX,
            incident_cap: 0,
            last_incident_id: 0,
            incidents_forgotten: 0,
            gpu_samples: BTreeMap::new(),
            judge_visits: 0,
            incidents_unjudged: 0,
        }
    }

    /// Keeps at most about `cap` incidents (0: all, the default): past it, the oldest that
    /// no process is still adding to are forgotten, in batches of a fifth, and counted
    /// ([`Model::incidents_forgotten`]). Incident ids keep growing: a reader that has seen
    /// ids up to N of a process finds its new ones above N. Not part of a checkpoint: set it
    /// again after [`Model::restore`].
    pub fn set_incident_cap(&mut self, cap: usize) {
        self.incident_cap = cap;
    }

    /// Incidents forgotten under the cap of [`Model::set_incident_cap`] since this model
    /// was made or restored.
    pub fn incidents_forgotten(&self) -> u64 {
        self.incidents_forgotten
    }

    /// Incidents not judged: the work allowance for judging them was spent (see
    /// `judge_visits`); their verdict is unknown, saying so.
    pub fn incidents_unjudged(&self) -> u64 {
        self.incidents_unjudged
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Events applied so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// OOM incidents recorded so far.
    pub fn incident_count(&self) -> usize {
        self.incidents.len()
    }

    /// Processes known so far (each image of a process counts once).
    pub fn process_count(&self) -> usize {
        self.procs.len()
    }

    /// The pids of the processes known (each once).
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_pid.keys().copied()
    }

    /// Number of live allocations held in the address map (all processes).
    pub fn live_allocation_count(&self) -> usize {
        self.allocs.len()
    }

    /// Arenas known (VMM reservations, pools, framework segments): what a snapshot lists
    /// besides processes.
    pub fn arena_count(&self) -> usize {
        self.reservations.len() + self.pools.len() + self.segments.len()
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
        if ev.ts_ns < self.origin {
            self.origin = ev.ts_ns;
        }
        let Some(kind) = ev.kind() else {
            self.anomaly(self.by_pid.get(&ev.pid).copied(), Anomaly::UnknownKind);
            return;
        };
        let Some(api) = ev.api() else {
            self.anomaly(self.by_pid.get(&ev.pid).copied(), Anomaly::UnknownApi);
            return;
        };
        if kind == EventKind::GpuProcess {
            // A reader's NVML sample, not any process's event.
            self.on_gpu_process(ev);
            return;
        }
        if kind == EventKind::ProcessStart {
            self.process_start(ev.pid, ev.start_time(), ev.ppid(), ev.ts_ns);
            return;
        }
        let slot = self.slot_of(ev.pid);
        if !self.procs[slot].alive {
            self.anomaly(Some(slot), Anomaly::EventAfterExit);
            return;
        }
        let (ts, incident) = self.process_time(slot, ev);
        if ts > self.now {
            self.now = ts;
        }
        if incident {
            // Incident bookkeeping that precedes the event itself.
            self.incident_pre(slot, ev, kind, ts);
        }

        if matches!(kind, EventKind::FrameworkOom | EventKind::FrameworkStats)
            || (ev.failed() && matches!(kind, EventKind::Alloc | EventKind::VmmCreate))
        {
            self.note_demand(slot, ev, kind, ts);
        }
        if !self.dispatch(slot, ev, kind, api, ts) {
            return;
        }
        self.after_event(slot, ev);
    }

    /// The slot of `pid`'s process (made on its first event), through a one-entry cache.
    #[inline]
    fn slot_of(&mut self, pid: u32) -> usize {
        match self.pid_cache {
            Some((p, s)) if p == pid => s,
            _ => {
                let s = match self.by_pid.get(&pid) {
                    Some(&s) => s,
                    None => self.new_process(pid, 0),
                };
                self.pid_cache = Some((pid, s));
                s
            }
        }
    }

    /// Time: an event is applied at its process's latest time if it is older (threads
    /// reach the ring concurrently, so small steps back across threads are normal); a
    /// step back within one thread is an anomaly. Returns the time applied and whether
    /// an incident is open or awaiting its sample.
    #[inline]
    fn process_time(&mut self, slot: usize, ev: &Event) -> (u64, bool) {
        let p = &mut self.procs[slot];
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
    }

    /// The event's own effect: a failure counted (an OOM opens an incident), or the
    /// state change its kind makes. False where the process exited (nothing follows).
    #[inline]
    fn dispatch(&mut self, slot: usize, ev: &Event, kind: EventKind, api: Api, ts: u64) -> bool {
        if ev.failed() {
            if kind != EventKind::MemInfo && kind != EventKind::PoolSample {
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
                EventKind::PoolSample => self.on_pool_sample(slot, ev),
                EventKind::StreamCreate => self.on_stream_create(slot, ev),
                EventKind::StreamDestroy => self.on_stream_destroy(slot, ev),
                EventKind::ProcessExit => {
                    self.forget_demand(slot);
                    self.close_process(slot, ts);
                    return false;
                }
                EventKind::Dropped => {
                    let p = &mut self.procs[slot];
                    p.dropped_events = p.dropped_events.saturating_add(ev.dropped_count());
                }
                EventKind::Frameworks => self.procs[slot].frameworks |= ev.framework_mask(),
                EventKind::FrameworkSample => self.on_framework_sample(slot, ev, ts),
                EventKind::FrameworkOom => self.on_framework_oom(slot, ev, ts),
                EventKind::FrameworkSegment => self.on_framework_segment(slot, ev, ts),
                EventKind::FrameworkStats => self.on_framework_stats(slot, ev),
                EventKind::ProcessStart | EventKind::HookMiss | EventKind::GpuProcess => {}
            }
        }
        true
    }

    /// After the event: the open incident's bytes freed since it opened, and the event
    /// kept in the process's lead-up ring.
    #[inline]
    fn after_event(&mut self, slot: usize, ev: &Event) {
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
}

impl Default for Model {
    fn default() -> Self {
        Model::new(ModelConfig::default())
    }
}
