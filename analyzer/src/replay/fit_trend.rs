//! The fit's trend rule over the replay: at each fit sample, the least-squares line through
//! the process's supply over the rule's window, followed to its horizon
//! (`vramhook_model::trend`, Prometheus's `predict_linear`); where it falls short of the
//! demand for the rule's hold, a warning, as a `predict_linear` alert rule would fire live
//! from the agent's series. The now-cast (`fit`) says a request would fail now; this says
//! where the supply is headed. Off unless asked for (`analyze --fit-trend`): on the GPU
//! serving loops it warned their controls as often as the failing runs (docs/live.md).

use super::fit::{MAX_FIT_TRACKS, MAX_FIT_WARNINGS};
use super::Replayer;
use crate::report::FitTrendWarning;
use std::collections::{BTreeMap, VecDeque};
use vramhook_model::trend::{predict_linear, slope_per_second};
use vramhook_model::ProcessFit;

/// Supply samples kept per (process, device) within the window: past this many, a sample
/// closer than window / this to the one before is left out (the line barely moves, the cost
/// of each forecast stays bounded on a capture with a sample per event). Pairs followed and
/// warnings kept are bounded as the fit's are.
const MAX_TREND_SAMPLES: usize = 512;

/// A forecast falling short since `since`, and where it had held for the hold.
struct ShortRun {
    since: u64,
    fired: Option<FitTrendWarning>,
}

#[derive(Default)]
pub(crate) struct TrendTracks {
    samples: BTreeMap<(u32, i16), VecDeque<(u64, f64)>>,
    runs: BTreeMap<(u32, i16), ShortRun>,
    warnings: Vec<FitTrendWarning>,
}

impl Replayer {
    /// One fit sample of `key` at `ts`: the forecast, and the run it starts, holds or ends.
    pub(super) fn trend_sample(&mut self, key: (u32, i16), ts: u64, f: &ProcessFit) {
        let Some(rule) = self.opts.fit_trend else { return };
        let tracks = &mut self.trends;
        if !tracks.samples.contains_key(&key) && tracks.samples.len() >= MAX_FIT_TRACKS {
            return;
        }
        let samples = tracks.samples.entry(key).or_default();
        let spacing = rule.window_ns / MAX_TREND_SAMPLES as u64;
        if samples.len() < MAX_TREND_SAMPLES || samples.back().is_none_or(|b| ts.saturating_sub(b.0) >= spacing) {
            samples.push_back((ts, f.supply_bytes as f64));
        }
        // Prometheus's range `[window]` at `ts`: samples after ts − window, up to ts.
        while samples.front().is_some_and(|s| s.0.saturating_add(rule.window_ns) <= ts) {
            samples.pop_front();
        }
        let all: &[(u64, f64)] = samples.make_contiguous();
        let forecast = predict_linear(all, ts, rule.horizon_ns);
        let short = forecast.is_some_and(|v| v < f.demand_bytes as f64);
        if !short {
            if let Some(run) = tracks.runs.remove(&key) {
                if let Some(mut w) = run.fired {
                    w.cleared_ts_ns = Some(ts);
                    self.trend_warning(w);
                }
            }
            return;
        }
        let run = tracks.runs.entry(key).or_insert(ShortRun { since: ts, fired: None });
        if run.fired.is_none() && ts.saturating_sub(run.since) >= rule.hold_ns {
            run.fired = Some(FitTrendWarning {
                pid: key.0,
                command: String::new(),
                device: key.1,
                since_ts_ns: run.since,
                fired_ts_ns: ts,
                demand_bytes: f.demand_bytes,
                demand_source: f.demand_source.name().to_string(),
                supply_bytes: f.supply_bytes,
                forecast_bytes: forecast.unwrap_or(0.0),
                slope_bytes_per_s: slope_per_second(all).unwrap_or(0.0),
                horizon_ns: rule.horizon_ns,
                cleared_ts_ns: None,
                came_ts_ns: None,
                came_bytes: None,
            });
        }
    }

    /// A request failed out of memory on the device: a warning that had fired foresaw it; a
    /// run still within its hold had not fired yet (and ends: the failure's own retries make
    /// the next runs).
    pub(super) fn trend_failure(&mut self, pid: u32, device: i16, ts: u64, size: u64) {
        if let Some(run) = self.trends.runs.remove(&(pid, device)) {
            if let Some(mut w) = run.fired {
                w.came_ts_ns = Some(ts);
                w.came_bytes = Some(size);
                self.trend_warning(w);
            }
        }
    }

    /// At the end: the warnings, with those still holding.
    pub(crate) fn fit_trend_finish(&mut self) -> Vec<FitTrendWarning> {
        for (_, run) in std::mem::take(&mut self.trends.runs) {
            if let Some(w) = run.fired {
                self.trend_warning(w);
            }
        }
        let mut all = std::mem::take(&mut self.trends.warnings);
        all.sort_by_key(|w| (w.fired_ts_ns, w.pid, w.device));
        all
    }

    fn trend_warning(&mut self, mut w: FitTrendWarning) {
        if self.trends.warnings.len() >= MAX_FIT_WARNINGS || !self.pid_selected(w.pid) {
            return;
        }
        // A run that starts with a failure's own retry (its size made the demand) is that
        // failure's, not a forecast of it.
        if self.fit_same_incident(w.pid, w.device, w.since_ts_ns) {
            return;
        }
        w.command = self.fit_command(w.pid);
        w.pid = self.view_pid(w.pid);
        self.trends.warnings.push(w);
    }
}
