//! The address layout at one moment (the first OOM, `--at`, or the peak).

use super::*;

impl Replayer {
    pub(crate) fn capture_layout(&mut self, ts: u64, reason: LayoutReason) {
        let mut entries = self.model.layout(None);
        if !self.opts.pids.is_empty() {
            entries.retain(|e| self.opts.pids.contains(&e.pid));
        }
        let total = entries.len();
        if total > MAX_LAYOUT_ENTRIES {
            entries.select_nth_unstable_by(MAX_LAYOUT_ENTRIES, |a, b| b.size.cmp(&a.size));
            entries.truncate(MAX_LAYOUT_ENTRIES);
            entries.sort_unstable_by_key(|e| (e.addr, e.pid));
        }
        let mut arenas: Vec<ArenaView> = self.model.arenas().into_iter().filter(|a| self.pid_selected(a.pid)).collect();
        arenas.truncate(MAX_LAYOUT_ARENAS);
        let entries_omitted = (total - entries.len()) as u64;
        self.layout = Some(LayoutReport { ts_ns: ts, reason, entries, entries_omitted, arenas });
    }
}
