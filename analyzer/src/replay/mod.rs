//! The replay engine: events (from `crate::input`) go into one [`Model`], whose own numbers
//! are sampled into bounded series ([`timelines`]) and, at one moment, an address layout
//! ([`layout`]). Every number in the report comes from the model; `crate::build` makes the
//! report of the final state.

mod fit;
mod fit_trend;
mod join;
mod layout;
mod timelines;

pub(crate) use join::SegmentKey;

use crate::report::*;
use crate::series::Series;
use crate::Options;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use timelines::Grid;
use vramhook_model::{ArenaKind, ArenaView, LayoutEntry, Model, ModelSnapshot, ProcessView};
use vramhook_protocol::capture::{ProcessEnd, ProcessInfo};
use vramhook_protocol::record::{Event, EventKind};

/// Per-event maps keyed by small integers, not SipHash. Fixed seed: the same capture gives
/// the same report.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

/// Processes with their own timeline; more are counted in device totals only.
const MAX_TRACKED_PROCS: usize = 512;
/// Arenas with their own fragmentation series.
const MAX_TRACKED_ARENAS: usize = 256;
/// Layout entries kept in the report (the largest).
const MAX_LAYOUT_ENTRIES: usize = 5000;
const MAX_LAYOUT_ARENAS: usize = 500;
/// Samples taken out of turn (new processes, OOMs): bounded, so that hostile input made of
/// such events cannot make the replay O(events × state).
const MAX_FORCED_SAMPLES: u32 = 10_000;
/// Work (processes + devices visited) that samples taken out of turn may cost in all: 10,000
/// forced samples of a model with 10,000 processes would be 10^8 process views (a sample
/// costs about 0.4 µs per process).
const FORCED_WORK_BUDGET: u64 = 2_000_000;
/// Work (processes + live allocations) that full views of processes at their exit may cost
/// in all (each is a snapshot of the model); exits past it keep a view of the process alone.
/// 10,000 processes each exiting made 10^8.
const EXIT_WORK_BUDGET: u64 = 2_000_000;
/// Kinds that take the slow path (as bits): exits, device samples, starts, a lens's samples
/// and OOMs (for the framework timelines), and drop markers (one may follow its process's
/// end).
const SPECIAL_KINDS: u64 = 1 << EventKind::ProcessExit as u8
    | 1 << EventKind::Dropped as u8
    | 1 << EventKind::MemInfo as u8
    | 1 << EventKind::ProcessStart as u8
    | 1 << EventKind::FrameworkSample as u8
    | 1 << EventKind::FrameworkOom as u8;
/// (process, device, framework) caches with their own timelines.
const MAX_TRACKED_FRAMEWORKS: usize = 256;
/// Framework OOM moments listed per cache timeline.
const MAX_FRAMEWORK_OOMS: usize = 1000;
/// Corrupt frames listed per input.
pub(crate) const MAX_CORRUPT_LISTED: usize = 100;

struct ProcTrack {
    pid: u32,
    series: Series,
    last: u64,
}

#[derive(Default)]
struct DevTrack {
    device: i16,
    live: Series,
    free: Series,
    total: Option<u64>,
    free_latest: Option<u64>,
    min_free: Option<u64>,
    peak_live: u64,
    last_live: u64,
}

struct ArenaTrack {
    pid: u32,
    device: i16,
    kind: ArenaKind,
    base: u64,
    size: u64,
    frag: Series,
    largest: Series,
    free: Series,
}

/// A framework's cache on one device of one process, over time.
pub(crate) struct FrameworkTrack {
    pub source: &'static str,
    pub samples: u64,
    pub reserved: Series,
    pub allocated: Series,
    pub largest: Series,
    pub frag: Series,
    pub ooms: Vec<FrameworkOomMark>,
}

pub(crate) struct ExitInfo {
    pub view: ProcessView,
    pub top: Vec<LayoutEntry>,
}

/// A framework's cache in the report: (process as shown, device, `FrameworkId` code, where
/// its numbers came from: "lens" or "snapshot").
pub(crate) type CacheKey = (u32, i16, u8, &'static str);

pub struct Replayer {
    pub(crate) model: Model,
    /// The fit of each process's next large request (`fit`).
    fits: fit::FitTracks,
    /// The fit's trend rule (`fit_trend`).
    trends: fit_trend::TrendTracks,
    pub(crate) opts: Options,
    pub(crate) applied: u64,
    next_sample: u64,
    pub(crate) first_ts: Option<u64>,
    pub(crate) last_ts: u64,
    /// Earliest event time seen (inputs need not be in time order).
    pub(crate) min_ts: u64,
    pub(crate) from_abs: u64,
    pub(crate) to_abs: u64,
    at_abs: Option<u64>,
    /// Events at or after this time take the slow path (layout capture, end of window).
    watch_ts: u64,
    pub(crate) stopped: bool,
    /// Indexed by the model's process index; as long as the model's process list at the
    /// last sample.
    procs: Vec<Option<ProcTrack>>,
    /// The indices of `procs` that hold a track.
    tracked_slots: Vec<usize>,
    /// The time grid of the live-bytes timelines.
    grid: Grid,
    /// In order of first appearance (indices stay valid); reports sort them.
    devs: Vec<DevTrack>,
    /// Index of each device's track in `devs`.
    dev_index: FastMap<i16, usize>,
    /// What was past the per-category limits.
    pub(crate) folded: Folded,
    /// Pids replayed, and pids folded.
    admitted: FastMap<u32, ()>,
    /// Processes replayed (at most `max_items`): a pid reused, or its new image after an
    /// `exec`, is another process of an admitted pid.
    processes_admitted: usize,
    /// Each folded pid's latest start time (0: not known), to count its processes.
    folded_pids: FastMap<u32, u64>,
    /// The (pid, time) of the last driver failure folded past the incident limit: the
    /// framework's failure that follows it is the same incident, not counted again.
    last_folded_oom: Option<(u32, u64)>,
    /// Device numbers replayed and folded (bit per ordinal + 32,768).
    dev_admitted: Vec<u64>,
    dev_folded: Vec<u64>,
    dev_admitted_count: usize,
    /// The last (pid, device) found admitted: most events repeat it.
    last_ok: Option<(u32, i16)>,
    forced_work: u64,
    exit_work: u64,
    /// Exits past the budget of full views (no histograms, no largest allocations).
    pub(crate) exits_summarised: u64,
    arenas: BTreeMap<(u32, i16, ArenaKind, u64), ArenaTrack>,
    /// Keyed by (pid, device, framework code, source): a lens's readings and a snapshot's of
    /// the same cache are drawn apart.
    pub(crate) frameworks: BTreeMap<CacheKey, FrameworkTrack>,
    /// Caches past [`MAX_TRACKED_FRAMEWORKS`] (counted, no timeline).
    pub(crate) frameworks_untracked: u64,
    /// The snapshots' segments, looked up in the captures' allocations.
    pub(crate) join: join::JoinIndex,
    /// Each snapshot's synthetic process: its input, and the capture's process it joined.
    pub(crate) snapshot_pids: BTreeMap<u32, (String, Option<u32>)>,
    /// The allocations live at each snapshot `oom` entry, by stack (snapshots with history).
    pub(crate) snapshot_stacks: Vec<crate::input::torch::OomStacks>,
    /// Keyed by the model's process index (its position in `snapshot().processes`).
    pub(crate) exits: FastMap<usize, ExitInfo>,
    pub(crate) layout: Option<LayoutReport>,
    layout_fixed: bool,
    peak_captured: u64,
    /// Losses from process-end frames (writer drops, lost in flight), by model process index.
    pub(crate) ends: BTreeMap<usize, (u64, u64)>,
    pub(crate) inputs: Vec<InputReport>,
    pub(crate) notes: Vec<String>,
    /// (monotonic, wall) ns anchor of the first capture: puts PyTorch snapshot times (wall
    /// clock) on the captures' monotonic clock.
    pub(crate) clock: Option<(u64, u64)>,
    tracked_overflow: bool,
    forced: u32,
    /// The next bucket edge of the live-bytes timelines: totals are flushed there.
    flush_at: u64,
    /// Flushes at bucket edges (samples flush too).
    edge_flushes: u64,
    /// Work counted against the input's size (snapshots: `crate::input::torch`).
    pub(crate) work: crate::Work,
    /// Live framework segments that earlier snapshots left in the model: every OOM after
    /// them looks at them too.
    pub(crate) snapshot_segments: u64,
    /// Why the memory or time budget stopped the analysis.
    pub(crate) over_budget: Option<String>,
    /// The budget, not `--to`, stopped the replay.
    pub(crate) budget_stopped: bool,
    started: std::time::Instant,
    /// Driver failures seen (for the budget's looks).
    ooms_seen: u64,
}

/// Events between two looks at the memory and time budget (a look reads /proc: every
/// 262,144 events it costs nothing at 21 M events/s).
const BUDGET_EVERY: u64 = 1 << 18;
/// Driver failures between two looks.
const OOMS_PER_BUDGET_LOOK: u64 = 16;

impl Replayer {
    pub fn new(opts: Options) -> Replayer {
        Replayer {
            model: Model::new(opts.model.clone()),
            fits: fit::FitTracks::default(),
            trends: fit_trend::TrendTracks::default(),
            folded: Folded { max_items: opts.max_items as u64, ..Folded::default() },
            opts,
            applied: 0,
            next_sample: 1,
            first_ts: None,
            last_ts: 0,
            min_ts: u64::MAX,
            from_abs: 0,
            to_abs: u64::MAX,
            at_abs: None,
            watch_ts: u64::MAX,
            stopped: false,
            procs: Vec::new(),
            tracked_slots: Vec::new(),
            grid: Grid::default(),
            devs: Vec::new(),
            dev_index: FastMap::default(),
            admitted: FastMap::default(),
            processes_admitted: 0,
            folded_pids: FastMap::default(),
            last_folded_oom: None,
            dev_admitted: vec![0; 1024],
            dev_folded: vec![0; 1024],
            dev_admitted_count: 0,
            last_ok: None,
            forced_work: 0,
            exit_work: 0,
            exits_summarised: 0,
            arenas: BTreeMap::new(),
            frameworks: BTreeMap::new(),
            frameworks_untracked: 0,
            join: join::JoinIndex::default(),
            snapshot_pids: BTreeMap::new(),
            snapshot_stacks: Vec::new(),
            exits: FastMap::default(),
            layout: None,
            layout_fixed: false,
            peak_captured: 0,
            ends: BTreeMap::new(),
            inputs: Vec::new(),
            notes: Vec::new(),
            clock: None,
            tracked_overflow: false,
            flush_at: u64::MAX,
            edge_flushes: 0,
            forced: 0,
            work: crate::Work::default(),
            snapshot_segments: 0,
            over_budget: None,
            budget_stopped: false,
            ooms_seen: 0,
            started: std::time::Instant::now(),
        }
    }

    /// Whether the memory and time budget still holds; when it does not, the replay stops
    /// (what was read is reported, with a note) and the analysis ends with the budget's error.
    #[cold]
    pub(crate) fn within_budget(&mut self) -> bool {
        if self.over_budget.is_some() {
            return false;
        }
        let over = if let Some(limit) = self.opts.time_limit.filter(|l| self.started.elapsed() > *l) {
            Some(format!("the analysis took more than its time limit of {:.1} s (--time-limit)", limit.as_secs_f64()))
        } else {
            let max = self.opts.max_memory_mib;
            resident_mib().filter(|rss| max > 0 && *rss > max).map(|rss| {
                format!("the analysis used {rss} MiB of memory, more than its limit of {max} MiB (--max-memory)")
            })
        };
        let Some(message) = over else { return true };
        self.notes.push(format!("{message}: stopped after {} events; this report is partial", self.applied));
        self.over_budget = Some(message);
        self.budget_stopped = !self.stopped;
        self.stopped = true;
        false
    }

    fn start_clock(&mut self, ts: u64) {
        self.first_ts = Some(ts);
        self.grid = Grid::starting_at(ts, self.opts.max_points.max(4) as u64);
        self.from_abs = self.opts.from_ns.map_or(0, |f| ts.saturating_add(f));
        self.to_abs = self.opts.to_ns.map_or(u64::MAX, |t| ts.saturating_add(t));
        self.at_abs = self.opts.at_ns.map(|a| ts.saturating_add(a));
        self.watch_ts = self.to_abs.min(self.at_abs.unwrap_or(u64::MAX));
    }

    /// Applies one event (the hot path).
    #[inline(always)]
    pub fn event(&mut self, ev: &Event) {
        if self.stopped {
            return;
        }
        if self.last_ok != Some((ev.pid, ev.device)) && !self.admit(ev) {
            return;
        }
        if self.first_ts.is_none() {
            self.start_clock(ev.ts_ns);
        }
        let special = ev.result != 0 || SPECIAL_KINDS.checked_shr(u32::from(ev.kind)).unwrap_or(0) & 1 != 0;
        if (ev.ts_ns >= self.watch_ts || special) && !self.slow_pre(ev) {
            return;
        }
        if ev.ts_ns > self.last_ts {
            self.last_ts = ev.ts_ns;
        }
        if ev.ts_ns < self.min_ts {
            self.min_ts = ev.ts_ns;
        }
        if ev.ts_ns >= self.flush_at {
            // Live bytes are taken from the model at their timelines' bucket edges.
            self.edge_flushes += 1;
            self.flush(ev.ts_ns);
        }
        self.model.apply(ev);
        if !self.join.is_empty() {
            self.join.see(ev);
        }
        if ev.kind == EventKind::FrameworkStats as u8 && ev.result == 0 {
            self.fit_after_lens(ev.pid, ev.ts_ns);
        }
        self.applied += 1;
        if self.applied >= self.next_sample {
            self.sample(ev.ts_ns);
        }
        if self.applied.is_multiple_of(BUDGET_EVERY) {
            self.within_budget();
        }
    }

    fn force_sample(&mut self, at: u64) {
        if self.may_force() {
            self.next_sample = self.next_sample.min(at);
        }
    }

    /// Whether a sample out of turn is still within its bounds (count and work).
    fn may_force(&mut self) -> bool {
        if self.forced >= MAX_FORCED_SAMPLES || self.forced_work >= FORCED_WORK_BUDGET {
            return false;
        }
        self.forced += 1;
        // A sample costs O(processes + arenas): 10,000 arenas sampled at each of 10,000
        // failures took 8 s.
        self.forced_work += (self.model.process_count() + self.model.arena_count() + self.devs.len()) as u64 + 1;
        true
    }

    /// Resumes from a model checkpoint (a capture that starts mid-stream). Its processes and
    /// incidents count against the limits as replayed ones do; a checkpoint that holds more
    /// of either than `max_items` is refused, and the replay starts empty instead. Its
    /// devices are admitted as they reach the timelines ([`Replayer::device_track`]).
    pub(crate) fn resume_from(&mut self, model: Model) -> Result<(), String> {
        let max = self.opts.max_items;
        let counts =
            [("processes", self.processes_admitted + model.process_count()), ("incidents", model.incident_count())];
        for (what, n) in counts {
            if n > max {
                return Err(format!("it holds {n} {what}, more than the limit of {max} (--max-items)"));
            }
        }
        for pid in model.pids() {
            self.admitted.insert(pid, ());
        }
        self.processes_admitted += model.process_count();
        self.model = model;
        Ok(())
    }

    /// Whether the process exists within the limit of processes (admitting it if there is
    /// room); a pid past the limit is counted as folded.
    fn admit_pid(&mut self, pid: u32, start_time: u64) -> bool {
        if self.admitted.contains_key(&pid) {
            return true;
        }
        if self.processes_admitted < self.opts.max_items {
            self.admitted.insert(pid, ());
            self.processes_admitted += 1;
            return true;
        }
        self.fold_pid(pid, start_time);
        false
    }

    /// Counts a process past the limit: a pid not seen before, or a folded pid started
    /// again (`start_time`, 0 where the caller does not know it).
    fn fold_pid(&mut self, pid: u32, start_time: u64) {
        match self.folded_pids.entry(pid) {
            Entry::Vacant(v) => {
                v.insert(start_time);
                self.folded.processes += 1;
            }
            Entry::Occupied(mut last) if start_time != 0 => {
                if *last.get() != 0 && *last.get() != start_time {
                    self.folded.processes += 1;
                }
                last.insert(start_time);
            }
            Entry::Occupied(_) => {}
        }
    }

    /// Whether a start of (pid, start_time) of an admitted pid at `ts` stays within the limit
    /// of processes: one that opens another process under the pid (pid reuse, `exec`) counts
    /// as a new one. Past the limit the pid is folded from then on, and its process before
    /// ends there, as the start would have ended it.
    fn admit_another_process(&mut self, pid: u32, start_time: u64, ts: u64) -> bool {
        if !self.model.opens_another_process(pid, start_time) {
            return true;
        }
        if self.processes_admitted < self.opts.max_items {
            self.processes_admitted += 1;
            return true;
        }
        self.admitted.remove(&pid);
        self.last_ok = None;
        self.fold_pid(pid, start_time);
        self.model.process_exit(pid, 0, None, ts);
        false
    }

    /// Whether the event's process and device are within the limits (admitting them if
    /// there is room); an event past them is counted and not replayed.
    #[cold]
    fn admit(&mut self, ev: &Event) -> bool {
        let bytes = if ev.result == 0 && ev.kind == EventKind::Alloc as u8 { ev.size } else { 0 };
        let start_time = if ev.kind == EventKind::ProcessStart as u8 { ev.start_time() } else { 0 };
        if !self.admit_pid(ev.pid, start_time) {
            self.folded.process_events += 1;
            self.folded.process_bytes = self.folded.process_bytes.saturating_add(bytes);
            return false;
        }
        if !self.admit_device(ev.device) {
            self.folded.device_events += 1;
            self.folded.device_bytes = self.folded.device_bytes.saturating_add(bytes);
            return false;
        }
        self.last_ok = Some((ev.pid, ev.device));
        true
    }

    /// Whether the device is within the limit of devices (admitting it if there is room;
    /// -1, the device not known, always is); a device past the limit is counted as folded.
    pub(crate) fn admit_device(&mut self, device: i16) -> bool {
        if device == -1 {
            return true;
        }
        let bit = (i32::from(device) + 32_768) as usize;
        let (word, mask) = (bit / 64, 1u64 << (bit % 64));
        if self.dev_admitted[word] & mask != 0 {
            return true;
        }
        if self.dev_admitted_count < self.opts.max_items {
            self.dev_admitted[word] |= mask;
            self.dev_admitted_count += 1;
            return true;
        }
        if self.dev_folded[word] & mask == 0 {
            self.dev_folded[word] |= mask;
            self.folded.devices += 1;
        }
        false
    }

    /// The timeline track of a device the model reports, created on first use. A device
    /// can reach the model without an event of its own (an allocation in a resumed
    /// checkpoint, freed later): it is admitted here too, and past the limit has no track.
    pub(super) fn device_track(&mut self, device: i16) -> Option<usize> {
        if let Some(&i) = self.dev_index.get(&device) {
            return Some(i);
        }
        if !self.admit_device(device) {
            return None;
        }
        self.devs.push(DevTrack { device, ..DevTrack::default() });
        self.dev_index.insert(device, self.devs.len() - 1);
        Some(self.devs.len() - 1)
    }

    /// Returns false when the event must not be applied (past `--to`).
    #[cold]
    fn slow_pre(&mut self, ev: &Event) -> bool {
        if ev.ts_ns > self.to_abs {
            self.stopped = true;
            return false;
        }
        // An agent wrote the marker of what its capture queue dropped after the process's
        // end frame (before the fix of issue 27): the loss is still that process's, and an
        // event after exit would be refused.
        if ev.kind == EventKind::Dropped as u8 && self.model.dropped_after_exit(ev.pid, ev.dropped_count()) {
            return false;
        }
        if let Some(at) = self.at_abs {
            if ev.ts_ns >= at && !self.layout_fixed {
                self.capture_layout(at, LayoutReason::At);
                self.layout_fixed = true;
            }
        }
        if ev.kind == EventKind::ProcessStart as u8 && !self.admit_another_process(ev.pid, ev.start_time(), ev.ts_ns) {
            self.folded.process_events += 1;
            return false;
        }
        if ev.kind == EventKind::FrameworkOom as u8
            && ev.result == 0
            && self.model.incident_count() >= self.opts.max_items
            && self.model.framework_oom_opens_incident(ev)
        {
            // A framework's failure with no driver failure to join opens an incident too;
            // one that follows a folded driver failure is that incident, counted already.
            let window = self.opts.model.incident_window_ns;
            let joins_folded = self
                .last_folded_oom
                .is_some_and(|(pid, ts)| pid == ev.pid && ev.ts_ns >= ts && ev.ts_ns - ts <= window);
            if !joins_folded {
                self.folded.ooms += 1;
                self.folded.oom_bytes = self.folded.oom_bytes.saturating_add(ev.framework_request());
            }
            return false;
        }
        if ev.result == vramhook_protocol::record::CUDA_ERROR_OUT_OF_MEMORY && ev.kind != EventKind::MemInfo as u8 {
            // An incident costs the model every arena of the process (and keeps a line per
            // arena): the budget is looked at every few, not every few thousand events.
            self.ooms_seen += 1;
            if self.ooms_seen.is_multiple_of(OOMS_PER_BUDGET_LOOK) && !self.within_budget() {
                return false;
            }
            if self.model.incident_count() >= self.opts.max_items {
                // Past the limit of incidents: counted, not analysed.
                self.last_folded_oom = Some((ev.pid, ev.ts_ns));
                self.folded.ooms += 1;
                self.folded.oom_bytes = self.folded.oom_bytes.saturating_add(ev.size);
                return false;
            }
            // The state the failing call met, then the failure itself (per-event timelines
            // already hold the bytes; this adds the arenas).
            if self.may_force() {
                self.sample(ev.ts_ns);
            }
            self.fit_failure(ev.pid, ev.device, ev.ts_ns, ev.size);
            if !self.layout_fixed && ev.ts_ns >= self.from_abs && self.pid_selected(ev.pid) {
                self.capture_layout(ev.ts_ns, LayoutReason::FirstOom);
                self.layout_fixed = true;
            }
            self.force_sample(self.applied + 1);
        }
        if ev.kind == EventKind::ProcessExit as u8 && ev.result == 0 {
            self.remember_exit(ev.pid, 0, ev.ts_ns);
            self.force_sample(self.applied + 1);
        }
        if ev.kind == EventKind::ProcessStart as u8 {
            // A new process (or a new image after exec): learn its index after this event.
            self.force_sample(self.applied + 1);
        }
        let sample = ev.kind == EventKind::MemInfo as u8 && ev.result == 0;
        if let Some(i) = if sample { self.device_track(ev.device) } else { None } {
            let d = &mut self.devs[i];
            d.total = Some(ev.size);
            d.free_latest = Some(ev.addr);
            d.min_free = Some(d.min_free.map_or(ev.addr, |m| m.min(ev.addr)));
            d.free.push(ev.ts_ns, ev.addr as f64);
        }
        // A snapshot's importer draws its own timeline (from its trace, under the process it
        // joined): its synthetic process's records are not a lens's.
        let lens = ev.pid < crate::input::torch::SNAPSHOT_PID_BASE;
        if lens && ev.result == 0 && ev.framework_allocated() <= ev.framework_reserved() {
            let (reserved, allocated) = (ev.framework_reserved(), ev.framework_allocated());
            let code = ev.framework() as u8;
            if ev.kind == EventKind::FrameworkSample as u8 {
                let largest = ev.largest_free_block();
                self.framework_point((ev.pid, ev.device, code, "lens"), ev.ts_ns, reserved, allocated, largest);
            } else if ev.kind == EventKind::FrameworkOom as u8 {
                let largest = ev.largest_free_block();
                let key = (ev.pid, ev.device, code, "lens");
                self.framework_point(key, ev.ts_ns, reserved, allocated, largest);
                self.framework_oom_mark(key, ev.ts_ns, ev.framework_request());
                self.fit_failure(ev.pid, ev.device, ev.ts_ns, ev.framework_request());
            }
        }
        true
    }

    /// The track of a framework's cache, created on first use (`None` past the limit).
    fn framework_track(&mut self, key: CacheKey) -> Option<&mut FrameworkTrack> {
        let source = key.3;
        if !self.frameworks.contains_key(&key) {
            if self.frameworks.len() >= MAX_TRACKED_FRAMEWORKS {
                self.frameworks_untracked += 1;
                return None;
            }
            let n = self.opts.max_points;
            let track = FrameworkTrack {
                source,
                samples: 0,
                reserved: Series::new(n),
                allocated: Series::new(n),
                largest: Series::new(n),
                frag: Series::new(n),
                ooms: Vec::new(),
            };
            self.frameworks.insert(key, track);
        }
        self.frameworks.get_mut(&key)
    }

    /// One reading of a framework's cache: reserved and allocated bytes, and the largest free
    /// block where it was measured (fragmentation is only known then).
    pub(crate) fn framework_point(
        &mut self,
        key: CacheKey,
        ts: u64,
        reserved: u64,
        allocated: u64,
        largest: Option<u64>,
    ) {
        let Some(t) = self.framework_track(key) else { return };
        t.samples += 1;
        t.reserved.push(ts, reserved as f64);
        t.allocated.push(ts, allocated as f64);
        if let Some(b) = largest {
            let free = reserved.saturating_sub(allocated);
            t.largest.push(ts, b as f64);
            t.frag.push(ts, vramhook_model::fragmentation(b, free));
        }
    }

    /// The framework gave up on a request of `requested` bytes.
    pub(crate) fn framework_oom_mark(&mut self, key: CacheKey, ts: u64, requested: u64) {
        let Some(t) = self.framework_track(key) else { return };
        if t.ooms.len() < MAX_FRAMEWORK_OOMS {
            t.ooms.push(FrameworkOomMark { ts_ns: ts, requested_bytes: requested });
        }
    }

    pub(crate) fn pid_selected(&self, pid: u32) -> bool {
        let pid = self.view_pid(pid);
        self.opts.pids.is_empty() || self.opts.pids.contains(&pid)
    }

    /// The process a report shows `pid`'s numbers under: a snapshot's synthetic process that
    /// joined a capture's process is that process.
    pub(crate) fn view_pid(&self, pid: u32) -> u32 {
        self.snapshot_pids.get(&pid).and_then(|s| s.1).unwrap_or(pid)
    }

    /// Expects a snapshot (its segments are looked up in the captures replayed next).
    pub(crate) fn expect_snapshot(&mut self, name: &str, segments: &[SegmentKey]) {
        self.join.expect(name, segments, self.opts.max_items);
    }

    /// The device's total bytes, when a driver sample said.
    pub(crate) fn device_total(&self, device: i16) -> Option<u64> {
        self.dev_index.get(&device).and_then(|&i| self.devs[i].total)
    }

    pub fn process_info(&mut self, info: &ProcessInfo) {
        if !self.stopped
            && self.admit_pid(info.pid, info.start_time)
            && self.admit_another_process(info.pid, info.start_time, self.last_ts)
        {
            self.model.process_info(info);
            // It may name a new process: learn its index at the next event.
            self.force_sample(self.applied);
        }
    }

    /// A framework segment (PyTorch): straight to the model.
    pub fn framework_segment(
        &mut self,
        pid: u32,
        device: i16,
        base: u64,
        size: u64,
        blocks: &[vramhook_model::Block],
        ts: u64,
    ) {
        if !self.stopped {
            self.model.framework_segment(pid, device, base, size, blocks, ts);
        }
    }

    pub fn process_end(&mut self, end: &ProcessEnd) {
        if self.stopped || !self.admit_pid(end.pid, 0) {
            return;
        }
        // Per process, not per pid: a pid reused is another process with its own losses.
        if let Some(slot) = self.model.process_slot(end.pid, end.start_time) {
            let e = self.ends.entry(slot).or_default();
            e.0 = e.0.saturating_add(end.dropped);
            e.1 = e.1.saturating_add(end.lost_in_flight);
        }
        // The reader closes a stream after the process is gone: its time is an upper bound.
        let ts = end.ts_ns.min(self.last_ts);
        self.remember_exit(end.pid, end.start_time, ts);
        self.model.process_exit(end.pid, end.start_time, end.exit_status, end.ts_ns);
        // A sample per process-end frame was O(processes) each: within the budget of samples
        // out of turn; past it, the timelines are flushed (O(tracked)).
        if self.may_force() {
            self.sample(ts);
        } else {
            self.flush(ts);
        }
    }

    /// Keeps what the process held just before the model releases it.
    fn remember_exit(&mut self, pid: u32, start_time: u64, ts: u64) {
        let cost = (self.model.process_count() + self.model.live_allocation_count()) as u64 + 1;
        if self.exit_work.saturating_add(cost) > EXIT_WORK_BUDGET {
            // Past the budget: this process's own view (no histograms, no largest
            // allocations) and the timelines flushed, at the cost of this process alone.
            if let Some((slot, view)) = self.model.process_view(pid, start_time, false) {
                self.flush(ts);
                self.exits_summarised += 1;
                self.exits.insert(slot, ExitInfo { view, top: Vec::new() });
            }
            return;
        }
        self.exit_work += cost;
        let snap = self.model.snapshot();
        let Some(slot) = snap.processes.iter().rposition(|p| {
            p.pid == pid && p.alive && (start_time == 0 || p.start_time == start_time || p.start_time == 0)
        }) else {
            return;
        };
        self.sample_from(&snap, ts);
        let mut top = self.model.layout(Some(pid));
        top.sort_unstable_by_key(|e| std::cmp::Reverse(e.size));
        top.truncate(10);
        let view = snap.processes[slot].clone();
        self.exits.insert(slot, ExitInfo { view, top });
    }
}

/// Resident memory of this process in MiB (`None` where /proc does not say).
fn resident_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramhook_protocol::record::Api;

    fn ev(pid: u32, ts: u64, kind: EventKind, addr: u64, size: u64) -> Event {
        let e = if kind == EventKind::Alloc {
            Event::alloc(Api::cuMemAlloc_v2, addr, size)
        } else {
            Event::free(Api::cuMemFree_v2, addr)
        };
        e.by(pid, pid).at(ts).on_device(0)
    }

    /// Flushes follow the grid, not the processes: one that went quiet long ago (or exited)
    /// does not make every later event flush. About cap / 2 flushes per doubling of the span.
    #[test]
    fn flushes_are_bounded_by_the_grid() {
        let mut r = Replayer::new(Options { max_points: 100, ..Options::default() });
        r.event(&ev(1, 1_000, EventKind::Alloc, 0x1000, 4096));
        r.event(&ev(1, 2_000, EventKind::Free, 0x1000, 0));
        r.event(&Event::process_exit().by(1, 1).at(3_000).on_device(0));
        // One hour of another process, an event every 18 ms.
        let n = 200_000u64;
        for i in 0..n {
            let kind = if i % 2 == 0 { EventKind::Alloc } else { EventKind::Free };
            r.event(&ev(2, 10_000 + i * 18_000_000, kind, 0x9000, 1 << 20));
        }
        let doublings = 64 - (n * 18_000_000 / 1000).leading_zeros() as u64;
        assert!(r.edge_flushes <= 100 * doublings, "{} flushes at edges for {n} events", r.edge_flushes);
        assert!(r.edge_flushes >= 50, "the grid must still be followed: {}", r.edge_flushes);
    }
}
