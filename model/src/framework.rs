//! Verdicts from what a framework said about its own cache at an OOM: PyTorch's message,
//! XLA's BFC dump (and, later, a lens). The driver cannot see inside a framework's cache;
//! the framework can, so where its numbers are known they decide between fragmentation
//! of the cache, another process, and a real shortage.

use crate::types::{fmt_bytes, Verdict};
use serde::{Deserialize, Serialize};

/// Which allocator the numbers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Framework {
    /// PyTorch's CUDA caching allocator (native or `cudaMallocAsync` backend).
    PyTorch,
    /// XLA's (JAX, TensorFlow) BFC allocator: a fixed pool.
    XlaBfc,
    /// ggml's CUDA backend (llama.cpp, ollama).
    Ggml,
    /// vLLM (PyTorch underneath; its KV-cache sizing).
    Vllm,
}

impl Framework {
    pub fn name(self) -> &'static str {
        match self {
            Framework::PyTorch => "pytorch",
            Framework::XlaBfc => "xla_bfc",
            Framework::Ggml => "ggml",
            Framework::Vllm => "vllm",
        }
    }
}

/// What was known at one framework OOM. Every field but the request may be missing; the
/// verdict then names what it missed instead of guessing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkOom {
    pub requested: u64,
    pub device_total: Option<u64>,
    pub device_free: Option<u64>,
    /// All this process held on the device (PyTorch: "this process has X memory in use").
    pub process_in_use: Option<u64>,
    /// Bytes handed out to the program by the framework.
    pub allocated: Option<u64>,
    /// Bytes the framework held but had not handed out (PyTorch's "reserved but
    /// unallocated"; a BFC pool's limit minus in use).
    pub cached_free: Option<u64>,
    /// The largest block the framework could have handed out whole.
    pub largest_free_block: Option<u64>,
    /// A fixed pool the framework may not grow beyond (XLA's BFC limit).
    pub pool_limit: Option<u64>,
    /// Other processes named with their usage: (pid, bytes).
    pub other_processes: Vec<(u32, u64)>,
    /// The framework's own limit for the process (PyTorch's "X allowed" under
    /// `set_per_process_memory_fraction`).
    #[serde(default)]
    pub framework_limit: Option<u64>,
}

/// A framework OOM judged: the verdict, what the judgement lacked (empty when nothing),
/// and the reason when the verdict is unknown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameworkJudgement {
    pub verdict: Verdict,
    pub missing: Vec<String>,
    pub unknown_reason: Option<String>,
}

/// Decides a framework OOM's verdict. With `R` the request, `C` the framework's cached free
/// bytes, `B` its largest free block, `F` the device's free bytes, `O` other processes' bytes:
/// 0. **Capacity** — `R` exceeds the device's total, or the framework's own limit `L` with
///    what it had allocated (`A + R > L`): its whole free cache would not have helped.
/// 1. **FrameworkFragmentation** — `C ≥ R` and (`B < R` or `B` unknown): the framework held
///    the bytes, in pieces. (PyTorch only reports an OOM after giving back its whole free
///    segments and retrying, so `C ≥ R` at its OOM means no block fitted.)
/// 2. For a fixed pool (`pool_limit`): **Capacity** of the pool — `C < R`.
/// 3. **Unknown** — `F ≥ R`: the device had the bytes; not explained by memory counts.
/// 4. **FrameworkFragmentation** — `F + C ≥ R`: the cache's stranded bytes plus the free
///    ones would have covered it.
/// 5. **OtherProcess** — `F + C + O ≥ R` with other processes named.
/// 6. **Capacity** — otherwise.
///
/// A missing number that a step needs makes the verdict `Unknown`, naming it; so does a
/// request of 0 bytes, a message that gave no size.
pub fn judge_framework_oom(o: &FrameworkOom) -> FrameworkJudgement {
    let r = o.requested;
    let mut missing = Vec::new();
    if o.device_total.is_some_and(|t| r > t) {
        // Larger than the whole device: nothing the framework or anyone else held matters.
        return FrameworkJudgement { verdict: Verdict::Capacity, missing, unknown_reason: None };
    }
    if let (Some(l), Some(a)) = (o.framework_limit, o.allocated) {
        if a.saturating_add(r) > l {
            return FrameworkJudgement { verdict: Verdict::Capacity, missing, unknown_reason: None };
        }
    }
    let unknown = |missing: Vec<String>, reason: String| FrameworkJudgement {
        verdict: Verdict::Unknown,
        missing,
        unknown_reason: Some(reason),
    };
    let judged = |verdict: Verdict, missing: Vec<String>| FrameworkJudgement { verdict, missing, unknown_reason: None };
    if r == 0 {
        // A message with no size (llama.cpp's `failed to allocate compute buffers` alone):
        // every rule below compares against the request.
        missing.push("the requested size".to_string());
        return unknown(missing, "the log does not say how many bytes were asked for".into());
    }
    match (o.cached_free, o.largest_free_block) {
        (Some(c), Some(b)) if c >= r && b >= r => {
            return unknown(
                missing,
                format!(
                "the framework reported a free block of {} for a request of {}: the failure is not explained by its \
                     numbers",
                fmt_bytes(b),
                fmt_bytes(r)
            ),
            )
        }
        (Some(c), _) if c >= r => return judged(Verdict::FrameworkFragmentation, missing),
        (None, _) => missing.push("the framework's cached free bytes".to_string()),
        _ => {}
    }
    if o.pool_limit.is_some() {
        return match o.cached_free {
            Some(_) => judged(Verdict::Capacity, missing),
            None => unknown(missing, "the pool's free bytes are not known".into()),
        };
    }
    let Some(f) = o.device_free else {
        missing.push("the device's free bytes".to_string());
        return unknown(missing, "the log does not say how much of the device was free".into());
    };
    if f >= r {
        return unknown(
            missing,
            format!(
                "the device reported {} free, enough for the {} requested; the failure is not explained by memory \
                 counts (a limit, MIG, or another allocation after the message)",
                fmt_bytes(f),
                fmt_bytes(r)
            ),
        );
    }
    let cached = o.cached_free.unwrap_or(0);
    if f.saturating_add(cached) >= r && cached > 0 {
        return judged(Verdict::FrameworkFragmentation, missing);
    }
    let others = o.other_processes.iter().fold(0u64, |a, (_, b)| a.saturating_add(*b));
    if !o.other_processes.is_empty() && f.saturating_add(cached).saturating_add(others) >= r {
        return judged(Verdict::OtherProcess, missing);
    }
    if o.cached_free.is_none() {
        return unknown(
            missing,
            "without the framework's cached bytes a shortage cannot be told from fragmentation".into(),
        );
    }
    judged(Verdict::Capacity, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn torch(requested: u64, free: u64, cached: u64) -> FrameworkOom {
        FrameworkOom {
            requested,
            device_total: Some(140 * GIB),
            device_free: Some(free),
            cached_free: Some(cached),
            allocated: Some(80 * GIB),
            ..FrameworkOom::default()
        }
    }

    #[test]
    fn each_verdict_on_its_own_case() {
        // The H200 case: 57.55 GiB reserved but unallocated, a 2 GiB request.
        assert_eq!(judge_framework_oom(&torch(2 * GIB, 293 * MIB, 57 * GIB)).verdict, Verdict::FrameworkFragmentation);
        // Stranded cache plus free bytes would have covered it.
        assert_eq!(judge_framework_oom(&torch(2 * GIB, GIB + MIB, GIB)).verdict, Verdict::FrameworkFragmentation);
        // A true shortage.
        assert_eq!(judge_framework_oom(&torch(148 * GIB, 139 * GIB, 0)).verdict, Verdict::Capacity);
        // The device had the bytes: not explained.
        assert_eq!(judge_framework_oom(&torch(GIB, 13 * GIB, 0)).verdict, Verdict::Unknown);
        assert_eq!(judge_framework_oom(&torch(24 * GIB, 13 * GIB, 0)).verdict, Verdict::Capacity);
        // Another process held what was missing.
        let mut other = torch(24 * GIB, 13 * GIB, 0);
        other.other_processes = vec![(633, 123 * GIB)];
        assert_eq!(judge_framework_oom(&other).verdict, Verdict::OtherProcess);
    }

    #[test]
    fn a_fixed_pool_is_judged_on_its_own_numbers() {
        let pool = |cached, largest| FrameworkOom {
            requested: 256 * MIB,
            cached_free: Some(cached),
            largest_free_block: Some(largest),
            pool_limit: Some(7 * GIB),
            ..FrameworkOom::default()
        };
        assert_eq!(judge_framework_oom(&pool(3 * GIB, 118 * MIB)).verdict, Verdict::FrameworkFragmentation);
        assert_eq!(judge_framework_oom(&pool(256, 256)).verdict, Verdict::Capacity);
        assert_eq!(judge_framework_oom(&pool(3 * GIB, GIB)).verdict, Verdict::Unknown);
    }

    #[test]
    fn a_request_over_the_frameworks_own_limit_is_capacity() {
        // set_per_process_memory_fraction(0.03): "4.19 GiB allowed", 3.84 GiB allocated.
        let mut o = torch(648 * MIB, 135 * GIB, 96 * MIB);
        o.allocated = Some(3932 * MIB);
        o.framework_limit = Some(4290 * MIB);
        assert_eq!(judge_framework_oom(&o).verdict, Verdict::Capacity);
        // Under the limit with the cache given back: the cache's pieces decide.
        o.requested = 322 * MIB;
        o.cached_free = Some(840 * MIB);
        assert_eq!(judge_framework_oom(&o).verdict, Verdict::FrameworkFragmentation);
    }

    #[test]
    fn missing_numbers_are_named_not_guessed() {
        let j = judge_framework_oom(&FrameworkOom { requested: GIB, ..FrameworkOom::default() });
        assert_eq!(j.verdict, Verdict::Unknown);
        assert_eq!(j.missing.len(), 2, "{:?}", j.missing);
        let mut no_cache = torch(24 * GIB, 13 * GIB, 0);
        no_cache.cached_free = None;
        let j = judge_framework_oom(&no_cache);
        assert_eq!(j.verdict, Verdict::Unknown);
        assert!(j.missing.iter().any(|m| m.contains("cached")));
    }
}
