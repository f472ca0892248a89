//! One self-contained HTML page: inline CSS, inline data, inline script that draws SVG plots.
//! Nothing is fetched from the network; the page opens from a file anywhere.

use crate::render::text::{rel, utc};
use crate::report::*;
use serde::Serialize;
use vramhook_model::{display_command, fmt_bytes};

/// Escapes text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

#[derive(Serialize)]
struct PlotData<'a> {
    t0: u64,
    t1: u64,
    timelines: &'a Timelines,
    ooms: Vec<(u64, u32, i16, &'a str)>,
    fragmentation: &'a [ArenaReport],
    layout: Option<PageLayout>,
    /// Shaded on the fit plots: from when a request would not have fit to when it came.
    fit_warnings: &'a [FitWarning],
    /// A capture or snapshot was read (else the plots say "no data in the input").
    captured: bool,
}

/// The layout as the page's script (`report.js`) reads it: of each of the model's entries and
/// arenas the keys it had in schema 6, in that order. The page stays the same whatever the
/// model adds to them; the JSON report carries them whole.
#[derive(Serialize)]
struct PageLayout {
    ts_ns: u64,
    reason: LayoutReason,
    entries: Vec<Fields>,
    entries_omitted: u64,
    arenas: Vec<Fields>,
}

const PAGE_ENTRY_KEYS: [&str; 7] = ["addr", "size", "class", "pid", "device", "ts_ns", "reservation"];
const PAGE_ARENA_KEYS: [&str; 9] =
    ["pid", "device", "kind", "base", "size", "occupied", "free_in_arena", "largest_free_span", "fragmentation"];

impl PageLayout {
    fn of(l: &LayoutReport) -> PageLayout {
        PageLayout {
            ts_ns: l.ts_ns,
            reason: l.reason,
            entries: l.entries.iter().map(|e| Fields::of(e, &PAGE_ENTRY_KEYS)).collect(),
            entries_omitted: l.entries_omitted,
            arenas: l.arenas.iter().map(|a| Fields::of(a, &PAGE_ARENA_KEYS)).collect(),
        }
    }
}

/// Some of a value's fields as JSON, in the order named (a `serde_json` map would sort them).
struct Fields(Vec<(&'static str, serde_json::Value)>);

impl Fields {
    fn of(value: &impl Serialize, keys: &[&'static str]) -> Fields {
        let mut all = match serde_json::to_value(value) {
            Ok(serde_json::Value::Object(all)) => all,
            _ => serde_json::Map::new(),
        };
        Fields(keys.iter().filter_map(|k| Some((*k, all.remove(*k)?))).collect())
    }
}

impl Serialize for Fields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

// The page's style and script, kept as plain files so that editors and linters see them.
const CSS: &str = include_str!("../../assets/report.css");

const JS: &str = include_str!("../../assets/report.js");

fn row(cells: &[String], numeric: &[bool]) -> String {
    let mut s = String::from("<tr>");
    for (i, c) in cells.iter().enumerate() {
        if numeric.get(i).copied().unwrap_or(false) {
            s.push_str(&format!("<td class=n>{}</td>", esc(c)));
        } else {
            s.push_str(&format!("<td>{}</td>", esc(c)));
        }
    }
    s.push_str("</tr>\n");
    s
}

/// One row per item: the cells `cells` gives it, right-aligned where `numeric` says.
fn rows<T>(items: &[T], numeric: &[bool], cells: impl Fn(&T) -> Vec<String>) -> String {
    items.iter().map(|item| row(&cells(item), numeric)).collect()
}

/// The page. Data is embedded as JSON (with `<` escaped so no input can close the script).
pub fn render(r: &Report) -> String {
    let json = plot_json(r);
    let mut h = String::new();
    head_html(&mut h, r);
    // Why first: the verdicts, then what limits them, then the plots that show how it came to that.
    ooms_html(&mut h, r);
    logs_html(&mut h, r);
    notes_html(&mut h, r);
    timelines_html(&mut h, r);
    fits_html(&mut h, r);
    fragmentation_html(&mut h, r);
    tables_html(&mut h, r);
    leaks_html(&mut h, r);
    anomalies_html(&mut h, r);
    h.push_str(&format!("<script type=\"application/json\" id=\"report-data\">{json}</script>\n"));
    h.push_str(&format!("<script>{JS}</script>\n</body></html>\n"));
    h
}

/// The data the plots draw, as JSON with `<` escaped.
fn plot_json(r: &Report) -> String {
    let data = PlotData {
        t0: r.time.from_ns.max(r.time.first_ts_ns),
        t1: r.time.to_ns.max(r.time.first_ts_ns),
        timelines: &r.timelines,
        ooms: r.ooms.iter().map(|o| &o.incident).map(|o| (o.ts_ns, o.pid, o.device, o.verdict.name())).collect(),
        fragmentation: &r.fragmentation,
        layout: r.layout.as_ref().map(PageLayout::of),
        fit_warnings: &r.fit_warnings,
        captured: r.inputs.iter().any(|i| i.kind != InputKind::Log),
    };
    // Paths folded as everywhere on the page (the plots' legends name the commands).
    super::tidy_paths(&serde_json::to_string(&data).unwrap_or_else(|_| "{}".into())).replace('<', "\\u003c")
}

/// The page head, the title and the line of inputs and totals.
fn head_html(h: &mut String, r: &Report) {
    h.push_str("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>vramhook post-mortem</title>\n");
    h.push_str("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n");
    h.push_str(&format!("<style>{CSS}</style></head><body>\n"));
    h.push_str("<h1>vramhook post-mortem</h1>\n<div class=sub>");
    for i in &r.inputs {
        h.push_str(&esc(&format!("{} ({}, {}", i.path, i.kind, i.status)));
        if let Some(w) = i.wall_start_ns {
            h.push_str(&esc(&format!(", started {}", utc(w))));
        }
        if let Some(j) = i.pytorch.as_ref().and_then(|p| p.join.as_ref()) {
            h.push_str(&format!(", <span class=snapshot-join>{}</span>", esc(&crate::render::text::join_line(j))));
        }
        h.push_str(") ");
    }
    for f in &r.logs {
        h.push_str(&esc(&format!("{} (log{}) ", f.path, if f.gzip { ", gzip" } else { "" })));
    }
    h.push_str(&format!(
        "<br>{} events over {} · {} · {}{} · {}</div>\n",
        r.events,
        rel(r, r.time.last_ts_ns).trim_start_matches('+'),
        super::count(r.processes.len() as u64, "process", "processes"),
        super::count(r.ooms.len() as u64, "OOM incident", "OOM incidents"),
        if r.logs.is_empty() { String::new() } else { format!(" · {} from logs", r.log_incidents.len()) },
        super::count(r.leaks.len() as u64, "leak", "leaks")
    ));
}

fn notes_html(h: &mut String, r: &Report) {
    if !r.notes.is_empty() {
        h.push_str("<h2>Notes</h2><ul>");
        for n in &r.notes {
            h.push_str(&format!("<li class=note>{}</li>", esc(n)));
        }
        h.push_str("</ul>\n");
    }
}

/// The live timelines, and the framework caches beside them where a lens or snapshot spoke.
fn timelines_html(h: &mut String, r: &Report) {
    h.push_str("<h2>Timelines</h2><div id=plot-live></div>\n");
    // The framework's cache next to the driver's view of the same bytes; no plot (and no
    // empty axis) where no lens or snapshot spoke.
    if r.timelines.frameworks.is_empty() {
        h.push_str(
            "<p class=note id=no-framework>No framework cache numbers: no lens records (<code>vramhook run</code> loads \
             the PyTorch lens) and no PyTorch snapshot in the input.</p>\n",
        );
    } else {
        h.push_str("<div id=plot-fw-bytes></div><div id=plot-fw-frag></div>\n<ul class=framework-caches>");
        for f in &r.timelines.frameworks {
            h.push_str(&format!("<li>{}</li>", esc(&crate::render::text::framework_line(f))));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("<div id=plot-free></div>\n");
}

/// The address layout and fragmentation plots.
fn fragmentation_html(h: &mut String, r: &Report) {
    h.push_str("<h2>Address layout</h2><div id=plot-layout></div>\n");
    h.push_str("<h2>Fragmentation</h2>");
    if r.fragmentation.iter().any(|a| a.kind == vramhook_model::ArenaKind::FrameworkSegment)
        && !r.timelines.frameworks.is_empty()
    {
        h.push_str(
            "<p class=note>Per arena, fragmentation is 1 − its largest free block / its free bytes: a framework \
             segment with one free block reads 0.00. A framework cache's fragmentation (under Framework caches) is \
             over all its segments together: free bytes split one block per segment over many segments read near \
             1 there while each segment reads 0.00 here.</p>",
        );
    }
    h.push_str("<div id=plot-frag></div><div id=plot-span></div>\n");
}

/// The processes, devices and allocations-live tables.
fn tables_html(h: &mut String, r: &Report) {
    h.push_str("<h2>Processes</h2><table><tr><th>pid<th>command<th>device<th>peak<th>final live<th>allocations<th>frees<th>failed calls<th>dropped events<th>exit</tr>\n");
    h.push_str(&rows(&r.processes, &[true, false, true, true, true, true, true, true, true, false], |p| {
        vec![
            p.pid.to_string(),
            super::tidy_paths(&display_command(&p.command)),
            p.device.to_string(),
            fmt_bytes(p.peak_bytes),
            fmt_bytes(p.final_live_bytes),
            p.allocations.to_string(),
            p.frees.to_string(),
            p.failed_calls.to_string(),
            p.dropped_events.to_string(),
            match (p.exited, p.exit_status) {
                (true, Some(s)) => format!("status {s}"),
                (true, None) => "exited".into(),
                _ => "running at end".into(),
            },
        ]
    }));
    h.push_str("</table>\n<h2>Devices</h2><table><tr><th>device<th>total<th>free (latest)<th>lowest free<th>traced live peak</tr>\n");
    let opt = |v: Option<u64>| v.map_or("?".to_string(), fmt_bytes);
    h.push_str(&rows(&r.devices, &[true, true, true, true, true], |d| {
        vec![
            d.device.to_string(),
            opt(d.total_bytes),
            opt(d.free_bytes),
            opt(d.min_free_bytes),
            fmt_bytes(d.peak_live_bytes),
        ]
    }));
    h.push_str("</table>\n<h2>Allocations live at exit</h2><table><tr><th>pid<th>sizes<th>ages</tr>\n");
    h.push_str(&rows(&r.processes, &[true, false, false], |p| {
        vec![
            p.pid.to_string(),
            crate::render::text::hist_line(&p.size_histogram, fmt_bytes),
            crate::render::text::hist_line(&p.age_histogram, crate::render::text::dur),
        ]
    }));
}

fn leaks_html(h: &mut String, r: &Report) {
    h.push_str("</table>\n<h2>Leaks</h2>\n");
    if r.leaks.is_empty() {
        h.push_str(&format!("<p>{}</p>\n", esc(&crate::render::text::no_leak_line(r))));
    } else {
        h.push_str("<table><tr><th>pid<th>command<th>kind<th>bytes<th>detail</tr>\n");
        h.push_str(&rows(&r.leaks, &[true, false, false, true, false], |l| {
            vec![
                l.pid.to_string(),
                super::tidy_paths(&display_command(&l.command)),
                l.kind.to_string(),
                fmt_bytes(l.bytes),
                l.detail.clone(),
            ]
        }));
        h.push_str("</table>\n");
    }
}

fn anomalies_html(h: &mut String, r: &Report) {
    if !r.anomalies.is_empty() {
        h.push_str("<h2>Anomalies</h2><ul>");
        for (k, v) in &r.anomalies {
            h.push_str(&format!("<li>{}: {v}</li>", esc(k)));
        }
        h.push_str("</ul>\n");
    }
}

/// Fit timelines plotted at most (those that went below 1 first); the JSON has them all.
const MAX_FIT_PLOTS: usize = 8;

/// The fit of each process's next large request: one plot per process and device (drawn by
/// the script from `timelines.fits`), each with its caption, the text report's sentence.
fn fits_html(h: &mut String, r: &Report) {
    let fits = &r.timelines.fits;
    if fits.is_empty() {
        return;
    }
    h.push_str(
        "<h3 id=fit>Fit of the next large request</h3>\n<p class=note>Supply / demand: what the process could get \
         now for a request as large as its largest in the fit window, over that request. Below the dashed line at \
         1, such a request would fail; triangles mark where it went below 1 (down) and back (up), and the shade the \
         run below 1 that the sentence under the plot is about, up to the failure it foresaw.</p>\n",
    );
    let mut order: Vec<usize> = (0..fits.len()).collect();
    order.sort_by_key(|&k| (fits[k].crossings.is_empty(), k));
    for &k in order.iter().take(MAX_FIT_PLOTS) {
        let f = &fits[k];
        h.push_str(&format!("<div id=plot-fit-{k} class=fit-plot></div><p class=fit-caption id=fit-caption-{k}>"));
        let warnings: Vec<&FitWarning> =
            r.fit_warnings.iter().filter(|w| w.pid == f.pid && w.device == f.device).collect();
        if warnings.is_empty() {
            h.push_str(&esc(&fit_quiet_line(r, f)));
        }
        for w in warnings {
            h.push_str(&esc(&crate::render::text::fit_line(r, w)));
            h.push(' ');
        }
        h.push_str("</p>\n");
        // The forecast (`--fit-trend`), where asked for: its sentences under the caption.
        let forecasts: Vec<String> = r
            .fit_trend_warnings
            .iter()
            .filter(|w| w.pid == f.pid && w.device == f.device)
            .map(|w| esc(&crate::render::text::fit_trend_line(r, w)))
            .collect();
        if !forecasts.is_empty() {
            h.push_str(&format!("<p class=note id=fit-forecast-{k}>Forecast: {}</p>\n", forecasts.join(" ")));
        }
    }
    if fits.len() > MAX_FIT_PLOTS {
        h.push_str(&format!(
            "<p class=note>{} more fit timelines in the JSON report (<code>--json</code>, timelines.fits).</p>\n",
            fits.len() - MAX_FIT_PLOTS
        ));
    }
}

/// The caption of a fit timeline with no run below 1 that a failure or the end closed.
fn fit_quiet_line(r: &Report, f: &FitTimeline) -> String {
    let who = format!("pid {} ({}) GPU {}", f.pid, super::tidy_paths(&display_command(&f.command)), f.device);
    let lowest = f.fit_ratio.iter().map(|p| p.min).fold(f64::INFINITY, f64::min);
    match f.crossings.iter().find(|c| c.below) {
        Some(c) => format!(
            "{who}: from {} on, a {} request would not have fit; the fit came back to 1 or more before one came \
             ({} below 1 in all).",
            crate::render::text::rel_short(r, c.ts_ns),
            fmt_bytes(c.demand_bytes),
            super::count(f.crossings.iter().filter(|c| c.below).count() as u64, "time", "times")
        ),
        None => format!("{who}: its largest recent request would have fit throughout (lowest fit {lowest:.2})."),
    }
}

/// The capture's OOM incidents, each with its verdict and explanation.
fn ooms_html(h: &mut String, r: &Report) {
    let captured = r.inputs.iter().any(|i| i.kind != InputKind::Log);
    h.push_str(&format!("<h2 id=ooms>OOM incidents ({})</h2>\n", r.ooms.len()));
    if r.ooms.is_empty() {
        h.push_str(if captured {
            "<p>None.</p>\n"
        } else {
            "<p>No capture or snapshot was given: the incidents below come from logs alone.</p>\n"
        });
    }
    for (n, oom) in r.ooms.iter().enumerate() {
        let o = &oom.incident;
        h.push_str(&format!(
            "<div class=oom id=oom-{}><b>#{} at {}</b> — pid {} <code>{}</code> on device {}: {} requested <b>{}</b>, device free {} of {}<br>\
             verdict: <span class=verdict>{}</span>{}{}<p class=why>{}</p>outcome: {} after {}, {}; {} freed in between\n",
            o.id,
            n + 1,
            rel(r, o.ts_ns),
            o.pid,
            esc(&super::tidy_paths(&display_command(&o.command))),
            o.device,
            esc(o.api.name()),
            fmt_bytes(o.requested_bytes),
            o.device_free_bytes.map_or("?".into(), fmt_bytes),
            o.device_total_bytes.map_or("?".into(), fmt_bytes),
            esc(o.verdict.name()),
            if o.fix.is_empty() { String::new() } else { format!("<p class=fix><b>Fix:</b> {}</p>", esc(&o.fix)) },
            {
                let rows: String = super::oom_numbers(oom)
                    .iter()
                    .map(|(l, v)| format!("<tr><th>{}</th><td>{}</td></tr>", esc(l), esc(v)))
                    .collect();
                format!("<table class=numbers>{rows}</table>")
            },
            match crate::render::text::snapshot_origin(r, oom) {
                Some(line) => format!("<span class=from-snapshot>{}</span><br>", esc(&line)) + &esc(&super::tidy_paths(&o.explanation)).replace('\n', "<br>"),
                None => esc(&super::tidy_paths(&o.explanation)).replace('\n', "<br>"),
            },
            o.outcome.name(),
            super::count(o.failures, "failure", "failures"),
            super::count(o.retries, "retry", "retries"),
            fmt_bytes(o.freed_bytes_between)
        ));
        if !o.holders.is_empty() {
            h.push_str(&format!(
                "<table class=holders><caption>Other processes on device {} at the failure</caption>\
                 <tr><th>pid</th><th>command</th><th>held</th><th>releasable</th><th>stranded</th><th>not visible</th>\
                 <th>live</th><th>seen</th><th>NVML</th></tr>\n",
                o.device
            ));
            for x in &o.holders {
                h.push_str(&format!(
                    "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                    if x.pid == 0 { "-".to_string() } else { x.pid.to_string() },
                    esc(&x.command),
                    fmt_bytes(x.held_bytes),
                    fmt_bytes(x.releasable_bytes),
                    fmt_bytes(x.stranded_bytes),
                    fmt_bytes(x.not_visible_bytes),
                    fmt_bytes(x.live_bytes),
                    x.sight.name(),
                    x.nvml_bytes.map_or("-".into(), fmt_bytes),
                ));
            }
            h.push_str("</table>\n");
        }
        let live = crate::render::text::live_at_oom_lines(r, oom);
        if !live.is_empty() {
            h.push_str(&format!("<details class=live-stacks open><summary>{}</summary><pre>", esc(&live[0])));
            for line in &live[1..] {
                h.push_str(&esc(line));
                h.push('\n');
            }
            h.push_str("</pre></details>");
        }
        if !o.lead_up.is_empty() {
            h.push_str("<details><summary>lead-up events</summary><table><tr><th>time<th>tid<th>kind<th>api<th>bytes and address<th>result</tr>\n");
            for e in &o.lead_up {
                h.push_str(&row(
                    &[
                        rel(r, e.ts_ns),
                        e.tid.to_string(),
                        e.kind_name().into_owned(),
                        e.api_name().into_owned(),
                        super::event_words(e).trim_start().to_string(),
                        vramhook_protocol::record::result_name(e.result).to_string(),
                    ],
                    &[false, true, false, false, false, false],
                ));
            }
            h.push_str("</table></details>");
        }
        h.push_str("</div>\n");
    }
}

/// The logs' part, as the text report's FROM LOGS: each file with the lines understood and
/// skipped, then each incident with its verdict, explanation, what the log did not say, the
/// fix, and the capture incident it joins.
fn logs_html(h: &mut String, r: &Report) {
    if r.logs.is_empty() {
        return;
    }
    h.push_str(&format!(
        "<h2 id=from-logs>From logs ({} incident(s) in {} file(s))</h2>\n",
        r.log_incidents.len(),
        r.logs.len()
    ));
    h.push_str(
        "<table class=log-files><tr><th>file<th>lines<th>understood<th>by source<th>skipped<th>long lines cut<th>binary lines<th>incidents</tr>\n",
    );
    h.push_str(&rows(&r.logs, &[false, true, true, false, true, true, true, true], |f| {
        let sources: Vec<String> = f.by_source.iter().map(|(s, n)| format!("{s} {n}")).collect();
        vec![
            format!("{}{}", f.path, if f.gzip { " (gzip)" } else { "" }),
            f.lines.to_string(),
            f.understood.to_string(),
            if sources.is_empty() { "none".into() } else { sources.join(", ") },
            f.skipped.to_string(),
            f.long_lines.to_string(),
            f.binary_lines.to_string(),
            if f.incidents_unlisted > 0 {
                format!("{} ({} not listed)", f.incidents, f.incidents_unlisted)
            } else {
                f.incidents.to_string()
            },
        ]
    }));
    h.push_str("</table>\n");
    let notes: Vec<(&str, &String)> =
        r.logs.iter().flat_map(|f| f.notes.iter().map(move |n| (f.path.as_str(), n))).collect();
    if !notes.is_empty() {
        h.push_str("<ul>");
        for (path, n) in notes {
            h.push_str(&format!("<li class=note>{}: {}</li>", esc(path), esc(n)));
        }
        h.push_str("</ul>\n");
    }
    for (n, i) in r.log_incidents.iter().enumerate() {
        let mut head = format!("L{} {}:{}", n + 1, i.file, i.line);
        let mut about = vec![i.source.clone()];
        about.push(i.pid.map_or_else(|| "no pid".to_string(), |p| format!("pid {p}")));
        if let Some(d) = i.device {
            about.push(format!("GPU {d}"));
        }
        if let Some(t) = &i.time {
            about.push(format!("logged {t}"));
        }
        head += &format!(" ({})", about.join(", "));
        h.push_str(&format!(
            "<div class=\"oom log-incident\" id=log-{}><b>{}</b><br>verdict: <span class=verdict>{}</span><br>{}",
            n + 1,
            esc(&head),
            esc(&i.verdict_name),
            esc(&i.explanation)
        ));
        h.push_str(&format!(
            "<br>missing: {}",
            if i.missing.is_empty() {
                "nothing: the log gave every number the verdict needs".to_string()
            } else {
                esc(&i.missing.join(", "))
            }
        ));
        if let Some(fix) = &i.fix {
            h.push_str(&format!("<br>fix: {}", esc(fix)));
        }
        let joined = i.capture_incident.and_then(|id| r.oom_position(id));
        match joined.map(|k| (k, &r.ooms[k].incident)) {
            Some((k, c)) => h.push_str(&format!(
                "<br>joins capture incident <a href=\"#oom-{}\">#{}</a> (judged from the driver alone: {})",
                c.id,
                k + 1,
                esc(c.verdict.name())
            )),
            None if !r.ooms.is_empty() => h.push_str("<br>joins no capture incident"),
            None => {}
        }
        if let Some(j) = &i.join {
            h.push_str(&format!(" <span class=join>({})</span>", esc(j)));
        }
        h.push_str(&format!(
            "<details><summary>the log's message</summary><pre>{}</pre></details></div>\n",
            esc(&i.message)
        ));
    }
}
