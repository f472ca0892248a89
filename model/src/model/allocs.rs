//! Plain, pitch, managed, pool and array allocations and their frees.

use super::*;

impl Model {
    #[inline]
    pub(super) fn pool_key(pid: u32, device: i16, pool: u64) -> PoolKey {
        if pool == 0 {
            (pid, true, device as u16 as u64)
        } else {
            (pid, false, pool)
        }
    }

    #[inline]
    pub(super) fn on_alloc(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        let Some(class) = api.mem_class() else {
            self.anomaly(Some(slot), Anomaly::AllocUnknownApi);
            return;
        };
        if class == Class::Vmm || class == Class::Import {
            // cuMemCreate / import reported as an alloc: treat as a handle creation.
            self.on_create(slot, ev, api, ts);
            return;
        }
        if ev.addr == 0 {
            self.anomaly(Some(slot), Anomaly::AllocNull);
            return;
        }
        let pid = ev.pid;
        let pool = ev.pool();
        let flag = if pool != 0 { EXPLICIT_POOL } else { 0 };
        let a = Alloc { size: ev.size, ts, device: ev.device, class: class as u8 | flag };
        if let Some(old) = self.allocs.insert(pid, ev.addr, a) {
            self.anomaly(Some(slot), Anomaly::AllocOverLive);
            self.remove_alloc(slot, pid, ev.addr, old);
        }
        if pool != 0 {
            self.alloc_pools.insert((pid, ev.addr), pool);
        }
        let p = &mut self.procs[slot];
        p.allocations += 1;
        if let Some(d) = p.add_bytes(class, ev.device, ev.size, ts) {
            d.count_in_total(&mut self.device_live, true, ev.size, ts);
        }
        if class == Class::Pool {
            let g = self.config.granularity;
            let key = Self::pool_key(pid, ev.device, pool);
            let before = self.pools.get(&key).map(|pl| pl.numbers(g));
            let pl = self.pools.entry(key).or_insert_with(|| Pool::new(ev.device));
            pl.live = pl.live.saturating_add(ev.size);
            pl.count += 1;
            pl.hwm = pl.hwm.max(pl.live);
            let after = pl.numbers(g);
            self.procs[slot].arena_change(before, Some(after));
        }
    }

    /// Accounts for an allocation already taken out of `allocs`.
    #[inline(always)]
    pub(super) fn remove_alloc(&mut self, slot: usize, pid: u32, addr: u64, a: Alloc) {
        let class = a.class();
        let p = &mut self.procs[slot];
        let ts = p.last_ts;
        if let Some(d) = p.sub_bytes(class, a.device, a.size, ts) {
            d.count_in_total(&mut self.device_live, false, a.size, ts);
        }
        if class == Class::Pool {
            let pool =
                if a.class & EXPLICIT_POOL != 0 { self.alloc_pools.remove(&(pid, addr)).unwrap_or(0) } else { 0 };
            let key = Self::pool_key(pid, a.device, pool);
            self.change_pool(slot, key, |pl| {
                pl.live = pl.live.saturating_sub(a.size);
                pl.count = pl.count.saturating_sub(1);
                if pl.destroyed {
                    pl.hwm = pl.live;
                }
            });
        }
        if !self.segments.is_empty() {
            if let Some(seg) = self.segments.remove(&(pid, addr)) {
                self.procs[slot].arena_change(Some(seg.numbers()), None);
            }
        }
    }

    #[inline]
    pub(super) fn on_free(&mut self, slot: usize, ev: &Event) {
        if ev.addr == 0 {
            return; // cudaFree(NULL) is a no-op.
        }
        match self.allocs.remove(ev.pid, ev.addr) {
            Some(a) => {
                self.note_given_back(slot, a.device, a.size, a.class());
                self.remove_alloc(slot, ev.pid, ev.addr, a)
            }
            None => self.anomaly(Some(slot), Anomaly::FreeUnknown),
        }
    }
}
