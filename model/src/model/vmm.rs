//! VMM: physical handles (create, release), reservations, mappings.

use super::*;

impl Model {
    /// The end of [addr, addr+size), or `None` (counted as an anomaly) when the range is
    /// empty or runs past the address space.
    #[inline]
    fn range_end(&mut self, slot: usize, addr: u64, size: u64) -> Option<u64> {
        if size == 0 {
            self.anomaly(Some(slot), Anomaly::ZeroSize);
            return None;
        }
        let end = addr.checked_add(size);
        if end.is_none() {
            self.anomaly(Some(slot), Anomaly::AddressOverflow);
        }
        end
    }

    #[inline]
    pub(super) fn on_create(&mut self, slot: usize, ev: &Event, api: Api, ts: u64) {
        let class = if api == Api::cuMemImportFromShareableHandle { Class::Import } else { Class::Vmm };
        let key = (ev.pid, ev.handle());
        if self.handles.contains_key(&key) {
            self.anomaly(Some(slot), Anomaly::VmmCreateDuplicate);
            return;
        }
        self.handles
            .insert(key, Handle { size: ev.size, ts, device: ev.device, class: class as u8, released: false, maps: 0 });
        let p = &mut self.procs[slot];
        p.allocations += 1;
        if let Some(d) = p.add_bytes(class, ev.device, ev.size, ts) {
            d.count_in_total(&mut self.device_live, true, ev.size, ts);
        }
    }

    #[inline]
    pub(super) fn drop_handle_if_done(&mut self, slot: usize, key: (u32, u64)) {
        if self.handles.get(&key).is_some_and(|h| h.released && h.maps == 0) {
            if let Some(h) = self.handles.remove(&key) {
                // Released and unmapped: given back (a handle released while mapped lives on).
                self.note_given_back(slot, h.device, h.size, Class::from_index(h.class));
                let p = &mut self.procs[slot];
                let ts = p.last_ts;
                if let Some(d) = p.sub_bytes(Class::from_index(h.class), h.device, h.size, ts) {
                    d.count_in_total(&mut self.device_live, false, h.size, ts);
                }
            }
        }
    }

    #[inline]
    pub(super) fn on_release(&mut self, slot: usize, ev: &Event) {
        let key = (ev.pid, ev.handle());
        match self.handles.get_mut(&key) {
            None => self.anomaly(Some(slot), Anomaly::ReleaseUnknown),
            Some(h) if h.released => self.anomaly(Some(slot), Anomaly::DoubleRelease),
            Some(h) => {
                h.released = true;
                self.drop_handle_if_done(slot, key);
            }
        }
    }

    #[inline]
    pub(super) fn on_reserve(&mut self, slot: usize, ev: &Event) {
        let pid = ev.pid;
        let Some(end) = self.range_end(slot, ev.addr, ev.size) else {
            return;
        };
        let prev_overlaps =
            self.reservations.range((pid, 0)..=(pid, ev.addr)).next_back().is_some_and(|(k, r)| k.1 + r.size > ev.addr);
        let next_overlaps = self.reservations.range((pid, ev.addr)..(pid, end)).next().is_some();
        if prev_overlaps || next_overlaps {
            self.anomaly(Some(slot), Anomaly::ReserveOverlap);
            return;
        }
        let mut gaps = Gaps::default();
        gaps.add(ev.size);
        let r = Reservation { size: ev.size, device: ev.device, mappings: BTreeMap::new(), mapped: 0, gaps };
        let n = r.numbers();
        self.reservations.insert((pid, ev.addr), r);
        self.procs[slot].arena_change(None, Some(n));
    }

    #[inline]
    pub(super) fn on_address_free(&mut self, slot: usize, ev: &Event) {
        let key = (ev.pid, ev.addr);
        match self.reservations.get(&key) {
            None => self.anomaly(Some(slot), Anomaly::AddressFreeUnknown),
            Some(r) if !r.mappings.is_empty() => self.anomaly(Some(slot), Anomaly::AddressFreeWhileMapped),
            Some(_) => {
                let r = self.reservations.remove(&key).expect("present");
                self.procs[slot].arena_change(Some(r.numbers()), None);
            }
        }
    }

    /// The reservation of `pid` containing `addr`.
    #[inline]
    pub(super) fn reservation_at(&self, pid: u32, addr: u64) -> Option<u64> {
        self.reservations
            .range((pid, 0)..=(pid, addr))
            .next_back()
            .filter(|(k, r)| addr - k.1 < r.size)
            .map(|(k, _)| k.1)
    }

    #[inline]
    pub(super) fn on_map(&mut self, slot: usize, ev: &Event, ts: u64) {
        let pid = ev.pid;
        let (addr, size, hkey) = (ev.addr, ev.size, (ev.pid, ev.handle()));
        let Some(end) = self.range_end(slot, addr, size) else {
            return;
        };
        let handle_device = match self.handles.get(&hkey) {
            None => {
                self.anomaly(Some(slot), Anomaly::MapUnknownHandle);
                return;
            }
            Some(h) if h.released => {
                self.anomaly(Some(slot), Anomaly::MapReleasedHandle);
                return;
            }
            Some(h) => h.device,
        };
        let Some(base) = self.reservation_at(pid, addr) else {
            self.anomaly(Some(slot), Anomaly::MapOutsideReservation);
            return;
        };
        let r = self.reservations.get_mut(&(pid, base)).expect("found");
        if end > base + r.size {
            self.anomaly(Some(slot), Anomaly::MapOutsideReservation);
            return;
        }
        let prev = r.mappings.range(..=addr).next_back().is_some_and(|(a, m)| a + m.size > addr);
        let next = r.mappings.range(addr..end).next().is_some();
        if prev || next {
            self.anomaly(Some(slot), Anomaly::MapOverlap);
            return;
        }
        // cuMemAddressReserve names no device; the memory mapped into the range does
        // (cuMemCreate's location): the first mapping names the reservation's.
        if r.device < 0 && handle_device >= 0 {
            r.device = handle_device;
        }
        let before = r.numbers();
        r.occupy_interval(base, addr, end);
        r.mappings.insert(addr, Mapping { size, handle: ev.handle(), offset: ev.map_offset(), ts });
        r.mapped += size;
        let after = r.numbers();
        self.procs[slot].arena_change(Some(before), Some(after));
        if let Some(h) = self.handles.get_mut(&hkey) {
            h.maps += 1;
        }
    }

    #[inline]
    pub(super) fn on_unmap(&mut self, slot: usize, ev: &Event) {
        let pid = ev.pid;
        if ev.size == 0 {
            self.anomaly(Some(slot), Anomaly::ZeroSize);
            return;
        }
        let Some(base) = self.reservation_at(pid, ev.addr) else {
            self.anomaly(Some(slot), Anomaly::UnmapNothing);
            return;
        };
        let r = self.reservations.get_mut(&(pid, base)).expect("found");
        let a = ev.addr;
        let e = ev.addr.saturating_add(ev.size).min(base + r.size);
        // Overlapping mappings: the one starting at or before `a` if it reaches past `a`,
        // and every one starting inside (a, e).
        let mut hit: Vec<u64> = Vec::new();
        if let Some((ma, m)) = r.mappings.range(..=a).next_back() {
            if ma + m.size > a {
                hit.push(*ma);
            }
        }
        if a < e {
            hit.extend(r.mappings.range(a.saturating_add(1)..e).map(|(k, _)| *k));
        }
        if hit.is_empty() {
            self.anomaly(Some(slot), Anomaly::UnmapNothing);
            return;
        }
        let before = r.numbers();
        let mut touched: Vec<(u64, i64)> = Vec::new();
        for ms in hit {
            let m = r.mappings.remove(&ms).expect("present");
            let me = ms + m.size;
            let fs = ms.max(a);
            let fe = me.min(e).max(fs);
            let mut delta: i64 = -1;
            if ms < fs {
                r.mappings.insert(ms, Mapping { size: fs - ms, ..m.clone() });
                delta += 1;
            }
            if fe < me {
                r.mappings.insert(fe, Mapping { size: me - fe, offset: m.offset + (fe - ms), ..m.clone() });
                delta += 1;
            }
            r.mapped -= fe - fs;
            if fe > fs {
                r.free_interval(base, fs, fe);
            }
            touched.push((m.handle, delta));
        }
        let after = r.numbers();
        self.procs[slot].arena_change(Some(before), Some(after));
        for (h, delta) in touched {
            let key = (pid, h);
            if let Some(hd) = self.handles.get_mut(&key) {
                hd.maps = (i64::from(hd.maps) + delta).max(0) as u32;
            }
            self.drop_handle_if_done(slot, key);
        }
    }
}
