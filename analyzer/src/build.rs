//! The report builder: turns the replay's final state into a [`Report`], in one place.
//! The replay (`crate::replay`) only follows the events; the renderers (`crate::render`)
//! only read the finished report.

use crate::input::pickle;
use crate::replay::Replayer;
use crate::report::*;
use crate::series;
use crate::SCHEMA_VERSION;
use vramhook_model::{fmt_bytes, ModelSnapshot, ProcessView};

pub fn verdict_name(v: vramhook_model::Verdict) -> &'static str {
    v.name()
}

/// The report's time window, absolute ns.
struct Window {
    first: u64,
    from: u64,
    to: u64,
}

/// Builds the report from the replay's final state.
pub fn finish(mut r: Replayer) -> Report {
    // One last sample at the end of the window.
    let end_ts = r.last_ts;
    r.sample(end_ts);
    if r.opts.at_ns.is_some() && r.layout.as_ref().is_none_or(|l| l.reason != LayoutReason::At) {
        r.capture_layout(end_ts, LayoutReason::At);
        r.notes.push("--at is after the last event: the layout shows the state at the end".into());
    }
    r.folded.ooms_unjudged = r.model.incidents_unjudged();
    let snap = r.model.snapshot();
    let fits = r.fit_timelines();
    let fit_warnings = r.fit_finish();
    let fit_trend_warnings = r.fit_trend_finish();
    let first = if r.min_ts == u64::MAX { r.first_ts.unwrap_or(0) } else { r.min_ts };
    let w = Window { first, from: r.from_abs, to: r.to_abs.min(r.last_ts.max(first)) };
    let mut timelines = Timelines::default();
    let (processes, leaks) = process_reports(&r, &snap, &w, &mut timelines);
    let top_holders = top_holders(&processes);
    let ooms = oom_reports(&r, &snap, &w);
    let (devices, dev_tl) = r.device_reports();
    timelines.devices = dev_tl;
    timelines.frameworks = r.framework_timelines(|pid| {
        let p = snap.processes.iter().rev().find(|p| p.pid == pid);
        p.map_or_else(String::new, |p| if p.command.is_empty() { p.exe.clone() } else { p.command.clone() })
    });
    timelines.fits = fits;
    let notes = notes(&mut r, &processes);
    let layout = r.layout.take().map(|mut l| {
        l.entries.retain(|e| r.pid_selected(e.pid));
        for a in &mut l.arenas {
            a.pid = r.view_pid(a.pid);
        }
        l
    });
    Report {
        schema_version: SCHEMA_VERSION,
        generator: format!("vramhook-analyzer {}", env!("CARGO_PKG_VERSION")),
        inputs: std::mem::take(&mut r.inputs),
        time: TimeRange {
            first_ts_ns: w.first,
            last_ts_ns: r.last_ts.max(w.first),
            from_ns: w.from.max(w.first),
            to_ns: w.to,
            wall_anchor: r.clock.map(|(mono_ns, wall_ns)| WallAnchor { mono_ns, wall_ns }),
        },
        events: r.applied,
        devices,
        processes,
        top_holders,
        ooms,
        fragmentation: name_reservation_devices(r.arena_reports()),
        leaks,
        timelines,
        layout,
        anomalies: snap.anomalies.clone(),
        notes,
        logs: Vec::new(),
        log_incidents: Vec::new(),
        folded: r.folded.clone(),
        fit_warnings,
        fit_trend_warnings,
    }
}

/// A VMM reservation's device is known from its first mapping on (cuMemAddressReserve
/// names none; the handles mapped into it do): samples taken before that are tracked under
/// device -1. They are the same arena's first points, and join it.
fn name_reservation_devices(arenas: Vec<ArenaReport>) -> Vec<ArenaReport> {
    use std::collections::HashMap;
    let named: HashMap<(u32, vramhook_model::ArenaKind, u64), usize> =
        arenas.iter().enumerate().filter(|(_, a)| a.device >= 0).map(|(k, a)| ((a.pid, a.kind, a.base), k)).collect();
    let mut out = arenas.clone();
    let mut merged = vec![false; arenas.len()];
    for (k, early) in arenas.iter().enumerate().filter(|(_, a)| a.device < 0) {
        let Some(&into) = named.get(&(early.pid, early.kind, early.base)) else { continue };
        let a = &mut out[into];
        a.size = a.size.max(early.size);
        a.max_fragmentation = a.max_fragmentation.max(early.max_fragmentation);
        a.min_largest_free_span = a.min_largest_free_span.min(early.min_largest_free_span);
        for (series, before) in [
            (&mut a.fragmentation, &early.fragmentation),
            (&mut a.largest_free_span, &early.largest_free_span),
            (&mut a.free_in_arena, &early.free_in_arena),
        ] {
            series.extend_from_slice(before);
            series.sort_by_key(|p| p.t_ns);
        }
        merged[k] = true;
    }
    out.into_iter().zip(merged).filter(|(_, m)| !m).map(|(a, _)| a).collect()
}

/// A row per selected process that did anything, its timeline, and its leak if it has one.
fn process_reports(
    r: &Replayer,
    snap: &ModelSnapshot,
    w: &Window,
    timelines: &mut Timelines,
) -> (Vec<ProcessReport>, Vec<LeakReport>) {
    let mut processes = Vec::new();
    let mut leaks = Vec::new();
    for (slot, view) in snap.processes.iter().enumerate() {
        if !r.pid_selected(view.pid) {
            continue;
        }
        if r.view_pid(view.pid) != view.pid {
            // A snapshot joined to a capture's process: its numbers are that process's.
            continue;
        }
        let exit = r.exits.get(&slot);
        let at_end = exit.map_or(view, |e| &e.view);
        // A process that never did anything is not worth a line.
        if view.allocations == 0 && view.failed_calls == 0 && at_end.live_bytes == 0 && view.command.is_empty() {
            continue;
        }
        let (device, devices) = r.proc_main_device(slot);
        let (ring_dropped, lost) = r.ends.get(&slot).copied().unwrap_or((0, 0));
        // Every loss is in the stream as a `Dropped` marker (the model's count: writer drops,
        // slots lost in flight, slots an agent restart skipped), and the process-end frame
        // counts the same losses again as writer drops + lost in flight. Adding the two
        // counted restart losses twice: the total is whichever says more (the markers, when
        // a rotated file holds the end of a process whose start is elsewhere; the end frame,
        // when a marker did not reach the capture), and lost in flight is part of it.
        let dropped = view.dropped_events.max(ring_dropped.saturating_add(lost));
        let lost = lost.min(dropped);
        let command = if view.command.is_empty() { view.exe.clone() } else { view.command.clone() };
        processes.push(ProcessReport {
            pid: view.pid,
            start_time: view.start_time,
            ppid: view.ppid,
            command: command.clone(),
            device,
            devices,
            peak_bytes: view.peak_bytes,
            peak_ts_ns: view.peak_ts_ns,
            final_live_bytes: at_end.live_bytes,
            final_live_allocations: at_end.live_allocations,
            final_streams: at_end.streams,
            streams_peak: at_end.streams_peak,
            final_stream_bytes: at_end.stream_bytes,
            exited: !view.alive,
            exit_status: view.exit_status,
            exit_ts_ns: view.exit_ts_ns,
            allocations: view.allocations,
            frees: view.frees,
            failed_calls: view.failed_calls,
            oom_count: view.oom_count,
            dropped_events: dropped,
            lost_in_flight: lost,
            incomplete: dropped > 0 || lost > 0,
            anomalies: view.anomalies,
            idle_bytes: at_end.idle_bytes,
            fragmentation: at_end.fragmentation,
            largest_free_span: at_end.largest_free_span,
            size_histogram: at_end.size_histogram.clone(),
            age_histogram: at_end.age_histogram.clone(),
        });
        if let Some(series) = r.proc_series(slot) {
            if r.track_pid(slot) == Some(view.pid) {
                timelines.processes.push(ProcessTimeline {
                    pid: view.pid,
                    command: command.clone(),
                    live_bytes: series.points_in(w.from, w.to.max(w.from)),
                });
            }
        }
        let largest = exit.map(|e| e.top.clone()).unwrap_or_default();
        leaks.extend(leak(view, at_end, exit.is_some(), largest, r.proc_series(slot), command));
    }
    (processes, leaks)
}

/// A leak: live at exit, or growing without bound.
fn leak(
    view: &ProcessView,
    at_end: &ProcessView,
    exited: bool,
    largest: Vec<vramhook_model::LayoutEntry>,
    series: Option<&series::Series>,
    command: String,
) -> Option<LeakReport> {
    if exited && at_end.live_bytes > 0 {
        Some(LeakReport {
            pid: view.pid,
            command,
            kind: LeakKind::LiveAtExit,
            bytes: at_end.live_bytes,
            allocations: at_end.live_allocations,
            growth_bytes_per_s: None,
            detail: format!(
                "{} in {} allocations never freed before the process exited (the driver reclaims them at exit; \
                 in a long-running process they would stay held)",
                fmt_bytes(at_end.live_bytes),
                at_end.live_allocations
            ),
            largest,
        })
    } else if let Some((rate, bytes)) = series.and_then(growing) {
        Some(LeakReport {
            pid: view.pid,
            command,
            kind: LeakKind::Growing,
            bytes,
            allocations: view.live_allocations,
            growth_bytes_per_s: Some(rate),
            detail: format!(
                "live bytes rose in every quarter of its life, to {} ({}/s): growing without bound",
                fmt_bytes(bytes),
                fmt_bytes(rate as u64)
            ),
            largest: Vec::new(),
        })
    } else {
        None
    }
}

/// The ten processes that held the most at their peak.
fn top_holders(processes: &[ProcessReport]) -> Vec<Holder> {
    let mut top: Vec<Holder> = processes
        .iter()
        .filter(|p| p.peak_bytes > 0)
        .map(|p| Holder {
            pid: p.pid,
            command: p.command.clone(),
            peak_bytes: p.peak_bytes,
            final_live_bytes: p.final_live_bytes,
        })
        .collect();
    top.sort_by_key(|h| std::cmp::Reverse(h.peak_bytes));
    top.truncate(10);
    top
}

/// The model's incidents of the selected processes inside the window.
fn oom_reports(r: &Replayer, snap: &ModelSnapshot, w: &Window) -> Vec<OomReport> {
    let command_of = |pid: u32| {
        let p = snap.processes.iter().rev().find(|p| p.pid == pid);
        p.map(|p| if p.command.is_empty() { p.exe.clone() } else { p.command.clone() })
    };
    let window = r.opts.model.incident_window_ns;
    let mut ooms: Vec<OomReport> = snap
        .incidents
        .iter()
        .filter(|i| r.pid_selected(i.pid) && i.ts_ns >= w.from && i.ts_ns <= r.to_abs)
        .map(|i| {
            // A copy of the model's incident, set to name the process it is reported as (a
            // joined snapshot's synthetic process is the capture's); the rest is the model's.
            let pid = r.view_pid(i.pid);
            let mut incident = i.clone();
            incident.pid = pid;
            if pid != i.pid {
                incident.command = command_of(pid).unwrap_or_else(|| i.command.clone());
            }
            incident.explanation = joined_explanation(r, i, command_of(pid));
            incident.lead_up.truncate(MAX_LEAD_UP);
            OomReport {
                incident,
                from_snapshot: r.snapshot_pids.get(&i.pid).map(|s| s.0.clone()),
                same_failure_as: same_failure(snap, i, pid, window),
                live_at_oom: live_at_oom(r, i, window),
            }
        })
        .collect();
    // A capture's incident gets the stacks of the snapshot's incident of the same failure.
    let copies: Vec<(u64, LiveAtOom)> =
        ooms.iter().filter_map(|o| Some((o.same_failure_as?, o.live_at_oom.clone()?))).collect();
    for (id, live) in copies {
        if let Some(c) = ooms.iter_mut().find(|c| c.incident.id == id && c.live_at_oom.is_none()) {
            c.live_at_oom = Some(live);
        }
    }
    ooms
}

/// For a snapshot's incident, the allocations live at its `oom` entry by stack: the entry of
/// that snapshot, device and request closest in time to the incident (within `window`).
fn live_at_oom(r: &Replayer, i: &vramhook_model::OomIncident, window: u64) -> Option<LiveAtOom> {
    r.snapshot_stacks
        .iter()
        .filter(|s| s.pid == i.pid && s.device == i.device && s.size == i.requested_bytes)
        .map(|s| (s.ts.abs_diff(i.ts_ns), s))
        .filter(|(d, _)| *d <= window)
        .min_by_key(|(d, _)| *d)
        .map(|(_, s)| s.live.clone())
}

/// The model's explanation; for a joined snapshot's incident, naming the capture's process
/// (and the snapshot) where it names the snapshot's synthetic process.
fn joined_explanation(r: &Replayer, i: &vramhook_model::OomIncident, command: Option<String>) -> String {
    let pid = r.view_pid(i.pid);
    match (r.snapshot_pids.get(&i.pid), command) {
        (Some((path, Some(_))), Some(command)) if pid != i.pid => i.explanation.replacen(
            &format!("process {} ({})", i.pid, i.command),
            &format!(
                "process {pid} ({command}, as its PyTorch snapshot {} shows it)",
                path.rsplit('/').next().unwrap_or(path)
            ),
            1,
        ),
        _ => i.explanation.clone(),
    }
}

/// For a joined snapshot's incident `i` (reported as `pid`'s), the capture's incident of the
/// same failure: that process, device and request, the closest in time within `window`.
fn same_failure(snap: &ModelSnapshot, i: &vramhook_model::OomIncident, pid: u32, window: u64) -> Option<u64> {
    if pid == i.pid {
        return None;
    }
    snap.incidents
        .iter()
        .filter(|c| c.pid == pid && c.device == i.device && c.requested_bytes == i.requested_bytes)
        .map(|c| (c.ts_ns.abs_diff(i.ts_ns), c.id))
        .filter(|(d, _)| *d <= window)
        .min()
        .map(|(_, id)| id)
}

/// The replay's notes, then what each input, the losses and the limits call for.
fn notes(r: &mut Replayer, processes: &[ProcessReport]) -> Vec<String> {
    let mut notes = std::mem::take(&mut r.notes);
    for i in &r.inputs {
        notes.extend(input_notes(i));
    }
    let dropped: u64 = processes.iter().map(|p| p.dropped_events).sum();
    if dropped > 0 {
        notes.push(format!("{dropped} events were lost (ring full or writer died): processes marked incomplete"));
    }
    if r.tracked_overflow() {
        notes.push("more than 512 processes: only the first have their own timeline".into());
    }
    if r.frameworks_untracked > 0 {
        notes.push(format!(
            "more than {} framework caches (process, device, framework): {} readings of the others have no timeline",
            r.frameworks.len(),
            r.frameworks_untracked
        ));
    }
    if r.stopped {
        notes.push("replay stopped at --to".into());
    }
    notes.extend(folded_notes(&r.folded));
    if r.exits_summarised > 0 {
        notes.push(format!(
            "{} exited after the work budget for full views at exit was spent: their size and age \
             histograms and largest allocations at exit are not listed",
            crate::render::count(r.exits_summarised, "process", "processes")
        ));
    }
    notes
}

/// What the reader met in one input: a cut, corrupt or unknown frames, an error.
fn input_notes(i: &InputReport) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(n) = i.truncated_at {
        notes.push(format!("{}: truncated at byte {n}; everything before the cut was analysed", i.path));
    }
    for c in &i.corrupt_frames {
        notes.push(format!(
            "{}: corrupt frame at byte {} ({}), {}",
            i.path,
            c.offset,
            c.reason,
            match c.skipped_bytes {
                Some(s) => format!("skipped {s} bytes to the next frame"),
                None => "no frame after it".to_string(),
            }
        ));
    }
    if i.corrupt_frames_unlisted > 0 {
        notes.push(format!("{}: {} more corrupt frames skipped", i.path, i.corrupt_frames_unlisted));
    }
    if i.unknown_frames > 0 {
        notes.push(format!("{}: {} frames of an unknown (newer) type skipped", i.path, i.unknown_frames));
    }
    if let Some(e) = &i.error {
        notes.push(format!("{}: {e}", i.path));
    }
    notes
}

/// Plain statements of what was past the per-category limit.
fn folded_notes(f: &Folded) -> Vec<String> {
    let limit = f.max_items;
    // Each kind of folded item with its note; only the kinds with any get theirs.
    let notes = [
        (
            f.processes,
            format!(
                "{} past the limit of {limit} (--max-items) were counted, not replayed: {} events, {} allocated",
                crate::render::count(f.processes, "more process", "more processes"),
                f.process_events,
                fmt_bytes(f.process_bytes)
            ),
        ),
        (
            f.devices,
            format!(
                "{} more device numbers past the limit of {limit} (--max-items) were counted, not replayed: {} events, {} allocated",
                f.devices,
                f.device_events,
                fmt_bytes(f.device_bytes)
            ),
        ),
        (
            f.ooms,
            format!(
                "{} more out-of-memory failures after {limit} incidents (--max-items) were counted, not analysed: {} requested",
                f.ooms,
                fmt_bytes(f.oom_bytes)
            ),
        ),
        (
            f.ooms_unjudged,
            format!(
                "{} not judged (verdict unknown): the work allowance for judging failures, which grows with the events \
                 read, was spent on earlier ones; analyze a shorter window (--from/--to) to judge them",
                crate::render::count(f.ooms_unjudged, "out-of-memory failure was", "out-of-memory failures were")
            ),
        ),
        (
            f.segments,
            format!(
                "{} more PyTorch segments past the limit of {limit} (--max-items) were counted, not imported: {}",
                f.segments,
                fmt_bytes(f.segment_bytes)
            ),
        ),
        (
            f.pickle_values,
            format!(
                "{} pickle values past the reader's budget of {} were counted, not kept",
                f.pickle_values,
                pickle::MAX_KEPT
            ),
        ),
    ];
    notes.into_iter().filter(|(n, _)| *n > 0).map(|(_, note)| note).collect()
}

/// Growing without bound: each quarter of the series starts higher than the previous one
/// ended at its lowest, and the last quarter's minimum exceeds the first quarter's maximum.
/// Returns (bytes per second, latest bytes).
fn growing(s: &series::Series) -> Option<(f64, u64)> {
    let pts = s.points();
    if pts.len() < 8 {
        return None;
    }
    let q = pts.len() / 4;
    let quarter = |i: usize| &pts[i * q..if i == 3 { pts.len() } else { (i + 1) * q }];
    let mins: Vec<f64> = (0..4).map(|i| quarter(i).iter().map(|p| p.min).fold(f64::MAX, f64::min)).collect();
    let first_max = quarter(0).iter().map(|p| p.max).fold(0.0, f64::max);
    if !(mins.windows(2).all(|w| w[1] > w[0]) && mins[3] > first_max) {
        return None;
    }
    let (a, b) = (pts[0], pts[pts.len() - 1]);
    let dt = (b.t_ns.saturating_sub(a.t_ns)) as f64 / 1e9;
    let rate = if dt > 0.0 { (b.last - a.last) / dt } else { 0.0 };
    Some((rate.max(0.0), b.last as u64))
}
