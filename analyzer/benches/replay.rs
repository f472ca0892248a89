//! Replay speed, side by side with a raw read of the same file.
//!
//!     cargo bench -p vramhook-analyzer --bench replay -- \
//!         [--events N] [--dir DIR] [--keep] [--file CAPTURE] [--rounds R]
//!
//! Writes a synthetic capture of N alloc/free events (default 20,000,000: about 1.3 GB; check
//! `df` first) with the protocol's writer, or takes `--file`. Then, R rounds (default 5),
//! times (1) a raw read: `CaptureReader` over the mapped file (as `analyze` reads it),
//! frames and checksums only, every record touched, (2) read plus
//! the bare `Model::apply`, and (3) the full analysis (`vramhook_analyzer::analyze`: read,
//! model replay, per-event timelines, sampling, report). Prints events/s for each as best
//! and median of the rounds, their ratio, and peak RSS (VmHWM). One thread.

use std::fs::File;
use std::io::BufWriter;
use std::time::Instant;
use vramhook_analyzer::{analyze, Options};
use vramhook_protocol::capture::{CaptureHeader, CaptureReader, CaptureWriter, Frame, ProcessInfo};
use vramhook_protocol::mapped::Mapped;
use vramhook_protocol::record::{Api, Event};

#[path = "../tests/common/rss.rs"]
mod rss;
use rss::vm_hwm_kib;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut events: u64 = 20_000_000;
    let mut dir = std::env::temp_dir();
    let mut keep = false;
    let mut rounds = 5usize;
    let mut given: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--events" => events = args.next().ok_or("--events N")?.replace('_', "").parse()?,
            "--dir" => dir = args.next().ok_or("--dir DIR")?.into(),
            "--keep" => keep = true,
            "--rounds" => rounds = args.next().ok_or("--rounds N")?.parse::<usize>()?.max(1),
            "--file" => given = Some(args.next().ok_or("--file CAPTURE")?.into()),
            "--bench" => {} // what `cargo bench` passes
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let path = match &given {
        Some(p) => p.clone(),
        None => generate(&dir.join(format!("vramhook-bench-{}.vhc", std::process::id())), events)?,
    };
    let bytes = std::fs::metadata(&path)?.len();

    // Rounds interleave the three measurements, so a slow spell of a shared machine hits
    // them alike; each is reported as best and median of the rounds.
    let (mut raw_t, mut bare_t, mut full_t) = (Vec::new(), Vec::new(), Vec::new());
    let mut hwm_before = 0;
    let mut last_report = None;
    let mut n = 0u64;
    for _ in 0..rounds {
        let (count, t) = raw_read(&path)?;
        n = count;
        raw_t.push(t);
        hwm_before = hwm_before.max(vm_hwm_kib());
        bare_t.push(read_and_apply(&path)?);
        let t = Instant::now();
        let report = analyze(&[&path], &Options::default())?;
        full_t.push(t.elapsed().as_secs_f64());
        last_report = Some(report);
    }
    let report = last_report.ok_or("no rounds")?;
    let rate = |t: f64| n as f64 / t;
    let (raw_best, raw_med) = best_median(&mut raw_t);
    let (bare_best, bare_med) = best_median(&mut bare_t);
    let (full_best, full_med) = best_median(&mut full_t);
    println!("{rounds} rounds, events/s as best (median):");
    println!(
        "raw read     : {:.1} M events/s ({:.1} M), {:.2} GB/s: frames, checksums, every record touched",
        rate(raw_best) / 1e6,
        rate(raw_med) / 1e6,
        bytes as f64 / raw_best / 1e9
    );
    println!(
        "read + apply : {:.1} M events/s ({:.1} M): Model::apply only",
        rate(bare_best) / 1e6,
        rate(bare_med) / 1e6
    );
    println!(
        "read + model : {:.1} M events/s ({:.1} M): `vramhook analyze` end to end ({} processes, {} timeline points)",
        rate(full_best) / 1e6,
        rate(full_med) / 1e6,
        report.processes.len(),
        report.timelines.processes.iter().map(|p| p.live_bytes.len()).sum::<usize>()
    );
    println!(
        "ratio        : replay runs at {:.0}% of raw read speed ({:.2}x slower; medians {:.2}x)",
        100.0 * raw_best / full_best,
        full_best / raw_best,
        full_med / raw_med
    );
    println!("peak RSS     : {} MiB (VmHWM; {} MiB before the analysis)", vm_hwm_kib() / 1024, hwm_before / 1024);
    if report.events != n {
        return Err(format!("replayed {} of {n} events", report.events).into());
    }
    if keep || given.is_some() {
        println!("kept {}", path.display());
    } else {
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

/// Frames and records only: every record's size is summed so none is skipped.
fn raw_read(path: &std::path::Path) -> Result<(u64, f64), Box<dyn std::error::Error>> {
    let t = Instant::now();
    let mut r = CaptureReader::from_source(Mapped::new(&File::open(path)?)?)?;
    let (mut n, mut sum) = (0u64, 0u64);
    while let Some(f) = r.next_frame()? {
        if let Frame::Events(recs) = f {
            n += recs.len() as u64;
            for rec in recs {
                sum = sum.wrapping_add(rec.size.get());
            }
        }
    }
    std::hint::black_box(sum);
    Ok((n, t.elapsed().as_secs_f64()))
}

/// Read plus the bare model (no sampling, no report): the model's own ceiling.
fn read_and_apply(path: &std::path::Path) -> Result<f64, Box<dyn std::error::Error>> {
    let t = Instant::now();
    let mut r = CaptureReader::from_source(Mapped::new(&File::open(path)?)?)?;
    let mut model = vramhook_model::Model::default();
    while let Some(f) = r.next_frame()? {
        if let Frame::Events(recs) = f {
            for rec in recs {
                model.apply(&Event::from_raw(rec));
            }
        }
    }
    std::hint::black_box(model.events());
    Ok(t.elapsed().as_secs_f64())
}

fn best_median(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2])
}

/// One process cycling 4,096 live slots (alloc, later free), sizes 4 KiB–64 MiB, a device
/// sample every 100,000 events.
fn generate(path: &std::path::Path, events: u64) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    let t = Instant::now();
    let mut w = CaptureWriter::new(BufWriter::with_capacity(4 << 20, File::create(path)?), &CaptureHeader::now())?;
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
    for i in 0..events {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let slot = (x % SLOTS) as usize;
        let ts = 1_000_000_000 + i * 50;
        let ev = if i % 100_000 == 0 {
            Event::mem_info(40 << 30, 80 << 30)
        } else if live[slot] != 0 {
            let a = live[slot];
            live[slot] = 0;
            Event::free(Api::cuMemFree_v2, a)
        } else {
            let a = 0x7f00_0000_0000 + (slot as u64) * (1 << 27) + ((i & 0xff) << 12);
            live[slot] = a;
            let size = 4096u64 << (x >> 60);
            Event::alloc(Api::cuMemAlloc_v2, a, size)
        };
        chunk.push(ev.by(4242, 4242).at(ts).with_seq(i).on_device(0));
        if chunk.len() == 65_536 {
            w.write_events(&chunk)?;
            chunk.clear();
        }
    }
    w.write_events(&chunk)?;
    w.finish()?;
    let bytes = std::fs::metadata(path)?.len();
    println!(
        "generated {} events, {:.2} GB at {} in {:.1}s (RSS peak so far {} MiB)",
        events,
        bytes as f64 / 1e9,
        path.display(),
        t.elapsed().as_secs_f64(),
        vm_hwm_kib() / 1024
    );

    Ok(path.to_path_buf())
}
