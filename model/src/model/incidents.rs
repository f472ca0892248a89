//! OOM incidents: the failure, the frees and retries that follow, the verdict.

use super::*;

/// A successful call that gives device memory back (a free, an unmap, a release, a trim).
fn gives_back(kind: EventKind, ev: &Event) -> bool {
    !ev.failed()
        && matches!(
            kind,
            EventKind::Free
                | EventKind::VmmRelease
                | EventKind::VmmUnmap
                | EventKind::VmmAddressFree
                | EventKind::PoolTrim
                | EventKind::PoolDestroy
        )
}

/// Looks (processes, pools, segments, arenas) any replay may spend judging incidents.
pub(super) const JUDGE_WORK_BASE: u64 = 1 << 22;
/// And per event read: a real capture's failures never come near it (ten processes with a
/// thousand segments each cost 10,000 looks per failure).
pub(super) const JUDGE_WORK_PER_EVENT: u64 = 64;

/// Arenas an incident lists (its sums count them all).
const ARENAS_KEPT: usize = 64;

/// Cache-wide figures over a process's framework segments.
#[derive(Default)]
pub(super) struct CacheFigures {
    free: u64,
    largest: u64,
    segments: u64,
    reserved: u64,
    pieces: u64,
    with_free: u64,
}

impl Model {
    #[inline]
    pub(super) fn incident_pre(&mut self, slot: usize, ev: &Event, kind: EventKind, ts: u64) {
        if kind == EventKind::PoolSample {
            return; // the interposer's own sample, taken with the device sample: not the program's
        }
        let mut redecide = None;
        let p = &mut self.procs[slot];
        if let Some((_, tid)) = p.awaiting_sample {
            if tid == ev.tid && kind != EventKind::MemInfo {
                p.awaiting_sample = None;
            }
        }
        if let Some(idx) = p.open_incident {
            if matches!(kind, EventKind::FrameworkOom | EventKind::FrameworkSegment | EventKind::FrameworkSample) {
                // The framework's own account of this failure (its lens, however late it
                // speaks: a slow snapshot after the OOM record) is not the program moving on.
                return;
            }
            let inc = &mut self.incidents[idx];
            // Memory given back (a framework freeing its cached blocks before its retry:
            // CuPy's free_all_blocks freed 70 on the H200) is part of the recovery, not
            // events that close the window before the retry comes.
            if !gives_back(kind, ev) {
                inc.events_since = inc.events_since.saturating_add(1);
            }
            if inc.events_since > self.config.incident_window_events
                || ts.saturating_sub(inc.view.ts_ns) > self.config.incident_window_ns
            {
                // No retry within the window (2 s, 64 events of the program): the program
                // moved on without the bytes. This event itself may be the same size served
                // later: not a retry of this request any more.
                if inc.view.outcome == Outcome::Open {
                    inc.view.outcome = Outcome::Failed;
                }
                p.open_incident = None;
                return;
            }
            let is_retry = matches!(kind, EventKind::Alloc | EventKind::VmmCreate)
                && ev.size == inc.view.requested_bytes
                && ev.api == inc.view.api.code();
            if is_retry {
                inc.view.retries += 1;
                inc.view.freed_bytes_between = p.freed_total - inc.freed_mark;
                if ev.failed() {
                    inc.view.failures += 1;
                    inc.view.outcome = Outcome::FailedAgain;
                } else {
                    inc.view.outcome = Outcome::Recovered;
                    p.open_incident = None;
                    if inc.inputs.lens_sample.is_some() {
                        // The retry found the bytes: a sample's free bytes were not stranded.
                        inc.inputs.recovered = true;
                        redecide = Some(idx);
                    }
                }
            } else if kind != EventKind::MemInfo && ev.is_oom() {
                // Another request failing (other size or API) is a new incident, not a
                // retry: the program moved on (without this request's bytes), and this may
                // be the failure that kills it.
                if inc.view.outcome == Outcome::Open {
                    inc.view.outcome = Outcome::Failed;
                }
                p.open_incident = None;
            }
        }
        if let Some(idx) = redecide {
            self.decide(idx);
        }
    }

    /// The process at `slot` ended: its incident still open (no retry of the request
    /// succeeded, no lens said the framework gave up, and its window had not closed) ends
    /// `Failed`: the request was never served. A scan of the incidents, only for a process
    /// that had an out-of-memory error.
    pub(super) fn settle_at_exit(&mut self, slot: usize) {
        if self.procs[slot].oom_count == 0 {
            return;
        }
        for inc in self.incidents.iter_mut().filter(|i| i.slot == slot && i.view.outcome == Outcome::Open) {
            inc.view.outcome = Outcome::Failed;
        }
    }

    /// Idle bytes (pool reserve − live, framework cache) of process `pid` on `device`
    /// (all devices when `device` is -1).
    #[inline]
    pub(super) fn idle_of(&self, pid: u32, device: i16) -> u64 {
        let g = self.config.granularity;
        let pools: u64 = self
            .pools
            .range((pid, false, 0)..=(pid, true, u64::MAX))
            .filter(|(_, p)| device < 0 || p.device == device)
            .fold(0u64, |acc, (_, p)| acc.saturating_add(p.idle(g)));
        let segs: u64 = self
            .segments
            .range((pid, 0)..=(pid, u64::MAX))
            .filter(|(_, s)| device < 0 || s.device == device)
            .fold(0u64, |acc, (_, s)| acc.saturating_add(s.size - s.allocated));
        let lens = self.by_pid.get(&pid).map_or(0, |&slot| self.lens_idle(&self.procs[slot], device));
        pools.saturating_add(segs).saturating_add(lens)
    }

    /// This process's arenas on `device` (all devices when -1) at a failure of `requested`
    /// bytes, sorted by (kind, base, device), with their free bytes summed and their
    /// largest free span: at most [`ARENAS_KEPT`] of them (all are added to `visits`), those the request found in
    /// pieces first, then the most free (an incident keeps its list; a process with 10,000
    /// arenas failing 10,000 times kept 10^8 entries).
    pub(super) fn arenas_at_failure(
        &self,
        pid: u32,
        device: i16,
        requested: u64,
        visits: &mut u64,
    ) -> (Vec<ArenaNumbers>, u64, u64) {
        let all = self.arenas_in(pid, pid);
        *visits += all.len() as u64;
        let mut v: Vec<(u16, ArenaNumbers)> = all
            .into_iter()
            .filter(|a| a.pid == pid && (device < 0 || a.device == device))
            .map(|a| {
                let n = ArenaNumbers {
                    kind: a.kind,
                    base: a.base,
                    free_in_arena: a.free_in_arena,
                    largest_free_span: a.largest_free_span,
                };
                (a.device as u16, n)
            })
            .collect();
        let free = v.iter().fold(0u64, |acc, (_, a)| acc.saturating_add(a.free_in_arena));
        let largest = v.iter().map(|(_, a)| a.largest_free_span).max().unwrap_or(0);
        if v.len() > ARENAS_KEPT {
            let in_pieces = |a: &ArenaNumbers| a.free_in_arena >= requested && a.largest_free_span < requested;
            v.sort_by_key(|(_, a)| (!in_pieces(a), std::cmp::Reverse(a.free_in_arena)));
            v.truncate(ARENAS_KEPT);
        }
        v.sort_by_key(|(d, a)| (a.kind, a.base, *d));
        let mut kept: Vec<ArenaNumbers> = v.into_iter().map(|(_, a)| a).collect();
        kept.shrink_to_fit(); // the collect reuses the list of all arenas in place
        (kept, free, largest)
    }

    /// This process's framework segments on `device` (all devices when -1), cache-wide:
    /// the inputs' `cache_*` figures.
    pub(super) fn cache_of(&self, pid: u32, device: i16) -> CacheFigures {
        let mut c = CacheFigures::default();
        for (_, s) in self.segments.range((pid, 0)..=(pid, u64::MAX)).filter(|(_, s)| device < 0 || s.device == device)
        {
            let (f, l) = s.numbers();
            c.free = c.free.saturating_add(f);
            c.largest = c.largest.max(l);
            c.segments += 1;
            c.reserved = c.reserved.saturating_add(s.size);
            c.pieces = c.pieces.saturating_add(s.gaps.sizes.values().map(|n| u64::from(*n)).sum::<u64>());
            c.with_free += u64::from(f > 0);
        }
        c
    }

    /// Whether judging an incident may still look at processes and arenas: the looks so far
    /// are within [`JUDGE_WORK_BASE`] plus [`JUDGE_WORK_PER_EVENT`] per event read.
    pub(super) fn judge_allowance_left(&self) -> bool {
        self.judge_visits <= JUDGE_WORK_BASE.saturating_add(self.events.saturating_mul(JUDGE_WORK_PER_EVENT))
    }

    #[inline]
    pub(super) fn on_oom(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        self.procs[slot].oom_count += 1;
        if self.procs[slot].open_incident.is_some() {
            return; // a failed retry, already counted by incident_pre
        }
        let caller = ev.caller().map(Caller::name).unwrap_or("");
        let idx = self.open_incident(slot, ev.device, ev.size, api, caller, ts);
        let p = &mut self.procs[slot];
        p.open_incident = Some(idx);
        p.awaiting_sample = Some((idx, ev.tid));
    }

    /// Records a new incident of the process at `slot`: a request of `requested` bytes on
    /// `device` through `api` failed at `ts`. Judged at once from what is known now; later
    /// events (the device sample after the failure, the framework's lens) judge it again.
    pub(super) fn open_incident(
        &mut self,
        slot: usize,
        device: i16,
        requested: u64,
        api: Api,
        caller: &str,
        ts: u64,
    ) -> usize {
        let cap = self.incident_cap;
        if cap > 0 && self.incidents.len() >= cap + cap / 4 {
            self.forget_old_incidents(cap.saturating_sub(1));
        }
        let pid = self.procs[slot].pid;
        // Judging looks at every process on the device and every arena of this one: past
        // the allowance (a capture of 10,000 processes holding memory, each failing, took
        // 10^8 looks and 2 GB) the incident is kept, counted, and left unjudged.
        let judged = self.judge_allowance_left();
        let mut visits = 0u64;
        let (own_idle, holders, other_idle, arenas, cache) = if judged {
            let own_idle = self.idle_of(pid, device);
            let holders = self.holders_at(slot, device, ts, &mut visits);
            let other_idle = if device < 0 {
                // No device known: every other process's idle bytes, on any device.
                visits += self.by_pid.len() as u64;
                let others = self.by_pid.iter().filter(|(p, s)| **p != pid && self.procs[**s].alive);
                others.fold(0u64, |acc, (p, _)| acc.saturating_add(self.idle_of(*p, -1)))
            } else {
                holders
                    .iter()
                    .fold(0u64, |acc, h| acc.saturating_add(h.releasable_bytes).saturating_add(h.stranded_bytes))
            };
            let arenas = self.arenas_at_failure(pid, device, requested, &mut visits);
            let cache = self.cache_of(pid, device);
            visits += cache.segments;
            (own_idle, holders, other_idle, arenas, cache)
        } else {
            self.incidents_unjudged += 1;
            (0, Vec::new(), 0, (Vec::new(), 0, 0), CacheFigures::default())
        };
        let (arenas, arena_free_bytes, arena_largest_free_span) = arenas;
        self.judge_visits = self.judge_visits.saturating_add(visits);
        let framework_limit = self.limit_of(slot, device);
        let sample = self.devices.get(&device).cloned();
        let p = &self.procs[slot];
        let lens_sample = p.fresh_lens(device, ts).map(|c| LensSample {
            framework: c.framework,
            reserved: c.reserved_bytes,
            allocated: c.allocated_bytes,
            largest_free_block: c.largest_free_block,
            age_ns: ts.saturating_sub(c.ts_ns),
        });
        let inputs = VerdictInputs {
            requested,
            granularity: self.config.granularity,
            device_free: sample.as_ref().map(|s| s.free),
            device_total: sample.as_ref().map(|s| s.total),
            own_idle,
            other_idle,
            arenas,
            framework: p.caching_framework(),
            framework_held: p.resident_on(device),
            cache_free: cache.free,
            cache_largest_free: cache.largest,
            cache_segments: cache.segments,
            cache_reserved: cache.reserved,
            cache_pieces: cache.pieces,
            cache_with_free: cache.with_free,
            lens: None,
            lens_sample,
            recovered: false,
            holders: holders.clone(),
            framework_limit,
            unjudged: !judged,
        };
        let id = self.last_incident_id.max(self.incidents.last().map_or(0, |i| i.view.id)) + 1;
        self.last_incident_id = id;
        let view = OomIncident {
            id,
            pid,
            start_time: p.start_time,
            command: p.command.clone(),
            device,
            ts_ns: ts,
            api,
            caller: caller.to_string(),
            requested_bytes: requested,
            device_free_bytes: inputs.device_free,
            device_total_bytes: inputs.device_total,
            sample_ts_ns: sample.as_ref().map(|s| s.ts),
            sample_after_failure: false,
            verdict: Verdict::Unknown,
            unknown_reason: None,
            fix: String::new(),
            explanation: String::new(),
            failures: 1,
            retries: 0,
            freed_bytes_between: 0,
            outcome: Outcome::Open,
            lead_up: {
                let h = p.lead_head.min(p.lead_up.len());
                p.lead_up[h..].iter().chain(&p.lead_up[..h]).map(EventRecord::from).collect()
            },
            own_idle_bytes: own_idle,
            other_idle_bytes: other_idle,
            arena_free_bytes,
            arena_largest_free_span,
            framework: inputs.framework,
            framework_oom: None,
            cache_fragmentation: (cache.segments > 0).then(|| fragmentation(cache.largest, cache.free)),
            holders,
            framework_limit,
        };
        let idx = self.incidents.len();
        self.incidents.push(IncidentState { view, inputs, slot, freed_mark: p.freed_total, events_since: 0 });
        self.decide(idx);
        idx
    }

    /// Forgets the oldest incidents until `keep` are left, but for those a process still
    /// points at (its open incident, one awaiting its device sample, one whose cache
    /// segments the lens is listing), and moves those pointers to the new places.
    fn forget_old_incidents(&mut self, keep: usize) {
        let n = self.incidents.len();
        let mut kept = vec![false; n];
        for k in kept.iter_mut().skip(n.saturating_sub(keep)) {
            *k = true;
        }
        for p in &self.procs {
            let pointed = [p.open_incident, p.awaiting_sample.map(|a| a.0), p.lens_segments_for.map(|l| l.0)];
            for i in pointed.into_iter().flatten() {
                if let Some(k) = kept.get_mut(i) {
                    *k = true;
                }
            }
        }
        let remap = self.retain_incidents(&kept);
        self.incidents_forgotten += (n - self.incidents.len()) as u64;
        for p in &mut self.procs {
            p.remap_incidents(&remap);
        }
    }

    /// Keeps the incidents `kept` marks, in order; returns each old index's new one
    /// (`usize::MAX`: forgotten).
    pub(super) fn retain_incidents(&mut self, kept: &[bool]) -> Vec<usize> {
        let mut map = vec![usize::MAX; self.incidents.len()];
        let mut incidents = Vec::with_capacity(self.incidents.len());
        for (old, inc) in std::mem::take(&mut self.incidents).into_iter().enumerate() {
            if kept.get(old).copied().unwrap_or(false) {
                map[old] = incidents.len();
                incidents.push(inc);
            }
        }
        self.incidents = incidents;
        map
    }

    #[inline]
    pub(super) fn decide(&mut self, idx: usize) {
        let inc = &self.incidents[idx];
        let (verdict, reason) = decide_verdict(&inc.inputs);
        let cmd = &self.procs[inc.slot].command;
        let text = explain(&ExplainCtx {
            pid: inc.view.pid,
            command: if cmd.is_empty() { &inc.view.command } else { cmd },
            api: inc.view.api,
            device: inc.view.device,
            ts_ns: inc.view.ts_ns,
            sample_ts_ns: inc.view.sample_ts_ns,
            sample_after_failure: inc.view.sample_after_failure,
            inputs: &inc.inputs,
            verdict,
            unknown_reason: reason.as_deref(),
            origin_ns: if self.origin == u64::MAX { 0 } else { self.origin },
        });
        let inc = &mut self.incidents[idx];
        inc.view.fix = fix_for(verdict, &inc.inputs);
        inc.view.verdict = verdict;
        inc.view.unknown_reason = reason;
        inc.view.explanation = text;
    }
}
