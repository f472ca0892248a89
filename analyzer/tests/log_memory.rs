//! Hostile logs in bounded memory: 1 GiB of unrelated text with huge lines, binary junk and
//! half-messages that look like OOMs, read through every parser. Its own test binary, so that
//! the peak resident memory measured is this test's alone.

#[path = "common/rss.rs"]
mod rss;

use std::io::Read;

/// Endless log text: ordinary lines, a 4 MiB line every 64 MiB, binary junk, and lines that
/// start like each parser's message but never finish it.
struct HostileLog {
    left: u64,
    pattern: Vec<u8>,
    at: usize,
}

impl HostileLog {
    fn new(total: u64) -> HostileLog {
        let mut p = Vec::new();
        for i in 0..2000u32 {
            p.extend_from_slice(
                format!("I1201 05:06:{:02}.000000 722 server.cc:12] request {i} served in 3 ms\n", i % 60).as_bytes(),
            );
        }
        p.extend_from_slice(b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate \n");
        p.extend_from_slice(
            b"Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.0GiB (rounded to 1073741824)\n",
        );
        p.extend_from_slice(b"Stats: \nLimit: 12\nInUse: \xff\xfe\n");
        p.extend_from_slice(b"torch.OutOfMemoryError: Allocation on device 0 would exceed allowed memory. (out of memory)\nRequested : 1e999 GiB\n");
        p.extend_from_slice(
            b"ggml_cuda: allocating 99999999999999999999 MiB on device 0: cudaMalloc failed: out of memory\n",
        );
        p.extend_from_slice(b"NVRM: Xid (PCI:0000:3b:00): 99999999999, pid=x\n");
        let junk: Vec<u8> = (0..65_536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        p.extend_from_slice(&junk);
        p.push(b'\n');
        // One huge line per pattern (the pattern is about 1/16 of 64 MiB of huge line).
        p.extend(std::iter::repeat_n(b'x', 4 << 20));
        p.push(b'\n');
        HostileLog { left: total, pattern: p, at: 0 }
    }
}

impl Read for HostileLog {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.pattern.len() - self.at).min(self.left as usize);
        buf[..n].copy_from_slice(&self.pattern[self.at..self.at + n]);
        self.at = (self.at + n) % self.pattern.len();
        self.left -= n as u64;
        Ok(n)
    }
}

#[test]
fn a_gibibyte_of_hostile_log_is_read_in_bounded_memory() {
    let before = rss::vm_hwm_kib();
    let (report, incidents) =
        vramhook_analyzer::logs::read_log("hostile", HostileLog::new(1 << 30), false).expect("read");
    let peak_mib = rss::vm_hwm_kib() / 1024;
    eprintln!(
        "hostile log: {} lines, {} long, {} binary, {} incidents; VmHWM {} MiB (before {} MiB)",
        report.lines,
        report.long_lines,
        report.binary_lines,
        report.incidents,
        peak_mib,
        before / 1024
    );
    assert_eq!(report.understood + report.skipped, report.lines);
    assert!(report.long_lines > 100, "the huge lines were cut: {}", report.long_lines);
    assert!(report.binary_lines > 0);
    assert!(incidents.len() <= vramhook_analyzer::logs::MAX_INCIDENTS);
    assert!(peak_mib <= 100, "peak resident memory {peak_mib} MiB for a 1 GiB log");
}
