//! vLLM's KV-cache sizing failures, verbatim from its source (`vllm/v1/core/kv_cache_utils.py`,
//! `_check_enough_kv_cache_memory`, commit 001cabc1):
//! - `No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when
//!   initializing the engine.`
//! - `To serve at least one request with the models's max seq len (N), (X GiB KV cache is
//!   needed, which is larger than the available KV cache memory (Y GiB). Based on the
//!   available memory, the estimated maximum model length is M. …`
//!
//! These are vLLM's own budget, not a failed allocation: vLLM sizes its KV cache from
//! `gpu_memory_utilization` × the GPU minus what the model took. PyTorch's messages under
//! vLLM (a CUDA OOM during the profile run) are read by the PyTorch parser.

use super::{between, parse_size, LogIncident, LogLine, Parsed, Parser};
use vramhook_model::framework::Framework;

#[derive(Default)]
pub struct VllmParser;

/// vLLM's process prefix: `(EngineCore_DP0 pid=245) ERROR …`.
fn prefix_pid(text: &str) -> Option<u32> {
    let inner = text.strip_prefix('(')?.split(')').next()?;
    inner.split_once("pid=")?.1.trim().parse().ok()
}

impl Parser for VllmParser {
    fn feed(&mut self, line: &LogLine<'_>) -> Parsed {
        let text = line.text;
        if text.contains("No available memory for the cache blocks") {
            let mut i = LogIncident::new(Framework::Vllm, line, text);
            i.pid = prefix_pid(text).or(i.pid);
            i.quote("pool_limit", "0 bytes");
            // No budget left at all for the cache after the weights: a shortage of the budget.
            i.numbers.cached_free = Some(0);
            i.numbers.pool_limit = Some(0);
            i.numbers.requested = 1;
            i.quote("requested", "any KV cache block");
            return Parsed::Incident(Box::new(i));
        }
        if let Some(at) = text.find("To serve at least one request with the model") {
            let msg = &text[at..];
            let mut i = LogIncident::new(Framework::Vllm, line, text);
            i.pid = prefix_pid(text).or(i.pid);
            let needed =
                between(msg, "), (", " KV cache is needed").or_else(|| between(msg, "), ", " KV cache is needed"));
            let available = between(msg, "available KV cache memory (", ")");
            if let Some(n) = needed {
                i.quote("requested", n.trim_start_matches('('));
                i.numbers.requested = parse_size(n.trim_start_matches('(')).unwrap_or(0);
            }
            if let Some(a) = available {
                i.quote("pool_limit", a);
                i.numbers.pool_limit = parse_size(a);
                i.numbers.cached_free = i.numbers.pool_limit;
            }
            if let Some(len) = between(msg, "max seq len (", ")") {
                i.quote("max_model_len", len);
            }
            if let Some(est) = between(msg, "estimated maximum model length is ", ".") {
                i.quote("estimated_max_model_len", est);
            }
            return Parsed::Incident(Box::new(i));
        }
        Parsed::No
    }
}
