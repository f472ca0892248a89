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
    // The first plot sits in the top 600 pixels: count series blue and OOM red there.
    let (mut blue, mut red, mut ink) = (0, 0, 0);
    for y in 100..600.min(h) {
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
    assert!(ink > 5000, "the top of the page is nearly blank: {ink}");
}
