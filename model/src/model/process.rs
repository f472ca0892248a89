//! Processes: their state, start, attach (pid reuse, exec), exit, and the view of one.

use super::*;

impl Process {
    /// Moves the process's pointers into the incident list after it was compacted (`map`:
    /// each old index's new one, `usize::MAX` for one forgotten).
    pub(super) fn remap_incidents(&mut self, map: &[usize]) {
        let remap = |i: usize| map.get(i).copied().filter(|n| *n != usize::MAX);
        self.open_incident = self.open_incident.and_then(remap);
        self.awaiting_sample = self.awaiting_sample.and_then(|(i, tid)| remap(i).map(|n| (n, tid)));
        self.lens_segments_for = self.lens_segments_for.and_then(|(i, d, c)| remap(i).map(|n| (n, d, c)));
    }

    #[inline]
    pub(super) fn new(pid: u32, start_time: u64) -> Process {
        Process {
            traced_since: None,
            pid,
            start_time,
            ppid: 0,
            command: String::new(),
            exe: String::new(),
            alive: true,
            exit_status: None,
            exit_ts: None,
            by_class: [0; 8],
            live_bytes: 0,
            live_allocations: 0,
            peak_bytes: 0,
            peak_ts: 0,
            allocations: 0,
            frees: 0,
            failed_calls: 0,
            oom_count: 0,
            dropped_events: 0,
            anomalies: 0,
            devices: Vec::new(),
            last_ts: 0,
            thread_ts: FastMap::default(),
            cur_tid: (0, 0),
            lead_up: Vec::new(),
            lead_head: 0,
            freed_total: 0,
            open_incident: None,
            awaiting_sample: None,
            arena_spans: BTreeMap::new(),
            free_in_arenas: 0,
            extremes: Extremes::UNCHANGED,
            frameworks: 0,
            lens: Vec::new(),
            lens_segments_for: None,
            streams: 0,
            streams_peak: 0,
            demand: Vec::new(),
        }
    }

    /// The newest lens sample of a caching framework on `device` at most
    /// `LENS_SAMPLE_FRESH_NS` older than `ts`: what a failure then, or a fit, may use.
    pub(super) fn fresh_lens(&self, device: i16, ts: u64) -> Option<&FrameworkCache> {
        self.lens
            .iter()
            .filter(|c| {
                c.device == device && c.framework.caches() && ts.saturating_sub(c.ts_ns) <= LENS_SAMPLE_FRESH_NS
            })
            .max_by_key(|c| c.ts_ns)
    }

    /// The first caching framework among those it loaded.
    pub(super) fn caching_framework(&self) -> Option<FrameworkId> {
        FrameworkId::in_mask(self.frameworks).find(|f| f.caches())
    }

    /// Its resident live bytes on `device` (all devices when -1).
    pub(super) fn resident_on(&self, device: i16) -> u64 {
        self.devices.iter().filter(|d| device < 0 || d.device == device).fold(0u64, |a, d| a.saturating_add(d.resident))
    }

    #[inline]
    pub(super) fn dev(&mut self, device: i16) -> &mut DevBytes {
        let i = match self.devices.iter().position(|d| d.device == device) {
            Some(i) => i,
            None => {
                self.devices.push(DevBytes { device, live: 0, resident: 0, peak: 0, total: u32::MAX });
                self.devices.len() - 1
            }
        };
        &mut self.devices[i]
    }

    /// Returns the device's entry when live bytes changed.
    #[inline(always)]
    pub(super) fn add_bytes(&mut self, class: Class, device: i16, size: u64, ts: u64) -> Option<&mut DevBytes> {
        self.by_class[class.index()] = self.by_class[class.index()].saturating_add(size);
        self.live_allocations += 1;
        if !class.owned() {
            return None;
        }
        self.live_bytes = self.live_bytes.saturating_add(size);
        if self.live_bytes > self.peak_bytes {
            self.peak_bytes = self.live_bytes;
            self.peak_ts = ts;
        }
        self.extremes.grew(self.live_bytes, ts);
        let d = self.dev(device);
        d.live = d.live.saturating_add(size);
        if d.live > d.peak {
            d.peak = d.live;
        }
        if class.resident() {
            d.resident = d.resident.saturating_add(size);
        }
        Some(d)
    }

    /// Returns the device's entry when live bytes changed.
    #[inline(always)]
    pub(super) fn sub_bytes(&mut self, class: Class, device: i16, size: u64, ts: u64) -> Option<&mut DevBytes> {
        self.by_class[class.index()] = self.by_class[class.index()].saturating_sub(size);
        self.live_allocations = self.live_allocations.saturating_sub(1);
        self.frees += 1;
        self.freed_total = self.freed_total.saturating_add(size);
        if !class.owned() {
            return None;
        }
        self.live_bytes = self.live_bytes.saturating_sub(size);
        self.extremes.shrank(self.live_bytes, ts);
        let d = self.dev(device);
        d.live = d.live.saturating_sub(size);
        if class.resident() {
            d.resident = d.resident.saturating_sub(size);
        }
        Some(d)
    }

    #[inline]
    pub(super) fn arena_change(&mut self, old: Option<(u64, u64)>, new: Option<(u64, u64)>) {
        if old == new {
            return;
        }
        if let Some((free, largest)) = old {
            self.free_in_arenas = self.free_in_arenas.saturating_sub(free);
            if let Some(c) = self.arena_spans.get_mut(&largest) {
                *c -= 1;
                if *c == 0 {
                    self.arena_spans.remove(&largest);
                }
            }
        }
        if let Some((free, largest)) = new {
            self.free_in_arenas = self.free_in_arenas.saturating_add(free);
            *self.arena_spans.entry(largest).or_insert(0) += 1;
        }
    }

    #[inline]
    pub(super) fn largest_free_span(&self) -> u64 {
        self.arena_spans.last_key_value().map(|(k, _)| *k).unwrap_or(0)
    }
}

/// What [`Model::attach`] does with a (pid, start time).
enum AttachTo {
    /// The process in this slot.
    Slot(usize),
    /// Nothing: the process in this slot has exited.
    Exited(usize),
    /// A new process; one of the same pid in `replaces` is closed first if still alive.
    New { replaces: Option<usize> },
}

impl Model {
    #[inline]
    pub(super) fn process_start(&mut self, pid: u32, start_time: u64, ppid: u32, ts: u64) {
        if ts > self.now {
            self.now = ts;
        }
        let slot = self.attach(pid, start_time, ts, true);
        if let Some(s) = slot {
            if ppid != 0 {
                self.procs[s].ppid = ppid;
            }
        }
    }

    /// Finds or creates the process (pid, start_time); closes an older process of the same
    /// pid (pid reuse). Returns None when it names a process that already exited, unless
    /// `new_image`: an `exec` keeps pid and start time, and its new image starts afresh
    /// (the old image's memory went with its address space).
    #[inline]
    pub(super) fn attach(&mut self, pid: u32, start_time: u64, ts: u64, new_image: bool) -> Option<usize> {
        match self.attach_target(pid, start_time, new_image) {
            AttachTo::Slot(s) => {
                let p = &mut self.procs[s];
                if p.start_time == 0 {
                    p.start_time = start_time;
                }
                Some(s)
            }
            AttachTo::Exited(s) => {
                self.anomaly(Some(s), Anomaly::EventAfterExit);
                None
            }
            AttachTo::New { replaces } => {
                if let Some(s) = replaces.filter(|&s| self.procs[s].alive) {
                    self.close_process(s, ts);
                }
                Some(self.new_process(pid, start_time))
            }
        }
    }

    /// Where [`Model::attach`] would take (pid, start_time), without changing anything.
    fn attach_target(&self, pid: u32, start_time: u64, new_image: bool) -> AttachTo {
        let Some(&s) = self.by_pid.get(&pid) else { return AttachTo::New { replaces: None } };
        let p = &self.procs[s];
        if p.start_time == start_time || start_time == 0 {
            match (p.alive, new_image && start_time != 0) {
                (true, _) => AttachTo::Slot(s),
                (false, true) => AttachTo::New { replaces: Some(s) },
                (false, false) => AttachTo::Exited(s),
            }
        } else if p.start_time == 0 && p.alive {
            AttachTo::Slot(s)
        } else {
            AttachTo::New { replaces: Some(s) }
        }
    }

    /// Whether a process start of (pid, start_time), or what a reader knows of it, would
    /// open a process beside the one the model already has under that pid (the pid reused,
    /// or a new image after `exec`): a replay that bounds its processes counts it.
    pub fn opens_another_process(&self, pid: u32, start_time: u64) -> bool {
        matches!(self.attach_target(pid, start_time, true), AttachTo::New { replaces: Some(_) })
    }

    /// Attaches what the reader knows about a process (command line, exe, parent).
    pub fn process_info(&mut self, info: &ProcessInfo) {
        let slot = self
            .procs
            .iter()
            .rposition(|p| p.pid == info.pid && p.start_time == info.start_time && info.start_time != 0)
            .filter(|s| self.procs[*s].alive)
            .or_else(|| self.attach(info.pid, info.start_time, self.now, true));
        if let Some(s) = slot {
            let p = &mut self.procs[s];
            p.command = info.cmdline.join(" ");
            p.exe = info.exe.clone();
            if info.ppid != 0 {
                p.ppid = info.ppid;
            }
        }
    }

    /// eBPF mode: the process was running before the probes were attached at `ts_ns`; its
    /// allocations before then are unknown ("attached at T; earlier allocations unknown").
    pub fn process_traced_since(&mut self, pid: u32, start_time: u64, ts_ns: u64) {
        let slot = self.procs.iter().rposition(|p| p.pid == pid && p.start_time == start_time && p.alive);
        if let Some(s) = slot {
            self.procs[s].traced_since = Some(ts_ns);
        }
    }

    /// The process ended (from the agent's process watcher or the capture's end frame):
    /// releases everything it held. Idempotent; a `start_time` of 0 matches the current
    /// process of that pid.
    pub fn process_exit(&mut self, pid: u32, start_time: u64, exit_status: Option<i32>, ts_ns: u64) {
        let Some(slot) = self.process_slot(pid, start_time) else { return };
        if self.procs[slot].start_time == 0 {
            self.procs[slot].start_time = start_time;
        }
        if ts_ns > self.now {
            self.now = ts_ns;
        }
        if self.procs[slot].alive {
            self.close_process(slot, ts_ns.max(self.procs[slot].last_ts));
        }
        if exit_status.is_some() {
            self.procs[slot].exit_status = exit_status;
        }
    }

    /// A `Dropped` marker of `pid` met after its latest process exited (an agent wrote the
    /// marker of what its capture queue dropped after the process's end): its events were
    /// that process's, so it counts them, where `apply` would refuse an event after exit.
    /// Returns false (nothing counted) when the pid's latest process is alive or unknown:
    /// then the marker is an ordinary event.
    pub fn dropped_after_exit(&mut self, pid: u32, events: u64) -> bool {
        let Some(&slot) = self.by_pid.get(&pid) else { return false };
        let p = &mut self.procs[slot];
        if p.alive {
            return false;
        }
        p.dropped_events = p.dropped_events.saturating_add(events);
        true
    }

    /// The index of process (pid, start_time), alive or not (`start_time` 0: the latest of
    /// that pid), as [`Model::process_exit`] finds it: a process whose start time is not
    /// known yet, still alive, is the one a known start time names.
    pub fn process_slot(&self, pid: u32, start_time: u64) -> Option<usize> {
        let exact = self.procs.iter().rposition(|p| p.pid == pid && (start_time == 0 || p.start_time == start_time));
        exact.or_else(|| {
            let s = self.by_pid.get(&pid).copied()?;
            (self.procs[s].start_time == 0 && self.procs[s].alive).then_some(s)
        })
    }

    #[inline]
    pub(super) fn close_process(&mut self, slot: usize, ts: u64) {
        self.settle_at_exit(slot);
        let pid = self.procs[slot].pid;
        self.allocs.retain(|p, _, _| p != pid);
        self.alloc_pools.retain(|k, _| k.0 != pid);
        self.handles.retain(|k, _| k.0 != pid);
        let range = (pid, 0)..=(pid, u64::MAX);
        let keys: Vec<_> = self.reservations.range(range.clone()).map(|(k, _)| *k).collect();
        for k in keys {
            self.reservations.remove(&k);
        }
        let keys: Vec<_> = self.segments.range(range).map(|(k, _)| *k).collect();
        for k in keys {
            self.segments.remove(&k);
        }
        let keys: Vec<_> = self.pools.range((pid, false, 0)..=(pid, true, u64::MAX)).map(|(k, _)| *k).collect();
        for k in keys {
            self.pools.remove(&k);
        }
        self.forget_streams(slot);
        let p = &mut self.procs[slot];
        p.alive = false;
        p.exit_ts = Some(ts);
        p.by_class = [0; 8];
        p.live_bytes = 0;
        p.extremes.shrank(0, ts);
        p.live_allocations = 0;
        // What it held leaves the device totals; its entries stay (with their peaks).
        for d in &mut p.devices {
            if let Some(dl) = self.device_live.get_mut(d.total as usize) {
                dl.live = dl.live.saturating_sub(d.live);
                dl.extremes.shrank(dl.live, ts);
            }
            d.live = 0;
            d.resident = 0;
        }
        p.arena_spans.clear();
        p.free_in_arenas = 0;
        p.open_incident = None;
        p.awaiting_sample = None;
    }
}

/// A process's view, as `Model::snapshot` and `Model::process_view` both report it, given
/// its idle bytes (pool reserve and framework cache), its pools' idle bytes and reserve,
/// and histograms.
pub(super) fn process_view_of(
    p: &Process,
    idle: u64,
    (pool_idle, pool_reserve): (u64, u64),
    stream_bytes_each: u64,
    sizes: Histogram,
    ages: Histogram,
) -> ProcessView {
    let mut devices: Vec<DeviceBytes> =
        p.devices.iter().filter(|d| d.live > 0).map(|d| DeviceBytes { device: d.device, live_bytes: d.live }).collect();
    devices.sort_by_key(|d| d.device);
    let largest = p.largest_free_span();
    ProcessView {
        pid: p.pid,
        start_time: p.start_time,
        ppid: p.ppid,
        command: p.command.clone(),
        exe: p.exe.clone(),
        alive: p.alive,
        exit_status: p.exit_status,
        exit_ts_ns: p.exit_ts,
        incomplete: p.dropped_events > 0,
        live_bytes: p.live_bytes,
        live_by_class: ClassBytes::from_array(&p.by_class),
        live_allocations: p.live_allocations,
        peak_bytes: p.peak_bytes,
        peak_ts_ns: p.peak_ts,
        allocations: p.allocations,
        frees: p.frees,
        failed_calls: p.failed_calls,
        oom_count: p.oom_count,
        dropped_events: p.dropped_events,
        anomalies: p.anomalies,
        idle_bytes: idle,
        pool_reserve_bytes: pool_reserve,
        held_bytes: p.live_bytes.saturating_add(pool_idle),
        streams: p.streams,
        streams_peak: p.streams_peak,
        stream_bytes: p.streams_peak.saturating_mul(stream_bytes_each),
        largest_free_span: largest,
        free_in_arenas: p.free_in_arenas,
        fragmentation: fragmentation(largest, p.free_in_arenas),
        devices,
        size_histogram: sizes,
        age_histogram: ages,
        traced_since_ns: p.traced_since,
        frameworks: FrameworkId::in_mask(p.frameworks).collect(),
        framework_caches: p.lens.clone(),
        device_memory: Vec::new(),
        fit: Vec::new(),
    }
}
