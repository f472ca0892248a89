//! Bounded time series: at most `cap` buckets, each keeping the first time, the minimum,
//! the maximum and the last value seen in it. When the buckets overflow, their width
//! doubles and neighbours merge, so peaks and troughs survive any amount of input.

use serde::{Serialize, Serializer};

/// Default bound on points per series.
pub const DEFAULT_POINTS: usize = 2000;

#[derive(Clone, Copy, Debug, PartialEq)]
struct Bucket {
    idx: u64,
    t: u64,
    min: f64,
    max: f64,
    last: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    origin: u64,
    width: u64,
    cap: usize,
    buckets: Vec<Bucket>,
    /// Where the last bucket ends: points before it join it without a division.
    last_end: u64,
    fixed_origin: bool,
}

/// One output point: `[t_ns, min, max, last]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub t_ns: u64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
}

impl Serialize for Point {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.t_ns, num(self.min), num(self.max), num(self.last)).serialize(s)
    }
}

/// Whole numbers serialise as integers (bytes stay exact in JSON).
#[derive(Clone, Copy, Debug)]
pub struct Num(pub f64);

impl Serialize for Num {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        if v.is_finite() && v.fract() == 0.0 && (0.0..9.007e15).contains(&v) {
            s.serialize_u64(v as u64)
        } else if v.is_finite() {
            s.serialize_f64(v)
        } else {
            s.serialize_f64(0.0)
        }
    }
}

fn num(v: f64) -> Num {
    Num(v)
}

impl Default for Series {
    fn default() -> Self {
        Series::new(DEFAULT_POINTS)
    }
}

impl Series {
    pub fn new(cap: usize) -> Series {
        Series { origin: 0, width: 1000, cap: cap.max(4), buckets: Vec::new(), last_end: 0, fixed_origin: false }
    }

    /// A series on a shared grid: buckets counted from `origin` (not from its first point)
    /// and `width` wide to begin with. Series on one grid share bucket edges.
    pub fn on_grid(cap: usize, origin: u64, width: u64) -> Series {
        Series { origin, width: width.max(1), fixed_origin: true, ..Series::new(cap) }
    }

    /// Merges buckets until they are at least `width` wide (a grid that widened).
    pub fn coarsen_to(&mut self, width: u64) {
        if self.width < width {
            while self.width < width {
                self.halve();
            }
            self.last_end = self.bucket_end().unwrap_or(0);
        }
    }

    /// Adds a point; a point before the last bucket's end (also one that went back in
    /// time) joins the last bucket without a division: the per-event case.
    #[inline]
    pub fn push(&mut self, t: u64, v: f64) {
        if t < self.last_end {
            if let Some(b) = self.buckets.last_mut() {
                // Plain compares, not f64::min/max (their NaN handling costs more; no value
                // pushed here is NaN).
                if v < b.min {
                    b.min = v;
                }
                if v > b.max {
                    b.max = v;
                }
                b.last = v;
                return;
            }
        }
        self.push_new(t, v);
    }

    #[inline(never)]
    fn push_new(&mut self, t: u64, v: f64) {
        if self.buckets.is_empty() && !self.fixed_origin {
            self.origin = t;
        }
        let t = match self.buckets.last() {
            Some(b) if t < b.t => b.t,
            _ => t,
        };
        if t < self.last_end {
            if let Some(b) = self.buckets.last_mut() {
                b.min = b.min.min(v);
                b.max = b.max.max(v);
                b.last = v;
                return;
            }
        }
        let idx = (t - self.origin.min(t)) / self.width;
        if let Some(b) = self.buckets.last_mut() {
            if b.idx >= idx {
                b.min = b.min.min(v);
                b.max = b.max.max(v);
                b.last = v;
                return;
            }
        }
        self.buckets.push(Bucket { idx, t, min: v, max: v, last: v });
        while self.buckets.len() > self.cap {
            self.halve();
        }
        self.last_end = self.bucket_end().unwrap_or(0);
    }

    /// End (exclusive) of the last bucket's time range; `None` while empty.
    pub fn bucket_end(&self) -> Option<u64> {
        self.buckets.last().map(|b| self.origin.saturating_add(b.idx.saturating_add(1).saturating_mul(self.width)))
    }

    fn halve(&mut self) {
        self.width = self.width.saturating_mul(2);
        let mut out: Vec<Bucket> = Vec::with_capacity(self.buckets.len() / 2 + 1);
        for b in &self.buckets {
            let idx = b.idx / 2;
            match out.last_mut() {
                Some(o) if o.idx == idx => {
                    o.min = o.min.min(b.min);
                    o.max = o.max.max(b.max);
                    o.last = b.last;
                }
                _ => out.push(Bucket { idx, ..*b }),
            }
        }
        self.buckets = out;
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn last(&self) -> Option<f64> {
        self.buckets.last().map(|b| b.last)
    }

    pub fn max(&self) -> Option<f64> {
        self.buckets.iter().map(|b| b.max).reduce(f64::max)
    }

    pub fn points(&self) -> Vec<Point> {
        self.buckets.iter().map(|b| Point { t_ns: b.t, min: b.min, max: b.max, last: b.last }).collect()
    }

    /// Points restricted to `[from, to]`.
    pub fn points_in(&self, from: u64, to: u64) -> Vec<Point> {
        self.points().into_iter().filter(|p| p.t_ns >= from && p.t_ns <= to).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_keeps_extremes() {
        let mut s = Series::new(100);
        for i in 0..100_000u64 {
            let v = if i == 54_321 {
                1e9
            } else if i == 7_777 {
                -5.0
            } else {
                (i % 10) as f64
            };
            s.push(i * 1000, v);
        }
        assert!(s.len() <= 100);
        assert_eq!(s.max(), Some(1e9));
        assert!(s.points().iter().any(|p| p.min == -5.0));
        assert_eq!(s.last(), Some((99_999 % 10) as f64));
    }

    #[test]
    fn time_going_backwards_is_clamped() {
        let mut s = Series::new(10);
        s.push(5_000, 1.0);
        s.push(1_000, 2.0);
        assert_eq!(s.len(), 1);
        assert_eq!(s.last(), Some(2.0));
    }
}
