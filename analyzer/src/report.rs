//! The report: everything `vramhook analyze` says, serialisable as the `--json` output.
//! The schema is `analyzer/schema/report.schema.json`; bump [`SCHEMA_VERSION`] on any
//! incompatible change.

use crate::series::Point;
use serde::Serialize;
use std::collections::BTreeMap;
use vramhook_model::{ArenaKind, ArenaView, Histogram, LayoutEntry, OomIncident};

/// Version of the JSON report's schema (4: `ooms[].verdict`, `ooms[].outcome` and
/// `log_incidents[].verdict` are the snake_case names; `verdict_name` is gone; 5:
/// `timelines.fits`, the fit of each process's next large request over time; 6:
/// `fit_warnings[].came_bytes`, the size of the failing request; 7: an incident, a layout
/// entry and a layout arena are the model's own types, so a number added to one of them
/// reaches the report: `ooms[]` gains `start_time`, `sample_ts_ns` and
/// `sample_after_failure`, and its keys come in the model's order; `lead_up[]` entries are
/// the model's events (`seq`, `pid`, `caller`, `aux` and `stream` added; `kind` and `api`
/// still by name); layout entries gain `handle` (`class` still in lower case);
/// `layout.arenas[]` gain `start_time` and `live_allocations`; and `fit_trend_warnings`, the
/// supply's trend falling short of the demand within the trend rule's horizon).
pub const SCHEMA_VERSION: u32 = 7;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub schema_version: u32,
    pub generator: String,
    pub inputs: Vec<InputReport>,
    pub time: TimeRange,
    /// Events applied to the model (all inputs).
    pub events: u64,
    pub devices: Vec<DeviceReport>,
    pub processes: Vec<ProcessReport>,
    /// Processes by peak bytes, largest first (at most 10).
    pub top_holders: Vec<Holder>,
    pub ooms: Vec<OomReport>,
    pub fragmentation: Vec<ArenaReport>,
    pub leaks: Vec<LeakReport>,
    pub timelines: Timelines,
    pub layout: Option<LayoutReport>,
    /// Nonsense events the model ignored, by reason.
    pub anomalies: BTreeMap<String, u64>,
    /// Plain statements about anything that makes the numbers less than complete.
    pub notes: Vec<String>,
    /// Log files read (schema 2).
    pub logs: Vec<crate::logs::LogFileReport>,
    /// OOMs (and driver faults) read from logs, judged (schema 2).
    pub log_incidents: Vec<crate::logs::LogIncident>,
    /// What was past the per-category limit (`--max-items`) and only counted.
    pub folded: Folded,
    /// Where a process's next large request stopped fitting before it came (issue #30).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fit_warnings: Vec<FitWarning>,
    /// Where the supply's trend said the next large request would not fit within the trend
    /// rule's horizon (schema 7; `analyze --fit-trend`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fit_trend_warnings: Vec<FitTrendWarning>,
}

impl Report {
    /// The position in `ooms` of the incident with model id `id`.
    pub fn oom_position(&self, id: u64) -> Option<usize> {
        self.ooms.iter().position(|c| c.incident.id == id)
    }
}

/// The least-squares line through a process's supply over the trend rule's window, followed
/// to its horizon, fell short of its demand, and kept falling short for the rule's hold
/// (`analyze --fit-trend`; from the same samples as the fit).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FitTrendWarning {
    pub pid: u32,
    pub command: String,
    pub device: i16,
    /// The first sample whose forecast fell short.
    pub since_ts_ns: u64,
    /// When it had fallen short for the hold: the alert fires then.
    pub fired_ts_ns: u64,
    pub demand_bytes: u64,
    pub demand_source: String,
    /// At `fired_ts_ns`: what the process could get then, the line's value at the horizon
    /// (below 0 where the line goes there), and its slope.
    pub supply_bytes: u64,
    pub forecast_bytes: f64,
    pub slope_bytes_per_s: f64,
    /// How far ahead the rule looks.
    pub horizon_ns: u64,
    /// When the forecast came back to the demand with no failure before: the warning did
    /// not come true (then). `None`: it held to the failure or to the end.
    pub cleared_ts_ns: Option<u64>,
    /// When a request failed out of memory on the device while it held, and its size.
    pub came_ts_ns: Option<u64>,
    pub came_bytes: Option<u64>,
}

/// The fit of a process's next large request went below 1 (what it could get for a request
/// as large as its largest within the model's fit window) and stayed there until such a
/// request came and failed, or to the end.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FitWarning {
    pub pid: u32,
    pub command: String,
    pub device: i16,
    /// The first sample of the run below 1.
    pub since_ts_ns: u64,
    pub demand_bytes: u64,
    /// "driver" (its allocation calls) or "lens_oom" (a framework lens's OOM record).
    pub demand_source: String,
    /// What it could get then.
    pub supply_bytes: u64,
    /// What stood in the way: "framework_fragmentation", "framework_limit",
    /// "other_processes" or "capacity".
    pub limited_by: Option<String>,
    /// When the failing request came (its OOM on the device); `None`: none before the end.
    pub came_ts_ns: Option<u64>,
    /// Its size (schema 6): smaller than the demand where a smaller request failed first.
    pub came_bytes: Option<u64>,
}

/// Items past the per-category limit (`max_items`): counted here instead of analysed.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Folded {
    /// The limit that applied.
    pub max_items: u64,
    /// Processes past the limit, their events (not replayed), and the bytes their
    /// successful allocations asked for.
    pub processes: u64,
    pub process_events: u64,
    pub process_bytes: u64,
    /// Device numbers past the limit, their events, and the bytes allocated on them.
    pub devices: u64,
    pub device_events: u64,
    pub device_bytes: u64,
    /// Out-of-memory failures after the limit of incidents was reached (not analysed),
    /// and the bytes they requested.
    pub ooms: u64,
    pub oom_bytes: u64,
    /// PyTorch snapshot segments past the limit (not imported), and their bytes.
    pub segments: u64,
    pub segment_bytes: u64,
    /// Pickle container elements past the reader's budget (not kept).
    pub pickle_values: u64,
    /// Out-of-memory failures kept but not judged: the model's work allowance for
    /// judging (processes and arenas looked at) was spent.
    pub ooms_unjudged: u64,
}

impl Folded {
    /// Anything folded at all.
    pub fn any(&self) -> bool {
        self.processes + self.devices + self.ooms + self.segments + self.pickle_values + self.ooms_unjudged > 0
    }
}

/// Names in the JSON (snake case, as the schema lists them) and in the text and HTML
/// reports: one enum per status instead of strings that must match by hand.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
        pub enum $name { $($(#[$vmeta])* #[serde(rename = $text)] $variant,)* }

        impl $name {
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text,)* }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum! {
    /// What an input file was read as.
    InputKind {
        Capture => "capture",
        PytorchSnapshot => "pytorch_snapshot",
        Log => "log",
    }
}

named_enum! {
    /// How far an input could be read.
    InputStatus {
        Complete => "complete",
        /// The file stops without an end frame.
        Truncated => "truncated",
        /// Frames were skipped.
        Corrupt => "corrupt",
        /// Checksums were right but the end frame counts more frames or events than were read.
        Gap => "gap",
        Unreadable => "unreadable",
    }
}

named_enum! {
    /// Why a process is listed as a leak.
    LeakKind {
        /// Bytes still live when the process exited.
        LiveAtExit => "live_at_exit",
        /// Live bytes rose in every quarter of its life.
        Growing => "growing",
    }
}

named_enum! {
    /// Why the layout shows this moment.
    LayoutReason {
        FirstOom => "first OOM",
        /// The time given with `--at`.
        At => "--at",
        Peak => "peak",
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct InputReport {
    pub path: String,
    pub kind: InputKind,
    pub status: InputStatus,
    pub host: Option<String>,
    pub format_version: Option<u16>,
    /// Wall-clock ns (Unix epoch) of the first event, when the capture says.
    pub wall_start_ns: Option<u64>,
    pub bytes_read: u64,
    pub frames: u64,
    pub events: u64,
    /// "truncated at byte N": the file stops without an end frame; everything before N was read.
    pub truncated_at: Option<u64>,
    pub corrupt_frames: Vec<CorruptFrame>,
    /// Corrupt frames beyond the listed ones.
    pub corrupt_frames_unlisted: u64,
    /// Frames of a type this reader does not know (from a newer writer), skipped.
    pub unknown_frames: u64,
    /// Set when nothing could be read: bad magic, a newer format version, an I/O error.
    pub error: Option<String>,
    /// PyTorch snapshots: the importer's totals (bytes reserved in segments, allocated in blocks).
    pub pytorch: Option<PytorchTotals>,
    /// Frames and events the end frame says the writer wrote but that were not read (whole
    /// frames deleted from the file): the status is then "gap". `None` when nothing is missing
    /// or there is no end frame.
    pub missing_frames: Option<u64>,
    pub missing_events: Option<u64>,
}

impl InputReport {
    /// An input of `kind` at `path` with nothing read yet.
    pub fn new(path: &str, kind: InputKind, status: InputStatus) -> InputReport {
        InputReport {
            path: path.to_string(),
            kind,
            status,
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
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct CorruptFrame {
    pub offset: u64,
    pub reason: String,
    /// Bytes skipped to the next frame (None: no frame followed).
    pub skipped_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PytorchTotals {
    pub segments: u64,
    pub blocks: u64,
    pub trace_entries: u64,
    /// Sum of segment sizes (PyTorch's memory_reserved).
    pub reserved_bytes: u64,
    /// Sum of allocated blocks (PyTorch's memory_allocated).
    pub allocated_bytes: u64,
    /// Reserved but unallocated, as the model computes it (its framework-cache idle bytes).
    pub reserved_unallocated_bytes: u64,
    /// Analysed with captures: whether the snapshot joined one of their processes, and why
    /// (or why not). `None` when no capture came with it.
    pub join: Option<SnapshotJoin>,
}

/// A snapshot matched with the captures' processes by its segments' addresses.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SnapshotJoin {
    /// Its framework view (blocks, fragmentation, OOM incidents, cache timeline) is reported
    /// as that process's.
    pub joined: bool,
    /// The process it joined.
    pub pid: Option<u32>,
    /// Distinct segments in the snapshot (its final ones and those its trace allocated).
    pub segments: u64,
    /// Of them, allocations of the joined process (or of the best candidate when not joined).
    pub matched: u64,
    /// The processes with matching allocations, most matches first (at most 5).
    pub candidates: Vec<JoinCandidate>,
    /// In words: the match, or why there is none.
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct JoinCandidate {
    pub pid: u32,
    pub matched: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TimeRange {
    /// Monotonic ns of the first event seen; every other time is on the same clock.
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    /// The window the report covers (after --from/--to).
    pub from_ns: u64,
    pub to_ns: u64,
    /// One instant on the captures' monotonic clock and on the wall clock, from the first
    /// capture's header: puts log times on the captures' clock (schema 2).
    pub wall_anchor: Option<WallAnchor>,
}

/// The same instant on two clocks, in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WallAnchor {
    pub mono_ns: u64,
    /// Unix epoch.
    pub wall_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    pub device: i16,
    pub total_bytes: Option<u64>,
    /// Latest driver sample of free bytes.
    pub free_bytes: Option<u64>,
    /// Lowest free bytes the driver reported.
    pub min_free_bytes: Option<u64>,
    /// Highest sum of live bytes of traced processes on this device (exact).
    pub peak_live_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessReport {
    pub pid: u32,
    pub start_time: u64,
    pub ppid: u32,
    pub command: String,
    /// The device it held most memory on (-1 when unknown).
    pub device: i16,
    pub devices: Vec<i16>,
    pub peak_bytes: u64,
    pub peak_ts_ns: u64,
    /// Live bytes just before it exited (or at the end of the capture if it did not).
    pub final_live_bytes: u64,
    pub final_live_allocations: u64,
    /// Streams it had made and not destroyed at exit/end, the most it had at once, and the
    /// driver's device memory for them, which no memory call shows and the driver keeps
    /// after a stream is destroyed (an estimate: the most at once × per-stream bytes).
    pub final_streams: u64,
    pub streams_peak: u64,
    pub final_stream_bytes: u64,
    pub exited: bool,
    pub exit_status: Option<i32>,
    pub exit_ts_ns: Option<u64>,
    pub allocations: u64,
    pub frees: u64,
    pub failed_calls: u64,
    pub oom_count: u64,
    /// Events lost, all kinds together: ring full, slots lost in flight, slots an agent
    /// restart skipped (each counted once).
    pub dropped_events: u64,
    /// Of `dropped_events`, those lost in flight or skipped by a restarted reader.
    pub lost_in_flight: u64,
    /// Events were lost: its numbers may be wrong.
    pub incomplete: bool,
    pub anomalies: u64,
    /// Idle cached bytes at exit/end (pool reserve − live, framework cache).
    pub idle_bytes: u64,
    pub fragmentation: f64,
    pub largest_free_span: u64,
    /// Sizes and ages of allocations live at exit (or at the end).
    pub size_histogram: Histogram,
    pub age_histogram: Histogram,
}

#[derive(Clone, Debug, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub command: String,
    pub peak_bytes: u64,
    pub final_live_bytes: u64,
}

/// One OOM incident: the model's, as the report shows it, and what only the report knows.
#[derive(Clone, Debug, Serialize)]
pub struct OomReport {
    /// The model's incident, every field (its `verdict` and `outcome` by their names, its
    /// `api` by the function's name, its `lead_up` the model's events). Where a snapshot
    /// joined a capture's process, `pid`, `command` and the `explanation` name that process;
    /// `lead_up` keeps at most [`MAX_LEAD_UP`] events.
    #[serde(flatten)]
    pub incident: OomIncident,
    /// The PyTorch snapshot the incident comes from (`None`: from a capture). A snapshot that
    /// joined a capture's process reports its incidents as that process's.
    pub from_snapshot: Option<String>,
    /// The capture's incident of the same failure (same process, device and request, within
    /// the incident window), when a joined snapshot's incident has one.
    pub same_failure_as: Option<u64>,
    /// From a PyTorch snapshot recorded with memory history (its blocks and trace entries
    /// carry `frames`): the allocations live at this OOM, grouped by their Python stack, and
    /// the failed request's own stack. On a capture's incident, copied from the snapshot's
    /// incident of the same failure. `None`: no snapshot with stacks covers this incident.
    pub live_at_oom: Option<LiveAtOom>,
}

/// Lead-up events listed per incident at most: the model keeps `ModelConfig::lead_up_events`
/// (16 by default), which a configuration may raise; the schema allows 64.
pub const MAX_LEAD_UP: usize = 64;

/// One frame of a PyTorch allocation's stack: its Python frames where the stack has any
/// (PyTorch's C++ frames are left out then), innermost first.
#[derive(Clone, Debug, Serialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackFrame {
    pub file: String,
    pub line: u64,
    pub function: String,
}

/// The allocations live at an OOM that have the same stack.
#[derive(Clone, Debug, Serialize)]
pub struct LiveStack {
    pub allocations: u64,
    pub bytes: u64,
    pub largest_bytes: u64,
    /// Innermost first, at most [`MAX_STACK_FRAMES`].
    pub frames: Vec<StackFrame>,
}

/// Stacks listed per OOM (the largest by bytes); the rest are counted.
pub const MAX_LIVE_STACKS: usize = 10;
/// Frames kept per stack.
pub const MAX_STACK_FRAMES: usize = 16;

/// What a PyTorch snapshot with memory history says about the allocations live at an OOM.
#[derive(Clone, Debug, Serialize)]
pub struct LiveAtOom {
    /// The snapshot it comes from.
    pub snapshot: String,
    /// Allocated blocks live at the OOM, and their bytes.
    pub allocations: u64,
    pub bytes: u64,
    /// Of them, blocks with no stack (allocated while history was off), and their bytes.
    pub without_stack: u64,
    pub without_stack_bytes: u64,
    /// The stack of the request that failed (empty when its trace entry has none).
    pub request_frames: Vec<StackFrame>,
    /// Live allocations grouped by stack, the most bytes first, at most [`MAX_LIVE_STACKS`].
    pub stacks: Vec<LiveStack>,
    /// Further stacks (not listed), and their bytes.
    pub stacks_folded: u64,
    pub stacks_folded_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ArenaReport {
    pub pid: u32,
    pub device: i16,
    pub kind: ArenaKind,
    pub base: u64,
    pub size: u64,
    pub max_fragmentation: f64,
    pub min_largest_free_span: u64,
    /// `[t_ns, min, max, last]` of fragmentation (0..1).
    pub fragmentation: Vec<Point>,
    pub largest_free_span: Vec<Point>,
    pub free_in_arena: Vec<Point>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LeakReport {
    pub pid: u32,
    pub command: String,
    pub kind: LeakKind,
    pub bytes: u64,
    pub allocations: u64,
    /// Growing: bytes per second over the process's life.
    pub growth_bytes_per_s: Option<f64>,
    pub detail: String,
    /// The largest allocations still live (at most 10).
    pub largest: Vec<LayoutEntry>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Timelines {
    pub processes: Vec<ProcessTimeline>,
    pub devices: Vec<DeviceTimeline>,
    /// Per process, device and framework: the framework's cache as its lens (or a PyTorch
    /// snapshot's trace) gave it. Empty without a lens or snapshot.
    pub frameworks: Vec<FrameworkTimeline>,
    /// Per process and device with a demand in the fit window and a device sample: the fit
    /// of its next large request over time (schema 5), from the samples `fit_warnings` is
    /// made of.
    pub fits: Vec<FitTimeline>,
}

/// The fit of one process's next large request on one device over the replay: what the
/// agent exports live as `vramhook_process_memory_fit_ratio`.
#[derive(Clone, Debug, Serialize)]
pub struct FitTimeline {
    pub pid: u32,
    pub command: String,
    pub device: i16,
    /// `[t_ns, min, max, last]` of supply / demand.
    pub fit_ratio: Vec<Point>,
    /// Where it went below 1 and back (at most 1,000 listed), in time order.
    pub crossings: Vec<FitCrossing>,
}

/// A sample where the fit went below 1 (`below`: true), or back to 1 or more.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FitCrossing {
    pub ts_ns: u64,
    pub below: bool,
    pub fit_ratio: f64,
    pub demand_bytes: u64,
    pub supply_bytes: u64,
}

/// A framework's cache on one device of one process over time: the numbers the agent exports
/// live as `vramhook_process_framework_{reserved,allocated,largest_free_block,fragmentation}`.
#[derive(Clone, Debug, Serialize)]
pub struct FrameworkTimeline {
    pub pid: u32,
    pub command: String,
    pub device: i16,
    /// `pytorch`, `cupy`, `jax`, …
    pub framework: String,
    /// Where the numbers come from: `lens` (the capture's `framework_sample` and
    /// `framework_oom` records) or `snapshot` (a PyTorch snapshot's trace and final state).
    pub source: String,
    /// Records (samples and OOMs) that fed it.
    pub samples: u64,
    /// `[t_ns, min, max, last]` of bytes the framework holds from the driver.
    pub reserved_bytes: Vec<Point>,
    /// Of those, bytes handed out to the program.
    pub allocated_bytes: Vec<Point>,
    /// Where it was measured only (a lens measures it less often than it samples).
    pub largest_free_block: Vec<Point>,
    /// `1 − largest free block / (reserved − allocated)` (0 when nothing is free), where the
    /// largest free block was measured.
    pub fragmentation: Vec<Point>,
    /// The framework's own out-of-memory moments on this device (at most 1,000 listed).
    pub ooms: Vec<FrameworkOomMark>,
}

#[derive(Clone, Debug, Serialize)]
pub struct FrameworkOomMark {
    pub ts_ns: u64,
    pub requested_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessTimeline {
    pub pid: u32,
    pub command: String,
    /// `[t_ns, min, max, last]` of live bytes.
    pub live_bytes: Vec<Point>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DeviceTimeline {
    pub device: i16,
    pub total_bytes: Option<u64>,
    pub live_bytes: Vec<Point>,
    pub free_bytes: Vec<Point>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LayoutReport {
    pub ts_ns: u64,
    /// Why this moment.
    pub reason: LayoutReason,
    /// The model's entries (allocations, mappings) of the selected processes.
    pub entries: Vec<LayoutEntry>,
    /// Entries left out to keep the report bounded (the smallest go first).
    pub entries_omitted: u64,
    /// The model's arenas of the selected processes (a joined snapshot's under the capture's pid).
    pub arenas: Vec<ArenaView>,
}
