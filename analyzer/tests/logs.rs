//! "I only have a log": OOM post-mortems from the logs programs wrote. The PyTorch and JAX
//! logs are real (the H200, `tests/fixtures/h200-oom/`), and so are ollama's
//! (`tests/fixtures/logs/ollama_*.h200.*`, `scripts/gpu/ollama/run.sh`); vLLM's, ggml's own
//! and the driver's are copied from their sources (`tests/fixtures/logs/README.md`).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use vramhook_analyzer::{analyze, logs::LogIncident, Options, Report};
use vramhook_protocol::capture::CaptureWriter;
use vramhook_protocol::record::{Api, Event};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(rel)
}

fn run(paths: &[PathBuf]) -> Report {
    analyze(paths, &Options::default()).expect("analyze")
}

fn only(r: &Report) -> &LogIncident {
    assert_eq!(r.log_incidents.len(), 1, "{:#?}", r.log_incidents);
    &r.log_incidents[0]
}

fn quoted<'a>(i: &'a LogIncident, field: &str) -> &'a str {
    i.quoted
        .iter()
        .find(|(f, _)| f == field)
        .map(|(_, t)| t.as_str())
        .unwrap_or_else(|| panic!("no {field} in {:?}", i.quoted))
}

#[test]
fn pytorch_fragmented_cache_is_fragmentation_with_pytorchs_own_numbers_and_the_fix() {
    let r = run(&[fixture("h200-oom/torch_default_fragmented.log")]);
    let i = only(&r);
    assert_eq!(i.verdict_name, "framework_fragmentation", "{}", i.explanation);
    assert_eq!(i.numbers.requested, 2 << 30);
    assert_eq!(i.device, Some(0));
    // PyTorch's sentence, quoted to the letter.
    assert!(
        i.explanation.contains(
            "Of the allocated memory 81.45 GiB is allocated by PyTorch, and 57.55 GiB is reserved by PyTorch but unallocated"
        ),
        "{}",
        i.explanation
    );
    assert!(i.explanation.contains("293.12 MiB free of 139.80 GiB"), "{}", i.explanation);
    assert!(i.fix.as_deref().unwrap_or("").contains("expandable_segments:True"));
    assert!(i.missing.is_empty(), "{:?}", i.missing);
}

#[test]
fn the_log_joins_the_capture_of_the_same_run_at_the_fatal_request() {
    let r = run(&[fixture("h200-oom/torch_default_fragmented.vhc"), fixture("h200-oom/torch_default_fragmented.log")]);
    let i = only(&r);
    let joined = i.capture_incident.expect("joined to a capture incident");
    let c = r.ooms.iter().map(|o| &o.incident).find(|o| o.id == joined).expect("that incident");
    assert_eq!(c.requested_bytes, 2 << 30, "the 2 GiB failure that killed the program, not the 1 GiB before it");
    assert_eq!(r.ooms.len(), 2, "the 1 GiB end of the fill loop and the fatal 2 GiB request are two incidents");
}

#[test]
fn true_capacity_in_each_allocator_mode() {
    for mode in ["default", "expandable", "async"] {
        let r = run(&[fixture(&format!("h200-oom/torch_{mode}_capacity.log"))]);
        let i = only(&r);
        assert_eq!(i.verdict_name, "capacity", "{mode}: {}", i.explanation);
        assert_eq!(quoted(i, "requested"), "147.80 GiB", "{mode}");
    }
}

#[test]
fn another_process_holding_the_gpu_is_named() {
    let r = run(&[fixture("h200-oom/torch_default_other_process.log")]);
    let i = only(&r);
    assert_eq!(i.verdict_name, "other_process", "{}", i.explanation);
    assert_eq!(i.numbers.other_processes.len(), 1);
    assert_eq!(i.numbers.other_processes[0].0, 633, "the holder's pid, as PyTorch named it");
    // nvidia-smi saw the holder at 126,764 MiB = 123.79 GiB.
    let gib = i.numbers.other_processes[0].1 as f64 / (1u64 << 30) as f64;
    assert!((gib - 123.79).abs() < 0.01, "{gib}");
    assert!(i.fix.is_some());
}

#[test]
fn jax_bfc_dump_full_pool_then_fragmented_pool() {
    let r = run(&[fixture("h200-oom/jax_bfc_fragmented.log")]);
    assert_eq!(r.log_incidents.len(), 2, "{:#?}", r.log_incidents);
    let (full, frag) = (&r.log_incidents[0], &r.log_incidents[1]);
    assert_eq!(full.verdict_name, "capacity", "{}", full.explanation);
    assert_eq!(quoted(full, "largest_free_block"), "256B");
    assert_eq!(frag.verdict_name, "framework_fragmentation", "{}", frag.explanation);
    assert_eq!(frag.numbers.requested, 268_435_456);
    assert_eq!(quoted(frag, "pool_limit"), "6.99GiB");
    assert_eq!(quoted(frag, "in_use"), "3.44GiB");
    assert_eq!(quoted(frag, "largest_free_block"), "118.00MiB");
    assert!(frag.explanation.contains("118.00MiB"), "{}", frag.explanation);
    assert!(frag.fix.as_deref().unwrap_or("").contains("TF_GPU_ALLOCATOR=cuda_malloc_async"));
    let f = &r.logs[0];
    assert_eq!(f.understood + f.skipped, f.lines);
    assert!(f.by_source.get("xla_bfc").copied().unwrap_or(0) > 200, "{:?}", f.by_source);
}

#[test]
fn vllm_kv_cache_budget_from_its_source() {
    let r = run(&[fixture("logs/vllm_kv_cache.from-source.log")]);
    assert_eq!(r.log_incidents.len(), 2, "{:#?}", r.log_incidents);
    let i = &r.log_incidents[0];
    assert_eq!(i.verdict_name, "capacity", "{}", i.explanation);
    assert_eq!(quoted(i, "requested"), "16.00 GiB");
    assert_eq!(quoted(i, "pool_limit"), "4.85 GiB");
    assert!(i.fix.as_deref().unwrap_or("").contains("9936"), "{:?}", i.fix);
    assert_eq!(r.log_incidents[1].verdict_name, "capacity");
}

#[test]
fn ggml_failure_without_free_bytes_says_what_is_missing() {
    let r = run(&[fixture("logs/ggml_cuda_oom.from-source.log")]);
    let i = only(&r); // ggml-alloc's line for the same buffer joins ggml-cuda's
    assert_eq!(i.source, "ggml");
    assert_eq!(i.verdict_name, "unknown");
    assert_eq!(i.numbers.requested, 28672 << 20);
    assert!(i.missing.iter().any(|m| m.contains("free")), "{:?}", i.missing);
    assert!(i.quoted.iter().any(|(f, t)| f == "plan: model weights on CUDA0" && t == "28.0 GiB"), "{:?}", i.quoted);
    assert!(r.logs[0].notes.iter().any(|n| n.contains("fell back")), "{:?}", r.logs[0].notes);
    assert_eq!(r.logs[0].skipped, 0);
}

/// ollama v0.24.0's default engine (llama.cpp's runner) on the H200, another process holding
/// all but 1.25 GiB: all layers asked for with a 2 GiB KV cache (the 912 MiB compute buffer
/// fails, the runner crashes), then a new runner as ollama planned it (3 of 5 layers; ggml's
/// VMM pool cannot grow, the runner crashes again).
#[test]
fn ollama_default_engine_h200_failures_with_the_plan_and_no_second_incident_for_the_servers_echo() {
    let r = run(&[fixture("logs/ollama_v0.24.0_oom.h200.log")]);
    assert_eq!(r.log_incidents.len(), 2, "{:#?}", r.log_incidents);
    let a = &r.log_incidents[0];
    assert_eq!((a.source.as_str(), a.line), ("ggml", 231));
    assert_eq!(a.numbers.requested, 912 << 20);
    assert_eq!(a.device, Some(0));
    assert_eq!(a.verdict_name, "unknown", "{}", a.explanation);
    assert!(a.missing.iter().any(|m| m.contains("free")), "{:?}", a.missing);
    assert_eq!(quoted(a, "device free at model load"), "1341259776");
    assert_eq!(quoted(a, "device_total"), "150754820096");
    assert_eq!(a.numbers.device_total, Some(150_754_820_096));
    assert_eq!(quoted(a, "plan: compute graph on CUDA0"), "4.8 GiB");
    assert_eq!(quoted(a, "plan: kv cache on CPU"), "2.0 GiB");
    assert!(a.explanation.contains("1341259776 bytes (1.25 GiB) free"), "{}", a.explanation);
    // The second runner: llama.cpp says only that the compute buffers failed.
    let b = &r.log_incidents[1];
    assert_eq!(b.line, 827);
    assert_eq!(b.numbers.requested, 0);
    assert_eq!(b.verdict_name, "unknown", "{}", b.explanation);
    assert!(b.missing.iter().any(|m| m == "the requested size"), "{:?}", b.missing);
    assert!(b.explanation.contains("for an unknown amount"), "{}", b.explanation);
    assert_eq!(quoted(b, "plan: model weights on CUDA0"), "360.0 MiB");
    let notes = &r.logs[0].notes;
    assert!(
        notes.iter().any(|n| n.contains("runner terminated: llama runner process has terminated: cudaMalloc failed")),
        "{notes:?}"
    );
}

#[test]
fn ollama_default_engine_log_joins_the_capture_of_the_same_h200_run() {
    let r = run(&[fixture("logs/ollama_v0.24.0_oom.h200.vhc"), fixture("logs/ollama_v0.24.0_oom.h200.log")]);
    assert_eq!(r.ooms.len(), 2, "{:#?}", r.ooms);
    // Scenario 5: a traced holder (probe.py hold) kept 138.04 GiB live. Both failures name
    // it, with its live bytes: the runner alone on the device would have had the memory.
    for o in r.ooms.iter().map(|o| &o.incident) {
        assert_eq!(o.verdict.name(), "other_process", "{}", o.explanation);
        let h = &o.holders[0];
        assert_eq!((h.pid, h.live_bytes), (1989, 148_216_217_600), "138.04 GiB: {:?}", o.holders);
        assert!(h.command.contains("probe.py hold"), "{:?}", h);
    }
    // ggml wrote 912.00 MiB; the driver saw the exact 956,303,360 bytes.
    let oom =
        r.ooms.iter().map(|o| &o.incident).find(|o| o.requested_bytes == 956_303_360).expect("the 912 MiB cudaMalloc");
    assert_eq!(r.log_incidents[0].capture_incident, Some(oom.id));
    // ggml's lines have no time; ollama's own lines around them do, and the capture's
    // failure (its wall clock from the capture's header) lies between them.
    let i = &r.log_incidents[0];
    let anchor = r.time.wall_anchor.expect("the capture's clock");
    let wall = anchor.wall_ns + (oom.ts_ns - anchor.mono_ns);
    let (lo, hi) = (i.time_earliest_unix_ns.expect("a timed line before"), i.time_latest_unix_ns.expect("and after"));
    assert!(lo <= wall && wall <= hi, "{lo} <= {wall} <= {hi}");
    assert_eq!(lo, 1_796_112_938_753_000_000, "time=2026-12-01T08:15:38.753Z, the line before");
    let join = i.join.as_deref().unwrap_or("");
    assert!(join.contains("within the log's timed lines around it"), "{join}");
    // The VMM pool's failed cuMemCreate is only in the capture: the log has no size to join on.
    assert!(r.ooms.iter().any(|o| o.incident.api == Api::cuMemCreate), "{:#?}", r.ooms);
    assert_eq!(r.log_incidents[1].capture_incident, None);
}

/// ollama's own engine (`OLLAMA_NEW_ENGINE=1`) on the H200: the 152 MiB compute graph fails,
/// ollama backs off and loads 3 of 5 layers; the forced request before it went to the CPU.
#[test]
fn ollama_new_engine_h200_backoff_and_cpu_fallback_are_noted() {
    let r = run(&[fixture("logs/ollama_v0.24.0_new_engine_backoff.h200.log")]);
    let i = only(&r);
    assert_eq!(i.numbers.requested, 152 << 20);
    assert_eq!(i.verdict_name, "unknown", "{}", i.explanation);
    // This engine allocates before it logs the plan of a new load: the failure comes first.
    assert_eq!(quoted(i, "requested"), "152.00 MiB");
    let notes = &r.logs[0].notes;
    for want in ["applying backoff", "put 0 of 5 layers on the GPU", "put 3 of 5 layers on the GPU"] {
        assert!(notes.iter().any(|n| n.contains(want)), "{want}: {notes:?}");
    }
    let r = run(&[
        fixture("logs/ollama_v0.24.0_new_engine_backoff.h200.vhc"),
        fixture("logs/ollama_v0.24.0_new_engine_backoff.h200.log"),
    ]);
    let oom =
        r.ooms.iter().map(|o| &o.incident).find(|o| o.requested_bytes == 159_387_776).expect("the 152 MiB cudaMalloc");
    // The run's holder (the probe, traced) kept 138.04 GiB live: the runner alone would have fitted.
    assert_eq!(oom.verdict.name(), "other_process", "{}", oom.explanation);
    assert_eq!((oom.holders[0].pid, oom.holders[0].live_bytes), (2763, 148_216_217_600), "{:?}", oom.holders);
    assert_eq!(r.log_incidents[0].capture_incident, Some(oom.id));
}

#[test]
fn a_driver_xid_is_not_an_oom() {
    let r = run(&[fixture("logs/nvrm_xid.from-docs.log")]);
    let i = only(&r);
    assert_eq!(i.verdict_name, "not_an_oom");
    assert!(i.explanation.contains("Xid 14"), "{}", i.explanation);
}

#[test]
fn journalctl_output_gzipped_reads_the_same_with_the_pid() {
    let log = std::fs::read_to_string(fixture("h200-oom/torch_default_fragmented.log")).expect("fixture");
    let journal: String = log.lines().map(|l| format!("Dec 01 05:06:42 gpu-host python3[468]: {l}\n")).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.txt.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(journal.as_bytes()).expect("gzip");
    std::fs::write(&path, gz.finish().expect("gzip")).expect("write");
    let r = run(&[path]);
    let i = only(&r);
    assert!(r.logs[0].gzip);
    assert_eq!(i.pid, Some(468));
    assert_eq!(i.time.as_deref(), Some("Dec 01 05:06:42"));
    assert_eq!(i.verdict_name, "framework_fragmentation");
}

#[test]
fn text_and_json_reports_carry_the_log_incidents() {
    let r = run(&[fixture("h200-oom/torch_default_fragmented.log")]);
    let text = vramhook_analyzer::render::text::render(&r);
    assert!(text.contains("FROM LOGS (1 incident(s) in 1 file(s))"), "{text}");
    assert!(text.contains("): framework_fragmentation"), "{text}");
    let json = serde_json::to_value(&r).expect("json");
    assert_eq!(json["schema_version"], 7);
    assert_eq!(json["log_incidents"][0]["verdict"], "framework_fragmentation");
    assert!(json["log_incidents"][0].get("verdict_name").is_none(), "schema 4: verdict_name is gone");
}

/// The fuzz body over every fixture, with each parser alone and all together, and over
/// cut and corrupted copies.
#[test]
fn fuzz_body_over_the_fixtures() {
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["h200-oom", "logs"] {
        for e in std::fs::read_dir(fixture(dir)).expect("dir").flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                files.push(e.path());
            }
        }
    }
    assert!(files.len() >= 12, "{files:?}");
    for f in files {
        let bytes = std::fs::read(&f).expect("read");
        for pick in 0..=4u8 {
            let mut data = vec![pick];
            data.extend_from_slice(&bytes);
            vramhook_analyzer::logs::fuzz_target(&data);
            for cut in [data.len() / 3, data.len() / 2, data.len().saturating_sub(7)] {
                vramhook_analyzer::logs::fuzz_target(&data[..cut.max(1)]);
            }
            let mut flipped = data.clone();
            for k in (1..flipped.len()).step_by(97) {
                flipped[k] ^= 0x5a;
            }
            vramhook_analyzer::logs::fuzz_target(&flipped);
        }
    }
}

#[test]
fn vllm_names_its_engine_process() {
    let r = run(&[fixture("logs/vllm_kv_cache.from-source.log")]);
    assert_eq!(r.log_incidents[0].pid, Some(245));
    assert!(r.log_incidents[0].explanation.contains("4.85 GiB available"), "{}", r.log_incidents[0].explanation);
}

#[test]
fn a_report_with_logs_matches_the_schema() {
    let r = run(&[
        fixture("h200-oom/torch_default_fragmented.vhc"),
        fixture("h200-oom/torch_default_fragmented.log"),
        fixture("h200-oom/jax_bfc_fragmented.log"),
        fixture("logs/nvrm_xid.from-docs.log"),
    ]);
    common::assert_valid(&r);
}

/// The capture of `common::header()` (monotonic 1 s is 2025-11-24 16:00:00 UTC) in which
/// each `(pid, seconds after 16:00:00)` fails to allocate 2 GiB.
fn failing_capture(dir: &Path, failures: &[(u32, u64)]) -> PathBuf {
    const S: u64 = 1_000_000_000;
    let mut w = CaptureWriter::new(Vec::new(), &common::header()).expect("writer");
    let mut events = vec![common::ev(100, S, Event::mem_info(16 * common::GIB, 16 * common::GIB))];
    for (pid, at) in failures {
        let ts = S + at * S;
        events.push(common::ev(*pid, ts, Event::alloc(Api::cuMemAlloc_v2, 0, 2 * common::GIB).with_result(2)));
        events.push(common::ev(*pid, ts + 1000, Event::mem_info(common::GIB, 16 * common::GIB)));
    }
    w.write_events(&events).expect("write");
    common::write_file(dir, "capture.vhc", w.finish().expect("finish"))
}

/// PyTorch's fragmented-cache message (2 GiB asked), each line prefixed with `prefix`.
fn torch_log(dir: &Path, name: &str, prefix: &str) -> PathBuf {
    let log = std::fs::read_to_string(fixture("h200-oom/torch_default_fragmented.log")).expect("fixture");
    let text: String = log.lines().map(|l| format!("{prefix}{l}\n")).collect();
    common::write_file(dir, name, text)
}

#[test]
fn a_log_time_within_5_seconds_of_the_capture_joins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let capture = failing_capture(dir.path(), &[(100, 10)]);
    let log = torch_log(dir.path(), "journal.txt", "2025-11-24T16:00:12+0000 gpu-host python3[100]: ");
    let r = run(&[capture, log]);
    assert_eq!(r.ooms.len(), 1, "{:#?}", r.ooms);
    let i = only(&r);
    assert_eq!(i.time_earliest_unix_ns, Some(1_764_000_012 * 1_000_000_000));
    assert_eq!(i.capture_incident, Some(r.ooms[0].incident.id), "{:?}", i.join);
    let join = i.join.as_deref().unwrap_or("");
    assert!(join.contains("matched by pid and size, 2.000 s from the log's time 2025-11-24T16:00:12+0000"), "{join}");
    // The same log an hour later (a zone-less time read as UTC, say) does not join.
    let later = torch_log(dir.path(), "later.txt", "2025-11-24T17:00:12+0100 gpu-host python3[100]: ");
    let r = run(&[dir.path().join("capture.vhc"), later]);
    assert_eq!(only(&r).capture_incident, Some(r.ooms[0].incident.id), "+0100: the same instant");
}

#[test]
fn a_log_time_outside_the_window_does_not_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    let capture = failing_capture(dir.path(), &[(100, 10)]);
    // journalctl's short format: no year (the capture's) and no zone (read as UTC).
    let log = torch_log(dir.path(), "journal.txt", "Nov 24 16:00:20 gpu-host python3[100]: ");
    let r = run(&[capture.clone(), log]);
    let i = only(&r);
    assert_eq!(i.capture_incident, None, "10 s apart: {:?}", i.join);
    let join = i.join.as_deref().unwrap_or("");
    assert!(join.contains("10.000 s from the log's time Nov 24 16:00:20, outside the 5-second window"), "{join}");
    assert!(join.contains("no zone: read as UTC, no year: the capture's"), "{join}");
    // Without its time the same log joins by pid and size alone, and says so.
    let untimed = torch_log(dir.path(), "plain.txt", "");
    let r = run(&[capture, untimed]);
    let i = only(&r);
    assert_eq!(i.capture_incident, Some(r.ooms[0].incident.id));
    assert!(i.join.as_deref().unwrap_or("").contains("the log gives no time"), "{:?}", i.join);
}

#[test]
fn two_capture_incidents_within_the_window_are_ambiguous_and_the_window_tells_others_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Python logging's asctime and no pid: the match is by size alone.
    let log = torch_log(dir.path(), "app.log", "2025-11-24 16:00:12,000 ERROR ");
    let capture = failing_capture(dir.path(), &[(100, 10), (101, 13)]);
    let r = run(&[capture, log.clone()]);
    assert_eq!(r.ooms.len(), 2, "{:#?}", r.ooms);
    let i = only(&r);
    assert_eq!(i.pid, None);
    assert_eq!(i.capture_incident, None, "two 2 GiB failures within 5 s: {:?}", i.join);
    let join = i.join.as_deref().unwrap_or("");
    assert!(join.contains("not joined: 2 capture incidents match by size alone"), "{join}");
    // The other process's failure 30 s later is outside the window: the first one joins,
    // where size alone could not choose.
    let capture = failing_capture(dir.path(), &[(100, 10), (101, 42)]);
    let r = run(&[capture, log]);
    let first = r.ooms.iter().map(|o| &o.incident).find(|o| o.pid == 100).expect("pid 100's incident");
    assert_eq!(only(&r).capture_incident, Some(first.id), "{:?}", only(&r).join);
}

/// PyTorch under `set_per_process_memory_fraction`: its message (as c10's
/// CUDACachingAllocator formats it, "X allowed; ") names the limit that was the ceiling.
#[test]
fn a_pytorch_memory_fraction_in_the_message_is_the_ceiling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("fraction.log");
    let message = |request: &str, allocated: &str, cached: &str| {
        format!(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {request}. GPU 0 has a total capacity of \
             139.80 GiB of which 135.21 GiB is free. Including non-PyTorch memory, this process has 4.22 GiB memory \
             in use. 4.19 GiB allowed; Of the allocated memory {allocated} is allocated by PyTorch, and {cached} is \
             reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
        )
    };
    std::fs::write(&log, message("648.00 MiB", "3.84 GiB", "96.11 MiB")).expect("write");
    let r = run(std::slice::from_ref(&log));
    let i = only(&r);
    assert_eq!(quoted(i, "framework_limit"), "4.19 GiB");
    assert_eq!(i.verdict_name, "capacity", "{}", i.explanation);
    assert!(i.explanation.contains("capacity (of the framework's limit)"), "{}", i.explanation);
    assert!(i.fix.as_deref().is_some_and(|f| f.contains("set_per_process_memory_fraction")), "{:?}", i.fix);
    // Under the limit with the cache given back: the stranded cache decides.
    std::fs::write(&log, message("322.00 MiB", "3.00 GiB", "840.85 MiB")).expect("write");
    let r = run(&[log]);
    assert_eq!(only(&r).verdict_name, "framework_fragmentation", "{}", only(&r).explanation);
}
