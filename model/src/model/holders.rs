//! Other processes' memory on a device: who holds it, and how much of it they could give
//! back (releasable), could not without a restart (stranded), cannot be seen into (a
//! caching framework without a lens), or use (live). NVML's per-process usage names the
//! processes vramhook does not trace.

use super::*;

/// An NVML sample that arrives this long after a failure still describes it (the agent
/// reads NVML when it sees the failure, a poll later).
const GPU_SAMPLE_AFTER_FAILURE_NS: u64 = 2_000_000_000;
/// An NVML sample older than this at a failure is not used for it.
const GPU_SAMPLE_FRESH_NS: u64 = 30_000_000_000;
/// Holders listed per incident (the rest are summed into the last entry's device bytes
/// through the verdict's totals only).
const HOLDERS_LISTED: usize = 16;

/// NVML's per-process usage on one device, as one reader sample.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct GpuSample {
    seq: u64,
    ts: u64,
    /// (pid, bytes, command name)
    entries: Vec<(u32, u64, String)>,
}

/// What a process holds on one device, by how it could be had.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct HeldBytes {
    pub held: u64,
    pub releasable: u64,
    pub stranded: u64,
    pub not_visible: u64,
    pub seen: bool,
}

impl Model {
    /// One entry of an NVML sample (`gpu_process`): a new sample number on the device
    /// replaces the previous list. Incidents on the device that failed shortly before get
    /// their holders again.
    pub(super) fn on_gpu_process(&mut self, ev: &Event) {
        let device = ev.device;
        let pid = ev.gpu_holder();
        let entry = self.gpu_samples.entry(device).or_default();
        if entry.seq != ev.seq || entry.entries.is_empty() && entry.ts == 0 {
            *entry = GpuSample { seq: ev.seq, ts: ev.ts_ns, entries: Vec::new() };
        }
        // A sample lists at most what its count says (a hostile capture cannot grow it).
        if pid != 0 && entry.entries.len() < (ev.tid as usize).min(4096) {
            entry.entries.push((pid, ev.size.min(MAX_POOL_SAMPLE), ev.gpu_holder_name()));
        }
        if pid != 0 && entry.entries.len() < ev.tid as usize {
            return; // more of this sample to come
        }
        let ts = ev.ts_ns;
        let stale: Vec<usize> = self
            .incidents
            .iter()
            .enumerate()
            .filter(|(_, i)| {
                i.view.device == device && ts >= i.view.ts_ns && ts - i.view.ts_ns <= GPU_SAMPLE_AFTER_FAILURE_NS
            })
            .map(|(k, _)| k)
            .collect();
        for idx in stale {
            if self.incidents[idx].inputs.unjudged || !self.judge_allowance_left() {
                continue;
            }
            let (slot, at) = (self.incidents[idx].slot, self.incidents[idx].view.ts_ns);
            let mut visits = 0;
            let holders = self.holders_at(slot, device, at, &mut visits);
            self.judge_visits = self.judge_visits.saturating_add(visits);
            let inc = &mut self.incidents[idx];
            inc.inputs.holders = holders.clone();
            inc.view.holders = holders;
            self.decide(idx);
        }
    }

    /// What the process at `slot` holds on `device` at `ts`, by how it could be had.
    pub(super) fn held_by(&self, slot: usize, device: i16, ts: u64) -> HeldBytes {
        self.held_by_counted(slot, device, ts, &mut 0)
    }

    /// [`Model::held_by`], adding the pools and segments it looked at to `visits`.
    fn held_by_counted(&self, slot: usize, device: i16, ts: u64, visits: &mut u64) -> HeldBytes {
        let g = self.config.granularity;
        let p = &self.procs[slot];
        let pid = p.pid;
        let mut h = HeldBytes::default();
        let mut pool_idle = 0u64;
        for (_, pool) in self.pools.range((pid, false, 0)..=(pid, true, u64::MAX)).filter(|(_, pl)| pl.device == device)
        {
            *visits += 1;
            pool_idle = pool_idle.saturating_add(pool.idle(g));
        }
        h.held = p.resident_on(device).saturating_add(pool_idle);
        h.releasable = pool_idle;
        let mut segments = false;
        for (_, s) in self.segments.range((pid, 0)..=(pid, u64::MAX)).filter(|(_, s)| s.device == device) {
            *visits += 1;
            segments = true;
            if s.allocated == 0 {
                h.releasable = h.releasable.saturating_add(s.size);
            } else {
                h.stranded = h.stranded.saturating_add(s.size - s.allocated);
            }
        }
        let lens = p.fresh_lens(device, ts);
        if let (false, Some(c)) = (segments, lens) {
            // A stream-ordered pool's idle reserve is the framework's cached free bytes
            // (PyTorch's async backend): counted once, with the pool's.
            let free = c.cached_free().saturating_sub(pool_idle);
            let stranded = c.stranded_bytes.unwrap_or(0).min(free);
            h.stranded = h.stranded.saturating_add(stranded);
            h.releasable = h.releasable.saturating_add(free - stranded);
        }
        h.seen = segments || lens.is_some();
        if !h.seen && p.caching_framework().is_some() {
            h.not_visible = h.held.saturating_sub(pool_idle);
        }
        // The framework's figures may run ahead of the driver's (a lens sample after frees
        // the ring has not delivered yet): never more than the process holds.
        let idle = h.releasable.saturating_add(h.stranded).saturating_add(h.not_visible);
        if idle > h.held {
            h.held = idle;
        }
        h
    }

    /// Other processes' memory on `device` at a failure of the process at `slot` at `ts`:
    /// every other live traced process with bytes there, and the untraced ones, named by
    /// NVML's latest fresh sample, or else the device's remainder beyond the traced
    /// processes' context allowance. Most bytes first.
    /// The processes, pools and segments looked at are added to `visits`.
    pub(super) fn holders_at(&self, slot: usize, device: i16, ts: u64, visits: &mut u64) -> Vec<Holder> {
        let me = self.procs[slot].pid;
        if device < 0 {
            return Vec::new(); // bytes of no known device: nobody to compare them with
        }
        *visits += self.by_pid.len() as u64;
        let nvml = self.gpu_samples.get(&device).filter(|s| {
            let age = s.ts.abs_diff(ts);
            (s.ts >= ts && age <= GPU_SAMPLE_AFTER_FAILURE_NS) || (s.ts < ts && age <= GPU_SAMPLE_FRESH_NS)
        });
        let nvml_of = |pid: u32| nvml.and_then(|s| s.entries.iter().find(|e| e.0 == pid)).map(|e| e.1);
        let mut holders = Vec::new();
        // The failing process's context is on the device whatever it holds.
        let mut traced_on_device = 1u64;
        let mut traced_bytes = 0u64;
        for (&pid, &s) in &self.by_pid {
            let p = &self.procs[s];
            if !p.alive {
                continue;
            }
            let h = self.held_by_counted(s, device, ts, visits);
            traced_bytes = traced_bytes.saturating_add(h.held);
            if pid == me || h.held == 0 {
                continue;
            }
            traced_on_device += 1;
            let framework = p.caching_framework();
            let sight = if h.seen {
                HolderSight::Lens
            } else if framework.is_some() {
                HolderSight::CacheNotVisible
            } else {
                HolderSight::Driver
            };
            holders.push(Holder {
                pid,
                command: p.command.clone(),
                sight,
                held_bytes: h.held,
                releasable_bytes: h.releasable,
                stranded_bytes: h.stranded,
                not_visible_bytes: h.not_visible,
                live_bytes: h.held - h.releasable - h.stranded - h.not_visible,
                framework,
                nvml_bytes: nvml_of(pid),
            });
        }
        match nvml {
            Some(sample) => {
                for (pid, bytes, name) in &sample.entries {
                    let traced = self.by_pid.get(pid).is_some_and(|s| self.procs[*s].alive);
                    if traced || *pid == me || *bytes == 0 {
                        continue;
                    }
                    holders.push(Holder {
                        pid: *pid,
                        command: name.clone(),
                        sight: HolderSight::Untraced,
                        held_bytes: *bytes,
                        live_bytes: *bytes,
                        nvml_bytes: Some(*bytes),
                        ..Holder::default()
                    });
                }
            }
            None => {
                // Stated only: the verdict counts these for no one (see `OthersBytes::unnamed`).
                if let Some(d) = self.devices.get(&device) {
                    let allowance = CONTEXT_ALLOWANCE.saturating_mul(traced_on_device);
                    let rest = d.total.saturating_sub(d.free).saturating_sub(traced_bytes).saturating_sub(allowance);
                    if rest > 0 {
                        holders.push(Holder {
                            sight: HolderSight::UntracedUnnamed,
                            held_bytes: rest,
                            live_bytes: rest,
                            ..Holder::default()
                        });
                    }
                }
            }
        }
        holders.sort_by(|a, b| b.held_bytes.cmp(&a.held_bytes).then(a.pid.cmp(&b.pid)));
        if holders.len() > HOLDERS_LISTED {
            // The rest are folded into one line, so that the totals the verdict uses stay whole.
            let rest = holders.split_off(HOLDERS_LISTED - 1);
            let mut folded = Holder { command: format!("{} more processes", rest.len()), ..Holder::default() };
            folded.sight = HolderSight::Driver;
            for h in rest {
                folded.held_bytes = folded.held_bytes.saturating_add(h.held_bytes);
                folded.releasable_bytes = folded.releasable_bytes.saturating_add(h.releasable_bytes);
                folded.stranded_bytes = folded.stranded_bytes.saturating_add(h.stranded_bytes);
                folded.not_visible_bytes = folded.not_visible_bytes.saturating_add(h.not_visible_bytes);
                folded.live_bytes = folded.live_bytes.saturating_add(h.live_bytes);
            }
            holders.push(folded);
            // Kept with the incident: not the capacity of every process on the device.
            holders.shrink_to_fit();
        }
        holders
    }

    /// The framework limit a lens knows for the process at `slot` on `device`.
    pub(super) fn limit_of(&self, slot: usize, device: i16) -> Option<u64> {
        self.procs[slot].lens.iter().filter(|c| c.device == device).filter_map(|c| c.limit_bytes).min()
    }

    /// A lens's stranded bytes and limit (`framework_stats`), kept with its latest numbers
    /// for that framework on the device.
    pub(super) fn on_framework_stats(&mut self, slot: usize, ev: &Event) {
        let (framework, device) = (ev.framework(), ev.device);
        let p = &mut self.procs[slot];
        match p.lens.iter_mut().find(|c| c.device == device && c.framework == framework) {
            Some(c) => {
                c.stranded_bytes = ev.framework_stranded().map(|s| s.min(c.cached_free()));
                c.limit_bytes = ev.framework_limit();
            }
            None => {
                self.anomaly(Some(slot), Anomaly::BadSegment);
                return;
            }
        }
        // An open incident of this process on the device is judged against the limit too.
        let limit = self.limit_of(slot, device);
        if let Some(idx) = self.procs[slot].open_incident.or(self.procs[slot].lens_segments_for.map(|l| l.0)) {
            if self.incidents.get(idx).is_some_and(|i| i.view.device == device && i.inputs.framework_limit != limit) {
                self.incidents[idx].inputs.framework_limit = limit;
                self.incidents[idx].view.framework_limit = limit;
                self.decide(idx);
            }
        }
    }

    /// Per device, what the process at `slot` holds by how it could be had (for metrics).
    pub(super) fn device_memory_of(&self, slot: usize) -> Vec<ProcessDeviceMemory> {
        let pid = self.procs[slot].pid;
        // A snapshot's segments, or a pool the driver sampled, may be on a device no call of
        // the process was seen on.
        let segment_devices = self.segments.range((pid, 0)..=(pid, u64::MAX)).map(|(_, s)| s.device);
        let pool_devices = self.pools.range((pid, false, 0)..=(pid, true, u64::MAX)).map(|(_, p)| p.device);
        let mut devices: Vec<i16> = self.procs[slot]
            .devices
            .iter()
            .map(|d| d.device)
            .chain(segment_devices)
            .chain(pool_devices)
            .filter(|d| *d >= 0)
            .collect();
        devices.sort_unstable();
        devices.dedup();
        devices
            .into_iter()
            .map(|device| (device, self.held_by(slot, device, self.now)))
            .filter(|(_, h)| h.held > 0)
            .map(|(device, h)| ProcessDeviceMemory {
                device,
                held_bytes: h.held,
                releasable_bytes: h.releasable,
                stranded_bytes: h.stranded,
                not_visible_bytes: h.not_visible,
            })
            .collect()
    }
}
