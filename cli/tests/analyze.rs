//! `vramhook analyze` end to end: real captures of the simulated workloads, the real H200
//! snapshot, every output format, and bad input (exit codes and the one-line reasons).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use vramhook_testkit::{interposer, repo_root, sim_dir, vramhook_bin as vramhook};

/// Traces a workload into `dir/<name>.vhc`.
fn record(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    record_as(dir, None, name, args)
}

/// Traces a workload with `vramhook run`, on a "host" of its own when one is named: a new
/// UTS namespace of that name, so the capture's header names that host
/// (`dir/<host>-<name>.vhc`, else `dir/<name>.vhc`).
fn record_as(dir: &Path, host: Option<&str>, name: &str, args: &[&str]) -> PathBuf {
    let stem = host.map_or_else(|| name.to_string(), |h| format!("{h}-{name}"));
    let capture = dir.join(format!("{stem}.vhc"));
    let mut cmd = match host {
        Some(h) => {
            let mut c = Command::new("unshare");
            c.args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", h]).arg(vramhook());
            c
        }
        None => Command::new(vramhook()),
    };
    let out = cmd
        .args(["run", "--record"])
        .arg(&capture)
        .arg("--ring-dir")
        .arg(dir.join(format!("rings-{stem}")))
        .arg("--")
        .arg(sim_dir().join("workloads").join(name))
        .args(args)
        .env("VRAMHOOK_LIB", interposer())
        .env("LD_LIBRARY_PATH", sim_dir())
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run vramhook");
    assert!(capture.is_file(), "no capture:\n{}", String::from_utf8_lossy(&out.stderr));
    capture
}

fn analyze(args: &[&str]) -> Output {
    Command::new(vramhook()).arg("analyze").args(args).output().expect("run vramhook analyze")
}

fn json(args: &[&str]) -> Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = analyze(&a);
    assert!(out.status.success(), "analyze failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn demo_oom_post_mortem_in_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap = record(dir.path(), "torch_caching", &[]);
    let r = json(&[s(&cap)]);
    assert_eq!(r["schema_version"], 7);
    let procs = r["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 1);
    let p = &procs[0];
    // The simulated driver's ground truth (tests/simcuda/README.md): 10 segments,
    // 744,488,960 bytes live at exit; 1,551,892,480 reserved before the OOM.
    assert_eq!(p["final_live_bytes"], 744_488_960u64);
    assert_eq!(p["peak_bytes"], 1_551_892_480u64);
    assert_eq!(p["failed_calls"], 2);
    assert_eq!(p["device"], 0);
    let ooms = r["ooms"].as_array().expect("ooms");
    assert_eq!(ooms.len(), 1, "fail, free the cache, retry, fail: one incident");
    assert_eq!(ooms[0]["requested_bytes"], 200u64 << 30);
    assert_eq!(ooms[0]["verdict"], "capacity");
    assert_eq!(ooms[0]["outcome"], "failed_again");
    assert!(!ooms[0]["lead_up"].as_array().expect("lead_up").is_empty());
    assert_eq!(r["leaks"][0]["kind"], "live_at_exit");
    assert_eq!(r["layout"]["reason"], "first OOM");

    let text = String::from_utf8_lossy(&analyze(&[s(&cap)]).stdout).into_owned();
    for needle in ["OOM INCIDENTS (1)", "verdict: capacity", "200.00 GiB", "LEAKS (1)", "710.00 MiB"] {
        assert!(text.contains(needle), "text lacks {needle:?}:\n{text}");
    }

    let html = dir.path().join("r.html");
    let trace = dir.path().join("r.json");
    let out = analyze(&[s(&cap), "--html", s(&html), "--perfetto", s(&trace)]);
    assert!(out.status.success());
    let page = std::fs::read_to_string(&html).expect("html written");
    assert!(page.contains("id=\"report-data\"") && page.contains("plot-layout"));
    assert!(!page.contains("<link") && !page.contains("src=\"http"), "self-contained");
    let t: Value = serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace written")).expect("trace JSON");
    let evs = t["traceEvents"].as_array().expect("traceEvents");
    assert!(evs.iter().any(|e| e["ph"] == "C"));
    assert_eq!(evs.iter().filter(|e| e["ph"] == "i").count(), 1);
}

#[test]
fn fork_exec_and_leaks_match_ground_truth() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap = record(dir.path(), "fork_exec", &[]);
    let r = json(&[s(&cap)]);
    let procs = r["processes"].as_array().expect("processes");
    // Parent: 28 MiB at exit; the child's exec'd `leak --n 4`: 6,295,456 bytes.
    assert!(procs.iter().any(|p| p["final_live_bytes"] == 28u64 << 20), "{procs:#?}");
    let child =
        procs.iter().find(|p| p["command"].as_str().unwrap_or("").contains("leak --n 4")).expect("exec'd child");
    assert_eq!(child["final_live_bytes"], 6_295_456u64);
    assert!(r["leaks"].as_array().expect("leaks").iter().any(|l| l["bytes"] == 6_295_456u64));
    // The process filter.
    let pid = child["pid"].as_u64().expect("pid");
    let only = json(&[s(&cap), "--pid", &pid.to_string()]);
    assert!(only["processes"].as_array().expect("processes").iter().all(|p| p["pid"].as_u64() == Some(pid)));
}

#[test]
fn bad_input_exit_codes_and_reasons() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap = record(dir.path(), "leak", &[]);
    let bytes = std::fs::read(&cap).expect("capture");

    // Truncated: analysed up to the cut, exit 0, "truncated at byte N".
    let cut = dir.path().join("cut.vhc");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).expect("write");
    let out = analyze(&[s(&cut)]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("truncated at byte"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Corrupt frame in the middle: skipped by default, exit 2 with --strict.
    let mut bad = bytes.clone();
    let second = bad.windows(4).enumerate().filter(|(_, w)| w == b"VRFM").nth(1).map(|(i, _)| i).expect("frames");
    bad[second + 20] ^= 0x55;
    let badp = dir.path().join("bad.vhc");
    std::fs::write(&badp, &bad).expect("write");
    let out = analyze(&[s(&badp)]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("corrupt frame at byte {second}")));
    let out = analyze(&["--strict", s(&badp)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(&format!("corrupt frame at byte {second}")), "{err}");

    // A newer format version: exit 2, says so.
    let mut newer = bytes.clone();
    newer[8] = 7;
    let newp = dir.path().join("newer.vhc");
    std::fs::write(&newp, &newer).expect("write");
    let out = analyze(&[s(&newp)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("version 7 is newer"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Not a file.
    let out = analyze(&[s(&dir.path().join("missing.vhc"))]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn real_h200_snapshot_and_capture() {
    let fixtures = repo_root().join("tests/fixtures");
    let r = json(&[s(&fixtures.join("torch_snapshot_h200.pickle"))]);
    assert_eq!(r["inputs"][0]["kind"], "pytorch_snapshot");
    assert_eq!(r["inputs"][0]["pytorch"]["reserved_bytes"], 807_403_520u64);
    assert_eq!(r["ooms"][0]["verdict"], "capacity");
    let r = json(&[s(&fixtures.join("h200_torch_default.vhc"))]);
    assert_eq!(r["ooms"][0]["requested_bytes"], 200u64 << 30);
}

/// Traces a workload into `dir/<host>-<name>.vhc` on a "host" of its own.
fn record_on_host(dir: &Path, host: &str, name: &str, args: &[&str]) -> PathBuf {
    record_as(dir, Some(host), name, args)
}

/// A fleet post-mortem from real captures of two "hosts" (UTS namespaces): an OOM on one,
/// a leak on the other; text and JSON report each host apart and add them up.
#[test]
fn captures_from_two_hosts_give_a_report_per_host_and_for_the_fleet() {
    const TEST: &str = "captures_from_two_hosts_give_a_report_per_host_and_for_the_fleet";
    if !vramhook_safety_tests::require_root(TEST) {
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let oom = record_on_host(dir.path(), "gpu-a", "torch_caching", &[]);
    let leak = record_on_host(dir.path(), "gpu-b", "leak", &["--n", "4"]);
    let v = json(&[s(&leak), s(&oom)]);
    assert_eq!(v["fleet_schema_version"], 1);
    let hosts: Vec<&str> = v["hosts"].as_array().expect("hosts").iter().filter_map(|h| h["host"].as_str()).collect();
    assert_eq!(hosts, ["gpu-a", "gpu-b"]);
    let a = &v["hosts"][0]["report"];
    let b = &v["hosts"][1]["report"];
    assert_eq!(a["ooms"].as_array().map(Vec::len), Some(1), "the OOM is gpu-a's");
    assert_eq!(b["ooms"].as_array().map(Vec::len), Some(0));
    // leak --n 4 leaves 6,295,456 bytes live at exit (the simulated driver's ground truth).
    assert_eq!(v["summary"][1]["leaked_bytes"], 6_295_456u64, "{}", v["summary"]);
    let verdict = a["ooms"][0]["verdict"].as_str().expect("verdict");
    assert_eq!(v["fleet"]["ooms_by_verdict"][verdict], 1);
    assert_eq!(v["fleet"]["ooms"], 1);
    assert_eq!(v["fleet"]["hosts"], 2);

    let out = analyze(&[s(&oom), s(&leak)]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("vramhook fleet post-mortem: 2 hosts"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("gpu-a ") && l.contains(&format!("{verdict} 1"))), "{text}");
    assert!(text.contains("==== host gpu-b"), "{text}");
    // One page per host only: asked for one over two hosts, a clear refusal.
    let html = dir.path().join("fleet.html");
    let out = analyze(&[s(&oom), s(&leak), "--html", s(&html)]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("several"));
}

/// Issue #10, item 4: the framework cache's numbers (the simulated lens feed of
/// `torch_fragmented`: 16 segments of 1000 MiB, 600 MiB in use in each, then 2000 MiB asked
/// for) as timelines in the JSON, a line in the text and plots in the HTML page.
#[test]
fn framework_cache_timelines_from_the_lens_in_every_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cap = record(dir.path(), "torch_fragmented", &[]);
    let r = json(&[s(&cap)]);
    let pid = r["processes"][0]["pid"].as_u64().expect("pid");
    let fw = r["timelines"]["frameworks"].as_array().expect("framework timelines");
    assert_eq!(fw.len(), 1, "{fw:#?}");
    let f = &fw[0];
    assert_eq!(
        (f["pid"].as_u64(), &f["source"], &f["framework"]),
        (Some(pid), &Value::from("lens"), &Value::from("pytorch"))
    );
    let last = |k: &str| f[k].as_array().and_then(|s| s.last()).map(|p| p[3].clone()).unwrap_or(Value::Null);
    let mib = 1u64 << 20;
    assert_eq!(last("reserved_bytes"), 16 * 1000 * mib);
    assert_eq!(last("allocated_bytes"), 16 * 600 * mib);
    assert_eq!(last("largest_free_block"), 400 * mib);
    let frag = last("fragmentation").as_f64().expect("fragmentation");
    assert!((frag - (1.0 - 400.0 / 6400.0)).abs() < 1e-9, "{frag}");
    assert_eq!(f["ooms"][0]["requested_bytes"], 2000 * mib);

    let out = analyze(&[s(&cap)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("pid {pid} dev 0 pytorch (lens, ")), "{text}");
    assert!(text.contains("largest free block 400.00 MiB (last measured), fragmentation 0.94"), "{text}");
    let html = dir.path().join("r.html");
    assert!(analyze(&[s(&cap), "--html", s(&html)]).status.success());
    let page = std::fs::read_to_string(&html).expect("html written");
    assert!(page.contains("id=plot-fw-bytes") && page.contains("id=plot-fw-frag"));
    assert!(page.contains("\"largest_free_block\":[["), "the series are in the page's data");
}

/// Issue #10, item 5: the H200 capture and PyTorch's snapshot of the same process; the
/// snapshot joins pid 468 on its 139 segments (and not with another run's capture).
#[test]
fn a_snapshot_with_its_own_capture_joins_that_process() {
    let fixtures = repo_root().join("tests/fixtures/h200-oom");
    let cap = fixtures.join("torch_default_fragmented.vhc");
    let snap = fixtures.join("torch_fragmented_snapshot.pickle");
    let r = json(&[s(&cap), s(&snap)]);
    let j = &r["inputs"][1]["pytorch"]["join"];
    assert_eq!(
        (&j["joined"], &j["pid"], &j["matched"], &j["segments"]),
        (&Value::from(true), &Value::from(468), &Value::from(139), &Value::from(139)),
        "{j}"
    );
    let pids: Vec<u64> =
        r["processes"].as_array().expect("processes").iter().filter_map(|p| p["pid"].as_u64()).collect();
    assert_eq!(pids, vec![468]);
    let fatal = r["ooms"]
        .as_array()
        .expect("ooms")
        .iter()
        .find(|o| o["from_snapshot"].is_string() && o["requested_bytes"] == 2u64 << 30)
        .expect("the snapshot's 2 GiB incident");
    assert_eq!((&fatal["pid"], &fatal["verdict"]), (&Value::from(468), &Value::from("framework_fragmentation")));
    let out = analyze(&[s(&cap), s(&snap)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("joined to pid 468: 139 of its 139 segments are allocations of pid 468"), "{text}");

    // Another run's capture (the capacity case: other addresses): the snapshot stays apart.
    let other = fixtures.join("torch_default_capacity.vhc");
    let r = json(&[s(&other), s(&snap)]);
    let j = &r["inputs"][1]["pytorch"]["join"];
    assert_eq!(j["joined"], false, "{j}");
    assert!(j["reason"].as_str().is_some_and(|t| t.contains("none of its")), "{j}");
    assert!(r["processes"].as_array().expect("processes").iter().any(|p| p["pid"].as_u64() > Some(1 << 22)));
}
