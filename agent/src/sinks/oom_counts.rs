//! OOM incidents counted once each, by device and verdict, for as long as the agent runs:
//! the counters outlive the process that failed (the model forgets an exited process with
//! its incidents after `--forget-exited-after`; these totals stay).
//!
//! New incidents are found per process (pid + start time): those with an id above the
//! highest seen of that process. The model's ids only grow, while its list loses old
//! incidents (a process forgotten, or the list's cap: `Model::set_incident_cap`), so neither
//! a position in the list nor one id for the whole host would do. (After a restore the ids
//! go on from the last kept, which may be below those of processes already forgotten: not
//! below any of a process still kept.)

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
    /// Per process (pid, start time): the highest incident id already seen.
    seen: HashMap<(u32, u64), u64>,
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
        let mut highest: HashMap<(u32, u64), u64> = HashMap::new();
        let mut fresh = Vec::new();
        for i in &snap.incidents {
            let key = (i.pid, i.start_time);
            if i.id > self.seen.get(&key).copied().unwrap_or(0) {
                fresh.push(i);
            }
            let h = highest.entry(key).or_default();
            *h = (*h).max(i.id);
        }
        // (A process none of whose incidents is left loses its mark: its next one has a
        // higher id than any it had, fresh either way.)
        self.seen = highest;
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

    /// Process A fails, exits and is forgotten; process B then fails: B's incident is
    /// counted, and A's count stays. (The model used to give B's incident A's old id.)
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
        assert!(fresh[0].id > first_id, "ids only grow");
        add_to(&mut totals, &fresh);
        assert_eq!(totals.values().sum::<u64>(), 2, "{totals:?}");
    }

    /// One process fails 50 times while the model keeps at most about 5 incidents: every
    /// incident is found new exactly once, though the list loses its oldest.
    #[test]
    fn every_incident_is_counted_once_under_the_models_cap() {
        let mut m = Model::default();
        m.set_incident_cap(5);
        let mut tracker = IncidentTracker::default();
        let mut totals = OomTotals::new();
        for i in 0..50u64 {
            // Each 3 s after the last: an incident of its own.
            oom(&mut m, 10, 100 + i * 3_000_000_000);
            let s = m.snapshot();
            assert!(s.incidents.len() <= 6, "{} kept", s.incidents.len());
            let fresh = tracker.new_incidents(&s);
            assert_eq!(fresh.len(), 1, "failure {i}");
            add_to(&mut totals, &fresh);
        }
        assert_eq!(totals.values().sum::<u64>(), 50, "{totals:?}");
        assert!(m.incidents_forgotten() >= 44);
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
