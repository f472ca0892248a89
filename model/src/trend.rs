//! Where a series is headed: the least-squares line through its recent samples, as
//! Prometheus's `predict_linear` draws it, so that `vramhook analyze --fit-trend` forecasts
//! the fit of the next large request from a capture as a `predict_linear` rule over the
//! agent's live series would.

/// A trend rule's three times, in ns: the samples looked at (the range of
/// `predict_linear(supply[window])`), how far ahead it looks (its second argument) and how
/// long the forecast must hold before it counts (an alert's `for:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrendRule {
    pub window_ns: u64,
    pub horizon_ns: u64,
    pub hold_ns: u64,
}

/// The value of the least-squares line through `samples` (time in ns, value) at
/// `at_ns + horizon_ns`, the line's intercept taken at `at_ns` (Prometheus's
/// `predict_linear(v[range], horizon)` evaluated at `at_ns` over the samples in the range).
/// `None` with fewer than two samples or all at one time: no line.
pub fn predict_linear(samples: &[(u64, f64)], at_ns: u64, horizon_ns: u64) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    // Seconds from the evaluation time, as Prometheus measures them (small numbers: the
    // sums keep their precision).
    let x = |t: u64| (t as f64 - at_ns as f64) / 1e9;
    let n = samples.len() as f64;
    let (mut sx, mut sy) = (0.0, 0.0);
    for &(t, v) in samples {
        sx += x(t);
        sy += v;
    }
    let (mx, my) = (sx / n, sy / n);
    let (mut cov, mut var) = (0.0, 0.0);
    for &(t, v) in samples {
        let dx = x(t) - mx;
        cov += dx * (v - my);
        var += dx * dx;
    }
    if var == 0.0 {
        return None;
    }
    let slope = cov / var;
    let intercept = my - slope * mx;
    Some(intercept + slope * horizon_ns as f64 / 1e9)
}

/// The line's slope through `samples`, per second (`None` as for [`predict_linear`]).
pub fn slope_per_second(samples: &[(u64, f64)]) -> Option<f64> {
    let at = samples.last()?.0;
    Some(predict_linear(samples, at, 1_000_000_000)? - predict_linear(samples, at, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_straight_line_is_continued() {
        // 10 GiB falling 1 MiB a second, sampled every 15 s for 5 minutes.
        let samples: Vec<(u64, f64)> =
            (0..=20).map(|i| (i * 15 * S, 10_737_418_240.0 - (i * 15) as f64 * 1_048_576.0)).collect();
        let at = 300 * S;
        let in_10m = predict_linear(&samples, at, 600 * S).expect("a line");
        assert!((in_10m - (10_737_418_240.0 - 900.0 * 1_048_576.0)).abs() < 1.0, "{in_10m}");
        let slope = slope_per_second(&samples).expect("a slope");
        assert!((slope + 1_048_576.0).abs() < 1e-3, "{slope}");
    }

    #[test]
    fn the_least_squares_line_of_scattered_points() {
        // y = 2, 4, 3, 7 at t = 0, 1, 2, 3 s: slope 1.4, mean 4 at t = 1.5 s, so 6.1 at
        // 3 s and 8.9 two seconds later (by hand, as promtool's predict_linear gives it).
        let samples = [(0, 2.0), (S, 4.0), (2 * S, 3.0), (3 * S, 7.0)];
        let p = predict_linear(&samples, 3 * S, 2 * S).expect("a line");
        assert!((p - 8.9).abs() < 1e-9, "{p}");
        assert!((slope_per_second(&samples).expect("slope") - 1.4).abs() < 1e-9);
    }

    #[test]
    fn no_line_from_one_sample_or_one_instant() {
        assert_eq!(predict_linear(&[(S, 1.0)], S, S), None);
        assert_eq!(predict_linear(&[(S, 1.0), (S, 2.0)], S, S), None);
        assert_eq!(predict_linear(&[], S, S), None);
    }
}
