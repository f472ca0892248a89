//! Hostile files for `vramhook analyze` (issue 9): each is generated here, analysed by the
//! real binary, and its cost is asserted in counts (items kept ≤ the limit, the rest
//! reported as folded) and in the child's peak memory (`wait4`'s `ru_maxrss`), never in
//! wall time (`cargo bench -p vramhook-safety-tests --bench hostile` times
//! them). Also: pipes and FIFOs, six bytes that are not a capture, frames deleted whole,
//! and the agent-restart losses counted once.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vramhook_protocol::capture::{CaptureHeader, CaptureReader, CaptureWriter, ProcessEnd, ProcessInfo};
use vramhook_safety_tests::files_kit::*;
use vramhook_safety_tests::vramhook_bin;

/// Peak memory allowed to the analyzer on any of these files.
const MAX_RSS_KIB: u64 = 200 * 1000;
const LIMIT: u64 = 10_000;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

/// Analyses `file` as JSON; checks it succeeded within the memory bound.
fn analyze_bounded(file: &Path, extra: &[&str]) -> Value {
    let (m, json) = analyze_json(&vramhook_bin(), file, extra);
    let stderr = String::from_utf8_lossy(&m.output.stderr);
    assert!(m.output.status.success(), "analyze {} failed ({:?}): {stderr}", file.display(), m.output.status);
    assert!(
        m.max_rss_kib <= MAX_RSS_KIB,
        "analyze {} peaked at {} KiB (bound {MAX_RSS_KIB})",
        file.display(),
        m.max_rss_kib
    );
    eprintln!("{}: peak {} KiB in {:.2} s", file.display(), m.max_rss_kib, m.wall.as_secs_f64());
    json.expect("JSON report")
}

/// Makes the file `name` in a fresh directory with `make`, then analyses it bounded.
fn made_and_analyzed<T>(name: &str, make: impl FnOnce(&Path) -> T) -> (tempfile::TempDir, PathBuf, Value) {
    let d = dir();
    let f = d.path().join(name);
    make(&f);
    let r = analyze_bounded(&f, &[]);
    (d, f, r)
}

/// `key` kept up to the limit, and `n` more folded.
fn kept_and_folded(r: &Value, key: &str, n: u64) {
    assert_eq!(count(r, key) as u64, LIMIT, "{key} kept");
    assert_eq!(folded(r, key), n, "{key} folded");
}

fn count(v: &Value, key: &str) -> usize {
    v[key].as_array().map_or(0, Vec::len)
}

fn folded(v: &Value, key: &str) -> u64 {
    v["folded"][key].as_u64().unwrap_or_else(|| panic!("folded.{key} missing: {}", v["folded"]))
}

fn notes(v: &Value) -> String {
    v["notes"].as_array().map(|n| n.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("\n")).unwrap_or_default()
}

/// Tuples nested 200,000 deep in a 200 KB snapshot used to overflow the stack (SIGABRT).
#[test]
fn tuples_nested_200k_deep_are_refused_with_a_reason() {
    let d = dir();
    let f = d.path().join("nested.pickle");
    nested_tuples(&f, 200_000);
    let m = run_measured(Command::new(vramhook_bin()).arg("analyze").arg(&f));
    let stderr = String::from_utf8_lossy(&m.output.stderr);
    assert_eq!(m.output.status.code(), Some(2), "a clear error, not a signal: {:?} {stderr}", m.output.status);
    assert!(stderr.contains("nested more than 1000 deep"), "{stderr}");
}

/// 100,000 OOM failures (12.8 MB; 734 MiB before): at most 10,000 incidents, the rest folded.
#[test]
fn a_hundred_thousand_ooms_keep_ten_thousand_incidents() {
    let (_d, _, r) = made_and_analyzed("ooms.vhc", |f| many_ooms(f, 100_000));
    kept_and_folded(&r, "ooms", 90_000);
    assert_eq!(folded(&r, "oom_bytes"), 90_000 * 200 * GIB);
    assert!(notes(&r).contains("90000 more out-of-memory failures after 10000 incidents"), "{}", notes(&r));
}

/// 300,000 processes (19.2 MB; 738 MiB before): 10,000 replayed, the rest counted.
#[test]
fn three_hundred_thousand_processes_keep_ten_thousand() {
    let (_d, _, r) = made_and_analyzed("procs.vhc", |f| many_processes(f, 300_000));
    kept_and_folded(&r, "processes", 290_000);
    assert_eq!(folded(&r, "process_events"), 290_000);
    assert_eq!(folded(&r, "process_bytes"), 290_000 * 4096);
    assert_eq!(r["folded"]["max_items"], LIMIT);
}

/// 50,000 processes with an OOM each (3.2 MB; >10 s and quadratic before: every OOM summed
/// the idle bytes of every process).
#[test]
fn fifty_thousand_processes_with_an_oom_each() {
    let (_d, _, r) = made_and_analyzed("proc-ooms.vhc", |f| many_processes_with_an_oom(f, 50_000));
    assert_eq!(count(&r, "ooms") as u64, LIMIT);
    kept_and_folded(&r, "processes", 40_000);
    assert_eq!(folded(&r, "process_events"), 40_000);
}

/// 10,000 processes that each hold 1 MiB and fail once (1.3 MB): judging a failure looks at
/// every process on the device, 10^8 looks in all (7.6 s and 2 GB before, each incident
/// also keeping a list as long as the processes). Past the work allowance (which grows
/// with the events read) the rest are kept, unjudged, and said to be.
#[test]
fn ten_thousand_holders_each_failing_are_judged_within_the_allowance() {
    let (_d, _, r) = made_and_analyzed("holders.vhc", |f| holders_each_failing(f, 10_000));
    assert_eq!(count(&r, "ooms") as u64, LIMIT);
    let unjudged = folded(&r, "ooms_unjudged");
    assert!(unjudged > 0 && unjudged < LIMIT, "{unjudged} unjudged");
    assert!(notes(&r).contains("not judged"), "{}", notes(&r));
    let ooms = r["ooms"].as_array().expect("ooms");
    let judged = ooms.iter().filter(|o| o["unknown_reason"].as_str().is_none_or(|w| !w.starts_with("not judged")));
    assert_eq!(judged.count() as u64, LIMIT - unjudged, "the first failures are judged, the rest say why not");
    let first = &ooms[0];
    assert!(count(first, "holders") <= 16, "holders listed per incident are bounded: {}", count(first, "holders"));
    assert_eq!(ooms.last().expect("last")["verdict"], "unknown");
}

/// 20,000 processes that each allocate and exit (2.6 MB; quadratic before: every exit took a
/// snapshot of every process, and sampled them all again at the next event).
#[test]
fn twenty_thousand_processes_exiting() {
    let (_d, _, r) = made_and_analyzed("exits.vhc", |f| many_processes_exiting(f, 20_000));
    kept_and_folded(&r, "processes", 10_000);
    assert_eq!(folded(&r, "process_events"), 20_000);
    // Every kept process is reported as exited, with what it held at exit.
    let procs = r["processes"].as_array().expect("processes");
    assert!(procs.iter().all(|p| p["exited"] == true && p["final_live_bytes"] == 4096), "{}", procs[0]);
    assert!(notes(&r).contains("work budget for full views at exit"), "{}", notes(&r));
}

/// 20,000 processes as `vramhook run` records them, each with a process-end frame (4.8 MB;
/// over two minutes before: every end frame sampled every process).
#[test]
fn twenty_thousand_process_end_frames() {
    let (_d, _, r) = made_and_analyzed("ends.vhc", |f| many_process_ends(f, 20_000));
    kept_and_folded(&r, "processes", 10_000);
    let procs = r["processes"].as_array().expect("processes");
    assert!(procs.iter().all(|p| p["exited"] == true && p["exit_status"] == 0), "{}", procs[0]);
}

/// 50,000 distinct device numbers (3.2 MB; >10 s before: devices were found by a linear
/// search at every flush). `--max-items` sets the limit.
#[test]
fn fifty_thousand_device_numbers_and_the_max_items_flag() {
    let (_d, f, r) = made_and_analyzed("devices.vhc", |f| many_devices(f, 50_000));
    kept_and_folded(&r, "devices", 40_000);
    assert_eq!(folded(&r, "device_bytes"), 40_000 * 4096);
    let r = analyze_bounded(&f, &["--max-items", "100"]);
    assert_eq!(count(&r, "devices"), 100);
    assert_eq!(folded(&r, "devices"), 49_900);
    assert_eq!(r["folded"]["max_items"], 100);
}

/// 10,000 segments × 10,000 OOM trace entries that are one memoized dict (0.5 MB; >10 s
/// before: every OOM handed every segment to the model again).
#[test]
fn ten_thousand_segments_times_ten_thousand_shared_ooms() {
    let (_d, f, r) = made_and_analyzed("segs.pickle", |f| segments_and_shared_ooms(f, 10_000, 10_000));
    let py = &r["inputs"][0]["pytorch"];
    assert_eq!(py["segments"], 10_000);
    assert_eq!(py["trace_entries"], 10_000);
    assert_eq!(folded(&r, "segments"), 0);
    // With a lower limit, the rest of the segments are counted with their bytes.
    let r = analyze_bounded(&f, &["--max-items", "2500"]);
    assert_eq!(folded(&r, "segments"), 7_500);
    assert_eq!(folded(&r, "segment_bytes"), 7_500 * 2 * MIB);
    assert!(count(&r["layout"], "arenas") <= 2_500);
}

/// A 40 MB snapshot (1 GB before): the pickle reader keeps a bounded number of values.
#[test]
fn a_forty_megabyte_snapshot_stays_bounded() {
    let (_d, _, r) = made_and_analyzed("big.pickle", |f| big_snapshot(f, 40 << 20));
    assert!(folded(&r, "pickle_values") > 0, "{}", r["folded"]);
    assert!(notes(&r).contains("pickle values past the reader's budget"), "{}", notes(&r));
}

/// The text and HTML reports say what was folded, too.
#[test]
fn text_and_html_say_what_was_folded() {
    let d = dir();
    let f = d.path().join("procs.vhc");
    many_processes(&f, 2_000);
    let html = d.path().join("r.html");
    let out = Command::new(vramhook_bin())
        .args(["analyze", "--max-items", "500", "--html"])
        .arg(&html)
        .arg(&f)
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = "1500 more processes past the limit of 500 (--max-items) were counted, not replayed";
    assert!(text.contains(line), "{text}");
    assert!(std::fs::read_to_string(&html).expect("html").contains(line));
}

/// A small real-shaped capture: a process, events in several frames, its end.
fn small_capture(path: &Path) -> Vec<u8> {
    let info = ProcessInfo { pid: 100, exe: "/bin/train".into(), cmdline: vec!["train".into()], ..Default::default() };
    let mut w = CaptureWriter::new(Vec::new(), &CaptureHeader::now()).expect("header");
    w.write_process(&info).expect("process");
    for k in 0..6u64 {
        let ev: Vec<_> =
            (0..10).map(|i| alloc(100, 1_000 + k * 100 + i, 0, 0x1000_0000 * (k * 10 + i + 1), MIB)).collect();
        w.write_events(&ev).expect("events");
    }
    w.write_process_end(&ProcessEnd {
        pid: 100,
        exit_status: Some(0),
        ts_ns: 10_000,
        delivered: 60,
        ..Default::default()
    })
    .expect("end");
    let bytes = w.finish().expect("finish");
    std::fs::write(path, &bytes).expect("write");
    bytes
}

/// `vramhook analyze --json <(cat file)`: the capture arrives through a pipe.
fn analyze_json_through_a_pipe(file: &Path) -> std::process::Output {
    Command::new("bash")
        .arg("-c")
        .arg(format!("exec {} analyze --json <(cat {})", vramhook_bin().display(), file.display()))
        .output()
        .expect("bash")
}

fn events_of(r: &Value) -> u64 {
    r["inputs"][0]["events"].as_u64().unwrap_or(0)
}

/// `analyze <(cat x.vhc)` said "bad magic" (the first byte was read, then the pipe opened
/// again), and a FIFO whose writer had closed hung. Both now read like the file.
#[test]
fn pipes_and_fifos_are_streamed_to_their_end() {
    let d = dir();
    let f = d.path().join("small.vhc");
    small_capture(&f);
    let file_report = analyze_bounded(&f, &[]);
    // Process substitution.
    let out = analyze_json_through_a_pipe(&f);
    assert!(out.status.success(), "pipe: {}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(r["inputs"][0]["status"], "complete");
    assert_eq!(events_of(&r), 60);
    assert_eq!(r["processes"], file_report["processes"]);
    // A FIFO: the writer writes everything and closes; the analysis ends at EOF.
    let fifo = d.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let (fifo2, f2) = (fifo.clone(), f.clone());
    let writer = std::thread::spawn(move || {
        let bytes = std::fs::read(&f2).expect("read");
        std::fs::write(&fifo2, bytes).expect("write fifo"); // opens (waits for the reader), writes, closes
    });
    let mut child = Command::new(vramhook_bin())
        .args(["analyze", "--json"])
        .arg(&fifo)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("analyze of a FIFO whose writer closed did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    writer.join().expect("writer");
    let out = child.wait_with_output().expect("output");
    assert!(out.status.success(), "fifo: {}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(r["inputs"][0]["status"], "complete");
    assert_eq!(events_of(&r), 60);
    // A corrupt frame in a pipe is skipped as in a file (the reader seeks back within it).
    let mut bytes = std::fs::read(&f).expect("read");
    let frames = frame_offsets(&bytes);
    bytes[frames[2].0 as usize + 20] ^= 0xFF; // payload of the second event frame
    let bad = d.path().join("bad.vhc");
    std::fs::write(&bad, &bytes).expect("write");
    let via_file = analyze_bounded(&bad, &[]);
    let out = analyze_json_through_a_pipe(&bad);
    let via_pipe: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(via_pipe["inputs"][0]["status"], "corrupt");
    assert_eq!(via_pipe["inputs"][0]["corrupt_frames"], via_file["inputs"][0]["corrupt_frames"]);
    assert_eq!(events_of(&via_pipe), 50);
}

/// `bytes` as the file `name` in `dir`, analysed plainly and with `--strict`: refused
/// both times (exit 2). Its stderr and stdout each time.
fn refused_plain_and_strict(dir: &Path, name: &str, bytes: &[u8]) -> [(String, Vec<u8>); 2] {
    let file = dir.join(name);
    std::fs::write(&file, bytes).expect("write");
    [false, true].map(|strict| {
        let mut cmd = Command::new(vramhook_bin());
        cmd.arg("analyze").arg(&file);
        if strict {
            cmd.arg("--strict");
        }
        let out = cmd.output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "strict {strict}: {stderr}");
        (stderr, out.stdout)
    })
}

/// Six bytes that are not a capture said "truncated at byte 6 … everything before the cut
/// was analysed" with exit 0, even with --strict. A capture cut inside its header is still
/// "truncated".
#[test]
fn six_bytes_of_something_else_are_not_a_capture() {
    let d = dir();
    for (stderr, _) in refused_plain_and_strict(d.path(), "junk", b"hello\n") {
        assert!(stderr.contains("not a capture"), "{stderr}");
        assert!(!stderr.contains("truncated"), "{stderr}");
    }
    let real = small_capture(&d.path().join("small.vhc"));
    for cut in [3usize, 6, 8, 40] {
        let f = d.path().join(format!("cut{cut}.vhc"));
        std::fs::write(&f, &real[..cut]).expect("write");
        let out = Command::new(vramhook_bin()).args(["analyze", "--json"]).arg(&f).output().expect("run");
        let r: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(r["inputs"][0]["status"], "truncated", "cut at {cut}");
    }
}

/// (offset, length) of every frame of a capture, the end frame last.
fn frame_offsets(bytes: &[u8]) -> Vec<(u64, u64)> {
    let mut r = CaptureReader::new(std::io::Cursor::new(bytes)).expect("header");
    let mut out = Vec::new();
    loop {
        let at = r.offset();
        match r.next_frame() {
            Ok(Some(_)) => out.push((at, r.offset() - at)),
            Ok(None) => break,
            Err(e) => panic!("{e}"),
        }
    }
    out
}

/// Deleting a whole frame left every checksum right, and 25 of 80 such mutants read as
/// "complete". The end frame's counts (frames and events the writer wrote) now show the gap.
#[test]
fn every_whole_frame_deleted_shows_a_gap() {
    let d = dir();
    let bytes = small_capture(&d.path().join("small.vhc"));
    let frames = frame_offsets(&bytes);
    assert_eq!(frames.len(), 9, "process, 6 event frames, process end, end");
    for (i, (at, len)) in frames[..frames.len() - 1].iter().enumerate() {
        let mut m = bytes[..*at as usize].to_vec();
        m.extend_from_slice(&bytes[(*at + *len) as usize..]);
        let f = d.path().join(format!("mutant{i}.vhc"));
        std::fs::write(&f, &m).expect("write");
        let r = analyze_bounded(&f, &[]);
        let input = &r["inputs"][0];
        assert_eq!(input["status"], "gap", "frame {i} deleted: {input}");
        assert_eq!(input["missing_frames"], 1, "frame {i}");
        let events = if (1..=6).contains(&i) { 10 } else { 0 };
        assert_eq!(input["missing_events"], events, "frame {i}");
        assert!(notes(&r).contains("are missing"), "{}", notes(&r));
    }
    // The untouched capture is complete, with nothing missing.
    let f = d.path().join("whole.vhc");
    std::fs::write(&f, &bytes).expect("write");
    let r = analyze_bounded(&f, &[]);
    assert_eq!(r["inputs"][0]["status"], "complete");
    assert_eq!(r["inputs"][0]["missing_frames"], Value::Null);
}

/// After an agent restart the capture holds the ring reader's `Dropped` marker (writer drops
/// plus slots lost in flight), the restarted reader's marker for the slots it skipped, and
/// the process-end frame counting the same losses again (dropped, lost in flight). The
/// analyzer added the markers' total to the end frame's lost-in-flight: 13,312 lost were
/// reported as more.
#[test]
fn restart_losses_are_counted_once() {
    let d = dir();
    let info = ProcessInfo { pid: 7, exe: "/bin/serve".into(), cmdline: vec!["serve".into()], ..Default::default() };
    let mut ev: Vec<_> = (0..100).map(|i| alloc(7, 1_000 + i, 0, 0x1000_0000 * (i + 1), MIB)).collect();
    // The first agent's ring poll: 4,000 writer drops + 96 slots lost in flight.
    ev.push(dropped(7, 2_000, 4_096, 96));
    ev.extend((0..100).map(|i| alloc(7, 3_000 + i, 0, 0x9000_0000_0000 + 0x1000_0000 * i, MIB)));
    // The restarted agent: 9,216 slots the killed one had consumed but never recorded.
    ev.push(dropped(7, 4_000, 9_216, 9_216));
    let end = ProcessEnd {
        pid: 7,
        exit_status: Some(0),
        ts_ns: 5_000,
        delivered: 200,
        dropped: 4_000,
        lost_in_flight: 96 + 9_216,
        ..Default::default()
    };
    let f = d.path().join("restart.vhc");
    std::fs::write(&f, with_process(&ev, &info, Some(&end))).expect("write");
    let r = analyze_bounded(&f, &[]);
    let p = &r["processes"][0];
    assert_eq!(p["dropped_events"], 13_312, "{p}");
    assert_eq!(p["lost_in_flight"], 9_312);
    assert_eq!(p["incomplete"], true);
    assert!(notes(&r).contains("13312 events were lost"), "{}", notes(&r));
    // Without the end frame (a capture cut before it), the markers alone say the same.
    let f2 = d.path().join("restart-cut.vhc");
    std::fs::write(&f2, with_process(&ev, &info, None)).expect("write");
    let r = analyze_bounded(&f2, &[]);
    assert_eq!(r["processes"][0]["dropped_events"], 13_312);
}

/// An empty file has no capture header: an error in one line, not a report that says
/// nothing happened (before: exit 0, "truncated" twice and "LEAKS none").
#[test]
fn an_empty_file_is_an_error_in_one_line() {
    let d = dir();
    for (stderr, stdout) in refused_plain_and_strict(d.path(), "empty.vhc", b"") {
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains("empty file"), "{stderr}");
        assert!(stdout.is_empty(), "no report: {}", String::from_utf8_lossy(&stdout));
    }
    // A cut capture is still read (exit 0), and fails with --strict, in one line.
    let real = small_capture(&d.path().join("small.vhc"));
    let cut = d.path().join("cut.vhc");
    std::fs::write(&cut, &real[..real.len() - 40]).expect("write");
    let out = Command::new(vramhook_bin()).arg("analyze").arg(&cut).output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("truncated at byte").count(), 1);
    let out = Command::new(vramhook_bin()).args(["analyze", "--strict"]).arg(&cut).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("truncated at byte"), "{stderr}");
}

/// 10,000 mapped VMM reservations and 10,000 OOM failures (2.5 MB): every incident made
/// the model look at (and keep a line for) each of the process's arenas, and the replay
/// sample them all, 10^8 in all (8 s and 600 MB). Now each incident keeps 64 of them
/// (its sums count all), the looks stop at the work allowance, and the samples out of turn count the arenas.
#[test]
fn arenas_times_ooms_are_bounded() {
    let (_d, _, r) = made_and_analyzed("arenas.vhc", |f| arenas_and_ooms(f, 10_000, 10_000));
    assert_eq!(count(&r, "ooms") as u64, LIMIT);
    assert!(folded(&r, "ooms_unjudged") > 0, "{}", r["folded"]);
}

/// The memory budget stops a replay that outgrows it: exit 3, one line on stderr, and the
/// partial report of what was read, which says it is partial, within about the budget.
#[test]
fn a_replay_past_the_memory_budget_stops_with_a_partial_report() {
    let d = dir();
    let f = d.path().join("arenas.vhc");
    arenas_and_ooms(&f, 10_000, 10_000);
    let ooms = 10_000;
    let budget_mib = 40;
    let (m, json) = analyze_json(&vramhook_bin(), &f, &["--max-memory", &budget_mib.to_string()]);
    let stderr = String::from_utf8_lossy(&m.output.stderr);
    assert_eq!(m.output.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("--max-memory") && stderr.contains("partial"), "{stderr}");
    let r = json.expect("the partial report");
    assert!(notes(&r).contains("this report is partial"), "{}", notes(&r));
    let incidents = count(&r, "ooms") as u64;
    assert!(incidents > 0 && incidents < ooms, "{incidents} incidents");
    // Looked at every 16 failures: overshoots by at most a few MB.
    assert!(m.max_rss_kib < (budget_mib + 100) * 1024, "peak {} KiB", m.max_rss_kib);
}
