//! The ring source as the agent uses it. The source itself (finding a directory's rings,
//! opening them as their one reader, draining them, following their processes) is the ring
//! crate's [`vramhook_ring::source`], shared with `vramhook run` and `vramhook top`, and
//! re-exported here; this module wires it into the agent: the refusals it reports counted in
//! the agent's counters and logged, the rings left to `vramhook run` sessions listed in its
//! state, and closed rings' files removed once the capture holds their events.

pub use vramhook_ring::dir::{default_ring_dir, process_alive};
pub use vramhook_ring::source::*;

use crate::capture::CaptureHandle;
use crate::stats::{add, AgentStats, RecordedByRun};

/// Removes the files of the rings closed in the last poll once the capture has written
/// their events (the capture thread runs the removal after its next flush), so that an
/// agent killed in between leaves the ring for the next one to count what it lost.
pub(crate) fn remove_when_recorded(source: &mut RingSource, capture: &Option<CaptureHandle>) {
    for removal in source.take_removals() {
        match capture {
            Some(c) => {
                let remove: Box<dyn FnOnce() + Send> = Box::new(move || {
                    removal.run();
                    crate::pause_point("ring-removed");
                });
                if let Err(now) = c.then(remove) {
                    now();
                }
            }
            None => removal.run(),
        }
    }
}

/// Counts and reports the rings refused (at the door) or closed as hostile since the last
/// call, one line each.
pub(crate) fn report_refusals(source: &mut RingSource, stats: &AgentStats) {
    for refusal in source.take_refusals() {
        if refusal.hostile {
            add(&stats.rings_hostile, 1);
            eprintln!("vramhook agent: closing hostile ring {}: {}", refusal.path.display(), refusal.reason);
        } else {
            add(&stats.rings_refused, 1);
            if let Some(t) = refusal.too_large {
                crate::stats::note_too_large(t.uid, t.len, t.max);
            }
            eprintln!("vramhook agent: refusing ring {}: {}", refusal.path.display(), refusal.reason);
        }
    }
}

/// Lists the processes left to `vramhook run` sessions in the agent's counters (state,
/// `/metrics`, `top`), and says once per ring in the log how to watch them here instead.
pub(crate) fn report_run_rings(source: &mut RingSource, stats: &AgentStats) {
    for run in source.take_new_run_rings() {
        eprintln!(
            "vramhook agent: {}; start the agent with {} to watch it here",
            RecordedByRun::from(run).describe(),
            crate::stats::INCLUDE_RUN_RINGS
        );
    }
    if let Ok(mut listed) = stats.recorded_by_run.lock() {
        *listed = source.run_rings().into_iter().map(RecordedByRun::from).collect();
    }
}
