//! The state machine: `apply`, which hands each event to its kind's module (`process`,
//! `allocs`, `vmm`, `pools`, `incidents`, `segments`), over the state in `state`; the
//! queries and checkpoints are in `queries` and `checkpoint`.

use crate::addr_map::{AddrMap, Alloc, EXPLICIT_POOL};
use crate::types::*;
use crate::verdict::{decide_verdict, explain, ExplainCtx};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use vramhook_protocol::{Api, Caller, Event, EventKind, ProcessInfo};

/// A hash map with a fast, fixed-seed hasher for the model's integer keys (the address
/// table itself is `AddrMap`). Fixed seed: the same stream gives the same state.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::FixedState>;

mod allocs;
mod checkpoint;
mod incidents;
mod pools;
mod process;
mod queries;
mod segments;
mod state;
mod vmm;

use process::*;
use state::*;

/// Errors of [`Model::restore`].
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("empty checkpoint")]
    Empty,
    #[error("checkpoint version {0} is not supported (this build reads {CHECKPOINT_VERSION})")]
    Version(u8),
    #[error("corrupt checkpoint: {0}")]
    Corrupt(String),
}

/// Version byte that starts every checkpoint.
pub const CHECKPOINT_VERSION: u8 = 2;

/// The VRAM model. See the crate documentation for what each number means.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Model {
    config: ModelConfig,
    procs: Vec<Process>,
    by_pid: FastMap<u32, usize>,
    allocs: AddrMap,
    /// Pool handle of each live allocation made from an explicit pool
    /// (`cuMemAllocFromPoolAsync*`); the others use their device's default pool.
    alloc_pools: FastMap<(u32, u64), u64>,
    handles: FastMap<(u32, u64), Handle>,
    reservations: BTreeMap<(u32, u64), Reservation>,
    pools: BTreeMap<PoolKey, Pool>,
    segments: BTreeMap<(u32, u64), Segment>,
    devices: BTreeMap<i16, DeviceSample>,
    incidents: Vec<IncidentState>,
    anomalies: Vec<u64>,
    now: u64,
    events: u64,
    #[serde(skip)]
    pid_cache: Option<(u32, usize)>,
    device_live: Vec<DeviceLive>,
}

impl Model {
    pub fn new(config: ModelConfig) -> Model {
        Model {
            config,
            procs: Vec::new(),
            by_pid: FastMap::default(),
            allocs: AddrMap::default(),
            alloc_pools: FastMap::default(),
            handles: FastMap::default(),
            reservations: BTreeMap::new(),
            pools: BTreeMap::new(),
            segments: BTreeMap::new(),
            devices: BTreeMap::new(),
            incidents: Vec::new(),
            anomalies: vec![0; Anomaly::COUNT],
            now: 0,
            events: 0,
            pid_cache: None,
            device_live: Vec::new(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Events applied so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// OOM incidents recorded so far.
    pub fn incident_count(&self) -> usize {
        self.incidents.len()
    }

    /// Processes known so far (each image of a process counts once).
    pub fn process_count(&self) -> usize {
        self.procs.len()
    }

    /// Number of live allocations held in the address map (all processes).
    pub fn live_allocation_count(&self) -> usize {
        self.allocs.len()
    }

    fn anomaly(&mut self, slot: Option<usize>, a: Anomaly) {
        self.anomalies[a as usize] += 1;
        if let Some(s) = slot {
            self.procs[s].anomalies += 1;
        }
    }

    /// Device totals agree with the processes' own bytes (a checkpoint is input too).
    fn device_totals_consistent(&self) -> bool {
        let mut sums = vec![0u64; self.device_live.len()];
        for d in self.procs.iter().flat_map(|p| &p.devices) {
            match sums.get_mut(d.total as usize) {
                Some(s) if self.device_live[d.total as usize].device == d.device => *s = s.saturating_add(d.live),
                None if d.total == u32::MAX && d.live == 0 => {}
                _ => return false,
            }
        }
        sums.iter().zip(&self.device_live).all(|(s, d)| *s == d.live && d.peak >= d.live)
    }

    /// Every device's live bytes (all processes) and peak, with how they moved since the
    /// last call; resets those windows. Sampling this at the edges of a timeline's buckets gives the same
    /// buckets as following every event.
    pub fn take_device_windows(&mut self) -> Vec<DeviceWindow> {
        self.device_live
            .iter_mut()
            .map(|d| DeviceWindow { device: d.device, live: d.live, peak: d.peak, window: d.extremes.take(d.live) })
            .collect()
    }

    /// The live bytes of the process at `slot` and how they moved since the last call
    /// (`None` in the window when they did not); resets that window.
    pub fn take_process_window(&mut self, slot: usize) -> Option<(u64, Option<Window>)> {
        let p = self.procs.get_mut(slot)?;
        Some((p.live_bytes, p.extremes.take(p.live_bytes)))
    }

    /// The highest live bytes of the process at `slot` on each device it used.
    pub fn device_peaks_at(&self, slot: usize) -> impl Iterator<Item = (i16, u64)> + '_ {
        self.procs.get(slot).map_or(&[][..], |p| &p.devices[..]).iter().map(|d| (d.device, d.peak))
    }

    fn new_process(&mut self, pid: u32, start_time: u64) -> usize {
        let slot = self.procs.len();
        self.procs.push(Process::new(pid, start_time));
        self.by_pid.insert(pid, slot);
        self.pid_cache = Some((pid, slot));
        slot
    }

    /// Applies one event. Never panics; nonsense is counted in `anomalies` and ignored.
    pub fn apply(&mut self, ev: &Event) {
        self.events += 1;
        let Some(kind) = ev.kind() else {
            self.anomaly(self.by_pid.get(&ev.pid).copied(), Anomaly::UnknownKind);
            return;
        };
        let Some(api) = ev.api() else {
            self.anomaly(self.by_pid.get(&ev.pid).copied(), Anomaly::UnknownApi);
            return;
        };
        if kind == EventKind::ProcessStart {
            self.process_start(ev.pid, ev.start_time(), ev.ppid(), ev.ts_ns);
            return;
        }
        let slot = match self.pid_cache {
            Some((p, s)) if p == ev.pid => s,
            _ => {
                let s = match self.by_pid.get(&ev.pid) {
                    Some(&s) => s,
                    None => self.new_process(ev.pid, 0),
                };
                self.pid_cache = Some((ev.pid, s));
                s
            }
        };
        let p = &mut self.procs[slot];
        if !p.alive {
            self.anomaly(Some(slot), Anomaly::EventAfterExit);
            return;
        }
        // Time: an event is applied at its process's latest time if it is older (threads
        // reach the ring concurrently, so small steps back across threads are normal); a
        // step back within one thread is an anomaly.
        let (ts, incident) = {
            let ts = if ev.ts_ns < p.last_ts { p.last_ts } else { ev.ts_ns };
            if p.cur_tid.0 != ev.tid {
                let (tid, last) = p.cur_tid;
                if last != 0 || tid != 0 {
                    p.thread_ts.insert(tid, last);
                }
                p.cur_tid = (ev.tid, p.thread_ts.get(&ev.tid).copied().unwrap_or(0));
            }
            let back = ev.ts_ns < p.cur_tid.1;
            p.cur_tid.1 = p.cur_tid.1.max(ev.ts_ns);
            p.last_ts = ts;
            let incident = p.awaiting_sample.is_some() || p.open_incident.is_some();
            if back {
                self.anomaly(Some(slot), Anomaly::TimeBackwards);
            }
            (ts, incident)
        };
        if ts > self.now {
            self.now = ts;
        }
        if incident {
            // Incident bookkeeping that precedes the event itself.
            self.incident_pre(slot, ev, kind, ts);
        }

        if ev.failed() {
            if kind != EventKind::MemInfo {
                self.procs[slot].failed_calls += 1;
                if ev.is_oom() {
                    self.on_oom(slot, ev, api, ts);
                }
            }
        } else {
            match kind {
                EventKind::Alloc => self.on_alloc(slot, ev, api, ts),
                EventKind::Free => self.on_free(slot, ev),
                EventKind::VmmCreate => self.on_create(slot, ev, api, ts),
                EventKind::VmmRelease => self.on_release(slot, ev),
                EventKind::VmmReserve => self.on_reserve(slot, ev),
                EventKind::VmmAddressFree => self.on_address_free(slot, ev),
                EventKind::VmmMap => self.on_map(slot, ev, ts),
                EventKind::VmmUnmap => self.on_unmap(slot, ev),
                EventKind::PoolCreate => self.on_pool_create(slot, ev),
                EventKind::PoolDestroy => self.on_pool_destroy(slot, ev),
                EventKind::PoolTrim => self.on_pool_trim(slot, ev),
                EventKind::MemInfo => self.on_meminfo(slot, ev, ts),
                EventKind::ProcessExit => {
                    self.close_process(slot, ts);
                    return;
                }
                EventKind::Dropped => {
                    let p = &mut self.procs[slot];
                    p.dropped_events = p.dropped_events.saturating_add(ev.dropped_count());
                }
                EventKind::ProcessStart | EventKind::HookMiss => {}
            }
        }
        let p = &mut self.procs[slot];
        if let Some(idx) = p.open_incident {
            if let Some(inc) = self.incidents.get_mut(idx) {
                if inc.view.retries == 0 {
                    inc.view.freed_bytes_between = p.freed_total - inc.freed_mark;
                }
            }
        }
        // The lead-up ring: `lead_head` is where the next event goes (the oldest once the
        // ring is full). A compare, not `%`: integer divisions per event cost a tenth of
        // `apply`'s time.
        let n = self.config.lead_up_events;
        let mut h = p.lead_head;
        let len = p.lead_up.len();
        if h < len {
            p.lead_up[h] = *ev;
        } else if len < n {
            p.lead_up.push(*ev);
        } else if let Some(first) = p.lead_up.first_mut() {
            // A restored checkpoint may carry any head.
            *first = *ev;
            h = 0;
        } else {
            return; // no lead-up kept
        }
        p.lead_head = if h + 1 < n { h + 1 } else { 0 };
    }
}

impl Default for Model {
    fn default() -> Self {
        Model::new(ModelConfig::default())
    }
}
