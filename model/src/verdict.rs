//! The OOM verdict rule and its explanation text.

use crate::types::*;
use vramhook_protocol::Api;

/// Decides a verdict from what was known at the failure.
///
/// Precedence (the first that holds wins), with `R` the request, `F` the device's free bytes,
/// `G` the granularity:
/// 1. **Unknown** — no device sample: "no device memory sample".
/// 2. **Granularity** — `R ≤ F < round_up(R, G)`: the bytes were there, not once rounded to pages.
/// 3. **Unknown** — `F ≥ round_up(R, G)`: the device had room; the failure is not explained by
///    memory counts (limits, MIG, a concurrent allocation by another process since the sample).
/// 4. **ArenaFragmentation** — `F < R` and one of this process's arenas on the device had
///    `free_in_arena ≥ R` but `largest_free_span < R`: the process had the bytes but in pieces,
///    so it had to ask the driver for more. Checked before the idle-byte rules because it says
///    why the process went to the driver at all.
/// 5. **Reclaimable** — `F < R ≤ F + own_idle`: releasing this process's idle cache would have covered it.
/// 6. **OtherProcess** — `F + own_idle < R ≤ F + own_idle + other_idle`.
/// 7. **Capacity** — `F + own_idle + other_idle < R`: even every idle traced byte would not cover it.
pub fn decide_verdict(i: &VerdictInputs) -> (Verdict, Option<String>) {
    let r = i.requested;
    let Some(f) = i.device_free else {
        return (Verdict::Unknown, Some("no device memory sample (cuMemGetInfo) was known for this device".into()));
    };
    let rounded = round_up(r, i.granularity);
    if r <= f && f < rounded {
        return (Verdict::Granularity, None);
    }
    if f >= rounded {
        return (
            Verdict::Unknown,
            Some(format!(
                "the device reported {} free, enough for the request even rounded to {}; the failure is not explained \
                 by memory counts (a limit, MIG, or another allocation after the sample)",
                fmt_bytes(f),
                fmt_bytes(rounded)
            )),
        );
    }
    if i.arenas.iter().any(|a| a.free_in_arena >= r && a.largest_free_span < r) {
        return (Verdict::ArenaFragmentation, None);
    }
    if r <= f.saturating_add(i.own_idle) {
        return (Verdict::Reclaimable, None);
    }
    if r <= f.saturating_add(i.own_idle).saturating_add(i.other_idle) {
        return (Verdict::OtherProcess, None);
    }
    (Verdict::Capacity, None)
}

pub(crate) struct ExplainCtx<'a> {
    pub pid: u32,
    pub command: &'a str,
    pub api: Api,
    pub device: i16,
    pub ts_ns: u64,
    pub sample_ts_ns: Option<u64>,
    pub sample_after_failure: bool,
    pub inputs: &'a VerdictInputs,
    pub verdict: Verdict,
    pub unknown_reason: Option<&'a str>,
}

fn secs(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

pub(crate) fn explain(c: &ExplainCtx<'_>) -> String {
    let i = c.inputs;
    let who =
        if c.command.is_empty() { format!("process {}", c.pid) } else { format!("process {} ({})", c.pid, c.command) };
    let gpu = if c.device < 0 { "an unknown GPU".to_string() } else { format!("GPU {}", c.device) };
    let mut s = format!("{who} asked for {} ({}) on {gpu} at {}; ", fmt_bytes(i.requested), c.api, secs(c.ts_ns));
    match (i.device_free, i.device_total) {
        (Some(f), t) => {
            let of = t.map(|t| format!(" of {}", fmt_bytes(t))).unwrap_or_default();
            let when = if c.sample_after_failure {
                "right after the failure".to_string()
            } else {
                format!("in a sample taken at {} (before the failure)", secs(c.sample_ts_ns.unwrap_or(0)))
            };
            s += &format!("the device had {} free{of} {when}", fmt_bytes(f));
        }
        (None, _) => s += "no device memory sample was known",
    }
    s += &format!(
        "; this process held {} idle (pool reserve and framework cache) and other traced processes {} on that device. ",
        fmt_bytes(i.own_idle),
        fmt_bytes(i.other_idle)
    );
    let f = i.device_free.unwrap_or(0);
    match c.verdict {
        Verdict::Capacity => {
            s += &format!(
                "Verdict: capacity. Even with every idle traced byte given back the device would have had {}, less than \
                 the {} requested: the workload needs a larger GPU, less memory, or other processes stopped.",
                fmt_bytes(f.saturating_add(i.own_idle).saturating_add(i.other_idle)),
                fmt_bytes(i.requested)
            )
        }
        Verdict::Reclaimable => {
            s += &format!(
                "Verdict: reclaimable. The process's own idle bytes ({}) plus the free {} would have covered the \
                 request: releasing its cache (pool trim, empty_cache) before allocating would have avoided the failure.",
                fmt_bytes(i.own_idle),
                fmt_bytes(f)
            )
        }
        Verdict::OtherProcess => {
            s += &format!(
                "Verdict: other process. Its own idle bytes were not enough, but other traced processes held {} idle \
                 on the device, which would have covered it.",
                fmt_bytes(i.other_idle)
            )
        }
        Verdict::ArenaFragmentation => {
            let a = i.arenas.iter().find(|a| a.free_in_arena >= i.requested && a.largest_free_span < i.requested);
            if let Some(a) = a {
                s += &format!(
                    "Verdict: arena fragmentation. Its {:?} arena at {:#x} had {} free but its largest free span was \
                     only {}, so the request could not be placed there and the driver had no room for more.",
                    a.kind,
                    a.base,
                    fmt_bytes(a.free_in_arena),
                    fmt_bytes(a.largest_free_span)
                )
            }
        }
        Verdict::Granularity => {
            s += &format!(
                "Verdict: granularity. The device had the {} requested, but not the {} it takes once rounded up to \
                 {} pages.",
                fmt_bytes(i.requested),
                fmt_bytes(round_up(i.requested, i.granularity)),
                fmt_bytes(i.granularity)
            )
        }
        Verdict::FrameworkFragmentation => {
            s += "Verdict: framework fragmentation. A framework's cache held the bytes in blocks too small for the \
                  request.";
        }
        Verdict::Unknown => {
            s += &format!("Verdict: unknown: {}.", c.unknown_reason.unwrap_or("no reason recorded"));
        }
    }
    s
}
