//! The agent's own counters: what it ingested, what it refused, what each sink dropped.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Every self-metric of the agent. Updated with relaxed atomics from any task.
#[derive(Debug, Default)]
pub struct AgentStats {
    pub events_ingested: AtomicU64,
    pub rings_open: AtomicU64,
    pub rings_opened: AtomicU64,
    pub rings_closed: AtomicU64,
    pub rings_refused: AtomicU64,
    /// Rings closed after they were opened for what no writer can do: counters beyond
    /// what the process could have issued, cursors more than a lap apart, a file cut
    /// while mapped.
    pub rings_hostile: AtomicU64,
    /// Records a ring's reader found malformed (hostile or corrupted writers).
    pub records_malformed: AtomicU64,
    /// Events refused because they named another process than the ring's verified writer
    /// (also counted in `records_malformed`).
    pub events_refused: AtomicU64,
    /// Events the writers dropped (ring full) or lost in flight (writer died mid-write).
    pub writer_dropped: AtomicU64,
    /// Events a previous reader consumed from a ring but never recorded (it was killed in
    /// between, and did not defer its commits: an agent without a capture, `vramhook run`,
    /// an older agent): counted, never silently lost.
    pub restart_lost: AtomicU64,
    /// Events found again in a ring after a restart that the previous agent instance had
    /// already recorded (it was killed before it committed them): skipped, not delivered
    /// twice. Not a loss.
    pub duplicates_skipped: AtomicU64,
    /// Dropped events an earlier agent instance counted, found in the model it left in
    /// the capture (recovered at start): this instance's other counters start at zero.
    pub dropped_recovered: AtomicU64,
    /// `Dropped` records found in a ring itself (only a hostile or corrupted writer puts
    /// them there: the interposer counts its drops in the ring header). The model counts
    /// them as the record says.
    pub dropped_in_ring: AtomicU64,
    /// Events recovered from the capture after a restart.
    pub events_recovered: AtomicU64,
    pub capture_dropped_batches: AtomicU64,
    pub capture_dropped_events: AtomicU64,
    pub capture_errors: AtomicU64,
    pub capture_bytes: AtomicU64,
    pub capture_files: AtomicU64,
    pub checkpoints: AtomicU64,
    pub otlp_incidents_dropped: AtomicU64,
    pub otlp_metric_exports: AtomicU64,
    pub otlp_metric_errors: AtomicU64,
    pub otlp_span_exports: AtomicU64,
    pub otlp_span_errors: AtomicU64,
    pub otlp_log_exports: AtomicU64,
    pub otlp_log_errors: AtomicU64,
    pub otlp_skipped_backoff: AtomicU64,
    pub incidents_exported: AtomicU64,
    /// Crossings of 1 by a process's fit handed to the OTLP log exporter.
    pub fit_crossings_exported: AtomicU64,
    pub snapshots: AtomicU64,
    pub http_requests: AtomicU64,
    /// Undrained rings of gone processes removed over the keep budget (their events were
    /// never drained), as recorded in the ring directory's `.gc-removed`.
    pub rings_gc_removed: AtomicU64,
    pub rings_gc_removed_bytes: AtomicU64,
    // eBPF mode (`vramhook agent --ebpf`), all 0 without it.
    /// Events the probes delivered to the model.
    pub ebpf_events: AtomicU64,
    /// Events of processes that also have a ring: dropped, the ring's count wins.
    pub ebpf_ring_won: AtomicU64,
    /// Events lost because the BPF ring buffer was full (also `Dropped` in the model).
    pub ebpf_lost: AtomicU64,
    /// Ring-buffer records refused as malformed.
    pub ebpf_malformed: AtomicU64,
    /// Probe links in place now.
    pub ebpf_links: AtomicU64,
    /// Processes traced through probes now.
    pub ebpf_processes: AtomicU64,
    /// OOM incidents since the agent started, by device and verdict (they outlive their
    /// process; written by the ingest thread only).
    pub ooms: std::sync::Mutex<crate::oom_counts::OomTotals>,
    /// Live processes whose rings a `vramhook run` session drains (left to it), as of the
    /// last directory scan (written by the ingest thread only).
    pub recorded_by_run: std::sync::Mutex<Vec<RecordedByRun>>,
}

/// A plain copy of [`AgentStats`] for the JSON state endpoint.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct StatsView {
    pub events_ingested: u64,
    pub rings_open: u64,
    pub rings_opened: u64,
    pub rings_closed: u64,
    pub rings_refused: u64,
    pub rings_hostile: u64,
    pub records_malformed: u64,
    pub events_refused: u64,
    pub writer_dropped: u64,
    pub restart_lost: u64,
    #[serde(default)]
    pub duplicates_skipped: u64,
    #[serde(default)]
    pub dropped_recovered: u64,
    #[serde(default)]
    pub dropped_in_ring: u64,
    pub events_recovered: u64,
    pub capture_dropped_batches: u64,
    pub capture_dropped_events: u64,
    pub capture_errors: u64,
    pub capture_bytes: u64,
    pub capture_files: u64,
    pub checkpoints: u64,
    pub otlp_incidents_dropped: u64,
    pub otlp_metric_exports: u64,
    pub otlp_metric_errors: u64,
    pub otlp_span_exports: u64,
    pub otlp_span_errors: u64,
    pub otlp_log_exports: u64,
    pub otlp_log_errors: u64,
    pub otlp_skipped_backoff: u64,
    pub incidents_exported: u64,
    #[serde(default)]
    pub fit_crossings_exported: u64,
    pub snapshots: u64,
    pub http_requests: u64,
    #[serde(default)]
    pub rings_gc_removed: u64,
    #[serde(default)]
    pub rings_gc_removed_bytes: u64,
    #[serde(default)]
    pub ebpf_events: u64,
    #[serde(default)]
    pub ebpf_ring_won: u64,
    #[serde(default)]
    pub ebpf_lost: u64,
    #[serde(default)]
    pub ebpf_malformed: u64,
    #[serde(default)]
    pub ebpf_links: u64,
    #[serde(default)]
    pub ebpf_processes: u64,
    /// OOM incidents since the agent started, by device and verdict, including those of
    /// processes already forgotten.
    #[serde(default)]
    pub ooms: Vec<OomTally>,
    /// Rings refused for being larger than this reader takes (`--max-ring-mib`), per owner:
    /// their processes are not traced.
    #[serde(default)]
    pub rings_too_large: Vec<RingsTooLarge>,
    /// Live processes recorded by a `vramhook run` session: their rings are that session's
    /// (one reader per ring), so they are listed here, not drained and not in the model;
    /// `--include-run-rings` drains them instead.
    #[serde(default)]
    pub recorded_by_run: Vec<RecordedByRun>,
}

/// A live process whose ring a `vramhook run` session drains. Read from the ring's header
/// without taking its lock: untrusted, bounded, control characters replaced.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct RecordedByRun {
    /// The process, as its ring names it.
    pub pid: u32,
    pub start_time: u64,
    /// Its executable and command line (at most 1,024 characters).
    pub exe: String,
    pub command: String,
    /// The `vramhook run` session draining it (the holder of the ring's lock), once seen.
    #[serde(default)]
    pub run_pid: Option<u32>,
}

impl From<vramhook_ring::source::RunRingProcess> for RecordedByRun {
    fn from(p: vramhook_ring::source::RunRingProcess) -> RecordedByRun {
        RecordedByRun { pid: p.pid, start_time: p.start_time, exe: p.exe, command: p.command, run_pid: p.run_pid }
    }
}

impl RecordedByRun {
    /// The process as `top` and the log name it: "pid 12 (python train.py)", and the
    /// session when known.
    pub fn describe(&self) -> String {
        let command = crate::metrics::command_label(&self.command, &self.exe);
        let who =
            if command.is_empty() { format!("pid {}", self.pid) } else { format!("pid {} ({command})", self.pid) };
        match self.run_pid {
            Some(run) => format!("{who} is recorded by vramhook run (pid {run})"),
            None => format!("{who} is recorded by vramhook run"),
        }
    }
}

/// The flag that makes the agent drain the rings of `vramhook run` sessions.
pub const INCLUDE_RUN_RINGS: &str = "--include-run-rings";

/// Rings of one owner refused for their size: their processes are not traced.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct RingsTooLarge {
    /// The rings' owner (the traced processes' effective uid).
    pub uid: u32,
    /// Rings refused.
    pub rings: u64,
    /// The largest of them, in bytes.
    pub largest_bytes: u64,
    /// The largest ring the reader takes, in bytes.
    pub limit_bytes: u64,
    /// The `--max-ring-mib` that takes the largest of them.
    pub max_ring_mib: u64,
}

/// Rings refused for their size, by owner, as the readers of this process noted them from
/// the ring source's refusals ([`vramhook_ring::source::TooLarge`]). Process-wide: one
/// agent, or one `top`, per process.
static TOO_LARGE: std::sync::Mutex<std::collections::BTreeMap<u32, RingsTooLarge>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The `--max-ring-mib` that takes a ring file of `len` bytes.
pub use vramhook_ring::source::max_ring_mib_for;

/// Counts a ring of `uid`, `len` bytes, refused for being over `limit` bytes.
pub fn note_too_large(uid: u32, len: u64, limit: u64) {
    if let Ok(mut m) = TOO_LARGE.lock() {
        let t = m.entry(uid).or_insert_with(|| RingsTooLarge { uid, ..RingsTooLarge::default() });
        t.rings = t.rings.saturating_add(1);
        t.largest_bytes = t.largest_bytes.max(len);
        t.limit_bytes = limit;
        t.max_ring_mib = max_ring_mib_for(t.largest_bytes);
    }
}

/// Every owner's rings refused for their size so far, in this process.
pub fn rings_too_large() -> Vec<RingsTooLarge> {
    TOO_LARGE.lock().map(|m| m.values().cloned().collect()).unwrap_or_default()
}

/// OOM incidents on one device with one verdict.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct OomTally {
    pub device: i16,
    pub verdict: String,
    pub count: u64,
}

impl StatsView {
    /// Every event the model counts as dropped, by where it was lost: the parts add up to
    /// this total (the capture queue's drops are not among them: those events reached the
    /// model, only the capture file misses them).
    pub fn dropped_total(&self) -> u64 {
        self.writer_dropped
            .saturating_add(self.restart_lost)
            .saturating_add(self.dropped_recovered)
            .saturating_add(self.dropped_in_ring)
            .saturating_add(self.ebpf_lost)
    }
}

/// The sizes of the `Dropped` records in a drained batch (the readers' own markers and any
/// the ring itself held).
pub fn dropped_marked(events: &[vramhook_protocol::record::Event]) -> u64 {
    use vramhook_protocol::record::EventKind;
    events.iter().filter(|e| e.kind() == Some(EventKind::Dropped)).map(|e| e.size).fold(0, u64::saturating_add)
}

/// Of the `Dropped` records a poll handed on (`marked`), those that were in the ring itself:
/// the reader's own markers are exactly the poll's writer drops and skipped slots.
pub fn dropped_in_ring(marked: u64, summary: &vramhook_ring::source::PollSummary) -> u64 {
    marked.saturating_sub(summary.dropped.saturating_add(summary.skipped))
}

/// Adds `n` to a counter, saturating: what a hostile ring claims can never wrap a total.
pub fn add(c: &AtomicU64, n: u64) {
    if n != 0 {
        let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_add(n)));
    }
}

impl AgentStats {
    pub fn view(&self) -> StatsView {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsView {
            events_ingested: g(&self.events_ingested),
            rings_open: g(&self.rings_open),
            rings_opened: g(&self.rings_opened),
            rings_closed: g(&self.rings_closed),
            rings_refused: g(&self.rings_refused),
            rings_hostile: g(&self.rings_hostile),
            records_malformed: g(&self.records_malformed),
            events_refused: g(&self.events_refused),
            writer_dropped: g(&self.writer_dropped),
            restart_lost: g(&self.restart_lost),
            duplicates_skipped: g(&self.duplicates_skipped),
            dropped_recovered: g(&self.dropped_recovered),
            dropped_in_ring: g(&self.dropped_in_ring),
            events_recovered: g(&self.events_recovered),
            capture_dropped_batches: g(&self.capture_dropped_batches),
            capture_dropped_events: g(&self.capture_dropped_events),
            capture_errors: g(&self.capture_errors),
            capture_bytes: g(&self.capture_bytes),
            capture_files: g(&self.capture_files),
            checkpoints: g(&self.checkpoints),
            otlp_incidents_dropped: g(&self.otlp_incidents_dropped),
            otlp_metric_exports: g(&self.otlp_metric_exports),
            otlp_metric_errors: g(&self.otlp_metric_errors),
            otlp_span_exports: g(&self.otlp_span_exports),
            otlp_span_errors: g(&self.otlp_span_errors),
            otlp_log_exports: g(&self.otlp_log_exports),
            otlp_log_errors: g(&self.otlp_log_errors),
            otlp_skipped_backoff: g(&self.otlp_skipped_backoff),
            incidents_exported: g(&self.incidents_exported),
            fit_crossings_exported: g(&self.fit_crossings_exported),
            snapshots: g(&self.snapshots),
            http_requests: g(&self.http_requests),
            rings_gc_removed: g(&self.rings_gc_removed),
            rings_gc_removed_bytes: g(&self.rings_gc_removed_bytes),
            ebpf_events: g(&self.ebpf_events),
            ebpf_ring_won: g(&self.ebpf_ring_won),
            ebpf_lost: g(&self.ebpf_lost),
            ebpf_malformed: g(&self.ebpf_malformed),
            ebpf_links: g(&self.ebpf_links),
            ebpf_processes: g(&self.ebpf_processes),
            ooms: self
                .ooms
                .lock()
                .map(|t| {
                    t.iter()
                        .map(|((device, verdict), count)| OomTally {
                            device: *device,
                            verdict: verdict.to_string(),
                            count: *count,
                        })
                        .collect()
                })
                .unwrap_or_default(),
            rings_too_large: rings_too_large(),
            recorded_by_run: self.recorded_by_run.lock().map(|v| v.clone()).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two rings each claiming 2^64-1 drops once wrapped the total to 1.8e19.
    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let stats = AgentStats::default();
        add(&stats.writer_dropped, u64::MAX - 1);
        add(&stats.writer_dropped, u64::MAX - 1);
        assert_eq!(stats.view().writer_dropped, u64::MAX);
    }
}
