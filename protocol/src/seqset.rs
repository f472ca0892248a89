//! A set of event sequence numbers kept as ranges.
//!
//! A ring's readers number its events `position * lanes + lane`, so the events a reader
//! handed on form a few long runs of consecutive numbers however many there are: the set
//! of events a capture holds beyond a checkpoint costs a few ranges, not 8 bytes an event.

use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqSet {
    /// start → end (exclusive); ranges never overlap nor touch.
    ranges: BTreeMap<u64, u64>,
    len: u64,
}

impl SeqSet {
    pub fn new() -> SeqSet {
        SeqSet::default()
    }

    /// Builds a set from `[start, end)` ranges (in any order, overlapping or not).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u64, u64)>) -> SeqSet {
        let mut set = SeqSet::new();
        for (start, end) in ranges {
            set.insert_range(start, end);
        }
        set
    }

    /// Numbers in the set.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, seq: u64) -> bool {
        self.ranges.range(..=seq).next_back().is_some_and(|(_, end)| seq < *end)
    }

    pub fn insert(&mut self, seq: u64) {
        self.insert_range(seq, seq.saturating_add(1));
    }

    /// Adds `[start, end)`, merging it with the ranges it overlaps or touches.
    pub fn insert_range(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // The range that starts at or before `start` may reach it.
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back() {
            if e >= start {
                if e >= end {
                    return; // already inside
                }
                start = s;
                self.len -= e - s;
                self.ranges.remove(&s);
            }
        }
        // Ranges that start inside `[start, end]` are swallowed.
        while let Some((&s, &e)) = self.ranges.range(start..=end).next() {
            self.len -= e - s;
            self.ranges.remove(&s);
            end = end.max(e);
        }
        self.len += end - start;
        self.ranges.insert(start, end);
    }

    /// Removes every number below `bound`.
    pub fn remove_below(&mut self, bound: u64) {
        while let Some((&s, &e)) = self.ranges.iter().next() {
            if s >= bound {
                break;
            }
            self.ranges.remove(&s);
            self.len -= e - s;
            if e > bound {
                self.ranges.insert(bound, e);
                self.len += e - bound;
                break;
            }
        }
    }

    /// The ranges, ascending, as `[start, end)`.
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(s, e)| (*s, *e))
    }

    /// Number of ranges (what the set costs).
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    pub fn union_with(&mut self, other: &SeqSet) {
        for (s, e) in other.ranges() {
            self.insert_range(s, e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn interleaved_lanes_collapse_to_one_range() {
        let mut set = SeqSet::new();
        // Four lanes read in time order: 1, 0, 3, 2, 5, 4, ...
        for pair in 0..1000u64 {
            set.insert(pair * 2 + 1);
            set.insert(pair * 2);
        }
        assert_eq!(set.range_count(), 1);
        assert_eq!(set.len(), 2000);
        assert!(set.contains(0) && set.contains(1999) && !set.contains(2000));
    }

    proptest! {
        #[test]
        fn behaves_like_a_btreeset(ops in prop::collection::vec((0u64..200, 0u64..8, any::<bool>()), 0..200), cut in 0u64..220) {
            let mut set = SeqSet::new();
            let mut model = std::collections::BTreeSet::new();
            for (start, len, single) in ops {
                if single {
                    set.insert(start);
                    model.insert(start);
                } else {
                    set.insert_range(start, start + len);
                    model.extend(start..start + len);
                }
            }
            prop_assert_eq!(set.len(), model.len() as u64);
            for x in 0..220 {
                prop_assert_eq!(set.contains(x), model.contains(&x), "{}", x);
            }
            let ranges: Vec<_> = set.ranges().collect();
            for w in ranges.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "ranges neither overlap nor touch: {:?}", ranges);
            }
            set.remove_below(cut);
            model.retain(|x| *x >= cut);
            prop_assert_eq!(set.len(), model.len() as u64);
            for x in 0..220 {
                prop_assert_eq!(set.contains(x), model.contains(&x));
            }
        }
    }
}
