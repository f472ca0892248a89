//! Fleet post-mortems: captures from many hosts at once. Each capture names its host in
//! its header; the captures of one host are replayed together (as one stream, like any
//! `vramhook analyze` of rotated files), each host through its own model (pids and device
//! ordinals of two hosts are unrelated), and the fleet report puts the hosts side by side
//! and adds them up: OOM incidents by verdict and by host, the largest holders and the
//! devices closest to full across the fleet.
//!
//! Inputs without a host (PyTorch snapshots, logs, files that are not captures) are
//! reported together under "(no host)".

use crate::{analyze, AnalyzeError, Options, Report};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Version of the fleet report's JSON (a document of its own: each host's part is a
/// [`Report`] with its own `schema_version`).
pub const FLEET_SCHEMA_VERSION: u32 = 1;

/// The name inputs without a host are reported under.
pub const NO_HOST: &str = "(no host)";

/// Rows kept in the fleet-wide lists (holders, devices).
const FLEET_TOP: usize = 10;

#[derive(Clone, Debug, Serialize)]
pub struct FleetReport {
    pub fleet_schema_version: u32,
    pub generator: String,
    /// One line per host, in host order.
    pub summary: Vec<HostSummary>,
    pub fleet: FleetTotals,
    /// Each host's full report, in host order.
    pub hosts: Vec<HostReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HostReport {
    pub host: String,
    pub inputs: Vec<String>,
    pub report: Report,
}

/// One host's numbers, for the table.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct HostSummary {
    pub host: String,
    pub inputs: u64,
    pub events: u64,
    pub processes: u64,
    pub devices: u64,
    /// Highest live bytes any one device of the host reached.
    pub peak_device_live_bytes: u64,
    pub ooms: u64,
    pub ooms_by_verdict: BTreeMap<String, u64>,
    /// Bytes the host's leaks left behind (live at exit, or growing).
    pub leaked_bytes: u64,
    pub dropped_events: u64,
    /// Inputs that were not complete (truncated, corrupt, gaps, unreadable).
    pub incomplete_inputs: u64,
}

/// The fleet added up.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct FleetTotals {
    pub hosts: u64,
    pub events: u64,
    pub processes: u64,
    pub devices: u64,
    pub ooms: u64,
    pub ooms_by_verdict: BTreeMap<String, u64>,
    pub leaked_bytes: u64,
    pub dropped_events: u64,
    /// The processes with the highest peaks across the fleet (at most 10).
    pub top_holders: Vec<FleetHolder>,
    /// The devices that came closest to full across the fleet (at most 10), by their
    /// lowest free memory sampled.
    pub least_headroom: Vec<FleetDevice>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FleetHolder {
    pub host: String,
    pub pid: u32,
    pub command: String,
    pub peak_bytes: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FleetDevice {
    pub host: String,
    pub device: i16,
    pub total_bytes: Option<u64>,
    pub min_free_bytes: u64,
    pub peak_live_bytes: u64,
}

/// The host a capture file names in its header: `None` for anything that is not a
/// readable capture (snapshots, logs, pipes, bad files), and for a capture whose header
/// has an empty host name.
pub fn capture_host(path: &Path) -> Option<String> {
    // A pipe or FIFO can be read once only (and opening a FIFO waits for a writer): only
    // regular files are peeked at.
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let file = std::fs::File::open(path).ok()?;
    let reader = vramhook_protocol::CaptureReader::new(std::io::BufReader::with_capacity(8192, file)).ok()?;
    Some(reader.header().host.clone()).filter(|h| !h.is_empty())
}

/// The inputs grouped by host, hosts in order, each host's files in the order given;
/// inputs without a host last, under [`NO_HOST`].
pub fn group_by_host<P: AsRef<Path>>(paths: &[P]) -> Vec<(String, Vec<PathBuf>)> {
    let mut groups: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut hostless = Vec::new();
    for p in paths {
        let p = p.as_ref();
        match capture_host(p) {
            Some(h) => groups.entry(h).or_default().push(p.to_path_buf()),
            None => hostless.push(p.to_path_buf()),
        }
    }
    let mut out: Vec<(String, Vec<PathBuf>)> = groups.into_iter().collect();
    if !hostless.is_empty() {
        out.push((NO_HOST.to_string(), hostless));
    }
    out
}

/// How many distinct hosts the captures among `paths` name.
pub fn host_count<P: AsRef<Path>>(paths: &[P]) -> usize {
    group_by_host(paths).iter().filter(|(h, _)| h != NO_HOST).count()
}

/// Analyses each host's inputs through its own model and adds the hosts up.
pub fn analyze_fleet<P: AsRef<Path>>(paths: &[P], opts: &Options) -> Result<FleetReport, AnalyzeError> {
    let mut hosts = Vec::new();
    for (host, files) in group_by_host(paths) {
        let report = analyze(&files, opts)?;
        hosts.push(HostReport { host, inputs: files.iter().map(|f| f.display().to_string()).collect(), report });
    }
    Ok(fleet_of(hosts))
}

/// The fleet report of hosts already analysed.
pub fn fleet_of(hosts: Vec<HostReport>) -> FleetReport {
    let summary: Vec<HostSummary> = hosts.iter().map(summarise).collect();
    let mut fleet = FleetTotals { hosts: summary.len() as u64, ..FleetTotals::default() };
    for s in &summary {
        fleet.events += s.events;
        fleet.processes += s.processes;
        fleet.devices += s.devices;
        fleet.ooms += s.ooms;
        fleet.leaked_bytes = fleet.leaked_bytes.saturating_add(s.leaked_bytes);
        fleet.dropped_events = fleet.dropped_events.saturating_add(s.dropped_events);
        for (v, n) in &s.ooms_by_verdict {
            *fleet.ooms_by_verdict.entry(v.clone()).or_default() += n;
        }
    }
    let mut holders: Vec<FleetHolder> = hosts
        .iter()
        .flat_map(|h| {
            h.report.processes.iter().map(|p| FleetHolder {
                host: h.host.clone(),
                pid: p.pid,
                command: p.command.clone(),
                peak_bytes: p.peak_bytes,
            })
        })
        .collect();
    holders.sort_by(|a, b| b.peak_bytes.cmp(&a.peak_bytes).then_with(|| (&a.host, a.pid).cmp(&(&b.host, b.pid))));
    holders.truncate(FLEET_TOP);
    fleet.top_holders = holders;
    let mut devices: Vec<FleetDevice> = hosts
        .iter()
        .flat_map(|h| {
            h.report.devices.iter().filter_map(|d| {
                Some(FleetDevice {
                    host: h.host.clone(),
                    device: d.device,
                    total_bytes: d.total_bytes,
                    min_free_bytes: d.min_free_bytes?,
                    peak_live_bytes: d.peak_live_bytes,
                })
            })
        })
        .collect();
    devices.sort_by(|a, b| {
        a.min_free_bytes.cmp(&b.min_free_bytes).then_with(|| (&a.host, a.device).cmp(&(&b.host, b.device)))
    });
    devices.truncate(FLEET_TOP);
    fleet.least_headroom = devices;
    FleetReport {
        fleet_schema_version: FLEET_SCHEMA_VERSION,
        generator: format!("vramhook-analyzer {}", env!("CARGO_PKG_VERSION")),
        summary,
        fleet,
        hosts,
    }
}

fn summarise(h: &HostReport) -> HostSummary {
    let r = &h.report;
    let mut ooms_by_verdict = BTreeMap::new();
    for o in &r.ooms {
        *ooms_by_verdict.entry(o.incident.verdict.name().to_string()).or_default() += 1;
    }
    HostSummary {
        host: h.host.clone(),
        inputs: r.inputs.len() as u64,
        events: r.events,
        processes: r.processes.len() as u64,
        devices: r.devices.len() as u64,
        peak_device_live_bytes: r.devices.iter().map(|d| d.peak_live_bytes).max().unwrap_or(0),
        ooms: r.ooms.len() as u64,
        ooms_by_verdict,
        leaked_bytes: r.leaks.iter().fold(0u64, |a, l| a.saturating_add(l.bytes)),
        dropped_events: r.processes.iter().fold(0u64, |a, p| a.saturating_add(p.dropped_events)),
        incomplete_inputs: r.inputs.iter().filter(|i| i.status != crate::InputStatus::Complete).count() as u64,
    }
}

fn verdicts(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter().map(|(v, n)| format!("{v} {n}")).collect::<Vec<_>>().join(", ")
}

/// The fleet report as text: the hosts side by side, the fleet's totals and lists, then
/// each host's own report.
pub fn render_text(f: &FleetReport) -> String {
    use std::fmt::Write;
    use vramhook_model::fmt_bytes;
    let mut out = String::new();
    let _ = writeln!(out, "vramhook fleet post-mortem: {} hosts, {} events", f.fleet.hosts, f.fleet.events);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<24} {:>6} {:>10} {:>9} {:>7} {:>12} {:>5} {:>12} {:>8}  OOM verdicts",
        "host", "inputs", "events", "processes", "devices", "peak/device", "OOMs", "leaked", "dropped"
    );
    for s in &f.summary {
        let incomplete =
            if s.incomplete_inputs > 0 { format!(" ({} incomplete)", s.incomplete_inputs) } else { String::new() };
        let _ = writeln!(
            out,
            "{:<24} {:>6} {:>10} {:>9} {:>7} {:>12} {:>5} {:>12} {:>8}  {}{incomplete}",
            s.host,
            s.inputs,
            s.events,
            s.processes,
            s.devices,
            fmt_bytes(s.peak_device_live_bytes),
            s.ooms,
            fmt_bytes(s.leaked_bytes),
            s.dropped_events,
            verdicts(&s.ooms_by_verdict)
        );
    }
    let t = &f.fleet;
    let _ = writeln!(
        out,
        "{:<24} {:>6} {:>10} {:>9} {:>7} {:>12} {:>5} {:>12} {:>8}  {}",
        "fleet",
        f.summary.iter().map(|s| s.inputs).sum::<u64>(),
        t.events,
        t.processes,
        t.devices,
        "",
        t.ooms,
        fmt_bytes(t.leaked_bytes),
        t.dropped_events,
        verdicts(&t.ooms_by_verdict)
    );
    if !t.top_holders.is_empty() {
        let _ = writeln!(out, "\nLargest holders across the fleet (peak):");
        for h in &t.top_holders {
            let _ = writeln!(out, "  {:>12}  {}  pid {}  {}", fmt_bytes(h.peak_bytes), h.host, h.pid, h.command);
        }
    }
    if !t.least_headroom.is_empty() {
        let _ = writeln!(out, "\nLeast headroom across the fleet (lowest free memory sampled):");
        for d in &t.least_headroom {
            let total = d.total_bytes.map(fmt_bytes).unwrap_or_else(|| "?".into());
            let _ = writeln!(
                out,
                "  {:>12} free of {total}  {} gpu {}  (peak traced {})",
                fmt_bytes(d.min_free_bytes),
                d.host,
                d.device,
                fmt_bytes(d.peak_live_bytes)
            );
        }
    }
    for h in &f.hosts {
        let _ = writeln!(out, "\n==== host {} ({}) ====\n", h.host, h.inputs.join(", "));
        out.push_str(&crate::render::text::render(&h.report));
    }
    out
}
