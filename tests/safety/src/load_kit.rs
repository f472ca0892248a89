//! Helpers for the load tests: many traced processes at once, and per-process accounting
//! of captures against the simulated driver's ground truth (the agent is `ring_kit::Agent`).

use std::collections::{BTreeMap, HashSet};
use std::io::BufReader;
use std::path::Path;
use vramhook_protocol::capture::{CaptureReader, Frame};
use vramhook_protocol::record::{Event, EventKind};

/// A shell command line that starts `procs` copies of threads16 at once and waits for them.
pub fn many_threads16(procs: usize, threads: usize, iters: usize) -> String {
    let wl = crate::workload("threads16");
    format!("for i in $(seq {procs}); do {} --threads {threads} --iters {iters} >/dev/null & done; wait", wl.display())
}

/// Calls per pid in the simulated driver's ground truth (`<pid>.jsonl` per process).
pub fn truth_calls(dir: &Path) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("truth dir").filter_map(|e| e.ok()) {
        let path = entry.path();
        let Some(pid) = path.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("truth file");
        out.insert(pid, text.lines().filter(|l| l.starts_with("{\"fn\"")).count() as u64);
    }
    out
}

/// What the captures hold for one process.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Captured {
    /// Driver calls delivered.
    pub calls: u64,
    /// Events counted as dropped (the sizes of its `Dropped` records).
    pub dropped: u64,
    /// Events delivered twice (same `seq`).
    pub duplicates: u64,
    /// Its `Dropped` records: (size, aux = ring slots they stand for), for a diagnosis.
    pub markers: Vec<(u64, u64)>,
    /// Process start and exit records delivered.
    pub frames: u64,
    /// The interposer's own samples delivered (pool reserves: no call of the program's, and
    /// not in the driver's log).
    pub samples: u64,
}

/// Per pid, what the capture files hold (in file name order; a file cut short by a killed
/// writer is read up to the cut).
pub fn captured(files: &[std::path::PathBuf]) -> BTreeMap<u32, Captured> {
    let mut out: BTreeMap<u32, Captured> = BTreeMap::new();
    let mut seen: HashSet<(u32, u64)> = HashSet::new();
    for file in files {
        let f = std::fs::File::open(file).expect("capture file");
        let Ok(mut r) = CaptureReader::new(BufReader::new(f)) else { continue };
        while let Ok(Some(frame)) = r.next_frame() {
            let Frame::Events(records) = frame else { continue };
            for raw in records {
                let e = Event::from_raw(raw);
                let c = out.entry(e.pid).or_default();
                match e.kind() {
                    Some(EventKind::Dropped) => {
                        c.dropped += e.dropped_count();
                        c.markers.push((e.dropped_count(), e.lost_in_flight()));
                    }
                    Some(EventKind::ProcessStart | EventKind::ProcessExit) => {
                        c.frames += 1;
                        if !seen.insert((e.pid, e.seq)) {
                            c.duplicates += 1;
                        }
                    }
                    Some(EventKind::PoolSample | EventKind::Frameworks) => {
                        c.samples += 1;
                        if !seen.insert((e.pid, e.seq)) {
                            c.duplicates += 1;
                        }
                    }
                    _ => {
                        c.calls += 1;
                        if !seen.insert((e.pid, e.seq)) {
                            c.duplicates += 1;
                        }
                    }
                }
            }
        }
    }
    out
}

/// The files of a capture directory, in name order (the agent's files sort by time).
pub fn capture_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir).expect("capture dir").filter_map(|e| e.ok()).map(|e| e.path()).collect();
    v.sort();
    v
}

/// Checks, per process of the ground truth (each exits normally: one start and one exit
/// record), delivered + dropped = issued + 2 and nothing twice; returns (issued calls,
/// delivered calls, dropped) over all of them.
pub fn assert_exact(truth: &BTreeMap<u32, u64>, got: &BTreeMap<u32, Captured>, what: &str) -> (u64, u64, u64) {
    let mut totals = (0, 0, 0);
    let mut wrong = Vec::new();
    for (pid, issued) in truth {
        let c = got.get(pid).cloned().unwrap_or_default();
        // A dropped slot may hold the process's start or exit record as well as a call
        // (an agent killed with the first batch in hand loses the start record with it):
        // every slot is accounted for, calls and the two records alike. It may also have
        // held one of the interposer's own samples (a pool's reserve when it changed, at
        // most one a sampling interval: a few in a run), which the driver's log does not
        // list: exact without drops, and never more than a few over with them.
        let excess = (c.calls + c.frames + c.dropped).checked_sub(issued + 2);
        let exact = excess == Some(0) || (c.dropped > 0 && excess.is_some_and(|x| x <= c.dropped.min(4)));
        if !exact || c.frames > 2 || c.duplicates != 0 {
            wrong.push(format!(
                "pid {pid}: issued {issued}, delivered {}, dropped {}, twice {} (start/exit records {}, own samples {}, Dropped records (size, slots) {:?})",
                c.calls, c.dropped, c.duplicates, c.frames, c.samples, c.markers
            ));
        }
        totals.0 += issued;
        totals.1 += c.calls;
        totals.2 += c.dropped;
    }
    assert!(
        wrong.is_empty(),
        "{what}: accounting not exact for {} of {} processes:\n{}",
        wrong.len(),
        truth.len(),
        wrong.join("\n")
    );
    totals
}

/// A ring directory of its own on /dev/shm (else the temp dir).
pub fn ring_dir(tag: &str) -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() { base.to_path_buf() } else { std::env::temp_dir() };
    tempfile::Builder::new().prefix(&format!("vramhook-safety-{tag}-")).tempdir_in(base).expect("ring dir")
}
