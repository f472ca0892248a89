//! Timelines: the live-bytes grid, the samples that fill the per-process, per-device and
//! per-arena series, and the reports made of them.

use super::*;

impl Replayer {
    /// Moves how the model's totals (tracked processes, devices) moved since the last call
    /// into their timelines, at time `now`. Each window's lowest and highest value land in
    /// the bucket where the window began, which is where following every event would have
    /// put them: a window never crosses a bucket edge, since the first event past the next
    /// edge of the shared [`Grid`] flushes before it is applied.
    pub(super) fn flush(&mut self, now: u64) {
        let width = self.grid.width;
        for &slot in &self.tracked_slots {
            let Some(Some(t)) = self.procs.get_mut(slot) else { continue };
            if let Some((live, window)) = self.model.take_process_window(slot) {
                if let Some(w) = window {
                    t.series.coarsen_to(width);
                    push_window(&mut t.series, w, live);
                }
                t.last = live;
            }
        }
        for w in self.model.take_device_windows() {
            let Some(i) = self.device_track(w.device) else { continue };
            let dt = &mut self.devs[i];
            if let Some(window) = w.window {
                if dt.live.is_empty() {
                    dt.live = self.grid.series();
                }
                dt.live.coarsen_to(width);
                push_window(&mut dt.live, window, w.live);
            }
            dt.last_live = w.live;
            dt.peak_live = w.peak;
        }
        self.flush_at = self.grid.next_edge(now);
    }

    /// Records the model's numbers now, and schedules the next sample so that sampling
    /// costs a bounded fraction of the replay (`snapshot` is O(live state)).
    pub(crate) fn sample(&mut self, ts: u64) {
        let snap = self.model.snapshot_numbers();
        self.sample_from(&snap, ts);
    }

    pub(super) fn sample_from(&mut self, snap: &ModelSnapshot, ts: u64) {
        let live = self.model.live_allocation_count() as u64;
        let state = live * 2 + snap.processes.len() as u64 + snap.arenas.len() as u64;
        // The pace follows the state's size: small states every event, large ones every ~4×
        // their size, and never more than ~2,000 samples per doubling of the event count.
        // (A sample costs O(processes + arenas): `snapshot_numbers` skips the histograms.)
        let stride = if state < 128 { 1 } else { state * 4 }.max(self.applied / 2048);
        self.next_sample = self.applied + stride;
        self.fit_sample(snap, ts);
        let mut total_live = 0u64;
        if self.procs.len() < snap.processes.len() {
            self.procs.resize_with(snap.processes.len(), || None);
        }
        for (slot, p) in snap.processes.iter().enumerate() {
            total_live = total_live.saturating_add(p.live_bytes);
            if self.procs[slot].is_none() && (p.live_bytes != 0 || p.alive) {
                if self.tracked_slots.len() >= MAX_TRACKED_PROCS {
                    self.tracked_overflow = true;
                    continue;
                }
                self.tracked_slots.push(slot);
                let series = self.grid.series();
                self.procs[slot] = Some(ProcTrack { pid: p.pid, series, last: u64::MAX });
            }
        }
        // What moved since the last flush lands before this sample's values (new tracks get
        // their process's history since it began).
        self.flush(ts);
        let width = self.grid.width;
        for (slot, p) in snap.processes.iter().enumerate() {
            let Some(Some(t)) = self.procs.get_mut(slot) else { continue };
            if t.last == 0 && p.live_bytes == 0 && !p.alive {
                continue;
            }
            t.series.coarsen_to(width);
            t.series.push(ts, p.live_bytes as f64);
            t.last = p.live_bytes;
        }
        for d in &snap.devices {
            let Some(i) = self.device_track(d.ordinal) else { continue };
            let t = &mut self.devs[i];
            if d.total.is_some() {
                t.total = d.total;
            }
        }
        for t in self.devs.iter_mut() {
            if t.last_live != 0 || t.live.is_empty() {
                if t.live.is_empty() {
                    t.live = self.grid.series();
                }
                t.live.coarsen_to(width);
                t.live.push(ts, t.last_live as f64);
            }
        }
        for a in &snap.arenas {
            let key = (a.pid, a.device, a.kind, a.base);
            if !self.arenas.contains_key(&key) {
                if self.arenas.len() >= MAX_TRACKED_ARENAS {
                    continue;
                }
                let n = self.opts.max_points;
                self.arenas.insert(
                    key,
                    ArenaTrack {
                        pid: a.pid,
                        device: a.device,
                        kind: a.kind,
                        base: a.base,
                        size: a.size,
                        frag: Series::new(n),
                        largest: Series::new(n),
                        free: Series::new(n),
                    },
                );
            }
            if let Some(t) = self.arenas.get_mut(&key) {
                t.size = t.size.max(a.size);
                t.frag.push(ts, a.fragmentation);
                t.largest.push(ts, a.largest_free_span as f64);
                t.free.push(ts, a.free_in_arena as f64);
            }
        }
        if !self.layout_fixed
            && total_live > 0
            && total_live > self.peak_captured.saturating_add(self.peak_captured / 10)
        {
            self.peak_captured = total_live;
            if ts >= self.from_abs {
                self.capture_layout(ts, LayoutReason::Peak);
            }
        }
    }

    pub(crate) fn arena_reports(&self) -> Vec<ArenaReport> {
        self.arenas
            .values()
            .filter(|a| self.pid_selected(a.pid))
            .map(|a| ArenaReport {
                pid: self.view_pid(a.pid),
                device: a.device,
                kind: a.kind,
                base: a.base,
                size: a.size,
                max_fragmentation: a.frag.max().unwrap_or(0.0),
                min_largest_free_span: a.largest.points().iter().map(|p| p.min as u64).min().unwrap_or(0),
                fragmentation: a.frag.points_in(self.from_abs, self.to_abs),
                largest_free_span: a.largest.points_in(self.from_abs, self.to_abs),
                free_in_arena: a.free.points_in(self.from_abs, self.to_abs),
            })
            .collect()
    }

    /// The framework caches' timelines, each named with its process's command.
    pub(crate) fn framework_timelines(&self, command: impl Fn(u32) -> String) -> Vec<FrameworkTimeline> {
        let (from, to) = (self.from_abs, self.to_abs);
        self.frameworks
            .iter()
            .filter(|((pid, _, _, _), _)| self.pid_selected(*pid))
            .map(|((pid, device, code, _), t)| FrameworkTimeline {
                pid: *pid,
                command: command(*pid),
                device: *device,
                framework: vramhook_protocol::record::FrameworkId::from_code(*code)
                    .unwrap_or_default()
                    .name()
                    .to_string(),
                source: t.source.to_string(),
                samples: t.samples,
                reserved_bytes: t.reserved.points_in(from, to),
                allocated_bytes: t.allocated.points_in(from, to),
                largest_free_block: t.largest.points_in(from, to),
                fragmentation: t.frag.points_in(from, to),
                ooms: t.ooms.iter().filter(|o| o.ts_ns >= from && o.ts_ns <= to).cloned().collect(),
            })
            .collect()
    }

    pub(crate) fn proc_series(&self, slot: usize) -> Option<&Series> {
        self.procs.get(slot)?.as_ref().map(|t| &t.series)
    }

    /// The device where the process held the most (its peak), and all devices it used.
    pub(crate) fn proc_main_device(&self, slot: usize) -> (i16, Vec<i16>) {
        let peaks: Vec<(i16, u64)> = self.model.device_peaks_at(slot).filter(|d| d.1 > 0).collect();
        let main = peaks.iter().max_by_key(|d| (d.1, std::cmp::Reverse(d.0))).map_or(-1, |d| d.0);
        let mut devs: Vec<i16> = peaks.iter().map(|d| d.0).collect();
        devs.sort_unstable();
        (main, devs)
    }

    pub(crate) fn device_reports(&self) -> (Vec<DeviceReport>, Vec<DeviceTimeline>) {
        let mut reps = Vec::new();
        let mut tls = Vec::new();
        let mut order: Vec<&DevTrack> = self.devs.iter().collect();
        order.sort_by_key(|t| t.device);
        for t in order {
            reps.push(DeviceReport {
                device: t.device,
                total_bytes: t.total,
                free_bytes: t.free_latest,
                min_free_bytes: t.min_free,
                peak_live_bytes: t.peak_live,
            });
            tls.push(DeviceTimeline {
                device: t.device,
                total_bytes: t.total,
                live_bytes: t.live.points_in(self.from_abs, self.to_abs),
                free_bytes: t.free.points_in(self.from_abs, self.to_abs),
            });
        }
        (reps, tls)
    }

    pub(crate) fn tracked_overflow(&self) -> bool {
        self.tracked_overflow
    }

    pub(crate) fn track_pid(&self, slot: usize) -> Option<u32> {
        self.procs.get(slot)?.as_ref().map(|t| t.pid)
    }
}

/// The time grid of the live-bytes timelines: one origin and one bucket width for all, the
/// width doubling as the replay's span grows so that a timeline never needs more than its
/// `cap` buckets. Shared edges mean one flush per edge serves every timeline, and a
/// time-driven width bounds the flushes (about `cap / 2` per doubling of the span) whatever
/// the processes do.
#[derive(Clone, Copy)]
pub(super) struct Grid {
    origin: u64,
    width: u64,
    cap: u64,
}

impl Default for Grid {
    fn default() -> Self {
        Grid { origin: 0, width: 1000, cap: crate::series::DEFAULT_POINTS as u64 }
    }
}

impl Grid {
    /// A grid from `origin` of 1 µs buckets, at most `cap` of them (buckets widen to fit).
    pub(super) fn starting_at(origin: u64, cap: u64) -> Grid {
        Grid { origin, width: 1000, cap }
    }

    pub(super) fn series(&self) -> Series {
        Series::on_grid(self.cap as usize, self.origin, self.width)
    }

    /// Widens the grid for time `now` if needed; returns the next edge after `now`.
    pub(super) fn next_edge(&mut self, now: u64) -> u64 {
        let span = now.saturating_sub(self.origin);
        while span / self.width >= self.cap {
            self.width = self.width.saturating_mul(2);
        }
        self.origin.saturating_add((span / self.width + 1).saturating_mul(self.width))
    }
}

/// A window of a total into its timeline: its extremes where it began, then its value now.
pub(super) fn push_window(series: &mut Series, w: vramhook_model::Window, live: u64) {
    series.push(w.since_ns, w.min as f64);
    series.push(w.since_ns, w.max as f64);
    series.push(w.since_ns, live as f64);
}
