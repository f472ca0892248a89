//! ggml's CUDA backend (llama.cpp, ollama's runner) and ollama's own memory lines:
//! - `ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1234.56 MiB on device 0: cudaMalloc failed: out of memory`
//!   (ggml-cuda.cu);
//! - `alloc_tensor_range: failed to allocate CUDA0 buffer of size 1294467072` and
//!   `ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size …` (ggml-alloc.c);
//! - ollama's plan, `msg="model weights" device=CUDA0 size="1.2 GiB"` (also `kv cache`,
//!   `compute graph`, `total memory`), and its fallbacks: `model layout did not fit, applying
//!   backoff`, `offloading output layer to CPU`, `memory layout cannot be allocated`.
//!
//! ggml allocates its buffers with plain `cudaMalloc` (no cache in between), so a failure
//! is judged on the device's free bytes, which these logs do not give: the verdict says so.

use super::{between, parse_size, LogIncident, LogLine, Parsed, Parser};
use vramhook_model::framework::Framework;

#[derive(Default)]
pub struct GgmlParser {
    /// ollama's plan lines seen so far (what, device, size as written).
    plan: Vec<(String, String)>,
    /// The last cudaMalloc failure, so that ggml-alloc's line for the same buffer joins it.
    last_failure_bytes: Option<u64>,
}

/// The value of `key=` in a slog text line (quoted or bare).
fn slog_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let mut from = 0;
    let start = loop {
        let at = from + text[from..].find(key)?;
        let after = at + key.len();
        if at > 0 && text.as_bytes()[at - 1] == b' ' && text.as_bytes().get(after) == Some(&b'=') {
            break after + 1;
        }
        from = after;
    };
    let rest = &text[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.split('"').next();
    }
    rest.split(' ').next()
}

impl Parser for GgmlParser {
    fn feed(&mut self, line: &LogLine<'_>) -> Parsed {
        let text = line.text;
        if let Some(at) = text.find(": cudaMalloc failed: ") {
            let head = &text[..at];
            let mut i = LogIncident::new(Framework::Ggml, line, text);
            if let Some(size) = between(head, "allocating ", " on device ") {
                i.quote("requested", size);
                i.numbers.requested = parse_size(size).unwrap_or(0);
            }
            i.device = head.rsplit("on device ").next().and_then(|d| d.trim().parse().ok());
            // ggml's buffers come straight from cudaMalloc: nothing was cached in between.
            i.numbers.cached_free = Some(0);
            for (what, size) in &self.plan {
                i.quote(&format!("plan: {what}"), size);
            }
            self.last_failure_bytes = Some(i.numbers.requested);
            return Parsed::Incident(Box::new(i));
        }
        if let Some(rest) =
            text.split_once(": failed to allocate ").map(|(_, r)| r).filter(|r| r.contains(" buffer of size "))
        {
            let bytes: Option<u64> = rest.rsplit(' ').next().and_then(|b| b.trim().parse().ok());
            // ggml-cuda logged the same buffer in MiB with two decimals.
            let same = matches!((bytes, self.last_failure_bytes), (Some(b), Some(l)) if b.abs_diff(l) <= 6 * 1024);
            if same {
                self.last_failure_bytes = None;
                return Parsed::Part;
            }
            let mut i = LogIncident::new(Framework::Ggml, line, text);
            if let Some(b) = bytes {
                i.quote("requested", &b.to_string());
                i.numbers.requested = b;
            }
            i.device = rest.split(' ').next().and_then(|b| b.strip_prefix("CUDA")).and_then(|d| d.parse().ok());
            i.numbers.cached_free = Some(0);
            return Parsed::Incident(Box::new(i));
        }
        if let Some(msg) = slog_value(text, "msg") {
            match msg {
                "model weights" | "kv cache" | "compute graph" | "total memory" => {
                    let device = slog_value(text, "device").unwrap_or("all");
                    let size = slog_value(text, "size").unwrap_or("?");
                    if self.plan.len() < 64 {
                        self.plan.push((format!("{msg} on {device}"), size.to_string()));
                    }
                    return Parsed::Part;
                }
                "model layout did not fit, applying backoff"
                | "offloading output layer to CPU"
                | "memory layout cannot be allocated" => {
                    return Parsed::Note(format!("line {}: ollama fell back toward the CPU: {msg}", line.number));
                }
                _ => {}
            }
        }
        Parsed::No
    }
}
