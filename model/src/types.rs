//! Plain, serialisable types: configuration, views returned by queries, incidents.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use vramhook_protocol::{Api, Event, FrameworkId, MemClass};

/// Model configuration. Part of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Physical page granularity used for the "granularity" verdict and to round pool
    /// reserve estimates (default 2 MiB).
    pub granularity: u64,
    /// A retry more than this long after the first failure starts a new incident (default 2 s).
    pub incident_window_ns: u64,
    /// A retry more than this many events (of that process) after the first failure starts a
    /// new incident (default 64).
    pub incident_window_events: u32,
    /// Events of the process kept before each failure for the post-mortem (default 16).
    pub lead_up_events: usize,
    /// A device sample older than this, relative to the latest event, is flagged stale (default 5 s).
    pub stale_sample_ns: u64,
    /// Upper bounds (inclusive) of the size histogram buckets; one more bucket holds the rest.
    pub size_buckets: Vec<u64>,
    /// Upper bounds (inclusive) of the age histogram buckets, in ns; one more bucket holds the rest.
    pub age_buckets_ns: Vec<u64>,
    /// Device memory the driver keeps for each stream a process made, which no memory call
    /// shows (default 560 KiB: on an H200 with driver 580, 128 streams, PyTorch's stream
    /// pool, took 70 MiB; the driver takes 2 MiB per 4 streams and 2 MiB more now and then,
    /// so the estimate is within 2.2 MiB up to 129 streams; see docs/measurements/gpu/h200-pools-overhead.txt).
    #[serde(default = "default_stream_bytes")]
    pub stream_bytes: u64,
    /// The window over which a process's demand (its largest request) is taken, for the
    /// fit of its next large request (default 10 minutes; seconds for tests and short runs).
    #[serde(default = "default_fit_window")]
    pub fit_window_ns: u64,
}

pub const DEFAULT_FIT_WINDOW_NS: u64 = 600_000_000_000;

fn default_fit_window() -> u64 {
    DEFAULT_FIT_WINDOW_NS
}

pub const DEFAULT_STREAM_BYTES: u64 = 560 * KIB;

fn default_stream_bytes() -> u64 {
    DEFAULT_STREAM_BYTES
}

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

impl Default for ModelConfig {
    fn default() -> Self {
        const S: u64 = 1_000_000_000;
        ModelConfig {
            granularity: 2 * MIB,
            incident_window_ns: 2 * S,
            incident_window_events: 64,
            lead_up_events: 16,
            stale_sample_ns: 5 * S,
            size_buckets: vec![64 * KIB, MIB, 2 * MIB, 16 * MIB, 128 * MIB, GIB, 8 * GIB],
            age_buckets_ns: vec![S / 1000, S / 10, S, 10 * S, 60 * S, 600 * S, 3600 * S],
            stream_bytes: DEFAULT_STREAM_BYTES,
            fit_window_ns: DEFAULT_FIT_WINDOW_NS,
        }
    }
}

/// Memory class: the protocol's [`MemClass`], serialised by its lower-case name
/// ([`MemClass::name`]: `plain`, `vmm`, …; checkpoints encode a variant by its index).
pub type Class = MemClass;

/// Live bytes by memory class.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassBytes {
    pub plain: u64,
    pub pitch: u64,
    pub managed: u64,
    /// Live stream-ordered pool allocations (not the pool's idle reserve).
    pub pool: u64,
    /// VMM physical handles (`cuMemCreate`) not yet both released and unmapped.
    pub vmm: u64,
    pub array: u64,
    /// Ranges opened with `cuIpcOpenMemHandle` (another process's memory; not in `live_bytes`).
    pub ipc: u64,
    /// Handles imported with `cuMemImportFromShareableHandle` (not in `live_bytes`).
    pub import: u64,
}

impl ClassBytes {
    pub fn from_array(a: &[u64; 8]) -> ClassBytes {
        ClassBytes {
            plain: a[0],
            pitch: a[1],
            managed: a[2],
            pool: a[3],
            vmm: a[4],
            array: a[5],
            ipc: a[6],
            import: a[7],
        }
    }
}

/// How a live-bytes total moved since it was last taken: its lowest and highest value
/// (counting the value when taken) and the time of the first change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub since_ns: u64,
    pub min: u64,
    pub max: u64,
}

/// One device's live bytes over all processes (see [`crate::Model::take_device_windows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceWindow {
    pub device: i16,
    pub live: u64,
    pub peak: u64,
    /// `None` when nothing changed since the last take.
    pub window: Option<Window>,
}

/// A copy of an event, serialisable (the protocol's `Event` is not). In JSON (reports, the
/// agent's state) `kind` and `api` are the protocol's names ([`EventRecord::kind_name`],
/// [`EventRecord::api_name`]); checkpoints (postcard) keep their codes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub seq: u64,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// A [`vramhook_protocol::EventKind`] code.
    #[serde(with = "kind_code_by_name")]
    pub kind: u8,
    /// An [`Api`] code.
    #[serde(with = "api_code_by_name")]
    pub api: u16,
    pub caller: u8,
    pub result: u32,
    pub device: i16,
    pub addr: u64,
    pub size: u64,
    pub aux: u64,
    pub stream: u64,
}

/// `EventRecord` and `Event` have the same fields: one list, both directions.
macro_rules! mirror_event {
    ($($field:ident),*) => {
        impl From<&Event> for EventRecord {
            fn from(e: &Event) -> Self {
                EventRecord { $($field: e.$field),* }
            }
        }
        impl From<&EventRecord> for Event {
            fn from(e: &EventRecord) -> Self {
                Event { $($field: e.$field),* }
            }
        }
    };
}
mirror_event!(seq, ts_ns, pid, tid, kind, api, caller, result, device, addr, size, aux, stream);

impl EventRecord {
    /// Its kind by the protocol's name (`alloc`, `mem_info`, …; `kind26` for a code this
    /// build does not know), as JSON and the reports show it.
    pub fn kind_name(&self) -> Cow<'static, str> {
        kind_code_by_name::name(self.kind)
    }

    /// Its driver function by name (`cuMemAlloc_v2`, …; `api513` for a code this build does
    /// not know), as JSON and the reports show it.
    pub fn api_name(&self) -> Cow<'static, str> {
        api_code_by_name::name(self.api)
    }
}

/// A serde module for a code of one of the protocol's code enums: in a human-readable format
/// (JSON) its name, or the prefix and the number for a code this build does not know; else
/// (postcard checkpoints) the number itself, the bytes of the plain integer field. A
/// human-readable reader takes a name, the prefixed number or a bare number (the agent's state
/// before the names).
macro_rules! code_by_name {
    ($module:ident, $enum:ident, $repr:ty, $prefix:literal) => {
        pub(crate) mod $module {
            use serde::de::{Error, Visitor};
            use serde::{Deserialize, Deserializer, Serialize, Serializer};
            use std::borrow::Cow;
            use vramhook_protocol::$enum;

            pub fn name(code: $repr) -> Cow<'static, str> {
                $enum::from_code(code)
                    .map_or_else(|| Cow::Owned(format!(concat!($prefix, "{}"), code)), |c| c.name().into())
            }

            fn code(name: &str) -> Option<$repr> {
                $enum::from_name(name).map($enum::code).or_else(|| name.strip_prefix($prefix)?.parse().ok())
            }

            pub fn serialize<S: Serializer>(code: &$repr, s: S) -> Result<S::Ok, S::Error> {
                if s.is_human_readable() {
                    s.serialize_str(&name(*code))
                } else {
                    code.serialize(s)
                }
            }

            pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<$repr, D::Error> {
                if d.is_human_readable() {
                    d.deserialize_any(NameOrCode)
                } else {
                    <$repr>::deserialize(d)
                }
            }

            struct NameOrCode;

            impl Visitor<'_> for NameOrCode {
                type Value = $repr;

                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(concat!("a ", stringify!($enum), " name or code"))
                }

                fn visit_str<E: Error>(self, v: &str) -> Result<$repr, E> {
                    code(v).ok_or_else(|| E::custom(format!(concat!("unknown ", stringify!($enum), " {:?}"), v)))
                }

                fn visit_u64<E: Error>(self, v: u64) -> Result<$repr, E> {
                    <$repr>::try_from(v)
                        .map_err(|_| E::custom(format!(concat!(stringify!($enum), " code {} out of range"), v)))
                }

                fn visit_i64<E: Error>(self, v: i64) -> Result<$repr, E> {
                    <$repr>::try_from(v)
                        .map_err(|_| E::custom(format!(concat!(stringify!($enum), " code {} out of range"), v)))
                }
            }
        }
    };
}
code_by_name!(kind_code_by_name, EventKind, u8, "kind");
code_by_name!(api_code_by_name, Api, u16, "api");

/// An [`Api`] as its name, in JSON and in checkpoints: the bytes of the `String` the field
/// used to be, so reports and older checkpoints read the same.
pub(crate) mod api_by_name {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};
    use vramhook_protocol::Api;

    pub fn serialize<S: Serializer>(api: &Api, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(api.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Api, D::Error> {
        let name = String::deserialize(d)?;
        Api::from_name(&name).ok_or_else(|| D::Error::custom(format!("unknown driver function {name:?}")))
    }
}

/// Counts per bucket. `counts.len() == bounds.len() + 1`; bucket `i` holds values `≤ bounds[i]`
/// (and above `bounds[i-1]`); the last bucket holds values above every bound.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Histogram {
    pub bounds: Vec<u64>,
    pub counts: Vec<u64>,
}

impl Histogram {
    pub fn new(bounds: &[u64]) -> Histogram {
        Histogram { bounds: bounds.to_vec(), counts: vec![0; bounds.len() + 1] }
    }

    pub fn add(&mut self, value: u64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.counts[i] += 1;
    }
}

/// One device as the driver reported it, plus what the traced processes hold on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceView {
    /// Device ordinal; -1 collects bytes whose device was not known.
    pub ordinal: i16,
    /// Total bytes from the latest `cuMemGetInfo` sample; `None` before the first sample.
    pub total: Option<u64>,
    /// Free bytes from the latest sample.
    pub free: Option<u64>,
    pub sample_ts_ns: Option<u64>,
    /// The sample is older than `stale_sample_ns` relative to the latest event seen.
    pub sample_stale: bool,
    /// Bytes held by live traced processes on this device: resident allocations (not managed,
    /// not IPC/imported) plus the estimated idle reserve of their stream-ordered pools.
    pub traced_bytes: u64,
    /// Estimated idle (reclaimable) pool bytes included in `traced_bytes`.
    pub pool_idle_bytes: u64,
    /// `total − free − traced`, clamped at 0: processes we do not trace, driver contexts,
    /// modules and library workspaces. `None` without a sample.
    pub untraced_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBytes {
    pub device: i16,
    /// Owned live bytes on this device (as in `ProcessView::live_bytes`).
    pub live_bytes: u64,
}

/// One traced process (pid + start time).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessView {
    pub pid: u32,
    /// Process start time in clock ticks since boot; 0 while unknown.
    pub start_time: u64,
    pub ppid: u32,
    /// Command line joined with spaces ("" until known).
    pub command: String,
    pub exe: String,
    pub alive: bool,
    pub exit_status: Option<i32>,
    pub exit_ts_ns: Option<u64>,
    /// Events were lost for this process: its numbers may be wrong.
    pub incomplete: bool,
    /// Bytes this process owns: every class except IPC-opened and imported memory.
    pub live_bytes: u64,
    pub live_by_class: ClassBytes,
    /// Live allocations (allocations, pool allocations, arrays, IPC ranges, VMM handles).
    pub live_allocations: u64,
    pub peak_bytes: u64,
    pub peak_ts_ns: u64,
    /// Successful allocating calls (including `cuMemCreate`) since the process was first seen.
    pub allocations: u64,
    /// Successful releases (frees, and VMM handles whose bytes were returned).
    pub frees: u64,
    pub failed_calls: u64,
    pub oom_count: u64,
    pub dropped_events: u64,
    pub anomalies: u64,
    /// Estimated idle bytes this process could give back: pool reserve − live, plus
    /// framework cache (segment bytes not in allocated blocks).
    pub idle_bytes: u64,
    /// Reserve of its stream-ordered pools (live + idle): the driver's own figure where the
    /// interposer sampled it (`pool_sample`), else estimated from the high-water mark.
    pub pool_reserve_bytes: u64,
    /// Bytes the process holds from the device: `live_bytes` plus the idle reserve of its
    /// stream-ordered pools. NVML's per-process figure is this plus the context, modules
    /// and library workspaces.
    #[serde(default)]
    pub held_bytes: u64,
    /// Streams the process made and has not destroyed (`cuStreamCreate*`).
    #[serde(default)]
    pub streams: u64,
    /// The most streams it had at once.
    #[serde(default)]
    pub streams_peak: u64,
    /// Device memory the driver keeps for its streams, which no memory call shows:
    /// `streams_peak` × `ModelConfig::stream_bytes`, an estimate (measured per driver; the
    /// driver keeps a destroyed stream's memory for the next one). NVML's per-process figure
    /// is about `held_bytes` + this + the context.
    #[serde(default)]
    pub stream_bytes: u64,
    /// Largest free span over all its arenas.
    pub largest_free_span: u64,
    /// Free bytes inside its arenas (unmapped reservation space, pool idle, cached blocks).
    pub free_in_arenas: u64,
    /// `1 − largest_free_span / free_in_arenas`, 0 when nothing is free.
    pub fragmentation: f64,
    pub devices: Vec<DeviceBytes>,
    pub size_histogram: Histogram,
    /// Ages of live allocations at the snapshot time (latest event time).
    pub age_histogram: Histogram,
    /// eBPF mode, a process already running when the probes were attached: "attached at
    /// this time (monotonic ns); earlier allocations unknown". Its bytes allocated before
    /// are in the device's `untraced_bytes`. `None`: traced from its first call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traced_since_ns: Option<u64>,
    /// Frameworks whose libraries the process loaded (from the interposer's `frameworks`
    /// record): who holds its bytes, resolved once per process, never per call.
    #[serde(default)]
    pub frameworks: Vec<FrameworkId>,
    /// What a framework lens last said about its cache, per device (empty without a lens).
    #[serde(default)]
    pub framework_caches: Vec<FrameworkCache>,
    /// Per device, what it holds by how it could be had (a live process's; empty after exit).
    #[serde(default)]
    pub device_memory: Vec<ProcessDeviceMemory>,
    /// Per device, the fit of its next large request (a live process's, where it made a
    /// request within the fit window and the device was sampled; empty after exit).
    #[serde(default)]
    pub fit: Vec<ProcessFit>,
}

/// Where a process's demand figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DemandSource {
    /// An allocation call the interposer saw: one the process gave back (freed, or a VMM
    /// handle released), or one that failed out of memory. Memory held since it was made is
    /// state (weights, a preallocated cache), not a request it will make again.
    Driver,
    /// A framework lens's OOM record: the framework's own request.
    LensOom,
    /// A lens's largest request of the framework (PyTorch: the largest segment of its latest
    /// snapshot not held whole by one block in use, or the largest block in use at one
    /// snapshot and gone at the next; JAX: `largest_alloc_size`), sampled: requests served
    /// from the cache, which the driver never sees.
    LensLargestAllocation,
}

impl DemandSource {
    pub fn name(self) -> &'static str {
        match self {
            DemandSource::Driver => "driver",
            DemandSource::LensOom => "lens_oom",
            DemandSource::LensLargestAllocation => "lens_largest_allocation",
        }
    }
}

/// By which allocator's rules a process's supply was worked out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupplyRule {
    /// A caching framework (a lens or segments): its largest free block, or a new segment
    /// from the device's free bytes plus what it releases before it raises, under its limit.
    FrameworkCache,
    /// A stream-ordered pool: its idle reserve plus the device's free bytes.
    Pool,
    /// Plain driver allocations: the device's free bytes.
    Driver,
}

impl SupplyRule {
    pub fn name(self) -> &'static str {
        match self {
            SupplyRule::FrameworkCache => "framework_cache",
            SupplyRule::Pool => "pool",
            SupplyRule::Driver => "driver",
        }
    }
}

/// The fit of a process's next large request on one device: could it get, now, as much as
/// the largest request it made within the window? Other processes' idle bytes are not
/// counted (they are not its to take).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessFit {
    pub device: i16,
    /// The largest request within `ModelConfig::fit_window_ns`.
    pub demand_bytes: u64,
    pub demand_source: DemandSource,
    /// When that request was made.
    pub demand_ts_ns: u64,
    /// What it could get for one request now (the device's free bytes less
    /// `DRIVER_RESERVE`, rounded down to the granularity, plus what its allocator has).
    pub supply_bytes: u64,
    pub supply_rule: SupplyRule,
    /// `supply / demand`: below 1, a request as large as the demand would fail now.
    pub fit_ratio: f64,
    /// Below 1: what stands in the way (the verdict such a failure would likely get).
    #[serde(default)]
    pub limited_by: Option<FitLimit>,
}

/// What keeps a process's next large request from fitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FitLimit {
    /// Its cache and the device's free bytes would hold it, but not in one piece, and its
    /// cache cannot give the pieces back (split segments).
    FrameworkFragmentation,
    /// Its framework's own limit stops the segment it would need.
    FrameworkLimit,
    /// The device's bytes it does not hold (other processes, traced or not, and the
    /// contexts) would make room.
    OtherProcesses,
    /// Not even all of the device would: capacity.
    Capacity,
}

impl FitLimit {
    pub fn name(self) -> &'static str {
        match self {
            FitLimit::FrameworkFragmentation => "framework_fragmentation",
            FitLimit::FrameworkLimit => "framework_limit",
            FitLimit::OtherProcesses => "other_processes",
            FitLimit::Capacity => "capacity",
        }
    }
}

/// What a process holds on one device, by how it could be had (see [`Holder`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessDeviceMemory {
    pub device: i16,
    pub held_bytes: u64,
    pub releasable_bytes: u64,
    pub stranded_bytes: u64,
    pub not_visible_bytes: u64,
}

/// A framework's cache on one device, as its lens measured it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrameworkCache {
    pub framework: FrameworkId,
    pub device: i16,
    /// Bytes the framework holds from the driver (PyTorch's `memory_reserved()`).
    pub reserved_bytes: u64,
    /// Of those, handed out to the program (`memory_allocated()`).
    pub allocated_bytes: u64,
    /// The largest block it could hand out whole (`None`: not measured in this sample).
    pub largest_free_block: Option<u64>,
    pub segments: u64,
    /// `1 − largest free block / (reserved − allocated)`; `None` when the largest block is
    /// not known, 0 when nothing is free.
    pub fragmentation: Option<f64>,
    pub ts_ns: u64,
    /// Of `reserved − allocated`, the free bytes inside split blocks (PyTorch's
    /// `inactive_split_bytes`): not given back by `empty_cache()`. `None`: not measured.
    #[serde(default)]
    pub stranded_bytes: Option<u64>,
    /// The framework's own limit for this process on the device (PyTorch's
    /// `set_per_process_memory_fraction` × total, JAX's `bytes_limit`, CuPy's `set_limit`).
    #[serde(default)]
    pub limit_bytes: Option<u64>,
}

impl FrameworkCache {
    /// Reserved but not allocated: free inside the cache, invisible to the driver.
    pub fn cached_free(&self) -> u64 {
        self.reserved_bytes.saturating_sub(self.allocated_bytes)
    }
}

/// What a framework lens saw when the framework gave up on a request (its OOM observer).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LensOom {
    pub framework: FrameworkId,
    /// The framework's own request (with expandable segments, not the chunk the driver refused).
    pub requested: u64,
    pub reserved: u64,
    pub allocated: u64,
    pub largest_free_block: Option<u64>,
    /// Segments the lens listed after it, the free pieces in them, and how many of them had any.
    pub segments_listed: u64,
    pub free_pieces: u64,
    pub segments_with_free: u64,
}

impl LensOom {
    pub fn cached_free(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ArenaKind {
    /// A `cuMemAddressReserve` range; occupied = mapped ranges. Free = unmapped address space.
    VmmReservation,
    /// A stream-ordered pool. Size = estimated reserve, occupied = live allocations.
    Pool,
    /// A framework segment (PyTorch) with blocks, from a snapshot import.
    FrameworkSegment,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArenaView {
    pub pid: u32,
    pub start_time: u64,
    pub device: i16,
    pub kind: ArenaKind,
    /// Base address (reservation, segment); for a pool: its handle (0 = the device's default pool).
    pub base: u64,
    pub size: u64,
    pub occupied: u64,
    pub free_in_arena: u64,
    pub largest_free_span: u64,
    pub fragmentation: f64,
    pub live_allocations: u64,
}

/// One live allocation, for address-layout pictures. Virtual gaps between plain allocations
/// are NOT free VRAM: the GPU pages physical memory, so those gaps say nothing about what
/// the next allocation can get.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutEntry {
    pub addr: u64,
    pub size: u64,
    pub class: Class,
    pub pid: u32,
    pub device: i16,
    pub ts_ns: u64,
    /// VMM mappings: base of the reservation that holds them.
    pub reservation: Option<u64>,
    /// VMM mappings: the physical handle mapped there.
    pub handle: Option<u64>,
}

/// In JSON (reports, the agent's state) each verdict is its [`Verdict::name`]; checkpoints
/// (postcard) encode a variant by its index, so the names do not reach them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The device did not have the bytes, even counting every idle byte of traced processes.
    Capacity,
    /// This process held idle cached bytes (pool reserve, framework cache) that would have covered it.
    Reclaimable,
    /// Other traced processes held idle bytes that would have covered it.
    OtherProcess,
    /// An arena of this process had enough free bytes but no span large enough.
    ArenaFragmentation,
    /// The device had the requested bytes, but not once rounded up to the page granularity.
    Granularity,
    /// A framework's cache (PyTorch's caching allocator, XLA's BFC pool) held enough
    /// reserved-but-unallocated bytes for the request, but no free block was large enough.
    FrameworkFragmentation,
    /// A caching framework held enough bytes from the driver to cover the request, and how
    /// much of them was free inside its cache is not visible from the driver (no lens).
    FrameworkCache,
    /// Not explained by the numbers known; see `unknown_reason`.
    Unknown,
}

impl Verdict {
    /// Every verdict, in a fixed order (dashboards and counters list them all).
    pub const ALL: [Verdict; 8] = [
        Verdict::Capacity,
        Verdict::Reclaimable,
        Verdict::OtherProcess,
        Verdict::ArenaFragmentation,
        Verdict::Granularity,
        Verdict::FrameworkFragmentation,
        Verdict::FrameworkCache,
        Verdict::Unknown,
    ];

    /// Its fixed name, as reports, metric labels and log parsers use it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Capacity => "capacity",
            Verdict::Reclaimable => "reclaimable",
            Verdict::OtherProcess => "other_process",
            Verdict::ArenaFragmentation => "arena_fragmentation",
            Verdict::Granularity => "granularity",
            Verdict::FrameworkFragmentation => "framework_fragmentation",
            Verdict::FrameworkCache => "framework_cache",
            Verdict::Unknown => "unknown",
        }
    }
}

/// In JSON each outcome is its [`Outcome::name`] (`recovered`, `failed_again`, `open`,
/// `failed`); checkpoints (postcard) encode a variant by its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A retry of the same size succeeded.
    Recovered,
    /// A retry of the same size failed too.
    FailedAgain,
    /// No retry seen yet: the process is still within the retry window (2 s and 64 of its
    /// events after the failure; memory it gives back does not count).
    Open,
    /// The framework gave up on the request (its lens saw its out-of-memory error), or the
    /// process moved on without the bytes: its window closed with no retry, another request
    /// failed, or it exited.
    Failed,
}

impl Outcome {
    /// Every outcome, in a fixed order.
    pub const ALL: [Outcome; 4] = [Outcome::Recovered, Outcome::FailedAgain, Outcome::Open, Outcome::Failed];

    /// Its fixed name, as reports, logs and exports use it (the same as in JSON).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Recovered => "recovered",
            Outcome::FailedAgain => "failed_again",
            Outcome::Open => "open",
            Outcome::Failed => "failed",
        }
    }
}

/// Free space of one arena at the moment of a failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArenaNumbers {
    pub kind: ArenaKind,
    pub base: u64,
    pub free_in_arena: u64,
    pub largest_free_span: u64,
}

/// Everything a verdict is decided from (public so that another model can reuse the rule).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictInputs {
    pub requested: u64,
    pub granularity: u64,
    pub device_free: Option<u64>,
    pub device_total: Option<u64>,
    /// This process's idle bytes on the device (pool reserve − live, framework cache).
    pub own_idle: u64,
    /// Other live traced processes' idle bytes on the device.
    pub other_idle: u64,
    /// This process's arenas on the device.
    pub arenas: Vec<ArenaNumbers>,
    /// The caching framework whose libraries the process loaded, if any.
    #[serde(default)]
    pub framework: Option<FrameworkId>,
    /// This process's own resident live bytes on the device: all a framework of it can hold.
    #[serde(default)]
    pub framework_held: u64,
    /// Over this process's framework segments on the device (a snapshot's or a lens's):
    /// their free bytes, the largest free block among them, and their count.
    #[serde(default)]
    pub cache_free: u64,
    #[serde(default)]
    pub cache_largest_free: u64,
    #[serde(default)]
    pub cache_segments: u64,
    /// Their bytes, their free pieces, and how many of them had any free byte.
    #[serde(default)]
    pub cache_reserved: u64,
    #[serde(default)]
    pub cache_pieces: u64,
    #[serde(default)]
    pub cache_with_free: u64,
    /// What the framework's lens said when it gave up, if a lens ran.
    #[serde(default)]
    pub lens: Option<LensOom>,
    /// The latest periodic sample of a caching framework's lens on the device, when it was
    /// taken at most `LENS_SAMPLE_FRESH_NS` before the failure (CuPy's and JAX's lenses
    /// have no out-of-memory observer: their samples are all there is).
    #[serde(default)]
    pub lens_sample: Option<LensSample>,
    /// The same request succeeded on a retry (the framework gave back cached memory and the
    /// driver then had it): whatever was free in its cache was not stranded.
    #[serde(default)]
    pub recovered: bool,
    /// Other processes' memory on the device at the failure, most bytes first.
    #[serde(default)]
    pub holders: Vec<Holder>,
    /// The framework's own limit for this process on the device, when its lens knows one.
    #[serde(default)]
    pub framework_limit: Option<u64>,
    /// Not judged: the model's work allowance for incidents was spent (an extreme or
    /// hostile input), so other processes and this one's arenas were not looked at.
    pub unjudged: bool,
}

impl VerdictInputs {
    /// Other processes' bytes by how they could be had: (releasable, stranded, not visible,
    /// live, untraced).
    pub fn others(&self) -> OthersBytes {
        let mut o = OthersBytes::default();
        for h in &self.holders {
            o.releasable = o.releasable.saturating_add(h.releasable_bytes);
            o.stranded = o.stranded.saturating_add(h.stranded_bytes);
            o.not_visible = o.not_visible.saturating_add(h.not_visible_bytes);
            if h.sight == HolderSight::UntracedUnnamed {
                o.unnamed = o.unnamed.saturating_add(h.live_bytes);
            } else if h.sight == HolderSight::Untraced {
                o.untraced = o.untraced.saturating_add(h.live_bytes);
            } else {
                o.live = o.live.saturating_add(h.live_bytes);
            }
        }
        o
    }
}

/// Other processes' bytes on a device, summed by how they could be had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OthersBytes {
    pub releasable: u64,
    pub stranded: u64,
    pub not_visible: u64,
    pub live: u64,
    pub untraced: u64,
    /// The device's bytes no traced process holds, with no NVML to name their holders:
    /// stated, never counted as another's (they may be this process's own context, or
    /// reserves it has that were not sampled).
    pub unnamed: u64,
}

impl OthersBytes {
    /// What named other processes held (the unnamed remainder is not in it).
    pub fn total(&self) -> u64 {
        self.releasable
            .saturating_add(self.stranded)
            .saturating_add(self.not_visible)
            .saturating_add(self.live)
            .saturating_add(self.untraced)
    }
}

/// A lens's periodic sample as a verdict uses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LensSample {
    pub framework: FrameworkId,
    pub reserved: u64,
    pub allocated: u64,
    /// `None`: the framework does not report it (CuPy), or this sample did not measure it.
    pub largest_free_block: Option<u64>,
    /// How long before the failure it was taken.
    pub age_ns: u64,
}

impl LensSample {
    pub fn cached_free(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

/// How another process's bytes on the failing device were seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderSight {
    /// Traced, with its framework's lens or segments: releasable and stranded are measured.
    #[default]
    Lens,
    /// Traced, no caching framework: its bytes are its allocations (and pool reserves).
    Driver,
    /// Traced, a caching framework with no lens: its held bytes may be idle, not visible.
    CacheNotVisible,
    /// Not traced: NVML's per-process figure (context included).
    Untraced,
    /// Not traced and not named: the device's bytes no traced process holds (no NVML).
    UntracedUnnamed,
}

impl HolderSight {
    pub fn name(self) -> &'static str {
        match self {
            HolderSight::Lens => "lens",
            HolderSight::Driver => "driver",
            HolderSight::CacheNotVisible => "cache_not_visible",
            HolderSight::Untraced => "untraced",
            HolderSight::UntracedUnnamed => "untraced_unnamed",
        }
    }
}

/// Another process's memory on the failing device at a failure: "is it me, or is it them?"
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// 0 for the device's unnamed untraced bytes.
    pub pid: u32,
    pub command: String,
    pub sight: HolderSight,
    /// Bytes it held on the device (traced: allocations and pool reserves; untraced: NVML's
    /// figure, or the unnamed remainder).
    pub held_bytes: u64,
    /// What it could give back without stopping: its pools' idle reserve, its whole free
    /// framework segments, a lens's `reserved − allocated − stranded`.
    pub releasable_bytes: u64,
    /// Free inside its split framework segments: only a restart (or the end of the blocks
    /// that split them) gives these back.
    pub stranded_bytes: u64,
    /// A caching framework's bytes with no lens: possibly idle, not visible from the driver.
    pub not_visible_bytes: u64,
    /// In use: held − releasable − stranded − not visible.
    pub live_bytes: u64,
    pub framework: Option<FrameworkId>,
    /// NVML's per-process figure (context and libraries included), when NVML was read.
    pub nvml_bytes: Option<u64>,
}

/// The device bytes that no traced process holds, when NVML does not name their holders,
/// count as another's only past this allowance per traced process on the device: each
/// process's CUDA context, modules and library workspaces are there too (520 to 590 MiB
/// for a PyTorch or ollama process on the H200, cuBLAS's 64 MiB included).
pub const CONTEXT_ALLOWANCE: u64 = 768 << 20;

/// A lens sample older than this at a failure says too little about the cache then.
pub const LENS_SAMPLE_FRESH_NS: u64 = 5_000_000_000;

/// One out-of-memory incident: a failure, possibly followed by frees and retries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomIncident {
    pub id: u64,
    pub pid: u32,
    pub start_time: u64,
    pub command: String,
    pub device: i16,
    /// Time of the first failure.
    pub ts_ns: u64,
    /// The driver function that failed (its name in JSON and checkpoints).
    #[serde(with = "api_by_name")]
    pub api: Api,
    pub caller: String,
    pub requested_bytes: u64,
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    /// When the device sample used was taken.
    pub sample_ts_ns: Option<u64>,
    /// The sample is the one the interposer takes right after the failure.
    pub sample_after_failure: bool,
    pub verdict: Verdict,
    pub unknown_reason: Option<String>,
    /// What to do, in one sentence (the explanation tells the story behind it).
    #[serde(default)]
    pub fix: String,
    pub explanation: String,
    /// Failed calls in this incident (first failure plus failed retries).
    pub failures: u64,
    /// Retries of the same size seen.
    pub retries: u64,
    /// Bytes the process released between the first failure and the last retry.
    pub freed_bytes_between: u64,
    pub outcome: Outcome,
    /// The last events of the process before the first failure, oldest first.
    pub lead_up: Vec<EventRecord>,
    pub own_idle_bytes: u64,
    pub other_idle_bytes: u64,
    /// Sum of free bytes in this process's arenas on the device, and the largest span among them.
    pub arena_free_bytes: u64,
    pub arena_largest_free_span: u64,
    /// The caching framework the process loaded, if any.
    #[serde(default)]
    pub framework: Option<FrameworkId>,
    /// What its lens saw when the framework gave up (`None`: no lens ran, or it said nothing).
    #[serde(default)]
    pub framework_oom: Option<LensOom>,
    /// Cache-wide over the framework's segments at the failure: `1 − largest free block / all
    /// free bytes in the cache` (`None`: no segments known).
    #[serde(default)]
    pub cache_fragmentation: Option<f64>,
    /// Other processes' memory on the device at the failure (traced, and untraced from NVML
    /// or as the device's remainder), most bytes first.
    #[serde(default)]
    pub holders: Vec<Holder>,
    /// The framework's own limit for the process on the device, when its lens knows one.
    #[serde(default)]
    pub framework_limit: Option<u64>,
}

/// The full state, for an operator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSnapshot {
    /// Latest event time seen (monotonic ns); ages are measured against it.
    pub now_ns: u64,
    pub events: u64,
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
    pub arenas: Vec<ArenaView>,
    pub incidents: Vec<OomIncident>,
    /// Nonsense events, counted by reason and otherwise ignored.
    pub anomalies: BTreeMap<String, u64>,
}

/// A block inside a framework segment (a PyTorch snapshot's block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    pub allocated: bool,
}

/// Reasons an event is counted as an anomaly and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Anomaly {
    UnknownKind,
    UnknownApi,
    AllocUnknownApi,
    AllocNull,
    AllocOverLive,
    /// Free of an address not live (unknown, or already freed: a double free).
    FreeUnknown,
    VmmCreateDuplicate,
    ReleaseUnknown,
    DoubleRelease,
    MapUnknownHandle,
    MapReleasedHandle,
    MapOutsideReservation,
    MapOverlap,
    UnmapNothing,
    ReserveOverlap,
    AddressFreeUnknown,
    AddressFreeWhileMapped,
    PoolDuplicate,
    PoolUnknown,
    TimeBackwards,
    EventAfterExit,
    AddressOverflow,
    ZeroSize,
    BadSegment,
    /// A pool sample whose reserve is beyond any device ([`MAX_POOL_SAMPLE`]): ignored.
    PoolSampleImplausible,
}

/// The largest pool reserve a `pool_sample` may report (1 PiB): beyond any device, so a
/// larger one is a corrupt or hostile record. Keeps every sum of reserves far from overflow.
pub const MAX_POOL_SAMPLE: u64 = 1 << 50;

impl Anomaly {
    pub const COUNT: usize = 25;
    pub const ALL: [Anomaly; Anomaly::COUNT] = [
        Anomaly::UnknownKind,
        Anomaly::UnknownApi,
        Anomaly::AllocUnknownApi,
        Anomaly::AllocNull,
        Anomaly::AllocOverLive,
        Anomaly::FreeUnknown,
        Anomaly::VmmCreateDuplicate,
        Anomaly::ReleaseUnknown,
        Anomaly::DoubleRelease,
        Anomaly::MapUnknownHandle,
        Anomaly::MapReleasedHandle,
        Anomaly::MapOutsideReservation,
        Anomaly::MapOverlap,
        Anomaly::UnmapNothing,
        Anomaly::ReserveOverlap,
        Anomaly::AddressFreeUnknown,
        Anomaly::AddressFreeWhileMapped,
        Anomaly::PoolDuplicate,
        Anomaly::PoolUnknown,
        Anomaly::TimeBackwards,
        Anomaly::EventAfterExit,
        Anomaly::AddressOverflow,
        Anomaly::ZeroSize,
        Anomaly::BadSegment,
        Anomaly::PoolSampleImplausible,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Anomaly::UnknownKind => "unknown_kind",
            Anomaly::UnknownApi => "unknown_api",
            Anomaly::AllocUnknownApi => "alloc_unknown_api",
            Anomaly::AllocNull => "alloc_null",
            Anomaly::AllocOverLive => "alloc_over_live",
            Anomaly::FreeUnknown => "free_unknown_address",
            Anomaly::VmmCreateDuplicate => "vmm_create_duplicate",
            Anomaly::ReleaseUnknown => "release_unknown_handle",
            Anomaly::DoubleRelease => "double_release",
            Anomaly::MapUnknownHandle => "map_unknown_handle",
            Anomaly::MapReleasedHandle => "map_released_handle",
            Anomaly::MapOutsideReservation => "map_outside_reservation",
            Anomaly::MapOverlap => "map_overlap",
            Anomaly::UnmapNothing => "unmap_of_nothing",
            Anomaly::ReserveOverlap => "reserve_overlap",
            Anomaly::AddressFreeUnknown => "address_free_unknown",
            Anomaly::AddressFreeWhileMapped => "address_free_while_mapped",
            Anomaly::PoolDuplicate => "pool_duplicate",
            Anomaly::PoolUnknown => "pool_unknown",
            Anomaly::TimeBackwards => "time_backwards",
            Anomaly::EventAfterExit => "event_after_exit",
            Anomaly::AddressOverflow => "address_overflow",
            Anomaly::ZeroSize => "zero_size",
            Anomaly::BadSegment => "bad_segment",
            Anomaly::PoolSampleImplausible => "pool_sample_implausible",
        }
    }
}

/// Human-readable bytes: "200.00 GiB", "20.00 MiB", "512 B", up to TiB. The one copy:
/// the text reports, `run`'s summary and `top` use it, and the HTML report's script
/// (`analyzer/assets/report.js`, `fb`) writes bytes the same way.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// A command as people read it: the program's file name, then its arguments
/// (`/usr/bin/python3 train.py` → `python3 train.py`).
pub fn display_command(command: &str) -> String {
    let mut parts = command.splitn(2, ' ');
    let prog = parts.next().unwrap_or("");
    let base = prog.rsplit('/').next().unwrap_or(prog);
    match parts.next() {
        Some(rest) => format!("{base} {rest}"),
        None => base.to_string(),
    }
}

/// `1 − largest / free`, 0 when nothing is free.
pub fn fragmentation(largest: u64, free: u64) -> f64 {
    if free == 0 {
        0.0
    } else {
        1.0 - (largest.min(free) as f64 / free as f64)
    }
}

/// Round up to a multiple of `g` (saturating; `g == 0` leaves `v` as is).
pub fn round_up(v: u64, g: u64) -> u64 {
    if g == 0 {
        return v;
    }
    match v % g {
        0 => v,
        r => v.saturating_add(g - r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_the_same_everywhere() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(200 * GIB), "200.00 GiB");
        // Past GiB it goes on to TiB (one copy used to stop at GiB: "2048.00 GiB").
        assert_eq!(fmt_bytes(2048 * GIB), "2.00 TiB");
    }

    #[test]
    fn commands_show_the_program_name_and_arguments() {
        assert_eq!(display_command("/usr/bin/python3 train.py --x"), "python3 train.py --x");
        assert_eq!(display_command("llama-server"), "llama-server");
        assert_eq!(display_command(""), "");
    }
}
