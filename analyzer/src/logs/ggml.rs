//! ggml's CUDA backend (llama.cpp, ollama's runner) and ollama's own memory lines:
//! - `ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1234.56 MiB on device 0: cudaMalloc failed: out of memory`
//!   (ggml-cuda.cu);
//! - `alloc_tensor_range: failed to allocate CUDA0 buffer of size 1294467072` and
//!   `ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size …` (ggml-alloc.c);
//! - ollama's plan, `msg="model weights" device=CUDA0 size="1.2 GiB"` (also `kv cache`,
//!   `compute graph`, `total memory`), and its fallbacks: `model layout did not fit, applying
//!   backoff`, `offloading output layer to CPU`, `memory layout cannot be allocated`.
//!
//! As ollama v0.24.0 wrote them on the H200 (`tests/fixtures/logs/ollama_*.h200.log`), also:
//! - `graph_reserve: failed to allocate compute buffers` (llama.cpp), which follows ggml's two
//!   lines for the same buffer, or stands alone when what failed was not a `cudaMalloc` (ggml's
//!   VMM pool could not grow: the log has no size, the capture has the call);
//! - the offload as ollama's engine logs it, `msg="offloaded 3/5 layers to GPU"`: fewer than
//!   all is a CPU fallback (llama.cpp's own `load_tensors: offloaded 3/5 layers to GPU` holds
//!   none of the words the reader's prefilter looks for, so it is not read; ollama's plan lines
//!   show the same split);
//! - the device's free bytes when the model was loaded, `ggml_backend_cuda_device_get_memory
//!   device GPU-… utilizing NVML memory reporting free: N total: M`: quoted, not used as the
//!   free bytes at the failure (the runner's own CUDA context and buffers came after it);
//! - ollama's server repeating the runner's error, `msg="Load failed" … error="llama runner
//!   process has terminated: cudaMalloc failed: …"`: a note, never a second incident.
//! - a new model load (`msg="loading model"`) starts a new plan.
//!
//! ggml allocates its buffers with plain `cudaMalloc` (no cache in between), so a failure
//! is judged on the device's free bytes at the failure, which these logs do not give: the
//! verdict says so (a capture of the same run has them).

use super::{between, parse_size, LogIncident, LogLine, Parsed, Parser};
use vramhook_model::framework::Framework;

#[derive(Default)]
pub struct GgmlParser {
    /// ollama's plan lines seen so far (what, device, size as written).
    plan: Vec<(String, String)>,
    /// The last cudaMalloc failure, so that ggml-alloc's line for the same buffer joins it.
    last_failure_bytes: Option<u64>,
    /// Line of the last failure: llama.cpp's `graph_reserve` line right after it is the same one.
    last_failure_line: Option<u64>,
    /// The offload of the model being loaded, as written (`3/5`).
    offloaded: Option<String>,
    /// Free and total bytes of the device when the model was loaded, as written.
    load_memory: Option<(String, String)>,
}

/// Lines after a failure within which llama.cpp's `graph_reserve` line belongs to it.
const SAME_FAILURE_LINES: u64 = 4;

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

impl GgmlParser {
    /// What this parser knew when the failure came: the plan, the offload, the load-time memory.
    fn context(&self, i: &mut LogIncident) {
        for (what, size) in &self.plan {
            i.quote(&format!("plan: {what}"), size);
        }
        if let Some(o) = &self.offloaded {
            i.quote("offloaded layers", o);
        }
        if let Some((free, total)) = &self.load_memory {
            i.quote("device free at model load", free);
            i.quote("device_total", total);
            i.numbers.device_total = total.parse().ok();
        }
    }
}

impl Parser for GgmlParser {
    fn feed(&mut self, line: &LogLine<'_>) -> Parsed {
        let text = line.text;
        // ollama's server repeats the runner's last error (`cudaMalloc failed: …` included).
        if text.contains("llama runner process has terminated") || text.contains("msg=\"llama runner terminated\"") {
            let why = slog_value(text, "error").unwrap_or(text);
            return Parsed::Note(format!(
                "line {}: ollama's runner terminated: {}",
                line.number,
                why.replace("\\n", "; ")
            ));
        }
        if let Some(at) = text.find(": cudaMalloc failed: ").filter(|&at| text[..at].contains(" on device ")) {
            let head = &text[..at];
            let mut i = LogIncident::new(Framework::Ggml, line, text);
            if let Some(size) = between(head, "allocating ", " on device ") {
                i.quote("requested", size);
                i.numbers.requested = parse_size(size).unwrap_or(0);
            }
            i.device = head.rsplit("on device ").next().and_then(|d| d.trim().parse().ok());
            // ggml's buffers come straight from cudaMalloc: nothing was cached in between.
            i.numbers.cached_free = Some(0);
            self.context(&mut i);
            self.last_failure_bytes = Some(i.numbers.requested);
            self.last_failure_line = Some(line.number);
            return Parsed::Incident(Box::new(i));
        }
        if let Some(rest) =
            text.split_once(": failed to allocate ").map(|(_, r)| r).filter(|r| r.contains(" buffer of size "))
        {
            let bytes: Option<u64> = rest.rsplit(' ').next().and_then(|b| b.trim().parse().ok());
            // ggml-cuda logged the same buffer in MiB with two decimals.
            let same = matches!((bytes, self.last_failure_bytes), (Some(b), Some(l)) if b.abs_diff(l) <= 6 * 1024);
            self.last_failure_line = Some(line.number);
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
            self.context(&mut i);
            return Parsed::Incident(Box::new(i));
        }
        if text.contains(": failed to allocate compute buffers") {
            let after = self.last_failure_line.is_some_and(|l| line.number.saturating_sub(l) <= SAME_FAILURE_LINES);
            self.last_failure_line = Some(line.number);
            if after {
                return Parsed::Part;
            }
            // Nothing ggml logged failed just before: the size is not in the log.
            let mut i = LogIncident::new(Framework::Ggml, line, text);
            i.numbers.cached_free = Some(0);
            self.context(&mut i);
            return Parsed::Incident(Box::new(i));
        }
        if let Some(free) = text.split_once("utilizing NVML memory reporting free: ").map(|(_, r)| r) {
            let mut words = free.split_whitespace();
            if let (Some(f), Some("total:"), Some(t)) = (words.next(), words.next(), words.next()) {
                self.load_memory = Some((f.to_string(), t.to_string()));
                return Parsed::Part;
            }
        }
        if let Some(rest) = text.split_once("offloaded ").map(|(_, r)| r).filter(|r| r.contains(" layers to GPU")) {
            let o = rest.split(' ').next().unwrap_or("");
            if let Some((n, m)) = o.split_once('/') {
                self.offloaded = Some(o.to_string());
                if n != m {
                    return Parsed::Note(format!(
                        "line {}: ollama's runner put {n} of {m} layers on the GPU, the rest on the CPU",
                        line.number
                    ));
                }
                return Parsed::Part;
            }
        }
        if let Some(msg) = slog_value(text, "msg") {
            match msg {
                "loading model" => {
                    self.plan.clear();
                    self.offloaded = None;
                    self.load_memory = None;
                    return Parsed::Part;
                }
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
