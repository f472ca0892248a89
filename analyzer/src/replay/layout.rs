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
        let mut arenas: Vec<LayoutArena> = self
            .model
            .arenas()
            .into_iter()
            .filter(|a| self.pid_selected(a.pid))
            .map(|a| LayoutArena {
                pid: a.pid,
                device: a.device,
                kind: a.kind,
                base: a.base,
                size: a.size,
                occupied: a.occupied,
                free_in_arena: a.free_in_arena,
                largest_free_span: a.largest_free_span,
                fragmentation: a.fragmentation,
            })
            .collect();
        arenas.truncate(MAX_LAYOUT_ARENAS);
        self.layout = Some(LayoutReport {
            ts_ns: ts,
            reason,
            entries: entries.iter().map(layout_item).collect(),
            entries_omitted: (total - entries.len()) as u64,
            arenas,
        });
    }
}

pub(crate) fn layout_item(e: &LayoutEntry) -> LayoutItem {
    LayoutItem {
        addr: e.addr,
        size: e.size,
        class: format!("{:?}", e.class).to_lowercase(),
        pid: e.pid,
        device: e.device,
        ts_ns: e.ts_ns,
        reservation: e.reservation,
    }
}
