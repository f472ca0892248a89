//! The corruption suite: truncations at every byte, random bit flips, spliced files,
//! strict mode. Seeded and fast; nothing may panic, and nothing readable may be lost.

mod common;
use common::*;
use vramhook_analyzer::{analyze_bytes, fuzzing, AnalyzeError, InputStatus, Options};
use vramhook_protocol::record::{Api, Event};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn events_applied(bytes: &[u8]) -> u64 {
    analyze_bytes("x.vhc", bytes, &Options::default()).expect("non-strict never fails").events
}

#[test]
fn truncation_at_every_byte() {
    let (bytes, offsets) = scenario();
    let full = events_applied(&bytes);
    let mut last_events = 0;
    // Not one byte: no header, an error rather than a report of nothing.
    let e = analyze_bytes("cut.vhc", &[], &Options::default()).expect_err("an empty input");
    assert!(matches!(e, AnalyzeError::Empty { .. }), "{e}");
    for cut in 1..bytes.len() {
        let r = analyze_bytes("cut.vhc", &bytes[..cut], &Options::default()).expect("non-strict never fails");
        let i = &r.inputs[0];
        if cut < 64 + 8 {
            assert!(
                i.status == InputStatus::Truncated || i.status == InputStatus::Unreadable,
                "cut {cut}: {}",
                i.status
            );
            continue;
        }
        assert_eq!(i.status, InputStatus::Truncated, "cut at {cut}");
        let at = i.truncated_at.expect("truncated_at");
        assert!(at <= cut as u64, "cut {cut} reported at {at}");
        // The cut is reported at the start of the frame it falls in: a frame boundary.
        assert!(offsets.contains(&at), "cut {cut}: {at} is not a frame boundary");
        assert!(r.notes.iter().any(|n| n.contains(&format!("truncated at byte {at}"))));
        assert!(r.events >= last_events, "fewer events with more bytes at cut {cut}");
        last_events = r.events;
    }
    assert!(last_events <= full);
}

#[test]
fn random_bit_flips_never_panic_and_report_offsets() {
    let (bytes, _) = scenario();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut corrupt_seen = 0;
    for _ in 0..1500 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.below(8) {
            let i = rng.below(b.len());
            b[i] ^= 1 << rng.below(8);
        }
        let r = analyze_bytes("flip.vhc", &b, &Options::default()).expect("non-strict never fails");
        for c in &r.inputs[0].corrupt_frames {
            assert!(c.offset < b.len() as u64);
            assert!(!c.reason.is_empty());
            corrupt_seen += 1;
        }
        fuzzing::capture_reader(&b);
        // Strict: either fine, or one corrupt frame named by offset.
        match analyze_bytes("flip.vhc", &b, &Options { strict: true, ..Options::default() }) {
            Ok(_) => {}
            Err(AnalyzeError::Corrupt { offset, .. }) => assert!(offset < b.len() as u64),
            // A flipped length can make the last frame run past the end: a cut.
            Err(AnalyzeError::Truncated { offset, .. }) => assert!(offset < b.len() as u64),
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(corrupt_seen > 500, "the flips should hit checksummed frames: {corrupt_seen}");
}

#[test]
fn a_corrupt_frame_is_skipped_and_the_rest_is_read() {
    let (bytes, offsets) = scenario();
    // Damage the payload of the second event frame (pid 100's first allocations).
    let frame = offsets[3];
    let mut b = bytes.clone();
    b[frame as usize + 16 + 70] ^= 0xff;
    let r = analyze_bytes("bad.vhc", &b, &Options::default()).expect("non-strict");
    let i = &r.inputs[0];
    assert_eq!(i.status, InputStatus::Corrupt);
    assert_eq!(i.corrupt_frames.len(), 1);
    assert_eq!(i.corrupt_frames[0].offset, frame);
    assert!(r.notes.iter().any(|n| n.contains(&format!("corrupt frame at byte {frame}"))));
    // Everything after the bad frame was still applied: the OOM and both exits.
    assert_eq!(r.ooms.len(), 1);
    assert!(r.processes.iter().all(|p| p.exited));
    // Strict stops there, naming the offset.
    match analyze_bytes("bad.vhc", &b, &Options { strict: true, ..Options::default() }) {
        Err(AnalyzeError::Corrupt { offset, reason, .. }) => {
            assert_eq!(offset, frame);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("strict mode must fail: {:?}", other.map(|r| r.inputs[0].status)),
    }
}

#[test]
fn spliced_files_never_panic() {
    let (a, _) = scenario();
    let (b, _) = scenario();
    let mut rng = Rng(0xfeed_beef_0000_0002);
    for _ in 0..400 {
        let i = rng.below(a.len());
        let j = rng.below(b.len());
        let mut s = a[..i].to_vec();
        s.extend_from_slice(&b[j..]);
        if rng.below(4) == 0 {
            // Or a whole second capture glued on, header and all.
            s.extend_from_slice(&b);
        }
        let r = analyze_bytes("splice.vhc", &s, &Options::default()).expect("non-strict");
        assert!(r.events <= 2 * 86);
        fuzzing::analyze_bytes_target(&s[..s.len().min(3000)]);
    }
}

#[test]
fn seed_corpus_through_the_fuzz_target_bodies() {
    let (bytes, _) = scenario();
    let mut corpus: Vec<Vec<u8>> = vec![bytes.clone(), Vec::new(), b"VRHKCAPT".to_vec(), vec![0x80, 5, b'.']];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds");
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if let Ok(b) = std::fs::read(e.path()) {
                corpus.push(b);
            }
        }
    }
    // Inputs of the checkpoint target: from each capture, the model after half its events.
    let checkpoints: Vec<Vec<u8>> = corpus.iter().filter_map(|c| fuzzing::model_checkpoint_seed(c)).collect();
    assert!(checkpoints.len() >= 2, "the scenario and the seed captures give checkpoints");
    corpus.extend(checkpoints);
    let mut rng = Rng(7);
    let n = corpus.len();
    for k in 0..n {
        for _ in 0..30 {
            let mut b = corpus[k].clone();
            if !b.is_empty() {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len());
                    b[i] = rng.next() as u8;
                }
            }
            corpus.push(b);
        }
    }
    for c in &corpus {
        fuzzing::capture_reader(c);
        fuzzing::pytorch_snapshot(c);
        fuzzing::analyze_bytes_target(c);
        fuzzing::model_checkpoint(c);
        fuzzing::joined_inputs(c);
    }
}

/// A file on disk is read through a memory map: for whole, cut and bit-flipped captures it
/// gives the same report as the same bytes in memory.
#[test]
fn mapped_files_read_as_their_bytes() {
    let (bytes, _) = scenario();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut variants = vec![bytes.clone(), bytes[..bytes.len() / 2].to_vec(), bytes[..100].to_vec()];
    for _ in 0..20 {
        let mut b = bytes.clone();
        let i = 64 + rng.below(b.len() - 64);
        b[i] ^= 1 << rng.below(8);
        variants.push(b);
    }
    for (n, v) in variants.iter().enumerate() {
        let path = dir.path().join(format!("v{n}.vhc"));
        std::fs::write(&path, v).expect("write");
        let from_file = vramhook_analyzer::analyze(&[&path], &Options::default()).expect("non-strict never fails");
        let from_bytes = analyze_bytes(&path.display().to_string(), v, &Options::default()).expect("bytes");
        assert_eq!(from_file.events, from_bytes.events, "variant {n}");
        let (a, b) = (&from_file.inputs[0], &from_bytes.inputs[0]);
        assert_eq!((&a.status, a.truncated_at, a.bytes_read), (&b.status, b.truncated_at, b.bytes_read), "variant {n}");
        let offsets =
            |i: &vramhook_analyzer::InputReport| i.corrupt_frames.iter().map(|c| c.offset).collect::<Vec<_>>();
        assert_eq!(offsets(a), offsets(b), "variant {n}");
    }
}

/// Another program truncates a capture while it is mapped: the analyzer reports the cut
/// instead of dying of SIGBUS, and keeps what it read before it.
#[test]
fn a_file_truncated_while_mapped_reads_as_cut() {
    let mut w = vramhook_protocol::capture::CaptureWriter::new(Vec::new(), &header()).expect("writer");
    let evs: Vec<_> = (0..200_000u64)
        .map(|i| {
            let addr = 0x1000 + (i / 2) * 4096;
            let e = if i % 2 == 0 {
                Event::alloc(Api::cuMemAlloc_v2, addr, 4096)
            } else {
                Event::free(Api::cuMemFree_v2, addr)
            };
            ev(7, 1_000 + i, e)
        })
        .collect();
    for c in evs.chunks(1000) {
        w.write_events(c).expect("events");
    }
    let bytes = w.finish().expect("finish");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shrinking.vhc");
    std::fs::write(&path, &bytes).expect("write");
    let file = std::fs::File::open(&path).expect("open");
    let mapped = vramhook_protocol::mapped::Mapped::new(&file).expect("map");
    // Cut to 1 MiB after the map was made (its first pages already populated).
    std::fs::OpenOptions::new().write(true).open(&path).expect("open rw").set_len(1 << 20).expect("truncate");
    let mut r = vramhook_analyzer::Replayer::new(Options::default());
    r.capture("shrinking.vhc", mapped).expect("non-strict never fails");
    let rep = vramhook_analyzer::finish(r);
    let i = &rep.inputs[0];
    assert_eq!(i.status, InputStatus::Truncated);
    let at = i.truncated_at.expect("where");
    assert!((900_000..=1 << 20).contains(&at), "cut reported at {at}");
    assert!(i.error.as_deref().is_some_and(|e| e.contains("shrank")), "{:?}", i.error);
    assert!(rep.events > 10_000 && rep.events < 200_000, "kept what came before the cut: {}", rep.events);
}

/// The seeds for issue 9's checks say what they are about: the depth bound, the gap of a
/// frame deleted whole, six bytes that are not a capture, and the per-category limit.
#[test]
fn issue_9_seeds_hit_their_checks() {
    let seed = |name: &str| std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds/").to_string() + name);
    let opts = Options::default();
    let e = analyze_bytes("n.pickle", &seed("nested_tuples_2000.pickle").expect("seed"), &opts).expect_err("too deep");
    assert!(e.to_string().contains("nested more than 1000 deep"), "{e}");
    let r = analyze_bytes("g.vhc", &seed("gap_frame_deleted.vhc").expect("seed"), &opts).expect("gap");
    assert_eq!(r.inputs[0].status, InputStatus::Gap);
    assert_eq!(r.inputs[0].missing_frames, Some(1));
    let r = analyze_bytes("j", &seed("not_a_capture_6_bytes").expect("seed"), &opts).expect("junk");
    assert_eq!(r.inputs[0].status, InputStatus::Unreadable);
    assert!(r.inputs[0].error.as_deref().unwrap_or("").contains("not a capture"));
    let r = analyze_bytes("c.vhc", &seed("capture_cut_in_header.vhc").expect("seed"), &opts).expect("cut");
    assert_eq!(r.inputs[0].status, InputStatus::Truncated);
    let small = Options { max_items: 4, ..Options::default() };
    let r = analyze_bytes("d.vhc", &seed("many_devices.vhc").expect("seed"), &small).expect("devices");
    assert_eq!((r.devices.len(), r.folded.devices), (4, 36));
    let r = analyze_bytes("p.vhc", &seed("processes_with_an_oom.vhc").expect("seed"), &small).expect("procs");
    assert_eq!((r.processes.len(), r.folded.processes, r.ooms.len()), (4, 26, 4));
    let r = analyze_bytes("s.pickle", &seed("segments_shared_ooms.pickle").expect("seed"), &small).expect("segs");
    assert_eq!(r.folded.segments, 16);
}

/// Framework failures open incidents too: past `max_items` they are folded and counted like
/// the driver's, and one that follows a folded driver failure is that incident, not another.
/// (Found by `cargo fuzz run analyze_bytes`: its input is the seed
/// `framework_ooms_past_the_limit.vhc`, which kept 22 incidents at a limit of 2.)
#[test]
fn framework_failures_past_the_incident_limit_are_folded_once() {
    use vramhook_protocol::capture::CaptureWriter;
    use vramhook_protocol::record::{FrameworkId, CUDA_ERROR_OUT_OF_MEMORY};
    let mut w = CaptureWriter::new(Vec::new(), &header()).expect("writer");
    w.write_process(&info(100, "python3 serve.py")).expect("process");
    let mut events = Vec::new();
    let lens_oom = |ts| ev(100, ts, Event::framework_oom(FrameworkId::PyTorch, 2 * GIB, 4 * GIB, 3 * GIB, MIB));
    // Five driver failures, each followed by its framework's; then five framework failures
    // alone (a limit of the framework's own), each a second apart: ten incidents.
    for i in 0..5u64 {
        let ts = 1_000_000_000 * (i + 1);
        let failed = Event::alloc(Api::cuMemAlloc_v2, 0, 2 * GIB).with_result(CUDA_ERROR_OUT_OF_MEMORY);
        events.push(ev(100, ts, failed));
        events.push(lens_oom(ts + 1_000));
    }
    for i in 0..5u64 {
        events.push(lens_oom(1_000_000_000 * (i + 10)));
    }
    w.write_events(&events).expect("events");
    let bytes = w.finish().expect("finish");
    let all = analyze_bytes("f.vhc", &bytes, &Options::default()).expect("capture");
    assert_eq!((all.ooms.len(), all.folded.ooms), (10, 0), "ten incidents without a limit");
    for max_items in [2, 7] {
        let r = analyze_bytes("f.vhc", &bytes, &Options { max_items, ..Options::default() }).expect("capture");
        assert_eq!((r.ooms.len(), r.folded.ooms), (max_items, 10 - max_items as u64), "limit {max_items}");
    }
    let seed = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/seeds/framework_ooms_past_the_limit.vhc"));
    let r = analyze_bytes("seed.vhc", &seed.expect("seed"), &Options { max_items: 2, ..Options::default() });
    assert_eq!(r.expect("seed").ooms.len(), 2);
}

/// A capture that starts with a checkpoint resumes from it, and what the checkpoint holds
/// counts against `--max-items`: one holding more processes than the limit is refused with
/// a note, and its devices past the limit are folded as they reach the timelines (found by
/// cargo fuzz: 22 devices kept at a limit of 2, then 3, from an allocation of the checkpoint
/// freed later).
#[test]
fn a_checkpoint_counts_against_the_limits() {
    // pids 300.. each hold 1 MiB on device 0..; `pids` of them.
    let capture = |pids: u32| {
        let mut model = vramhook_model::Model::new(Default::default());
        for device in 0..5i16 {
            let pid = 300 + device as u32 % pids;
            let e = Event::alloc(Api::cuMemAlloc_v2, 0x7000_0000_0000 + (device as u64) * (1 << 32), 1 << 20);
            model.apply(&vramhook_testkit::events::made(e, pid, 1_000 + device as u64, device));
        }
        let later = ev(300, 2_000, Event::free(Api::cuMemFree_v2, 0x7000_0000_0000)).to_raw();
        fuzzing::checkpoint_capture(&model.checkpoint(), zerocopy::IntoBytes::as_bytes(&later))
    };
    let analyze = |pids: u32, max_items: usize| {
        analyze_bytes("ck.vhc", &capture(pids), &Options { max_items, ..Options::default() }).expect("report")
    };
    let devices = |r: &vramhook_analyzer::Report| r.devices.iter().filter(|d| d.device != -1).count();
    let resumed = |r: &vramhook_analyzer::Report| r.notes.iter().any(|n| n.contains("resumed from a model checkpoint"));

    let within = analyze(5, 5);
    assert!(resumed(&within), "{:?}", within.notes);
    assert_eq!((devices(&within), within.processes.len()), (5, 5));
    assert_eq!(within.processes.iter().map(|p| p.final_live_bytes).sum::<u64>(), 4 << 20, "the free after it applies");

    let past = analyze(5, 2);
    assert!(!resumed(&past), "{:?}", past.notes);
    let refused = "checkpoint ignored: it holds 5 processes, more than the limit of 2 (--max-items)";
    assert!(past.notes.iter().any(|n| n.contains(refused)), "{:?}", past.notes);
    assert!(devices(&past) <= 2 && past.processes.len() <= 2);

    // One process on five devices: resumed, two devices kept, three folded.
    let one = analyze(1, 2);
    assert!(resumed(&one), "{:?}", one.notes);
    assert_eq!((devices(&one), one.folded.devices), (2, 3));
}

/// A pid the system reused (or a process's new image after `exec`) is another process:
/// it counts against `--max-items` as a new pid does. Before, three processes of pid 5
/// were all kept at a limit of 1 (a container's main process restarting in a loop keeps
/// its pid in its namespace).
#[test]
fn a_reused_pid_counts_against_the_process_limit() {
    let mut evs = Vec::new();
    for (i, start) in [11u64, 22, 33].into_iter().enumerate() {
        let t = 1_000 + i as u64 * 100;
        evs.push(ev(5, t, Event::process_start(1, start)));
        evs.push(ev(5, t + 1, Event::alloc(Api::cuMemAlloc_v2, 0x1000_0000 * (i as u64 + 1), 4096)));
    }
    let mut w = vramhook_protocol::capture::CaptureWriter::new(Vec::new(), &header()).expect("writer");
    w.write_events(&evs).expect("write");
    let capture = w.finish().expect("finish");
    // (start time, exited) of each process kept; processes and events folded.
    let kept = |max_items: usize| {
        let r = analyze_bytes("reuse.vhc", &capture, &Options { max_items, ..Options::default() }).expect("report");
        let procs: Vec<_> = r.processes.iter().map(|p| (p.start_time, p.exited)).collect();
        (procs, r.folded.processes, r.folded.process_events)
    };
    assert_eq!(kept(10), (vec![(11, true), (22, true), (33, false)], 0, 0));
    // The last process kept ends where the pid's next start was folded, as it would have.
    assert_eq!(kept(2), (vec![(11, true), (22, true)], 1, 2));
    assert_eq!(kept(1), (vec![(11, true)], 2, 4));
}

/// Every 64-byte prefix of a small capture (what a killed agent leaves, or a running agent's
/// current file): read, its cut said once (in the notes and in the text, not again as an
/// error), `--strict` failing on it, and no report claiming an exit the prefix does not hold.
#[test]
fn every_64_byte_prefix_says_its_cut_once_and_claims_no_exit_it_lacks() {
    use vramhook_analyzer::render::{html, text};
    use vramhook_protocol::capture::{Bytes, CaptureReader, Frame};
    use vramhook_protocol::record::EventKind;
    let (bytes, _) = scenario();
    let cuts: Vec<usize> = (64..bytes.len()).step_by(64).chain([bytes.len()]).collect();
    let mut truncated = 0;
    for cut in cuts {
        let prefix = &bytes[..cut];
        let r = analyze_bytes("cut.vhc", prefix, &Options::default()).expect("non-strict never fails");
        let t = text::render(&r);
        // The exits the prefix holds: process-end frames and exit events.
        let mut exits = std::collections::BTreeSet::new();
        if let Ok(mut reader) = CaptureReader::from_source(Bytes::new(prefix)) {
            while let Ok(Some(f)) = reader.next_frame() {
                match f {
                    Frame::ProcessEnd(end) => {
                        exits.insert(end.pid);
                    }
                    Frame::Events(recs) => {
                        for raw in recs {
                            let e = vramhook_protocol::Event::from_raw(raw);
                            if e.kind == EventKind::ProcessExit as u8 {
                                exits.insert(e.pid);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        for p in &r.processes {
            assert!(!p.exited || exits.contains(&p.pid), "cut {cut}: pid {} exited, not in the input", p.pid);
        }
        let all_exited = !r.processes.is_empty() && r.processes.iter().all(|p| exits.contains(&p.pid));
        let leaks = t.split("\nLEAKS").nth(1).and_then(|l| l.lines().nth(1)).unwrap_or("").trim().to_string();
        if !all_exited {
            for claim in ["before exit", "freed everything"] {
                assert!(!t.contains(claim), "cut {cut}: {claim:?} with exits {exits:?}:\n{t}");
            }
            assert!(!leaks.starts_with("none"), "cut {cut}: LEAKS {leaks}");
            let h = html::render(&r);
            let html_leaks = h.split("<h2>Leaks</h2>").nth(1).unwrap_or("");
            assert!(
                !h.contains("before exit") && !html_leaks.starts_with("\n<p>None"),
                "cut {cut}: html claims an exit"
            );
            if r.leaks.is_empty() {
                let said = ["no process in the input", "running at end"].iter().any(|w| html_leaks.contains(w));
                assert!(said, "cut {cut}: html leaks {}", &html_leaks[..html_leaks.len().min(200)]);
            }
        }
        if r.leaks.is_empty() && r.processes.iter().any(|p| !p.exited) {
            assert!(leaks.contains("running at end of capture"), "cut {cut}: {leaks}");
        }
        if r.inputs[0].status == InputStatus::Truncated {
            truncated += 1;
            assert_eq!(t.matches("truncated at byte").count(), 1, "cut {cut}: said once:\n{t}");
            assert_eq!(r.notes.iter().filter(|n| n.contains("truncated")).count(), 1, "cut {cut}: {:?}", r.notes);
            let strict = analyze_bytes("cut.vhc", prefix, &Options { strict: true, ..Options::default() });
            assert!(matches!(strict, Err(AnalyzeError::Truncated { .. })), "cut {cut}: --strict must fail");
        } else {
            assert!(!t.contains("truncated"), "cut {cut}: {}", r.inputs[0].status);
        }
    }
    assert!(truncated >= 10, "the prefixes must be cuts: {truncated}");
}
