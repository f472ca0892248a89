//! The fit of each process's next large request over the replay (issue #30): when it went
//! below 1 and stayed there until a request that large came and failed. Followed at the
//! replay's samples (its pace: every event for a small state, coarser for a large one), so
//! a crossing's time is that of the first sample that saw it.

use super::Replayer;
use crate::report::{FitCrossing, FitTimeline, FitWarning};
use crate::series::Series;
use std::collections::BTreeMap;
use vramhook_model::ModelSnapshot;

/// Crossings kept (the first ones).
pub(super) const MAX_FIT_WARNINGS: usize = 1000;
/// (Process, device) timelines kept (the first seen); each is bounded by `max_points`.
pub(super) const MAX_FIT_TRACKS: usize = 256;
/// Crossings kept per timeline (the first ones).
const MAX_CROSSINGS: usize = 1000;

/// One (process, device)'s fit over the replay: its ratio at each sample, and where it
/// crossed 1.
struct FitTrack {
    ratio: Series,
    crossings: Vec<FitCrossing>,
    /// The side of 1 it was on at the last sample (below: true).
    below: bool,
}

/// The start of a run below 1: when, the demand and its source, the supply, what limited it.
type Run = (u64, u64, &'static str, u64, Option<&'static str>);

/// Per (pid, device): the run below 1 in progress, if any.
#[derive(Default)]
pub(crate) struct FitTracks {
    below: BTreeMap<(u32, i16), Run>,
    pub(crate) warnings: Vec<FitWarning>,
    commands: BTreeMap<u32, String>,
    /// The last failure, per (pid, device): the runs that start within the incident window
    /// after it are the same incident (its retries, the lens's record).
    came: BTreeMap<(u32, i16), u64>,
    /// The timelines the HTML report plots, from the same samples as the warnings.
    tracks: BTreeMap<(u32, i16), FitTrack>,
}

impl Replayer {
    /// Follows the fits of a sample's live processes.
    pub(super) fn fit_sample(&mut self, snap: &ModelSnapshot, ts: u64) {
        for p in snap.processes.iter().filter(|p| p.alive) {
            self.fit_process(p, ts);
        }
    }

    /// A lens's stats close its sample: the fit of that process now, between the replay's
    /// paced samples. A caching framework calls the driver rarely, so the paced samples
    /// alone can miss a crossing by minutes (the H200 serving loop's capture, 900 events in
    /// 2.5 minutes, had 4 of them); its lens samples once a second.
    pub(super) fn fit_after_lens(&mut self, pid: u32, ts: u64) {
        if let Some((_, view)) = self.model.process_view(pid, 0, false) {
            self.fit_process(&view, ts);
        }
    }

    fn fit_process(&mut self, p: &vramhook_model::ProcessView, ts: u64) {
        if !p.fit.is_empty() {
            self.fits.commands.entry(p.pid).or_insert_with(|| {
                if p.command.is_empty() {
                    p.exe.clone()
                } else {
                    p.command.clone()
                }
            });
        }
        for f in &p.fit {
            let key = (p.pid, f.device);
            self.fit_track(key, ts, f);
            self.trend_sample(key, ts, f);
            if f.fit_ratio < 1.0 {
                let limit = f.limited_by.map(|l| l.name());
                self.fits.below.entry(key).or_insert((
                    ts,
                    f.demand_bytes,
                    f.demand_source.name(),
                    f.supply_bytes,
                    limit,
                ));
            } else {
                self.fits.below.remove(&key);
            }
        }
    }

    /// Adds a sample to the timeline of `key`, noting a crossing of 1 (the first sample
    /// below 1 is one: it was not known to be below before).
    fn fit_track(&mut self, key: (u32, i16), ts: u64, f: &vramhook_model::ProcessFit) {
        let below = f.fit_ratio < 1.0;
        if !self.fits.tracks.contains_key(&key) {
            if self.fits.tracks.len() >= MAX_FIT_TRACKS {
                return;
            }
            let ratio = Series::new(self.opts.max_points);
            self.fits.tracks.insert(key, FitTrack { ratio, crossings: Vec::new(), below: false });
        }
        let Some(t) = self.fits.tracks.get_mut(&key) else { return };
        t.ratio.push(ts, f.fit_ratio);
        if below != t.below && t.crossings.len() < MAX_CROSSINGS {
            t.crossings.push(FitCrossing {
                ts_ns: ts,
                below,
                fit_ratio: f.fit_ratio,
                demand_bytes: f.demand_bytes,
                supply_bytes: f.supply_bytes,
            });
        }
        t.below = below;
    }

    /// The fit timelines of the selected processes within the report's window.
    pub(crate) fn fit_timelines(&self) -> Vec<FitTimeline> {
        let (from, to) = (self.from_abs, self.to_abs);
        self.fits
            .tracks
            .iter()
            .filter(|((pid, _), _)| self.pid_selected(*pid))
            .map(|(&(pid, device), t)| FitTimeline {
                pid: self.view_pid(pid),
                command: self.fits.commands.get(&pid).cloned().unwrap_or_default(),
                device,
                fit_ratio: t.ratio.points_in(from, to),
                crossings: t.crossings.iter().filter(|c| c.ts_ns >= from && c.ts_ns <= to).cloned().collect(),
            })
            .filter(|t| !t.fit_ratio.is_empty())
            .collect()
    }

    /// A process's request failed out of memory on `device` at `ts`: a run below 1 in
    /// progress foresaw it.
    pub(super) fn fit_failure(&mut self, pid: u32, device: i16, ts: u64, size: u64) {
        self.trend_failure(pid, device, ts, size);
        if let Some(run) = self.fits.below.remove(&(pid, device)) {
            if !self.fit_same_incident(pid, device, run.0) {
                self.fit_warning(pid, device, run, Some((ts, size)));
            }
        }
        // Every failure, foreseen or not: a run that starts with it (the failed call made the
        // demand, its own size, and the sample after it saw it short) warned of nothing and
        // ends at its retry.
        self.fits.came.insert((pid, device), ts);
    }

    /// At the end: runs still in progress, with no request that large since.
    pub(crate) fn fit_finish(&mut self) -> Vec<FitWarning> {
        for ((pid, device), run) in std::mem::take(&mut self.fits.below) {
            if !self.fit_same_incident(pid, device, run.0) {
                self.fit_warning(pid, device, run, None);
            }
        }
        std::mem::take(&mut self.fits.warnings)
    }

    /// A run that starts within the incident window after a failure it foresaw belongs to it.
    pub(super) fn fit_same_incident(&self, pid: u32, device: i16, since: u64) -> bool {
        let window = self.opts.model.incident_window_ns;
        self.fits.came.get(&(pid, device)).is_some_and(|c| since >= *c && since - c <= window)
    }

    /// The command line of a process with a fit (its executable where it had none).
    pub(super) fn fit_command(&self, pid: u32) -> String {
        self.fits.commands.get(&pid).cloned().unwrap_or_default()
    }

    fn fit_warning(&mut self, pid: u32, device: i16, run: Run, came: Option<(u64, u64)>) {
        let (since, demand, source, supply, limit) = run;
        if self.fits.warnings.len() >= MAX_FIT_WARNINGS || !self.pid_selected(pid) {
            return;
        }
        self.fits.warnings.push(FitWarning {
            pid: self.view_pid(pid),
            command: self.fit_command(pid),
            device,
            since_ts_ns: since,
            demand_bytes: demand,
            demand_source: source.to_string(),
            supply_bytes: supply,
            limited_by: limit.map(str::to_string),
            came_ts_ns: came.map(|c| c.0),
            came_bytes: came.map(|c| c.1),
        });
    }
}
