//! The OOM verdict rule and its explanation text.

use crate::types::*;
use vramhook_protocol::{Api, FrameworkId};

/// Why an incident past the model's work allowance has no verdict.
pub const UNJUDGED_REASON: &str = "not judged: the work allowance for judging failures (the processes and arenas \
     looked at per failure, which grows with the events read) was spent before this failure; analyze a shorter \
     window (--from/--to) to judge it";

/// Decides a verdict from what was known at the failure.
///
/// Precedence (the first that holds wins), with `R` the request, `F` the device's free bytes,
/// `G` the granularity, `L` the framework's own limit for the process (a lens's), `A` the
/// framework's allocated bytes (its lens's, at the failure or in a fresh sample), and the
/// other processes' bytes on the device split as their holders list says (releasable,
/// stranded, not visible, live, untraced; see [`crate::Holder`]):
/// L. **Capacity** (of the limit) — `A + R > L`: even with its whole free cache given back
///    the framework could not have served the request under its own limit.
/// 0. **FrameworkFragmentation** (a lens) — the framework's lens saw it give up on its own
///    request `R'` with `C = reserved − allocated`: `C ≥ R'` and its largest free block
///    `< R'` (or unknown), or `F + C ≥ R'`. PyTorch gives back its whole free segments and
///    retries before it gives up, so what is left of `C` then is stranded in split segments.
/// 1. **Unknown** — no device sample: "no device memory sample".
/// 2. **Granularity** — `R ≤ F < round_up(R, G)`: the bytes were there, not once rounded to pages.
/// 3. **Capacity** (full) — `round_up(R, G) ≤ F < round_up(R, G) + DRIVER_RESERVE` and the
///    framework's lens saw its cache fully allocated: the driver keeps a reserve it does not
///    hand out, and nothing was cached to give back.
/// 4. **Unknown** — `F ≥ round_up(R, G)`: the device had room; the failure is not explained by
///    memory counts (MIG, a concurrent allocation by another process since the sample).
/// 5. **ArenaFragmentation** — `F < R` and one of this process's pools or segments on the device had
///    `free_in_arena ≥ R` but `largest_free_span < R`: the process had the bytes but in pieces,
///    so it had to ask the driver for more. Checked before the idle-byte rules because it says
///    why the process went to the driver at all.
/// 6. **FrameworkFragmentation** (cache-wide) — the process's framework segments (a snapshot's
///    or a lens's) held free bytes with `F + free ≥ R`, but none of their free blocks was `≥ R`.
///    Each segment alone may look whole; only the cache-wide figure shows the pieces.
/// 7. **FrameworkFragmentation** (a lens's sample) — no lens spoke at the OOM (CuPy, JAX),
///    but its latest sample on the device (at most 5 s old) had `C = reserved − allocated > 0`
///    with `F + C ≥ R`, its largest free block `< R` or not reported, and the request did not
///    succeed on a retry: the framework went to the driver because no free block held `R`.
/// 8. **Reclaimable** — `F < R ≤ F + own_idle`: releasing this process's idle cache would have covered it.
/// 9. **OtherProcess** (idle) — `R ≤ F + own_idle + others' releasable + stranded`.
/// 10. **FrameworkCache** — a caching framework (PyTorch, CuPy, JAX, TensorFlow) of this
///     process held enough from the driver that `F + held ≥ R`, and nothing says how much of
///     it was free inside its cache (no lens, no segments, no recent sample): not capacity
///     until the cache is seen.
/// 11. **OtherProcess** (held) — `R ≤ F + own_idle + everything other processes held`
///     (not visible, live, untraced too): it would have fit with the device to itself.
/// 12. **Capacity** — otherwise: the request would not have fit even alone on the device.
///
/// This process's own context and live bytes are its own, never another's: without NVML,
/// the device's bytes no traced process holds beyond [`crate::CONTEXT_ALLOWANCE`] per traced
/// process on the device are stated as untraced but counted for no one (they may be this
/// process's own: its context, reserves not sampled, allocations before tracing began).
pub fn decide_verdict(i: &VerdictInputs) -> (Verdict, Option<String>) {
    let r = i.requested;
    if over_limit(i).is_some() {
        return (Verdict::Capacity, None);
    }
    if let Some(l) = &i.lens {
        let (r, c) = (l.requested.max(1), l.cached_free());
        let in_pieces = l.largest_free_block.is_none_or(|b| b < r);
        if (c >= r && in_pieces) || (c > 0 && i.device_free.is_some_and(|f| f.saturating_add(c) >= r)) {
            return (Verdict::FrameworkFragmentation, None);
        }
    }
    if i.unjudged {
        return (Verdict::Unknown, Some(UNJUDGED_REASON.into()));
    }
    let Some(f) = i.device_free else {
        return (Verdict::Unknown, Some("no device memory sample (cuMemGetInfo) was known for this device".into()));
    };
    let rounded = round_up(r, i.granularity);
    if r <= f && f < rounded {
        return (Verdict::Granularity, None);
    }
    if f >= rounded && f < rounded.saturating_add(DRIVER_RESERVE) && cache_full(i) {
        return (Verdict::Capacity, None);
    }
    if f >= rounded {
        return (
            Verdict::Unknown,
            Some(format!(
                "the device reported {} free, enough for the request even rounded to {}; the failure is not explained \
                 by memory counts (MIG, or another allocation after the sample)",
                fmt_bytes(f),
                fmt_bytes(rounded)
            )),
        );
    }
    if i.arenas.iter().any(|a| holds_bytes(a) && a.free_in_arena >= r && a.largest_free_span < r) {
        return (Verdict::ArenaFragmentation, None);
    }
    if i.cache_segments > 0 && f.saturating_add(i.cache_free) >= r && i.cache_largest_free < r {
        return (Verdict::FrameworkFragmentation, None);
    }
    if let Some(l) = &i.lens_sample {
        // A caching framework asks the driver only when none of its free blocks holds the
        // request: with the free bytes there (as the lens last saw them) and the retry after
        // the framework gave back what it could still failing, they were in pieces.
        let c = l.cached_free();
        let in_pieces = l.largest_free_block.is_none_or(|b| b < r);
        if i.lens.is_none() && i.cache_segments == 0 && !i.recovered && c > 0 && f.saturating_add(c) >= r && in_pieces {
            return (Verdict::FrameworkFragmentation, None);
        }
    }
    if r <= f.saturating_add(i.own_idle) {
        return (Verdict::Reclaimable, None);
    }
    if r <= f.saturating_add(i.own_idle).saturating_add(i.other_idle) {
        return (Verdict::OtherProcess, None);
    }
    let cache_unseen = i.lens.is_none() && i.cache_segments == 0 && i.lens_sample.is_none();
    if i.framework.is_some_and(|fw| fw.caches()) && cache_unseen && f.saturating_add(i.framework_held) >= r {
        return (Verdict::FrameworkCache, None);
    }
    if needed(i) <= f.saturating_add(i.own_idle).saturating_add(i.others().total()) {
        return (Verdict::OtherProcess, None);
    }
    (Verdict::Capacity, None)
}

/// The bytes the program needed: the framework's own request when its lens spoke (with
/// expandable segments the driver refused one 20 MiB chunk of it), else the driver's.
fn needed(i: &VerdictInputs) -> u64 {
    i.lens.as_ref().map_or(i.requested, |l| l.requested.max(i.requested))
}

/// What the real driver keeps back: it refuses a request that would leave less than this
/// free (on the H200, a 2 MiB `cudaMalloc` failed with 3.12 MiB reported free).
pub const DRIVER_RESERVE: u64 = 8 << 20;

/// `(limit, allocated, request)` when the framework's own limit could not have served the
/// request even with its whole free cache given back: `allocated + request > limit`.
fn over_limit(i: &VerdictInputs) -> Option<(u64, u64, u64)> {
    let limit = i.framework_limit?;
    let (allocated, request) = match (&i.lens, &i.lens_sample) {
        (Some(l), _) => (l.allocated, l.requested.max(1)),
        (None, Some(s)) => (s.allocated, i.requested),
        (None, None) => return None,
    };
    (allocated.saturating_add(request) > limit).then_some((limit, allocated, request))
}

/// The framework's lens saw its cache fully allocated (nothing cached to give back).
fn cache_full(i: &VerdictInputs) -> bool {
    match (&i.lens, &i.lens_sample) {
        (Some(l), _) => l.reserved > 0 && l.cached_free() == 0,
        (None, Some(s)) => s.reserved > 0 && s.cached_free() == 0,
        (None, None) => false,
    }
}

/// An arena whose free space is device memory already held (a pool's reserve, a framework
/// segment): a VMM reservation's free space is unmapped addresses, not bytes.
fn holds_bytes(a: &ArenaNumbers) -> bool {
    a.kind != ArenaKind::VmmReservation
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
    /// Times are given since this one (the first event the model saw).
    pub origin_ns: u64,
}

/// A time as seconds since the model's first event.
fn since(ns: u64, origin: u64) -> String {
    format!("+{:.3} s", ns.saturating_sub(origin) as f64 / 1e9)
}

/// `81.45 GiB (87,456,000,000 bytes)`: the rounded figure a framework prints, and the exact one.
fn with_bytes(v: u64) -> String {
    let digits = v.to_string();
    let mut grouped = String::new();
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    format!("{} ({grouped} bytes)", fmt_bytes(v))
}

/// What the framework's documented settings would change, for a cache whose free bytes
/// were stranded in pieces.
fn fragmentation_fix(fw: FrameworkId, stranded: u64) -> String {
    match fw {
        FrameworkId::PyTorch => format!(
            "Fix: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets PyTorch grow and unmap segments page by \
             page, so the {} stranded in split segments become usable for one large block; or max_split_size_mb \
             (large blocks are then never split, so they stay whole for large requests), or \
             garbage_collection_threshold (cached blocks are given back before the cache fills).",
            fmt_bytes(stranded)
        ),
        FrameworkId::Jax | FrameworkId::TensorFlow => format!(
            "Fix: XLA_PYTHON_CLIENT_ALLOCATOR=platform (or a smaller XLA_PYTHON_CLIENT_MEM_FRACTION with \
             preallocation off) so the {} stranded in the BFC pool go back to the driver.",
            fmt_bytes(stranded)
        ),
        FrameworkId::CuPy => format!(
            "Fix: CuPy gives back only wholly free chunks (free_all_blocks); the {} stranded in split chunks stay: \
             allocate the large arrays first, or use cupy.cuda.MemoryAsyncPool (stream-ordered, the driver's pool), \
             or set_allocator(None) for the large requests.",
            fmt_bytes(stranded)
        ),
        _ => format!(
            "Fix: have the framework return its cached blocks ({}) before the large request.",
            fmt_bytes(stranded)
        ),
    }
}

pub(crate) fn explain(c: &ExplainCtx<'_>) -> String {
    let i = c.inputs;
    let who =
        if c.command.is_empty() { format!("process {}", c.pid) } else { format!("process {} ({})", c.pid, c.command) };
    let gpu = if c.device < 0 { "an unknown GPU".to_string() } else { format!("GPU {}", c.device) };
    let at = since(c.ts_ns, c.origin_ns);
    let mut s = match &i.lens {
        Some(l) if l.requested != i.requested && c.api != Api::Lens => format!(
            "{who} asked {} for {} on {gpu}; the driver call that failed was {} ({}) at {at}; ",
            l.framework.display_name(),
            fmt_bytes(l.requested),
            fmt_bytes(i.requested),
            c.api
        ),
        Some(l) if c.api == Api::Lens => {
            format!("{who} asked {} for {} on {gpu} at {at}; ", l.framework.display_name(), fmt_bytes(l.requested))
        }
        _ => format!("{who} asked for {} ({}) on {gpu} at {at}; ", fmt_bytes(i.requested), c.api),
    };
    match (i.device_free, i.device_total) {
        (Some(f), t) => {
            let of = t.map(|t| format!(" of {}", fmt_bytes(t))).unwrap_or_default();
            let when = if c.sample_after_failure {
                "right after the failure".to_string()
            } else {
                format!("in a sample taken at {} (before the failure)", since(c.sample_ts_ns.unwrap_or(0), c.origin_ns))
            };
            s += &format!("the device had {} free{of} {when}", fmt_bytes(f));
        }
        (None, _) => s += "no device memory sample was known",
    }
    let o = i.others();
    s += &format!("; this process held {} idle (pool reserve and framework cache)", fmt_bytes(i.own_idle));
    if i.holders.is_empty() {
        s += " and no other process was seen holding memory on that device. ";
    } else {
        s += &format!(
            "; other processes held {} on that device ({}). ",
            fmt_bytes(o.total().saturating_add(o.unnamed)),
            others_split(&o)
        );
    }
    let f = i.device_free.unwrap_or(0);
    s += &match c.verdict {
        Verdict::Capacity => capacity(i, &o, f),
        Verdict::Reclaimable => reclaimable(i, f),
        Verdict::OtherProcess => other_process(i, &o, f),
        Verdict::ArenaFragmentation => arena_fragmentation(i),
        Verdict::Granularity => granularity(i),
        Verdict::FrameworkFragmentation => framework_fragmentation(i),
        Verdict::FrameworkCache => framework_cache(i, f),
        Verdict::Unknown => format!("Verdict: unknown: {}.", c.unknown_reason.unwrap_or("no reason recorded")),
    };
    s
}

/// Capacity: past the framework's limit, a full cache on a full device, or more than the device holds.
fn capacity(i: &VerdictInputs, o: &OthersBytes, f: u64) -> String {
    let mut s = String::new();
    match over_limit(i) {
        Some((limit, allocated, request)) => {
            s += &format!(
                "Verdict: capacity (of the framework's limit). {} allows this process {}: {} were allocated, so the \
                 {} request could not fit under the limit even with its whole free cache given back (the device had \
                 {} free). Fix: raise the limit ({}), or need less memory.",
                i.framework.map(FrameworkId::display_name).unwrap_or("The framework"),
                with_bytes(limit),
                with_bytes(allocated),
                fmt_bytes(request),
                fmt_bytes(f),
                limit_fix(i.framework)
            )
        }
        None if cache_full(i) && f >= round_up(i.requested, i.granularity) => {
            s += &format!(
                "Verdict: capacity. The framework's cache was fully allocated (nothing cached to give back) and the \
                 {} free is within the {} the driver keeps back: the device was full. Fix: a larger GPU or less \
                 memory (smaller batches, a smaller model).",
                fmt_bytes(f),
                fmt_bytes(DRIVER_RESERVE)
            )
        }
        None => {
            s += &format!(
                "Verdict: capacity. Even with the device to itself (every idle byte of its own and all that other \
                 processes held given back) the request would not have fit: at most {} for the {} requested. The \
                 workload needs a larger GPU or less memory.",
                fmt_bytes(f.saturating_add(i.own_idle).saturating_add(o.total())),
                fmt_bytes(needed(i))
            )
        }
    }
    s
}

fn reclaimable(i: &VerdictInputs, f: u64) -> String {
    let mut s = String::new();
    s += &format!(
        "Verdict: reclaimable. The process's own idle bytes ({}) plus the free {} would have covered the \
         request: releasing its cache (pool trim, empty_cache) before allocating would have avoided the failure.",
        fmt_bytes(i.own_idle),
        fmt_bytes(f)
    );
    s
}

fn other_process(i: &VerdictInputs, o: &OthersBytes, f: u64) -> String {
    let mut s = String::new();
    let base = f.saturating_add(i.own_idle);
    let need = needed(i).saturating_sub(base);
    let tier = if need <= o.releasable {
        "with their releasable bytes given back"
    } else if need <= o.releasable.saturating_add(o.stranded) {
        "only with their stranded bytes given back too (a restart of the holder)"
    } else {
        "only with memory they were using (or could not show) given back"
    };
    s += &format!(
        "Verdict: other process. Its own idle bytes were not enough; the request would have fit {tier}: {} \
         more were needed. ",
        fmt_bytes(need)
    );
    s += &holders_advice(&i.holders);
    s
}

fn arena_fragmentation(i: &VerdictInputs) -> String {
    let mut s = String::new();
    let a =
        i.arenas.iter().find(|a| holds_bytes(a) && a.free_in_arena >= i.requested && a.largest_free_span < i.requested);
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
    s
}

fn granularity(i: &VerdictInputs) -> String {
    let mut s = String::new();
    s += &format!(
        "Verdict: granularity. The device had the {} requested, but not the {} it takes once rounded up to \
         {} pages.",
        fmt_bytes(i.requested),
        fmt_bytes(round_up(i.requested, i.granularity)),
        fmt_bytes(i.granularity)
    );
    s
}

/// What the framework (or its lens, or its segments) said about its cache.
fn framework_fragmentation(i: &VerdictInputs) -> String {
    let mut s = String::new();
    match &i.lens {
        Some(l) => {
            let name = l.framework.display_name();
            s += &format!(
                "Verdict: framework fragmentation. {name} said, when it gave up: {} allocated by {name}, {} \
                 reserved by {name} but unallocated, of {} reserved. ",
                with_bytes(l.allocated),
                with_bytes(l.cached_free()),
                fmt_bytes(l.reserved)
            );
            let largest = l.largest_free_block.or((i.cache_segments > 0).then_some(i.cache_largest_free));
            let largest = largest.map(fmt_bytes).unwrap_or_else(|| "not measured".into());
            s += &format!("The largest free block was {largest}, for a request of {}", fmt_bytes(l.requested));
            let (pieces, with_free, listed) = if l.segments_listed > 0 {
                (l.free_pieces, l.segments_with_free, l.segments_listed)
            } else {
                (i.cache_pieces, i.cache_with_free, i.cache_segments)
            };
            if listed > 0 {
                s += &format!(
                    "; the free bytes were in {pieces} pieces over {with_free} of its {listed} segments (cache-wide \
                     fragmentation {:.3})",
                    fragmentation(i.cache_largest_free, i.cache_free)
                );
            }
            s += ": the memory was there, stranded in the cache. ";
            s += &fragmentation_fix(l.framework, l.cached_free());
        }
        None if i.cache_segments == 0 && i.lens_sample.is_some() => {
            let l = i.lens_sample.clone().unwrap_or_default();
            let name = l.framework.display_name();
            s += &format!(
                "Verdict: framework fragmentation. {name}'s lens, {:.3} s before the failure: {} allocated by                      {name}, {} reserved by {name} but unallocated, of {} reserved; ",
                l.age_ns as f64 / 1e9,
                with_bytes(l.allocated),
                with_bytes(l.cached_free()),
                fmt_bytes(l.reserved)
            );
            match l.largest_free_block {
                Some(b) => s += &format!("the largest free block was {}, ", fmt_bytes(b)),
                None => s += &format!("{name} does not report its largest free block, but "),
            }
            s += &format!(
                "{name} asked the driver for {} and did not get it on a retry, so no free block in its cache held                      it: the memory was there, stranded in the cache (as of that sample). ",
                fmt_bytes(i.requested)
            );
            s += &fragmentation_fix(l.framework, l.cached_free());
        }
        None => {
            let fw = i.framework.unwrap_or(FrameworkId::PyTorch);
            s += &format!(
                "Verdict: framework fragmentation. Its {} framework segments on the device held {} reserved, {} \
                 allocated and {} free in {} pieces (cache-wide fragmentation {:.3}), but the largest free block was \
                 {}: the request fit in none of them. ",
                i.cache_segments,
                fmt_bytes(i.cache_reserved),
                with_bytes(i.cache_reserved.saturating_sub(i.cache_free)),
                with_bytes(i.cache_free),
                i.cache_pieces,
                fragmentation(i.cache_largest_free, i.cache_free),
                fmt_bytes(i.cache_largest_free)
            );
            s += &fragmentation_fix(fw, i.cache_free);
        }
    }
    s
}

fn framework_cache(i: &VerdictInputs, f: u64) -> String {
    let mut s = String::new();
    let fw = i.framework.map(FrameworkId::display_name).unwrap_or("a framework");
    s += &format!(
        "Verdict: framework cache. {fw} held {} of this device from the driver, enough with the free {} for \
         the {} requested; how much of it was free inside {fw}'s cache is not visible from the driver, so \
         this is not known to be a shortage. Turn on the lens to see inside the cache (vramhook run does; \
         with LD_PRELOAD, put vramhook's lens directory first on PYTHONPATH){}.",
        fmt_bytes(i.framework_held),
        fmt_bytes(f),
        fmt_bytes(i.requested),
        if i.framework == Some(FrameworkId::PyTorch) {
            "; if the cache was fragmented, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids it"
        } else {
            ""
        }
    );
    s
}

/// "12.00 GiB releasable, 2.00 GiB stranded, …": the parts that are not zero.
fn others_split(o: &OthersBytes) -> String {
    let parts = [
        (o.releasable, "releasable"),
        (o.stranded, "stranded"),
        (o.not_visible, "in caches not visible"),
        (o.live, "live"),
        (o.untraced, "untraced"),
        (o.unnamed, "not held by any traced process, holders not named: NVML was not read"),
    ];
    let v: Vec<String> =
        parts.iter().filter(|(b, _)| *b > 0).map(|(b, what)| format!("{} {what}", fmt_bytes(*b))).collect();
    if v.is_empty() {
        "nothing".into()
    } else {
        v.join(", ")
    }
}

/// How a process's framework limit is raised.
fn limit_fix(fw: Option<FrameworkId>) -> &'static str {
    match fw {
        Some(FrameworkId::PyTorch) => "torch.cuda.set_per_process_memory_fraction",
        Some(FrameworkId::Jax) => "XLA_PYTHON_CLIENT_MEM_FRACTION",
        Some(FrameworkId::CuPy) => "cupy.get_default_memory_pool().set_limit",
        Some(FrameworkId::TensorFlow) => "tf.config.set_logical_device_configuration's memory_limit",
        _ => "the framework's memory limit setting",
    }
}

/// One line per holder, most bytes first: who, what of it could be had, and what gives it back.
pub fn holders_advice(holders: &[Holder]) -> String {
    let mut s = String::from("Holders:");
    for h in holders {
        if h.sight == HolderSight::UntracedUnnamed && h.pid == 0 && h.command.is_empty() {
            s += &format!(
                " {} on the device that no traced process holds (not named: NVML was not read; part of it may be this \
                 process's own context; not counted as another's);",
                fmt_bytes(h.held_bytes)
            );
            continue;
        }
        let who = match (h.pid, h.command.is_empty()) {
            (0, true) => "untraced processes".to_string(),
            (0, false) => h.command.clone(),
            (p, true) => format!("pid {p}"),
            (p, false) => format!("pid {p} ({})", h.command),
        };
        s += &format!(" {who}: {} held", fmt_bytes(h.held_bytes));
        let fw = h.framework.map(FrameworkId::display_name).unwrap_or("its allocator");
        if h.releasable_bytes > 0 {
            s += &format!(", {} releasable ({})", fmt_bytes(h.releasable_bytes), release_fix(h.framework));
        }
        if h.stranded_bytes > 0 {
            s += &format!(
                ", {} stranded in split {fw} segments (not given back by empty_cache: a restart, or \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True there)",
                fmt_bytes(h.stranded_bytes)
            );
        }
        if h.not_visible_bytes > 0 {
            s += &format!(
                ", {} in a {fw} cache not visible (no lens in that process: possibly idle; run it with vramhook's lens \
                 to see)",
                fmt_bytes(h.not_visible_bytes)
            );
        }
        if h.live_bytes > 0 {
            let what = match h.sight {
                HolderSight::Untraced => "in use (untraced; NVML's figure, its context included)",
                HolderSight::UntracedUnnamed => "in use (untraced; the device's bytes beyond the traced processes')",
                _ => "in use",
            };
            s += &format!(", {} {what}", fmt_bytes(h.live_bytes));
            s += &format!(" ({})", live_fix(&h.command));
        }
        s.push(';');
    }
    if s.ends_with(';') {
        s.pop();
        s.push('.');
    }
    s
}

/// What gives a holder's releasable bytes back.
fn release_fix(fw: Option<FrameworkId>) -> &'static str {
    match fw {
        Some(FrameworkId::PyTorch) => {
            "torch.cuda.empty_cache() in that process; PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6 makes it \
             give cached blocks back on its own"
        }
        Some(FrameworkId::CuPy) => "cupy.get_default_memory_pool().free_all_blocks() in that process",
        Some(FrameworkId::Jax) | Some(FrameworkId::TensorFlow) => {
            "XLA keeps its pool: XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_ALLOCATOR=platform there"
        }
        _ => "a pool trim (cudaMemPoolTrimTo) or a release threshold in that process",
    }
}

/// What frees memory another process is using.
fn live_fix(command: &str) -> &'static str {
    let program = command.split_whitespace().next().unwrap_or("");
    if program.rsplit('/').next().is_some_and(|name| name.starts_with("ollama")) {
        "ollama: a shorter keep_alive (or unloading the model) frees it, OLLAMA_MAX_LOADED_MODELS limits it; or a smaller model"
    } else {
        "stop it, move it to another GPU, or give it a smaller model"
    }
}

/// What to do about an incident, in one sentence: what the report leads with.
pub(crate) fn fix_for(verdict: Verdict, i: &VerdictInputs) -> String {
    let fw = i.lens.as_ref().map(|l| l.framework).or(i.framework).unwrap_or(FrameworkId::Unknown);
    match verdict {
        Verdict::Capacity => match over_limit(i) {
            Some((limit, _, _)) => format!(
                "Raise the framework's limit of {} ({}), or need less memory.",
                fmt_bytes(limit),
                limit_fix(i.framework)
            ),
            None => "Use a larger GPU, or need less memory (smaller batches, a smaller model).".into(),
        },
        Verdict::Reclaimable => {
            "Give back this process's idle cache before the large request (torch.cuda.empty_cache(), \
             a pool trim), or let the framework do it (PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6)."
                .into()
        }
        Verdict::OtherProcess => {
            let o = i.others();
            let need = needed(i).saturating_sub(i.device_free.unwrap_or(0).saturating_add(i.own_idle));
            let top = i.holders.iter().find(|h| h.sight != HolderSight::UntracedUnnamed);
            let who = top.map_or("the other processes".to_string(), |h| match h.pid {
                0 => h.command.clone(),
                p => format!("pid {p}"),
            });
            if need <= o.releasable {
                let how = top.map_or("its cache", |h| release_fix(h.framework));
                format!("Have {who} give back its idle memory ({how}).")
            } else if need <= o.releasable.saturating_add(o.stranded) {
                format!(
                    "Restart {who} (its free memory is stranded in split segments), or run it with \
                         PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
                )
            } else {
                format!(
                    "Stop {who}, move it to another GPU, or give it less memory ({}).",
                    live_fix(top.map_or("", |h| &h.command))
                )
            }
        }
        Verdict::ArenaFragmentation => "Trim or recreate the pool before the large request, or allocate the large \
             blocks first."
            .into(),
        Verdict::Granularity => format!(
            "Free {} more, or ask for a size that fits once rounded up to {} pages.",
            fmt_bytes(round_up(i.requested, i.granularity).saturating_sub(i.device_free.unwrap_or(0))),
            fmt_bytes(i.granularity)
        ),
        Verdict::FrameworkFragmentation => {
            let stranded = i.lens.as_ref().map_or(i.cache_free, |l| l.cached_free());
            fragmentation_fix(fw, stranded).trim_start_matches("Fix: ").to_string()
        }
        Verdict::FrameworkCache => "Turn on the lens to see inside the cache (vramhook run does; with LD_PRELOAD, put \
             vramhook's lens directory first on PYTHONPATH)."
            .into(),
        Verdict::Unknown => "None known from the numbers: check limits the counts do not show (MIG, a container's \
             limit), and whether another process allocated after the sample."
            .into(),
    }
}
