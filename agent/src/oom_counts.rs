//! OOM incidents counted once each, by device and verdict, for as long as the agent runs:
//! the counters outlive the process that failed (the model forgets an exited process with
//! its incidents after `--forget-exited-after`; these totals stay).
//!
//! New incidents are found per process (pid + start time), not by incident id: the model
//! numbers incidents by their position in its list, so once a process is forgotten a later
//! incident can get an id already seen, and an "id above the last exported" rule missed it.
//! A process's incidents only ever grow at its end, and go all at once when it is forgotten.

use std::collections::{BTreeMap, HashMap};
use vramhook_model::{ModelSnapshot, OomIncident, Verdict};

/// Every verdict, whose names are the label values (`verdict="capacity"`).
pub const VERDICTS: [Verdict; 8] = Verdict::ALL;

/// The verdict as a metric label value (the names `vramhook analyze` prints).
pub fn verdict_label(v: Verdict) -> &'static str {
    v.name()
}

/// OOM incidents counted so far, by (device, verdict label).
pub type OomTotals = BTreeMap<(i16, &'static str), u64>;

/// Finds the incidents a snapshot has that earlier snapshots did not.
#[derive(Debug, Default)]
pub struct IncidentTracker {
    /// Per process (pid, start time): how many of its incidents were already seen.
    seen: HashMap<(u32, u64), usize>,
}

impl IncidentTracker {
    /// A tracker that takes every incident of `snap` as already seen (a model recovered
    /// from a capture: its incidents were counted and exported by the agent that recorded it).
    pub fn seeded(snap: &ModelSnapshot) -> IncidentTracker {
        let mut t = IncidentTracker::default();
        let _ = t.new_incidents(snap);
        t
    }

    /// The incidents of `snap` not seen before, oldest first; forgets processes that are
    /// no longer in the snapshot.
    pub fn new_incidents<'a>(&mut self, snap: &'a ModelSnapshot) -> Vec<&'a OomIncident> {
        let mut count: HashMap<(u32, u64), usize> = HashMap::new();
        let mut fresh = Vec::new();
        for i in &snap.incidents {
            let key = (i.pid, i.start_time);
            let n = count.entry(key).or_default();
            if *n >= self.seen.get(&key).copied().unwrap_or(0) {
                fresh.push(i);
            }
            *n += 1;
        }
        self.seen = count;
        fresh
    }
}

/// Adds `incidents` to the totals.
pub fn add_to(totals: &mut OomTotals, incidents: &[&OomIncident]) {
    for i in incidents {
        let n = totals.entry((i.device, verdict_label(i.verdict))).or_default();
        *n = n.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramhook_model::Model;
    use vramhook_protocol::{Api, Event};

    use vramhook_protocol::record::CUDA_ERROR_OUT_OF_MEMORY;

    fn oom(m: &mut Model, pid: u32, ts: u64) {
        m.apply(&Event::mem_info(1 << 20, 1 << 30).by(pid, pid).at(ts).on_device(0));
        let e = Event::alloc(Api::cuMemAlloc_v2, 0, 1 << 31).by(pid, pid).at(ts + 1).on_device(0);
        m.apply(&e.with_result(CUDA_ERROR_OUT_OF_MEMORY));
    }

    /// Process A fails, exits and is forgotten; process B then fails. The model gives B's
    /// incident A's old id; it is still counted, and A's count stays.
    #[test]
    fn an_incident_after_a_forgotten_process_is_counted_though_its_id_was_seen() {
        let mut m = Model::default();
        let mut tracker = IncidentTracker::default();
        let mut totals = OomTotals::new();
        oom(&mut m, 10, 100);
        let s = m.snapshot();
        let fresh = tracker.new_incidents(&s);
        assert_eq!(fresh.len(), 1);
        let first_id = fresh[0].id;
        add_to(&mut totals, &fresh);
        assert!(tracker.new_incidents(&m.snapshot()).is_empty(), "seen once");
        m.process_exit(10, 0, Some(1), 200);
        assert_eq!(m.forget_exited(300), 1);
        oom(&mut m, 11, 400);
        let s = m.snapshot();
        let fresh = tracker.new_incidents(&s);
        assert_eq!(fresh.len(), 1, "B's incident is new");
        assert_eq!(fresh[0].pid, 11);
        assert_eq!(fresh[0].id, first_id, "the model reused the id (why ids are not used)");
        add_to(&mut totals, &fresh);
        assert_eq!(totals.values().sum::<u64>(), 2, "{totals:?}");
    }

    #[test]
    fn a_seeded_tracker_counts_only_later_incidents() {
        let mut m = Model::default();
        oom(&mut m, 10, 100);
        let mut tracker = IncidentTracker::seeded(&m.snapshot());
        assert!(tracker.new_incidents(&m.snapshot()).is_empty());
        oom(&mut m, 12, 500);
        let s = m.snapshot();
        let fresh = tracker.new_incidents(&s);
        assert_eq!(fresh.iter().map(|i| i.pid).collect::<Vec<_>>(), [12]);
    }

    #[test]
    fn every_verdict_has_a_distinct_label() {
        let mut labels: Vec<&str> = VERDICTS.iter().map(|v| verdict_label(*v)).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), VERDICTS.len());
    }
}
