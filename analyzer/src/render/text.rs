//! The text report: what an operator reads first.

use crate::report::*;
use std::fmt::Write;
use vramhook_model::{display_command, fmt_bytes};

/// Seconds since the first event, "+1.234567s".
pub fn rel(report: &Report, ts: u64) -> String {
    let d = ts.saturating_sub(report.time.first_ts_ns);
    format!("+{}.{:06}s", d / 1_000_000_000, (d % 1_000_000_000) / 1000)
}

/// "2026-11-29 03:04:05 UTC" from Unix ns.
pub fn utc(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem / 60 % 60, rem % 60)
}

fn opt_bytes(v: Option<u64>) -> String {
    v.map_or_else(|| "?".to_string(), fmt_bytes)
}

fn short(s: &str, n: usize) -> String {
    let s = &super::tidy_paths(&display_command(s));
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

pub fn hist_line(h: &vramhook_model::Histogram, label: impl Fn(u64) -> String) -> String {
    let mut parts = Vec::new();
    for (i, c) in h.counts.iter().enumerate() {
        if *c == 0 {
            continue;
        }
        let name = match h.bounds.get(i) {
            Some(b) => format!("≤{}", label(*b)),
            None => format!(">{}", h.bounds.last().map_or_else(String::new, |b| label(*b))),
        };
        parts.push(format!("{name}: {c}"));
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// What an empty list of leaks says: a process whose exit is not in the input may still
/// free what it holds, so "freed before exit" is said only when every process's exit is.
pub fn no_leak_line(r: &Report) -> String {
    let running: Vec<&ProcessReport> = r.processes.iter().filter(|p| !p.exited).collect();
    if r.processes.is_empty() && r.folded.processes == 0 {
        return "no process in the input: nothing to judge".into();
    }
    if running.is_empty() && r.folded.processes == 0 {
        return "none: every process freed everything before exit and nothing grew without bound".into();
    }
    let mut parts = Vec::new();
    if !running.is_empty() {
        let pids: Vec<String> = running.iter().take(5).map(|p| p.pid.to_string()).collect();
        let more = if running.len() > 5 { format!(" and {} more", running.len() - 5) } else { String::new() };
        let (n, whose) = (running.len(), if running.len() == 1 { "its" } else { "their" });
        parts.push(format!(
            "{n} running at end of capture (pid {}{more}): {whose} allocations may be freed later",
            pids.join(", ")
        ));
    }
    if r.folded.processes > 0 {
        parts.push(format!("{} processes past --max-items not judged", r.folded.processes));
    }
    format!("no leak found among the processes whose exit is in the input; {}", parts.join("; "))
}

/// Time since the first event as people say it: "+2 h 14 m", "+3 m 05 s", "+25.02 s".
pub fn rel_short(report: &Report, ts: u64) -> String {
    format!("+{}", span(ts.saturating_sub(report.time.first_ts_ns)))
}

fn span(d: u64) -> String {
    let s = d / 1_000_000_000;
    if s >= 3600 {
        format!("{} h {:02} m", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{} m {:02} s", s / 60, s % 60)
    } else {
        format!("{:.2} s", d as f64 / 1e9)
    }
}

/// "pid 42 (server) GPU 0: from +2 h 14 m on,": who, where, and since when.
fn from_on(r: &Report, pid: u32, command: &str, device: i16, ts: u64) -> String {
    format!("pid {pid} ({}) GPU {device}: from {} on,", short(command, 40), rel_short(r, ts))
}

/// "pid 42 (server) GPU 0: from +2 h 14 m on, a 2.00 GiB request would not have fit (1.20 GiB
/// to be had: its cache is fragmented; demand from driver); it came at +3 h 02 m, 48 m 00 s
/// later." Where a smaller request failed first: "…; a 980.00 MiB request failed first, at …"
pub fn fit_line(r: &Report, w: &FitWarning) -> String {
    let head = format!(
        "{} a {} request would not have fit ({} to be had{}; demand from {})",
        from_on(r, w.pid, &w.command, w.device, w.since_ts_ns),
        fmt_bytes(w.demand_bytes),
        fmt_bytes(w.supply_bytes),
        match w.limited_by.as_deref() {
            Some("framework_fragmentation") => ": its cache is fragmented",
            Some("framework_limit") => ": its framework's limit",
            Some("other_processes") => ": other processes hold the rest",
            Some("capacity") => ": capacity",
            _ => "",
        },
        w.demand_source
    );
    let Some(c) = w.came_ts_ns else { return format!("{head}; none came before the end.") };
    let when = format!("{}, {} later.", rel_short(r, c), span(c.saturating_sub(w.since_ts_ns)));
    match w.came_bytes {
        Some(b) if b < w.demand_bytes => format!("{head}; a {} request failed first, at {when}", fmt_bytes(b)),
        _ => format!("{head}; it came at {when}"),
    }
}

pub fn dur(ns: u64) -> String {
    if ns >= 3_600_000_000_000 {
        format!("{}h", ns / 3_600_000_000_000)
    } else if ns >= 60_000_000_000 {
        format!("{}min", ns / 60_000_000_000)
    } else if ns >= 1_000_000_000 {
        format!("{}s", ns / 1_000_000_000)
    } else if ns >= 1_000_000 {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}µs", ns / 1000)
    }
}

pub fn render(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "vramhook analyze — post-mortem");
    let _ = writeln!(o, "==============================");
    // The report's sections, in the order they are read.
    let sections: [fn(&mut String, &Report); 14] = [
        inputs,
        notes,
        devices,
        processes,
        top_holders,
        fit_warnings,
        ooms,
        crate::logs::render_text,
        leaks,
        fragmentation,
        framework_caches,
        histograms,
        layout,
        anomalies,
    ];
    for section in sections {
        section(&mut o, r);
    }
    o
}

fn inputs(o: &mut String, r: &Report) {
    for i in &r.inputs {
        // A cut is said once, by its note ("truncated at byte N; ..."); the status says it is one.
        let _ = write!(o, "input  {} ({}): {}", i.path, i.kind, i.status);
        let _ = writeln!(o, ", {} events in {} frames, {} bytes read", i.events, i.frames, i.bytes_read);
        match (&i.host, i.wall_start_ns) {
            (Some(h), Some(w)) => {
                let _ = writeln!(o, "       host {h:?}, first event at {}", utc(w));
            }
            (Some(h), None) => {
                let _ = writeln!(o, "       host {h:?}");
            }
            (None, Some(w)) => {
                let _ = writeln!(o, "       first event at {}", utc(w));
            }
            (None, None) => {}
        }
        if let Some(e) = &i.error {
            let _ = writeln!(o, "       error: {e}");
        }
        if let Some(p) = &i.pytorch {
            let _ = writeln!(
                o,
                "       PyTorch snapshot: {} segments, {} blocks, {} trace entries; reserved {}, allocated {}, reserved but unallocated {}",
                p.segments,
                p.blocks,
                p.trace_entries,
                fmt_bytes(p.reserved_bytes),
                fmt_bytes(p.allocated_bytes),
                fmt_bytes(p.reserved_unallocated_bytes)
            );
            if let Some(j) = &p.join {
                let _ = writeln!(o, "       {}", join_line(j));
            }
        }
    }
    let _ = writeln!(
        o,
        "events {} over {} (times below are since the first event)",
        r.events,
        rel(r, r.time.last_ts_ns).trim_start_matches('+')
    );
}

fn notes(o: &mut String, r: &Report) {
    if !r.notes.is_empty() {
        let _ = writeln!(o, "\nNOTES");
        for n in &r.notes {
            let _ = writeln!(o, "  ! {n}");
        }
    }
}

fn devices(o: &mut String, r: &Report) {
    let _ = writeln!(o, "\nDEVICES");
    if r.devices.is_empty() {
        let _ = writeln!(o, "  (no device seen)");
    }
    for d in &r.devices {
        let _ = writeln!(
            o,
            "  device {:>2}: total {}, free {} (lowest {}), traced live peak {}",
            d.device,
            opt_bytes(d.total_bytes),
            opt_bytes(d.free_bytes),
            opt_bytes(d.min_free_bytes),
            fmt_bytes(d.peak_live_bytes)
        );
    }
}

fn processes(o: &mut String, r: &Report) {
    let _ = writeln!(o, "\nPROCESSES");
    let _ = writeln!(
        o,
        "  {:>7} {:<28} {:>3} {:>11} {:>11} {:>7} {:>7} {:>6} {:>7}  exit",
        "pid", "command", "dev", "peak", "final live", "allocs", "frees", "failed", "dropped"
    );
    for p in &r.processes {
        let exit = match (p.exited, p.exit_status) {
            (true, Some(s)) => format!("status {s}"),
            (true, None) => "exited".into(),
            (false, _) => "running at end".into(),
        };
        let _ = writeln!(
            o,
            "  {:>7} {:<28} {:>3} {:>11} {:>11} {:>7} {:>7} {:>6} {:>7}  {}{}",
            p.pid,
            short(&p.command, 28),
            p.device,
            fmt_bytes(p.peak_bytes),
            fmt_bytes(p.final_live_bytes),
            p.allocations,
            p.frees,
            p.failed_calls,
            p.dropped_events,
            exit,
            if p.incomplete { " (INCOMPLETE: events lost)" } else { "" }
        );
        if p.streams_peak > 0 {
            let _ = writeln!(
                o,
                "  {:>7} {} streams at exit/end, {} at most: about {} of driver memory that no memory call shows",
                "",
                p.final_streams,
                p.streams_peak,
                fmt_bytes(p.final_stream_bytes)
            );
        }
    }
}

fn top_holders(o: &mut String, r: &Report) {
    if !r.top_holders.is_empty() {
        let _ = writeln!(o, "\nTOP HOLDERS (by peak)");
        for (i, h) in r.top_holders.iter().enumerate() {
            let _ = writeln!(
                o,
                "  {}. pid {} {}: peak {}, {} at exit/end",
                i + 1,
                h.pid,
                short(&h.command, 40),
                fmt_bytes(h.peak_bytes),
                fmt_bytes(h.final_live_bytes)
            );
        }
    }
}

fn fit_warnings(o: &mut String, r: &Report) {
    if !r.fit_warnings.is_empty() {
        let _ = writeln!(o, "\nNEXT LARGE REQUEST (fit below 1)");
        for w in &r.fit_warnings {
            let _ = writeln!(o, "  {}", fit_line(r, w));
        }
    }
    if !r.fit_trend_warnings.is_empty() {
        let _ = writeln!(o, "\nNEXT LARGE REQUEST, FORECAST (the supply's trend)");
        for w in &r.fit_trend_warnings {
            let _ = writeln!(o, "  {}", fit_trend_line(r, w));
        }
    }
}

/// "pid 42 (server) GPU 0: from +1 m 40 s on, at its trend (3.90 GiB to be had, falling
/// 12.30 MiB/s) a 1.95 GiB request would not fit within 5 m 00 s (demand from driver); it
/// came at +2 m 42 s, 1 m 02 s later."
pub fn fit_trend_line(r: &Report, w: &FitTrendWarning) -> String {
    let rate = w.slope_bytes_per_s;
    let head = format!(
        "{} at its trend ({} to be had, {} {}/s) a {} request would not fit within {} (demand from {})",
        from_on(r, w.pid, &w.command, w.device, w.fired_ts_ns),
        fmt_bytes(w.supply_bytes),
        if rate < 0.0 { "falling" } else { "rising" },
        fmt_bytes(rate.abs() as u64),
        fmt_bytes(w.demand_bytes),
        span(w.horizon_ns),
        w.demand_source
    );
    let later = |t: u64| format!("{}, {} later", rel_short(r, t), span(t.saturating_sub(w.fired_ts_ns)));
    match (w.came_ts_ns, w.came_bytes, w.cleared_ts_ns) {
        (Some(c), Some(b), _) if b < w.demand_bytes => {
            format!("{head}; a {} request failed first, at {}.", fmt_bytes(b), later(c))
        }
        (Some(c), _, _) => format!("{head}; it came at {}.", later(c)),
        (None, _, Some(c)) => format!("{head}; the forecast cleared at {}, with no failure before.", later(c)),
        (None, _, None) => format!("{head}; none came before the end."),
    }
}

fn ooms(o: &mut String, r: &Report) {
    let _ = writeln!(o, "\nOOM INCIDENTS ({})", r.ooms.len());
    if r.ooms.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for (n, i) in r.ooms.iter().enumerate() {
        oom_incident(o, r, n, i);
    }
}

fn leaks(o: &mut String, r: &Report) {
    let _ = writeln!(o, "\nLEAKS ({})", r.leaks.len());
    if r.leaks.is_empty() {
        let _ = writeln!(o, "  {}", no_leak_line(r));
    }
    for l in &r.leaks {
        let _ = writeln!(o, "  pid {} {} [{}]: {}", l.pid, short(&l.command, 40), l.kind, l.detail);
        for e in l.largest.iter().take(5) {
            let _ = writeln!(
                o,
                "     {:>11} at {:#x} ({}) allocated {}",
                fmt_bytes(e.size),
                e.addr,
                e.class.name(),
                rel(r, e.ts_ns)
            );
        }
    }
}

fn fragmentation(o: &mut String, r: &Report) {
    let _ = writeln!(o, "\nFRAGMENTATION ({} arenas)", r.fragmentation.len());
    if r.fragmentation.is_empty() {
        let _ = writeln!(
            o,
            "  no arenas (VMM reservations, pools, framework segments); gaps between plain allocations are virtual, not free VRAM"
        );
    }
    let groups = fragmentation_groups(r);
    for g in groups.iter().take(20) {
        let _ = writeln!(o, "  {}", fragmentation_line(g));
    }
    let segments = r.fragmentation.iter().any(|a| a.kind == vramhook_model::ArenaKind::FrameworkSegment);
    if segments && !r.timelines.frameworks.is_empty() {
        let _ = writeln!(
            o,
            "  (a segment's fragmentation is 1 − its largest free block / its free bytes; a cache's, under FRAMEWORK \
             CACHES, is over all its segments together: segments with one free block each read 0.00 while the \
             cache's free bytes, split over them, can read near 1)"
        );
    }
    if groups.len() > 20 {
        let rest: usize = groups[20..].iter().map(|g| g.len()).sum();
        let _ = writeln!(o, "  … {} more in --json", super::count(rest as u64, "arena", "arenas"));
    }
}

fn framework_caches(o: &mut String, r: &Report) {
    if !r.timelines.frameworks.is_empty() {
        let _ = writeln!(o, "\nFRAMEWORK CACHES ({}; timelines in --json and --html)", r.timelines.frameworks.len());
        for f in r.timelines.frameworks.iter().take(20) {
            let _ = writeln!(o, "  {}", framework_line(f));
        }
        if r.timelines.frameworks.len() > 20 {
            let _ = writeln!(o, "  … {} more in --json", r.timelines.frameworks.len() - 20);
        }
    }
}

fn histograms(o: &mut String, r: &Report) {
    let _ = writeln!(o, "\nHISTOGRAMS (allocations live at exit or end)");
    for p in &r.processes {
        let _ = writeln!(o, "  pid {} sizes: {}", p.pid, hist_line(&p.size_histogram, fmt_bytes));
        let _ = writeln!(o, "  pid {} ages:  {}", p.pid, hist_line(&p.age_histogram, dur));
    }
}

fn layout(o: &mut String, r: &Report) {
    if let Some(l) = &r.layout {
        let _ = writeln!(
            o,
            "\nLAYOUT at {} ({}): {} live allocations{}, {} arenas (see --html for the picture)",
            rel(r, l.ts_ns),
            l.reason,
            l.entries.len(),
            if l.entries_omitted > 0 { format!(" (+{} smallest omitted)", l.entries_omitted) } else { String::new() },
            l.arenas.len()
        );
    }
}

fn anomalies(o: &mut String, r: &Report) {
    let _ = writeln!(o, "\nANOMALIES");
    if r.anomalies.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for (k, v) in &r.anomalies {
        let _ = writeln!(o, "  {k}: {v}");
    }
    let lost: u64 = r.processes.iter().map(|p| p.dropped_events).sum();
    let _ = writeln!(o, "  dropped events: {lost}");
}

/// One OOM incident: what was asked, the verdict and its numbers, the outcome, who held the
/// memory and the lead-up.
fn oom_incident(o: &mut String, r: &Report, n: usize, oom: &OomReport) {
    let i = &oom.incident;
    let _ = writeln!(
        o,
        "  #{} at {} — pid {} ({}) on device {}: {} requested {}, device free {} of {}",
        n + 1,
        rel(r, i.ts_ns),
        i.pid,
        short(&i.command, 40),
        i.device,
        if i.caller.is_empty() { i.api.name().to_string() } else { format!("{} via {}", i.api, i.caller) },
        fmt_bytes(i.requested_bytes),
        opt_bytes(i.device_free_bytes),
        opt_bytes(i.device_total_bytes)
    );
    if let Some(line) = snapshot_origin(r, oom) {
        let _ = writeln!(o, "     {line}");
    }
    let _ = writeln!(o, "     verdict: {}", i.verdict.name());
    if !i.fix.is_empty() {
        let _ = writeln!(o, "     fix: {}", i.fix);
    }
    for (label, value) in super::oom_numbers(oom) {
        let _ = writeln!(o, "       {label:<18} {value}");
    }
    for (k, line) in i.explanation.lines().enumerate() {
        let _ = writeln!(o, "     {}{}", if k == 0 { "why: " } else { "" }, super::tidy_paths(line));
    }
    let _ = writeln!(
        o,
        "     outcome: {} after {}, {}; {} freed in between; idle: own {}, other processes {}",
        i.outcome.name(),
        super::count(i.failures, "failure", "failures"),
        super::count(i.retries, "retry", "retries"),
        fmt_bytes(i.freed_bytes_between),
        fmt_bytes(i.own_idle_bytes),
        fmt_bytes(i.other_idle_bytes)
    );
    for line in holders_lines(oom) {
        let _ = writeln!(o, "     {line}");
    }
    for line in live_at_oom_lines(r, oom) {
        let _ = writeln!(o, "     {line}");
    }
    if !i.lead_up.is_empty() {
        let _ = writeln!(o, "     lead-up (last {} events of the process):", i.lead_up.len());
        for e in &i.lead_up {
            let _ = writeln!(
                o,
                "       {} tid {:<6} {:<12} {:<22} {}{}",
                rel(r, e.ts_ns),
                e.tid,
                e.kind_name(),
                e.api_name(),
                super::event_words(e),
                if e.result != 0 {
                    format!("  -> {}", vramhook_protocol::record::result_name(e.result))
                } else {
                    String::new()
                }
            );
        }
    }
}

/// One framework cache in a line: its peak and last reserved and allocated bytes, its last
/// measured largest free block and fragmentation, and its OOMs.
pub fn framework_line(f: &FrameworkTimeline) -> String {
    let peak = |s: &[crate::series::Point]| s.iter().map(|p| p.max as u64).max().unwrap_or(0);
    let last = |s: &[crate::series::Point]| s.last().map(|p| p.last);
    let mut line = format!(
        "pid {} dev {} {} ({}, {} readings): reserved peak {}, last {}; allocated peak {}, last {}",
        f.pid,
        f.device,
        f.framework,
        f.source,
        f.samples,
        fmt_bytes(peak(&f.reserved_bytes)),
        opt_bytes(last(&f.reserved_bytes).map(|v| v as u64)),
        fmt_bytes(peak(&f.allocated_bytes)),
        opt_bytes(last(&f.allocated_bytes).map(|v| v as u64)),
    );
    match (last(&f.largest_free_block), f.fragmentation.last()) {
        (Some(b), Some(fr)) => {
            let max = f.fragmentation.iter().map(|p| p.max).fold(0.0, f64::max);
            let _ = write!(
                line,
                "; largest free block {} (last measured), fragmentation {:.2} (max {:.2})",
                fmt_bytes(b as u64),
                fr.last,
                max
            );
        }
        _ => line.push_str("; largest free block never measured"),
    }
    if !f.ooms.is_empty() {
        let _ = write!(line, "; {}", super::count(f.ooms.len() as u64, "framework OOM", "framework OOMs"));
    }
    line
}

/// What a snapshot's match with the captures came to, in a line.
pub fn join_line(j: &SnapshotJoin) -> String {
    match j.pid {
        Some(pid) if j.joined => format!("joined to pid {pid}: {}", j.reason),
        _ => format!("not joined to a capture's process: {}", j.reason),
    }
}

/// For an incident from a PyTorch snapshot: which snapshot, and the capture's incident of the
/// same failure when there is one.
pub fn snapshot_origin(r: &Report, i: &OomReport) -> Option<String> {
    let path = i.from_snapshot.as_ref()?;
    let mut line = format!("from the PyTorch snapshot {path}");
    if let Some(k) = i.same_failure_as.and_then(|id| r.oom_position(id)) {
        let c = &r.ooms[k].incident;
        let _ = write!(line, "; the same failure as #{} (judged from the driver alone: {})", k + 1, c.verdict.name());
    }
    Some(line)
}

/// Stacks listed per incident in the text and the page (the JSON has up to
/// [`MAX_LIVE_STACKS`]), and frames per stack.
const SHOWN_STACKS: usize = 5;
const SHOWN_FRAMES: usize = 6;

fn frame_line(f: &StackFrame) -> String {
    format!("{}:{} in {}", f.file, f.line, f.function)
}

/// The allocations live at the OOM by Python stack, and the failed request's stack, from a
/// PyTorch snapshot with memory history: the lines the text (and the page) give under the
/// incident. A snapshot's incident whose capture incident lists the same says so in a line.
pub fn live_at_oom_lines(r: &Report, i: &OomReport) -> Vec<String> {
    let Some(l) = &i.live_at_oom else { return Vec::new() };
    if i.from_snapshot.is_some() {
        let same = i.same_failure_as.and_then(|id| r.oom_position(id));
        if let Some(k) = same.filter(|k| r.ooms[*k].live_at_oom.is_some()) {
            return vec![format!("live allocations and stacks at this OOM: under #{} above", k + 1)];
        }
    }
    let name = l.snapshot.rsplit('/').next().unwrap_or(&l.snapshot);
    let mut out = vec![format!(
        "live at the OOM (PyTorch snapshot {name}, memory history): {} allocation(s), {}; by stack, most bytes first:",
        l.allocations,
        fmt_bytes(l.bytes)
    )];
    for s in l.stacks.iter().take(SHOWN_STACKS) {
        out.push(format!(
            "  {} in {} allocation(s) (largest {})",
            fmt_bytes(s.bytes),
            s.allocations,
            fmt_bytes(s.largest_bytes)
        ));
        for f in s.frames.iter().take(SHOWN_FRAMES) {
            out.push(format!("    {}", frame_line(f)));
        }
        if s.frames.len() > SHOWN_FRAMES {
            out.push(format!("    … {} outer frame(s) in --json", s.frames.len() - SHOWN_FRAMES));
        }
    }
    let more = l.stacks.len().saturating_sub(SHOWN_STACKS) as u64 + l.stacks_folded;
    if more > 0 {
        let bytes = l.stacks.iter().skip(SHOWN_STACKS).fold(l.stacks_folded_bytes, |a, s| a.saturating_add(s.bytes));
        out.push(format!("  {more} more stack(s), {}", fmt_bytes(bytes)));
    }
    if l.without_stack > 0 {
        out.push(format!(
            "  {} in {} allocation(s) without a stack (made before memory history was on)",
            fmt_bytes(l.without_stack_bytes),
            l.without_stack
        ));
    }
    if !l.request_frames.is_empty() {
        out.push(format!("the failed request of {} was made at:", fmt_bytes(i.incident.requested_bytes)));
        for f in l.request_frames.iter().take(SHOWN_FRAMES) {
            out.push(format!("    {}", frame_line(f)));
        }
    }
    out
}

/// The other processes holding memory on the failing device, one line each, most first.
pub(crate) fn holders_lines(oom: &OomReport) -> Vec<String> {
    let i = &oom.incident;
    if i.holders.is_empty() {
        return Vec::new();
    }
    let mut v = vec![format!(
        "other processes on GPU {} at the failure: {:>7} {:>11} {:>11} {:>11} {:>11} {:>11}  {}",
        i.device, "pid", "held", "releasable", "stranded", "not visible", "live", "command (how seen)"
    )];
    for h in &i.holders {
        let nvml = h.nvml_bytes.map(|b| format!(", NVML {}", fmt_bytes(b))).unwrap_or_default();
        v.push(format!(
            "  {:>44} {:>11} {:>11} {:>11} {:>11} {:>11}  {} ({}{nvml})",
            if h.pid == 0 { "-".to_string() } else { h.pid.to_string() },
            fmt_bytes(h.held_bytes),
            fmt_bytes(h.releasable_bytes),
            fmt_bytes(h.stranded_bytes),
            fmt_bytes(h.not_visible_bytes),
            fmt_bytes(h.live_bytes),
            if h.command.is_empty() { "?".to_string() } else { short(&h.command, 40) },
            h.sight.name()
        ));
    }
    v
}

/// The arenas whose lines would read the same but for their address (same process, device,
/// kind, size and fragmentation figures), together, in the report's order: one line each.
pub fn fragmentation_groups(r: &crate::Report) -> Vec<Vec<&crate::ArenaReport>> {
    let key = |a: &crate::ArenaReport| {
        (
            a.pid,
            a.device,
            super::arena_kind(a.kind),
            a.size,
            format!("{:.2}", a.fragmentation.last().map_or(0.0, |p| p.last)),
            format!("{:.2}", a.max_fragmentation),
            a.largest_free_span.last().map_or(0, |p| p.last as u64),
            a.min_largest_free_span,
        )
    };
    let mut groups: Vec<Vec<&crate::ArenaReport>> = Vec::new();
    let mut index: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    for a in &r.fragmentation {
        match index.get(&key(a)) {
            Some(&i) => groups[i].push(a),
            None => {
                index.insert(key(a), groups.len());
                groups.push(vec![a]);
            }
        }
    }
    groups
}

/// One line for a group of [`fragmentation_groups`]: the arena itself, or how many there are
/// and the figures each has.
pub fn fragmentation_line(g: &[&crate::ArenaReport]) -> String {
    let a = g[0];
    let last = a.fragmentation.last().map_or(0.0, |p| p.last);
    let span = a.largest_free_span.last().map_or(0, |p| p.last as u64);
    // -1: a reservation nothing was mapped into names no device.
    let device = if a.device < 0 { "?".to_string() } else { a.device.to_string() };
    let kind = super::arena_kind(a.kind);
    let figures = format!(
        "fragmentation {:.2} (max {:.2}), largest free span {} (min {})",
        last,
        a.max_fragmentation,
        fmt_bytes(span),
        fmt_bytes(a.min_largest_free_span)
    );
    // Fragmentation 0 with free bytes: the largest free span is all the free bytes.
    let why = |each: &str| {
        if format!("{last:.2}") == "0.00" && format!("{:.2}", a.max_fragmentation) == "0.00" && span > 0 {
            format!(": one free block{each}")
        } else {
            String::new()
        }
    };
    if g.len() == 1 {
        format!("pid {} dev {device} {kind} {:#x} size {}: {figures}{}", a.pid, a.base, fmt_bytes(a.size), why(""))
    } else {
        let plural = if kind.ends_with('s') { format!("{kind}es") } else { format!("{kind}s") };
        format!(
            "pid {} dev {device}: {} {plural} of {} ({:#x} … {:#x}), each {figures}{}",
            a.pid,
            g.len(),
            fmt_bytes(a.size),
            g.iter().map(|a| a.base).min().unwrap_or(0),
            g.iter().map(|a| a.base).max().unwrap_or(0),
            why(" each")
        )
    }
}
