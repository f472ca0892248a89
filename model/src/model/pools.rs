//! Stream-ordered pools (create, destroy, trim) and device samples.

use super::*;

impl Model {
    #[inline]
    pub(super) fn on_pool_create(&mut self, slot: usize, ev: &Event) {
        let key = (ev.pid, false, ev.pool());
        if ev.pool() == 0 || self.pools.contains_key(&key) {
            self.anomaly(Some(slot), Anomaly::PoolDuplicate);
            return;
        }
        let pl = Pool::new(ev.device);
        let n = pl.numbers(self.config.granularity);
        self.pools.insert(key, pl);
        self.procs[slot].arena_change(None, Some(n));
    }

    /// An explicit handle, or — for a handle never seen — the device's default pool (its
    /// handle never appears in allocation events).
    #[inline]
    pub(super) fn resolve_pool(&self, pid: u32, device: i16, handle: u64) -> Option<PoolKey> {
        let k = (pid, false, handle);
        if self.pools.contains_key(&k) {
            return Some(k);
        }
        let d = Self::pool_key(pid, device, 0);
        self.pools.contains_key(&d).then_some(d)
    }

    #[inline]
    pub(super) fn on_pool_destroy(&mut self, slot: usize, ev: &Event) {
        let Some(key) = self.resolve_pool(ev.pid, ev.device, ev.pool()) else {
            self.anomaly(Some(slot), Anomaly::PoolUnknown);
            return;
        };
        self.change_pool(slot, key, |pl| {
            pl.destroyed = true;
            pl.hwm = pl.live;
            pl.sampled = None;
        });
    }

    #[inline]
    pub(super) fn on_pool_trim(&mut self, slot: usize, ev: &Event) {
        let Some(key) = self.resolve_pool(ev.pid, ev.device, ev.pool()) else {
            self.anomaly(Some(slot), Anomaly::PoolUnknown);
            return;
        };
        let keep = ev.keep_bytes();
        // The driver rounds what it keeps its own way: the estimate stands until the next sample.
        self.change_pool(slot, key, |pl| {
            pl.hwm = pl.live.max(pl.hwm.min(keep));
            pl.sampled = None;
        });
    }

    /// The driver's reserve of one pool (`pool_sample`): it becomes the pool's reserve. A
    /// sample of a device's current pool goes to the pool `cuMemAllocAsync` allocations
    /// are counted in (that device's default pool), or to an explicit pool of that handle;
    /// a pool with reserve that no allocation has named yet is added. A sample that
    /// follows an out-of-memory failure on the same thread (the interposer takes it right
    /// after the failure, before the device sample) updates that incident's idle bytes.
    #[inline]
    pub(super) fn on_pool_sample(&mut self, slot: usize, ev: &Event) {
        let (pid, device, handle, reserved) = (ev.pid, ev.device, ev.pool(), ev.pool_reserved());
        if reserved > MAX_POOL_SAMPLE {
            self.anomaly(Some(slot), Anomaly::PoolSampleImplausible);
            return;
        }
        let default = Self::pool_key(pid, device, 0);
        let explicit = (pid, false, handle);
        let key = if ev.pool_is_current() && self.pools.contains_key(&default) {
            default
        } else if handle != 0 && self.pools.contains_key(&explicit) {
            explicit
        } else if reserved == 0 {
            return; // nothing held, nothing to add
        } else if ev.pool_is_current() || handle == 0 {
            default
        } else {
            explicit
        };
        if !self.pools.contains_key(&key) {
            let pl = Pool::new(device);
            let n = pl.numbers(self.config.granularity);
            self.pools.insert(key, pl);
            self.procs[slot].arena_change(None, Some(n));
        }
        self.change_pool(slot, key, |pl| pl.sampled = Some(reserved));
        if let Some((idx, tid)) = self.procs[slot].awaiting_sample {
            if tid == ev.tid
                && self.incidents[idx].view.device == device
                && !self.incidents[idx].inputs.unjudged
                && self.judge_allowance_left()
            {
                let own_idle = self.idle_of(pid, device);
                let requested = self.incidents[idx].inputs.requested;
                let mut visits = 0;
                let (arenas, free, largest) = self.arenas_at_failure(pid, device, requested, &mut visits);
                self.judge_visits = self.judge_visits.saturating_add(visits);
                let inc = &mut self.incidents[idx];
                inc.view.own_idle_bytes = own_idle;
                inc.view.arena_free_bytes = free;
                inc.view.arena_largest_free_span = largest;
                inc.inputs.own_idle = own_idle;
                inc.inputs.arenas = arenas;
                self.decide(idx);
            }
        }
    }

    /// Changes a pool and keeps its process's arena numbers in step; a destroyed pool goes
    /// when its last allocation does.
    #[inline]
    pub(super) fn change_pool(&mut self, slot: usize, key: PoolKey, change: impl FnOnce(&mut Pool)) {
        let g = self.config.granularity;
        let Some(pl) = self.pools.get_mut(&key) else { return };
        let before = pl.numbers(g);
        change(pl);
        if pl.destroyed && pl.count == 0 {
            self.pools.remove(&key);
            self.procs[slot].arena_change(Some(before), None);
        } else {
            let after = pl.numbers(g);
            self.procs[slot].arena_change(Some(before), Some(after));
        }
    }

    #[inline]
    pub(super) fn on_meminfo(&mut self, slot: usize, ev: &Event, ts: u64) {
        let (free, total) = (ev.free_bytes(), ev.total_bytes());
        self.devices.insert(ev.device, DeviceSample { total, free, ts });
        if let Some((idx, tid)) = self.procs[slot].awaiting_sample {
            if tid == ev.tid && self.incidents[idx].view.device == ev.device {
                self.procs[slot].awaiting_sample = None;
                let inc = &mut self.incidents[idx];
                inc.inputs.device_free = Some(free);
                inc.inputs.device_total = Some(total);
                inc.view.device_free_bytes = Some(free);
                inc.view.device_total_bytes = Some(total);
                inc.view.sample_ts_ns = Some(ts);
                inc.view.sample_after_failure = true;
                self.decide(idx);
            }
        }
    }
}
