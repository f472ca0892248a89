//! The replay engine: streams inputs frame by frame into one [`Model`], sampling the model's
//! own numbers into bounded series. Every number in the report comes from the model.

use crate::report::*;
use crate::series::Series;
use crate::{AnalyzeError, Options};
use std::collections::{BTreeMap, HashMap};

/// Per-event maps keyed by small integers: the model's integer hasher, not SipHash.
/// Fixed seed: the same capture gives the same report.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;
use vramhook_model::{ArenaKind, LayoutEntry, Model, ModelSnapshot, ProcessView};
use vramhook_protocol::capture::{CaptureError, CaptureReader, Frame, ProcessEnd, ProcessInfo, SeekSource};
use vramhook_protocol::record::{Event, EventKind};

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
/// Kinds that take the slow path (as bits): exits, device samples, starts.
const SPECIAL_KINDS: u64 =
    1 << EventKind::ProcessExit as u8 | 1 << EventKind::MemInfo as u8 | 1 << EventKind::ProcessStart as u8;
/// Corrupt frames listed per input.
const MAX_CORRUPT_LISTED: usize = 100;

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

pub(crate) struct ExitInfo {
    pub view: ProcessView,
    pub top: Vec<LayoutEntry>,
}

pub struct Replayer {
    pub(crate) model: Model,
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
    /// Pids replayed (at most `max_items`), and pids folded.
    admitted: FastMap<u32, ()>,
    folded_pids: FastMap<u32, ()>,
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
    /// Keyed by the model's process index (its position in `snapshot().processes`).
    pub(crate) exits: FastMap<usize, ExitInfo>,
    pub(crate) layout: Option<LayoutReport>,
    layout_fixed: bool,
    peak_captured: u64,
    pub(crate) ends: BTreeMap<u32, (u64, u64)>,
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
}

impl Replayer {
    pub fn new(opts: Options) -> Replayer {
        Replayer {
            model: Model::new(opts.model.clone()),
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
            folded_pids: FastMap::default(),
            dev_admitted: vec![0; 1024],
            dev_folded: vec![0; 1024],
            dev_admitted_count: 0,
            last_ok: None,
            forced_work: 0,
            exit_work: 0,
            exits_summarised: 0,
            arenas: BTreeMap::new(),
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
        }
    }

    fn start_clock(&mut self, ts: u64) {
        self.first_ts = Some(ts);
        self.grid = Grid { origin: ts, width: 1000, cap: self.opts.max_points.max(4) as u64 };
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
        self.applied += 1;
        if self.applied >= self.next_sample {
            self.sample(ev.ts_ns);
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
        self.forced_work += (self.model.process_count() + self.devs.len()) as u64 + 1;
        true
    }

    /// Whether the process exists within the limit of processes (admitting it if there is
    /// room); a pid past the limit is counted as folded.
    fn admit_pid(&mut self, pid: u32) -> bool {
        if self.admitted.contains_key(&pid) {
            return true;
        }
        if self.admitted.len() < self.opts.max_items {
            self.admitted.insert(pid, ());
            return true;
        }
        if self.folded_pids.insert(pid, ()).is_none() {
            self.folded.processes += 1;
        }
        false
    }

    /// Whether the event's process and device are within the limits (admitting them if
    /// there is room); an event past them is counted and not replayed.
    #[cold]
    fn admit(&mut self, ev: &Event) -> bool {
        let bytes = if ev.result == 0 && ev.kind == EventKind::Alloc as u8 { ev.size } else { 0 };
        if !self.admit_pid(ev.pid) {
            self.folded.process_events += 1;
            self.folded.process_bytes = self.folded.process_bytes.saturating_add(bytes);
            return false;
        }
        if ev.device != -1 {
            let bit = (i32::from(ev.device) + 32_768) as usize;
            let (word, mask) = (bit / 64, 1u64 << (bit % 64));
            if self.dev_admitted[word] & mask == 0 {
                if self.dev_admitted_count < self.opts.max_items {
                    self.dev_admitted[word] |= mask;
                    self.dev_admitted_count += 1;
                } else {
                    if self.dev_folded[word] & mask == 0 {
                        self.dev_folded[word] |= mask;
                        self.folded.devices += 1;
                    }
                    self.folded.device_events += 1;
                    self.folded.device_bytes = self.folded.device_bytes.saturating_add(bytes);
                    return false;
                }
            }
        }
        self.last_ok = Some((ev.pid, ev.device));
        true
    }

    /// Moves how the model's totals (tracked processes, devices) moved since the last call
    /// into their timelines, at time `now`. Each window's lowest and highest value land in
    /// the bucket where the window began, which is where following every event would have
    /// put them: a window never crosses a bucket edge, since the first event past the next
    /// edge of the shared [`Grid`] flushes before it is applied.
    fn flush(&mut self, now: u64) {
        let width = self.grid.width;
        for &slot in &self.tracked_slots {
            let Some(Some(t)) = self.procs.get_mut(slot) else { continue };
            if let Some((live, window)) = self.model.take_process_window(slot) {
                if let Some(w) = window {
                    t.series.coarsen_to(width);
                    push_window(&mut t.series, w, live);
                }
                t.last = live;
            }
        }
        for w in self.model.take_device_windows() {
            let i = dev_track(&mut self.devs, &mut self.dev_index, w.device);
            let dt = &mut self.devs[i];
            if let Some(window) = w.window {
                if dt.live.is_empty() {
                    dt.live = self.grid.series();
                }
                dt.live.coarsen_to(width);
                push_window(&mut dt.live, window, w.live);
            }
            dt.last_live = w.live;
            dt.peak_live = w.peak;
        }
        self.flush_at = self.grid.next_edge(now);
    }

    /// Returns false when the event must not be applied (past `--to`).
    #[cold]
    fn slow_pre(&mut self, ev: &Event) -> bool {
        if ev.ts_ns > self.to_abs {
            self.stopped = true;
            return false;
        }
        if let Some(at) = self.at_abs {
            if ev.ts_ns >= at && !self.layout_fixed {
                self.capture_layout(at, "--at");
                self.layout_fixed = true;
            }
        }
        if ev.result == vramhook_protocol::record::CUDA_ERROR_OUT_OF_MEMORY && ev.kind != EventKind::MemInfo as u8 {
            if self.model.incident_count() >= self.opts.max_items {
                // Past the limit of incidents: counted, not analysed.
                self.folded.ooms += 1;
                self.folded.oom_bytes = self.folded.oom_bytes.saturating_add(ev.size);
                return false;
            }
            // The state the failing call met, then the failure itself (per-event timelines
            // already hold the bytes; this adds the arenas).
            if self.may_force() {
                self.sample(ev.ts_ns);
            }
            if !self.layout_fixed && ev.ts_ns >= self.from_abs && self.pid_selected(ev.pid) {
                self.capture_layout(ev.ts_ns, "first OOM");
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
        if ev.kind == EventKind::MemInfo as u8 && ev.result == 0 {
            let i = dev_track(&mut self.devs, &mut self.dev_index, ev.device);
            let d = &mut self.devs[i];
            d.total = Some(ev.size);
            d.free_latest = Some(ev.addr);
            d.min_free = Some(d.min_free.map_or(ev.addr, |m| m.min(ev.addr)));
            d.free.push(ev.ts_ns, ev.addr as f64);
        }
        true
    }

    pub(crate) fn pid_selected(&self, pid: u32) -> bool {
        self.opts.pids.is_empty() || self.opts.pids.contains(&pid)
    }

    pub fn process_info(&mut self, info: &ProcessInfo) {
        if !self.stopped && self.admit_pid(info.pid) {
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
        if self.stopped || !self.admit_pid(end.pid) {
            return;
        }
        let e = self.ends.entry(end.pid).or_default();
        e.0 = e.0.saturating_add(end.dropped);
        e.1 = e.1.saturating_add(end.lost_in_flight);
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

    pub(crate) fn capture_layout(&mut self, ts: u64, reason: &str) {
        let mut entries = self.model.layout(None);
        if !self.opts.pids.is_empty() {
            entries.retain(|e| self.opts.pids.contains(&e.pid));
        }
        let total = entries.len();
        if total > MAX_LAYOUT_ENTRIES {
            entries.select_nth_unstable_by(MAX_LAYOUT_ENTRIES, |a, b| b.size.cmp(&a.size));
            entries.truncate(MAX_LAYOUT_ENTRIES);
            entries.sort_unstable_by_key(|e| (e.addr, e.pid));
        }
        let mut arenas: Vec<LayoutArena> = self
            .model
            .arenas()
            .into_iter()
            .filter(|a| self.pid_selected(a.pid))
            .map(|a| LayoutArena {
                pid: a.pid,
                device: a.device,
                kind: a.kind,
                base: a.base,
                size: a.size,
                occupied: a.occupied,
                free_in_arena: a.free_in_arena,
                largest_free_span: a.largest_free_span,
                fragmentation: a.fragmentation,
            })
            .collect();
        arenas.truncate(MAX_LAYOUT_ARENAS);
        self.layout = Some(LayoutReport {
            ts_ns: ts,
            reason: reason.to_string(),
            entries: entries.iter().map(layout_item).collect(),
            entries_omitted: (total - entries.len()) as u64,
            arenas,
        });
    }

    /// Records the model's numbers now, and schedules the next sample so that sampling
    /// costs a bounded fraction of the replay (`snapshot` is O(live state)).
    pub(crate) fn sample(&mut self, ts: u64) {
        let snap = self.model.snapshot_numbers();
        self.sample_from(&snap, ts);
    }

    fn sample_from(&mut self, snap: &ModelSnapshot, ts: u64) {
        let live = self.model.live_allocation_count() as u64;
        let state = live * 2 + snap.processes.len() as u64 + snap.arenas.len() as u64;
        // The pace follows the state's size: small states every event, large ones every ~4×
        // their size, and never more than ~2,000 samples per doubling of the event count.
        // (A sample costs O(processes + arenas): `snapshot_numbers` skips the histograms.)
        let stride = if state < 128 { 1 } else { state * 4 }.max(self.applied / 2048);
        self.next_sample = self.applied + stride;
        let mut total_live = 0u64;
        if self.procs.len() < snap.processes.len() {
            self.procs.resize_with(snap.processes.len(), || None);
        }
        for (slot, p) in snap.processes.iter().enumerate() {
            total_live = total_live.saturating_add(p.live_bytes);
            if self.procs[slot].is_none() && (p.live_bytes != 0 || p.alive) {
                if self.tracked_slots.len() >= MAX_TRACKED_PROCS {
                    self.tracked_overflow = true;
                    continue;
                }
                self.tracked_slots.push(slot);
                let series = self.grid.series();
                self.procs[slot] = Some(ProcTrack { pid: p.pid, series, last: u64::MAX });
            }
        }
        // What moved since the last flush lands before this sample's values (new tracks get
        // their process's history since it began).
        self.flush(ts);
        let width = self.grid.width;
        for (slot, p) in snap.processes.iter().enumerate() {
            let Some(Some(t)) = self.procs.get_mut(slot) else { continue };
            if t.last == 0 && p.live_bytes == 0 && !p.alive {
                continue;
            }
            t.series.coarsen_to(width);
            t.series.push(ts, p.live_bytes as f64);
            t.last = p.live_bytes;
        }
        for d in &snap.devices {
            let i = dev_track(&mut self.devs, &mut self.dev_index, d.ordinal);
            let t = &mut self.devs[i];
            if d.total.is_some() {
                t.total = d.total;
            }
        }
        for t in self.devs.iter_mut() {
            if t.last_live != 0 || t.live.is_empty() {
                if t.live.is_empty() {
                    t.live = self.grid.series();
                }
                t.live.coarsen_to(width);
                t.live.push(ts, t.last_live as f64);
            }
        }
        for a in &snap.arenas {
            let key = (a.pid, a.device, a.kind, a.base);
            if !self.arenas.contains_key(&key) {
                if self.arenas.len() >= MAX_TRACKED_ARENAS {
                    continue;
                }
                let n = self.opts.max_points;
                self.arenas.insert(
                    key,
                    ArenaTrack {
                        pid: a.pid,
                        device: a.device,
                        kind: a.kind,
                        base: a.base,
                        size: a.size,
                        frag: Series::new(n),
                        largest: Series::new(n),
                        free: Series::new(n),
                    },
                );
            }
            if let Some(t) = self.arenas.get_mut(&key) {
                t.size = t.size.max(a.size);
                t.frag.push(ts, a.fragmentation);
                t.largest.push(ts, a.largest_free_span as f64);
                t.free.push(ts, a.free_in_arena as f64);
            }
        }
        if !self.layout_fixed
            && total_live > 0
            && total_live > self.peak_captured.saturating_add(self.peak_captured / 10)
        {
            self.peak_captured = total_live;
            if ts >= self.from_abs {
                self.capture_layout(ts, "peak");
            }
        }
    }

    /// Streams one capture. Errors only in strict mode (a corrupt frame).
    pub fn capture<S: SeekSource>(&mut self, path: &str, input: S) -> Result<(), AnalyzeError> {
        let mut rep = InputReport {
            path: path.to_string(),
            kind: "capture".into(),
            status: "complete".into(),
            host: None,
            format_version: None,
            wall_start_ns: None,
            bytes_read: 0,
            frames: 0,
            events: 0,
            truncated_at: None,
            corrupt_frames: Vec::new(),
            corrupt_frames_unlisted: 0,
            unknown_frames: 0,
            error: None,
            pytorch: None,
            missing_frames: None,
            missing_events: None,
        };
        let mut reader = match CaptureReader::from_source(input) {
            Ok(r) => r,
            Err(e) => {
                rep.status =
                    if matches!(e, CaptureError::Truncated(_)) { "truncated".into() } else { "unreadable".into() };
                if let CaptureError::Truncated(n) = e {
                    rep.truncated_at = Some(n);
                }
                rep.error = Some(e.to_string());
                self.inputs.push(rep);
                return Ok(());
            }
        };
        rep.host = Some(reader.header().host.clone());
        rep.format_version = Some(reader.header().version);
        let header = reader.header().clone();
        if self.clock.is_none() && header.wall_anchor_ns != 0 {
            self.clock = Some((header.mono_anchor_ns, header.wall_anchor_ns));
        }
        let first_before = self.first_ts;
        loop {
            if self.stopped {
                break;
            }
            match reader.next_frame() {
                Ok(None) => break,
                Ok(Some(frame)) => {
                    rep.frames += 1;
                    match frame {
                        Frame::Events(records) => {
                            rep.events += records.len() as u64;
                            for raw in records {
                                self.event(&Event::from_raw(raw));
                            }
                        }
                        Frame::Process(info) => self.process_info(&info),
                        Frame::ProcessEnd(end) => self.process_end(&end),
                        Frame::Checkpoint(bytes) => {
                            // A capture that starts mid-stream (a rotated file): resume from
                            // the writer's model. Later checkpoints add nothing to a full replay.
                            if self.model.events() == 0 && self.applied == 0 {
                                match Model::restore(bytes) {
                                    Ok(m) => {
                                        self.model = m;
                                        self.notes.push(format!("{path}: replay resumed from a model checkpoint"));
                                    }
                                    Err(e) => self.notes.push(format!("{path}: checkpoint ignored: {e}")),
                                }
                            }
                        }
                        Frame::Note(_) => {}
                        Frame::Unknown(_) => rep.unknown_frames += 1,
                        Frame::End { events, frames } => {
                            // The writer's own counts: a frame deleted whole (checksums all
                            // right) shows up only here.
                            let (read_events, read_frames) = (rep.events, rep.frames);
                            if events != read_events || frames != read_frames {
                                rep.missing_events = Some(events.saturating_sub(read_events));
                                rep.missing_frames = Some(frames.saturating_sub(read_frames));
                                if rep.status == "complete" {
                                    rep.status = "gap".into();
                                }
                                self.notes.push(format!(
                                    "{path}: the end frame counts {frames} frames and {events} events, but {read_frames} \
                                     frames and {read_events} events were read: {} frames and {} events are missing",
                                    frames.saturating_sub(read_frames),
                                    events.saturating_sub(read_events)
                                ));
                            }
                        }
                    }
                }
                Err(CaptureError::Truncated(n)) => {
                    rep.status = "truncated".into();
                    rep.truncated_at = Some(n);
                    break;
                }
                Err(CaptureError::Corrupt { offset, reason }) => {
                    if self.opts.strict {
                        rep.status = "corrupt".into();
                        self.inputs.push(rep);
                        return Err(AnalyzeError::Corrupt { path: path.to_string(), offset, reason });
                    }
                    rep.status = "corrupt".into();
                    let skipped = match reader.resync() {
                        Ok(s) => s,
                        Err(e) => {
                            rep.error = Some(e.to_string());
                            None
                        }
                    };
                    if rep.corrupt_frames.len() < MAX_CORRUPT_LISTED {
                        rep.corrupt_frames.push(CorruptFrame { offset, reason, skipped_bytes: skipped });
                    } else {
                        rep.corrupt_frames_unlisted += 1;
                    }
                    if skipped.is_none() {
                        break;
                    }
                }
                Err(e) => {
                    rep.status = "unreadable".into();
                    rep.error = Some(e.to_string());
                    break;
                }
            }
        }
        rep.bytes_read = reader.offset();
        if let Some(cut) = reader.shrank() {
            // Another program truncated the file while it was mapped: what follows the cut
            // read as zeros (reported above as corrupt), not as data.
            rep.status = "truncated".into();
            rep.truncated_at = Some(rep.truncated_at.map_or(cut, |t| t.min(cut)));
            rep.error = Some(format!("the file shrank while it was read (cut at byte {cut} by another program)"));
        }
        if first_before.is_none() {
            if let Some(f) = self.first_ts {
                rep.wall_start_ns = Some(header.wall_time_ns(f));
            }
        }
        self.inputs.push(rep);
        Ok(())
    }

    pub(crate) fn arena_reports(&self) -> Vec<ArenaReport> {
        self.arenas
            .values()
            .filter(|a| self.pid_selected(a.pid))
            .map(|a| ArenaReport {
                pid: a.pid,
                device: a.device,
                kind: a.kind,
                base: a.base,
                size: a.size,
                max_fragmentation: a.frag.max().unwrap_or(0.0),
                min_largest_free_span: a.largest.points().iter().map(|p| p.min as u64).min().unwrap_or(0),
                fragmentation: a.frag.points_in(self.from_abs, self.to_abs),
                largest_free_span: a.largest.points_in(self.from_abs, self.to_abs),
                free_in_arena: a.free.points_in(self.from_abs, self.to_abs),
            })
            .collect()
    }

    pub(crate) fn proc_series(&self, slot: usize) -> Option<&Series> {
        self.procs.get(slot)?.as_ref().map(|t| &t.series)
    }

    /// The device where the process held the most (its peak), and all devices it used.
    pub(crate) fn proc_main_device(&self, slot: usize) -> (i16, Vec<i16>) {
        let peaks: Vec<(i16, u64)> = self.model.device_peaks_at(slot).filter(|d| d.1 > 0).collect();
        let main = peaks.iter().max_by_key(|d| (d.1, std::cmp::Reverse(d.0))).map_or(-1, |d| d.0);
        let mut devs: Vec<i16> = peaks.iter().map(|d| d.0).collect();
        devs.sort_unstable();
        (main, devs)
    }

    pub(crate) fn device_reports(&self) -> (Vec<DeviceReport>, Vec<DeviceTimeline>) {
        let mut reps = Vec::new();
        let mut tls = Vec::new();
        let mut order: Vec<&DevTrack> = self.devs.iter().collect();
        order.sort_by_key(|t| t.device);
        for t in order {
            reps.push(DeviceReport {
                device: t.device,
                total_bytes: t.total,
                free_bytes: t.free_latest,
                min_free_bytes: t.min_free,
                peak_live_bytes: t.peak_live,
            });
            tls.push(DeviceTimeline {
                device: t.device,
                total_bytes: t.total,
                live_bytes: t.live.points_in(self.from_abs, self.to_abs),
                free_bytes: t.free.points_in(self.from_abs, self.to_abs),
            });
        }
        (reps, tls)
    }

    pub(crate) fn tracked_overflow(&self) -> bool {
        self.tracked_overflow
    }

    pub(crate) fn track_pid(&self, slot: usize) -> Option<u32> {
        self.procs.get(slot)?.as_ref().map(|t| t.pid)
    }
}

/// The time grid of the live-bytes timelines: one origin and one bucket width for all, the
/// width doubling as the replay's span grows so that a timeline never needs more than its
/// `cap` buckets. Shared edges mean one flush per edge serves every timeline, and a
/// time-driven width bounds the flushes (about `cap / 2` per doubling of the span) whatever
/// the processes do.
#[derive(Clone, Copy)]
struct Grid {
    origin: u64,
    width: u64,
    cap: u64,
}

impl Default for Grid {
    fn default() -> Self {
        Grid { origin: 0, width: 1000, cap: crate::series::DEFAULT_POINTS as u64 }
    }
}

impl Grid {
    fn series(&self) -> Series {
        Series::on_grid(self.cap as usize, self.origin, self.width)
    }

    /// Widens the grid for time `now` if needed; returns the next edge after `now`.
    fn next_edge(&mut self, now: u64) -> u64 {
        let span = now.saturating_sub(self.origin);
        while span / self.width >= self.cap {
            self.width = self.width.saturating_mul(2);
        }
        self.origin.saturating_add((span / self.width + 1).saturating_mul(self.width))
    }
}

/// A window of a total into its timeline: its extremes where it began, then its value now.
fn push_window(series: &mut Series, w: vramhook_model::Window, live: u64) {
    series.push(w.since_ns, w.min as f64);
    series.push(w.since_ns, w.max as f64);
    series.push(w.since_ns, live as f64);
}

/// Index of the device's track, created on first use.
fn dev_track(devs: &mut Vec<DevTrack>, index: &mut FastMap<i16, usize>, device: i16) -> usize {
    *index.entry(device).or_insert_with(|| {
        devs.push(DevTrack { device, ..DevTrack::default() });
        devs.len() - 1
    })
}

pub(crate) fn layout_item(e: &LayoutEntry) -> LayoutItem {
    LayoutItem {
        addr: e.addr,
        size: e.size,
        class: format!("{:?}", e.class).to_lowercase(),
        pid: e.pid,
        device: e.device,
        ts_ns: e.ts_ns,
        reservation: e.reservation,
    }
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
