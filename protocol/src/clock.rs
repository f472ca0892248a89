//! Timestamps. The interposer stamps events with the cheapest clock that is good enough:
//! the invariant TSC on x86-64 (a few ns) rather than `clock_gettime` (about 33 ns on the
//! GPU machine). Readers on the same host convert TSC ticks to CLOCK_MONOTONIC ns.

/// Which clock a ring's timestamps come from (ring header `clock_source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ClockSource {
    Monotonic = 0,
    Tsc = 1,
}

pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

pub fn wall_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// The TSC, read after every earlier instruction has executed and before any later one
/// starts (`lfence` on both sides): the ring reader's watermark must not be read after the
/// loads that follow it.
pub fn read_tsc_ordered() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: lfence and rdtsc have no preconditions on x86-64.
        unsafe {
            core::arch::x86_64::_mm_lfence();
            let t = core::arch::x86_64::_rdtsc();
            core::arch::x86_64::_mm_lfence();
            t
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        read_tsc()
    }
}

/// Reads the time-stamp counter (0 where there is none).
#[inline(always)]
pub fn read_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// True when the CPU advertises an invariant TSC (constant rate, runs in all C-states),
/// so that ticks from any core and process on this host share one time base.
pub fn tsc_is_invariant() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let max_ext = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        if max_ext < 0x8000_0007 {
            return false;
        }
        core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Converts TSC ticks into monotonic nanoseconds, calibrated by the reader.
#[derive(Clone, Copy, Debug)]
pub struct TscClock {
    ns_per_tick: f64,
}

impl TscClock {
    /// Measures the TSC rate against CLOCK_MONOTONIC over `window`. `None` if the TSC is
    /// not invariant.
    pub fn calibrate(window: std::time::Duration) -> Option<TscClock> {
        if !tsc_is_invariant() {
            return None;
        }
        let (t0, m0) = pair();
        std::thread::sleep(window);
        let (t1, m1) = pair();
        let ticks = t1.checked_sub(t0)?;
        let ns = m1.checked_sub(m0)?;
        if ticks == 0 || ns == 0 {
            return None;
        }
        Some(TscClock { ns_per_tick: ns as f64 / ticks as f64 })
    }

    pub fn from_ns_per_tick(ns_per_tick: f64) -> TscClock {
        TscClock { ns_per_tick }
    }

    /// A (tsc, monotonic ns) pair taken now.
    pub fn now_pair(&self) -> (u64, u64) {
        pair()
    }

    /// Converts `tsc` using a recent reference pair, so that calibration error only
    /// scales with the event's age, not with the process's.
    pub fn to_monotonic(&self, tsc: u64, tsc_now: u64, mono_now: u64) -> u64 {
        if tsc <= tsc_now {
            let age = ((tsc_now - tsc) as f64 * self.ns_per_tick) as u64;
            mono_now.saturating_sub(age)
        } else {
            mono_now.saturating_add(((tsc - tsc_now) as f64 * self.ns_per_tick) as u64)
        }
    }
}

/// A tsc/monotonic pair taken as close together as possible.
fn pair() -> (u64, u64) {
    let a = read_tsc();
    let m = monotonic_ns();
    let b = read_tsc();
    (a / 2 + b / 2, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_is_monotonic_and_close() {
        let Some(clock) = TscClock::calibrate(std::time::Duration::from_millis(20)) else {
            eprintln!("NOTE: no invariant TSC on this machine; TSC conversion not exercised");
            return;
        };
        let t = read_tsc();
        let m = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (tn, mn) = clock.now_pair();
        let converted = clock.to_monotonic(t, tn, mn);
        let err = converted.abs_diff(m);
        assert!(err < 200_000, "conversion off by {err} ns");
    }
}
