//! The metric catalogue, shared by the Prometheus endpoint and the OTLP exporter, so both
//! carry the same names, units and values (all taken from the model's snapshot).
//!
//! Names follow OpenTelemetry conventions (`vramhook.process.memory.live`, unit `By`);
//! the Prometheus names are what Prometheus's own OTLP translation makes of them
//! (`vramhook_process_memory_live_bytes`, attribute `process.pid` → label `process_pid`).
//! Two device metrics are OpenTelemetry's hardware semantic conventions for GPUs
//! (`hw.gpu.memory.usage`, `hw.gpu.memory.limit`); the rest are vramhook's own, in the
//! `vramhook.` namespace. Never an address label, so cardinality stays bounded by
//! processes × devices × kinds.

use crate::stats::StatsView;
use vramhook_model::{DeviceView, FrameworkCache, ModelSnapshot, ProcessDeviceMemory, ProcessFit, ProcessView};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    /// A sum that goes up and down (the instrument the hardware conventions prescribe);
    /// Prometheus stores it as a gauge.
    UpDownCounter,
}

impl Kind {
    /// The instrument's name in the README.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::UpDownCounter => "updowncounter",
        }
    }

    /// The type on Prometheus's `# TYPE` line.
    pub fn prometheus_type(self) -> &'static str {
        match self {
            Kind::Gauge | Kind::UpDownCounter => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// One data point: labels as (OpenTelemetry attribute key, value), and the value.
pub type Point = (Vec<(&'static str, String)>, f64);

/// Every data point of one metric in a snapshot and the agent's counters.
pub type Values = fn(&ModelSnapshot, &StatsView) -> Vec<Point>;

/// One metric: OpenTelemetry name and unit, Prometheus name, kind, labels, meaning, and
/// the function that produces its data points. `/metrics`, the OTLP exporter and the
/// README's table (checked by a test) all come from [`ALL`].
#[derive(Clone, Copy)]
pub struct MetricDef {
    pub otel: &'static str,
    pub unit: &'static str,
    pub prom: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    pub help: &'static str,
    pub values: Values,
}

impl std::fmt::Debug for MetricDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricDef").field("otel", &self.otel).field("prom", &self.prom).finish_non_exhaustive()
    }
}

const DEVICE: &[&str] = &["device"];
const GPU: &[&str] = &["hw.id", "hw.name", "hw.vendor", "hw.type"];
const PROCESS: &[&str] = &["process.pid", "process.executable.name", "device"];
const NONE: &[&str] = &[];
const KIND: &[&str] = &["kind"];
const FRAMEWORK: &[&str] = &["process.pid", "process.executable.name", "device", "framework"];
/// The owner of refused rings (the effective uid of their processes).
const OWNER: &[&str] = &["process.user.id"];

fn per_owner(st: &StatsView, f: impl Fn(&crate::stats::RingsTooLarge) -> f64) -> Vec<Point> {
    st.rings_too_large.iter().map(|t| (vec![("process.user.id", t.uid.to_string())], f(t))).collect()
}

/// Live processes only: an exited process's series end with it.
fn live(snap: &ModelSnapshot) -> impl Iterator<Item = &ProcessView> {
    snap.processes.iter().filter(|p| p.alive)
}

/// The devices a process holds memory on now, as one label value: "0", or "0,1" for a
/// process on two GPUs, "" (no label, for Prometheus) while it holds none.
pub fn devices_label(p: &ProcessView) -> String {
    let mut d: Vec<i16> = p.devices.iter().map(|d| d.device).collect();
    d.sort_unstable();
    d.dedup();
    d.iter().map(i16::to_string).collect::<Vec<_>>().join(",")
}

/// The process's labels, its numbers being process-wide: `device` lists its devices.
fn who(p: &ProcessView) -> Vec<(&'static str, String)> {
    who_on(p, devices_label(p))
}

fn who_on(p: &ProcessView, device: String) -> Vec<(&'static str, String)> {
    vec![
        ("process.pid", p.pid.to_string()),
        ("process.executable.name", executable_name(&p.command, &p.exe)),
        ("device", device),
    ]
}

/// An info series' point (value 1): the process and its command line, at most 1,024
/// characters of it.
fn info_point(pid: u32, command: &str, exe: &str) -> Point {
    let labels = vec![
        ("process.pid", pid.to_string()),
        ("process.executable.name", executable_name(command, exe)),
        ("process.command_line", command.chars().take(1024).collect()),
    ];
    (labels, 1.0)
}

fn per_process(snap: &ModelSnapshot, f: impl Fn(&ProcessView) -> f64) -> Vec<Point> {
    live(snap).map(|p| (who(p), f(p))).collect()
}

/// One point per live process, device and framework whose lens has spoken.
fn per_cache(snap: &ModelSnapshot, f: impl Fn(&FrameworkCache) -> Option<f64>) -> Vec<Point> {
    live(snap)
        .flat_map(|p| {
            let f = &f;
            p.framework_caches.iter().filter_map(move |c| {
                let mut l = who_on(p, c.device.to_string());
                l.push(("framework", c.framework.name().to_string()));
                Some((l, f(c)?))
            })
        })
        .collect()
}

/// One point per live process and device it holds memory on (`device_memory`).
fn per_device_memory(snap: &ModelSnapshot, f: impl Fn(&ProcessDeviceMemory) -> u64) -> Vec<Point> {
    live(snap).flat_map(|p| p.device_memory.iter().map(|m| (who_on(p, m.device.to_string()), f(m) as f64))).collect()
}

/// One point per live process and device with a fit (`ProcessView::fit`).
fn per_fit(snap: &ModelSnapshot, f: impl Fn(&ProcessFit) -> f64) -> Vec<Point> {
    live(snap).flat_map(|p| p.fit.iter().map(|x| (who_on(p, x.device.to_string()), f(x)))).collect()
}

/// One point (1) per live process and device whose fit is below 1, labelled with what
/// stands in the way.
fn fit_limits(snap: &ModelSnapshot) -> Vec<Point> {
    let mut out = Vec::new();
    for p in live(snap) {
        for f in &p.fit {
            if let Some(limit) = f.limited_by {
                let mut labels = who_on(p, f.device.to_string());
                labels.push(("limited_by", limit.name().to_string()));
                out.push((labels, 1.0));
            }
        }
    }
    out
}

fn per_device(snap: &ModelSnapshot, f: impl Fn(&DeviceView) -> Option<f64>) -> Vec<Point> {
    snap.devices.iter().filter_map(|d| Some((vec![("device", d.ordinal.to_string())], f(d)?))).collect()
}

/// A device under the hardware conventions' attributes (`hw.type` is "gpu" by the
/// conventions; `hw.id` is the CUDA ordinal as the traced processes see it).
fn per_gpu(snap: &ModelSnapshot, f: impl Fn(&DeviceView) -> Option<f64>) -> Vec<Point> {
    snap.devices
        .iter()
        .filter(|d| d.ordinal >= 0)
        .filter_map(|d| {
            let labels = vec![
                ("hw.id", format!("gpu{}", d.ordinal)),
                ("hw.name", format!("cuda:{}", d.ordinal)),
                ("hw.vendor", "NVIDIA".to_string()),
                ("hw.type", "gpu".to_string()),
            ];
            Some((labels, f(d)?))
        })
        .collect()
}

fn one(v: u64) -> Vec<Point> {
    vec![(vec![], v as f64)]
}

fn by_kind(parts: &[(&str, u64)]) -> Vec<Point> {
    parts.iter().map(|(k, v)| (vec![("kind", k.to_string())], *v as f64)).collect()
}

/// OOM incidents by device and verdict: every verdict of every device the agent knows,
/// zeros included, so that Prometheus's `increase()` sees the first incident too.
fn ooms_by_device(snap: &ModelSnapshot, stats: &StatsView) -> Vec<Point> {
    use std::collections::BTreeSet;
    let devices: BTreeSet<i16> =
        snap.devices.iter().map(|d| d.ordinal).chain(stats.ooms.iter().map(|t| t.device)).collect();
    let mut out = Vec::new();
    for device in devices {
        for v in crate::oom_counts::VERDICTS {
            let verdict = crate::oom_counts::verdict_label(v);
            let n: u64 =
                stats.ooms.iter().filter(|t| t.device == device && t.verdict == verdict).map(|t| t.count).sum();
            out.push((vec![("device", device.to_string()), ("verdict", verdict.to_string())], n as f64));
        }
    }
    out
}

fn ooms_on_host(stats: &StatsView) -> Vec<Point> {
    crate::oom_counts::VERDICTS
        .iter()
        .map(|v| {
            let verdict = crate::oom_counts::verdict_label(*v);
            let n: u64 = stats.ooms.iter().filter(|t| t.verdict == verdict).map(|t| t.count).sum();
            (vec![("verdict", verdict.to_string())], n as f64)
        })
        .collect()
}

pub const KINDS: [&str; 8] = ["plain", "pitch", "managed", "pool", "vmm", "array", "ipc", "import"];

pub const ALL: &[MetricDef] = &[
    MetricDef {
        otel: "vramhook.device.memory.total",
        unit: "By",
        prom: "vramhook_device_memory_total_bytes",
        kind: Kind::Gauge,
        labels: DEVICE,
        help: "Device memory as the driver reports it (last cuMemGetInfo sample).",
        values: |s, _| per_device(s, |d| Some(d.total? as f64)),
    },
    MetricDef {
        otel: "vramhook.device.memory.free",
        unit: "By",
        prom: "vramhook_device_memory_free_bytes",
        kind: Kind::Gauge,
        labels: DEVICE,
        help: "Free device memory at the last driver sample.",
        values: |s, _| per_device(s, |d| Some(d.free? as f64)),
    },
    MetricDef {
        otel: "vramhook.device.memory.traced",
        unit: "By",
        prom: "vramhook_device_memory_traced_bytes",
        kind: Kind::Gauge,
        labels: DEVICE,
        help: "Device memory held by traced processes (the model's live bytes).",
        values: |s, _| per_device(s, |d| Some(d.traced_bytes as f64)),
    },
    MetricDef {
        otel: "vramhook.device.memory.untraced",
        unit: "By",
        prom: "vramhook_device_memory_untraced_bytes",
        kind: Kind::Gauge,
        labels: DEVICE,
        help: "total - free - traced: untraced processes and driver contexts.",
        values: |s, _| per_device(s, |d| Some(d.untraced_bytes? as f64)),
    },
    MetricDef {
        otel: "hw.gpu.memory.usage",
        unit: "By",
        prom: "hw_gpu_memory_usage_bytes",
        kind: Kind::UpDownCounter,
        labels: GPU,
        help: "GPU memory used (total - free at the last driver sample), by every process. OpenTelemetry hardware semantic conventions.",
        values: |s, _| per_gpu(s, |d| Some(d.total?.saturating_sub(d.free?) as f64)),
    },
    MetricDef {
        otel: "hw.gpu.memory.limit",
        unit: "By",
        prom: "hw_gpu_memory_limit_bytes",
        kind: Kind::UpDownCounter,
        labels: GPU,
        help: "Size of the GPU memory (total at the last driver sample). OpenTelemetry hardware semantic conventions.",
        values: |s, _| per_gpu(s, |d| Some(d.total? as f64)),
    },
    MetricDef {
        otel: "vramhook.device.ooms",
        unit: "{oom}",
        prom: "vramhook_device_ooms_total",
        kind: Kind::Counter,
        labels: &["device", "verdict"],
        help: "OOM incidents on this device by verdict since the agent started, including those of processes that are gone.",
        values: ooms_by_device,
    },
    MetricDef {
        otel: "vramhook.host.ooms",
        unit: "{oom}",
        prom: "vramhook_host_ooms_total",
        kind: Kind::Counter,
        labels: &["verdict"],
        help: "OOM incidents on this host by verdict since the agent started, every device (and device unknown) together.",
        values: |_, st| ooms_on_host(st),
    },
    MetricDef {
        otel: "vramhook.process.info",
        unit: "{process}",
        prom: "vramhook_process_info",
        kind: Kind::Gauge,
        labels: &["process.pid", "process.executable.name", "process.command_line"],
        help: "1 for each live traced process, with its full command line (at most 1,024 characters); join on process_pid.",
        values: |s, _| {
            live(s).map(|p| info_point(p.pid, &p.command, &p.exe)).collect()
        },
    },
    MetricDef {
        otel: "vramhook.process.recorded_by_run",
        unit: "{process}",
        prom: "vramhook_process_recorded_by_run",
        kind: Kind::Gauge,
        labels: &["process.pid", "process.executable.name", "process.command_line"],
        help: "1 for each live process recorded by a vramhook run session: its ring is the session's, so it is not drained here and has no other series (vramhook agent --include-run-rings drains it instead).",
        values: |_, st| {
            st.recorded_by_run.iter().map(|r| info_point(r.pid, &r.command, &r.exe)).collect()
        },
    },
    MetricDef {
        otel: "vramhook.process.memory.live",
        unit: "By",
        prom: "vramhook_process_memory_live_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Device bytes the process owns on this device (every kind but IPC-opened and imported memory).",
        values: |s, _| {
            live(s)
                .flat_map(|p| {
                    let on: Vec<Point> =
                        p.devices.iter().map(|d| (who_on(p, d.device.to_string()), d.live_bytes as f64)).collect();
                    // A process holding nothing now still has its series, at 0.
                    if on.is_empty() {
                        vec![(who_on(p, String::new()), 0.0)]
                    } else {
                        on
                    }
                })
                .collect()
        },
    },
    MetricDef {
        otel: "vramhook.process.memory.held",
        unit: "By",
        prom: "vramhook_process_memory_held_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Device bytes the process holds: its live bytes plus the idle reserve of its stream-ordered pools (the driver's figure where sampled). NVML's per-process usage adds the context and libraries.",
        values: |s, _| per_process(s, |p| p.held_bytes as f64),
    },
    MetricDef {
        otel: "vramhook.process.memory.releasable",
        unit: "By",
        prom: "vramhook_process_memory_releasable_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Device bytes the process holds on this device that it could give back without stopping: its stream-ordered pools' idle reserve, its wholly free framework segments, and a lens's reserved - allocated - stranded (torch.cuda.empty_cache() gives these back).",
        values: |s, _| per_device_memory(s, |m| m.releasable_bytes),
    },
    MetricDef {
        otel: "vramhook.process.memory.stranded",
        unit: "By",
        prom: "vramhook_process_memory_stranded_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Device bytes free inside the process's split framework segments on this device (PyTorch's inactive_split_bytes): not given back by empty_cache(), only by a restart or the end of the blocks that split them.",
        values: |s, _| per_device_memory(s, |m| m.stranded_bytes),
    },
    MetricDef {
        otel: "vramhook.process.memory.fit",
        unit: "1",
        prom: "vramhook_process_memory_fit_ratio",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Per device: supply / demand, whether the process could get now as much as its largest request within the fit window (--fit-window). Below 1, that request would fail now. No point without a request in the window or a device sample.",
        values: |s, _| per_fit(s, |f| f.fit_ratio),
    },
    MetricDef {
        otel: "vramhook.process.memory.demand",
        unit: "By",
        prom: "vramhook_process_memory_demand_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Per device: the largest request the process made within the fit window and makes again: an allocation it gave back or that failed (memory held since it was made is not counted), a framework lens's OOM record (the request the framework itself refused), or the largest request given back that the lens saw.",
        values: |s, _| per_fit(s, |f| f.demand_bytes as f64),
    },
    MetricDef {
        otel: "vramhook.process.memory.supply",
        unit: "By",
        prom: "vramhook_process_memory_supply_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Per device: what the process could get for one request now, by its allocator's rules: a caching framework's largest free block, or a new segment from the device's free bytes (less the driver's reserve, under the framework's limit) plus what it releases first; a pool's idle reserve plus the device's free bytes; else the device's free bytes. Other processes' idle bytes are not counted.",
        values: |s, _| per_fit(s, |f| f.supply_bytes as f64),
    },
    MetricDef {
        otel: "vramhook.process.memory.fit.limit.info",
        unit: "{process}",
        prom: "vramhook_process_memory_fit_limit_info",
        kind: Kind::Gauge,
        labels: &["process.pid", "process.executable.name", "device", "limited_by"],
        help: "1 per process and device whose fit is below 1, with what stands in the way: framework_fragmentation (its cache would hold the request, not in one piece), framework_limit, other_processes (their memory would make room) or capacity. The verdict such a failure would likely get; join on process_pid and device.",
        values: |s, _| fit_limits(s),
    },
    MetricDef {
        otel: "vramhook.process.streams",
        unit: "{stream}",
        prom: "vramhook_process_streams",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Streams the process made and has not destroyed (cuStreamCreate*). PyTorch makes 128 per device for its stream pool.",
        values: |s, _| per_process(s, |p| p.streams as f64),
    },
    MetricDef {
        otel: "vramhook.process.memory.streams",
        unit: "By",
        prom: "vramhook_process_memory_streams_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Device memory the driver keeps for the process's streams, which no memory call shows and which it keeps after a stream is destroyed: the most streams at once times the per-stream bytes measured for the driver (an estimate). NVML's per-process usage is about held + this + the context.",
        values: |s, _| per_process(s, |p| p.stream_bytes as f64),
    },
    MetricDef {
        otel: "vramhook.process.memory.live_by_kind",
        unit: "By",
        prom: "vramhook_process_memory_live_by_kind_bytes",
        kind: Kind::Gauge,
        labels: &["process.pid", "process.executable.name", "device", "kind"],
        help: "Live device bytes of a process by kind (plain, pitch, managed, pool, vmm, array, ipc, import), over its devices.",
        values: |s, _| {
            live(s)
                .flat_map(|p| {
                    let c = &p.live_by_class;
                    let v = [c.plain, c.pitch, c.managed, c.pool, c.vmm, c.array, c.ipc, c.import];
                    KINDS.iter().zip(v).map(move |(k, b)| {
                        let mut l = who(p);
                        l.push(("kind", k.to_string()));
                        (l, b as f64)
                    })
                })
                .collect()
        },
    },
    MetricDef {
        otel: "vramhook.process.memory.peak",
        unit: "By",
        prom: "vramhook_process_memory_peak_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Highest live bytes the process reached.",
        values: |s, _| per_process(s, |p| p.peak_bytes as f64),
    },
    MetricDef {
        otel: "vramhook.process.allocations.live",
        unit: "{allocation}",
        prom: "vramhook_process_allocations_live",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Allocations currently live.",
        values: |s, _| per_process(s, |p| p.live_allocations as f64),
    },
    MetricDef {
        otel: "vramhook.process.allocations",
        unit: "{allocation}",
        prom: "vramhook_process_allocations_total",
        kind: Kind::Counter,
        labels: PROCESS,
        help: "Successful allocations since the process started.",
        values: |s, _| per_process(s, |p| p.allocations as f64),
    },
    MetricDef {
        otel: "vramhook.process.failed_calls",
        unit: "{call}",
        prom: "vramhook_process_failed_calls_total",
        kind: Kind::Counter,
        labels: PROCESS,
        help: "Memory calls that returned an error.",
        values: |s, _| per_process(s, |p| p.failed_calls as f64),
    },
    MetricDef {
        otel: "vramhook.process.ooms",
        unit: "{oom}",
        prom: "vramhook_process_ooms_total",
        kind: Kind::Counter,
        labels: PROCESS,
        help: "Out-of-memory failures (CUDA_ERROR_OUT_OF_MEMORY).",
        values: |s, _| per_process(s, |p| p.oom_count as f64),
    },
    MetricDef {
        otel: "vramhook.process.dropped_events",
        unit: "{event}",
        prom: "vramhook_process_dropped_events_total",
        kind: Kind::Counter,
        labels: PROCESS,
        help: "Events of this process that were lost (ring full, writer died, agent restart): its numbers are incomplete when > 0.",
        values: |s, _| per_process(s, |p| p.dropped_events as f64),
    },
    MetricDef {
        otel: "vramhook.process.memory.largest_free_span",
        unit: "By",
        prom: "vramhook_process_memory_largest_free_span_bytes",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "Largest free span inside the process's arenas (VMM reservations, pools).",
        values: |s, _| per_process(s, |p| p.largest_free_span as f64),
    },
    MetricDef {
        otel: "vramhook.process.memory.fragmentation",
        unit: "1",
        prom: "vramhook_process_memory_fragmentation_ratio",
        kind: Kind::Gauge,
        labels: PROCESS,
        help: "1 - largest_free_span / free_in_arenas (0 when nothing is free).",
        values: |s, _| per_process(s, |p| p.fragmentation),
    },
    MetricDef {
        otel: "vramhook.process.framework.reserved",
        unit: "By",
        prom: "vramhook_process_framework_reserved_bytes",
        kind: Kind::Gauge,
        labels: FRAMEWORK,
        help: "Bytes a framework's cache holds from the driver, as its lens last said (PyTorch's memory_reserved()).",
        values: |s, _| per_cache(s, |c| Some(c.reserved_bytes as f64)),
    },
    MetricDef {
        otel: "vramhook.process.framework.allocated",
        unit: "By",
        prom: "vramhook_process_framework_allocated_bytes",
        kind: Kind::Gauge,
        labels: FRAMEWORK,
        help: "Of those, bytes the framework handed out to the program (memory_allocated()).",
        values: |s, _| per_cache(s, |c| Some(c.allocated_bytes as f64)),
    },
    MetricDef {
        otel: "vramhook.process.framework.largest_free_block",
        unit: "By",
        prom: "vramhook_process_framework_largest_free_block_bytes",
        kind: Kind::Gauge,
        labels: FRAMEWORK,
        help: "The largest block the framework's cache could hand out whole, as last measured (no point until measured).",
        values: |s, _| per_cache(s, |c| Some(c.largest_free_block? as f64)),
    },
    MetricDef {
        otel: "vramhook.process.framework.fragmentation",
        unit: "1",
        prom: "vramhook_process_framework_fragmentation_ratio",
        kind: Kind::Gauge,
        labels: FRAMEWORK,
        help: "1 - largest free block / (reserved - allocated) of the framework's cache (no point until measured).",
        values: |s, _| per_cache(s, |c| c.fragmentation),
    },
    MetricDef {
        otel: "vramhook.agent.events.ingested",
        unit: "{event}",
        prom: "vramhook_agent_events_ingested_total",
        kind: Kind::Counter,
        labels: NONE,
        help: "Events drained from rings and applied to the model.",
        values: |_, st| one(st.events_ingested),
    },
    MetricDef {
        otel: "vramhook.agent.rings.open",
        unit: "{ring}",
        prom: "vramhook_agent_rings_open",
        kind: Kind::Gauge,
        labels: NONE,
        help: "Rings being drained.",
        values: |_, st| one(st.rings_open),
    },
    MetricDef {
        otel: "vramhook.agent.rings.refused",
        unit: "{ring}",
        prom: "vramhook_agent_rings_refused_total",
        kind: Kind::Counter,
        labels: NONE,
        help: "Ring files refused (bad header, absurd capacity, wrong owner).",
        values: |_, st| one(st.rings_refused),
    },
    MetricDef {
        otel: "vramhook.agent.rings.too_large",
        unit: "{ring}",
        prom: "vramhook_agent_rings_too_large_total",
        kind: Kind::Counter,
        labels: OWNER,
        help: "Rings refused for being larger than the agent reads (--max-ring-mib), by owner: their processes are not traced (also in rings_refused).",
        values: |_, st| per_owner(st, |t| t.rings as f64),
    },
    MetricDef {
        otel: "vramhook.agent.rings.too_large.max_ring_mib",
        unit: "{MiB}",
        prom: "vramhook_agent_rings_too_large_max_ring_mib",
        kind: Kind::Gauge,
        labels: OWNER,
        help: "The --max-ring-mib that would read the largest ring refused for its size, by owner.",
        values: |_, st| per_owner(st, |t| t.max_ring_mib as f64),
    },
    MetricDef {
        otel: "vramhook.agent.rings.hostile",
        unit: "{ring}",
        prom: "vramhook_agent_rings_hostile_total",
        kind: Kind::Counter,
        labels: NONE,
        help: "Rings closed for what no writer can do (impossible counters or cursors, file cut while mapped).",
        values: |_, st| one(st.rings_hostile),
    },
    MetricDef {
        otel: "vramhook.agent.events.refused",
        unit: "{event}",
        prom: "vramhook_agent_events_refused_total",
        kind: Kind::Counter,
        labels: NONE,
        help: "Events refused for naming another process than their ring's verified writer.",
        values: |_, st| one(st.events_refused),
    },
    MetricDef {
        otel: "vramhook.agent.rings.gc_removed",
        unit: "{ring}",
        prom: "vramhook_agent_rings_gc_removed_total",
        kind: Kind::Counter,
        labels: NONE,
        help: "Undrained rings of gone processes removed over the keep budget (VRAMHOOK_KEEP_PERCENT, VRAMHOOK_KEEP_HOURS): their events were never drained.",
        values: |_, st| one(st.rings_gc_removed),
    },
    MetricDef {
        otel: "vramhook.agent.rings.gc_removed_bytes",
        unit: "By",
        prom: "vramhook_agent_rings_gc_removed_bytes_total",
        kind: Kind::Counter,
        labels: NONE,
        help: "Bytes of the undrained rings removed over the keep budget.",
        values: |_, st| one(st.rings_gc_removed_bytes),
    },
    MetricDef {
        otel: "vramhook.agent.records.malformed",
        unit: "{record}",
        prom: "vramhook_agent_records_malformed_total",
        kind: Kind::Counter,
        labels: NONE,
        help: "Ring records that made no sense (corrupted or hostile writer).",
        values: |_, st| one(st.records_malformed),
    },
    MetricDef {
        otel: "vramhook.agent.events.dropped",
        unit: "{event}",
        prom: "vramhook_agent_events_dropped_total",
        kind: Kind::Counter,
        labels: KIND,
        help: "Events the model counts as lost, by where: kind=writer (ring full or writer died), kind=restart (consumed by a killed agent, never recorded), kind=earlier_agent (counted by an earlier agent instance, in the model recovered from its capture), kind=in_ring (Dropped records a hostile or corrupted writer put in its ring). The kinds add up to the sum of vramhook_process_dropped_events_total over every process the model holds.",
        values: |_, st| {
            by_kind(&[
                ("writer", st.writer_dropped),
                ("restart", st.restart_lost),
                ("earlier_agent", st.dropped_recovered),
                ("in_ring", st.dropped_in_ring),
            ])
        },
    },
    MetricDef {
        otel: "vramhook.agent.sink.dropped",
        unit: "{item}",
        prom: "vramhook_agent_sink_dropped_total",
        kind: Kind::Counter,
        labels: KIND,
        help: "Items a sink's bounded queue dropped: kind=capture (events), kind=otlp (OOM incidents).",
        values: |_, st| by_kind(&[("capture", st.capture_dropped_events), ("otlp", st.otlp_incidents_dropped)]),
    },
    MetricDef {
        otel: "vramhook.agent.export.errors",
        unit: "{error}",
        prom: "vramhook_agent_export_errors_total",
        kind: Kind::Counter,
        labels: KIND,
        help: "Failed exports: kind=capture, otlp_metrics, otlp_traces, otlp_logs.",
        values: |_, st| {
            by_kind(&[
                ("capture", st.capture_errors),
                ("otlp_metrics", st.otlp_metric_errors),
                ("otlp_traces", st.otlp_span_errors),
                ("otlp_logs", st.otlp_log_errors),
            ])
        },
    },
];

/// Every data point of `def` in this snapshot.
pub fn points(def: &MetricDef, snap: &ModelSnapshot, stats: &StatsView) -> Vec<Point> {
    (def.values)(snap, stats)
}

/// The executable's name (`python3`, `llama-server`), at most 128 characters: the
/// `process.executable.name` of every process series.
pub fn executable_name(command: &str, exe: &str) -> String {
    let path = if exe.is_empty() { command.split(' ').next().unwrap_or("") } else { exe };
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    path.rsplit('/').next().unwrap_or(path).chars().take(128).collect()
}

/// The program's base name and arguments, at most 80 characters.
pub fn command_label(command: &str, exe: &str) -> String {
    let mut s = vramhook_model::display_command(if command.is_empty() { exe } else { command });
    if s.chars().count() > 80 {
        s = s.chars().take(80).collect();
    }
    s
}

/// An attribute key as Prometheus's OTLP translation names the label (`process.pid` →
/// `process_pid`), so that `/metrics` and OTLP give the same labels.
pub fn prometheus_label(key: &str) -> String {
    key.replace('.', "_")
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The Prometheus text exposition (version 0.0.4) of the snapshot and agent counters.
pub fn render_prometheus(snap: &ModelSnapshot, stats: &StatsView) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(8192);
    for def in ALL {
        let kind = def.kind.prometheus_type();
        let _ = writeln!(out, "# HELP {} {} (OpenTelemetry: {}, unit {})", def.prom, def.help, def.otel, def.unit);
        let _ = writeln!(out, "# TYPE {} {kind}", def.prom);
        for (labels, value) in points(def, snap, stats) {
            out.push_str(def.prom);
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}=\"{}\"", prometheus_label(k), escape(v));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {}", fmt_value(value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's table: one row per metric, in the table's order, with the same
    /// names, unit, type and labels. A metric renamed, added or removed in [`ALL`] and not
    /// in the README (or the other way round) fails here.
    #[test]
    fn the_readme_table_is_the_metric_table() {
        let readme = include_str!("../../README.md");
        let got: Vec<Vec<String>> = readme
            .lines()
            .filter(|l| l.starts_with("| `vramhook.") || l.starts_with("| `hw."))
            .map(|l| l.trim_matches('|').split('|').take(5).map(|c| c.trim().to_string()).collect())
            .collect();
        let expected: Vec<Vec<String>> = ALL
            .iter()
            .map(|d| {
                vec![
                    format!("`{}`", d.otel),
                    d.unit.to_string(),
                    format!("`{}`", d.prom),
                    d.kind.name().to_string(),
                    d.labels.join(", "),
                ]
            })
            .collect();
        assert_eq!(got, expected, "agent/README.md's metric table (name, unit, Prometheus name, type, labels)");
    }

    /// Every metric yields points for a model with a sampled device and a live process,
    /// each point carrying exactly the metric's labels: none exports nothing by mistake.
    #[test]
    fn every_metric_has_points_with_its_labels() {
        use vramhook_protocol::{Api, Event};
        let mut m = vramhook_model::Model::default();
        m.apply(&Event::mem_info(1 << 30, 2 << 30).by(7, 7).at(1).on_device(0));
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x1000, 4096).by(7, 7).at(2).on_device(0));
        // An allocation given back: a request it makes (the fit's demand).
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x2000, 4096).by(7, 7).at(2).on_device(0));
        m.apply(&Event::free(Api::cuMemFree_v2, 0x2000).by(7, 7).at(2).on_device(0));
        // A lens's sample with the largest free block measured.
        let sample = Event::framework_sample(vramhook_protocol::FrameworkId::PyTorch, 4096, 1024, 2048, 1);
        m.apply(&sample.by(7, 7).at(3).on_device(0));
        // A process whose largest request given back (3 GiB) would not fit now: its fit is
        // below 1, with what stands in the way.
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x1_0000_0000, 3 << 30).by(8, 8).at(4).on_device(0));
        m.apply(&Event::free(Api::cuMemFree_v2, 0x1_0000_0000).by(8, 8).at(5).on_device(0));
        m.apply(&Event::mem_info(1 << 30, 2 << 30).by(8, 8).at(6).on_device(0));
        let snap = m.snapshot();
        // A ring refused for its size (its series exist only then).
        let stats = StatsView {
            rings_too_large: vec![crate::stats::RingsTooLarge {
                uid: 1000,
                rings: 1,
                largest_bytes: (128 << 20) + 4096,
                limit_bytes: (64 << 20) + 4096,
                max_ring_mib: 128,
            }],
            // A process recorded by a `vramhook run` session (its series exist only then).
            recorded_by_run: vec![crate::stats::RecordedByRun {
                pid: 9,
                start_time: 9,
                exe: "/usr/bin/python3".into(),
                command: "python3 train.py".into(),
                run_pid: Some(8),
            }],
            ..StatsView::default()
        };
        for def in ALL {
            let points = points(def, &snap, &stats);
            assert!(!points.is_empty(), "{} has no points", def.prom);
            for (labels, _) in points {
                let keys: Vec<&str> = labels.iter().map(|(k, _)| *k).collect();
                assert_eq!(keys, def.labels, "labels of {}", def.prom);
            }
        }
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = ALL.iter().flat_map(|d| [d.otel, d.prom]).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }

    #[test]
    fn prometheus_names_follow_the_otlp_translation() {
        for def in ALL {
            let base = def.otel.replace('.', "_");
            let expected = match (def.kind, def.unit) {
                (Kind::Counter, _) => format!("{base}_total"),
                // Prometheus's translation drops units in braces.
                (_, u) if u.starts_with('{') => base,
                (_, "By") => format!("{base}_bytes"),
                (_, "1") => format!("{base}_ratio"),
                _ => base,
            };
            assert_eq!(def.prom, expected);
        }
    }

    #[test]
    fn labels_are_the_documented_attributes_in_prometheus_form() {
        use vramhook_protocol::{Api, Event};
        let mut m = vramhook_model::Model::default();
        m.apply(&Event::mem_info(1 << 30, 2 << 30).by(7, 7).at(1).on_device(0));
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x1000, 4096).by(7, 7).at(2).on_device(0));
        let text = render_prometheus(&m.snapshot(), &StatsView::default());
        let allowed = [
            "process_pid",
            "process_executable_name",
            "process_command_line",
            "device",
            "kind",
            "verdict",
            "hw_id",
            "hw_name",
            "hw_vendor",
            "hw_type",
        ];
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some(labels) = line.split_once('{').map(|(_, r)| r) {
                for kv in labels.split("\",") {
                    let key = kv.split('=').next().unwrap_or("");
                    assert!(allowed.contains(&key), "label {key} in {line}");
                    seen.insert(key.to_string());
                }
            }
        }
        assert_eq!(seen.len(), allowed.len(), "every label appears: {seen:?}");
        assert!(text.contains(
            "hw_gpu_memory_limit_bytes{hw_id=\"gpu0\",hw_name=\"cuda:0\",hw_vendor=\"NVIDIA\",hw_type=\"gpu\"} 2147483648"
        ));
        assert!(text.contains("hw_gpu_memory_usage_bytes{hw_id=\"gpu0\",hw_name=\"cuda:0\",hw_vendor=\"NVIDIA\",hw_type=\"gpu\"} 1073741824"));
        assert!(text.contains("# TYPE hw_gpu_memory_usage_bytes gauge"));
    }

    #[test]
    fn process_series_carry_their_device_and_the_executable_name_only() {
        use vramhook_protocol::{Api, Event};
        let mut m = vramhook_model::Model::default();
        m.process_info(&vramhook_protocol::ProcessInfo {
            pid: 7,
            ppid: 1,
            uid: 0,
            start_time: 0,
            run_id: 0,
            exe: "/usr/bin/python3.12".into(),
            cmdline: ["/usr/bin/python3", "train.py", "--secret-token=abc"].map(String::from).to_vec(),
        });
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x1000, 4096).by(7, 7).at(2).on_device(0));
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x9000_0000, 8192).by(7, 7).at(3).on_device(1));
        let text = render_prometheus(&m.snapshot(), &StatsView::default());
        let who = "process_pid=\"7\",process_executable_name=\"python3.12\"";
        assert!(text.contains(&format!("vramhook_process_memory_live_bytes{{{who},device=\"0\"}} 4096")), "{text}");
        assert!(text.contains(&format!("vramhook_process_memory_live_bytes{{{who},device=\"1\"}} 8192")), "{text}");
        assert!(text.contains(&format!("vramhook_process_memory_peak_bytes{{{who},device=\"0,1\"}} 12288")), "{text}");
        let with_args: Vec<&str> = text.lines().filter(|l| l.contains("--secret-token")).collect();
        assert_eq!(with_args.len(), 1, "the command line is on the info metric only: {with_args:?}");
        assert!(with_args[0].starts_with("vramhook_process_info{"), "{}", with_args[0]);
    }

    #[test]
    fn oom_counters_have_every_verdict_and_count_by_device_and_host() {
        use vramhook_protocol::{Api, Event};
        let mut m = vramhook_model::Model::default();
        m.apply(&Event::mem_info(1 << 30, 2 << 30).by(7, 7).at(1).on_device(0));
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x1000, 4096).by(7, 7).at(2).on_device(0));
        let stats = StatsView {
            ooms: vec![
                crate::stats::OomTally { device: 0, verdict: "capacity".into(), count: 2 },
                crate::stats::OomTally { device: 3, verdict: "capacity".into(), count: 1 },
                crate::stats::OomTally { device: 3, verdict: "reclaimable".into(), count: 4 },
            ],
            ..StatsView::default()
        };
        let text = render_prometheus(&m.snapshot(), &stats);
        let value = |series: &str| {
            text.lines().find_map(|l| l.strip_prefix(series).and_then(|r| r.strip_prefix(' ')).map(str::to_string))
        };
        assert_eq!(value("vramhook_device_ooms_total{device=\"0\",verdict=\"capacity\"}").as_deref(), Some("2"));
        assert_eq!(value("vramhook_device_ooms_total{device=\"0\",verdict=\"granularity\"}").as_deref(), Some("0"));
        // Device 3 has no sample (its process is gone), its counts stay.
        assert_eq!(value("vramhook_device_ooms_total{device=\"3\",verdict=\"reclaimable\"}").as_deref(), Some("4"));
        assert_eq!(value("vramhook_host_ooms_total{verdict=\"capacity\"}").as_deref(), Some("3"));
        assert_eq!(value("vramhook_host_ooms_total{verdict=\"reclaimable\"}").as_deref(), Some("4"));
        assert_eq!(value("vramhook_host_ooms_total{verdict=\"unknown\"}").as_deref(), Some("0"));
    }
}
