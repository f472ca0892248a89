//! Issue 2 end to end: every simulated workload traced through `vramhook run`, checked
//! against the simulated driver's own ground truth, event for event.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::process::Command;

/// Traces a workload and checks: exit status and output equal to an untraced run, the
/// capture equal to the driver's log per thread, no drops, live bytes at exit equal.
fn check_workload(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Traced {
    let untraced = run_untraced(name, args, envs);
    let t = trace_workload(name, args, envs);
    assert_eq!(
        t.output.status.code(),
        untraced.status.code(),
        "{name}: exit status changed under tracing\nstderr:\n{}",
        t.stderr()
    );
    let plain_checksum = checksum_line(&String::from_utf8_lossy(&untraced.stdout));
    assert!(!plain_checksum.is_empty(), "{name} printed no checksum");
    assert_eq!(t.checksum(), plain_checksum, "{name}: results changed under tracing");

    let truth = truth_by_thread(&t);
    let captured = captured_by_thread(&t);
    assert!(!truth.is_empty(), "{name}: the simulated driver logged no calls");
    assert_eq!(
        captured.keys().collect::<Vec<_>>(),
        truth.keys().collect::<Vec<_>>(),
        "{name}: processes/threads differ between capture and ground truth"
    );
    for (key, calls) in &truth {
        let got = &captured[key];
        if got != calls {
            let first = got.iter().zip(calls).position(|(a, b)| a != b).unwrap_or(got.len().min(calls.len()));
            panic!(
                "{name}: pid/tid {key:?}: capture differs from ground truth at call {first} of {} (captured {}):\n  captured: {:?}\n  truth:    {:?}",
                calls.len(),
                got.len(),
                got.get(first),
                calls.get(first)
            );
        }
    }
    assert_eq!(t.summary["dropped_events"], 0, "{name}: events dropped with a large ring");
    assert_eq!(
        allocation_devices(&t, Side::Captured),
        allocation_devices(&t, Side::Truth),
        "{name}: the device of a successful allocation differs from the driver's"
    );

    for (pid, live) in truth_live_at_exit(&t) {
        assert_eq!(
            t.process(pid)["final_live_bytes"],
            live,
            "{name}: pid {pid} live bytes at exit differ from the driver's"
        );
    }
    // Every out-of-memory failure is followed by a device sample from the same thread.
    for (i, e) in t.events.iter().enumerate() {
        if e["result"] == 2 {
            let next = t.events[i + 1..].iter().find(|n| n["tid"] == e["tid"]).expect("an event after the OOM");
            assert_eq!(next["kind"], "mem_info", "{name}: OOM at seq {} not followed by a device sample", e["seq"]);
        }
    }
    t
}

enum Side {
    Truth,
    Captured,
}

/// Per pid and thread, the (address, device) of each successful allocation in order: the
/// interposer asks the driver for the device once per thread and context, so this checks
/// that a context switch is never missed.
fn allocation_devices(t: &Traced, side: Side) -> BTreeMap<(u64, u64), Vec<(u64, i64)>> {
    let mut out: BTreeMap<(u64, u64), Vec<(u64, i64)>> = BTreeMap::new();
    let mut add = |v: &serde_json::Value, pid: u64, name: &str| {
        if DEVICE_ALLOCS.contains(&name) && v["result"] == 0 {
            let (tid, addr, device) = (v["tid"].as_u64(), v["addr"].as_u64(), v["device"].as_i64());
            out.entry((pid, tid.expect("tid"))).or_default().push((addr.expect("addr"), device.expect("device")));
        }
    };
    match side {
        Side::Truth => {
            for (pid, lines) in &t.truth {
                for v in lines {
                    add(v, u64::from(*pid), v["fn"].as_str().unwrap_or(""));
                }
            }
        }
        Side::Captured => {
            for e in t.events.iter().filter(|e| e["kind"] == "alloc") {
                add(e, e["pid"].as_u64().expect("pid"), e["api"].as_str().unwrap_or(""));
            }
        }
    }
    out
}

#[test]
fn torch_caching_through_shared_cudart() {
    let t = check_workload("torch_caching", &[], &[]);
    let ooms: Vec<_> = t.events.iter().filter(|e| e["result"] == 2).collect();
    assert_eq!(ooms.len(), 2, "the 200 GiB request fails twice (before and after freeing the cache)");
    assert!(ooms.iter().all(|e| e["size"] == 200u64 << 30 && e["api"] == "cuMemAlloc_v2"));
    // Live bytes just before the OOM equal what the framework says it reserved.
    let reserved: u64 = t
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("reserved="))
        .and_then(|v| v.parse().ok())
        .expect("reserved= line");
    let mut live: i128 = 0;
    let mut sizes = std::collections::HashMap::new();
    for e in &t.events {
        if e["result"] != 0 {
            if e["result"] == 2 {
                break;
            }
            continue;
        }
        match e["kind"].as_str() {
            Some("alloc") => {
                sizes.insert(e["addr"].as_u64().expect("addr"), e["size"].as_u64().expect("size"));
                live += e["size"].as_u64().expect("size") as i128;
            }
            Some("free") => live -= sizes.remove(&e["addr"].as_u64().expect("addr")).unwrap_or(0) as i128,
            _ => {}
        }
    }
    assert_eq!(live as u64, reserved, "live bytes at the OOM equal the caching allocator's reserved bytes");
}

#[test]
fn torch_caching_through_static_cudart() {
    let t = check_workload("torch_caching_static", &[], &[]);
    assert!(t.events.iter().any(|e| e["api"] == "cuMemAlloc_v2"), "static cudart's calls are seen");
}

#[test]
fn torch_expandable_segments_via_dlsym_shim() {
    let t = check_workload("torch_expandable", &[], &[]);
    assert!(t.events.iter().filter(|e| e["api"] == "cuMemCreate").count() > 100);
    assert!(t.events.iter().any(|e| e["api"] == "cuMemCreate" && e["result"] == 2));
}

#[test]
fn ggml_vmm_pool_linked_directly() {
    let t = check_workload("ggml_vmm", &[], &[]);
    let reserve = t.events.iter().find(|e| e["api"] == "cuMemAddressReserve").expect("reserve");
    assert_eq!(reserve["size"], 32u64 << 30);
    let pid = t.events[0]["pid"].as_u64().expect("pid") as u32;
    assert_eq!(t.process(pid)["final_live_bytes"], 32u64 << 20, "released handles stay live while mapped");
    check_workload("ggml_vmm", &["--cleanup"], &[]);
}

#[test]
fn async_pools_with_ptsz_variants() {
    let t = check_workload("async_pool", &[], &[]);
    for api in
        ["cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemPoolTrimTo"]
    {
        assert!(t.events.iter().any(|e| e["api"] == api), "no {api} event");
    }
}

#[test]
fn leak_keeps_exit_status_and_reports_live_bytes() {
    let t = check_workload("leak", &["--exit", "3"], &[]);
    assert_eq!(t.output.status.code(), Some(3), "vramhook run exits with the command's status");
    let pid = t.events[0]["pid"].as_u64().expect("pid") as u32;
    assert_eq!(t.process(pid)["final_live_bytes"], 15_753_640);
    assert_eq!(t.process(pid)["exit_status"], 3);
}

#[test]
fn fork_and_exec_give_each_process_and_image_its_own_ring() {
    let t = check_workload("fork_exec", &[], &[]);
    let procs: Vec<_> = t.frames.iter().filter(|f| f["frame"] == "process").collect();
    assert_eq!(procs.len(), 3, "parent, forked child, and the child's exec'd image: {procs:?}");
    let pids: std::collections::BTreeSet<_> = procs.iter().map(|p| p["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 2, "exec keeps the pid");
    assert!(procs.iter().any(|p| p["cmdline"][0].as_str().is_some_and(|c| c.ends_with("leak"))));
}

/// A signal handler forks while its thread is inside a driver call, so inside our hook,
/// and the child goes on from there. The call is the parent's: the child's ring holds only
/// the child's own calls, call for call against the driver's log, with nothing lost (the
/// resumed hook once wrote at the parent's lane cursor into the child's new ring), and both
/// processes exit 0.
#[test]
fn a_fork_inside_a_hook_leaves_the_call_to_the_parent_and_the_child_whole() {
    let t = check_workload("fork_in_handler", &[], &[("VRAMHOOK_SIM_RAISE_AT_BYTES", "8388608")]);
    let procs = t.summary["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 2, "parent and child: {procs:?}");
    let parent = procs.iter().find(|p| p["exit_status"] == 0).expect("the parent, exit 0");
    let child = procs.iter().find(|p| p["ppid"] == parent["pid"]).expect("the child");
    assert_eq!(parent["final_live_bytes"], 12u64 << 20, "{parent}");
    assert_eq!(child["final_live_bytes"], 0, "{child}");
    for p in [parent, child] {
        assert_eq!(p["lost_in_flight"], 0, "{p}");
        assert_eq!(p["dropped_events"], 0, "{p}");
    }
}

/// A free and the allocation that is handed its address by another thread while the freeing
/// thread is still inside cudaFree (the driver released the block, the call has not
/// returned). Stamped after its call, the free came out after that allocation, and the
/// capture lost the block that was live at exit. Stamped before the call (a release), it
/// comes first; the lanes are four so that the freeing thread has one of its own.
#[test]
fn a_free_comes_before_the_allocation_that_reuses_its_address_in_another_thread() {
    let t = check_workload(
        "free_reuse",
        &[],
        &[
            ("VRAMHOOK_SIM_REUSE_VA", "1"),
            ("VRAMHOOK_SIM_RAISE_AT_FREE_BYTES", "3145728"),
            ("VRAMHOOK_RING_LANES", "4"),
        ],
    );
    let procs = t.summary["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 1, "{procs:?}");
    assert_eq!(procs[0]["final_live_bytes"], 3u64 << 20, "{}", procs[0]);
    let anomalies = &t.summary["anomalies"];
    assert!(anomalies.get("alloc_over_live").is_none(), "no allocation over a live one: {anomalies}");
}

/// ollama's process shape (issue #12, as measured on the H200): a server that never touches
/// CUDA, a GPU-discovery child that only counts devices, and model runners that dlopen a
/// backend using the shared cudart and libcuda's VMM calls directly; one runner runs out of
/// memory and exits 2, and ollama starts it again with fewer layers on the GPU; loaded
/// runners are unloaded with SIGKILL.
#[test]
fn ollama_shape_silent_server_and_discovery_runners_traced_and_a_restart() {
    let t = check_workload("ollama_shape", &[], &[]);
    let stdout = t.stdout();
    let pids: BTreeMap<&str, u32> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("pids "))
        .expect("pids line")
        .split(' ')
        .collect::<Vec<_>>()
        .chunks(2)
        .map(|kv| (kv[0], kv[1].parse().expect("pid")))
        .collect();
    let procs: BTreeMap<u32, &serde_json::Value> = t
        .frames
        .iter()
        .filter(|f| f["frame"] == "process")
        .map(|f| (f["pid"].as_u64().expect("pid") as u32, f))
        .collect();
    // Only the three runners have rings: neither the server nor the discovery child. (As
    // sets: pids wrap around, so the runners' pids need not rise in the order they started.)
    let mut runners = vec![pids["a"], pids["b"], pids["b2"]];
    runners.sort_unstable();
    assert_eq!(procs.keys().copied().collect::<Vec<_>>(), runners, "pids {pids:?}, frames {procs:?}");
    for p in procs.values() {
        assert_eq!(p["cmdline"][1], "runner", "{p}");
        assert_eq!(t.process(p["pid"].as_u64().expect("pid") as u32)["ppid"].as_u64(), Some(pids["serve"] as u64));
    }
    let summary = |pid: u32| t.process(pid);
    assert!(t.summary["processes"].as_array().expect("processes").iter().all(|p| p["pid"] != pids["serve"]));
    // The failed runner: its one call, the OOM. Its exit status (2) went to the server that
    // reaped it, not to `vramhook run`, which knows only its child's and orphans' statuses.
    let b = summary(pids["b"]);
    assert_eq!(
        (b["ooms"].as_u64(), b["exit_status"].as_i64(), b["final_live_bytes"].as_u64()),
        (Some(1), None, Some(0))
    );
    // The loaded runners, killed: weights + KV + compute + cuBLAS (+1 KiB) + 3 mapped 2 MiB VMM pieces.
    for (name, gpu_mib) in [("a", 512u64), ("b2", 4096)] {
        let live = (gpu_mib + 64 + 68 + 64 + 6) * (1 << 20) + 1024;
        assert_eq!(summary(pids[name])["final_live_bytes"].as_u64(), Some(live), "{name}");
    }
    // The analyzer: the VMM pool is an arena of each loaded runner, the OOM an incident.
    let out = Command::new(vramhook_bin()).arg("analyze").arg(t.capture()).arg("--json").output().expect("analyze");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report");
    let ooms = report["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "{ooms:?}");
    assert_eq!((ooms[0]["pid"].as_u64(), ooms[0]["verdict"].as_str()), (Some(pids["b"] as u64), Some("capacity")));
    assert_eq!(ooms[0]["requested_bytes"].as_u64(), Some(20 << 30));
    let vmm: Vec<u64> = t
        .events
        .iter()
        .filter(|e| e["api"] == "cuMemAddressReserve" && e["size"] == 32u64 << 30)
        .map(|e| e["pid"].as_u64().expect("pid"))
        .collect();
    assert_eq!(vmm, vec![pids["a"] as u64, pids["b2"] as u64]);
}

#[test]
fn sixteen_threads_hammering() {
    let t = check_workload("threads16", &["--threads", "16", "--iters", "500"], &[]);
    let threads: std::collections::BTreeSet<_> = t.events.iter().map(|e| e["tid"].as_u64()).collect();
    assert!(threads.len() >= 16);
}

#[test]
fn misc_apis_on_two_devices() {
    let t = check_workload("misc_api", &[], &[("VRAMHOOK_SIM_DEVICES", "2")]);
    for api in [
        "cuMemAllocPitch_v2",
        "cuMemAllocManaged",
        "cuArrayCreate_v2",
        "cuArray3DCreate_v2",
        "cuMipmappedArrayCreate",
        "cuIpcOpenMemHandle",
        "cuIpcCloseMemHandle",
        "cuMemImportFromShareableHandle",
    ] {
        assert!(t.events.iter().any(|e| e["api"] == api), "no {api} event");
    }
    assert!(t.events.iter().any(|e| e["device"] == 1 && e["kind"] == "alloc"), "device 1 allocations are attributed");
    // cudart asks for cuIpcOpenMemHandle at version 4010 and gets the legacy entry point:
    // it must be wrapped, not missed.
    assert!(
        t.events.iter().all(|e| e["kind"] != "hook_miss"),
        "an entry point escaped: {:?}",
        t.events.iter().find(|e| e["kind"] == "hook_miss")
    );
    let ipc = t.events.iter().find(|e| e["api"] == "cuIpcOpenMemHandle").expect("IPC open event");
    assert!(ipc["size"].as_u64() > Some(0), "IPC imports are sized: {ipc}");
    assert!(t.events.iter().any(|e| e["api"] == "cuMemFree_v2" && e["result"] != 0), "failed frees are recorded");
}

#[test]
fn small_ring_drops_are_counted_exactly_and_the_program_is_unaffected() {
    let args = ["--threads", "16", "--iters", "2000"];
    let untraced = run_untraced("threads16", &args, &[]);
    // No periodic samples: a pool sample reads the driver through calls the simulated driver
    // does not log, and whether one is recorded depends on how the threads interleave (it
    // is recorded only when the pool's reserve changed since the last).
    let t = trace_workload("threads16", &args, &[("VRAMHOOK_RING_SLOTS", "16"), ("VRAMHOOK_MEMINFO_MS", "4000000000")]);
    assert_eq!(t.output.status.code(), Some(0));
    assert_eq!(t.checksum(), checksum_line(&String::from_utf8_lossy(&untraced.stdout)));
    // Everything the interposer tried to record: each driver call the simulated driver
    // logged, plus process start and exit.
    let issued: u64 =
        t.truth.values().map(|l| l.iter().filter(|v| v.get("fn").is_some()).count() as u64).sum::<u64>() + 2;
    let delivered = t.events.iter().filter(|e| e["kind"] != "dropped").count() as u64;
    let dropped: u64 =
        t.events.iter().filter(|e| e["kind"] == "dropped").map(|e| e["size"].as_u64().expect("size")).sum();
    assert!(dropped > 0, "a 16-slot ring under 16 threads should overflow");
    assert_eq!(delivered + dropped, issued, "delivered {delivered} + dropped {dropped} != issued {issued}");
    assert_eq!(t.summary["dropped_events"], dropped);
    assert!(t.stderr().contains("events lost"), "the summary says events were lost");
}

fn run_preloaded(name: &str, envs: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(workload(name));
    cmd.env("LD_PRELOAD", interposer());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run workload")
}

#[test]
fn unwritable_ring_directory_warns_once_and_changes_nothing() {
    let plain = run_untraced("torch_caching", &[], &[]);
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let not_a_dir = file.path().to_str().expect("utf8");
    let traced = run_preloaded("torch_caching", &[("VRAMHOOK_DIR", not_a_dir)]);
    assert_eq!(traced.status.code(), plain.status.code());
    assert_eq!(traced.stdout, plain.stdout);
    let stderr = String::from_utf8_lossy(&traced.stderr);
    let warnings: Vec<_> = stderr.lines().filter(|l| l.starts_with("vramhook:")).collect();
    assert_eq!(warnings.len(), 1, "exactly one line says why: {stderr}");
    assert!(warnings[0].contains("not a directory"), "{}", warnings[0]);
    let quiet = run_preloaded("torch_caching", &[("VRAMHOOK_DIR", not_a_dir), ("VRAMHOOK_QUIET", "1")]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("vramhook"));
    assert_eq!(quiet.stdout, plain.stdout);
}

#[test]
fn no_reader_needed_and_the_ring_keeps_the_events() {
    let plain = run_untraced("ggml_vmm", &[], &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let traced = run_preloaded("ggml_vmm", &[("VRAMHOOK_DIR", dir.path().to_str().expect("utf8"))]);
    assert_eq!(traced.stdout, plain.stdout);
    assert_eq!(traced.status.code(), plain.status.code());
    let rings: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
    assert_eq!(rings.len(), 1, "one ring left for a later reader");
}

#[test]
fn silent_until_cuda_is_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rings = dir.path().join("rings");
    let out = Command::new("sh")
        .args(["-c", "echo hello; ls / > /dev/null"])
        .env("LD_PRELOAD", interposer())
        .env("VRAMHOOK_DIR", &rings)
        .output()
        .expect("sh");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert!(out.stderr.is_empty(), "no output: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!rings.exists(), "no ring directory or file without CUDA");
}

#[test]
fn rtld_next_keeps_the_callers_meaning() {
    // A library wrapping puts() with dlsym(RTLD_NEXT) recurses (exit 42) if our dlsym
    // forwarded with an ordinary call instead of a tail jump.
    let out = run_preloaded("rtld_next_check", &[]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "rtld-next-ok\n");
}

#[test]
fn disabled_passes_everything_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plain = run_untraced("misc_api", &[], &[]);
    let out =
        run_preloaded("misc_api", &[("VRAMHOOK_DISABLE", "1"), ("VRAMHOOK_DIR", dir.path().to_str().expect("utf8"))]);
    assert_eq!(out.stdout, plain.stdout);
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
}

#[test]
fn dump_prints_one_json_event_per_line_with_the_documented_fields() {
    let t = trace_workload("async_pool", &[], &[]);
    assert!(!t.events.is_empty());
    for e in &t.events {
        for key in ["seq", "ts_ns", "pid", "tid", "kind", "api", "device", "addr", "size", "result"] {
            assert!(e.get(key).is_some(), "missing {key} in {e}");
        }
    }
    assert!(t.events.iter().any(|e| e["api"] == "cuMemAllocAsync_ptsz"));
    // Within one process, seq is unique and grows along each thread, and time never runs
    // backwards.
    let pid = t.events[0]["pid"].clone();
    let mine: Vec<_> = t.events.iter().filter(|e| e["pid"] == pid && e["kind"] != "dropped").collect();
    let seqs: std::collections::BTreeSet<u64> = mine.iter().map(|e| e["seq"].as_u64().expect("seq")).collect();
    assert_eq!(seqs.len(), mine.len(), "seq is unique");
    let mut last_by_thread = std::collections::HashMap::new();
    for e in &mine {
        let seq = e["seq"].as_u64().expect("seq");
        if let Some(prev) = last_by_thread.insert(e["tid"].as_u64(), seq) {
            assert!(seq > prev, "seq grows along a thread: {prev} then {seq}");
        }
    }
    for w in mine.windows(2) {
        assert!(w[1]["ts_ns"].as_u64() >= w[0]["ts_ns"].as_u64(), "time went backwards: {} then {}", w[0], w[1]);
    }
}

#[test]
fn truncated_capture_dumps_what_it_has_and_says_where() {
    let t = trace_workload("torch_caching", &[], &[]);
    let bytes = std::fs::read(t.capture()).expect("capture");
    let cut = t.dir.path().join("cut.vhc");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).expect("write");
    let out = Command::new(vramhook_bin()).arg("dump").arg(&cut).output().expect("dump");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("truncated at byte"), "{stderr}");
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert!(lines > 0 && lines < t.events.len() + 1);
}

/// The interposer's periodic device samples: a thread looks for one at every 256th
/// allocation, and takes one when `VRAMHOOK_MEMINFO_MS` has passed since the last: they
/// keep coming while the program allocates, at most one per interval.
#[test]
fn periodic_device_samples_keep_their_interval() {
    // 24 bursts of 256 allocations (one look each), 60 ms apart, a 100 ms interval: a
    // sample at the first allocation, then at about every second look (12). A loaded
    // machine only stretches the gaps (more looks find a sample due, at most one per
    // burst).
    let t = trace_workload("paced", &["--bursts", "24", "--gap-ms", "60"], &[("VRAMHOOK_MEMINFO_MS", "100")]);
    assert_eq!(t.output.status.code(), Some(0), "{}", t.stderr());
    let samples: Vec<u64> =
        t.events.iter().filter(|e| e["kind"] == "mem_info").filter_map(|e| e["ts_ns"].as_u64()).collect();
    assert!((9..=24).contains(&samples.len()), "{} samples at {samples:?}", samples.len());
    for w in samples.windows(2) {
        // The coarse clock that has the last word ticks in up to 4 ms.
        assert!(w[1] - w[0] >= 95_000_000, "samples {} ns apart: {samples:?}", w[1] - w[0]);
    }
}
