//! Small hostile PyTorch snapshots (issue 27), generated here: pickles whose memo references
//! make one list or entry stand for many. The work the analyzer counts (list elements
//! expanded, live segments looked at for `oom` entries) stays within a fixed multiple of the
//! input's bytes, what was not read or analysed is said in a note, and the peak memory of
//! an analysis, measured in a child process (VmHWM is per process), stays bounded.

use std::collections::HashMap;
use vramhook_analyzer::{analyze_bytes_work, Options, Report, Work};

#[path = "common/rss.rs"]
mod rss;

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7F00_0000_0000;
/// Work allowed per byte of input, all counters together (the analyzer's budgets: 2 list
/// elements and 2 segment visits per byte, plus floors that these files dwarf).
const WORK_PER_BYTE: u64 = 8;
/// Peak resident memory allowed to an analysis of the two files (its target for
/// the release build), and to any: linear in the bytes (each segment visit an `oom` entry
/// may spend, 2 per byte, keeps about 60 bytes in its incident).
const MAX_PEAK_KIB: u64 = 256 * 1024;
const PEAK_BASE_KIB: u64 = 64 * 1024;
const PEAK_PER_BYTE: u64 = 160;
/// The two files.
const NAMED: [&str; 2] = ["segments_and_one_shared_oom", "devices_share_one_trace"];

/// A hand-written pickle (protocol 2 opcodes, keys memoized as `pickle` does).
#[derive(Default)]
struct Pickle {
    b: Vec<u8>,
    memo: u32,
    keys: HashMap<&'static str, u32>,
}

impl Pickle {
    fn new() -> Pickle {
        Pickle { b: vec![0x80, 2], ..Pickle::default() }
    }
    fn op(&mut self, ops: &[u8]) -> &mut Self {
        self.b.extend_from_slice(ops);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.b.push(b'X');
        self.b.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.b.extend_from_slice(s.as_bytes());
        self
    }
    /// A dict key: written once, then a memo reference.
    fn key(&mut self, k: &'static str) -> &mut Self {
        match self.keys.get(k) {
            Some(&i) => self.get(i),
            None => {
                self.str(k);
                let i = self.put();
                self.keys.insert(k, i);
                self
            }
        }
    }
    fn int(&mut self, v: u64) -> &mut Self {
        if v < 256 {
            self.op(&[b'K', v as u8])
        } else {
            self.op(&[0x8a, 8]).op(&v.to_le_bytes())
        }
    }
    /// Memoizes the top of the stack.
    fn put(&mut self) -> u32 {
        let i = self.memo;
        self.memo += 1;
        self.b.push(b'r');
        self.b.extend_from_slice(&i.to_le_bytes());
        i
    }
    fn get(&mut self, i: u32) -> &mut Self {
        self.b.push(b'j');
        self.b.extend_from_slice(&i.to_le_bytes());
        self
    }
    /// A dict of (key, unsigned int or string) pairs.
    fn dict(&mut self, pairs: &[(&'static str, Field)]) -> &mut Self {
        self.op(b"}(");
        for (k, v) in pairs {
            self.key(k);
            match v {
                Field::U(n) => self.int(*n),
                Field::S(s) => self.str(s),
            };
        }
        self.op(b"u")
    }
    /// A list of `n` elements, each pushed by `item`, appended in batches of 1,000.
    fn list(&mut self, n: u64, mut item: impl FnMut(&mut Pickle, u64)) -> &mut Self {
        self.op(b"](");
        for i in 0..n {
            item(self, i);
            if i % 1000 == 999 {
                self.op(b"e(");
            }
        }
        self.op(b"e")
    }
    /// A value built by `make`, memoized and popped: returns its memo index.
    fn shared(&mut self, make: impl FnOnce(&mut Pickle)) -> u32 {
        make(self);
        let i = self.put();
        self.op(b"0");
        i
    }
    fn finish(mut self) -> Vec<u8> {
        self.b.push(b'.');
        self.b
    }
}

enum Field {
    U(u64),
    S(&'static str),
}
use Field::{S, U};

/// A segment of 2 MiB at `i`, with its first MiB allocated (a list of one block).
fn segment(p: &mut Pickle, i: u64) {
    let a = BASE + i * 2 * MIB;
    p.op(b"}(");
    p.key("device").int(0).key("address").int(a).key("total_size").int(2 * MIB);
    p.key("blocks");
    p.list(1, |p, _| {
        p.dict(&[("address", U(a)), ("size", U(MIB)), ("state", S("active_allocated"))]);
    });
    p.op(b"u");
}

fn oom_entry(p: &mut Pickle) {
    p.dict(&[("action", S("oom")), ("size", U(1 << 40)), ("device_free", U(MIB)), ("time_us", U(5000))]);
}

/// The first file: 10,000 segments and 10,000 `oom` trace entries that are one
/// memoized entry (29 s and 7.2 GB before).
fn segments_and_one_shared_oom(segments: u64, ooms: u64) -> Vec<u8> {
    let mut p = Pickle::new();
    let oom = p.shared(oom_entry);
    p.op(b"}(").key("segments");
    p.list(segments, segment);
    one_trace_of_shared_ooms(p, ooms, oom)
}

/// A trace of `entries` entries: a segment, then allocations and frees in it, an `oom` last.
fn trace(p: &mut Pickle, entries: u64) {
    p.list(entries, |p, i| match i {
        0 => {
            p.dict(&[("action", S("segment_alloc")), ("addr", U(BASE)), ("size", U(64 * MIB)), ("time_us", U(1))]);
        }
        i if i + 1 == entries => oom_entry(p),
        i => {
            let action = if i % 2 == 1 { "alloc" } else { "free_completed" };
            let addr = BASE + (i / 2) % 64 * MIB;
            p.dict(&[("action", S(action)), ("addr", U(addr)), ("size", U(MIB)), ("time_us", U(1 + i))]);
        }
    });
}

/// The second file: `devices` devices whose traces are one list (92.6 s before).
fn devices_share_one_trace(devices: u64, entries: u64) -> Vec<u8> {
    let mut p = Pickle::new();
    let t = p.shared(|p| trace(p, entries));
    p.op(b"}(").key("segments").op(b"]").key("device_traces");
    p.list(devices, |p, _| {
        p.get(t);
    });
    p.op(b"u");
    p.finish()
}

/// Ends a snapshot after its segments: one device whose trace is `n` references to the
/// shared `oom` entry.
fn one_trace_of_shared_ooms(mut p: Pickle, n: u64, oom: u32) -> Vec<u8> {
    p.key("device_traces").op(b"](");
    p.list(n, |p, _| {
        p.get(oom);
    });
    p.op(b"eu");
    p.finish()
}

/// `segments` segments whose `blocks` are one list of `blocks` blocks, and `ooms` shared
/// `oom` entries (each hands the cache to the model).
fn segments_share_one_block_list(segments: u64, blocks: u64, ooms: u64) -> Vec<u8> {
    let mut p = Pickle::new();
    let list = p.shared(|p| {
        p.list(blocks, |p, i| {
            p.dict(&[("address", U(BASE + i * 4096)), ("size", U(4096)), ("state", S("active_allocated"))]);
        });
    });
    let oom = p.shared(oom_entry);
    p.op(b"}(").key("segments");
    p.list(segments, |p, i| {
        p.op(b"}(");
        p.key("device").int(0).key("address").int(BASE + i * 64 * MIB).key("total_size").int(64 * MIB);
        p.key("blocks").get(list);
        p.op(b"u");
    });
    one_trace_of_shared_ooms(p, ooms, oom)
}

/// A segment list that is one segment referenced `n` times, and as many shared `oom` entries.
fn one_segment_referenced(n: u64) -> Vec<u8> {
    let mut p = Pickle::new();
    let seg = p.shared(|p| segment(p, 0));
    let oom = p.shared(oom_entry);
    p.op(b"}(").key("segments");
    p.list(n, |p, _| {
        p.get(seg);
    });
    one_trace_of_shared_ooms(p, n, oom)
}

/// One device whose trace is one allocation entry and one `oom` entry, referenced in turn
/// `n` times each, after 2,000 segments.
fn shared_trace_entries(n: u64) -> Vec<u8> {
    let mut p = Pickle::new();
    let alloc = p.shared(|p| {
        p.dict(&[("action", S("alloc")), ("addr", U(BASE)), ("size", U(MIB)), ("time_us", U(7))]);
    });
    let oom = p.shared(oom_entry);
    p.op(b"}(").key("segments");
    p.list(2000, segment);
    p.key("device_traces").op(b"](");
    p.list(2 * n, |p, i| {
        p.get(if i % 2 == 0 { alloc } else { oom });
    });
    p.op(b"eu");
    p.finish()
}

/// Device traces that are one list of `inner` references to a list of device traces
/// (lists of lists shared at two levels).
fn device_lists_of_shared_lists(outer: u64, inner: u64) -> Vec<u8> {
    let mut p = Pickle::new();
    let t = p.shared(|p| trace(p, 200));
    let devices = p.shared(|p| {
        p.list(inner, |p, _| {
            p.get(t);
        });
    });
    p.op(b"}(").key("segments");
    p.list(outer, |p, _| {
        p.get(devices);
    });
    p.key("device_traces").get(devices);
    p.op(b"u");
    p.finish()
}

type Case = (&'static str, fn() -> Vec<u8>);

const CASES: &[Case] = &[
    ("segments_and_one_shared_oom", || segments_and_one_shared_oom(10_000, 10_000)),
    ("devices_share_one_trace", || devices_share_one_trace(30_000, 600)),
    ("segments_share_one_block_list", || segments_share_one_block_list(2_000, 2_000, 2_000)),
    ("one_segment_referenced", || one_segment_referenced(200_000)),
    ("shared_trace_entries", || shared_trace_entries(200_000)),
    ("device_lists_of_shared_lists", || device_lists_of_shared_lists(20_000, 20_000)),
];

fn analysed(name: &str, bytes: &[u8]) -> (Report, Work) {
    let (r, work) = analyze_bytes_work(name, bytes, &Options::default());
    (r.unwrap_or_else(|e| panic!("{name}: {e}")), work)
}

fn assert_linear(name: &str, w: &Work) {
    assert!(w.bytes > 20_000, "{name}: {} bytes is too small for the floors not to matter", w.bytes);
    let counted = w.items_expanded + w.segment_visits;
    assert!(counted <= WORK_PER_BYTE * w.bytes, "{name}: {w:?}: {counted} > {WORK_PER_BYTE} per byte");
}

/// The first file: some incidents analysed (the first ones), the rest counted with
/// their bytes, and the final state (every segment, every block) read in full.
#[test]
fn ten_thousand_segments_and_one_oom_shared_ten_thousand_times() {
    let bytes = segments_and_one_shared_oom(10_000, 10_000);
    let (r, w) = analysed("s.pickle", &bytes);
    let py = r.inputs[0].pytorch.as_ref().expect("pytorch totals");
    assert_eq!((py.segments, py.blocks, py.trace_entries), (10_000, 10_000, 10_000));
    assert!(!r.ooms.is_empty(), "the first OOM entries are analysed");
    let note = r.notes.iter().find(|n| n.contains("OOM entries counted, not analysed")).expect("a note");
    let counted: u64 = note.trim_start_matches("s.pickle: ").split(' ').next().and_then(|n| n.parse().ok()).expect("n");
    assert_eq!(r.ooms.len() as u64 + counted, 10_000, "analysed + counted = all: {note}");
    assert_eq!(r.folded.ooms, 0, "not past --max-items: {:?}", r.folded);
    // The cost of an OOM here is its 10,000 live segments: the analysed ones fit the budget.
    assert!(w.segment_visits >= r.ooms.len() as u64 * 10_000, "{w:?}");
    assert_linear("s.pickle", &w);
}

/// The second file: devices past --max-items are folded before their traces are
/// read; the traces read stay within the budget of list elements.
#[test]
fn thirty_thousand_devices_share_one_trace() {
    let bytes = devices_share_one_trace(30_000, 600);
    let (r, w) = analysed("d.pickle", &bytes);
    assert!(r.folded.devices >= 20_000, "{:?}", r.folded);
    assert!(r.notes.iter().any(|n| n.contains("list elements not read")), "{:#?}", r.notes);
    let entries = r.inputs[0].pytorch.as_ref().expect("pytorch totals").trace_entries;
    assert!(entries >= 600 && entries <= 2 * w.bytes, "{entries} entries read");
    assert_linear("d.pickle", &w);
    // With a small limit of items, the fold comes first.
    let (r, _) = analyze_bytes_work("d.pickle", &bytes, &Options { max_items: 3, ..Options::default() });
    let r = r.expect("report");
    assert_eq!(r.devices.iter().filter(|d| d.device >= 0).count(), 3);
    assert_eq!(r.inputs[0].pytorch.as_ref().expect("totals").trace_entries, 3 * 600);
}

/// Each case, in a child process of its own (this test binary, run for one case by
/// `child_analysis`): work within a fixed multiple of the bytes, what was left out said in a
/// note, and the child's peak memory within the bound.
#[test]
fn every_case_is_linear_in_its_bytes_and_bounded_in_memory() {
    for (name, make) in CASES {
        let bytes = make().len() as u64;
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", "child_analysis", "--nocapture", "--test-threads=1"])
            .env("HOSTILE_SNAPSHOT_CASE", name)
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
        let peak: u64 = stdout
            .lines()
            .find_map(|l| l.split("peak_kib=").nth(1))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no peak in {stdout}"));
        eprintln!("{name}: {bytes} bytes, peak {peak} KiB");
        assert!(peak > 0 && peak <= PEAK_BASE_KIB + PEAK_PER_BYTE * bytes / 1024, "{name}: peak {peak} KiB");
        if NAMED.contains(name) {
            assert!(peak <= MAX_PEAK_KIB, "{name}: peak {peak} KiB");
        }
    }
}

/// One case's analysis, when `HOSTILE_SNAPSHOT_CASE` names it (otherwise nothing).
#[test]
fn child_analysis() {
    let Ok(name) = std::env::var("HOSTILE_SNAPSHOT_CASE") else { return };
    let (_, make) = CASES.iter().find(|(n, _)| *n == name).expect("a known case");
    let bytes = make();
    let (r, w) = analysed(&name, &bytes);
    let peak = rss::vm_hwm_kib();
    println!("{name}: {w:?}; {} incidents, folded {:?}", r.ooms.len(), r.folded);
    assert_linear(&name, &w);
    // Each of these expands past its budget somewhere: a note says what was left out.
    let said =
        r.notes.iter().any(|n| n.contains("not read") || n.contains("counted, not analysed")) || r.folded.devices > 0;
    assert!(said, "{name}: nothing said about what was left out: {:#?}", r.notes);
    assert!(r.devices.iter().filter(|d| d.device >= 0).count() <= vramhook_analyzer::DEFAULT_MAX_ITEMS);
    println!("peak_kib={peak}");
}

/// The memory and time budget: past it the analysis stops with an error that carries the
/// partial report, which says it is partial.
#[test]
fn the_budget_ends_with_an_error_and_a_partial_report() {
    use vramhook_analyzer::{analyze_bytes, AnalyzeError};
    let bytes = segments_and_one_shared_oom(2_000, 2_000);
    for (what, opts) in [
        ("--time-limit", Options { time_limit: Some(std::time::Duration::ZERO), ..Options::default() }),
        ("--max-memory", Options { max_memory_mib: 1, ..Options::default() }),
    ] {
        match analyze_bytes("b.pickle", &bytes, &opts) {
            Err(AnalyzeError::Budget { message, partial }) => {
                assert!(message.contains(what), "{message}");
                assert!(partial.notes.iter().any(|n| n.contains("this report is partial")), "{:#?}", partial.notes);
                assert!(!partial.notes.iter().any(|n| n.contains("--to")), "{:#?}", partial.notes);
            }
            other => panic!("{what}: {:?}", other.map(|r| r.notes)),
        }
    }
    // Without limits it completes.
    let unlimited = Options { time_limit: None, max_memory_mib: 0, ..Options::default() };
    assert!(analyze_bytes("b.pickle", &bytes, &unlimited).is_ok());
    // A capture is stopped by the replay's own looks (every 262,144 events): what came
    // before is in the partial report.
    use vramhook_protocol::capture::{CaptureHeader, CaptureWriter};
    use vramhook_protocol::record::{Api, Event};
    let n = 600_000u64;
    let events: Vec<Event> = (0..n)
        .map(|i| {
            let e = if i % 2 == 0 {
                Event::alloc(Api::cuMemAlloc_v2, BASE, MIB)
            } else {
                Event::free(Api::cuMemFree_v2, BASE)
            };
            e.by(9, 9).at(1_000 + i).with_seq(i).on_device(0)
        })
        .collect();
    let mut w = CaptureWriter::new(Vec::new(), &CaptureHeader::default()).expect("writer");
    w.write_events(&events).expect("events");
    let capture = w.finish().expect("finish");
    let zero = Options { time_limit: Some(std::time::Duration::ZERO), ..Options::default() };
    match analyze_bytes("c.vhc", &capture, &zero) {
        Err(AnalyzeError::Budget { partial, .. }) => {
            assert!(partial.events >= 1 << 18 && partial.events < n, "{} events", partial.events);
            assert!(partial.notes.iter().any(|n| n.contains("this report is partial")), "{:#?}", partial.notes);
        }
        other => panic!("capture: {:?}", other.map(|r| r.events)),
    }
    assert_eq!(analyze_bytes("c.vhc", &capture, &unlimited).expect("report").events, n);
}
