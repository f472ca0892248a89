//! Times as logs write them, for the join with a capture's wall clock.
//!
//! A log line's time is kept as the text it was written as (`time` of a [`LogIncident`]);
//! this module finds that text in a line and turns it into Unix ns. Formats read:
//!
//! - `journalctl -o short` / `short-precise`: `Dec 01 05:06:42[.123456]` (no year, no zone)
//! - `journalctl -o short-iso` / `short-iso-precise`: `2026-12-01T05:06:42[.123456]+0000`
//! - Go's `log/slog` text handler (ollama): `time=2026-12-01T08:15:38.254Z`
//! - Go's `log` package: `2026/12/01 08:15:38`
//! - Python `logging`'s `%(asctime)s`: `2026-12-01 05:06:42,123`
//! - vLLM's logger: `ERROR 12-01 05:00:00 [core.py:708]` (no year, no zone)
//! - glog (XLA, TensorFlow): `W1201 05:06:53.655563` (no year, no zone)
//!
//! A time without a zone is read as UTC; a time without a year takes the year that puts it
//! nearest the capture's clock. Both are assumptions, and the join says when it made them.
//!
//! [`LogIncident`]: super::LogIncident

const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// A time as one log line wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogTime {
    pub year: Option<i64>,
    pub month: u32,
    pub day: u32,
    /// Nanoseconds since midnight.
    pub ns_of_day: u64,
    /// Seconds east of UTC; `None`: the log gave no zone.
    pub utc_offset_s: Option<i64>,
}

impl LogTime {
    /// Unix ns. A time without a year takes the year (of `reference`'s, the one before or
    /// the one after) that puts it nearest `reference` (Unix ns); without a reference it
    /// has none. A time without a zone is read as UTC.
    pub fn unix_ns(&self, reference: Option<u64>) -> Option<u64> {
        let at = |year: i64| -> Option<i128> {
            let days = days_from_civil(year, self.month, self.day)?;
            let secs = i128::from(days) * 86_400 - i128::from(self.utc_offset_s.unwrap_or(0));
            Some(secs * 1_000_000_000 + self.ns_of_day as i128)
        };
        let ns = match (self.year, reference) {
            (Some(y), _) => at(y)?,
            (None, Some(r)) => {
                let (year, _, _) = civil_from_days((r / 1_000_000_000 / 86_400) as i64);
                [year - 1, year, year + 1].into_iter().filter_map(at).min_by_key(|t| (t - r as i128).unsigned_abs())?
            }
            (None, None) => return None,
        };
        u64::try_from(ns).ok()
    }

    /// Whether reading it needed an assumption: no year, or no zone.
    pub fn assumed(&self) -> Vec<&'static str> {
        let mut a = Vec::new();
        if self.utc_offset_s.is_none() {
            a.push("no zone: read as UTC");
        }
        if self.year.is_none() {
            a.push("no year: the capture's");
        }
        a
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm); `None` for a date
/// that does not exist.
fn days_from_civil(year: i64, month: u32, day: u32) -> Option<i64> {
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(month) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `n` ASCII digits at `b[at..]` as a number.
fn digits(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let s = b.get(at..at + n)?;
    s.iter().try_fold(0u32, |v, c| c.is_ascii_digit().then(|| v * 10 + u32::from(c - b'0')))
}

/// `HH:MM:SS` at `b[at..]`, then an optional `.fraction` or `,fraction`: (ns of day, bytes used).
fn clock(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let (h, m, s) = (digits(b, at, 2)?, digits(b, at + 3, 2)?, digits(b, at + 6, 2)?);
    if b[at + 2] != b':' || b[at + 5] != b':' || h > 23 || m > 59 || s > 60 {
        return None;
    }
    let mut ns = (u64::from(h) * 3600 + u64::from(m) * 60 + u64::from(s)) * 1_000_000_000;
    let mut used = 8;
    if matches!(b.get(at + 8), Some(b'.' | b',')) {
        let frac: Vec<u8> = b[at + 9..].iter().take_while(|c| c.is_ascii_digit()).copied().collect();
        if !frac.is_empty() {
            let mut scale = 100_000_000u64;
            for c in frac.iter().take(9) {
                ns += u64::from(c - b'0') * scale;
                scale /= 10;
            }
            used += 1 + frac.len();
        }
    }
    Some((ns, used))
}

/// `Z`, `+HH:MM`, `+HHMM` or `+HH` at `b[at..]`: (seconds east of UTC, bytes used).
fn zone(b: &[u8], at: usize) -> Option<(i64, usize)> {
    match b.get(at)? {
        b'Z' => Some((0, 1)),
        sign @ (b'+' | b'-') => {
            let h = i64::from(digits(b, at + 1, 2)?);
            let (m, used) = match (b.get(at + 3), digits(b, at + 3, 2), digits(b, at + 4, 2)) {
                (Some(b':'), _, Some(m)) => (i64::from(m), 6),
                (_, Some(m), _) => (i64::from(m), 5),
                _ => (0, 3),
            };
            let off = (h * 3600 + m * 60) * if *sign == b'-' { -1 } else { 1 };
            Some((off, used))
        }
        _ => None,
    }
}

/// `YYYY-MM-DD` (or with `sep` instead of `-`) then `T` or a space and the clock, an
/// optional zone: the time and its length.
fn iso(b: &[u8], sep: u8) -> Option<(LogTime, usize)> {
    let (y, mo, d) = (digits(b, 0, 4)?, digits(b, 5, 2)?, digits(b, 8, 2)?);
    if b[4] != sep || b[7] != sep || !matches!(b.get(10)?, b'T' | b' ') {
        return None;
    }
    let (ns, used) = clock(b, 11)?;
    let mut len = 11 + used;
    let utc_offset_s = zone(b, len).map(|(off, n)| {
        len += n;
        off
    });
    days_from_civil(i64::from(y), mo, d)?;
    Some((LogTime { year: Some(i64::from(y)), month: mo, day: d, ns_of_day: ns, utc_offset_s }, len))
}

/// `Dec 01 05:06:42[.frac]` (journalctl short, syslog): the time and its length.
fn syslog(b: &[u8]) -> Option<(LogTime, usize)> {
    let month = MONTHS.iter().position(|m| b.get(..3) == Some(m.as_bytes()))? as u32 + 1;
    if b.get(3) != Some(&b' ') {
        return None;
    }
    let day = match (b.get(4)?, b.get(5)?) {
        (b' ', d) if d.is_ascii_digit() => u32::from(d - b'0'),
        _ => digits(b, 4, 2)?,
    };
    if b.get(6) != Some(&b' ') || !(1..=31).contains(&day) {
        return None;
    }
    let (ns, used) = clock(b, 7)?;
    Some((LogTime { year: None, month, day, ns_of_day: ns, utc_offset_s: None }, 7 + used))
}

/// `MM-DD HH:MM:SS` (vLLM) or `MMDD HH:MM:SS.frac` (glog, its level letter removed).
fn month_day(b: &[u8]) -> Option<(LogTime, usize)> {
    let (month, day, at) = if b.get(2) == Some(&b'-') {
        (digits(b, 0, 2)?, digits(b, 3, 2)?, 6)
    } else {
        (digits(b, 0, 2)?, digits(b, 2, 2)?, 5)
    };
    if b.get(at - 1) != Some(&b' ') || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (ns, used) = clock(b, at)?;
    Some((LogTime { year: None, month, day, ns_of_day: ns, utc_offset_s: None }, at + used))
}

/// Reads a time token exactly as [`find`] returns it (and as `LogIncident::time` keeps it).
pub fn parse(token: &str) -> Option<LogTime> {
    let b = token.as_bytes();
    let t = token.strip_prefix("time=").map(str::as_bytes).unwrap_or(b);
    iso(t, b'-').or_else(|| iso(t, b'/')).or_else(|| syslog(t)).or_else(|| month_day(t)).map(|(t, _)| t)
}

/// Where a line (its journal prefix already removed) says when it was written: the time's
/// text, if the line starts with one of the formats above. Cheap on lines that have none:
/// it looks at a few bytes first.
pub fn find(text: &str) -> Option<&str> {
    let b = text.as_bytes();
    let first = *b.first()?;
    let take = |from: usize, len: usize| text.get(from..from + len);
    if first.is_ascii_digit() {
        if let Some((_, n)) = iso(b, b'-').or_else(|| iso(b, b'/')) {
            return take(0, n);
        }
        return None;
    }
    match first {
        b't' if b.starts_with(b"time=") => iso(&b[5..], b'-').and_then(|(_, n)| take(0, 5 + n)),
        b'[' => iso(&b[1..], b'-').and_then(|(_, n)| take(1, n)),
        b'I' | b'W' | b'E' | b'F' if b.get(1).is_some_and(u8::is_ascii_digit) => {
            month_day(&b[1..]).and_then(|(_, n)| take(1, n))
        }
        _ => syslog(b).and_then(|(_, n)| take(0, n)).or_else(|| vllm(text)),
    }
}

/// vLLM: `[(EngineCore_DP0 pid=245) ]LEVEL MM-DD HH:MM:SS [file:line] …`.
fn vllm(text: &str) -> Option<&str> {
    let rest = match text.strip_prefix('(') {
        Some(r) => &r[r.find(") ")? + 2..],
        None => text,
    };
    let level = rest.find(' ')?;
    if !matches!(&rest[..level], "DEBUG" | "INFO" | "WARNING" | "ERROR" | "CRITICAL") {
        return None;
    }
    let after = &rest[level + 1..];
    let (_, n) = month_day(after.as_bytes())?;
    after.get(..n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(token: &str, reference: Option<u64>) -> Option<u64> {
        parse(token)?.unix_ns(reference)
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn each_format_is_found_and_read() {
        // 2026-12-01T08:15:38Z
        let t = 1_796_112_938 * S;
        let cases = [
            ("time=2026-12-01T08:15:38.254Z level=INFO msg=x", "time=2026-12-01T08:15:38.254Z", t + 254_000_000),
            ("2026-12-01 08:15:38,123 - root - ERROR - boom", "2026-12-01 08:15:38,123", t + 123_000_000),
            ("[2026-12-01 08:15:38] boom", "2026-12-01 08:15:38", t),
            ("2026/12/01 08:15:38 server.go:1 boom", "2026/12/01 08:15:38", t),
            ("2026-12-01T09:15:38+0100 gpu1 x[1]: y", "2026-12-01T09:15:38+0100", t),
            ("2026-12-01T03:15:38.5-05:00 gpu1 x[1]: y", "2026-12-01T03:15:38.5-05:00", t + 500_000_000),
            ("W1201 08:15:38.655563     722 bfc_allocator.cc:598] x", "1201 08:15:38.655563", t + 655_563_000),
            ("(EngineCore_DP0 pid=245) ERROR 12-01 08:15:38 [core.py:708] x", "12-01 08:15:38", t),
            ("INFO 12-01 08:15:38 [api_server.py:1] x", "12-01 08:15:38", t),
        ];
        for (line, token, want) in cases {
            assert_eq!(find(line), Some(token), "{line}");
            assert_eq!(unix(token, Some(t)), Some(want), "{token}");
        }
        assert_eq!(unix("Dec 01 08:15:38", Some(t)), Some(t));
        assert_eq!(unix("Dec  1 08:15:38.000001", Some(t)), Some(t + 1000));
    }

    #[test]
    fn lines_without_a_time_have_none() {
        for line in [
            "",
            "torch.OutOfMemoryError: CUDA out of memory.",
            "2026-13-01 08:15:38 month 13",
            "2026-02-30 08:15:38 no such day",
            "12345 not a time",
            "INFO:     127.0.0.1:50000 - \"POST /v1/completions HTTP/1.1\" 200 OK",
            "ERROR 12-01 boom",
            "Warning: something",
            "[…] NVRM: Xid (0000:03:00): 14",
            "(EngineCore_DP0 pid=245",
        ] {
            assert_eq!(find(line), None, "{line}");
        }
    }

    #[test]
    fn a_year_less_time_takes_the_nearest_year() {
        // 2027-01-01T00:00:02Z as the reference: "Dec 31 23:59:58" is the day before, not
        // 2027-12-31.
        let reference = 1_798_761_602 * S;
        assert_eq!(unix("Dec 31 23:59:58", Some(reference)), Some(reference - 4 * S));
        assert_eq!(unix("Dec 31 23:59:58", None), None, "no year and nothing to take it from");
        let t = parse("Dec 31 23:59:58").expect("parse");
        assert_eq!(t.assumed(), vec!["no zone: read as UTC", "no year: the capture's"]);
        assert!(parse("2026-12-01T08:15:38Z").expect("parse").assumed().is_empty());
    }
}
