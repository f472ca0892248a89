//! The NVIDIA driver's Xid lines in the kernel log, `NVRM: Xid (PCI:0000:3b:00): 79, pid=…,
//! name=…, GPU has fallen off the bus.` (older drivers: `NVRM: Xid (0000:03:00): 14, Channel
//! 00000001`, NVIDIA's Xid documentation). An Xid is a driver or hardware fault, not an
//! out-of-memory: when a program died near one, the Xid is the cause to look at.

use super::{between, LogIncident, LogLine, Parsed};
use vramhook_model::framework::Framework;

pub struct NvrmParser;

/// What the common Xids mean (NVIDIA's Xid catalog).
fn meaning(xid: u32) -> &'static str {
    match xid {
        13 => "graphics engine exception (often an application error, such as an illegal address)",
        31 => "GPU memory page fault (an application or driver touched an address it may not)",
        43 => "GPU stopped processing (the program was killed or faulted)",
        45 => "preemptive cleanup after the program ended or was killed",
        48 => "double-bit ECC error (a memory hardware fault)",
        63 | 64 => "ECC page retirement or row remapping event",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 | 95 => "contained or uncontained ECC error",
        119 | 120 => "GSP firmware error or timeout",
        _ => "a driver-reported GPU error (see NVIDIA's Xid catalog)",
    }
}

impl NvrmParser {
    pub fn feed(&mut self, line: &LogLine<'_>) -> Parsed {
        let Some(at) = line.text.find("NVRM: Xid (") else { return Parsed::No };
        let rest = &line.text[at..];
        let Some(xid) = rest
            .split_once("): ")
            .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|x| x.parse::<u32>().ok())
        else {
            return Parsed::No;
        };
        let mut i = LogIncident::new(Framework::Ggml, line, line.text);
        i.source = "nvrm".into();
        i.pid = between(rest, "pid=", ",").and_then(|p| p.trim().parse().ok()).or(line.pid);
        i.quote("xid", &xid.to_string());
        if let Some(bus) = between(rest, "Xid (", ")") {
            i.quote("gpu", bus);
        }
        i.verdict_name = "not_an_oom".into();
        i.explanation = format!(
            "The NVIDIA driver reported Xid {xid}: {}. This is a driver or hardware fault, not an out-of-memory; a \
             program that failed near it failed because of it.",
            meaning(xid)
        );
        Parsed::Incident(Box::new(i))
    }
}
