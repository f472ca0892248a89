//! Opens the HTML report in headless Chromium: the script-built SVG plots must exist in the
//! DOM and the screenshot must show them (coloured series and OOM-marker pixels).
//! Chromium is required: without it this test FAILS (install: `apt-get install -y chromium`).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use vramhook_analyzer::render::html;
use vramhook_analyzer::{analyze_bytes, Options};

fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(p);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output() {
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !p.is_empty() {
                return PathBuf::from(p);
            }
        }
    }
    panic!(
        "MISSING chromium: the HTML report test needs headless Chromium. Install it with \
         `apt-get update && apt-get install -y chromium` (or set $CHROMIUM to a Chrome binary)"
    );
}

fn run_chromium(profile: &Path, extra: &[String], url: &str) -> std::process::Output {
    let mut cmd = Command::new("timeout");
    cmd.arg("120").arg(chromium());
    for a in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--window-size=1400,2000",
    ] {
        cmd.arg(a);
    }
    cmd.arg(format!("--user-data-dir={}", profile.display()));
    cmd.args(extra).arg(url);
    let out = cmd.output().expect("cannot start chromium");
    assert!(out.status.success(), "chromium failed ({:?}):\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    out
}

/// Opens `html` with `script` (a JS expression) appended after the report's own script, and
/// returns the expression's value, JSON-serialised by the page and read from the dumped DOM.
fn measure(dir: &Path, name: &str, html: &str, script: &str) -> serde_json::Value {
    let page = dir.join(format!("{name}.html"));
    let probe = format!(
        "<script>document.body.setAttribute('data-measure',JSON.stringify((function(){{{script}}})()));</script></body>"
    );
    std::fs::write(&page, html.replacen("</body>", &probe, 1)).expect("write page");
    let out = run_chromium(
        &dir.join(format!("profile-{name}")),
        &["--dump-dom".into()],
        &format!("file://{}", page.display()),
    );
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("data-rendered=\"yes\""),
        "the plotting script did not finish:\n{}",
        &dom[..dom.len().min(2000)]
    );
    let at = dom
        .find("data-measure=\"")
        .unwrap_or_else(|| panic!("the probe did not run:\n{}", &dom[..dom.len().min(2000)]));
    let rest = &dom[at + "data-measure=\"".len()..];
    let raw = &rest[..rest.find('"').expect("attribute end")];
    let json = raw.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&");
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("probe output {json}: {e}"))
}

/// The page's y (CSS px from the top of the document) of the first element matching `selector`.
const TOP: &str =
    "const top=s=>{const e=document.querySelector(s);return e?e.getBoundingClientRect().top+window.scrollY:null;};";

#[test]
fn html_report_renders_its_plots_in_headless_chromium() {
    let (bytes, _) = scenario();
    let report = analyze_bytes("scenario.vhc", &bytes, &Options::default()).expect("analyze");
    let dir = tempfile::tempdir().expect("tempdir");
    let page = dir.path().join("report.html");
    let html = html::render(&report);
    assert!(!html.contains("http://") || html.matches("http://").all(|_| true));
    assert!(!html.contains("<link") && !html.contains("src=\"http"), "the page must not load anything");
    std::fs::write(&page, &html).expect("write page");
    let url = format!("file://{}", page.display());

    // 1. The DOM after the script ran.
    let out = run_chromium(&dir.path().join("p1"), &["--dump-dom".into()], &url);
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("data-rendered=\"yes\""),
        "the plotting script did not finish:\n{}",
        &dom[..dom.len().min(2000)]
    );
    for plot in ["plot-live", "plot-free", "plot-frag", "plot-span", "plot-layout"] {
        assert!(dom.contains(&format!("data-plot=\"{plot}\"")), "no SVG for {plot}");
    }
    let series = dom.matches("class=\"series\"").count();
    assert!(series >= 6, "expected live, device, free, fragmentation and span series; got {series}");
    assert!(dom.matches("class=\"oom-marker\"").count() >= 4, "OOM markers on the time plots");
    assert!(dom.matches("class=\"alloc\"").count() >= 20, "layout rectangles for the live allocations");
    assert!(dom.contains("class=\"arena-occupied\""), "the reservation in the layout");

    // Where the live-bytes plot is: below the verdicts, inside the 2000-pixel window.
    let at = measure(
        dir.path(),
        "where",
        &html,
        &format!("{TOP} const r=document.querySelector('[data-plot=plot-live]').getBoundingClientRect(); return [r.top+window.scrollY, r.bottom+window.scrollY, top('.verdict')];"),
    );
    let (plot_top, plot_bottom) = (at[0].as_f64().expect("top") as usize, at[1].as_f64().expect("bottom") as usize);
    assert!(at[2].as_f64().expect("a verdict") < plot_top as f64, "the verdict comes before the plots: {at}");
    assert!(plot_bottom < 1900, "the live-bytes plot must be inside the screenshot: {at}");

    // 2. The screenshot shows them.
    let png = dir.path().join("shot.png");
    run_chromium(&dir.path().join("p2"), &[format!("--screenshot={}", png.display())], &url);
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).expect("screenshot written")));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0u8; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("png frame");
    let ch = match info.color_type {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        other => panic!("unexpected screenshot colour type {other:?}"),
    };
    let (w, h) = (info.width as usize, info.height as usize);
    assert!(w >= 1300 && h >= 1000, "screenshot {w}x{h}");
    let px = |x: usize, y: usize| {
        let i = (y * w + x) * ch;
        (buf[i], buf[i + 1], buf[i + 2])
    };
    // Count series blue and OOM red inside the live-bytes plot (the OOM incident's red
    // border is above it).
    let (mut blue, mut red, mut ink) = (0, 0, 0);
    for y in plot_top..plot_bottom.min(h) {
        for x in 0..w {
            let (r, g, b) = px(x, y);
            if r < 60 && (80..150).contains(&g) && b > 180 {
                blue += 1;
            }
            if r > 180 && g < 80 && b < 80 {
                red += 1;
            }
            if (r as u32 + g as u32 + b as u32) < 600 {
                ink += 1;
            }
        }
    }
    let keep = std::env::var_os("VRAMHOOK_KEEP_SCREENSHOT").map(PathBuf::from);
    if let Some(k) = keep {
        let _ = std::fs::copy(&png, k);
    }
    assert!(blue > 400, "too few series pixels in the live-bytes plot: {blue}");
    assert!(red > 40, "no OOM marker pixels: {red}");
    assert!(ink > 5000, "the plot is nearly blank: {ink}");
}

/// OOMs of 12 processes in a 10-second capture: three within a millisecond (one line on the
/// plot), six 100 ms apart (12 px: lines apart, labels that would overlap), one alone and
/// one at the right edge. Pid 99 holds memory throughout so the live plot has a series.
fn crowded_ooms() -> (Vec<u8>, usize) {
    use vramhook_protocol::capture::CaptureWriter;
    use vramhook_protocol::record::{Api, Event};
    let ms = 1_000_000u64;
    let t0 = 2_000 * ms;
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("writer");
    let mut evs = vec![
        ev(99, t0, Event::mem_info(16 * GIB, 16 * GIB)),
        ev(99, t0, Event::alloc(Api::cuMemAlloc_v2, 0x1000_0000, 4 * GIB)),
    ];
    let at_us: Vec<u64> = vec![
        1_000_000, 1_000_300, 1_000_600, 3_000_000, 3_100_000, 3_200_000, 3_300_000, 3_400_000, 3_500_000, 6_000_000,
        9_990_000,
    ];
    for (k, us) in at_us.iter().enumerate() {
        let ts = t0 + us * 1000;
        let pid = 100 + k as u32;
        evs.push(ev(pid, ts, Event::alloc(Api::cuMemAlloc_v2, 0, 20 * GIB).with_result(2)));
        evs.push(ev(pid, ts + 1000, Event::mem_info(12 * GIB, 16 * GIB)));
    }
    // A second failure of pid 100 a little later: another size, another incident.
    evs.push(ev(100, t0 + 1_000_800_000, Event::alloc(Api::cuMemAlloc_v2, 0, 30 * GIB).with_result(2)));
    evs.push(ev(99, t0 + 10_000 * ms, Event::mem_info(12 * GIB, 16 * GIB)));
    w.write_events(&evs).expect("write");
    (w.finish().expect("finish"), at_us.len() + 1)
}

#[test]
fn oom_markers_do_not_overlap() {
    let (bytes, failures) = crowded_ooms();
    let report = analyze_bytes("crowded.vhc", &bytes, &Options::default()).expect("analyze");
    assert_eq!(report.ooms.len(), failures, "{:#?}", report.ooms);
    let dir = tempfile::tempdir().expect("tempdir");
    let plots = measure(
        dir.path(),
        "crowded",
        &html::render(&report),
        "const out=[];document.querySelectorAll('svg[data-plot]').forEach(svg=>{\
           const labels=[...svg.querySelectorAll('.oom-label')].map(t=>{const b=t.getBBox();return [b.x,b.y,b.width,b.height];});\
           const lines=[...svg.querySelectorAll('.oom-marker')].map(l=>[+l.getAttribute('x1'),+l.getAttribute('data-count')]);\
           out.push({plot:svg.getAttribute('data-plot'),labels:labels,lines:lines});});return out;",
    );
    let plots = plots.as_array().expect("plots");
    let mut checked = 0;
    for p in plots {
        let lines = p["lines"].as_array().expect("lines");
        if lines.is_empty() {
            continue; // the layout picture has no time axis
        }
        let name = &p["plot"];
        if name.as_str().is_some_and(|n| n.starts_with("plot-fit-")) {
            // A fit plot marks its own process's failures only (one here, two for pid 100).
            let count: u64 = lines.iter().map(|l| l[1].as_u64().expect("data-count")).sum();
            assert!((1..=2).contains(&count), "{name}: {lines:?}");
            continue;
        }
        checked += 1;
        let count: u64 = lines.iter().map(|l| l[1].as_u64().expect("data-count")).sum();
        assert_eq!(count as usize, failures, "{name}: every incident is on a line: {lines:?}");
        let mut xs: Vec<f64> = lines.iter().map(|l| l[0].as_f64().expect("x")).collect();
        xs.sort_by(f64::total_cmp);
        for pair in xs.windows(2) {
            assert!(pair[1] - pair[0] >= 6.0, "{name}: marker lines {} px apart: {xs:?}", pair[1] - pair[0]);
        }
        assert!(
            lines.iter().any(|l| l[1].as_u64() == Some(4)),
            "{name}: the four failures within 1 ms share a line: {lines:?}"
        );
        let boxes: Vec<[f64; 4]> = p["labels"]
            .as_array()
            .expect("labels")
            .iter()
            .map(|b| [0, 1, 2, 3].map(|k| b[k].as_f64().expect("bbox")))
            .collect();
        assert!(boxes.len() >= 5, "{name}: labels shown: {boxes:?}");
        let rows: std::collections::BTreeSet<i64> = boxes.iter().map(|b| b[1] as i64).collect();
        assert!(rows.len() >= 2, "{name}: crowded labels go to other rows: {boxes:?}");
        for (i, a) in boxes.iter().enumerate() {
            assert!(a[2] > 20.0, "{name}: a label with no width: {a:?}");
            for b in &boxes[i + 1..] {
                let apart = a[0] + a[2] <= b[0] || b[0] + b[2] <= a[0] || a[1] + a[3] <= b[1] || b[1] + b[3] <= a[1];
                assert!(apart, "{name}: labels overlap: {a:?} and {b:?}");
            }
        }
    }
    assert_eq!(checked, 4, "live, free, fragmentation and span plots carry the markers");
}

#[test]
fn empty_plots_say_no_data_without_an_axis() {
    let log = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/h200-oom/torch_default_fragmented.log");
    let report = vramhook_analyzer::analyze(&[log], &Options::default()).expect("analyze");
    let dir = tempfile::tempdir().expect("tempdir");
    let probe = "return ['plot-live','plot-free','plot-frag','plot-span'].map(id=>{const s=document.querySelector('[data-plot='+id+']');\
                 return [id,s.getAttribute('data-empty'),s.querySelectorAll('.tick').length,(s.querySelector('.no-data')||{}).textContent||null];});";
    for p in measure(dir.path(), "empty", &html::render(&report), probe).as_array().expect("plots") {
        assert_eq!(p[1], "yes", "{p}");
        assert_eq!(p[2], 0, "no axis ticks on an empty plot: {p}");
        assert_eq!(p[3], "no data for this plot in the input", "{p}");
    }
    // A plot with data keeps its ticks, none repeated.
    let (bytes, _) = scenario();
    let report = analyze_bytes("scenario.vhc", &bytes, &Options::default()).expect("analyze");
    let ticks = measure(
        dir.path(),
        "ticks",
        &html::render(&report),
        "return [...document.querySelectorAll('[data-plot=plot-live] .tick')].map(t=>t.textContent);",
    );
    let ticks: Vec<&str> = ticks.as_array().expect("ticks").iter().filter_map(|t| t.as_str()).collect();
    assert_eq!(ticks.len(), 5, "{ticks:?}");
    assert!(ticks.windows(2).all(|w| w[0] != w[1]), "{ticks:?}");
}

/// "Why" first: the capture's incidents with their verdicts, then the log's, then the plots.
#[test]
fn verdicts_and_log_incidents_come_before_the_plots() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/logs");
    let report = vramhook_analyzer::analyze(
        &[fixtures.join("ollama_v0.24.0_oom.h200.vhc"), fixtures.join("ollama_v0.24.0_oom.h200.log")],
        &Options::default(),
    )
    .expect("analyze");
    assert_eq!(report.log_incidents.len(), 2);
    let page = html::render(&report);
    let dir = tempfile::tempdir().expect("tempdir");
    let at = measure(
        dir.path(),
        "order",
        &page,
        &format!(
            "{TOP} return {{ooms:top('#ooms'),verdict:top('.oom .verdict'),logs:top('#from-logs'),log1:top('#log-1'),\
             plots:top('[data-plot=plot-live]'),log1_text:document.querySelector('#log-1').textContent,\
             files:document.querySelector('.log-files').textContent,link:document.querySelector('#log-1 a').getAttribute('href')}};"
        ),
    );
    let y = |k: &str| at[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {at}"));
    assert!(
        y("ooms") < y("verdict") && y("verdict") < y("logs") && y("logs") < y("log1") && y("log1") < y("plots"),
        "{at}"
    );
    let text = at["log1_text"].as_str().expect("text");
    for want in [
        "L1 ",
        "ollama_v0.24.0_oom.h200.log:231 (ggml, no pid",
        "verdict: unknown",
        "912.00 MiB",
        "missing: ",
        "joins capture incident #",
        "judged from the driver alone: other_process",
        "matched by size alone",
        "cudaMalloc failed: out of memory",
    ] {
        assert!(text.contains(want), "{want:?} not in {text}");
    }
    let oom = report.ooms.iter().find(|o| o.incident.requested_bytes == 956_303_360).expect("the 912 MiB failure");
    assert_eq!(at["link"], format!("#oom-{}", oom.incident.id));
    let files = at["files"].as_str().expect("files");
    let f = &report.logs[0];
    for want in [f.lines.to_string(), f.understood.to_string(), f.skipped.to_string(), "ggml".to_string()] {
        assert!(files.contains(&want), "{want} not in {files}");
    }
}

/// The framework cache's plots (issue #10): beside the live-bytes plot, with the OOM markers,
/// reserved, allocated and largest free block drawn; a fragmentation plot with no measured
/// largest free block says "no data" and has no axis.
#[test]
fn framework_cache_plots_render_next_to_the_live_bytes() {
    let (bytes, _) = lens_capture(40, 10);
    let report = analyze_bytes("lens.vhc", &bytes, &Options::default()).expect("analyze");
    assert!(!report.ooms.is_empty(), "the framework's OOM is an incident");
    let dir = tempfile::tempdir().expect("tempdir");
    let probe = format!(
        "{TOP} const p=id=>{{const s=document.querySelector('[data-plot='+id+']');if(!s)return null;\
           return {{empty:s.getAttribute('data-empty'),series:s.querySelectorAll('.series').length,\
           markers:s.querySelectorAll('.oom-marker').length,readings:s.querySelectorAll('.reading').length,ticks:[...s.querySelectorAll('.tick')].map(t=>t.textContent),\
           top:top('[data-plot='+id+']')}};}};\
         return {{live:p('plot-live'),bytes:p('plot-fw-bytes'),frag:p('plot-fw-frag'),free:p('plot-free')}};"
    );
    let at = measure(dir.path(), "framework", &html::render(&report), &probe);
    let (bytes_plot, frag) = (&at["bytes"], &at["frag"]);
    assert!(bytes_plot["empty"].is_null() && frag["empty"].is_null(), "{at}");
    assert_eq!(bytes_plot["series"], 3, "reserved, allocated, largest free block: {at}");
    assert_eq!(frag["series"], 1, "{at}");
    // Measured now and then: each reading is a dot (four samples and the OOM).
    assert_eq!(frag["readings"], 5, "{at}");
    for p in [bytes_plot, frag] {
        assert!(p["markers"].as_u64().unwrap_or(0) >= 1, "OOM marker: {at}");
        let ticks: Vec<&str> = p["ticks"].as_array().expect("ticks").iter().filter_map(|t| t.as_str()).collect();
        assert!(ticks.len() >= 3 && ticks.windows(2).all(|w| w[0] != w[1]), "{ticks:?}");
    }
    assert!(frag["ticks"].as_array().is_some_and(|t| t.last().and_then(|v| v.as_str()) == Some("1.00")), "{at}");
    let y = |k: &str| at[k]["top"].as_f64().unwrap_or_else(|| panic!("{k}: {at}"));
    assert!(y("live") < y("bytes") && y("bytes") < y("frag") && y("frag") < y("free"), "{at}");

    // Never measured: the fragmentation plot is empty, without an axis.
    let (bytes, _) = lens_capture(40, 0);
    let report = analyze_bytes("lens.vhc", &bytes, &Options::default()).expect("analyze");
    let at = measure(dir.path(), "unmeasured", &html::render(&report), &probe);
    assert_eq!(at["frag"]["empty"], "yes", "{at}");
    assert_eq!(at["frag"]["ticks"].as_array().map(|t| t.len()), Some(0), "{at}");
    assert_eq!(at["bytes"]["series"], 2, "reserved and allocated only: {at}");
    // No lens at all: no framework plot.
    let (bytes, _) = scenario();
    let report = analyze_bytes("scenario.vhc", &bytes, &Options::default()).expect("analyze");
    let at = measure(dir.path(), "nolens", &html::render(&report), &probe);
    assert!(at["bytes"].is_null() && at["frag"].is_null(), "{at}");
}

/// Long commands make long legend labels: at 1400 px no legend label overlaps another (each
/// is cut to its 300 px slot, the whole name in its tooltip), in every plot, the fit plots
/// included.
#[test]
fn legend_labels_do_not_overlap() {
    use vramhook_protocol::capture::CaptureWriter;
    use vramhook_protocol::record::{Api, Event};
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("writer");
    let long = "python3 /srv/inference/a_rather_long_directory_name/serve_the_model_with_a_long_name.py --port";
    let mut evs = Vec::new();
    // On GPU 12: legend labels as long as a many-GPU host makes them.
    let on12 = |pid: u32, ts: u64, e: Event| vramhook_testkit::events::made(e, pid, ts, 12);
    for k in 0..6u32 {
        let pid = 4_194_300 + k; // pids as long as Linux makes them
        w.write_process(&info(pid, &format!("{long} {k}"))).expect("process");
        let ts = 2_000_000_000 + u64::from(k) * 10_000_000;
        evs.push(on12(pid, ts, Event::mem_info(8 * GIB, 16 * GIB)));
        evs.push(on12(pid, ts + 1000, Event::alloc(Api::cuMemAlloc_v2, 0x1000_0000 * u64::from(k + 1), GIB)));
        // Given back: a request it makes (the fit's demand, so each has a fit plot).
        evs.push(on12(pid, ts + 1500, Event::free(Api::cuMemFree_v2, 0x1000_0000 * u64::from(k + 1))));
        // A VMM reservation each, half mapped: the per-arena plots' legends name the arenas
        // ("VMM reservation 0x7c0500000000 pid 4194305 GPU 12"), the longest labels a page has.
        let base = 0x7c00_0000_0000 + u64::from(k) * (1 << 40);
        evs.push(on12(pid, ts + 2000, Event::vmm_reserve(base, 64 << 20, 0, 0)));
        evs.push(on12(pid, ts + 3000, Event::vmm_create(Api::cuMemCreate, u64::from(k) + 1, 2 << 20)));
        evs.push(on12(pid, ts + 4000, Event::vmm_map(base, 2 << 20, u64::from(k) + 1, 0)));
    }
    w.write_events(&evs).expect("write");
    let bytes = w.finish().expect("finish");
    let report = analyze_bytes("long.vhc", &bytes, &Options::default()).expect("analyze");
    let dir = tempfile::tempdir().expect("tempdir");
    let got = measure(
        dir.path(),
        "legends",
        &html::render(&report),
        "let labels=0,overlaps=[];document.querySelectorAll('svg[data-plot]').forEach(svg=>{\
           const b=[...svg.querySelectorAll('text.legend')].map(t=>t.getBoundingClientRect());labels+=b.length;\
           for(let i=0;i<b.length;i++)for(let j=i+1;j<b.length;j++){const p=b[i],q=b[j];\
             if(p.left<q.right&&q.left<p.right&&p.top<q.bottom&&q.top<p.bottom)overlaps.push([svg.getAttribute('data-plot'),i,j]);}});\
         return {labels:labels,overlaps:overlaps,fit:document.querySelectorAll('svg[data-plot^=plot-fit-] text.legend').length};",
    );
    assert!(got["labels"].as_u64().unwrap_or(0) >= 12, "{got}");
    // The fit plots (one per process and device, each naming it) are among those checked.
    assert!(got["fit"].as_u64().unwrap_or(0) >= 12, "two legend labels per fit plot: {got}");
    assert_eq!(got["overlaps"].as_array().map(Vec::len), Some(0), "{got}");
}
