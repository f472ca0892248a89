//! The report's numbers and shape on a synthetic two-process capture.

mod common;
use common::*;
use vramhook_analyzer::render::{perfetto, text};
use vramhook_analyzer::{analyze_bytes, InputStatus, LayoutReason, LeakKind, Options};
use vramhook_protocol::capture::Bytes;
use vramhook_protocol::record::{Api, Event};

fn proc(r: &vramhook_analyzer::Report, pid: u32) -> &vramhook_analyzer::ProcessReport {
    r.processes.iter().find(|p| p.pid == pid).expect("process in report")
}

#[test]
fn scenario_report_has_every_section_and_matches_the_schema() {
    let (bytes, _) = scenario();
    let r = analyze_bytes("scenario.vhc", &bytes, &Options::default()).expect("analyze");
    assert_valid(&r);
    assert_eq!(r.inputs[0].status, InputStatus::Complete);
    assert_eq!(r.schema_version, 7);
    // Schema 5: the fit timelines (validated above), the same samples as the fit warnings.
    let fit = r.timelines.fits.iter().find(|f| f.pid == 100 && f.device == 0).expect("pid 100's fit on GPU 0");
    assert!(!fit.fit_ratio.is_empty());
    for w in &r.fit_warnings {
        let t = r.timelines.fits.iter().find(|f| f.pid == w.pid && f.device == w.device).expect("its timeline");
        assert!(t.crossings.iter().any(|c| c.below && c.ts_ns == w.since_ts_ns), "{w:?} {:?}", t.crossings);
    }
    // pid 100 never asked for 200 GiB before its OOM: the retry of the failed call (its own
    // size now the demand) is the same incident, no warning of it.
    assert!(r.fit_warnings.is_empty(), "the failure's own retry warns of nothing: {:?}", r.fit_warnings);
    let p = proc(&r, 100);
    assert_eq!(p.command, "python train.py");
    assert_eq!(p.device, 0);
    assert_eq!(p.allocations, 40);
    assert_eq!(p.frees, 13 + 2);
    assert_eq!(p.failed_calls, 2);
    // 40 × 100 MiB minus 13 frees before the OOM: the peak; two more frees after it.
    assert_eq!(p.peak_bytes, 27 * 100 * MIB);
    assert_eq!(p.final_live_bytes, 25 * 100 * MIB, "live just before exit, not the model's 0 after it");
    assert!(p.exited);
    assert_eq!(p.exit_status, Some(1));
    let q = proc(&r, 200);
    assert_eq!(q.dropped_events, 3);
    assert!(q.incomplete);
    assert_eq!(q.allocations, 8);
    assert_eq!(q.final_live_bytes, 4 * 512 * MIB);

    assert_eq!(r.ooms.len(), 1, "fail, free, retry is one incident");
    let o = &r.ooms[0].incident;
    assert_eq!(o.pid, 100);
    assert_eq!(o.requested_bytes, 200 * GIB);
    assert_eq!(o.device_free_bytes, Some(9 * GIB));
    assert_eq!(o.verdict.name(), "capacity");
    assert!(!o.explanation.is_empty());
    assert!(!o.lead_up.is_empty() && o.lead_up.len() <= 16);

    let a = r.fragmentation.iter().find(|a| a.pid == 200).expect("pid 200's reservation");
    assert_eq!(a.size, 4 * GIB);
    assert!(a.max_fragmentation > 0.5, "every other chunk unmapped: {}", a.max_fragmentation);
    assert_eq!(a.min_largest_free_span, 0, "fully mapped for a while");
    assert_eq!(a.largest_free_span.last().map(|p| p.last), Some((512 * MIB) as f64));
    assert_eq!(r.anomalies.get("unmap_of_nothing"), Some(&1), "the scenario unmaps past the reservation once");

    assert!(r.leaks.iter().any(|l| l.pid == 100 && l.kind == LeakKind::LiveAtExit && l.bytes == 25 * 100 * MIB));
    let l = r.layout.as_ref().expect("layout");
    assert_eq!(l.reason, LayoutReason::FirstOom);
    assert_eq!(l.entries.iter().filter(|e| e.pid == 100).map(|e| e.size).sum::<u64>(), 27 * 100 * MIB);
    assert!(r.timelines.processes.iter().all(|t| !t.live_bytes.is_empty()));
    assert!(r.timelines.devices[0].free_bytes.len() >= 2);

    let t = text::render(&r);
    for needle in ["OOM INCIDENTS (1)", "verdict: capacity", "LEAKS", "FRAGMENTATION", "INCOMPLETE", "200.00 GiB"] {
        assert!(t.contains(needle), "text report lacks {needle:?}:\n{t}");
    }
}

#[test]
fn filters_by_pid_and_time() {
    let (bytes, _) = scenario();
    let opts = Options { pids: vec![200], ..Options::default() };
    let r = analyze_bytes("s.vhc", &bytes, &opts).expect("analyze");
    assert_valid(&r);
    assert!(r.processes.iter().all(|p| p.pid == 200));
    assert!(r.ooms.is_empty());
    // Stop 50 ms in: pid 100 has made only a few allocations, no OOM yet.
    let opts = Options { to_ns: Some(50_000_000), ..Options::default() };
    let r = analyze_bytes("s.vhc", &bytes, &opts).expect("analyze");
    assert_valid(&r);
    assert!(r.ooms.is_empty());
    assert!(proc(&r, 100).allocations < 10);
    assert!(r.notes.iter().any(|n| n.contains("--to")));
    // Layout at a chosen moment.
    let opts = Options { at_ns: Some(30_000_000), ..Options::default() };
    let r = analyze_bytes("s.vhc", &bytes, &opts).expect("analyze");
    assert_eq!(r.layout.as_ref().map(|l| l.reason), Some(LayoutReason::At));
}

#[test]
fn truncated_capture_is_analysed_up_to_the_cut() {
    let (bytes, offsets) = scenario();
    // Cut in the middle of the frame that holds the OOM.
    let cut = (offsets[offsets.len() - 4] + 40) as usize;
    let r = analyze_bytes("cut.vhc", &bytes[..cut], &Options::default()).expect("analyze");
    assert_valid(&r);
    assert_eq!(r.inputs[0].status, InputStatus::Truncated);
    let at = r.inputs[0].truncated_at.expect("truncated_at");
    assert_eq!(at, offsets[offsets.len() - 4]);
    assert!(r.notes.iter().any(|n| n.contains(&format!("truncated at byte {at}"))));
    assert_eq!(proc(&r, 100).allocations, 40, "every event before the cut was applied");
    assert!(text::render(&r).contains(&format!("truncated at byte {at}")));
}

#[test]
fn perfetto_trace_has_counters_and_oom_instants() {
    let (bytes, _) = scenario();
    let r = analyze_bytes("s.vhc", &bytes, &Options::default()).expect("analyze");
    let v: serde_json::Value = serde_json::from_str(&perfetto::render(&r)).expect("trace is JSON");
    let evs = v["traceEvents"].as_array().expect("traceEvents");
    let counters: Vec<_> = evs.iter().filter(|e| e["ph"] == "C").collect();
    assert!(counters.iter().any(|e| e["pid"] == 100 && e["name"] == "live bytes"));
    assert!(counters.iter().any(|e| e["name"] == "device free bytes"));
    let peak = counters
        .iter()
        .filter(|e| e["pid"] == 100)
        .filter_map(|e| e["args"]["bytes"].as_u64())
        .max()
        .expect("pid 100 counters");
    assert_eq!(peak, 27 * 100 * MIB, "downsampling keeps the peak");
    let ooms: Vec<_> = evs.iter().filter(|e| e["ph"] == "i").collect();
    assert_eq!(ooms.len(), 1);
    assert!(ooms[0]["name"].as_str().unwrap_or("").contains("capacity"));
    assert!(evs.iter().all(|e| e["ts"].is_number() || e["ph"] == "M"));
}

#[test]
fn newer_version_and_garbage_say_so() {
    let (mut bytes, _) = scenario();
    bytes[8] = 9; // format version 9
    let r = analyze_bytes("new.vhc", &bytes, &Options::default()).expect("analyze");
    assert_eq!(r.inputs[0].status, InputStatus::Unreadable);
    assert!(r.inputs[0].error.as_deref().unwrap_or("").contains("version 9 is newer"), "{:?}", r.inputs[0].error);
    let r = analyze_bytes("junk", b"hello world, not a capture", &Options::default()).expect("analyze");
    assert!(r.inputs[0].error.as_deref().unwrap_or("").contains("bad magic"));
}

#[test]
fn real_h200_captures_match_the_schema() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("tests/fixtures").flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "vhc" || x == "pickle") {
            let r = vramhook_analyzer::analyze(&[&p], &Options::default()).expect("analyze");
            assert_valid(&r);
            assert!(
                r.inputs.iter().all(|i| i.status == InputStatus::Complete),
                "{}: {:?}",
                p.display(),
                r.inputs[0].status
            );
            assert!(!r.ooms.is_empty(), "{}: every H200 fixture run ends in an OOM", p.display());
            // Every text and HTML rendering works on real data too.
            assert!(text::render(&r).contains("verdict:"));
            assert!(vramhook_analyzer::render::html::render(&r).contains("report-data"));
            n += 1;
        }
    }
    assert!(n >= 4, "expected the H200 captures and snapshot, found {n}");
}

#[test]
fn inputs_out_of_time_order_keep_every_timeline() {
    use vramhook_protocol::capture::CaptureWriter;
    use vramhook_protocol::record::Api;
    let (bytes, _) = scenario();
    // A second capture whose only process ran before the first capture's.
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("w");
    w.write_events(&[
        ev(300, 1_000, Event::alloc(Api::cuMemAlloc_v2, 0x5000_0000, 64 * MIB)),
        ev(300, 2_000, Event::free(Api::cuMemFree_v2, 0x5000_0000)),
    ])
    .expect("w");
    let early = w.finish().expect("finish");
    let mut r = vramhook_analyzer::Replayer::new(Options::default());
    r.capture("late.vhc", Bytes::new(&bytes)).expect("late");
    r.capture("early.vhc", Bytes::new(&early)).expect("early");
    let rep = vramhook_analyzer::finish(r);
    assert_valid(&rep);
    assert_eq!(rep.time.first_ts_ns, 1_000);
    let t = rep.timelines.processes.iter().find(|t| t.pid == 300).expect("pid 300's timeline");
    assert_eq!(t.live_bytes.iter().map(|p| p.max).fold(0.0, f64::max), (64 * MIB) as f64);
    assert!(t.live_bytes.iter().all(|p| p.t_ns >= 1_000));
    assert!(t.live_bytes.iter().any(|p| p.t_ns <= 2_000 && p.max > 0.0), "the allocation shows at its own time");
}

/// Timelines are bounded yet keep every peak: against the truth computed event by event,
/// the highest point of each process and device timeline is exact (and the lowest never
/// above the truth), for three processes, one on two devices, churning allocations with
/// 60 points per timeline.
#[test]
fn timelines_keep_exact_extremes_of_every_process_and_device() {
    use std::collections::BTreeMap;
    let mut w = vramhook_protocol::capture::CaptureWriter::new(Vec::new(), &header()).expect("writer");
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut live: BTreeMap<(u32, u64), (i16, u64)> = BTreeMap::new();
    let mut proc_live: BTreeMap<u32, u64> = BTreeMap::new();
    let mut dev_live: BTreeMap<i16, u64> = BTreeMap::new();
    let mut truth_proc: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut truth_dev: BTreeMap<i16, (u64, u64)> = BTreeMap::new();
    let mut events = Vec::new();
    for i in 0..60_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let pid = [10u32, 20, 30][(x % 3) as usize];
        let device = if pid == 30 { ((x >> 8) % 2) as i16 } else { (pid / 20) as i16 };
        let addr = 0x7000_0000 + ((x >> 16) % 64) * 0x10_0000;
        let ts = 1_000_000 + i * 1_000 + (x >> 40) % 1_000;
        let e = match live.remove(&(pid, addr)) {
            Some((d, size)) => {
                *proc_live.entry(pid).or_default() -= size;
                *dev_live.entry(d).or_default() -= size;
                ev(pid, ts, Event::free(Api::cuMemFree_v2, addr))
            }
            None => {
                let size = 4096 << ((x >> 32) % 12);
                live.insert((pid, addr), (device, size));
                *proc_live.entry(pid).or_default() += size;
                *dev_live.entry(device).or_default() += size;
                ev(pid, ts, Event::alloc(Api::cuMemAlloc_v2, addr, size)).on_device(device)
            }
        };
        events.push(e);
        let p = truth_proc.entry(pid).or_insert((u64::MAX, 0));
        *p = (p.0.min(proc_live[&pid]), p.1.max(proc_live[&pid]));
        let d = e.device;
        let t = truth_dev.entry(d).or_insert((u64::MAX, 0));
        *t = (t.0.min(dev_live[&d]), t.1.max(dev_live[&d]));
    }
    for c in events.chunks(4096) {
        w.write_events(c).expect("events");
    }
    let bytes = w.finish().expect("finish");
    let r = analyze_bytes("churn.vhc", &bytes, &Options { max_points: 60, ..Options::default() }).expect("analyze");
    for t in &r.timelines.processes {
        assert!(t.live_bytes.len() <= 60, "bounded: {}", t.live_bytes.len());
        let (lo, hi) = truth_proc[&t.pid];
        let max = t.live_bytes.iter().map(|p| p.max).fold(0.0, f64::max);
        let min = t.live_bytes.iter().map(|p| p.min).fold(f64::MAX, f64::min);
        assert_eq!(max, hi as f64, "pid {} highest", t.pid);
        assert!(min <= lo as f64, "pid {} lowest {min} above the truth {lo}", t.pid);
        assert_eq!(proc(&r, t.pid).peak_bytes, hi);
    }
    for t in &r.timelines.devices {
        let (lo, hi) = truth_dev[&t.device];
        let max = t.live_bytes.iter().map(|p| p.max).fold(0.0, f64::max);
        let min = t.live_bytes.iter().map(|p| p.min).fold(f64::MAX, f64::min);
        assert_eq!(max, hi as f64, "device {} highest", t.device);
        assert!(min <= lo as f64, "device {} lowest", t.device);
        let rep = r.devices.iter().find(|d| d.device == t.device).expect("device report");
        assert_eq!(rep.peak_live_bytes, hi, "device {} peak", t.device);
        assert_eq!(t.live_bytes.last().map(|p| p.last), Some(dev_live[&t.device] as f64), "device {} final", t.device);
    }
    assert_eq!(r.timelines.devices.len(), 2);
}

/// ollama's VMM pool on the H200: cuMemAddressReserve names no device, the handles mapped
/// into the reservation do. Each reservation is one arena on GPU 0 (its samples before the
/// first mapping included), and a reservation nothing was mapped into says "dev ?".
#[test]
fn vmm_reservations_name_their_device_in_real_captures() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let r = vramhook_analyzer::analyze(&[fixtures.join("logs/ollama_v0.24.0_oom.h200.vhc")], &Options::default())
        .expect("analyze");
    let vmm: Vec<_> = r.fragmentation.iter().filter(|a| a.kind == vramhook_model::ArenaKind::VmmReservation).collect();
    assert!(!vmm.is_empty());
    assert!(
        vmm.iter().all(|a| a.device == 0),
        "{:?}",
        vmm.iter().map(|a| (a.pid, a.device, a.base)).collect::<Vec<_>>()
    );
    for a in &vmm {
        // The 32 GiB reserved before anything was mapped: the arena's first points.
        assert_eq!(a.largest_free_span.first().map(|p| p.max as u64), Some(a.size), "{:#x}", a.base);
        assert!(a.fragmentation.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    }
    assert!(!text::render(&r).contains("dev -1"));
    let r = vramhook_analyzer::analyze(&[fixtures.join("h200-oom/torch_expandable_capacity.vhc")], &Options::default())
        .expect("analyze");
    assert_eq!(r.fragmentation.len(), 1);
    assert_eq!(r.fragmentation[0].device, -1, "nothing was mapped: no device to name");
    assert!(text::render(&r).contains("pid 555 dev ? VMM reservation"));
}

/// A pid reused is another process with its own losses: each process-end frame's drops go
/// to the process it ends, not to every process of that pid (before: both processes of pid
/// 5 reported 10 + 20 dropped events).
#[test]
fn a_reused_pid_keeps_each_process_losses_apart() {
    use vramhook_protocol::capture::{CaptureWriter, ProcessEnd};
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("writer");
    for (i, (start, dropped)) in [(11u64, 10u64), (22, 20)].into_iter().enumerate() {
        let t = 1_000 + i as u64 * 100;
        let evs = [
            ev(5, t, Event::process_start(1, start)),
            ev(5, t + 1, Event::alloc(Api::cuMemAlloc_v2, 0x1000_0000 * (i as u64 + 1), 4096)),
        ];
        w.write_events(&evs).expect("events");
        let end = ProcessEnd { pid: 5, start_time: start, ts_ns: t + 50, dropped, ..ProcessEnd::default() };
        w.write_process_end(&end).expect("end");
    }
    let r = analyze_bytes("reuse.vhc", &w.finish().expect("finish"), &Options::default()).expect("report");
    let drops: Vec<_> = r.processes.iter().map(|p| (p.start_time, p.dropped_events)).collect();
    assert_eq!(drops, vec![(11, 10), (22, 20)]);
}
