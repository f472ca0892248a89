//! XLA's BFC allocator (JAX, TensorFlow) when it runs out: `Allocator (GPU_0_bfc) ran out of
//! memory trying to allocate 256.00MiB (rounded to 268435456)`, then its dump (bins, chunks,
//! the in-use summary) and its `Stats:` block (`Limit:`, `InUse:`, `LargestFreeBlock:`),
//! then the program's `RESOURCE_EXHAUSTED: Out of memory while trying to allocate …`.
//! Lines carry glog's prefix (`I1201 05:07:03.712842     722 bfc_allocator.cc:1392] `).

use super::{between, parse_size, LogIncident, LogLine, Parsed, Parser};
use vramhook_model::framework::Framework;

#[derive(Default)]
pub struct BfcParser {
    pending: Option<Box<LogIncident>>,
    /// Free chunks listed in the pending dump.
    free_chunks: u64,
    in_stats: bool,
    /// Size of the last incident, so that the program's own error line joins it.
    last_requested: Option<u64>,
}

/// Removes glog's prefix; returns (time, message).
fn strip_glog(text: &str) -> (Option<&str>, &str) {
    let b = text.as_bytes();
    if b.len() > 22 && matches!(b[0], b'I' | b'W' | b'E' | b'F') && b[1..5].iter().all(u8::is_ascii_digit) {
        if let Some(end) = text.find("] ") {
            return (text.get(1..21), &text[end + 2..]);
        }
    }
    (None, text)
}

impl BfcParser {
    fn take(&mut self) -> Option<Box<LogIncident>> {
        let mut i = self.pending.take()?;
        self.in_stats = false;
        if self.free_chunks > 0 {
            i.quote("free_chunks", &self.free_chunks.to_string());
        }
        self.free_chunks = 0;
        self.last_requested = Some(i.numbers.requested);
        Some(i)
    }
}

impl Parser for BfcParser {
    fn feed(&mut self, line: &LogLine<'_>) -> Parsed {
        let (time, text) = strip_glog(line.text);
        if let Some(rest) =
            text.strip_prefix("Allocator (").filter(|r| r.contains("ran out of memory trying to allocate "))
        {
            let ended = self.take();
            let mut i = LogIncident::new(Framework::XlaBfc, line, line.text);
            i.time = time.map(str::to_string).or(i.time);
            i.device = between(rest, "GPU_", "_bfc").and_then(|d| d.parse().ok());
            let asked = between(rest, "trying to allocate ", " (rounded to ")
                .or_else(|| between(rest, "trying to allocate ", " "));
            if let Some(a) = asked {
                i.quote("requested", a);
            }
            i.numbers.requested = between(rest, "(rounded to ", ")")
                .and_then(|r| r.trim().parse().ok())
                .or_else(|| asked.and_then(parse_size))
                .unwrap_or(0);
            self.pending = Some(Box::new(i));
            self.free_chunks = 0;
            return match ended {
                Some(e) => Parsed::Incident(e),
                None => Parsed::Part,
            };
        }
        if let Some(rest) =
            text.split_once("RESOURCE_EXHAUSTED: Out of memory while trying to allocate ").map(|(_, r)| r)
        {
            let size = rest.split(" with allocator").next().and_then(parse_size);
            if let Some(i) = self.take() {
                return Parsed::Incident(i);
            }
            if size.is_some() && self.last_requested.is_some_and(|l| Some(l) == size) {
                self.last_requested = None;
                return Parsed::Part; // the program's own line for the dump already reported
            }
            // No dump: the program's line alone.
            let mut i = LogIncident::new(Framework::XlaBfc, line, line.text);
            if let Some(s) = rest.split(" with allocator").next() {
                i.quote("requested", s);
            }
            i.numbers.requested = size.unwrap_or(0);
            i.device = between(rest, "on device ", ".").and_then(|d| d.trim().parse().ok());
            return Parsed::Incident(Box::new(i));
        }
        let Some(i) = self.pending.as_mut() else { return Parsed::No };
        if text.starts_with("Stats:") {
            self.in_stats = true;
            return Parsed::Part;
        }
        if self.in_stats {
            if let Some((key, value)) = text.split_once(':') {
                let v = parse_size(value);
                match key.trim() {
                    "Limit" => {
                        i.quote("pool_limit", value);
                        i.numbers.pool_limit = v;
                    }
                    "InUse" => {
                        i.quote("in_use", value);
                        i.numbers.allocated = v;
                    }
                    "LargestFreeBlock" => {
                        i.quote("largest_free_block", value);
                        i.numbers.largest_free_block = v;
                    }
                    "MaxInUse" | "NumAllocs" | "MaxAllocSize" | "Reserved" | "PeakReserved" | "PeakAllocated"
                    | "LargestAllocSize" | "InUseTotal" | "BytesReservable" | "PeakBytesInUse" => {}
                    _ => return self.end_stats(),
                }
                if let (Some(l), Some(u)) = (i.numbers.pool_limit, i.numbers.allocated) {
                    i.numbers.cached_free = Some(l.saturating_sub(u));
                }
                return Parsed::Part;
            }
            if text.trim().is_empty() {
                return Parsed::Part;
            }
            return self.end_stats();
        }
        if text.starts_with("Free  at ") {
            self.free_chunks += 1;
            return Parsed::Part;
        }
        const DUMP: [&str; 12] = [
            "BFCAllocator dump",
            "Bin (",
            "Bin for ",
            "Next region",
            "InUse at ",
            "Summary of in-use Chunks",
            "Chunks of size",
            "Sum Total of in-use chunks",
            "Allocator memory summary",
            "Spatial partitioning",
            "Allocator region growth",
            "Current allocation summary follows",
        ];
        if DUMP.iter().any(|d| text.trim_start().starts_with(d))
            || text.starts_with("If this is caused by memory fragmentation")
        {
            return Parsed::Part;
        }
        Parsed::No
    }

    fn pending(&self) -> bool {
        self.pending.is_some()
    }

    fn finish(&mut self) -> Option<Box<LogIncident>> {
        self.take()
    }
}

impl BfcParser {
    /// The line after the stats block (glog's `****` marker, usually) ends the incident.
    fn end_stats(&mut self) -> Parsed {
        match self.take() {
            Some(i) => Parsed::Incident(i),
            None => Parsed::No,
        }
    }
}
