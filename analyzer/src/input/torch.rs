//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`): a pickled dict with
//! `segments` (the caching allocator's segments and their blocks, at snapshot time) and
//! `device_traces` (per device, the allocator's recent actions).
//!
//! Import, so that the same model computes the same report and verdicts:
//! - every segment is a `cudaMalloc` of the caching allocator: segments alive before the
//!   trace starts become allocations at its start; `segment_alloc`/`segment_map` trace entries
//!   become allocations, `segment_free`/`segment_unmap` frees;
//! - the blocks inside segments are tracked from `alloc`/`free_completed` entries and handed
//!   to the model as framework segments before every `oom` entry (so the verdict sees the cache
//!   that was idle then), and from the final `segments` list at the end;
//! - an `oom` entry becomes a failed allocation followed by the device sample it carries.
//!
//! - with memory history (`torch.cuda.memory._record_memory_history`), blocks and trace entries
//!   carry `frames`: at each `oom` entry the allocations live then are grouped by stack
//!   ([`LiveAtOom`]), for the report to list under the incident.
//!
//! The process is synthetic (pid [`SNAPSHOT_PID_BASE`] + n, above Linux's pid range). Analysed
//! with captures, a snapshot whose segments are one capture process's allocations joins that
//! process (see `crate::replay::join`): its allocations and frees are then not replayed again
//! (the capture has the driver's calls), and its framework view (blocks, fragmentation, OOM
//! incidents, cache timeline) is reported as that process's.

use crate::input::pickle::{self, Value};
use crate::replay::SegmentKey;
use crate::report::{
    InputKind, InputReport, InputStatus, LiveAtOom, LiveStack, PytorchTotals, SnapshotJoin, StackFrame,
    MAX_LIVE_STACKS, MAX_STACK_FRAMES,
};
use crate::{AnalyzeError, Replayer};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;
use vramhook_model::Block;
use vramhook_protocol::capture::ProcessInfo;
use vramhook_protocol::kinds::UNKNOWN_BYTES;
use vramhook_protocol::record::{Api, Event, EventKind, FrameworkId, CUDA_ERROR_OUT_OF_MEMORY};

/// Largest snapshot file read.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 30;
/// Pids above Linux's maximum (2^22), so they never collide with a capture's processes.
pub const SNAPSHOT_PID_BASE: u32 = 1 << 22;
/// Trace entries imported per device.
const MAX_TRACE: usize = 10_000_000;
/// List elements expanded per byte of the file, and below that a floor. A list pickled once
/// costs at least a byte per element; only references to a list read already (memo gets:
/// 2 to 5 bytes each, whatever the list's length) can expand past it, and whatever is past
/// it is not read (counted, with a note).
const ITEMS_PER_BYTE: u64 = 2;
const ITEMS_FLOOR: u64 = 4096;
/// List elements expanded at most, whatever the size (twice what the pickle reader keeps).
const MAX_ITEMS: u64 = 2 * pickle::MAX_KEPT as u64;
/// Live segments and blocks looked at on behalf of `oom` entries, per byte of the file, and
/// below that a floor: each `oom` entry makes the model look at every live segment (and
/// keep about 60 bytes per segment in the incident), so 10,000 segments × 10,000 references to one
/// `oom` entry (680 KB) took 29 s and 7.2 GB. Past the budget, `oom` entries are counted,
/// not analysed (with a note).
const VISITS_PER_BYTE: u64 = 2;
const VISITS_FLOOR: u64 = 65_536;
/// `oom` entries per snapshot whose live allocations are grouped by stack.
const MAX_OOM_STACKS: usize = 64;
/// Frames of one stack looked at (PyTorch's C++ frames come first; the Python ones follow).
const MAX_FRAME_SCAN: usize = 256;

/// The allocations live at one of a snapshot's `oom` entries, by stack: for the report to put
/// under the model's incident of that failure (`crate::build`).
#[derive(Clone, Debug)]
pub(crate) struct OomStacks {
    /// The snapshot's synthetic process, the device, the time and the request of the entry.
    pub pid: u32,
    pub device: i16,
    pub ts: u64,
    pub size: u64,
    pub live: LiveAtOom,
}

/// Stacks read from a snapshot, each distinct `frames` list converted once.
#[derive(Default)]
struct Stacks {
    /// By the address of the pickle's list (the parsed pickle keeps every list alive while
    /// it is imported): its stack's id, `None` for an empty stack.
    by_list: HashMap<usize, Option<u32>>,
    ids: HashMap<Vec<StackFrame>, u32>,
    list: Vec<Vec<StackFrame>>,
}

impl Stacks {
    fn id(&mut self, frames: Option<&Value>) -> Option<u32> {
        let v = frames?;
        let key = match v {
            Value::List(l) => Some(Rc::as_ptr(l) as *const () as usize),
            _ => None,
        };
        if let Some(id) = key.and_then(|k| self.by_list.get(&k)) {
            return *id;
        }
        let stack = stack_frames(v);
        let id = if stack.is_empty() {
            None
        } else {
            let next = self.list.len() as u32;
            let list = &mut self.list;
            Some(*self.ids.entry(stack).or_insert_with_key(|s| {
                list.push(s.clone());
                next
            }))
        };
        if let Some(k) = key {
            self.by_list.insert(k, id);
        }
        id
    }
}

/// Whether a frame's file is Python's (a `.py` file, or `<stdin>`, `<string>`, `<frozen …>`).
fn python_file(f: &str) -> bool {
    f.ends_with(".py") || (f.starts_with('<') && f.ends_with('>'))
}

/// A `frames` list as the report gives it: the Python frames where there are any (PyTorch
/// records its C++ frames too with `stacks="all"`), else the C++ frames that name a file and
/// line; innermost first, at most [`MAX_STACK_FRAMES`].
fn stack_frames(v: &Value) -> Vec<StackFrame> {
    let mut python = Vec::new();
    let mut other = Vec::new();
    let mut scan = |f: &Value| {
        let file = f.get("filename").and_then(|x| x.as_str()).unwrap_or_else(|| "".into());
        let line = f.get("line").and_then(|x| x.as_u64()).unwrap_or(0);
        let function = f.get("name").and_then(|x| x.as_str()).unwrap_or_else(|| "".into());
        let frame = || StackFrame { file: file.to_string(), line, function: function.to_string() };
        if python_file(&file) {
            if python.len() < MAX_STACK_FRAMES {
                python.push(frame());
            }
        } else if other.len() < MAX_STACK_FRAMES && line > 0 && !file.is_empty() && &*file != "??" {
            other.push(frame());
        }
    };
    match v {
        Value::List(l) => {
            if let Ok(l) = l.try_borrow() {
                l.0.iter().take(MAX_FRAME_SCAN).for_each(&mut scan);
            }
        }
        Value::Tuple(t) => t.0.iter().take(MAX_FRAME_SCAN).for_each(&mut scan),
        _ => {}
    }
    if python.is_empty() {
        other
    } else {
        python
    }
}

/// Elements of a list or tuple (0 for anything else).
fn list_len(v: &Value) -> usize {
    match v {
        Value::List(l) => l.try_borrow().map_or(0, |l| l.len()),
        Value::Tuple(t) => t.len(),
        _ => 0,
    }
}

/// The list elements a snapshot may expand: every reference to a list counts its elements
/// again, so a list shared n times costs n times its length.
struct Budget {
    limit: u64,
    left: u64,
    /// Elements not expanded, past the budget.
    unexpanded: u64,
}

impl Budget {
    fn new(bytes: usize) -> Budget {
        let limit = (bytes as u64).saturating_mul(ITEMS_PER_BYTE).saturating_add(ITEMS_FLOOR).min(MAX_ITEMS);
        Budget { limit, left: limit, unexpanded: 0 }
    }

    /// The elements of `v` that fit in the budget (handles, not copies of the contents).
    fn items(&mut self, v: &Value, work: &mut crate::Work) -> Vec<Value> {
        let n = list_len(v) as u64;
        let take = n.min(self.left);
        self.left -= take;
        self.unexpanded += n - take;
        work.items_expanded += take;
        let take = take as usize;
        match v {
            Value::List(l) => l.try_borrow().map(|l| l.0[..take.min(l.len())].to_vec()).unwrap_or_default(),
            Value::Tuple(t) => t.0[..take.min(t.len())].to_vec(),
            _ => Vec::new(),
        }
    }

    fn note(&self, path: &str, bytes: usize) -> Option<String> {
        (self.unexpanded > 0).then(|| {
            format!(
                "{path}: {} list elements not read: the file refers to lists it holds again and again, which \
                 would expand past {} elements ({ITEMS_PER_BYTE} per byte of its {bytes} bytes); the numbers \
                 above count what was read",
                self.unexpanded, self.limit
            )
        })
    }
}

struct Seg {
    device: i16,
    size: u64,
    blocks: BTreeMap<u64, u64>,
}

struct Importer<'r> {
    r: &'r mut Replayer,
    pid: u32,
    seq: u64,
    live: BTreeMap<u64, Seg>,
    /// Segments at most (`max_items`); the rest are folded.
    max: usize,
    /// Segments whose blocks changed since they were last handed to the model: an `oom`
    /// entry hands over only these (handing over every segment at every OOM made 10,000
    /// segments × 10,000 OOM entries cost 10^8).
    dirty: BTreeSet<u64>,
    /// Bytes of live segments per device, kept as they come and go.
    reserved: BTreeMap<i16, u64>,
    /// Bytes of allocated blocks in live segments per device, likewise.
    allocated: BTreeMap<i16, u64>,
    /// Folded segment bases (each counted once).
    folded: BTreeSet<u64>,
    /// The process the framework timelines are drawn for (the synthetic one, or the capture's
    /// process the snapshot joined).
    view_pid: u32,
    /// Joined a capture's process: its segments' allocations and frees are the capture's.
    joined: bool,
    /// The `frames` of each allocated block the trace allocated (by address).
    block_frames: HashMap<u64, Value>,
    /// Allocated blocks of the final segments that no trace entry allocates or frees: live
    /// through the whole trace (device, size, frames).
    always_live: Vec<(i16, u64, Option<Value>)>,
    stacks: Stacks,
    /// Allocated blocks in live segments, all devices.
    blocks_live: u64,
    /// Segment visits left to `oom` entries, and the budget they came from.
    visits_left: u64,
    visits_limit: u64,
    /// `oom` entries past the visits budget: counted, not analysed, and the bytes they asked for.
    ooms_folded: u64,
    ooms_folded_bytes: u64,
    /// `oom` entries whose live allocations were not grouped by stack (past the budget).
    stacks_skipped: u64,
}

impl Importer<'_> {
    /// Replays `ev` (built by one of `Event`'s constructors) as this process's next event.
    fn emit(&mut self, ev: Event, device: i16, ts: u64) {
        let driver_call = ev.kind == EventKind::Alloc as u8 || ev.kind == EventKind::Free as u8;
        if self.joined && driver_call && ev.result == 0 {
            return;
        }
        self.seq += 1;
        self.r.event(&ev.by(self.pid, self.pid).at(ts).with_seq(self.seq).on_device(device));
    }

    /// The segment holding `addr`, marked changed.
    fn seg_of(&mut self, addr: u64) -> Option<&mut Seg> {
        let (base, seg) = self.live.range_mut(..=addr).next_back()?;
        if addr < base.saturating_add(seg.size) {
            self.dirty.insert(*base);
            Some(seg)
        } else {
            None
        }
    }

    /// Adds a live segment, unless the limit of segments is reached (then it is folded:
    /// counted with its bytes). Returns whether it was added.
    fn add_seg(&mut self, base: u64, device: i16, size: u64) -> bool {
        if self.live.contains_key(&base) {
            return true;
        }
        if self.live.len() >= self.max {
            if self.folded.insert(base) {
                self.r.folded.segments += 1;
                self.r.folded.segment_bytes = self.r.folded.segment_bytes.saturating_add(size);
            }
            return false;
        }
        self.live.insert(base, Seg { device, size, blocks: BTreeMap::new() });
        let r = self.reserved.entry(device).or_default();
        *r = r.saturating_add(size);
        self.dirty.insert(base);
        true
    }

    /// An allocated block at `addr` (in the segment holding it, if any).
    fn add_block(&mut self, addr: u64, size: u64) {
        if let Some(seg) = self.seg_of(addr) {
            let device = seg.device;
            let old = seg.blocks.insert(addr, size);
            self.blocks_live += u64::from(old.is_none());
            let old = old.unwrap_or(0);
            let a = self.allocated.entry(device).or_default();
            *a = a.saturating_sub(old).saturating_add(size);
        }
    }

    fn remove_block(&mut self, addr: u64) {
        if let Some(seg) = self.seg_of(addr) {
            let device = seg.device;
            if let Some(old) = seg.blocks.remove(&addr) {
                self.blocks_live = self.blocks_live.saturating_sub(1);
                let a = self.allocated.entry(device).or_default();
                *a = a.saturating_sub(old);
            }
        }
    }

    fn remove_seg(&mut self, base: u64) -> Option<Seg> {
        let seg = self.live.remove(&base)?;
        self.blocks_live = self.blocks_live.saturating_sub(seg.blocks.len() as u64);
        if let Some(r) = self.reserved.get_mut(&seg.device) {
            *r = r.saturating_sub(seg.size);
        }
        if let Some(a) = self.allocated.get_mut(&seg.device) {
            *a = a.saturating_sub(seg.blocks.values().fold(0u64, |acc, b| acc.saturating_add(*b)));
        }
        self.dirty.remove(&base);
        Some(seg)
    }

    /// Takes `cost` segment visits from the budget; false (and the budget spent) when they
    /// do not fit.
    fn spend(&mut self, cost: u64) -> bool {
        if cost > self.visits_left {
            self.r.work.segment_visits += self.visits_left;
            self.visits_left = 0;
            return false;
        }
        self.visits_left -= cost;
        self.r.work.segment_visits += cost;
        true
    }

    /// What an `oom` entry costs the model: every live segment (this snapshot's and those
    /// earlier snapshots left), and the blocks of the segments handed over first. Counted
    /// with an early stop: once the budget is spent, each later entry costs O(1).
    fn oom_cost(&self) -> u64 {
        let mut cost = self.live.len() as u64 + self.r.snapshot_segments + 1;
        for base in &self.dirty {
            if cost > self.visits_left {
                break;
            }
            cost += 1 + self.live.get(base).map_or(0, |s| s.blocks.len() as u64);
        }
        cost
    }

    /// The cache of device `d` as the trace has rebuilt it, into its framework timeline.
    fn point(&mut self, d: i16, ts: u64, largest: Option<u64>) {
        let reserved = self.reserved.get(&d).copied().unwrap_or(0);
        let allocated = self.allocated.get(&d).copied().unwrap_or(0).min(reserved);
        let code = FrameworkId::PyTorch as u8;
        self.r.framework_point((self.view_pid, d, code, "snapshot"), ts, reserved, allocated, largest);
    }

    /// Hands the segments that changed since the last call to the model.
    fn push_segments(&mut self, ts: u64) {
        for base in std::mem::take(&mut self.dirty) {
            let Some(s) = self.live.get(&base) else { continue };
            let blocks: Vec<Block> =
                s.blocks.iter().map(|(a, z)| Block { addr: *a, size: *z, allocated: true }).collect();
            let (device, size) = (s.device, s.size);
            self.r.framework_segment(self.pid, device, base, size, &blocks, ts);
        }
    }

    /// The allocations live on device `d` at an `oom` entry, by stack (`None` when none of
    /// them, nor the request, has a stack: the snapshot was taken without history).
    fn live_at_oom(&mut self, d: i16, request: Option<&Value>, snapshot: &str) -> Option<LiveAtOom> {
        // (allocations, bytes, largest) per stack; `None`: no stack.
        let mut groups: HashMap<Option<u32>, (u64, u64, u64)> = HashMap::new();
        let mut add = |id: Option<u32>, size: u64| {
            let g = groups.entry(id).or_default();
            g.0 += 1;
            g.1 = g.1.saturating_add(size);
            g.2 = g.2.max(size);
        };
        for seg in self.live.values().filter(|s| s.device == d) {
            for (addr, size) in &seg.blocks {
                add(self.stacks.id(self.block_frames.get(addr)), *size);
            }
        }
        for (dev, size, frames) in &self.always_live {
            if *dev == d {
                add(self.stacks.id(frames.as_ref()), *size);
            }
        }
        let request_frames =
            self.stacks.id(request).map(|id| self.stacks.list[id as usize].clone()).unwrap_or_default();
        if request_frames.is_empty() && groups.keys().all(|k| k.is_none()) {
            return None;
        }
        let (allocations, bytes) = groups.values().fold((0u64, 0u64), |a, g| (a.0 + g.0, a.1.saturating_add(g.1)));
        let (without_stack, without_stack_bytes) = groups.remove(&None).map_or((0, 0), |g| (g.0, g.1));
        let mut by: Vec<(u32, (u64, u64, u64))> = groups.into_iter().filter_map(|(k, g)| Some((k?, g))).collect();
        // The most bytes first; ties in a fixed order.
        by.sort_unstable_by(|a, b| b.1 .1.cmp(&a.1 .1).then(b.1 .0.cmp(&a.1 .0)).then(a.0.cmp(&b.0)));
        let rest = by.split_off(by.len().min(MAX_LIVE_STACKS));
        Some(LiveAtOom {
            snapshot: snapshot.to_string(),
            allocations,
            bytes,
            without_stack,
            without_stack_bytes,
            request_frames,
            stacks: by
                .into_iter()
                .map(|(id, (n, b, l))| LiveStack {
                    allocations: n,
                    bytes: b,
                    largest_bytes: l,
                    frames: self.stacks.list[id as usize].clone(),
                })
                .collect(),
            stacks_folded: rest.len() as u64,
            stacks_folded_bytes: rest.iter().fold(0u64, |a, g| a.saturating_add(g.1 .1)),
        })
    }
}

fn bad(path: &str, m: impl Into<String>) -> AnalyzeError {
    AnalyzeError::Snapshot { path: path.to_string(), message: m.into() }
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(|x| x.as_u64()).unwrap_or(0)
}

fn dev(v: &Value) -> i16 {
    v.get("device").and_then(|x| x.as_i64()).and_then(|d| i16::try_from(d).ok()).unwrap_or(0)
}

/// One trace entry: its time on the replay's clock, its device, and the entry itself.
type TraceEntry = (u64, i16, Value);

/// Imports one snapshot into the replay. Malformed pickles are errors with the byte offset.
pub fn import(r: &mut Replayer, path: &str, bytes: &[u8]) -> Result<(), AnalyzeError> {
    if r.over_budget.is_some() {
        return Ok(()); // the analysis stopped already (said in its notes)
    }
    let parsed = pickle::parse(bytes).map_err(|e| bad(path, format!("not a readable PyTorch snapshot: {e}")))?;
    if !r.within_budget() {
        return Ok(());
    }
    let mut budget = Budget::new(bytes.len());
    let segments = read_segments(r, &parsed.root, &mut budget, path)?;
    let trace = read_trace(r, &parsed.root, &mut budget);
    let wall_start = match (r.clock, trace.first()) {
        (Some((mono, anchor)), Some(first)) => Some(first.0.saturating_sub(mono).saturating_add(anchor)),
        (None, Some(first)) => Some(first.0),
        _ => None,
    };
    let pid = SNAPSHOT_PID_BASE + r.inputs.len() as u32;
    let join = join_decision(r, path);
    let joined = join.as_ref().and_then(|j| j.pid);
    r.snapshot_pids.insert(pid, (path.to_string(), joined));
    let t_start = trace.first().map_or(1, |e| e.0.saturating_sub(1).max(1));
    let t_end = trace.last().map_or(1, |e| e.0.saturating_add(1));
    snapshot_process(r, pid, path);
    r.folded.pickle_values += parsed.folded;
    let mut imp = Importer::new(r, pid, joined, bytes.len());
    // A snapshot is PyTorch's caching allocator by definition.
    imp.emit(Event::frameworks(FrameworkId::PyTorch.bit()), -1, t_start);
    let allocated_seen = imp.before_trace(&trace, &segments, t_start);
    imp.push_segments(t_start);
    imp.always_live_at_ooms(&trace, &segments, allocated_seen, &mut budget, path);
    let entries = imp.replay_trace(&trace, path);

    // The final state: the snapshot's own segments and blocks. Its own last moment (its last
    // trace entry) is where its cache timeline ends; the model's state goes on to the end of
    // the replay.
    let t_snap = if trace.is_empty() { imp.r.last_ts } else { t_end };
    let t_end = t_end.max(imp.r.last_ts);
    imp.free_gone_segments(&segments, t_end);
    let mut totals = PytorchTotals { trace_entries: entries, ..PytorchTotals::default() };
    imp.final_segments(&segments, &mut budget, &mut totals, t_end, t_snap);
    imp.folded_notes(path);
    imp.r.snapshot_segments += imp.live.len() as u64;
    drop(imp);
    if let Some(note) = budget.note(path, bytes.len()) {
        r.notes.push(note);
    }
    let snap = r.model.snapshot();
    totals.reserved_unallocated_bytes = snap.processes.iter().rev().find(|p| p.pid == pid).map_or(0, |p| p.idle_bytes);
    r.sample(r.last_ts);
    r.inputs.push(InputReport {
        wall_start_ns: wall_start,
        bytes_read: bytes.len() as u64,
        events: entries,
        pytorch: Some(PytorchTotals { join, ..totals }),
        ..InputReport::new(path, InputKind::PytorchSnapshot, InputStatus::Complete)
    });
    drop(parsed);
    Ok(())
}

/// The snapshot's segment list (`segments`, or the root itself in older PyTorch).
fn read_segments(r: &mut Replayer, root: &Value, budget: &mut Budget, path: &str) -> Result<Vec<Value>, AnalyzeError> {
    Ok(match root.get("segments") {
        Some(s @ Value::List(_)) => budget.items(&s, &mut r.work),
        _ => {
            // Older PyTorch pickled the segment list itself.
            let items = budget.items(root, &mut r.work);
            if items.is_empty() && !matches!(root, Value::List(_)) {
                return Err(bad(path, "not a PyTorch memory snapshot (no 'segments')"));
            }
            items
        }
    })
}

/// Trace entries of every device, merged by time.
fn read_trace(r: &mut Replayer, root: &Value, budget: &mut Budget) -> Vec<TraceEntry> {
    let mut trace: Vec<TraceEntry> = Vec::new();
    if let Some(traces) = root.get("device_traces") {
        for (d, per_dev) in budget.items(&traces, &mut r.work).into_iter().enumerate() {
            let device = i16::try_from(d).unwrap_or(i16::MAX);
            // A device past --max-items is folded (and counted) before its trace is read:
            // 30,000 devices sharing one 600-entry trace were 18,000,000 entries.
            if list_len(&per_dev) == 0 || !r.admit_device(device) {
                continue;
            }
            for e in budget.items(&per_dev, &mut r.work).into_iter().take(MAX_TRACE) {
                let wall = e.get("time_us").and_then(|x| x.as_u64()).unwrap_or(0).saturating_mul(1000);
                // On the captures' clock when a capture came first; wall-clock ns otherwise.
                let t = match r.clock {
                    Some((mono, anchor)) => wall.saturating_sub(anchor).saturating_add(mono).max(1),
                    None => wall,
                };
                trace.push((t, device, e));
            }
        }
    }
    trace.sort_by_key(|e| e.0);
    trace
}

/// The synthetic process a snapshot's events belong to.
fn snapshot_process(r: &mut Replayer, pid: u32, path: &str) {
    let name = path.rsplit('/').next().unwrap_or(path).to_string();
    r.process_info(&ProcessInfo {
        pid,
        ppid: 0,
        uid: 0,
        start_time: u64::from(pid),
        run_id: 0,
        exe: "pytorch".into(),
        cmdline: vec!["pytorch-snapshot".into(), name],
    });
}

fn action(e: &Value) -> Option<Rc<str>> {
    e.get("action").and_then(|a| a.as_str())
}

fn action_is(e: &Value, a: &str) -> bool {
    action(e).as_deref() == Some(a)
}

impl<'r> Importer<'r> {
    fn new(r: &'r mut Replayer, pid: u32, joined: Option<u32>, bytes: usize) -> Importer<'r> {
        let max = r.opts.max_items;
        let visits_limit = (bytes as u64).saturating_mul(VISITS_PER_BYTE).saturating_add(VISITS_FLOOR);
        Importer {
            r,
            pid,
            seq: 0,
            live: BTreeMap::new(),
            max,
            dirty: BTreeSet::new(),
            reserved: BTreeMap::new(),
            allocated: BTreeMap::new(),
            folded: BTreeSet::new(),
            view_pid: joined.unwrap_or(pid),
            joined: joined.is_some(),
            block_frames: HashMap::new(),
            always_live: Vec::new(),
            stacks: Stacks::default(),
            blocks_live: 0,
            visits_left: visits_limit,
            visits_limit,
            ooms_folded: 0,
            ooms_folded_bytes: 0,
            stacks_skipped: 0,
        }
    }

    /// Segments that existed before the trace (the final ones never allocated in it, and any
    /// the trace frees or unmaps before allocating), and the blocks in them the trace frees
    /// without allocating. Returns the addresses the trace allocates.
    fn before_trace(&mut self, trace: &[TraceEntry], segments: &[Value], t_start: u64) -> BTreeSet<u64> {
        let mut born: BTreeSet<u64> = BTreeSet::new();
        let mut early: BTreeMap<u64, (i16, u64)> = BTreeMap::new();
        for (_, d, e) in trace {
            let addr = u(e, "addr");
            match action(e).as_deref() {
                Some("segment_alloc") | Some("segment_map") => {
                    born.insert(addr);
                }
                Some("segment_free") | Some("segment_unmap") if !born.contains(&addr) => {
                    early.entry(addr).or_insert((*d, u(e, "size")));
                }
                _ => {}
            }
        }
        for s in segments {
            let a = u(s, "address");
            if !born.contains(&a) {
                early.entry(a).or_insert((dev(s), u(s, "total_size")));
            }
        }
        // Blocks of those early segments that the trace frees were allocated before it too.
        for (base, (d, size)) in &early {
            if *size == 0 || !self.add_seg(*base, *d, *size) {
                continue;
            }
            self.emit(Event::alloc(Api::cuMemAlloc_v2, *base, *size), *d, t_start);
        }
        let mut allocated_seen: BTreeSet<u64> = BTreeSet::new();
        for (_, _, e) in trace {
            if action_is(e, "alloc") {
                allocated_seen.insert(u(e, "addr"));
            }
        }
        for (_, _, e) in trace {
            if action_is(e, "free_completed") {
                let a = u(e, "addr");
                if !allocated_seen.contains(&a) {
                    self.add_block(a, u(e, "size"));
                }
            }
        }
        allocated_seen
    }

    /// Where the trace has `oom` entries: the blocks live through the whole trace (in the
    /// final segments, allocated, and never named by an `alloc` or `free_completed` entry),
    /// with their stacks from the final blocks.
    fn always_live_at_ooms(
        &mut self,
        trace: &[TraceEntry],
        segments: &[Value],
        allocated_seen: BTreeSet<u64>,
        budget: &mut Budget,
        path: &str,
    ) {
        let oom_entries = trace.iter().filter(|(_, _, e)| action_is(e, "oom")).count();
        if oom_entries > 0 {
            let mut touched = allocated_seen;
            touched
                .extend(trace.iter().filter(|(_, _, e)| action_is(e, "free_completed")).map(|(_, _, e)| u(e, "addr")));
            for s in segments {
                let d = dev(s);
                let blist = match s.get("blocks") {
                    Some(b) => budget.items(&b, &mut self.r.work),
                    None => Vec::new(),
                };
                for b in blist {
                    let active = b.get("state").and_then(|x| x.as_str()).is_some_and(|st| st.starts_with("active"));
                    if active && !touched.contains(&u(&b, "address")) {
                        self.always_live.push((d, u(&b, "size"), b.get("frames")));
                    }
                }
            }
        }
        if oom_entries > MAX_OOM_STACKS {
            self.r.notes.push(format!(
                "{path}: {oom_entries} OOM entries; the allocations live at the first {MAX_OOM_STACKS} only are grouped by stack"
            ));
        }
    }

    /// Replays the trace in time order; returns the entries replayed.
    fn replay_trace(&mut self, trace: &[TraceEntry], path: &str) -> u64 {
        let mut oom_stacks_left = MAX_OOM_STACKS;
        let mut entries = 0u64;
        for (ts, d, e) in trace {
            if entries % 1024 == 1023 && !self.r.within_budget() {
                break;
            }
            entries += 1;
            self.replay_entry((*ts).max(1), *d, e, path, &mut oom_stacks_left);
        }
        entries
    }

    fn replay_entry(&mut self, ts: u64, d: i16, e: &Value, path: &str, oom_stacks_left: &mut usize) {
        let pid = self.pid;
        let addr = u(e, "addr");
        let size = u(e, "size");
        let action = action(e).unwrap_or_else(|| "".into());
        match &*action {
            "segment_alloc" | "segment_map"
                if size > 0 && !self.live.contains_key(&addr) && self.add_seg(addr, d, size) =>
            {
                self.dirty.remove(&addr);
                self.emit(Event::alloc(Api::cuMemAlloc_v2, addr, size), d, ts);
                self.r.framework_segment(pid, d, addr, size, &[], ts);
                self.point(d, ts, None);
            }
            "segment_free" | "segment_unmap" if self.remove_seg(addr).is_some() => {
                self.r.framework_segment(pid, d, addr, 0, &[], ts);
                self.emit(Event::free(Api::cuMemFree_v2, addr), d, ts);
                self.point(d, ts, None);
            }
            "alloc" => {
                self.add_block(addr, size);
                match e.get("frames") {
                    Some(f) => self.block_frames.insert(addr, f),
                    None => self.block_frames.remove(&addr),
                };
                self.point(d, ts, None);
            }
            "free_completed" => {
                self.remove_block(addr);
                self.block_frames.remove(&addr);
                self.point(d, ts, None);
            }
            "oom" => self.oom_entry(ts, d, e, size, path, oom_stacks_left),
            _ => {}
        }
    }

    /// An `oom` entry: PyTorch giving up (it raises OutOfMemoryError next), with its cache as
    /// the trace rebuilt it.
    fn oom_entry(&mut self, ts: u64, d: i16, e: &Value, size: u64, path: &str, oom_stacks_left: &mut usize) {
        let cost = self.oom_cost();
        if !self.spend(cost) {
            // Counted, not analysed; its cache's timeline still marks it.
            // Not `folded.ooms`: those are past --max-items; this note is its own.
            self.ooms_folded += 1;
            self.ooms_folded_bytes = self.ooms_folded_bytes.saturating_add(size);
            self.point(d, ts, None);
            let view = self.view_pid;
            self.r.framework_oom_mark((view, d, FrameworkId::PyTorch as u8, "snapshot"), ts, size);
            return;
        }
        self.push_segments(ts);
        let free = u(e, "device_free");
        let reserved = self.reserved.get(&d).copied().unwrap_or(0);
        self.emit(Event::alloc(Api::cuMemAlloc_v2, 0, size).with_result(CUDA_ERROR_OUT_OF_MEMORY), d, ts);
        // The sample PyTorch took: free bytes. The total is not in the snapshot: a
        // capture's, else free + reserved.
        let total = self.r.device_total(d).unwrap_or(free.saturating_add(reserved));
        self.emit(Event::mem_info(free, total), d, ts);
        // The largest free block comes from the segments just handed over.
        let allocated = self.allocated.get(&d).copied().unwrap_or(0).min(reserved);
        let gave_up = Event::framework_oom(FrameworkId::PyTorch, size, reserved, allocated, UNKNOWN_BYTES);
        self.emit(gave_up, d, ts);
        self.point(d, ts, None);
        let view = self.view_pid;
        self.r.framework_oom_mark((view, d, FrameworkId::PyTorch as u8, "snapshot"), ts, size);
        let group_cost = self.blocks_live + self.always_live.len() as u64 + self.live.len() as u64;
        if *oom_stacks_left > 0 && !self.spend(group_cost) {
            self.stacks_skipped += 1;
        } else if *oom_stacks_left > 0 {
            *oom_stacks_left -= 1;
            if let Some(live) = self.live_at_oom(d, e.get("frames").as_ref(), path) {
                self.r.snapshot_stacks.push(OomStacks { pid: self.pid, device: d, ts, size, live });
            }
        }
    }

    /// Frees the live segments that are not among the snapshot's final ones.
    fn free_gone_segments(&mut self, segments: &[Value], t_end: u64) {
        let final_bases: BTreeSet<u64> = segments.iter().map(|s| u(s, "address")).collect();
        let gone: Vec<(u64, i16)> =
            self.live.iter().filter(|(b, _)| !final_bases.contains(b)).map(|(b, s)| (*b, s.device)).collect();
        for (b, d) in gone {
            self.remove_seg(b);
            self.r.framework_segment(self.pid, d, b, 0, &[], t_end);
            self.emit(Event::free(Api::cuMemFree_v2, b), d, t_end);
        }
    }

    /// The snapshot's own final segments and blocks, counted in `totals`, and the cache at
    /// the snapshot (after its last trace entry) per device.
    fn final_segments(
        &mut self,
        segments: &[Value],
        budget: &mut Budget,
        totals: &mut PytorchTotals,
        t_end: u64,
        t_snap: u64,
    ) {
        let pid = self.pid;
        // Per device: reserved, allocated and the largest free block of the final segments.
        let mut at_end: BTreeMap<i16, (u64, u64, u64)> = BTreeMap::new();
        for s in segments {
            let base = u(s, "address");
            let size = u(s, "total_size");
            let d = dev(s);
            totals.segments += 1;
            totals.reserved_bytes = totals.reserved_bytes.saturating_add(size);
            if !self.live.contains_key(&base) && size > 0 {
                if !self.add_seg(base, d, size) {
                    continue; // folded
                }
                self.emit(Event::alloc(Api::cuMemAlloc_v2, base, size), d, t_end);
            }
            if !self.live.contains_key(&base) {
                continue;
            }
            let blocks = final_blocks(s, budget, &mut self.r.work, totals);
            let e = at_end.entry(d).or_default();
            e.0 = e.0.saturating_add(size);
            let used = blocks.iter().filter(|b| b.allocated).fold(0u64, |acc, b| acc.saturating_add(b.size));
            e.1 = e.1.saturating_add(used);
            if let Some(l) = largest_free(base, size, &blocks) {
                e.2 = e.2.max(l);
            }
            self.r.framework_segment(pid, d, base, size, &blocks, t_end);
        }
        // The cache at the snapshot, its own numbers, with the largest free block its
        // blocks give.
        let (view, code) = (self.view_pid, FrameworkId::PyTorch as u8);
        for (d, (reserved, allocated, largest)) in at_end {
            let allocated = allocated.min(reserved);
            self.r.framework_point((view, d, code, "snapshot"), t_snap, reserved, allocated, Some(largest));
        }
    }

    /// Notes for the OOM entries past the budget of segment visits.
    fn folded_notes(&mut self, path: &str) {
        if self.ooms_folded > 0 {
            self.r.notes.push(format!(
                "{path}: {} OOM entries counted, not analysed ({} requested): each makes the model look at every \
                 live segment ({} at the end), and the {} segment visits allowed ({VISITS_PER_BYTE} per byte of the \
                 file) were spent",
                self.ooms_folded,
                vramhook_model::fmt_bytes(self.ooms_folded_bytes),
                self.live.len(),
                self.visits_limit
            ));
        }
        if self.stacks_skipped > 0 {
            self.r.notes.push(format!(
                "{path}: the allocations live at {} OOM entries are not grouped by stack (past the budget of segment visits)",
                self.stacks_skipped
            ));
        }
    }
}

/// The blocks of one final segment, counted in `totals`.
fn final_blocks(s: &Value, budget: &mut Budget, work: &mut crate::Work, totals: &mut PytorchTotals) -> Vec<Block> {
    let mut blocks = Vec::new();
    let blist = match s.get("blocks") {
        Some(b) => budget.items(&b, work),
        None => Vec::new(),
    };
    for b in blist {
        totals.blocks += 1;
        let state = b.get("state").and_then(|x| x.as_str()).unwrap_or_else(|| "".into());
        let allocated = state.starts_with("active");
        let bs = u(&b, "size");
        if allocated {
            totals.allocated_bytes = totals.allocated_bytes.saturating_add(bs);
        }
        blocks.push(Block { addr: u(&b, "address"), size: bs, allocated });
    }
    blocks
}

/// The largest stretch of a segment not covered by an allocated block (`None` when the
/// blocks overlap or leave the segment: the model reports those as bad segments).
fn largest_free(base: u64, size: u64, blocks: &[Block]) -> Option<u64> {
    let end = base.checked_add(size)?;
    let mut allocated: Vec<(u64, u64)> =
        blocks.iter().filter(|b| b.allocated && b.size > 0).map(|b| (b.addr, b.size)).collect();
    allocated.sort_unstable();
    let (mut cursor, mut largest) = (base, 0u64);
    for (a, s) in allocated {
        let e = a.checked_add(s)?;
        if a < cursor || e > end {
            return None;
        }
        largest = largest.max(a - cursor);
        cursor = e;
    }
    Some(largest.max(end - cursor))
}

/// Whether the snapshot at `path` joins a capture's process: `None` when no capture was read
/// with it.
fn join_decision(r: &mut Replayer, path: &str) -> Option<SnapshotJoin> {
    if !r.inputs.iter().any(|i| i.kind == InputKind::Capture) {
        return None;
    }
    Some(match r.join.take(path) {
        Some(k) => r.join.decide(k),
        None => SnapshotJoin {
            reason: "not matched: only a snapshot in a regular file is looked for in the captures \
                     (this one came through a pipe or FIFO)"
                .into(),
            ..SnapshotJoin::default()
        },
    })
}

/// The segments of a snapshot, to look for in the captures: its final segments and those its
/// trace allocated, with their devices.
pub(crate) fn segment_keys(work: &mut crate::Work, path: &str, bytes: &[u8]) -> Result<Vec<SegmentKey>, AnalyzeError> {
    let parsed = pickle::parse(bytes).map_err(|e| bad(path, format!("not a readable PyTorch snapshot: {e}")))?;
    let root = &parsed.root;
    let mut budget = Budget::new(bytes.len());
    let mut keys = Vec::new();
    let segments = match root.get("segments") {
        Some(s @ Value::List(_)) => budget.items(&s, work),
        _ => budget.items(root, work),
    };
    for s in &segments {
        let (addr, size) = (u(s, "address"), u(s, "total_size"));
        if size > 0 {
            keys.push(SegmentKey { device: dev(s), addr, size });
        }
    }
    if let Some(traces) = root.get("device_traces") {
        for (d, per_dev) in budget.items(&traces, work).into_iter().enumerate() {
            let device = i16::try_from(d).unwrap_or(i16::MAX);
            for e in budget.items(&per_dev, work).into_iter().take(MAX_TRACE) {
                let action = e.get("action").and_then(|a| a.as_str());
                // Not `segment_map`: an expandable segment's pages are mapped into its
                // reservation, which the final segment (its address) already names.
                if action.as_deref() == Some("segment_alloc") && u(&e, "size") > 0 {
                    keys.push(SegmentKey { device, addr: u(&e, "addr"), size: u(&e, "size") });
                }
            }
        }
    }
    Ok(keys)
}
