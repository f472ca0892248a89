//! The live-allocation table: (pid, address) → allocation.
//!
//! Every alloc and free event does one operation here, so it is the replay's hottest
//! structure. Open addressing with linear probing over 32-byte slots (two per cache line),
//! at most half full (it doubles before an insert would pass half), with backward-shift
//! deletion: no tombstones, so probe runs stay short under endless alloc/free churn. It
//! replaced std's `HashMap` (hashbrown's SIMD groups plus a separate hasher), which took
//! more instructions per operation in the replay; see `model/benches/model.rs` and
//! `scripts/bench/run.sh analyzer`.
//!
//! The hash is fixed (replays are deterministic). A capture crafted so that many keys
//! collide slows the replay down; it cannot make it wrong.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A live allocation as the table stores it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Alloc {
    pub size: u64,
    pub ts: u64,
    pub device: i16,
    /// `Class` index; [`EXPLICIT_POOL`] set when the allocation came from an explicit pool
    /// (its handle is kept apart: few allocations have one).
    pub class: u8,
}

impl Alloc {
    #[inline]
    pub fn class(&self) -> crate::types::Class {
        crate::types::Class::from_index(self.class & !EXPLICIT_POOL)
    }
}

/// Flag in [`Alloc::class`]: allocated from an explicit pool (`cuMemAllocFromPoolAsync`).
pub(crate) const EXPLICIT_POOL: u8 = 0x80;

#[derive(Clone, Copy, Default)]
struct Slot {
    addr: u64,
    size: u64,
    ts: u64,
    pid: u32,
    device: i16,
    class: u8,
    /// 0: empty; else 1 + the distance from the key's home slot, or 255 for a long one
    /// (then the hash is computed again): deletion needs no hashing.
    dist: u8,
}

impl Slot {
    #[inline]
    fn alloc(&self) -> Alloc {
        Alloc { size: self.size, ts: self.ts, device: self.device, class: self.class }
    }
}

#[derive(Clone, Default)]
pub(crate) struct AddrMap {
    slots: Vec<Slot>,
    len: usize,
}

/// Distances from here on are stored as 255, "hash again". Small in unit tests, so that
/// the property test exercises that path all the time.
const SATURATED: usize = if cfg!(test) { 3 } else { 254 };

#[inline]
fn stored_dist(d: usize) -> u8 {
    if d < SATURATED {
        d as u8 + 1
    } else {
        255
    }
}

#[inline]
fn hash(pid: u32, addr: u64) -> usize {
    // foldhash's folded multiply: the 128-bit product's halves xor-ed, so every input bit
    // reaches the low bits that pick the slot (aligned addresses differ only in high bits).
    let x = addr ^ u64::from(pid).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let m = u128::from(x ^ 0x243f_6a88_85a3_08d3) * u128::from(0xa409_3822_299f_31d1u64);
    ((m as u64) ^ ((m >> 64) as u64)) as usize
}

impl AddrMap {
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// Index of the key's slot, or of the empty slot where it would go.
    #[inline]
    fn find(&self, pid: u32, addr: u64) -> usize {
        let mask = self.mask();
        let mut i = hash(pid, addr) & mask;
        loop {
            let s = &self.slots[i];
            if s.dist == 0 || (s.addr == addr && s.pid == pid) {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    #[inline]
    fn dist_of(&self, i: usize, home: usize) -> u8 {
        stored_dist(i.wrapping_sub(home) & self.mask())
    }

    /// Distance of the entry at `i` from its home slot.
    #[inline]
    fn distance(&self, i: usize) -> usize {
        let s = &self.slots[i];
        if s.dist < 255 {
            usize::from(s.dist) - 1
        } else {
            i.wrapping_sub(hash(s.pid, s.addr)) & self.mask()
        }
    }

    /// Inserts; returns the allocation the key held before.
    #[inline]
    pub fn insert(&mut self, pid: u32, addr: u64, a: Alloc) -> Option<Alloc> {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let home = hash(pid, addr) & self.mask();
        let i = self.find(pid, addr);
        let dist = self.dist_of(i, home);
        let s = &mut self.slots[i];
        let old = if s.dist != 0 { Some(s.alloc()) } else { None };
        if old.is_none() {
            self.len += 1;
        }
        *s = Slot { addr, size: a.size, ts: a.ts, pid, device: a.device, class: a.class, dist };
        old
    }

    #[cfg(test)]
    pub fn get(&self, pid: u32, addr: u64) -> Option<Alloc> {
        if self.len == 0 {
            return None;
        }
        let s = &self.slots[self.find(pid, addr)];
        if s.dist != 0 {
            Some(s.alloc())
        } else {
            None
        }
    }

    #[inline]
    pub fn remove(&mut self, pid: u32, addr: u64) -> Option<Alloc> {
        if self.len == 0 {
            return None;
        }
        let mask = self.mask();
        let mut hole = self.find(pid, addr);
        if self.slots[hole].dist == 0 {
            return None;
        }
        let out = self.slots[hole].alloc();
        self.len -= 1;
        // Backward shift: pull later members of the run into the hole unless that would
        // move them before their home slot.
        let mut j = (hole + 1) & mask;
        while self.slots[j].dist != 0 {
            let d = self.distance(j);
            let gap = j.wrapping_sub(hole) & mask;
            if d >= gap {
                let mut s = self.slots[j];
                s.dist = stored_dist(d - gap);
                self.slots[hole] = s;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.slots[hole].dist = 0;
        Some(out)
    }

    /// Keeps the entries for which `keep` is true (rebuilds the table: O(capacity)).
    pub fn retain(&mut self, mut keep: impl FnMut(u32, u64, &Alloc) -> bool) {
        let old = std::mem::take(&mut self.slots);
        self.len = 0;
        for s in old.iter().filter(|s| s.dist != 0) {
            if keep(s.pid, s.addr, &s.alloc()) {
                self.insert(s.pid, s.addr, s.alloc());
            }
        }
    }

    /// (pid, address, allocation), in table order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u64, Alloc)> + '_ {
        self.slots.iter().filter(|s| s.dist != 0).map(|s| (s.pid, s.addr, s.alloc()))
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); cap]);
        for mut s in old.into_iter().filter(|s| s.dist != 0) {
            let home = hash(s.pid, s.addr) & self.mask();
            let i = self.find(s.pid, s.addr);
            s.dist = self.dist_of(i, home);
            self.slots[i] = s;
        }
    }
}

impl std::fmt::Debug for AddrMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter().map(|(p, a, v)| ((p, a), v))).finish()
    }
}

impl Serialize for AddrMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.len))?;
        for (pid, addr, a) in self.iter() {
            m.serialize_entry(&(pid, addr), &a)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for AddrMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AddrMap;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of (pid, address) to allocations")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<AddrMap, A::Error> {
                let mut m = AddrMap::default();
                while let Some(((pid, addr), a)) = access.next_entry::<(u32, u64), Alloc>()? {
                    m.insert(pid, addr, a);
                }
                Ok(m)
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn a(size: u64) -> Alloc {
        Alloc { size, ts: size * 3, device: (size % 5) as i16, class: (size % 7) as u8 }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32, u64, u64),
        Remove(u32, u64),
        Get(u32, u64),
        RetainOddPids,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct pids and addresses, some sharing their low bits: long probe runs,
        // removals in the middle of runs and wrap-around at the table's end all happen.
        let pid = 0u32..4;
        let addr = prop_oneof![0u64..64, (0u64..64).prop_map(|x| x << 32), (0u64..64).prop_map(|x| x * 4096)];
        prop_oneof![
            4 => (pid.clone(), addr.clone(), 1u64..1000).prop_map(|(p, a, s)| Op::Insert(p, a, s)),
            3 => (pid.clone(), addr.clone()).prop_map(|(p, a)| Op::Remove(p, a)),
            2 => (pid, addr).prop_map(|(p, a)| Op::Get(p, a)),
            1 => Just(Op::RetainOddPids),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// The table behaves exactly as std's HashMap under any sequence of operations.
        #[test]
        fn same_as_std_hashmap(ops in proptest::collection::vec(op(), 1..600)) {
            let mut m = AddrMap::default();
            let mut r: HashMap<(u32, u64), Alloc> = HashMap::new();
            for o in ops {
                match o {
                    Op::Insert(p, ad, s) => prop_assert_eq!(m.insert(p, ad, a(s)), r.insert((p, ad), a(s))),
                    Op::Remove(p, ad) => prop_assert_eq!(m.remove(p, ad), r.remove(&(p, ad))),
                    Op::Get(p, ad) => prop_assert_eq!(m.get(p, ad), r.get(&(p, ad)).copied()),
                    Op::RetainOddPids => {
                        m.retain(|p, _, _| p % 2 == 1);
                        r.retain(|k, _| k.0 % 2 == 1);
                    }
                }
                prop_assert_eq!(m.len(), r.len());
            }
            let mut want: Vec<_> = r.iter().map(|(k, v)| (k.0, k.1, *v)).collect();
            want.sort_by_key(|x| (x.0, x.1));
            prop_assert_eq!(sorted(&m), want);
        }
    }

    #[test]
    fn serde_round_trip() {
        let mut m = AddrMap::default();
        for i in 0..1000u64 {
            m.insert((i % 3) as u32, i << 12, a(i + 1));
        }
        let bytes = postcard::to_allocvec(&m).expect("serialise");
        let back: AddrMap = postcard::from_bytes(&bytes).expect("deserialise");
        assert_eq!(sorted(&m), sorted(&back));
    }

    /// The entries in key order.
    fn sorted(m: &AddrMap) -> Vec<(u32, u64, Alloc)> {
        let mut v: Vec<_> = m.iter().collect();
        v.sort_by_key(|e| (e.0, e.1));
        v
    }

    #[test]
    fn stays_at_most_half_full() {
        let mut m = AddrMap::default();
        for i in 0..100_000u64 {
            m.insert(1, 0x7f00_0000_0000 + (i << 21), a(i + 1));
            assert!(m.len() * 2 <= m.slots.len());
        }
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }
}
