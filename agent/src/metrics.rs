//! The metric catalogue, shared by the Prometheus endpoint and the OTLP exporter, so both
//! carry the same names, units and values (all taken from the model's snapshot).
//!
//! Names follow OpenTelemetry conventions (`vramhook.process.memory.live`, unit `By`);
//! the Prometheus names are what Prometheus's own OTLP translation makes of them
//! (`vramhook_process_memory_live_bytes`). Labels are only `pid`, `command`, `device`
//! and `kind`: never an address, so cardinality stays bounded by processes × devices.

use crate::stats::StatsView;
use vramhook_model::ModelSnapshot;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

/// One metric: OpenTelemetry name and unit, Prometheus name, meaning.
#[derive(Clone, Copy, Debug)]
pub struct MetricDef {
    pub otel: &'static str,
    pub unit: &'static str,
    pub prom: &'static str,
    pub kind: Kind,
    pub labels: &'static str,
    pub help: &'static str,
}

macro_rules! m {
    ($otel:literal, $unit:literal, $prom:literal, $kind:ident, $labels:literal, $help:literal) => {
        MetricDef { otel: $otel, unit: $unit, prom: $prom, kind: Kind::$kind, labels: $labels, help: $help }
    };
}

pub const DEVICE_TOTAL: MetricDef = m!(
    "vramhook.device.memory.total",
    "By",
    "vramhook_device_memory_total_bytes",
    Gauge,
    "device",
    "Device memory as the driver reports it (last cuMemGetInfo sample)."
);
pub const DEVICE_FREE: MetricDef = m!(
    "vramhook.device.memory.free",
    "By",
    "vramhook_device_memory_free_bytes",
    Gauge,
    "device",
    "Free device memory at the last driver sample."
);
pub const DEVICE_TRACED: MetricDef = m!(
    "vramhook.device.memory.traced",
    "By",
    "vramhook_device_memory_traced_bytes",
    Gauge,
    "device",
    "Device memory held by traced processes (the model's live bytes)."
);
pub const DEVICE_UNTRACED: MetricDef = m!(
    "vramhook.device.memory.untraced",
    "By",
    "vramhook_device_memory_untraced_bytes",
    Gauge,
    "device",
    "total - free - traced: untraced processes and driver contexts."
);
pub const PROC_LIVE: MetricDef = m!(
    "vramhook.process.memory.live",
    "By",
    "vramhook_process_memory_live_bytes",
    Gauge,
    "pid, command, kind",
    "Live device bytes of a process by kind (plain, pitch, managed, pool, vmm, array, ipc, import)."
);
pub const PROC_PEAK: MetricDef = m!(
    "vramhook.process.memory.peak",
    "By",
    "vramhook_process_memory_peak_bytes",
    Gauge,
    "pid, command",
    "Highest live bytes the process reached."
);
pub const PROC_LIVE_ALLOCS: MetricDef = m!(
    "vramhook.process.allocations.live",
    "{allocation}",
    "vramhook_process_allocations_live",
    Gauge,
    "pid, command",
    "Allocations currently live."
);
pub const PROC_ALLOCS: MetricDef = m!(
    "vramhook.process.allocations",
    "{allocation}",
    "vramhook_process_allocations_total",
    Counter,
    "pid, command",
    "Successful allocations since the process started."
);
pub const PROC_FAILED: MetricDef = m!(
    "vramhook.process.failed_calls",
    "{call}",
    "vramhook_process_failed_calls_total",
    Counter,
    "pid, command",
    "Memory calls that returned an error."
);
pub const PROC_OOMS: MetricDef = m!(
    "vramhook.process.ooms",
    "{oom}",
    "vramhook_process_ooms_total",
    Counter,
    "pid, command",
    "Out-of-memory failures (CUDA_ERROR_OUT_OF_MEMORY)."
);
pub const PROC_DROPPED: MetricDef = m!("vramhook.process.dropped_events", "{event}", "vramhook_process_dropped_events_total", Counter, "pid, command", "Events of this process that were lost (ring full, writer died, agent restart): its numbers are incomplete when > 0.");
pub const PROC_SPAN: MetricDef = m!(
    "vramhook.process.memory.largest_free_span",
    "By",
    "vramhook_process_memory_largest_free_span_bytes",
    Gauge,
    "pid, command",
    "Largest free span inside the process's arenas (VMM reservations, pools)."
);
pub const PROC_FRAG: MetricDef = m!(
    "vramhook.process.memory.fragmentation",
    "1",
    "vramhook_process_memory_fragmentation_ratio",
    Gauge,
    "pid, command",
    "1 - largest_free_span / free_in_arenas (0 when nothing is free)."
);
pub const AGENT_EVENTS: MetricDef = m!(
    "vramhook.agent.events.ingested",
    "{event}",
    "vramhook_agent_events_ingested_total",
    Counter,
    "",
    "Events drained from rings and applied to the model."
);
pub const AGENT_RINGS: MetricDef =
    m!("vramhook.agent.rings.open", "{ring}", "vramhook_agent_rings_open", Gauge, "", "Rings being drained.");
pub const AGENT_REFUSED: MetricDef = m!(
    "vramhook.agent.rings.refused",
    "{ring}",
    "vramhook_agent_rings_refused_total",
    Counter,
    "",
    "Ring files refused (bad header, absurd capacity, wrong owner)."
);
pub const AGENT_HOSTILE: MetricDef = m!(
    "vramhook.agent.rings.hostile",
    "{ring}",
    "vramhook_agent_rings_hostile_total",
    Counter,
    "",
    "Rings closed for what no writer can do (impossible counters or cursors, file cut while mapped)."
);
pub const AGENT_EVENTS_REFUSED: MetricDef = m!(
    "vramhook.agent.events.refused",
    "{event}",
    "vramhook_agent_events_refused_total",
    Counter,
    "",
    "Events refused for naming another process than their ring's verified writer."
);
pub const AGENT_GC_REMOVED: MetricDef = m!(
    "vramhook.agent.rings.gc_removed",
    "{ring}",
    "vramhook_agent_rings_gc_removed_total",
    Counter,
    "",
    "Undrained rings of gone processes removed over the keep budget (VRAMHOOK_KEEP_PERCENT, VRAMHOOK_KEEP_HOURS): their events were never drained."
);
pub const AGENT_GC_REMOVED_BYTES: MetricDef = m!(
    "vramhook.agent.rings.gc_removed_bytes",
    "By",
    "vramhook_agent_rings_gc_removed_bytes_total",
    Counter,
    "",
    "Bytes of the undrained rings removed over the keep budget."
);
pub const AGENT_MALFORMED: MetricDef = m!(
    "vramhook.agent.records.malformed",
    "{record}",
    "vramhook_agent_records_malformed_total",
    Counter,
    "",
    "Ring records that made no sense (corrupted or hostile writer)."
);
pub const AGENT_DROPPED: MetricDef = m!("vramhook.agent.events.dropped", "{event}", "vramhook_agent_events_dropped_total", Counter, "kind", "Events the model counts as lost, by where: kind=writer (ring full or writer died), kind=restart (consumed by a killed agent, never recorded), kind=earlier_agent (counted by an earlier agent instance, in the model recovered from its capture), kind=in_ring (Dropped records a hostile or corrupted writer put in its ring). The kinds add up to the sum of vramhook_process_dropped_events_total over every process the model holds.");
pub const AGENT_SINK_DROPPED: MetricDef = m!(
    "vramhook.agent.sink.dropped",
    "{item}",
    "vramhook_agent_sink_dropped_total",
    Counter,
    "kind",
    "Items a sink's bounded queue dropped: kind=capture (events), kind=otlp (OOM incidents)."
);
pub const AGENT_EXPORT_ERRORS: MetricDef = m!(
    "vramhook.agent.export.errors",
    "{error}",
    "vramhook_agent_export_errors_total",
    Counter,
    "kind",
    "Failed exports: kind=capture, otlp_metrics, otlp_traces, otlp_logs."
);

pub const ALL: &[MetricDef] = &[
    DEVICE_TOTAL,
    DEVICE_FREE,
    DEVICE_TRACED,
    DEVICE_UNTRACED,
    PROC_LIVE,
    PROC_PEAK,
    PROC_LIVE_ALLOCS,
    PROC_ALLOCS,
    PROC_FAILED,
    PROC_OOMS,
    PROC_DROPPED,
    PROC_SPAN,
    PROC_FRAG,
    AGENT_EVENTS,
    AGENT_RINGS,
    AGENT_REFUSED,
    AGENT_HOSTILE,
    AGENT_EVENTS_REFUSED,
    AGENT_GC_REMOVED,
    AGENT_GC_REMOVED_BYTES,
    AGENT_MALFORMED,
    AGENT_DROPPED,
    AGENT_SINK_DROPPED,
    AGENT_EXPORT_ERRORS,
];

/// One data point: labels as (key, value), and the value.
pub type Point = (Vec<(&'static str, String)>, f64);

pub const KINDS: [&str; 8] = ["plain", "pitch", "managed", "pool", "vmm", "array", "ipc", "import"];

/// Every data point of `def` in this snapshot. Only live processes are exported: an
/// exited process's series end with it.
pub fn points(def: &MetricDef, snap: &ModelSnapshot, stats: &StatsView) -> Vec<Point> {
    let dev = |d: i16| ("device", d.to_string());
    let procs = || snap.processes.iter().filter(|p| p.alive);
    let who = |p: &vramhook_model::ProcessView| {
        vec![("pid", p.pid.to_string()), ("command", command_label(&p.command, &p.exe))]
    };
    let per_proc = |f: &dyn Fn(&vramhook_model::ProcessView) -> f64| procs().map(|p| (who(p), f(p))).collect();
    match def.prom {
        "vramhook_device_memory_total_bytes" => {
            snap.devices.iter().filter_map(|d| Some((vec![dev(d.ordinal)], d.total? as f64))).collect()
        }
        "vramhook_device_memory_free_bytes" => {
            snap.devices.iter().filter_map(|d| Some((vec![dev(d.ordinal)], d.free? as f64))).collect()
        }
        "vramhook_device_memory_traced_bytes" => {
            snap.devices.iter().map(|d| (vec![dev(d.ordinal)], d.traced_bytes as f64)).collect()
        }
        "vramhook_device_memory_untraced_bytes" => {
            snap.devices.iter().filter_map(|d| Some((vec![dev(d.ordinal)], d.untraced_bytes? as f64))).collect()
        }
        "vramhook_process_memory_live_bytes" => procs()
            .flat_map(|p| {
                let c = &p.live_by_class;
                let v = [c.plain, c.pitch, c.managed, c.pool, c.vmm, c.array, c.ipc, c.import];
                KINDS.iter().zip(v).map(move |(k, b)| {
                    let mut l = who(p);
                    l.push(("kind", k.to_string()));
                    (l, b as f64)
                })
            })
            .collect(),
        "vramhook_process_memory_peak_bytes" => per_proc(&|p| p.peak_bytes as f64),
        "vramhook_process_allocations_live" => per_proc(&|p| p.live_allocations as f64),
        "vramhook_process_allocations_total" => per_proc(&|p| p.allocations as f64),
        "vramhook_process_failed_calls_total" => per_proc(&|p| p.failed_calls as f64),
        "vramhook_process_ooms_total" => per_proc(&|p| p.oom_count as f64),
        "vramhook_process_dropped_events_total" => per_proc(&|p| p.dropped_events as f64),
        "vramhook_process_memory_largest_free_span_bytes" => per_proc(&|p| p.largest_free_span as f64),
        "vramhook_process_memory_fragmentation_ratio" => per_proc(&|p| p.fragmentation),
        "vramhook_agent_events_ingested_total" => vec![(vec![], stats.events_ingested as f64)],
        "vramhook_agent_rings_open" => vec![(vec![], stats.rings_open as f64)],
        "vramhook_agent_rings_refused_total" => vec![(vec![], stats.rings_refused as f64)],
        "vramhook_agent_rings_hostile_total" => vec![(vec![], stats.rings_hostile as f64)],
        "vramhook_agent_events_refused_total" => vec![(vec![], stats.events_refused as f64)],
        "vramhook_agent_rings_gc_removed_total" => vec![(vec![], stats.rings_gc_removed as f64)],
        "vramhook_agent_rings_gc_removed_bytes_total" => vec![(vec![], stats.rings_gc_removed_bytes as f64)],
        "vramhook_agent_records_malformed_total" => vec![(vec![], stats.records_malformed as f64)],
        "vramhook_agent_events_dropped_total" => vec![
            (vec![("kind", "writer".into())], stats.writer_dropped as f64),
            (vec![("kind", "restart".into())], stats.restart_lost as f64),
            (vec![("kind", "earlier_agent".into())], stats.dropped_recovered as f64),
            (vec![("kind", "in_ring".into())], stats.dropped_in_ring as f64),
        ],
        "vramhook_agent_sink_dropped_total" => vec![
            (vec![("kind", "capture".into())], stats.capture_dropped_events as f64),
            (vec![("kind", "otlp".into())], stats.otlp_incidents_dropped as f64),
        ],
        "vramhook_agent_export_errors_total" => vec![
            (vec![("kind", "capture".into())], stats.capture_errors as f64),
            (vec![("kind", "otlp_metrics".into())], stats.otlp_metric_errors as f64),
            (vec![("kind", "otlp_traces".into())], stats.otlp_span_errors as f64),
            (vec![("kind", "otlp_logs".into())], stats.otlp_log_errors as f64),
        ],
        _ => Vec::new(),
    }
}

/// The program's base name and arguments, at most 80 characters.
pub fn command_label(command: &str, exe: &str) -> String {
    let cmd = if command.is_empty() { exe } else { command };
    let mut parts = cmd.splitn(2, ' ');
    let first = parts.next().unwrap_or("");
    let base = first.rsplit('/').next().unwrap_or(first);
    let mut s = match parts.next() {
        Some(rest) => format!("{base} {rest}"),
        None => base.to_string(),
    };
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
        let kind = match def.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
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

    #[test]
    fn the_readme_documents_every_metric_with_its_unit() {
        let readme = include_str!("../README.md");
        for def in ALL {
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", def.otel)))
                .unwrap_or_else(|| panic!("README has no row for {}", def.otel));
            assert!(row.contains(&format!("| {} |", def.unit)), "unit of {} in README", def.otel);
            assert!(row.contains(&format!("`{}`", def.prom)), "Prometheus name of {} in README", def.otel);
        }
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
