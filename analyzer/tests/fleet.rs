//! Fleet post-mortems: captures from two hosts whose processes share a pid are analysed
//! through one model per host, side by side, and added up.

mod common;

use std::path::Path;
use vramhook_analyzer::fleet::{self, analyze_fleet, NO_HOST};
use vramhook_analyzer::Options;
use vramhook_protocol::capture::{CaptureHeader, CaptureWriter, ProcessInfo};
use vramhook_protocol::record::Api;
use vramhook_testkit::events::Stream;

const GIB: u64 = 1 << 30;

/// A capture from `host`: pid 100 running `command`, `allocs` × 1 GiB on a 16 GiB device
/// (one sample), then an OOM of `oom_gib` GiB when asked.
fn capture(dir: &Path, name: &str, host: &str, command: &str, allocs: u64, oom_gib: Option<u64>) -> std::path::PathBuf {
    let header = CaptureHeader {
        version: 1,
        mono_anchor_ns: 1_000_000_000,
        wall_anchor_ns: 1_764_000_000_000_000_000,
        flags: 0,
        host: host.into(),
    };
    let mut w = CaptureWriter::new(Vec::new(), &header).expect("writer");
    w.write_process(&ProcessInfo {
        pid: 100,
        ppid: 1,
        uid: 0,
        start_time: 1100,
        run_id: 0,
        exe: format!("/usr/bin/{command}"),
        cmdline: vec![command.into()],
    })
    .expect("process");
    let mut s = Stream::new(100, 2_000_000_000);
    s.allocs_a_gib_apart(allocs, GIB);
    s.meminfo(16 * GIB - allocs * GIB, 16 * GIB);
    if let Some(g) = oom_gib {
        s.oom(Api::cuMemAlloc_v2, g * GIB);
    }
    w.write_events(&s.out).expect("events");
    common::write_file(dir, name, w.finish().expect("finish"))
}

#[test]
fn two_hosts_with_the_same_pid_are_reported_apart_and_added_up() {
    let dir = tempfile::tempdir().expect("dir");
    let a = capture(dir.path(), "a.vhc", "gpu-a", "python3", 3, Some(40));
    let b = capture(dir.path(), "b.vhc", "gpu-b", "llama-server", 5, None);
    let log = dir.path().join("notes.txt");
    std::fs::write(&log, "nothing to see\n").expect("log");
    let files = [&b, &a, &log];
    assert_eq!(fleet::host_count(&files), 2);
    let groups = fleet::group_by_host(&files);
    let names: Vec<&str> = groups.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(names, ["gpu-a", "gpu-b", NO_HOST], "hosts in order, hostless last");

    let f = analyze_fleet(&files, &Options::default()).expect("fleet");
    assert_eq!(f.fleet_schema_version, fleet::FLEET_SCHEMA_VERSION);
    let host = |h: &str| f.hosts.iter().find(|x| x.host == h).expect(h);
    // pid 100 is two processes, one per host, each with its own command and bytes.
    let pa = &host("gpu-a").report.processes;
    let pb = &host("gpu-b").report.processes;
    assert_eq!((pa.len(), pb.len()), (1, 1));
    assert!(pa[0].command.contains("python3") && pb[0].command.contains("llama-server"), "{pa:?} {pb:?}");
    assert_eq!((pa[0].peak_bytes, pb[0].peak_bytes), (3 * GIB, 5 * GIB));

    let sa = f.summary.iter().find(|s| s.host == "gpu-a").expect("a");
    let sb = f.summary.iter().find(|s| s.host == "gpu-b").expect("b");
    assert_eq!((sa.ooms, sb.ooms), (1, 0));
    let verdict = host("gpu-a").report.ooms[0].incident.verdict.name();
    assert_eq!(verdict, "capacity", "40 GiB asked of a 16 GiB device");
    assert_eq!(sa.ooms_by_verdict.get("capacity"), Some(&1));
    assert_eq!(f.fleet.hosts, 3, "two hosts and the hostless inputs");
    assert_eq!(f.fleet.ooms, 1);
    assert_eq!(f.fleet.ooms_by_verdict.get("capacity"), Some(&1));
    assert_eq!(f.fleet.processes, 2);
    assert_eq!(f.fleet.events, sa.events + sb.events);
    // Holders across the fleet: b's 5 GiB first.
    let holders: Vec<(&str, u64)> = f.fleet.top_holders.iter().map(|h| (h.host.as_str(), h.peak_bytes)).collect();
    assert_eq!(holders, [("gpu-b", 5 * GIB), ("gpu-a", 3 * GIB)]);
    // Least headroom: b sampled 11 GiB free, a 13 GiB.
    let least: Vec<(&str, u64)> = f.fleet.least_headroom.iter().map(|d| (d.host.as_str(), d.min_free_bytes)).collect();
    assert_eq!(least, [("gpu-b", 11 * GIB), ("gpu-a", 13 * GIB)]);

    let text = fleet::render_text(&f);
    assert!(text.starts_with("vramhook fleet post-mortem: 3 hosts"), "{text}");
    let row = text.lines().find(|l| l.starts_with("gpu-a ")).expect("a's row");
    assert!(row.contains("capacity 1"), "{row}");
    assert!(text.contains("==== host gpu-b"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("fleet ")), "{text}");

    let json = serde_json::to_value(&f).expect("json");
    assert_eq!(json["fleet"]["ooms_by_verdict"]["capacity"], 1);
    assert_eq!(json["hosts"][0]["report"]["schema_version"], vramhook_analyzer::SCHEMA_VERSION);
    // The document matches schema/fleet.schema.json, each host's report report.schema.json.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/schema/fleet.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("JSON");
    let mut errs = Vec::new();
    common::validate(&schema, &schema, &json, "$", &mut errs);
    assert!(errs.is_empty(), "fleet report does not match its schema:\n{}", errs.join("\n"));
    for h in &f.hosts {
        common::assert_valid(&h.report);
    }
    // The check can fail: a field the schema does not know.
    let mut bad = json.clone();
    bad["fleet"]["surprise"] = serde_json::json!(1);
    let mut errs = Vec::new();
    common::validate(&schema, &schema, &bad, "$", &mut errs);
    assert!(!errs.is_empty());
}

#[test]
fn one_host_is_not_a_fleet_and_a_fifo_is_never_opened() {
    let dir = tempfile::tempdir().expect("dir");
    let a = capture(dir.path(), "a.vhc", "gpu-a", "python3", 1, None);
    let a2 = capture(dir.path(), "a2.vhc", "gpu-a", "python3", 2, None);
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    // Opening the FIFO would wait for a writer that never comes: it is not peeked at.
    assert_eq!(fleet::host_count(&[&a, &a2, &fifo]), 1);
}
