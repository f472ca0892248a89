//! The recorder behind `run` and `demo`: feeds drained events to the capture file and the
//! model, and builds the end summary from the model's numbers.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use vramhook_model::{display_command, fmt_bytes, Model};
use vramhook_protocol::capture::{CaptureHeader, CaptureWriter, ProcessEnd};
use vramhook_protocol::record::{Api, EventKind};
use vramhook_ring::source::SourceItem;

#[derive(Default)]
struct Tally {
    /// Calls per driver API code (names are looked up for the report only).
    calls: BTreeMap<u16, u64>,
    ends: Vec<ProcessEnd>,
    start_time: u64,
    ppid: u32,
    command: String,
    /// What the process held just before it ended.
    at_exit: Option<AtExit>,
}

/// A process's numbers just before it ended (the model then releases its memory).
#[derive(Clone)]
struct AtExit {
    live_bytes: u64,
    live_allocations: u64,
    by_device: BTreeMap<i16, u64>,
    /// Live bytes plus the idle reserve of its stream-ordered pools.
    held_bytes: u64,
    streams: u64,
    streams_peak: u64,
    stream_bytes: u64,
}

impl AtExit {
    fn of(p: &vramhook_model::ProcessView) -> AtExit {
        AtExit {
            live_bytes: p.live_bytes,
            live_allocations: p.live_allocations,
            by_device: p.devices.iter().map(|d| (d.device, d.live_bytes)).collect(),
            held_bytes: p.held_bytes,
            streams: p.streams,
            streams_peak: p.streams_peak,
            stream_bytes: p.stream_bytes,
        }
    }
}

pub struct Recorder {
    model: Model,
    capture: Option<CaptureWriter<BufWriter<File>>>,
    capture_path: Option<PathBuf>,
    capture_error: Option<String>,
    capture_bytes: u64,
    tallies: BTreeMap<u32, Tally>,
    exit_statuses: BTreeMap<u32, i32>,
    events: u64,
}

#[derive(Serialize, Debug, Clone)]
pub struct RunReport {
    pub capture: Option<String>,
    /// Set when the capture could not be written completely (it is then truncated).
    pub capture_error: Option<String>,
    pub capture_bytes: u64,
    pub events: u64,
    pub dropped_events: u64,
    pub processes: Vec<ProcessReport>,
}

#[derive(Serialize, Debug, Clone)]
pub struct ProcessReport {
    pub pid: u32,
    pub ppid: u32,
    pub command: String,
    pub exit_status: Option<i32>,
    pub peak_bytes: u64,
    pub final_live_bytes: u64,
    /// What it held from the device at exit: live bytes plus the idle reserve of its
    /// stream-ordered pools (the driver's figure where sampled).
    pub final_held_bytes: u64,
    /// Streams it had made and not destroyed at exit, and the most it had at once.
    pub final_streams: u64,
    pub streams_peak: u64,
    /// The driver's device memory for its streams, which no memory call shows and which the
    /// driver keeps after a stream is destroyed (estimated: the most streams at once × the
    /// model's `stream_bytes`).
    pub final_stream_bytes: u64,
    /// Live bytes at exit per device ordinal (-1: device unknown).
    pub final_live_by_device: BTreeMap<i16, u64>,
    pub live_allocations: u64,
    pub calls: BTreeMap<String, u64>,
    pub failed_calls: u64,
    pub ooms: u64,
    pub dropped_events: u64,
    pub lost_in_flight: u64,
    pub hook_misses: u64,
    pub anomalies: u64,
}

impl Recorder {
    pub fn new(capture_path: Option<&Path>) -> Result<Recorder> {
        let capture = match capture_path {
            Some(path) => {
                let file = File::create(path).with_context(|| format!("cannot create capture {}", path.display()))?;
                Some(
                    CaptureWriter::new(BufWriter::with_capacity(1 << 20, file), &CaptureHeader::now())
                        .with_context(|| format!("cannot write capture {}", path.display()))?,
                )
            }
            None => None,
        };
        Ok(Recorder {
            model: Model::new(vramhook_agent::model_config()),
            capture,
            capture_path: capture_path.map(Path::to_path_buf),
            capture_error: None,
            capture_bytes: 0,
            tallies: BTreeMap::new(),
            exit_statuses: BTreeMap::new(),
            events: 0,
        })
    }

    /// Runs a capture write; on the first failure (a full disk, say) stops writing, keeps
    /// what was written, and remembers why. Tracing goes on.
    fn write(&mut self, f: impl FnOnce(&mut CaptureWriter<BufWriter<File>>) -> std::io::Result<()>) {
        if let Some(w) = self.capture.as_mut() {
            if let Err(e) = f(w) {
                eprintln!("vramhook: capture write failed ({e}); the capture ends here, tracing goes on");
                self.capture_bytes = w.bytes_written();
                self.capture_error = Some(e.to_string());
                self.capture = None;
            }
        }
    }

    pub fn handle(&mut self, item: SourceItem<'_>) {
        match item {
            SourceItem::Process(info) => {
                self.write(|w| w.write_process(info));
                self.model.process_info(info);
                let tally = self.tallies.entry(info.pid).or_default();
                tally.start_time = info.start_time;
                tally.ppid = info.ppid;
                tally.command =
                    display_command(&if info.cmdline.is_empty() { info.exe.clone() } else { info.cmdline.join(" ") });
                tally.at_exit = None; // a new image after exec
            }
            SourceItem::Events(events) => {
                self.write(|w| w.write_events(events));
                self.events += events.len() as u64;
                for e in events {
                    if e.kind() == Some(EventKind::ProcessExit) {
                        self.remember_live_at_exit(e.pid);
                    }
                    self.model.apply(e);
                    // Driver calls only: not our own records (pool samples included), nor a lens's.
                    let ours = e.api == Api::Interposer as u16 || e.api == Api::Lens as u16;
                    if ours
                        || matches!(
                            e.kind(),
                            Some(
                                EventKind::ProcessStart
                                    | EventKind::ProcessExit
                                    | EventKind::Dropped
                                    | EventKind::PoolSample
                            )
                        )
                    {
                        continue;
                    }
                    *self.tallies.entry(e.pid).or_default().calls.entry(e.api).or_default() += 1;
                }
            }
            SourceItem::End(end) => {
                self.write(|w| w.write_process_end(&end));
                if self.tallies.get(&end.pid).is_none_or(|t| t.at_exit.is_none()) {
                    self.remember_live_at_exit(end.pid);
                }
                self.model.process_exit(end.pid, end.start_time, end.exit_status, end.ts_ns);
                self.tallies.entry(end.pid).or_default().ends.push(end);
            }
        }
    }

    /// The model releases a process's memory when it ends; the summary's "final" is what
    /// it still held just before.
    fn remember_live_at_exit(&mut self, pid: u32) {
        let Some(tally) = self.tallies.get_mut(&pid) else { return };
        let snapshot = self.model.snapshot();
        if let Some(p) = snapshot.processes.iter().rev().find(|p| p.pid == pid && p.start_time == tally.start_time) {
            tally.at_exit = Some(AtExit::of(p));
        }
    }

    pub fn note_exit_status(&mut self, pid: u32, code: i32) {
        self.exit_statuses.insert(pid, code);
    }

    pub fn flush(&mut self) {
        self.write(|w| w.flush());
    }

    /// Seals the capture with its end frame.
    pub fn finish(&mut self) {
        if let Some(w) = self.capture.take() {
            self.capture_bytes = w.bytes_written();
            match w.finish() {
                Ok(_) => self.capture_bytes += 32,
                Err(e) => self.capture_error = Some(e.to_string()),
            }
        }
    }

    pub fn report(&self) -> RunReport {
        let snapshot = self.model.snapshot();
        let mut processes = Vec::new();
        let mut dropped_total = 0;
        for (pid, tally) in &self.tallies {
            let view = snapshot.processes.iter().rev().find(|p| p.pid == *pid && p.start_time == tally.start_time);
            let sum = |f: fn(&ProcessEnd) -> u64| tally.ends.iter().map(f).sum::<u64>();
            let dropped = sum(|e| e.dropped) + sum(|e| e.lost_in_flight);
            dropped_total += dropped;
            // At exit, or now for a process still running.
            let at_exit = tally.at_exit.clone().or_else(|| view.map(AtExit::of));
            processes.push(ProcessReport {
                pid: *pid,
                ppid: tally.ppid,
                command: tally.command.clone(),
                exit_status: self.exit_statuses.get(pid).copied(),
                peak_bytes: view.map_or(0, |v| v.peak_bytes),
                final_live_bytes: at_exit.as_ref().map_or(0, |a| a.live_bytes),
                final_held_bytes: at_exit.as_ref().map_or(0, |a| a.held_bytes),
                final_streams: at_exit.as_ref().map_or(0, |a| a.streams),
                streams_peak: at_exit.as_ref().map_or(0, |a| a.streams_peak),
                final_stream_bytes: at_exit.as_ref().map_or(0, |a| a.stream_bytes),
                live_allocations: at_exit.as_ref().map_or(0, |a| a.live_allocations),
                final_live_by_device: at_exit.map(|a| a.by_device).unwrap_or_default(),
                calls: tally
                    .calls
                    .iter()
                    .map(|(code, n)| {
                        (Api::from_code(*code).map_or_else(|| format!("api#{code}"), |a| a.name().to_string()), *n)
                    })
                    .collect(),
                failed_calls: view.map_or(0, |v| v.failed_calls),
                ooms: view.map_or(0, |v| v.oom_count),
                dropped_events: dropped,
                lost_in_flight: sum(|e| e.lost_in_flight),
                hook_misses: tally.ends.iter().map(|e| e.hook_misses).max().unwrap_or(0),
                anomalies: view.map_or(0, |v| v.anomalies),
            });
        }
        RunReport {
            capture: self.capture_path.as_ref().map(|p| p.display().to_string()),
            capture_error: self.capture_error.clone(),
            capture_bytes: self.capture_bytes,
            events: self.events,
            dropped_events: dropped_total,
            processes,
        }
    }
}

pub fn render_text(report: &RunReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nvramhook: {} process{} traced, {} events, {} dropped",
        report.processes.len(),
        if report.processes.len() == 1 { "" } else { "es" },
        report.events,
        report.dropped_events
    );
    if let Some(path) = &report.capture {
        match &report.capture_error {
            None => {
                let _ = writeln!(out, "capture: {path} ({})", fmt_bytes(report.capture_bytes));
            }
            Some(e) => {
                let _ = writeln!(out, "capture: {path} INCOMPLETE ({e}); it ends at byte {}", report.capture_bytes);
            }
        }
    }
    let _ = writeln!(
        out,
        "{:>8}  {:<28} {:>11} {:>11} {:>7} {:>6} {:>5} {:>7} {:>6}",
        "pid", "command", "peak", "final", "calls", "failed", "OOMs", "dropped", "exit"
    );
    for p in &report.processes {
        let mut command = p.command.clone();
        if command.chars().count() > 28 {
            command = command.chars().take(27).collect::<String>() + "…";
        }
        let calls: u64 = p.calls.values().sum();
        let exit = p.exit_status.map_or("-".to_string(), |c| c.to_string());
        let _ = writeln!(
            out,
            "{:>8}  {:<28} {:>11} {:>11} {:>7} {:>6} {:>5} {:>7} {:>6}",
            p.pid,
            command,
            fmt_bytes(p.peak_bytes),
            fmt_bytes(p.final_live_bytes),
            calls,
            p.failed_calls,
            p.ooms,
            p.dropped_events,
            exit
        );
        if p.final_held_bytes != p.final_live_bytes {
            let _ = writeln!(
                out,
                "{:>8}  held {} at the end: {} live plus its stream-ordered pools' idle reserve",
                "",
                fmt_bytes(p.final_held_bytes),
                fmt_bytes(p.final_live_bytes)
            );
        }
        if p.streams_peak > 0 {
            let _ = writeln!(
                out,
                "{:>8}  {} streams at the end, {} at most: about {} of driver memory no memory call shows",
                "",
                p.final_streams,
                p.streams_peak,
                fmt_bytes(p.final_stream_bytes)
            );
        }
        let by_api: Vec<String> = p.calls.iter().map(|(k, v)| format!("{k} {v}")).collect();
        if !by_api.is_empty() {
            let _ = writeln!(out, "{:>8}  calls: {}", "", by_api.join(" · "));
        }
        if p.dropped_events > 0 {
            let _ = writeln!(
                out,
                "{:>8}  WARNING: {} events lost ({} in flight when the process died): numbers for this process are incomplete",
                "", p.dropped_events, p.lost_in_flight
            );
        }
        if p.hook_misses > 0 {
            let _ = writeln!(out, "{:>8}  WARNING: {} driver entry points could not be wrapped", "", p.hook_misses);
        }
    }
    out
}
