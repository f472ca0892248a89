//! The metric catalogue, shared by the Prometheus endpoint and the OTLP exporter, so both
//! carry the same names, units and values (all taken from the model's snapshot).
//!
//! Names follow OpenTelemetry conventions (`vramhook.process.memory.live`, unit `By`);
//! the Prometheus names are what Prometheus's own OTLP translation makes of them
//! (`vramhook_process_memory_live_bytes`). Labels are only `pid`, `command`, `device`
//! and `kind`: never an address, so cardinality stays bounded by processes × devices.

use crate::stats::StatsView;
use vramhook_model::{DeviceView, FrameworkCache, ModelSnapshot, ProcessView};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

impl Kind {
    /// The name Prometheus's `# TYPE` line and the README use.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// One data point: labels as (key, value), and the value.
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
const PROCESS: &[&str] = &["pid", "command"];
const NONE: &[&str] = &[];
const KIND: &[&str] = &["kind"];
const FRAMEWORK: &[&str] = &["pid", "command", "device", "framework"];

/// Live processes only: an exited process's series end with it.
fn live(snap: &ModelSnapshot) -> impl Iterator<Item = &ProcessView> {
    snap.processes.iter().filter(|p| p.alive)
}

fn who(p: &ProcessView) -> Vec<(&'static str, String)> {
    vec![("pid", p.pid.to_string()), ("command", command_label(&p.command, &p.exe))]
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
                let mut l = who(p);
                l.push(("device", c.device.to_string()));
                l.push(("framework", c.framework.name().to_string()));
                Some((l, f(c)?))
            })
        })
        .collect()
}

fn per_device(snap: &ModelSnapshot, f: impl Fn(&DeviceView) -> Option<f64>) -> Vec<Point> {
    snap.devices.iter().filter_map(|d| Some((vec![("device", d.ordinal.to_string())], f(d)?))).collect()
}

fn one(v: u64) -> Vec<Point> {
    vec![(vec![], v as f64)]
}

fn by_kind(parts: &[(&str, u64)]) -> Vec<Point> {
    parts.iter().map(|(k, v)| (vec![("kind", k.to_string())], *v as f64)).collect()
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
        otel: "vramhook.process.memory.live",
        unit: "By",
        prom: "vramhook_process_memory_live_bytes",
        kind: Kind::Gauge,
        labels: &["pid", "command", "kind"],
        help: "Live device bytes of a process by kind (plain, pitch, managed, pool, vmm, array, ipc, import).",
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

/// The program's base name and arguments, at most 80 characters.
pub fn command_label(command: &str, exe: &str) -> String {
    let mut s = vramhook_model::display_command(if command.is_empty() { exe } else { command });
    if s.chars().count() > 80 {
        s = s.chars().take(80).collect();
    }
    s
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
        let kind = def.kind.name();
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
                    let _ = write!(out, "{k}=\"{}\"", escape(v));
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
        let readme = include_str!("../README.md");
        let got: Vec<Vec<String>> = readme
            .lines()
            .filter(|l| l.starts_with("| `vramhook."))
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
        // A lens's sample with the largest free block measured.
        let sample = Event::framework_sample(vramhook_protocol::FrameworkId::PyTorch, 4096, 1024, 2048, 1);
        m.apply(&sample.by(7, 7).at(3).on_device(0));
        let snap = m.snapshot();
        for def in ALL {
            let points = points(def, &snap, &StatsView::default());
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
                (_, "By") => format!("{base}_bytes"),
                (_, "1") => format!("{base}_ratio"),
                _ => base,
            };
            assert_eq!(def.prom, expected);
        }
    }

    #[test]
    fn no_label_but_pid_command_device_kind() {
        let snap = vramhook_model::Model::default().snapshot();
        let text = render_prometheus(&snap, &StatsView::default());
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some(labels) = line.split_once('{').map(|(_, r)| r) {
                for kv in labels.split(',') {
                    let key = kv.split('=').next().unwrap_or("");
                    assert!(["pid", "command", "device", "kind"].contains(&key), "label {key} in {line}");
                }
            }
        }
    }
}
