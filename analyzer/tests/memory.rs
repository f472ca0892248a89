//! Memory stays bounded whatever the capture's size: a 2-million-event capture (128 MB) is
//! analysed with a small, bounded peak RSS, and every timeline stays within its point budget.
//! (Own test binary, one test: VmHWM is per process.) The release-mode figure for a 1.28 GB
//! capture comes from `benches/replay.rs`.

use std::fs::File;
use std::io::BufWriter;
use vramhook_analyzer::{analyze, Options};
use vramhook_protocol::capture::{CaptureHeader, CaptureWriter, ProcessInfo};
use vramhook_protocol::record::{Api, Event};

#[path = "common/rss.rs"]
mod rss;
use rss::vm_hwm_kib;

#[test]
fn large_capture_in_bounded_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("big.vhc");
    let mut w =
        CaptureWriter::new(BufWriter::new(File::create(&path).expect("create")), &CaptureHeader::now()).expect("w");
    for pid in 1..=4u32 {
        w.write_process(&ProcessInfo {
            pid,
            start_time: u64::from(pid),
            cmdline: vec![format!("p{pid}")],
            ..Default::default()
        })
        .expect("w");
    }
    let n: u64 = 2_000_000;
    let mut chunk = Vec::with_capacity(65_536);
    for i in 0..n {
        let pid = (i % 4) as u32 + 1;
        let k = i / 4;
        // Each process fills 512 slots of 1 MiB, frees them all, fills them again, and so on.
        let slot = k % 512;
        let addr = 0x7000_0000_0000 + u64::from(pid) * (1 << 36) + slot * (1 << 24);
        let free = k >= 512 && (k / 512) % 2 == 1;
        let ev =
            if free { Event::free(Api::cuMemFree_v2, addr) } else { Event::alloc(Api::cuMemAlloc_v2, addr, 1 << 20) };
        let ev = ev.by(pid, pid).at(1_000_000 + i * 100).with_seq(k).on_device(0);
        chunk.push(ev);
        if chunk.len() == 65_536 {
            w.write_events(&chunk).expect("w");
            chunk.clear();
        }
    }
    w.write_events(&chunk).expect("w");
    w.finish().expect("finish");
    drop(chunk);
    let size = std::fs::metadata(&path).expect("meta").len();
    assert!(size > 120_000_000, "{size}");
    let before = vm_hwm_kib();
    let r = analyze(&[&path], &Options { max_points: 500, ..Options::default() }).expect("analyze");
    let after = vm_hwm_kib();
    assert_eq!(r.events, n);
    assert_eq!(r.processes.len(), 4);
    for t in &r.timelines.processes {
        assert!(!t.live_bytes.is_empty() && t.live_bytes.len() <= 500, "{}", t.live_bytes.len());
    }
    assert!(
        r.processes.iter().all(|p| p.peak_bytes == 512 << 20),
        "{:?}",
        r.processes.iter().map(|p| p.peak_bytes).collect::<Vec<_>>()
    );
    let grown = after.saturating_sub(before);
    eprintln!("capture {size} bytes; VmHWM {before} KiB before, {after} KiB after (+{grown} KiB)");
    assert!(after < 100 * 1024, "peak RSS {after} KiB for a {size}-byte capture");
}
