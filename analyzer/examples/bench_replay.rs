//! Replay speed, side by side with a raw read of the same file.
//!
//!     cargo run --release -p vramhook-analyzer --example bench_replay -- [--events N] [--dir DIR] [--keep]
//!
//! Writes a synthetic capture of N alloc/free events (default 20,000,000: about 1.3 GB; check
//! `df` first) with the protocol's writer, then times (1) a raw read: `CaptureReader` frames
//! only, every record touched, and (2) the full analysis (`vramhook_analyzer::analyze`: read,
//! model replay, sampling, report). Prints events/s for both, their ratio, and peak RSS
//! (VmHWM). One thread.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::time::Instant;
use vramhook_analyzer::{analyze, Options};
use vramhook_protocol::capture::{CaptureHeader, CaptureReader, CaptureWriter, Frame, ProcessInfo};
use vramhook_protocol::record::{Api, Event, EventKind};

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut events: u64 = 20_000_000;
    let mut dir = std::env::temp_dir();
    let mut keep = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--events" => events = args.next().ok_or("--events N")?.replace('_', "").parse()?,
            "--dir" => dir = args.next().ok_or("--dir DIR")?.into(),
            "--keep" => keep = true,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let path = dir.join(format!("vramhook-bench-{}.vhc", std::process::id()));

    // 1. Generate: one process cycling 4,096 live slots (alloc, later free), sizes 4 KiB–64 MiB,
    // a device sample every 100,000 events.
    let t = Instant::now();
    let mut w = CaptureWriter::new(BufWriter::with_capacity(4 << 20, File::create(&path)?), &CaptureHeader::now())?;
    w.write_process(&ProcessInfo {
        pid: 4242,
        ppid: 1,
        uid: 0,
        start_time: 7,
        run_id: 0,
        exe: "/usr/bin/bench".into(),
        cmdline: vec!["bench".into()],
    })?;
    const SLOTS: u64 = 4096;
    let mut live = vec![0u64; SLOTS as usize];
    let mut chunk: Vec<Event> = Vec::with_capacity(65_536);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let base = Event { pid: 4242, tid: 4242, device: 0, ..Event::default() };
    for i in 0..events {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let slot = (x % SLOTS) as usize;
        let ts = 1_000_000_000 + i * 50;
        let ev = if i % 100_000 == 0 {
            Event {
                ts_ns: ts,
                kind: EventKind::MemInfo.code(),
                api: Api::cuMemGetInfo_v2.code(),
                addr: 40 << 30,
                size: 80 << 30,
                ..base
            }
        } else if live[slot] != 0 {
            let a = live[slot];
            live[slot] = 0;
            Event { ts_ns: ts, kind: EventKind::Free.code(), api: Api::cuMemFree_v2.code(), addr: a, ..base }
        } else {
            let a = 0x7f00_0000_0000 + (slot as u64) * (1 << 27) + ((i & 0xff) << 12);
            live[slot] = a;
            let size = 4096u64 << (x >> 60);
            Event { ts_ns: ts, kind: EventKind::Alloc.code(), api: Api::cuMemAlloc_v2.code(), addr: a, size, ..base }
        };
        chunk.push(Event { seq: i, ..ev });
        if chunk.len() == 65_536 {
            w.write_events(&chunk)?;
            chunk.clear();
        }
    }
    w.write_events(&chunk)?;
    w.finish()?;
    let bytes = std::fs::metadata(&path)?.len();
    println!(
        "generated {} events, {:.2} GB at {} in {:.1}s (RSS peak so far {} MiB)",
        events,
        bytes as f64 / 1e9,
        path.display(),
        t.elapsed().as_secs_f64(),
        vm_hwm_kib() / 1024
    );

    // 2. Raw read: frames and records only.
    let t = Instant::now();
    let mut r = CaptureReader::new(BufReader::with_capacity(1 << 20, File::open(&path)?))?;
    let (mut n, mut sum) = (0u64, 0u64);
    while let Some(f) = r.next_frame()? {
        if let Frame::Events(recs) = f {
            n += recs.len() as u64;
            for rec in recs {
                sum = sum.wrapping_add(rec.size.get());
            }
        }
    }
    let raw = t.elapsed().as_secs_f64();
    let raw_rate = n as f64 / raw;
    println!(
        "raw read     : {n} events in {raw:.3}s = {:.1} M events/s ({:.2} GB/s) [checksum {sum:x}]",
        raw_rate / 1e6,
        bytes as f64 / raw / 1e9
    );
    let hwm_before = vm_hwm_kib();

    // 3. Read + the bare model (no sampling, no report): the model's own ceiling.
    let t = Instant::now();
    let mut r = CaptureReader::new(BufReader::with_capacity(1 << 20, File::open(&path)?))?;
    let mut model = vramhook_model::Model::default();
    while let Some(f) = r.next_frame()? {
        if let Frame::Events(recs) = f {
            for rec in recs {
                model.apply(&Event::from_raw(rec));
            }
        }
    }
    let bare = t.elapsed().as_secs_f64();
    println!(
        "read + apply : {} events in {bare:.3}s = {:.1} M events/s (Model::apply only)",
        model.events(),
        model.events() as f64 / bare / 1e6
    );

    // 4. The analysis, end to end.
    let t = Instant::now();
    let report = analyze(&[&path], &Options::default())?;
    let full = t.elapsed().as_secs_f64();
    let rate = report.events as f64 / full;
    println!(
        "read + model : {} events in {full:.3}s = {:.1} M events/s ({} processes, {} timeline points)",
        report.events,
        rate / 1e6,
        report.processes.len(),
        report.timelines.processes.iter().map(|p| p.live_bytes.len()).sum::<usize>()
    );
    println!(
        "ratio        : replay runs at {:.0}% of raw read speed ({:.2}x slower)",
        100.0 * rate / raw_rate,
        raw_rate / rate
    );
    println!("peak RSS     : {} MiB (VmHWM; {} MiB before the analysis)", vm_hwm_kib() / 1024, hwm_before / 1024);
    if report.events != n {
        return Err(format!("replayed {} of {n} events", report.events).into());
    }
    if keep {
        println!("kept {}", path.display());
    } else {
        std::fs::remove_file(&path)?;
    }
    Ok(())
}
