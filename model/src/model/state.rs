//! The model's internal state: what it keeps per handle, mapping, reservation, pool,
//! segment, device and incident (serialised whole in checkpoints).

use super::*;

/// Serialises events as [`EventRecord`]s (the protocol's `Event` has no serde).
pub(super) mod events_as_records {
    use crate::types::EventRecord;
    use serde::{Deserialize, Deserializer, Serializer};
    use vramhook_protocol::Event;

    pub fn serialize<S: Serializer>(v: &[Event], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(EventRecord::from))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Event>, D::Error> {
        Ok(Vec::<EventRecord>::deserialize(d)?.iter().map(Event::from).collect())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Handle {
    pub(super) size: u64,
    pub(super) ts: u64,
    pub(super) device: i16,
    pub(super) class: u8,
    pub(super) released: bool,
    pub(super) maps: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Mapping {
    pub(super) size: u64,
    pub(super) handle: u64,
    pub(super) offset: u64,
    pub(super) ts: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Gaps {
    pub(super) sizes: BTreeMap<u64, u32>,
    pub(super) total: u64,
}

impl Gaps {
    #[inline]
    pub(super) fn add(&mut self, s: u64) {
        if s > 0 {
            *self.sizes.entry(s).or_insert(0) += 1;
            self.total += s;
        }
    }
    #[inline]
    pub(super) fn remove(&mut self, s: u64) {
        if s == 0 {
            return;
        }
        if let Some(c) = self.sizes.get_mut(&s) {
            *c -= 1;
            if *c == 0 {
                self.sizes.remove(&s);
            }
            self.total = self.total.saturating_sub(s);
        }
    }
    /// O(log n): the largest key of the multiset.
    pub(crate) fn largest(&self) -> u64 {
        self.sizes.last_key_value().map(|(k, _)| *k).unwrap_or(0)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Reservation {
    pub(super) size: u64,
    pub(super) device: i16,
    pub(super) mappings: BTreeMap<u64, Mapping>,
    pub(super) mapped: u64,
    pub(super) gaps: Gaps,
}

impl Reservation {
    #[inline]
    pub(super) fn numbers(&self) -> (u64, u64) {
        (self.gaps.total, self.gaps.largest())
    }

    /// Marks [s, e) free; it must not overlap a mapping.
    #[inline]
    pub(super) fn free_interval(&mut self, base: u64, s: u64, e: u64) {
        let left = self.mappings.range(..s).next_back().map(|(a, m)| a + m.size).unwrap_or(base);
        let right = self.mappings.range(e..).next().map(|(a, _)| *a).unwrap_or(base + self.size);
        if left < s {
            self.gaps.remove(s - left);
        }
        if right > e {
            self.gaps.remove(right - e);
        }
        self.gaps.add(right - left);
    }

    /// Marks [s, e) occupied; it must lie inside one gap (checked by the caller).
    #[inline]
    pub(super) fn occupy_interval(&mut self, base: u64, s: u64, e: u64) {
        let left = self.mappings.range(..s).next_back().map(|(a, m)| a + m.size).unwrap_or(base);
        let right = self.mappings.range(e..).next().map(|(a, _)| *a).unwrap_or(base + self.size);
        self.gaps.remove(right - left);
        self.gaps.add(s - left);
        self.gaps.add(right - e);
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Pool {
    pub(super) device: i16,
    pub(super) live: u64,
    pub(super) count: u64,
    /// High-water live bytes since the last trim (the reserve estimate before rounding).
    pub(super) hwm: u64,
    pub(super) destroyed: bool,
}

impl Pool {
    #[inline]
    pub(super) fn reserve(&self, g: u64) -> u64 {
        round_up(self.hwm, g).max(self.live)
    }
    #[inline]
    pub(super) fn numbers(&self, g: u64) -> (u64, u64) {
        let idle = self.reserve(g) - self.live;
        (idle, idle)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Segment {
    pub(super) size: u64,
    pub(super) device: i16,
    pub(super) ts: u64,
    pub(super) allocated: u64,
    pub(super) blocks: u64,
    pub(super) gaps: Gaps,
}

impl Segment {
    #[inline]
    pub(super) fn numbers(&self) -> (u64, u64) {
        (self.gaps.total, self.gaps.largest())
    }
}

/// Pool key: (pid, is_default, handle or device ordinal).
pub(super) type PoolKey = (u32, bool, u64);

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct DevBytes {
    pub(super) device: i16,
    pub(super) live: u64,
    pub(super) resident: u64,
    /// Highest `live` so far (kept after exit).
    pub(super) peak: u64,
    /// Index in `Model::device_live` (`u32::MAX` until known).
    pub(super) total: u32,
}

/// All processes' live bytes on one device.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct DeviceLive {
    pub(super) device: i16,
    pub(super) live: u64,
    pub(super) peak: u64,
    pub(super) extremes: Extremes,
}

/// A total's lowest and highest value since it was last taken (starting from its value
/// then) and the time of the first change: lets a caller plot a total exactly at its own
/// pace (the analyzer's timeline buckets) without following every event. One compare per
/// change: a total that grew can only have a new highest value, one that shrank a new
/// lowest.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(super) struct Extremes {
    /// `u64::MAX`: no change since the take.
    pub(super) since: u64,
    pub(super) min: u64,
    pub(super) max: u64,
}

impl Extremes {
    pub(super) const UNCHANGED: Extremes = Extremes { since: u64::MAX, min: 0, max: 0 };

    #[inline]
    pub(super) fn grew(&mut self, value: u64, ts: u64) {
        self.max = self.max.max(value);
        self.since = self.since.min(ts);
    }

    #[inline]
    pub(super) fn shrank(&mut self, value: u64, ts: u64) {
        self.min = self.min.min(value);
        self.since = self.since.min(ts);
    }

    #[inline]
    pub(super) fn take(&mut self, value: u64) -> Option<Window> {
        let w = (self.since != u64::MAX).then_some(Window { since_ns: self.since, min: self.min, max: self.max });
        *self = Extremes { since: u64::MAX, min: value, max: value };
        w
    }
}

impl DevBytes {
    /// Carries a change of this process's bytes here into the device's total.
    #[inline(always)]
    pub(super) fn count_in_total(&mut self, totals: &mut Vec<DeviceLive>, grew: bool, size: u64, ts: u64) {
        // Indices are only ever set here (and checked on restore).
        let t = match totals.get(self.total as usize) {
            Some(_) => self.total as usize,
            None => {
                let t = device_index(totals, self.device);
                self.total = t as u32;
                t
            }
        };
        let dl = &mut totals[t];
        if grew {
            dl.live = dl.live.saturating_add(size);
            dl.peak = dl.peak.max(dl.live);
            dl.extremes.grew(dl.live, ts);
        } else {
            dl.live = dl.live.saturating_sub(size);
            dl.extremes.shrank(dl.live, ts);
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct DeviceSample {
    pub(super) total: u64,
    pub(super) free: u64,
    pub(super) ts: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct IncidentState {
    pub(super) view: OomIncident,
    pub(super) inputs: VerdictInputs,
    pub(super) slot: usize,
    pub(super) freed_mark: u64,
    pub(super) events_since: u32,
}

/// Index of `device`'s entry in the device totals, created on first use.
pub(super) fn device_index(totals: &mut Vec<DeviceLive>, device: i16) -> usize {
    match totals.iter().position(|d| d.device == device) {
        Some(i) => i,
        None => {
            totals.push(DeviceLive { device, live: 0, peak: 0, extremes: Extremes::UNCHANGED });
            totals.len() - 1
        }
    }
}
