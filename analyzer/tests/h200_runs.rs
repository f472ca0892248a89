//! Real captures from the GPU runs of 2026-12-05 (`tests/fixtures/h200-holders/`,
//! `h200-raise/`, `h200-fit/`, and `h100-fit/` from an H100; their README says how each was
//! made): replayed offline, they must give what the agent and `vramhook run` said live on
//! the GPU machine.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use vramhook_analyzer::{analyze, Options};

const GIB: u64 = 1 << 30;

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(path)
}

fn report(paths: &[&str]) -> Value {
    let files: Vec<PathBuf> = paths.iter().map(|p| fixture(p)).collect();
    serde_json::to_value(analyze(&files, &Options::default()).expect("analyze")).expect("JSON")
}

fn ooms(r: &Value) -> &Vec<Value> {
    r["ooms"].as_array().expect("ooms")
}

/// The first incident whose failed call asked the driver for `bytes`.
fn oom_asking(r: &Value, bytes: u64) -> &Value {
    ooms(r).iter().find(|o| o["requested_bytes"] == bytes).unwrap_or_else(|| panic!("no OOM of {bytes} bytes"))
}

/// The incidents whose framework asked for `bytes` (the framework's request, not the driver's).
fn framework_ooms_asking(r: &Value, bytes: u64) -> Vec<&Value> {
    ooms(r).iter().filter(|o| o["framework_oom"]["requested"].as_u64() == Some(bytes)).collect()
}

/// The asker's 100 GiB request in a holders run: whether the holder is seen or not, another
/// process holds the memory.
fn the_askers_oom(path: &str) -> Value {
    let r = report(&[path]);
    let o = oom_asking(&r, 100 * GIB).clone();
    assert_eq!(o["verdict"], "other_process", "{}", o["explanation"]);
    o
}

/// Another process's idle PyTorch cache (60 GiB reserved, 0 allocated), seen through its
/// lens: `other_process`, naming it, its releasable bytes = memory_reserved() −
/// memory_allocated() to the byte.
#[test]
fn another_process_idle_cache_through_its_lens_is_other_process() {
    let o = the_askers_oom("h200-holders/lens_agent.vrhk");
    let h = &o["holders"][0];
    assert_eq!((h["pid"].as_u64(), h["sight"].as_str()), (Some(546), Some("lens")), "{h}");
    assert_eq!(h["releasable_bytes"], 64_424_509_440u64);
    assert!(o["fix"].as_str().unwrap_or("").contains("torch.cuda.empty_cache() in that process"), "{}", o["fix"]);
}

#[test]
fn another_process_cache_without_its_lens_is_other_process_not_visible() {
    let o = the_askers_oom("h200-holders/nolens_agent.vrhk");
    assert_eq!(o["holders"][0]["sight"], "cache_not_visible", "{}", o["holders"]);
    assert_eq!(o["holders"][0]["not_visible_bytes"], 64_424_509_440u64);
}

/// The holder untraced, the asker alone under `vramhook run`: NVML named the holder, and
/// the capture carries that answer.
#[test]
fn an_untraced_holder_is_named_from_nvml_in_the_capture() {
    let o = the_askers_oom("h200-holders/run_asker.vhc");
    let h = &o["holders"][0];
    assert_eq!((h["sight"].as_str(), h["nvml_bytes"].as_u64()), (Some("untraced"), Some(64_967_671_808)), "{h}");
}

/// PyTorch's own message of the same failure ("Process 546 has 60.51 GiB memory in use").
#[test]
fn the_askers_crash_log_agrees() {
    let r = report(&["h200-holders/lens_asker.log"]);
    let li = &r["log_incidents"][0];
    assert_eq!(li["verdict"], "other_process", "{li}");
}

#[test]
fn jax_default_preallocation_fatal_request_is_framework_fragmentation_with_xlas_numbers() {
    let r = report(&["h200-raise/jax_frag.vhc"]);
    let fatal = framework_ooms_asking(&r, 2 * GIB);
    assert_eq!(fatal.len(), 1, "one incident for the 2 GiB request");
    assert_eq!(fatal[0]["verdict"], "framework_fragmentation", "{}", fatal[0]["explanation"]);
    // XLA's memory_stats() just before: bytes_in_use 55,834,574,848, largest free block
    // 1,073,742,336 (scripts/gpu/raise/programs.py's "before" line).
    assert_eq!(fatal[0]["framework_oom"]["allocated"], 55_834_574_848u64);
    assert_eq!(fatal[0]["framework_oom"]["largest_free_block"], 1_073_742_336u64);
}

#[test]
fn cupys_request_after_it_freed_its_cache_is_recovered_and_its_fatal_one_failed() {
    let r = report(&["h200-raise/cupy_recover.vhc"]);
    let o = oom_asking(&r, 3 * GIB);
    assert_eq!(o["outcome"], "recovered", "{o}");
    let r = report(&["h200-raise/cupy_fatal.vhc"]);
    let o = ooms(&r).iter().rfind(|o| o["requested_bytes"] == 3 * GIB).expect("the 3 GiB request");
    assert_eq!(o["outcome"], "failed", "{o}");
    assert_eq!(o["framework"], "cupy");
}

/// Under set_per_process_memory_fraction(0.03) ("4.19 GiB allowed"): capacity of the limit,
/// named, in the capture and from PyTorch's message.
#[test]
fn a_request_over_the_frameworks_limit_is_capacity_naming_it() {
    let r = report(&["h200-raise/torch_fraction.vhc"]);
    let o = ooms(&r).last().expect("the incident");
    assert_eq!(o["verdict"], "capacity", "{}", o["explanation"]);
    assert_eq!(o["framework_limit"], 4_503_296_409u64);
    let r = report(&["h200-raise/torch_fraction.log"]);
    let li = &r["log_incidents"][0];
    assert_eq!(li["verdict"], "capacity", "{li}");
    assert!(li["explanation"].as_str().unwrap_or("").contains("limit"), "{li}");
}

/// With PyTorch's memory history on, the lens's record joins the driver's failure: one
/// incident for the fatal 2 GiB request.
#[test]
fn with_the_memory_history_on_the_failure_is_one_incident() {
    let r = report(&["h200-raise/torch_history.vhc"]);
    let fatal = framework_ooms_asking(&r, 2 * GIB);
    assert_eq!(fatal.len(), 1, "{:?}", ooms(&r).iter().map(|o| &o["verdict"]).collect::<Vec<_>>());
    assert_eq!(fatal[0]["verdict"], "framework_fragmentation");
}

/// The serving loop (scripts/gpu/fit/serve.py): the fit of its 1.95 GiB request went below 1
/// 9.99 s before a 980 MiB chat request failed, as the agent saw it live (9.1 s, read each
/// second); the failure is the cache's fragmentation.
#[test]
fn the_serving_loops_fit_went_below_one_before_its_oom() {
    let r = report(&["h200-fit/serving_fragmented.vrhk"]);
    let o = oom_asking(&r, 1_027_604_480);
    assert_eq!(o["verdict"], "framework_fragmentation", "{}", o["explanation"]);
    let w = &r["fit_warnings"][0];
    assert_eq!(w["demand_bytes"], 2_097_152_000u64, "{w}");
    assert_eq!(w["limited_by"], "framework_fragmentation");
    assert_eq!(w["came_bytes"], 1_027_604_480u64, "a smaller request failed first");
    let lead = w["came_ts_ns"].as_u64().expect("came") - w["since_ts_ns"].as_u64().expect("since");
    assert!((9_000_000_000..11_000_000_000).contains(&lead), "lead {lead} ns");
}

const S: u64 = 1_000_000_000;

/// The report of a fixture with the forecast the GPU script asks for (`--fit-trend 60s,5min,10s`).
fn forecast(path: &str) -> vramhook_analyzer::Report {
    let rule = vramhook_model::trend::TrendRule { window_ns: 60 * S, horizon_ns: 300 * S, hold_ns: 10 * S };
    analyze(&[fixture(path)], &Options { fit_trend: Some(rule), ..Options::default() }).expect("analyze")
}

/// The same capture through the forecast (`--fit-trend 60s,5min,10s`): its first warning
/// fired while the loop was still filling the device (its supply falling by gigabytes a
/// second), not from the fragmentation a minute later; the control (not kept: 6.5 MB) was
/// warned the same way (docs/live.md), which is why the forecast is off by default.
#[test]
fn the_forecast_of_the_serving_loop_fired_in_its_fill() {
    let r = forecast("h200-fit/serving_fragmented.vrhk");
    let first = r.fit_trend_warnings.first().expect("a forecast warning");
    let start = r.time.first_ts_ns;
    assert!(first.fired_ts_ns - start < 50 * S, "fired in the fill: +{} s", (first.fired_ts_ns - start) / S);
    assert!(first.slope_bytes_per_s < -((1u64 << 30) as f64), "the fill: {} B/s", first.slope_bytes_per_s);
    assert_eq!(first.came_bytes, Some(1_027_604_480), "it held to the failure: {first:?}");
    common::assert_valid(&r);
    let html = vramhook_analyzer::render::html::render(&r);
    assert!(html.contains("<p class=note id=fit-forecast-0>Forecast: pid 1379"), "the forecast under the fit plot");
}

/// The serving loop with its sessions released in order (H100): the caching allocator
/// fragmented anyway and the long document's own 1.95 GiB request failed; the fit was below
/// 1 for it 24.7 s before (23.7 s live). The forecast fired in the fill and cleared, then
/// fired again 88 s before the failure: the one run of three where it came a minute ahead.
#[test]
fn the_in_order_loop_failed_too_and_the_fit_and_forecast_foresaw_it() {
    let r = forecast("h100-fit/serving_fifo.vrhk");
    let o = r.ooms.first().expect("the OOM");
    assert_eq!(o.incident.requested_bytes, 2_097_152_000, "the long document's request");
    assert_eq!(o.incident.verdict.name(), "framework_fragmentation", "{}", o.incident.explanation);
    let w = r.fit_warnings.first().expect("a fit warning");
    assert_eq!((w.demand_bytes, w.came_bytes), (2_097_152_000, Some(2_097_152_000)), "{w:?}");
    let lead = w.came_ts_ns.expect("came") - w.since_ts_ns;
    assert!((20 * S..30 * S).contains(&lead), "lead {lead} ns");
    let [fill, ahead] = &r.fit_trend_warnings[..] else { panic!("two forecasts: {:?}", r.fit_trend_warnings) };
    assert!(fill.cleared_ts_ns.is_some() && fill.came_ts_ns.is_none(), "the fill's cleared: {fill:?}");
    let forecast_lead = ahead.came_ts_ns.expect("came") - ahead.fired_ts_ns;
    assert!((80 * S..95 * S).contains(&forecast_lead), "forecast lead {forecast_lead} ns");
    assert_eq!(ahead.demand_bytes, 2_097_152_000);
}
