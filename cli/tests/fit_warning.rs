//! The fit of the next large request, warned before the OOM (issue #30), on the simulated
//! driver: a PyTorch-style server whose cache fragments step by step until a large request
//! fails (`torch_serving`), and its control, the same requests with the caching allocator
//! off, which never fails. Both run under `vramhook run --record`; the captures are replayed
//! through the model (as `vramhook analyze` does); the fit must cross below 1, and stay
//! there, well before the OOM, and the control's never. The replayed series, one point per
//! step, then drive the Prometheus rule `VramhookNextLargeRequestWouldFail` in `promtool
//! test rules` (a step read as a minute): it fires before the OOM, and not for the control.

mod agent_support;

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vramhook_model::{Model, ModelConfig, ProcessFit};
use vramhook_protocol::capture::{CaptureReader, Frame};
use vramhook_protocol::record::{Event, EventKind};
use vramhook_testkit::{interposer, repo_root, sim_dir, vramhook_bin as vramhook};

const GIB: u64 = 1 << 30;
const S: u64 = 1_000_000_000;
/// The simulated device (the workload's defaults are tuned to it: with the cache, a large
/// request fails at step 550 of 600; without, the same requests all fit).
const VRAM: u64 = 9 * GIB;
/// The control's steps: the server's 551 requests and some more. Past step 560 the control's
/// own kept tail leaves less than the large request free (1.34 GiB at step 570): a true
/// crossing by capacity, which a control that must never cross cannot have.
const CONTROL_STEPS: &str = "560";
/// The demand window: the whole run (the driver sees a large request only when the cache
/// cannot serve it, here its first; the agent's default is 10 minutes).
const WINDOW_S: u64 = 60;
/// A crossing counts when the fit stays below 1 this long (the alert's `for:`, scaled).
const SUSTAINED_NS: u64 = S;
const STEP_NS: u64 = 50_000_000;

fn record(dir: &Path, name: &str, envs: &[(&str, &str)]) -> (PathBuf, Output) {
    let capture = dir.join(format!("{name}.vhc"));
    let program = sim_dir().join("workloads/torch_serving");
    let mut cmd = Command::new(vramhook());
    cmd.arg("run").arg("--record").arg(&capture).arg("--ring-dir").arg(dir.join(format!("rings-{name}")));
    cmd.arg("--").arg(program);
    cmd.env("VRAMHOOK_LIB", interposer()).env("LD_LIBRARY_PATH", sim_dir()).env_remove("LD_PRELOAD");
    cmd.env("VRAMHOOK_SIM_VRAM_BYTES", VRAM.to_string()).env("SIM_STEP_MS", (STEP_NS / 1_000_000).to_string());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run vramhook");
    assert!(capture.is_file(), "no capture:\n{}", String::from_utf8_lossy(&out.stderr));
    (capture, out)
}

/// One point per step: (time, the fit after the step's lens numbers).
struct Replayed {
    points: Vec<(u64, ProcessFit)>,
    oom_ts: Option<u64>,
    origin: u64,
}

fn replay(capture: &Path) -> Replayed {
    let file = std::fs::File::open(capture).expect("capture");
    let mut reader = CaptureReader::new(BufReader::new(file)).expect("capture header");
    let mut model = Model::new(ModelConfig { fit_window_ns: WINDOW_S * S, ..ModelConfig::default() });
    let mut points = Vec::new();
    let mut origin = u64::MAX;
    while let Some(frame) = reader.next_frame().expect("capture frame") {
        let Frame::Events(records) = frame else { continue };
        for raw in records {
            let ev = Event::from_raw(raw);
            model.apply(&ev);
            origin = origin.min(ev.ts_ns);
            // The lens's stats close each step (after its device sample and its sample).
            if ev.kind() == Some(EventKind::FrameworkStats) {
                if let Some((_, view)) = model.process_view(ev.pid, 0, false) {
                    if let Some(f) = view.fit.into_iter().find(|f| f.device == 0) {
                        points.push((ev.ts_ns, f));
                    }
                }
            }
        }
    }
    let oom_ts = model.snapshot().incidents.first().map(|i| i.ts_ns);
    Replayed { points, oom_ts, origin }
}

/// The first time the fit went below 1 and stayed there for `SUSTAINED_NS` (or to the end).
fn sustained_crossing(points: &[(u64, ProcessFit)], end: u64) -> Option<u64> {
    let mut start: Option<u64> = None;
    for (ts, f) in points {
        if f.fit_ratio < 1.0 {
            let s = *start.get_or_insert(*ts);
            if ts - s >= SUSTAINED_NS {
                return Some(s);
            }
        } else {
            start = None;
        }
    }
    start.filter(|s| end - s >= SUSTAINED_NS)
}

/// `vramhook analyze` (text, or JSON) with the test's fit window.
fn analyze(capture: &Path, json: bool) -> String {
    analyze_with_window(capture, json, &WINDOW_S.to_string())
}

fn analyze_with_window(capture: &Path, json: bool, window_s: &str) -> String {
    let mut cmd = Command::new(vramhook());
    cmd.arg("analyze").env("VRAMHOOK_FIT_WINDOW", window_s);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.arg(capture).output().expect("analyze");
    assert!(out.status.success(), "analyze: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// `promtool test rules` over the replayed series, one point a step read as one minute:
/// the agent's three series under its labels, and the alert expected from `fire_at_min`
/// on (`None`: never, checked at the last minute).
fn promtool_case(points: &[(u64, ProcessFit)], eval_min: usize, fire: bool) -> String {
    let series = |name: &str, v: &dyn Fn(&ProcessFit) -> String| {
        let values: Vec<String> = points.iter().map(|(_, f)| v(f)).collect();
        format!(
            "      - series: '{name}{{process_pid=\"4242\",process_executable_name=\"torch_serving\",device=\"0\",instance=\"sim\"}}'\n        values: '{}'\n",
            values.join(" ")
        )
    };
    let mut y = String::from(
        "rule_files: [alerts.yml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n",
    );
    y += &series("vramhook_process_memory_fit_ratio", &|f| format!("{}", f.fit_ratio));
    y += &series("vramhook_process_memory_demand_bytes", &|f| f.demand_bytes.to_string());
    y += &series("vramhook_process_memory_supply_bytes", &|f| f.supply_bytes.to_string());
    // The agent's info series of what stands in the way: one per value of `limited_by`, a
    // point where the fit is below 1 with that limit.
    let mut limits: Vec<&str> = points.iter().filter_map(|(_, f)| f.limited_by.map(|l| l.name())).collect();
    limits.sort_unstable();
    limits.dedup();
    for limit in limits {
        let values: Vec<&str> =
            points.iter().map(|(_, f)| if f.limited_by.map(|l| l.name()) == Some(limit) { "1" } else { "_" }).collect();
        y += &format!(
            "      - series: 'vramhook_process_memory_fit_limit_info{{process_pid=\"4242\",process_executable_name=\"torch_serving\",device=\"0\",instance=\"sim\",limited_by=\"{limit}\"}}'\n        values: '{}'\n",
            values.join(" ")
        );
    }
    y += &format!(
        "    alert_rule_test:\n      - eval_time: {eval_min}m\n        alertname: VramhookNextLargeRequestWouldFail\n"
    );
    if fire {
        let f = &points[eval_min].1;
        y += "        exp_alerts:\n          - exp_labels: {severity: warning, process_pid: \"4242\", process_executable_name: torch_serving, device: \"0\", instance: sim}\n";
        y += &format!(
            "            exp_annotations:\n              summary: \"torch_serving (pid 4242) on GPU 0 of sim: its next large request would not fit (fit {:.2})\"\n",
            f.fit_ratio
        );
        y += &format!(
            "              description: \"Its largest recent request: {}B; what it could get now: {}B; in the way: {} (the verdict such a failure would get; a split cache shows in vramhook_process_memory_stranded_bytes). `vramhook top` shows the fit column.\"\n",
            humanize1024(f.demand_bytes as f64),
            humanize1024(f.supply_bytes as f64),
            f.limited_by.map_or("not known", |l| l.name())
        );
    } else {
        y += "        exp_alerts: []\n";
    }
    y
}

/// Prometheus's `humanize1024` (Go's `%.4g` and a binary prefix), for the expected annotations.
fn humanize1024(mut v: f64) -> String {
    let mut prefix = "";
    for p in ["Ki", "Mi", "Gi", "Ti"] {
        if v.abs() < 1024.0 {
            break;
        }
        v /= 1024.0;
        prefix = p;
    }
    let decimals = if v.abs() < 1.0 { 4 } else { (3 - v.abs().log10().floor() as i32).max(0) as usize };
    let mut s = format!("{v:.decimals$}");
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{s}{prefix}")
}

/// Runs `promtool test rules` on `case` beside a copy of the real rules; whether it passed.
fn promtool_passes(case: &str) -> Option<(bool, String)> {
    let promtool = repo_root().join(".tools/bin/promtool");
    if !promtool.is_file() {
        eprintln!("not run: the alert part: .tools/bin/promtool is missing (scripts/lib/backends.sh builds it)");
        return None;
    }
    let tmp = tempfile::tempdir().expect("dir");
    std::fs::copy(repo_root().join("deploy/prometheus/alerts.yml"), tmp.path().join("alerts.yml")).expect("rules");
    std::fs::write(tmp.path().join("case.yml"), case).expect("case");
    let out =
        Command::new(promtool).args(["test", "rules", "case.yml"]).current_dir(tmp.path()).output().expect("promtool");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((out.status.success(), text))
}

#[test]
fn the_fit_crosses_below_one_before_the_oom_and_never_in_the_control() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().to_path_buf();
    let control =
        std::thread::spawn(move || record(&d, "control", &[("SIM_NO_CACHING", "1"), ("SIM_STEPS", CONTROL_STEPS)]));
    let (cache_capture, cache_out) = record(dir.path(), "cache", &[]);
    let (control_capture, control_out) = control.join().expect("control run");
    let stdout = String::from_utf8_lossy(&cache_out.stdout);
    assert_eq!(cache_out.status.code(), Some(1), "the fragmenting server fails:\n{stdout}");
    assert!(stdout.contains("oom_step="), "{stdout}");
    assert_eq!(control_out.status.code(), Some(0), "{}", String::from_utf8_lossy(&control_out.stderr));

    // The fragmenting cache: below 1, for good, well before the OOM.
    let r = replay(&cache_capture);
    let oom = r.oom_ts.expect("the OOM is an incident");
    assert!(r.points.len() > 400, "a point per step: {}", r.points.len());
    let cross = sustained_crossing(&r.points, oom).expect("the fit crossed below 1 before the OOM");
    let lead = oom - cross;
    eprintln!(
        "fit crossed below 1 at +{:.2} s, the OOM came at +{:.2} s: {:.2} s ahead ({} steps)",
        secs(cross - r.origin),
        secs(oom - r.origin),
        secs(lead),
        lead / STEP_NS
    );
    assert!(cross < oom, "crossing at {cross}, OOM at {oom}");
    assert!(lead >= 2 * S, "the warning comes at least 2 s (40 steps) before the OOM: {:.2} s", secs(lead));
    let (_, at) = r.points.iter().find(|(t, _)| *t >= cross).expect("the crossing's point");
    assert_eq!(at.demand_bytes, 1536 << 20, "the demand is the large request: {at:?}");
    assert!(at.supply_bytes < at.demand_bytes, "{at:?}");
    assert_eq!(at.limited_by, Some(vramhook_model::FitLimit::FrameworkFragmentation), "{at:?}");
    // Before the fragmentation, the same request fitted.
    assert!(r.points.iter().take(100).all(|(_, f)| f.fit_ratio >= 1.0), "no early crossing");

    // The control: the same requests, never short, not even for one sample.
    let c = replay(&control_capture);
    assert_eq!(c.oom_ts, None);
    assert!(c.points.len() >= 550, "a point per step: {}", c.points.len());
    let lowest = c.points.iter().map(|(_, f)| f.fit_ratio).fold(f64::MAX, f64::min);
    eprintln!("control: lowest fit {lowest:.2}");
    assert!(lowest >= 1.0, "the control's fit never goes below 1: lowest {lowest}");

    // `vramhook analyze` says it, replaying the same captures: one line for the server, the
    // crossing before the failure it foresaw; nothing for the control.
    let text = analyze(&cache_capture, false);
    let line =
        text.lines().find(|l| l.contains("would not have fit")).unwrap_or_else(|| panic!("no fit line:\n{text}"));
    assert!(line.contains("a 1.50 GiB request would not have fit") && line.contains("; it came at +"), "{line}");
    eprintln!("analyze: {}", line.trim());
    let json: serde_json::Value = serde_json::from_str(&analyze(&cache_capture, true)).expect("JSON report");
    let warnings = json["fit_warnings"].as_array().expect("fit_warnings");
    assert_eq!(warnings.len(), 1, "one crossing, one failure: {warnings:?}");
    let (since, came) = (warnings[0]["since_ts_ns"].as_u64().expect("since"), warnings[0]["came_ts_ns"].as_u64());
    assert_eq!(came, Some(oom), "the request it foresaw is the OOM");
    // Analyze reports the run below 1 that lasted up to the failure: it may start after the
    // first sustained crossing (the fit came back above 1 for a while in between).
    assert!(since >= cross && since + S <= oom, "analyze's crossing {since}, the test's first {cross}, OOM {oom}");
    assert_eq!(warnings[0]["demand_bytes"], 1536u64 << 20);
    assert_eq!(warnings[0]["limited_by"], "framework_fragmentation");
    assert!(line.contains("to be had: its cache is fragmented"), "{line}");
    // A window shorter than a step (20 ms) forgets the driver's calls, but not the lens's
    // figure: the segment made for the large request is still in the cache at each sample,
    // so the lens reports that request again each time and the warning still comes ahead.
    let short: serde_json::Value =
        serde_json::from_str(&analyze_with_window(&cache_capture, true, "0.02")).expect("JSON report");
    let w = short["fit_warnings"].as_array().and_then(|w| w.first()).expect("a warning with a 20 ms window");
    assert_eq!(w["demand_source"], "lens_largest_allocation", "{w}");
    let (since, came) = (w["since_ts_ns"].as_u64().expect("since"), w["came_ts_ns"].as_u64().expect("came"));
    assert!(came - since >= S, "still ahead with a 20 ms window: {w}");
    let control_text = analyze(&control_capture, false);
    assert!(!control_text.contains("would not have fit"), "{control_text}");
    forecast_warns_both(&cache_capture, &control_capture, oom);

    // The alert on these series (a step read as a minute, `for: 5m`): fires before the OOM's
    // step, and never for the control.
    let cross_step = r.points.iter().position(|(t, _)| *t >= cross).expect("step");
    let oom_step = r.points.iter().position(|(t, _)| *t >= oom).unwrap_or(r.points.len());
    let before_oom = oom_step - 1;
    assert!(before_oom > cross_step + 5, "room for the rule's for: 5m ({cross_step} → {oom_step})");
    if let Some((ok, text)) = promtool_passes(&promtool_case(&r.points, before_oom, true)) {
        assert!(ok, "the alert fires at step {before_oom}, before the OOM:\n{text}");
        let (early, _) = promtool_passes(&promtool_case(&r.points, cross_step, true)).expect("promtool");
        assert!(!early, "the alert waits for its for: (not yet at the crossing, step {cross_step})");
        let (quiet, text) = promtool_passes(&promtool_case(&c.points, c.points.len() - 1, false)).expect("promtool");
        assert!(quiet, "the control raises no alert:\n{text}");
    }
}

/// `analyze --fit-trend` (the supply's least-squares line, followed ahead): each warning as
/// the rule says (held for the hold, the forecast short of the demand), the fragmenting
/// server's first well before its OOM; and the control's too, with no failure after them:
/// the forecast cannot tell the two apart (both supplies fall as kept sessions pile up),
/// which is why it is off by default (docs/live.md).
fn forecast_warns_both(cache: &Path, control: &Path, oom: u64) {
    let forecast = |capture: &Path| -> Vec<serde_json::Value> {
        let out = Command::new(vramhook())
            .arg("analyze")
            .arg("--json")
            .args(["--fit-trend", "2s,5s,500ms"])
            .arg(capture)
            .env("VRAMHOOK_FIT_WINDOW", WINDOW_S.to_string())
            .output()
            .expect("analyze");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
        json["fit_trend_warnings"].as_array().cloned().unwrap_or_default()
    };
    let n = |w: &serde_json::Value, k: &str| w[k].as_u64().unwrap_or_else(|| panic!("{k}: {w}"));
    let (server, quiet) = (forecast(cache), forecast(control));
    for w in server.iter().chain(&quiet) {
        assert!(n(w, "fired_ts_ns") >= n(w, "since_ts_ns") + 500_000_000, "held for the hold: {w}");
        assert!(w["forecast_bytes"].as_f64().expect("forecast") < n(w, "demand_bytes") as f64, "{w}");
        assert_eq!(n(w, "horizon_ns"), 5_000_000_000, "{w}");
        assert!(!(w["came_ts_ns"].is_u64() && w["cleared_ts_ns"].is_u64()), "came or cleared, not both: {w}");
    }
    let first = server.first().map(|w| n(w, "fired_ts_ns")).expect("the server's supply fell: a forecast");
    assert!(first + 5 * S <= oom, "the forecast came at least 5 s before the OOM: {first} vs {oom}");
    assert!(!quiet.is_empty(), "the control's supply falls too: the forecast warns it");
    assert!(quiet.iter().all(|w| w["came_ts_ns"].is_null()), "no failure in the control: {quiet:?}");
    eprintln!(
        "forecast: server first {:.2} s before its OOM ({} warnings); control {} warnings, none followed by a failure",
        secs(oom - first),
        server.len(),
        quiet.len()
    );
}

/// Headless Chromium's DOM of the page at `page` after its script ran (`None`: no Chromium;
/// `$CHROMIUM` names one elsewhere).
fn rendered_dom(page: &Path, profile: &Path) -> Option<String> {
    let chromium = std::env::var_os("CHROMIUM").map(PathBuf::from).or_else(|| {
        ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
            let out = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().ok()?;
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (out.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
        })
    })?;
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
        .args(["--disable-component-update", "--disable-sync", "--window-size=1400,2000", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium");
    assert!(out.status.success(), "chromium: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The HTML report of the fragmenting server's capture plots its fit (issue #30): one plot
/// for its GPU 0, drawn from `timelines.fits` (the samples the NEXT LARGE REQUEST line is
/// made of), a triangle where it went below 1, its OOM's marker, and the text report's
/// sentence as the caption.
#[test]
fn the_html_report_plots_the_fit_with_its_crossings_and_the_oom() {
    let dir = tempfile::tempdir().expect("dir");
    let (capture, out) = record(dir.path(), "cache", &[]);
    assert_eq!(out.status.code(), Some(1), "the fragmenting server fails");
    let json: serde_json::Value = serde_json::from_str(&analyze(&capture, true)).expect("JSON report");
    let warning = &json["fit_warnings"][0];
    let since = warning["since_ts_ns"].as_u64().expect("a fit warning");
    let fits = json["timelines"]["fits"].as_array().expect("timelines.fits");
    assert_eq!(fits.len(), 1, "one process, one device: {fits:?}");
    let fit = &fits[0];
    assert_eq!((&fit["pid"], &fit["device"]), (&warning["pid"], &warning["device"]));
    let crossings = fit["crossings"].as_array().expect("crossings");
    // The warning's run starts at a crossing below 1 of the same timeline.
    assert!(crossings.iter().any(|c| c["below"] == true && c["ts_ns"] == since), "{since}: {crossings:?}");
    assert!(fit["fit_ratio"].as_array().is_some_and(|p| p.len() > 100), "a point per sample");

    let page = dir.path().join("report.html");
    let mut cmd = Command::new(vramhook());
    cmd.arg("analyze").env("VRAMHOOK_FIT_WINDOW", WINDOW_S.to_string()).arg(&capture).arg("--html").arg(&page);
    let out = cmd.output().expect("analyze --html");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(&page).expect("HTML");
    let text = analyze(&capture, false);
    let line = text.lines().find(|l| l.contains("would not have fit")).expect("the text report's fit line").trim();
    let caption = html.split("<p class=fit-caption id=fit-caption-0>").nth(1).expect("the fit plot's caption");
    let caption = &caption[..caption.find("</p>").expect("caption end")];
    assert!(caption.contains(&line.replace('\'', "&#39;")), "the caption is the text's sentence:\n{caption}\n{line}");

    let Some(dom) = rendered_dom(&page, &dir.path().join("profile")) else {
        panic!("MISSING chromium: this test draws the page in headless Chromium (apt-get install -y chromium)");
    };
    assert!(dom.contains("data-rendered=\"yes\""), "the plotting script did not finish");
    let at = dom.find("data-plot=\"plot-fit-0\"").expect("the fit plot");
    let svg = &dom[at..at + dom[at..].find("</svg>").expect("svg end")];
    assert!(svg.contains("class=\"series\""), "the fit's line");
    let below = svg.matches("data-below=\"yes\"").count();
    let expected = crossings.iter().filter(|c| c["below"] == true).count();
    assert!(below >= 1 && below == expected, "one down triangle per crossing below 1: {below} of {expected}");
    assert!(svg.contains("class=\"oom-marker\""), "the OOM on the fit plot");
    assert!(svg.contains("class=\"fit-warning-span\""), "the run below 1 the caption is about, shaded");
    assert!(svg.contains("fit = 1"), "the line at 1 in the legend");
}

/// Prometheus's firing alerts `VramhookNextLargeRequestWouldFail`, by their `process_pid`.
fn firing(port: u16) -> Vec<String> {
    firing_described(port).into_iter().map(|(pid, _)| pid).collect()
}

/// The same with each alert's description.
fn firing_described(port: u16) -> Vec<(String, String)> {
    let Ok(addr) = format!("127.0.0.1:{port}").parse() else { return vec![] };
    let Ok(body) = agent_support::http_get(addr, "/api/v1/alerts") else { return vec![] };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["alerts"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|a| a["labels"]["alertname"] == "VramhookNextLargeRequestWouldFail" && a["state"] == "firing")
                .filter_map(|a| {
                    let pid = a["labels"]["process_pid"].as_str()?.to_string();
                    Some((pid, a["annotations"]["description"].as_str().unwrap_or_default().to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The live path: the agent (`--fit-window 60`) drains both workloads' rings (the server on
/// device 0, the control on device 1 of the simulated driver, a step every 100 ms), a real
/// Prometheus 3 scrapes its /metrics every 500 ms and evaluates the real rule file (the
/// rule's `for:` cut from 5m to 3s for a run of a minute). The alert fires for the server
/// while it still runs and before the agent has seen any OOM, and never for the control.
#[test]
fn prometheus_fires_the_alert_from_the_agents_series_before_the_oom() {
    use agent_support::*;
    let rings = ring_dir("fit");
    let agent = Agent::start(
        &vramhook_bin(),
        &["--ring-dir", rings.path().to_str().expect("utf-8"), "--fit-window", "60", "--snapshot-ms", "100"],
        &[],
    );
    let prom_port = free_port();
    let dir = tempfile::tempdir().expect("prometheus dir");
    let rules = std::fs::read_to_string(repo_root().join("deploy/prometheus/alerts.yml")).expect("rules");
    let rule = "expr: vramhook_process_memory_fit_ratio < 1\n        for: 5m";
    assert!(rules.contains(rule), "the rule as the test expects it");
    // 3 s: a `for:` shorter than the run (a minute), longer than one scrape and evaluation.
    std::fs::write(dir.path().join("alerts.yml"), rules.replace(rule, &rule.replace("5m", "3s"))).expect("rules");
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 500ms\n  evaluation_interval: 500ms\nrule_files: [alerts.yml]\n\
             scrape_configs:\n  - job_name: vramhook\n    static_configs: [{{targets: ['{}']}}]\n",
            agent.addr
        ),
    )
    .expect("config");
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let mut prom = Command::new(backend_bin("prometheus"))
        .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("prometheus");
    let ready = std::time::Instant::now();
    while agent_support::http_get(format!("127.0.0.1:{prom_port}").parse().expect("addr"), "/-/ready").is_err() {
        assert!(ready.elapsed() < std::time::Duration::from_secs(60), "prometheus did not come up");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    let program = workload("torch_serving");
    let vram = VRAM.to_string();
    let common = [("VRAMHOOK_SIM_VRAM_BYTES", vram.as_str()), ("VRAMHOOK_SIM_DEVICES", "2"), ("SIM_STEP_MS", "100")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut e: Vec<(&str, &str)> = common.to_vec();
        e.extend_from_slice(extra);
        e
    };
    let mut server = spawn_traced(&program, &[], rings.path(), &with(&[]));
    let mut control = spawn_traced(
        &program,
        &[],
        rings.path(),
        &with(&[("SIM_NO_CACHING", "1"), ("SIM_DEVICE", "1"), ("SIM_STEPS", CONTROL_STEPS)]),
    );
    let (server_pid, control_pid) = (server.id().to_string(), control.id().to_string());
    let start = std::time::Instant::now();
    let mut fired_before_oom: Option<f64> = None;
    let mut description = String::new();
    let mut control_fired = false;
    let status = loop {
        let described = firing_described(prom_port);
        let f: Vec<String> = described.iter().map(|(pid, _)| pid.clone()).collect();
        control_fired |= f.contains(&control_pid);
        if let Some((_, d)) = described.iter().find(|(pid, _)| *pid == server_pid) {
            description.clone_from(d);
        }
        if fired_before_oom.is_none() && f.contains(&server_pid) {
            // The agent has seen no OOM yet, and the server still runs.
            let incidents = agent.state()["snapshot"]["incidents"].as_array().map_or(0, Vec::len);
            if incidents == 0 && server.try_wait().expect("wait").is_none() {
                fired_before_oom = Some(start.elapsed().as_secs_f64());
            }
        }
        if let Some(s) = server.try_wait().expect("wait") {
            break s;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(240), "the server ran too long");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let oom_at = start.elapsed().as_secs_f64();
    assert_eq!(status.code(), Some(1), "the server fails");
    let control_status = loop {
        control_fired |= firing(prom_port).contains(&control_pid);
        if let Some(s) = control.try_wait().expect("wait") {
            break s;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(control_status.code(), Some(0), "the control never fails");
    let _ = prom.kill();
    let _ = prom.wait();
    let fired = fired_before_oom.unwrap_or_else(|| panic!("the alert did not fire before the OOM (at {oom_at:.1} s)"));
    eprintln!("the alert fired at {fired:.1} s, the server failed at about {oom_at:.1} s: {description}");
    // What stands in the way, from the agent's vramhook_process_memory_fit_limit_info.
    assert!(description.contains("; in the way: framework_fragmentation ("), "{description}");
    assert!(fired < oom_at, "fired {fired}, OOM {oom_at}");
    assert!(!control_fired, "the control raised the alert");
}
