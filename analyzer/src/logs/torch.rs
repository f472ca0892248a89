//! PyTorch's `OutOfMemoryError`, in the wordings of 1.x to 2.11:
//! - 2.1 and later: `CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity
//!   of 139.80 GiB of which 293.12 MiB is free. Process 633 has 123.79 GiB memory in use.
//!   Including non-PyTorch memory, this process has 139.51 GiB memory in use. Of the allocated
//!   memory 81.45 GiB is allocated by PyTorch, and 57.55 GiB is reserved by PyTorch but
//!   unallocated.` (one line);
//! - 1.x and 2.0: `CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total
//!   capacity; 14.56 GiB already allocated; 3.12 MiB free; 14.71 GiB reserved in total by
//!   PyTorch)`;
//! - the `cudaMallocAsync` backend: `Allocation on device 0 would exceed allowed memory. (out
//!   of memory)` followed by `Currently allocated :`, `Requested :`, `Device limit :`,
//!   `Free (according to CUDA):` lines.

use super::{between, parse_size, LogIncident, LogLine, Parsed, Parser};
use vramhook_model::framework::Framework;

#[derive(Default)]
pub struct TorchParser {
    /// A `cudaMallocAsync` message being assembled, and how many of its lines were read.
    pending: Option<(Box<LogIncident>, u32)>,
}

impl Parser for TorchParser {
    fn feed(&mut self, line: &LogLine<'_>) -> Parsed {
        let text = line.text;
        if let Some((mut incident, seen)) = self.pending.take() {
            if let Some((key, value)) = text.split_once(':') {
                let key = key.trim();
                let value = value.trim();
                let field = match key {
                    "Currently allocated" => Some("allocated"),
                    "Requested" => Some("requested"),
                    "Device limit" => Some("device_total"),
                    "Free (according to CUDA)" => Some("device_free"),
                    "" => Some("limit"), // the value line under "PyTorch limit (…)"
                    _ => None,
                };
                if let Some(field) = field {
                    incident.quote(field, value);
                    let n = &mut incident.numbers;
                    let v = parse_size(value);
                    match field {
                        "allocated" => n.allocated = v,
                        "requested" => n.requested = v.unwrap_or(0),
                        "device_total" => n.device_total = v,
                        "device_free" => n.device_free = v,
                        _ => {}
                    }
                    if field == "limit" {
                        return Parsed::Incident(incident);
                    }
                    self.pending = Some((incident, seen + 1));
                    return Parsed::Part;
                }
            }
            if text.trim_start().starts_with("PyTorch limit") && seen < 8 {
                self.pending = Some((incident, seen + 1));
                return Parsed::Part;
            }
            return Parsed::Ended(incident);
        }
        if let Some(at) = text.find("CUDA out of memory. Tried to allocate ") {
            return Parsed::Incident(Box::new(parse_message(line, &text[at..])));
        }
        if let Some(at) = text.find("would exceed allowed memory. (out of memory)") {
            let mut i = LogIncident::new(Framework::PyTorch, line, text);
            i.device = between(&text[..at + 1], "Allocation on device ", " ").and_then(|d| d.trim().parse().ok());
            // The cache's free bytes are not in this message: cudaMallocAsync's pool keeps them.
            self.pending = Some((Box::new(i), 0));
            return Parsed::Part;
        }
        Parsed::No
    }

    fn pending(&self) -> bool {
        self.pending.is_some()
    }

    fn finish(&mut self) -> Option<Box<LogIncident>> {
        self.pending.take().map(|(i, _)| i)
    }
}

fn parse_message(line: &LogLine<'_>, msg: &str) -> LogIncident {
    let mut i = LogIncident::new(Framework::PyTorch, line, line.text);
    let set = |i: &mut LogIncident, field: &str, text: Option<&str>| -> Option<u64> {
        let text = text?;
        i.quote(field, text);
        parse_size(text)
    };
    if msg.contains(" has a total capacity of ") {
        // 2.1 and later.
        let requested =
            between(msg, "Tried to allocate ", ". GPU ").or_else(|| between(msg, "Tried to allocate ", ". "));
        i.numbers.requested = set(&mut i, "requested", requested).unwrap_or(0);
        i.device = between(msg, ". GPU ", " has").and_then(|d| d.trim().parse().ok());
        i.numbers.device_total = set(&mut i, "device_total", between(msg, "has a total capacity of ", " of which "));
        i.numbers.device_free = set(&mut i, "device_free", between(msg, " of which ", " is free"));
        let mut rest = msg;
        while let Some(at) = rest.find("Process ") {
            rest = &rest[at + "Process ".len()..];
            let Some((pid, tail)) = rest.split_once(" has ") else { break };
            let Some(pid) = pid.trim().parse::<u32>().ok() else { continue };
            if let Some(bytes) = tail.split_once(" memory in use").and_then(|(b, _)| parse_size(b)) {
                i.numbers.other_processes.push((pid, bytes));
            }
        }
        i.numbers.process_in_use = set(&mut i, "process_in_use", between(msg, "this process has ", " memory in use"));
        // Under set_per_process_memory_fraction: "… memory in use. 4.19 GiB allowed; Of the …".
        if let Some(at) = msg.find(" allowed;").or_else(|| msg.find(" allowed.")) {
            let words: Vec<&str> = msg[..at].split_whitespace().rev().take(2).collect();
            if let [unit, value] = words[..] {
                let text = format!("{value} {unit}");
                i.numbers.framework_limit = set(&mut i, "framework_limit", Some(&text));
            }
        }
        i.numbers.allocated =
            set(&mut i, "allocated", between(msg, "Of the allocated memory ", " is allocated by PyTorch"));
        i.numbers.cached_free = set(
            &mut i,
            "cached_free",
            between(msg, "is allocated by PyTorch, and ", " is reserved by PyTorch but unallocated"),
        );
    } else {
        // 1.x and 2.0: "(GPU 0; T total capacity; A already allocated; F free; R reserved in total by PyTorch)"
        i.numbers.requested = set(&mut i, "requested", between(msg, "Tried to allocate ", " (GPU ")).unwrap_or(0);
        if let Some(inner) = between(msg, " (GPU ", ")") {
            let mut parts = inner.split(';').map(str::trim);
            i.device = parts.next().and_then(|d| d.parse().ok());
            let mut reserved = None;
            for part in parts {
                if let Some(v) = part.strip_suffix(" total capacity") {
                    i.numbers.device_total = set(&mut i, "device_total", Some(v));
                } else if let Some(v) = part.strip_suffix(" already allocated") {
                    i.numbers.allocated = set(&mut i, "allocated", Some(v));
                } else if let Some(v) = part.strip_suffix(" free") {
                    i.numbers.device_free = set(&mut i, "device_free", Some(v));
                } else if let Some(v) = part.strip_suffix(" reserved in total by PyTorch") {
                    reserved = set(&mut i, "reserved", Some(v));
                }
            }
            // The old message gives reserved in total; what was cached but free is the difference.
            i.numbers.cached_free = reserved.zip(i.numbers.allocated).map(|(r, a)| r.saturating_sub(a));
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::super::read_log;

    fn incidents(text: &str) -> Vec<super::LogIncident> {
        read_log("t", text.as_bytes(), false).expect("read").1
    }

    #[test]
    fn pytorch_1x_wording() {
        let i = incidents(
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB \
             already allocated; 3.12 MiB free; 14.71 GiB reserved in total by PyTorch) If reserved memory is >> \
             allocated memory try setting max_split_size_mb to avoid fragmentation.\n",
        );
        assert_eq!(i.len(), 1);
        assert_eq!(i[0].numbers.requested, 20 << 20);
        assert_eq!(i[0].device, Some(0));
        // 14.71 − 14.56 GiB ≈ 153.6 MiB cached and free, more than the 20 MiB asked.
        assert_eq!(i[0].verdict_name, "framework_fragmentation", "{}", i[0].explanation);
    }
}
