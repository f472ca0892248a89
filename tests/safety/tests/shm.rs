//! A full or tiny /dev/shm, the space a new ring may take, and what becomes of rings whose
//! process is gone (gc by the next traced process and by `vramhook gc`, the keep budget).

use std::path::Path;
use vramhook_safety_tests::shm_kit::*;
use vramhook_safety_tests::{require_root, traced_workload, Tmpfs};

const WORKLOAD: &str = "torch_caching";

fn ring_dir_on(fs: &Path) -> std::path::PathBuf {
    private_dir(fs, "rings", 0o700)
}

/// As root: a tmpfs of `bytes` with a ring directory on it; otherwise `None` (the test is
/// reported not run).
fn rings_on_tmpfs(test: &str, bytes: u64) -> Option<(Tmpfs, std::path::PathBuf)> {
    if !require_root(test) {
        return None;
    }
    let fs = Tmpfs::mount(bytes).expect("tmpfs");
    let dir = ring_dir_on(fs.path());
    Some((fs, dir))
}

/// One traced run into a fresh private ring directory: the run succeeds and leaves one
/// ring. Returns the directory (and what keeps it) and the ring.
fn one_traced_ring(what: &str) -> (tempfile::TempDir, std::path::PathBuf, Vec<std::path::PathBuf>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = private_dir(tmp.path(), "rings", 0o700);
    assert!(traced_workload(WORKLOAD, &dir).status().expect(what).success());
    let found = rings(&dir);
    assert_eq!(found.len(), 1);
    (tmp, dir, found)
}

/// A 256 KiB tmpfs as the ring directory's file system: every one of 12 runs ends as the
/// untraced run does (before the fix, runs died of SIGBUS writing to unbacked ring pages).
#[test]
fn a_tiny_shm_never_kills_the_traced_program() {
    let Some((_fs, dir)) = rings_on_tmpfs("a_tiny_shm_never_kills_the_traced_program", 256 << 10) else {
        return;
    };
    let expected = untraced(WORKLOAD);
    for run in 0..12 {
        let out = traced_workload(WORKLOAD, &dir).output().expect("run");
        assert_same_as_untraced(&out, &expected, &format!("run {run} on a 256 KiB tmpfs"));
        assert!(vramhook_lines(&out).len() <= 1, "at most one line: {:?}", vramhook_lines(&out));
    }
    assert!(names(&dir).iter().all(|n| !n.ends_with(".tmp")), "no unfinished ring left: {:?}", names(&dir));
}

/// A full file system: the ring's pages cannot be reserved, so the process runs untraced
/// with exactly one line and leaves no file behind.
#[test]
fn a_full_shm_runs_untraced_with_one_line_and_no_file() {
    let Some((fs, dir)) = rings_on_tmpfs("a_full_shm_runs_untraced_with_one_line_and_no_file", 4 << 20) else {
        return;
    };
    fs.fill_leaving(0);
    let expected = untraced(WORKLOAD);
    let out = traced_workload(WORKLOAD, &dir).output().expect("run");
    assert_same_as_untraced(&out, &expected, "full tmpfs");
    let lines = vramhook_lines(&out);
    assert_eq!(lines.len(), 1, "exactly one line: {lines:?}");
    assert!(lines[0].contains("untraced"), "{lines:?}");
    assert_eq!(names(&dir), Vec::<String>::new(), "nothing left in the ring directory");
}

/// A new ring takes at most 10% of the space free when it is made (it took a fixed 4 MiB
/// before), and still records.
#[test]
fn a_new_ring_takes_at_most_a_tenth_of_the_free_space() {
    let Some((_fs, dir)) = rings_on_tmpfs("a_new_ring_takes_at_most_a_tenth_of_the_free_space", 16 << 20) else {
        return;
    };
    let free = free_bytes(&dir);
    let expected = untraced(WORKLOAD);
    let out = traced_workload(WORKLOAD, &dir).output().expect("run");
    assert_same_as_untraced(&out, &expected, "16 MiB tmpfs");
    let rings = rings(&dir);
    assert_eq!(rings.len(), 1, "{:?}", names(&dir));
    let size = std::fs::metadata(&rings[0]).expect("ring").len();
    assert!(size <= free / 10, "ring of {size} bytes with {free} bytes free");
    assert!(size >= 4096 + 1024 * 64, "at least the floor of 1,024 slots: {size}");
    assert!(pending(&rings[0]) > 0, "the smaller ring still records");
}

/// The next traced process removes the rings of gone processes that were drained, and
/// stale unfinished rings; it keeps an undrained ring for a later agent.
#[test]
fn the_next_traced_process_removes_drained_rings_of_gone_processes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = private_dir(tmp.path(), "rings", 0o700);
    let first = traced_workload(WORKLOAD, &dir).output().expect("run 1");
    assert!(first.status.success());
    let r1 = rings(&dir);
    assert_eq!(r1.len(), 1, "{:?}", names(&dir));
    mark_drained(&r1[0]);
    let stale_tmp = dir.join(format!(".{DEAD_PID}-1-0.ring.tmp"));
    std::fs::write(&stale_tmp, b"").expect("tmp");

    let second = traced_workload(WORKLOAD, &dir).output().expect("run 2");
    assert!(second.status.success());
    let r2 = rings(&dir);
    assert_eq!(r2.len(), 1, "the drained ring is gone, the new one is there: {:?}", names(&dir));
    assert_ne!(r2[0], r1[0]);
    assert!(!stale_tmp.exists(), "a stale unfinished ring is removed");

    // Undrained rings of gone processes are kept (within the budget) for a later agent.
    let third = traced_workload(WORKLOAD, &dir).output().expect("run 3");
    assert!(third.status.success());
    assert_eq!(rings(&dir).len(), 2, "{:?}", names(&dir));
    assert!(rings(&dir).contains(&r2[0]));
}

/// An undrained ring of a gone process kept past the keep-hours budget (counted from when a
/// gc first found its process gone) is removed by the next traced process, and the removal
/// is counted where `vramhook gc` reports it.
#[test]
fn undrained_rings_past_the_age_budget_are_removed_and_counted() {
    let (_tmp, dir, r1) = one_traced_ring("run 1");
    assert!(pending(&r1[0]) > 0);
    let bytes = std::fs::metadata(&r1[0]).expect("ring").len();
    set_gone_since(&r1[0], 25 * 3600);
    assert!(traced_workload(WORKLOAD, &dir).status().expect("run 2").success());
    assert!(!r1[0].exists(), "a ring found gone 25 hours ago is removed: {:?}", names(&dir));
    let record = std::fs::read_to_string(dir.join(".gc-removed")).expect("removals are recorded");
    let mut parts = record.split_whitespace().map(|p| p.parse::<u64>().expect("number"));
    assert_eq!(parts.next(), Some(1));
    assert!(parts.next().expect("bytes") >= bytes);
    let out = gc(&dir, &["--dry-run"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 undrained ring"), "gc reports the recorded removal:\n{text}");
}

/// `vramhook gc`: with a keep budget of 0% every undrained ring of a gone process goes,
/// oldest first, each one printed; `--dry-run` removes nothing.
#[test]
fn gc_applies_the_space_budget_oldest_first_and_dry_run_removes_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = private_dir(tmp.path(), "rings", 0o700);
    for run in 0..3 {
        assert!(traced_workload(WORKLOAD, &dir).status().expect("run").success(), "run {run}");
    }
    let all = rings(&dir);
    assert_eq!(all.len(), 3, "{:?}", names(&dir));
    // Ages 3 h, 1 h, 2 h: the order of removal is 0, 2, 1.
    for (ring, hours) in all.iter().zip([3, 1, 2]) {
        set_age(ring, hours * 3600);
    }
    let dry = gc(&dir, &["--dry-run"], &[("VRAMHOOK_KEEP_PERCENT", "0")]);
    assert!(dry.status.success(), "{}", String::from_utf8_lossy(&dry.stderr));
    assert_eq!(rings(&dir).len(), 3, "a dry run removes nothing");
    assert!(String::from_utf8_lossy(&dry.stdout).contains("would remove"), "{}", String::from_utf8_lossy(&dry.stdout));

    let out = gc(&dir, &[], &[("VRAMHOOK_KEEP_PERCENT", "0")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(rings(&dir), Vec::<std::path::PathBuf>::new(), "{text}");
    let order: Vec<usize> = ["0", "2", "1"]
        .iter()
        .map(|i| {
            let name =
                all[i.parse::<usize>().expect("index")].file_name().expect("name").to_string_lossy().into_owned();
            text.find(&name).unwrap_or_else(|| panic!("{name} not printed:\n{text}"))
        })
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "oldest first:\n{text}");
    let record = std::fs::read_to_string(dir.join(".gc-removed")).expect("recorded");
    assert!(record.starts_with("3 "), "{record}");
}

/// `vramhook run` drains its descendants' rings and then removes them (their processes are
/// gone, their events drained): a run leaves nothing in the ring directory. It also
/// removes, when it starts, drained rings of gone processes it finds there.
#[test]
fn vramhook_run_leaves_nothing_in_the_ring_directory() {
    let (_tmp, dir, old) = one_traced_ring("plain traced run");
    mark_drained(&old[0]);
    let out = std::process::Command::new(vramhook_safety_tests::vramhook_bin())
        .arg("run")
        .arg("--quiet")
        .arg("--ring-dir")
        .arg(&dir)
        .arg("--")
        .arg(vramhook_safety_tests::workload(WORKLOAD))
        .env("LD_LIBRARY_PATH", vramhook_safety_tests::sim_dir())
        .output()
        .expect("vramhook run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rings(&dir), Vec::<std::path::PathBuf>::new(), "{:?}", names(&dir));
}
