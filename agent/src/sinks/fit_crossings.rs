//! The moments a process's next large request stops fitting, and fits again (issue #30):
//! per live process and device, the published snapshots' fit compared with the last one's.
//! Each crossing of 1 becomes one OTLP log record (`crate::otlp`), so that a log backend
//! holds the warning beside the OOM it foresaw, the way the alert rule does for Prometheus.
//!
//! A fit first seen below 1 is a crossing below (nothing before said it fitted); one first
//! seen at 1 or more is none. A fit that ends (its process exited, or its demand left the
//! window) ends without a record: the OOM record, or the next crossing, says the rest.

use std::collections::HashMap;
use vramhook_model::{ModelSnapshot, ProcessFit};

/// One crossing of 1, as exported.
#[derive(Clone, Debug, PartialEq)]
pub struct FitCrossing {
    pub pid: u32,
    pub command: String,
    pub exe: String,
    pub device: i16,
    /// True: it went below 1 (a request as large as its demand would fail now); false: it
    /// came back to 1 or more.
    pub below: bool,
    /// The model's time of the snapshot that saw it (monotonic ns).
    pub ts_ns: u64,
    pub fit: ProcessFit,
}

impl FitCrossing {
    /// "below" or "above", the record's `vramhook.fit.direction`.
    pub fn direction(&self) -> &'static str {
        if self.below {
            "below"
        } else {
            "above"
        }
    }
}

/// The side of 1 each (process, device) was on at the last published snapshot.
#[derive(Debug, Default)]
pub struct FitTracker {
    /// (pid, start time, device) → below 1.
    below: HashMap<(u32, u64, i16), bool>,
}

impl FitTracker {
    /// A tracker that takes the sides of `snap` as known (a model recovered from a capture:
    /// the agent that recorded it exported its crossings).
    pub fn seeded(snap: &ModelSnapshot) -> FitTracker {
        let mut t = FitTracker::default();
        let _ = t.crossings(snap, 0);
        t
    }

    /// The crossings since the last call; forgets the fits no longer in `snap`.
    pub fn crossings(&mut self, snap: &ModelSnapshot, ts_ns: u64) -> Vec<FitCrossing> {
        let mut now = HashMap::with_capacity(self.below.len());
        let mut out = Vec::new();
        for p in snap.processes.iter().filter(|p| p.alive) {
            for f in &p.fit {
                let key = (p.pid, p.start_time, f.device);
                let below = f.fit_ratio < 1.0;
                let before = self.below.get(&key).copied();
                if before.map_or(below, |b| b != below) {
                    out.push(FitCrossing {
                        pid: p.pid,
                        command: p.command.clone(),
                        exe: p.exe.clone(),
                        device: f.device,
                        below,
                        ts_ns,
                        fit: f.clone(),
                    });
                }
                now.insert(key, below);
            }
        }
        self.below = now;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramhook_model::Model;
    use vramhook_protocol::{Api, Event};

    const GIB: u64 = 1 << 30;

    /// A process that asked for 2 GiB on GPU 0 and gave it back, on a device with `free`
    /// bytes free.
    fn sample(m: &mut Model, ts: u64, free: u64) -> ModelSnapshot {
        m.apply(&Event::mem_info(free, 16 * GIB).by(7, 7).at(ts).on_device(0));
        m.snapshot()
    }

    #[test]
    fn each_crossing_once_in_each_direction() {
        let mut m = Model::new(vramhook_model::ModelConfig::default());
        m.apply(&Event::mem_info(12 * GIB, 16 * GIB).by(7, 7).at(1).on_device(0));
        m.apply(&Event::alloc(Api::cuMemAlloc_v2, 0x1000, 2 * GIB).by(7, 7).at(2).on_device(0));
        m.apply(&Event::free(Api::cuMemFree_v2, 0x1000).by(7, 7).at(3).on_device(0)); // given back: demand
        let mut t = FitTracker::default();
        assert!(t.crossings(&sample(&mut m, 10, 10 * GIB), 10).is_empty(), "fits: nothing to say");
        let down = t.crossings(&sample(&mut m, 20, GIB), 20);
        assert_eq!(down.len(), 1, "{down:?}");
        assert!(down[0].below && down[0].pid == 7 && down[0].device == 0 && down[0].ts_ns == 20);
        assert_eq!(down[0].fit.demand_bytes, 2 * GIB);
        assert!(down[0].fit.supply_bytes < 2 * GIB && down[0].fit.limited_by.is_some(), "{:?}", down[0].fit);
        assert!(t.crossings(&sample(&mut m, 30, GIB / 2), 30).is_empty(), "still below: no new record");
        let up = t.crossings(&sample(&mut m, 40, 10 * GIB), 40);
        assert_eq!(up.iter().map(FitCrossing::direction).collect::<Vec<_>>(), ["above"]);
        // A model recovered below 1: its crossing was exported by the agent before.
        let below = sample(&mut m, 50, GIB);
        assert!(FitTracker::seeded(&below).crossings(&below, 50).is_empty());
        // First seen below 1: a crossing.
        assert_eq!(FitTracker::default().crossings(&below, 50).len(), 1);
    }
}
